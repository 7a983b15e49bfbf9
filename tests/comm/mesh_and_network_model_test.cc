// DeviceMesh sub-groups and the network-model wrapper.
#include <chrono>

#include "runtime/comm/device_mesh.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/network_model.h"
#include "tests/comm/conformance.h"
#include "tests/comm/gloo_world.h"

namespace sk::comm {
namespace {

using namespace std::chrono_literals;
using testing::MakeStream;
using testing::MakeTensor;
using testing::RunRanks;
using testing::Values;

std::vector<std::unique_ptr<ProcessGroup>> LocalGroup(int world) {
  auto groups = LocalProcessGroup::Create(world);
  CHECK(groups.ok()) << groups.status();
  return std::move(groups).value();
}

// Hybrid sharding's pattern on a replicate x shard mesh: gather within the
// row, all-reduce across the column.
void CheckMesh(std::vector<std::unique_ptr<ProcessGroup>>& world, int replicate, int shard) {
  RunRanks(replicate * shard, [&](int r) {
    auto mesh = DeviceMesh::Create(*world[r], replicate, shard, 20s);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    const DeviceMesh& m = **mesh;
    EXPECT_EQ(m.replicate_index(), r / shard);
    EXPECT_EQ(m.shard_index(), r % shard);
    EXPECT_EQ(m.shard_group().size(), shard);
    EXPECT_EQ(m.shard_group().rank(), r % shard);
    EXPECT_EQ(m.replicate_group().size(), replicate);
    EXPECT_EQ(m.replicate_group().rank(), r / shard);
    auto stream = MakeStream(r, "comm");
    Tensor mine = MakeTensor(r, DType::kF32, 1);
    StoreFromFloat(mine.data(), DType::kF32, 0, static_cast<float>(r));
    Tensor row = MakeTensor(r, DType::kF32, shard);
    auto ag = m.shard_group().all_gather(row, mine, *stream);
    ASSERT_TRUE(ag.ok()) << ag.status();
    auto ar = m.replicate_group().all_reduce(mine, *stream);
    ASSERT_TRUE(ar.ok()) << ar.status();
    ASSERT_TRUE((*ar)->wait(20s).ok());
    ASSERT_TRUE((*ag)->wait(20s).ok());
    std::vector<float> got = Values(row);
    for (int s = 0; s < shard; ++s) EXPECT_EQ(got[s], static_cast<float>(m.replicate_index() * shard + s));
    float column_sum = 0;
    for (int rep : m.ReplicateGroupRanks(m.shard_index())) column_sum += static_cast<float>(rep);
    EXPECT_EQ(Values(mine)[0], column_sum);
  });
}

TEST(DeviceMesh, LocalTwoByFourShardsRowsAndReplicatesColumns) {
  auto world = LocalGroup(8);
  CheckMesh(world, 2, 4);
}

TEST(DeviceMesh, LocalDegenerateMeshesAreFullShardAndFullReplication) {
  auto world = LocalGroup(4);
  CheckMesh(world, 1, 4);
  CheckMesh(world, 4, 1);
}

TEST(DeviceMesh, GlooTwoByTwo) {
  testing::GlooWorld world(4);
  CheckMesh(world.groups, 2, 2);
}

TEST(DeviceMesh, ShapeMustCoverTheWorld) {
  auto world = LocalGroup(4);
  auto mesh = DeviceMesh::Create(*world[0], 3, 2);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(mesh.status().message()).find("does not cover a group of 4"), std::string::npos);
}

TEST(LinkModel, ParsesSpecsAndNamesMistakes) {
  auto m = LinkModel::Parse("tree:latency_us=2,bandwidth_gbps=25");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->algorithm, LinkAlgorithm::kTree);
  EXPECT_EQ(m->latency_us, 2);
  EXPECT_EQ(m->bandwidth_gbps, 25);
  EXPECT_EQ(m->ToString(), "tree, alpha=2 us, beta=25 GB/s");
  EXPECT_TRUE(LinkModel::Parse("ring").ok());
  EXPECT_EQ(LinkModel::Parse("mesh").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LinkModel::Parse("ring:speed=3").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LinkModel::Parse("ring:bandwidth_gbps=0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LinkModel::Parse("ring:latency_us=abc").status().code(), StatusCode::kInvalidArgument);
  // Only plain decimal numbers, each key once, nothing empty: what strtod
  // and a last-wins loop used to accept quietly.
  for (const char* bad : {"ring:bandwidth_gbps=0x10", "ring:bandwidth_gbps=+5", "ring:bandwidth_gbps= 5",
                          "ring:bandwidth_gbps=5 ", "ring:latency_us=inf", "ring:latency_us=nan",
                          "ring:latency_us=1,latency_us=2", "ring:", "ring:latency_us=1,",
                          "ring:,latency_us=1"}) {
    auto r = LinkModel::Parse(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto twice = LinkModel::Parse("tree:bandwidth_gbps=5,bandwidth_gbps=50");
  EXPECT_NE(std::string(twice.status().message()).find("'bandwidth_gbps' is given twice"), std::string::npos)
      << twice.status();
  auto sci = LinkModel::Parse("ring:latency_us=1.5e1,bandwidth_gbps=2.5");
  ASSERT_TRUE(sci.ok()) << sci.status();
  EXPECT_EQ(sci->latency_us, 15);
  EXPECT_EQ(sci->bandwidth_gbps, 2.5);
}

TEST(LinkModel, AlphaBetaFormulas) {
  LinkModel ring{10.0, 1.0, LinkAlgorithm::kRing};  // 10 us, 1 GB/s
  const size_t gb = 1000000000;
  EXPECT_DOUBLE_EQ(ring.Seconds(CollectiveKind::kAllGather, gb, 4), 3 * 10e-6 + 0.75);
  EXPECT_DOUBLE_EQ(ring.Seconds(CollectiveKind::kReduceScatter, gb, 4), 3 * 10e-6 + 0.75);
  EXPECT_DOUBLE_EQ(ring.Seconds(CollectiveKind::kAllReduce, gb, 4), 6 * 10e-6 + 1.5);
  EXPECT_DOUBLE_EQ(ring.Seconds(CollectiveKind::kBroadcast, gb, 4), 3 * 10e-6 + 1.0);
  EXPECT_DOUBLE_EQ(ring.Seconds(CollectiveKind::kBarrier, 0, 4), 6 * 10e-6);
  EXPECT_EQ(ring.Seconds(CollectiveKind::kAllReduce, gb, 1), 0.0);
  LinkModel tree{10.0, 1.0, LinkAlgorithm::kTree};
  EXPECT_DOUBLE_EQ(tree.Seconds(CollectiveKind::kAllGather, gb, 8), 3 * 10e-6 + 0.875);
  EXPECT_DOUBLE_EQ(tree.Seconds(CollectiveKind::kAllReduce, gb, 5), 6 * 10e-6 + 1.6);
  EXPECT_DOUBLE_EQ(tree.Seconds(CollectiveKind::kBroadcast, gb, 8), 3 * (10e-6 + 1.0));
}

TEST(NetworkModelProcessGroup, DataMovesAndCompletionWaitsForTheModel) {
  auto inner = LocalGroup(2);
  std::vector<std::unique_ptr<NetworkModelProcessGroup>> groups;
  // 2 ranks, ring: one step of 150 ms latency dominates.
  LinkModel model{150000.0, 100.0, LinkAlgorithm::kRing};
  for (auto& g : inner) {
    auto w = NetworkModelProcessGroup::Wrap(std::move(g), model);
    ASSERT_TRUE(w.ok());
    groups.push_back(std::move(w).value());
  }
  EXPECT_EQ(groups[0]->label(), "local + network model (ring, alpha=150000 us, beta=100 GB/s)");
  RunRanks(2, [&](int r) {
    auto stream = MakeStream(r, "comm");
    Tensor in = MakeTensor(r, DType::kBF16, 3);
    Tensor out = MakeTensor(r, DType::kBF16, 6);
    for (int i = 0; i < 3; ++i) StoreFromFloat(in.data(), DType::kBF16, i, r * 10.0f + i);
    auto start = std::chrono::steady_clock::now();
    auto work = groups[r]->all_gather(out, in, *stream);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE((*work)->wait(10s).ok());
    // "No earlier than the model": a lower bound, safe on any machine.
    EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
    EXPECT_EQ(Values(out), (std::vector<float>{0, 1, 2, 10, 11, 12}));
    EXPECT_NE((*work)->description().find("[ring, alpha=150000 us"), std::string::npos);
  });
}

// One group is one NCCL communicator: its collectives run one after another
// in issue order whatever stream they were issued on, so two collectives of
// 150 ms each, issued on two streams of the same group, finish no earlier
// than 300 ms after the first started (before, the second overlapped the
// first on the modelled link and both ended after 150 ms).
TEST(NetworkModelProcessGroup, AGroupsCollectivesQueueOnItsLinkAcrossStreams) {
  auto inner = LocalGroup(2);
  std::vector<std::unique_ptr<NetworkModelProcessGroup>> groups;
  LinkModel model{150000.0, 100.0, LinkAlgorithm::kRing};
  for (auto& g : inner) groups.push_back(*NetworkModelProcessGroup::Wrap(std::move(g), model));
  RunRanks(2, [&](int r) {
    auto gather_stream = MakeStream(r, "all-gather");
    auto reduce_stream = MakeStream(r, "reduce-scatter");
    Tensor in = MakeTensor(r, DType::kF32, 2);
    Tensor out = MakeTensor(r, DType::kF32, 4);
    Tensor grads = MakeTensor(r, DType::kF32, 4);
    Tensor shard = MakeTensor(r, DType::kF32, 2);
    for (int i = 0; i < 4; ++i) StoreFromFloat(grads.data(), DType::kF32, i, static_cast<float>(r + i));
    const auto start = std::chrono::steady_clock::now();
    auto reduce = groups[r]->reduce_scatter(shard, grads, *reduce_stream);
    ASSERT_TRUE(reduce.ok()) << reduce.status();
    auto gather = groups[r]->all_gather(out, in, *gather_stream);
    ASSERT_TRUE(gather.ok()) << gather.status();
    ASSERT_TRUE((*gather)->wait(10s).ok());
    EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);  // a lower bound: safe on any machine
    ASSERT_TRUE((*reduce)->wait(10s).ok());
    EXPECT_EQ(Values(shard), r == 0 ? (std::vector<float>{1, 3}) : (std::vector<float>{5, 7}));
  });
}

// Parse takes any finite number, so a model can need more time than a clock
// duration holds: the collective is refused, naming the model, instead of an
// overflowing conversion (which in practice completed at once).
TEST(NetworkModelProcessGroup, AModelTooSlowForTheClockIsRefused) {
  for (const char* spec : {"ring:latency_us=1e300", "tree:bandwidth_gbps=1e-320"}) {
    auto model = LinkModel::Parse(spec);
    ASSERT_TRUE(model.ok()) << model.status();
    auto inner = LocalGroup(2);
    std::vector<std::unique_ptr<NetworkModelProcessGroup>> groups;
    for (auto& g : inner) groups.push_back(*NetworkModelProcessGroup::Wrap(std::move(g), *model));
    RunRanks(2, [&](int r) {
      auto stream = MakeStream(r, "comm");
      Tensor in = MakeTensor(r, DType::kF32, 3);
      Tensor out = MakeTensor(r, DType::kF32, 6);
      auto work = groups[r]->all_gather(out, in, *stream);
      ASSERT_FALSE(work.ok()) << spec;
      EXPECT_EQ(work.status().code(), StatusCode::kInvalidArgument) << work.status();
      EXPECT_NE(work.status().ToString().find("network model (" + model->ToString() + ")"), std::string::npos)
          << work.status();
    });
  }
}

TEST(NetworkModelProcessGroup, MeshSubGroupsKeepTheModel) {
  auto inner = LocalGroup(4);
  std::vector<std::unique_ptr<ProcessGroup>> world;
  for (auto& g : inner) {
    world.push_back(*NetworkModelProcessGroup::Wrap(std::move(g), LinkModel{1.0, 50.0, LinkAlgorithm::kTree}));
  }
  EXPECT_EQ(world[0]->label(), "local + network model (tree, alpha=1 us, beta=50 GB/s)");
  RunRanks(4, [&](int r) {
    auto mesh = DeviceMesh::Create(*world[r], 2, 2, 20s);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    EXPECT_EQ((*mesh)->shard_group().label(), world[r]->label());
    EXPECT_EQ((*mesh)->replicate_group().label(), world[r]->label());
  });
  CheckMesh(world, 2, 2);
}

TEST(NetworkModelProcessGroup, InnerErrorsPassThrough) {
  auto inner = LocalGroup(2);
  auto wrapped = NetworkModelProcessGroup::Wrap(std::move(inner[0]), LinkModel{});
  ASSERT_TRUE(wrapped.ok());
  auto stream = MakeStream(0, "comm");
  auto work = (*wrapped)->barrier(*stream, CollectiveOptions{50ms});  // rank 1 never comes
  ASSERT_TRUE(work.ok());
  EXPECT_EQ((*work)->wait(10s).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(NetworkModelProcessGroup::Wrap(nullptr, LinkModel{}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk::comm
