// The C ABI of issue 34 (0.6.0): the learning rate per step and schedules,
// lr = 0 across struct versions, parameter groups, collectives on the
// caller's buffers, sharded engine checkpoints with the step, and
// sk_engine_write_param. Through libshardkit.so and shardkit.h only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "capi_test_util.h"
#include "shardkit/shardkit.h"

namespace {

using sk_capi_test::LastError;

// fc.w [2, 3], fc.b [3]; ln.gain [3].
sk_model_spec* SmallSpec() {
  sk_model_spec* spec = nullptr;
  EXPECT_EQ(sk_model_spec_create(&spec), SK_STATUS_OK);
  int32_t fc = 0, ln = 0;
  EXPECT_EQ(sk_model_spec_add_unit(spec, "fc", &fc), SK_STATUS_OK);
  EXPECT_EQ(sk_model_spec_add_unit(spec, "ln", &ln), SK_STATUS_OK);
  const int64_t w_shape[2] = {2, 3}, v_shape[1] = {3};
  sk_param_spec p = SK_PARAM_SPEC_INIT;
  p.name = "w";
  p.ndim = 2;
  p.shape = w_shape;
  p.init = SK_INIT_NORMAL;
  p.init_b = 1.0f;
  EXPECT_EQ(sk_model_spec_add_param(spec, fc, &p, nullptr), SK_STATUS_OK);
  p.name = "b";
  p.ndim = 1;
  p.shape = v_shape;
  EXPECT_EQ(sk_model_spec_add_param(spec, fc, &p, nullptr), SK_STATUS_OK);
  p.name = "gain";
  p.init = SK_INIT_ONES;
  p.init_b = 0.0f;
  EXPECT_EQ(sk_model_spec_add_param(spec, ln, &p, nullptr), SK_STATUS_OK);
  return spec;
}

std::vector<float> Read(sk_engine* e, int unit, int param, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  EXPECT_EQ(sk_engine_read_param(e, unit, param, v.data(), n), SK_STATUS_OK) << LastError();
  return v;
}

// Backward of both units adding `g` to every gradient element, then
// finish_backward and an optimizer step; no zero_grad (the caller's).
sk_status_t BackwardAndStep(sk_engine* e, float g) {
  sk_status_t s;
  for (int u = 1; u >= 0; --u) {
    if ((s = sk_engine_pre_backward(e, u)) != SK_STATUS_OK) return s;
    for (int p = 0; p < (u == 0 ? 2 : 1); ++p) {
      sk_tensor_view v = SK_TENSOR_VIEW_INIT;
      if ((s = sk_engine_grad(e, u, p, &v)) != SK_STATUS_OK) return s;
      for (int64_t i = 0; i < v.numel; ++i) static_cast<float*>(v.data)[i] += g;
    }
    if ((s = sk_engine_post_backward(e, u)) != SK_STATUS_OK) return s;
  }
  if ((s = sk_engine_finish_backward(e)) != SK_STATUS_OK) return s;
  return sk_engine_optimizer_step(e);
}

sk_status_t Forward(sk_engine* e) {
  sk_status_t s;
  for (int u = 0; u < 2; ++u) {
    if ((s = sk_engine_pre_forward(e, u)) != SK_STATUS_OK) return s;
    if ((s = sk_engine_post_forward(e, u)) != SK_STATUS_OK) return s;
  }
  return SK_STATUS_OK;
}

// One step in which every gradient element gets `g` added.
sk_status_t Step(sk_engine* e, float g) {
  sk_status_t s;
  if ((s = sk_engine_zero_grad(e)) != SK_STATUS_OK) return s;
  if ((s = Forward(e)) != SK_STATUS_OK) return s;
  return BackwardAndStep(e, g);
}

// sk_engine_set_loss_tokens (0.8.0) on one rank with SGD at lr 1: the
// step's gradient is divided by the count; bad input and calls out of
// order are refused and leave the step's reduction the plain mean. The
// multi-rank arithmetic: //tests/train:engine_loss_tokens_test.
TEST(CapiFramework, EngineSetLossTokensDividesTheStepsGradientAndRefusesBadCalls) {
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  opt.kind = SK_OPTIMIZER_SGD;
  opt.lr = 1.0f;
  sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
  eo.optimizer = &opt;
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  int64_t n = -7;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_set_loss_tokens(nullptr, 4, &n));
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_set_loss_tokens(e, -1, &n));
  EXPECT_ERROR_MENTIONS("tokens is -1");
  EXPECT_EQ(n, -7) << "a refused call wrote its output";

  // Weighted: a gradient of 1 per element over 4 tokens steps by 1/4.
  std::vector<float> before = Read(e, 0, 1, 3);
  ASSERT_OK(sk_engine_zero_grad(e));
  ASSERT_OK(sk_engine_set_loss_tokens(e, 4, &n));
  EXPECT_EQ(n, 4);
  ASSERT_OK(Forward(e));
  ASSERT_OK(BackwardAndStep(e, 1.0f));
  std::vector<float> after = Read(e, 0, 1, 3);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.25f);

  // Refused between pre_forward and post_forward, and after the step's
  // first reduction: the step stays the plain mean (a step of 1).
  before = after;
  ASSERT_OK(sk_engine_zero_grad(e));
  ASSERT_OK(sk_engine_pre_forward(e, 0));
  EXPECT_STATUS(SK_STATUS_FAILED_PRECONDITION, sk_engine_set_loss_tokens(e, 4, nullptr));
  ASSERT_OK(sk_engine_post_forward(e, 0));
  ASSERT_OK(sk_engine_pre_forward(e, 1));
  ASSERT_OK(sk_engine_post_forward(e, 1));
  ASSERT_OK(sk_engine_pre_backward(e, 1));
  sk_tensor_view v = SK_TENSOR_VIEW_INIT;
  ASSERT_OK(sk_engine_grad(e, 1, 0, &v));
  ASSERT_OK(sk_engine_post_backward(e, 1));
  EXPECT_STATUS(SK_STATUS_FAILED_PRECONDITION, sk_engine_set_loss_tokens(e, 4, nullptr));
  EXPECT_ERROR_MENTIONS("reduction");
  ASSERT_OK(sk_engine_pre_backward(e, 0));
  for (int p = 0; p < 2; ++p) {
    ASSERT_OK(sk_engine_grad(e, 0, p, &v));
    for (int64_t i = 0; i < v.numel; ++i) static_cast<float*>(v.data)[i] += 1.0f;
  }
  ASSERT_OK(sk_engine_post_backward(e, 0));
  ASSERT_OK(sk_engine_finish_backward(e));
  ASSERT_OK(sk_engine_optimizer_step(e));
  after = Read(e, 0, 1, 3);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 1.0f);

  // No token anywhere: a zero gradient; zero_grad then returns to the mean.
  before = after;
  ASSERT_OK(sk_engine_zero_grad(e));
  ASSERT_OK(sk_engine_set_loss_tokens(e, 0, nullptr));
  ASSERT_OK(Forward(e));
  ASSERT_OK(BackwardAndStep(e, 1.0f));
  EXPECT_EQ(Read(e, 0, 1, 3), before);
  ASSERT_OK(sk_engine_zero_grad(e));
  ASSERT_OK(Forward(e));
  ASSERT_OK(BackwardAndStep(e, 1.0f));
  after = Read(e, 0, 1, 3);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 1.0f);
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

TEST(CapiFramework, VersionIs080) {
  EXPECT_STREQ(sk_version(), "0.8.0");
  EXPECT_EQ(sk_version_number(), 8000);
}

// lr = 0 is a rate of 0 in a 0.6.0 struct and "1e-3" in an older one.
TEST(CapiFramework, OptimizerLrZeroMeansZeroInTheNewStructAndTheDefaultInAnOldOne) {
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
  eo.optimizer = &opt;
  float lr = -1;
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  ASSERT_OK(sk_engine_get_lr(e, &lr));
  EXPECT_FLOAT_EQ(lr, 1e-3f);  // the INIT macro's
  sk_engine_destroy(e);
  opt.lr = 0.0f;
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  ASSERT_OK(sk_engine_get_lr(e, &lr));
  EXPECT_EQ(lr, 0.0f);
  sk_engine_destroy(e);
  opt.struct_size = 48;  // a 0.5.0 header's struct
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  ASSERT_OK(sk_engine_get_lr(e, &lr));
  EXPECT_FLOAT_EQ(lr, 1e-3f);
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

TEST(CapiFramework, EngineSetLrStepsAtTheNewRateAndRefusesBadRates) {
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  opt.kind = SK_OPTIMIZER_SGD;
  sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
  eo.optimizer = &opt;
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  const std::vector<float> before = Read(e, 0, 1, 3);
  ASSERT_OK(sk_engine_set_lr(e, 0.0f));
  ASSERT_OK(Step(e, 1.0f));
  EXPECT_EQ(Read(e, 0, 1, 3), before);
  ASSERT_OK(sk_engine_set_lr(e, 0.5f));
  ASSERT_OK(Step(e, 1.0f));
  const std::vector<float> after = Read(e, 0, 1, 3);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f);
  int64_t steps = 0;
  ASSERT_OK(sk_engine_steps(e, &steps));
  EXPECT_EQ(steps, 2);
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_set_lr(e, -0.1f));
  EXPECT_ERROR_MENTIONS("learning rate");
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_set_lr(e, NAN));
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_set_lr(nullptr, 0.1f));
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_get_lr(e, nullptr));
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

TEST(CapiFramework, ParamGroupsExemptTheNoDecaySetAndBadGroupsNameTheGroup) {
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  sk_param_group groups[1] = {SK_PARAM_GROUP_INIT};
  groups[0].norms_biases_embeddings = 1;  // weight_decay 0 as given
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  opt.kind = SK_OPTIMIZER_SGD;
  opt.lr = 0.1f;
  opt.weight_decay = 0.5f;
  opt.param_groups = groups;
  opt.num_param_groups = 1;
  sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
  eo.optimizer = &opt;
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  const std::vector<float> w0 = Read(e, 0, 0, 6), b0 = Read(e, 0, 1, 3);
  ASSERT_OK(Step(e, 1.0f));
  const std::vector<float> w1 = Read(e, 0, 0, 6), b1 = Read(e, 0, 1, 3);
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(w1[i], w0[i] - 0.1f * (1.0f + 0.5f * w0[i]));
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(b1[i], b0[i] - 0.1f);
  sk_engine_destroy(e);
  sk_param_group none = SK_PARAM_GROUP_INIT;  // selects nothing
  opt.param_groups = &none;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_create(spec, g, &eo, &e));
  EXPECT_ERROR_MENTIONS("param_groups[0]");
  opt.param_groups = nullptr;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_create(spec, g, &eo, &e));
  EXPECT_ERROR_MENTIONS("num_param_groups");
  // 0.8.0's no_decay: an unknown rule, or one that contradicts
  // norms_biases_embeddings, is refused naming the group (no engine made).
  sk_param_group bad = SK_PARAM_GROUP_INIT;
  bad.no_decay = static_cast<sk_no_decay_t>(7);
  opt.param_groups = &bad;
  e = nullptr;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_create(spec, g, &eo, &e));
  EXPECT_ERROR_MENTIONS("param_groups[0].no_decay");
  EXPECT_EQ(e, nullptr);
  bad.no_decay = SK_NO_DECAY_BIASES_AND_NORMS;
  bad.norms_biases_embeddings = 1;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_create(spec, g, &eo, &e));
  EXPECT_ERROR_MENTIONS("norms_biases_embeddings");
  EXPECT_EQ(e, nullptr);
  // A 0.6.0 struct (struct_size 32) reads no_decay as NONE: its flag alone decides.
  sk_param_group old = SK_PARAM_GROUP_INIT;
  old.struct_size = SK_PARAM_GROUP_STRUCT_SIZE_V1;
  old.norms_biases_embeddings = 1;
  opt.param_groups = &old;
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

sk_status_t CollectivesRank(int32_t rank, sk_process_group* g, void*) {
  float loss[2] = {static_cast<float>(rank + 1), static_cast<float>(10 * rank)};
  sk_status_t s = sk_process_group_all_reduce(g, loss, 2, SK_DTYPE_F32, SK_REDUCE_MEAN);
  if (s != SK_STATUS_OK) return s;
  if (loss[0] != 1.5f || loss[1] != 5.0f) return SK_STATUS_INTERNAL;
  float mx = rank == 0 ? 3.0f : -1.0f;
  if ((s = sk_process_group_all_reduce(g, &mx, 1, SK_DTYPE_F32, SK_REDUCE_MAX)) != SK_STATUS_OK) return s;
  if (mx != 3.0f) return SK_STATUS_INTERNAL;
  float b = rank == 1 ? 7.0f : 0.0f;
  if ((s = sk_process_group_broadcast(g, &b, 1, SK_DTYPE_F32, 1)) != SK_STATUS_OK) return s;
  if (b != 7.0f) return SK_STATUS_INTERNAL;
  float in = static_cast<float>(rank), out[2] = {-1, -1};
  if ((s = sk_process_group_all_gather(g, &in, out, 1, SK_DTYPE_F32)) != SK_STATUS_OK) return s;
  if (out[0] != 0.0f || out[1] != 1.0f) return SK_STATUS_INTERNAL;
  if ((s = sk_process_group_barrier(g)) != SK_STATUS_OK) return s;
  // Bad arguments: errors before any communication, on every rank alike.
  if (sk_process_group_all_reduce(g, nullptr, 4, SK_DTYPE_F32, SK_REDUCE_SUM) != SK_STATUS_INVALID_ARGUMENT)
    return SK_STATUS_INTERNAL;
  if (sk_process_group_all_reduce(g, &b, 1, static_cast<sk_dtype_t>(9), SK_REDUCE_SUM) !=
      SK_STATUS_INVALID_ARGUMENT)
    return SK_STATUS_INTERNAL;
  if (std::string(sk_last_error_message()).find("dtype") == std::string::npos) return SK_STATUS_INTERNAL;
  if (sk_process_group_all_reduce(g, &b, 1, SK_DTYPE_F32, static_cast<sk_reduce_op_t>(7)) !=
      SK_STATUS_INVALID_ARGUMENT)
    return SK_STATUS_INTERNAL;
  if (sk_process_group_broadcast(g, &b, 1, SK_DTYPE_F32, 5) != SK_STATUS_OUT_OF_RANGE) return SK_STATUS_INTERNAL;
  // Mismatched peers: rank 0 reduces 2 elements, rank 1 one.
  float two[2] = {1, 1};
  s = sk_process_group_all_reduce(g, two, rank == 0 ? 2 : 1, SK_DTYPE_F32, SK_REDUCE_SUM);
  if (s != SK_STATUS_INVALID_ARGUMENT) return SK_STATUS_INTERNAL;
  if (std::string(sk_last_error_message()).find("all_reduce") == std::string::npos) return SK_STATUS_INTERNAL;
  return SK_STATUS_OK;
}

TEST(CapiFramework, CollectivesOnTheCallersBuffersAcrossRanks) {
  ASSERT_OK(sk_run_local_ranks(2, nullptr, CollectivesRank, nullptr));
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_process_group_barrier(nullptr));
}

std::string TempPath(const char* name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name + "-" + std::to_string(::getpid());
}

struct CheckpointRun {
  std::string dir;
  std::vector<float> w;  // rank 0's fc.w after the steps
};

sk_status_t SaveAtTwoRanks(int32_t rank, sk_process_group* g, void* user) {
  auto* run = static_cast<CheckpointRun*>(user);
  sk_model_spec* spec = SmallSpec();
  sk_engine* e = nullptr;
  sk_status_t s = sk_engine_create(spec, g, nullptr, &e);
  sk_model_spec_destroy(spec);
  if (s != SK_STATUS_OK) return s;
  for (int i = 0; i < 2 && s == SK_STATUS_OK; ++i) s = Step(e, 0.5f);
  if (s == SK_STATUS_OK) s = sk_engine_save_checkpoint(e, run->dir.c_str());
  std::vector<float> w(6);
  if (s == SK_STATUS_OK) s = sk_engine_read_param(e, 0, 0, w.data(), 6);
  if (rank == 0) run->w = w;
  sk_engine_destroy(e);
  return s;
}

TEST(CapiFramework, EngineCheckpointSavedAtTwoRanksLoadsAtOneWithTheStep) {
  CheckpointRun run{TempPath("capi-engine-ckpt"), {}};
  ASSERT_OK(sk_run_local_ranks(2, nullptr, SaveAtTwoRanks, &run));
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, nullptr, &e));
  int64_t step = -1;
  EXPECT_STATUS(SK_STATUS_NOT_FOUND, sk_engine_load_checkpoint(e, (run.dir + "-missing").c_str(), &step));
  EXPECT_EQ(step, -1);
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_load_checkpoint(e, nullptr, &step));
  ASSERT_OK(sk_engine_load_checkpoint(e, run.dir.c_str(), &step));
  EXPECT_EQ(step, 2);
  EXPECT_EQ(Read(e, 0, 0, 6), run.w);
  int64_t steps = 0;
  ASSERT_OK(sk_engine_steps(e, &steps));
  EXPECT_EQ(steps, 2);
  // The state dict keeps the step too.
  const std::string sd = TempPath("capi-engine-sd") + ".safetensors";
  ASSERT_OK(sk_engine_save_state_dict(e, sd.c_str(), SK_WEIGHT_LAYOUT_SHARDKIT));
  sk_engine* f = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, nullptr, &f));
  ASSERT_OK(sk_engine_load_state_dict(f, sd.c_str(), SK_WEIGHT_LAYOUT_SHARDKIT));
  ASSERT_OK(sk_engine_steps(f, &steps));
  EXPECT_EQ(steps, 2);
  sk_engine_destroy(f);
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

TEST(CapiFramework, WriteParamSetsTheFullValue) {
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, nullptr, &e));
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  ASSERT_OK(sk_engine_write_param(e, 0, 0, w.data(), 6));
  EXPECT_EQ(Read(e, 0, 0, 6), w);
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_write_param(e, 0, 0, w.data(), 5));
  EXPECT_ERROR_MENTIONS("count is 5");
  EXPECT_STATUS(SK_STATUS_OUT_OF_RANGE, sk_engine_write_param(e, 0, 9, w.data(), 6));
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_write_param(nullptr, 0, 0, w.data(), 6));
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

TEST(CapiFramework, TrainerFollowsItsScheduleAndSetLrOverridesIt) {
  sk_lr_schedule ls = SK_LR_SCHEDULE_INIT;
  ls.kind = SK_LR_SCHEDULE_COSINE;
  ls.warmup_steps = 2;
  ls.decay_steps = 2;
  ls.min_lr = 1e-4f;
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  sk_trainer_options o = sk_capi_test::TinyTrainer(nullptr, &opt);
  o.lr_schedule = &ls;
  sk_local_session* s = nullptr;
  ASSERT_OK(sk_local_session_create(&o, 2, nullptr, &s));
  const float want[5] = {5e-4f, 1e-3f, 1e-3f, 5.5e-4f, 1e-4f};
  for (int i = 0; i < 5; ++i) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    ASSERT_OK(sk_local_session_step(s, &m));
    EXPECT_NEAR(m.lr, want[i], 1e-9) << "step " << i;
  }
  ASSERT_OK(sk_local_session_set_lr(s, 0.0f));
  sk_step_metrics m = SK_STEP_METRICS_INIT;
  ASSERT_OK(sk_local_session_step(s, &m));
  EXPECT_EQ(m.lr, 0.0f);
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_local_session_set_lr(s, -1.0f));
  sk_local_session_destroy(s);
  ls.decay_steps = 0;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_local_session_create(&o, 1, nullptr, &s));
  EXPECT_ERROR_MENTIONS("decay_steps");
  ls.decay_steps = 2;
  ls.kind = static_cast<sk_lr_schedule_kind_t>(8);
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_local_session_create(&o, 1, nullptr, &s));
  EXPECT_ERROR_MENTIONS("sk_lr_schedule.kind");
}

sk_status_t TrainerLrRank(int32_t, sk_process_group* g, void*) {
  sk_trainer_options o = sk_capi_test::TinyTrainer();
  sk_trainer* t = nullptr;
  sk_status_t s = sk_trainer_create(&o, g, &t);
  if (s != SK_STATUS_OK) return s;
  float lr = 0;
  if ((s = sk_trainer_get_lr(t, &lr)) == SK_STATUS_OK && lr != 1e-3f) s = SK_STATUS_INTERNAL;
  if (s == SK_STATUS_OK) s = sk_trainer_set_lr(t, 0.25f);
  if (s == SK_STATUS_OK && (s = sk_trainer_get_lr(t, &lr)) == SK_STATUS_OK && lr != 0.25f) s = SK_STATUS_INTERNAL;
  sk_trainer_destroy(t);
  return s;
}

TEST(CapiFramework, TrainerGetAndSetLr) { ASSERT_OK(sk_run_local_ranks(1, nullptr, TrainerLrRank, nullptr)); }

// Your own update rule through the ABI: p -= 0.25 * sign(m) with m the
// running gradient kept in the optimizer's state (one tensor: SGD momentum).
TEST(CapiFramework, CustomStepUpdatesTheMasterShardsFromTheGradientShards) {
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  opt.kind = SK_OPTIMIZER_SGD;
  opt.momentum = 0.9f;
  sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
  eo.optimizer = &opt;
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, &eo, &e));
  const std::vector<float> b0 = Read(e, 0, 1, 3);
  sk_tensor_view v = SK_TENSOR_VIEW_INIT;
  EXPECT_STATUS(SK_STATUS_FAILED_PRECONDITION, sk_engine_begin_custom_step(e));
  EXPECT_STATUS(SK_STATUS_FAILED_PRECONDITION, sk_engine_master_shard(e, 0, &v));
  EXPECT_ERROR_MENTIONS("BeginCustomStep");
  // A backward whose gradient is 1 everywhere, then the custom rule.
  ASSERT_OK(sk_engine_zero_grad(e));
  for (int u = 0; u < 2; ++u) {
    ASSERT_OK(sk_engine_pre_forward(e, u));
    ASSERT_OK(sk_engine_post_forward(e, u));
  }
  for (int u = 1; u >= 0; --u) {
    ASSERT_OK(sk_engine_pre_backward(e, u));
    for (int p = 0; p < (u == 0 ? 2 : 1); ++p) {
      sk_tensor_view gv = SK_TENSOR_VIEW_INIT;
      ASSERT_OK(sk_engine_grad(e, u, p, &gv));
      for (int64_t i = 0; i < gv.numel; ++i) static_cast<float*>(gv.data)[i] += 1.0f;
    }
    ASSERT_OK(sk_engine_post_backward(e, u));
  }
  ASSERT_OK(sk_engine_finish_backward(e));
  ASSERT_OK(sk_engine_begin_custom_step(e));
  EXPECT_STATUS(SK_STATUS_FAILED_PRECONDITION, sk_engine_optimizer_step(e));
  for (int u = 0; u < 2; ++u) {
    sk_tensor_view mv = SK_TENSOR_VIEW_INIT, gv = SK_TENSOR_VIEW_INIT, sv = SK_TENSOR_VIEW_INIT;
    ASSERT_OK(sk_engine_master_shard(e, u, &mv));
    ASSERT_OK(sk_engine_grad_shard(e, u, &gv));
    ASSERT_OK(sk_engine_optimizer_state(e, u, 0, &sv));
    ASSERT_EQ(mv.numel, gv.numel);
    ASSERT_EQ(mv.numel, sv.numel);
    EXPECT_EQ(mv.ndim, 1);
    for (int64_t i = 0; i < mv.numel; ++i) {
      float& m = static_cast<float*>(sv.data)[i];
      m = 0.9f * m + static_cast<const float*>(gv.data)[i];
      static_cast<float*>(mv.data)[i] -= m > 0 ? 0.25f : 0.0f;  // padding: gradient 0, unchanged
    }
  }
  EXPECT_STATUS(SK_STATUS_OUT_OF_RANGE, sk_engine_optimizer_state(e, 0, 1, &v));
  EXPECT_STATUS(SK_STATUS_OUT_OF_RANGE, sk_engine_master_shard(e, 5, &v));
  ASSERT_OK(sk_engine_end_custom_step(e));
  EXPECT_STATUS(SK_STATUS_FAILED_PRECONDITION, sk_engine_end_custom_step(e));
  const std::vector<float> b1 = Read(e, 0, 1, 3);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(b1[i], b0[i] - 0.25f);
  int64_t steps = 0;
  ASSERT_OK(sk_engine_steps(e, &steps));
  EXPECT_EQ(steps, 1);
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

// Issue 47 item 9 through the ABI. Rank r of 2 under NO_SHARD holds shard 0
// of 1 (not shard r): every piece is the whole parameter at its flat offset.
// A Lion rule declares its one state tensor, which checkpoints record under
// "lion", and sk_engine_optimizer_step is refused on such an engine.
struct LayoutRun {
  std::string dir;
};

sk_status_t LayoutRank(int32_t rank, sk_process_group* g, void* user) {
  auto* run = static_cast<LayoutRun*>(user);
  sk_model_spec* spec = SmallSpec();
  sk_fsdp_options fsdp = SK_FSDP_OPTIONS_INIT;
  fsdp.strategy = SK_SHARDING_NO_SHARD;
  sk_param_group no_decay = SK_PARAM_GROUP_INIT;
  no_decay.no_decay = SK_NO_DECAY_BIASES_AND_NORMS;
  no_decay.weight_decay = 0.0f;
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  opt.weight_decay = 0.25f;
  opt.param_groups = &no_decay;
  opt.num_param_groups = 1;
  const char* states[1] = {"exp_avg"};
  sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
  eo.fsdp = &fsdp;
  eo.optimizer = &opt;
  eo.custom_optimizer = "lion";
  eo.custom_state_names = states;
  eo.num_custom_states = 1;
  sk_engine* e = nullptr;
  sk_status_t s = sk_engine_create(spec, g, &eo, &e);
  sk_model_spec_destroy(spec);
  if (s != SK_STATUS_OK) return s;
  int32_t index = -1, shards = -1, pieces = -1;
  EXPECT_EQ(sk_engine_shard_layout(e, 0, &index, &shards, &pieces), SK_STATUS_OK) << LastError();
  EXPECT_EQ(index, 0) << "rank " << rank;
  EXPECT_EQ(shards, 1);
  EXPECT_EQ(pieces, 2);
  const char* names[2] = {"fc.w", "fc.b"};
  const int64_t numels[2] = {6, 3};
  const float decays[2] = {0.25f, 0.0f};
  const std::vector<float> full[2] = {Read(e, 0, 0, 6), Read(e, 0, 1, 3)};
  sk_shard_piece layout[2];
  for (int32_t i = 0; i < 2; ++i) {
    sk_shard_piece& p = layout[i];
    p = SK_SHARD_PIECE_INIT;
    EXPECT_EQ(sk_engine_shard_piece(e, 0, i, &p), SK_STATUS_OK) << LastError();
    EXPECT_STREQ(p.name, names[i]);
    EXPECT_EQ(p.param, i);
    EXPECT_GE(p.shard_offset, i == 0 ? 0 : layout[0].shard_offset + layout[0].numel);
    EXPECT_EQ(p.numel, numels[i]);
    EXPECT_EQ(p.param_offset, 0);
    EXPECT_EQ(p.ndim, i == 0 ? 2 : 1);
    EXPECT_EQ(p.shape[0], i == 0 ? 2 : 3);
    EXPECT_EQ(p.param_group, i == 0 ? -1 : 0);
    EXPECT_FLOAT_EQ(p.weight_decay, decays[i]);
    EXPECT_FLOAT_EQ(p.lr_multiplier, 1.0f);
  }
  // Bad inputs: nothing written.
  sk_shard_piece p = SK_SHARD_PIECE_INIT;
  EXPECT_EQ(sk_engine_shard_piece(e, 0, 2, &p), SK_STATUS_OUT_OF_RANGE);
  EXPECT_NE(LastError().find("2 pieces"), std::string::npos) << LastError();
  EXPECT_EQ(sk_engine_shard_piece(e, 0, -1, &p), SK_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(sk_engine_shard_piece(e, 5, 0, &p), SK_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(p.name, nullptr);
  EXPECT_EQ(sk_engine_shard_piece(e, 0, 0, nullptr), SK_STATUS_INVALID_ARGUMENT);
  sk_shard_piece small = SK_SHARD_PIECE_INIT;
  small.struct_size = 8;
  EXPECT_EQ(sk_engine_shard_piece(e, 0, 0, &small), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("struct_size"), std::string::npos) << LastError();
  index = -7;
  EXPECT_EQ(sk_engine_shard_layout(e, 2, &index, nullptr, nullptr), SK_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(index, -7);
  EXPECT_EQ(sk_engine_shard_layout(nullptr, 0, &index, nullptr, nullptr), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(sk_engine_shard_piece(nullptr, 0, 0, &p), SK_STATUS_INVALID_ARGUMENT);
  // One step of the rule; the built-in step is refused.
  if ((s = Step(e, 0.5f)) != SK_STATUS_FAILED_PRECONDITION) {
    sk_engine_destroy(e);
    return SK_STATUS_INTERNAL;
  }
  EXPECT_NE(LastError().find("lion"), std::string::npos) << LastError();
  s = sk_engine_begin_custom_step(e);
  sk_tensor_view v = SK_TENSOR_VIEW_INIT;
  if (s == SK_STATUS_OK) s = sk_engine_master_shard(e, 0, &v);
  if (s == SK_STATUS_OK) {
    // Each piece holds its parameter's values (the whole parameter: NO_SHARD).
    for (int k = 0; k < 2; ++k) {
      for (int64_t j = 0; j < layout[k].numel; ++j) {
        EXPECT_EQ(static_cast<const float*>(v.data)[layout[k].shard_offset + j], full[k][j]) << names[k] << " " << j;
      }
    }
    s = sk_engine_optimizer_state(e, 0, 0, &v);
  }
  if (s == SK_STATUS_OK) {
    for (int64_t i = 0; i < v.numel; ++i) static_cast<float*>(v.data)[i] = 1.0f + static_cast<float>(i);
    EXPECT_EQ(sk_engine_optimizer_state(e, 0, 1, &v), SK_STATUS_OUT_OF_RANGE);
    EXPECT_NE(LastError().find("lion"), std::string::npos) << LastError();
    s = sk_engine_end_custom_step(e);
  }
  if (s == SK_STATUS_OK) s = sk_engine_save_checkpoint(e, run->dir.c_str());
  sk_engine_destroy(e);
  return s;
}

TEST(CapiFramework, ShardLayoutAndACustomRulesDeclaredState) {
  LayoutRun run{TempPath("capi-lion-ckpt")};
  ASSERT_OK(sk_run_local_ranks(2, nullptr, LayoutRank, &run));
  std::FILE* f = std::fopen((run.dir + "/index.json").c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string index;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) index.append(buf, n);
  std::fclose(f);
  EXPECT_NE(index.find("\"lion\""), std::string::npos) << index;
  EXPECT_EQ(index.find("\"SGD\""), std::string::npos) << index;
  EXPECT_EQ(index.find("\"ADAMW\""), std::string::npos) << index;
  // Bad declarations: INVALID_ARGUMENT naming the field, no engine.
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_model_spec* spec = SmallSpec();
  const char* states[2] = {"m", nullptr};
  struct Bad {
    const char* name;
    const char* const* states;
    int32_t count;
    const char* mentions;
  } bad[] = {{nullptr, states, 1, "custom_optimizer is NULL"},
             {"lion", nullptr, 1, "custom_state_names is NULL"},
             {"lion", states, 17, "num_custom_states"},
             {"lion", states, -1, "num_custom_states"},
             {"lion", states, 2, "custom_state_names[1]"},
             {"AdamW", nullptr, 0, "built-in"},
             {"li on", nullptr, 0, "letters"}};
  for (const Bad& b : bad) {
    sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
    eo.custom_optimizer = b.name;
    eo.custom_state_names = b.states;
    eo.num_custom_states = b.count;
    sk_engine* e = nullptr;
    EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_engine_create(spec, g, &eo, &e));
    EXPECT_ERROR_MENTIONS(b.mentions);
    EXPECT_EQ(e, nullptr);
  }
  // The 0.5.0 struct (ending at cuda_stream) still creates a built-in engine.
  sk_engine_options old = SK_ENGINE_OPTIONS_INIT;
  old.struct_size = 48;
  sk_engine* e = nullptr;
  ASSERT_OK(sk_engine_create(spec, g, &old, &e));
  EXPECT_EQ(Step(e, 0.5f), SK_STATUS_OK) << LastError();
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  sk_process_group_destroy(g);
}

// f64, i32 and i64 buffers and MIN through the ABI, and their bad inputs.
sk_status_t WideCollectivesRank(int32_t rank, sk_process_group* g, void*) {
  double d = 0.5 + rank;
  sk_status_t s = sk_process_group_all_reduce(g, &d, 1, SK_DTYPE_F64, SK_REDUCE_SUM);
  if (s != SK_STATUS_OK) return s;
  if (d != 2.0) return SK_STATUS_INTERNAL;
  int64_t l[2] = {(int64_t{1} << 40) + rank, -rank};
  if ((s = sk_process_group_all_reduce(g, l, 2, SK_DTYPE_I64, SK_REDUCE_MIN)) != SK_STATUS_OK) return s;
  if (l[0] != int64_t{1} << 40 || l[1] != -1) return SK_STATUS_INTERNAL;
  int32_t i = 3 * rank;
  if ((s = sk_process_group_all_reduce(g, &i, 1, SK_DTYPE_I32, SK_REDUCE_MAX)) != SK_STATUS_OK) return s;
  if (i != 3) return SK_STATUS_INTERNAL;
  if (sk_process_group_all_reduce(g, &i, 1, SK_DTYPE_I32, SK_REDUCE_MEAN) != SK_STATUS_INVALID_ARGUMENT)
    return SK_STATUS_INTERNAL;
  if (std::string(sk_last_error_message()).find("MEAN") == std::string::npos) return SK_STATUS_INTERNAL;
  if (sk_process_group_all_reduce(g, &i, 1, static_cast<sk_dtype_t>(7), SK_REDUCE_SUM) != SK_STATUS_INVALID_ARGUMENT)
    return SK_STATUS_INTERNAL;
  if (sk_process_group_all_reduce(g, &i, 1, SK_DTYPE_I32, static_cast<sk_reduce_op_t>(5)) !=
      SK_STATUS_INVALID_ARGUMENT)
    return SK_STATUS_INTERNAL;
  if (i != 3) return SK_STATUS_INTERNAL;  // refused calls changed nothing
  int64_t b = rank == 1 ? -42 : 0;
  if ((s = sk_process_group_broadcast(g, &b, 1, SK_DTYPE_I64, 1)) != SK_STATUS_OK) return s;
  return b == -42 ? SK_STATUS_OK : SK_STATUS_INTERNAL;
}

TEST(CapiFramework, F64AndIntegerCollectivesWithMin) {
  ASSERT_OK(sk_run_local_ranks(2, nullptr, WideCollectivesRank, nullptr));
}

// skip_nonfinite_steps through the ABI: at a learning rate of FLT_MAX a
// step goes non-finite; with the field set it returns OK with
// metrics.skipped and is counted, without it the step is ABORTED; 2 is
// refused naming the field.
TEST(CapiFramework, SkipNonfiniteStepsReportsTheSkippedStep) {
  for (int32_t skip : {0, 1}) {
    sk_trainer_options o = sk_capi_test::TinyTrainer();
    o.skip_nonfinite_steps = skip;
    sk_local_session* session = nullptr;
    ASSERT_OK(sk_local_session_create(&o, 2, nullptr, &session));
    ASSERT_OK(sk_local_session_set_lr(session, 3.4e38f));
    bool nonfinite = false;
    for (int i = 0; i < 4 && !nonfinite; ++i) {
      sk_step_metrics m = SK_STEP_METRICS_INIT;
      const sk_status_t st = sk_local_session_step(session, &m);
      if (skip) {
        ASSERT_EQ(st, SK_STATUS_OK) << LastError();
        nonfinite = m.skipped != 0;
        if (nonfinite) {
          EXPECT_EQ(m.step, i + 1);
        }
      } else if (st != SK_STATUS_OK) {
        EXPECT_EQ(st, SK_STATUS_ABORTED) << LastError();
        EXPECT_ERROR_MENTIONS("skipped on every rank");
        nonfinite = true;
      } else {
        EXPECT_EQ(m.skipped, 0);
      }
    }
    EXPECT_TRUE(nonfinite) << "skip " << skip << ": no step at lr FLT_MAX was reported non-finite";
    sk_local_session_destroy(session);
  }
  sk_trainer_options o = sk_capi_test::TinyTrainer();
  o.skip_nonfinite_steps = 2;
  sk_local_session* session = nullptr;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_local_session_create(&o, 1, nullptr, &session));
  EXPECT_ERROR_MENTIONS("skip_nonfinite_steps");
  EXPECT_EQ(session, nullptr);
}

}  // namespace
