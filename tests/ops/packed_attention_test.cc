// Block-diagonal causal attention (packed documents: AttentionShape's
// key_start) on the CPU backend, composed and linear-memory, forward and
// backward, against a reference written in double; the checks on the new
// fields; the masked attention's declared cost; RoPE at given positions.
// And the CUDA backend's arithmetic for it, on the host (its mask and
// softmax are math.h's SK_HOST_DEVICE functions), against the CPU backend.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/ops/cost.h"
#include "runtime/ops/math.h"
#include "runtime/ops/ops.h"

namespace sk::ops {
namespace {

Tensor HostF32(const std::vector<float>& v) {
  Tensor t = *HostAllocator::Default().Empty(DType::kF32, Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data_as<float>());
  return t;
}

Tensor HostI32(const std::vector<int32_t>& v) {
  Tensor t = *HostAllocator::Default().Empty(DType::kI32, Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data_as<int32_t>());
  return t;
}

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Documents of the given lengths per row (each row's lengths sum to
// q_len): the key start of every token, and the pairs the mask leaves.
std::vector<int32_t> KeyStarts(const std::vector<std::vector<int>>& docs, int64_t* pairs) {
  std::vector<int32_t> starts;
  *pairs = 0;
  for (const auto& row : docs) {
    int32_t at = 0;
    for (int len : row) {
      for (int i = 0; i < len; ++i) {
        starts.push_back(at);
        *pairs += i + 1;
      }
      at += len;
    }
  }
  return starts;
}

// The attention's forward and backward in double: q [B*T, H*D], k, v
// [B*T, KH*D], query i attending keys [start[b*T + i], i].
struct Reference {
  std::vector<double> out, dq, dk, dv;
};

Reference Attend(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v, const std::vector<float>& dout,
                 const std::vector<int32_t>& start) {
  const int64_t T = s.q_len, D = s.head_dim, H = s.heads, KH = s.KvHeads(), G = s.Group();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Reference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / G;
      auto Q = [&](int64_t i, int64_t d) { return q[(b * T + i) * H * D + h * D + d]; };
      auto K = [&](int64_t j, int64_t d) { return k[(b * T + j) * KH * D + kh * D + d]; };
      auto V = [&](int64_t j, int64_t d) { return v[(b * T + j) * KH * D + kh * D + d]; };
      auto dO = [&](int64_t i, int64_t d) { return dout[(b * T + i) * H * D + h * D + d]; };
      for (int64_t i = 0; i < T; ++i) {
        const int64_t j0 = start[b * T + i];
        std::vector<double> p(i + 1 - j0);
        double m = -1e300, sum = 0;
        for (int64_t j = j0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += Q(i, d) * K(j, d);
          p[j - j0] = scale * dot;
          m = std::max(m, p[j - j0]);
        }
        for (double& x : p) sum += (x = std::exp(x - m));
        for (double& x : p) x /= sum;
        std::vector<double> dp(p.size());
        double rowdot = 0;
        for (int64_t j = j0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.out[(b * T + i) * H * D + h * D + d] += p[j - j0] * V(j, d);
            dot += dO(i, d) * V(j, d);
          }
          dp[j - j0] = dot;
          rowdot += p[j - j0] * dot;
        }
        for (int64_t j = j0; j <= i; ++j) {
          const double ds = p[j - j0] * (dp[j - j0] - rowdot) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dv[(b * T + j) * KH * D + kh * D + d] += p[j - j0] * dO(i, d);
            r.dq[(b * T + i) * H * D + h * D + d] += ds * K(j, d);
            r.dk[(b * T + j) * KH * D + kh * D + d] += ds * Q(i, d);
          }
        }
      }
    }
  }
  return r;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-5 + 2e-5 * std::fabs(want[i])) << what << "[" << i << "]";
  }
}

// Row 0: three documents, one longer than a 64-key block and one of 5
// tokens; row 1: a one-token document, then one filling the row.
const std::vector<std::vector<int>> kDocs = {{70, 5, 75}, {1, 149}};
constexpr int64_t kLen = 150;

struct Operands {
  AttentionShape s;
  std::vector<int32_t> starts;
  std::vector<float> q, k, v, dout;
};

Operands MakeOperands(int64_t heads, int64_t kv_heads) {
  Operands o;
  o.s.batch = 2;
  o.s.heads = heads;
  o.s.kv_heads = kv_heads;
  o.s.q_len = o.s.kv_len = kLen;
  o.s.head_dim = 8;
  o.s.causal = true;
  o.starts = KeyStarts(kDocs, &o.s.masked_pairs);
  o.s.key_start = HostI32(o.starts);
  const int64_t rows = o.s.batch * kLen;
  o.q = Random(rows * heads * 8, 1);
  o.k = Random(rows * o.s.KvHeads() * 8, 2);
  o.v = Random(rows * o.s.KvHeads() * 8, 3);
  o.dout = Random(rows * heads * 8, 4);
  return o;
}

TEST(PackedAttention, LinearMemoryAttentionMatchesTheBlockDiagonalReference) {
  for (int64_t kv_heads : {0, 2}) {  // multi-head, then grouped (4 query heads on 2)
    const Operands o = MakeOperands(4, kv_heads);
    const int64_t qc = 4 * 8, kc = o.s.KvHeads() * 8;
    Tensor q = HostF32(o.q), k = HostF32(o.k), v = HostF32(o.v), dout = HostF32(o.dout);
    Tensor out = HostF32(std::vector<float>(o.q.size()));
    Tensor lse = HostF32(std::vector<float>(o.s.batch * 4 * kLen));
    ASSERT_TRUE(FlashAttentionForward(HostContext(), o.s, {q, 0, qc}, {k, 0, kc}, {v, 0, kc},
                                      {out, 0, qc}, lse)
                    .ok());
    Tensor dq = HostF32(std::vector<float>(o.q.size()));
    Tensor dk = HostF32(std::vector<float>(o.k.size()));
    Tensor dv = HostF32(std::vector<float>(o.v.size()));
    ASSERT_TRUE(FlashAttentionBackward(HostContext(), o.s, {q, 0, qc}, {k, 0, kc}, {v, 0, kc},
                                       {out, 0, qc}, {dout, 0, qc}, lse, {dq, 0, qc}, {dk, 0, kc},
                                       {dv, 0, kc})
                    .ok());
    const Reference r = Attend(o.s, o.q, o.k, o.v, o.dout, o.starts);
    ExpectNear(Values(out), r.out, "out");
    ExpectNear(Values(dq), r.dq, "dq");
    ExpectNear(Values(dk), r.dk, "dk");
    ExpectNear(Values(dv), r.dv, "dv");
  }
}

TEST(PackedAttention, ComposedAttentionMatchesTheBlockDiagonalReference) {
  const Operands o = MakeOperands(2, 0);
  const int64_t c = 2 * 8;
  Tensor q = HostF32(o.q), k = HostF32(o.k), v = HostF32(o.v), dout = HostF32(o.dout);
  Tensor out = HostF32(std::vector<float>(o.q.size()));
  Tensor probs = HostF32(std::vector<float>(o.s.batch * 2 * kLen * kLen));
  ASSERT_TRUE(
      AttentionForward(HostContext(), o.s, {q, 0, c}, {k, 0, c}, {v, 0, c}, probs, {out, 0, c})
          .ok());
  // Keys outside a query's document have probability 0.
  const float* p = probs.data_as<float>();
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(p[(0 * 2 + h) * kLen * kLen + 80 * kLen + 69], 0.0f);  // doc 2 query, doc 1 key
    EXPECT_GT(p[(0 * 2 + h) * kLen * kLen + 80 * kLen + 75], 0.0f);  // its own document's first key
    EXPECT_EQ(p[(1 * 2 + h) * kLen * kLen + 5 * kLen + 0], 0.0f);    // row 1's one-token document
  }
  Tensor dq = HostF32(std::vector<float>(o.q.size()));
  Tensor dk = HostF32(std::vector<float>(o.k.size()));
  Tensor dv = HostF32(std::vector<float>(o.v.size()));
  ASSERT_TRUE(AttentionBackward(HostContext(), o.s, {q, 0, c}, {k, 0, c}, {v, 0, c}, probs,
                                {dout, 0, c}, {dq, 0, c}, {dk, 0, c}, {dv, 0, c})
                  .ok());
  const Reference r = Attend(o.s, o.q, o.k, o.v, o.dout, o.starts);
  ExpectNear(Values(out), r.out, "out");
  ExpectNear(Values(dq), r.dq, "dq");
  ExpectNear(Values(dk), r.dk, "dk");
  ExpectNear(Values(dv), r.dv, "dv");
}

// One document per row is plain causal attention, to the bit, on both paths.
TEST(PackedAttention, OneDocumentPerRowIsCausalAttentionBitForBit) {
  Operands o = MakeOperands(2, 0);
  AttentionShape plain = o.s;
  plain.key_start = Tensor();
  plain.masked_pairs = 0;
  o.s.key_start = HostI32(std::vector<int32_t>(o.s.batch * kLen, 0));
  o.s.masked_pairs = o.s.batch * kLen * (kLen + 1) / 2;
  const int64_t c = 2 * 8;
  Tensor q = HostF32(o.q), k = HostF32(o.k), v = HostF32(o.v);
  for (bool flash : {false, true}) {
    std::vector<float> outs[2];
    for (int masked = 0; masked < 2; ++masked) {
      const AttentionShape& s = masked ? o.s : plain;
      Tensor out = HostF32(std::vector<float>(o.q.size()));
      Status st;
      if (flash) {
        Tensor lse = HostF32(std::vector<float>(o.s.batch * 2 * kLen));
        st = FlashAttentionForward(HostContext(), s, {q, 0, c}, {k, 0, c}, {v, 0, c}, {out, 0, c},
                                   lse);
      } else {
        Tensor probs = HostF32(std::vector<float>(o.s.batch * 2 * kLen * kLen));
        st = AttentionForward(HostContext(), s, {q, 0, c}, {k, 0, c}, {v, 0, c}, probs,
                              {out, 0, c});
      }
      ASSERT_TRUE(st.ok()) << st;
      outs[masked] = Values(out);
    }
    EXPECT_EQ(outs[0], outs[1]) << (flash ? "linear-memory" : "composed");
  }
}

TEST(PackedAttention, BadKeyStartsAreInvalidArgumentAndWriteNothing) {
  Operands o = MakeOperands(2, 0);
  const int64_t c = 2 * 8;
  Tensor q = HostF32(o.q), k = HostF32(o.k), v = HostF32(o.v);
  Tensor out = HostF32(std::vector<float>(o.q.size(), 7.0f));
  Tensor lse = HostF32(std::vector<float>(o.s.batch * 2 * kLen));
  auto run = [&](const AttentionShape& s) {
    return FlashAttentionForward(HostContext(), s, {q, 0, c}, {k, 0, c}, {v, 0, c}, {out, 0, c},
                                 lse);
  };
  AttentionShape s = o.s;
  s.causal = false;
  Status st = run(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("causal"), std::string::npos) << st;
  s = o.s;
  s.masked_pairs = 0;
  st = run(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("masked_pairs"), std::string::npos) << st;
  s.masked_pairs = s.batch * kLen * (kLen + 1) / 2 + 1;
  EXPECT_EQ(run(s).code(), StatusCode::kInvalidArgument);
  s = o.s;
  s.key_start = HostI32(std::vector<int32_t>(kLen, 0));  // one row's worth for two rows
  st = run(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("key_start"), std::string::npos) << st;
  s = o.s;
  s.key_start = HostF32(std::vector<float>(s.batch * kLen, 0.0f));
  EXPECT_EQ(run(s).code(), StatusCode::kInvalidArgument);
  s = o.s;
  s.key_start = Tensor();
  EXPECT_EQ(run(s).code(), StatusCode::kInvalidArgument);  // masked_pairs without key_start
  for (float x : Values(out)) ASSERT_EQ(x, 7.0f);
}

// ---- The CUDA backend's packed attention, on the host -----------------------

// The CUDA backend's composed attention (cuda/backend_attention.cc: ComposedForward,
// ComposedBackward, and the linear-memory op's fallback through them) run
// on the host in f32: every mask and softmax from the SK_HOST_DEVICE
// functions its kernels call (cuda/attention.cu: SoftmaxKernel and
// RowLogSumExpKernel through math::AttentionRowKeys; SoftmaxGradKernel
// through SoftmaxGradElement), the GEMMs as f32 sums. Grouped-query heads
// as the backend runs them: k and v repeated per query head, dk and dv
// summed over each group afterwards.
struct CudaOnHost {
  std::vector<float> probs, lse, out, dq, dk, dv;
};

CudaOnHost CudaComposedOnHost(const AttentionShape& s, const std::vector<float>& q,
                              const std::vector<float>& k, const std::vector<float>& v,
                              const std::vector<float>& dout, const int32_t* starts) {
  const int64_t T = s.q_len, KV = s.kv_len, D = s.head_dim, H = s.heads, KH = s.KvHeads();
  const int64_t G = s.Group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  CudaOnHost r;
  r.probs.assign(s.batch * H * T * KV, 0.0f);
  r.lse.assign(s.batch * H * T, 0.0f);
  r.out.assign(q.size(), 0.0f);
  r.dq.assign(q.size(), 0.0f);
  r.dk.assign(k.size(), 0.0f);
  r.dv.assign(v.size(), 0.0f);
  auto Q = [&](int64_t b, int64_t h, int64_t i, int64_t d) { return q[(b * T + i) * H * D + h * D + d]; };
  auto K = [&](int64_t b, int64_t h, int64_t j, int64_t d) {
    return k[(b * KV + j) * KH * D + (h / G) * D + d];
  };
  auto V = [&](int64_t b, int64_t h, int64_t j, int64_t d) {
    return v[(b * KV + j) * KH * D + (h / G) * D + d];
  };
  auto DO = [&](int64_t b, int64_t h, int64_t i, int64_t d) {
    return dout[(b * T + i) * H * D + h * D + d];
  };
  std::vector<float> dk_full(s.batch * KV * H * D, 0.0f), dv_full(dk_full.size(), 0.0f);
  std::vector<float> dp(KV);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const int64_t row = (b * H + h) * T + i;
        float* p = &r.probs[row * KV];
        for (int64_t j = 0; j < KV; ++j) {
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += Q(b, h, i, d) * K(b, h, j, d);
          p[j] = scale * dot;
        }
        const math::AttentionKeys keys =
            math::AttentionRowKeys(row, H, T, KV, s.causal, starts);
        r.lse[row] = math::RowLogSumExp(p + keys.first, keys.end - keys.first);
        math::MaskedSoftmaxRowInPlace(p, KV, keys);
        for (int64_t d = 0; d < D; ++d) {
          float o = 0.0f;
          for (int64_t j = 0; j < KV; ++j) o += p[j] * V(b, h, j, d);
          r.out[(b * T + i) * H * D + h * D + d] = o;
        }
        // dP = dO V^T over every key; dS from the masked P (0 where masked).
        float rowdot = 0.0f;
        for (int64_t j = 0; j < KV; ++j) {
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += DO(b, h, i, d) * V(b, h, j, d);
          dp[j] = dot;
          rowdot += p[j] * dot;
        }
        for (int64_t j = 0; j < KV; ++j) {
          const float ds = math::SoftmaxGradElement(p[j], dp[j], rowdot, scale);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[(b * T + i) * H * D + h * D + d] += ds * K(b, h, j, d);
            dk_full[(b * KV + j) * H * D + h * D + d] += ds * Q(b, h, i, d);
            dv_full[(b * KV + j) * H * D + h * D + d] += p[j] * DO(b, h, i, d);
          }
        }
      }
    }
  }
  for (int64_t row = 0; row < s.batch * KV; ++row) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        r.dk[row * KH * D + (h / G) * D + d] += dk_full[row * H * D + h * D + d];
        r.dv[row * KH * D + (h / G) * D + d] += dv_full[row * H * D + h * D + d];
      }
    }
  }
  return r;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol + tol * std::fabs(want[i])) << what << "[" << i << "]";
  }
}

// The CUDA kernels' row mask (math::AttentionRowKeys) keeps exactly the
// keys the CPU's composed attention gives a nonzero probability, row by
// row -- documents as the models make them, and key starts out of [0, i],
// which both clamp.
TEST(PackedAttention, TheCudaMaskKeepsExactlyTheKeysTheCpuAttends) {
  Operands o = MakeOperands(2, 0);
  std::vector<int32_t> wild = o.starts;
  for (size_t r = 0; r < wild.size(); r += 7) wild[r] = -5;            // below 0
  for (size_t r = 3; r < wild.size(); r += 11) wild[r] = kLen + 9;     // past the query
  for (const std::vector<int32_t>* starts : {&o.starts, &wild}) {
    AttentionShape s = o.s;
    s.key_start = HostI32(*starts);
    const int64_t c = 2 * 8;
    Tensor q = HostF32(o.q), k = HostF32(o.k), v = HostF32(o.v);
    Tensor out = HostF32(std::vector<float>(o.q.size()));
    Tensor probs = HostF32(std::vector<float>(s.batch * 2 * kLen * kLen, -1.0f));
    ASSERT_TRUE(
        AttentionForward(HostContext(), s, {q, 0, c}, {k, 0, c}, {v, 0, c}, probs, {out, 0, c})
            .ok());
    const float* p = probs.data_as<float>();
    for (int64_t row = 0; row < s.batch * 2 * kLen; ++row) {
      const math::AttentionKeys keys =
          math::AttentionRowKeys(row, 2, kLen, kLen, true, starts->data());
      ASSERT_LT(keys.first, keys.end) << "row " << row;
      for (int64_t j = 0; j < kLen; ++j) {
        const bool kept = j >= keys.first && j < keys.end;
        ASSERT_EQ(p[row * kLen + j] != 0.0f, kept) << "row " << row << " key " << j;
      }
    }
  }
  // Without documents the mask is the causal one, and everything without causal.
  const math::AttentionKeys causal = math::AttentionRowKeys(2 * kLen + 5, 2, kLen, kLen, true, nullptr);
  EXPECT_EQ(causal.first, 0);
  EXPECT_EQ(causal.end, 6);
  const math::AttentionKeys full = math::AttentionRowKeys(5, 2, 3, 17, false, nullptr);
  EXPECT_EQ(full.first, 0);
  EXPECT_EQ(full.end, 17);
}

// The CUDA backend's packed attention arithmetic (host emulation above)
// gives the CPU backend's results to f32 rounding: the composed op's
// probabilities, output and gradients, and the linear-memory op's
// log-sum-exp, output and gradients, multi-head and grouped.
TEST(PackedAttention, TheCudaArithmeticGivesTheCpuAttention) {
  {
    const Operands o = MakeOperands(2, 0);
    const int64_t c = 2 * 8;
    Tensor q = HostF32(o.q), k = HostF32(o.k), v = HostF32(o.v), dout = HostF32(o.dout);
    Tensor out = HostF32(std::vector<float>(o.q.size()));
    Tensor probs = HostF32(std::vector<float>(o.s.batch * 2 * kLen * kLen));
    ASSERT_TRUE(
        AttentionForward(HostContext(), o.s, {q, 0, c}, {k, 0, c}, {v, 0, c}, probs, {out, 0, c})
            .ok());
    Tensor dq = HostF32(std::vector<float>(o.q.size()));
    Tensor dk = HostF32(std::vector<float>(o.k.size()));
    Tensor dv = HostF32(std::vector<float>(o.v.size()));
    ASSERT_TRUE(AttentionBackward(HostContext(), o.s, {q, 0, c}, {k, 0, c}, {v, 0, c}, probs,
                                  {dout, 0, c}, {dq, 0, c}, {dk, 0, c}, {dv, 0, c})
                    .ok());
    const CudaOnHost cuda = CudaComposedOnHost(o.s, o.q, o.k, o.v, o.dout, o.starts.data());
    ExpectClose(cuda.probs, Values(probs), 1e-6, "composed probs");
    ExpectClose(cuda.out, Values(out), 1e-5, "composed out");
    ExpectClose(cuda.dq, Values(dq), 2e-5, "composed dq");
    ExpectClose(cuda.dk, Values(dk), 2e-5, "composed dk");
    ExpectClose(cuda.dv, Values(dv), 2e-5, "composed dv");
  }
  for (int64_t kv_heads : {0, 2}) {
    const Operands o = MakeOperands(4, kv_heads);
    const int64_t qc = 4 * 8, kc = o.s.KvHeads() * 8;
    Tensor q = HostF32(o.q), k = HostF32(o.k), v = HostF32(o.v), dout = HostF32(o.dout);
    Tensor out = HostF32(std::vector<float>(o.q.size()));
    Tensor lse = HostF32(std::vector<float>(o.s.batch * 4 * kLen));
    ASSERT_TRUE(FlashAttentionForward(HostContext(), o.s, {q, 0, qc}, {k, 0, kc}, {v, 0, kc},
                                      {out, 0, qc}, lse)
                    .ok());
    Tensor dq = HostF32(std::vector<float>(o.q.size()));
    Tensor dk = HostF32(std::vector<float>(o.k.size()));
    Tensor dv = HostF32(std::vector<float>(o.v.size()));
    ASSERT_TRUE(FlashAttentionBackward(HostContext(), o.s, {q, 0, qc}, {k, 0, kc}, {v, 0, kc},
                                       {out, 0, qc}, {dout, 0, qc}, lse, {dq, 0, qc},
                                       {dk, 0, kc}, {dv, 0, kc})
                    .ok());
    const CudaOnHost cuda = CudaComposedOnHost(o.s, o.q, o.k, o.v, o.dout, o.starts.data());
    ExpectClose(cuda.lse, Values(lse), 1e-6, "linear-memory lse");
    ExpectClose(cuda.out, Values(out), 1e-5, "linear-memory out");
    ExpectClose(cuda.dq, Values(dq), 2e-5, "linear-memory dq");
    ExpectClose(cuda.dk, Values(dk), 2e-5, "linear-memory dk");
    ExpectClose(cuda.dv, Values(dv), 2e-5, "linear-memory dv");
  }
}

// The simulator prices the linear-memory attention by the pairs the mask
// leaves: packing ten documents of 100 into a row of 1000 costs a tenth
// of the causal row's score work.
TEST(PackedAttention, TheCostCountsOnlyThePairsTheDocumentsLeave) {
  const int64_t per_doc = 100 * 101 / 2;
  const double causal = FlashAttentionScorePairs(1, 8, 1000, 1000, true);
  const double packed = FlashAttentionScorePairs(1, 8, 1000, 1000, true, 10 * per_doc);
  EXPECT_DOUBLE_EQ(packed, 8.0 * 10 * per_doc);
  EXPECT_LT(packed, causal / 9);
  const OpCost f = FlashAttentionForwardCost(1, 8, 1000, 1000, 64, true, DType::kF32, 0,
                                             10 * per_doc);
  EXPECT_DOUBLE_EQ(f.flops, 4.0 * packed * 64 + kSoftmaxFlops * packed);
  const OpCost b = FlashAttentionBackwardCost(1, 8, 1000, 1000, 64, true, DType::kF32, 0,
                                              10 * per_doc);
  const OpCost bc = FlashAttentionBackwardCost(1, 8, 1000, 1000, 64, true, DType::kF32);
  EXPECT_LT(b.flops, bc.flops / 5);
}

// RoPE at given positions rotates each row by its own position: the same
// as the row-index rule where they agree, the reference row elsewhere.
TEST(PackedAttention, RopeAtGivenPositionsTurnsEachRowByItsPosition) {
  const int64_t seq = 6, heads = 2, hd = 8, rows = 2 * seq;
  const std::vector<float> x = Random(rows * heads * hd, 9);
  const RopeScaling none;
  Tensor a = HostF32(x), b = HostF32(x), c = HostF32(x);
  std::vector<int32_t> same(rows), packed(rows);
  for (int64_t r = 0; r < rows; ++r) same[r] = static_cast<int32_t>(r % seq);
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 0, 5, 4, 3, 2, 1, 0};
  ASSERT_TRUE(RopeForward(HostContext(), a, seq, heads, hd, 10000.0f, none, a).ok());
  ASSERT_TRUE(RopeForward(HostContext(), b, seq, heads, hd, 10000.0f, none, b, HostI32(same)).ok());
  EXPECT_EQ(Values(a), Values(b));
  ASSERT_TRUE(RopeForward(HostContext(), c, seq, heads, hd, 10000.0f, none, c, HostI32(pos)).ok());
  const std::vector<float> got = Values(c);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      float want[hd];
      math::RopeHeadRow(x.data() + (r * heads + h) * hd, pos[r], hd, 10000.0f, none, 1.0f,
                           want);
      for (int64_t i = 0; i < hd; ++i) ASSERT_EQ(got[(r * heads + h) * hd + i], want[i]) << r;
    }
  }
  // Backward turns back.
  ASSERT_TRUE(RopeBackward(HostContext(), c, seq, heads, hd, 10000.0f, none, c, HostI32(pos)).ok());
  const std::vector<float> back = Values(c);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(back[i], x[i], 1e-6f) << i;
  // Positions are checked: one per row, i32.
  EXPECT_EQ(RopeForward(HostContext(), c, seq, heads, hd, 10000.0f, none, c,
                        HostI32(std::vector<int32_t>(rows - 1)))
                .code(),
            StatusCode::kInvalidArgument);
}

// What a CUDA call that runs the composed attention (every packed call)
// allocates beside its declared buffers (ops.h:
// ComposedAttentionTemporaryBytes), as cuda/backend_attention.cc allocates it. Small
// rows group every sequence in one backward GEMM; long rows one sequence
// per GEMM (2^26 scores per group).
TEST(ComposedAttentionTemporaries, CountTheProbabilitiesOfEveryPairAsTheCudaPathAllocatesThem) {
  AttentionShape s;
  s.batch = 3;
  s.heads = 4;
  s.q_len = 16;
  s.kv_len = 16;
  s.head_dim = 8;
  s.causal = true;
  const int64_t hpq = 4 * 16 * 16, all = 3 * hpq;
  EXPECT_EQ(ComposedAttentionBackwardGroup(s), 3);
  ComposedAttentionBytes f32 = ComposedAttentionTemporaryBytes(s, DType::kF32);
  EXPECT_EQ(f32.forward, 4 * all);                          // f32 P
  EXPECT_EQ(f32.backward, 4 * all + 4 * hpq + 4 * 3 * hpq);  // P, scratch, the group's dP
  ComposedAttentionBytes bf16 = ComposedAttentionTemporaryBytes(s, DType::kBF16);
  EXPECT_EQ(bf16.forward, 6 * all);  // f32 P and its bf16 copy: 6 bytes a pair
  EXPECT_EQ(bf16.backward, 4 * all + 4 * hpq + 4 * 3 * hpq + 2 * 2 * 3 * hpq);  // + dS, P in bf16
  EXPECT_EQ(bf16.peak(), bf16.backward);
  // Grouped heads (2 key/value heads): k and v repeated in forward, and
  // k, v, dk, dv in backward, each [batch * kv_len, heads * head_dim].
  s.kv_heads = 2;
  const int64_t rep = 3 * 16 * 4 * 8 * 2;
  ComposedAttentionBytes grouped = ComposedAttentionTemporaryBytes(s, DType::kBF16);
  EXPECT_EQ(grouped.forward, bf16.forward + 2 * rep);
  EXPECT_EQ(grouped.backward, bf16.backward + 4 * rep);
  // Llama-3.2-1B's shape at 2048 tokens, 8 rows: one sequence per backward
  // GEMM (32 x 2048 x 2048 > 2^26), the forward's 6 bytes per pair the peak.
  s.batch = 8;
  s.heads = 32;
  s.kv_heads = 8;
  s.q_len = s.kv_len = 2048;
  s.head_dim = 64;
  EXPECT_EQ(ComposedAttentionBackwardGroup(s), 1);
  const int64_t big = int64_t{32} * 2048 * 2048;
  const int64_t rep_big = int64_t{8} * 2048 * 32 * 64 * 2;
  ComposedAttentionBytes llama = ComposedAttentionTemporaryBytes(s, DType::kBF16);
  EXPECT_EQ(llama.forward, 6 * 8 * big + 2 * rep_big);
  EXPECT_EQ(llama.backward, 4 * 8 * big + 4 * big + 4 * big + 4 * rep_big);
  EXPECT_EQ(llama.peak(), llama.forward);  // 6.4 GiB + the repeats
  // Nothing to attend: nothing allocated.
  s.q_len = 0;
  EXPECT_EQ(ComposedAttentionTemporaryBytes(s, DType::kBF16).peak(), 0);
}

}  // namespace
}  // namespace sk::ops
