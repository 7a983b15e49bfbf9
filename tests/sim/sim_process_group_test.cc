// SimProcessGroup: collectives on virtual time, priced by the topology and
// sharing the simulated GPU's links; Work semantics as on real backends.
#include "runtime/sim/sim_process_group.h"

#include <gtest/gtest.h>

#include "runtime/comm/device_mesh.h"
#include "runtime/device/device.h"
#include "runtime/sim/profile.h"
#include "runtime/sim/sim_device.h"

namespace sk::sim {
namespace {

using comm::CollectiveKind;
using comm::DeviceMesh;
using comm::LinkAlgorithm;
using comm::LinkProtocol;
using comm::ProcessGroup;
using comm::Work;

constexpr double kUs = 1e-6;
constexpr double kLaunch = 5 * kUs;

// The checked-in a100-80g network, with its measured nccl-tests curve (8
// GPUs of a node) or, for the closed forms of the tuning model, without.
comm::NetworkProfile A100(bool measured = true) {
  auto p = LoadProfile("a100-80g");
  CHECK(p.ok()) << p.status();
  auto n = ParseNetworkProfile(p->network);
  CHECK(n.ok()) << n.status();
  n->name = "a100-80g";
  if (!measured) n->measured.clear();
  return *n;
}
comm::NetworkProfile ModelA100() { return A100(false); }

// Each test its own device index (devices are process-wide), indices above
// those of sim_device_test.
SimDevice* Fresh(int index) {
  StatusOr<SimDevice*> d = SimDevice::Get(100 + index);
  CHECK(d.ok()) << d.status();
  SimDeviceSpec spec;
  spec.name = "a100-80g";
  spec.launch_overhead_s = kLaunch;
  CHECK(d.value()->Configure(spec).ok());
  d.value()->ResetClocks();
  return *d;
}

std::unique_ptr<Stream> MakeStream(SimDevice* d, const char* name) {
  return std::move(d->CreateStream(name)).value();
}

// A sim tensor: a virtual address, no data.
Tensor SimTensor(SimDevice* d, int64_t numel) {
  void* p = d->RawAllocate(numel * 4).value();
  return Tensor::Wrap(p, DType::kF32, Shape({numel}), d->id()).value();
}

std::unique_ptr<SimProcessGroup> World(int n, const comm::NetworkProfile& profile = A100()) {
  auto g = SimProcessGroup::Create(profile, n);
  CHECK(g.ok()) << g.status();
  return std::move(g).value();
}

double EndOf(const Work& w) { return static_cast<const SimEvent&>(w.event()).time_s(); }

std::shared_ptr<Work> Ok(StatusOr<std::shared_ptr<Work>> w) {
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : nullptr;
}

// A simulated collective's span (and its Work's errors) carry this text, so
// a trace names what each collective moved.
TEST(SimProcessGroup, ACollectiveDescribesItsKindSequenceTensorsOpAndLabel) {
  SimDevice* d = Fresh(40);
  Tensor shard = SimTensor(d, 4), full = SimTensor(d, 32);
  comm::Collective c;
  c.kind = CollectiveKind::kAllGather;
  c.seq = 12;
  c.inputs = {shard, shard};
  c.outputs = {full, full};
  c.label = "unit 'h.3' forward";
  EXPECT_EQ(c.Describe(), "all_gather #12 (f32[4] -> f32[32], f32[4] -> f32[32]) [unit 'h.3' forward]");
  c.kind = CollectiveKind::kReduceScatter;
  c.inputs = {full};
  c.outputs = {shard};
  c.op = comm::ReduceOp::kAvg;
  c.label.clear();
  EXPECT_EQ(c.Describe(), "reduce_scatter #12 (f32[32] -> f32[4], avg)");
  c.kind = CollectiveKind::kAllReduce;
  c.inputs = c.outputs = {full};
  c.op = comm::ReduceOp::kSum;
  EXPECT_EQ(c.Describe(), "all_reduce #12 (f32[32], sum)");
  c.kind = CollectiveKind::kBroadcast;
  c.root = 3;
  c.label = "weights";
  EXPECT_EQ(c.Describe(), "broadcast #12 (f32[32], root 3) [weights]");
  c.kind = CollectiveKind::kBarrier;
  c.seq = 0;
  c.inputs.clear();
  c.outputs.clear();
  EXPECT_EQ(c.Describe(), "barrier #0 [weights]");
  c.label.clear();
  EXPECT_EQ(c.Describe(), "barrier #0");
}

TEST(SimProcessGroup, RingAllReduceInsideANodeTakesTheClosedForm) {
  SimDevice* d = Fresh(1);
  const comm::NetworkProfile model = ModelA100();
  auto world = World(8, model);
  EXPECT_EQ(world->backend_name(), "sim");
  EXPECT_EQ(world->label(), "sim (a100-80g: 8 ranks on 1 node (8 per node))");
  auto s = MakeStream(d, "comm");
  const int64_t numel = int64_t{64} << 20;  // 256 MiB of f32
  Tensor t = SimTensor(d, numel);
  auto work = Ok(world->all_reduce(t, *s));
  // Ring/Simple over NVLink (12 links x 19.3 GB/s): 2(n-1) = 14 steps of
  // 3.4 us after 8.4 us, and 2(n-1)/n of the bytes at 231.6 GB/s.
  const double nvlink = model.intra_node_gbps() * 1e9;
  const double closed_form = (8.4 + 14 * 3.4) * kUs + 2.0 * 7 / 8 * numel * 4 / nvlink;
  EXPECT_NEAR(EndOf(*work), kLaunch + closed_form, 1e-12);
  EXPECT_NE(work->description().find("ring/simple"), std::string::npos) << work->description();
  // The host ran ahead; waiting brings it to the collective's end.
  EXPECT_FALSE(work->is_completed());
  EXPECT_NEAR(d->HostClock(), kLaunch, 1e-12);
  ASSERT_TRUE(work->wait(std::chrono::milliseconds(1000)).ok());
  EXPECT_TRUE(work->is_completed());
  EXPECT_NEAR(d->HostClock(), kLaunch + closed_form, 1e-12);
}

// The checked-in profile's measured curve (nccl-tests all_reduce on 8
// A100s, 213.87 GB/s of bus bandwidth at 256 MiB) prices the same
// collective: NCCL's measured time, not the model's.
TEST(SimProcessGroup, AMeasuredCurvePricesTheEightGpuAllReduce) {
  SimDevice* d = Fresh(20);
  auto world = World(8);
  auto s = MakeStream(d, "comm");
  const int64_t numel = int64_t{64} << 20;
  Tensor t = SimTensor(d, numel);
  const double start = d->HostClock();
  auto work = Ok(world->all_reduce(t, *s));
  ASSERT_TRUE(work->wait().ok());
  const double measured = 2.0 * 7 / 8 * numel * 4 / 213.87e9;
  EXPECT_NEAR(EndOf(*work) - start, kLaunch + measured, 1e-12);
  EXPECT_NE(work->description().find("nccl-tests curve"), std::string::npos) << work->description();
  // Slower than the model's ring at this size (its latency and bandwidth
  // alone would give 231.6 GB/s less 56 us).
  auto model = World(8, ModelA100())->Plan(CollectiveKind::kAllReduce, numel * 4);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_GT(measured, model->seconds());
}

TEST(SimProcessGroup, CrossingNodesIsSlowerThanStayingInside) {
  SimDevice* d = Fresh(2);
  auto s = MakeStream(d, "comm");
  const int64_t shard = int64_t{16} << 20;
  double busbw[2];
  int i = 0;
  for (int n : {8, 16}) {
    auto world = World(n);
    Tensor in = SimTensor(d, shard);
    Tensor out = SimTensor(d, shard * n);
    const double start = d->HostClock();
    auto work = Ok(world->all_gather(out, in, *s));
    ASSERT_TRUE(work->wait().ok());
    const double seconds = EndOf(*work) - start - kLaunch;
    busbw[i++] = out.nbytes() * comm::BusBandwidthFactor(CollectiveKind::kAllGather, n) / seconds;
  }
  // Inside a node the measured curve: 221.58 GB/s at 512 MiB; across two,
  // the node's 8 x 25 GB/s NICs at NCCL's measured 0.96 (192 GB/s), less
  // the ring's latency.
  EXPECT_NEAR(busbw[0], 221.58e9, 1e6);
  EXPECT_GT(busbw[1], 185e9);
  EXPECT_LT(busbw[1], 192e9);
}

TEST(SimProcessGroup, HybridMeshShardsOverNvlinkAndReplicatesOverTheNics) {
  SimDevice* d = Fresh(3);
  auto world = World(64);
  auto mesh = DeviceMesh::Create(*world, /*replicate=*/8, /*shard=*/8);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto& shard = static_cast<SimProcessGroup&>((*mesh)->shard_group());
  auto& replica = static_cast<SimProcessGroup&>((*mesh)->replicate_group());
  EXPECT_EQ(shard.placement().nodes, 1);
  EXPECT_EQ(shard.placement().ranks, 8);
  EXPECT_EQ(replica.placement().nodes, 8);
  EXPECT_EQ(replica.placement().min_ranks_per_node, 1);
  EXPECT_EQ(replica.positions(), (std::vector<int>{0, 8, 16, 24, 32, 40, 48, 56}));
  auto gather_stream = MakeStream(d, "all_gather");
  auto reduce_stream = MakeStream(d, "all_reduce");
  const int64_t n = int64_t{32} << 20;
  Tensor in = SimTensor(d, n);
  Tensor out = SimTensor(d, 8 * n);
  Tensor grad = SimTensor(d, n);
  auto ag = Ok(shard.all_gather(out, in, *gather_stream));
  auto ar = Ok(replica.all_reduce(grad, *reduce_stream));
  auto ag_plan = shard.Plan(CollectiveKind::kAllGather, out.nbytes());
  auto ar_plan = replica.Plan(CollectiveKind::kAllReduce, grad.nbytes());
  // One GPU per node in the replica group: its share of the node's NICs is
  // one NIC (25 GB/s at NCCL's measured 0.96). The shard group is 8 GPUs
  // of a node: the measured curve (228.1 GB/s at 1 GiB).
  ASSERT_EQ(ar_plan->protocol, LinkProtocol::kSimple);
  EXPECT_FALSE(ar_plan->measured);
  EXPECT_DOUBLE_EQ(ar_plan->bus_bytes_per_s, 24e9);
  EXPECT_TRUE(ag_plan->measured);
  EXPECT_DOUBLE_EQ(ag_plan->bus_bytes_per_s, 228.1e9);
  // Different links: neither slows the other (launched 5 us apart).
  EXPECT_NEAR(EndOf(*ag), kLaunch + ag_plan->seconds(), 1e-12);
  EXPECT_NEAR(EndOf(*ar), 2 * kLaunch + ar_plan->seconds(), 1e-12);
}

TEST(SimProcessGroup, ConcurrentCollectivesShareALinkAndStreamsWaitOnTheirWork) {
  SimDevice* d = Fresh(4);
  auto world = World(8, ModelA100());
  // A second communicator over the same ranks: its collectives may run
  // beside the world's (one communicator's may not: next test).
  auto other = world->NewGroup({0, 1, 2, 3, 4, 5, 6, 7});
  ASSERT_TRUE(other.ok()) << other.status();
  auto gather_stream = MakeStream(d, "all_gather");
  auto reduce_stream = MakeStream(d, "reduce_scatter");
  auto compute = MakeStream(d, "compute");
  const int64_t n = int64_t{32} << 20;
  Tensor in = SimTensor(d, n), out = SimTensor(d, 8 * n);
  Tensor grads = SimTensor(d, 8 * n), shard = SimTensor(d, n);
  auto ag = Ok(world->all_gather(out, in, *gather_stream));
  auto rs = Ok((*other)->reduce_scatter(shard, grads, *reduce_stream));
  auto plan = world->Plan(CollectiveKind::kAllGather, out.nbytes());
  ASSERT_EQ(plan->algorithm, LinkAlgorithm::kRing);
  const double transfer = plan->bus_bytes / plan->bus_bytes_per_s;
  EXPECT_NEAR(EndOf(*ag), kLaunch + plan->seconds(), 1e-12);
  // The reduce-scatter (same bytes on the link) waits for the link: the two
  // together take as long as the link needs to carry both.
  EXPECT_NEAR(EndOf(*rs), EndOf(*ag) + transfer, 1e-9);
  // FSDP's pattern: compute waits on the reduce-scatter's event, not the host.
  ASSERT_TRUE(compute->WaitEvent(rs->event()).ok());
  ASSERT_TRUE(d->EnqueueSpan(*compute, "optimizer", 1e-3).ok());
  EXPECT_NEAR(d->StreamClock(*compute), EndOf(*rs) + 1e-3, 1e-12);
  EXPECT_LT(d->HostClock(), EndOf(*ag));
}

TEST(SimProcessGroup, OneCommunicatorRunsItsCollectivesInIssueOrderAcrossStreams) {
  SimDevice* d = Fresh(7);
  auto world = World(8);
  auto a = MakeStream(d, "a");
  auto b = MakeStream(d, "b");
  const int64_t n = int64_t{1} << 20;
  Tensor big_in = SimTensor(d, 16 * n), big_out = SimTensor(d, 128 * n);
  Tensor small = SimTensor(d, n);
  // A long all-gather on stream a, then a small all-reduce on idle stream b:
  // NCCL runs the second after the first (one communicator), not beside it.
  auto ag = Ok(world->all_gather(big_out, big_in, *a));
  auto ar = Ok(world->all_reduce(small, *b));
  auto small_plan = world->Plan(CollectiveKind::kAllReduce, small.nbytes());
  ASSERT_TRUE(small_plan.ok());
  EXPECT_NEAR(EndOf(*ar), EndOf(*ag) + small_plan->seconds(), 1e-9);
  // Stream b waited for its collective: its clock is the all-reduce's end.
  EXPECT_NEAR(d->StreamClock(*b), EndOf(*ar), 1e-12);
  // A new simulation forgets the communicator's queue with the links.
  d->ResetClocks();
  world->links().Clear();
  auto again = Ok(world->all_reduce(small, *b));
  EXPECT_NEAR(EndOf(*again), kLaunch + small_plan->seconds(), 1e-12);
}

TEST(SimProcessGroup, TheSameScheduleTwiceGivesTheSameTimes) {
  SimDevice* d = Fresh(5);
  auto run = [&] {
    d->ResetClocks();
    auto world = World(128);
    auto mesh = DeviceMesh::Create(*world, 16, 8);
    CHECK(mesh.ok());
    auto a = MakeStream(d, "a");
    auto b = MakeStream(d, "b");
    std::vector<double> ends;
    for (int i = 0; i < 20; ++i) {
      const int64_t n = (int64_t{1} << 16) * (1 + i % 5);
      Tensor in = SimTensor(d, n), out = SimTensor(d, 8 * n);
      auto ag = Ok((*mesh)->shard_group().all_gather(out, in, *a));
      auto ar = Ok((*mesh)->replicate_group().all_reduce(in, *b));
      auto wr = Ok(world->all_reduce(out, i % 2 ? *a : *b));
      ends.push_back(EndOf(*ag));
      ends.push_back(EndOf(*ar));
      ends.push_back(EndOf(*wr));
    }
    return ends;
  };
  EXPECT_EQ(run(), run());
}

TEST(SimProcessGroup, BadInputIsRefusedWithItsReason) {
  SimDevice* d = Fresh(6);
  EXPECT_EQ(SimProcessGroup::Create(A100(), 0).status().code(), StatusCode::kInvalidArgument);
  auto huge = SimProcessGroup::Create(A100(), SimProcessGroup::kMaxWorldSize + 1);
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("1 to 1048576"), std::string::npos) << huge.status();
  ASSERT_TRUE(SimProcessGroup::Create(A100(), SimProcessGroup::kMaxWorldSize).ok());
  EXPECT_EQ(SimProcessGroup::Create(A100(), 4, 4).status().code(), StatusCode::kInvalidArgument);
  comm::NetworkProfile bad = A100();
  bad.nic_gbps = 0;
  EXPECT_EQ(SimProcessGroup::Create(bad, 4).status().code(), StatusCode::kInvalidArgument);
  auto world = World(16);
  // A sub-group must contain the calling rank.
  EXPECT_EQ(world->NewGroup({1, 2}).status().code(), StatusCode::kInvalidArgument);
  // A CPU stream is not a sim stream.
  auto cpu = Device::Get(DeviceId::Cpu(0));
  ASSERT_TRUE(cpu.ok());
  auto cpu_stream = std::move((*cpu)->CreateStream("cpu")).value();
  float x = 0;
  Tensor host = Tensor::Wrap(&x, DType::kF32, Shape({1})).value();
  auto on_cpu = world->all_reduce(host, *cpu_stream);
  EXPECT_EQ(on_cpu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(on_cpu.status().message().find("sim streams only"), std::string::npos) << on_cpu.status();
  // The shared validation still applies: a CPU tensor on a sim stream.
  auto s = MakeStream(d, "comm");
  EXPECT_EQ(world->all_reduce(host, *s).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk::sim
