#include "runtime/ops/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sk {

namespace {

// The keys query i of a sequence attends: [0, KeysOf(i)).
int64_t KeysOf(const ops::AttentionShape& s, int64_t i) { return s.causal ? i + 1 : s.kv_len; }

}  // namespace

void FlashAttentionForward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                           const float* k, int64_t ldk, const float* v, int64_t ldv, float* out,
                           int64_t ldo, float* lse) {
  const int64_t hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> acc(static_cast<size_t>(hd));
  float scores[kFlashKeyBlock];
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kh = h / s.Group();  // its key/value head
      for (int64_t i = 0; i < s.q_len; ++i) {
        const float* qi = q + (b * s.q_len + i) * ldq + h * hd;
        const int64_t keys = KeysOf(s, i);
        float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j0 = 0; j0 < keys; j0 += kFlashKeyBlock) {
          const int64_t nj = std::min(kFlashKeyBlock, keys - j0);
          float block_max = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < nj; ++j) {
            const float* kj = k + (b * s.kv_len + j0 + j) * ldk + kh * hd;
            float dot = 0.0f;
            for (int64_t d = 0; d < hd; ++d) dot += qi[d] * kj[d];
            scores[j] = dot * scale;
            block_max = std::max(block_max, scores[j]);
          }
          // Rescale what the earlier blocks summed to the new running max.
          const float m_new = std::max(m, block_max);
          const float correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first block
          l *= correction;
          for (float& a : acc) a *= correction;
          for (int64_t j = 0; j < nj; ++j) {
            const float p = std::exp(scores[j] - m_new);
            l += p;
            const float* vj = v + (b * s.kv_len + j0 + j) * ldv + kh * hd;
            for (int64_t d = 0; d < hd; ++d) acc[d] += p * vj[d];
          }
          m = m_new;
        }
        float* oi = out + (b * s.q_len + i) * ldo + h * hd;
        for (int64_t d = 0; d < hd; ++d) oi[d] = acc[d] / l;
        lse[(b * s.heads + h) * s.q_len + i] = m + std::log(l);
      }
    }
  }
}

void FlashAttentionBackward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                            const float* k, int64_t ldk, const float* v, int64_t ldv,
                            const float* out, int64_t ldo, const float* dout, int64_t lddo,
                            const float* lse, float* dq, int64_t lddq, float* dk, int64_t lddk,
                            float* dv, int64_t lddv, float* workspace) {
  const int64_t hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t rows = s.batch * s.heads * s.q_len;
  float* delta = workspace;          // [batch, heads, q_len]
  float* dq_acc = workspace + rows;  // [batch, heads, q_len, head_dim]
  std::vector<float> dk_acc(static_cast<size_t>(kFlashKeyBlock * hd));
  std::vector<float> dv_acc(dk_acc.size());
  const int64_t group = s.Group();
  // Query rows of head h in q-shaped operands; key rows of key/value head kh.
  auto QRow = [&](auto* base, int64_t ld, int64_t b, int64_t h, int64_t i) {
    return base + (b * s.q_len + i) * ld + h * hd;
  };
  auto KRow = [&](auto* base, int64_t ld, int64_t b, int64_t kh, int64_t j) {
    return base + (b * s.kv_len + j) * ld + kh * hd;
  };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t bh = b * s.heads + h;
      for (int64_t i = 0; i < s.q_len; ++i) {
        const float* oi = QRow(out, ldo, b, h, i);
        const float* doi = QRow(dout, lddo, b, h, i);
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += doi[d] * oi[d];
        delta[bh * s.q_len + i] = dot;
      }
      float* dqh = dq_acc + bh * s.q_len * hd;
      std::fill(dqh, dqh + s.q_len * hd, 0.0f);
    }
    for (int64_t kh = 0; kh < s.KvHeads(); ++kh) {
      // Key blocks outermost (FlashAttention-2's backward): dK and dV of a
      // block are complete after one pass over the queries that see it --
      // those of every query head of the group (grouped-query attention sums
      // their contributions, query head by query head).
      for (int64_t j0 = 0; j0 < s.kv_len; j0 += kFlashKeyBlock) {
        const int64_t nj = std::min(kFlashKeyBlock, s.kv_len - j0);
        std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
        std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
        const int64_t first_query = s.causal ? j0 : 0;  // causal: queries before j0 see none
        for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
          const int64_t bh = b * s.heads + h;
          float* dqh = dq_acc + bh * s.q_len * hd;
          for (int64_t i = first_query; i < s.q_len; ++i) {
            const float* qi = QRow(q, ldq, b, h, i);
            const float* doi = QRow(dout, lddo, b, h, i);
            const float lse_i = lse[bh * s.q_len + i];
            const float delta_i = delta[bh * s.q_len + i];
            const int64_t end = std::min(nj, KeysOf(s, i) - j0);
            for (int64_t j = 0; j < end; ++j) {
              const float* kj = KRow(k, ldk, b, kh, j0 + j);
              const float* vj = KRow(v, ldv, b, kh, j0 + j);
              float sij = 0.0f, dpij = 0.0f;
              for (int64_t d = 0; d < hd; ++d) {
                sij += qi[d] * kj[d];
                dpij += doi[d] * vj[d];
              }
              const float p = std::exp(sij * scale - lse_i);
              const float ds = p * (dpij - delta_i) * scale;
              float* dkj = &dk_acc[j * hd];
              float* dvj = &dv_acc[j * hd];
              float* dqi = dqh + i * hd;
              for (int64_t d = 0; d < hd; ++d) {
                dvj[d] += p * doi[d];
                dkj[d] += ds * qi[d];
                dqi[d] += ds * kj[d];
              }
            }
          }
        }
        for (int64_t j = 0; j < nj; ++j) {
          std::copy_n(&dk_acc[j * hd], hd, KRow(dk, lddk, b, kh, j0 + j));
          std::copy_n(&dv_acc[j * hd], hd, KRow(dv, lddv, b, kh, j0 + j));
        }
      }
    }
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* dqh = dq_acc + (b * s.heads + h) * s.q_len * hd;
      for (int64_t i = 0; i < s.q_len; ++i) std::copy_n(dqh + i * hd, hd, QRow(dq, lddq, b, h, i));
    }
  }
}

}  // namespace sk
