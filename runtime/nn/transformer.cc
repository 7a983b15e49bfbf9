#include "runtime/nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "runtime/ops/classifier.h"
#include "runtime/ops/cost.h"

namespace sk {
namespace nn_internal {

size_t SublayerParamCount(SublayerKind kind) { return kind == SublayerKind::kCrossAttention ? 8 : 6; }

void AppendSublayerSpecs(SublayerKind kind, const std::string& prefix, int64_t d_model,
                         int64_t d_ff, float std, float proj_std, std::vector<ParamSpec>* out) {
  const int64_t c = d_model;
  auto add = [&](const char* name, Shape shape, Initializer init) {
    out->push_back(ParamSpec{prefix + name, std::move(shape), init});
  };
  add("ln.g", Shape{c}, Initializer::Ones());
  add("ln.b", Shape{c}, Initializer::Zeros());
  switch (kind) {
    case SublayerKind::kSelfAttention:
    case SublayerKind::kCausalSelfAttention:
      add("qkv.w", Shape{c, 3 * c}, Initializer::Normal(0.0f, std));
      add("qkv.b", Shape{3 * c}, Initializer::Zeros());
      break;
    case SublayerKind::kCrossAttention:
      add("q.w", Shape{c, c}, Initializer::Normal(0.0f, std));
      add("q.b", Shape{c}, Initializer::Zeros());
      add("kv.w", Shape{c, 2 * c}, Initializer::Normal(0.0f, std));
      add("kv.b", Shape{2 * c}, Initializer::Zeros());
      break;
    case SublayerKind::kMlp:
      add("fc.w", Shape{c, d_ff}, Initializer::Normal(0.0f, std));
      add("fc.b", Shape{d_ff}, Initializer::Zeros());
      add("proj.w", Shape{d_ff, c}, Initializer::Normal(0.0f, proj_std));
      add("proj.b", Shape{c}, Initializer::Zeros());
      return;
  }
  add("proj.w", Shape{c, c}, Initializer::Normal(0.0f, proj_std));
  add("proj.b", Shape{c}, Initializer::Zeros());
}

namespace {

const char* SublayerPrefix(SublayerKind kind) {
  switch (kind) {
    case SublayerKind::kSelfAttention:
    case SublayerKind::kCausalSelfAttention: return "attn.";
    case SublayerKind::kCrossAttention: return "cross.";
    case SublayerKind::kMlp: return "mlp.";
  }
  return "";
}

}  // namespace

using ops::GemmParams;
using ops::MatrixRef;
using ops::OpContext;

namespace {

ops::AttentionShape AttnShape(SublayerKind kind, const BlockDims& d) {
  ops::AttentionShape as;
  as.batch = d.batch;
  as.heads = d.heads;
  as.q_len = d.seq;
  as.head_dim = d.d_model / d.heads;
  as.kv_len = kind == SublayerKind::kCrossAttention ? d.enc_seq : d.seq;
  as.causal = kind == SublayerKind::kCausalSelfAttention;
  if (as.causal) {
    as.key_start = d.key_start;
    as.masked_pairs = d.masked_pairs;
  }
  return as;
}

// Whether a sublayer's attention runs as the linear-memory op (ops.h:
// FlashAttentionForward) on a device of kind `device`, keeping a
// log-sum-exp per row instead of the [B, H, T, T] probabilities:
// self-attention wherever the backend prefers it (ops::PrefersFlashAttention:
// CUDA where cuDNN's SDPA takes the shape, in bf16/f16; the CPU, and the
// simulator as the CPU, from kCpuFlashAttentionMinKeys keys, where its
// FlashAttention-2 is at least as fast as the composed attention). Below
// that, and for cross-attention, the composed op stays. Forward asks it of
// its context's device; the byte counts (SavedBytes and the others) of the
// device they are asked for, so the memory estimate counts what runs.
bool LinearMemoryAttention(DeviceKind device, SublayerKind kind, const BlockDims& d) {
  return kind != SublayerKind::kCrossAttention &&
         ops::PrefersFlashAttention(device, AttnShape(kind, d), d.storage);
}

// What an attention sublayer's forward keeps for its backward besides its
// output (f32): the log-sum-exp per query row in linear memory, else the
// probabilities.
int64_t AttentionStateBytes(SublayerKind kind, const BlockDims& d, DeviceKind device) {
  if (LinearMemoryAttention(device, kind, d)) return 4 * d.batch * d.heads * d.seq;
  const int64_t kv_len = kind == SublayerKind::kCrossAttention ? d.enc_seq : d.seq;
  return 4 * d.batch * d.heads * d.seq * kv_len;
}

// The sublayer's tensors in spec order from src[offset...] (params or grads).
template <typename Src>
SublayerTensors Bind(SublayerKind kind, const Src& src, size_t o) {
  SublayerTensors t;
  t.ln_g = src[o];
  t.ln_b = src[o + 1];
  switch (kind) {
    case SublayerKind::kSelfAttention:
    case SublayerKind::kCausalSelfAttention:
      t.qkv_w = src[o + 2];
      t.qkv_b = src[o + 3];
      t.proj_w = src[o + 4];
      t.proj_b = src[o + 5];
      break;
    case SublayerKind::kCrossAttention:
      t.q_w = src[o + 2];
      t.q_b = src[o + 3];
      t.kv_w = src[o + 4];
      t.kv_b = src[o + 5];
      t.proj_w = src[o + 6];
      t.proj_b = src[o + 7];
      break;
    case SublayerKind::kMlp:
      t.fc_w = src[o + 2];
      t.fc_b = src[o + 3];
      t.proj_w = src[o + 4];
      t.proj_b = src[o + 5];
      break;
  }
  return t;
}

// The attention of an attention sublayer from its projections (s->qkv, or
// s->q and s->kv): allocates and writes s->att and the state its backward
// reads (s->probs, or s->lse where self-attention runs in linear memory).
Status AttentionCore(const OpContext& ctx, SublayerKind kind, const BlockDims& d,
                     SublayerActivations* s) {
  const int64_t n = d.batch * d.seq;
  const int64_t c = d.d_model;
  const DType t = d.storage;
  const ops::AttentionShape as = AttnShape(kind, d);
  SK_ASSIGN_OR_RETURN(s->att, NewAct(ctx, t, n * c));
  if (kind == SublayerKind::kCrossAttention) {
    SK_ASSIGN_OR_RETURN(s->probs, NewF32(ctx, d.batch * d.heads * d.seq * d.enc_seq));
    return ops::AttentionForward(ctx, as, MatrixRef{s->q, 0, c}, MatrixRef{s->kv, 0, 2 * c},
                                 MatrixRef{s->kv, c, 2 * c}, s->probs, MatrixRef{s->att, 0, c});
  }
  const MatrixRef q{s->qkv, 0, 3 * c}, k{s->qkv, c, 3 * c}, v{s->qkv, 2 * c, 3 * c};
  if (ctx.device != nullptr && LinearMemoryAttention(ctx.device->id().kind, kind, d)) {
    SK_ASSIGN_OR_RETURN(s->lse, NewF32(ctx, d.batch * d.heads * d.seq));
    return ops::FlashAttentionForward(ctx, as, q, k, v, MatrixRef{s->att, 0, c}, s->lse);
  }
  SK_ASSIGN_OR_RETURN(s->probs, NewF32(ctx, d.batch * d.heads * d.seq * d.seq));
  return ops::AttentionForward(ctx, as, q, k, v, s->probs, MatrixRef{s->att, 0, c});
}

// Activations (and, in backward, their gradients) are tensors of d.storage,
// the compute dtype: every op reads them exactly, computes in f32 and rounds
// its 16-bit outputs once, as PyTorch's autocast does. LayerNorm statistics
// and attention probabilities stay f32.
Status SublayerForward(const OpContext& ctx, SublayerKind kind, const BlockDims& d,
                       const SublayerTensors& p, const Tensor& x, const Tensor& enc,
                       SublayerActivations* s) {
  const int64_t n = d.batch * d.seq;
  const int64_t c = d.d_model;
  const DType t = d.storage;
  SK_ASSIGN_OR_RETURN(s->ln, NewAct(ctx, t, n * c));
  SK_ASSIGN_OR_RETURN(s->ln_mean, NewF32(ctx, n));
  SK_ASSIGN_OR_RETURN(s->ln_rstd, NewF32(ctx, n));
  SK_ASSIGN_OR_RETURN(s->out, NewAct(ctx, t, n * c));
  SK_RETURN_IF_ERROR(ops::LayerNormForward(ctx, x, p.ln_g, p.ln_b, s->ln, s->ln_mean, s->ln_rstd));
  Tensor proj_in;
  int64_t proj_in_dim = c;
  if (kind == SublayerKind::kMlp) {
    SK_ASSIGN_OR_RETURN(s->fc, NewAct(ctx, t, n * d.d_ff));
    // GELU's output feeds the projection and is then dropped: the backward
    // recomputes it from fc (SublayerBackward), as Megatron-LM's recomputed
    // activation function does, instead of keeping N x F per block.
    SK_ASSIGN_OR_RETURN(Tensor gelu, NewAct(ctx, t, n * d.d_ff));
    // fc and GELU as one op: a fusing backend writes both from one GEMM
    // (ops::GemmBiasGelu; elsewhere GemmBias then GeluForward, as before).
    SK_ASSIGN_OR_RETURN(Tensor fc_w, InDType(ctx, p.fc_w, t));
    GemmParams fp;
    fp.m = n, fp.n = d.d_ff, fp.k = c;
    SK_RETURN_IF_ERROR(ops::GemmBiasGelu(ctx, fp, MatrixRef{s->ln, 0, c}, MatrixRef{fc_w, 0, d.d_ff},
                                         p.fc_b, s->fc, gelu));
    proj_in = gelu;
    proj_in_dim = d.d_ff;
  } else {
    if (kind == SublayerKind::kCrossAttention) {
      const int64_t ne = d.batch * d.enc_seq;
      SK_ASSIGN_OR_RETURN(s->q, NewAct(ctx, t, n * c));
      SK_ASSIGN_OR_RETURN(s->kv, NewAct(ctx, t, ne * 2 * c));
      SK_RETURN_IF_ERROR(Linear(ctx, s->ln, p.q_w, p.q_b, n, c, c, s->q));
      SK_RETURN_IF_ERROR(Linear(ctx, enc, p.kv_w, p.kv_b, ne, c, 2 * c, s->kv));
    } else {
      SK_ASSIGN_OR_RETURN(s->qkv, NewAct(ctx, t, n * 3 * c));
      SK_RETURN_IF_ERROR(Linear(ctx, s->ln, p.qkv_w, p.qkv_b, n, c, 3 * c, s->qkv));
    }
    SK_RETURN_IF_ERROR(AttentionCore(ctx, kind, d, s));
    proj_in = s->att;
  }
  // The projection and the residual add in f32, rounded once into a 16-bit out.
  return LinearResidual(ctx, proj_in, p.proj_w, p.proj_b, x, n, proj_in_dim, c, s->out);
}

// dx = dy (the residual) + the LayerNorm branch's input gradient; dx may be
// dy (every read of dy comes before the LayerNorm's backward adds into dx,
// so the gradient then runs in place, without the residual's copy).
// Gradients of activations are in the compute dtype (d.storage), as
// autograd keeps them under autocast; parameter gradients go to f32 sinks.
Status SublayerBackward(const OpContext& ctx, SublayerKind kind, const BlockDims& d,
                        const SublayerTensors& p, const SublayerTensors& g, const Tensor& x,
                        const Tensor& enc, const SublayerActivations& s, const Tensor& dy,
                        const Tensor& dx, const Tensor& denc) {
  const int64_t n = d.batch * d.seq;
  const int64_t c = d.d_model;
  const DType t = d.storage;
  SK_ASSIGN_OR_RETURN(Tensor dln, NewAct(ctx, t, n * c));
  if (kind == SublayerKind::kMlp) {
    {
      // proj's weight and bias gradients first, from GELU's output
      // recomputed from the kept fc (SublayerForward drops it): GeluForward
      // on the forward's own input, so the forward's values wherever it
      // composes GemmBiasGelu. The temporary is freed before dh exists.
      SK_ASSIGN_OR_RETURN(Tensor gelu, NewAct(ctx, t, n * d.d_ff));
      SK_RETURN_IF_ERROR(ops::GeluForward(ctx, s.fc, gelu));
      SK_RETURN_IF_ERROR(LinearBackward(ctx, gelu, p.proj_w, dy, n, d.d_ff, c, Tensor(), false,
                                        g.proj_w, g.proj_b));
    }
    SK_ASSIGN_OR_RETURN(Tensor dh, NewAct(ctx, t, n * d.d_ff));
    // dh = (dy proj_w^T) * GELU'(fc) as one op (ops::GemmGeluBackward: a
    // fusing backend scales the product in its GEMM; elsewhere Gemm then
    // GeluBackward).
    SK_ASSIGN_OR_RETURN(Tensor proj_w, InDType(ctx, p.proj_w, dy.dtype()));
    GemmParams dp;
    dp.trans_b = true;
    dp.m = n, dp.n = d.d_ff, dp.k = c;
    SK_RETURN_IF_ERROR(ops::GemmGeluBackward(ctx, dp, MatrixRef{dy, 0, c}, MatrixRef{proj_w, 0, c},
                                             s.fc, MatrixRef{dh, 0, d.d_ff}));
    SK_RETURN_IF_ERROR(
        LinearBackward(ctx, s.ln, p.fc_w, dh, n, c, d.d_ff, dln, false, g.fc_w, g.fc_b));
  } else {
    const ops::AttentionShape as = AttnShape(kind, d);
    SK_ASSIGN_OR_RETURN(Tensor datt, NewAct(ctx, t, n * c));
    SK_RETURN_IF_ERROR(
        LinearBackward(ctx, s.att, p.proj_w, dy, n, c, c, datt, false, g.proj_w, g.proj_b));
    if (kind == SublayerKind::kCrossAttention) {
      const int64_t ne = d.batch * d.enc_seq;
      SK_ASSIGN_OR_RETURN(Tensor dq, NewAct(ctx, t, n * c));
      SK_ASSIGN_OR_RETURN(Tensor dkv, NewAct(ctx, t, ne * 2 * c));
      SK_RETURN_IF_ERROR(ops::AttentionBackward(
          ctx, as, MatrixRef{s.q, 0, c}, MatrixRef{s.kv, 0, 2 * c}, MatrixRef{s.kv, c, 2 * c},
          s.probs, MatrixRef{datt, 0, c}, MatrixRef{dq, 0, c}, MatrixRef{dkv, 0, 2 * c},
          MatrixRef{dkv, c, 2 * c}));
      SK_RETURN_IF_ERROR(
          LinearBackward(ctx, enc, p.kv_w, dkv, ne, c, 2 * c, denc, true, g.kv_w, g.kv_b));
      SK_RETURN_IF_ERROR(LinearBackward(ctx, s.ln, p.q_w, dq, n, c, c, dln, false, g.q_w, g.q_b));
    } else {
      SK_ASSIGN_OR_RETURN(Tensor dqkv, NewAct(ctx, t, n * 3 * c));
      const MatrixRef q{s.qkv, 0, 3 * c}, k{s.qkv, c, 3 * c}, v{s.qkv, 2 * c, 3 * c};
      const MatrixRef dq{dqkv, 0, 3 * c}, dk{dqkv, c, 3 * c}, dv{dqkv, 2 * c, 3 * c};
      if (s.lse.defined()) {  // forward ran in linear memory
        SK_RETURN_IF_ERROR(ops::FlashAttentionBackward(ctx, as, q, k, v, MatrixRef{s.att, 0, c},
                                                       MatrixRef{datt, 0, c}, s.lse, dq, dk, dv));
      } else {
        SK_RETURN_IF_ERROR(
            ops::AttentionBackward(ctx, as, q, k, v, s.probs, MatrixRef{datt, 0, c}, dq, dk, dv));
      }
      SK_RETURN_IF_ERROR(
          LinearBackward(ctx, s.ln, p.qkv_w, dqkv, n, c, 3 * c, dln, false, g.qkv_w, g.qkv_b));
    }
  }
  // The residual passes dy through (already there when dx is dy);
  // LayerNorm's backward adds its part (a 16-bit dx is rounded once, after
  // the add).
  if (dx.data() != dy.data()) SK_RETURN_IF_ERROR(ops::Copy(ctx, dy, dx));
  return ops::LayerNormBackward(ctx, x, p.ln_g, dln, s.ln_mean, s.ln_rstd, dx, g.ln_g, g.ln_b);
}

}  // namespace

void TransformerBlock::AppendSpecs(int64_t d_model, int64_t d_ff, float std, float proj_std,
                                   std::vector<ParamSpec>* out) const {
  // Reserved: the specs are moved, not copied, as the vector grows (the
  // planner builds each candidate's model; regrowth was 1% of a plan).
  size_t count = out->size();
  for (SublayerKind k : kinds_) count += SublayerParamCount(k);
  out->reserve(count);
  for (SublayerKind k : kinds_) {
    AppendSublayerSpecs(k, SublayerPrefix(k), d_model, d_ff, std, proj_std, out);
  }
}

Status TransformerBlock::Forward(const OpContext& ctx, const BlockDims& d, const UnitParams& p,
                                 const Tensor& x, const Tensor& enc, BlockSaved* saved) const {
  saved->subs.assign(kinds_.size(), SublayerActivations{});
  size_t offset = 0;
  Tensor in = x;
  for (size_t i = 0; i < kinds_.size(); ++i) {
    SK_RETURN_IF_ERROR(SublayerForward(ctx, kinds_[i], d, Bind(kinds_[i], p, offset), in, enc,
                                       &saved->subs[i]));
    in = saved->subs[i].out;
    offset += SublayerParamCount(kinds_[i]);
  }
  return OkStatus();
}

Status TransformerBlock::Backward(const OpContext& ctx, const BlockDims& d, const UnitParams& p,
                                  const UnitGrads& g, const Tensor& x, const Tensor& enc,
                                  const BlockSaved& saved, const Tensor& dy, const Tensor& dx,
                                  const Tensor& denc) const {
  // The running gradient lives in dx: the last sublayer's backward copies dy
  // there (its residual) and each sublayer before it works in place, so no
  // pass copies it in or out.
  size_t offset = 0;
  for (SublayerKind k : kinds_) offset += SublayerParamCount(k);
  for (size_t i = kinds_.size(); i-- > 0;) {
    offset -= SublayerParamCount(kinds_[i]);
    const Tensor& in = i == 0 ? x : saved.subs[i - 1].out;
    const Tensor& dout = i + 1 == kinds_.size() ? dy : dx;
    SK_RETURN_IF_ERROR(SublayerBackward(ctx, kinds_[i], d, Bind(kinds_[i], p, offset),
                                        Bind(kinds_[i], g, offset), in, enc, saved.subs[i], dout,
                                        dx, denc));
  }
  return OkStatus();
}

void TransformerBlock::ReleaseRecomputable(bool attention, BlockSaved* saved) const {
  for (SublayerActivations& s : saved->subs) {
    s.ln = s.ln_mean = s.ln_rstd = Tensor();
    if (attention) s.att = s.probs = s.lse = Tensor();
  }
}

Status TransformerBlock::RecomputeCheap(const OpContext& ctx, const BlockDims& d,
                                        const UnitParams& p, const Tensor& x, bool attention,
                                        BlockSaved* saved) const {
  const int64_t n = d.batch * d.seq, c = d.d_model;
  size_t offset = 0;
  for (size_t i = 0; i < kinds_.size(); ++i) {
    const SublayerTensors w = Bind(kinds_[i], p, offset);
    SublayerActivations& s = saved->subs[i];
    const Tensor& in = i == 0 ? x : saved->subs[i - 1].out;
    SK_ASSIGN_OR_RETURN(s.ln, NewAct(ctx, d.storage, n * c));
    SK_ASSIGN_OR_RETURN(s.ln_mean, NewF32(ctx, n));
    SK_ASSIGN_OR_RETURN(s.ln_rstd, NewF32(ctx, n));
    SK_RETURN_IF_ERROR(ops::LayerNormForward(ctx, in, w.ln_g, w.ln_b, s.ln, s.ln_mean, s.ln_rstd));
    if (kinds_[i] != SublayerKind::kMlp && attention) {
      SK_RETURN_IF_ERROR(AttentionCore(ctx, kinds_[i], d, &s));
    }
    offset += SublayerParamCount(kinds_[i]);
  }
  return OkStatus();
}

int64_t TransformerBlock::RecomputableBytes(const BlockDims& d, bool attention,
                                            DeviceKind device) const {
  const int64_t n = d.batch * d.seq, c = d.d_model;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  int64_t b = 0;
  for (SublayerKind k : kinds_) {
    b += a * n * c + 4 * 2 * n;  // ln; mean, rstd (f32)
    if (k != SublayerKind::kMlp && attention) {
      // att; its state (f32), as SavedBytes counts it
      b += a * n * c + AttentionStateBytes(k, d, device);
    }
  }
  return b;
}

double TransformerBlock::RecomputeCheapFlops(const BlockDims& d, bool attention) const {
  const double n = static_cast<double>(d.batch) * d.seq;
  const double c = static_cast<double>(d.d_model);
  double f = 0.0;
  for (SublayerKind k : kinds_) {
    f += ops::kLayerNormForwardFlops * n * c;
    if (k != SublayerKind::kMlp && attention) {
      // QK^T and PV (as ForwardMatmulFlops counts them) and the softmax.
      const double kv_len = static_cast<double>(k == SublayerKind::kCrossAttention ? d.enc_seq : d.seq);
      f += 2.0 * 2.0 * n * kv_len * c +
           ops::kSoftmaxFlops * static_cast<double>(d.heads) * n * kv_len;
    }
  }
  return f;
}

int64_t TransformerBlock::SavedBytes(const BlockDims& d, DeviceKind device) const {
  const int64_t n = d.batch * d.seq, ne = d.batch * d.enc_seq, c = d.d_model;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  int64_t b = 0;
  for (SublayerKind k : kinds_) {
    b += a * 2 * n * c + 4 * 2 * n;  // ln, out; mean, rstd (f32)
    switch (k) {
      case SublayerKind::kSelfAttention:
      case SublayerKind::kCausalSelfAttention:
        // qkv, att; probs or lse (f32)
        b += a * (3 * n * c + n * c) + AttentionStateBytes(k, d, device);
        break;
      case SublayerKind::kCrossAttention:
        // q, kv, att; probs (f32)
        b += a * (n * c + 2 * ne * c + n * c) + AttentionStateBytes(k, d, device);
        break;
      case SublayerKind::kMlp:
        b += a * n * d.d_ff;  // pre-GELU (the post-GELU is recomputed)
        break;
    }
  }
  return b;
}

int64_t TransformerBlock::PackedAttentionTemporaryBytes(const BlockDims& d, DeviceKind device) const {
  int64_t most = 0;
  for (SublayerKind k : kinds_) {
    if (KindCapabilities(device).masked_fused_attention ||
        k != SublayerKind::kCausalSelfAttention ||
        !LinearMemoryAttention(device, k, d)) {
      continue;
    }
    most = std::max(most, ops::ComposedAttentionTemporaryBytes(AttnShape(k, d), d.storage).peak());
  }
  return most;
}

int64_t TransformerBlock::BackwardTempBytes(const BlockDims& d, DeviceKind device) const {
  const int64_t n = d.batch * d.seq, ne = d.batch * d.enc_seq, c = d.d_model;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  int64_t most = 0;
  for (SublayerKind k : kinds_) {
    int64_t f = a * n * c;  // dln
    switch (k) {
      case SublayerKind::kSelfAttention:
      case SublayerKind::kCausalSelfAttention:
        f += a * (n * c + 3 * n * c);  // datt, dqkv
        // The linear-memory backward's workspace (ops.h), or the composed
        // one's scratch (f32, per head).
        f += LinearMemoryAttention(device, k, d)
                 ? 4 * ops::FlashAttentionBackwardWorkspaceElements(AttnShape(k, d))
                 : 4 * d.heads * d.seq * d.seq;
        break;
      case SublayerKind::kCrossAttention:
        f += a * (n * c + n * c + 2 * ne * c) + 4 * d.heads * d.seq * d.enc_seq;  // datt, dq, dkv; scratch
        break;
      case SublayerKind::kMlp:
        f += a * n * d.d_ff;  // the recomputed GELU output, then (freed) dh
        break;
    }
    most = std::max(most, f);
  }
  return most;  // (the running gradient is dx)
}

double TransformerBlock::ForwardMatmulFlops(int64_t batch, int64_t seq, int64_t enc_seq,
                                            int64_t d_model, int64_t d_ff) const {
  const double n = static_cast<double>(batch) * seq;
  const double ne = static_cast<double>(batch) * enc_seq;
  const double c = static_cast<double>(d_model);
  double f = 0.0;
  for (SublayerKind k : kinds_) {
    switch (k) {
      case SublayerKind::kSelfAttention:
      case SublayerKind::kCausalSelfAttention:
        // qkv and output projections, then QK^T and PV over the full sequence
        // (causal masking is not discounted, as the usual 12 L T d convention).
        f += 2.0 * n * c * 4.0 * c + 2.0 * 2.0 * n * static_cast<double>(seq) * c;
        break;
      case SublayerKind::kCrossAttention:
        f += 2.0 * n * c * 2.0 * c + 2.0 * ne * c * 2.0 * c +
             2.0 * 2.0 * n * static_cast<double>(enc_seq) * c;
        break;
      case SublayerKind::kMlp:
        f += 2.0 * n * c * static_cast<double>(d_ff) * 2.0;
        break;
    }
  }
  return f;
}

void AppendHeadSpecs(int64_t d_model, int64_t vocab, float std, const std::string& tied_owner,
                     UnitSpec* head) {
  head->params.push_back(ParamSpec{"ln.g", Shape{d_model}, Initializer::Ones()});
  head->params.push_back(ParamSpec{"ln.b", Shape{d_model}, Initializer::Zeros()});
  if (tied_owner.empty()) {
    head->params.push_back(ParamSpec{"lm_head.w", Shape{d_model, vocab}, Initializer::Normal(0.0f, std)});
  } else {
    head->tied.push_back(TiedParamSpec{"lm_head.w", tied_owner, Shape{vocab, d_model}});
  }
}

StatusOr<float> HeadForward(const OpContext& ctx, const UnitParams& p, const Tensor& x,
                            const Tensor& targets, int64_t rows, int64_t d_model, int64_t vocab,
                            DType storage, bool want_grad, HeadSaved* saved, bool tied) {
  const HeadTensors h{p[0], p[1], p[2]};
  SK_ASSIGN_OR_RETURN(saved->ln, NewAct(ctx, storage, rows * d_model));
  SK_ASSIGN_OR_RETURN(saved->ln_mean, NewF32(ctx, rows));
  SK_ASSIGN_OR_RETURN(saved->ln_rstd, NewF32(ctx, rows));
  SK_RETURN_IF_ERROR(
      ops::LayerNormForward(ctx, x, h.ln_g, h.ln_b, saved->ln, saved->ln_mean, saved->ln_rstd));
  if (want_grad) return 0.0f;
  SK_ASSIGN_OR_RETURN(Tensor loss, ctx.alloc->Empty(DType::kF32, Shape{1}));
  ops::ClassifierShape cs{rows, d_model, vocab, tied};
  SK_RETURN_IF_ERROR(ops::Classifier(ctx, cs, saved->ln, h.lm_head_w, targets, loss));
  SK_ASSIGN_OR_RETURN(double value, ops::ReadScalar(ctx, loss));
  return static_cast<float>(value);
}

StatusOr<float> HeadBackward(const OpContext& ctx, const UnitParams& p, const UnitGrads& g,
                             const Tensor& x, const HeadSaved& saved, const Tensor& targets,
                             int64_t rows, int64_t d_model, int64_t vocab, DType storage,
                             Tensor* dx, bool tied, float grad_scale) {
  const HeadTensors h{p[0], p[1], p[2]};
  const HeadTensors dh{g[0], g[1], g[2]};
  SK_ASSIGN_OR_RETURN(Tensor loss, ctx.alloc->Empty(DType::kF32, Shape{1}));
  SK_ASSIGN_OR_RETURN(Tensor dln, NewAct(ctx, storage, rows * d_model));
  ops::ClassifierShape cs{rows, d_model, vocab, tied};
  SK_RETURN_IF_ERROR(ops::Classifier(ctx, cs, saved.ln, h.lm_head_w, targets, loss, dln,
                                     dh.lm_head_w, grad_scale));
  // dx only now: the classifier's workspace is back by then.
  SK_ASSIGN_OR_RETURN(*dx, NewAct(ctx, storage, rows * d_model));
  SK_RETURN_IF_ERROR(ops::Fill(ctx, *dx, 0.0f));
  SK_RETURN_IF_ERROR(ops::LayerNormBackward(ctx, x, h.ln_g, dln, saved.ln_mean, saved.ln_rstd, *dx,
                                            dh.ln_g, dh.ln_b));
  SK_ASSIGN_OR_RETURN(double value, ops::ReadScalar(ctx, loss));
  return static_cast<float>(value);
}

}  // namespace nn_internal
}  // namespace sk
