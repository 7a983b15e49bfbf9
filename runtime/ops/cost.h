// The cost every op declares: floating-point operations and bytes moved, as a
// function of the op's shapes and dtypes only.
//
// The dispatcher (the *_ops.cc files over dispatch.h) computes an OpCost
// ONCE per op call, with the cost functions below, and hands it to the
// backend's Account() before the backend runs the op. Backends never
// compute costs: the simulator prices ops from these numbers,
// //benchmarks:kernels reports achieved FLOP/s and bytes/s from them, and a
// CPU or CUDA backend may count or trace them.
//
// Conventions (docs/ops.md has the table):
// - A multiply-add counts 2 flops. Transcendentals (exp, tanh, sqrt, log)
//   count 1 each; the per-element constants below say what each op counts.
// - bytes_read / bytes_written count every element the op reads / writes once,
//   at its dtype's size: an accumulate (y += x) reads and writes y. Caches
//   are not modelled.
// - GEMM also fills m, n, k, batch and dtype (the A/B input dtype), so a
//   backend can price tensor-core rates and tile quantisation.
//
// Thread safety: every function is pure.
#ifndef SHARDKIT_RUNTIME_OPS_COST_H_
#define SHARDKIT_RUNTIME_OPS_COST_H_

#include <cstdint>
#include <string_view>

#include "runtime/core/dtype.h"

namespace sk::ops {

enum class OpClass : uint8_t {
  kGemm,
  kElementwise,
  kReduction,
  kNormalization,
  kAttention,
  kEmbedding,
  kLoss,
  kCopy,
  kOptimizer,
  kInit,
  kOther,
};

// "gemm", "elementwise", ...
std::string_view OpClassName(OpClass c);

struct OpCost {
  const char* name = "";      // static string: "gemm", "layer_norm_fwd", "adamw_update", ...
  OpClass cls = OpClass::kOther;
  double flops = 0;           // floating-point operations (a multiply-add counts 2)
  double bytes_read = 0;      // bytes the op reads from device memory
  double bytes_written = 0;   // bytes it writes
  // GEMM: per-matrix dims and batch count. Fused attention
  // (flash_attention_fwd/bwd): m = queries, n = keys per query (causal: on
  // average, rounded up), k = head_dim, batch = sequences x heads.
  int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::kF32;  // input dtype (GEMM: the A/B dtype; selects tensor-core rates)
  // Fused attention over packed documents (masked_pairs > 0): what the
  // CUDA backend runs for such a call instead, the composed attention
  // (cuDNN's SDPA has no block-diagonal mask): every one of the batch x
  // heads x q_len x kv_len score pairs through batched cuBLAS GEMMs, and
  // the f32 probabilities written and read between its kernels
  // (composed_kernels launches). 0 otherwise. A simulator profile of a
  // CUDA GPU prices these, not the masked pairs (sim_ops.cc).
  double composed_flops = 0;
  double composed_bytes = 0;
  int composed_kernels = 0;
};

// Per-element flop counts of the elementwise ops (see each op in ops.h).
inline constexpr double kGeluForwardFlops = 14;   // x^3, polynomial, tanh via exp, 0.5 x (1 + t)
inline constexpr double kGeluBackwardFlops = 24;  // forward's tanh, its derivative, the product
inline constexpr double kLayerNormForwardFlops = 8;   // mean, variance, normalise, affine
inline constexpr double kLayerNormBackwardFlops = 14; // xhat, two row sums, dx, dgamma, dbeta
inline constexpr double kSoftmaxFlops = 5;            // max, exp, sum, scale (per score)
inline constexpr double kSoftmaxBackwardFlops = 4;    // row dot, difference, two products
inline constexpr double kCrossEntropyFlops = 4;       // max, exp, sum (+ log per row)
inline constexpr double kRmsNormForwardFlops = 4;    // square-sum, normalise, scale
inline constexpr double kRmsNormBackwardFlops = 8;   // xhat, row sum, dx, dgamma
inline constexpr double kRopeFlops = 6;              // per element: its angle's cos/sin share, 2 products, a sum
inline constexpr double kSwiGluForwardFlops = 5;     // sigmoid (exp, add, divide), two products
inline constexpr double kSwiGluBackwardFlops = 10;   // sigmoid, silu', four products
inline constexpr double kSgdFlops = 6;   // decay, momentum, Nesterov, step
inline constexpr double kAdamFlops = 16; // decay, two moments, sqrt, divide, step

// The cost functions, one per op (ops.h says what each op does). Sizes are
// element counts; `ab`/`x`/`y` name the dtypes of the operands.

// C[batch][m, n] = alpha op(A) op(B) + beta C: 2 m n k flops per matrix; A and
// B read once at `ab`'s size, C written at `c`'s size (f32, or `ab` when the
// product is stored rounded), and read too when beta != 0.
OpCost GemmCost(int64_t m, int64_t n, int64_t k, int64_t batch, DType ab, bool reads_c,
                DType c = DType::kF32);
OpCost CopyCost(int64_t n, DType t);
OpCost CastCost(int64_t n, DType from, DType to);
OpCost RoundToDTypeCost(int64_t n);
OpCost ScaleCost(int64_t n, DType t);
OpCost AxpyCost(int64_t n, DType x, DType y);
OpCost FillCost(int64_t n, DType t);
OpCost InitCost(int64_t n, DType t);
// The activation-shaped operands ([rows, cols], x, y, dy, dx, q/k/v/out,
// logits) are counted at the dtypes given (f32 by default); the small ones
// (bias, gamma, beta, mean, rstd, probs, loss, parameter gradients) at f32.
OpCost BroadcastRowsCost(int64_t rows, int64_t cols, DType dst = DType::kF32);
OpCost BiasAddCost(int64_t rows, int64_t cols, DType y = DType::kF32);
OpCost BiasGradCost(int64_t rows, int64_t cols, DType dy = DType::kF32);
OpCost GeluForwardCost(int64_t n, DType x = DType::kF32, DType y = DType::kF32);
OpCost GeluBackwardCost(int64_t n, DType x = DType::kF32, DType dx = DType::kF32);
OpCost LayerNormForwardCost(int64_t rows, int64_t cols, DType x = DType::kF32,
                            DType y = DType::kF32);
OpCost LayerNormBackwardCost(int64_t rows, int64_t cols, DType x = DType::kF32,
                             DType dx = DType::kF32);
// Per head and sequence: two GEMMs forward (scores, values), four backward.
// q, k, v, out and their gradients in `t`; probs f32.
OpCost AttentionForwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                            int64_t head_dim, DType t = DType::kF32);
OpCost AttentionBackwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                             int64_t head_dim, DType t = DType::kF32);
// Attention in linear memory (ops.h: FlashAttentionForward/Backward). Only
// the score pairs a query attends count (causal: q_len (q_len + 1) / 2 per
// head; the kernels skip masked blocks). Forward: S = Q K^T and P V (2
// GEMMs) and the online softmax; reads q, k, v (t), writes out (t) and lse
// (f32). Backward recomputes S and P from q, k and lse, then dP = dO V^T,
// dV = P^T dO, dQ = dS K, dK = dS^T Q (5 GEMMs); reads q, k, v, out, dout
// (t) and lse, writes dq, dk, dv (t); its f32 workspace (ops.h) is
// written and read once. masked_pairs > 0: packed documents
// (backend.h: AttentionShape::key_start), whose block-diagonal causal mask
// leaves that many pairs per head over the batch: those count instead.
double FlashAttentionScorePairs(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                                bool causal, int64_t masked_pairs = 0);
// kv_heads (0: heads) sizes k and v (grouped-query attention); the flops
// are the query heads'.
OpCost FlashAttentionForwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                                 int64_t head_dim, bool causal, DType t = DType::kF32,
                                 int64_t kv_heads = 0, int64_t masked_pairs = 0);
OpCost FlashAttentionBackwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                                  int64_t head_dim, bool causal, DType t = DType::kF32,
                                  int64_t kv_heads = 0, int64_t masked_pairs = 0);
// RMSNorm over rows x cols (rstd f32); RoPE over n elements ("rope_fwd" or
// "rope_bwd"); SwiGLU over n outputs (gate and up read, y written; backward
// writes dgate and dup).
OpCost RmsNormForwardCost(int64_t rows, int64_t cols, DType x = DType::kF32, DType y = DType::kF32);
OpCost RmsNormBackwardCost(int64_t rows, int64_t cols, DType x = DType::kF32,
                           DType dx = DType::kF32);
OpCost RopeCost(int64_t n, DType x, DType y, bool backward);
OpCost SwiGluForwardCost(int64_t n, DType x = DType::kF32, DType y = DType::kF32);
OpCost SwiGluBackwardCost(int64_t n, DType x = DType::kF32, DType dx = DType::kF32);
OpCost EmbeddingForwardCost(int64_t count, int64_t dim, DType table = DType::kF32,
                            DType out = DType::kF32);
OpCost EmbeddingBackwardCost(int64_t count, int64_t dim, DType dout = DType::kF32);
OpCost CrossEntropyForwardCost(int64_t rows, int64_t vocab, DType logits = DType::kF32);
OpCost CrossEntropyBackwardCost(int64_t rows, int64_t vocab, DType logits = DType::kF32,
                                DType dlogits = DType::kF32);
// CrossEntropyRowLosses: named cross_entropy_fwd (the forward's kernel, whose
// measured efficiency the profiles carry), writing a loss per row.
OpCost CrossEntropyRowLossesCost(int64_t rows, int64_t vocab, DType logits = DType::kF32);
// CrossEntropyMean over `rows` row losses.
OpCost CrossEntropyMeanCost(int64_t rows);
OpCost SumOfSquaresCost(int64_t n, DType t);
OpCost MaxAbsCost(int64_t n, DType t);
OpCost SgdUpdateCost(int64_t n, bool has_momentum);
// name "adam_update" or "adamw_update" (decoupled weight decay).
OpCost AdamUpdateCost(int64_t n, bool decoupled);
OpCost ReadScalarCost(DType t);
// "read_values": n elements of t to the host.
OpCost ReadValuesCost(DType t, int64_t n);

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_COST_H_
