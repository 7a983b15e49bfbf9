// The models' choice of attention: where the op backend prefers the
// linear-memory attention (CUDA with cuDNN in bf16/f16; the CPU and the
// simulator from kCpuFlashAttentionMinKeys keys), the self-attention
// sublayers call it and keep a log-sum-exp per row instead of the
// probabilities; elsewhere the composed op stays. Checked on the CPU by
// wrapping its backend in one that answers PrefersFlashAttention as a test
// says (the CPU's FlashAttention-2 then runs), so the wiring a GPU run
// relies on is tested without one.
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/gpt.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "tests/nn/gpt_test_model.h"

namespace sk {
namespace {

using namespace ops;  // NOLINT: the backend interface's types

// PrefersFlashAttention's answer for a shape and dtype.
using Preference = std::function<bool(const AttentionShape&, DType)>;

// The CPU backend, preferring flash_attention_fwd/bwd where `prefers` says,
// counting ops.
class FusingCpuBackend final : public OpBackend {
 public:
  FusingCpuBackend(OpBackend* base, Preference prefers)
      : base_(base), prefers_(std::move(prefers)) {}
  bool PrefersFlashAttention(const AttentionShape& s, DType t) const override {
    return prefers_(s, t);
  }
  Status Account(const OpContext& ctx, const OpCost& cost) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[cost.name];
    return base_->Account(ctx, cost);
  }
  int Calls(const std::string& op) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[op];
  }
  const char* name() const override {
    return base_->name();
  }
  bool executes() const override {
    return base_->executes();
  }
  Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b, const MatrixRef& c) override {
    return base_->Gemm(ctx, p, a, b, c);
  }
  bool GemmStores16Bit(const GemmParams& p) const override {
    return base_->GemmStores16Bit(p);
  }
  bool GemmAddsBias(const GemmParams& p, DType ab, DType bias, DType c) const override {
    return base_->GemmAddsBias(p, ab, bias, c);
  }
  Status GemmBias(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b, const Tensor& bias, const MatrixRef& c) override {
    return base_->GemmBias(ctx, p, a, b, bias, c);
  }
  bool Native16Bit(std::string_view op) const override {
    return base_->Native16Bit(op);
  }
  Status Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst) override {
    return base_->Copy(ctx, src, dst);
  }
  Status Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst) override {
    return base_->Cast(ctx, src, dst);
  }
  Status RoundToDType(const OpContext& ctx, const Tensor& x, DType t) override {
    return base_->RoundToDType(ctx, x, t);
  }
  Status Scale(const OpContext& ctx, const Tensor& x, float alpha) override {
    return base_->Scale(ctx, x, alpha);
  }
  Status Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y) override {
    return base_->Axpy(ctx, alpha, x, y);
  }
  Status Fill(const OpContext& ctx, const Tensor& x, float value) override {
    return base_->Fill(ctx, x, value);
  }
  Status InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed, uint64_t param_id, int64_t begin, const Tensor& out) override {
    return base_->InitPhilox(ctx, init, seed, param_id, begin, out);
  }
  Status BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst) override {
    return base_->BroadcastRows(ctx, src, dst);
  }
  Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y) override {
    return base_->BiasAdd(ctx, bias, y);
  }
  Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias) override {
    return base_->BiasGrad(ctx, dy, dbias);
  }
  Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y) override {
    return base_->GeluForward(ctx, x, y);
  }
  Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) override {
    return base_->GeluBackward(ctx, x, dy, dx);
  }
  Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y, const Tensor& mean, const Tensor& rstd) override {
    return base_->LayerNormForward(ctx, x, gamma, beta, y, mean, rstd);
  }
  Status LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override {
    return base_->LayerNormBackward(ctx, x, gamma, dy, mean, rstd, dx, dgamma, dbeta);
  }
  Status AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q, const MatrixRef& k, const MatrixRef& v, const Tensor& probs, const MatrixRef& out) override {
    return base_->AttentionForward(ctx, s, q, k, v, probs, out);
  }
  Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q, const MatrixRef& k, const MatrixRef& v, const Tensor& probs, const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk, const MatrixRef& dv, const Tensor& scratch) override {
    return base_->AttentionBackward(ctx, s, q, k, v, probs, dout, dq, dk, dv, scratch);
  }
  Status FlashAttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q, const MatrixRef& k, const MatrixRef& v, const MatrixRef& out, const Tensor& lse) override {
    return base_->FlashAttentionForward(ctx, s, q, k, v, out, lse);
  }
  Status FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q, const MatrixRef& k, const MatrixRef& v, const MatrixRef& out, const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq, const MatrixRef& dk, const MatrixRef& dv, const Tensor& workspace) override {
    return base_->FlashAttentionBackward(ctx, s, q, k, v, out, dout, lse, dq, dk, dv, workspace);
  }
  Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids, const Tensor& out) override {
    return base_->EmbeddingForward(ctx, table, ids, out);
  }
  Status EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    return base_->EmbeddingBackward(ctx, ids, dout, dtable);
  }
  Status CrossEntropyForward(const OpContext& ctx, const Tensor& logits, const Tensor& targets, const Tensor& loss) override {
    return base_->CrossEntropyForward(ctx, logits, targets, loss);
  }
  Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets, const Tensor& dlogits,
                              float scale) override {
    return base_->CrossEntropyBackward(ctx, logits, targets, dlogits, scale);
  }
  Status CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                               const Tensor& row_loss) override {
    return base_->CrossEntropyRowLosses(ctx, logits, targets, row_loss);
  }
  Status CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss, const Tensor& targets,
                          const Tensor& loss) override {
    return base_->CrossEntropyMean(ctx, row_loss, targets, loss);
  }
  Status SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc) override {
    return base_->SumOfSquares(ctx, x, acc);
  }
  Status MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc) override {
    return base_->MaxAbs(ctx, x, acc);
  }
  Status SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param, const Tensor& grad, const Tensor& momentum) override {
    return base_->SgdUpdate(ctx, h, param, grad, momentum);
  }
  Status AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) override {
    return base_->AdamUpdate(ctx, h, param, grad, exp_avg, exp_avg_sq);
  }
  StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t) override {
    return base_->ReadScalar(ctx, t);
  }
  Status ReadValues(const OpContext& ctx, const Tensor& t, double* out) override {
    return base_->ReadValues(ctx, t, out);
  }

 private:
  OpBackend* base_;
  Preference prefers_;
  std::mutex mu_;
  std::map<std::string, int> calls_;
};

// In 16-bit only: what the CUDA backend answers where cuDNN takes the shape.
bool In16Bit(const AttentionShape&, DType t) { return t != DType::kF32; }

// Registers the fusing backend for cpu for its lifetime (by default
// preferring the linear-memory op in 16-bit only, as CUDA does).
class FusingCpu {
 public:
  explicit FusingCpu(Preference prefers = In16Bit)
      : base_(BackendFor(DeviceKind::kCpu)), fusing_(base_, std::move(prefers)) {
    RegisterOpBackend(DeviceKind::kCpu, &fusing_);
  }
  ~FusingCpu() { RegisterOpBackend(DeviceKind::kCpu, base_); }
  FusingCpuBackend& backend() { return fusing_; }

 private:
  OpBackend* base_;
  FusingCpuBackend fusing_;
};

struct Step {
  float loss = 0;
  std::vector<float> grads;
};

// One forward and backward of the tiny GPT (at `seq` positions, batch
// `batch`).
Step RunStep(DType t, int64_t batch = 4, int64_t seq = 8) {
  GptConfig config = Tiny();
  config.max_seq_len = seq;
  auto model = GptModel::Create(config, ModelOptions{t, false});
  CHECK(model.ok()) << model.status();
  auto params = OwnedParameters::Create((*model)->units(), 4, DType::kF32);
  CHECK(params.ok()) << params.status();
  auto loss = (*model)->ForwardBackward(RandomBatch(batch, seq, 32, 15), **params,
                                        HostAllocator::Default());
  CHECK(loss.ok()) << loss.status();
  Step s;
  s.loss = *loss;
  for (const Tensor& g : (*params)->all_grads()) {
    s.grads.insert(s.grads.end(), g.data_as<float>(), g.data_as<float>() + g.numel());
  }
  return s;
}

double RelativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

TEST(LinearMemoryAttention, GptUsesItIn16BitWhereTheBackendFusesIt) {
  const Step composed = RunStep(DType::kBF16);
  FusingCpu fusing;
  const Step linear = RunStep(DType::kBF16);
  EXPECT_EQ(fusing.backend().Calls("flash_attention_fwd"), 2);  // one per layer
  EXPECT_EQ(fusing.backend().Calls("flash_attention_bwd"), 2);
  EXPECT_EQ(fusing.backend().Calls("attention_fwd"), 0);
  EXPECT_EQ(fusing.backend().Calls("attention_bwd"), 0);
  // The same model up to bf16 rounding inside attention.
  EXPECT_NEAR(linear.loss, composed.loss, 0.005f * composed.loss);
  EXPECT_LT(RelativeL2(composed.grads, linear.grads), 0.02);
}

TEST(LinearMemoryAttention, WhereTheBackendDoesNotPreferItTheComposedAttentionStays) {
  const Step plain = RunStep(DType::kF32);
  FusingCpu fusing;
  const Step again = RunStep(DType::kF32);
  EXPECT_EQ(fusing.backend().Calls("flash_attention_fwd"), 0);
  EXPECT_EQ(fusing.backend().Calls("attention_fwd"), 2);
  EXPECT_EQ(again.loss, plain.loss);
  EXPECT_EQ(again.grads, plain.grads);
}

// The CPU prefers its FlashAttention-2 from kCpuFlashAttentionMinKeys keys
// (where it measured at least as fast as the composed attention), in
// every dtype.
TEST(LinearMemoryAttention, TheCpuBackendPrefersItFromTheMeasuredCrossover) {
  const OpContext ctx = HostContext();
  const int64_t from = kCpuFlashAttentionMinKeys;
  for (DType t : {DType::kF32, DType::kBF16}) {
    EXPECT_FALSE(PrefersFlashAttention(ctx, AttentionShape{1, 2, 8, 8, 8, true}, t));
    EXPECT_FALSE(
        PrefersFlashAttention(ctx, AttentionShape{1, 2, from - 1, from - 1, 8, true}, t));
    EXPECT_TRUE(PrefersFlashAttention(ctx, AttentionShape{1, 2, from, from, 8, true}, t));
  }
}

// A GPT at kCpuFlashAttentionMinKeys positions on the plain CPU backend runs
// the linear-memory attention in every layer, and computes what the
// composed attention does up to f32 rounding.
TEST(LinearMemoryAttention, GptAtLongSequencesUsesItOnTheCpu) {
  const int64_t seq = kCpuFlashAttentionMinKeys;
  Step linear;
  {
    FusingCpu counting([base = BackendFor(DeviceKind::kCpu)](const AttentionShape& s, DType t) {
      return base->PrefersFlashAttention(s, t);
    });
    linear = RunStep(DType::kF32, 1, seq);
    EXPECT_EQ(counting.backend().Calls("flash_attention_fwd"), 2);  // one per layer
    EXPECT_EQ(counting.backend().Calls("flash_attention_bwd"), 2);
    EXPECT_EQ(counting.backend().Calls("attention_fwd"), 0);
  }
  Step composed;
  {
    FusingCpu declining([](const AttentionShape&, DType) { return false; });
    composed = RunStep(DType::kF32, 1, seq);
    EXPECT_EQ(declining.backend().Calls("attention_fwd"), 2);
  }
  EXPECT_NEAR(linear.loss, composed.loss, 1e-5f * composed.loss);
  EXPECT_LT(RelativeL2(composed.grads, linear.grads), 1e-5);
}

}  // namespace
}  // namespace sk
