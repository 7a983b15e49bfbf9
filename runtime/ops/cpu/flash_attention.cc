#include "runtime/ops/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/ops/cpu/simd.h"
#include "runtime/ops/cpu/small_gemm.h"

namespace sk {

namespace {

// The calling thread's f32 scratch, one buffer per slot, grown as asked.
float* Scratch(int slot, int64_t n) {
  thread_local std::vector<float> bufs[5];
  std::vector<float>& b = bufs[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// The first key query i of a sequence attends: its document's first
// position (ks: the sequence's key starts, clamped into [0, i]), or 0.
int64_t KeyStart(const int32_t* ks, int64_t i) {
  return ks == nullptr ? 0 : std::clamp<int64_t>(ks[i], 0, i);
}

// The keys query i of a sequence attends within key block [j0, j0 + nc):
// block columns [lo, hi), none when hi <= lo (causal: up to the diagonal;
// packed documents: from the document's first key).
struct KeyRange {
  int64_t lo, hi;
  int64_t count() const { return hi > lo ? hi - lo : 0; }
};
KeyRange KeysInBlock(const ops::AttentionShape& s, const int32_t* ks, int64_t i, int64_t j0,
                     int64_t nc) {
  const int64_t hi = s.causal ? std::clamp<int64_t>(i + 1 - j0, 0, nc) : nc;
  return {std::clamp<int64_t>(KeyStart(ks, i) - j0, 0, nc), hi};
}

// The smallest key start of queries [i0, i0 + nr) (0 without documents).
int64_t FirstKey(const int32_t* ks, int64_t i0, int64_t nr) {
  int64_t first = KeyStart(ks, i0);
  for (int64_t i = i0 + 1; i < i0 + nr && first > 0; ++i) first = std::min(first, KeyStart(ks, i));
  return first;
}

// dst[rows, cols] (row stride cols) = src[rows, cols] (row stride ld).
void CopyRows(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * ld, cols, dst + r * cols);
}

// dst[rows, cols] (row stride ld) = src[rows, cols] (row stride cols).
void StoreRows(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * cols, cols, dst + r * ld);
}

// The floats of one head's K^T (or V^T) in key-block panels (PackPanels).
int64_t PanelFloats(int64_t kv, int64_t hd) {
  return (kv + kFlashKeyBlock - 1) / kFlashKeyBlock * kFlashKeyBlock * hd;
}

// src[kv, hd] (row stride ld) transposed into one panel per key block: the
// block of keys [j0, j0 + nc) at dst + j0 hd is [hd, nc] with row stride
// kFlashKeyBlock. Every block's GEMM then reads a contiguous 32 KiB (at hd
// = 64) instead of rows kv apart: at kv a power of two, the whole K^T's rows
// fall in the same L1 sets, and the score GEMMs ran at half the rate of
// the packed ones (LIBXSMM, 64 x 128 x 64, on this repository's 2-core AVX2
// EPYC: 31-44 against 80-90 GFLOP/s).
void PackPanels(const float* src, int64_t kv, int64_t hd, int64_t ld, float* dst) {
  for (int64_t j0 = 0; j0 < kv; j0 += kFlashKeyBlock) {
    TransposeInto(src + j0 * ld, std::min(kFlashKeyBlock, kv - j0), hd, ld, dst + j0 * hd,
                  kFlashKeyBlock);
  }
}

// A SmallGemm per block shape: the full block's made once per call, an
// edge block's when met (LIBXSMM caches each shape's kernel, so that is a
// lookup).
class BlockGemm {
 public:
  BlockGemm(bool trans_a, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
            bool accumulate)
      : trans_a_(trans_a), m_(m), n_(n), k_(k), lda_(lda), ldb_(ldb), ldc_(ldc),
        accumulate_(accumulate), full_(trans_a, m, n, k, lda, ldb, ldc, accumulate) {}
  // C = op(A) B on an m x n x k block (each at most the full block's).
  void operator()(int64_t m, int64_t n, int64_t k, const float* a, const float* b,
                  float* c) const {
    if (m == m_ && n == n_ && k == k_) {
      full_(a, b, c);
    } else {
      SmallGemm(trans_a_, m, n, k, lda_, ldb_, ldc_, accumulate_)(a, b, c);
    }
  }

 private:
  bool trans_a_;
  int64_t m_, n_, k_, lda_, ldb_, ldc_;
  bool accumulate_;
  SmallGemm full_;
};

}  // namespace

int64_t FlashAttentionUnits(const ops::AttentionShape& s) { return s.batch * s.KvHeads(); }

// Per unit (sequence b, key/value head kh): K^T in key-block panels and V
// copied contiguous; per query head h of its group, per query block of
// kFlashQueryBlock rows (copied contiguous): S = Q K^T block by block, the
// online softmax over the block's valid keys (running max m and sum l per
// row, earlier output rows rescaled by exp(m_old - m_new)), O += P V.
// Causal key blocks past a query block's last row are skipped.
void FlashAttentionForward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                           const float* k, int64_t ldk, const float* v, int64_t ldv, float* out,
                           int64_t ldo, float* lse, int64_t unit_begin, int64_t unit_end,
                           const int32_t* key_start) {
  const int64_t hd = s.head_dim, kv = s.kv_len, group = s.Group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr int64_t br = kFlashQueryBlock, bc = kFlashKeyBlock;
  float* kt = Scratch(0, PanelFloats(kv, hd));  // K^T of the unit's head, in panels
  float* vc = Scratch(1, kv * hd);              // V of the unit's head [kv, hd]
  float* qc = Scratch(2, 2 * br * hd);          // the query block, then its output
  float* acc = qc + br * hd;
  float* sc = Scratch(3, br * bc);              // one block of scores, then probabilities
  float* ml = Scratch(4, 2 * br);               // running max and sum per row
  const BlockGemm scores(false, br, bc, hd, hd, bc, bc, false);  // S = Q K^T
  const BlockGemm pv(false, br, hd, bc, bc, hd, hd, true);       // O += P V
  for (int64_t u = unit_begin; u < unit_end; ++u) {
    const int64_t b = u / s.KvHeads(), kh = u % s.KvHeads();
    if (kv == 0) continue;
    const int32_t* ks = key_start == nullptr ? nullptr : key_start + b * s.q_len;
    PackPanels(k + b * kv * ldk + kh * hd, kv, hd, ldk, kt);
    CopyRows(v + b * kv * ldv + kh * hd, kv, hd, ldv, vc);
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      for (int64_t i0 = 0; i0 < s.q_len; i0 += br) {
        const int64_t nr = std::min(br, s.q_len - i0);
        CopyRows(q + (b * s.q_len + i0) * ldq + h * hd, nr, hd, ldq, qc);
        float* m = ml;
        float* l = ml + br;
        std::fill(m, m + nr, -std::numeric_limits<float>::infinity());
        std::fill(l, l + nr, 0.0f);
        std::fill(acc, acc + nr * hd, 0.0f);
        const int64_t key_end = s.causal ? std::min(kv, i0 + nr) : kv;
        // Packed documents: key blocks before every row's document are skipped.
        const int64_t key_begin = FirstKey(ks, i0, nr) / bc * bc;
        for (int64_t j0 = key_begin; j0 < key_end; j0 += bc) {
          const int64_t nc = std::min(bc, kv - j0);
          scores(nr, nc, hd, qc, kt + j0 * hd, sc);
          for (int64_t r = 0; r < nr; ++r) {
            float* row = sc + r * bc;
            const KeyRange keys = KeysInBlock(s, ks, i0 + r, j0, nc);
            const int64_t valid = keys.count();
            if (valid == 0) {
              std::fill(row, row + nc, 0.0f);
              continue;
            }
            float* live = row + keys.lo;
            const float m_new = std::max(m[r], simd::MaxOfRow(live, valid) * scale);
            const float sum = simd::ScaledExpShiftInPlace(live, valid, scale, m_new);
            std::fill(row, live, 0.0f);
            std::fill(live + valid, row + nc, 0.0f);
            if (m_new != m[r]) {
              // Rescale what the earlier blocks summed to the new running max
              // (exp(-inf) = 0 on the first block).
              const float correction = std::exp(m[r] - m_new);
              l[r] *= correction;
              simd::ScaleInPlace(acc + r * hd, correction, hd);
              m[r] = m_new;
            }
            l[r] += sum;
          }
          pv(nr, hd, nc, sc, vc + j0 * hd, acc);
        }
        for (int64_t r = 0; r < nr; ++r) {
          simd::ScaleInPlace(acc + r * hd, 1.0f / l[r], hd);
          lse[(b * s.heads + h) * s.q_len + i0 + r] = m[r] + std::log(l[r]);
        }
        StoreRows(acc, nr, hd, out + (b * s.q_len + i0) * ldo + h * hd, ldo);
      }
    }
  }
}

// Per unit (b, kh): K^T and V^T in key-block panels, K copied contiguous,
// dK and dV accumulators [kv, hd] zeroed; per query head h of the group:
// Q and dO copied contiguous, delta = rowsum(dO o O), h's dQ accumulator
// zeroed, then key blocks outer and query blocks inner (causal: from the
// first query block that sees the key block): S = Q K^T, P = exp(scale S -
// lse), dP = dO V^T, dS = scale P (dP - delta), dV += P^T dO, dK += dS^T
// Q, dQ += dS K. Every GEMM reads contiguous operands and accumulates into
// contiguous rows; dK and dV sum the group's heads in place.
void FlashAttentionBackward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                            const float* k, int64_t ldk, const float* v, int64_t ldv,
                            const float* out, int64_t ldo, const float* dout, int64_t lddo,
                            const float* lse, float* dq, int64_t lddq, float* dk, int64_t lddk,
                            float* dv, int64_t lddv, float* workspace, int64_t unit_begin,
                            int64_t unit_end, const int32_t* key_start) {
  const int64_t hd = s.head_dim, kv = s.kv_len, tq = s.q_len, group = s.Group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr int64_t br = kFlashQueryBlock, bc = kFlashKeyBlock;
  float* delta = workspace;                          // [batch, heads, q_len]
  float* dq_acc = workspace + s.batch * s.heads * tq;  // [batch, heads, q_len, hd]
  const int64_t panels = PanelFloats(kv, hd);
  float* kt = Scratch(0, 2 * panels);  // K^T and V^T of the unit's head, in panels
  float* vt = kt + panels;
  float* kc = Scratch(1, 3 * kv * hd);  // K, then the dK and dV accumulators [kv, hd]
  float* dk_acc = kc + kv * hd;
  float* dv_acc = dk_acc + kv * hd;
  float* qc = Scratch(2, 2 * tq * hd);  // Q and dO of one query head [q_len, hd]
  float* doc = qc + tq * hd;
  float* p = Scratch(3, 2 * br * bc);  // P, then dP and dS, of one block
  float* ds = p + br * bc;
  const BlockGemm scores(false, br, bc, hd, hd, bc, bc, false);  // S = Q K^T
  const BlockGemm dp(false, br, bc, hd, hd, bc, bc, false);      // dP = dO V^T
  const BlockGemm dv_g(true, bc, hd, br, bc, hd, hd, true);      // dV += P^T dO
  const BlockGemm dk_g(true, bc, hd, br, bc, hd, hd, true);      // dK += dS^T Q
  const BlockGemm dq_g(false, br, hd, bc, bc, hd, hd, true);     // dQ += dS K
  for (int64_t u = unit_begin; u < unit_end; ++u) {
    const int64_t b = u / s.KvHeads(), kh = u % s.KvHeads();
    const int32_t* ks = key_start == nullptr ? nullptr : key_start + b * tq;
    PackPanels(k + b * kv * ldk + kh * hd, kv, hd, ldk, kt);
    PackPanels(v + b * kv * ldv + kh * hd, kv, hd, ldv, vt);
    CopyRows(k + b * kv * ldk + kh * hd, kv, hd, ldk, kc);
    std::fill(dk_acc, dk_acc + 2 * kv * hd, 0.0f);
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      const int64_t bh = b * s.heads + h;
      CopyRows(q + b * tq * ldq + h * hd, tq, hd, ldq, qc);
      CopyRows(dout + b * tq * lddo + h * hd, tq, hd, lddo, doc);
      float* delta_h = delta + bh * tq;
      for (int64_t i = 0; i < tq; ++i) {
        const float* oi = out + (b * tq + i) * ldo + h * hd;
        const float* doi = doc + i * hd;
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += doi[d] * oi[d];
        delta_h[i] = dot;
      }
      float* dq_h = dq_acc + bh * tq * hd;
      std::fill(dq_h, dq_h + tq * hd, 0.0f);
      const float* lse_h = lse + bh * tq;
      for (int64_t j0 = 0; j0 < kv; j0 += bc) {
        const int64_t nc = std::min(bc, kv - j0);
        const int64_t first_block = s.causal ? j0 / br * br : 0;  // causal: earlier queries see none
        for (int64_t i0 = first_block; i0 < tq; i0 += br) {
          const int64_t nr = std::min(br, tq - i0);
          // Packed documents: a query block whose rows all start past this
          // key block sees none of it.
          if (FirstKey(ks, i0, nr) >= j0 + nc) continue;
          const float* qb = qc + i0 * hd;
          const float* dob = doc + i0 * hd;
          scores(nr, nc, hd, qb, kt + j0 * hd, p);
          dp(nr, nc, hd, dob, vt + j0 * hd, ds);
          for (int64_t r = 0; r < nr; ++r) {
            float* pr = p + r * bc;
            float* dsr = ds + r * bc;
            const KeyRange keys = KeysInBlock(s, ks, i0 + r, j0, nc);
            const int64_t lo = std::min(keys.lo, keys.hi), valid = keys.count();
            simd::ScaledExpShiftInPlace(pr + lo, valid, scale, lse_h[i0 + r]);
            simd::SoftmaxGradFromDeltaInPlace(pr + lo, dsr + lo, valid, delta_h[i0 + r], scale);
            std::fill(pr, pr + lo, 0.0f);
            std::fill(dsr, dsr + lo, 0.0f);
            std::fill(pr + lo + valid, pr + nc, 0.0f);
            std::fill(dsr + lo + valid, dsr + nc, 0.0f);
          }
          dv_g(nc, hd, nr, p, dob, dv_acc + j0 * hd);
          dk_g(nc, hd, nr, ds, qb, dk_acc + j0 * hd);
          dq_g(nr, hd, nc, ds, kc + j0 * hd, dq_h + i0 * hd);
        }
      }
      StoreRows(dq_h, tq, hd, dq + b * tq * lddq + h * hd, lddq);
    }
    StoreRows(dk_acc, kv, hd, dk + b * kv * lddk + kh * hd, lddk);
    StoreRows(dv_acc, kv, hd, dv + b * kv * lddv + kh * hd, lddv);
  }
}

}  // namespace sk
