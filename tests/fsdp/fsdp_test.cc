// FSDP behaviour beyond equivalence: no_sync, clipping, deferred init, the
// hook protocol, prefetch order, the rate limiter, mixed precision, offload
// and failures.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "runtime/fsdp/fsdp.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

using testing::MakeBatch;
using testing::RunRanks;

constexpr uint64_t kSeed = 99;

FsdpOptions Options(ShardingStrategy s = ShardingStrategy::kFullShard) {
  FsdpOptions o;
  o.strategy = s;
  o.seed = kSeed;
  o.timeout = Duration(60'000);
  return o;
}

std::unique_ptr<GptModel> Tiny(DType compute = DType::kF32) { return testing::TinyGptModel(compute); }

TEST(FsdpTest, DeferredInitShardsEqualSlicesOfAFullInitBitForBit) {
  auto model = Tiny();
  auto full = *OwnedParameters::Create(model->units(), kSeed);
  RunRanks(3, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, Options());
    for (int u = 0; u < fsdp->num_units(); ++u) {
      const float* shard = fsdp->master_shard(u).data_as<float>();
      for (const auto& s : fsdp->layout(u).ShardSlices(rank)) {
        const float* want = full->param(u, s.param).data_as<float>();
        EXPECT_EQ(0, std::memcmp(shard + s.shard_offset, want + s.param_begin,
                                 (s.param_end - s.param_begin) * sizeof(float)))
            << "unit " << u << " param " << s.param << " rank " << rank;
      }
    }
  });
}

// The copies in and out of master shards (ops::Copy on the model's streams):
// a full parameter loaded on every rank comes back from GatherFullParam bit
// for bit, LoadMasterShard takes a host tensor, and bad input changes nothing.
TEST(FsdpTest, LoadAndGatherFullParamsRoundTripThroughTheMasterShards) {
  auto model = Tiny();
  RunRanks(3, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, Options(ShardingStrategy::kShardOptim));
    const int u = 1;
    const auto& specs = fsdp->layout(u).params();
    std::vector<Tensor> params;
    for (size_t p = 0; p < specs.size(); ++p) {
      Tensor t = *HostAllocator::Default().Empty(DType::kF32, specs[p].shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = static_cast<float>(p * 1000 + i) * 0.5f;
      params.push_back(t);
    }
    ASSERT_TRUE(fsdp->LoadFullParams(u, params).ok());
    for (size_t p = 0; p < specs.size(); ++p) {
      StatusOr<Tensor> got = fsdp->GatherFullParam(u, static_cast<int>(p));
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->shape(), specs[p].shape);
      EXPECT_EQ(0, std::memcmp(got->data(), params[p].data(), params[p].nbytes())) << "param " << p;
    }
    // Wrong dtype or size: InvalidArgument naming the unit, the shard unchanged.
    const int64_t n = fsdp->layout(u).shard_numel();
    std::vector<float> before(fsdp->master_shard(u).data_as<float>(),
                              fsdp->master_shard(u).data_as<float>() + n);
    Tensor short_shard = *HostAllocator::Default().Empty(DType::kF32, Shape{n - 1});
    Tensor bf16_shard = *HostAllocator::Default().Empty(DType::kBF16, Shape{n});
    Status s = fsdp->LoadMasterShard(u, short_shard);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(model->units()[u].name), std::string::npos) << s;
    EXPECT_EQ(fsdp->LoadMasterShard(u, bf16_shard).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(fsdp->LoadMasterShard(u, Tensor()).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(0, std::memcmp(fsdp->master_shard(u).data(), before.data(), n * sizeof(float)));
    // A host shard is copied in, and the persistent full parameter follows.
    Tensor ones = *HostAllocator::Default().Empty(DType::kF32, Shape{n});
    for (int64_t i = 0; i < n; ++i) ones.data_as<float>()[i] = 1.f;
    ASSERT_TRUE(fsdp->LoadMasterShard(u, ones).ok());
    EXPECT_EQ(0, std::memcmp(fsdp->master_shard(u).data(), ones.data(), n * sizeof(float)));
    StatusOr<Tensor> first = fsdp->GatherFullParam(u, 0);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(first->data_as<float>()[0], 1.f);
  });
}

// M micro-batches with gradient sync off for all but the last equal one
// batch M times larger (mean losses, so each micro-batch's loss is scaled 1/M
// by comparing against the mean of the micro-batch means).
TEST(FsdpTest, NoSyncAccumulationEqualsOneLargerBatch) {
  auto model = Tiny();
  constexpr int kWorld = 2, kMicro = 3, kRows = 2;
  std::vector<std::vector<float>> accumulated(kWorld), large(kWorld);
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto a = *FullyShardedModel::Create(model->units(), world, &alloc, Options());
    for (int m = 0; m < kMicro; ++m) {
      a->set_gradient_sync(m == kMicro - 1);
      TokenBatch b = MakeBatch(0, (rank * kMicro + m) * kRows, kRows);
      ASSERT_TRUE(model->ForwardBackward(b, *a, a->activation_allocator()).ok());
    }
    ASSERT_TRUE(a->FinishBackward().ok());
    auto b = *FullyShardedModel::Create(model->units(), world, &alloc, Options());
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank * kMicro * kRows, kMicro * kRows), *b,
                                       b->activation_allocator()).ok());
    ASSERT_TRUE(b->FinishBackward().ok());
    for (int u = 0; u < a->num_units(); ++u) {
      const float* ga = a->grad_shard(u).data_as<float>();
      const float* gb = b->grad_shard(u).data_as<float>();
      for (int64_t i = 0; i < a->layout(u).shard_numel(); ++i) {
        // Accumulated micro-batch means sum to kMicro times the large batch's mean.
        EXPECT_NEAR(ga[i] / kMicro, gb[i], 1e-5 * (1 + std::fabs(gb[i]))) << "unit " << u << " elem " << i;
      }
    }
  });
}

// Issue 45, item 1: gradient shards exist only while a step has gradients.
// ZeroGrad gives their memory back; the step's first reduction of a unit
// makes its shard and copies (widening) into it, later ones add: the sum of
// two synced backwards is bit for bit the f32 sum of each one's reduced
// gradient, in f32 and with a bf16 reduction.
TEST(FsdpTest, GradientShardsLiveFromTheFirstReductionUntilZeroGrad) {
  auto model = Tiny();
  for (bool bf16_reduce : {false, true}) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o = Options();
      if (bf16_reduce) o.mixed_precision.reduce_dtype = DType::kBF16;
      auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
      for (int u = 0; u < fsdp->num_units(); ++u) EXPECT_FALSE(fsdp->grad_shard(u).defined()) << u;
      const int64_t idle = alloc.stats().allocated_bytes.current;
      int64_t shard_bytes = 0;
      for (int u = 0; u < fsdp->num_units(); ++u) {
        shard_bytes += (fsdp->layout(u).shard_numel() * 4 + 511) / 512 * 512;
      }
      // The reduced gradient of each of two batches alone.
      std::vector<std::vector<std::vector<float>>> alone(2);
      for (int b = 0; b < 2; ++b) {
        ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 2 * rank + b, 1), *fsdp, fsdp->activation_allocator()).ok());
        ASSERT_TRUE(fsdp->FinishBackward().ok());
        EXPECT_EQ(alloc.stats().allocated_bytes.current, idle + shard_bytes) << "batch " << b;
        for (int u = 0; u < fsdp->num_units(); ++u) {
          const Tensor& g = fsdp->grad_shard(u);
          ASSERT_TRUE(g.defined()) << u;
          alone[b].emplace_back(g.data_as<float>(), g.data_as<float>() + g.numel());
        }
        fsdp->ZeroGrad();
        for (int u = 0; u < fsdp->num_units(); ++u) EXPECT_FALSE(fsdp->grad_shard(u).defined()) << u;
        EXPECT_EQ(alloc.stats().allocated_bytes.current, idle) << "batch " << b;
      }
      // Both, each reduced as it finishes: the second adds into the first.
      for (int b = 0; b < 2; ++b) {
        ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 2 * rank + b, 1), *fsdp, fsdp->activation_allocator()).ok());
      }
      ASSERT_TRUE(fsdp->FinishBackward().ok());
      for (int u = 0; u < fsdp->num_units(); ++u) {
        const float* got = fsdp->grad_shard(u).data_as<float>();
        for (size_t i = 0; i < alone[0][u].size(); ++i) {
          const float want = alone[0][u][i] + alone[1][u][i];
          ASSERT_EQ(0, std::memcmp(&got[i], &want, sizeof(float)))
              << "unit " << u << " elem " << i << (bf16_reduce ? " (bf16 reduction)" : "");
        }
      }
    });
  }
}

// A unit no reduction reached has a zero gradient: FinishBackward gives it a
// shard of zeros (here: every unit, after a no_sync backward only).
TEST(FsdpTest, FinishBackwardGivesUnitsWithoutAReductionZeroGradients) {
  auto model = Tiny();
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, Options());
    fsdp->set_gradient_sync(false);
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank, 1), *fsdp, fsdp->activation_allocator()).ok());
    fsdp->set_gradient_sync(true);
    ASSERT_TRUE(fsdp->FinishBackward().ok());
    for (int u = 0; u < fsdp->num_units(); ++u) {
      const Tensor& g = fsdp->grad_shard(u);
      ASSERT_TRUE(g.defined()) << u;
      for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.data_as<float>()[i], 0.f) << u << " " << i;
    }
  });
}

TEST(FsdpTest, ClipGradNormReturnsTheUnshardedNormAndClipsToIt) {
  auto model = Tiny();
  constexpr int kWorld = 4, kRows = 1;
  // The unsharded gradient of the global batch, on one rank.
  auto owned = *OwnedParameters::Create(model->units(), kSeed);
  ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 0, kWorld * kRows), *owned, HostAllocator::Default()).ok());
  double sq = 0, mx = 0;
  for (const Tensor& g : owned->all_grads()) {
    for (int64_t i = 0; i < g.numel(); ++i) {
      double x = g.data_as<float>()[i];
      sq += x * x;
      mx = std::max(mx, std::fabs(x));
    }
  }
  const double want_l2 = std::sqrt(sq);
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, Options());
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank * kRows, kRows), *fsdp, fsdp->activation_allocator()).ok());
    StatusOr<double> inf = fsdp->ClipGradNorm(0, NormType::kInf);
    ASSERT_TRUE(inf.ok()) << inf.status();
    EXPECT_NEAR(*inf, mx, 1e-5 * mx);
    StatusOr<double> l2 = fsdp->ClipGradNorm(want_l2 / 2);
    ASSERT_TRUE(l2.ok());
    EXPECT_NEAR(*l2, want_l2, 1e-5 * want_l2);
    StatusOr<double> after = fsdp->ClipGradNorm(0);
    EXPECT_NEAR(*after, want_l2 / 2, 1e-4 * want_l2);
    EXPECT_EQ(fsdp->ClipGradNorm(-1).status().code(), StatusCode::kInvalidArgument);
  });
}

TEST(FsdpTest, HookCallsOutOfOrderAreFailedPreconditionNamingUnitAndState) {
  auto model = Tiny();
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, Options());
    Status s = fsdp->PostForward(1);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("'h.0'"), std::string::npos) << s;
    EXPECT_NE(s.message().find("idle"), std::string::npos) << s;
    EXPECT_EQ(fsdp->PreBackward(0).status().code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(fsdp->PreForward(0).ok());
    EXPECT_EQ(fsdp->PreForward(0).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(fsdp->PostBackward(0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(fsdp->FinishBackward().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(fsdp->PreForward(99).status().code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(fsdp->PostForward(0).ok());
    // The protocol still works after the rejected calls.
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 0, 1), *fsdp, fsdp->activation_allocator()).ok());
  });
}

// Records, around each FSDP hook, which all-gathers had been issued, so the
// test can see what was prefetched before a unit's gradients were computed.
class RecordingHooks final : public UnitHooks {
 public:
  explicit RecordingHooks(FullyShardedModel* f) : f_(f) {}
  StatusOr<std::vector<Tensor>> PreForward(int u) override { return f_->PreForward(u); }
  Status PostForward(int u) override { return f_->PostForward(u); }
  StatusOr<UnitBackwardBuffers> PreBackward(int u) override {
    auto r = f_->PreBackward(u);
    gathered_before_compute.push_back(f_->all_gather_log());
    max_alive = std::max(max_alive, f_->counters().max_unsharded_alive);
    return r;
  }
  Status PostBackward(int u) override { return f_->PostBackward(u); }
  std::vector<std::vector<int>> gathered_before_compute;
  int max_alive = 0;

 private:
  FullyShardedModel* f_;
};

TEST(FsdpTest, BackwardPrefetchIssuesInReverseRecordedOrder) {
  auto model = Tiny();
  const int units = static_cast<int>(model->units().size());
  for (BackwardPrefetch mode : {BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost,
                                BackwardPrefetch::kNone}) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o = Options();
      o.backward_prefetch = mode;
      auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
      RecordingHooks hooks(fsdp.get());
      ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank, 1), hooks, fsdp->activation_allocator()).ok());
      std::vector<int> forward(fsdp->forward_order());
      ASSERT_EQ(static_cast<int>(forward.size()), units);
      // Backward all-gathers, in issue order, are the reverse forward order.
      std::vector<int> backward(fsdp->all_gather_log().begin() + units, fsdp->all_gather_log().end());
      EXPECT_EQ(backward, std::vector<int>(forward.rbegin(), forward.rend())) << BackwardPrefetchName(mode);
      // When the first backward unit's gradients are about to be computed
      // (its PreBackward returned), BACKWARD_PRE has already issued the next
      // unit's all-gather; BACKWARD_POST issues it only after them, in
      // PostBackward; NONE never issues ahead.
      for (int k = 0; k + 1 < units; ++k) {
        const std::vector<int>& log = hooks.gathered_before_compute[k];
        int next = forward[units - 2 - k];
        bool issued = std::find(log.begin() + units, log.end(), next) != log.end();
        if (k == 0) {
          // The default limit (2) allows exactly one unit ahead of the current one.
          EXPECT_EQ(log.size() - units, mode == BackwardPrefetch::kBackwardPre ? 2u : 1u)
              << BackwardPrefetchName(mode);
        }
        if (k == 0 || mode == BackwardPrefetch::kNone) {
          EXPECT_EQ(issued, mode == BackwardPrefetch::kBackwardPre)
              << BackwardPrefetchName(mode) << " at backward step " << k;
        }
      }
      if (mode == BackwardPrefetch::kNone) {
        EXPECT_EQ(fsdp->counters().prefetches, 0);
      } else {
        EXPECT_GT(fsdp->counters().prefetches, 0);
      }
    });
  }
}

// One meaning per value: N >= 1 in flight is a limit, RateLimit::Off() is
// none, and 0 in flight (the C ABI's "default", once this field's "no
// limit") is rejected.
TEST(FsdpTest, AllGatherLimitZeroIsRejectedAndOffMeansNoLimit) {
  FsdpOptions o;
  EXPECT_EQ(o.all_gather_limit, RateLimit::InFlight(2));
  EXPECT_TRUE(ValidateFsdpOptions(o, 2).ok());
  o.all_gather_limit = RateLimit::Off();
  EXPECT_TRUE(ValidateFsdpOptions(o, 2).ok());
  for (int bad : {0, -2}) {
    o.all_gather_limit = RateLimit::InFlight(bad);
    Status s = ValidateFsdpOptions(o, 2);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.ToString().find("all_gather_limit"), std::string::npos) << s;
  }
}

// Issue 14, item 12: the all-gather log used to grow by every all-gather
// forever (a leak of ~32 bytes per step per rank). It now covers one step.
TEST(FsdpTest, AllGatherLogStaysBoundedOverManySteps) {
  auto model = Tiny();
  const size_t units = model->units().size();
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, Options());
    size_t first_step = 0;
    for (int step = 0; step < 50; ++step) {
      ASSERT_TRUE(model->ForwardBackward(MakeBatch(step, rank, 1), *fsdp, fsdp->activation_allocator()).ok());
      if (step == 0) first_step = fsdp->all_gather_log().size();
      // Forward and backward gather each unit at most once per step.
      EXPECT_LE(fsdp->all_gather_log().size(), 2 * units) << "step " << step;
    }
    EXPECT_EQ(fsdp->all_gather_log().size(), first_step);
  });
}

TEST(FsdpTest, RateLimiterBoundsUnshardedParametersInFlight) {
  ModelOptions mo;
  GptConfig cfg = testing::TinyGpt();
  cfg.n_layer = 4;
  auto model = *GptModel::Create(cfg, mo);
  for (RateLimit limit : {RateLimit::InFlight(1), RateLimit::InFlight(2), RateLimit::InFlight(3), RateLimit::Off()}) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o = Options();
      o.forward_prefetch = true;
      o.all_gather_limit = limit;
      auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
      for (int step = 0; step < 2; ++step) {  // step 2 forward-prefetches by the recorded order
        ASSERT_TRUE(model->ForwardBackward(MakeBatch(step, rank, 1), *fsdp, fsdp->activation_allocator()).ok());
        ASSERT_TRUE(fsdp->FinishBackward().ok());
      }
      const FsdpCounters& c = fsdp->counters();
      if (!limit.off()) {
        EXPECT_LE(c.max_unsharded_alive, limit.max_in_flight()) << "limit " << limit;
        if (limit.max_in_flight() == 1) {
          EXPECT_EQ(c.prefetches, 0);
        } else {
          EXPECT_EQ(c.max_unsharded_alive, limit.max_in_flight());
        }
        EXPECT_GT(c.prefetches_deferred, 0);
      } else {
        // Off: prefetching races ahead and many units are unsharded at once.
        EXPECT_GT(c.max_unsharded_alive, 3);
        EXPECT_EQ(c.prefetches_deferred, 0);
      }
    });
  }
}

TEST(FsdpTest, Bf16MixedPrecisionStaysWithinToleranceOfF32) {
  auto f32 = Tiny(DType::kF32);
  auto bf16 = Tiny(DType::kBF16);
  std::vector<float> loss32(2), loss16(2);
  for (int run = 0; run < 2; ++run) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o = Options();
      if (run == 1) o.mixed_precision.param_dtype = DType::kBF16;
      const GptModel& m = run == 0 ? *f32 : *bf16;
      auto fsdp = *FullyShardedModel::Create(m.units(), world, &alloc, o);
      auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
      float last = 0;
      for (int s = 0; s < 3; ++s) {
        fsdp->ZeroGrad();
        auto loss = m.ForwardBackward(MakeBatch(s, rank * 2, 2), *fsdp, fsdp->activation_allocator());
        ASSERT_TRUE(loss.ok()) << loss.status();
        ASSERT_TRUE(fsdp->OptimizerStep(*opt).ok());
        last = *loss;
      }
      (run == 0 ? loss32 : loss16)[rank] = last;
    });
  }
  // bf16 has 8 bits of mantissa: losses agree to about 1%.
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(loss16[r], loss32[r], 0.02 * loss32[r]);
}

TEST(FsdpTest, ReduceDtypeBf16ReducesInLowPrecision) {
  auto model = Tiny();
  std::vector<std::vector<float>> grads(2);
  for (int run = 0; run < 2; ++run) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o = Options();
      if (run == 1) o.mixed_precision.reduce_dtype = DType::kBF16;
      auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
      ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank, 1), *fsdp, fsdp->activation_allocator()).ok());
      ASSERT_TRUE(fsdp->FinishBackward().ok());
      if (rank == 0) {
        const Tensor& g = fsdp->grad_shard(1);
        grads[run].assign(g.data_as<float>(), g.data_as<float>() + g.numel());
      }
    });
  }
  bool any_different = false;
  double scale = 0;
  for (float g : grads[0]) scale = std::max(scale, std::fabs(double(g)));
  for (size_t i = 0; i < grads[0].size(); ++i) {
    // Inputs and the sum are each rounded to bf16 (8 significant bits).
    EXPECT_NEAR(grads[1][i], grads[0][i], scale / 64);
    any_different |= grads[1][i] != grads[0][i];
  }
  EXPECT_TRUE(any_different) << "bf16 reduction should round";
}

TEST(FsdpTest, CpuOffloadKeepsShardsOutOfTheDeviceAllocator) {
  auto model = Tiny();
  std::vector<int64_t> reserved(2);
  std::vector<float> losses(2);
  for (int run = 0; run < 2; ++run) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      HostAllocator host;
      FsdpOptions o = Options();
      o.cpu_offload = run == 1;
      auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o, &host);
      auto opt = *Optimizer::Create(testing::TestOptimizer(), &host);
      auto loss = model->ForwardBackward(MakeBatch(0, rank, 1), *fsdp, fsdp->activation_allocator());
      ASSERT_TRUE(loss.ok());
      ASSERT_TRUE(fsdp->OptimizerStep(*opt).ok());
      loss = model->ForwardBackward(MakeBatch(1, rank, 1), *fsdp, fsdp->activation_allocator());
      ASSERT_TRUE(fsdp->FinishBackward().ok());
      if (rank == 0) {
        losses[run] = *loss;
        reserved[run] = alloc.stats().allocated_bytes.current;
      }
    });
  }
  EXPECT_EQ(losses[0], losses[1]);  // same arithmetic, different memory
  EXPECT_LT(reserved[1], reserved[0]);
}

// Offload moves the shards and the optimizer step to the host context
// (host->device copies on the all-gather stream, device->host copies and
// the host accumulation on the reduce stream). On cpu the copies are exact,
// so with bf16 compute, bf16 reduction, gradient accumulation (no_sync) and
// clipping the master shards, optimizer state and gradient norms are
// bit-identical to the run without offload, for every strategy.
TEST(FsdpTest, CpuOffloadIsBitIdenticalToNoOffloadOnCpu) {
  auto model = Tiny(DType::kBF16);
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    std::vector<std::vector<float>> masters(2), state(2);
    std::vector<double> norms[2];
    for (int run = 0; run < 2; ++run) {
      std::mutex mu;
      RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
        CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
        HostAllocator host;
        FsdpOptions o = Options(strategy);
        o.mixed_precision.param_dtype = DType::kBF16;
        o.mixed_precision.reduce_dtype = DType::kBF16;
        o.cpu_offload = run == 1;
        auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o, &host);
        auto opt = *Optimizer::Create(testing::TestOptimizer(), &host);
        for (int step = 0; step < 3; ++step) {
          fsdp->ZeroGrad();
          fsdp->set_gradient_sync(false);
          ASSERT_TRUE(model->ForwardBackward(MakeBatch(2 * step, rank, 1), *fsdp, fsdp->activation_allocator()).ok());
          fsdp->set_gradient_sync(true);
          ASSERT_TRUE(model->ForwardBackward(MakeBatch(2 * step + 1, rank, 1), *fsdp, fsdp->activation_allocator()).ok());
          StatusOr<double> norm = fsdp->ClipGradNorm(0.05);
          ASSERT_TRUE(norm.ok()) << norm.status();
          ASSERT_TRUE(fsdp->OptimizerStep(*opt).ok());
          if (rank == 0) norms[run].push_back(*norm);
        }
        if (run == 1) {
          // The shards and the optimizer state are host memory, outside the
          // device allocator, and the shards' context is the host's.
          EXPECT_TRUE(fsdp->master_shard(0).device().is_cpu());
          EXPECT_EQ(fsdp->shard_context().alloc, &HostAllocator::Default());
          EXPECT_EQ(fsdp->shard_context().stream, nullptr);
        }
        std::lock_guard<std::mutex> lock(mu);
        if (rank != 0) return;
        for (int u = 0; u < fsdp->num_units(); ++u) {
          const Tensor& m = fsdp->master_shard(u);
          masters[run].insert(masters[run].end(), m.data_as<float>(), m.data_as<float>() + m.numel());
          for (const std::string& name : opt->StateNames()) {
            Tensor t = *opt->State(u, name);
            state[run].insert(state[run].end(), t.data_as<float>(), t.data_as<float>() + t.numel());
          }
        }
      });
    }
    ASSERT_FALSE(masters[0].empty());
    EXPECT_EQ(masters[0], masters[1]);
    EXPECT_EQ(state[0], state[1]);
    EXPECT_EQ(norms[0], norms[1]);
  }
}

// A host stream for offloaded ops must be on the offload allocator's device,
// and a host that is not a cpu needs one: both are rejected at wrap time.
TEST(FsdpTest, CpuOffloadHostStreamMustMatchTheOffloadAllocator) {
  auto model = Tiny();
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o = Options();
    o.cpu_offload = true;
    HostAllocator elsewhere(DeviceId::Cpu(7));
    auto stream = *(*Device::Get(DeviceId::Cpu(rank + 3)))->CreateStream("host");
    auto bad = FullyShardedModel::Create(model->units(), world, &alloc, o, &elsewhere, stream.get());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
    EXPECT_NE(bad.status().message().find("host stream"), std::string::npos) << bad.status();
  });
}

TEST(FsdpTest, ParametersDeclaredTwiceAndBadOptionsAreRejectedAtWrapTime) {
  auto model = Tiny();
  std::vector<UnitSpec> units = model->units();
  units[1].name = units[0].name;
  units[1].params = units[0].params;
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto twice = FullyShardedModel::Create(units, world, &alloc, Options());
    EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(twice.status().message().find("declared by two units"), std::string::npos) << twice.status();
    FsdpOptions o = Options();
    o.strategy = static_cast<ShardingStrategy>(77);
    EXPECT_EQ(FullyShardedModel::Create(model->units(), world, &alloc, o).status().code(),
              StatusCode::kInvalidArgument);
    o = Options(ShardingStrategy::kHybridShard);
    o.shard_group_size = 3;
    EXPECT_EQ(ValidateFsdpOptions(o, 4).code(), StatusCode::kInvalidArgument);
    o = Options();
    o.mixed_precision.param_dtype = DType::kInvalid;
    EXPECT_NE(ValidateFsdpOptions(o, 1).message().find("param_dtype"), std::string::npos);
    EXPECT_EQ(FullyShardedModel::Create(model->units(), nullptr, &alloc, Options()).status().code(),
              StatusCode::kInvalidArgument);
  });
}

// A rank that stops taking part makes the others fail within the timeout,
// and a failed step leaves master shards untouched.
TEST(FsdpTest, MissingPeerFailsTheStepWithinTheTimeoutAndLosesNothing) {
  auto model = Tiny();
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o = Options();
    o.timeout = Duration(300);
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
    if (rank == 1) return;  // never trains
    std::vector<float> before(fsdp->master_shard(0).data_as<float>(),
                              fsdp->master_shard(0).data_as<float>() + fsdp->master_shard(0).numel());
    auto loss = model->ForwardBackward(MakeBatch(0, 0, 1), *fsdp, fsdp->activation_allocator());
    ASSERT_FALSE(loss.ok());
    EXPECT_EQ(loss.status().code(), StatusCode::kDeadlineExceeded) << loss.status();
    EXPECT_EQ(0, std::memcmp(before.data(), fsdp->master_shard(0).data(), before.size() * 4));
    // Every unit is back to idle: a new step may start (and fails the same way).
    EXPECT_EQ(model->ForwardBackward(MakeBatch(0, 0, 1), *fsdp, fsdp->activation_allocator()).status().code(),
              StatusCode::kDeadlineExceeded);
  });
}

}  // namespace
}  // namespace sk
