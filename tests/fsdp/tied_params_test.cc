// Tied parameters (UnitSpec::tied) under every way of training: a tiny GPT
// whose head is its token embedding (GPT-2's tying) trained five steps under
// each FSDP strategy, DDP, CPU offload, both backward prefetches and no_sync
// gradient accumulation ends with the same losses and parameters as one
// unsharded rank (OwnedParameters, whose tied gradient is the sum of both
// uses: tests/nn/gpt_test.cc), and stores the embedding once in checkpoints.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <mutex>

#include "runtime/ddp/ddp.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/memory_estimator.h"
#include "runtime/checkpoint/safetensors.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

using testing::ExpectRelClose;
using testing::MakeBatch;
using testing::RunRanks;

constexpr int kSteps = 5;
constexpr int kRowsPerRank = 2;
constexpr uint64_t kSeed = 1234;

GptConfig TiedGpt() {
  GptConfig c = testing::TinyGpt();
  c.tie_word_embeddings = true;
  return c;
}

struct Case {
  std::string name;
  bool ddp = false;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int world = 2;
  int shard_group = 0;
  bool offload = false;
  BackwardPrefetch prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  bool no_sync_microbatch = false;  // each step: a no_sync half batch, then a synced one
};

std::vector<float> Flatten1(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

class TiedParamsTest : public ::testing::TestWithParam<Case> {};

// The reference: one rank, OwnedParameters, the global batch (as two halves
// accumulated, when the case accumulates).
testing::ReferenceRun Reference(const GptModel& model, int global_rows, bool halves) {
  if (!halves) return testing::RunReference(model, kSteps, global_rows, kSeed);
  testing::ReferenceRun out;
  auto owned = *OwnedParameters::Create(model.units(), kSeed);
  auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
  for (int s = 0; s < kSteps; ++s) {
    owned->ZeroGrad();
    // Rows [0, global/2) and [global/2, global) of the step's batch,
    // each the mean over its half: the gradient is their sum over 2.
    float total = 0;
    for (int h = 0; h < 2; ++h) {
      TokenBatch b;
      b.batch_size = 0;
      b.seq_len = 8;
      for (int r = 0; r < global_rows; ++r) {
        if ((r % kRowsPerRank < kRowsPerRank / 2) != (h == 0)) continue;
        TokenBatch one = MakeBatch(s, r, 1);
        b.inputs.insert(b.inputs.end(), one.inputs.begin(), one.inputs.end());
        b.targets.insert(b.targets.end(), one.targets.begin(), one.targets.end());
        ++b.batch_size;
      }
      total += *model.ForwardBackward(b, *owned, HostAllocator::Default());
    }
    out.losses.push_back(total / 2);
    std::vector<Tensor> ps = owned->all_params(), gs = owned->all_grads();
    EXPECT_TRUE(ScaleGradients(ops::HostContext(), gs, 0.5f).ok());
    EXPECT_TRUE(opt->Step(ops::HostContext(), *ShardRefsFor(ps, gs)).ok());
  }
  for (int u = 0; u < owned->num_units(); ++u) {
    out.params.emplace_back();
    for (size_t p = 0; p < model.units()[u].params.size(); ++p) {
      const Tensor& t = owned->param(u, static_cast<int>(p));
      out.params.back().emplace_back(t.data_as<float>(), t.data_as<float>() + t.numel());
    }
  }
  return out;
}

TEST_P(TiedParamsTest, LossesAndParametersMatchOneUnshardedRank) {
  const Case c = GetParam();
  auto model = *GptModel::Create(TiedGpt());
  ASSERT_EQ(model->units().back().tied.size(), 1u);
  const testing::ReferenceRun ref = Reference(*model, kRowsPerRank * c.world, c.no_sync_microbatch);

  std::mutex mu;
  std::vector<std::vector<float>> losses(c.world);
  std::vector<std::vector<std::vector<std::vector<float>>>> params(c.world);  // [rank][unit][param]
  RunRanks(c.world, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    std::unique_ptr<DataParallelModel> dp;
    FullyShardedModel* fsdp = nullptr;
    DistributedDataParallel* ddp = nullptr;
    if (c.ddp) {
      DdpOptions o;
      o.seed = kSeed;
      o.bucket_bytes = 2048;  // several buckets: the head's and the embedding's differ
      o.timeout = Duration(60'000);
      auto d = DistributedDataParallel::Create(model->units(), world, &alloc, o);
      ASSERT_TRUE(d.ok()) << d.status();
      ddp = d->get();
      dp = std::move(*d);
    } else {
      FsdpOptions o;
      o.strategy = c.strategy;
      o.shard_group_size = c.shard_group;
      o.seed = kSeed;
      o.cpu_offload = c.offload;
      o.backward_prefetch = c.prefetch;
      o.forward_prefetch = c.forward_prefetch;
      o.timeout = Duration(60'000);
      auto f = FullyShardedModel::Create(model->units(), world, &alloc, o);
      ASSERT_TRUE(f.ok()) << f.status();
      fsdp = f->get();
      dp = std::move(*f);
    }
    auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
    for (int s = 0; s < kSteps; ++s) {
      dp->ZeroGrad();
      float loss = 0;
      if (c.no_sync_microbatch) {
        for (int h = 0; h < 2; ++h) {
          dp->set_gradient_sync(h == 1);
          StatusOr<float> l = model->ForwardBackward(
              MakeBatch(s, rank * kRowsPerRank + h * kRowsPerRank / 2, kRowsPerRank / 2), *dp,
              dp->activation_allocator());
          ASSERT_TRUE(l.ok()) << l.status();
          loss += *l / 2;
        }
        ASSERT_TRUE(dp->ScaleGradients(0.5f).ok());
      } else {
        StatusOr<float> l = model->ForwardBackward(MakeBatch(s, rank * kRowsPerRank, kRowsPerRank), *dp,
                                                   dp->activation_allocator());
        ASSERT_TRUE(l.ok()) << l.status();
        loss = *l;
      }
      Status st = dp->OptimizerStep(*opt);
      ASSERT_TRUE(st.ok()) << st;
      losses[rank].push_back(loss);
    }
    std::vector<std::vector<std::vector<float>>> mine;
    for (size_t u = 0; u < model->units().size(); ++u) {
      mine.emplace_back();
      for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
        Tensor t;
        if (ddp != nullptr) {
          t = ddp->param(static_cast<int>(u), static_cast<int>(p));
        } else {
          StatusOr<Tensor> g = fsdp->GatherFullParam(static_cast<int>(u), static_cast<int>(p));
          ASSERT_TRUE(g.ok()) << g.status();
          t = *g;
        }
        mine.back().emplace_back(t.data_as<float>(), t.data_as<float>() + t.numel());
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    params[rank] = std::move(mine);
  });
  for (int s = 0; s < kSteps; ++s) {
    double mean = 0;
    for (int r = 0; r < c.world; ++r) mean += losses[r][s];
    ExpectRelClose(static_cast<float>(mean / c.world), ref.losses[s], 1e-5, "loss at step " + std::to_string(s));
  }
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(params[r].size(), ref.params.size());
    for (size_t u = 0; u < ref.params.size(); ++u) {
      for (size_t p = 0; p < ref.params[u].size(); ++p) {
        for (size_t i = 0; i < ref.params[u][p].size(); ++i) {
          ExpectRelClose(params[r][u][p][i], ref.params[u][p][i], 1e-5,
                         "rank " + std::to_string(r) + " " + FullParamName(model->units()[u], model->units()[u].params[p]) +
                             "[" + std::to_string(i) + "]");
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

std::vector<Case> Cases() {
  using S = ShardingStrategy;
  std::vector<Case> v;
  v.push_back({"FullShard_world2", false, S::kFullShard, 2});
  v.push_back({"FullShard_world4", false, S::kFullShard, 4});
  v.push_back({"ShardGradOp_world2", false, S::kShardGradOp, 2});
  v.push_back({"ShardOptim_world2", false, S::kShardOptim, 2});
  v.push_back({"NoShard_world2", false, S::kNoShard, 2});
  v.push_back({"HybridShard_world4_group2", false, S::kHybridShard, 4, 2});
  v.push_back({"HybridShardGradOp_world4_group2", false, S::kHybridShardGradOp, 4, 2});
  v.push_back({"FullShard_offload", false, S::kFullShard, 2, 0, true});
  v.push_back({"ShardOptim_offload", false, S::kShardOptim, 2, 0, true});
  v.push_back({"FullShard_backward_post", false, S::kFullShard, 2, 0, false, BackwardPrefetch::kBackwardPost});
  v.push_back({"FullShard_no_prefetch_forward_prefetch", false, S::kFullShard, 2, 0, false, BackwardPrefetch::kNone,
               true});
  v.push_back({"FullShard_no_sync_microbatch", false, S::kFullShard, 2, 0, false, BackwardPrefetch::kBackwardPre,
               false, true});
  v.push_back({"NoShard_no_sync_microbatch", false, S::kNoShard, 2, 0, false, BackwardPrefetch::kBackwardPre, false,
               true});
  v.push_back({"Ddp_world2", true});
  v.push_back({"Ddp_world4", true, S::kFullShard, 4});
  v.push_back({"Ddp_no_sync_microbatch", true, S::kFullShard, 2, 0, false, BackwardPrefetch::kBackwardPre, false,
               true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(EveryWayOfTraining, TiedParamsTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// bf16 parameters and gradients: the tied gradient's two halves are each
// rounded into the embedding's bf16 buffer, so the run stays close to f32,
// not equal to it.
TEST(TiedParams, Bf16MixedPrecisionStaysCloseToF32) {
  auto model = *GptModel::Create(TiedGpt());
  const testing::ReferenceRun ref = testing::RunReference(*model, kSteps, 2 * kRowsPerRank, kSeed);
  std::vector<std::vector<float>> losses(2);
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o;
    o.seed = kSeed;
    o.mixed_precision.param_dtype = DType::kBF16;
    o.f32_unsharded_gradients = rank == 0;  // both forms of the unsharded gradient
    o.timeout = Duration(60'000);
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
    auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
    for (int s = 0; s < kSteps; ++s) {
      fsdp->ZeroGrad();
      StatusOr<float> l = model->ForwardBackward(MakeBatch(s, rank * kRowsPerRank, kRowsPerRank), *fsdp,
                                                 fsdp->activation_allocator());
      ASSERT_TRUE(l.ok()) << l.status();
      ASSERT_TRUE(fsdp->OptimizerStep(*opt).ok());
      losses[rank].push_back(*l);
    }
  });
  for (int s = 0; s < kSteps; ++s) {
    const float mean = (losses[0][s] + losses[1][s]) / 2;
    EXPECT_NEAR(mean, ref.losses[s], 0.02 * ref.losses[s]) << "step " << s;
  }
}

// The embedding is one parameter: FSDP shards it once (the head's flat
// parameter holds only its LayerNorm), and a full state dict has embed.wte
// and no head.lm_head.w; it loads back into a fresh model bit for bit.
TEST(TiedParams, StoredOnceInFlatParametersAndStateDicts) {
  auto model = *GptModel::Create(TiedGpt());
  auto untied = *GptModel::Create(testing::TinyGpt());
  EXPECT_EQ(model->num_parameters() + 32 * 16, untied->num_parameters());
  const std::string path = ::testing::TempDir() + "/tied_state_dict.safetensors";
  std::vector<std::vector<float>> before;
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o;
    o.seed = kSeed;
    o.timeout = Duration(60'000);
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
    const int head = fsdp->num_units() - 1;
    EXPECT_EQ(fsdp->layout(head).unpadded_numel(), 2 * 16);
    auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
    fsdp->ZeroGrad();
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank * 2, 2), *fsdp, fsdp->activation_allocator()).ok());
    ASSERT_TRUE(fsdp->OptimizerStep(*opt).ok());
    TrainingState st{"gpt-tied", &model->units(), fsdp.get(), nullptr};
    Status saved = SaveFullStateDict(path, st, 1);
    ASSERT_TRUE(saved.ok()) << saved;
    StatusOr<Tensor> wte = fsdp->GatherFullParam(0, 0);
    ASSERT_TRUE(wte.ok()) << wte.status();
    if (rank == 0) before.push_back(Flatten1(*wte));
  });
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->contains("embed.wte"));
  EXPECT_FALSE(f->contains("head.lm_head.w"));
  EXPECT_EQ(f->names().size(), 2u + 2 * 12 + 2);
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o;
    o.seed = kSeed + 1;  // different initial values: the load must replace them
    o.strategy = ShardingStrategy::kShardOptim;
    o.timeout = Duration(60'000);
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
    TrainingState st{"gpt-tied", &model->units(), fsdp.get(), nullptr};
    StatusOr<int64_t> step = LoadFullStateDict(path, st);
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<float> wte = Flatten1(*fsdp->GatherFullParam(0, 0));
    if (rank == 0) {
      EXPECT_EQ(wte, before[0]);
    }
  });
}

// The estimator counts the tied embedding once: fewer parameters and model
// states than the untied model by exactly the head's matrix, plus what
// borrowing it costs (its gathered copy and full gradient while the head
// runs).
TEST(TiedParams, MemoryEstimateCountsTheEmbeddingOnceAndBoundsThePeak) {
  NamedModelConfig named;
  named.name = "gpt-tied";
  named.family = ModelFamily::kGpt;
  named.gpt = TiedGpt();
  named.seq_len = 8;
  NamedModelConfig untied = named;
  untied.gpt.tie_word_embeddings = false;
  MemoryEstimateRequest r;
  r.model = named;
  r.world_size = 2;
  r.batch_size = kRowsPerRank;
  r.optimizer = testing::TestOptimizer();
  StatusOr<MemoryEstimate> e = EstimatePeakMemory(r);
  ASSERT_TRUE(e.ok()) << e.status();
  r.model = untied;
  StatusOr<MemoryEstimate> eu = EstimatePeakMemory(r);
  ASSERT_TRUE(eu.ok()) << eu.status();
  EXPECT_EQ(e->parameters + 32 * 16, eu->parameters);
  EXPECT_LT(e->master_bytes, eu->master_bytes);
  EXPECT_LT(e->optimizer_bytes, eu->optimizer_bytes);
  EXPECT_GT(e->unsharded_bytes, 0);

}

TEST(TiedParams, BadTiesAreInvalidArgumentNamingTheParameter) {
  auto model = *GptModel::Create(TiedGpt());
  std::vector<UnitSpec> units = model->units();
  units.back().tied[0].owner = "embed.nope";
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto f = FullyShardedModel::Create(units, world, &alloc, FsdpOptions());
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find("head.lm_head.w"), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find("embed.nope"), std::string::npos) << f.status();
    std::vector<UnitSpec> wrong_shape = model->units();
    wrong_shape.back().tied[0].shape = Shape{16, 32};
    auto d = DistributedDataParallel::Create(wrong_shape, world, &alloc, DdpOptions());
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("[32, 16]"), std::string::npos) << d.status();
    // An owner after its user: the user's backward would come too late.
    std::vector<UnitSpec> late = model->units();
    late.front().tied.push_back(TiedParamSpec{"w", "head.ln.g", Shape{16}});
    auto l = FullyShardedModel::Create(late, world, &alloc, FsdpOptions());
    ASSERT_FALSE(l.ok());
    EXPECT_NE(l.status().message().find("earlier unit"), std::string::npos) << l.status();
  });
}

}  // namespace
}  // namespace sk
