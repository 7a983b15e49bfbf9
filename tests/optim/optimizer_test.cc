#include "runtime/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/ops/ops.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/optim/param_groups.h"

namespace sk {
namespace {

std::vector<float> RandomVector(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// torch.optim.Adam/AdamW written out in double from the documentation.
void ReferenceAdam(std::vector<double>& p, const std::vector<std::vector<float>>& grads,
                   double lr, double b1, double b2, double eps, double wd, bool decoupled) {
  std::vector<double> m(p.size(), 0), v(p.size(), 0);
  for (size_t t = 1; t <= grads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grads[t - 1][i];
      if (decoupled) {
        p[i] *= 1 - lr * wd;
      } else {
        g += wd * p[i];
      }
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double mhat = m[i] / (1 - std::pow(b1, t));
      double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
}

void ReferenceSgd(std::vector<double>& p, const std::vector<std::vector<float>>& grads, double lr,
                  double mom, double damp, double wd, bool nesterov) {
  std::vector<double> buf(p.size(), 0);
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grads[t][i] + wd * p[i];
      if (mom != 0) {
        buf[i] = t == 0 ? g : mom * buf[i] + (1 - damp) * g;
        g = nesterov ? g + mom * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  }
}

// An f32 tensor over v[offset, offset + n) (caller-owned memory).
Tensor F32(const std::vector<float>& v, int offset, int n) {
  return *Tensor::Wrap(const_cast<float*>(v.data()) + offset, DType::kF32, Shape{n});
}

struct OptRun {
  std::vector<float> params;
};

OptRun RunOptimizer(const OptimizerOptions& o, const std::vector<float>& init,
                 const std::vector<std::vector<float>>& grads, std::vector<int> split) {
  HostAllocator alloc;
  auto opt = Optimizer::Create(o, &alloc);
  EXPECT_TRUE(opt.ok()) << opt.status();
  OptRun run{init};
  for (const auto& g : grads) {
    std::vector<ShardRef> refs;
    int offset = 0;
    for (size_t s = 0; s < split.size(); ++s) {
      refs.push_back({static_cast<int>(s), F32(run.params, offset, split[s]), F32(g, offset, split[s])});
      offset += split[s];
    }
    EXPECT_TRUE((*opt)->Step(ops::HostContext(), refs).ok());
  }
  return run;
}

constexpr int kN = 97;

void ExpectCloseToReference(const std::vector<float>& got, const std::vector<double>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "element " << i;
  }
}

TEST(OptimizerTest, AdamMatchesTorchDefinition) {
  auto init = RandomVector(kN, 1);
  std::vector<std::vector<float>> grads = {RandomVector(kN, 2), RandomVector(kN, 3), RandomVector(kN, 4)};
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.lr = 0.01f;
  o.weight_decay = 0.1f;
  OptRun r = RunOptimizer(o, init, grads, {kN});
  std::vector<double> ref(init.begin(), init.end());
  ReferenceAdam(ref, grads, 0.01, 0.9, 0.999, 1e-8, 0.1, false);
  ExpectCloseToReference(r.params, ref);
}

TEST(OptimizerTest, AdamWDecouplesWeightDecay) {
  auto init = RandomVector(kN, 5);
  std::vector<std::vector<float>> grads = {RandomVector(kN, 6), RandomVector(kN, 7)};
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.lr = 0.05f;
  o.weight_decay = 0.2f;
  OptRun r = RunOptimizer(o, init, grads, {kN});
  std::vector<double> ref(init.begin(), init.end());
  ReferenceAdam(ref, grads, 0.05, 0.9, 0.999, 1e-8, 0.2, true);
  ExpectCloseToReference(r.params, ref);
}

TEST(OptimizerTest, SgdWithMomentumDampeningAndNesterovMatchesTorchDefinition) {
  auto init = RandomVector(kN, 8);
  std::vector<std::vector<float>> grads = {RandomVector(kN, 9), RandomVector(kN, 10), RandomVector(kN, 11)};
  for (bool nesterov : {false, true}) {
    OptimizerOptions o;
    o.kind = OptimizerKind::kSgd;
    o.lr = 0.1f;
    o.momentum = 0.9f;
    o.dampening = nesterov ? 0.f : 0.25f;
    o.nesterov = nesterov;
    o.weight_decay = 0.01f;
    OptRun r = RunOptimizer(o, init, grads, {kN});
    std::vector<double> ref(init.begin(), init.end());
    ReferenceSgd(ref, grads, 0.1, 0.9, o.dampening, 0.01, nesterov);
    ExpectCloseToReference(r.params, ref);
  }
}

TEST(OptimizerTest, ShardedStepIsBitIdenticalToUnshardedStep) {
  auto init = RandomVector(kN, 12);
  std::vector<std::vector<float>> grads = {RandomVector(kN, 13), RandomVector(kN, 14)};
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    OptimizerOptions o;
    o.kind = kind;
    o.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.f;
    o.weight_decay = 0.01f;
    OptRun whole = RunOptimizer(o, init, grads, {kN});
    OptRun sharded = RunOptimizer(o, init, grads, {30, 30, 37});
    EXPECT_EQ(0, std::memcmp(whole.params.data(), sharded.params.data(), kN * sizeof(float)));
  }
}

TEST(OptimizerTest, InvalidOptionsNameTheField) {
  HostAllocator alloc;
  OptimizerOptions o;
  o.lr = -1;
  EXPECT_NE(Optimizer::Create(o, &alloc).status().message().find("lr"), std::string::npos);
  o = {};
  o.beta2 = 1.0f;
  EXPECT_NE(Optimizer::Create(o, &alloc).status().message().find("beta2"), std::string::npos);
  o = {};
  o.kind = static_cast<OptimizerKind>(42);
  EXPECT_EQ(Optimizer::Create(o, &alloc).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.kind = OptimizerKind::kSgd;
  o.nesterov = true;
  EXPECT_EQ(Optimizer::Create(o, &alloc).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Optimizer::Create(OptimizerOptions{}, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

// The default is a resolved value (the C ABI turns its 0 into it when it
// translates options); the runtime has no "default" kind to resolve again.
TEST(OptimizerTest, DefaultKindIsAdamW) {
  HostAllocator alloc;
  OptimizerOptions o;
  EXPECT_EQ(o.kind, OptimizerKind::kAdamW);
  auto opt = Optimizer::Create(o, &alloc);
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ((*opt)->options().kind, OptimizerKind::kAdamW);
  o.kind = static_cast<OptimizerKind>(0);
  EXPECT_EQ(Optimizer::Create(o, &alloc).status().code(), StatusCode::kInvalidArgument);
}

TEST(OptimizerTest, BadStepLeavesParametersAndStateUntouched) {
  HostAllocator alloc;
  auto opt = *Optimizer::Create(OptimizerOptions{}, &alloc);
  std::vector<float> p(4, 1.f), g(4, 1.f);
  ASSERT_TRUE(opt->Step(ops::HostContext(), {{0, F32(p, 0, 4), F32(g, 0, 4)}}).ok());
  std::vector<float> after = p;
  // Second shard has a size mismatch for slot 0: nothing must change.
  std::vector<float> p1(3, 1.f), g1(3, 1.f);
  Status s = opt->Step(ops::HostContext(), {{1, F32(p1, 0, 3), F32(g1, 0, 3)}, {0, F32(p, 0, 3), F32(g, 0, 3)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p, after);
  EXPECT_EQ(p1, std::vector<float>(3, 1.f));
  EXPECT_EQ(opt->step_count(0), 1);
  EXPECT_EQ(opt->step_count(1), 0);
  EXPECT_EQ(opt->Step(ops::HostContext(), {{2, Tensor(), F32(g, 0, 4)}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->Step(ops::HostContext(), {{2, F32(p, 0, 4), F32(g, 0, 3)}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->Step(ops::HostContext(), {{0, F32(p, 0, 4), F32(g, 0, 4)}, {0, F32(p, 0, 4), F32(g, 0, 4)}}).code(),
            StatusCode::kInvalidArgument);
  std::vector<uint16_t> half(4, 0);
  Tensor bf16 = *Tensor::Wrap(half.data(), DType::kBF16, Shape{4});
  EXPECT_EQ(opt->Step(ops::HostContext(), {{2, bf16, F32(g, 0, 4)}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p, after);
}

// The step's tensors must live where its op context runs (the fused update
// ops execute there); a context without a device or allocator is refused.
TEST(OptimizerTest, StepRefusesTensorsOffTheContextsDeviceAndAnEmptyContext) {
  HostAllocator alloc;
  auto opt = *Optimizer::Create(OptimizerOptions{}, &alloc);
  std::vector<float> p(4, 1.f), g(4, 1.f);
  Tensor on_gpu = *Tensor::Wrap(g.data(), DType::kF32, Shape{4}, DeviceId::Cuda(0));
  Status s = opt->Step(ops::HostContext(), {{0, F32(p, 0, 4), on_gpu}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("device"), std::string::npos) << s;
  EXPECT_EQ(opt->Step(ops::OpContext{}, {{0, F32(p, 0, 4), F32(g, 0, 4)}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(p, std::vector<float>(4, 1.f));
  EXPECT_EQ(opt->step_count(0), 0);
}

TEST(OptimizerTest, StateRoundTripsThroughLoadState) {
  HostAllocator alloc;
  OptimizerOptions o;
  auto a = *Optimizer::Create(o, &alloc);
  auto b = *Optimizer::Create(o, &alloc);
  auto init = RandomVector(kN, 20);
  auto g1 = RandomVector(kN, 21), g2 = RandomVector(kN, 22);
  std::vector<float> pa = init;
  ASSERT_TRUE(a->Step(ops::HostContext(), {{0, F32(pa, 0, kN), F32(g1, 0, kN)}}).ok());
  std::vector<Tensor> state;
  for (const std::string& name : a->StateNames()) state.push_back(*a->State(0, name));
  ASSERT_TRUE(b->LoadState(ops::HostContext(), 0, kN, a->step_count(0), state).ok());
  std::vector<float> pb = pa;
  ASSERT_TRUE(a->Step(ops::HostContext(), {{0, F32(pa, 0, kN), F32(g2, 0, kN)}}).ok());
  ASSERT_TRUE(b->Step(ops::HostContext(), {{0, F32(pb, 0, kN), F32(g2, 0, kN)}}).ok());
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(a->StateBytes(), 2u * kN * sizeof(float));
  EXPECT_EQ(b->LoadState(ops::HostContext(), 0, kN, 1, {state[0]}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->State(9, "exp_avg").status().code(), StatusCode::kNotFound);
}

TEST(ClipGradNormTest, PartialsFromShardsCombineToTheUnshardedNorm) {
  auto g = RandomVector(kN, 30);
  double full_sq = 0, full_max = 0;
  for (float x : g) {
    full_sq += double(x) * x;
    full_max = std::max(full_max, std::fabs(double(x)));
  }
  double l2 = *LocalGradNormPartial(ops::HostContext(), {F32(g, 0, 40)}, NormType::kL2) +
              *LocalGradNormPartial(ops::HostContext(), {F32(g, 40, kN - 40)}, NormType::kL2);
  double inf = std::max(*LocalGradNormPartial(ops::HostContext(), {F32(g, 0, 40)}, NormType::kInf),
                        *LocalGradNormPartial(ops::HostContext(), {F32(g, 40, kN - 40)}, NormType::kInf));
  EXPECT_NEAR(FinishGradNorm(l2, NormType::kL2), std::sqrt(full_sq), 1e-9);
  EXPECT_EQ(FinishGradNorm(inf, NormType::kInf), full_max);
}

TEST(ClipGradNormTest, ScalesOnlyWhenAboveMaxNorm) {
  std::vector<float> g = {3.f, 4.f};
  EXPECT_EQ(*ClipGradientsToNorm(ops::HostContext(), {F32(g, 0, 2)}, 5.0, 10.0), 1.f);
  EXPECT_EQ(g[0], 3.f);
  float c = *ClipGradientsToNorm(ops::HostContext(), {F32(g, 0, 2)}, 5.0, 1.0);
  EXPECT_NEAR(c, 0.2f, 1e-6);
  EXPECT_NEAR(std::hypot(g[0], g[1]), 1.0, 1e-5);
  EXPECT_EQ(ClipGradientsToNorm(ops::HostContext(), {Tensor()}, 5.0, 1.0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalGradNormPartial(ops::HostContext(), {Tensor()}, NormType::kL2).status().code(),
            StatusCode::kInvalidArgument);
}

// The single-process use (the reference models' training): one slot per
// parameter tensor, whatever its shape.
TEST(OptimizerTest, ShardRefsForStepsEveryParameterTensor) {
  HostAllocator alloc;
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 0.5f;
  auto opt = *Optimizer::Create(o, &alloc);
  std::vector<float> a(6, 1.f), b(2, 2.f), ga(6, 1.f), gb(2, 4.f);
  Tensor ta = *Tensor::Wrap(a.data(), DType::kF32, Shape{2, 3});
  Tensor tga = *Tensor::Wrap(ga.data(), DType::kF32, Shape{2, 3});
  auto refs = ShardRefsFor({ta, F32(b, 0, 2)}, {tga, F32(gb, 0, 2)});
  ASSERT_TRUE(refs.ok());
  ASSERT_TRUE(opt->Step(ops::HostContext(), *refs).ok());
  EXPECT_EQ(a, std::vector<float>(6, 0.5f));
  EXPECT_EQ(b, std::vector<float>(2, 0.f));
  EXPECT_EQ(opt->step_count(1), 1);
  EXPECT_EQ(ShardRefsFor({ta}, {}).status().code(), StatusCode::kInvalidArgument);
}

// Parameter groups inside one slot: a segment steps with its own weight
// decay and learning-rate multiplier, exactly as that slice would alone.
TEST(OptimizerTest, SegmentsStepLikeSeparateSlotsWithTheirOwnDecayAndRate) {
  auto init = RandomVector(kN, 20);
  std::vector<std::vector<float>> grads = {RandomVector(kN, 21), RandomVector(kN, 22)};
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.lr = 0.05f;
  o.weight_decay = 0.2f;
  HostAllocator alloc;
  auto opt = Optimizer::Create(o, &alloc);
  ASSERT_TRUE(opt.ok());
  // [10, 40): no decay, half the rate; the rest: the options'.
  ASSERT_TRUE((*opt)->SetSegments(0, {{10, 40, 0.f, 0.5f}}).ok());
  std::vector<float> p = init;
  for (const auto& g : grads) ASSERT_TRUE((*opt)->Step(ops::HostContext(), {{0, F32(p, 0, kN), F32(g, 0, kN)}}).ok());
  std::vector<double> ref(init.begin(), init.end());
  ReferenceAdam(ref, grads, 0.05, 0.9, 0.999, 1e-8, 0.2, true);
  std::vector<double> mid(init.begin() + 10, init.begin() + 40);
  std::vector<std::vector<float>> mid_grads;
  for (const auto& g : grads) mid_grads.emplace_back(g.begin() + 10, g.begin() + 40);
  ReferenceAdam(mid, mid_grads, 0.025, 0.9, 0.999, 1e-8, 0.0, true);
  for (int i = 0; i < 30; ++i) ref[10 + i] = mid[i];
  ExpectCloseToReference(p, ref);
}

TEST(OptimizerTest, BadSegmentsAreInvalidArgumentAndChangeNothing) {
  HostAllocator alloc;
  auto opt = Optimizer::Create(OptimizerOptions{}, &alloc);
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ((*opt)->SetSegments(0, {{0, 10, 0, 1}, {5, 20, 0, 1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->SetSegments(0, {{4, 4, 0, 1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->SetSegments(0, {{0, 4, -1, 1}}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*opt)->SetSegments(0, {{0, 8, 0, 1}}).ok());
  std::vector<float> p(4, 1.f), g(4, 1.f);
  Status s = (*opt)->Step(ops::HostContext(), {{0, F32(p, 0, 4), F32(g, 0, 4)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(p, std::vector<float>(4, 1.f));
}

TEST(ParamGroupsTest, GlobAndTheNoDecayRuleSelectTheFirstMatchingGroup) {
  EXPECT_TRUE(GlobMatch("block*.ln?.*", "block3.ln1.gain"));
  EXPECT_FALSE(GlobMatch("block*.ln?.*", "block3.mlp.w"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_FALSE(GlobMatch("a", "ab"));
  std::vector<ParamGroup> groups(2);
  groups[0].pattern = "head.*";
  groups[0].lr_multiplier = 2;
  groups[1].norms_biases_embeddings = true;
  groups[1].weight_decay = 0;
  EXPECT_EQ(SelectParamGroup(groups, "head", "w", 2), 0);
  EXPECT_EQ(SelectParamGroup(groups, "head", "b", 1), 0);  // the first group wins
  EXPECT_EQ(SelectParamGroup(groups, "block0", "b", 1), 1);
  EXPECT_EQ(SelectParamGroup(groups, "embed", "table", 2), 1);
  EXPECT_EQ(SelectParamGroup(groups, "block0", "wte", 2), 1);
  EXPECT_EQ(SelectParamGroup(groups, "block0", "w", 2), -1);
  EXPECT_TRUE(ValidateParamGroups(groups).ok());
  groups.push_back(ParamGroup{});
  EXPECT_EQ(ValidateParamGroups(groups).code(), StatusCode::kInvalidArgument);
}

// Issue 43: Hugging Face Trainer's rule exempts biases and norm weights
// (fewer than two dimensions) and decays embeddings and a tied head;
// norms_biases_embeddings (and its NoDecay value) still exempts embeddings.
TEST(ParamGroupsTest, HuggingFacesRuleDecaysEmbeddingsAndTheOldRuleDoesNot) {
  std::vector<ParamGroup> hf(1), old(1), old_by_rule(1);
  hf[0].no_decay = NoDecay::kBiasesAndNorms;
  old[0].norms_biases_embeddings = true;
  old_by_rule[0].no_decay = NoDecay::kNormsBiasesEmbeddings;
  struct Param {
    const char *unit, *name;
    int ndim;
    bool hf_exempt, old_exempt;
  };
  for (const Param& p : std::vector<Param>{{"embed", "wte", 2, false, true},
                                           {"embed", "embed_tokens.w", 2, false, true},
                                           {"embed", "wpe", 2, false, true},
                                           {"h.0", "attn.qkv.b", 1, true, true},
                                           {"layers.0", "input_layernorm.g", 1, true, true},
                                           {"head", "norm.g", 1, true, true},
                                           {"layers.0", "self_attn.q_proj.w", 2, false, false},
                                           {"head", "lm_head.w", 2, false, false}}) {
    EXPECT_EQ(SelectParamGroup(hf, p.unit, p.name, p.ndim) == 0, p.hf_exempt) << p.unit << "." << p.name;
    EXPECT_EQ(SelectParamGroup(old, p.unit, p.name, p.ndim) == 0, p.old_exempt) << p.unit << "." << p.name;
    EXPECT_EQ(SelectParamGroup(old_by_rule, p.unit, p.name, p.ndim) == 0, p.old_exempt) << p.unit << "." << p.name;
  }
  EXPECT_TRUE(ValidateParamGroups(hf).ok());
  EXPECT_TRUE(ValidateParamGroups(old_by_rule).ok());
  hf[0].norms_biases_embeddings = true;  // contradicts the rule
  EXPECT_EQ(ValidateParamGroups(hf).code(), StatusCode::kInvalidArgument);
  hf[0].norms_biases_embeddings = false;
  hf[0].no_decay = static_cast<NoDecay>(5);
  Status bad = ValidateParamGroups(hf);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("param_groups[0].no_decay"), std::string::npos) << bad;
}

TEST(LrScheduleTest, WarmupThenCosineOrLinearDecayToTheFloor) {
  LrSchedule s;
  s.kind = LrScheduleKind::kCosine;
  s.warmup_steps = 4;
  s.decay_steps = 10;
  s.min_lr = 0.1f;
  ASSERT_TRUE(ValidateLrSchedule(s, 1.f).ok());
  EXPECT_FLOAT_EQ(LrAt(s, 1.f, 0), 0.25f);
  EXPECT_FLOAT_EQ(LrAt(s, 1.f, 3), 1.f);
  EXPECT_FLOAT_EQ(LrAt(s, 1.f, 4), 1.f);
  EXPECT_NEAR(LrAt(s, 1.f, 9), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-6);
  EXPECT_FLOAT_EQ(LrAt(s, 1.f, 14), 0.1f);
  EXPECT_FLOAT_EQ(LrAt(s, 1.f, 1000), 0.1f);
  s.kind = LrScheduleKind::kLinear;
  EXPECT_NEAR(LrAt(s, 1.f, 9), 0.55, 1e-6);
  EXPECT_FLOAT_EQ(LrAt(s, 1.f, 14), 0.1f);
  s.kind = LrScheduleKind::kConstant;
  EXPECT_FLOAT_EQ(LrAt(s, 1.f, 9), 1.f);
  EXPECT_FLOAT_EQ(LrAt(s, 0.f, 9), 0.f);
}

TEST(LrScheduleTest, BadSchedulesNameTheField) {
  LrSchedule s;
  s.kind = LrScheduleKind::kCosine;
  Status st = ValidateLrSchedule(s, 1.f);
  EXPECT_NE(std::string(st.message()).find("decay_steps"), std::string::npos) << st;
  s.decay_steps = 5;
  s.min_lr = 2.f;
  st = ValidateLrSchedule(s, 1.f);
  EXPECT_NE(std::string(st.message()).find("min_lr"), std::string::npos) << st;
  s.min_lr = 0;
  s.warmup_steps = -1;
  st = ValidateLrSchedule(s, 1.f);
  EXPECT_NE(std::string(st.message()).find("warmup_steps"), std::string::npos) << st;
  s.warmup_steps = 0;
  s.kind = static_cast<LrScheduleKind>(9);
  EXPECT_EQ(ValidateLrSchedule(s, 1.f).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk
