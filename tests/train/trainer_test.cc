#include "runtime/train/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "runtime/comm/local_backend.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"

namespace sk {
namespace {

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
  o.batch_size = 4;
  o.data_tokens = 96;  // a short stream the model can memorise
  o.optimizer.lr = 3e-3f;
  o.fsdp.timeout = Duration(60'000);
  return o;
}

TEST(TrainerTest, TrainingReducesLossAndReportsMetrics) {
  RunRanks(2, [](int rank, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.grad_accum_steps = 2;
    o.clip_grad_norm = 1.0;
    auto t = Trainer::Create(o, world);
    ASSERT_TRUE(t.ok()) << t.status();
    StatusOr<float> before = (*t)->Evaluate(2);
    ASSERT_TRUE(before.ok()) << before.status();
    StepMetrics m;
    for (int s = 0; s < 30; ++s) {
      StatusOr<StepMetrics> r = (*t)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      m = *r;
    }
    StatusOr<float> after = (*t)->Evaluate(2);
    ASSERT_TRUE(after.ok());
    EXPECT_LT(*after, *before * 0.95) << "rank " << rank;
    EXPECT_EQ(m.step, 30);
    EXPECT_GT(m.step_seconds, 0);
    EXPECT_GT(m.tokens_per_second, 0);
    EXPECT_GT(m.model_tflops_per_rank, 0);
    EXPECT_GT(m.peak_allocated_bytes, 0);
    EXPECT_GE(m.peak_reserved_bytes, m.peak_allocated_bytes);
    EXPECT_GT(m.bytes_communicated, 0);
    EXPECT_GT(m.grad_norm, 0);
    EXPECT_EQ(m.ooms, 0);
  });
}

// grad_accum_steps = M: the gradient is that of the reported (mean) loss, as
// PyTorch's (loss / M).backward() makes it. Two ranks x two micro-batches of
// 2 sequences step exactly like one unsharded SGD step on those 8 sequences
// at once (summing the micro-batches instead would step twice as far).
// Both ways of accumulating (issue 45, item 2): sharded (FULL_SHARD's
// default: every micro-batch reduce-scatters into the gradient shards) and
// unsharded (no_sync: the last micro-batch reduces the sum).
class AccumulationTest : public ::testing::TestWithParam<GradAccumulation> {};

TEST_P(AccumulationTest, AccumulatedMicroBatchesStepLikeOneBatchMTimesLarger) {
  constexpr int kWorld = 2, kMicro = 2;
  TrainerOptions o = Tiny();
  o.batch_size = 2;
  o.grad_accum_steps = kMicro;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = 0.5f;
  o.fsdp.seed = 11;
  o.fsdp.grad_accumulation = GetParam();
  // Reductions per unit in the step: one per micro-batch when sharded.
  const int64_t reductions = GetParam() == GradAccumulation::kUnsharded ? 1 : kMicro;
  std::vector<TokenBatch> micro(kWorld * kMicro);
  std::vector<float> losses(kWorld), global_losses(kWorld);
  std::vector<std::vector<std::vector<float>>> params;  // rank 0's [unit][param][elem]
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    auto t = Trainer::Create(o, world);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int m = 0; m < kMicro; ++m) micro[rank * kMicro + m] = *(*t)->BatchFor(0, m);
    (*t)->fsdp()->ResetCounters();
    StatusOr<StepMetrics> r = (*t)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*t)->fsdp()->counters().reduce_scatters, reductions * (*t)->fsdp()->num_units());
    losses[rank] = r->loss;
    global_losses[rank] = r->global_loss;
    const auto& units = (*t)->model().units();
    std::vector<std::vector<std::vector<float>>> mine;
    for (size_t u = 0; u < units.size(); ++u) {
      mine.emplace_back();
      for (size_t p = 0; p < units[u].params.size(); ++p) {
        StatusOr<Tensor> full = (*t)->fsdp()->GatherFullParam(static_cast<int>(u), static_cast<int>(p));
        ASSERT_TRUE(full.ok()) << full.status();
        mine.back().emplace_back(full->data_as<float>(), full->data_as<float>() + full->numel());
      }
    }
    if (rank == 0) params = std::move(mine);
  });
  ASSERT_FALSE(params.empty());

  // The reference: one unsharded rank, one batch of all 8 sequences.
  TokenBatch all = micro[0];
  for (size_t i = 1; i < micro.size(); ++i) {
    all.inputs.insert(all.inputs.end(), micro[i].inputs.begin(), micro[i].inputs.end());
    all.targets.insert(all.targets.end(), micro[i].targets.begin(), micro[i].targets.end());
    all.batch_size += micro[i].batch_size;
  }
  auto model = *CreateModel(o.model);
  auto owned = *OwnedParameters::Create(model->units(), o.fsdp.seed);
  auto opt = *Optimizer::Create(o.optimizer, &HostAllocator::Default());
  owned->ZeroGrad();
  StatusOr<float> loss = model->ForwardBackward(all, *owned, HostAllocator::Default());
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(opt->Step(ops::HostContext(), *ShardRefsFor(owned->all_params(), owned->all_grads())).ok());

  EXPECT_NEAR((losses[0] + losses[1]) / 2, *loss, 1e-5 * *loss);
  // global_loss is the global batch's loss on every rank; loss is the rank's own.
  EXPECT_NE(losses[0], losses[1]);
  for (float g : global_losses) EXPECT_NEAR(g, *loss, 1e-5 * *loss);
  double max_diff = 0, max_update = 0;
  for (int u = 0; u < owned->num_units(); ++u) {
    for (size_t p = 0; p < params[u].size(); ++p) {
      const Tensor& want = owned->param(u, static_cast<int>(p));
      ASSERT_EQ(static_cast<int64_t>(params[u][p].size()), want.numel());
      for (int64_t k = 0; k < want.numel(); ++k) {
        max_diff = std::max(max_diff, std::fabs(double{params[u][p][k]} - want.data_as<float>()[k]));
      }
    }
  }
  // Parameters agree far more closely than the step moved them.
  for (const Tensor& g : owned->all_grads()) {
    for (int64_t k = 0; k < g.numel(); ++k) {
      max_update = std::max(max_update, std::fabs(double{o.optimizer.lr} * g.data_as<float>()[k]));
    }
  }
  EXPECT_GT(max_update, 1e-3);
  EXPECT_LT(max_diff, 1e-6 + 1e-3 * max_update) << "largest update " << max_update;
}

INSTANTIATE_TEST_SUITE_P(Modes, AccumulationTest,
                         ::testing::Values(GradAccumulation::kDefault, GradAccumulation::kUnsharded),
                         [](const ::testing::TestParamInfo<GradAccumulation>& i) {
                           return std::string(GradAccumulationName(i.param));
                         });

// The default accumulation is sharded for the strategies that free unsharded
// gradients and unsharded (no_sync) for those that keep them; explicit
// choices win; an out-of-range value is InvalidArgument naming the field.
TEST(AccumulationDefaultsTest, ShardedWhereTheStrategyFreesUnshardedGradients) {
  FsdpOptions f;
  for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                             ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardGradOp}) {
    f.strategy = s;
    EXPECT_TRUE(ReducesEveryMicroBatch(f)) << ShardingStrategyName(s);
  }
  for (ShardingStrategy s : {ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard}) {
    f.strategy = s;
    EXPECT_FALSE(ReducesEveryMicroBatch(f)) << ShardingStrategyName(s);
    f.grad_accumulation = GradAccumulation::kSharded;
    EXPECT_TRUE(ReducesEveryMicroBatch(f)) << ShardingStrategyName(s);
    f.grad_accumulation = GradAccumulation::kDefault;
  }
  f.strategy = ShardingStrategy::kFullShard;
  f.grad_accumulation = GradAccumulation::kUnsharded;
  EXPECT_FALSE(ReducesEveryMicroBatch(f));
  f.grad_accumulation = static_cast<GradAccumulation>(7);
  Status s = ValidateFsdpOptions(f, 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("grad_accumulation"), std::string::npos) << s;
  EXPECT_EQ(*ParseGradAccumulation("unsharded"), GradAccumulation::kUnsharded);
  EXPECT_EQ(ParseGradAccumulation("later").status().code(), StatusCode::kInvalidArgument);
}

TEST(TrainerTest, MemoryCapGivesResourceExhaustedAndTheTrainerStaysUsable) {
  RunRanks(1, [](int rank, comm::ProcessGroup* world) {
    auto t = *Trainer::Create(Tiny(), world);
    ASSERT_TRUE(t->Step().ok());
    // Squeeze the cap below what a step needs: the step fails cleanly.
    t->allocator().EmptyCache();
    ASSERT_TRUE(t->allocator().SetCapacity(t->allocator().stats().reserved_bytes.current + 1024).ok());
    StatusOr<StepMetrics> r = t->Step();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
    EXPECT_GT(t->allocator().stats().num_ooms, 0);
    // With the cap lifted the same trainer trains on.
    ASSERT_TRUE(t->allocator().SetCapacity(0).ok());
    StatusOr<StepMetrics> again = t->Step();
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->step, 2);
  });
}

// Master shards and optimizer state of a trainer (FSDP), to prove a failed
// step changed nothing.
std::vector<std::vector<float>> ModelState(Trainer& t) {
  std::vector<std::vector<float>> out;
  FullyShardedModel& f = *t.fsdp();
  for (int u = 0; u < f.num_units(); ++u) {
    const Tensor& m = f.master_shard(u);
    out.emplace_back(m.data_as<float>(), m.data_as<float>() + m.numel());
    for (const std::string& name : t.optimizer().StateNames()) {
      StatusOr<Tensor> st = t.optimizer().State(u, name);
      if (st.ok()) out.emplace_back(st->data_as<float>(), st->data_as<float>() + st->numel());
    }
    out.push_back({static_cast<float>(t.optimizer().step_count(u))});
  }
  return out;
}

// An allocation that fails anywhere in a step (inside the model's compute
// between a unit's hooks as well as inside FSDP's hooks) fails that step
// only: every unit is idle again, parameters and optimizer state are
// untouched, and the next step trains exactly as if the failure never
// happened. (Issue 35: a failure inside the compute left 'h.1' in state
// 'backward' and every later step was FailedPrecondition.)
TEST(TrainerTest, AnOutOfMemoryAnywhereInAStepLeavesTheTrainerUsableAndUnchanged) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    RunRanks(1, [&](int, comm::ProcessGroup* world) {
      TrainerOptions o = Tiny();
      o.fsdp.strategy = strategy;
      o.grad_accum_steps = 2;
      auto reference = *Trainer::Create(o, world);
      auto t = *Trainer::Create(o, world);
      ASSERT_TRUE(reference->Step().ok());
      ASSERT_TRUE(t->Step().ok());
      // How many allocations one step makes: the failure points to try.
      const int64_t before = t->allocator().stats().num_allocs;
      StatusOr<StepMetrics> want = reference->Step();
      ASSERT_TRUE(want.ok()) << want.status();
      const int64_t per_step = reference->allocator().stats().num_allocs - before;
      ASSERT_GT(per_step, 10);
      const int64_t stride = std::max<int64_t>(1, per_step / 24);
      for (int64_t k = 0; k < per_step; k += stride) {
        SCOPED_TRACE("allocation " + std::to_string(k) + " of " + std::to_string(per_step));
        const auto state = ModelState(*t);
        t->allocator().InjectOutOfMemoryAfter(k);
        StatusOr<StepMetrics> failed = t->Step();
        t->allocator().InjectOutOfMemoryAfter(-1);
        ASSERT_FALSE(failed.ok()) << "allocation " << k << " was not made";
        EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted) << failed.status();
        EXPECT_NE(failed.status().message().find("(injected)"), std::string::npos) << failed.status();
        EXPECT_EQ(t->steps(), 1);
        EXPECT_TRUE(ModelState(*t) == state) << "a failed step changed parameters or optimizer state";
      }
      StatusOr<StepMetrics> got = t->Step();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->step, 2);
      EXPECT_EQ(got->loss, want->loss);
      EXPECT_TRUE(ModelState(*t) == ModelState(*reference));
    });
  }
}

// One rank out of memory at any point of a step (issue 35, defect 2: the
// other rank was told of a "desync", timed out, and every later step failed
// on every rank). Now every rank's step fails with that rank's
// ResourceExhausted naming it, at once (the failing rank fails its peers'
// waiting collectives), no rank changes anything, and the next step works
// on every rank with the losses of a run that never failed.
TEST(TrainerTest, OneRankOutOfMemoryFailsTheStepOnEveryRankWithItsErrorAndTrainingGoesOn) {
  std::mutex mu;
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.fsdp.timeout = Duration(30'000);  // a hang would show as a 30 s wait and a DeadlineExceeded
    auto reference = *Trainer::Create(o, world);
    auto t = *Trainer::Create(o, world);
    ASSERT_TRUE(reference->Step().ok());
    ASSERT_TRUE(t->Step().ok());
    const int64_t before = reference->allocator().stats().num_allocs;
    StatusOr<StepMetrics> want = reference->Step();
    ASSERT_TRUE(want.ok()) << want.status();
    // Rank 1's count decides the failure points; every rank learns it.
    const int64_t per_step = reference->allocator().stats().num_allocs - before;
    ASSERT_GT(per_step, 10);
    const int64_t stride = std::max<int64_t>(1, per_step / 12);
    for (int64_t k = 0; k < per_step; k += stride) {
      const auto state = ModelState(*t);
      if (rank == 1) t->allocator().InjectOutOfMemoryAfter(k);
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<StepMetrics> failed = t->Step();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      t->allocator().InjectOutOfMemoryAfter(-1);
      std::lock_guard<std::mutex> lock(mu);
      SCOPED_TRACE("rank " + std::to_string(rank) + ", rank 1's allocation " + std::to_string(k));
      if (failed.ok()) {
        // Rank 1 made fewer allocations than the reference (a later k):
        // then no rank may have failed; both ranks stepped.
        ADD_FAILURE() << "the step succeeded";
        return;
      }
      EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted) << failed.status();
      const std::string msg(failed.status().message());
      EXPECT_NE(msg.find("rank 1 failed step 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("(injected)"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("rank 0 failed"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("desync"), std::string::npos) << msg;
      EXPECT_LT(seconds, 20) << "the failure waited for a timeout";
      EXPECT_EQ(t->steps(), 1);
      EXPECT_TRUE(ModelState(*t) == state) << "a failed step changed parameters or optimizer state";
    }
    StatusOr<StepMetrics> got = t->Step();
    ASSERT_TRUE(got.ok()) << "rank " << rank << ": " << got.status();
    EXPECT_EQ(got->step, 2);
    EXPECT_EQ(got->loss, want->loss) << "rank " << rank;
    EXPECT_EQ(got->global_loss, want->global_loss) << "rank " << rank;
    StatusOr<StepMetrics> next = t->Step();
    ASSERT_TRUE(next.ok()) << "rank " << rank << ": " << next.status();
  });
}

// Issue 47 (the optimizer update after the step agreement): rank 1 runs out
// of memory at each of the last allocations of a first step, where the
// optimizer's state is created. That allocation used to come after the ranks
// agreed to update: rank 0 stepped and counted while rank 1 failed alone,
// and the two trained apart for good. Now every rank's step fails with rank
// 1's error, nothing changes anywhere, and the next step is a first step
// that never failed. (FULL_SHARD: its last allocations are the state's;
// under NO_SHARD the regather after the update comes last, and a failure
// there is not yet agreed on: docs/reliability.md, "Not done".)
TEST(TrainerTest, OneRankOutOfMemoryCreatingOptimizerStateFailsEveryRankAndTheNextStepIsTheFirst) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    std::mutex mu;
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      TrainerOptions o = Tiny();
      o.fsdp.strategy = strategy;
      o.fsdp.timeout = Duration(30'000);  // a hang would show as a 30 s wait
      auto reference = *Trainer::Create(o, world);
      const int64_t before = reference->allocator().stats().num_allocs;
      StatusOr<StepMetrics> want = reference->Step();
      ASSERT_TRUE(want.ok()) << want.status();
      const int64_t per_step = reference->allocator().stats().num_allocs - before;
      const auto want_state = ModelState(*reference);
      for (int64_t k = std::max<int64_t>(0, per_step - 10); k < per_step; ++k) {
        auto t = *Trainer::Create(o, world);
        const auto state = ModelState(*t);
        if (rank == 1) t->allocator().InjectOutOfMemoryAfter(k);
        const auto t0 = std::chrono::steady_clock::now();
        StatusOr<StepMetrics> failed = t->Step();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t->allocator().InjectOutOfMemoryAfter(-1);
        {
          std::lock_guard<std::mutex> lock(mu);
          SCOPED_TRACE("rank " + std::to_string(rank) + ", rank 1's allocation " + std::to_string(k) + " of " +
                       std::to_string(per_step));
          ASSERT_FALSE(failed.ok()) << "the step succeeded";
          EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted) << failed.status();
          EXPECT_NE(failed.status().ToString().find("rank 1 failed step 1"), std::string::npos) << failed.status();
          EXPECT_LT(seconds, 20) << "the failure waited for a timeout";
          EXPECT_EQ(t->steps(), 0);
          EXPECT_TRUE(ModelState(*t) == state) << "a failed step changed parameters";
        }
        StatusOr<StepMetrics> got = t->Step();
        ASSERT_TRUE(got.ok()) << "rank " << rank << ": " << got.status();
        EXPECT_EQ(got->step, 1);
        EXPECT_EQ(got->loss, want->loss) << "rank " << rank;
        EXPECT_TRUE(ModelState(*t) == want_state) << "rank " << rank << ": the next step differs from a first step";
      }
    });
  }
}

// The regather after the update under NO_SHARD and SHARD_OPTIM (issue 47,
// item 4): rank 1 out of memory for a unit's buffer after the ranks agreed
// and updated. Before, rank 1's step failed alone without counting while
// rank 0's returned OK and counted, and the ranks trained apart. Now every
// rank's step fails with rank 1's error naming the regather, the update is
// kept and counted on every rank, and the next step equals step 3 of a run
// that never failed. (Allocations before the update fail the step with
// nothing changed, as before; the loop covers both.)
TEST(TrainerTest, OneRankOutOfMemoryInTheRegatherAfterTheUpdateFailsEveryRankAndKeepsTheUpdate) {
  for (ShardingStrategy strategy : {ShardingStrategy::kNoShard, ShardingStrategy::kShardOptim}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    std::mutex mu;
    int after_update = 0;
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      TrainerOptions o = Tiny();
      o.fsdp.strategy = strategy;
      o.fsdp.timeout = Duration(30'000);  // a hang would show as a 30 s wait
      auto reference = *Trainer::Create(o, world);
      ASSERT_TRUE(reference->Step().ok());
      const auto want1 = ModelState(*reference);
      const int64_t before = reference->allocator().stats().num_allocs;
      ASSERT_TRUE(reference->Step().ok());
      const int64_t per_step = reference->allocator().stats().num_allocs - before;
      const auto want2 = ModelState(*reference);
      StatusOr<StepMetrics> want3 = reference->Step();
      ASSERT_TRUE(want3.ok()) << want3.status();
      const auto want3_state = ModelState(*reference);
      for (int64_t k = std::max<int64_t>(0, per_step - 8); k < per_step; ++k) {
        auto t = *Trainer::Create(o, world);
        ASSERT_TRUE(t->Step().ok());
        if (rank == 1) t->allocator().InjectOutOfMemoryAfter(k);
        const auto t0 = std::chrono::steady_clock::now();
        StatusOr<StepMetrics> failed = t->Step();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t->allocator().InjectOutOfMemoryAfter(-1);
        const bool kept = !failed.ok() && failed.status().ToString().find("after the update") != std::string::npos;
        {
          std::lock_guard<std::mutex> lock(mu);
          SCOPED_TRACE("rank " + std::to_string(rank) + ", rank 1's allocation " + std::to_string(k) + " of " +
                       std::to_string(per_step) + ": " + failed.status().ToString());
          if (failed.ok()) continue;  // past rank 1's last allocation of the step: no rank failed
          EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted);
          EXPECT_NE(failed.status().ToString().find("rank 1 failed step 2"), std::string::npos);
          EXPECT_LT(seconds, 20) << "the failure waited for a timeout";
          if (kept) {
            if (rank == 0) ++after_update;
            EXPECT_NE(failed.status().ToString().find("regathering the parameters after the optimizer update"),
                      std::string::npos);
            EXPECT_EQ(t->steps(), 2);
            EXPECT_TRUE(ModelState(*t) == want2) << "the update was not kept as applied";
          } else {
            EXPECT_EQ(t->steps(), 1);
            EXPECT_TRUE(ModelState(*t) == want1) << "a failed step changed parameters";
          }
        }
        if (!kept) continue;
        StatusOr<StepMetrics> got = t->Step();
        ASSERT_TRUE(got.ok()) << "rank " << rank << ": " << got.status();
        EXPECT_EQ(got->step, 3);
        EXPECT_EQ(got->loss, want3->loss) << "rank " << rank;
        EXPECT_TRUE(ModelState(*t) == want3_state) << "rank " << rank << ": step 3 differs from a run that never failed";
      }
    });
    EXPECT_GE(after_update, 1) << "no allocation of the regather was failed";
  }
}

// Issue 47, item 7: rank 1 alone set another rate. Before, each rank's
// shard moved by its own rate and the step returned OK.
TEST(TrainerTest, RanksWithDifferentLearningRatesFailTheStepNamingThemAndNothingChanges) {
  std::mutex mu;
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    auto t = *Trainer::Create(Tiny(), world);
    ASSERT_TRUE(t->set_lr(rank == 1 ? 0.5f : 0.25f).ok());
    const auto state = ModelState(*t);
    StatusOr<StepMetrics> m = t->Step();
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status();
      EXPECT_NE(m.status().ToString().find("the learning rate (0.25 on rank 0, 0.5 on rank 1)"), std::string::npos)
          << m.status();
    }
    EXPECT_TRUE(ModelState(*t) == state) << "a refused step changed parameters or optimizer state";
    EXPECT_EQ(t->steps(), 0);
    t->clear_lr();
    m = t->Step();
    EXPECT_TRUE(m.ok()) << m.status();
  });
}

// Issue 47, item 8: a learning rate of FLT_MAX turned the model into NaNs
// while every step returned OK. Now the step whose loss or gradient norm is
// not finite fails on every rank with Aborted and changes nothing; with
// skip_nonfinite_steps it is counted as skipped and training goes on.
TEST(TrainerTest, ANonFiniteLossOrGradientNormSkipsTheUpdateOnEveryRank) {
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "skip_nonfinite_steps" : "fail");
    std::mutex mu;
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      TrainerOptions o = Tiny();
      o.skip_nonfinite_steps = skip;
      auto t = *Trainer::Create(o, world);
      ASSERT_TRUE(t->set_lr(std::numeric_limits<float>::max()).ok());
      int64_t nonfinite_step = -1;
      for (int i = 0; i < 4 && nonfinite_step < 0; ++i) {
        const auto state = ModelState(*t);
        const int64_t steps = t->steps();
        StatusOr<StepMetrics> m = t->Step();
        const bool skipped = m.ok() && m->skipped;
        if (m.ok() && !skipped) continue;
        nonfinite_step = steps + 1;
        std::lock_guard<std::mutex> lock(mu);
        if (skip) {
          ASSERT_TRUE(m.ok()) << m.status();
          EXPECT_TRUE(!std::isfinite(m->loss) || !std::isfinite(m->grad_norm));
          EXPECT_EQ(t->steps(), steps + 1);
          EXPECT_EQ(t->steps_skipped(), 1);
        } else {
          EXPECT_EQ(m.status().code(), StatusCode::kAborted) << m.status();
          EXPECT_NE(m.status().ToString().find("skipped on every rank"), std::string::npos) << m.status();
          EXPECT_EQ(t->steps(), steps);
        }
        // Bit for bit: the state may hold NaNs already (NaN != NaN).
        const auto now = ModelState(*t);
        bool same = now.size() == state.size();
        for (size_t i = 0; same && i < now.size(); ++i) {
          same = now[i].size() == state[i].size() &&
                 std::memcmp(now[i].data(), state[i].data(), now[i].size() * sizeof(float)) == 0;
        }
        EXPECT_TRUE(same) << "the non-finite step changed parameters or optimizer state";
      }
      EXPECT_GT(nonfinite_step, 0) << "every step at lr FLT_MAX returned OK";
    });
  }
}

TEST(TrainerTest, BadOptionsNameTheField) {
  RunRanks(1, [](int, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.model = "gpt-nonexistent";
    EXPECT_EQ(Trainer::Create(o, world).status().code(), StatusCode::kNotFound);
    o = Tiny();
    o.batch_size = 0;
    EXPECT_NE(Trainer::Create(o, world).status().message().find("batch_size"), std::string::npos);
    o = Tiny();
    o.optimizer.lr = -1;
    EXPECT_NE(Trainer::Create(o, world).status().message().find("lr"), std::string::npos);
    o = Tiny();
    o.data_path = "/nonexistent/tokens.bin";
    EXPECT_EQ(Trainer::Create(o, world).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(Trainer::Create(Tiny(), nullptr).status().code(), StatusCode::kInvalidArgument);
  });
}

// Issue 14, item 8: options that were accepted and then failed every step.
TEST(TrainerTest, OptionsThatWouldFailEveryStepAreInvalidArgumentAtCreate) {
  RunRanks(1, [](int, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.fsdp.timeout = Duration(INT64_MAX);
    Status s = Trainer::Create(o, world).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("timeout"), std::string::npos) << s;
    o = Tiny();
    o.clip_grad_norm = std::numeric_limits<double>::infinity();
    s = Trainer::Create(o, world).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("clip_grad_norm"), std::string::npos) << s;
    o = Tiny();
    o.batch_size = int64_t{1} << 50;
    s = Trainer::Create(o, world).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("batch_size"), std::string::npos) << s;
    o = Tiny();
    o.fsdp.timeout = kMaxTimeout;  // the bound itself is fine
    EXPECT_TRUE(Trainer::Create(o, world).ok());
  });
}

// Issue 14, item 7: ranks whose options differ in ways that leave the
// collectives identical trained without error, and FSDP on one rank with
// DDP on another waited out the collective timeout. Creation now agrees on
// the options: every rank fails at once, naming the field and both values.
TEST(TrainerTest, RanksWhoseOptionsDifferFailAtCreateNamingTheFieldAndBothValues) {
  struct Case {
    std::function<void(TrainerOptions&)> rank1;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {[](TrainerOptions& o) { o.batch_size = 2; }, "batch_size is 4 on rank 0 but 2 on rank 1"},
      {[](TrainerOptions& o) { o.seq_len = 16; }, "seq_len is 0 on rank 0 but 16 on rank 1"},
      {[](TrainerOptions& o) { o.clip_grad_norm = 1; }, "clip_grad_norm is 0 on rank 0 but 1 on rank 1"},
      {[](TrainerOptions& o) { o.optimizer.kind = OptimizerKind::kSgd; }, "optimizer.kind"},
      {[](TrainerOptions& o) { o.optimizer.lr = 1e-3f; }, "optimizer.lr"},
      {[](TrainerOptions& o) { o.optimizer.weight_decay = 0.1f; }, "optimizer.weight_decay"},
      {[](TrainerOptions& o) { o.fsdp.seed = 7; }, "fsdp.seed is 0 on rank 0 but 7 on rank 1"},
      {[](TrainerOptions& o) { o.fsdp.strategy = ShardingStrategy::kNoShard; },
       "fsdp.strategy is FULL_SHARD on rank 0 but NO_SHARD on rank 1"},
      {[](TrainerOptions& o) { o.parallelism = Parallelism::kDdp; },
       "parallelism is FSDP on rank 0 but DDP on rank 1"},
      {[](TrainerOptions& o) { o.fsdp.mixed_precision.param_dtype = DType::kBF16; },
       "fsdp.mixed_precision.param_dtype"},
      {[](TrainerOptions& o) { o.model = "gpt-1m"; }, "model is gpt-tiny on rank 0 but gpt-1m on rank 1"},
      {[](TrainerOptions& o) { o.data_seed = 2; }, "data_seed is 1 on rank 0 but 2 on rank 1"},
      // Issue 47: a list of another length (the slots were sized by it: the
      // ranks' option exchange itself failed as a desync naming no field).
      {[](TrainerOptions& o) {
         ParamGroup g;
         g.pattern = "*";
         o.optimizer.param_groups = {g};
       },
       "optimizer.param_groups is 0 on rank 0 but 1 on rank 1"},
  };
  for (const Case& c : cases) {
    std::vector<Status> results(2);
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      TrainerOptions o = Tiny();
      if (rank == 1) c.rank1(o);
      results[rank] = Trainer::Create(o, world).status();
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(results[r].code(), StatusCode::kInvalidArgument) << c.mentions << ": " << results[r];
      EXPECT_NE(std::string(results[r].message()).find(c.mentions), std::string::npos) << results[r];
    }
  }
  // What may differ per rank does not fail.
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.memory_cap_bytes = rank == 0 ? 0 : size_t{1} << 30;
    o.gemm_threads = rank + 1;
    auto t = Trainer::Create(o, world);
    EXPECT_TRUE(t.ok()) << t.status();
  });
}

TEST(TrainerTest, T5TrainsThroughTheSameTrainer) {
  RunRanks(2, [](int, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.model = "t5-tiny";
    o.fsdp.strategy = ShardingStrategy::kShardGradOp;
    auto t = Trainer::Create(o, world);
    ASSERT_TRUE(t.ok()) << t.status();
    float first = (*(*t)->Step()).loss, last = first;
    for (int s = 0; s < 15; ++s) last = (*(*t)->Step()).loss;
    EXPECT_LT(last, first);
  });
}

}  // namespace
}  // namespace sk

namespace sk {
namespace {

TEST(TrainerTest, DdpAndEveryFsdpStrategyTrainToTheSameLosses) {
  std::vector<std::vector<float>> runs;
  std::vector<std::string> names;
  auto run = [&](Parallelism p, ShardingStrategy s) {
    std::vector<float> losses;
    std::mutex mu;
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
      TrainerOptions o = Tiny();
      o.parallelism = p;
      o.fsdp.strategy = s;
      o.optimizer.kind = OptimizerKind::kSgd;
      o.optimizer.lr = 0.1f;
      o.optimizer.momentum = 0.9f;
      auto t = Trainer::Create(o, world);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int step = 0; step < 4; ++step) {
        StatusOr<StepMetrics> m = (*t)->Step();
        ASSERT_TRUE(m.ok()) << m.status();
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          losses.push_back(m->loss);
        }
      }
    });
    runs.push_back(losses);
    names.push_back(p == Parallelism::kDdp ? "DDP" : ShardingStrategyName(s));
  };
  run(Parallelism::kDdp, ShardingStrategy::kFullShard);
  for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                             ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard}) {
    run(Parallelism::kFsdp, s);
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_NEAR(runs[r][i], runs[0][i], 1e-5 * runs[0][i]) << names[r] << " vs DDP at step " << i;
    }
  }
}

// Issue 34: the rate of every step follows the schedule (reported in the
// metrics), a checkpoint resumes the curve, and set_lr(0) is a real rate 0.
TEST(TrainerTest, LearningRateFollowsTheScheduleAndSetLrOverridesIt) {
  RunRanks(2, [](int, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.lr_schedule.kind = LrScheduleKind::kCosine;
    o.lr_schedule.warmup_steps = 2;
    o.lr_schedule.decay_steps = 4;
    o.lr_schedule.min_lr = 3e-4f;
    ParamGroup no_decay;
    no_decay.norms_biases_embeddings = true;
    no_decay.weight_decay = 0;
    o.optimizer.weight_decay = 0.1f;
    o.optimizer.param_groups = {no_decay};
    auto t = Trainer::Create(o, world);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int s = 0; s < 7; ++s) {
      EXPECT_FLOAT_EQ((*t)->lr(), LrAt(o.lr_schedule, o.optimizer.lr, s));
      StatusOr<StepMetrics> m = (*t)->Step();
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_FLOAT_EQ(m->lr, LrAt(o.lr_schedule, o.optimizer.lr, s)) << "step " << s;
    }
    EXPECT_FLOAT_EQ((*t)->lr(), 3e-4f);
    ASSERT_TRUE((*t)->set_lr(0.f).ok());
    StatusOr<float> before = (*t)->Evaluate(1);
    ASSERT_TRUE(before.ok());
    StatusOr<StepMetrics> m = (*t)->Step();
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->lr, 0.f);
    StatusOr<float> after = (*t)->Evaluate(1);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, *before) << "a step at lr 0 changed the model";
    EXPECT_EQ((*t)->set_lr(-1.f).code(), StatusCode::kInvalidArgument);
    (*t)->clear_lr();
    EXPECT_FLOAT_EQ((*t)->lr(), 3e-4f);
  });
}

TEST(TrainerTest, BadSchedulesAndDdpParamGroupsAreRefusedAtCreate) {
  RunRanks(1, [](int, comm::ProcessGroup* world) {
    TrainerOptions o = Tiny();
    o.lr_schedule.kind = LrScheduleKind::kLinear;  // decay_steps missing
    auto t = Trainer::Create(o, world);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(std::string(t.status().message()).find("decay_steps"), std::string::npos) << t.status();
    o = Tiny();
    o.parallelism = Parallelism::kDdp;
    ParamGroup g;
    g.pattern = "*";
    o.optimizer.param_groups = {g};
    t = Trainer::Create(o, world);
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented) << t.status();
  });
}

}  // namespace
}  // namespace sk
