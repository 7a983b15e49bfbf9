#include "runtime/ops/cost.h"

#include <cmath>

namespace sk::ops {

namespace {

double D(int64_t v) { return static_cast<double>(v); }
double Sz(DType t) { return static_cast<double>(DTypeSize(t)); }
constexpr double kF32 = 4;
constexpr double kI32 = 4;

OpCost Make(const char* name, OpClass cls, double flops, double read, double written,
            DType dtype = DType::kF32) {
  OpCost c;
  c.name = name;
  c.cls = cls;
  c.flops = flops;
  c.bytes_read = read;
  c.bytes_written = written;
  c.dtype = dtype;
  return c;
}

// The attention shape a backend may price by (cost.h: m = q_len, n = keys
// per query, rounded up, k = head_dim, batch = batch x heads).
OpCost WithAttentionShape(OpCost c, double bh, int64_t q_len, double pairs, int64_t head_dim) {
  c.m = q_len;
  c.n = bh * D(q_len) > 0 ? static_cast<int64_t>(std::ceil(pairs / (bh * D(q_len)))) : 0;
  c.k = head_dim;
  c.batch = static_cast<int64_t>(bh);
  return c;
}

}  // namespace

std::string_view OpClassName(OpClass c) {
  switch (c) {
    case OpClass::kGemm: return "gemm";
    case OpClass::kElementwise: return "elementwise";
    case OpClass::kReduction: return "reduction";
    case OpClass::kNormalization: return "normalization";
    case OpClass::kAttention: return "attention";
    case OpClass::kEmbedding: return "embedding";
    case OpClass::kLoss: return "loss";
    case OpClass::kCopy: return "copy";
    case OpClass::kOptimizer: return "optimizer";
    case OpClass::kInit: return "init";
    case OpClass::kOther: return "other";
  }
  return "unknown";
}

OpCost GemmCost(int64_t m, int64_t n, int64_t k, int64_t batch, DType ab, bool reads_c,
                DType c_dtype) {
  const double per = D(m) * D(n);
  const double sc = Sz(c_dtype);
  OpCost c = Make("gemm", OpClass::kGemm, 2.0 * per * D(k) * D(batch),
                  D(batch) * ((D(m) * D(k) + D(k) * D(n)) * Sz(ab) + (reads_c ? per * sc : 0.0)),
                  D(batch) * per * sc, ab);
  c.m = m;
  c.n = n;
  c.k = k;
  c.batch = batch;
  return c;
}

OpCost CopyCost(int64_t n, DType t) {
  return Make("copy", OpClass::kCopy, 0, D(n) * Sz(t), D(n) * Sz(t), t);
}

OpCost CastCost(int64_t n, DType from, DType to) {
  return Make("cast", OpClass::kCopy, 0, D(n) * Sz(from), D(n) * Sz(to), from);
}

OpCost RoundToDTypeCost(int64_t n) {
  return Make("round_to_dtype", OpClass::kElementwise, 0, D(n) * kF32, D(n) * kF32);
}

OpCost ScaleCost(int64_t n, DType t) {
  return Make("scale", OpClass::kElementwise, D(n), D(n) * Sz(t), D(n) * Sz(t), t);
}

OpCost AxpyCost(int64_t n, DType x, DType y) {
  return Make("axpy", OpClass::kElementwise, 2.0 * D(n), D(n) * (Sz(x) + Sz(y)), D(n) * Sz(y), x);
}

OpCost FillCost(int64_t n, DType t) {
  return Make("fill", OpClass::kInit, 0, 0, D(n) * Sz(t), t);
}

OpCost InitCost(int64_t n, DType t) {
  return Make("init_philox", OpClass::kInit, 0, 0, D(n) * Sz(t), t);
}

OpCost BroadcastRowsCost(int64_t rows, int64_t cols, DType dst) {
  return Make("broadcast_rows", OpClass::kCopy, 0, D(cols) * kF32, D(rows) * D(cols) * Sz(dst),
              dst);
}

OpCost BiasAddCost(int64_t rows, int64_t cols, DType y) {
  const double e = D(rows) * D(cols);
  return Make("bias_add", OpClass::kElementwise, e, e * Sz(y) + D(cols) * kF32, e * Sz(y), y);
}

OpCost BiasGradCost(int64_t rows, int64_t cols, DType dy) {
  const double e = D(rows) * D(cols);
  return Make("bias_grad", OpClass::kReduction, e, e * Sz(dy) + D(cols) * kF32, D(cols) * kF32,
              dy);
}

OpCost GeluForwardCost(int64_t n, DType x, DType y) {
  return Make("gelu_fwd", OpClass::kElementwise, kGeluForwardFlops * D(n), D(n) * Sz(x),
              D(n) * Sz(y), x);
}

OpCost GeluBackwardCost(int64_t n, DType x, DType dx) {
  // Reads x and dy (dx's dtype), writes dx.
  return Make("gelu_bwd", OpClass::kElementwise, kGeluBackwardFlops * D(n),
              D(n) * (Sz(x) + Sz(dx)), D(n) * Sz(dx), x);
}

OpCost LayerNormForwardCost(int64_t rows, int64_t cols, DType x, DType y) {
  const double e = D(rows) * D(cols);
  return Make("layer_norm_fwd", OpClass::kNormalization, kLayerNormForwardFlops * e,
              e * Sz(x) + 2.0 * D(cols) * kF32, e * Sz(y) + 2.0 * D(rows) * kF32, x);
}

OpCost LayerNormBackwardCost(int64_t rows, int64_t cols, DType x, DType dx) {
  const double e = D(rows) * D(cols);
  // Reads x, dy and dx (accumulated; dy in dx's dtype), gamma, dgamma, dbeta,
  // mean, rstd; writes dx, dgamma, dbeta.
  return Make("layer_norm_bwd", OpClass::kNormalization, kLayerNormBackwardFlops * e,
              e * (Sz(x) + 2.0 * Sz(dx)) + (3.0 * D(cols) + 2.0 * D(rows)) * kF32,
              e * Sz(dx) + 2.0 * D(cols) * kF32, x);
}

OpCost AttentionForwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                            int64_t head_dim, DType t) {
  const double bh = D(batch) * D(heads);
  const double scores = bh * D(q_len) * D(kv_len);
  const double flops = 2.0 * 2.0 * scores * D(head_dim) + kSoftmaxFlops * scores;
  const double read = bh * (D(q_len) + 2.0 * D(kv_len)) * D(head_dim) * Sz(t);
  const double written = scores * kF32 + bh * D(q_len) * D(head_dim) * Sz(t);
  return Make("attention_fwd", OpClass::kAttention, flops, read, written, t);
}

OpCost AttentionBackwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                             int64_t head_dim, DType t) {
  const double bh = D(batch) * D(heads);
  const double scores = bh * D(q_len) * D(kv_len);
  const double flops = 4.0 * 2.0 * scores * D(head_dim) + kSoftmaxBackwardFlops * scores;
  // Reads q, k, v, probs and dout; writes dq, dk, dv.
  const double qkv = bh * (D(q_len) + 2.0 * D(kv_len)) * D(head_dim);
  const double read = (qkv + bh * D(q_len) * D(head_dim)) * Sz(t) + scores * kF32;
  return Make("attention_bwd", OpClass::kAttention, flops, read, qkv * Sz(t), t);
}

double FlashAttentionScorePairs(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                                bool causal, int64_t masked_pairs) {
  if (masked_pairs > 0) return D(heads) * D(masked_pairs);
  const double per_head = causal ? D(q_len) * (D(q_len) + 1.0) / 2.0 : D(q_len) * D(kv_len);
  return D(batch) * D(heads) * per_head;
}

namespace {

// cuda/backend_attention.cc's composed attention for packed documents (cost.h:
// OpCost::composed_flops). Forward: S = scale Q K^T (one batched GEMM, f32
// out), the row log-sum-exps (reads S), the masked softmax (reads S,
// writes P in f32 and, for 16-bit t, in t), out = P V (reads P in t).
// Backward: P recomputed as forward's first steps, dP = dO V^T (f32 out),
// the softmax backward (reads P and dP, writes dS: over dP in f32, or dS
// and P in t), dV = P^T dO, dQ = dS K, dK = dS^T Q (each reads P or dS
// in t). `io` is the fused op's own operand traffic (q, k, v, out, ...).
OpCost WithComposed(OpCost c, bool backward, double dense, int64_t head_dim, DType t, double io) {
  const double p_t = t == DType::kF32 ? kF32 : Sz(t);  // P and dS as the GEMMs read them
  const double half = t == DType::kF32 ? 0.0 : Sz(t);   // their 16-bit copies written
  if (!backward) {
    c.composed_flops = 2.0 * 2.0 * dense * D(head_dim) + (kSoftmaxFlops + 3.0) * dense;
    c.composed_bytes = io + dense * (kF32 /*S*/ + kF32 /*lse*/ + 2.0 * kF32 /*softmax*/ + half + p_t);
    c.composed_kernels = 4;
  } else {
    c.composed_flops =
        5.0 * 2.0 * dense * D(head_dim) + (kSoftmaxFlops + kSoftmaxBackwardFlops) * dense;
    c.composed_bytes = io + dense * (kF32 /*S*/ + 2.0 * kF32 /*softmax*/ + kF32 /*dP*/ +
                                     2.0 * kF32 /*softmax bwd reads*/ + (half > 0 ? 2.0 * half : kF32) +
                                     3.0 * p_t /*the three GEMMs*/);
    c.composed_kernels = 7;
  }
  return c;
}

}  // namespace

OpCost FlashAttentionForwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                                 int64_t head_dim, bool causal, DType t, int64_t kv_heads,
                                 int64_t masked_pairs) {
  const double bh = D(batch) * D(heads);
  const double bkv = D(batch) * D(kv_heads > 0 ? kv_heads : heads);
  const double pairs =
      FlashAttentionScorePairs(batch, heads, q_len, kv_len, causal, masked_pairs);
  const double flops = 2.0 * 2.0 * pairs * D(head_dim) + kSoftmaxFlops * pairs;
  const double read = (bh * D(q_len) + 2.0 * bkv * D(kv_len)) * D(head_dim) * Sz(t);
  const double written = bh * D(q_len) * (D(head_dim) * Sz(t) + kF32);
  OpCost c = WithAttentionShape(Make("flash_attention_fwd", OpClass::kAttention, flops, read, written, t),
                                bh, q_len, pairs, head_dim);
  if (masked_pairs > 0) c = WithComposed(c, false, bh * D(q_len) * D(kv_len), head_dim, t, read + written);
  return c;
}

OpCost FlashAttentionBackwardCost(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                                  int64_t head_dim, bool causal, DType t, int64_t kv_heads,
                                  int64_t masked_pairs) {
  const double bh = D(batch) * D(heads);
  const double bkv = D(batch) * D(kv_heads > 0 ? kv_heads : heads);
  const double pairs =
      FlashAttentionScorePairs(batch, heads, q_len, kv_len, causal, masked_pairs);
  // S recomputed, P = exp(S - lse), dS = P (dP - delta): 3 per pair beyond
  // the softmax's backward; delta = rowsum(dO o O): 2 per query element.
  const double flops = 5.0 * 2.0 * pairs * D(head_dim) +
                       (kSoftmaxBackwardFlops + 3.0) * pairs + 2.0 * bh * D(q_len) * D(head_dim);
  const double qkv = (bh * D(q_len) + 2.0 * bkv * D(kv_len)) * D(head_dim);
  const double q_rows = bh * D(q_len) * D(head_dim);
  const double workspace = bh * D(q_len) * (D(head_dim) + 1.0) * kF32;  // dQ accumulator, delta
  const double read = (qkv + 2.0 * q_rows) * Sz(t) + bh * D(q_len) * kF32 + workspace;
  const double written = qkv * Sz(t) + workspace;
  OpCost c = WithAttentionShape(Make("flash_attention_bwd", OpClass::kAttention, flops, read, written, t),
                                bh, q_len, pairs, head_dim);
  if (masked_pairs > 0) c = WithComposed(c, true, bh * D(q_len) * D(kv_len), head_dim, t, read + written);
  return c;
}

OpCost RmsNormForwardCost(int64_t rows, int64_t cols, DType x, DType y) {
  const double e = D(rows) * D(cols);
  return Make("rms_norm_fwd", OpClass::kNormalization, kRmsNormForwardFlops * e,
              e * Sz(x) + D(cols) * kF32, e * Sz(y) + D(rows) * kF32, x);
}

OpCost RmsNormBackwardCost(int64_t rows, int64_t cols, DType x, DType dx) {
  const double e = D(rows) * D(cols);
  // Reads x, dy and dx (accumulated; dy in dx's dtype), gamma, dgamma, rstd;
  // writes dx, dgamma.
  return Make("rms_norm_bwd", OpClass::kNormalization, kRmsNormBackwardFlops * e,
              e * (Sz(x) + 2.0 * Sz(dx)) + (2.0 * D(cols) + D(rows)) * kF32,
              e * Sz(dx) + D(cols) * kF32, x);
}

OpCost RopeCost(int64_t n, DType x, DType y, bool backward) {
  return Make(backward ? "rope_bwd" : "rope_fwd", OpClass::kElementwise, kRopeFlops * D(n),
              D(n) * Sz(x), D(n) * Sz(y), x);
}

OpCost SwiGluForwardCost(int64_t n, DType x, DType y) {
  return Make("swiglu_fwd", OpClass::kElementwise, kSwiGluForwardFlops * D(n),
              2.0 * D(n) * Sz(x), D(n) * Sz(y), x);
}

OpCost SwiGluBackwardCost(int64_t n, DType x, DType dx) {
  // Reads gate, up, dy; writes dgate, dup.
  return Make("swiglu_bwd", OpClass::kElementwise, kSwiGluBackwardFlops * D(n),
              D(n) * (2.0 * Sz(x) + Sz(dx)), 2.0 * D(n) * Sz(dx), x);
}

OpCost EmbeddingForwardCost(int64_t count, int64_t dim, DType table, DType out) {
  return Make("embedding_fwd", OpClass::kEmbedding, 0,
              D(count) * kI32 + D(count) * D(dim) * Sz(table), D(count) * D(dim) * Sz(out), out);
}

OpCost EmbeddingBackwardCost(int64_t count, int64_t dim, DType dout) {
  return Make("embedding_bwd", OpClass::kEmbedding, D(count) * D(dim),
              D(count) * kI32 + D(count) * D(dim) * (Sz(dout) + kF32), D(count) * D(dim) * kF32,
              dout);
}

OpCost CrossEntropyForwardCost(int64_t rows, int64_t vocab, DType logits) {
  return Make("cross_entropy_fwd", OpClass::kLoss, kCrossEntropyFlops * D(rows) * D(vocab),
              D(rows) * D(vocab) * Sz(logits) + D(rows) * kI32, kF32, logits);
}

OpCost CrossEntropyBackwardCost(int64_t rows, int64_t vocab, DType logits, DType dlogits) {
  return Make("cross_entropy_bwd", OpClass::kLoss, kCrossEntropyFlops * D(rows) * D(vocab),
              D(rows) * D(vocab) * Sz(logits) + D(rows) * kI32, D(rows) * D(vocab) * Sz(dlogits),
              logits);
}

OpCost CrossEntropyRowLossesCost(int64_t rows, int64_t vocab, DType logits) {
  return Make("cross_entropy_fwd", OpClass::kLoss, kCrossEntropyFlops * D(rows) * D(vocab),
              D(rows) * D(vocab) * Sz(logits) + D(rows) * kI32, D(rows) * kF32, logits);
}

OpCost CrossEntropyMeanCost(int64_t rows) {
  return Make("cross_entropy_mean", OpClass::kLoss, D(rows), D(rows) * (kF32 + kI32), kF32,
              DType::kF32);
}

OpCost SumOfSquaresCost(int64_t n, DType t) {
  return Make("sum_of_squares", OpClass::kReduction, 2.0 * D(n), D(n) * Sz(t) + 8.0, 8.0, t);
}

OpCost MaxAbsCost(int64_t n, DType t) {
  return Make("max_abs", OpClass::kReduction, D(n), D(n) * Sz(t) + 8.0, 8.0, t);
}

OpCost SgdUpdateCost(int64_t n, bool has_momentum) {
  const double tensors_read = has_momentum ? 3.0 : 2.0;   // param, grad (, momentum)
  const double tensors_written = has_momentum ? 2.0 : 1.0;
  return Make("sgd_update", OpClass::kOptimizer, kSgdFlops * D(n), tensors_read * D(n) * kF32,
              tensors_written * D(n) * kF32);
}

OpCost AdamUpdateCost(int64_t n, bool decoupled) {
  return Make(decoupled ? "adamw_update" : "adam_update", OpClass::kOptimizer, kAdamFlops * D(n),
              4.0 * D(n) * kF32, 3.0 * D(n) * kF32);
}

OpCost ReadScalarCost(DType t) { return Make("read_scalar", OpClass::kCopy, 0, Sz(t), 0, t); }
OpCost ReadValuesCost(DType t, int64_t n) {
  return Make("read_values", OpClass::kCopy, 0, static_cast<double>(n) * Sz(t), 0, t);
}

}  // namespace sk::ops
