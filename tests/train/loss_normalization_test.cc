// The step's loss over micro-batches and ranks (runtime/train/
// loss_normalization.h): the mean over every counted target, however
// unevenly masks spread them, equal to one unsharded step on all the
// sequences at once; uniform batches keep the trainer's original
// arithmetic bit for bit; the caller's batches (Trainer::StepOnBatches)
// are checked on every rank before anything changes.
#include "runtime/train/loss_normalization.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

TEST(LossNormalization, UniformCountsKeepThePerMicroBatchMeans) {
  LossNormalization l = NormalizeLoss({8, 8, 8, 8}, 2);
  EXPECT_TRUE(l.uniform);
  EXPECT_EQ(l.global_tokens, 32);
  EXPECT_EQ(l.denominator, 0);
  l = NormalizeLoss({3, 8, 0, 5}, 2);
  EXPECT_FALSE(l.uniform);
  EXPECT_EQ(l.global_tokens, 16);
  EXPECT_DOUBLE_EQ(l.denominator, 8.0);  // N / W: the ranks' average divides by W again
  l = NormalizeLoss({0, 0}, 1);
  EXPECT_TRUE(l.uniform);
  EXPECT_EQ(l.global_tokens, 0);
}

TEST(LossNormalization, CountedTargetsSkipIgnoredOnes) {
  TokenBatch b;
  b.targets = {1, kIgnoreTarget, 3, kIgnoreTarget};
  EXPECT_EQ(CountedTargets(b), 2);
}

// TokenBatch::loss_denominator D: the gradient is that of the summed
// counted losses / D, i.e. the mean's gradient x count / D, in every model
// family (the head's cross-entropy backward takes 1 / D per counted
// target); the returned loss stays the batch's mean. Bad values are refused.
TEST(LossNormalization, ALossDenominatorScalesTheGradientOfTheSum) {
  for (const char* name : {"gpt-tiny", "llama-tiny", "t5-tiny", "regnet-tiny"}) {
    auto model = *CreateModel(name);
    auto owned = *OwnedParameters::Create(model->units(), 3);
    TrainerOptions o;
    o.model = name;
    o.batch_size = 2;
    o.seq_len = 8;
    o.source_len = std::string(name) == "t5-tiny" ? 8 : 0;
    if (std::string(name) == "regnet-tiny") o.seq_len = 1;
    // A batch from the model's own family: the trainer's sampler.
    Status s = comm::RunLocalRanks(1, [&](int, comm::ProcessGroup* g) -> Status {
      SK_ASSIGN_OR_RETURN(auto t, Trainer::Create(o, g));
      SK_ASSIGN_OR_RETURN(TokenBatch b, t->BatchFor(0, 0));
      b.targets[0] = kIgnoreTarget;
      const int64_t count = CountedTargets(b);
      owned->ZeroGrad();
      SK_ASSIGN_OR_RETURN(float mean, model->ForwardBackward(b, *owned, HostAllocator::Default()));
      std::vector<std::vector<float>> g_mean;
      for (const Tensor& g : owned->all_grads()) g_mean.emplace_back(g.data_as<float>(), g.data_as<float>() + g.numel());
      owned->ZeroGrad();
      b.loss_denominator = 3.0 * count;
      SK_ASSIGN_OR_RETURN(float same, model->ForwardBackward(b, *owned, HostAllocator::Default()));
      EXPECT_EQ(same, mean) << name;
      const std::vector<Tensor> grads = owned->all_grads();
      float scale = 0;
      for (const auto& g : g_mean) for (float x : g) scale = std::max(scale, std::fabs(x));
      EXPECT_GT(scale, 0.0f) << name;
      for (size_t k = 0; k < grads.size(); ++k) {
        for (int64_t e = 0; e < grads[k].numel(); ++e) {
          EXPECT_NEAR(grads[k].data_as<float>()[e], g_mean[k][e] / 3.0f, 1e-6f * scale) << name;
        }
      }
      b.loss_denominator = -1;
      EXPECT_EQ(model->ForwardBackward(b, *owned, HostAllocator::Default()).status().code(),
                StatusCode::kInvalidArgument) << name;
      b.loss_denominator = std::numeric_limits<double>::infinity();
      EXPECT_EQ(model->ValidateBatch(b).code(), StatusCode::kInvalidArgument) << name;
      return OkStatus();
    });
    EXPECT_TRUE(s.ok()) << name << ": " << s;
  }
}

void RunRanks(int world, const std::function<void(int, comm::ProcessGroup*)>& body) {
  Status s = comm::RunLocalRanks(world, [&](int r, comm::ProcessGroup* g) {
    body(r, g);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TrainerOptions Tiny() {
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 2;
  o.seq_len = 16;
  o.grad_accum_steps = 2;
  o.data_tokens = 96;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = 0.5f;
  o.fsdp.seed = 11;
  o.fsdp.timeout = Duration(60'000);
  return o;
}

using Params = std::vector<std::vector<std::vector<float>>>;  // [unit][param][elem]

Params Gather(Trainer& t) {
  Params out;
  const auto& units = t.model().units();
  for (size_t u = 0; u < units.size(); ++u) {
    out.emplace_back();
    for (size_t p = 0; p < units[u].params.size(); ++p) {
      StatusOr<Tensor> full = t.fsdp()->GatherFullParam(static_cast<int>(u), static_cast<int>(p));
      EXPECT_TRUE(full.ok()) << full.status();
      if (full.ok()) out.back().emplace_back(full->data_as<float>(), full->data_as<float>() + full->numel());
    }
  }
  return out;
}

// Micro-batch m of rank r: the trainer's own batch cut to `len` positions
// with the targets of `masked` positions of each row ignored (uneven
// counts on purpose: rank 0's first micro-batch counts 2 targets, rank
// 1's second all 32).
TokenBatch Masked(Trainer& t, int m, int64_t len, int masked) {
  TokenBatch b = *t.BatchFor(0, m);
  TokenBatch out;
  out.batch_size = b.batch_size;
  out.seq_len = len;
  for (int64_t r = 0; r < b.batch_size; ++r) {
    for (int64_t i = 0; i < len; ++i) {
      out.inputs.push_back(b.inputs[r * b.seq_len + i]);
      out.targets.push_back(i < masked ? kIgnoreTarget : b.targets[r * b.seq_len + i]);
    }
  }
  return out;
}

// Two ranks x two micro-batches with 2, 12, 20 and 32 counted targets
// (seq_len 8 and 16 mixed) step exactly like one unsharded step on all the
// sequences at once, whose loss is the mean over every counted target
// (what PyTorch's ignore_index mean over the global batch gives).
TEST(LossNormalization, UnevenMasksStepLikeOneBatchOfEverything) {
  constexpr int kWorld = 2;
  const TrainerOptions o = Tiny();
  std::vector<TokenBatch> micro(4);
  std::vector<StepMetrics> metrics(kWorld);
  Params params;
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    auto t = Trainer::Create(o, world);
    ASSERT_TRUE(t.ok()) << t.status();
    std::vector<TokenBatch> mine = rank == 0
        ? std::vector<TokenBatch>{Masked(**t, 0, 8, 7), Masked(**t, 1, 16, 10)}
        : std::vector<TokenBatch>{Masked(**t, 0, 16, 6), Masked(**t, 1, 16, 0)};
    micro[rank * 2] = mine[0];
    micro[rank * 2 + 1] = mine[1];
    StatusOr<StepMetrics> r = (*t)->StepOnBatches(mine);
    ASSERT_TRUE(r.ok()) << r.status();
    metrics[rank] = *r;
    Params p = Gather(**t);
    if (rank == 0) params = std::move(p);
  });
  ASSERT_FALSE(params.empty());
  EXPECT_EQ(metrics[0].target_tokens, 2 + 12);
  EXPECT_EQ(metrics[1].target_tokens, 20 + 32);
  EXPECT_EQ(metrics[0].global_target_tokens, 66);

  // The reference: every sequence in one batch (padded to 16 with ignored
  // targets), one unsharded ForwardBackward and SGD step.
  TokenBatch all;
  all.seq_len = 16;
  for (const TokenBatch& b : micro) {
    for (int64_t r = 0; r < b.batch_size; ++r) {
      for (int64_t i = 0; i < 16; ++i) {
        const bool in = i < b.seq_len;
        all.inputs.push_back(in ? b.inputs[r * b.seq_len + i] : 0);
        all.targets.push_back(in ? b.targets[r * b.seq_len + i] : kIgnoreTarget);
      }
      ++all.batch_size;
    }
  }
  auto model = *CreateModel(o.model);
  auto owned = *OwnedParameters::Create(model->units(), o.fsdp.seed);
  auto opt = *Optimizer::Create(o.optimizer, &HostAllocator::Default());
  owned->ZeroGrad();
  StatusOr<float> loss = model->ForwardBackward(all, *owned, HostAllocator::Default());
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(opt->Step(ops::HostContext(), *ShardRefsFor(owned->all_params(), owned->all_grads())).ok());
  for (const StepMetrics& m : metrics) EXPECT_NEAR(m.global_loss, *loss, 2e-6 * *loss);
  double max_diff = 0, max_update = 0;
  for (int u = 0; u < owned->num_units(); ++u) {
    for (size_t p = 0; p < params[u].size(); ++p) {
      const Tensor& want = owned->param(u, static_cast<int>(p));
      const Tensor& g = owned->grad(u, static_cast<int>(p));
      for (int64_t k = 0; k < want.numel(); ++k) {
        max_diff = std::max(max_diff, std::fabs(double{params[u][p][k]} - want.data_as<float>()[k]));
        max_update = std::max(max_update, std::fabs(double{o.optimizer.lr} * g.data_as<float>()[k]));
      }
    }
  }
  EXPECT_GT(max_update, 1e-3);
  EXPECT_LT(max_diff, 1e-5 * max_update) << "max update " << max_update;
}

// Micro-batches that all count as many targets take the trainer's
// original arithmetic (per-micro-batch means, summed, times 1/M): the
// caller passing the trainer's own batches steps to the same bits as Step.
TEST(LossNormalization, UniformBatchesFromTheCallerStepAsStepDoes) {
  constexpr int kWorld = 2;
  TrainerOptions o = Tiny();
  o.grad_accum_steps = 3;  // not a power of two: 1/M is not exact
  std::vector<Params> by_step(kWorld), by_batches(kWorld);
  std::vector<float> loss_step(kWorld), loss_batches(kWorld);
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    auto a = *Trainer::Create(o, world);
    StatusOr<StepMetrics> r = a->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    loss_step[rank] = r->global_loss;
    by_step[rank] = Gather(*a);
    auto b = *Trainer::Create(o, world);
    std::vector<TokenBatch> mine;
    for (int m = 0; m < o.grad_accum_steps; ++m) mine.push_back(*b->BatchFor(0, m));
    r = b->StepOnBatches(mine);
    ASSERT_TRUE(r.ok()) << r.status();
    loss_batches[rank] = r->global_loss;
    by_batches[rank] = Gather(*b);
  });
  EXPECT_EQ(loss_step, loss_batches);
  EXPECT_TRUE(by_step[0] == by_batches[0]);
}

// A bad batch on one rank fails the step on both, naming the micro-batch
// and field; nothing changes, and the next step works.
TEST(LossNormalization, BadCallerBatchesFailEveryRankAndChangeNothing) {
  constexpr int kWorld = 2;
  const TrainerOptions o = Tiny();
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    auto t = *Trainer::Create(o, world);
    const Params before = Gather(*t);
    std::vector<TokenBatch> good = {*t->BatchFor(0, 0), *t->BatchFor(0, 1)};
    auto expect_refused = [&](std::vector<TokenBatch> mine, const std::string& what) {
      if (rank == 1) mine = good;  // only rank 0's batches are bad
      StatusOr<StepMetrics> r = t->StepOnBatches(mine);
      ASSERT_FALSE(r.ok()) << what;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
      EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
      EXPECT_EQ(t->steps(), 0);
    };
    expect_refused({good[0]}, "grad_accum_steps = 2");
    std::vector<TokenBatch> bad = good;
    bad[1].inputs[3] = 1 << 20;
    expect_refused(bad, "micro-batch 1");
    bad = good;
    bad[0].seq_len = 17;
    expect_refused(bad, "seq_len 17 is outside [1, 16]");
    bad = good;
    bad[1].batch_size = 3;
    expect_refused(bad, "batch_size 3 is outside [1, 2]");
    bad = good;
    bad[0].loss_denominator = 4;
    expect_refused(bad, "loss_denominator");
    bad = good;
    bad[0].targets.pop_back();
    expect_refused(bad, "batch.targets has");
    EXPECT_TRUE(Gather(*t) == before);
    // Shorter sequences than the configured maximum are fine, every step its own.
    for (int64_t len : {4, 16, 9}) {
      std::vector<TokenBatch> mine = {Masked(*t, 0, len, 1), Masked(*t, 1, len, 0)};
      StatusOr<StepMetrics> r = t->StepOnBatches(mine);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(std::isfinite(r->global_loss));
    }
    EXPECT_EQ(t->steps(), 3);
  });
}

}  // namespace
}  // namespace sk
