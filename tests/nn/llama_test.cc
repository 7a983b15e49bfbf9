#include "runtime/nn/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/configs.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/nn/gpt_test_model.h"
#include "tests/nn/gradient_check.h"

namespace sk {
namespace {

// 2 layers, d_model 16, 4 query heads of 4 sharing 2 key/value heads, a
// SwiGLU of 24, vocabulary 32, sequences of up to 8.
LlamaConfig TinyLlama() {
  LlamaConfig c;
  c.name = "llama-test";
  c.vocab_size = 32;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 16;
  c.d_ff = 24;
  return c;
}

// Qwen2's variant: q/k/v biases, one key/value head for all four query heads.
LlamaConfig TinyQwen2() {
  LlamaConfig c = TinyLlama();
  c.name = "qwen2-test";
  c.n_kv_head = 1;
  c.qkv_bias = true;
  c.rope_theta = 1e6f;
  c.rms_norm_eps = 1e-6f;
  return c;
}

std::unique_ptr<LlamaModel> MakeModel(const LlamaConfig& c, ModelOptions o = {}) {
  auto m = LlamaModel::Create(c, o);
  CHECK(m.ok()) << m.status();
  return std::move(m).value();
}

TEST(Llama, UnitsCarryHuggingFaceNamesAndGroupedShapes) {
  auto m = MakeModel(TinyLlama());
  const auto& u = m->units();
  ASSERT_EQ(u.size(), 4u);
  EXPECT_EQ(u[0].name, "embed");
  EXPECT_EQ(u[0].params[0].name, "embed_tokens.w");
  EXPECT_EQ(u[1].name, "layers.0");
  EXPECT_EQ(u[3].name, "head");
  std::vector<std::string> names;
  for (const ParamSpec& p : u[1].params) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "input_layernorm.g", "self_attn.q_proj.w", "self_attn.k_proj.w",
                       "self_attn.v_proj.w", "self_attn.o_proj.w", "post_attention_layernorm.g",
                       "mlp.gate_proj.w", "mlp.up_proj.w", "mlp.down_proj.w"}));
  EXPECT_EQ(u[1].params[1].shape, Shape({16, 16}));  // q: 4 heads of 4
  EXPECT_EQ(u[1].params[2].shape, Shape({16, 8}));   // k: 2 heads of 4
  EXPECT_EQ(u[1].params[8].shape, Shape({24, 16}));
  EXPECT_EQ(u[3].params[0].name, "norm.g");
  EXPECT_EQ(u[3].params[1].name, "lm_head.w");
  const int64_t block = 2 * 16 + 16 * 16 + 2 * 16 * 8 + 16 * 16 + 3 * 16 * 24;
  EXPECT_EQ(m->num_parameters(), 32 * 16 + 2 * block + 16 + 16 * 32);
  // Qwen2: biases after each of q, k, v.
  auto q = MakeModel(TinyQwen2());
  EXPECT_EQ(q->units()[1].params[2].name, "self_attn.q_proj.b");
  EXPECT_EQ(q->units()[1].params[4].shape, Shape({4}));  // k_proj.b: one kv head of 4
  EXPECT_EQ(q->num_parameters(),
            32 * 16 + 2 * (2 * 16 + 16 * 16 + 16 + 2 * (16 * 4 + 4) + 16 * 16 + 3 * 16 * 24) +
                16 + 16 * 32);
}

// The published sizes: Llama 3 8B has 8,030,261,248 parameters with its
// untied head (Meta's model card: 8.03 B), 70B 70,553,706,496; Qwen2-0.5B
// (494,032,768) and Llama 3.2 1B (1,235,814,400) tie their heads to the
// token embedding, which counts once.
TEST(Llama, NamedConfigsCountThePublishedParameters) {
  const std::pair<const char*, int64_t> published[] = {{"llama3-8b", 8030261248},
                                                       {"llama3-70b", 70553706496},
                                                       {"qwen2-0.5b", 494032768},
                                                       {"llama3.2-1b", 1235814400}};
  for (const auto& [name, count] : published) {
    auto m = CreateModel(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_EQ((*m)->num_parameters(), count) << name;
  }
  for (const char* name : {"qwen2-0.5b", "llama3.2-1b"}) {
    auto c = FindModelConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(c->llama.tie_word_embeddings) << name;
  }
  for (const char* name : {"llama-tiny", "qwen2-tiny", "llama-10m", "llama3-8b", "llama3-70b"}) {
    auto c = FindModelConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(c->family, ModelFamily::kLlama) << name;
    EXPECT_FALSE(c->llama.tie_word_embeddings) << name;
    EXPECT_TRUE(CreateModel(*c).ok()) << name;
  }
}

// Rotary settings as the published config.json files have them: Llama 3.2
// 1B scales RoPE (rope_type llama3, factor 32, low/high frequency factors 1
// and 4, pre-training context 8192) out to 131072 positions, planned at its
// training length; Llama 3 8B and 70B (not 3.1) do not scale, 8192 positions.
TEST(Llama, NamedConfigsCarryThePublishedRopeSettings) {
  auto small = FindModelConfig("llama3.2-1b");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->llama.rope_theta, 500000.0f);
  EXPECT_EQ(small->llama.rope_scaling, (RopeScaling{RopeScalingType::kLlama3, 32.0f, 1.0f, 4.0f, 8192}));
  EXPECT_EQ(small->llama.max_seq_len, 131072);
  EXPECT_EQ(small->seq_len, 4096);
  for (const char* name : {"llama3-8b", "llama3-70b"}) {
    auto c = FindModelConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(c->llama.rope_scaling.type, RopeScalingType::kNone) << name;
    EXPECT_EQ(c->llama.max_seq_len, 8192) << name;
  }
}

// A scaling the RoPE op cannot compute is refused when the model is built,
// naming the field.
TEST(Llama, BadRopeScalingIsRefusedAtCreation) {
  auto c = FindModelConfig("llama-tiny");
  ASSERT_TRUE(c.ok());
  LlamaConfig l = c->llama;
  l.rope_scaling = RopeScaling{RopeScalingType::kLlama3, 8.0f, 1.0f, 1.0f, 8192};
  auto m = LlamaModel::Create(l);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("high_freq_factor"), std::string::npos) << m.status();
  l.rope_scaling = RopeScaling{RopeScalingType::kLinear, -2.0f};
  EXPECT_EQ(LlamaModel::Create(l).status().code(), StatusCode::kInvalidArgument);
}

// A tied head has no matrix of its own: it reads embed.embed_tokens.w
// [vocab, d], counted once.
TEST(Llama, TiedHeadUsesTheEmbeddingAndCountsItOnce) {
  LlamaConfig c = TinyLlama();
  c.tie_word_embeddings = true;
  auto tied = MakeModel(c);
  auto untied = MakeModel(TinyLlama());
  const UnitSpec& head = tied->units().back();
  ASSERT_EQ(head.params.size(), 1u);
  EXPECT_EQ(head.params[0].name, "norm.g");
  ASSERT_EQ(head.tied.size(), 1u);
  EXPECT_EQ(head.tied[0].name, "lm_head.w");
  EXPECT_EQ(head.tied[0].owner, "embed.embed_tokens.w");
  EXPECT_EQ(head.tied[0].shape, Shape({32, 16}));
  EXPECT_EQ(tied->num_parameters() + 16 * 32, untied->num_parameters());
  EXPECT_TRUE(ResolveTiedParams(tied->units()).ok());
}

// The tied model is the untied one with lm_head.w = embed_tokens.w^T: the
// same loss, the same gradients everywhere else, and as the embedding's
// gradient the sum of both uses', d(embed) + d(head)^T.
TEST(Llama, TiedGradientIsTheSumOfTheEmbeddingAndHeadGradients) {
  for (LlamaConfig c : {TinyLlama(), TinyQwen2()}) {
    SCOPED_TRACE(c.name);
    const LlamaConfig untied_config = c;
    c.tie_word_embeddings = true;
    auto tied = MakeModel(c);
    auto untied = MakeModel(untied_config);
    auto pt = MakeParams(*tied, 5);
    auto pu = MakeParams(*untied, 5);
    const int head = static_cast<int>(untied->units().size()) - 1;
    // Same seed and names: every shared parameter starts equal; the head's
    // matrix [16, 32] is set to the transposed embedding [32, 16].
    const Tensor& embed = pt->param(0, 0);
    const Tensor& lm = pu->param(head, 1);
    for (int64_t v = 0; v < 32; ++v) {
      for (int64_t d = 0; d < 16; ++d) {
        lm.data_as<float>()[d * 32 + v] = embed.data_as<float>()[v * 16 + d];
      }
    }
    const TokenBatch batch = RandomBatch(3, 8, 32, 11);
    auto lt = tied->ForwardBackward(batch, *pt, HostAllocator::Default());
    auto lu = untied->ForwardBackward(batch, *pu, HostAllocator::Default());
    ASSERT_TRUE(lt.ok() && lu.ok()) << lt.status() << lu.status();
    EXPECT_NEAR(*lt, *lu, 1e-6 * std::fabs(*lu));
    const float* gt = pt->grad(0, 0).data_as<float>();
    const float* ge = pu->grad(0, 0).data_as<float>();
    const float* gh = pu->grad(head, 1).data_as<float>();
    double max_head = 0;
    for (int64_t v = 0; v < 32; ++v) {
      for (int64_t d = 0; d < 16; ++d) {
        const double want = ge[v * 16 + d] + gh[d * 32 + v];
        max_head = std::max(max_head, std::fabs(static_cast<double>(gh[d * 32 + v])));
        EXPECT_NEAR(gt[v * 16 + d], want, 1e-6 + 1e-5 * std::fabs(want))
            << "embed_tokens.w[" << v << ", " << d << "]";
      }
    }
    EXPECT_GT(max_head, 1e-3);  // the head's share is not negligible
    for (size_t u = 1; u < tied->units().size(); ++u) {
      for (size_t i = 0; i < tied->units()[u].params.size(); ++i) {
        const Tensor& a = pt->grad(static_cast<int>(u), static_cast<int>(i));
        const Tensor& b = pu->grad(static_cast<int>(u), static_cast<int>(i));
        for (int64_t k = 0; k < a.numel(); ++k) {
          ASSERT_NEAR(a.data_as<float>()[k], b.data_as<float>()[k],
                      1e-6 + 1e-5 * std::fabs(b.data_as<float>()[k]))
              << FullParamName(tied->units()[u], tied->units()[u].params[i]) << "[" << k << "]";
        }
      }
    }
  }
}

TEST(Llama, HooksRunForwardInUnitOrderAndBackwardInReverse) {
  auto m = MakeModel(TinyLlama());
  auto p = MakeParams(*m, 1);
  auto loss = m->ForwardBackward(RandomBatch(2, 8, 32, 3), *p, HostAllocator::Default());
  ASSERT_TRUE(loss.ok()) << loss.status();
  std::vector<std::string> want = {"PreForward(0)",  "PostForward(0)",  "PreForward(1)",
                                   "PostForward(1)", "PreForward(2)",   "PostForward(2)",
                                   "PreForward(3)",  "PostForward(3)",  "PreBackward(3)",
                                   "PostBackward(3)", "PreBackward(2)", "PostBackward(2)",
                                   "PreBackward(1)", "PostBackward(1)", "PreBackward(0)",
                                   "PostBackward(0)"};
  EXPECT_EQ(p->call_log(), want);
}

TEST(Llama, InitialLossIsNearLogVocab) {
  auto m = MakeModel(TinyLlama());
  auto p = MakeParams(*m, 1);
  auto loss = m->Forward(RandomBatch(4, 8, 32, 3), *p, HostAllocator::Default());
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, std::log(32.0f), 0.1f);
}

// Every parameter tensor's analytic gradient (RMSNorm, RoPE, grouped-query
// linear-memory attention, SwiGLU, biases, and a tied head's share of the
// embedding's gradient) at a few elements against central differences of
// the loss.
TEST(Llama, ParameterGradientsMatchFiniteDifferencesOfTheLoss) {
  LlamaConfig tied = TinyLlama();
  tied.name = "llama-test-tied";
  tied.tie_word_embeddings = true;
  for (const LlamaConfig& c : {TinyLlama(), TinyQwen2(), tied}) {
    auto m = MakeModel(c);
    auto p = MakeParams(*m, 5);
    SpreadParams(*p);
    TokenBatch batch = RandomBatch(2, 6, 32, 9);
    ASSERT_TRUE(m->ForwardBackward(batch, *p, HostAllocator::Default()).ok());
    const int checked = ExpectGradientsMatchCentralDifferences(*m, *p, batch, c.name);
    EXPECT_EQ(checked, static_cast<int>(3 * p->all_params().size()));
  }
}


TEST(Llama, TinyModelMemorisesAFixedBatch) {
  auto m = MakeModel(TinyLlama());
  auto p = MakeParams(*m, 11);
  TokenBatch batch = RandomBatch(4, 8, 32, 12);
  std::vector<float> losses;
  TrainWithAdam(*m, *p, batch, 150, 1e-2f, &losses);
  EXPECT_GT(losses.front(), 3.0f);
  EXPECT_LT(losses.back(), 0.05f) << "first " << losses.front();
}

TEST(Llama, ActivationCheckpointingGivesIdenticalLossAndGradients) {
  ExpectWholeBlockCheckpointingIsExact([](const ModelOptions& o) -> std::unique_ptr<Model> { return MakeModel(TinyQwen2(), o); });
}

TEST(Llama, SelectiveCheckpointingGivesIdenticalLossAndGradients) {
  ExpectSelectiveCheckpointingIsExact([](const ModelOptions& o) -> std::unique_ptr<Model> { return MakeModel(TinyQwen2(), o); });
}

// torchtitan's "every other matmul" (checkpointing = selective_matmuls): k, o's
// output (x2) and up recomputed besides the cheap ops, in f32 and bf16, with
// and without q/k/v biases: the loss and every gradient bit as without
// checkpointing. It recomputes more than selective (three GEMMs) and less
// than the whole block, and keeps less than selective, more than full.
TEST(Llama, SelectiveMatmulCheckpointingGivesIdenticalLossAndGradients) {
  TokenBatch batch = RandomBatch(2, 8, 32, 14);
  for (const LlamaConfig& c : {TinyLlama(), TinyQwen2()}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(c.name + " " + std::string(DTypeName(dt)));
      ModelOptions off, mm, sel, full;
      off.compute_dtype = mm.compute_dtype = sel.compute_dtype = full.compute_dtype = dt;
      mm.checkpointing = ActivationCheckpointing::kSelectiveMatmuls;
      sel.checkpointing = ActivationCheckpointing::kSelective;
      full.checkpointing = ActivationCheckpointing::kFull;
      auto plain = MakeModel(c, off), every_other = MakeModel(c, mm);
      auto pa = MakeParams(*plain, 3, dt), pb = MakeParams(*every_other, 3, dt);
      auto la = plain->ForwardBackward(batch, *pa, HostAllocator::Default());
      auto lb = every_other->ForwardBackward(batch, *pb, HostAllocator::Default());
      ASSERT_TRUE(la.ok() && lb.ok()) << lb.status();
      EXPECT_EQ(*la, *lb);
      EXPECT_EQ(Flatten(pa->all_grads()), Flatten(pb->all_grads()));

      auto selective = MakeModel(c, sel), whole = MakeModel(c, full);
      auto recomputed = [](const Model& m) {
        const StepFlops f = m.Flops(2, 8, 0);
        return f.hardware_flops - f.model_flops;
      };
      EXPECT_GT(recomputed(*every_other), recomputed(*selective));
      EXPECT_LT(recomputed(*every_other), recomputed(*whole));
      const auto peak = [](const Model& m) { return m.PeakActivationBytes(2, 8, 0, DeviceKind::kCpu); };
      EXPECT_LT(peak(*every_other), peak(*selective));
      EXPECT_GT(peak(*every_other), peak(*whole));
    }
  }
}

// selective_matmuls keeps the attention (it recomputes GEMMs, not the attention):
// recompute_attention with it contradicts, as does whole-block; a model
// without it (GPT) refuses it by name.
TEST(Llama, SelectiveMatmulCheckpointingRefusesContradictions) {
  ModelOptions o;
  o.checkpointing = ActivationCheckpointing::kSelectiveMatmuls;
  o.recompute_attention = true;
  auto attention = LlamaModel::Create(TinyLlama(), o);
  ASSERT_FALSE(attention.ok());
  EXPECT_EQ(attention.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(attention.status().message().find("recompute_attention"), std::string::npos)
      << attention.status();
  o.recompute_attention = false;
  o.activation_checkpointing = true;
  auto both = LlamaModel::Create(TinyLlama(), o);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("selective_matmuls"), std::string::npos) << both.status();
  o.activation_checkpointing = false;
  auto gpt = CreateModel("gpt-tiny", o);
  ASSERT_FALSE(gpt.ok());
  EXPECT_EQ(gpt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(gpt.status().message().find("selective_matmuls"), std::string::npos) << gpt.status();
  EXPECT_TRUE(LlamaModel::Create(TinyLlama(), o).ok());
}

// bf16 compute against f32, with GPT's documented tolerances: 2% on the
// loss, 5% relative L2 on the gradient.
TEST(Llama, Bf16ComputeStaysWithinToleranceOfF32) {
  TokenBatch batch = RandomBatch(4, 8, 32, 15);
  auto f32 = MakeModel(TinyLlama());
  auto bf16 = MakeModel(TinyLlama(), ModelOptions{DType::kBF16, false});
  auto pa = MakeParams(*f32, 4), pb = MakeParams(*bf16, 4, DType::kBF16);
  auto la = f32->ForwardBackward(batch, *pa, HostAllocator::Default());
  auto lb = bf16->ForwardBackward(batch, *pb, HostAllocator::Default());
  ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
  EXPECT_NEAR(*lb, *la, 0.02f * *la);
  EXPECT_NE(*lb, *la);
  std::vector<float> ga = Flatten(pa->all_grads()), gb = Flatten(pb->all_grads());
  double num = 0, den = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    num += (ga[i] - gb[i]) * (ga[i] - gb[i]);
    den += ga[i] * ga[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
}

// Causal: the loss at position 3 ignores later inputs, not earlier ones.
TEST(Llama, LossAtAPositionIgnoresLaterInputs) {
  auto m = MakeModel(TinyLlama());
  auto p = MakeParams(*m, 2);
  TokenBatch b = RandomBatch(1, 8, 32, 18);
  for (int t = 0; t < 8; ++t) b.targets[t] = t == 3 ? b.targets[t] : kIgnoreTarget;
  float base = *m->Forward(b, *p, HostAllocator::Default());
  TokenBatch later = b;
  later.inputs[5] = (later.inputs[5] + 1) % 32;
  later.inputs[7] = (later.inputs[7] + 3) % 32;
  EXPECT_EQ(*m->Forward(later, *p, HostAllocator::Default()), base);
  TokenBatch earlier = b;
  earlier.inputs[1] = (earlier.inputs[1] + 1) % 32;
  EXPECT_NE(*m->Forward(earlier, *p, HostAllocator::Default()), base);
}

// Without position embeddings only RoPE tells positions apart: swapping two
// earlier tokens changes the prediction at position 3 (a bag of tokens
// would not), and so does rope_theta.
TEST(Llama, RotaryEmbeddingsMakeTheModelSeeOrder) {
  auto m = MakeModel(TinyLlama());
  auto p = MakeParams(*m, 2);
  for (const Tensor& t : p->all_params()) {
    float* d = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] += 0.2f * std::sin(0.5f + 0.73f * i);
  }
  TokenBatch b = RandomBatch(1, 8, 32, 19);
  b.inputs[0] = 1, b.inputs[1] = 2;
  for (int t = 0; t < 8; ++t) b.targets[t] = t == 3 ? b.targets[t] : kIgnoreTarget;
  const float base = *m->Forward(b, *p, HostAllocator::Default());
  TokenBatch swapped = b;
  std::swap(swapped.inputs[0], swapped.inputs[1]);
  EXPECT_NE(*m->Forward(swapped, *p, HostAllocator::Default()), base);
  LlamaConfig other = TinyLlama();
  other.rope_theta = 100.0f;
  EXPECT_NE(*MakeModel(other)->Forward(b, *p, HostAllocator::Default()), base);
}

TEST(Llama, BadConfigsAreInvalidArgumentNamingTheField) {
  auto expect_bad = [](LlamaConfig c, const std::string& field) {
    auto m = LlamaModel::Create(c);
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(m.status().message().find(field), std::string::npos) << m.status();
  };
  LlamaConfig c = TinyLlama();
  c.n_kv_head = 3;
  expect_bad(c, "n_kv_head");
  c = TinyLlama();
  c.n_kv_head = -1;
  expect_bad(c, "n_kv_head");
  c = TinyLlama();
  c.d_model = 12;  // head_dim 3: RoPE rotates pairs
  expect_bad(c, "head_dim");
  c = TinyLlama();
  c.d_ff = 0;
  expect_bad(c, "d_ff");
  c = TinyLlama();
  c.rope_theta = 0.0f;
  expect_bad(c, "rope_theta");
  c = TinyLlama();
  c.rms_norm_eps = -1.0f;
  expect_bad(c, "rms_norm_eps");
  EXPECT_EQ(LlamaModel::Create(TinyLlama(), ModelOptions{DType::kInvalid, false}).status().code(),
            StatusCode::kInvalidArgument);
  auto m = MakeModel(TinyLlama());
  auto p = MakeParams(*m, 1);
  TokenBatch b = RandomBatch(1, 9, 32, 1);  // longer than max_seq_len 8
  EXPECT_EQ(m->Forward(b, *p, HostAllocator::Default()).status().code(),
            StatusCode::kInvalidArgument);
}

// 6 Psi per token for the dense layers (q, k, v, o, gate, up, down and the
// head) plus 12 L T (heads x head_dim) for attention.
TEST(Llama, ModelFlopsAreSixPsiPerTokenPlusAttention) {
  auto m = MakeModel(TinyLlama());
  const double dense = static_cast<double>(m->num_parameters() - 32 * 16 - 2 * 2 * 16 - 16);
  const double tokens = 2.0 * 8.0;
  const double want = 6.0 * dense * tokens + 12.0 * 2 * 8 * 16 * tokens;
  EXPECT_NEAR(m->Flops(2, 8, 0).model_flops, want, 1e-9 * want);
}

}  // namespace
}  // namespace sk
