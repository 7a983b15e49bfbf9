// The proof that sharding changes nothing but memory: a tiny GPT trained for
// five steps under every strategy, at world sizes 2 and 4 (hybrid at 2x2),
// ends with the same losses and parameters as one unsharded rank.
#include <gtest/gtest.h>

#include <mutex>

#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/store.h"

#include "runtime/fsdp/fsdp.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

using testing::ExpectRelClose;
using testing::MakeBatch;

struct Case {
  ShardingStrategy strategy;
  int world;
  int shard_group;  // hybrid only
  bool gloo = false;
  bool offload = false;  // cpu_offload: shards and the optimizer on the host
};

// Gloo over loopback TCP, ranks as threads, rendezvous through a TcpStore.
void RunGlooRanks(int world, const std::function<void(int, comm::ProcessGroup*)>& body) {
  auto server = comm::TcpStore::Create("127.0.0.1", 0, /*serve=*/true, std::chrono::seconds(30));
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::unique_ptr<comm::ProcessGroup>> groups(world);
  Status formed = comm::RunRankThreads(world, [&](int r) -> Status {
    SK_ASSIGN_OR_RETURN(auto client, comm::TcpStore::Create("127.0.0.1", (*server)->port(), false,
                                                            std::chrono::seconds(30)));
    SK_ASSIGN_OR_RETURN(groups[r], comm::GlooProcessGroup::Create(
                                       std::shared_ptr<comm::Store>(std::move(client)), "fsdp", r, world));
    return OkStatus();
  });
  ASSERT_TRUE(formed.ok()) << formed;
  Status ran = comm::RunRankThreads(world, [&](int r) {
    body(r, groups[r].get());
    return OkStatus();
  });
  EXPECT_TRUE(ran.ok()) << ran;
  // Final barriers run together.
  Status closed = comm::RunRankThreads(world, [&](int r) {
    groups[r].reset();
    return OkStatus();
  });
  EXPECT_TRUE(closed.ok()) << closed;
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = ShardingStrategyName(info.param.strategy);
  s += "_world" + std::to_string(info.param.world);
  if (info.param.shard_group) s += "_group" + std::to_string(info.param.shard_group);
  if (info.param.gloo) s += "_gloo";
  if (info.param.offload) s += "_offload";
  return s;
}

class FsdpEquivalenceTest : public ::testing::TestWithParam<Case> {};

constexpr int kSteps = 5;
constexpr int kRowsPerRank = 2;
constexpr uint64_t kSeed = 1234;

TEST_P(FsdpEquivalenceTest, LossesAndParametersMatchOneUnshardedRank) {
  const Case c = GetParam();
  auto model = *GptModel::Create(testing::TinyGpt());
  testing::ReferenceRun ref = testing::RunReference(*model, kSteps, kRowsPerRank * c.world, kSeed);

  std::mutex mu;
  std::vector<std::vector<float>> losses(c.world);
  std::vector<std::vector<std::vector<Tensor>>> gathered(c.world);
  auto run = c.gloo ? RunGlooRanks : testing::RunRanks;
  run(c.world, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o;
    o.strategy = c.strategy;
    o.shard_group_size = c.shard_group;
    o.seed = kSeed;
    o.timeout = Duration(60'000);
    o.cpu_offload = c.offload;
    auto fsdp = FullyShardedModel::Create(model->units(), world, &alloc, o);
    ASSERT_TRUE(fsdp.ok()) << fsdp.status();
    auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
    for (int s = 0; s < kSteps; ++s) {
      (*fsdp)->ZeroGrad();
      StatusOr<float> loss = model->ForwardBackward(MakeBatch(s, rank * kRowsPerRank, kRowsPerRank),
                                                    **fsdp, (*fsdp)->activation_allocator());
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE((*fsdp)->OptimizerStep(*opt).ok());
      losses[rank].push_back(*loss);
    }
    std::vector<std::vector<Tensor>> params;
    for (int u = 0; u < (*fsdp)->num_units(); ++u) {
      params.emplace_back();
      for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
        StatusOr<Tensor> t = (*fsdp)->GatherFullParam(u, static_cast<int>(p));
        ASSERT_TRUE(t.ok()) << t.status();
        params.back().push_back(*t);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    gathered[rank] = std::move(params);
  });
  for (int s = 0; s < kSteps; ++s) {
    // The global loss is the mean of the ranks' local means (equal batch sizes).
    double mean = 0;
    for (int r = 0; r < c.world; ++r) mean += losses[r][s];
    mean /= c.world;
    ExpectRelClose(static_cast<float>(mean), ref.losses[s], 1e-5, "loss at step " + std::to_string(s));
  }
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(gathered[r].size(), ref.params.size());
    for (size_t u = 0; u < ref.params.size(); ++u) {
      for (size_t p = 0; p < ref.params[u].size(); ++p) {
        const float* got = gathered[r][u][p].data_as<float>();
        for (size_t i = 0; i < ref.params[u][p].size(); ++i) {
          ExpectRelClose(got[i], ref.params[u][p][i], 1e-5,
                         "rank " + std::to_string(r) + " " + model->units()[u].name + "." +
                             model->units()[u].params[p].name + "[" + std::to_string(i) + "]");
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, FsdpEquivalenceTest,
    ::testing::Values(Case{ShardingStrategy::kFullShard, 2, 0}, Case{ShardingStrategy::kFullShard, 4, 0},
                      Case{ShardingStrategy::kShardGradOp, 2, 0}, Case{ShardingStrategy::kShardGradOp, 4, 0},
                      Case{ShardingStrategy::kShardOptim, 2, 0}, Case{ShardingStrategy::kShardOptim, 4, 0},
                      Case{ShardingStrategy::kNoShard, 2, 0}, Case{ShardingStrategy::kNoShard, 4, 0},
                      Case{ShardingStrategy::kHybridShard, 4, 2},
                      Case{ShardingStrategy::kHybridShardGradOp, 4, 2},
                      Case{ShardingStrategy::kFullShard, 2, 0, true},
                      Case{ShardingStrategy::kShardOptim, 2, 0, true},
                      Case{ShardingStrategy::kHybridShard, 4, 2, true},
                      Case{ShardingStrategy::kFullShard, 2, 0, false, true},
                      Case{ShardingStrategy::kShardGradOp, 2, 0, false, true},
                      Case{ShardingStrategy::kShardOptim, 2, 0, false, true},
                      Case{ShardingStrategy::kNoShard, 2, 0, false, true},
                      Case{ShardingStrategy::kHybridShard, 4, 2, false, true}),
    Name);

}  // namespace
}  // namespace sk
