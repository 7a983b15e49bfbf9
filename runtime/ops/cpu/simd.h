// Vectorised loops of the CPU backend and its kernels (runtime/ops/cpu), compiled
// for AVX-512 and for AVX2 + FMA beside the portable scalar loops, and chosen
// at run time from the CPU (so one binary runs on any x86-64). Internal to
// runtime/ops/cpu.
//
// Results against the scalar loops (runtime/ops/math.h, update_rules.h):
// - elementwise ops without exp (AdamW/Adam/SGD updates, adds) keep the order
//   of arithmetic and round alike: bit-identical on every ISA;
// - exp-based ops (GELU, SwiGLU, softmax, cross-entropy) use a vector exp (Cephes'
//   polynomial, ~2 ulp) instead of glibc's expf (~0.5 ulp);
// - row reductions (LayerNorm, RMSNorm, softmax, cross-entropy sums, sum of squares)
//   add in lanes, then across lanes: a different summation order.
// Those two kinds differ from the scalar loops by a few ulp; the conformance
// tests compare every ISA with f64 references (tests/ops/cpu_kernels_test.cc).
//
// Thread safety: every function is thread-compatible; SetIsa is a process-wide
// setting for tests and benchmarks, not to be called while kernels run.
#ifndef SHARDKIT_RUNTIME_OPS_CPU_SIMD_H_
#define SHARDKIT_RUNTIME_OPS_CPU_SIMD_H_

#include <cstdint>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/ops/update_rules.h"

namespace sk::simd {

// kAvx512Bf16 is kAvx512 whose bf16 loops narrow with avx512_bf16's
// vcvtneps2bf16 (one instruction for the integer rounding sequence) wherever
// no lane is subnormal, the integer sequence otherwise: the same bits.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// "scalar", "avx2", "avx512", "avx512_bf16".
const char* IsaName(Isa isa);

// The best ISA this CPU runs (AVX-512 needs avx512f+dq, AVX2 needs avx2+fma,
// avx512_bf16 also avx512bf16+bw+vl).
Isa BestIsa();

// The ISA the kernels use now: BestIsa() at start-up, lowered by the
// environment variable SK_CPU_ISA=scalar|avx2|avx512|avx512_bf16 (never
// raised above BestIsa(); an unknown value is ignored with a warning).
Isa ActiveIsa();

// Makes the kernels use min(isa, BestIsa()) and returns the ISA in use
// before. For tests and benchmarks that compare paths.
Isa SetIsa(Isa isa);

// Every ISA this CPU runs, scalar first and BestIsa() last: the values
// SetIsa takes without lowering them. For tests that run each path.
std::vector<Isa> RunnableIsas();

// Each function below runs the active ISA's loop; the scalar loop is the
// reference arithmetic of math.h / update_rules.h.

// y = gelu_tanh(x) (y may alias x); dx = dy * gelu_tanh'(x) (dx may alias dy).
void GeluForward(const float* x, int64_t n, float* y);
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx);

// SwiGLU (math.h's Silu and SiluGrad, in its order): y = silu(g) u;
// dg = dy u silu'(g) and du = dy silu(g). The vector ISAs take sigmoid's
// e^(-g) from the vector exp (Cephes' polynomial, as GELU), the scalar loop
// from expf; outputs must not overlap inputs.
void SwiGluForward(const float* g, const float* u, int64_t n, float* y);
void SwiGluBackward(const float* g, const float* u, const float* dy, int64_t n, float* dg,
                    float* du);

// Rotary embedding of one position's `heads` head rows of head_dim floats
// (x and y; y may be x): each pair (i, i + head_dim / 2) of every head turned
// by the angles whose cosines and sines are cos[i] and sin[i] (times sign),
// math.h's RopeRotate, bit-identical on every ISA (no FMA, its order).
void RopeRotateHeads(const float* x, const float* cos, const float* sin, int64_t heads,
                     int64_t head_dim, float sign, float* y);

// The per-element rules of update_rules.h over n elements (momentum unused
// when h.momentum == 0).
void AdamUpdate(const AdamHyper& h, float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n);
void SgdUpdate(const SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n);

// x += y; y += alpha x; x *= alpha (elementwise, bit-identical on every ISA).
void AddInPlace(float* x, const float* y, int64_t n);
void Axpy(float alpha, const float* x, float* y, int64_t n);
void ScaleInPlace(float* x, float alpha, int64_t n);

// Sum of x[i]^2 accumulated in f64, added to acc.
double SumOfSquares(const float* x, int64_t n, double acc);

// LayerNorm over rows (runtime/ops/cpu/kernels.h's contract).
void LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                      int64_t cols, float* y, float* mean, float* rstd);
void LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                       const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                       float* dbeta);

// RMSNorm over rows (ops.h's rms_norm_fwd/bwd in f32): y = x rstd gamma,
// rstd[r] = 1 / sqrt(mean(x^2) + eps); backward ACCUMULATES dx and dgamma
// (+=; dgamma may be null) as math.h's RmsNormRowBackward. The scalar ISA
// runs math.h's row functions; the vector ones add the row sums in lanes.
void RmsNormForward(const float* x, const float* gamma, int64_t rows, int64_t cols, float eps,
                    float* y, float* rstd);
void RmsNormBackward(const float* x, const float* gamma, const float* dy, const float* rstd,
                     int64_t rows, int64_t cols, float* dx, float* dgamma);

// row[j] = exp(scale row[j] - m) for j < n, in place; returns the f32 sum of
// the results (lanes summed at the end on vector ISAs). The linear-memory
// attention's online softmax and its backward's recomputed probabilities.
float ScaledExpShiftInPlace(float* row, int64_t n, float scale, float m);
// The maximum of row[0, n), n >= 1.
float MaxOfRow(const float* row, int64_t n);
// dp[j] = (p[j] (dp[j] - delta)) scale for j < n, in place: a row of the
// linear-memory attention's dS from its recomputed probabilities, dP and
// delta = rowsum(dO o O) (the softmax backward with the row's P . dP
// precomputed). Bit-identical on every ISA (no FMA, the scalar order).
void SoftmaxGradFromDeltaInPlace(const float* p, float* dp, int64_t n, float delta, float scale);

// math.h's SoftmaxRowInPlace of scale * row[0, valid) (scale > 0; the
// scale costs nothing extra: the same bits as scaling the row first, on
// every ISA) and SoftmaxRowBackwardInPlace.
void SoftmaxRowInPlace(float* row, int64_t cols, int64_t valid, float scale = 1.0f);
void SoftmaxRowBackwardInPlace(const float* p, float* dp, int64_t cols, float scale);

// The two above over a block of rows: row r of x (row stride ld) is
// SoftmaxRowInPlace(x + r ld, cols, min(cols, valid + (causal ? r : 0)),
// scale) (valid >= 1), and row r of dp (stride lddp) is
// SoftmaxRowBackwardInPlace(p + r ldp, dp + r lddp, cols, scale), bit for
// bit; the vector loops run each pass over many rows so that the rows'
// reductions overlap (attention's query blocks).
void SoftmaxRowsInPlace(float* x, int64_t rows, int64_t cols, int64_t ld, int64_t valid,
                        bool causal, float scale);
void SoftmaxRowsBackwardInPlace(const float* p, int64_t ldp, float* dp, int64_t lddp,
                                int64_t rows, int64_t cols, float scale);

// math.h's CrossEntropyRow and CrossEntropyRowBackward.
float CrossEntropyRow(const float* logits, int64_t cols, int32_t target);
void CrossEntropyRowBackward(const float* logits, int64_t cols, int32_t target, float scale,
                             float* dlogits);

// bf16 <-> f32 over n elements, bit-identical to core/dtype.h's BF16ToFloat
// and FloatToBF16 (round to nearest even, NaN kept quiet) on every ISA.
// The AVX-512 and AVX2 loops use integer shifts; avx512_bf16's vcvtneps2bf16
// gives the same bits except that it flushes subnormal inputs to zero, so the
// kAvx512Bf16 loops use it only for vectors without a subnormal lane. dst
// must not overlap src.
void WidenBf16(const BF16* src, int64_t n, float* dst);
void NarrowToBf16(const float* src, int64_t n, BF16* dst);

// GELU on bf16 tensors: exactly NarrowToBf16(GeluForward(WidenBf16(x))) (and
// the backward's dx = round(dy * gelu'(x))), bit for bit on every ISA, with
// the conversions done in registers instead of through f32 copies (y may
// alias x; dx may alias dy or x).
void GeluForwardBf16(const BF16* x, int64_t n, BF16* y);
void GeluBackwardBf16(const BF16* x, const BF16* dy, int64_t n, BF16* dx);

// SwiGLU on bf16 tensors: exactly NarrowToBf16 of SwiGluForward /
// SwiGluBackward on the widened operands, bit for bit on every ISA, the
// conversions in registers.
void SwiGluForwardBf16(const BF16* g, const BF16* u, int64_t n, BF16* y);
void SwiGluBackwardBf16(const BF16* g, const BF16* u, const BF16* dy, int64_t n, BF16* dg,
                        BF16* du);

// dst[i] = round(dst[i] + src[i]) for a bf16 dst: exactly WidenBf16, an f32
// add and NarrowToBf16, with the conversions in registers (the model's
// flush of its f32 gradient sinks into a 16-bit full gradient).
void AccumulateBf16(const float* src, int64_t n, BF16* dst);

// acc[i] += x[i] widened, in f32: exactly WidenBf16 then AddInPlace, without
// the f32 copy (a bias gradient's sum over the rows of a bf16 dy).
void AddWidenedBf16(float* acc, const BF16* x, int64_t n);

}  // namespace sk::simd

#endif  // SHARDKIT_RUNTIME_OPS_CPU_SIMD_H_
