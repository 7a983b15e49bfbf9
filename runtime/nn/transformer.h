// Internal to runtime/nn: the GPT-2-style transformer that GPT, T5 and the
// unit tables' ViT blocks are assembled from (what every model uses,
// whatever its blocks, is model_common.h).
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

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/model.h"
#include "runtime/nn/model_common.h"
#include "runtime/ops/ops.h"

namespace sk {
namespace nn_internal {

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

}  // namespace nn_internal
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_TRANSFORMER_H_
