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
  thread_local std::vector<float> bufs[4];
  std::vector<float>& b = bufs[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// The keys query i of a sequence attends within key block [j0, j0 + nc):
// how many of the block's first keys (0 when none, causal).
int64_t KeysInBlock(const ops::AttentionShape& s, int64_t i, int64_t j0, int64_t nc) {
  if (!s.causal) return nc;
  return std::clamp<int64_t>(i + 1 - j0, 0, nc);
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

// Per unit (sequence b, key/value head kh), per query head h of its group,
// per query block of kFlashQueryBlock rows: S = Q K^T block by block
// against K^T transposed once per unit, the online softmax over the block's
// valid keys (running max m and sum l per row, earlier output rows rescaled
// by exp(m_old - m_new)), O += P V. Causal key blocks past a query block's
// last row are skipped.
void FlashAttentionForward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                           const float* k, int64_t ldk, const float* v, int64_t ldv, float* out,
                           int64_t ldo, float* lse, int64_t unit_begin, int64_t unit_end) {
  const int64_t hd = s.head_dim, kv = s.kv_len, group = s.Group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr int64_t br = kFlashQueryBlock, bc = kFlashKeyBlock;
  float* kt = Scratch(0, hd * kv);          // K^T of the unit's key/value head [hd, kv]
  float* sc = Scratch(1, br * bc);          // one block of scores, then probabilities
  float* acc = Scratch(2, br * hd);         // the query block's unnormalised output
  float* ml = Scratch(3, 2 * br);           // running max and sum per row
  const BlockGemm scores(false, br, bc, hd, ldq, kv, bc, false);  // S = Q K^T
  const BlockGemm pv(false, br, hd, bc, bc, ldv, hd, true);       // O += P V
  for (int64_t u = unit_begin; u < unit_end; ++u) {
    const int64_t b = u / s.KvHeads(), kh = u % s.KvHeads();
    if (kv == 0) continue;
    TransposeInto(k + b * kv * ldk + kh * hd, kv, hd, ldk, kt);
    const float* vb = v + b * kv * ldv + kh * hd;
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      for (int64_t i0 = 0; i0 < s.q_len; i0 += br) {
        const int64_t nr = std::min(br, s.q_len - i0);
        const float* qb = q + (b * s.q_len + i0) * ldq + h * hd;
        float* m = ml;
        float* l = ml + br;
        std::fill(m, m + nr, -std::numeric_limits<float>::infinity());
        std::fill(l, l + nr, 0.0f);
        std::fill(acc, acc + nr * hd, 0.0f);
        const int64_t key_end = s.causal ? std::min(kv, i0 + nr) : kv;
        for (int64_t j0 = 0; j0 < key_end; j0 += bc) {
          const int64_t nc = std::min(bc, kv - j0);
          scores(nr, nc, hd, qb, kt + j0, sc);
          for (int64_t r = 0; r < nr; ++r) {
            float* row = sc + r * bc;
            const int64_t valid = KeysInBlock(s, i0 + r, j0, nc);
            if (valid == 0) {
              std::fill(row, row + nc, 0.0f);
              continue;
            }
            const float m_new = std::max(m[r], simd::MaxOfRow(row, valid) * scale);
            const float sum = simd::ScaledExpShiftInPlace(row, valid, scale, m_new);
            std::fill(row + valid, row + nc, 0.0f);
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
          pv(nr, hd, nc, sc, vb + j0 * ldv, acc);
        }
        for (int64_t r = 0; r < nr; ++r) {
          float* o = out + (b * s.q_len + i0 + r) * ldo + h * hd;
          const float inv = 1.0f / l[r];
          for (int64_t d = 0; d < hd; ++d) o[d] = acc[r * hd + d] * inv;
          lse[(b * s.heads + h) * s.q_len + i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

// Per unit (b, kh): delta = rowsum(dO o O) for the group's query heads and
// their dQ accumulators zeroed; then key blocks outermost (FlashAttention-2's
// backward: a block's dK and dV are complete after one pass over the queries
// that see it, of every query head of the group), per query block:
// S = Q K^T, P = exp(scale S - lse), dV += P^T dO, dP = dO V^T,
// dS = scale P (dP - delta), dQ += dS K, dK += dS^T Q.
void FlashAttentionBackward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                            const float* k, int64_t ldk, const float* v, int64_t ldv,
                            const float* out, int64_t ldo, const float* dout, int64_t lddo,
                            const float* lse, float* dq, int64_t lddq, float* dk, int64_t lddk,
                            float* dv, int64_t lddv, float* workspace, int64_t unit_begin,
                            int64_t unit_end) {
  const int64_t hd = s.head_dim, kv = s.kv_len, group = s.Group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr int64_t br = kFlashQueryBlock, bc = kFlashKeyBlock;
  float* delta = workspace;                              // [batch, heads, q_len]
  float* dq_acc = workspace + s.batch * s.heads * s.q_len;  // [batch, heads, q_len, hd]
  float* kvt = Scratch(0, 2 * hd * kv);  // K^T and V^T of the unit's head [hd, kv] each
  float* p = Scratch(1, 2 * br * bc);    // P, then dP and dS, of one block
  float* dkv = Scratch(2, 2 * bc * hd);  // the key block's dK and dV accumulators
  float* kt = kvt;
  float* vt = kvt + hd * kv;
  float* ds = p + br * bc;
  float* dk_acc = dkv;
  float* dv_acc = dkv + bc * hd;
  const BlockGemm scores(false, br, bc, hd, ldq, kv, bc, false);  // S = Q K^T
  const BlockGemm dp(false, br, bc, hd, lddo, kv, bc, false);     // dP = dO V^T
  const BlockGemm dv_g(true, bc, hd, br, bc, lddo, hd, true);     // dV += P^T dO
  const BlockGemm dk_g(true, bc, hd, br, bc, ldq, hd, true);      // dK += dS^T Q
  const BlockGemm dq_g(false, br, hd, bc, bc, ldk, hd, true);     // dQ += dS K
  for (int64_t u = unit_begin; u < unit_end; ++u) {
    const int64_t b = u / s.KvHeads(), kh = u % s.KvHeads();
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      const int64_t bh = b * s.heads + h;
      for (int64_t i = 0; i < s.q_len; ++i) {
        const float* oi = out + (b * s.q_len + i) * ldo + h * hd;
        const float* doi = dout + (b * s.q_len + i) * lddo + h * hd;
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += doi[d] * oi[d];
        delta[bh * s.q_len + i] = dot;
      }
      std::fill(dq_acc + bh * s.q_len * hd, dq_acc + (bh + 1) * s.q_len * hd, 0.0f);
    }
    if (kv > 0) {
      TransposeInto(k + b * kv * ldk + kh * hd, kv, hd, ldk, kt);
      TransposeInto(v + b * kv * ldv + kh * hd, kv, hd, ldv, vt);
    }
    const float* kb = k + b * kv * ldk + kh * hd;
    for (int64_t j0 = 0; j0 < kv; j0 += bc) {
      const int64_t nc = std::min(bc, kv - j0);
      std::fill(dkv, dkv + 2 * bc * hd, 0.0f);
      const int64_t first_block = s.causal ? j0 / br * br : 0;  // causal: earlier queries see none
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        const int64_t bh = b * s.heads + h;
        for (int64_t i0 = first_block; i0 < s.q_len; i0 += br) {
          const int64_t nr = std::min(br, s.q_len - i0);
          const float* qb = q + (b * s.q_len + i0) * ldq + h * hd;
          const float* dob = dout + (b * s.q_len + i0) * lddo + h * hd;
          scores(nr, nc, hd, qb, kt + j0, p);
          dp(nr, nc, hd, dob, vt + j0, ds);
          for (int64_t r = 0; r < nr; ++r) {
            float* pr = p + r * bc;
            float* dsr = ds + r * bc;
            const int64_t valid = KeysInBlock(s, i0 + r, j0, nc);
            simd::ScaledExpShiftInPlace(pr, valid, scale, lse[bh * s.q_len + i0 + r]);
            const float delta_r = delta[bh * s.q_len + i0 + r];
            for (int64_t j = 0; j < valid; ++j) dsr[j] = pr[j] * (dsr[j] - delta_r) * scale;
            std::fill(pr + valid, pr + nc, 0.0f);
            std::fill(dsr + valid, dsr + nc, 0.0f);
          }
          dv_g(nc, hd, nr, p, dob, dv_acc);
          dk_g(nc, hd, nr, ds, qb, dk_acc);
          dq_g(nr, hd, nc, ds, kb + j0 * ldk, dq_acc + (bh * s.q_len + i0) * hd);
        }
      }
      for (int64_t j = 0; j < nc; ++j) {
        std::copy_n(dk_acc + j * hd, hd, dk + (b * kv + j0 + j) * lddk + kh * hd);
        std::copy_n(dv_acc + j * hd, hd, dv + (b * kv + j0 + j) * lddv + kh * hd);
      }
    }
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      const float* dqh = dq_acc + (b * s.heads + h) * s.q_len * hd;
      for (int64_t i = 0; i < s.q_len; ++i) {
        std::copy_n(dqh + i * hd, hd, dq + (b * s.q_len + i) * lddq + h * hd);
      }
    }
  }
}

}  // namespace sk
