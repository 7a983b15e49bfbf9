// The engine's ranks fail together and agree (issue 47, items 4, 7 and 8):
// one rank out of memory anywhere in a step fails that step on every rank
// with its error and the next step works (local and gloo groups; before, the
// peers were told of a desync, timed out, and a gloo group was dead for
// good); ranks whose learning rates, written values, units or parameter
// groups differ fail naming the ranks and the field (before, each trained
// its own way in silence); a non-finite gradient norm skips the update on
// every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/train/engine.h"
#include "tests/comm/gloo_world.h"

namespace sk {
namespace {

// fc.w [4, 6], fc.b [6], ln.gain [6]: enough elements that every rank's
// shard holds parts of several parameters.
std::vector<UnitSpec> SmallModel() {
  UnitSpec fc{"fc", {ParamSpec{"w", Shape{4, 6}, Initializer{InitKind::kNormal, 0.f, 1.f}},
                     ParamSpec{"b", Shape{6}, Initializer{InitKind::kUniform, -1.f, 1.f}}}};
  UnitSpec ln{"ln", {ParamSpec{"gain", Shape{6}, Initializer{InitKind::kOnes, 0.f, 0.f}}}};
  return {fc, ln};
}

// A 10 s timeout: a failure that waited for one shows as a DeadlineExceeded.
FsdpEngineOptions Adam() {
  FsdpEngineOptions o;
  o.optimizer.kind = OptimizerKind::kAdamW;
  o.optimizer.lr = 0.01f;
  o.fsdp.timeout = Duration(10'000);
  return o;
}

void RunLocal(int world, const std::function<void(int, comm::ProcessGroup*)>& body) {
  Status s = comm::RunLocalRanks(world, [&](int rank, comm::ProcessGroup* g) -> Status {
    body(rank, g);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

void RunGloo(int world, const std::function<void(int, comm::ProcessGroup*)>& body) {
  comm::testing::GlooWorld w(world);
  comm::testing::RunRanks(world, [&](int rank) { body(rank, w.groups[rank].get()); });
}

StatusOr<std::vector<std::vector<float>>> ReadAll(FsdpEngine& e) {
  std::vector<std::vector<float>> out;
  for (int u = 0; u < e.num_units(); ++u) {
    for (int p = 0; p < static_cast<int>(e.units()[u].params.size()); ++p) {
      std::vector<float> v(static_cast<size_t>(e.units()[u].params[p].shape.numel()));
      SK_RETURN_IF_ERROR(e.ReadParam(u, p, v.data(), static_cast<int64_t>(v.size())));
      out.push_back(std::move(v));
    }
  }
  return out;
}

// One step in which every gradient element gets `grad(value, rank)`; stops
// at the first failing call and returns its status.
Status Step(FsdpEngine& e, int rank, const std::function<float(float, int)>& grad, double clip = -1) {
  SK_RETURN_IF_ERROR(e.ZeroGrad());
  for (int u = 0; u < e.num_units(); ++u) {
    SK_RETURN_IF_ERROR(e.PreForward(u));
    SK_RETURN_IF_ERROR(e.PostForward(u));
  }
  for (int u = e.num_units() - 1; u >= 0; --u) {
    SK_RETURN_IF_ERROR(e.PreBackward(u));
    for (int p = 0; p < static_cast<int>(e.units()[u].params.size()); ++p) {
      SK_ASSIGN_OR_RETURN(const Tensor* w, e.Param(u, p));
      SK_ASSIGN_OR_RETURN(const Tensor* g, e.Grad(u, p));
      for (int64_t i = 0; i < g->numel(); ++i) g->data_as<float>()[i] += grad(w->data_as<float>()[i], rank);
    }
    SK_RETURN_IF_ERROR(e.PostBackward(u));
  }
  SK_RETURN_IF_ERROR(e.FinishBackward());
  if (clip >= 0) SK_RETURN_IF_ERROR(e.ClipGradNorm(clip).status());
  return e.OptimizerStep();
}

float Grad(float w, int rank) { return 0.5f * w + 0.1f * static_cast<float>(rank + 1); }

// Rank 1 runs out of memory at its k-th allocation of a step, for k across
// the whole step: every rank's step fails with rank 1's ResourceExhausted
// (not a desync, not a timeout), nothing changes, and the next step equals a
// run that never failed.
void OneRankOutOfMemory(int rank, comm::ProcessGroup* world, FsdpEngineOptions o, std::mutex& mu) {
  auto reference = FsdpEngine::Create(SmallModel(), world, o);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto engine = FsdpEngine::Create(SmallModel(), world, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  FsdpEngine& e = **engine;
  FsdpEngine& ref = **reference;
  ASSERT_TRUE(Step(ref, rank, Grad).ok());
  ASSERT_TRUE(Step(e, rank, Grad).ok());
  const int64_t before = ref.allocator().stats().num_allocs;
  ASSERT_TRUE(Step(ref, rank, Grad).ok());
  const int64_t per_step = ref.allocator().stats().num_allocs - before;
  ASSERT_GT(per_step, 3);
  auto want = ReadAll(ref);
  ASSERT_TRUE(want.ok()) << want.status();
  auto state = ReadAll(e);
  ASSERT_TRUE(state.ok());
  int failures = 0;
  for (int64_t k = 0; k < per_step; ++k) {
    if (rank == 1) e.allocator().InjectOutOfMemoryAfter(k);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = Step(e, rank, Grad);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    e.allocator().InjectOutOfMemoryAfter(-1);
    std::lock_guard<std::mutex> lock(mu);
    SCOPED_TRACE("rank " + std::to_string(rank) + ", rank 1's allocation " + std::to_string(k) + ": " +
                 s.ToString());
    if (s.ok()) continue;  // rank 1 made fewer allocations than k: no rank failed
    ++failures;
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(s.ToString().find("rank 1 failed step 2"), std::string::npos);
    EXPECT_NE(s.ToString().find("(injected)"), std::string::npos);
    EXPECT_EQ(s.ToString().find("desync"), std::string::npos);
    EXPECT_LT(seconds, 8) << "the failure waited for the 10 s timeout";
    EXPECT_EQ(e.steps(), 1);
  }
  EXPECT_EQ(failures, per_step) << "rank " << rank;
  auto unchanged = ReadAll(e);
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  EXPECT_EQ(*unchanged, *state) << "a failed step changed a parameter";
  Status next = Step(e, rank, Grad);
  ASSERT_TRUE(next.ok()) << "rank " << rank << ": " << next;
  auto got = ReadAll(e);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *want) << "rank " << rank << ": the next step differs from a run that never failed";
}

TEST(EngineOutOfMemory, OneRankOutOfMemoryFailsTheStepOnEveryRankAndTheNextStepWorksOnLocalGroups) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    std::mutex mu;
    FsdpEngineOptions o = Adam();
    o.fsdp.strategy = strategy;
    RunLocal(2, [&](int rank, comm::ProcessGroup* world) { OneRankOutOfMemory(rank, world, o, mu); });
  }
}

TEST(EngineOutOfMemory, OneRankOutOfMemoryFailsTheStepOnEveryRankAndTheNextStepWorksOnGloo) {
  std::mutex mu;
  RunGloo(2, [&](int rank, comm::ProcessGroup* world) { OneRankOutOfMemory(rank, world, Adam(), mu); });
}

// A first custom step (a Lion-like rule declaring one state tensor) with
// rank 1 out of memory where the rule's state is created (the allocations
// after FinishBackward's). That allocation used to come inside the custom
// step, after the ranks agreed: rank 0 updated its shards while rank 1
// failed and stayed in the step. Now both ranks fail at BeginCustomStep
// with rank 1's error, nothing changes, and the next step is a first step.
// `allocs_before_begin` (may be null) receives the allocator's count just
// before BeginCustomStep.
Status CustomStep(FsdpEngine& e, int rank, int64_t* allocs_before_begin = nullptr) {
  SK_RETURN_IF_ERROR(e.ZeroGrad());
  for (int u = 0; u < e.num_units(); ++u) {
    SK_RETURN_IF_ERROR(e.PreForward(u));
    SK_RETURN_IF_ERROR(e.PostForward(u));
  }
  for (int u = e.num_units() - 1; u >= 0; --u) {
    SK_RETURN_IF_ERROR(e.PreBackward(u));
    for (int p = 0; p < static_cast<int>(e.units()[u].params.size()); ++p) {
      SK_ASSIGN_OR_RETURN(const Tensor* w, e.Param(u, p));
      SK_ASSIGN_OR_RETURN(const Tensor* g, e.Grad(u, p));
      for (int64_t i = 0; i < g->numel(); ++i) g->data_as<float>()[i] += Grad(w->data_as<float>()[i], rank);
    }
    SK_RETURN_IF_ERROR(e.PostBackward(u));
  }
  SK_RETURN_IF_ERROR(e.FinishBackward());
  if (allocs_before_begin != nullptr) *allocs_before_begin = e.allocator().stats().num_allocs;
  SK_RETURN_IF_ERROR(e.BeginCustomStep());
  Status s = OkStatus();
  for (int u = 0; u < e.num_units() && s.ok(); ++u) {
    StatusOr<const Tensor*> p = e.MasterShard(u), g = e.GradShard(u), m = e.OptimizerState(u, 0);
    if (!m.ok()) {
      s = m.status();
      break;
    }
    for (int64_t i = 0; i < (*p)->numel(); ++i) {
      float& mi = (*m)->data_as<float>()[i];
      mi = 0.9f * mi + 0.1f * (*g)->data_as<float>()[i];
      (*p)->data_as<float>()[i] -= 0.01f * (mi > 0 ? 1.f : (mi < 0 ? -1.f : 0.f));
    }
  }
  Status end = e.EndCustomStep();
  return s.ok() ? end : s;
}

TEST(EngineOutOfMemory, OneRankOutOfMemoryCreatingACustomRulesStateFailsEveryRankBeforeAnyUpdate) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    std::mutex mu;
    RunLocal(2, [&](int rank, comm::ProcessGroup* world) {
      FsdpEngineOptions o = Adam();
      o.fsdp.strategy = strategy;
      o.optimizer.custom_name = "lion";
      o.optimizer.custom_state_names = {"exp_avg"};
      auto reference = FsdpEngine::Create(SmallModel(), world, o);
      ASSERT_TRUE(reference.ok()) << reference.status();
      const int64_t before = (*reference)->allocator().stats().num_allocs;
      int64_t at_begin = 0;
      ASSERT_TRUE(CustomStep(**reference, rank, &at_begin).ok());
      const int64_t per_step = (*reference)->allocator().stats().num_allocs - before;
      auto want = ReadAll(**reference);
      ASSERT_TRUE(want.ok()) << want.status();
      // One state tensor per unit: the two allocations after FinishBackward's.
      const int64_t first_state = at_begin - before;
      ASSERT_LE(first_state + 2, per_step);
      for (int64_t k = first_state; k < first_state + 2; ++k) {
        auto engine = FsdpEngine::Create(SmallModel(), world, o);
        ASSERT_TRUE(engine.ok()) << engine.status();
        FsdpEngine& e = **engine;
        auto state = ReadAll(e);
        ASSERT_TRUE(state.ok());
        if (rank == 1) e.allocator().InjectOutOfMemoryAfter(k);
        const auto t0 = std::chrono::steady_clock::now();
        Status s = CustomStep(e, rank);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        e.allocator().InjectOutOfMemoryAfter(-1);
        {
          std::lock_guard<std::mutex> lock(mu);
          SCOPED_TRACE("rank " + std::to_string(rank) + ", rank 1's allocation " + std::to_string(k) + " of " +
                       std::to_string(per_step) + ": " + s.ToString());
          EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
          EXPECT_NE(s.ToString().find("rank 1 failed step 1"), std::string::npos);
          EXPECT_LT(seconds, 8) << "the failure waited for the 10 s timeout";
          EXPECT_FALSE(e.in_custom_step());
          EXPECT_EQ(e.steps(), 0);
        }
        auto unchanged = ReadAll(e);
        ASSERT_TRUE(unchanged.ok()) << unchanged.status();
        EXPECT_EQ(*unchanged, *state) << "rank " << rank << ": a failed step changed a parameter";
        Status next = CustomStep(e, rank);
        ASSERT_TRUE(next.ok()) << "rank " << rank << ": " << next;
        auto got = ReadAll(e);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, *want) << "rank " << rank << ": the next step differs from a first step";
      }
    });
  }
}

// The regather after the update (NO_SHARD and SHARD_OPTIM keep the full
// parameters and gather them again from the updated shards): rank 1 out of
// memory for a unit's buffer there. Before, its OptimizerStep (or
// EndCustomStep, which stayed open) failed alone while rank 0 returned OK
// and counted the step, and the next step waited for the timeout. Now
// every rank fails with rank 1's error naming the regather; the update,
// applied on every rank before, stays and the step counts on every rank;
// the full parameters are gathered again at the next forward, and the next
// step equals a run that never failed.
Status StepUntilUpdate(FsdpEngine& e, int rank) {
  SK_RETURN_IF_ERROR(e.ZeroGrad());
  for (int u = 0; u < e.num_units(); ++u) {
    SK_RETURN_IF_ERROR(e.PreForward(u));
    SK_RETURN_IF_ERROR(e.PostForward(u));
  }
  for (int u = e.num_units() - 1; u >= 0; --u) {
    SK_RETURN_IF_ERROR(e.PreBackward(u));
    for (int p = 0; p < static_cast<int>(e.units()[u].params.size()); ++p) {
      SK_ASSIGN_OR_RETURN(const Tensor* w, e.Param(u, p));
      SK_ASSIGN_OR_RETURN(const Tensor* g, e.Grad(u, p));
      for (int64_t i = 0; i < g->numel(); ++i) g->data_as<float>()[i] += Grad(w->data_as<float>()[i], rank);
    }
    SK_RETURN_IF_ERROR(e.PostBackward(u));
  }
  return e.FinishBackward();
}

// A plain SGD-like rule (p -= 0.01 g) through the custom step.
Status CustomUpdate(FsdpEngine& e) {
  SK_RETURN_IF_ERROR(e.BeginCustomStep());
  for (int u = 0; u < e.num_units(); ++u) {
    SK_ASSIGN_OR_RETURN(const Tensor* p, e.MasterShard(u));
    SK_ASSIGN_OR_RETURN(const Tensor* g, e.GradShard(u));
    for (int64_t i = 0; i < p->numel(); ++i) p->data_as<float>()[i] -= 0.01f * g->data_as<float>()[i];
  }
  return e.EndCustomStep();
}

void OneRankOutOfMemoryInTheRegather(int rank, comm::ProcessGroup* world, const FsdpEngineOptions& o, bool custom,
                                     std::mutex& mu) {
  auto update = [custom](FsdpEngine& e) { return custom ? CustomUpdate(e) : e.OptimizerStep(); };
  auto step = [&](FsdpEngine& e) {
    Status s = StepUntilUpdate(e, rank);
    return s.ok() ? update(e) : s;
  };
  auto reference = FsdpEngine::Create(SmallModel(), world, o);
  ASSERT_TRUE(reference.ok()) << reference.status();
  FsdpEngine& ref = **reference;
  ASSERT_TRUE(step(ref).ok());
  ASSERT_TRUE(StepUntilUpdate(ref, rank).ok());
  const int64_t before = ref.allocator().stats().num_allocs;
  ASSERT_TRUE(update(ref).ok());
  const int64_t in_update = ref.allocator().stats().num_allocs - before;  // the regather's
  ASSERT_GE(in_update, 2) << "one buffer per unit";
  auto want2 = ReadAll(ref);
  ASSERT_TRUE(want2.ok()) << want2.status();
  ASSERT_TRUE(step(ref).ok());
  auto want3 = ReadAll(ref);
  ASSERT_TRUE(want3.ok()) << want3.status();
  for (int64_t k = 0; k < in_update; ++k) {
    auto engine = FsdpEngine::Create(SmallModel(), world, o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    FsdpEngine& e = **engine;
    ASSERT_TRUE(step(e).ok());
    ASSERT_TRUE(StepUntilUpdate(e, rank).ok());
    if (rank == 1) e.allocator().InjectOutOfMemoryAfter(k);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = update(e);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    e.allocator().InjectOutOfMemoryAfter(-1);
    {
      std::lock_guard<std::mutex> lock(mu);
      SCOPED_TRACE("rank " + std::to_string(rank) + ", rank 1's allocation " + std::to_string(k) + " of " +
                   std::to_string(in_update) + " in the update: " + s.ToString());
      EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
      EXPECT_NE(s.ToString().find("rank 1 failed step 2 after the update: "), std::string::npos);
      EXPECT_NE(s.ToString().find("regathering the parameters after the optimizer update"), std::string::npos);
      EXPECT_NE(s.ToString().find("(injected)"), std::string::npos);
      EXPECT_NE(s.ToString().find("the update of step 2 was applied on every rank"), std::string::npos);
      EXPECT_EQ(s.ToString().find("desync"), std::string::npos);
      EXPECT_LT(seconds, 8) << "the failure waited for the 10 s timeout";
      EXPECT_EQ(e.steps(), 2);
      EXPECT_FALSE(e.in_custom_step());
    }
    auto got2 = ReadAll(e);
    ASSERT_TRUE(got2.ok()) << got2.status();
    EXPECT_EQ(*got2, *want2) << "rank " << rank << ": the update was not kept as applied";
    Status next = step(e);
    ASSERT_TRUE(next.ok()) << "rank " << rank << ": " << next;
    auto got3 = ReadAll(e);
    ASSERT_TRUE(got3.ok()) << got3.status();
    EXPECT_EQ(*got3, *want3) << "rank " << rank << ": the next step differs from a run that never failed";
    EXPECT_EQ(e.steps(), 3);
  }
}

TEST(EngineOutOfMemory, OneRankOutOfMemoryInTheRegatherAfterTheUpdateFailsEveryRankOnLocalGroups) {
  for (ShardingStrategy strategy : {ShardingStrategy::kNoShard, ShardingStrategy::kShardOptim}) {
    for (bool custom : {false, true}) {
      SCOPED_TRACE(std::string(ShardingStrategyName(strategy)) + (custom ? ", custom step" : ", OptimizerStep"));
      std::mutex mu;
      FsdpEngineOptions o = Adam();
      o.fsdp.strategy = strategy;
      if (custom) o.optimizer.custom_name = "plain";
      RunLocal(2, [&](int rank, comm::ProcessGroup* world) {
        OneRankOutOfMemoryInTheRegather(rank, world, o, custom, mu);
      });
    }
  }
}

TEST(EngineOutOfMemory, OneRankOutOfMemoryInTheRegatherAfterTheUpdateFailsEveryRankOnGloo) {
  for (ShardingStrategy strategy : {ShardingStrategy::kNoShard, ShardingStrategy::kShardOptim}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    std::mutex mu;
    FsdpEngineOptions o = Adam();
    o.fsdp.strategy = strategy;
    RunGloo(2, [&](int rank, comm::ProcessGroup* world) {
      OneRankOutOfMemoryInTheRegather(rank, world, o, /*custom=*/false, mu);
    });
  }
}

// Item 7: rank 1 alone set another rate. Before, only its shard moved by it.
TEST(EngineAgreement, RanksWithDifferentLearningRatesFailTheStepNamingThemAndNothingChanges) {
  std::mutex mu;
  RunLocal(3, [&](int rank, comm::ProcessGroup* world) {
    auto e = FsdpEngine::Create(SmallModel(), world, Adam());
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->set_lr(rank == 1 ? 0.5f : 0.25f).ok());
    auto before = ReadAll(**e);
    ASSERT_TRUE(before.ok());
    Status s = Step(**e, rank, Grad);
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << rank << ": " << s;
      EXPECT_NE(s.ToString().find("the learning rate (0.25 on rank 0, 0.5 on rank 1)"), std::string::npos) << s;
    }
    auto after = ReadAll(**e);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, *before);
    EXPECT_EQ((*e)->steps(), 0);
    ASSERT_TRUE((*e)->set_lr(0.25f).ok());
    s = Step(**e, rank, Grad);
    EXPECT_TRUE(s.ok()) << s;
    // The custom step checks the rate too.
    ASSERT_TRUE((*e)->set_lr(rank == 2 ? 0.125f : 0.25f).ok());
    ASSERT_TRUE((*e)->ZeroGrad().ok());
    for (int u = 0; u < (*e)->num_units(); ++u) {
      ASSERT_TRUE((*e)->PreForward(u).ok());
      ASSERT_TRUE((*e)->PostForward(u).ok());
    }
    for (int u = (*e)->num_units() - 1; u >= 0; --u) {
      ASSERT_TRUE((*e)->PreBackward(u).ok());
      ASSERT_TRUE((*e)->PostBackward(u).ok());
    }
    ASSERT_TRUE((*e)->FinishBackward().ok());
    s = (*e)->BeginCustomStep();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.ToString().find("0.125 on rank 2"), std::string::npos) << s;
    EXPECT_FALSE((*e)->in_custom_step());
  });
}

// Item 7: each rank writes its own slice, so values that differed by rank
// left a parameter holding values no rank wrote.
TEST(EngineAgreement, WriteParamWithValuesThatDifferByRankIsRefusedOnEveryRank) {
  std::mutex mu;
  RunLocal(2, [&](int rank, comm::ProcessGroup* world) {
    auto e = FsdpEngine::Create(SmallModel(), world, Adam());
    ASSERT_TRUE(e.ok()) << e.status();
    auto before = ReadAll(**e);
    ASSERT_TRUE(before.ok());
    std::vector<float> v(24, 1.f);
    if (rank == 1) v[20] = 2.f;
    Status s = (*e)->WriteParam(0, 0, v.data(), 24);
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.ToString().find("WriteParam of 'fc.w': rank 1 passed values that differ from rank 0's"),
                std::string::npos)
          << s;
    }
    auto after = ReadAll(**e);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, *before) << "a refused write changed the parameter";
    v[20] = 2.f;
    ASSERT_TRUE((*e)->WriteParam(0, 0, v.data(), 24).ok());
    auto written = ReadAll(**e);
    ASSERT_TRUE(written.ok());
    EXPECT_EQ((*written)[0], v);
  });
}

// Item 7: a parameter group on one rank only (or a unit that differs) fails
// every rank at creation naming the field and both values.
TEST(EngineAgreement, UnitsOrOptionsThatDifferByRankFailEveryRankAtCreate) {
  struct Case {
    const char* mentions;
    std::function<void(int rank, std::vector<UnitSpec>&, FsdpEngineOptions&)> change;
  };
  const std::vector<Case> cases = {
      {"optimizer.param_groups is 0 on rank 0 but 1 on rank 1",
       [](int rank, std::vector<UnitSpec>&, FsdpEngineOptions& o) {
         if (rank != 1) return;
         ParamGroup g;
         g.pattern = "fc.*";
         g.weight_decay = 0;
         o.optimizer.param_groups = {g};
       }},
      {"optimizer.param_groups[0].pattern is fc.* on rank 0 but ln.* on rank 1",
       [](int rank, std::vector<UnitSpec>&, FsdpEngineOptions& o) {
         ParamGroup g;
         g.pattern = rank == 1 ? "ln.*" : "fc.*";
         o.optimizer.param_groups = {g};
       }},
      {"units[0] parameter is w [4, 6]",
       [](int rank, std::vector<UnitSpec>& units, FsdpEngineOptions&) {
         if (rank == 1) units[0].params[0].shape = Shape{6, 4};
       }},
      {"fsdp.strategy is FULL_SHARD on rank 0 but NO_SHARD on rank 1",
       [](int rank, std::vector<UnitSpec>&, FsdpEngineOptions& o) {
         if (rank == 1) o.fsdp.strategy = ShardingStrategy::kNoShard;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.mentions);
    std::mutex mu;
    RunLocal(2, [&](int rank, comm::ProcessGroup* world) {
      std::vector<UnitSpec> units = SmallModel();
      FsdpEngineOptions o = Adam();
      c.change(rank, units, o);
      auto e = FsdpEngine::Create(units, world, o);
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << "rank " << rank << ": " << e.status();
      EXPECT_NE(e.status().ToString().find(c.mentions), std::string::npos) << e.status();
    });
  }
}

// Item 8: a NaN gradient on one rank makes the (all-reduced) norm NaN:
// every rank's ClipGradNorm is Aborted, the update skipped, nothing changed,
// and the next step works.
TEST(EngineNonFinite, ANonFiniteGradientNormSkipsTheUpdateOnEveryRank) {
  std::mutex mu;
  RunLocal(2, [&](int rank, comm::ProcessGroup* world) {
    auto e = FsdpEngine::Create(SmallModel(), world, Adam());
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(Step(**e, rank, Grad, 1.0).ok());
    auto before = ReadAll(**e);
    ASSERT_TRUE(before.ok());
    Status s = Step(**e, rank, [](float w, int r) {
      return r == 1 ? std::numeric_limits<float>::quiet_NaN() : Grad(w, r);
    }, 0.0);
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
      EXPECT_NE(s.ToString().find("step 2 skipped on every rank: the gradient norm is nan"), std::string::npos)
          << s;
    }
    EXPECT_EQ((*e)->steps(), 1);
    auto after = ReadAll(**e);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, *before);
    Status next = Step(**e, rank, Grad, 1.0);
    EXPECT_TRUE(next.ok()) << next;
    EXPECT_EQ((*e)->steps(), 2);
  });
}

}  // namespace
}  // namespace sk
