// The CPU backend's kernels, forward and backward, on f32 buffers: what the
// CPU op backend (backend_*.cc) runs. Defined by family: the GEMMs and the
// linear layer in gemm.cc, the composed attention in attention.cc, the rest
// in kernels.cc. Internal to runtime/ops: everything else calls ops
// (runtime/ops/ops.h).
//
// Layout: activations are row-major matrices of `rows` x `cols` floats, where
// a row is one token (rows = batch * sequence length). A Linear layer's weight
// is stored [in, out] (y = x W + b), as GPT-2 stores it, so both passes are
// plain row-major GEMMs without transposed copies.
//
// Contracts: the caller (the op dispatcher, through the CPU backend) owns
// shape checking and passes consistent sizes; a mismatch here is a bug inside
// shardkit and CHECKs.
// Backward functions ACCUMULATE into parameter gradients (+=) so that FSDP's
// unsharded gradient buffers and gradient accumulation work unchanged; input
// gradients are documented per function. Every function is thread-compatible
// (no shared state besides the BLAS library's own thread pool and LIBXSMM's
// thread-safe cache of generated kernels).
#ifndef SHARDKIT_RUNTIME_OPS_CPU_KERNELS_H_
#define SHARDKIT_RUNTIME_OPS_CPU_KERNELS_H_

#include <cstdint>
#include <string_view>

#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/ops/backend.h"

namespace sk {

// The BLAS libraries a GEMM can go to. Chosen by measurement (see
// benchmarks/micro/kernels.cc and runtime/nn/RESULTS.md); kDefault is the choice.
enum class GemmBackend : uint8_t {
  kDefault = 0,
  kOpenBlas = 1,
  kOneDnn = 2,
};

std::string_view GemmBackendName(GemmBackend b);

// The backend kDefault resolves to.
GemmBackend DefaultGemmBackend();

// Sets how many threads a GEMM issued from the calling thread may use:
// oneDNN's OpenMP team of this thread (an OpenMP setting of the calling
// thread) and OpenBLAS's pool (process-wide). InvalidArgument unless n >= 1.
//
// Runtimes that run several ranks as threads of one process (the local
// backend) should give each rank thread n = cores / ranks: idle OpenMP
// workers spin, and oversubscribed teams spin against each other. On our
// 2-core machine under a load average of ~9 from other processes, a gpt-10m
// step took 27.6 s wall with 2 GEMM threads against 2.0 s with 1.
Status SetGemmThreads(int n);

// The thread count GEMMs from the calling thread use now (OpenMP's view).
int GemmThreads();

// C = alpha op(A) op(B) + beta C, row-major, op = transpose when the flag is
// set. op(A) is m x k, op(B) is k x n, C is m x n; ld* are row strides.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, GemmBackend backend = GemmBackend::kDefault);

// C = op(A) op(B), or C += op(A) op(B) when accumulate, with A and B in bf16
// and the products accumulated and stored in f32: oneDNN's matmul, which
// uses the CPU's AVX512-BF16 (or AMX) instructions where it has them. Same
// row-major conventions as Gemm. The f32 Gemm of bf16-valued inputs gives
// the same numbers up to summation order (the CPU backend's choice between
// the two: NativeBf16Gemm below).
// Primitives are cached per shape and take the calling thread's scratchpad
// (oneDNN's user scratchpad mode): safe to call from several threads at once.
// Without such hardware (Bf16GemmHardware() false: oneDNN then has no bf16
// matmul) the operands are widened and the f32 Gemm runs instead.
void GemmBF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
              int64_t lda, const BF16* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);
// The same with C in bf16: products accumulated in f32 (C widened and added
// when accumulating), rounded once to bf16 as oneDNN stores C, so a
// bf16 result needs no f32 copy of C in memory. oneDNN rounds to nearest
// even; on bf16 hardware its conversion flushes subnormal results
// (|x| < 2^-126) to zero, where simd::NarrowToBf16 keeps them.
void GemmBF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
              int64_t lda, const BF16* b, int64_t ldb, bool accumulate, BF16* c, int64_t ldc);

// C = op(A) op(B) + bias (bias: n values, added to every row), all bf16:
// the bias joins the f32 accumulation and the sum is rounded once (oneDNN's
// matmul bias, so C is written once: a linear layer's forward). The bits
// are those of writing the bias into C and accumulating with GemmBF16 where
// oneDNN does not block the sum over k; where it does (k >= 1024 here) the
// bias joins the sum at another point: the same up to f32 summation order.
void GemmBF16Bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
                  int64_t lda, const BF16* b, int64_t ldb, const BF16* bias, BF16* c, int64_t ldc);
// The same with C in f32 (the bias widened exactly, nothing rounded but
// the f32 sum): a 16-bit linear layer whose f32 output meets a residual.
void GemmBF16Bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
                  int64_t lda, const BF16* b, int64_t ldb, const BF16* bias, float* c,
                  int64_t ldc);

// True when oneDNN runs bf16 GEMMs on bf16 dot-product hardware here
// (avx512_core_bf16 or AMX, as oneDNN detects it at run time; DNNL_MAX_CPU_ISA
// can lower it): GemmBF16 and GemmBF16Bias then run oneDNN's bf16 matmul.
// Without it oneDNN's bf16 matmul converts in software and was ~4x slower
// per CPU-second than the f32 GEMM on our AVX-512 machine without
// avx512_bf16 (benchmarks/micro/kernels.cc, BM_GemmBF16 vs BM_Gemm), so
// they widen the operands and run Gemm instead. Thread-safe.
bool Bf16GemmHardware();

// True when the CPU backend sends bf16 GEMMs (and bf16 linear layers with
// a bias) to oneDNN's bf16 matmul (GemmBF16); false: it widens the bf16
// operands exactly into f32 blocks and runs the f32 Gemm, rounding C once
// (the same numbers up to f32 summation order). By default true where
// Bf16GemmHardware() holds and the bf16 matmul is the faster one: with AMX,
// or on a CPU that is not Intel's (AMD's Zen 4 runs vdpbf16ps at its f32
// FMA's rate; issue 45 measured bf16 steps 1.33-1.47x faster than f32
// there). Intel's avx512_bf16 without AMX (Cooper Lake; Sapphire and
// Emerald Rapids where a hypervisor hides AMX) issues vdpbf16ps at half the
// f32 FMA's rate: on such a machine (Xeon family 6 model 207 under KVM)
// the llama-10m step's bf16 GEMMs ran at 74 GFLOP per CPU-second in
// oneDNN's bf16 matmul against 127 for the f32 GEMM (step_breakdown), so
// the backend widens there. Decided from the CPU's identity (never a
// timing): every run and rank takes the same path. Thread-safe.
bool NativeBf16Gemm();
// Overrides NativeBf16Gemm's default for the process (on: oneDNN's bf16
// matmul where Bf16GemmHardware(); off: widened) and returns the previous
// value: for A/B benchmarks and tests of both paths. Not to be called
// while GEMMs run.
bool SetNativeBf16Gemm(bool on);

// y[rows, out] = x[rows, in] w[in, out] + bias[out] (bias may be null).
void LinearForward(const float* x, const float* w, const float* bias, int64_t rows, int64_t in,
                   int64_t out, float* y);

// Given dy[rows, out]: dw += x^T dy, dbias += column sums of dy (dbias may be
// null), and dx = dy w^T, overwritten when accumulate_dx is false and added
// otherwise (dx may be null when the input needs no gradient).
void LinearBackward(const float* x, const float* w, const float* dy, int64_t rows, int64_t in,
                    int64_t out, float* dx, bool accumulate_dx, float* dw, float* dbias);

// Per-row LayerNorm with affine gamma/beta; mean and rstd are [rows].
void LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                      int64_t cols, float* y, float* mean, float* rstd);

// dx += LayerNorm input gradient; dgamma, dbeta += parameter gradients.
void LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                       const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                       float* dbeta);

// y = gelu_tanh(x) elementwise (y may alias x).
void GeluForward(const float* x, int64_t n, float* y);
// dx = dy * gelu_tanh'(x), overwritten (dx may alias dy).
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx);

// Row softmax of x[rows, cols] into y (may alias x).
void SoftmaxForward(const float* x, int64_t rows, int64_t cols, float* y);
// dx = softmax input gradient from y = softmax(x) and dy, overwritten.
void SoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t cols, float* dx);

// Multi-head scaled dot-product attention over `batch` sequences (the
// shape's contract is in runtime/ops/backend.h). Each operand has its own row
// stride (fused projections pass pointers into one buffer).
using ops::AttentionShape;

// Both passes work per (sequence, head) on the head's columns copied into
// contiguous per-thread scratch (K and V transposed where a GEMM needs
// them), in blocks of 32 query rows that see only the keys up to their
// diagonal when causal; the per-head GEMMs are LIBXSMM's JIT small-GEMM
// kernels, single-threaded, so results do not depend on the thread count.

// Writes probs [batch, heads, q_len, kv_len] (kept for backward; masked
// entries 0) and out. key_start: packed documents, causal only
// (ops::AttentionShape::key_start's values on the host, [batch * q_len],
// read here instead of the shape's tensor), or nullptr: query i attends
// keys [key_start[b * q_len + i], i], the value clamped into [0, i]. The
// backward reads the mask from probs (its zeros) and needs no key starts.
void AttentionForward(const AttentionShape& s, const float* q, int64_t ldq, const float* k,
                      int64_t ldk, const float* v, int64_t ldv, float* probs, float* out,
                      int64_t ldo, const int32_t* key_start = nullptr);

// Overwrites dq, dk and dv from dout and forward's probs. scratch holds
// q_len * kv_len floats (the first min(q_len, 32) * kv_len are used).
void AttentionBackward(const AttentionShape& s, const float* q, int64_t ldq, const float* k,
                       int64_t ldk, const float* v, int64_t ldv, const float* probs,
                       const float* dout, int64_t ldo, float* dq, int64_t lddq, float* dk,
                       int64_t lddk, float* dv, int64_t lddv, float* scratch);

// Attention on bf16 q, k, v (and dout) with bf16 outputs, per (sequence,
// head) and query block as above, with the GEMMs that meet P on bf16
// operands: S = Q K^T, out = P V, dP = dO V^T and dV = P^T dO run on
// LIBXSMM's JIT kernels for the AVX512-BF16 dot-product instruction
// (vdpbf16ps, f32 accumulation), P rounded to bf16 before it meets V or dO
// (the rounding ops.h allows; the CUDA backend does the same). S, dP, the
// softmax, probs and its backward are f32, and dS stays f32: dQ = dS K and
// dK = dS^T Q run on LIBXSMM's f32 kernels over the widened Q and K, as in
// the f32 kernel. (Rounding dS too, as CUDA does, made the scalar-vs-vector
// difference of //tests/train:bf16_determinism_test's t5-tiny bf16 updates
// 12.7% against 1.2e-5 with P alone: dS = P (dP - <P, dP>) cancels, so
// few-ulp differences flip its roundings.) Each output is rounded once.
// The dot-product instruction treats subnormal bf16 inputs and f32 results
// as zero (|x| < 2^-126). Results do not depend on the thread count. Needs
// head_dim even and even row strides for K (forward) and V (backward),
// which are read in 32-bit pairs; returns false, having written nothing,
// where the path does not run (NativeBf16Attention() false, or a shape
// LIBXSMM declines): the caller then widens to f32.
//
// NativeBf16Attention: true when LIBXSMM targets AVX512-BF16 here (its
// "cpx" code, which Sapphire Rapids also runs; LIBXSMM_TARGET can lower
// it) and SetNativeBf16Attention has not turned the path off.
// SetNativeBf16Attention is for tests and benchmarks that compare the two
// paths (never turns it on where the CPU lacks it); returns the setting
// before. Process-wide; not to be called while kernels run.
bool NativeBf16Attention();
bool SetNativeBf16Attention(bool on);
bool AttentionForwardBF16(const AttentionShape& s, const BF16* q, int64_t ldq, const BF16* k,
                          int64_t ldk, const BF16* v, int64_t ldv, float* probs, BF16* out,
                          int64_t ldo, const int32_t* key_start = nullptr);
// Overwrites dq, dk and dv (scratch: as AttentionBackward's).
bool AttentionBackwardBF16(const AttentionShape& s, const BF16* q, int64_t ldq, const BF16* k,
                           int64_t ldk, const BF16* v, int64_t ldv, const float* probs,
                           const BF16* dout, int64_t ldo, BF16* dq, int64_t lddq, BF16* dk,
                           int64_t lddk, BF16* dv, int64_t lddv, float* scratch);

// out[n, :] = table[ids[n], :] for n < count; ids must be in [0, vocab).
void EmbeddingForward(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                      float* out);
// dtable[ids[n], :] += dout[n, :].
void EmbeddingBackward(const int32_t* ids, const float* dout, int64_t count, int64_t dim,
                       float* dtable);

using ops::kIgnoreTarget;

// Mean over non-ignored rows of -log softmax(logits[n])[targets[n]]; stores
// the number of counted rows in *count (the mean is 0 when none count).
float CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab, int64_t* count);

// dlogits = scale * (softmax - onehot) per counted row, 0 on ignored rows.
// For the gradient of the mean, scale = 1 / count.
void CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab, float scale, float* dlogits);

// x += y elementwise.
void AddInPlace(float* x, const float* y, int64_t n);

// Rounds each value to the nearest bf16 (ties to even) and stores it back as
// f32: emulates bf16 storage of an activation on the CPU.
void RoundToBF16InPlace(float* x, int64_t n);

// Rounds each value to the nearest value of `t` (f32: unchanged; bf16, f16:
// nearest even, f16 overflowing to infinity) and stores it back as f32.
void RoundToDTypeInPlace(float* x, int64_t n, DType t);

// Copies n elements of a buffer of dtype t (f32, bf16 or f16) into f32, exactly.
void WidenToF32(const void* src, DType t, int64_t n, float* dst);

// dst(t) += src for n elements; bf16 and f16 destinations round to nearest even.
void AccumulateFromF32(const float* src, int64_t n, void* dst, DType t);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_CPU_KERNELS_H_
