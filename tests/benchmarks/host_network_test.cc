// HostNetworkGroup: sub-groups within a host get the intra-host link, those
// across hosts the inter-host link, and only the latter count cross-host bytes.
#include <chrono>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "benchmarks/paper/host_network.h"
#include "runtime/comm/local_backend.h"
#include "runtime/core/allocator.h"
#include "runtime/device/device.h"

namespace sk::bench {
namespace {

using namespace std::chrono_literals;
void RunRanks(int n, const std::function<void(int)>& fn) {
  Status s = comm::RunRankThreads(n, [&](int r) {
    fn(r);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

std::unique_ptr<Stream> MakeStream(int rank) {
  auto device = Device::Get(DeviceId::Cpu(rank));
  EXPECT_TRUE(device.ok()) << device.status();
  auto stream = (*device)->CreateStream("comm");
  EXPECT_TRUE(stream.ok()) << stream.status();
  return std::move(stream).value();
}

Tensor MakeTensor(int rank, int64_t numel) {
  HostAllocator allocator(DeviceId::Cpu(rank));
  auto t = allocator.Zeros(DType::kF32, Shape({numel}));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

comm::LinkModel Link(double gbps) {
  comm::LinkModel l;
  l.latency_us = 1;
  l.bandwidth_gbps = gbps;
  return l;
}

std::vector<std::unique_ptr<HostNetworkGroup>> TwoHostsOfTwo() {
  auto groups = comm::LocalProcessGroup::Create(4);
  EXPECT_TRUE(groups.ok()) << groups.status();
  std::vector<std::unique_ptr<HostNetworkGroup>> world;
  for (auto& g : *groups) {
    auto w = HostNetworkGroup::Wrap(std::move(g), 2, Link(100), Link(1));
    EXPECT_TRUE(w.ok()) << w.status();
    world.push_back(std::move(w).value());
  }
  return world;
}

TEST(HostNetworkGroup, RanksPerHostMustDivideTheWorld) {
  auto groups = comm::LocalProcessGroup::Create(4);
  ASSERT_TRUE(groups.ok());
  auto w = HostNetworkGroup::Wrap(std::move((*groups)[0]), 3, Link(100), Link(1));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
}

TEST(HostNetworkGroup, LabelNamesBothLinks) {
  auto world = TwoHostsOfTwo();
  EXPECT_TRUE(world[0]->spans_hosts());
  const std::string label = world[0]->label();
  EXPECT_NE(label.find("2 ranks per host"), std::string::npos) << label;
  EXPECT_NE(label.find("intra-host: ring, alpha=1 us, beta=100 GB/s"), std::string::npos) << label;
  EXPECT_NE(label.find("inter-host: ring, alpha=1 us, beta=1 GB/s"), std::string::npos) << label;
}

TEST(HostNetworkGroup, OnlyGroupsAcrossHostsCountCrossHostBytes) {
  auto world = TwoHostsOfTwo();
  RunRanks(4, [&](int r) {
    // Shard group: this host's two ranks. Replicate group: the same local
    // index on both hosts.
    const int host = r / 2, local = r % 2;
    auto shard = world[r]->NewGroup({2 * host, 2 * host + 1}, 20s);
    ASSERT_TRUE(shard.ok()) << shard.status();
    auto replicate = world[r]->NewGroup({local, 2 + local}, 20s);
    ASSERT_TRUE(replicate.ok()) << replicate.status();
    EXPECT_FALSE(dynamic_cast<HostNetworkGroup&>(**shard).spans_hosts());
    EXPECT_TRUE(dynamic_cast<HostNetworkGroup&>(**replicate).spans_hosts());
    auto stream = MakeStream(r);
    Tensor t = MakeTensor(r, 256);  // 1 KiB
    auto intra = (*shard)->all_reduce(t, *stream);
    ASSERT_TRUE(intra.ok()) << intra.status();
    ASSERT_TRUE((*intra)->wait(20s).ok());
    EXPECT_EQ(world[r]->cross_host_bytes(), 0);
    auto inter = (*replicate)->all_reduce(t, *stream);
    ASSERT_TRUE(inter.ok()) << inter.status();
    ASSERT_TRUE((*inter)->wait(20s).ok());
    // A ring all-reduce over 2 ranks moves 2 (n-1)/n = 1 buffer per rank.
    EXPECT_EQ(world[r]->cross_host_bytes(), 1024);
  });
}

}  // namespace
}  // namespace sk::bench
