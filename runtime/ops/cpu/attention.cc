// The composed attention's CPU kernels (kernels.h): f32 per sequence and head
// group on the GEMM library, and bf16 on LIBXSMM's small GEMMs where the CPU
// has bf16 dot products.

#include <immintrin.h>
#include <libxsmm.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include <glog/logging.h>

#include "runtime/ops/cpu/isa_target.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/cpu/simd.h"
#include "runtime/ops/cpu/small_gemm.h"
#include "runtime/ops/math.h"

namespace sk {

namespace {

// Splits a sequence's [tokens, heads * d] operand (row stride ld) into
// per-head contiguous [tokens, d] matrices, dst + h * tokens * d, or joins
// them back. Token rows are read or written whole, one after the other
// (streams the hardware prefetchers follow); the heads' columns of one
// row lie heads * d floats apart, so reading a head's rows directly would
// miss on every row and put them into a few L1 sets (gpt-deep-20m: 3 KiB
// apart, 8 of 64 sets), where a GEMM's operands evict each other.
template <typename T>
void SplitHeads(const T* src, int64_t tokens, int64_t heads, int64_t d, int64_t ld, T* dst) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(dst + (h * tokens + t) * d, src + t * ld + h * d, sizeof(T) * d);
    }
  }
}
void JoinHeads(const float* src, int64_t tokens, int64_t heads, int64_t d, float* dst,
               int64_t ld) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(dst + t * ld + h * d, src + (h * tokens + t) * d, sizeof(float) * d);
    }
  }
}

// Attention works on blocks of this many query rows. Causal block [q0, q1)
// attends to keys [0, q1) only, so the GEMMs skip the masked triangle beyond
// the diagonal blocks (at T = 128: 62.5% of the full T x T work; T = 256:
// 56%).
constexpr int64_t kQueryBlock = 32;

// One query block: rows [q0, q0 + rows) seeing keys [0, keys).
struct QueryBlock {
  int64_t q0, rows, keys;
};

std::vector<QueryBlock> QueryBlocks(const AttentionShape& s) {
  std::vector<QueryBlock> blocks;
  for (int64_t q0 = 0; q0 < s.q_len; q0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, s.q_len - q0);
    blocks.push_back({q0, rows, s.causal ? q0 + rows : s.kv_len});
  }
  return blocks;
}

// The softmax of a query block's unscaled score rows pb [rows, kv] in
// place, each row over the keys its query attends and 0 elsewhere: up to
// the diagonal when causal and, with packed documents (ks: the sequence's
// key starts, clamped into [0, i]), from the query's document start. The
// backward needs nothing more: masked probabilities are 0, so their score
// gradients are too.
void BlockSoftmax(const AttentionShape& s, const QueryBlock& qb, const int32_t* ks, float scale,
                  int64_t kv, float* pb) {
  if (ks == nullptr) {
    simd::SoftmaxRowsInPlace(pb, qb.rows, kv, kv, s.causal ? qb.q0 + 1 : kv, s.causal, scale);
    return;
  }
  for (int64_t r = 0; r < qb.rows; ++r) {
    const int64_t i = qb.q0 + r, first = std::clamp<int64_t>(ks[i], 0, i);
    float* row = pb + r * kv;
    simd::SoftmaxRowInPlace(row + first, kv - first, i + 1 - first, scale);
    std::fill(row, row + first, 0.0f);
  }
}

// dX[0, keys) of one head += A^T B for A = a block's [rows, keys] of P or
// dS (row stride kv) and B its rows of dO or Q (row stride ldb): key rows
// [0, first) accumulate, rows [first, keys) are overwritten.
class KeyRowsGemm {
 public:
  KeyRowsGemm(const QueryBlock& qb, int64_t first, int64_t d, int64_t kv, int64_t ldb,
              int64_t ldc)
      : first_(first),
        ldc_(ldc),
        acc_(true, first, d, qb.rows, kv, ldb, ldc, true),
        fresh_(true, qb.keys - first, d, qb.rows, kv, ldb, ldc, false) {}

  void operator()(const float* a, const float* b, float* c) const {
    acc_(a, b, c);
    fresh_(a + first_, b, c + first_ * ldc_);
  }

 private:
  int64_t first_, ldc_;
  SmallGemm acc_, fresh_;
};

// How many heads to split out of a sequence at a time: all of them unless
// their copies (floats_per_head each) would exceed 1 Mi floats (4 MiB) of
// scratch per thread; at least one.
int64_t HeadGroup(int64_t heads, int64_t floats_per_head) {
  constexpr int64_t kBudget = int64_t{1} << 20;
  return std::max<int64_t>(1, std::min(heads, kBudget / std::max<int64_t>(1, floats_per_head)));
}

// The calling thread's scratch of at least n elements of T in one of
// kScratchSlots buffers per element type (ranks run as threads; a kernel
// that needs several at once takes different slots).
constexpr int kScratchSlots = 4;
template <typename T>
T* ThreadScratch(int slot, int64_t n) {
  thread_local std::vector<T> scratch[kScratchSlots];
  std::vector<T>& b = scratch[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

}  // namespace

void AttentionForward(const AttentionShape& s, const float* q, int64_t ldq, const float* k,
                      int64_t ldk, const float* v, int64_t ldv, float* probs, float* out,
                      int64_t ldo, const int32_t* key_start) {
  CHECK(!s.causal || s.q_len == s.kv_len) << "causal attention needs q_len == kv_len";
  CHECK(key_start == nullptr || s.causal) << "packed documents need causal attention";
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t d = s.head_dim, kv = s.kv_len;
  const std::vector<QueryBlock> blocks = QueryBlocks(s);
  // Per sequence and group of heads (HeadGroup), split into heads: qs, os
  // [group, q_len, d], ks, vs [group, kv, d]; per head, kt = K^T [d, kv]. Per block: S = Q K^T into
  // probs, the softmax there, O = P V; the kernels are dispatched once per
  // call and run for every (batch, head).
  std::vector<SmallGemm> scores, pv;
  for (const QueryBlock& qb : blocks) {
    scores.emplace_back(false, qb.rows, qb.keys, d, d, kv, kv, false);
    pv.emplace_back(false, qb.rows, d, qb.keys, kv, d, d, false);
  }
  const int64_t group = HeadGroup(s.heads, 2 * s.q_len * d + 2 * kv * d);
  const int64_t hq = group * s.q_len * d, hk = group * kv * d;
  float* qs = ThreadScratch<float>(0, 2 * hq + 2 * hk + d * kv);
  float* os = qs + hq;
  float* ks = os + hq;
  float* vs = ks + hk;
  float* kt = vs + hk;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* starts = key_start == nullptr ? nullptr : key_start + b * s.q_len;
    for (int64_t h0 = 0; h0 < s.heads; h0 += group) {
      const int64_t g = std::min(group, s.heads - h0), col = h0 * d;
      SplitHeads(q + b * s.q_len * ldq + col, s.q_len, g, d, ldq, qs);
      SplitHeads(k + b * kv * ldk + col, kv, g, d, ldk, ks);
      SplitHeads(v + b * kv * ldv + col, kv, g, d, ldv, vs);
      for (int64_t h = 0; h < g; ++h) {
        float* p = probs + (b * s.heads + h0 + h) * s.q_len * kv;
        const float* qh = qs + h * s.q_len * d;
        const float* vh = vs + h * kv * d;
        float* oh = os + h * s.q_len * d;
        TransposeInto(ks + h * kv * d, kv, d, d, kt);
        for (size_t i = 0; i < blocks.size(); ++i) {
          const QueryBlock& qb = blocks[i];
          float* pb = p + qb.q0 * kv;
          // Unscaled scores over the keys this block sees; the softmax
          // scales them and writes the whole row (0 past the causal limit),
          // which backward reads.
          scores[i](qh + qb.q0 * d, kt, pb);
          BlockSoftmax(s, qb, starts, scale, kv, pb);
          pv[i](pb, vh, oh + qb.q0 * d);
        }
      }
      JoinHeads(os, s.q_len, g, d, out + b * s.q_len * ldo + col, ldo);
    }
  }
}

void AttentionBackward(const AttentionShape& s, const float* q, int64_t ldq, const float* k,
                       int64_t ldk, const float* v, int64_t ldv, const float* probs,
                       const float* dout, int64_t ldo, float* dq, int64_t lddq, float* dk,
                       int64_t lddk, float* dv, int64_t lddv, float* scratch) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t d = s.head_dim, kv = s.kv_len;
  const std::vector<QueryBlock> blocks = QueryBlocks(s);
  // Per sequence and group of heads (HeadGroup), split into heads: qs,
  // dos, dqs [group, q_len, d], ks, vs, dks, dvs [group, kv, d]; per head,
  // vt = V^T [d, kv]. Per block, with
  // ds = the block's [rows, keys] of dP, then dS, in the first rows of
  // scratch: dP = dO V^T, dV += P^T dO, dQ = dS K, dK += dS^T Q. Key rows
  // [first, keys) of dK and dV are reached for the first time in block i
  // (causal: its diagonal; otherwise all of them in block 0) and are
  // overwritten; earlier ones accumulate. dV and dK have the same shapes:
  // one key_rows kernel pair per block serves both.
  std::vector<SmallGemm> dp_g, dq_g;
  std::vector<KeyRowsGemm> key_rows;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const QueryBlock& qb = blocks[i];
    const int64_t first = s.causal ? qb.q0 : (i == 0 ? 0 : qb.keys);
    dp_g.emplace_back(false, qb.rows, qb.keys, d, d, kv, kv, false);
    dq_g.emplace_back(false, qb.rows, d, qb.keys, kv, d, d, false);
    key_rows.push_back(KeyRowsGemm(qb, first, d, kv, d, d));
  }
  const int64_t group = HeadGroup(s.heads, 3 * s.q_len * d + 4 * kv * d);
  const int64_t hq = group * s.q_len * d, hk = group * kv * d;
  float* qs = ThreadScratch<float>(0, 3 * hq + 4 * hk + d * kv);
  float* dos = qs + hq;
  float* dqs = dos + hq;
  float* ks = dqs + hq;
  float* vs = ks + hk;
  float* dks = vs + hk;
  float* dvs = dks + hk;
  float* vt = dvs + hk;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h0 = 0; h0 < s.heads; h0 += group) {
      const int64_t g = std::min(group, s.heads - h0), col = h0 * d;
      SplitHeads(q + b * s.q_len * ldq + col, s.q_len, g, d, ldq, qs);
      SplitHeads(dout + b * s.q_len * ldo + col, s.q_len, g, d, ldo, dos);
      SplitHeads(k + b * kv * ldk + col, kv, g, d, ldk, ks);
      SplitHeads(v + b * kv * ldv + col, kv, g, d, ldv, vs);
      for (int64_t h = 0; h < g; ++h) {
        const float* p = probs + (b * s.heads + h0 + h) * s.q_len * kv;
        const float* qh = qs + h * s.q_len * d;
        const float* doh = dos + h * s.q_len * d;
        const float* kh = ks + h * kv * d;
        float* dqh = dqs + h * s.q_len * d;
        float* dkh = dks + h * kv * d;
        float* dvh = dvs + h * kv * d;
        TransposeInto(vs + h * kv * d, kv, d, d, vt);
        for (size_t i = 0; i < blocks.size(); ++i) {
          const QueryBlock& qb = blocks[i];
          const float* pb = p + qb.q0 * kv;
          const float* dob = doh + qb.q0 * d;
          dp_g[i](dob, vt, scratch);
          key_rows[i](pb, dob, dvh);
          // dS = scale * P (dP - rowdot(P, dP)); masked entries have P = 0.
          simd::SoftmaxRowsBackwardInPlace(pb, kv, scratch, kv, qb.rows, qb.keys, scale);
          dq_g[i](scratch, kh, dqh + qb.q0 * d);
          key_rows[i](scratch, qh + qb.q0 * d, dkh);
        }
      }
      JoinHeads(dqs, s.q_len, g, d, dq + b * s.q_len * lddq + col, lddq);
      JoinHeads(dks, kv, g, d, dk + b * kv * lddk + col, lddk);
      JoinHeads(dvs, kv, g, d, dv + b * kv * lddv + col, lddv);
    }
  }
}

// ---- bf16 attention ----------------------------------------------------------

namespace {

// Row-major C[m, n] (f32) = A[m, k] B, or += when accumulate: A bf16
// row-major (row stride lda), B bf16 in VNNI row pairs, element (kk, j) at
// b[((kk / 2) * ldb + j) * 2 + kk % 2], k even. LIBXSMM's bf16 kernel for
// the column-major C^T = B^T A^T, whose first operand B^T is then what
// LIBXSMM calls a VNNI "A". ok() is false where LIBXSMM declines the shape.
class SmallGemmBF16 {
 public:
  SmallGemmBF16(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                bool accumulate)
      : fn_(k % 2 != 0 ? nullptr
                       : DispatchRowMajor(libxsmm_bsmmdispatch, m, n, k, lda, ldb, ldc,
                                          accumulate, LIBXSMM_GEMM_FLAG_VNNI_A)) {}

  bool ok() const { return fn_ != nullptr; }
  void operator()(const BF16* a, const BF16* b, float* c) const {
    fn_(reinterpret_cast<const libxsmm_bfloat16*>(b), reinterpret_cast<const libxsmm_bfloat16*>(a),
        c);
  }

 private:
  libxsmm_bsmmfunction fn_;
};

int64_t RoundUpEven(int64_t n) { return n + (n & 1); }

// TransposePairs reads 32-bit words: its source must be 4-byte aligned.
bool Aligned4(const BF16* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

const uint16_t* Bits(const BF16* p) { return reinterpret_cast<const uint16_t*>(p); }
uint16_t* Bits(BF16* p) { return reinterpret_cast<uint16_t*>(p); }


// B^T in VNNI pairs for a row-major [rows, d] matrix B (row stride ld, d and
// ld even, B 4-byte aligned): the pair (B[j, 2c], B[j, 2c + 1]) is one
// 32-bit word, and the words transposed, [d / 2][rows] (LIBXSMM's 32-bit
// transpose).
void TransposePairs(const BF16* src, int64_t rows, int64_t d, int64_t ld, BF16* dst) {
  libxsmm_otrans(dst, src, 4, static_cast<libxsmm_blasint>(d / 2),
                 static_cast<libxsmm_blasint>(rows), static_cast<libxsmm_blasint>(ld / 2),
                 static_cast<libxsmm_blasint>(rows));
}

// The layout work around the bf16 GEMMs, in AVX-512 (BW, BF16) code: it
// runs only where NativeBf16Attention() holds, and at head_dim 64 the
// GEMMs do just 2 dot-product instructions per 16 elements of P, so
// conversions and transposes written as scalar loops or LIBXSMM's generic
// 16-bit transpose took about half of the backward's time.
SK_ISA_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512bf16")
// GCC 12 reports the _mm512_undefined_epi32() inside its own intrinsics
// (avx512fintrin.h) as uninitialised once they are inlined (as simd.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The first n lanes (none for n <= 0, all for n >= the lane count).
__mmask32 Mask32(int64_t n) {
  return n <= 0 ? __mmask32{0} : n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1;
}
__mmask16 Mask16(int64_t n) {
  return n <= 0 ? __mmask16{0} : n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

// 16 f32 lanes of a and of b rounded to bf16 (vcvtne2ps2bf16: nearest even;
// subnormal inputs and results become zero, as the dot-product instruction
// reads them anyway): a's in elements 0-15, b's in 16-31.
__m512i Bf16Of(__m512 a, __m512 b) { return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)); }

// Index vectors for _mm512_permutex(2)var_epi16.
__m512i Index16(int first, int step, int second_from) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) {
    idx[i] = static_cast<int16_t>(second_from < 0 ? first + step * i
                                                   : (i % 2 == 0 ? first + i / 2
                                                                 : second_from + i / 2));
  }
  return _mm512_load_si512(idx);
}

// Rows [0, rows) of an f32 block (row stride ld), columns [0, cols), rounded
// into bf16 rows of stride ldo, column cols zeroed when cols is odd (the
// even k the VNNI kernels take): attention's P and dS as a GEMM's A.
void NarrowRowsPadded(const float* src, int64_t rows, int64_t cols, int64_t ld, BF16* dst,
                      int64_t ldo) {
  const int64_t cols2 = RoundUpEven(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * ld;
    uint16_t* y = Bits(dst + r * ldo);
    for (int64_t j = 0; j < cols2; j += 32) {
      const __m512 a = _mm512_maskz_loadu_ps(Mask16(cols - j), x + j);
      const __m512 b = _mm512_maskz_loadu_ps(Mask16(cols - j - 16), x + j + 16);
      _mm512_mask_storeu_epi16(y + j, Mask32(cols2 - j), Bf16Of(a, b));
    }
  }
}
// The same rows as VNNI row pairs, [RoundUpEven(rows) / 2][ldo][2]:
// element j of rows 2p and 2p + 1 side by side (an odd last row pairs
// with zeros): P and dS as a GEMM's B.
void NarrowRowPairs(const float* src, int64_t rows, int64_t cols, int64_t ld, BF16* dst,
                    int64_t ldo) {
  const __m512i interleave = Index16(0, 0, 16);  // a0 b0 a1 b1 ...
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const float* r0 = src + 2 * p * ld;
    const bool odd = 2 * p + 1 == rows;
    uint16_t* y = Bits(dst + 2 * p * ldo);
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 m = Mask16(cols - j);
      const __m512 a = _mm512_maskz_loadu_ps(m, r0 + j);
      const __m512 b = odd ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, r0 + ld + j);
      _mm512_mask_storeu_epi16(y + 2 * j, Mask32(2 * (cols - j)),
                               _mm512_permutexvar_epi16(interleave, Bf16Of(a, b)));
    }
  }
}
// A bf16 [rows, cols] matrix (row stride ld) in VNNI row pairs,
// [RoundUpEven(rows) / 2][cols][2] (an odd last row pairs with zeros).
void PackRowPairs(const BF16* src, int64_t rows, int64_t cols, int64_t ld, BF16* dst) {
  const __m512i lo = Index16(0, 0, 32), hi = Index16(16, 0, 48);
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const uint16_t* r0 = Bits(src + 2 * p * ld);
    const bool odd = 2 * p + 1 == rows;
    uint16_t* y = Bits(dst + 2 * p * cols);
    for (int64_t c = 0; c < cols; c += 32) {
      const int64_t n = cols - c;
      const __m512i a = _mm512_maskz_loadu_epi16(Mask32(n), r0 + c);
      const __m512i b = odd ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(Mask32(n), r0 + ld + c);
      _mm512_mask_storeu_epi16(y + 2 * c, Mask32(2 * n), _mm512_permutex2var_epi16(a, lo, b));
      if (n > 16) {
        _mm512_mask_storeu_epi16(y + 2 * c + 32, Mask32(2 * (n - 16)),
                                 _mm512_permutex2var_epi16(a, hi, b));
      }
    }
  }
}
// dst [d, ld_dst] = src^T for a bf16 row-major [rows, d] src (row stride
// ld), columns [rows, ld_dst) zero. With d and ld even and src 4-byte
// aligned: LIBXSMM's 32-bit transpose of the column pairs into words [d /
// 2][rows] (TransposePairs into scratch w, rows * d elements), each word
// row then split into its low and high halves, rows 2c and 2c + 1
// (LIBXSMM's 16-bit transpose, the other case, is ~5x slower).
void TransposeBf16(const BF16* src, int64_t rows, int64_t d, int64_t ld, int64_t ld_dst,
                   BF16* w, BF16* dst) {
  uint16_t* out = Bits(dst);
  if (d % 2 == 0 && ld % 2 == 0 && Aligned4(src)) {
    TransposePairs(src, rows, d, ld, w);
    const __m512i even = Index16(0, 2, -1), odd = Index16(1, 2, -1);
    for (int64_t c = 0; c < d / 2; ++c) {
      const uint32_t* wr = reinterpret_cast<const uint32_t*>(w) + c * rows;
      uint16_t* y0 = out + 2 * c * ld_dst;
      uint16_t* y1 = y0 + ld_dst;
      for (int64_t t = 0; t < rows; t += 32) {
        const int64_t n = rows - t;
        const __m512i a = _mm512_maskz_loadu_epi32(Mask16(n), wr + t);
        const __m512i b = _mm512_maskz_loadu_epi32(Mask16(n - 16), wr + t + 16);
        _mm512_mask_storeu_epi16(y0 + t, Mask32(n), _mm512_permutex2var_epi16(a, even, b));
        _mm512_mask_storeu_epi16(y1 + t, Mask32(n), _mm512_permutex2var_epi16(a, odd, b));
      }
    }
  } else {
    libxsmm_otrans(dst, src, 2, static_cast<libxsmm_blasint>(d),
                   static_cast<libxsmm_blasint>(rows), static_cast<libxsmm_blasint>(ld),
                   static_cast<libxsmm_blasint>(ld_dst));
  }
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t j = rows; j < ld_dst; ++j) out[c * ld_dst + j] = 0;
  }
}

// A sequence's [tokens, g * d] bf16 columns (row stride ld) widened into g
// contiguous f32 [tokens, d] matrices, dst + h * tokens * d, token rows
// read whole as SplitHeads reads them.
void WidenSplitHeads(const BF16* src, int64_t tokens, int64_t g, int64_t d, int64_t ld,
                     float* dst) {
  for (int64_t t = 0; t < tokens; ++t) {
    const uint16_t* row = Bits(src + t * ld);
    for (int64_t h = 0; h < g; ++h) {
      const uint16_t* x = row + h * d;
      float* o = dst + (h * tokens + t) * d;
      for (int64_t j = 0; j < d; j += 16) {
        const __mmask16 m = Mask16(d - j);
        const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + j));
        _mm512_mask_storeu_ps(o + j, m, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
      }
    }
  }
}

#pragma GCC diagnostic pop
SK_ISA_TARGET_END

// Rows of an f32 [rows, d] block (row stride ld) rounded into bf16 rows of
// stride ldo as NarrowToBf16 (the outputs: subnormals kept).
void NarrowRows(const float* src, int64_t rows, int64_t d, int64_t ld, BF16* dst, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) simd::NarrowToBf16(src + r * ld, d, dst + r * ldo);
}

std::atomic<bool> g_bf16_attention_on{true};

bool Bf16AttentionHardware() {
  // The helpers above need avx512bf16 + bw + vl: what simd's avx512_bf16
  // level needs (BestIsa, the CPU's; SK_CPU_ISA lowers only the loops).
  static const bool native = libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512_CPX &&
                             simd::BestIsa() == simd::Isa::kAvx512Bf16;
  return native;
}

}  // namespace

bool NativeBf16Attention() { return Bf16AttentionHardware() && g_bf16_attention_on.load(); }

bool SetNativeBf16Attention(bool on) { return g_bf16_attention_on.exchange(on); }

bool AttentionForwardBF16(const AttentionShape& s, const BF16* q, int64_t ldq, const BF16* k,
                          int64_t ldk, const BF16* v, int64_t ldv, float* probs, BF16* out,
                          int64_t ldo, const int32_t* key_start) {
  CHECK(!s.causal || s.q_len == s.kv_len) << "causal attention needs q_len == kv_len";
  CHECK(key_start == nullptr || s.causal) << "packed documents need causal attention";
  const int64_t d = s.head_dim, kv = s.kv_len, kv2 = RoundUpEven(kv);
  if (!NativeBf16Attention() || d % 2 != 0 || ldk % 2 != 0 || !Aligned4(k) || kv == 0) {
    return false;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const std::vector<QueryBlock> blocks = QueryBlocks(s);
  // Per sequence and group of heads (HeadGroup), Q split into heads, qg
  // [group, q_len, d] (SplitHeads; read in place, the forward ran 2-7%
  // longer, BM_OpAttention/bwd:0/dtype:1, three alternating runs of 5:
  // 4.69-4.99 against 4.58-4.65 ms); per head: kt = K^T in VNNI
  // pairs [d / 2][kv][2], vp = V in row pairs [kv2 / 2][d][2], os the
  // head's f32 output [q_len, d]. Per block: S = Q K^T into probs, the
  // softmax there, P rounded into p16 [rows, kv2] (an odd key count padded
  // with a zero column that meets vp's zero row), O = P V.
  std::vector<SmallGemmBF16> scores, pv;
  for (const QueryBlock& qb : blocks) {
    scores.emplace_back(qb.rows, qb.keys, d, d, kv, kv, false);
    pv.emplace_back(qb.rows, d, RoundUpEven(qb.keys), kv2, d, d, false);
    if (!scores.back().ok() || !pv.back().ok()) return false;
  }
  BF16* kt = ThreadScratch<BF16>(0, d * kv);
  BF16* vp = ThreadScratch<BF16>(1, kv2 * d);
  BF16* p16 = ThreadScratch<BF16>(2, kQueryBlock * kv2);
  const int64_t group = HeadGroup(s.heads, s.q_len * d);
  BF16* qg = ThreadScratch<BF16>(3, group * s.q_len * d);
  float* os = ThreadScratch<float>(0, s.q_len * d);
  for (int64_t b = 0; b < s.batch; ++b) {
   const int32_t* starts = key_start == nullptr ? nullptr : key_start + b * s.q_len;
   for (int64_t h0 = 0; h0 < s.heads; h0 += group) {
    const int64_t g = std::min(group, s.heads - h0);
    SplitHeads(q + b * s.q_len * ldq + h0 * d, s.q_len, g, d, ldq, qg);
    for (int64_t h = h0; h < h0 + g; ++h) {
      const int64_t col = h * d;
      const BF16* qh = qg + (h - h0) * s.q_len * d;
      float* p = probs + (b * s.heads + h) * s.q_len * kv;
      TransposePairs(k + b * kv * ldk + col, kv, d, ldk, kt);
      PackRowPairs(v + b * kv * ldv + col, kv, d, ldv, vp);
      for (size_t i = 0; i < blocks.size(); ++i) {
        const QueryBlock& qb = blocks[i];
        float* pb = p + qb.q0 * kv;
        scores[i](qh + qb.q0 * d, kt, pb);
        BlockSoftmax(s, qb, starts, scale, kv, pb);
        NarrowRowsPadded(pb, qb.rows, qb.keys, kv, p16, kv2);
        pv[i](p16, vp, os + qb.q0 * d);
      }
      NarrowRows(os, s.q_len, d, d, out + b * s.q_len * ldo + col, ldo);
    }
   }
  }
  return true;
}

bool AttentionBackwardBF16(const AttentionShape& s, const BF16* q, int64_t ldq, const BF16* k,
                           int64_t ldk, const BF16* v, int64_t ldv, const float* probs,
                           const BF16* dout, int64_t ldo, BF16* dq, int64_t lddq, BF16* dk,
                           int64_t lddk, BF16* dv, int64_t lddv, float* scratch) {
  const int64_t d = s.head_dim, kv = s.kv_len, tq = s.q_len, tq2 = RoundUpEven(tq);
  if (!NativeBf16Attention() || d % 2 != 0 || ldv % 2 != 0 || !Aligned4(v) || kv == 0 ||
      tq == 0) {
    return false;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const std::vector<QueryBlock> blocks = QueryBlocks(s);
  // Per (sequence, head): vt = V^T in VNNI pairs [d / 2][kv][2], dot =
  // dO^T [d, tq2] (zero column past an odd q_len), qf and kf the head's Q
  // and K widened to f32 [len, d]; f32 dqh [q_len, d], dkh [kv, d] and dvt
  // = dV^T [d, kv], the key gradients accumulated over the blocks from zero.
  // Per block, in scratch's first rows: dP = dO V^T (bf16 operands); P
  // rounded into row pairs, dV^T += dO^T P (bf16); dS from P and dP (f32);
  // dQ = dS K and dK += dS^T Q in f32 (LIBXSMM's f32 kernels, as the f32
  // kernel does).
  std::vector<SmallGemmBF16> dp_g, dvt_g;
  std::vector<SmallGemm> dq_g, dk_g;
  for (const QueryBlock& qb : blocks) {
    dp_g.emplace_back(qb.rows, qb.keys, d, ldo, kv, kv, false);
    dvt_g.emplace_back(d, qb.keys, RoundUpEven(qb.rows), tq2, kv, kv, true);
    if (!dp_g.back().ok() || !dvt_g.back().ok()) return false;
    dq_g.emplace_back(false, qb.rows, d, qb.keys, kv, d, d, false);
    dk_g.emplace_back(true, qb.keys, d, qb.rows, kv, d, d, true);
  }
  // Q and K are widened a group of heads at a time (HeadGroup), token rows
  // read whole: qg [group, q_len, d], kg [group, kv, d].
  const int64_t group = HeadGroup(s.heads, tq * d + kv * d);
  BF16* vt = ThreadScratch<BF16>(0, d * kv);
  BF16* dot = ThreadScratch<BF16>(1, d * tq2);
  BF16* pairs = ThreadScratch<BF16>(2, kQueryBlock * kv);  // P's row pairs [16][kv][2]
  BF16* w = ThreadScratch<BF16>(3, tq * d);  // TransposeBf16's words
  float* qg = ThreadScratch<float>(0, group * (tq + kv) * d + tq * d);
  float* kg = qg + group * tq * d;
  float* dqh = kg + group * kv * d;
  float* dkh = ThreadScratch<float>(1, 2 * d * kv);
  float* dvt = dkh + d * kv;
  float* kd = ThreadScratch<float>(2, kv * d);  // dV transposed back
  for (int64_t b = 0; b < s.batch; ++b) {
   for (int64_t h0 = 0; h0 < s.heads; h0 += group) {
    const int64_t g = std::min(group, s.heads - h0);
    WidenSplitHeads(q + b * tq * ldq + h0 * d, tq, g, d, ldq, qg);
    WidenSplitHeads(k + b * kv * ldk + h0 * d, kv, g, d, ldk, kg);
    for (int64_t h = h0; h < h0 + g; ++h) {
      const int64_t col = h * d;
      const float* p = probs + (b * s.heads + h) * tq * kv;
      const float* qf = qg + (h - h0) * tq * d;
      const float* kf = kg + (h - h0) * kv * d;
      const BF16* doh = dout + b * tq * ldo + col;
      TransposePairs(v + b * kv * ldv + col, kv, d, ldv, vt);
      TransposeBf16(doh, tq, d, ldo, tq2, w, dot);
      std::fill(dkh, dkh + 2 * d * kv, 0.0f);
      for (size_t i = 0; i < blocks.size(); ++i) {
        const QueryBlock& qb = blocks[i];
        const float* pb = p + qb.q0 * kv;
        dp_g[i](doh + qb.q0 * ldo, vt, scratch);
        NarrowRowPairs(pb, qb.rows, qb.keys, kv, pairs, kv);
        dvt_g[i](dot + qb.q0, pairs, dvt);
        // dS = scale * P (dP - rowdot(P, dP)); masked entries have P = 0.
        simd::SoftmaxRowsBackwardInPlace(pb, kv, scratch, kv, qb.rows, qb.keys, scale);
        dq_g[i](scratch, kf, dqh + qb.q0 * d);
        dk_g[i](scratch, qf + qb.q0 * d, dkh);
      }
      NarrowRows(dqh, tq, d, d, dq + b * tq * lddq + col, lddq);
      NarrowRows(dkh, kv, d, d, dk + b * kv * lddk + col, lddk);
      TransposeInto(dvt, d, kv, kv, kd);
      NarrowRows(kd, kv, d, d, dv + b * kv * lddv + col, lddv);
    }
   }
  }
  return true;
}
}  // namespace sk
