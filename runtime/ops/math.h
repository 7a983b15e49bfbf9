// Per-element and per-row arithmetic shared by the CPU backend (runtime/ops/cpu)
// and the CUDA kernels (runtime/ops/cuda/*.cu).
//
// Every function here is SK_HOST_DEVICE and free of allocation and library
// calls other than <cmath>, so host tests exercise exactly the arithmetic a
// GPU runs. Row functions operate on one contiguous row of `cols` floats and
// are what the CPU's scalar loops run. The CUDA kernels split a row across a
// warp or a block (their sums then run in another, fixed order), so each row
// function is built from per-element helpers below that both call: the
// arithmetic on each element is the same code on both.
#ifndef SHARDKIT_RUNTIME_OPS_MATH_H_
#define SHARDKIT_RUNTIME_OPS_MATH_H_

#include <cmath>
#include <cstdint>

#include "runtime/core/macros.h"
#include "runtime/ops/rope_scaling.h"

namespace sk::ops::math {

// sqrt(2/pi) and the cubic coefficient of GPT-2's tanh approximation of GELU.
inline constexpr float kGeluK0 = 0.7978845608028654f;
inline constexpr float kGeluK1 = 0.044715f;

// The epsilon inside LayerNorm's square root (GPT-2 and PyTorch default).
inline constexpr float kLayerNormEps = 1e-5f;

// tanh(u) = 1 - 2 / (1 + e^(2u)). glibc's tanhf goes through expm1f and was
// the largest single cost of a gpt-10m CPU step (perf: 17% of cycles); this
// form costs one expf, saturates correctly at +-1 (e^(2u) -> inf or 0), and
// its absolute error (~1e-7, from cancellation near 0) is below f32's
// resolution of the GELU output it feeds.
SK_HOST_DEVICE SK_INLINE float TanhViaExp(float u) { return 1.0f - 2.0f / (1.0f + expf(2.0f * u)); }

// gelu(x) = 0.5 x (1 + tanh(k0 (x + k1 x^3))).
SK_HOST_DEVICE SK_INLINE float GeluTanh(float x) {
  float u = kGeluK0 * (x + kGeluK1 * x * x * x);
  return 0.5f * x * (1.0f + TanhViaExp(u));
}

// d gelu / dx at x.
SK_HOST_DEVICE SK_INLINE float GeluTanhGrad(float x) {
  float u = kGeluK0 * (x + kGeluK1 * x * x * x);
  float t = TanhViaExp(u);
  float du = kGeluK0 * (1.0f + 3.0f * kGeluK1 * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// 1/sqrt(var + eps), from a row's population variance.
SK_HOST_DEVICE SK_INLINE float LayerNormRstd(float var) { return 1.0f / sqrtf(var + kLayerNormEps); }

// The normalised element xhat = (x - mean) rstd.
SK_HOST_DEVICE SK_INLINE float LayerNormXhat(float x, float mean, float rstd) {
  return (x - mean) * rstd;
}

// One output element: xhat gamma + beta.
SK_HOST_DEVICE SK_INLINE float LayerNormOut(float x, float mean, float rstd, float gamma,
                                            float beta) {
  return LayerNormXhat(x, mean, rstd) * gamma + beta;
}

// One element of the input gradient (before it is added to dx), given the
// row's mean(dy gamma) and mean(dy gamma xhat):
// rstd (dy gamma - mean_g - xhat mean_g_xhat).
SK_HOST_DEVICE SK_INLINE float LayerNormGradIn(float xhat, float dy, float gamma, float rstd,
                                               float mean_g, float mean_g_xhat) {
  return rstd * (dy * gamma - mean_g - xhat * mean_g_xhat);
}

// y = LayerNorm(x) * gamma + beta over one row; stores the row's mean and
// 1/sqrt(var + eps) (population variance) for the backward pass.
SK_HOST_DEVICE SK_INLINE void LayerNormRowForward(const float* x, const float* gamma,
                                                  const float* beta, int64_t cols, float* y,
                                                  float* mean_out, float* rstd_out) {
  float mean = 0.0f;
  for (int64_t j = 0; j < cols; ++j) mean += x[j];
  mean /= static_cast<float>(cols);
  float var = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    float d = x[j] - mean;
    var += d * d;
  }
  var /= static_cast<float>(cols);
  float rstd = LayerNormRstd(var);
  for (int64_t j = 0; j < cols; ++j) y[j] = LayerNormOut(x[j], mean, rstd, gamma[j], beta[j]);
  *mean_out = mean;
  *rstd_out = rstd;
}

// Backward of LayerNormRowForward for one row. dx is ACCUMULATED (+=), so a
// residual gradient can already be in it; dgamma and dbeta are accumulated too.
SK_HOST_DEVICE SK_INLINE void LayerNormRowBackward(const float* x, const float* gamma,
                                                   const float* dy, float mean, float rstd,
                                                   int64_t cols, float* dx, float* dgamma,
                                                   float* dbeta) {
  // With xhat = (x - mean) rstd and g = dy * gamma:
  // dx = rstd (g - mean(g) - xhat mean(g xhat)).
  float sum_g = 0.0f;
  float sum_g_xhat = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    float xhat = LayerNormXhat(x[j], mean, rstd);
    float g = dy[j] * gamma[j];
    sum_g += g;
    sum_g_xhat += g * xhat;
    if (dgamma != nullptr) dgamma[j] += dy[j] * xhat;
    if (dbeta != nullptr) dbeta[j] += dy[j];
  }
  float inv_n = 1.0f / static_cast<float>(cols);
  float mean_g = sum_g * inv_n;
  float mean_g_xhat = sum_g_xhat * inv_n;
  for (int64_t j = 0; j < cols; ++j) {
    dx[j] += LayerNormGradIn(LayerNormXhat(x[j], mean, rstd), dy[j], gamma[j], rstd, mean_g,
                             mean_g_xhat);
  }
}

// In-place softmax of the first `valid` entries of a row of `cols`; entries
// at and after `valid` are set to 0 (the causal mask: valid = i + 1 on row i).
SK_HOST_DEVICE SK_INLINE void SoftmaxRowInPlace(float* row, int64_t cols, int64_t valid) {
  float m = row[0];
  for (int64_t j = 1; j < valid; ++j) m = row[j] > m ? row[j] : m;
  float sum = 0.0f;
  for (int64_t j = 0; j < valid; ++j) {
    row[j] = expf(row[j] - m);
    sum += row[j];
  }
  float inv = 1.0f / sum;
  for (int64_t j = 0; j < valid; ++j) row[j] *= inv;
  for (int64_t j = valid; j < cols; ++j) row[j] = 0.0f;
}

// log sum_j e^(row[j]) over the first `valid` (> 0) entries, as m + log of
// the sum of e^(row[j] - m), m the largest: the log-sum-exp the linear-memory
// attention keeps per query row (the CUDA backend's composed fallback
// computes it from the scores before the softmax overwrites them).
SK_HOST_DEVICE SK_INLINE float RowLogSumExp(const float* row, int64_t valid) {
  float m = row[0];
  for (int64_t j = 1; j < valid; ++j) m = row[j] > m ? row[j] : m;
  float sum = 0.0f;
  for (int64_t j = 0; j < valid; ++j) sum += expf(row[j] - m);
  return m + logf(sum);
}

// The keys [first, end) one row of attention's [batch, heads, q_len,
// kv_len] scores attends: the mask of the composed attention (the CUDA
// backend's kernels and the host tests that hold them against the CPU).
struct AttentionKeys {
  int64_t first = 0;
  int64_t end = 0;
};

// Score row r (sequence b, head h, query i: r = (b heads + h) q_len + i):
// every key without causal; causal, keys [0, i] (at most kv_len of them);
// with packed documents (key_start: AttentionShape::key_start's i32
// [batch * q_len], or nullptr), keys [key_start[b q_len + i], i], the start
// clamped into [0, i] as the CPU backend clamps it. end > first whenever
// kv_len > 0 (a query always sees itself).
SK_HOST_DEVICE SK_INLINE AttentionKeys AttentionRowKeys(int64_t r, int64_t heads, int64_t q_len,
                                                        int64_t kv_len, bool causal,
                                                        const int32_t* key_start) {
  AttentionKeys keys;
  keys.end = kv_len;
  if (!causal) return keys;
  const int64_t i = r % q_len;
  keys.end = i + 1 < kv_len ? i + 1 : kv_len;
  if (key_start != nullptr) {
    const int64_t start = key_start[(r / (heads * q_len)) * q_len + i];
    keys.first = start < 0 ? 0 : (start > i ? i : start);
  }
  return keys;
}

// The row softmax of the composed attention under a mask: entries [first,
// end) softmaxed in place (SoftmaxRowInPlace), every other entry 0.
SK_HOST_DEVICE SK_INLINE void MaskedSoftmaxRowInPlace(float* row, int64_t cols,
                                                      AttentionKeys keys) {
  for (int64_t j = 0; j < keys.first; ++j) row[j] = 0.0f;
  SoftmaxRowInPlace(row + keys.first, cols - keys.first, keys.end - keys.first);
}

// One element of softmax's backward: scale * p (dp - dot), dot = <p, dp>.
SK_HOST_DEVICE SK_INLINE float SoftmaxGradElement(float p, float dp, float dot, float scale) {
  return scale * p * (dp - dot);
}

// Given p = softmax(s) and dp = dL/dp for one row, overwrites dp with
// scale * dL/ds = scale * p (dp - <p, dp>).
SK_HOST_DEVICE SK_INLINE void SoftmaxRowBackwardInPlace(const float* p, float* dp, int64_t cols,
                                                        float scale) {
  float dot = 0.0f;
  for (int64_t j = 0; j < cols; ++j) dot += p[j] * dp[j];
  for (int64_t j = 0; j < cols; ++j) dp[j] = SoftmaxGradElement(p[j], dp[j], dot, scale);
}

// A row's loss from its max m, sum of e^(logit - m) and target logit:
// log(sum) + m - logit_target.
SK_HOST_DEVICE SK_INLINE float CrossEntropyFromStats(float m, float sum, float target_logit) {
  return logf(sum) + m - target_logit;
}

// One element of the loss gradient from e = e^(logit - m) and
// inv = scale / sum: e inv, less scale at the target.
SK_HOST_DEVICE SK_INLINE float CrossEntropyGradElement(float e, float inv, bool is_target,
                                                       float scale) {
  const float v = e * inv;
  return is_target ? v - scale : v;
}

// -log softmax(logits)[target] for one row, computed stably in f32.
SK_HOST_DEVICE SK_INLINE float CrossEntropyRow(const float* logits, int64_t cols, int32_t target) {
  float m = logits[0];
  for (int64_t j = 1; j < cols; ++j) m = logits[j] > m ? logits[j] : m;
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sum += expf(logits[j] - m);
  return CrossEntropyFromStats(m, sum, logits[target]);
}

// dlogits = scale * (softmax(logits) - onehot(target)) for one row.
SK_HOST_DEVICE SK_INLINE void CrossEntropyRowBackward(const float* logits, int64_t cols,
                                                      int32_t target, float scale,
                                                      float* dlogits) {
  float m = logits[0];
  for (int64_t j = 1; j < cols; ++j) m = logits[j] > m ? logits[j] : m;
  float sum = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    dlogits[j] = expf(logits[j] - m);
    sum += dlogits[j];
  }
  float inv = scale / sum;
  for (int64_t j = 0; j < cols; ++j) {
    dlogits[j] = CrossEntropyGradElement(dlogits[j], inv, j == target, scale);
  }
}


// ---- Llama-family elementwise and row arithmetic ----------------------------

// silu(x) = x sigmoid(x) and its derivative sigmoid(x) (1 + x (1 - sigmoid(x))).
SK_HOST_DEVICE SK_INLINE float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
SK_HOST_DEVICE SK_INLINE float Silu(float x) { return x * Sigmoid(x); }
SK_HOST_DEVICE SK_INLINE float SiluGrad(float x) {
  const float s = Sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// RMSNorm (Zhang and Sennrich 2019; Llama): y = x rstd gamma with
// rstd = 1/sqrt(mean(x^2) + eps), Hugging Face's LlamaRMSNorm in f32.
SK_HOST_DEVICE SK_INLINE float RmsNormRstd(float mean_sq, float eps) {
  return 1.0f / sqrtf(mean_sq + eps);
}

SK_HOST_DEVICE SK_INLINE void RmsNormRowForward(const float* x, const float* gamma, int64_t cols,
                                                float eps, float* y, float* rstd_out) {
  float sq = 0.0f;
  for (int64_t j = 0; j < cols; ++j) sq += x[j] * x[j];
  const float rstd = RmsNormRstd(sq / static_cast<float>(cols), eps);
  for (int64_t j = 0; j < cols; ++j) y[j] = x[j] * rstd * gamma[j];
  *rstd_out = rstd;
}

// One element of RMSNorm's input gradient given the row's mean(dy gamma xhat):
// rstd (dy gamma - xhat mean_g_xhat), xhat = x rstd.
SK_HOST_DEVICE SK_INLINE float RmsNormGradIn(float x, float dy, float gamma, float rstd,
                                             float mean_g_xhat) {
  return rstd * (dy * gamma - x * rstd * mean_g_xhat);
}

// Backward of RmsNormRowForward for one row: dx and dgamma ACCUMULATED (+=).
SK_HOST_DEVICE SK_INLINE void RmsNormRowBackward(const float* x, const float* gamma,
                                                 const float* dy, float rstd, int64_t cols,
                                                 float* dx, float* dgamma) {
  float sum_g_xhat = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    const float xhat = x[j] * rstd;
    sum_g_xhat += dy[j] * gamma[j] * xhat;
    if (dgamma != nullptr) dgamma[j] += dy[j] * xhat;
  }
  const float mean_g_xhat = sum_g_xhat / static_cast<float>(cols);
  for (int64_t j = 0; j < cols; ++j) dx[j] += RmsNormGradIn(x[j], dy[j], gamma[j], rstd, mean_g_xhat);
}

// Rotary position embedding in Hugging Face's rotate-half layout: within a
// head of head_dim = 2 half, element i < half pairs with i + half and both
// turn by the angle pos * inv_freq_i, computed in f32 as transformers'
// LlamaRotaryEmbedding does (inv_freq, then pos * inv_freq, then cos and
// sin).
//
// inv_freq_i = theta^(-2i / head_dim), rescaled as rope_scaling.h says, in
// the order of transformers' _compute_linear_scaling_rope_parameters and
// _compute_llama3_parameters (modeling_rope_utils.py), each step an f32
// operation as torch runs it (2 pi / inv_freq is inv_freq's reciprocal times
// 2 pi; the band limits L / low and L / high are compared as f32).
SK_HOST_DEVICE SK_INLINE float RopeInvFreq(int64_t i, int64_t head_dim, float theta,
                                           const RopeScaling& scaling) {
  const float inv_freq =
      1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  switch (scaling.type) {
    case RopeScalingType::kNone: return inv_freq;
    case RopeScalingType::kLinear: return inv_freq / scaling.factor;
    case RopeScalingType::kLlama3: {
      const double old_context = static_cast<double>(scaling.original_max_positions);
      const float low_freq_wavelen = static_cast<float>(old_context / scaling.low_freq_factor);
      const float high_freq_wavelen = static_cast<float>(old_context / scaling.high_freq_factor);
      const float wavelen = (1.0f / inv_freq) * static_cast<float>(2.0 * 3.14159265358979323846);
      if (wavelen < high_freq_wavelen) return inv_freq;               // high frequencies: kept
      if (wavelen > low_freq_wavelen) return inv_freq / scaling.factor;  // low: divided
      const float smooth = ((1.0f / wavelen) * static_cast<float>(old_context) - scaling.low_freq_factor) /
                           (scaling.high_freq_factor - scaling.low_freq_factor);
      return (1.0f - smooth) * inv_freq / scaling.factor + smooth * inv_freq;
    }
  }
  return inv_freq;
}

// The position of row `row` of a [batch * seq_len, ...] operand: its
// positions entry where given (packed documents), else row % seq_len.
SK_HOST_DEVICE SK_INLINE int64_t RopePosition(int64_t row, int64_t seq_len,
                                              const int32_t* positions) {
  return positions != nullptr ? static_cast<int64_t>(positions[row]) : row % seq_len;
}

SK_HOST_DEVICE SK_INLINE float RopeAngle(int64_t pos, int64_t i, int64_t head_dim, float theta,
                                         const RopeScaling& scaling) {
  return static_cast<float>(pos) * RopeInvFreq(i, head_dim, theta, scaling);
}

// One rotated pair by the angle whose cosine and sine are c and s:
// (a, b) = (x[i], x[i + half]) -> (a c - b s', b c + a s'), s' = sign s.
// The backward is the rotation by -angle: pass sign = -1. The CPU backend
// reads c and s from a table of cosf/sinf of RopeAngle (the same values
// RopePair computes), so both give the same bits.
SK_HOST_DEVICE SK_INLINE void RopeRotate(float a, float b, float c, float s, float sign,
                                         float* out_a, float* out_b) {
  const float ss = sign * s;
  *out_a = a * c - b * ss;
  *out_b = b * c + a * ss;
}

// One rotated pair: (a, b) = (x[i], x[i + half]) turned by `angle` (times sign).
SK_HOST_DEVICE SK_INLINE void RopePair(float a, float b, float angle, float sign, float* out_a,
                                       float* out_b) {
  RopeRotate(a, b, cosf(angle), sinf(angle), sign, out_a, out_b);
}

// One head's row (head_dim contiguous floats) at position pos; y may be x.
SK_HOST_DEVICE SK_INLINE void RopeHeadRow(const float* x, int64_t pos, int64_t head_dim,
                                          float theta, const RopeScaling& scaling, float sign,
                                          float* y) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float a, b;
    RopePair(x[i], x[i + half], RopeAngle(pos, i, head_dim, theta, scaling), sign, &a, &b);
    y[i] = a;
    y[i + half] = b;
  }
}

}  // namespace sk::ops::math

#endif  // SHARDKIT_RUNTIME_OPS_MATH_H_
