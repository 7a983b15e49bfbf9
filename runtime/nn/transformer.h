// Internal to runtime/nn: the pieces GPT and T5 are assembled from.
//
// A transformer block is a list of pre-LayerNorm residual sublayers
// (x + f(LN(x))): self-attention (causal or not), cross-attention to an
// encoder output, and a GELU MLP. Each sublayer owns a fixed run of
// consecutive parameters in its unit (see AppendSublayerSpecs), so a block's
// parameters are the concatenation of its sublayers'.
#ifndef SHARDKIT_RUNTIME_NN_TRANSFORMER_H_
#define SHARDKIT_RUNTIME_NN_TRANSFORMER_H_

#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/model.h"

namespace sk {
namespace nn_internal {

// An f32 tensor from `alloc`, uninitialised or zeroed.
StatusOr<Tensor> NewF32(Allocator& alloc, int64_t numel);
StatusOr<Tensor> ZerosF32(Allocator& alloc, int64_t numel);
inline float* F(const Tensor& t) { return t.data_as<float>(); }

// A unit's parameters as f32 pointers: f32 tensors are used in place, bf16
// and f16 ones are widened (exactly) into scratch from the allocator.
class UnitParams {
 public:
  // InvalidArgument naming the unit and parameter when `tensors` does not
  // match the specs (count, shape, dtype f32/bf16/f16, host memory).
  static StatusOr<UnitParams> Make(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                                   Allocator& alloc);
  const float* operator[](size_t i) const { return ptrs_[i]; }

 private:
  std::vector<Tensor> keep_;
  std::vector<const float*> ptrs_;
};

// A unit's gradient sinks as f32 pointers: f32 targets are accumulated into
// directly; bf16/f16 targets get zeroed f32 scratch that Flush() adds into them.
class UnitGrads {
 public:
  static StatusOr<UnitGrads> Make(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                                  Allocator& alloc);
  float* operator[](size_t i) const { return ptrs_[i]; }
  // Adds scratch into bf16/f16 targets. Call once, after the unit's backward.
  void Flush();

 private:
  std::vector<Tensor> targets_;
  std::vector<Tensor> scratch_;
  std::vector<float*> ptrs_;
};

// Drives the hook protocol for one unit and names the unit in every error
// ("PreBackward of unit 'h.1': ...").
class UnitScope {
 public:
  UnitScope(UnitHooks& hooks, const std::vector<UnitSpec>& units, Allocator& alloc)
      : hooks_(hooks), units_(units), alloc_(alloc) {}

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
  Allocator& alloc_;
};

// Checks the tensors a hook returned against the unit's specs.
Status ValidateUnitTensors(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                           const char* what);

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
  DType storage = DType::kF32;  // activations are rounded to this dtype
};

// What a sublayer keeps for its backward; `out` is its output (the next
// sublayer's input).
struct SublayerSaved {
  Tensor ln, mean, rstd, a, b, probs, att, out;
};

struct BlockSaved {
  std::vector<SublayerSaved> subs;
};

class TransformerBlock {
 public:
  explicit TransformerBlock(std::vector<SublayerKind> kinds) : kinds_(std::move(kinds)) {}

  // Appends the block's parameters: sublayers named "attn." (self-attention),
  // "cross." and "mlp.".
  void AppendSpecs(int64_t d_model, int64_t d_ff, float std, float proj_std,
                   std::vector<ParamSpec>* out) const;

  // Runs the block on x [batch*seq, d_model]; the output is saved->subs.back().out.
  // enc is the encoder output [batch*enc_seq, d_model] for cross-attention.
  Status Forward(const BlockDims& d, const UnitParams& p, const float* x, const float* enc,
                 Allocator& alloc, BlockSaved* saved) const;

  // Given dy for the block output, overwrites dx [batch*seq, d_model] with the
  // input gradient, adds the encoder-output gradient into denc (if any
  // cross-attention) and parameter gradients into g.
  Status Backward(const BlockDims& d, const UnitParams& p, const UnitGrads& g, const float* x,
                  const float* enc, const BlockSaved& saved, const float* dy, float* dx,
                  float* denc, Allocator& alloc) const;

  // Floats a Forward keeps in `saved` (what backward needs).
  int64_t SavedFloats(const BlockDims& d) const;
  // Most floats a Backward allocates at once beyond `saved`, its dy and dx.
  int64_t BackwardTempFloats(const BlockDims& d) const;

  // Multiply-adds per block invocation in matmuls (x2 for flops), forward only.
  double ForwardMatmulFlops(int64_t batch, int64_t seq, int64_t enc_seq, int64_t d_model,
                            int64_t d_ff) const;

 private:
  std::vector<SublayerKind> kinds_;
};

// The output head: final LayerNorm, LM projection [d_model, vocab] without
// bias, softmax cross-entropy. Parameters in order: ln.g, ln.b, lm_head.w.
void AppendHeadSpecs(int64_t d_model, int64_t vocab, float std, std::vector<ParamSpec>* out);

struct HeadSaved {
  Tensor ln, mean, rstd, dlogits;
};

// Loss of x [rows, d_model] against targets [rows]. With want_grad, also
// stores dL/dlogits of the mean loss in saved->dlogits for HeadBackward.
StatusOr<float> HeadForward(const UnitParams& p, const float* x, const int32_t* targets,
                            int64_t rows, int64_t d_model, int64_t vocab, DType storage,
                            bool want_grad, Allocator& alloc, HeadSaved* saved);

// Overwrites dx [rows, d_model]; adds parameter gradients into g.
Status HeadBackward(const UnitParams& p, const UnitGrads& g, const float* x,
                    const HeadSaved& saved, int64_t rows, int64_t d_model, int64_t vocab,
                    DType storage, float* dx, Allocator& alloc);

// InvalidArgument unless rows * cols fits int64 (both already positive).
Status CheckProduct(int64_t rows, int64_t cols, const char* what);

// InvalidArgument "config '<model>': <field> must be positive, got <v>" unless v > 0.
Status Positive(int64_t v, const std::string& model, const char* field);

// The checks every transformer config shares: d_model a multiple of n_head,
// and a vocabulary whose ids fit int32.
Status ValidateWidthAndVocab(const std::string& model, int64_t d_model, int64_t n_head,
                             int64_t vocab_size);

// InvalidArgument unless `dtype` is one the models compute in (f32, bf16, f16).
Status ValidateComputeDType(DType dtype);

// Checks ids in [0, vocab) (targets may also be kIgnoreTarget).
Status ValidateTokens(const std::vector<int32_t>& ids, int64_t expected_count, int64_t vocab,
                      bool allow_ignore, const char* field);

}  // namespace nn_internal
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_TRANSFORMER_H_
