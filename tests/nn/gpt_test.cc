#include "runtime/nn/gpt.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/nn/gpt_test_model.h"
#include "tests/nn/gradient_check.h"

namespace sk {
namespace {

std::unique_ptr<GptModel> MakeModel(const GptConfig& c, ModelOptions o = {}) {
  auto m = GptModel::Create(c, o);
  CHECK(m.ok()) << m.status();
  return std::move(m).value();
}

TEST(Gpt, UnitsAreEmbeddingBlocksAndHeadWithGpt2Shapes) {
  auto m = MakeModel(Tiny());
  const auto& u = m->units();
  ASSERT_EQ(u.size(), 4u);
  EXPECT_EQ(u[0].name, "embed");
  EXPECT_EQ(u[1].name, "h.0");
  EXPECT_EQ(u[3].name, "head");
  EXPECT_EQ(u[0].params[0].shape, Shape({32, 16}));
  EXPECT_EQ(u[1].params.size(), 12u);
  EXPECT_EQ(u[1].params[2].name, "attn.qkv.w");
  EXPECT_EQ(u[1].params[2].shape, Shape({16, 48}));
  EXPECT_EQ(u[1].params[8].shape, Shape({16, 64}));
  // 2 embeddings + per block (4 LN + qkv + proj + fc + proj) + head.
  const int64_t block = 4 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 64 + 64 + 64 * 16 + 16;
  EXPECT_EQ(m->num_parameters(), 32 * 16 + 8 * 16 + 2 * block + 2 * 16 + 16 * 32);
}

TEST(Gpt, HooksRunForwardInUnitOrderAndBackwardInReverse) {
  auto m = MakeModel(Tiny());
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

TEST(Gpt, InitialLossIsNearLogVocab) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 1);
  auto loss = m->Forward(RandomBatch(4, 8, 32, 3), *p, HostAllocator::Default());
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, std::log(32.0f), 0.1f);
}

// The model's analytic gradient of every parameter tensor, sampled at a few
// elements, against central differences of the model's loss. The f32 loss
// limits the accuracy of the difference, hence the step of 1e-2 and the tolerance.
TEST(Gpt, ParameterGradientsMatchFiniteDifferencesOfTheLoss) {
  GptConfig c = Tiny();
  auto m = MakeModel(c);
  auto p = MakeParams(*m, 5);
  SpreadParams(*p);
  TokenBatch batch = RandomBatch(2, 6, 32, 9);
  ASSERT_TRUE(m->ForwardBackward(batch, *p, HostAllocator::Default()).ok());
  const int checked = ExpectGradientsMatchCentralDifferences(*m, *p, batch, "gpt");
  EXPECT_EQ(checked, static_cast<int>(3 * p->all_params().size()));
}


TEST(Gpt, TinyModelMemorisesAFixedBatch) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 11);
  TokenBatch batch = RandomBatch(4, 8, 32, 12);
  std::vector<float> losses;
  TrainWithAdam(*m, *p, batch, 150, 1e-2f, &losses);
  EXPECT_GT(losses.front(), 3.0f);
  EXPECT_LT(losses.back(), 0.05f) << "first " << losses.front();
}

TEST(Gpt, SameSeedGivesBitIdenticalTraining) {
  TokenBatch batch = RandomBatch(2, 8, 32, 13);
  std::vector<float> la, lb;
  auto m = MakeModel(Tiny());
  auto pa = MakeParams(*m, 21), pb = MakeParams(*m, 21), pc = MakeParams(*m, 22);
  TrainWithAdam(*m, *pa, batch, 5, 1e-2f, &la);
  TrainWithAdam(*m, *pb, batch, 5, 1e-2f, &lb);
  EXPECT_EQ(la, lb);
  std::vector<float> fa = Flatten(pa->all_params()), fb = Flatten(pb->all_params());
  ASSERT_EQ(fa.size(), fb.size());
  EXPECT_EQ(0, std::memcmp(fa.data(), fb.data(), fa.size() * sizeof(float)));
  EXPECT_NE(Flatten(pc->all_params()), Flatten(MakeParams(*m, 21)->all_params()));
}

TEST(Gpt, ActivationCheckpointingGivesIdenticalLossAndGradients) {
  ExpectWholeBlockCheckpointingIsExact([](const ModelOptions& o) -> std::unique_ptr<Model> { return MakeModel(Tiny(), o); });
}

TEST(Gpt, SelectiveCheckpointingGivesIdenticalLossAndGradients) {
  ExpectSelectiveCheckpointingIsExact([](const ModelOptions& o) -> std::unique_ptr<Model> { return MakeModel(Tiny(), o); });
}

TEST(Gpt, SelectiveAndWholeBlockCheckpointingTogetherAreInvalid) {
  ModelOptions o;
  o.activation_checkpointing = true;
  o.checkpointing = ActivationCheckpointing::kSelective;
  auto m = GptModel::Create(Tiny(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("selective"), std::string::npos) << m.status();
  o.activation_checkpointing = false;
  o.checkpointing = static_cast<ActivationCheckpointing>(7);
  EXPECT_EQ(GptModel::Create(Tiny(), o).status().code(), StatusCode::kInvalidArgument);
  o.checkpointing = ActivationCheckpointing::kFull;
  o.recompute_attention = true;
  auto full = GptModel::Create(Tiny(), o);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("recompute_attention"), std::string::npos) << full.status();
}

// bf16 compute (bf16 parameters and activations, f32 accumulation) against
// f32: the documented tolerance is 2% relative on the loss and 5% relative
// L2 error on the gradient.
TEST(Gpt, Bf16ComputeStaysWithinToleranceOfF32) {
  TokenBatch batch = RandomBatch(4, 8, 32, 15);
  auto f32 = MakeModel(Tiny());
  auto bf16 = MakeModel(Tiny(), ModelOptions{DType::kBF16, false});
  auto pa = MakeParams(*f32, 4), pb = MakeParams(*bf16, 4, DType::kBF16);
  auto la = f32->ForwardBackward(batch, *pa, HostAllocator::Default());
  auto lb = bf16->ForwardBackward(batch, *pb, HostAllocator::Default());
  ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
  EXPECT_NEAR(*lb, *la, 0.02f * *la);
  EXPECT_NE(*lb, *la);  // bf16 really changes the arithmetic
  std::vector<float> ga = Flatten(pa->all_grads()), gb = Flatten(pb->all_grads());
  double num = 0, den = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    num += (ga[i] - gb[i]) * (ga[i] - gb[i]);
    den += ga[i] * ga[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
  // And it still learns.
  float end = TrainWithAdam(*bf16, *pb, batch, 100, 1e-2f);
  EXPECT_LT(end, 0.3f);
}

// Hooks whose gradient buffers are bf16 (FSDP with a bf16 reduce dtype):
// the model accumulates in f32 and adds into them once per unit.
class Bf16GradHooks : public UnitHooks {
 public:
  explicit Bf16GradHooks(OwnedParameters* inner) : inner_(inner) {
    for (const UnitSpec& u : inner->units()) {
      std::vector<Tensor> gs;
      for (const ParamSpec& p : u.params) gs.push_back(*HostAllocator::Default().Zeros(DType::kBF16, p.shape));
      grads_.push_back(std::move(gs));
    }
  }
  StatusOr<std::vector<Tensor>> PreForward(int u) override { return inner_->PreForward(u); }
  Status PostForward(int u) override { return inner_->PostForward(u); }
  StatusOr<UnitBackwardBuffers> PreBackward(int u) override {
    SK_ASSIGN_OR_RETURN(UnitBackwardBuffers b, inner_->PreBackward(u));
    b.grads = grads_[u];
    return b;
  }
  Status PostBackward(int u) override { return inner_->PostBackward(u); }
  std::vector<float> FlatGrads() const {
    std::vector<float> out;
    for (const auto& unit : grads_)
      for (const Tensor& t : unit)
        for (int64_t i = 0; i < t.numel(); ++i) out.push_back(BF16ToFloat(t.data_as<BF16>()[i]));
    return out;
  }

 private:
  OwnedParameters* inner_;
  std::vector<std::vector<Tensor>> grads_;
};

// f16 compute: 11 mantissa bits against bf16's 8, so the documented
// tolerance is tighter: 1% on the loss, 2% relative L2 on the gradient.
TEST(Gpt, F16ComputeStaysWithinToleranceOfF32) {
  TokenBatch batch = RandomBatch(4, 8, 32, 15);
  auto f32 = MakeModel(Tiny());
  auto f16 = MakeModel(Tiny(), ModelOptions{DType::kF16, false});
  auto pa = MakeParams(*f32, 4), pb = MakeParams(*f16, 4, DType::kF16);
  auto la = f32->ForwardBackward(batch, *pa, HostAllocator::Default());
  auto lb = f16->ForwardBackward(batch, *pb, HostAllocator::Default());
  ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
  EXPECT_NEAR(*lb, *la, 0.01f * *la);
  EXPECT_NE(*lb, *la);
  std::vector<float> ga = Flatten(pa->all_grads()), gb = Flatten(pb->all_grads());
  double num = 0, den = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    num += (ga[i] - gb[i]) * (ga[i] - gb[i]);
    den += ga[i] * ga[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.02);
}

TEST(Gpt, Bf16GradientBuffersReceiveTheF32GradientRounded) {
  TokenBatch batch = RandomBatch(2, 8, 32, 17);
  auto m = MakeModel(Tiny());
  auto p32 = MakeParams(*m, 8), pb = MakeParams(*m, 8);
  ASSERT_TRUE(m->ForwardBackward(batch, *p32, HostAllocator::Default()).ok());
  Bf16GradHooks hooks(pb.get());
  ASSERT_TRUE(m->ForwardBackward(batch, hooks, HostAllocator::Default()).ok());
  std::vector<float> want = Flatten(p32->all_grads()), got = hooks.FlatGrads();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i], BF16ToFloat(FloatToBF16(want[i]))) << i;
  }
}

TEST(Gpt, GradientsAccumulateAcrossCallsUntilZeroed) {
  TokenBatch batch = RandomBatch(2, 8, 32, 16);
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 6);
  ASSERT_TRUE(m->ForwardBackward(batch, *p, HostAllocator::Default()).ok());
  std::vector<float> once = Flatten(p->all_grads());
  ASSERT_TRUE(m->ForwardBackward(batch, *p, HostAllocator::Default()).ok());
  std::vector<float> twice = Flatten(p->all_grads());
  // Equal up to f32 rounding: a GEMM that accumulates (beta = 1) sums in
  // another order than one that starts from zero.
  float scale = 0;
  for (float g : once) scale = std::max(scale, std::fabs(g));
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(twice[i], 2 * once[i], 1e-5f * std::fabs(once[i]) + 1e-6f * scale) << i;
  }
}

TEST(Gpt, BadBatchesAreInvalidArgumentNamingTheField) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 1);
  Allocator& a = HostAllocator::Default();
  TokenBatch b = RandomBatch(1, 8, 32, 1);
  b.inputs[3] = 32;
  auto r = m->ForwardBackward(b, *p, a);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("inputs[3]"), std::string::npos) << r.status();
  b = RandomBatch(1, 8, 32, 1);
  b.targets[0] = -2;
  EXPECT_EQ(m->Forward(b, *p, a).status().code(), StatusCode::kInvalidArgument);
  b = RandomBatch(1, 9, 32, 1);
  EXPECT_EQ(m->Forward(b, *p, a).status().code(), StatusCode::kInvalidArgument);
  b = RandomBatch(2, 4, 32, 1);
  b.inputs.pop_back();
  EXPECT_EQ(m->Forward(b, *p, a).status().code(), StatusCode::kInvalidArgument);
  b = RandomBatch(1, 4, 32, 1);
  b.targets[1] = kIgnoreTarget;
  EXPECT_TRUE(m->Forward(b, *p, a).ok());
  EXPECT_TRUE(p->call_log().size() > 0);
}

TEST(Gpt, OverflowingBatchSizesAreInvalidArgumentNotACrash) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 1);
  TokenBatch b;
  b.batch_size = int64_t{1} << 62;
  b.seq_len = 8;  // the product wraps to 0, which matches the empty vectors
  EXPECT_EQ(m->Forward(b, *p, HostAllocator::Default()).status().code(),
            StatusCode::kInvalidArgument);
}

// A causal model: the prediction at position t must not depend on inputs
// after t. Only position 3 counts in the loss; changing later inputs leaves
// the loss bit-identical, changing an earlier input does not.
TEST(Gpt, LossAtAPositionIgnoresLaterInputs) {
  auto m = MakeModel(Tiny());
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

TEST(Gpt, BadConfigsAreInvalidArgument) {
  GptConfig c = Tiny();
  c.n_head = 3;
  EXPECT_EQ(GptModel::Create(c).status().code(), StatusCode::kInvalidArgument);
  c = Tiny();
  c.n_layer = 0;
  EXPECT_EQ(GptModel::Create(c).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GptModel::Create(Tiny(), ModelOptions{DType::kInvalid, false}).status().code(),
            StatusCode::kInvalidArgument);
}

// Hooks that fail at one call: the step stops and the error names the unit.
class FailingHooks : public UnitHooks {
 public:
  FailingHooks(OwnedParameters* inner, int fail_unit) : inner_(inner), fail_unit_(fail_unit) {}
  StatusOr<std::vector<Tensor>> PreForward(int u) override { return inner_->PreForward(u); }
  Status PostForward(int u) override { return inner_->PostForward(u); }
  StatusOr<UnitBackwardBuffers> PreBackward(int u) override {
    if (u == fail_unit_) return UnavailableError("gather failed");
    return inner_->PreBackward(u);
  }
  Status PostBackward(int u) override { return inner_->PostBackward(u); }

 private:
  OwnedParameters* inner_;
  int fail_unit_;
};

TEST(Gpt, HookErrorStopsTheStepAndNamesTheUnit) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 1);
  FailingHooks hooks(p.get(), 2);
  auto r = m->ForwardBackward(RandomBatch(1, 8, 32, 1), hooks, HostAllocator::Default());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("'h.1'"), std::string::npos) << r.status();
  EXPECT_EQ(p->call_log().back(), "PostBackward(3)");
}

TEST(Gpt, WrongParameterShapesFromHooksAreInvalidArgument) {
  auto m = MakeModel(Tiny());
  GptConfig other = Tiny();
  other.d_model = 32;
  auto wrong = MakeParams(*MakeModel(other), 1);
  auto r = m->Forward(RandomBatch(1, 8, 32, 1), *wrong, HostAllocator::Default());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("embed.wte"), std::string::npos) << r.status();
}

TEST(Gpt, ModelFlopsAreSixPsiPerTokenPlusAttention) {
  GptConfig c = Tiny();
  auto m = MakeModel(c);
  const double C = c.d_model, L = c.n_layer, T = 8, tokens = 3 * T;
  const double psi_matmul = L * (C * 3 * C + C * C + 2 * C * 4 * C) + C * c.vocab_size;
  EXPECT_DOUBLE_EQ(m->Flops(3, 8, 0).model_flops, tokens * (6 * psi_matmul + 12 * L * T * C));
}

// GPT-2's weight tying: the head has no matrix of its own; it reads the
// token embedding, which is counted once.
TEST(Gpt, TiedHeadUsesTheEmbeddingAndCountsItOnce) {
  GptConfig c = Tiny();
  c.tie_word_embeddings = true;
  auto tied = MakeModel(c);
  auto untied = MakeModel(Tiny());
  const UnitSpec& head = tied->units().back();
  ASSERT_EQ(head.params.size(), 2u);
  ASSERT_EQ(head.tied.size(), 1u);
  EXPECT_EQ(head.tied[0].name, "lm_head.w");
  EXPECT_EQ(head.tied[0].owner, "embed.wte");
  EXPECT_EQ(head.tied[0].shape, Shape({32, 16}));
  EXPECT_EQ(tied->num_parameters() + 16 * 32, untied->num_parameters());
  EXPECT_TRUE(ResolveTiedParams(tied->units()).ok());
}

// The tied model is the untied one with lm_head.w = wte^T: the same loss,
// the same gradients everywhere else, and as the embedding's gradient the
// sum of both uses', dwte + dlm_head^T.
TEST(Gpt, TiedGradientIsTheSumOfTheEmbeddingAndHeadGradients) {
  GptConfig c = Tiny();
  c.tie_word_embeddings = true;
  auto tied = MakeModel(c);
  auto untied = MakeModel(Tiny());
  auto pt = MakeParams(*tied, 5);
  auto pu = MakeParams(*untied, 5);
  const int head = static_cast<int>(untied->units().size()) - 1;
  // Same seed and names: every shared parameter starts equal; the head's
  // matrix is set to the transposed embedding.
  const Tensor& wte = pt->param(0, 0);
  const Tensor& lm = pu->param(head, 2);
  for (int64_t v = 0; v < 32; ++v) {
    for (int64_t d = 0; d < 16; ++d) lm.data_as<float>()[d * 32 + v] = wte.data_as<float>()[v * 16 + d];
  }
  const TokenBatch batch = RandomBatch(3, 8, 32, 11);
  auto lt = tied->ForwardBackward(batch, *pt, HostAllocator::Default());
  auto lu = untied->ForwardBackward(batch, *pu, HostAllocator::Default());
  ASSERT_TRUE(lt.ok() && lu.ok());
  EXPECT_NEAR(*lt, *lu, 1e-6 * std::fabs(*lu));
  const float* gt = pt->grad(0, 0).data_as<float>();
  const float* ge = pu->grad(0, 0).data_as<float>();
  const float* gh = pu->grad(head, 2).data_as<float>();
  double max_head = 0;
  for (int64_t v = 0; v < 32; ++v) {
    for (int64_t d = 0; d < 16; ++d) {
      const double want = ge[v * 16 + d] + gh[d * 32 + v];
      max_head = std::max(max_head, std::fabs(static_cast<double>(gh[d * 32 + v])));
      EXPECT_NEAR(gt[v * 16 + d], want, 1e-6 + 1e-5 * std::fabs(want)) << "wte[" << v << ", " << d << "]";
    }
  }
  EXPECT_GT(max_head, 1e-3);  // the head's share is not negligible
  for (size_t u = 1; u < tied->units().size(); ++u) {
    for (size_t i = 0; i < tied->units()[u].params.size(); ++i) {
      const Tensor& a = pt->grad(static_cast<int>(u), static_cast<int>(i));
      const Tensor& b = pu->grad(static_cast<int>(u), static_cast<int>(i));
      for (int64_t k = 0; k < a.numel(); ++k) {
        ASSERT_NEAR(a.data_as<float>()[k], b.data_as<float>()[k], 1e-6 + 1e-5 * std::fabs(b.data_as<float>()[k]))
            << FullParamName(tied->units()[u], tied->units()[u].params[i]) << "[" << k << "]";
      }
    }
  }
}

TEST(Gpt, TiedModelGradientsMatchFiniteDifferencesOfTheLoss) {
  GptConfig c = Tiny();
  c.tie_word_embeddings = true;
  auto m = MakeModel(c);
  auto p = MakeParams(*m, 5);
  SpreadParams(*p);
  TokenBatch batch = RandomBatch(2, 6, 32, 9);
  ASSERT_TRUE(m->ForwardBackward(batch, *p, HostAllocator::Default()).ok());
  EXPECT_EQ(ExpectGradientsMatchCentralDifferences(*m, *p, batch, "tied gpt"),
            static_cast<int>(3 * p->all_params().size()));
}

}  // namespace
}  // namespace sk
