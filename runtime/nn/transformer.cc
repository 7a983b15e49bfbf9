#include "runtime/nn/transformer.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/nn/kernels.h"

namespace sk {
namespace nn_internal {

StatusOr<Tensor> NewF32(Allocator& alloc, int64_t numel) {
  return alloc.Empty(DType::kF32, Shape{numel});
}

StatusOr<Tensor> ZerosF32(Allocator& alloc, int64_t numel) {
  SK_ASSIGN_OR_RETURN(Tensor t, NewF32(alloc, numel));
  if (numel > 0) std::memset(t.data(), 0, t.nbytes());
  return t;
}

Status ValidateUnitTensors(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                           const char* what) {
  if (tensors.size() != unit.params.size()) {
    return InvalidArgumentError(std::string(what) + " of unit '" + unit.name + "' has " +
                                std::to_string(tensors.size()) + " tensors, the unit has " +
                                std::to_string(unit.params.size()) + " parameters");
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string where =
        std::string(what) + " tensor for '" + FullParamName(unit, unit.params[i]) + "'";
    if (!t.defined()) return InvalidArgumentError(where + " is undefined");
    if (!t.device().is_cpu()) return InvalidArgumentError(where + " is not in host memory");
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
      return InvalidArgumentError(where + " has dtype " + std::string(DTypeName(t.dtype())) +
                                  ", expected f32, bf16 or f16");
    }
    if (t.shape() != unit.params[i].shape) {
      return InvalidArgumentError(where + " has shape " + t.shape().ToString() + ", expected " +
                                  unit.params[i].shape.ToString());
    }
  }
  return OkStatus();
}

StatusOr<UnitParams> UnitParams::Make(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                                      Allocator& alloc) {
  SK_RETURN_IF_ERROR(ValidateUnitTensors(unit, tensors, "parameter"));
  UnitParams p;
  for (const Tensor& t : tensors) {
    if (t.dtype() == DType::kF32) {
      p.ptrs_.push_back(t.data_as<float>());
      continue;
    }
    SK_ASSIGN_OR_RETURN(Tensor wide, NewF32(alloc, t.numel()));
    WidenToF32(t.data(), t.dtype(), t.numel(), F(wide));
    p.ptrs_.push_back(F(wide));
    p.keep_.push_back(std::move(wide));
  }
  return p;
}

StatusOr<UnitGrads> UnitGrads::Make(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                                    Allocator& alloc) {
  SK_RETURN_IF_ERROR(ValidateUnitTensors(unit, tensors, "gradient"));
  UnitGrads g;
  for (const Tensor& t : tensors) {
    g.targets_.push_back(t);
    if (t.dtype() == DType::kF32) {
      g.scratch_.emplace_back();
      g.ptrs_.push_back(t.data_as<float>());
      continue;
    }
    SK_ASSIGN_OR_RETURN(Tensor s, ZerosF32(alloc, t.numel()));
    g.ptrs_.push_back(F(s));
    g.scratch_.push_back(std::move(s));
  }
  return g;
}

void UnitGrads::Flush() {
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (!scratch_[i].defined()) continue;
    AccumulateFromF32(F(scratch_[i]), scratch_[i].numel(), targets_[i].data(),
                      targets_[i].dtype());
    std::memset(scratch_[i].data(), 0, scratch_[i].nbytes());
  }
}

Status UnitScope::Named(const Status& s, int u, const char* phase) const {
  return s.WithContext(std::string(phase) + " of unit '" + units_[u].name + "'");
}

StatusOr<UnitParams> UnitScope::PreForward(int u) {
  auto pt = hooks_.PreForward(u);
  if (!pt.ok()) return Named(pt.status(), u, "PreForward");
  return UnitParams::Make(units_[u], *pt, alloc_);
}

Status UnitScope::PostForward(int u) { return Named(hooks_.PostForward(u), u, "PostForward"); }

StatusOr<UnitScope::Backward> UnitScope::PreBackward(int u) {
  auto bufs = hooks_.PreBackward(u);
  if (!bufs.ok()) return Named(bufs.status(), u, "PreBackward");
  SK_ASSIGN_OR_RETURN(UnitParams p, UnitParams::Make(units_[u], bufs->params, alloc_));
  SK_ASSIGN_OR_RETURN(UnitGrads g, UnitGrads::Make(units_[u], bufs->grads, alloc_));
  return Backward{std::move(p), std::move(g)};
}

StatusOr<UnitScope::Backward> UnitScope::PreBackwardGradientsOnly(int u) {
  auto bufs = hooks_.PreBackward(u);
  if (!bufs.ok()) return Named(bufs.status(), u, "PreBackward");
  SK_RETURN_IF_ERROR(ValidateUnitTensors(units_[u], bufs->params, "parameter"));
  SK_ASSIGN_OR_RETURN(UnitGrads g, UnitGrads::Make(units_[u], bufs->grads, alloc_));
  return Backward{UnitParams(), std::move(g)};
}

Status UnitScope::PostBackward(int u, Backward* b) {
  b->g.Flush();
  return Named(hooks_.PostBackward(u), u, "PostBackward");
}

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

void MaybeRound(const BlockDims& d, const Tensor& t) {
  RoundToDTypeInPlace(F(t), t.numel(), d.storage);
}

Status SublayerForward(SublayerKind kind, const BlockDims& d, const float* const* p,
                       const float* x, const float* enc, Allocator& alloc, SublayerSaved* s) {
  const int64_t n = d.batch * d.seq;
  const int64_t c = d.d_model;
  SK_ASSIGN_OR_RETURN(s->ln, NewF32(alloc, n * c));
  SK_ASSIGN_OR_RETURN(s->mean, NewF32(alloc, n));
  SK_ASSIGN_OR_RETURN(s->rstd, NewF32(alloc, n));
  SK_ASSIGN_OR_RETURN(s->out, NewF32(alloc, n * c));
  LayerNormForward(x, p[0], p[1], n, c, F(s->ln), F(s->mean), F(s->rstd));
  MaybeRound(d, s->ln);
  const float* proj_w = nullptr;
  const float* proj_b = nullptr;
  const float* proj_in = nullptr;
  int64_t proj_in_dim = c;
  if (kind == SublayerKind::kMlp) {
    SK_ASSIGN_OR_RETURN(s->a, NewF32(alloc, n * d.d_ff));
    SK_ASSIGN_OR_RETURN(s->b, NewF32(alloc, n * d.d_ff));
    LinearForward(F(s->ln), p[2], p[3], n, c, d.d_ff, F(s->a));
    MaybeRound(d, s->a);
    GeluForward(F(s->a), n * d.d_ff, F(s->b));
    MaybeRound(d, s->b);
    proj_w = p[4];
    proj_b = p[5];
    proj_in = F(s->b);
    proj_in_dim = d.d_ff;
  } else {
    AttentionShape as;
    as.batch = d.batch;
    as.heads = d.heads;
    as.q_len = d.seq;
    as.head_dim = c / d.heads;
    SK_ASSIGN_OR_RETURN(s->att, NewF32(alloc, n * c));
    if (kind == SublayerKind::kCrossAttention) {
      const int64_t ne = d.batch * d.enc_seq;
      as.kv_len = d.enc_seq;
      SK_ASSIGN_OR_RETURN(s->a, NewF32(alloc, n * c));
      SK_ASSIGN_OR_RETURN(s->b, NewF32(alloc, ne * 2 * c));
      SK_ASSIGN_OR_RETURN(s->probs, NewF32(alloc, d.batch * d.heads * d.seq * d.enc_seq));
      LinearForward(F(s->ln), p[2], p[3], n, c, c, F(s->a));
      LinearForward(enc, p[4], p[5], ne, c, 2 * c, F(s->b));
      MaybeRound(d, s->a);
      MaybeRound(d, s->b);
      AttentionForward(as, F(s->a), c, F(s->b), 2 * c, F(s->b) + c, 2 * c, F(s->probs), F(s->att),
                       c);
      proj_w = p[6];
      proj_b = p[7];
    } else {
      as.kv_len = d.seq;
      as.causal = kind == SublayerKind::kCausalSelfAttention;
      SK_ASSIGN_OR_RETURN(s->a, NewF32(alloc, n * 3 * c));
      SK_ASSIGN_OR_RETURN(s->probs, NewF32(alloc, d.batch * d.heads * d.seq * d.seq));
      LinearForward(F(s->ln), p[2], p[3], n, c, 3 * c, F(s->a));
      MaybeRound(d, s->a);
      const float* qkv = F(s->a);
      AttentionForward(as, qkv, 3 * c, qkv + c, 3 * c, qkv + 2 * c, 3 * c, F(s->probs), F(s->att),
                       c);
      proj_w = p[4];
      proj_b = p[5];
    }
    MaybeRound(d, s->att);
    proj_in = F(s->att);
  }
  LinearForward(proj_in, proj_w, proj_b, n, proj_in_dim, c, F(s->out));
  AddInPlace(F(s->out), x, n * c);
  MaybeRound(d, s->out);
  return OkStatus();
}

Status SublayerBackward(SublayerKind kind, const BlockDims& d, const float* const* p,
                        float* const* g, const float* x, const float* enc, const SublayerSaved& s,
                        const float* dy, float* dx, float* denc, Allocator& alloc) {
  const int64_t n = d.batch * d.seq;
  const int64_t c = d.d_model;
  SK_ASSIGN_OR_RETURN(Tensor dln, NewF32(alloc, n * c));
  if (kind == SublayerKind::kMlp) {
    SK_ASSIGN_OR_RETURN(Tensor dh, NewF32(alloc, n * d.d_ff));
    LinearBackward(F(s.b), p[4], dy, n, d.d_ff, c, F(dh), false, g[4], g[5]);
    GeluBackward(F(s.a), F(dh), n * d.d_ff, F(dh));
    LinearBackward(F(s.ln), p[2], F(dh), n, c, d.d_ff, F(dln), false, g[2], g[3]);
  } else {
    AttentionShape as;
    as.batch = d.batch;
    as.heads = d.heads;
    as.q_len = d.seq;
    as.head_dim = c / d.heads;
    SK_ASSIGN_OR_RETURN(Tensor datt, NewF32(alloc, n * c));
    if (kind == SublayerKind::kCrossAttention) {
      const int64_t ne = d.batch * d.enc_seq;
      as.kv_len = d.enc_seq;
      LinearBackward(F(s.att), p[6], dy, n, c, c, F(datt), false, g[6], g[7]);
      SK_ASSIGN_OR_RETURN(Tensor dq, NewF32(alloc, n * c));
      SK_ASSIGN_OR_RETURN(Tensor dkv, NewF32(alloc, ne * 2 * c));
      SK_ASSIGN_OR_RETURN(Tensor scratch, NewF32(alloc, d.seq * d.enc_seq));
      AttentionBackward(as, F(s.a), c, F(s.b), 2 * c, F(s.b) + c, 2 * c, F(s.probs), F(datt), c,
                        F(dq), c, F(dkv), 2 * c, F(dkv) + c, 2 * c, F(scratch));
      LinearBackward(enc, p[4], F(dkv), ne, c, 2 * c, denc, true, g[4], g[5]);
      LinearBackward(F(s.ln), p[2], F(dq), n, c, c, F(dln), false, g[2], g[3]);
    } else {
      as.kv_len = d.seq;
      as.causal = kind == SublayerKind::kCausalSelfAttention;
      LinearBackward(F(s.att), p[4], dy, n, c, c, F(datt), false, g[4], g[5]);
      SK_ASSIGN_OR_RETURN(Tensor dqkv, NewF32(alloc, n * 3 * c));
      SK_ASSIGN_OR_RETURN(Tensor scratch, NewF32(alloc, d.seq * d.seq));
      const float* qkv = F(s.a);
      float* dq = F(dqkv);
      AttentionBackward(as, qkv, 3 * c, qkv + c, 3 * c, qkv + 2 * c, 3 * c, F(s.probs), F(datt), c,
                        dq, 3 * c, dq + c, 3 * c, dq + 2 * c, 3 * c, F(scratch));
      LinearBackward(F(s.ln), p[2], F(dqkv), n, c, 3 * c, F(dln), false, g[2], g[3]);
    }
  }
  // The residual passes dy through; LayerNorm's backward adds its part.
  if (dx != dy) std::memcpy(dx, dy, sizeof(float) * n * c);
  LayerNormBackward(x, p[0], F(dln), F(s.mean), F(s.rstd), n, c, dx, g[0], g[1]);
  RoundToDTypeInPlace(dx, n * c, d.storage);
  return OkStatus();
}

}  // namespace

void TransformerBlock::AppendSpecs(int64_t d_model, int64_t d_ff, float std, float proj_std,
                                   std::vector<ParamSpec>* out) const {
  for (SublayerKind k : kinds_) {
    AppendSublayerSpecs(k, SublayerPrefix(k), d_model, d_ff, std, proj_std, out);
  }
}

Status TransformerBlock::Forward(const BlockDims& d, const UnitParams& p, const float* x,
                                 const float* enc, Allocator& alloc, BlockSaved* saved) const {
  saved->subs.assign(kinds_.size(), SublayerSaved{});
  size_t offset = 0;
  std::vector<const float*> ptrs;
  const float* in = x;
  for (size_t i = 0; i < kinds_.size(); ++i) {
    ptrs.clear();
    for (size_t j = 0; j < SublayerParamCount(kinds_[i]); ++j) ptrs.push_back(p[offset + j]);
    SK_RETURN_IF_ERROR(
        SublayerForward(kinds_[i], d, ptrs.data(), in, enc, alloc, &saved->subs[i]));
    in = F(saved->subs[i].out);
    offset += SublayerParamCount(kinds_[i]);
  }
  return OkStatus();
}

Status TransformerBlock::Backward(const BlockDims& d, const UnitParams& p, const UnitGrads& g,
                                  const float* x, const float* enc, const BlockSaved& saved,
                                  const float* dy, float* dx, float* denc,
                                  Allocator& alloc) const {
  const int64_t nc = d.batch * d.seq * d.d_model;
  SK_ASSIGN_OR_RETURN(Tensor dcur, NewF32(alloc, nc));
  std::memcpy(F(dcur), dy, sizeof(float) * nc);
  size_t offset = 0;
  for (SublayerKind k : kinds_) offset += SublayerParamCount(k);
  std::vector<const float*> ptrs;
  std::vector<float*> gptrs;
  for (size_t i = kinds_.size(); i-- > 0;) {
    offset -= SublayerParamCount(kinds_[i]);
    ptrs.clear();
    gptrs.clear();
    for (size_t j = 0; j < SublayerParamCount(kinds_[i]); ++j) {
      ptrs.push_back(p[offset + j]);
      gptrs.push_back(g[offset + j]);
    }
    const float* in = i == 0 ? x : F(saved.subs[i - 1].out);
    SK_RETURN_IF_ERROR(SublayerBackward(kinds_[i], d, ptrs.data(), gptrs.data(), in, enc,
                                        saved.subs[i], F(dcur), F(dcur), denc, alloc));
  }
  std::memcpy(dx, F(dcur), sizeof(float) * nc);
  return OkStatus();
}

int64_t TransformerBlock::SavedFloats(const BlockDims& d) const {
  const int64_t n = d.batch * d.seq, ne = d.batch * d.enc_seq, c = d.d_model;
  int64_t f = 0;
  for (SublayerKind k : kinds_) {
    f += 2 * n * c + 2 * n;  // ln, out; mean, rstd
    switch (k) {
      case SublayerKind::kSelfAttention:
      case SublayerKind::kCausalSelfAttention:
        f += 3 * n * c + d.batch * d.heads * d.seq * d.seq + n * c;  // qkv, probs, att
        break;
      case SublayerKind::kCrossAttention:
        f += n * c + 2 * ne * c + d.batch * d.heads * d.seq * d.enc_seq + n * c;  // q, kv, probs, att
        break;
      case SublayerKind::kMlp:
        f += 2 * n * d.d_ff;  // pre- and post-GELU
        break;
    }
  }
  return f;
}

int64_t TransformerBlock::BackwardTempFloats(const BlockDims& d) const {
  const int64_t n = d.batch * d.seq, ne = d.batch * d.enc_seq, c = d.d_model;
  int64_t most = 0;
  for (SublayerKind k : kinds_) {
    int64_t f = n * c;  // dln
    switch (k) {
      case SublayerKind::kSelfAttention:
      case SublayerKind::kCausalSelfAttention:
        f += n * c + 3 * n * c + d.seq * d.seq;  // datt, dqkv, scratch
        break;
      case SublayerKind::kCrossAttention:
        f += n * c + n * c + 2 * ne * c + d.seq * d.enc_seq;  // datt, dq, dkv, scratch
        break;
      case SublayerKind::kMlp:
        f += n * d.d_ff;  // dh
        break;
    }
    most = std::max(most, f);
  }
  return n * c + most;  // + the running gradient dcur
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

void AppendHeadSpecs(int64_t d_model, int64_t vocab, float std, std::vector<ParamSpec>* out) {
  out->push_back(ParamSpec{"ln.g", Shape{d_model}, Initializer::Ones()});
  out->push_back(ParamSpec{"ln.b", Shape{d_model}, Initializer::Zeros()});
  out->push_back(ParamSpec{"lm_head.w", Shape{d_model, vocab}, Initializer::Normal(0.0f, std)});
}

StatusOr<float> HeadForward(const UnitParams& p, const float* x, const int32_t* targets,
                            int64_t rows, int64_t d_model, int64_t vocab, DType storage,
                            bool want_grad, Allocator& alloc, HeadSaved* saved) {
  SK_ASSIGN_OR_RETURN(saved->ln, NewF32(alloc, rows * d_model));
  SK_ASSIGN_OR_RETURN(saved->mean, NewF32(alloc, rows));
  SK_ASSIGN_OR_RETURN(saved->rstd, NewF32(alloc, rows));
  LayerNormForward(x, p[0], p[1], rows, d_model, F(saved->ln), F(saved->mean), F(saved->rstd));
  RoundToDTypeInPlace(F(saved->ln), rows * d_model, storage);
  SK_ASSIGN_OR_RETURN(Tensor logits, NewF32(alloc, rows * vocab));
  LinearForward(F(saved->ln), p[2], nullptr, rows, d_model, vocab, F(logits));
  RoundToDTypeInPlace(F(logits), rows * vocab, storage);
  int64_t count = 0;
  float loss = CrossEntropyForward(F(logits), targets, rows, vocab, &count);
  if (want_grad) {
    // The gradient overwrites the logits: they are not needed afterwards.
    float scale = count == 0 ? 0.0f : 1.0f / static_cast<float>(count);
    CrossEntropyBackward(F(logits), targets, rows, vocab, scale, F(logits));
    saved->dlogits = std::move(logits);
  }
  return loss;
}

Status HeadBackward(const UnitParams& p, const UnitGrads& g, const float* x,
                    const HeadSaved& saved, int64_t rows, int64_t d_model, int64_t vocab,
                    DType storage, float* dx, Allocator& alloc) {
  SK_ASSIGN_OR_RETURN(Tensor dln, NewF32(alloc, rows * d_model));
  LinearBackward(F(saved.ln), p[2], F(saved.dlogits), rows, d_model, vocab, F(dln), false, g[2],
                 nullptr);
  std::memset(dx, 0, sizeof(float) * rows * d_model);
  LayerNormBackward(x, p[0], F(dln), F(saved.mean), F(saved.rstd), rows, d_model, dx, g[0], g[1]);
  RoundToDTypeInPlace(dx, rows * d_model, storage);
  return OkStatus();
}

Status CheckProduct(int64_t rows, int64_t cols, const char* what) {
  if (rows > std::numeric_limits<int64_t>::max() / cols) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " overflows int64");
  }
  return OkStatus();
}

Status Positive(int64_t v, const std::string& model, const char* field) {
  if (v <= 0) {
    return InvalidArgumentError("config '" + model + "': " + field + " must be positive, got " +
                                std::to_string(v));
  }
  return OkStatus();
}

Status ValidateWidthAndVocab(const std::string& model, int64_t d_model, int64_t n_head,
                             int64_t vocab_size) {
  if (d_model % n_head != 0) {
    return InvalidArgumentError("config '" + model + "': d_model " + std::to_string(d_model) +
                                " is not a multiple of n_head " + std::to_string(n_head));
  }
  if (vocab_size > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError("config '" + model + "': vocab_size does not fit int32 token ids");
  }
  return OkStatus();
}

Status ValidateComputeDType(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return InvalidArgumentError("compute_dtype must be f32, bf16 or f16, got " +
                                std::string(DTypeName(dtype)));
  }
  return OkStatus();
}

Status ValidateTokens(const std::vector<int32_t>& ids, int64_t expected_count, int64_t vocab,
                      bool allow_ignore, const char* field) {
  if (static_cast<int64_t>(ids.size()) != expected_count) {
    return InvalidArgumentError(std::string("batch.") + field + " has " +
                                std::to_string(ids.size()) + " ids, expected " +
                                std::to_string(expected_count));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (allow_ignore && ids[i] == kIgnoreTarget) continue;
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgumentError(std::string("batch.") + field + "[" + std::to_string(i) +
                                  "] = " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
    }
  }
  return OkStatus();
}

}  // namespace nn_internal
}  // namespace sk
