#include "runtime/ops/cpu/simd.h"

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <glog/logging.h>

#include "runtime/core/env.h"
#include "runtime/ops/cpu/isa_target.h"
#include "runtime/ops/math.h"

// GCC 12 reports the _mm512_undefined_ps() inside its own AVX-512 intrinsics
// (avx512fintrin.h) as uninitialised once they are inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace sk::simd {

// Cephes' expf, shared by the vector Exp of every ISA: x = n ln2 + r with
// ln2 split so that n * kLn2Hi is exact, then a degree-6 polynomial in r.
namespace exp_poly {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_poly

// ---- AVX-512 ------------------------------------------------------------------

SK_ISA_TARGET_BEGIN("avx512f,avx512dq,avx2,fma")
namespace avx512 {

struct V {
  using R = __m512;
  static constexpr int kLanes = 16;
  static __mmask16 Mask(int64_t c) { return static_cast<__mmask16>((1u << c) - 1u); }
  static R Load(const float* p) { return _mm512_loadu_ps(p); }
  static R LoadN(const float* p, int64_t c) { return _mm512_maskz_loadu_ps(Mask(c), p); }
  static void Store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static void StoreN(float* p, R v, int64_t c) { _mm512_mask_storeu_ps(p, Mask(c), v); }
  static R Set(float x) { return _mm512_set1_ps(x); }
  static R Zero() { return _mm512_setzero_ps(); }
  static R Add(R a, R b) { return _mm512_add_ps(a, b); }
  static R Sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R Mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R Div(R a, R b) { return _mm512_div_ps(a, b); }
  static R Sqrt(R a) { return _mm512_sqrt_ps(a); }
  static R Max(R a, R b) { return _mm512_max_ps(a, b); }
  static R MaskTail(R v, int64_t c) { return c == kLanes ? v : _mm512_maskz_mov_ps(Mask(c), v); }
  static float SumLanes(R v) { return _mm512_reduce_add_ps(v); }
  static float MaxLanes(R v) { return _mm512_reduce_max_ps(v); }
  // e^x: x = n ln2 + r, |r| <= ln2 / 2; Cephes' degree-6 polynomial for e^r
  // (~2 ulp), scaled by 2^n with scalef (which overflows to inf and underflows
  // to 0 like expf). NaN stays NaN (min/max return their second operand).
  static R Exp(R x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    R n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(exp_poly::kLog2e)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    R r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_poly::kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_poly::kLn2Lo), r);
    R p = _mm512_set1_ps(exp_poly::kP[0]);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly::kP[1]));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly::kP[2]));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly::kP[3]));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly::kP[4]));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_poly::kP[5]));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
  static double SumOfSquares(const float* x, int64_t n, double acc) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m512d v0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
      __m512d v1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
      a0 = _mm512_add_pd(a0, _mm512_mul_pd(v0, v0));
      a1 = _mm512_add_pd(a1, _mm512_mul_pd(v1, v1));
    }
    double tail = 0.0;
    for (; i < n; ++i) tail += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return acc + (_mm512_reduce_add_pd(_mm512_add_pd(a0, a1)) + tail);
  }
};

#include "runtime/ops/cpu/simd_loops.inc"

// bf16 <-> f32, 16 lanes. Widening is a 16-bit shift (exact). Narrowing is
// FloatToBF16's integer sequence (round to nearest even; NaN quietened with
// its sign and top payload kept), not avx512_bf16's vcvtneps2bf16, which
// flushes subnormal inputs and results to zero: the same bits as the scalar
// conversion on every CPU. LoadBf16/StoreBf16 convert one vector; the loops
// over arrays are simd_bf16_loops.inc's.
inline __m512 WidenBf16x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m256i NarrowBf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
inline R LoadBf16(const uint16_t* p) {
  return WidenBf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void StoreBf16(uint16_t* p, R v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), NarrowBf16x16(v));
}

#include "runtime/ops/cpu/simd_bf16_loops.inc"

}  // namespace avx512
SK_ISA_TARGET_END

// ---- AVX-512 with avx512_bf16 -------------------------------------------------
// The AVX-512 loops, the bf16 ones compiled again with the hardware
// narrowing: vcvtneps2bf16 rounds to nearest even and quietens NaN exactly
// as NarrowBf16x16 does (Intel SDM: a NaN's top 16 bits with bit 6 set),
// but treats a subnormal input as zero; a vector with a subnormal lane
// (fpclass) takes the integer sequence. gpt-10m's bf16 GELU spends more on
// narrowing than on the f32 GELU it wraps otherwise.

SK_ISA_TARGET_BEGIN("avx512f,avx512dq,avx2,fma,avx512bw,avx512vl,avx512bf16")
namespace avx512_bf16 {

using avx512::V;
using R = V::R;
constexpr int64_t L = V::kLanes;
using avx512::GeluBackwardV;
using avx512::GeluForwardV;
using avx512::LoadBf16;
using avx512::SwiGluBackwardV;
using avx512::SwiGluForwardV;

inline void StoreBf16(uint16_t* p, R v) {
  constexpr int kSubnormal = 0x20;  // fpclass: denormal
  const __m256i h = _mm512_fpclass_ps_mask(v, kSubnormal) == 0
                        ? reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v))
                        : avx512::NarrowBf16x16(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
}

#include "runtime/ops/cpu/simd_bf16_loops.inc"

}  // namespace avx512_bf16
SK_ISA_TARGET_END

// ---- AVX2 + FMA ---------------------------------------------------------------

SK_ISA_TARGET_BEGIN("avx2,fma")
namespace avx2 {

struct V {
  using R = __m256;
  static constexpr int kLanes = 8;
  static __m256i Mask(int64_t c) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(c)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R Load(const float* p) { return _mm256_loadu_ps(p); }
  static R LoadN(const float* p, int64_t c) { return _mm256_maskload_ps(p, Mask(c)); }
  static void Store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static void StoreN(float* p, R v, int64_t c) { _mm256_maskstore_ps(p, Mask(c), v); }
  static R Set(float x) { return _mm256_set1_ps(x); }
  static R Zero() { return _mm256_setzero_ps(); }
  static R Add(R a, R b) { return _mm256_add_ps(a, b); }
  static R Sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R Mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R Div(R a, R b) { return _mm256_div_ps(a, b); }
  static R Sqrt(R a) { return _mm256_sqrt_ps(a); }
  static R Max(R a, R b) { return _mm256_max_ps(a, b); }
  static R MaskTail(R v, int64_t c) {
    return c == kLanes ? v : _mm256_and_ps(v, _mm256_castsi256_ps(Mask(c)));
  }
  static float SumLanes(R v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float MaxLanes(R v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // e^x as in avx512::V::Exp; 2^n built in the exponent field, so x is
  // clamped to [-87.34, 88.37] (n in [-126, 127]) and the results beyond
  // expf's range set to 0 and inf afterwards.
  static R Exp(R x) {
    const R lo = _mm256_set1_ps(-87.3365448f), hi = _mm256_set1_ps(88.3762626f);
    R xc = _mm256_max_ps(lo, _mm256_min_ps(hi, x));
    R n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(exp_poly::kLog2e)),
                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    R r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_poly::kLn2Hi), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_poly::kLn2Lo), r);
    R p = _mm256_set1_ps(exp_poly::kP[0]);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly::kP[1]));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly::kP[2]));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly::kP[3]));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly::kP[4]));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly::kP[5]));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    R y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY),
                            _mm256_cmp_ps(x, _mm256_set1_ps(88.7228394f), _CMP_GT_OQ));
  }
  static double SumOfSquares(const float* x, int64_t n, double acc) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
      __m256d v1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
      a0 = _mm256_add_pd(a0, _mm256_mul_pd(v0, v0));
      a1 = _mm256_add_pd(a1, _mm256_mul_pd(v1, v1));
    }
    double tail = 0.0;
    for (; i < n; ++i) tail += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    __m256d s = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return acc + (_mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h))) + tail);
  }
};

#include "runtime/ops/cpu/simd_loops.inc"

// bf16 <-> f32, 8 lanes, as avx512's.
inline __m256 WidenBf16x8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m128i NarrowBf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);  // each lane <= 0xffff
  // packus works within 128-bit halves: [r0..3 r0..3 | r4..7 r4..7]; gather
  // quadwords 0 and 2.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
inline R LoadBf16(const uint16_t* p) {
  return WidenBf16x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void StoreBf16(uint16_t* p, R v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), NarrowBf16x8(v));
}

#include "runtime/ops/cpu/simd_bf16_loops.inc"

}  // namespace avx2
SK_ISA_TARGET_END

// ---- Scalar: the reference loops of math.h and update_rules.h -----------------

namespace scalar {

void GeluForwardBf16(const uint16_t* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = FloatToBF16(ops::math::GeluTanh(BF16ToFloat(BF16{x[i]}))).bits;
  }
}
void GeluBackwardBf16(const uint16_t* x, const uint16_t* dy, int64_t n, uint16_t* dx) {
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = FloatToBF16(BF16ToFloat(BF16{dy[i]}) * ops::math::GeluTanhGrad(BF16ToFloat(BF16{x[i]})))
                .bits;
  }
}
void SwiGluForwardBf16(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = FloatToBF16(ops::math::Silu(BF16ToFloat(BF16{g[i]})) * BF16ToFloat(BF16{u[i]})).bits;
  }
}
void SwiGluBackwardBf16(const uint16_t* g, const uint16_t* u, const uint16_t* dy, int64_t n,
                        uint16_t* dg, uint16_t* du) {
  for (int64_t i = 0; i < n; ++i) {
    const float gf = BF16ToFloat(BF16{g[i]}), uf = BF16ToFloat(BF16{u[i]}),
                df = BF16ToFloat(BF16{dy[i]});
    dg[i] = FloatToBF16(df * uf * ops::math::SiluGrad(gf)).bits;
    du[i] = FloatToBF16(df * ops::math::Silu(gf)).bits;
  }
}
void SwiGluForward(const float* g, const float* u, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = ops::math::Silu(g[i]) * u[i];
}
void SwiGluBackward(const float* g, const float* u, const float* dy, int64_t n, float* dg,
                    float* du) {
  for (int64_t i = 0; i < n; ++i) {
    dg[i] = dy[i] * u[i] * ops::math::SiluGrad(g[i]);
    du[i] = dy[i] * ops::math::Silu(g[i]);
  }
}
void RopeRotateHeads(const float* x, const float* cos, const float* sin, int64_t heads,
                     int64_t head_dim, float sign, float* y) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* xa = x + h * head_dim;
    float* ya = y + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      ops::math::RopeRotate(xa[i], xa[i + half], cos[i], sin[i], sign, &ya[i], &ya[i + half]);
    }
  }
}
void WidenBf16(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(BF16{src[i]});
}
void NarrowBf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBF16(src[i]).bits;
}
void AccumulateBf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBF16(BF16ToFloat(BF16{dst[i]}) + src[i]).bits;
}
void AddWidenedBf16(float* acc, const uint16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += BF16ToFloat(BF16{x[i]});
}

void GeluForward(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = ops::math::GeluTanh(x[i]);
}
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * ops::math::GeluTanhGrad(x[i]);
}
void AdamUpdate(const AdamHyper& hyper, float* p, const float* g, float* m, float* v, int64_t n) {
  // A local copy: the float stores below could alias a referenced struct's
  // float fields, which would force reloads and block vectorisation.
  const AdamHyper h = hyper;
  for (int64_t i = 0; i < n; ++i) sk::AdamUpdate(p[i], g[i], m[i], v[i], h);
}
void SgdUpdate(const SgdHyper& hyper, float* p, const float* g, float* buf, int64_t n) {
  const SgdHyper h = hyper;  // local: see AdamUpdate
  if (h.momentum == 0.0f) {
    float scratch = 0.0f;
    for (int64_t i = 0; i < n; ++i) sk::SgdUpdate(p[i], g[i], scratch, h);
    return;
  }
  for (int64_t i = 0; i < n; ++i) sk::SgdUpdate(p[i], g[i], buf[i], h);
}
void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}
void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void ScaleInPlace(float* x, float alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}
double SumOfSquares(const float* x, int64_t n, double acc) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    acc += v * v;
  }
  return acc;
}
void LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                      int64_t cols, float* y, float* mean, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    ops::math::LayerNormRowForward(x + r * cols, gamma, beta, cols, y + r * cols, mean + r, rstd + r);
  }
}
void LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                       const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                       float* dbeta) {
  for (int64_t r = 0; r < rows; ++r) {
    ops::math::LayerNormRowBackward(x + r * cols, gamma, dy + r * cols, mean[r], rstd[r], cols,
                                  dx + r * cols, dgamma, dbeta);
  }
}
void RmsNormForward(const float* x, const float* gamma, int64_t rows, int64_t cols, float eps,
                    float* y, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    ops::math::RmsNormRowForward(x + r * cols, gamma, cols, eps, y + r * cols, rstd + r);
  }
}
void RmsNormBackward(const float* x, const float* gamma, const float* dy, const float* rstd,
                     int64_t rows, int64_t cols, float* dx, float* dgamma) {
  for (int64_t r = 0; r < rows; ++r) {
    ops::math::RmsNormRowBackward(x + r * cols, gamma, dy + r * cols, rstd[r], cols, dx + r * cols,
                                dgamma);
  }
}
float ScaledExpShiftInPlace(float* row, int64_t n, float scale, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    row[j] = expf(row[j] * scale - m);
    sum += row[j];
  }
  return sum;
}
float MaxOfRow(const float* row, int64_t n) {
  float m = row[0];
  for (int64_t j = 1; j < n; ++j) m = row[j] > m ? row[j] : m;
  return m;
}
void SoftmaxGradFromDeltaInPlace(const float* p, float* dp, int64_t n, float delta, float scale) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta) * scale;
}
void SoftmaxRowInPlace(float* row, int64_t cols, int64_t valid, float scale) {
  if (scale != 1.0f) ScaleInPlace(row, scale, valid);
  ops::math::SoftmaxRowInPlace(row, cols, valid);
}
void SoftmaxRowBackwardInPlace(const float* p, float* dp, int64_t cols, float scale) {
  ops::math::SoftmaxRowBackwardInPlace(p, dp, cols, scale);
}
void SoftmaxRowsInPlace(float* x, int64_t rows, int64_t cols, int64_t ld, int64_t valid,
                        bool causal, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t v = valid + (causal ? r : 0);
    SoftmaxRowInPlace(x + r * ld, cols, v < cols ? v : cols, scale);
  }
}
void SoftmaxRowsBackwardInPlace(const float* p, int64_t ldp, float* dp, int64_t lddp,
                                int64_t rows, int64_t cols, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    ops::math::SoftmaxRowBackwardInPlace(p + r * ldp, dp + r * lddp, cols, scale);
  }
}
float CrossEntropyRow(const float* logits, int64_t cols, int32_t target) {
  return ops::math::CrossEntropyRow(logits, cols, target);
}
void CrossEntropyRowBackward(const float* logits, int64_t cols, int32_t target, float scale,
                             float* dlogits) {
  ops::math::CrossEntropyRowBackward(logits, cols, target, scale, dlogits);
}

}  // namespace scalar

// ---- Selection ------------------------------------------------------------------

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512_bf16";
  }
  return "unknown";
}

Isa BestIsa() {
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
      return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl")
                 ? Isa::kAvx512Bf16
                 : Isa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kScalar;
  }();
  return best;
}

namespace {

Isa Clamp(Isa isa) { return static_cast<int>(isa) < static_cast<int>(BestIsa()) ? isa : BestIsa(); }

std::atomic<int>& Active() {
  static std::atomic<int> active([] {
    Isa isa = BestIsa();
    if (const char* env = GetEnv(EnvVar::kCpuIsa)) {
      if (std::strcmp(env, "scalar") == 0) {
        isa = Isa::kScalar;
      } else if (std::strcmp(env, "avx2") == 0) {
        isa = Isa::kAvx2;
      } else if (std::strcmp(env, "avx512") == 0) {
        isa = Isa::kAvx512;
      } else if (std::strcmp(env, "avx512_bf16") == 0) {
        isa = Isa::kAvx512Bf16;
      } else {
        LOG(WARNING) << "SK_CPU_ISA=" << env
                     << " is not scalar, avx2, avx512 or avx512_bf16; ignored";
      }
    }
    return static_cast<int>(Clamp(isa));
  }());
  return active;
}

}  // namespace

Isa ActiveIsa() { return static_cast<Isa>(Active().load(std::memory_order_relaxed)); }

Isa SetIsa(Isa isa) {
  return static_cast<Isa>(Active().exchange(static_cast<int>(Clamp(isa))));
}

std::vector<Isa> RunnableIsas() {
  std::vector<Isa> out;
  for (int i = 0; i <= static_cast<int>(BestIsa()); ++i) out.push_back(static_cast<Isa>(i));
  return out;
}

#define SK_SIMD_DISPATCH(fn, ...)                          \
  switch (ActiveIsa()) {                                   \
    case Isa::kAvx512Bf16:                                 \
    case Isa::kAvx512: return avx512::fn(__VA_ARGS__);     \
    case Isa::kAvx2: return avx2::fn(__VA_ARGS__);         \
    case Isa::kScalar: break;                              \
  }                                                        \
  return scalar::fn(__VA_ARGS__)
// The bf16 loops, which kAvx512Bf16 has its own build of.
#define SK_SIMD_DISPATCH_BF16(fn, ...)                        \
  switch (ActiveIsa()) {                                      \
    case Isa::kAvx512Bf16: return avx512_bf16::fn(__VA_ARGS__); \
    case Isa::kAvx512: return avx512::fn(__VA_ARGS__);        \
    case Isa::kAvx2: return avx2::fn(__VA_ARGS__);            \
    case Isa::kScalar: break;                                 \
  }                                                           \
  return scalar::fn(__VA_ARGS__)

void GeluForward(const float* x, int64_t n, float* y) { SK_SIMD_DISPATCH(GeluForward, x, n, y); }
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  SK_SIMD_DISPATCH(GeluBackward, x, dy, n, dx);
}
void AdamUpdate(const AdamHyper& h, float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n) {
  SK_SIMD_DISPATCH(AdamUpdate, h, param, grad, exp_avg, exp_avg_sq, n);
}
void SgdUpdate(const SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n) {
  SK_SIMD_DISPATCH(SgdUpdate, h, param, grad, momentum, n);
}
void AddInPlace(float* x, const float* y, int64_t n) { SK_SIMD_DISPATCH(AddInPlace, x, y, n); }
void Axpy(float alpha, const float* x, float* y, int64_t n) { SK_SIMD_DISPATCH(Axpy, alpha, x, y, n); }
void ScaleInPlace(float* x, float alpha, int64_t n) { SK_SIMD_DISPATCH(ScaleInPlace, x, alpha, n); }
double SumOfSquares(const float* x, int64_t n, double acc) {
  switch (ActiveIsa()) {
    case Isa::kAvx512Bf16:
    case Isa::kAvx512: return avx512::V::SumOfSquares(x, n, acc);
    case Isa::kAvx2: return avx2::V::SumOfSquares(x, n, acc);
    case Isa::kScalar: break;
  }
  return scalar::SumOfSquares(x, n, acc);
}
void LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                      int64_t cols, float* y, float* mean, float* rstd) {
  SK_SIMD_DISPATCH(LayerNormForward, x, gamma, beta, rows, cols, y, mean, rstd);
}
void LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                       const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                       float* dbeta) {
  SK_SIMD_DISPATCH(LayerNormBackward, x, gamma, dy, mean, rstd, rows, cols, dx, dgamma, dbeta);
}
void RmsNormForward(const float* x, const float* gamma, int64_t rows, int64_t cols, float eps,
                    float* y, float* rstd) {
  SK_SIMD_DISPATCH(RmsNormForward, x, gamma, rows, cols, eps, y, rstd);
}
void RmsNormBackward(const float* x, const float* gamma, const float* dy, const float* rstd,
                     int64_t rows, int64_t cols, float* dx, float* dgamma) {
  SK_SIMD_DISPATCH(RmsNormBackward, x, gamma, dy, rstd, rows, cols, dx, dgamma);
}
float ScaledExpShiftInPlace(float* row, int64_t n, float scale, float m) {
  SK_SIMD_DISPATCH(ScaledExpShiftInPlace, row, n, scale, m);
}
float MaxOfRow(const float* row, int64_t n) { SK_SIMD_DISPATCH(MaxOfRow, row, n); }
void SoftmaxGradFromDeltaInPlace(const float* p, float* dp, int64_t n, float delta, float scale) {
  SK_SIMD_DISPATCH(SoftmaxGradFromDeltaInPlace, p, dp, n, delta, scale);
}
void SoftmaxRowInPlace(float* row, int64_t cols, int64_t valid, float scale) {
  SK_SIMD_DISPATCH(SoftmaxRowInPlace, row, cols, valid, scale);
}
void SoftmaxRowBackwardInPlace(const float* p, float* dp, int64_t cols, float scale) {
  SK_SIMD_DISPATCH(SoftmaxRowBackwardInPlace, p, dp, cols, scale);
}
void SoftmaxRowsInPlace(float* x, int64_t rows, int64_t cols, int64_t ld, int64_t valid,
                        bool causal, float scale) {
  SK_SIMD_DISPATCH(SoftmaxRowsInPlace, x, rows, cols, ld, valid, causal, scale);
}
void SoftmaxRowsBackwardInPlace(const float* p, int64_t ldp, float* dp, int64_t lddp,
                                int64_t rows, int64_t cols, float scale) {
  SK_SIMD_DISPATCH(SoftmaxRowsBackwardInPlace, p, ldp, dp, lddp, rows, cols, scale);
}
float CrossEntropyRow(const float* logits, int64_t cols, int32_t target) {
  SK_SIMD_DISPATCH(CrossEntropyRow, logits, cols, target);
}
void CrossEntropyRowBackward(const float* logits, int64_t cols, int32_t target, float scale,
                             float* dlogits) {
  SK_SIMD_DISPATCH(CrossEntropyRowBackward, logits, cols, target, scale, dlogits);
}

void SwiGluForward(const float* g, const float* u, int64_t n, float* y) {
  SK_SIMD_DISPATCH(SwiGluForward, g, u, n, y);
}
void SwiGluBackward(const float* g, const float* u, const float* dy, int64_t n, float* dg,
                    float* du) {
  SK_SIMD_DISPATCH(SwiGluBackward, g, u, dy, n, dg, du);
}
void SwiGluForwardBf16(const BF16* g, const BF16* u, int64_t n, BF16* y) {
  SK_SIMD_DISPATCH_BF16(SwiGluForwardBf16, reinterpret_cast<const uint16_t*>(g),
                        reinterpret_cast<const uint16_t*>(u), n, reinterpret_cast<uint16_t*>(y));
}
void SwiGluBackwardBf16(const BF16* g, const BF16* u, const BF16* dy, int64_t n, BF16* dg,
                        BF16* du) {
  SK_SIMD_DISPATCH_BF16(SwiGluBackwardBf16, reinterpret_cast<const uint16_t*>(g),
                        reinterpret_cast<const uint16_t*>(u), reinterpret_cast<const uint16_t*>(dy),
                        n, reinterpret_cast<uint16_t*>(dg), reinterpret_cast<uint16_t*>(du));
}
void RopeRotateHeads(const float* x, const float* cos, const float* sin, int64_t heads,
                     int64_t head_dim, float sign, float* y) {
  SK_SIMD_DISPATCH(RopeRotateHeads, x, cos, sin, heads, head_dim, sign, y);
}
void GeluForwardBf16(const BF16* x, int64_t n, BF16* y) {
  SK_SIMD_DISPATCH_BF16(GeluForwardBf16, reinterpret_cast<const uint16_t*>(x), n,
                   reinterpret_cast<uint16_t*>(y));
}
void GeluBackwardBf16(const BF16* x, const BF16* dy, int64_t n, BF16* dx) {
  SK_SIMD_DISPATCH_BF16(GeluBackwardBf16, reinterpret_cast<const uint16_t*>(x),
                   reinterpret_cast<const uint16_t*>(dy), n, reinterpret_cast<uint16_t*>(dx));
}
void WidenBf16(const BF16* src, int64_t n, float* dst) {
  SK_SIMD_DISPATCH_BF16(WidenBf16, reinterpret_cast<const uint16_t*>(src), n, dst);
}
void NarrowToBf16(const float* src, int64_t n, BF16* dst) {
  SK_SIMD_DISPATCH_BF16(NarrowBf16, src, n, reinterpret_cast<uint16_t*>(dst));
}

void AccumulateBf16(const float* src, int64_t n, BF16* dst) {
  SK_SIMD_DISPATCH_BF16(AccumulateBf16, src, n, reinterpret_cast<uint16_t*>(dst));
}
void AddWidenedBf16(float* acc, const BF16* x, int64_t n) {
  SK_SIMD_DISPATCH_BF16(AddWidenedBf16, acc, reinterpret_cast<const uint16_t*>(x), n);
}

#undef SK_SIMD_DISPATCH
#undef SK_SIMD_DISPATCH_BF16

}  // namespace sk::simd
