#include "runtime/nn/llama.h"

#include <algorithm>
#include <cmath>

#include "runtime/ops/classifier.h"
#include "runtime/ops/cost.h"

namespace sk {

using nn_internal::InDType;
using nn_internal::Linear;
using nn_internal::LinearBackward;
using nn_internal::NewAct;
using nn_internal::NewF32;
using nn_internal::Positive;
using nn_internal::UnitGrads;
using nn_internal::UnitParams;
using nn_internal::UnitScope;
using ops::MatrixRef;
using ops::OpContext;

namespace {

// Sizes of one block invocation (N = batch * seq rows).
struct LlamaDims {
  int64_t batch = 0, seq = 0;
  int64_t d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, d_ff = 0;
  float theta = 0, eps = 0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;
  DType storage = DType::kF32;  // the compute dtype: activations and their gradients
  // Packed documents (nn_internal::DocumentTensors): each token's RoPE
  // position and the attention's key starts; undefined otherwise.
  Tensor positions, key_start;
  int64_t masked_pairs = 0;

  int64_t rows() const { return batch * seq; }
  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
  ops::AttentionShape Attention() const {
    ops::AttentionShape as;
    as.batch = batch;
    as.heads = heads;
    as.kv_heads = kv_heads;
    as.q_len = seq;
    as.kv_len = seq;
    as.head_dim = head_dim;
    as.causal = true;
    as.key_start = key_start;
    as.masked_pairs = masked_pairs;
    return as;
  }
};

// One block's parameters by name (or their gradients: the same layout).
// C = d_model, Q = heads * head_dim, K = kv_heads * head_dim, F = d_ff.
struct LlamaBlockTensors {
  Tensor input_norm_g;            // [C]
  Tensor q_w, q_b;                // [C, Q], [Q] (q_b: qkv_bias only)
  Tensor k_w, k_b;                // [C, K], [K]
  Tensor v_w, v_b;                // [C, K], [K]
  Tensor o_w;                     // [Q, C]
  Tensor post_norm_g;             // [C]
  Tensor gate_w, up_w, down_w;    // [C, F], [C, F], [F, C]
};

// What a block's forward keeps for its backward (N rows, B batch, H heads, T seq).
struct LlamaBlockSaved {
  Tensor h1, rstd1;   // [N, C] input RMSNorm output, [N] f32
  Tensor q, k, v;     // [N, Q], [N, K], [N, K]; q and k after RoPE
  Tensor att, lse;    // [N, Q] heads' outputs, [B, H, T] f32 log-sum-exp
  Tensor x2;          // [N, C] after the attention residual
  Tensor h2, rstd2;   // [N, C], [N] post-attention RMSNorm
  Tensor gate, up;    // [N, F] the MLP's two projections
  Tensor act;         // [N, F] silu(gate) * up, down_proj's input
  Tensor out;         // [N, C] the block output
};

// The block's tensors in spec order (AppendBlockSpecs).
template <typename Src>
LlamaBlockTensors Bind(const Src& src, bool qkv_bias) {
  LlamaBlockTensors t;
  size_t i = 0;
  t.input_norm_g = src[i++];
  t.q_w = src[i++];
  if (qkv_bias) t.q_b = src[i++];
  t.k_w = src[i++];
  if (qkv_bias) t.k_b = src[i++];
  t.v_w = src[i++];
  if (qkv_bias) t.v_b = src[i++];
  t.o_w = src[i++];
  t.post_norm_g = src[i++];
  t.gate_w = src[i++];
  t.up_w = src[i++];
  t.down_w = src[i++];
  return t;
}

void AppendBlockSpecs(const LlamaConfig& c, std::vector<ParamSpec>* out) {
  const int64_t d = c.d_model, q = c.n_head * c.head_dim(), kv = c.kv_heads() * c.head_dim();
  const Initializer w = Initializer::Normal(0.0f, 0.02f);
  auto add = [&](const char* name, Shape shape, Initializer init) {
    out->push_back(ParamSpec{name, std::move(shape), init});
  };
  add("input_layernorm.g", Shape{d}, Initializer::Ones());
  add("self_attn.q_proj.w", Shape{d, q}, w);
  if (c.qkv_bias) add("self_attn.q_proj.b", Shape{q}, Initializer::Zeros());
  add("self_attn.k_proj.w", Shape{d, kv}, w);
  if (c.qkv_bias) add("self_attn.k_proj.b", Shape{kv}, Initializer::Zeros());
  add("self_attn.v_proj.w", Shape{d, kv}, w);
  if (c.qkv_bias) add("self_attn.v_proj.b", Shape{kv}, Initializer::Zeros());
  add("self_attn.o_proj.w", Shape{q, d}, w);
  add("post_attention_layernorm.g", Shape{d}, Initializer::Ones());
  add("mlp.gate_proj.w", Shape{d, c.d_ff}, w);
  add("mlp.up_proj.w", Shape{d, c.d_ff}, w);
  add("mlp.down_proj.w", Shape{c.d_ff, d}, w);
}

// y[rows, out] = residual + x[rows, in] w[in, out]: the residual copied into
// y, then one GEMM with beta = 1 (f32 accumulation over the residual, a
// 16-bit y rounded once).
Status ResidualLinear(const OpContext& ctx, const Tensor& x, const Tensor& w_in,
                      const Tensor& residual, int64_t rows, int64_t in, int64_t out,
                      const Tensor& y) {
  SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, x.dtype()));
  SK_RETURN_IF_ERROR(ops::Copy(ctx, residual, y));
  ops::GemmParams p;
  p.m = rows, p.n = out, p.k = in;
  p.beta = 1.0f;
  return ops::Gemm(ctx, p, MatrixRef{x, 0, in}, MatrixRef{w, 0, out}, MatrixRef{y, 0, out});
}

// Attention in linear memory from the kept s->q (after RoPE), s->k and
// s->v: allocates and writes s->att and s->lse.
Status AttentionCore(const OpContext& ctx, const LlamaDims& d, LlamaBlockSaved* s) {
  const int64_t n = d.rows(), qw = d.q_width(), kw = d.kv_width();
  SK_ASSIGN_OR_RETURN(s->att, NewAct(ctx, d.storage, n * qw));
  SK_ASSIGN_OR_RETURN(s->lse, NewF32(ctx, d.batch * d.heads * d.seq));
  return ops::FlashAttentionForward(ctx, d.Attention(), MatrixRef{s->q, 0, qw},
                                    MatrixRef{s->k, 0, kw}, MatrixRef{s->v, 0, kw},
                                    MatrixRef{s->att, 0, qw}, s->lse);
}

Status BlockForward(const OpContext& ctx, const LlamaDims& d, const LlamaBlockTensors& p,
                    const Tensor& x, LlamaBlockSaved* s) {
  const int64_t n = d.rows(), c = d.d_model, qw = d.q_width(), kw = d.kv_width(), f = d.d_ff;
  const DType t = d.storage;
  // Attention: x + o_proj(attention(rope(q), rope(k), v)) of RMSNorm(x).
  SK_ASSIGN_OR_RETURN(s->h1, NewAct(ctx, t, n * c));
  SK_ASSIGN_OR_RETURN(s->rstd1, NewF32(ctx, n));
  SK_RETURN_IF_ERROR(ops::RmsNormForward(ctx, x, p.input_norm_g, d.eps, s->h1, s->rstd1));
  SK_ASSIGN_OR_RETURN(s->q, NewAct(ctx, t, n * qw));
  SK_ASSIGN_OR_RETURN(s->k, NewAct(ctx, t, n * kw));
  SK_ASSIGN_OR_RETURN(s->v, NewAct(ctx, t, n * kw));
  SK_RETURN_IF_ERROR(Linear(ctx, s->h1, p.q_w, p.q_b, n, c, qw, s->q));
  SK_RETURN_IF_ERROR(Linear(ctx, s->h1, p.k_w, p.k_b, n, c, kw, s->k));
  SK_RETURN_IF_ERROR(Linear(ctx, s->h1, p.v_w, p.v_b, n, c, kw, s->v));
  SK_RETURN_IF_ERROR(ops::RopeForward(ctx, s->q, d.seq, d.heads, d.head_dim, d.theta,
                                      d.rope_scaling, s->q, d.positions));
  SK_RETURN_IF_ERROR(ops::RopeForward(ctx, s->k, d.seq, d.kv_heads, d.head_dim, d.theta,
                                      d.rope_scaling, s->k, d.positions));
  SK_RETURN_IF_ERROR(AttentionCore(ctx, d, s));
  SK_ASSIGN_OR_RETURN(s->x2, NewAct(ctx, t, n * c));
  SK_RETURN_IF_ERROR(ResidualLinear(ctx, s->att, p.o_w, x, n, qw, c, s->x2));
  // MLP: x2 + down_proj(silu(gate_proj(h2)) * up_proj(h2)), h2 = RMSNorm(x2).
  SK_ASSIGN_OR_RETURN(s->h2, NewAct(ctx, t, n * c));
  SK_ASSIGN_OR_RETURN(s->rstd2, NewF32(ctx, n));
  SK_RETURN_IF_ERROR(ops::RmsNormForward(ctx, s->x2, p.post_norm_g, d.eps, s->h2, s->rstd2));
  SK_ASSIGN_OR_RETURN(s->gate, NewAct(ctx, t, n * f));
  SK_ASSIGN_OR_RETURN(s->up, NewAct(ctx, t, n * f));
  SK_RETURN_IF_ERROR(Linear(ctx, s->h2, p.gate_w, Tensor(), n, c, f, s->gate));
  SK_RETURN_IF_ERROR(Linear(ctx, s->h2, p.up_w, Tensor(), n, c, f, s->up));
  SK_ASSIGN_OR_RETURN(s->act, NewAct(ctx, t, n * f));
  SK_RETURN_IF_ERROR(ops::SwiGluForward(ctx, s->gate, s->up, s->act));
  SK_ASSIGN_OR_RETURN(s->out, NewAct(ctx, t, n * c));
  return ResidualLinear(ctx, s->act, p.down_w, s->x2, n, f, c, s->out);
}

// What a selective policy drops after a block's forward and rebuilds
// before its backward (ModelOptions: kSelective, recompute_attention,
// kSelectiveMatmuls).
struct LlamaRecompute {
  bool selective = false;  // either selective policy: the block drops what it rebuilds
  bool attention = false;  // the attention's output and log-sum-exp
  bool matmuls = false;    // the even-numbered GEMMs' outputs: k, x2 (o's), up
};

LlamaRecompute RecomputeOf(const ModelOptions& o) {
  LlamaRecompute r;
  r.selective = o.selective_checkpointing() || o.selective_matmul_checkpointing();
  r.attention = o.selective_checkpointing() && o.recompute_attention;
  r.matmuls = o.selective_matmul_checkpointing();
  return r;
}

// Selective checkpointing: what RecomputeDropped rebuilds leaves `s` after
// the forward: both RMSNorms' outputs and statistics and the SwiGLU product.
// The GEMM outputs stay (q, k, v, x2, gate, up), q and k after RoPE (applied
// in place to the projections' outputs: attention's backward reads only
// them) and, unless r.attention, attention's output and log-sum-exp. With
// r.matmuls (torchtitan's "every other matmul": of the block's GEMMs q, k,
// v, o, gate, up, down in forward order the even ones are recomputed) k,
// x2 and up go too; down's output is the block output, kept as the next
// block's input whatever the policy.
void ReleaseRecomputable(const LlamaRecompute& r, LlamaBlockSaved* s) {
  s->h1 = s->rstd1 = Tensor();
  s->h2 = s->rstd2 = Tensor();
  s->act = Tensor();
  if (r.attention) s->att = s->lse = Tensor();
  if (r.matmuls) s->k = s->x2 = s->up = Tensor();
}

// Rebuilds what ReleaseRecomputable dropped with the ops BlockForward ran on
// the same inputs (x and the kept tensors): bit-identical activations.
Status RecomputeDropped(const OpContext& ctx, const LlamaDims& d, const LlamaBlockTensors& p,
                        const Tensor& x, const LlamaRecompute& r, LlamaBlockSaved* s) {
  const int64_t n = d.rows(), c = d.d_model, qw = d.q_width(), kw = d.kv_width(), f = d.d_ff;
  const DType t = d.storage;
  SK_ASSIGN_OR_RETURN(s->h1, NewAct(ctx, t, n * c));
  SK_ASSIGN_OR_RETURN(s->rstd1, NewF32(ctx, n));
  SK_RETURN_IF_ERROR(ops::RmsNormForward(ctx, x, p.input_norm_g, d.eps, s->h1, s->rstd1));
  if (r.matmuls) {
    SK_ASSIGN_OR_RETURN(s->k, NewAct(ctx, t, n * kw));
    SK_RETURN_IF_ERROR(Linear(ctx, s->h1, p.k_w, p.k_b, n, c, kw, s->k));
    SK_RETURN_IF_ERROR(ops::RopeForward(ctx, s->k, d.seq, d.kv_heads, d.head_dim, d.theta,
                                        d.rope_scaling, s->k, d.positions));
    SK_ASSIGN_OR_RETURN(s->x2, NewAct(ctx, t, n * c));
    SK_RETURN_IF_ERROR(ResidualLinear(ctx, s->att, p.o_w, x, n, qw, c, s->x2));
  }
  if (r.attention) SK_RETURN_IF_ERROR(AttentionCore(ctx, d, s));
  SK_ASSIGN_OR_RETURN(s->h2, NewAct(ctx, t, n * c));
  SK_ASSIGN_OR_RETURN(s->rstd2, NewF32(ctx, n));
  SK_RETURN_IF_ERROR(ops::RmsNormForward(ctx, s->x2, p.post_norm_g, d.eps, s->h2, s->rstd2));
  if (r.matmuls) {
    SK_ASSIGN_OR_RETURN(s->up, NewAct(ctx, t, n * f));
    SK_RETURN_IF_ERROR(Linear(ctx, s->h2, p.up_w, Tensor(), n, c, f, s->up));
  }
  SK_ASSIGN_OR_RETURN(s->act, NewAct(ctx, t, n * f));
  return ops::SwiGluForward(ctx, s->gate, s->up, s->act);
}

// Given dy for the block output, overwrites dx with the input gradient and
// adds parameter gradients into g. dx may be dy. The running gradient
// lives in dx: dy (the MLP's residual) is copied there, each RMSNorm's
// backward adds its branch.
Status BlockBackward(const OpContext& ctx, const LlamaDims& d, const LlamaBlockTensors& p,
                     const LlamaBlockTensors& g, const Tensor& x, const LlamaBlockSaved& s,
                     const Tensor& dy, const Tensor& dx) {
  const int64_t n = d.rows(), c = d.d_model, qw = d.q_width(), kw = d.kv_width(), f = d.d_ff;
  const DType t = d.storage;
  SK_ASSIGN_OR_RETURN(Tensor dh, NewAct(ctx, t, n * c));  // each RMSNorm's output gradient
  {  // MLP
    SK_ASSIGN_OR_RETURN(Tensor dact, NewAct(ctx, t, n * f));
    SK_RETURN_IF_ERROR(LinearBackward(ctx, s.act, p.down_w, dy, n, f, c, dact, false, g.down_w,
                                      Tensor()));
    SK_ASSIGN_OR_RETURN(Tensor dgate, NewAct(ctx, t, n * f));
    SK_ASSIGN_OR_RETURN(Tensor dup, NewAct(ctx, t, n * f));
    SK_RETURN_IF_ERROR(ops::SwiGluBackward(ctx, s.gate, s.up, dact, dgate, dup));
    dact = Tensor();
    SK_RETURN_IF_ERROR(
        LinearBackward(ctx, s.h2, p.gate_w, dgate, n, c, f, dh, false, g.gate_w, Tensor()));
    SK_RETURN_IF_ERROR(
        LinearBackward(ctx, s.h2, p.up_w, dup, n, c, f, dh, true, g.up_w, Tensor()));
  }
  if (dx.data() != dy.data()) SK_RETURN_IF_ERROR(ops::Copy(ctx, dy, dx));
  SK_RETURN_IF_ERROR(ops::RmsNormBackward(ctx, s.x2, p.post_norm_g, dh, s.rstd2, dx, g.post_norm_g));
  {  // Attention
    SK_ASSIGN_OR_RETURN(Tensor datt, NewAct(ctx, t, n * qw));
    SK_RETURN_IF_ERROR(
        LinearBackward(ctx, s.att, p.o_w, dx, n, qw, c, datt, false, g.o_w, Tensor()));
    SK_ASSIGN_OR_RETURN(Tensor dq, NewAct(ctx, t, n * qw));
    SK_ASSIGN_OR_RETURN(Tensor dk, NewAct(ctx, t, n * kw));
    SK_ASSIGN_OR_RETURN(Tensor dv, NewAct(ctx, t, n * kw));
    SK_RETURN_IF_ERROR(ops::FlashAttentionBackward(
        ctx, d.Attention(), MatrixRef{s.q, 0, qw}, MatrixRef{s.k, 0, kw}, MatrixRef{s.v, 0, kw},
        MatrixRef{s.att, 0, qw}, MatrixRef{datt, 0, qw}, s.lse, MatrixRef{dq, 0, qw},
        MatrixRef{dk, 0, kw}, MatrixRef{dv, 0, kw}));
    datt = Tensor();
    SK_RETURN_IF_ERROR(ops::RopeBackward(ctx, dq, d.seq, d.heads, d.head_dim, d.theta,
                                         d.rope_scaling, dq, d.positions));
    SK_RETURN_IF_ERROR(ops::RopeBackward(ctx, dk, d.seq, d.kv_heads, d.head_dim, d.theta,
                                         d.rope_scaling, dk, d.positions));
    SK_RETURN_IF_ERROR(LinearBackward(ctx, s.h1, p.q_w, dq, n, c, qw, dh, false, g.q_w, g.q_b));
    SK_RETURN_IF_ERROR(LinearBackward(ctx, s.h1, p.k_w, dk, n, c, kw, dh, true, g.k_w, g.k_b));
    SK_RETURN_IF_ERROR(LinearBackward(ctx, s.h1, p.v_w, dv, n, c, kw, dh, true, g.v_w, g.v_b));
  }
  return ops::RmsNormBackward(ctx, x, p.input_norm_g, dh, s.rstd1, dx, g.input_norm_g);
}

// Bytes a BlockForward keeps (LlamaBlockSaved) and the most a BlockBackward
// allocates at once beyond them, its dy and dx.
int64_t BlockSavedBytes(const LlamaDims& d) {
  const int64_t n = d.rows(), a = static_cast<int64_t>(DTypeSize(d.storage));
  return a * (4 * n * d.d_model + 2 * n * d.q_width() + 2 * n * d.kv_width() + 3 * n * d.d_ff) +
         4 * 2 * n + 4 * d.batch * d.heads * d.seq;
}

// Bytes ReleaseRecomputable drops and RecomputeDropped allocates again.
int64_t BlockRecomputableBytes(const LlamaDims& d, const LlamaRecompute& r) {
  const int64_t n = d.rows(), a = static_cast<int64_t>(DTypeSize(d.storage));
  const int64_t cheap = a * (2 * n * d.d_model + n * d.d_ff) + 4 * 2 * n;
  // att; lse (f32)
  const int64_t attention = r.attention ? a * n * d.q_width() + 4 * d.batch * d.heads * d.seq : 0;
  // k, x2, up
  const int64_t matmuls = r.matmuls ? a * n * (d.kv_width() + d.d_model + d.d_ff) : 0;
  return cheap + attention + matmuls;
}

// What a block's selective policy drops after its forward: nothing without one.
int64_t BlockDroppedBytes(const LlamaDims& d, const LlamaRecompute& r) {
  return r.selective ? BlockRecomputableBytes(d, r) : 0;
}

// Flops RecomputeDropped runs: two RMSNorms and a SwiGLU product; with
// r.attention, also QK^T and PV (as BlockForwardMatmulFlops counts them)
// and the softmax; with r.matmuls, the k, o and up GEMMs.
double BlockRecomputeFlops(const LlamaDims& d, const LlamaRecompute& r) {
  const double n = static_cast<double>(d.rows()), t = static_cast<double>(d.seq);
  const double c = static_cast<double>(d.d_model);
  double flops = 2.0 * ops::kRmsNormForwardFlops * n * c +
                 ops::kSwiGluForwardFlops * n * static_cast<double>(d.d_ff);
  if (r.attention) {
    flops += 2.0 * 2.0 * n * t * static_cast<double>(d.q_width()) +
             ops::kSoftmaxFlops * static_cast<double>(d.heads) * n * t;
  }
  if (r.matmuls) {
    flops += 2.0 * n * c *
             static_cast<double>(d.kv_width() + d.q_width() + d.d_ff);
  }
  return flops;
}

int64_t BlockBackwardTempBytes(const LlamaDims& d) {
  const int64_t n = d.rows(), a = static_cast<int64_t>(DTypeSize(d.storage));
  const int64_t dh = a * n * d.d_model;
  const int64_t mlp = dh + std::max(3 * a * n * d.d_ff, 2 * a * n * d.d_ff);
  // datt, dq, dk, dv and flash attention's f32 workspace (ops.h).
  const int64_t attention = dh + 2 * a * n * d.q_width() + 2 * a * n * d.kv_width() +
                            4 * ops::FlashAttentionBackwardWorkspaceElements(d.Attention());
  return std::max(mlp, attention);
}

// (Parameters are used in place; 16-bit gradient buffers' f32 sinks are
// counted by whoever hands them out, as for GPT.) Kept through the
// forward: token ids and targets, the loss, the embedding output and, per
// block, what its backward needs (`saved`) or (checkpointing) its output only.
int64_t KeptBytes(const LlamaDims& d, int64_t layers, bool ckpt, int64_t saved) {
  const int64_t n = d.rows(), a = static_cast<int64_t>(DTypeSize(d.storage));
  return 4 * (2 * n + 1) + a * n * d.d_model + layers * (ckpt ? a * n * d.d_model : saved);
}

double BlockForwardMatmulFlops(const LlamaDims& d) {
  const double n = static_cast<double>(d.rows()), c = static_cast<double>(d.d_model);
  const double q = static_cast<double>(d.q_width()), kv = static_cast<double>(d.kv_width());
  // q, k, v and o projections; QK^T and PV over the full sequence (causal
  // masking not discounted, the usual 12 L T d convention); the three MLP GEMMs.
  return 2.0 * n * c * (2.0 * q + 2.0 * kv) + 2.0 * 2.0 * n * static_cast<double>(d.seq) * q +
         3.0 * 2.0 * n * c * static_cast<double>(d.d_ff);
}

}  // namespace

Status LlamaConfig::Validate() const {
  SK_RETURN_IF_ERROR(Positive(vocab_size, name, "vocab_size"));
  SK_RETURN_IF_ERROR(Positive(max_seq_len, name, "max_seq_len"));
  SK_RETURN_IF_ERROR(Positive(n_layer, name, "n_layer"));
  SK_RETURN_IF_ERROR(Positive(n_head, name, "n_head"));
  SK_RETURN_IF_ERROR(Positive(d_model, name, "d_model"));
  SK_RETURN_IF_ERROR(Positive(d_ff, name, "d_ff"));
  if (n_kv_head < 0) {
    return InvalidArgumentError("config '" + name + "': n_kv_head must be >= 0 (0: n_head), got " +
                                std::to_string(n_kv_head));
  }
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_layer, nn_internal::kMaxLayers, name, "n_layer"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(d_model, nn_internal::kMaxWidth, name, "d_model"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(d_ff, nn_internal::kMaxWidth, name, "d_ff"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_head, nn_internal::kMaxWidth, name, "n_head"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_kv_head, nn_internal::kMaxWidth, name, "n_kv_head"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(max_seq_len, nn_internal::kMaxWidth, name, "max_seq_len"));
  SK_RETURN_IF_ERROR(nn_internal::ValidateWidthAndVocab(name, d_model, n_head, vocab_size));
  {
    // Every factor is bounded above, so 128 bits hold each term.
    using W = __int128;
    const W d = d_model, kv = W{kv_heads()} * head_dim();
    const W layer = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * d_ff + (qkv_bias ? d + 2 * kv : W{0});
    SK_RETURN_IF_ERROR(nn_internal::CheckParameterCount(
        name, W{vocab_size} * d + W{n_layer} * layer + d + (tie_word_embeddings ? W{0} : d * vocab_size)));
  }
  if (head_dim() % 2 != 0) {
    return InvalidArgumentError("config '" + name + "': head_dim " + std::to_string(head_dim()) +
                                " (d_model / n_head) must be even for rotary embeddings");
  }
  if (n_head % kv_heads() != 0) {
    return InvalidArgumentError("config '" + name + "': n_kv_head " + std::to_string(kv_heads()) +
                                " does not divide n_head " + std::to_string(n_head));
  }
  if (!(rope_theta > 0.0f)) {
    return InvalidArgumentError("config '" + name + "': rope_theta must be positive, got " +
                                std::to_string(rope_theta));
  }
  if (!(rms_norm_eps > 0.0f)) {
    return InvalidArgumentError("config '" + name + "': rms_norm_eps must be positive, got " +
                                std::to_string(rms_norm_eps));
  }
  return ops::ValidateRopeScaling(rope_scaling).WithContext("config '" + name + "'");
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const LlamaConfig& config,
                                                         const ModelOptions& options) {
  SK_RETURN_IF_ERROR(ValidateCreate(config, options, /*supports_selective=*/true,
                                    /*supports_selective_matmuls=*/true));
  return std::unique_ptr<LlamaModel>(new LlamaModel(config, options));
}

LlamaModel::LlamaModel(const LlamaConfig& config, const ModelOptions& options)
    : ConfiguredModel(config, options) {
  const int64_t d = config.d_model;
  UnitSpec embed{"embed", {}};
  embed.params.push_back(
      {"embed_tokens.w", Shape{config.vocab_size, d}, Initializer::Normal(0.0f, 0.02f)});
  units_.push_back(std::move(embed));
  for (int64_t l = 0; l < config.n_layer; ++l) {
    UnitSpec u{"layers." + std::to_string(l), {}};
    AppendBlockSpecs(config, &u.params);
    units_.push_back(std::move(u));
  }
  UnitSpec head{"head", {}};
  head.params.push_back({"norm.g", Shape{d}, Initializer::Ones()});
  if (config.tie_word_embeddings) {
    head.tied.push_back(
        TiedParamSpec{"lm_head.w", "embed.embed_tokens.w", Shape{config.vocab_size, d}});
  } else {
    head.params.push_back(
        {"lm_head.w", Shape{d, config.vocab_size}, Initializer::Normal(0.0f, 0.02f)});
  }
  units_.push_back(std::move(head));
}

Status LlamaModel::ValidateBatch(const TokenBatch& batch) const {
  return nn_internal::ValidateDecoderBatch(batch, config_.name, config_.max_seq_len, config_.vocab_size);
}

namespace {

LlamaDims Dims(const LlamaConfig& c, DType storage, int64_t batch, int64_t seq) {
  LlamaDims d;
  d.batch = batch;
  d.seq = seq;
  d.d_model = c.d_model;
  d.heads = c.n_head;
  d.kv_heads = c.kv_heads();
  d.head_dim = c.head_dim();
  d.d_ff = c.d_ff;
  d.theta = c.rope_theta;
  d.rope_scaling = c.rope_scaling;
  d.eps = c.rms_norm_eps;
  d.qkv_bias = c.qkv_bias;
  d.storage = storage;
  return d;
}

}  // namespace

StatusOr<float> LlamaModel::Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                                bool backward) const {
  SK_ASSIGN_OR_RETURN(const OpContext ctx, nn_internal::MakeContext(hooks, alloc));
  const int64_t L = config_.n_layer;
  const int64_t n = batch.batch_size * batch.seq_len;
  const int64_t c = config_.d_model, vocab = config_.vocab_size;
  const DType act = options_.compute_dtype;
  const bool ckpt = options_.full_checkpointing();
  // Either selective policy: what is dropped after each block's forward
  // and rebuilt before its backward.
  const LlamaRecompute recompute = RecomputeOf(options_);
  const bool selective = recompute.selective;
  const bool bias = config_.qkv_bias;
  const bool tied = config_.tie_word_embeddings;
  const int head_unit = static_cast<int>(L + 1);
  LlamaDims dims = Dims(config_, act, batch.batch_size, batch.seq_len);

  SK_ASSIGN_OR_RETURN(Tensor inputs, nn_internal::TokensToDevice(ctx, batch.inputs));
  SK_ASSIGN_OR_RETURN(Tensor targets, nn_internal::TokensToDevice(ctx, batch.targets));
  {  // Packed documents: position ids turn RoPE; segment ids mask the attention.
    SK_ASSIGN_OR_RETURN(nn_internal::DocumentTensors docs,
                        nn_internal::DocumentsToDevice(ctx, batch));
    dims.positions = std::move(docs.positions);
    dims.key_start = std::move(docs.key_start);
    dims.masked_pairs = docs.masked_pairs;
  }
  // xs[l] is block l's input; xs[L] feeds the head.
  std::vector<Tensor> xs(static_cast<size_t>(L + 1));
  std::vector<LlamaBlockSaved> saved(static_cast<size_t>(L));
  UnitScope scope(hooks, units_, ctx);

  {  // Token embedding (no position embedding: RoPE rotates q and k).
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(0));
    SK_ASSIGN_OR_RETURN(xs[0], NewAct(ctx, act, n * c));
    SK_RETURN_IF_ERROR(ops::EmbeddingForward(ctx, p[0], inputs, xs[0]));
    SK_RETURN_IF_ERROR(scope.PostForward(0));
  }
  for (int64_t l = 0; l < L; ++l) {
    const int u = static_cast<int>(l + 1);
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(u));
    LlamaBlockSaved s;
    SK_RETURN_IF_ERROR(BlockForward(ctx, dims, Bind(p, bias), xs[l], &s));
    xs[l + 1] = s.out;
    if (selective) ReleaseRecomputable(recompute, &s);
    if (!ckpt && backward) saved[l] = std::move(s);
    SK_RETURN_IF_ERROR(scope.PostForward(u));
    if (!backward && l > 0) xs[l] = Tensor();
  }
  // Head: final RMSNorm, then the fused classifier (LM projection and
  // cross-entropy a chunk of tokens at a time, ops/classifier.h): for the
  // loss alone in the forward, with its gradient in the head's backward.
  Tensor head_h, head_rstd;
  const ops::ClassifierShape classifier{n, c, vocab, tied};
  float loss = 0.0f;
  {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(head_unit));
    const Tensor& norm_g = p[0];     // [C]
    const Tensor& lm_head_w = p[1];  // [C, V]; tied: embed_tokens.w [V, C]
    SK_ASSIGN_OR_RETURN(head_h, NewAct(ctx, act, n * c));
    SK_ASSIGN_OR_RETURN(head_rstd, NewF32(ctx, n));
    SK_RETURN_IF_ERROR(ops::RmsNormForward(ctx, xs[L], norm_g, config_.rms_norm_eps, head_h,
                                           head_rstd));
    if (!backward) {
      SK_ASSIGN_OR_RETURN(Tensor loss_t, ctx.alloc->Empty(DType::kF32, Shape{1}));
      SK_RETURN_IF_ERROR(ops::Classifier(ctx, classifier, head_h, lm_head_w, targets, loss_t));
      SK_ASSIGN_OR_RETURN(double value, ops::ReadScalar(ctx, loss_t));
      loss = static_cast<float>(value);
    }
    SK_RETURN_IF_ERROR(scope.PostForward(head_unit));
  }
  if (!backward) return loss;

  SK_ASSIGN_OR_RETURN(Tensor dx, NewAct(ctx, act, n * c));
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(head_unit));
    SK_ASSIGN_OR_RETURN(Tensor loss_t, ctx.alloc->Empty(DType::kF32, Shape{1}));
    SK_ASSIGN_OR_RETURN(Tensor dh, NewAct(ctx, act, n * c));
    SK_RETURN_IF_ERROR(ops::Classifier(ctx, classifier, head_h, b.p[1], targets, loss_t, dh, b.g[1],
                                       nn_internal::ClassifierGradScale(batch)));
    SK_RETURN_IF_ERROR(ops::Fill(ctx, dx, 0.0f));
    SK_RETURN_IF_ERROR(ops::RmsNormBackward(ctx, xs[L], b.p[0], dh, head_rstd, dx, b.g[0]));
    SK_ASSIGN_OR_RETURN(double value, ops::ReadScalar(ctx, loss_t));
    loss = static_cast<float>(value);
    head_h = head_rstd = Tensor();
    xs[L] = Tensor();
    SK_RETURN_IF_ERROR(scope.PostBackward(head_unit, &b));
  }
  SK_ASSIGN_OR_RETURN(Tensor dnext, NewAct(ctx, act, n * c));
  for (int64_t l = L - 1; l >= 0; --l) {
    const int u = static_cast<int>(l + 1);
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(u));
    const LlamaBlockTensors p = Bind(b.p, bias);
    if (ckpt) SK_RETURN_IF_ERROR(BlockForward(ctx, dims, p, xs[l], &saved[l]));
    if (selective) {
      SK_RETURN_IF_ERROR(RecomputeDropped(ctx, dims, p, xs[l], recompute, &saved[l]));
    }
    SK_RETURN_IF_ERROR(BlockBackward(ctx, dims, p, Bind(b.g, bias), xs[l], saved[l], dx, dnext));
    saved[l] = LlamaBlockSaved();
    if (l > 0) xs[l] = Tensor();
    std::swap(dx, dnext);
    SK_RETURN_IF_ERROR(scope.PostBackward(u, &b));
  }
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackwardGradientsOnly(0));
    SK_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx, inputs, dx, b.g[0]));
    SK_RETURN_IF_ERROR(scope.PostBackward(0, &b));
  }
  return loss;
}

StepFlops LlamaModel::Flops(int64_t batch_size, int64_t seq_len, int64_t /*source_len*/) const {
  const LlamaDims d = Dims(config_, options_.compute_dtype, batch_size, seq_len);
  const double block_fwd = BlockForwardMatmulFlops(d);
  const double head_fwd = 2.0 * static_cast<double>(d.rows()) * config_.d_model * config_.vocab_size;
  double recompute = 0.0;  // per block
  if (options_.full_checkpointing()) recompute = block_fwd;
  const LlamaRecompute r = RecomputeOf(options_);
  if (r.selective) recompute = BlockRecomputeFlops(d, r);
  StepFlops f;
  f.model_flops = 3.0 * (block_fwd * config_.n_layer + head_fwd);
  f.hardware_flops = f.model_flops + recompute * config_.n_layer;
  return f;
}

// Llama's attention always runs in linear memory (FlashAttentionForward on
// every device), so the count is the same on each.
int64_t LlamaModel::PeakActivationBytes(int64_t batch_size, int64_t seq_len,
                                        int64_t /*source_len*/, DeviceKind /*device*/) const {
  const LlamaDims d = Dims(config_, options_.compute_dtype, batch_size, seq_len);
  const int64_t n = d.rows(), c = config_.d_model, L = config_.n_layer;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  const bool ckpt = options_.full_checkpointing();
  // Selective checkpointing keeps less what RecomputeDropped rebuilds in the
  // block's backward.
  const int64_t recomputed = BlockDroppedBytes(d, RecomputeOf(options_));
  const int64_t saved = BlockSavedBytes(d) - recomputed;
  const int64_t kept = KeptBytes(d, L, ckpt, saved);
  // Head backward: its RMSNorm output and rstd, dx, dh and the fused
  // classifier's row losses and chunk of logits.
  const int64_t head = kept + nn_internal::HeadBackwardPeakBytes(n, c, config_.vocab_size, d.storage, 1);
  // The last block's backward: dx, dnext, its temporaries and what it
  // recomputes: with full checkpointing the block (whose output the kept
  // count has), with selective the cheap ops' outputs.
  const int64_t block = kept + 2 * a * n * c + BlockBackwardTempBytes(d) +
                        (ckpt ? saved - a * n * c : recomputed);
  return std::max(head, block);
}

// Between two units' backwards before the first block's: the most of the
// head's PreBackward (what the forward kept, the head's RMSNorm output and
// rstd, dx), its PostBackward (the kept tensors, dx, dh and the loss: its
// saved norm is released) and the last block's PreBackward (the kept
// tensors, dx and dnext). Each block's backward then releases what that
// block saved, so every later moment holds less.
int64_t LlamaModel::BetweenBackwardsActivationBytes(int64_t batch_size, int64_t seq_len,
                                                    int64_t /*source_len*/,
                                                    DeviceKind /*device*/) const {
  const LlamaDims d = Dims(config_, options_.compute_dtype, batch_size, seq_len);
  const int64_t n = d.rows(), c = config_.d_model;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  const bool ckpt = options_.full_checkpointing();
  const int64_t recomputed = BlockDroppedBytes(d, RecomputeOf(options_));
  const int64_t kept = KeptBytes(d, config_.n_layer, ckpt, BlockSavedBytes(d) - recomputed);
  return kept + 2 * a * n * c + 4 * n;
}

// The first block's backward, as GPT's: ids, targets, loss, the embedding
// output, dx and dnext, the block's temporaries and all it saved.
int64_t LlamaModel::BackwardEndActivationBytes(int64_t batch_size, int64_t seq_len,
                                               int64_t /*source_len*/, DeviceKind /*device*/) const {
  const LlamaDims d = Dims(config_, options_.compute_dtype, batch_size, seq_len);
  const int64_t n = d.rows(), c = config_.d_model;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  return 4 * (2 * n + 1) + 3 * a * n * c + BlockBackwardTempBytes(d) + BlockSavedBytes(d);
}

// Llama always runs the linear-memory attention: where it does not mask
// packed documents in its kernel (cuda) a packed call runs its composed
// fallback (DeviceCapabilities::masked_fused_attention).
int64_t LlamaModel::PackedAttentionTemporaryBytes(int64_t batch_size, int64_t seq_len,
                                                  DeviceKind device) const {
  if (KindCapabilities(device).masked_fused_attention) return 0;
  const LlamaDims d = Dims(config_, options_.compute_dtype, batch_size, seq_len);
  return ops::ComposedAttentionTemporaryBytes(d.Attention(), d.storage).peak();
}

}  // namespace sk
