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

// The options every run here shares: the strategy, the seed and a timeout.
FsdpOptions Options(ShardingStrategy strategy, int shard_group) {
  FsdpOptions o;
  o.strategy = strategy;
  o.shard_group_size = shard_group;
  o.seed = kSeed;
  o.timeout = Duration(60'000);
  return o;
}

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
    FsdpOptions o = Options(c.strategy, c.shard_group);
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

// The Trainer's f32 unsharded gradients (FsdpOptions::f32_unsharded_gradients)
// against param_dtype ones with the model's f32 sinks: in bf16, both round each
// backward's f32 sum once into the reduce dtype, so losses and parameters
// must agree bit for bit, including a no_sync microbatch (whose kept gradient
// stays in param_dtype) before each synchronised one. With reduce_dtype f32
// the f32 gradient is reduced as it is, where the sinks' path rounded it to
// bf16 and widened it again: the results then differ by that rounding only.
struct F32GradCase {
  ShardingStrategy strategy;
  int world;
  int shard_group;
  bool no_sync_microbatch;
  bool reduce_f32;
};

class F32UnshardedGradientsTest : public ::testing::TestWithParam<F32GradCase> {};

TEST_P(F32UnshardedGradientsTest, SameBitsAsParamDtypeGradients) {
  const F32GradCase c = GetParam();
  auto model = *GptModel::Create(testing::TinyGpt());
  auto train = [&](bool f32_grads, std::vector<float>* losses, std::vector<float>* params) {
    std::mutex mu;
    testing::RunRanks(c.world, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o = Options(c.strategy, c.shard_group);
      o.mixed_precision.param_dtype = DType::kBF16;
      if (c.reduce_f32) o.mixed_precision.reduce_dtype = DType::kF32;
      o.f32_unsharded_gradients = f32_grads;
      auto fsdp = FullyShardedModel::Create(model->units(), world, &alloc, o);
      ASSERT_TRUE(fsdp.ok()) << fsdp.status();
      auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
      std::vector<float> mine;
      for (int s = 0; s < 3; ++s) {
        (*fsdp)->ZeroGrad();
        if (c.no_sync_microbatch) {
          (*fsdp)->set_gradient_sync(false);
          StatusOr<float> l = model->ForwardBackward(MakeBatch(100 + s, rank * kRowsPerRank, kRowsPerRank),
                                                     **fsdp, (*fsdp)->activation_allocator());
          ASSERT_TRUE(l.ok()) << l.status();
          (*fsdp)->set_gradient_sync(true);
        }
        StatusOr<float> loss = model->ForwardBackward(MakeBatch(s, rank * kRowsPerRank, kRowsPerRank),
                                                      **fsdp, (*fsdp)->activation_allocator());
        ASSERT_TRUE(loss.ok()) << loss.status();
        ASSERT_TRUE((*fsdp)->OptimizerStep(*opt).ok());
        mine.push_back(*loss);
      }
      std::vector<float> flat;
      for (int u = 0; u < (*fsdp)->num_units(); ++u) {
        for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
          StatusOr<Tensor> t = (*fsdp)->GatherFullParam(u, static_cast<int>(p));
          ASSERT_TRUE(t.ok()) << t.status();
          const float* d = t->data_as<float>();
          flat.insert(flat.end(), d, d + t->numel());
        }
      }
      if (rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      *losses = std::move(mine);
      *params = std::move(flat);
    });
  };
  std::vector<float> loss_sinks, params_sinks, loss_f32, params_f32;
  train(false, &loss_sinks, &params_sinks);
  train(true, &loss_f32, &params_f32);
  ASSERT_EQ(loss_sinks.size(), 3u);
  ASSERT_FALSE(params_sinks.empty());
  ASSERT_EQ(params_f32.size(), params_sinks.size());
  size_t differ = 0;
  for (size_t i = 0; i < params_sinks.size(); ++i) differ += params_f32[i] != params_sinks[i];
  if (c.reduce_f32) {
    // bf16 rounding of the gradients (2^-9 relative) moves a step's update,
    // not the loss's leading digits; the parameters stay within a few
    // learning-rate-sized updates of each other.
    for (size_t s = 0; s < loss_sinks.size(); ++s) {
      ExpectRelClose(loss_f32[s], loss_sinks[s], 1e-3, "loss at step " + std::to_string(s));
    }
    for (size_t i = 0; i < params_sinks.size() && !::testing::Test::HasFailure(); ++i) {
      EXPECT_NEAR(params_f32[i], params_sinks[i], 1e-2) << "parameter " << i;
    }
    EXPECT_GT(differ, 0u) << "reduced unrounded: some update must differ";
  } else {
    for (size_t s = 0; s < loss_sinks.size(); ++s) EXPECT_EQ(loss_f32[s], loss_sinks[s]) << "step " << s;
    EXPECT_EQ(differ, 0u) << "of " << params_sinks.size() << " parameters";
  }
  // The update moved the parameters (the comparison is not of two untouched copies).
  EXPECT_NE(loss_sinks.front(), loss_sinks.back());
}

INSTANTIATE_TEST_SUITE_P(
    Bf16, F32UnshardedGradientsTest,
    ::testing::Values(F32GradCase{ShardingStrategy::kFullShard, 2, 0, false, false},
                      F32GradCase{ShardingStrategy::kFullShard, 2, 0, true, false},
                      F32GradCase{ShardingStrategy::kFullShard, 2, 0, false, true},
                      F32GradCase{ShardingStrategy::kShardGradOp, 2, 0, false, false},
                      F32GradCase{ShardingStrategy::kHybridShard, 4, 2, false, false}),
    [](const ::testing::TestParamInfo<F32GradCase>& info) {
      std::string s = ShardingStrategyName(info.param.strategy);
      s += "_world" + std::to_string(info.param.world);
      if (info.param.no_sync_microbatch) s += "_no_sync";
      if (info.param.reduce_f32) s += "_reduce_f32";
      return s;
    });

}  // namespace
}  // namespace sk
