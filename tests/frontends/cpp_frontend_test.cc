// The C++ frontend: move-only owners that release their handles, one
// exception type with the C API's code and message, and exceptions from
// rank callbacks that come back to the caller instead of crossing the ABI.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "shardkit/shardkit.hpp"

namespace {

static_assert(!std::is_copy_constructible_v<shardkit::Trainer>);
static_assert(!std::is_copy_assignable_v<shardkit::Engine>);
static_assert(std::is_nothrow_move_constructible_v<shardkit::ProcessGroup>);
static_assert(std::is_nothrow_move_assignable_v<shardkit::ModelSpec>);

sk_trainer_options Tiny() {
  sk_trainer_options o = SK_TRAINER_OPTIONS_INIT;
  o.model = "gpt-tiny";
  o.data_tokens = 64;
  return o;
}

TEST(CppFrontend, ErrorsCarryTheCodeAndTheLibraryMessage) {
  auto groups = shardkit::ProcessGroup::Local(1);
  sk_trainer_options o = Tiny();
  o.model = "gpt-unknown";
  try {
    shardkit::Trainer t(o, groups[0].get());
    FAIL() << "expected an Error";
  } catch (const shardkit::Error& e) {
    EXPECT_EQ(e.code(), SK_STATUS_NOT_FOUND);
    EXPECT_NE(e.message().find("gpt-unknown"), std::string::npos) << e.message();
    EXPECT_NE(std::string(e.what()).find("NOT_FOUND"), std::string::npos) << e.what();
  }
  try {
    shardkit::ProcessGroup::Local(0);
    FAIL() << "expected an Error";
  } catch (const shardkit::Error& e) {
    EXPECT_NE(e.message().find("world_size"), std::string::npos) << e.message();
  }
}

TEST(CppFrontend, MovedFromOwnersAreEmptyAndMoveAssignReleasesTheOld) {
  auto groups = shardkit::ProcessGroup::Local(2);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].rank(), 1);
  EXPECT_EQ(groups[1].size(), 2);
  shardkit::ProcessGroup moved = std::move(groups[0]);
  EXPECT_FALSE(groups[0]);
  EXPECT_TRUE(moved);
  sk_process_group* raw = moved.get();
  moved = std::move(groups[1]);  // releases rank 0's handle
  int32_t r = 0;
  EXPECT_EQ(sk_process_group_rank(raw, &r), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(moved.rank(), 1);
}

TEST(CppFrontend, TrainerOutlivesTheGroupObjectItWasMadeFrom) {
  std::optional<shardkit::Trainer> trainer;
  {
    auto groups = shardkit::ProcessGroup::Local(1);
    trainer.emplace(Tiny(), groups[0].get());
  }
  EXPECT_EQ(trainer->Step().step, 1);
  EXPECT_GT(trainer->NumParameters(), 0);
  EXPECT_EQ(trainer->NumParameters(), shardkit::ModelNumParameters("gpt-tiny"));
}

TEST(CppFrontend, LocalSessionTrainsTwoRanks) {
  shardkit::LocalSession session(Tiny(), 2);
  EXPECT_EQ(session.WorldSize(), 2);
  const sk_step_metrics m0 = session.Step();
  EXPECT_EQ(m0.rank, 0);
  EXPECT_EQ(session.Metrics(1).rank, 1);
  EXPECT_THROW(session.Metrics(2), shardkit::Error);
}

TEST(CppFrontend, CheckpointsResumeASessionAndFailuresThrow) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/cpp_frontend_ckpt";
  std::filesystem::remove_all(dir);
  shardkit::LocalSession session(Tiny(), 2);
  session.Step();
  session.SaveCheckpoint(dir);
  const float next = session.Step().loss;
  shardkit::LocalSession resumed(Tiny(), 2);
  EXPECT_EQ(resumed.LoadCheckpoint(dir), 1);
  EXPECT_EQ(resumed.Step().loss, next);
  try {
    resumed.LoadCheckpoint(dir + "-missing");
    FAIL() << "expected an Error";
  } catch (const shardkit::Error& e) {
    EXPECT_EQ(e.code(), SK_STATUS_NOT_FOUND);
  }
  std::filesystem::remove_all(dir);
}

TEST(CppFrontend, StateDictsResumeASessionAndImportHuggingFaceLayout) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp != nullptr ? tmp : "/tmp") + "/cpp_frontend_sd";
  shardkit::LocalSession session(Tiny(), 2);
  session.Step();
  session.SaveStateDict(base + ".safetensors");
  session.SaveStateDict(base + "-hf.safetensors", SK_WEIGHT_LAYOUT_HF_GPT2);
  const float weights = session.Evaluate(1);
  const float next = session.Step().loss;
  shardkit::LocalSession resumed(Tiny(), 2);
  EXPECT_EQ(resumed.LoadStateDict(base + ".safetensors"), 1);
  EXPECT_EQ(resumed.Step().loss, next);
  EXPECT_EQ(resumed.LoadStateDict(base + "-hf.safetensors", SK_WEIGHT_LAYOUT_HF_GPT2), 0);
  EXPECT_EQ(resumed.Evaluate(1), weights);
  try {
    resumed.LoadStateDict(base + ".safetensors", SK_WEIGHT_LAYOUT_HF_GPT2);
    FAIL() << "expected an Error";
  } catch (const shardkit::Error& e) {
    EXPECT_EQ(e.code(), SK_STATUS_INVALID_ARGUMENT);
  }
  std::filesystem::remove(base + ".safetensors");
  std::filesystem::remove(base + "-hf.safetensors");
}

TEST(CppFrontend, EngineStateDictsRoundTripThroughTheTorchLayout) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/cpp_frontend_engine.safetensors";
  auto groups = shardkit::ProcessGroup::Local(1);
  shardkit::ModelSpec drawn, zeros;
  drawn.AddParam(drawn.AddUnit("layer"), "w", {2, 3}, SK_INIT_NORMAL, 0.0f, 1.0f);
  zeros.AddParam(zeros.AddUnit("layer"), "w", {2, 3});
  shardkit::Engine from(drawn, groups[0].get());
  const std::vector<float> w = from.ReadParam(0, 0, 6);
  from.SaveStateDict(path, SK_WEIGHT_LAYOUT_TORCH);  // "layer.w" stored [3, 2]
  shardkit::Engine to(zeros, groups[0].get());
  EXPECT_THROW(to.LoadStateDict(path, SK_WEIGHT_LAYOUT_SHARDKIT), shardkit::Error);  // [3, 2] is not [2, 3]
  EXPECT_EQ(to.ReadParam(0, 0, 6), std::vector<float>(6, 0.0f));
  to.LoadStateDict(path, SK_WEIGHT_LAYOUT_TORCH);
  EXPECT_EQ(to.ReadParam(0, 0, 6), w);
  std::filesystem::remove(path);
}

TEST(CppFrontend, DdpTrainerStepsAndTheEstimatorCoversIt) {
  sk_trainer_options o = Tiny();
  o.parallelism = SK_PARALLELISM_DDP;
  shardkit::LocalSession ddp(o, 2);
  EXPECT_EQ(ddp.Step().step, 1);
  const sk_memory_estimate replicated = shardkit::EstimateMemory(o, 2);
  o.parallelism = SK_PARALLELISM_FSDP;
  const sk_memory_estimate e = shardkit::EstimateMemory(o, 2);
  EXPECT_GT(e.peak_bytes, 0);
  EXPECT_LT(e.master_bytes, replicated.master_bytes);
  EXPECT_EQ(e.parameters, shardkit::ModelNumParameters("gpt-tiny"));
}

TEST(CppFrontend, RankCallbackExceptionsAreRethrownToTheCaller) {
  EXPECT_THROW(shardkit::RunLocalRanks(2,
                                       [](int32_t rank, sk_process_group*) {
                                         if (rank == 1) throw std::logic_error("rank 1 gave up");
                                       }),
               std::logic_error);
  try {
    shardkit::RunLocalRanks(2, [](int32_t rank, sk_process_group* g) {
      EXPECT_EQ(shardkit::ProcessGroup::Rank(g), rank);
      shardkit::ModelSpec spec;
      spec.AddUnit("u");
      spec.AddParam(0, "p", {-1});  // bad shape on every rank
    });
    FAIL() << "expected an Error";
  } catch (const shardkit::Error& e) {
    EXPECT_EQ(e.code(), SK_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("u.p"), std::string::npos) << e.message();
  }
}

TEST(CppFrontend, EngineViewsAreTypedAndLifecycleErrorsThrow) {
  shardkit::ModelSpec spec;
  const int32_t u = spec.AddUnit("layer");
  spec.AddParam(u, "w", {2, 3}, SK_INIT_ONES);
  auto groups = shardkit::ProcessGroup::Local(1);
  shardkit::Engine engine(spec, groups[0].get());
  EXPECT_EQ(engine.NumUnits(), 1);
  try {
    engine.PostForward(u);
    FAIL() << "expected an Error";
  } catch (const shardkit::Error& e) {
    EXPECT_EQ(e.code(), SK_STATUS_FAILED_PRECONDITION);
  }
  engine.PreForward(u);
  shardkit::TensorView w = engine.Param(u, 0);
  EXPECT_EQ(w.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.f32()[5], 1.0f);
  engine.PostForward(u);
  EXPECT_EQ(engine.ReadParam(u, 0, 6), std::vector<float>(6, 1.0f));
  EXPECT_THROW(engine.ReadParam(u, 0, 5), shardkit::Error);
}

}  // namespace

namespace {

TEST(CppFrontend, PlanRanksCandidatesAndOwnsTheResult) {
  sk_plan_request r = SK_PLAN_REQUEST_INIT;
  r.model = "gpt-1m";
  r.gpus = 8;
  r.batch_size = 4;
  r.strategies = "DDP,SHARD_GRAD_OP";
  r.dtypes = "bf16";
  r.activation_checkpointing = 1;
  r.cpu_offload = 1;
  shardkit::Plan plan(r);
  // DDP, and SHARD_GRAD_OP without or with forward prefetch at 4 limits.
  ASSERT_EQ(plan.NumCandidates(), 6);
  EXPECT_EQ(plan.Recommended(), 0);
  EXPECT_STREQ(plan.result().profile, "a100-80g");
  EXPECT_NE(plan.Table().find("simulated, profile a100-80g"), std::string::npos);
  const sk_plan_candidate best = plan.Candidate(0);
  EXPECT_EQ(best.fits, 1);
  EXPECT_NE(plan.Recommendation().find(best.label), std::string::npos);
  EXPECT_LE(best.step_seconds, plan.Candidate(5).step_seconds);
  try {
    plan.Candidate(6);
    FAIL() << "expected an error";
  } catch (const shardkit::Error& e) {
    EXPECT_EQ(e.code(), SK_STATUS_OUT_OF_RANGE);
  }
  shardkit::Plan moved = std::move(plan);
  EXPECT_EQ(moved.NumCandidates(), 6);
  r.model = "no-such-model";
  try {
    shardkit::Plan bad(r);
    FAIL() << "expected an error";
  } catch (const shardkit::Error& e) {
    EXPECT_EQ(e.code(), SK_STATUS_NOT_FOUND);
    EXPECT_NE(e.message().find("no-such-model"), std::string::npos);
  }
}

}  // namespace
