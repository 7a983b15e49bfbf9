// The simulated network: the profiles' "network" sections and link sharing
// between collectives on virtual time.
#include "runtime/sim/topology.h"

#include <gtest/gtest.h>

#include "runtime/sim/profile.h"

namespace sk::sim {
namespace {

using comm::CollectiveKind;
using comm::CollectivePlan;
using comm::GroupPlacement;
using comm::LinkAlgorithm;
using comm::LinkProtocol;
using comm::NetworkProfile;
using nlohmann::json;

json NetworkSection(const std::string& name) {
  auto p = LoadProfile(name);
  EXPECT_TRUE(p.ok()) << p.status();
  return p->network;
}

json A100Network() { return NetworkSection("a100-80g"); }

NetworkProfile A100() {
  auto p = ParseNetworkProfile(A100Network());
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

TEST(NetworkProfile, CheckedInProfilesParseWithASourceForEveryNumber) {
  for (const char* name : {"a100-80g", "h100-80g", "h200-141g"}) {
    auto p = ParseNetworkProfile(NetworkSection(name));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->gpus_per_node, 8);
    // 6 cluster numbers, 6 pairs x 4, the slow-down factor, one measured
    // nccl-tests curve (8 GPUs of a node).
    EXPECT_EQ(p->sources.size(), 6u + 24u + 1u + 1u) << name;
    for (const auto& [path, source] : p->sources) EXPECT_FALSE(source.empty()) << path;
    ASSERT_EQ(p->measured.size(), 1u) << name;
    EXPECT_EQ(p->measured[0].ranks, 8);
    EXPECT_NE(p->measured[0].source.find("nccl-tests"), std::string::npos);
  }
  const NetworkProfile a100 = A100();
  EXPECT_NEAR(a100.intra_node_gbps(), 231.6, 1e-9);  // 12 links x 19.3 GB/s (measured peak)
  EXPECT_DOUBLE_EQ(a100.node_network_gbps(), 192.0);  // 8 x 200 Gb/s x 0.96 (NCCL's 192 GB/s)
  EXPECT_DOUBLE_EQ(a100.cost(LinkAlgorithm::kRing, LinkProtocol::kSimple).base_latency_us, 8.4);
  EXPECT_NE(a100.sources.at("nic.bandwidth_gbps").find("HDR"), std::string::npos);
}

TEST(NetworkProfile, MistakesAreNamedByTheirPath) {
  auto expect_error = [](json j, const std::string& needle) {
    auto p = ParseNetworkProfile(j);
    ASSERT_FALSE(p.ok()) << needle;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status();
  };
  json j = A100Network();
  j["nic"].erase("per_node");
  expect_error(j, "network.nic.per_node: missing");
  j = A100Network();
  j["nic"]["speed"] = {{"value", 1}, {"source", "x"}};
  expect_error(j, "network.nic: unknown key 'speed'");
  j = A100Network();
  j["nvlink"]["links_per_gpu"] = 12;
  expect_error(j, "network.nvlink.links_per_gpu: expected {\"value\"");
  j = A100Network();
  j["nvlink"]["links_per_gpu"]["source"] = "";
  expect_error(j, "network.nvlink.links_per_gpu.source");
  j = A100Network();
  j["gpus_per_node"]["value"] = 7.5;
  expect_error(j, "network.gpus_per_node: expected an integer");
  j = A100Network();
  j["nic"]["efficiency"]["value"] = 1.5;
  expect_error(j, "nic_efficiency must be in (0, 1]");
  j = A100Network();
  j["algorithms"]["tree"]["ll"] = {{"enabled", true}};
  expect_error(j, "network.algorithms.tree.ll.enabled: only false");
  j = A100Network();
  j["algorithms"]["ring"]["ll128"] = {{"enabled", false}, {"source", "not on this fabric"}};
  auto disabled = ParseNetworkProfile(j);
  ASSERT_TRUE(disabled.ok()) << disabled.status();
  EXPECT_FALSE(disabled->cost(LinkAlgorithm::kRing, LinkProtocol::kLL128).enabled);
  EXPECT_EQ(disabled->sources.at("algorithms.ring.ll128.enabled"), "not on this fabric");
  EXPECT_NE(ParseNetworkProfile(json()).status().message().find("no network section"), std::string::npos);

  const json curve = {{"collectives", {"all_gather"}},
                      {"ranks", 8},
                      {"nodes", 1},
                      {"points", {{1024, 0.1}, {1048576, 50.0}}},
                      {"source", "test"}};
  j = A100Network();
  j["measured_bus_bandwidth"] = json::array({curve});
  auto parsed = ParseNetworkProfile(j);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->measured.size(), 1u);
  EXPECT_EQ(parsed->measured[0].kinds, std::vector<CollectiveKind>{CollectiveKind::kAllGather});
  EXPECT_EQ(parsed->sources.at("measured_bus_bandwidth[0]"), "test");
  auto with = [&](const char* key, json value) {
    json c = curve;
    c[key] = std::move(value);
    json n = A100Network();
    n["measured_bus_bandwidth"] = json::array({c});
    return n;
  };
  expect_error(with("collectives", {"all_to_all"}), "measured_bus_bandwidth[0].collectives: expected one of");
  expect_error(with("ranks", 8.5), "measured_bus_bandwidth[0].ranks: expected an integer");
  expect_error(with("source", ""), "measured_bus_bandwidth[0].source");
  expect_error(with("points", {{1024, 0.1}, {512, 1.0}}), "sizes must be positive and increasing");
  expect_error(with("points", {{1024, 0.1}}), "at least two");
  expect_error(with("points", {{1024, -1.0}, {2048, 1.0}}), "bus bandwidths must be positive");
  expect_error(with("points", {1024, 0.1}), "measured_bus_bandwidth[0].points: expected [[bytes");
  expect_error(with("speed", 1), "measured_bus_bandwidth[0]: unknown key 'speed'");
  j = A100Network();
  j["measured_bus_bandwidth"] = curve;
  expect_error(j, "network.measured_bus_bandwidth: expected an array");
}

CollectivePlan RingPlan(const NetworkProfile& p, CollectiveKind kind, size_t bytes,
                        const GroupPlacement& g) {
  auto plan = comm::PlanCollective(p, kind, bytes, g, LinkAlgorithm::kRing, LinkProtocol::kSimple);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

TEST(LinkSchedule, AloneACollectiveTakesItsPlannedTime) {
  LinkSchedule links;
  const CollectivePlan ag = RingPlan(A100(), CollectiveKind::kAllGather, 1 << 30, *GroupPlacement::Packed(8, 8));
  auto b = links.Book(ag, 2.0);
  EXPECT_DOUBLE_EQ(b.start_s, 2.0);
  EXPECT_NEAR(b.end_s - b.start_s, ag.seconds(), 1e-12);
  EXPECT_DOUBLE_EQ(b.alone_s, ag.seconds());
  // Booked again after the first ended: no sharing.
  auto later = links.Book(ag, b.end_s);
  EXPECT_NEAR(later.end_s - later.start_s, ag.seconds(), 1e-12);
}

TEST(LinkSchedule, OverlappingCollectivesShareTheLinkAndConserveItsBandwidth) {
  LinkSchedule links;
  const CollectivePlan ag = RingPlan(A100(), CollectiveKind::kAllGather, 1 << 30, *GroupPlacement::Packed(8, 8));
  const CollectivePlan rs = RingPlan(A100(), CollectiveKind::kReduceScatter, 1 << 30, *GroupPlacement::Packed(8, 8));
  const double transfer = ag.bus_bytes / ag.bus_bytes_per_s;
  auto first = links.Book(ag, 0.0);
  // The reduce-scatter starts while the all-gather moves its bytes: it gets
  // what the all-gather leaves (nothing) until it ends, then the whole link.
  const double start = ag.latency_s + transfer / 2;
  auto second = links.Book(rs, start);
  EXPECT_DOUBLE_EQ(first.end_s, ag.seconds());
  EXPECT_NEAR(second.end_s, first.end_s + transfer, 1e-12);
  EXPECT_GT(second.end_s - second.start_s, second.alone_s);
  // Both together took as long as the link needs for both: work-conserving.
  EXPECT_NEAR(second.end_s - ag.latency_s, 2 * transfer, 1e-12);
}

TEST(LinkSchedule, CollectivesOnDifferentLinksDoNotSlowEachOther) {
  LinkSchedule links;
  const NetworkProfile p = A100();
  // A hybrid mesh of 8 nodes: the shard group is a node (NVLink only), the
  // replica group holds one GPU per node (the network only).
  const CollectivePlan shard = RingPlan(p, CollectiveKind::kAllGather, 1 << 30, *GroupPlacement::Packed(8, 8));
  const CollectivePlan replica =
      RingPlan(p, CollectiveKind::kAllReduce, 1 << 28, *GroupPlacement::Of({3, 11, 19, 27, 35, 43, 51, 59}, 8));
  EXPECT_EQ(shard.network_use_per_byte_s, 0.0);
  EXPECT_EQ(replica.nvlink_use_per_byte_s, 0.0);
  auto a = links.Book(shard, 0.0);
  auto b = links.Book(replica, 0.0);
  EXPECT_DOUBLE_EQ(a.end_s, shard.seconds());
  EXPECT_DOUBLE_EQ(b.end_s, replica.seconds());
}

// Cross-node traffic: only bookings whose group spans nodes count, with
// their bus bytes (a ring all-reduce over 8 nodes moves 2 * 7/8 of its
// bytes); forgetting old bookings keeps the count, Clear resets it.
TEST(LinkSchedule, NetworkBusBytesCountOnlyGroupsThatSpanNodes) {
  LinkSchedule links;
  const NetworkProfile p = A100();
  const CollectivePlan shard = RingPlan(p, CollectiveKind::kAllGather, 1 << 30, *GroupPlacement::Packed(8, 8));
  const CollectivePlan replica =
      RingPlan(p, CollectiveKind::kAllReduce, 1 << 28, *GroupPlacement::Of({3, 11, 19, 27, 35, 43, 51, 59}, 8));
  links.Book(shard, 0.0);
  EXPECT_EQ(links.network_bus_bytes(), 0.0);
  auto b = links.Book(replica, 0.0);
  EXPECT_DOUBLE_EQ(links.network_bus_bytes(), replica.bus_bytes);
  EXPECT_DOUBLE_EQ(replica.bus_bytes, 2.0 * 7 / 8 * (1 << 28));
  links.ForgetBefore(b.end_s);
  links.Book(replica, b.end_s);
  EXPECT_DOUBLE_EQ(links.network_bus_bytes(), 2 * replica.bus_bytes);
  links.Clear();
  EXPECT_EQ(links.network_bus_bytes(), 0.0);
}

TEST(LinkSchedule, ANetworkBoundCollectiveLeavesTheRestOfNvlink) {
  LinkSchedule links;
  const NetworkProfile p = A100();
  const double nvlink = p.intra_node_gbps() * 1e9;   // 231.6 GB/s
  const double nics = p.node_network_gbps() * 1e9;   // 192 GB/s
  ASSERT_LT(nics, nvlink);
  // 16 GPUs on 2 nodes: limited by the node's NICs, it uses that much of
  // NVLink; a node-local all-gather gets the rest.
  const CollectivePlan world = RingPlan(p, CollectiveKind::kAllGather, size_t{1} << 34, *GroupPlacement::Packed(16, 8));
  const CollectivePlan local = RingPlan(p, CollectiveKind::kAllGather, 1 << 30, *GroupPlacement::Packed(8, 8));
  EXPECT_DOUBLE_EQ(world.bus_bytes_per_s, nics);
  links.Book(world, 0.0);
  auto b = links.Book(local, 0.0);
  // The local one's shorter latency gives it the whole of NVLink until the
  // world's bytes start to flow, then what the world leaves.
  ASSERT_LT(local.latency_s, world.latency_s);
  const double early = nvlink * (world.latency_s - local.latency_s);
  EXPECT_NEAR(b.end_s, world.latency_s + (local.bus_bytes - early) / (nvlink - nics), 1e-9);
}

TEST(LinkSchedule, BusyFractionForgetAndClear) {
  LinkSchedule links;
  const CollectivePlan ag = RingPlan(A100(), CollectiveKind::kAllGather, 1 << 30, *GroupPlacement::Packed(8, 8));
  auto b = links.Book(ag, 1.0);
  EXPECT_DOUBLE_EQ(links.BusyFraction(1.0, b.end_s), 1.0);
  EXPECT_DOUBLE_EQ(links.BusyFraction(0.0, 1.0), 0.0);
  const double d = b.end_s - 1.0;
  EXPECT_NEAR(links.BusyFraction(1.0 - d, 1.0 + d), 0.5, 1e-12);
  EXPECT_EQ(links.BusyFraction(2.0, 1.0), 0.0);
  // Forgetting the past keeps what is booked after it.
  links.ForgetBefore(1.0 + (b.end_s - 1.0) / 2);
  auto overlapped = links.Book(ag, 1.0 + (b.end_s - 1.0) / 2);
  EXPECT_GT(overlapped.end_s - overlapped.start_s, ag.seconds());
  links.Clear();
  auto fresh = links.Book(ag, 1.0);
  EXPECT_NEAR(fresh.end_s - fresh.start_s, ag.seconds(), 1e-12);
}

TEST(LinkSchedule, SameBookingsGiveTheSameTimes) {
  auto run = [] {
    LinkSchedule links;
    const NetworkProfile p = A100();
    std::vector<double> ends;
    for (int i = 0; i < 50; ++i) {
      const CollectivePlan plan = RingPlan(p, i % 2 ? CollectiveKind::kAllGather : CollectiveKind::kReduceScatter,
                                           (size_t{1} << 20) * (1 + i % 7), *GroupPlacement::Packed(16, 8));
      ends.push_back(links.Book(plan, i * 1e-4).end_s);
    }
    return ends;
  };
  EXPECT_EQ(run(), run());
}

}  // namespace
}  // namespace sk::sim
