// The engine as a framework's training backend (issue 34): the learning rate
// per step, parameter groups, the step count in checkpoints and state dicts,
// and what the gradient view holds under no_sync.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/train/engine.h"

namespace sk {
namespace {

// fc.w [2, 3] (decays), fc.b [3] and ln.gain [3] (the usual no-decay set).
std::vector<UnitSpec> SmallModel() {
  UnitSpec fc{"fc", {ParamSpec{"w", Shape{2, 3}, Initializer{InitKind::kNormal, 0.f, 1.f}},
                     ParamSpec{"b", Shape{3}, Initializer{InitKind::kUniform, -1.f, 1.f}}}};
  UnitSpec ln{"ln", {ParamSpec{"gain", Shape{3}, Initializer{InitKind::kOnes, 0.f, 0.f}}}};
  return {fc, ln};
}

void RunRanks(int world, const std::function<Status(int, comm::ProcessGroup*)>& body) {
  Status s = comm::RunLocalRanks(world, body);
  ASSERT_TRUE(s.ok()) << s;
}

// Reads every parameter in full (collective), "<unit>.<param>" order.
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

// One backward in which every gradient element gets `grad(param value)`
// added; `on_view` sees each gradient view before the add.
Status Backward(FsdpEngine& e, const std::function<float(float)>& grad,
                const std::function<void(const Tensor&)>& on_view = nullptr) {
  for (int u = 0; u < e.num_units(); ++u) {
    SK_RETURN_IF_ERROR(e.PreForward(u));
    SK_RETURN_IF_ERROR(e.PostForward(u));
  }
  for (int u = e.num_units() - 1; u >= 0; --u) {
    SK_RETURN_IF_ERROR(e.PreBackward(u));
    for (int p = 0; p < static_cast<int>(e.units()[u].params.size()); ++p) {
      SK_ASSIGN_OR_RETURN(const Tensor* w, e.Param(u, p));
      SK_ASSIGN_OR_RETURN(const Tensor* g, e.Grad(u, p));
      if (on_view) on_view(*g);
      for (int64_t i = 0; i < g->numel(); ++i) g->data_as<float>()[i] += grad(w->data_as<float>()[i]);
    }
    SK_RETURN_IF_ERROR(e.PostBackward(u));
  }
  return OkStatus();
}

Status Step(FsdpEngine& e, const std::function<float(float)>& grad) {
  SK_RETURN_IF_ERROR(e.ZeroGrad());
  SK_RETURN_IF_ERROR(Backward(e, grad));
  SK_RETURN_IF_ERROR(e.FinishBackward());
  return e.OptimizerStep();
}

FsdpEngineOptions Sgd(float lr, float wd) {
  FsdpEngineOptions o;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = lr;
  o.optimizer.weight_decay = wd;
  o.fsdp.timeout = Duration(60'000);
  return o;
}

TEST(EngineLearningRate, SetLrAppliesToTheFollowingStepsAndZeroIsValid) {
  RunRanks(2, [](int, comm::ProcessGroup* world) -> Status {
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, Sgd(0.1f, 0.f)));
    EXPECT_FLOAT_EQ(e->lr(), 0.1f);
    SK_ASSIGN_OR_RETURN(auto before, ReadAll(*e));
    SK_RETURN_IF_ERROR(e->set_lr(0.f));
    SK_RETURN_IF_ERROR(Step(*e, [](float) { return 1.f; }));
    SK_ASSIGN_OR_RETURN(auto same, ReadAll(*e));
    EXPECT_EQ(same, before) << "a step at lr 0 changed a parameter";
    SK_RETURN_IF_ERROR(e->set_lr(0.25f));
    SK_RETURN_IF_ERROR(Step(*e, [](float) { return 1.f; }));
    SK_ASSIGN_OR_RETURN(auto after, ReadAll(*e));
    for (size_t p = 0; p < after.size(); ++p) {
      for (size_t i = 0; i < after[p].size(); ++i) EXPECT_FLOAT_EQ(after[p][i], before[p][i] - 0.25f);
    }
    EXPECT_EQ(e->steps(), 2);
    EXPECT_EQ(e->set_lr(-1.f).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e->set_lr(std::numeric_limits<float>::infinity()).code(), StatusCode::kInvalidArgument);
    EXPECT_FLOAT_EQ(e->lr(), 0.25f);
    return OkStatus();
  });
}

// The usual no-decay group, sharded over 2 ranks so that a flat shard holds
// parts of decayed and undecayed parameters: each element steps as its
// parameter's group says.
TEST(EngineParamGroups, NoDecayGroupSkipsDecayForBiasesAndNormsOnEveryShard) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardOptim,
                                    ShardingStrategy::kNoShard}) {
    RunRanks(2, [&](int, comm::ProcessGroup* world) -> Status {
      FsdpEngineOptions o = Sgd(0.1f, 0.5f);
      o.fsdp.strategy = strategy;
      ParamGroup no_decay;
      no_decay.norms_biases_embeddings = true;
      no_decay.weight_decay = 0;
      ParamGroup slow_gain;  // listed second: ln.gain is already in no_decay
      slow_gain.pattern = "ln.*";
      slow_gain.lr_multiplier = 0;
      o.optimizer.param_groups = {no_decay, slow_gain};
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
      SK_ASSIGN_OR_RETURN(auto before, ReadAll(*e));
      SK_RETURN_IF_ERROR(Step(*e, [](float) { return 1.f; }));
      SK_ASSIGN_OR_RETURN(auto after, ReadAll(*e));
      for (size_t i = 0; i < after[0].size(); ++i) {  // fc.w: SGD's L2 decay
        EXPECT_FLOAT_EQ(after[0][i], before[0][i] - 0.1f * (1.f + 0.5f * before[0][i]))
            << ShardingStrategyName(strategy);
      }
      for (size_t p : {1, 2}) {  // fc.b, ln.gain: no decay
        for (size_t i = 0; i < after[p].size(); ++i) {
          EXPECT_FLOAT_EQ(after[p][i], before[p][i] - 0.1f) << ShardingStrategyName(strategy);
        }
      }
      return OkStatus();
    });
  }
}

TEST(EngineParamGroups, AnLrMultiplierScalesTheGroupsRate) {
  RunRanks(2, [](int, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o = Sgd(0.1f, 0.f);
    ParamGroup frozen;
    frozen.pattern = "fc.*";
    frozen.lr_multiplier = 0;
    o.optimizer.param_groups = {frozen};
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
    SK_ASSIGN_OR_RETURN(auto before, ReadAll(*e));
    SK_RETURN_IF_ERROR(Step(*e, [](float) { return 1.f; }));
    SK_ASSIGN_OR_RETURN(auto after, ReadAll(*e));
    EXPECT_EQ(after[0], before[0]);
    EXPECT_EQ(after[1], before[1]);
    for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(after[2][i], before[2][i] - 0.1f);
    return OkStatus();
  });
}

// Issue 47, item 8: the header promised that a group selecting nothing is
// refused; a misspelt pattern was accepted and every parameter stepped with
// the optimizer's defaults.
TEST(EngineParamGroups, AGroupThatMatchesNoParameterIsRefusedNamingIt) {
  RunRanks(2, [](int, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o = Sgd(0.1f, 0.f);
    ParamGroup ok;
    ok.pattern = "fc.*";
    ParamGroup typo;
    typo.pattern = "fc1.*";
    o.optimizer.param_groups = {ok, typo};
    StatusOr<std::unique_ptr<FsdpEngine>> e = FsdpEngine::Create(SmallModel(), world, o);
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status();
    const std::string msg(e.status().message());
    EXPECT_NE(msg.find("param_groups[1] (pattern 'fc1.*') selects no parameter"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fc.w"), std::string::npos) << msg;
    return OkStatus();
  });
}

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name + "-" + std::to_string(::getpid());
}

// Saved at 2 ranks (FULL_SHARD) after 2 Adam steps, resumed at 1 rank
// (NO_SHARD) with the step and the optimizer state: the third step matches
// the 2-rank run's third step.
TEST(EngineCheckpoint, ShardedCheckpointSavedAtTwoRanksResumesAtOneWithStepAndState) {
  const std::string dir = TempDir("engine-ckpt");
  auto grad = [](float w) { return w - 0.5f; };  // the gradient of 0.5 (w - 0.5)^2
  FsdpEngineOptions o;
  o.optimizer.kind = OptimizerKind::kAdamW;
  o.optimizer.lr = 0.05f;
  o.optimizer.weight_decay = 0.1f;
  o.fsdp.timeout = Duration(60'000);
  std::vector<std::vector<float>> three_steps;
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
    SK_RETURN_IF_ERROR(Step(*e, grad));
    SK_RETURN_IF_ERROR(Step(*e, grad));
    SK_RETURN_IF_ERROR(e->SaveCheckpoint(dir));
    SK_RETURN_IF_ERROR(Step(*e, grad));
    SK_ASSIGN_OR_RETURN(auto p, ReadAll(*e));
    if (rank == 0) three_steps = p;
    return OkStatus();
  });
  RunRanks(1, [&](int, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions one = o;
    one.fsdp.strategy = ShardingStrategy::kNoShard;
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, one));
    EXPECT_EQ(e->LoadCheckpoint(dir + "-missing").code(), StatusCode::kNotFound);
    SK_RETURN_IF_ERROR(e->LoadCheckpoint(dir));
    EXPECT_EQ(e->steps(), 2);
    SK_RETURN_IF_ERROR(Step(*e, grad));
    EXPECT_EQ(e->steps(), 3);
    SK_ASSIGN_OR_RETURN(auto p, ReadAll(*e));
    for (size_t k = 0; k < p.size(); ++k) {
      for (size_t i = 0; i < p[k].size(); ++i) EXPECT_NEAR(p[k][i], three_steps[k][i], 1e-6);
    }
    return OkStatus();
  });
}

TEST(EngineCheckpoint, FullStateDictKeepsAndRestoresTheStep) {
  const std::string path = TempDir("engine-sd") + ".safetensors";
  RunRanks(2, [&](int, comm::ProcessGroup* world) -> Status {
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, Sgd(0.1f, 0.f)));
    for (int s = 0; s < 3; ++s) SK_RETURN_IF_ERROR(Step(*e, [](float) { return 1.f; }));
    SK_RETURN_IF_ERROR(e->SaveFullStateDict(path));
    SK_ASSIGN_OR_RETURN(auto f, FsdpEngine::Create(SmallModel(), world, Sgd(0.1f, 0.f)));
    EXPECT_EQ(f->steps(), 0);
    SK_RETURN_IF_ERROR(f->LoadFullStateDict(path));
    EXPECT_EQ(f->steps(), 3);
    return OkStatus();
  });
}

// The contract chosen for no_sync (engine.h, docs/capi.md): the gradient view
// is the accumulation buffer itself, so in a micro-batch after a no_sync one
// it holds the running sum of the earlier micro-batches' gradients; the
// caller adds. After a synchronised backward (or ZeroGrad) it is zero again.
TEST(EngineNoSync, TheGradientViewHoldsTheRunningSumOfTheAccumulatedMicroBatches) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard}) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
      FsdpEngineOptions o = Sgd(1.f, 0.f);
      o.fsdp.strategy = strategy;
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
      SK_ASSIGN_OR_RETURN(auto before, ReadAll(*e));
      const std::string where = std::string(ShardingStrategyName(strategy)) + " rank " + std::to_string(rank);
      auto expect_all = [&](float want, const char* when) {
        return [&, want, when](const Tensor& g) {
          for (int64_t i = 0; i < g.numel(); ++i) {
            ASSERT_EQ(g.data_as<float>()[i], want) << where << ", " << when << ", element " << i;
          }
        };
      };
      // Rank r adds r + 1 in micro-batch 1 and 10 (r + 1) in micro-batch 2.
      const float a = static_cast<float>(rank + 1);
      SK_RETURN_IF_ERROR(e->ZeroGrad());
      SK_RETURN_IF_ERROR(e->set_gradient_sync(false));
      SK_RETURN_IF_ERROR(Backward(*e, [a](float) { return a; }, expect_all(0.f, "first micro-batch")));
      SK_RETURN_IF_ERROR(e->set_gradient_sync(true));
      SK_RETURN_IF_ERROR(
          Backward(*e, [a](float) { return 10 * a; }, expect_all(a, "second micro-batch (running sum)")));
      SK_RETURN_IF_ERROR(e->FinishBackward());
      SK_RETURN_IF_ERROR(e->OptimizerStep());
      // The mean over ranks of 11 (r + 1): 16.5.
      SK_ASSIGN_OR_RETURN(auto after, ReadAll(*e));
      for (size_t p = 0; p < after.size(); ++p) {
        for (size_t i = 0; i < after[p].size(); ++i) EXPECT_FLOAT_EQ(after[p][i], before[p][i] - 16.5f) << where;
      }
      SK_RETURN_IF_ERROR(e->ZeroGrad());
      SK_RETURN_IF_ERROR(Backward(*e, [](float) { return 0.f; }, expect_all(0.f, "the next step")));
      return e->FinishBackward();
    });
  }
}

// Write a parameter: every strategy reads back what was written, the other
// parameters keep their values, and training continues from it.
TEST(EngineWriteParam, WrittenValuesAreReadBackOnEveryStrategy) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard}) {
    RunRanks(2, [&](int, comm::ProcessGroup* world) -> Status {
      FsdpEngineOptions o = Sgd(0.5f, 0.f);
      o.fsdp.strategy = strategy;
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
      SK_ASSIGN_OR_RETURN(auto before, ReadAll(*e));
      const std::vector<float> w = {1, 2, 3, 4, 5, 6};
      SK_RETURN_IF_ERROR(e->WriteParam(0, 0, w.data(), 6));
      SK_ASSIGN_OR_RETURN(auto after, ReadAll(*e));
      EXPECT_EQ(after[0], w) << ShardingStrategyName(strategy);
      EXPECT_EQ(after[1], before[1]);
      EXPECT_EQ(after[2], before[2]);
      EXPECT_EQ(e->WriteParam(0, 0, w.data(), 5).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(e->WriteParam(0, 0, nullptr, 6).code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(e->WriteParam(0, 7, w.data(), 6).code(), StatusCode::kOutOfRange);
      SK_RETURN_IF_ERROR(e->PreForward(0));
      Status inside = e->WriteParam(0, 0, w.data(), 6);
      EXPECT_EQ(inside.code(), StatusCode::kFailedPrecondition) << inside;
      SK_RETURN_IF_ERROR(e->PostForward(0));
      SK_RETURN_IF_ERROR(Step(*e, [](float) { return 1.f; }));
      SK_ASSIGN_OR_RETURN(auto stepped, ReadAll(*e));
      for (size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(stepped[0][i], w[i] - 0.5f);
      return OkStatus();
    });
  }
}

// Your own optimizer: Lion (Chen et al. 2023) written on the shard views,
// checked against the rule applied to the full parameters in double. The
// momentum lives in the built-in optimizer's state (SGD with momentum keeps
// one tensor per unit), so a checkpoint saves it.
void LionOnShards(FsdpEngine& e, float lr, float b1, float b2, float wd) {
  ASSERT_TRUE(e.BeginCustomStep().ok());
  for (int u = 0; u < e.num_units(); ++u) {
    StatusOr<const Tensor*> p = e.MasterShard(u), g = e.GradShard(u);
    StatusOr<const Tensor*> m = e.OptimizerState(u, 0);
    ASSERT_TRUE(p.ok() && g.ok() && m.ok()) << m.status();
    float* pw = (*p)->data_as<float>();
    const float* gw = (*g)->data_as<float>();
    float* mw = (*m)->data_as<float>();
    for (int64_t i = 0; i < (*p)->numel(); ++i) {
      const float c = b1 * mw[i] + (1 - b1) * gw[i];
      const float sign = c > 0 ? 1.f : (c < 0 ? -1.f : 0.f);
      pw[i] = pw[i] * (1 - lr * wd) - lr * sign;
      mw[i] = b2 * mw[i] + (1 - b2) * gw[i];
    }
  }
  ASSERT_TRUE(e.EndCustomStep().ok());
}

TEST(EngineCustomOptimizer, LionOnTheShardsMatchesTheReferenceRule) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    RunRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
      FsdpEngineOptions o = Sgd(0.f, 0.f);
      o.optimizer.momentum = 0.9f;  // one state tensor per unit
      o.fsdp.strategy = strategy;
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
      SK_ASSIGN_OR_RETURN(auto start, ReadAll(*e));
      EXPECT_EQ(e->BeginCustomStep().code(), StatusCode::kFailedPrecondition);  // before a backward
      EXPECT_EQ(e->MasterShard(0).status().code(), StatusCode::kFailedPrecondition);
      auto grad = [](float w) { return w - 0.5f; };
      for (int s = 0; s < 3; ++s) {
        SK_RETURN_IF_ERROR(e->ZeroGrad());
        SK_RETURN_IF_ERROR(Backward(*e, grad));
        SK_RETURN_IF_ERROR(e->FinishBackward());
        LionOnShards(*e, 0.01f, 0.9f, 0.99f, 0.1f);
      }
      EXPECT_EQ(e->steps(), 3);
      SK_RETURN_IF_ERROR(e->ZeroGrad());
      SK_RETURN_IF_ERROR(Backward(*e, grad));
      SK_RETURN_IF_ERROR(e->FinishBackward());
      SK_RETURN_IF_ERROR(e->BeginCustomStep());
      EXPECT_EQ(e->OptimizerState(0, 1).status().code(), StatusCode::kOutOfRange);
      EXPECT_EQ(e->ZeroGrad().code(), StatusCode::kFailedPrecondition);
      EXPECT_EQ(e->PreForward(0).code(), StatusCode::kFailedPrecondition);
      SK_RETURN_IF_ERROR(e->EndCustomStep());  // a step with no change
      SK_ASSIGN_OR_RETURN(auto got, ReadAll(*e));
      for (size_t k = 0; k < start.size(); ++k) {
        for (size_t i = 0; i < start[k].size(); ++i) {
          double w = start[k][i], m = 0;
          for (int s = 0; s < 3; ++s) {
            const double g = static_cast<float>(w) - 0.5f;
            const double c = 0.9 * m + 0.1 * g;
            w = w * (1 - 0.01 * 0.1) - 0.01 * (c > 0 ? 1 : (c < 0 ? -1 : 0));
            m = 0.99 * m + 0.01 * g;
          }
          EXPECT_NEAR(got[k][i], w, 1e-5) << ShardingStrategyName(strategy) << " rank " << rank << " param " << k
                                          << " element " << i;
        }
      }
      return OkStatus();
    });
  }
}

// A unit whose parameters do not divide evenly over 2 or 4 ranks, so shards
// hold parts of several parameters and padding.
std::vector<UnitSpec> UnevenModel() {
  UnitSpec fc{"fc", {ParamSpec{"w", Shape{3, 5}, Initializer{InitKind::kNormal, 0.f, 1.f}},
                     ParamSpec{"b", Shape{5}, Initializer{InitKind::kUniform, -1.f, 1.f}},
                     ParamSpec{"gain", Shape{2}, Initializer{InitKind::kUniform, 2.f, 3.f}}}};
  UnitSpec head{"head", {ParamSpec{"w", Shape{7}, Initializer{InitKind::kNormal, 0.f, 1.f}}}};
  return {fc, head};
}

const ShardingStrategy kEveryStrategy[] = {ShardingStrategy::kFullShard,   ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kShardOptim,  ShardingStrategy::kNoShard,
                                           ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardGradOp};

// Every piece of the layout names the elements of its parameter that the
// master shard really holds, under every strategy at world 4 (the hybrids
// shard over 2): the shard index is the rank's place in its shard group (0
// of 1 under NO_SHARD, rank % 2 under the hybrids), and the pieces of all
// shard indices cover every parameter once.
TEST(EngineShardLayout, EachPieceIsTheSliceOfItsParameterTheShardHoldsUnderEveryStrategy) {
  for (ShardingStrategy strategy : kEveryStrategy) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    std::vector<std::vector<int64_t>> covered(4);  // per rank: elements seen per (unit, param)
    RunRanks(4, [&](int rank, comm::ProcessGroup* world) -> Status {
      FsdpEngineOptions o = Sgd(0.f, 0.f);
      o.fsdp.strategy = strategy;
      if (strategy == ShardingStrategy::kHybridShard || strategy == ShardingStrategy::kHybridShardGradOp) {
        o.fsdp.shard_group_size = 2;
      }
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(UnevenModel(), world, o));
      SK_ASSIGN_OR_RETURN(auto full, ReadAll(*e));  // fc.w, fc.b, fc.gain, head.w
      SK_RETURN_IF_ERROR(e->ZeroGrad());
      SK_RETURN_IF_ERROR(Backward(*e, [](float) { return 0.f; }));
      SK_RETURN_IF_ERROR(e->FinishBackward());
      SK_RETURN_IF_ERROR(e->BeginCustomStep());
      const int want_shards = strategy == ShardingStrategy::kNoShard ? 1
                              : (strategy == ShardingStrategy::kHybridShard ||
                                 strategy == ShardingStrategy::kHybridShardGradOp)
                                  ? 2
                                  : 4;
      covered[rank].assign(4, 0);
      const int first_param[] = {0, 3};
      for (int u = 0; u < e->num_units(); ++u) {
        SK_ASSIGN_OR_RETURN(const FsdpEngine::ShardLayout* l, e->GetShardLayout(u));
        SK_ASSIGN_OR_RETURN(const Tensor* master, e->MasterShard(u));
        EXPECT_EQ(l->num_shards, want_shards);
        EXPECT_EQ(l->shard_index, rank % want_shards) << "rank " << rank;
        EXPECT_EQ(l->shard_numel, master->numel());
        for (const FsdpEngine::ShardPiece& piece : l->pieces) {
          const std::vector<float>& value = full[first_param[u] + piece.param];
          EXPECT_EQ(piece.name, e->units()[u].name + "." + e->units()[u].params[piece.param].name);
          EXPECT_EQ(piece.shape, e->units()[u].params[piece.param].shape);
          EXPECT_LE(piece.shard_offset + piece.numel, master->numel());
          EXPECT_LE(piece.param_offset + piece.numel, static_cast<int64_t>(value.size()));
          for (int64_t i = 0; i < piece.numel; ++i) {
            EXPECT_EQ(master->data_as<float>()[piece.shard_offset + i], value[piece.param_offset + i])
                << "rank " << rank << " " << piece.name << " element " << piece.param_offset + i;
          }
          covered[rank][first_param[u] + piece.param] += piece.numel;
        }
      }
      return e->EndCustomStep();
    });
    // One shard group's pieces together cover each parameter exactly once.
    const int64_t sizes[] = {15, 5, 2, 7};
    const int shards = strategy == ShardingStrategy::kNoShard ? 1
                       : (strategy == ShardingStrategy::kHybridShard ||
                          strategy == ShardingStrategy::kHybridShardGradOp)
                           ? 2
                           : 4;
    for (int k = 0; k < 4; ++k) {
      int64_t sum = 0;
      for (int r = 0; r < shards; ++r) sum += covered[r][k];
      EXPECT_EQ(sum, sizes[k]) << "parameter " << k;
    }
  }
}

// Decoupled weight decay applied to one parameter by name, through the
// layout: under NO_SHARD and HYBRID_SHARD (world 4, shards of 2) exactly
// that parameter's elements shrink. Taking the shard index to be the rank
// (what a framework had to assume) decayed other parameters' elements there.
TEST(EngineShardLayout, DecayByParameterNameTouchesOnlyThatParameterUnderNoShardAndHybrid) {
  for (ShardingStrategy strategy : {ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    RunRanks(4, [&](int, comm::ProcessGroup* world) -> Status {
      FsdpEngineOptions o = Sgd(0.f, 0.f);
      o.fsdp.strategy = strategy;
      if (strategy == ShardingStrategy::kHybridShard) o.fsdp.shard_group_size = 2;
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(UnevenModel(), world, o));
      SK_ASSIGN_OR_RETURN(auto before, ReadAll(*e));
      SK_RETURN_IF_ERROR(e->ZeroGrad());
      SK_RETURN_IF_ERROR(Backward(*e, [](float) { return 0.f; }));
      SK_RETURN_IF_ERROR(e->FinishBackward());
      SK_RETURN_IF_ERROR(e->BeginCustomStep());
      for (int u = 0; u < e->num_units(); ++u) {
        SK_ASSIGN_OR_RETURN(const FsdpEngine::ShardLayout* l, e->GetShardLayout(u));
        SK_ASSIGN_OR_RETURN(const Tensor* master, e->MasterShard(u));
        for (const FsdpEngine::ShardPiece& piece : l->pieces) {
          if (piece.name != "fc.b") continue;
          for (int64_t i = 0; i < piece.numel; ++i) master->data_as<float>()[piece.shard_offset + i] *= 0.5f;
        }
      }
      SK_RETURN_IF_ERROR(e->EndCustomStep());
      SK_ASSIGN_OR_RETURN(auto after, ReadAll(*e));
      for (size_t k = 0; k < after.size(); ++k) {
        for (size_t i = 0; i < after[k].size(); ++i) {
          EXPECT_EQ(after[k][i], k == 1 ? before[k][i] * 0.5f : before[k][i]) << "parameter " << k << " element " << i;
        }
      }
      return OkStatus();
    });
  }
}

// The layout carries each parameter's group: the no-decay rule's biases and
// norms get weight decay 0, a pattern's lr multiplier reaches its pieces,
// the rest keep the options' decay.
TEST(EngineShardLayout, PiecesCarryTheirParameterGroup) {
  RunRanks(2, [&](int, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o = Sgd(0.1f, 0.5f);
    ParamGroup head;
    head.pattern = "head.*";
    head.lr_multiplier = 0.25f;
    ParamGroup no_decay;
    no_decay.no_decay = NoDecay::kBiasesAndNorms;
    no_decay.weight_decay = 0;
    o.optimizer.param_groups = {head, no_decay};
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(UnevenModel(), world, o));
    for (int u = 0; u < e->num_units(); ++u) {
      SK_ASSIGN_OR_RETURN(const FsdpEngine::ShardLayout* l, e->GetShardLayout(u));
      for (const FsdpEngine::ShardPiece& piece : l->pieces) {
        if (piece.name == "head.w") {
          EXPECT_EQ(piece.param_group, 0);
          EXPECT_FLOAT_EQ(piece.lr_multiplier, 0.25f);
          EXPECT_FLOAT_EQ(piece.weight_decay, 0.5f);
        } else if (piece.name == "fc.w") {
          EXPECT_EQ(piece.param_group, -1);
          EXPECT_FLOAT_EQ(piece.weight_decay, 0.5f);
          EXPECT_FLOAT_EQ(piece.lr_multiplier, 1.f);
        } else {
          EXPECT_EQ(piece.param_group, 1) << piece.name;
          EXPECT_FLOAT_EQ(piece.weight_decay, 0.f) << piece.name;
        }
      }
    }
    EXPECT_EQ(e->GetShardLayout(2).status().code(), StatusCode::kOutOfRange);
    return OkStatus();
  });
}

// A custom rule declares its own state: Lion keeps one tensor, "exp_avg",
// under the name "lion"; the checkpoint records kind "lion" (a Lion run
// borrowing SGD's momentum slot recorded SGD), restores the state into a
// Lion engine and is refused by an AdamW one, naming both.
TEST(EngineCustomOptimizer, DeclaredStateIsCheckpointedUnderTheRulesName) {
  char tmpl[] = "/tmp/sk_lion_ckpt_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/ckpt";
  std::vector<std::vector<float>> saved_state(2);
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o = Sgd(0.f, 0.f);
    o.optimizer.custom_name = "lion";
    o.optimizer.custom_state_names = {"exp_avg"};
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
    SK_RETURN_IF_ERROR(e->ZeroGrad());
    SK_RETURN_IF_ERROR(Backward(*e, [](float w) { return w - 0.5f; }));
    SK_RETURN_IF_ERROR(e->FinishBackward());
    Status builtin = e->OptimizerStep();
    EXPECT_EQ(builtin.code(), StatusCode::kFailedPrecondition) << builtin;
    EXPECT_NE(builtin.message().find("lion"), std::string::npos) << builtin;
    LionOnShards(*e, 0.01f, 0.9f, 0.99f, 0.1f);
    SK_RETURN_IF_ERROR(e->ZeroGrad());
    SK_RETURN_IF_ERROR(Backward(*e, [](float) { return 0.f; }));
    SK_RETURN_IF_ERROR(e->FinishBackward());
    SK_RETURN_IF_ERROR(e->BeginCustomStep());
    EXPECT_EQ(e->OptimizerState(0, 1).status().code(), StatusCode::kOutOfRange);
    SK_ASSIGN_OR_RETURN(const Tensor* m, e->OptimizerState(0, 0));
    saved_state[rank].assign(m->data_as<float>(), m->data_as<float>() + m->numel());
    SK_RETURN_IF_ERROR(e->EndCustomStep());
    return e->SaveCheckpoint(dir);
  });
  StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
  ASSERT_TRUE(ix.ok()) << ix.status();
  EXPECT_EQ(ix->optimizer_kind, "lion");
  EXPECT_EQ(ix->optimizer_state_names, std::vector<std::string>{"exp_avg"});
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o = Sgd(0.f, 0.f);
    o.optimizer.custom_name = "lion";
    o.optimizer.custom_state_names = {"exp_avg"};
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
    SK_RETURN_IF_ERROR(e->LoadCheckpoint(dir));
    EXPECT_EQ(e->steps(), 2);
    SK_RETURN_IF_ERROR(e->ZeroGrad());
    SK_RETURN_IF_ERROR(Backward(*e, [](float) { return 0.f; }));
    SK_RETURN_IF_ERROR(e->FinishBackward());
    SK_RETURN_IF_ERROR(e->BeginCustomStep());
    SK_ASSIGN_OR_RETURN(const Tensor* m, e->OptimizerState(0, 0));
    EXPECT_EQ(std::vector<float>(m->data_as<float>(), m->data_as<float>() + m->numel()), saved_state[rank]);
    SK_RETURN_IF_ERROR(e->EndCustomStep());
    FsdpEngineOptions adamw = Sgd(0.f, 0.f);
    adamw.optimizer.kind = OptimizerKind::kAdamW;
    SK_ASSIGN_OR_RETURN(auto a, FsdpEngine::Create(SmallModel(), world, adamw));
    Status refused = a->LoadCheckpoint(dir);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused;
    EXPECT_NE(refused.message().find("lion"), std::string::npos) << refused;
    EXPECT_NE(refused.message().find("ADAMW"), std::string::npos) << refused;
    return OkStatus();
  });
  // Bad declarations are refused naming what is wrong.
  RunRanks(1, [&](int, comm::ProcessGroup* world) -> Status {
    for (auto bad : std::vector<std::pair<std::string, std::vector<std::string>>>{
             {"SGD", {}}, {"adamw", {}}, {"li on", {}}, {"lion", {"m", "m"}}, {"lion", {""}}, {"", {"m"}}}) {
      FsdpEngineOptions o = Sgd(0.f, 0.f);
      o.optimizer.custom_name = bad.first;
      o.optimizer.custom_state_names = bad.second;
      auto e = FsdpEngine::Create(SmallModel(), world, o);
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << "'" << bad.first << "'";
    }
    return OkStatus();
  });
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

// Engine checkpoints match units and parameters by name: a model that
// declares its units and a unit's parameters in another order loads the
// same values (by position it was refused, or would have swapped weights);
// a parameter only one side has is INVALID_ARGUMENT naming it.
TEST(EngineCheckpoint, ParametersAreMatchedByNameAndAMissingOneIsNamed) {
  char tmpl[] = "/tmp/sk_byname_ckpt_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/ckpt";
  std::vector<std::vector<float>> saved;  // fc.w, fc.b, ln.gain
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o = Sgd(0.1f, 0.f);
    o.optimizer.momentum = 0.9f;
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(SmallModel(), world, o));
    SK_RETURN_IF_ERROR(Step(*e, [](float w) { return w; }));
    SK_ASSIGN_OR_RETURN(auto values, ReadAll(*e));
    if (rank == 0) saved = values;
    return e->SaveCheckpoint(dir);
  });
  // ln first, and fc's parameters as b, w: other flat offsets.
  UnitSpec ln{"ln", {ParamSpec{"gain", Shape{3}, Initializer{InitKind::kZeros, 0.f, 0.f}}}};
  UnitSpec fc{"fc", {ParamSpec{"b", Shape{3}, Initializer{InitKind::kZeros, 0.f, 0.f}},
                     ParamSpec{"w", Shape{2, 3}, Initializer{InitKind::kZeros, 0.f, 0.f}}}};
  for (int world_size : {1, 2}) {
    RunRanks(world_size, [&](int, comm::ProcessGroup* world) -> Status {
      FsdpEngineOptions o = Sgd(0.1f, 0.f);
      o.optimizer.momentum = 0.9f;
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create({ln, fc}, world, o));
      SK_RETURN_IF_ERROR(e->LoadCheckpoint(dir));
      SK_ASSIGN_OR_RETURN(auto got, ReadAll(*e));  // ln.gain, fc.b, fc.w
      EXPECT_EQ(got[0], saved[2]);
      EXPECT_EQ(got[1], saved[1]);
      EXPECT_EQ(got[2], saved[0]);
      EXPECT_EQ(e->steps(), 1);
      return OkStatus();
    });
  }
  UnitSpec fc_extra = fc;
  fc_extra.params.push_back(ParamSpec{"extra", Shape{2}, Initializer{InitKind::kZeros, 0.f, 0.f}});
  UnitSpec fc_short{"fc", {fc.params[1]}};
  UnitSpec fc_reshaped{"fc", {fc.params[0], ParamSpec{"w", Shape{3, 2}, Initializer{InitKind::kZeros, 0.f, 0.f}}}};
  UnitSpec other{"other", ln.params};
  const std::vector<std::pair<std::vector<UnitSpec>, std::string>> mismatches = {
      {{ln, fc_extra}, "fc.extra"}, {{ln, fc_short}, "fc.b"}, {{ln, fc_reshaped}, "fc.w"}, {{other, fc}, "other"}};
  for (const auto& [units, named] : mismatches) {
    RunRanks(2, [&](int, comm::ProcessGroup* world) -> Status {
      SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(units, world, Sgd(0.1f, 0.f)));
      SK_ASSIGN_OR_RETURN(auto before, ReadAll(*e));
      Status s = e->LoadCheckpoint(dir);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find(named), std::string::npos) << s;
      SK_ASSIGN_OR_RETURN(auto after, ReadAll(*e));
      EXPECT_EQ(after, before) << "a refused load changed the parameters";
      return OkStatus();
    });
  }
  std::system(("rm -rf " + std::string(tmpl)).c_str());
}

}  // namespace
}  // namespace sk
