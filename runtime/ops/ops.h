// The op layer: every operation shardkit performs on tensor data.
//
// Each function validates its operands, computes the op's cost (cost.h),
// calls Account() on the backend registered for ctx.device's kind and, when
// that backend executes, runs the op there (backend.h has the execution
// contract per device kind; docs/ops.md the op table). Models, FSDP, DDP and
// the optimizers touch tensor data only through these functions.
//
// Common contract of every op:
// - ctx.device and ctx.alloc must be set; tensors must be defined and on a
//   device of ctx.device's kind (Copy may have one host side). Violations,
//   shape or dtype mismatches return InvalidArgument naming the op and the
//   operand ("layer_norm_fwd: gamma has 7 elements, x rows have 8"), and
//   nothing is written. No device kind registered: Unavailable.
// - "Accumulates" means the op adds into its output (+=); other outputs are
//   overwritten. Unless an op says so, outputs must not overlap inputs.
// - Float tensors are f32 unless an op says it accepts bf16/f16; arithmetic
//   is f32 (reductions that say so: f64); 16-bit results round to nearest
//   even, once, when stored. Token ids and targets are i32 tensors;
//   accumulators for values the host reads (grad-norm partials) are f64
//   tensors of one element.
// - "Compute-dtype operands": the activation-shaped operands of the model ops
//   (bias, GELU, LayerNorm, attention, embedding, cross-entropy) may each be
//   f32, bf16 or f16, independently unless the op says otherwise; the op
//   reads them exactly, computes in f32 and rounds each 16-bit output once.
//   LayerNorm statistics, attention probabilities, the loss and the
//   embedding table's gradient stay f32. An in-place pair (y may be x) must
//   then have one dtype. Backends without 16-bit kernels for an op run it on
//   exact f32 copies made by the dispatcher (dispatch.h: F32Staging); backends
//   with them (OpBackend::Native16Bit; CUDA) read and round the same way, so
//   every backend gives the same numbers up to f32 summation order -- except
//   attention on 16-bit operands, which a backend may run on 16-bit GEMM
//   operands (see AttentionForward).
// - Shapes: ops read only element counts, never ranks, except where a
//   parameter says which dimension it uses; a [rows, cols] operand is any
//   tensor of rows * cols elements.
// - On CPU the op has run when the function returns; elsewhere it is ordered
//   on ctx.stream. Values the host needs go through ReadScalar.
//
// Thread safety: ops may be called concurrently from several threads on
// disjoint outputs; each thread must be the one that plays its ctx.stream.
#ifndef SHARDKIT_RUNTIME_OPS_OPS_H_
#define SHARDKIT_RUNTIME_OPS_OPS_H_

#include <cstdint>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/backend.h"

namespace sk::ops {

// The OpContext for host memory on cpu:0 (HostAllocator::Default(), no
// stream: the calling thread). For tests and tools.
OpContext HostContext();

// ---- GEMM -----------------------------------------------------------------

// C = alpha op(A) op(B) + beta C over p.batch matrices (backend.h: GemmParams,
// MatrixRef). A and B: f32, bf16 or f16, the same dtype; the products are
// accumulated in f32 (with beta C read exactly). C: f32, or A's dtype, then
// the f32 result is rounded once (nearest even) when stored: PyTorch's
// autocast matmul with cuBLAS's CUBLAS_COMPUTE_32F. beta == 0 overwrites C
// without reading it. C must not overlap A or B. Every matrix must fit its
// tensor. m, n or k may be 0 (k == 0: C = beta C).
Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
            const MatrixRef& c);

// C = alpha op(A) op(B) + bias, bias [n] (any float dtype) in every row of C:
// a linear layer's forward. The numbers are those of BroadcastRows(bias, C)
// followed by Gemm with beta = 1 up to f32 summation order (the bias rounded
// to C's dtype is one more term of the f32 sum, C rounded once), which is
// what runs on a backend that does not add the bias inside its GEMM
// (OpBackend::GemmAddsBias); one that does (cpu, bf16 on bf16 hardware)
// writes C once. Requires p.beta == 0, p.batch == 1, C's rows contiguous
// (c.ld == n) and bias.numel() == n, not overlapping C.
Status GemmBias(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                const Tensor& bias, const MatrixRef& c);

// C = alpha op(A) op(B) + bias + residual, bias [n] in every row and
// residual [m, n] (any float dtypes, m * n elements, rows contiguous as C's):
// a linear layer's forward followed by a residual connection. The numbers
// are those of GemmBias into an f32 [m, n], Axpy(1, residual) onto it and,
// for a 16-bit C, one rounding into C (with an f32 C: GemmBias into C, then
// the Axpy), which is what runs on a backend that does not fuse them
// (OpBackend::GemmAddsResidual); one that does (cuda: a cuBLASLt epilogue,
// docs/cuda.md) reads the residual as its GEMM's beta = 1 term and writes C
// once, the same numbers up to f32 summation order. Requires what GemmBias
// requires; residual must not overlap C.
Status GemmBiasResidual(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                        const MatrixRef& b, const Tensor& bias, const Tensor& residual,
                        const MatrixRef& c);

// pre = alpha op(A) op(B) + bias and out = gelu_tanh(pre): a linear layer
// and its GELU (a transformer MLP's first half), keeping GELU's input for
// backward. pre and out: m * n elements each, rows contiguous (as C's in
// GemmBias), compute-dtype operands; neither may overlap the other or an
// input. Requires what GemmBias requires. The numbers are those of GemmBias
// into pre followed by GeluForward(pre, out), which is what runs on a
// backend that does not fuse them (OpBackend::GemmFusesGelu); one that does
// (cuda with SK_CUDA_FUSED_EPILOGUES=1: cuBLASLt's GELU_AUX_BIAS epilogue,
// docs/cuda.md) writes pre and out from one f32 value each rounded once,
// so a 16-bit out is GELU of the unrounded pre: it may differ from the
// composed result by GELU's slope (at most 1.13) times pre's rounding.
Status GemmBiasGelu(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                    const MatrixRef& b, const Tensor& bias, const Tensor& pre, const Tensor& out);

// C = (alpha op(A) op(B)) * gelu_tanh'(pre) elementwise, pre [m, n] (m * n
// elements, any float dtype): the gradient at GELU's input from the one at
// the next layer's output (dy W^T), the backward of GemmBiasGelu's GELU.
// Requires p.beta == 0, p.batch == 1 and C's rows contiguous (c.ld == n);
// pre must not overlap C. The numbers are those of Gemm into C followed by
// GeluBackward(pre, C, C) (a 16-bit C rounded after each), which is what
// runs where OpBackend::GemmFusesGelu is false; where it is true (cuda,
// cuBLASLt's DGELU epilogue) the product is scaled in f32 and C rounded
// once.
Status GemmGeluBackward(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                        const MatrixRef& b, const Tensor& pre, const MatrixRef& c);

// ---- Data movement ----------------------------------------------------------

// dst = src, same dtype and element count. One side may be host memory (cpu)
// while ctx is another kind: the host<->device copy of token ids and
// checkpoints. Offsets into flat buffers: pass Tensor::View()s.
Status Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst);

// dst = src converted between f32, bf16 and f16 (round to nearest even;
// same dtype: a copy). Equal element counts.
Status Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst);

// x (f32) = x rounded to the nearest value of `t` (f32: unchanged; bf16/f16:
// nearest even, f16 overflowing to infinity): emulates 16-bit storage of an
// f32 activation.
Status RoundToDType(const OpContext& ctx, const Tensor& x, DType t);

// x *= alpha (x f32, bf16 or f16; computed in f32, rounded back).
Status Scale(const OpContext& ctx, const Tensor& x, float alpha);

// y += alpha * x, computed in f32 and rounded into y's dtype; x and y may
// have different dtypes among f32/bf16/f16 (accumulating an f32 gradient into
// a bf16 buffer). Equal element counts; x may not overlap y unless equal.
Status Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y);

// Every element of x = value (rounded to x's dtype; f32/bf16/f16).
Status Fill(const OpContext& ctx, const Tensor& x, float value);

// out (f32/bf16/f16) = elements [begin, begin + out.numel()) of the parameter
// `param_id` under `seed` as `init` draws them (init.h: counter-based Philox,
// so any slice can be initialised alone, bit-identical to a full init).
// InvalidArgument for an invalid initializer or begin < 0.
Status InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed,
                  uint64_t param_id, int64_t begin, const Tensor& out);

// ---- Bias -------------------------------------------------------------------

// dst [rows, cols] = src [cols] in every row (cols = src.numel(); the bias of
// a linear layer written before a beta = 1 GEMM adds the product). Any
// float dtypes (compute-dtype operands).
Status BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst);

// y [rows, cols] += bias [cols] in every row (cols = bias.numel()); any
// float dtypes.
Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y);

// dbias [cols] += the column sums of dy [rows, cols], in an order fixed by
// the backend and the shape (deterministic; CPU: row by row; CUDA: chunks of
// rows, docs/cuda.md). Accumulates. Any float dtypes (dbias normally f32).
Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias);

// ---- Activations and normalisation -----------------------------------------

// y = gelu_tanh(x) elementwise; y may be x. Compute-dtype operands.
Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y);
// dx = dy * gelu_tanh'(x), overwritten; dx may be dy. Compute-dtype operands.
Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);

// Per row of x [rows, cols] (cols = gamma.numel(), rows = x.numel() / cols):
// y = (x - mean) * rstd * gamma + beta, with the row's mean and
// rstd = 1/sqrt(var + 1e-5) stored in mean [rows] and rstd [rows] (f32).
// x, gamma, beta, y: compute-dtype operands.
Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd);
// Accumulates the input gradient into dx and the parameter gradients into
// dgamma and dbeta, from dy and forward's mean/rstd (f32). The others:
// compute-dtype operands (a 16-bit dx is read, added to and rounded once).
Status LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                         const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta);

// ---- Llama-family ops: RMSNorm, rotary embeddings, SwiGLU --------------------

// Per row of x [rows, cols] (cols = gamma.numel()): y = x rstd gamma with
// rstd = 1/sqrt(mean(x^2) + eps) stored in rstd [rows] (f32): Llama's
// RMSNorm (no mean, no bias). eps > 0 (Llama 1e-5, Qwen2 1e-6). x, gamma, y:
// compute-dtype operands; y may not overlap x.
Status RmsNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, float eps,
                      const Tensor& y, const Tensor& rstd);
// Accumulates the input gradient into dx and gamma's into dgamma from dy and
// forward's rstd (f32). Compute-dtype operands otherwise (a 16-bit dx is read,
// added to and rounded once).
Status RmsNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                       const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dgamma);

// Rotary position embedding (Su et al. 2021) in Hugging Face's rotate-half
// layout: x is [batch * seq_len, heads * head_dim] (head_dim even), a row's
// position is positions[row] where `positions` is defined (i32, one per row,
// on the op's device: packed documents restart at 0; any int32 value is
// taken as given) and row % seq_len otherwise, and in every head element
// i < head_dim / 2 and
// element i + head_dim / 2 turn by pos * inv_freq_i, inv_freq_i =
// theta^(-2i / head_dim) rescaled by `scaling` (rope_scaling.h; math.h:
// RopeInvFreq, f32 as transformers computes it). y may be x (same dtype).
// Compute-dtype operands. seq_len, heads > 0; theta > 0; `scaling` as
// ValidateRopeScaling accepts.
Status RopeForward(const OpContext& ctx, const Tensor& x, int64_t seq_len, int64_t heads,
                   int64_t head_dim, float theta, const RopeScaling& scaling, const Tensor& y,
                   const Tensor& positions = Tensor());
// dx = the rotation of dy by minus the angle (the transpose of forward's),
// overwritten; dx may be dy (same dtype).
Status RopeBackward(const OpContext& ctx, const Tensor& dy, int64_t seq_len, int64_t heads,
                    int64_t head_dim, float theta, const RopeScaling& scaling, const Tensor& dx,
                    const Tensor& positions = Tensor());
// OK, or InvalidArgument naming the field: an unknown type, a factor that is
// not a positive finite number (linear, llama3), llama3's low_freq_factor
// not positive, high_freq_factor not above it, original_max_positions not
// positive. The check the Rope ops make; model configurations call it too.
Status ValidateRopeScaling(const RopeScaling& scaling);

// y = silu(gate) * up elementwise (Shazeer 2020's SwiGLU, Llama's MLP);
// equal element counts; y may not overlap gate or up. Compute-dtype operands.
Status SwiGluForward(const OpContext& ctx, const Tensor& gate, const Tensor& up, const Tensor& y);
// dgate = dy up silu'(gate), dup = dy silu(gate), overwritten; neither may
// overlap an input or the other. Compute-dtype operands.
Status SwiGluBackward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                      const Tensor& dy, const Tensor& dgate, const Tensor& dup);

// ---- Attention --------------------------------------------------------------

// Scaled dot-product attention (backend.h: AttentionShape; s.kv_heads must
// be 0 or heads: grouped-query attention is FlashAttentionForward's). q, k, v, out are
// views with their own row strides (rows: batch*q_len for q/out, batch*kv_len
// for k/v; heads*head_dim columns). Writes probs [batch, heads, q_len,
// kv_len] (f32, kept for backward; masked entries 0) and out. head_dim > 0.
// q, k, v, out (and backward's dout, dq, dk, dv): compute-dtype operands.
// When they all share one 16-bit dtype, a backend may round the
// probabilities to it before P V and P^T dO, and the score gradients before
// dS K and dS^T Q, as tensor-core attention does (the CUDA backend:
// cuda_backend.h); scores, the softmax, probs and dP stay f32. Each such
// rounding moves a result by at most the unit roundoff times the sum of its
// terms' magnitudes (//tests/ops:conformance_test bounds it). The CPU
// backend rounds P (not the score gradients) in bf16 where the CPU has
// AVX512-BF16 (its bf16 dot-product kernels: runtime/ops/cpu/kernels.h);
// otherwise, and for f16, it computes 16-bit attention in f32 and rounds
// only the outputs.
Status AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                        const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                        const MatrixRef& out);
// Overwrites dq, dk, dv from dout and forward's probs. Takes a workspace of
// AttentionBackwardScratchElements(s) f32 from ctx.alloc for the call's
// duration (one sequence's score gradients, as a GPU kernel needs them), on
// every device kind alike.
int64_t AttentionBackwardScratchElements(const AttentionShape& s);
Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                         const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                         const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                         const MatrixRef& dv);

// ---- Attention in linear memory (FlashAttention-2) ---------------------------

// Scaled dot-product attention that keeps no probabilities, with grouped
// query heads when s.kv_heads says so (backend.h: AttentionShape; k, v, dk,
// dv then have kv_heads * head_dim columns, and dk, dv sum the gradients
// of a group's query heads): the shapes, views, masking and operand dtypes
// of AttentionForward (one 16-bit dtype
// for q, k, v, out lets a backend run on 16-bit GEMM operands, rounding P
// and dS as there; other mixes are staged through f32). Writes out and
// lse [batch, heads, q_len] (f32), lse[b, h, i] = log sum_j exp(scale
// q_i . k_j) over the keys query i attends (natural log, scale =
// 1/sqrt(head_dim)): what backward needs to recompute the probabilities.
// Memory is linear in the sequence length: no [q_len, kv_len] tensor is
// allocated (cpu: blocks of queries and keys with a running max and sum
// per row; cuda: cuDNN's fused SDPA where it supports the call, else the
// composed attention with a temporary of the probabilities, logged once:
// cuda_backend.h). lse must not overlap an input.
Status FlashAttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                             const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                             const Tensor& lse);
// Whether ctx's backend runs the op on `s` in dtype t (every operand t,
// 16-byte aligned rows) as a fused kernel at least as fast as its composed
// attention (OpBackend::PrefersFlashAttention: cuda where cuDNN's SDPA
// takes it, cpu and sim from kCpuFlashAttentionMinKeys keys): what a model
// asks before choosing it over AttentionForward. False when ctx has no
// backend.
bool PrefersFlashAttention(const OpContext& ctx, const AttentionShape& s, DType t);
// The same answer for a device kind, without a context: what a memory
// estimate asks so that it counts the attention a run on that kind will
// choose (the context form is this one of ctx's device kind). A kind with
// no registered backend: the simulator's rule for kSim
// (CpuPrefersFlashAttention; its backend registers on first use), false
// for the others (nothing runs there).
bool PrefersFlashAttention(DeviceKind kind, const AttentionShape& s, DType t);
// The backward's workspace in f32 elements, taken from ctx.alloc by the
// dispatcher for the call on every device kind (so the simulator counts
// it): delta [batch, heads, q_len] = rowsum(dO o O) and an f32 dQ
// accumulator [batch, heads, q_len, head_dim], as FlashAttention-2 and
// cuDNN's SDPA backward use them.
int64_t FlashAttentionBackwardWorkspaceElements(const AttentionShape& s);
// What the CUDA backend's linear-memory attention allocates, beside the
// buffers above, for a call it runs as the composed attention (packed
// documents always: cuDNN's SDPA has no block-diagonal mask; other calls
// where SdpaSupports or cuDNN declines), freed when the call returns, in
// bytes. Forward: the f32 probabilities [batch, heads, q_len, kv_len],
// their copy in t for 16-bit t, and with grouped heads k and v repeated per
// query head. Backward: the probabilities recomputed (f32), one sequence's
// f32 score gradients (AttentionBackwardScratchElements), a group's
// (ComposedAttentionBackwardGroup sequences) when the group holds several,
// for 16-bit t the group's dS and P in t, and with grouped heads k, v, dk
// and dv repeated. cuBLAS's own workspace is not counted. The count of
// cuda/backend_attention.cc's allocations, for the memory estimate; tests/ops holds it.
struct ComposedAttentionBytes {
  int64_t forward = 0;
  int64_t backward = 0;
  int64_t peak() const { return forward > backward ? forward : backward; }
};
ComposedAttentionBytes ComposedAttentionTemporaryBytes(const AttentionShape& s, DType t);
// Sequences per batched GEMM of the composed backward (CUDA's BackwardGroup,
// cuda/backend_attention.cc, the same rule): as many as
// keep the group's f32 score gradients within 2^26 elements (256 MiB; with
// 16-bit operands as much again for their rounded dS and P), at least one.
int64_t ComposedAttentionBackwardGroup(const AttentionShape& s);

// Overwrites dq, dk, dv from forward's out and lse (and q, k, v, dout),
// recomputing the probabilities block by block.
Status FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                              const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                              const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                              const MatrixRef& dk, const MatrixRef& dv);

// ---- Embedding and loss -----------------------------------------------------

// out [count, dim] = rows ids[i] of table [vocab, dim] (table rank 2; ids i32
// with count elements, each in [0, vocab): not checked on the device, the
// caller validates ids before copying them there). table and out: any float
// dtypes (a row of a 16-bit table is exact in an f32 out).
Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                        const Tensor& out);
// dtable[ids[i], :] += dout[i, :], in order of i. Accumulates. dout: any
// float dtype; dtable: f32.
Status EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout,
                         const Tensor& dtable);

// loss (f32, one element) = the mean over rows whose target is not
// kIgnoreTarget of -log softmax(logits[row])[target]; 0 when no row counts.
// logits [rows, vocab] (any float dtype, read exactly) with rows =
// targets.numel() (i32). Summed in f64; loss f32.
Status CrossEntropyForward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                           const Tensor& loss);
// dlogits = (softmax(logits) - onehot(target)) / count per counted row, 0 on
// ignored rows (count: rows that count); the gradient of the mean loss.
// With scale > 0 the factor per counted row is `scale` instead of 1 /
// count: the gradient of (sum of the rows' losses) x scale, the form a
// loss normalised over several batches and ranks takes (runtime/train:
// loss_normalization.h). scale must be finite and >= 0 (0: 1 / count).
// dlogits may be logits (computed in place, then of one dtype); a 16-bit
// dlogits is rounded once.
Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                            const Tensor& dlogits, float scale = 0.0f);
// The forward above in two parts, so that a loss over many rows can be
// computed a chunk of rows at a time (ops/classifier.h) with the same bits:
// row_loss (f32, one per row) = -log softmax(logits[row])[target], 0 on
// rows whose target is kIgnoreTarget (logits [rows, vocab], any float
// dtype, read exactly); its declared cost is cross_entropy_fwd's, whose
// kernel it is.
Status CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                             const Tensor& row_loss);
// loss (f32, one element) = the mean of row_loss over the rows whose target
// is not kIgnoreTarget (summed as CrossEntropyForward sums: the backend's
// order, f64), 0 when none counts. CrossEntropyRowLosses then this gives
// CrossEntropyForward's loss bit for bit on every backend.
Status CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss, const Tensor& targets,
                        const Tensor& loss);

// ---- Reductions (grad-norm partials) ----------------------------------------

// acc (f64, one element) += sum of x^2 over x (f32/bf16/f16), summed in f64
// in element order.
Status SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc);
// acc (f64, one element) = max(acc, max |x|).
Status MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc);

// ---- Fused optimizer updates over a flat shard ------------------------------

// One SGD step per element (update_rules.h) on param (f32) from grad (f32);
// momentum (f32, same count) is required when h.momentum != 0 and ignored
// (may be undefined) otherwise.
Status SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param, const Tensor& grad,
                 const Tensor& momentum);
// One Adam (h.decoupled: AdamW) step per element on param, exp_avg and
// exp_avg_sq (all f32, equal counts) from grad (f32).
Status AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param,
                  const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq);

// ---- Reading values back ----------------------------------------------------

// The value of a one-element tensor (f32, bf16, f16, f64 or i32) on the host.
// cpu: read at once; cuda: synchronises ctx.stream and copies; sim: NaN
// (callers label such values as simulated).
StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t);

// The values of a tensor of 1 to kMaxReadValues elements (ReadScalar's
// dtypes) on the host, in element order, with one synchronisation and one
// copy: what a host needs of a few values per rank (FSDP's gradient-norm
// partials of a shard group) without a round trip per value. cpu: read at
// once; cuda: synchronises ctx.stream and copies; sim: NaNs, timed as one
// read of numel elements.
inline constexpr int64_t kMaxReadValues = int64_t{1} << 24;
StatusOr<std::vector<double>> ReadValues(const OpContext& ctx, const Tensor& t);

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_OPS_H_
