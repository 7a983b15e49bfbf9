// Internal to runtime/nn: the pieces GPT and T5 are assembled from.
//
// A transformer block is a list of pre-LayerNorm residual sublayers
// (x + f(LN(x))): self-attention (causal or not), cross-attention to an
// encoder output, and a GELU MLP. Each sublayer owns a fixed run of
// consecutive parameters in its unit (see AppendSublayerSpecs), so a block's
// parameters are the concatenation of its sublayers', named by
// SublayerTensors. Everything computes through ops (runtime/ops/ops.h): no
// code here reads tensor data, so the models run on any device kind.
#ifndef SHARDKIT_RUNTIME_NN_TRANSFORMER_H_
#define SHARDKIT_RUNTIME_NN_TRANSFORMER_H_

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
// is cast for that GEMM (transformer.cc: InDType).
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

enum class SublayerKind { kSelfAttention, kCausalSelfAttention, kCrossAttention, kMlp };

// Appends the sublayer's parameters named "<prefix>ln.g" etc. Weights are
// normal(0, std), the output projection normal(0, proj_std), biases zero,
// LayerNorm gains one.
void AppendSublayerSpecs(SublayerKind kind, const std::string& prefix, int64_t d_model,
                         int64_t d_ff, float std, float proj_std, std::vector<ParamSpec>* out);
size_t SublayerParamCount(SublayerKind kind);

// Sizes of one block invocation.
struct BlockDims {
  int64_t batch = 0;
  int64_t seq = 0;      // rows per sequence of the block's input
  int64_t enc_seq = 0;  // rows per sequence of the encoder output (cross-attention)
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t d_ff = 0;
  DType storage = DType::kF32;  // the compute dtype: activations and their gradients
  // Packed documents: the causal self-attention's key starts and their
  // pair count (DocumentTensors); undefined and 0 otherwise.
  Tensor key_start;
  int64_t masked_pairs = 0;
};

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

// One sublayer's parameters by name (or their gradients: the same layout).
// Which fields a kind uses (C = d_model, F = d_ff):
//   every kind:        ln_g [C], ln_b [C]
//   self-attention:    qkv_w [C, 3C], qkv_b [3C], proj_w [C, C], proj_b [C]
//   cross-attention:   q_w [C, C], q_b [C], kv_w [C, 2C], kv_b [2C], proj_w [C, C], proj_b [C]
//   MLP:               fc_w [C, F], fc_b [F], proj_w [F, C], proj_b [C]
// Unused fields stay undefined. Spec order (AppendSublayerSpecs) is the
// order of the fields above.
struct SublayerTensors {
  Tensor ln_g, ln_b;
  Tensor qkv_w, qkv_b;
  Tensor q_w, q_b, kv_w, kv_b;
  Tensor fc_w, fc_b;
  Tensor proj_w, proj_b;
};

// What a sublayer's forward keeps for its backward (N = batch * seq rows,
// Ne = batch * enc_seq encoder rows, H heads, T = seq, Te = enc_seq). Fields
// a kind does not use stay undefined.
struct SublayerActivations {
  Tensor ln;       // [N, C] LayerNorm output (the projections' input)
  Tensor ln_mean;  // [N]
  Tensor ln_rstd;  // [N]
  Tensor qkv;      // self-attention: [N, 3C] fused q, k, v
  Tensor q;        // cross-attention: [N, C] queries
  Tensor kv;       // cross-attention: [Ne, 2C] fused keys and values of the encoder output
  Tensor probs;    // attention: [B, H, T, T] (self) or [B, H, T, Te] (cross) softmax
  Tensor lse;      // self-attention in linear memory, instead of probs: [B, H, T] f32
                   // log-sum-exp per query row (transformer.cc: LinearMemoryAttention)
  Tensor att;      // attention: [N, C] heads' outputs, the output projection's input
  Tensor fc;       // MLP: [N, F] pre-GELU. GELU's output, the projection's input,
                   // is not kept: the backward recomputes it from fc (one
                   // elementwise pass instead of N x F kept per block).
  Tensor out;      // [N, C] the residual output: the next sublayer's input (the
                   // last sublayer's is the block output, which the block's
                   // own backward does not read)
};

struct BlockSaved {
  std::vector<SublayerActivations> subs;
};

class TransformerBlock {
 public:
  explicit TransformerBlock(std::vector<SublayerKind> kinds) : kinds_(std::move(kinds)) {}

  // Appends the block's parameters: sublayers named "attn." (self-attention),
  // "cross." and "mlp.".
  void AppendSpecs(int64_t d_model, int64_t d_ff, float std, float proj_std,
                   std::vector<ParamSpec>* out) const;

  // Runs the block on x [batch*seq, d_model]; the output is saved->subs.back().out.
  // enc is the encoder output [batch*enc_seq, d_model] for cross-attention
  // (undefined otherwise).
  Status Forward(const ops::OpContext& ctx, const BlockDims& d, const UnitParams& p,
                 const Tensor& x, const Tensor& enc, BlockSaved* saved) const;

  // Given dy for the block output, overwrites dx [batch*seq, d_model] with the
  // input gradient, adds the encoder-output gradient into denc (if any
  // cross-attention) and parameter gradients into g. dx may be dy (the
  // gradient then runs in place: no copy, no second buffer); otherwise they
  // must not overlap. Reads neither saved.subs.back().out (the block
  // output) nor anything after the call: the caller may release both.
  // Each MLP sublayer recomputes GELU's output from its kept input (an
  // N x F temporary, freed before the GELU's gradient is allocated):
  // bit-identical to the forward's wherever the forward composes
  // GemmBiasGelu (cpu, the simulator, CUDA by default); with CUDA's fused
  // GELU epilogue (SK_CUDA_FUSED_EPILOGUES=1) the forward rounded GELU of
  // the unrounded pre-activation, so the recomputed value may differ from
  // it by GELU's slope times pre's rounding (ops.h: GemmBiasGelu).
  Status Backward(const ops::OpContext& ctx, const BlockDims& d, const UnitParams& p,
                  const UnitGrads& g, const Tensor& x, const Tensor& enc, const BlockSaved& saved,
                  const Tensor& dy, const Tensor& dx, const Tensor& denc) const;

  // Selective checkpointing (ActivationCheckpointing::kSelective): drops from
  // `saved` what RecomputeCheap rebuilds, each sublayer's LayerNorm output
  // and statistics, keeping the GEMM outputs (qkv, q, kv, fc, the residual
  // outputs) and, unless `attention`, the attention's output and its
  // probabilities (or log-sum-exp). (The MLP's post-GELU is never kept:
  // Backward recomputes it in every mode.)
  void ReleaseRecomputable(bool attention, BlockSaved* saved) const;
  // Rebuilds what ReleaseRecomputable dropped (the same `attention`), from x
  // (the block input) and the kept tensors, with the ops Forward ran on the
  // same inputs: the backward then reads bit-identical activations.
  Status RecomputeCheap(const ops::OpContext& ctx, const BlockDims& d, const UnitParams& p,
                        const Tensor& x, bool attention, BlockSaved* saved) const;
  // Bytes ReleaseRecomputable drops (RecomputeCheap allocates them again)
  // on a device of kind `device` (which attention runs there:
  // LinearMemoryAttention).
  int64_t RecomputableBytes(const BlockDims& d, bool attention, DeviceKind device) const;
  // Flops RecomputeCheap runs: LayerNorms at their elementwise cost
  // (runtime/ops/cost.h), no GEMM; with `attention`, also the attention's
  // two products and its softmax. (Backward's GELU recompute runs in every
  // mode, as part of the backward, and is not checkpointing's.)
  double RecomputeCheapFlops(const BlockDims& d, bool attention) const;

  // Bytes a Forward on a device of kind `device` keeps in `saved` (what
  // backward needs): activations at d.storage's size, LayerNorm statistics
  // and attention state f32: the composed attention's probabilities, or a
  // log-sum-exp per row where self-attention runs in linear memory there
  // (LinearMemoryAttention, the predicate Forward itself asks).
  int64_t SavedBytes(const BlockDims& d, DeviceKind device) const;
  // Most bytes a Backward on `device` allocates at once beyond `saved`, its
  // dy and dx (the composed attention's scratch, or the linear-memory
  // backward's workspace; an MLP's recomputed GELU output, then its
  // gradient).
  int64_t BackwardTempBytes(const BlockDims& d, DeviceKind device) const;
  // Model::PackedAttentionTemporaryBytes of the block's causal
  // self-attention (the largest of its sublayers').
  int64_t PackedAttentionTemporaryBytes(const BlockDims& d, DeviceKind device) const;

  // Multiply-adds per block invocation in matmuls (x2 for flops), forward only.
  double ForwardMatmulFlops(int64_t batch, int64_t seq, int64_t enc_seq, int64_t d_model,
                            int64_t d_ff) const;

 private:
  std::vector<SublayerKind> kinds_;
};

// The output head: final LayerNorm, LM projection [d_model, vocab] without
// bias, softmax cross-entropy. Parameters in order: ln.g, ln.b, lm_head.w.
// With a non-empty `tied_owner` (the full name of the token embedding
// [vocab, d_model]), lm_head.w is that parameter, tied (UnitSpec::tied), and
// the logits are x wte^T.
void AppendHeadSpecs(int64_t d_model, int64_t vocab, float std, const std::string& tied_owner,
                     UnitSpec* head);

// The head's parameters by name: ln_g [C], ln_b [C], lm_head_w [C, V]
// (tied: the token embedding [V, C]).
struct HeadTensors {
  Tensor ln_g, ln_b, lm_head_w;
};

// What the head keeps from its forward for its backward (N rows).
struct HeadSaved {
  Tensor ln;       // [N, C] final LayerNorm output
  Tensor ln_mean;  // [N]
  Tensor ln_rstd;  // [N]
};

// The head's forward: the final LayerNorm of x [rows, d_model] into saved.
// With want_grad that is all (the loss and its gradient come together from
// HeadBackward, through the fused classifier, ops/classifier.h) and the
// result is 0; without, it also returns the loss against targets [rows]
// (i32 on ctx's device): the classifier without gradients, read back with
// ReadScalar (NaN on a device that does not execute).
StatusOr<float> HeadForward(const ops::OpContext& ctx, const UnitParams& p, const Tensor& x,
                            const Tensor& targets, int64_t rows, int64_t d_model, int64_t vocab,
                            DType storage, bool want_grad, HeadSaved* saved, bool tied = false);

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

// The head's loss and backward, in its backward phase: the fused
// classifier over saved.ln (loss, dL/dln, the LM projection's gradient with
// factor grad_scale per counted target: ClassifierGradScale), then the
// LayerNorm's into *dx [rows, d_model], which it allocates (compute dtype)
// once the classifier has returned its workspace, so that the two never
// coexist; adds parameter gradients into g. Returns the loss, read back
// with ReadScalar (NaN on a device that does not execute).
StatusOr<float> HeadBackward(const ops::OpContext& ctx, const UnitParams& p, const UnitGrads& g,
                             const Tensor& x, const HeadSaved& saved, const Tensor& targets,
                             int64_t rows, int64_t d_model, int64_t vocab, DType storage,
                             Tensor* dx, bool tied, float grad_scale);

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

#endif  // SHARDKIT_RUNTIME_NN_TRANSFORMER_H_
