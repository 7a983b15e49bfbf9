// Internal to runtime/nn: what every model (GPT, T5, the Llama family, unit
// tables) is written with, whatever its blocks: the op context of a call
// and its activation tensors, a batch's tokens and packed documents on the
// device, a unit's parameters and gradient sinks and the hook protocol
// around them (UnitScope), linear layers, the loss's gradient scale and the
// head's peak bytes, and the checks every config and batch shares (shape
// bounds, token ids). The GPT-2-style blocks and LayerNorm head that GPT
// and T5 share are transformer.h. Everything computes through ops
// (runtime/ops/ops.h): no code here reads tensor data.
#ifndef SHARDKIT_RUNTIME_NN_MODEL_COMMON_H_
#define SHARDKIT_RUNTIME_NN_MODEL_COMMON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/model.h"
#include "runtime/ops/ops.h"

namespace sk {
namespace nn_internal {

// The op context of one model call: the device of `alloc`, the hooks
// owner's compute stream, and `alloc` for activations and temporaries.
// Unavailable when the device cannot be had.
StatusOr<ops::OpContext> MakeContext(UnitHooks& hooks, Allocator& alloc);

// An f32 tensor [numel] from ctx.alloc, uninitialised or zeroed (fill op).
StatusOr<Tensor> NewF32(const ops::OpContext& ctx, int64_t numel);
// An activation tensor [numel] of dtype t (the compute dtype), uninitialised.
StatusOr<Tensor> NewAct(const ops::OpContext& ctx, DType t, int64_t numel);
StatusOr<Tensor> ZerosF32(const ops::OpContext& ctx, int64_t numel);

// The first `numel` elements of tensor t, as [numel] (a CHECKed view:
// the callers' sizes come from validated batches).
Tensor Prefix(const Tensor& t, int64_t numel);

// `ids` (validated host token ids) in an i32 tensor on ctx's device, moved
// there by the copy op.
StatusOr<Tensor> TokensToDevice(const ops::OpContext& ctx, const std::vector<int32_t>& ids);

// A batch's packed documents on ctx's device (TokenBatch::positions and
// segment_ids), each undefined where the batch has none.
struct DocumentTensors {
  // i32 [batch * seq_len]: each token's position id.
  Tensor positions;
  // i32 [batch * seq_len]: the first position of each token's document in
  // its row, the attention's key start (ops::AttentionShape::key_start).
  Tensor key_start;
  // The (query, key) pairs the documents' causal masks leave, summed over
  // the rows (ops::AttentionShape::masked_pairs); 0 without segment ids.
  int64_t masked_pairs = 0;
};

// The key starts of a validated batch's segment ids on the host: token i
// of a row attends keys [start[i], i] of its row (documents are runs of
// equal ids). Adds the pairs that leaves to *pairs.
std::vector<int32_t> DocumentKeyStarts(const TokenBatch& batch, int64_t* pairs);

// Moves a validated batch's positions and key starts to ctx's device.
StatusOr<DocumentTensors> DocumentsToDevice(const ops::OpContext& ctx, const TokenBatch& batch);

// A unit's parameters, used in place in whatever float dtype the hooks gave
// them (FSDP: param_dtype; DDP: the compute dtype): no copies. The ops read
// any float dtype; a GEMM weight whose dtype differs from its activations'
// is cast for that GEMM (InDType).
class UnitParams {
 public:
  // InvalidArgument naming the unit and parameter when `tensors` does not
  // match the specs (count, shape, dtype f32/bf16/f16, ctx's device kind).
  static StatusOr<UnitParams> Make(const ops::OpContext& ctx, const UnitSpec& unit,
                                   const std::vector<Tensor>& tensors);
  const Tensor& operator[](size_t i) const { return tensors_[i]; }
  size_t size() const { return tensors_.size(); }

 private:
  std::vector<Tensor> tensors_;
};

// A unit's gradient sinks as f32 tensors: f32 targets are accumulated into
// directly; bf16/f16 targets get zeroed f32 scratch of the same shape that
// Flush() adds into them (axpy, rounding to the target's dtype).
class UnitGrads {
 public:
  static StatusOr<UnitGrads> Make(const ops::OpContext& ctx, const UnitSpec& unit,
                                  const std::vector<Tensor>& tensors);
  const Tensor& operator[](size_t i) const { return sinks_[i]; }
  size_t size() const { return sinks_.size(); }
  // Adds scratch into bf16/f16 targets. Call once, after the unit's backward.
  Status Flush(const ops::OpContext& ctx);

 private:
  std::vector<Tensor> targets_;
  std::vector<Tensor> sinks_;  // the target itself (f32) or its f32 scratch
};

// Drives the hook protocol for one unit and names the unit in every error
// ("PreBackward of unit 'h.1': ...").
class UnitScope {
 public:
  UnitScope(UnitHooks& hooks, const std::vector<UnitSpec>& units, const ops::OpContext& ctx)
      : hooks_(hooks), units_(units), ctx_(ctx) {}

  StatusOr<UnitParams> PreForward(int u);
  Status PostForward(int u);

  struct Backward {
    UnitParams p;
    UnitGrads g;
  };
  StatusOr<Backward> PreBackward(int u);
  // For units whose backward reads no parameter (the embeddings): checks
  // the parameters but does not widen bf16 ones to f32.
  StatusOr<Backward> PreBackwardGradientsOnly(int u);
  // Flushes b's gradients into the hook's buffers, then PostBackward(u).
  Status PostBackward(int u, Backward* b);

 private:
  Status Named(const Status& s, int u, const char* phase) const;
  UnitHooks& hooks_;
  const std::vector<UnitSpec>& units_;
  ops::OpContext ctx_;
};

// Checks the tensors a hook returned against the unit's specs; they must be
// on a device of kind `kind`.
Status ValidateUnitTensors(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                           const char* what, DeviceKind kind);

// w itself when it has dtype t; otherwise a copy cast to t from ctx.alloc
// (a GEMM takes A and B of one dtype).
StatusOr<Tensor> InDType(const ops::OpContext& ctx, const Tensor& w, DType t);

// y[rows, out] = x[rows, in] w[in, out] (+ bias[out] when defined), the
// bias added to the f32 accumulation (ops::GemmBias).
Status Linear(const ops::OpContext& ctx, const Tensor& x, const Tensor& w, const Tensor& bias,
              int64_t rows, int64_t in, int64_t out, const Tensor& y);

// y[rows, out] = x[rows, in] w[in, out] + bias[out] + residual[rows, out],
// summed in f32 and rounded once (ops::GemmBiasResidual).
Status LinearResidual(const ops::OpContext& ctx, const Tensor& x, const Tensor& w,
                      const Tensor& bias, const Tensor& residual, int64_t rows, int64_t in,
                      int64_t out, const Tensor& y);

// Given dy[rows, out]: dw += x^T dy, dbias += column sums of dy (if defined),
// and dx = dy w^T, overwritten or (accumulate_dx) added (if defined).
Status LinearBackward(const ops::OpContext& ctx, const Tensor& x, const Tensor& w,
                      const Tensor& dy, int64_t rows, int64_t in, int64_t out, const Tensor& dx,
                      bool accumulate_dx, const Tensor& dw, const Tensor& dbias);

// The factor CrossEntropyBackward gives each counted target's gradient for
// `batch`: 1 / loss_denominator where set, else 0 (1 / the batch's count).
float GradScale(const TokenBatch& batch);
// The fused classifier's factor per counted target (ops::Classifier's
// grad_scale): GradScale where it is set, else 1 / the batch's count of
// counted targets (1 when none counts: every row's gradient is zero then):
// the factor CrossEntropyBackward computes from the count, bit for bit.
float ClassifierGradScale(const TokenBatch& batch);
// InvalidArgument unless batch.loss_denominator is finite and >= 0.
Status ValidateLossDenominator(const TokenBatch& batch);

// Bytes a step's one-element f32 loss tensor takes from a caching
// allocator (runtime/memory: 512-byte blocks), as GPT's count takes it:
// four bytes left the estimate 508 bytes short of the simulator's peak,
// which the loss is alive at (tests/sim/sim_run_test).
inline constexpr int64_t kLossBytes = 512;

// Bytes the head holds at its peak besides what the model keeps through the
// forward: its saved LayerNorm output and statistics, dL/dln and the larger
// of the classifier's workspace (ops::ClassifierWorkspaceBytes; the weight
// used in the compute dtype) and dx, which HeadBackward allocates after
// the classifier. The same for RMSNorm heads with `stats` statistics per
// row.
int64_t HeadBackwardPeakBytes(int64_t rows, int64_t d_model, int64_t vocab, DType storage,
                              int stats);

// InvalidArgument unless rows * cols fits int64 (both already positive).
Status CheckProduct(int64_t rows, int64_t cols, const char* what);

// InvalidArgument "config '<model>': <field> must be positive, got <v>" unless v > 0.
Status Positive(int64_t v, const std::string& model, const char* field);

// Bounds on a transformer's shape (issue 47 item 2: a config.json or decoder
// spec with a width of 2^62 overflowed the parameter count into 10400 or a
// negative number, and 10^9 layers ran for minutes until memory ran out).
// Each bound is far beyond any trained model's (Llama 3.1 405B: 126 layers,
// d_model 16384, d_ff 53248, 128 Ki positions) and keeps every product the
// runtime forms of two dimensions, or of the parameter count and 16 bytes,
// inside int64.
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;      // per stack
inline constexpr int64_t kMaxWidth = int64_t{1} << 24;       // d_model, d_ff, heads, positions
inline constexpr int64_t kMaxParameters = int64_t{1} << 48;  // ~2.8e14

// InvalidArgument "config '<model>': <field> is <v>, more than the bound
// <max> ..." unless v <= max.
Status AtMost(int64_t v, int64_t max, const std::string& model, const char* field);

// InvalidArgument naming the model and the bound unless `count` (computed
// in 128 bits from dimensions already within their bounds) is at most
// kMaxParameters.
Status CheckParameterCount(const std::string& model, __int128 count);

// The checks every transformer config shares: d_model a multiple of n_head,
// and a vocabulary whose ids fit int32.
Status ValidateWidthAndVocab(const std::string& model, int64_t d_model, int64_t n_head,
                             int64_t vocab_size);

// InvalidArgument unless `dtype` is one the models compute in (f32, bf16, f16).
Status ValidateComputeDType(DType dtype);

// Checks ids in [0, vocab) (targets may also be kIgnoreTarget).
Status ValidateTokens(const std::vector<int32_t>& ids, int64_t expected_count, int64_t vocab,
                      bool allow_ignore, const char* field);

// A decoder-only model's batch (GPT, the Llama family): a positive batch,
// 1 <= seq_len <= max_seq_len, no source, and inputs and targets of
// batch_size * seq_len ids in [0, vocab_size); positions, where given, of
// batch_size * seq_len values in [0, max_seq_len); segment_ids, where
// given, of batch_size * seq_len values non-decreasing along each row.
Status ValidateDecoderBatch(const TokenBatch& batch, const std::string& model, int64_t max_seq_len,
                            int64_t vocab_size);

}  // namespace nn_internal
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_MODEL_COMMON_H_
