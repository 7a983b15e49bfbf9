// The CUDA backend's attention (backend_common.h): the composed attention on
// cuBLAS's batched GEMMs and the softmax kernels, and attention in linear
// memory on cuDNN's fused SDPA, else composed with its probabilities in a
// temporary of the call.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include <glog/logging.h>

#include "runtime/ops/cuda/backend_common.h"
#include "runtime/ops/cuda/cudnn_attention.h"
#include "runtime/ops/cuda/sdpa_plan.h"

namespace sk::ops {

namespace {

// Sequences per batched GEMM in attention backward: as many as keep the
// group's f32 score gradients within 2^26 elements (256 MiB; with 16-bit
// operands, as much again for their rounded dS and P), at least one.
// ops::ComposedAttentionBackwardGroup (ops.h, which this library sits
// below) is the same rule for the memory counts: change both.
int64_t BackwardGroup(const AttentionShape& s) {
  const int64_t per_seq = s.heads * s.q_len * s.kv_len;
  return std::clamp<int64_t>((int64_t{1} << 26) / per_seq, 1, s.batch);
}

// A view as sdpa_plan.h's checks see it: row stride, start alignment.
cuda::SdpaOperand Operand(const MatrixRef& m) {
  return cuda::SdpaOperand{
      m.ld, static_cast<int64_t>(reinterpret_cast<uintptr_t>(Ptr(m.t, m.offset)) %
                                 cuda::kSdpaAlignmentBytes)};
}

// Logs, once per op and reason, that a linear-memory attention call runs
// composed (its probabilities in a temporary) and why.
void LogComposedFallback(const char* op, const AttentionShape& s, DType t, const Status& why) {
  static std::mutex mu;
  static std::set<std::string>* seen = new std::set<std::string>;
  const std::string key = std::string(op) + ": " + why.ToString();
  std::lock_guard<std::mutex> lock(mu);
  if (!seen->insert(key).second) return;
  LOG(WARNING) << op << " on CUDA runs the composed attention (probabilities in a temporary of "
               << s.batch * s.heads * s.q_len * s.kv_len * 4 << " bytes), not cuDNN's fused SDPA: "
               << why.ToString() << " [first call: batch " << s.batch << ", heads " << s.heads
               << ", q_len " << s.q_len << ", kv_len " << s.kv_len << ", head_dim " << s.head_dim
               << ", " << DTypeName(t) << (s.causal ? ", causal" : "") << "; logged once per reason]";
}

}  // namespace

Status CudaBackend::AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                     const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                                     const MatrixRef& out) {
  SK_RETURN_IF_ERROR(Enter(ctx, "attention_fwd"));
  return ComposedForward(ctx, s, q, k, v, probs, out, nullptr);
}

// In the dtype t of every operand but probs (as forward), for groups of
// BackwardGroup(s) sequences, each step one batched GEMM over the group's
// (sequence, head) pairs: dP = dO V^T (f32); dS = scale P (dP -
// rowdot(P, dP)) from the f32 P and dP (masked entries have P = 0);
// dV = P^T dO, dQ = dS K, dK = dS^T Q. f32 t: dS overwrites dP and the
// GEMMs read the f32 P and dS. 16-bit t: the softmax backward stores dS
// and P rounded to t in two temporaries, and the three GEMMs run on them
// on tensor cores (f32 accumulation, outputs rounded once). dP lives in
// the op's scratch for a group of one sequence, else in a temporary of the
// group's size; temporaries are reused by the next group in stream order.
Status CudaBackend::AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                      const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                                      const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                                      const MatrixRef& dv, const Tensor& scratch) {
  SK_RETURN_IF_ERROR(Enter(ctx, "attention_bwd"));
  return ComposedBackward(ctx, s, q, k, v, probs, dout, dq, dk, dv, scratch);
}

// cuDNN's fused SDPA takes the shape and dtype and libcudnn.so.9 loads
// (sdpa_plan.h, cudnn_attention.h); a graph that then fails to build or
// run still falls back, logged. Decided without the packed documents
// (key_start): a packed batch keeps the linear-memory op its unpacked
// shape gets, whose calls then run composed with the probabilities in a
// temporary of that call only (FlashAttentionForward), rather than
// keeping every layer's probabilities from forward to backward; the
// memory estimate, which sees no batch, counts the same choice.
bool CudaBackend::PrefersFlashAttention(const AttentionShape& s, DType t) const {
  AttentionShape unpacked = s;
  unpacked.key_start = Tensor();
  unpacked.masked_pairs = 0;
  const int64_t ld = s.heads * s.head_dim;
  return cuda::SdpaSupports(unpacked, t, {{ld, 0}}).ok() && cuda::CudnnAvailable().ok();
}

// Linear-memory attention: cuDNN's fused SDPA (cudnn_attention.h) where
// SdpaSupports accepts the call and cuDNN builds and runs its graph;
// otherwise the composed attention above with the probabilities in a
// temporary of the call (memory quadratic in the sequence for that call
// only), logged once per reason. The log-sum-exp comes from the scores
// before the softmax (RowLogSumExp). Packed documents (key_start) always
// take the composed path: its softmax masks each query to its document.
Status CudaBackend::FlashAttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                          const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                          const Tensor& lse) {
  const char* op = "flash_attention_fwd";
  SK_RETURN_IF_ERROR(Enter(ctx, op));
  if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return OkStatus();
  const DType t = q.t.dtype();
  Status fused = cuda::SdpaSupports(s, t, {Operand(q), Operand(k), Operand(v), Operand(out)});
  if (fused.ok()) {
    fused = cuda::CudnnSdpaForward(ctx, cuda::MakeSdpaForwardPlan(s, t, {q.ld, k.ld, v.ld, out.ld}),
                                   Ptr(q.t, q.offset), Ptr(k.t, k.offset), Ptr(v.t, v.offset),
                                   Ptr(out.t, out.offset), F(lse));
    if (fused.ok()) return OkStatus();
  }
  LogComposedFallback(op, s, t, fused);
  SK_ASSIGN_OR_RETURN(Tensor probs,
                      ctx.alloc->Empty(DType::kF32, Shape{s.batch * s.heads * s.q_len * s.kv_len}));
  if (s.Group() == 1) return ComposedForward(ctx, s, q, k, v, probs, out, F(lse));
  // Grouped-query attention composed: k and v repeated per query head.
  SK_ASSIGN_OR_RETURN(MatrixRef k_full, RepeatKv(ctx, s, k, op));
  SK_ASSIGN_OR_RETURN(MatrixRef v_full, RepeatKv(ctx, s, v, op));
  return ComposedForward(ctx, Ungrouped(s), q, k_full, v_full, probs, out, F(lse));
}

// The multi-head shape of a grouped one (every query head its own k and v).
AttentionShape CudaBackend::Ungrouped(AttentionShape s) {
  s.kv_heads = 0;
  return s;
}

// A temporary [batch * kv_len, heads * head_dim] of m's dtype holding m's
// key/value heads repeated for their query heads (uninitialised when
// !fill: a gradient the composed backward writes).
StatusOr<MatrixRef> CudaBackend::RepeatKv(const OpContext& ctx, const AttentionShape& s, const MatrixRef& m,
                                          const char* op, bool fill) {
  const int64_t rows = s.batch * s.kv_len, cols = s.heads * s.head_dim;
  SK_ASSIGN_OR_RETURN(Tensor full, ctx.alloc->Empty(m.t.dtype(), Shape{rows * cols}));
  if (fill) {
    SK_CUDA_OP(op, cuda::RepeatKvHeads(cuda::CBuf{Ptr(m.t, m.offset), m.t.dtype()}, m.ld, rows,
                                       s.KvHeads(), s.Group(), s.head_dim, B(full), S(ctx)));
  }
  return MatrixRef{full, 0, cols};
}

// dst (a k-shaped gradient) = the sums over each group of full's heads.
Status CudaBackend::SumKvGroups(const OpContext& ctx, const AttentionShape& s, const MatrixRef& full,
                                const MatrixRef& dst, const char* op) {
  SK_CUDA_OP(op, cuda::SumKvHeadGroups(C(full.t), s.batch * s.kv_len, s.KvHeads(), s.Group(),
                                       s.head_dim, cuda::Buf{Ptr(dst.t, dst.offset), dst.t.dtype()},
                                       dst.ld, S(ctx)));
  return OkStatus();
}

// As forward: cuDNN's SDPA backward (the op's declared workspace is its
// dQ accumulator and delta), else the composed backward on probabilities
// recomputed into a temporary (the scores GEMM and softmax of forward).
Status CudaBackend::FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                           const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                           const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                                           const MatrixRef& dk, const MatrixRef& dv,
                                           const Tensor& workspace) {
  const char* op = "flash_attention_bwd";
  SK_RETURN_IF_ERROR(Enter(ctx, op));
  if (s.batch == 0 || s.heads == 0) return OkStatus();
  const DType t = q.t.dtype();
  Status fused = cuda::SdpaSupports(s, t, {Operand(q), Operand(k), Operand(v), Operand(out),
                                           Operand(dout), Operand(dq), Operand(dk), Operand(dv)});
  if (fused.ok()) {
    fused = cuda::CudnnSdpaBackward(
        ctx,
        cuda::MakeSdpaBackwardPlan(s, t, {q.ld, k.ld, v.ld, out.ld, dout.ld, dq.ld, dk.ld, dv.ld}),
        Ptr(q.t, q.offset), Ptr(k.t, k.offset), Ptr(v.t, v.offset), Ptr(out.t, out.offset),
        Ptr(dout.t, dout.offset), F(lse), Ptr(dq.t, dq.offset), Ptr(dk.t, dk.offset),
        Ptr(dv.t, dv.offset), workspace);
    if (fused.ok()) return OkStatus();
  }
  LogComposedFallback(op, s, t, fused);
  // Grouped-query attention composed: k and v repeated per query head, and
  // the repeated heads' gradients summed per group afterwards.
  const bool grouped = s.Group() > 1;
  MatrixRef kf = k, vf = v, dkf = dk, dvf = dv;
  if (grouped) {
    SK_ASSIGN_OR_RETURN(kf, RepeatKv(ctx, s, k, op));
    SK_ASSIGN_OR_RETURN(vf, RepeatKv(ctx, s, v, op));
    SK_ASSIGN_OR_RETURN(dkf, RepeatKv(ctx, s, dk, op, /*fill=*/false));
    SK_ASSIGN_OR_RETURN(dvf, RepeatKv(ctx, s, dv, op, /*fill=*/false));
  }
  const AttentionShape full = Ungrouped(s);
  Tensor probs, scratch;
  if (s.q_len > 0) {
    SK_ASSIGN_OR_RETURN(probs, ctx.alloc->Empty(DType::kF32,
                                                Shape{s.batch * s.heads * s.q_len * s.kv_len}));
    SK_RETURN_IF_ERROR(Probabilities(ctx, full, q, kf, probs));
    SK_ASSIGN_OR_RETURN(scratch,
                        ctx.alloc->Empty(DType::kF32, Shape{s.heads * s.q_len * s.kv_len}));
  }
  SK_RETURN_IF_ERROR(ComposedBackward(ctx, full, q, kf, vf, probs, dout, dq, dkf, dvf, scratch));
  if (!grouped) return OkStatus();
  SK_RETURN_IF_ERROR(SumKvGroups(ctx, s, dkf, dk, op));
  return SumKvGroups(ctx, s, dvf, dv, op);
}

// Composed, in the dtype t of q, k, v and out (f32, or one 16-bit dtype:
// the dispatcher stages every other mix to f32). S = scale Q K^T for
// every (sequence, head) as one batched GEMM (GemmSeqHeads; head h's
// columns start at h * head_dim) into probs (f32 accumulation and
// output); the masked row softmax in place (f32), which for 16-bit t also
// stores P rounded to t in a temporary of the whole batch; then out = P V
// as one batched GEMM, with P in t (tensor cores for 16-bit t, f32
// accumulation, out rounded once).
// With lse (f32 [batch * heads * q_len]) also the log-sum-exp of each
// row's scores, taken before the softmax overwrites them.
Status CudaBackend::ComposedForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                    const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                                    const MatrixRef& out, float* lse) {
  if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return OkStatus();
  const DType t = q.t.dtype();
  CHECK(k.t.dtype() == t && v.t.dtype() == t && out.t.dtype() == t)
      << "attention_fwd: the dispatcher hands the CUDA backend one dtype for q, k, v and out";
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t pq = s.q_len * s.kv_len;  // one head's probabilities
  Tensor p16;                             // P rounded to t (16-bit t only)
  if (t != DType::kF32) {
    SK_ASSIGN_OR_RETURN(p16, ctx.alloc->Empty(t, Shape{s.batch * s.heads * pq}));
  }
  const int64_t hpq = s.heads * pq;  // one sequence's probabilities
  SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, true, s.q_len, s.kv_len, s.head_dim, scale,
                                  Ptr(q.t, q.offset), q.ld, s.q_len * q.ld, s.head_dim,
                                  Ptr(k.t, k.offset), k.ld, s.kv_len * k.ld, s.head_dim, t,
                                  probs.data(), DType::kF32, s.kv_len, hpq, pq, s.batch,
                                  s.heads));
  if (lse != nullptr) {
    SK_CUDA_OP("flash_attention_fwd",
               cuda::RowLogSumExp(F(probs), s.batch * s.heads * s.q_len, s.kv_len, s.causal,
                                  s.q_len, s.heads, KeyStarts(s), lse, S(ctx)));
  }
  SK_CUDA_OP("attention_fwd",
             cuda::SoftmaxRows(F(probs), s.batch * s.heads * s.q_len, s.kv_len, s.causal, s.q_len,
                               s.heads, KeyStarts(s), p16.defined() ? B(p16) : cuda::Buf{},
                               S(ctx)));
  const Tensor& p = p16.defined() ? p16 : probs;  // in t
  return GemmSeqHeads(ctx, false, false, s.q_len, s.head_dim, s.kv_len, 1.0f, p.data(),
                      s.kv_len, hpq, pq, Ptr(v.t, v.offset), v.ld, s.kv_len * v.ld, s.head_dim,
                      t, Ptr(out.t, out.offset), t, out.ld, s.q_len * out.ld, s.head_dim,
                      s.batch, s.heads);
}

Status CudaBackend::ComposedBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                     const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                                     const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                                     const MatrixRef& dv, const Tensor& scratch) {
  if (s.batch == 0 || s.heads == 0) return OkStatus();
  const DType t = q.t.dtype();
  for (const MatrixRef* m : {&k, &v, &dout, &dq, &dk, &dv}) {
    CHECK(m->t.dtype() == t) << "attention_bwd: the dispatcher hands the CUDA backend one dtype "
                                "for q, k, v, dout, dq, dk and dv";
  }
  const int64_t width = s.heads * s.head_dim;
  if (s.q_len == 0) {  // no query attends: the key and value gradients are zero
    SK_CUDA_OP("attention_bwd", cuda::FillMatrix(cuda::Buf{Ptr(dk.t, dk.offset), t},
                                                 s.batch * s.kv_len, width, dk.ld, 0.0f, S(ctx)));
    SK_CUDA_OP("attention_bwd", cuda::FillMatrix(cuda::Buf{Ptr(dv.t, dv.offset), t},
                                                 s.batch * s.kv_len, width, dv.ld, 0.0f, S(ctx)));
    return OkStatus();
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t pq = s.q_len * s.kv_len, hpq = s.heads * pq;
  const int64_t group = BackwardGroup(s);
  Tensor dp = scratch;  // heads * pq: AttentionBackwardScratchElements
  if (group > 1) {
    SK_ASSIGN_OR_RETURN(dp, ctx.alloc->Empty(DType::kF32, Shape{group * hpq}));
  }
  const bool half = t != DType::kF32;
  Tensor ds16, p16;  // the group's dS and P rounded to t (16-bit t only)
  if (half) {
    SK_ASSIGN_OR_RETURN(ds16, ctx.alloc->Empty(t, Shape{group * hpq}));
    SK_ASSIGN_OR_RETURN(p16, ctx.alloc->Empty(t, Shape{group * hpq}));
  }
  for (int64_t b = 0; b < s.batch; b += group) {
    const int64_t g = std::min(group, s.batch - b);  // sequences b .. b + g - 1
    const float* pb = F(probs) + b * hpq;
    const void* qb = Ptr(q.t, q.offset + b * s.q_len * q.ld);
    const void* kb = Ptr(k.t, k.offset + b * s.kv_len * k.ld);
    const void* vb = Ptr(v.t, v.offset + b * s.kv_len * v.ld);
    const void* dob = Ptr(dout.t, dout.offset + b * s.q_len * dout.ld);
    void* dqb = Ptr(dq.t, dq.offset + b * s.q_len * dq.ld);
    void* dkb = Ptr(dk.t, dk.offset + b * s.kv_len * dk.ld);
    void* dvb = Ptr(dv.t, dv.offset + b * s.kv_len * dv.ld);
    SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, true, s.q_len, s.kv_len, s.head_dim, 1.0f, dob,
                                    dout.ld, s.q_len * dout.ld, s.head_dim, vb, v.ld,
                                    s.kv_len * v.ld, s.head_dim, t, F(dp), DType::kF32,
                                    s.kv_len, hpq, pq, g, s.heads));
    // P and dS as the GEMMs read them (dtype t).
    const void* p_t = pb;
    const void* ds_t = F(dp);
    if (half) {
      SK_CUDA_OP("attention_bwd",
                 cuda::SoftmaxBackwardRows(pb, F(dp), g * s.heads * s.q_len, s.kv_len, scale,
                                           B(ds16), p16.data(), S(ctx)));
      p_t = p16.data();
      ds_t = ds16.data();
    } else {
      SK_CUDA_OP("attention_bwd",
                 cuda::SoftmaxBackwardRows(pb, F(dp), g * s.heads * s.q_len, s.kv_len, scale,
                                           cuda::Buf{}, nullptr, S(ctx)));
    }
    SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, true, false, s.kv_len, s.head_dim, s.q_len, 1.0f, p_t,
                                    s.kv_len, hpq, pq, dob, dout.ld, s.q_len * dout.ld,
                                    s.head_dim, t, dvb, t, dv.ld, s.kv_len * dv.ld, s.head_dim,
                                    g, s.heads));
    SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, false, s.q_len, s.head_dim, s.kv_len, 1.0f, ds_t,
                                    s.kv_len, hpq, pq, kb, k.ld, s.kv_len * k.ld, s.head_dim, t,
                                    dqb, t, dq.ld, s.q_len * dq.ld, s.head_dim, g, s.heads));
    SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, true, false, s.kv_len, s.head_dim, s.q_len, 1.0f, ds_t,
                                    s.kv_len, hpq, pq, qb, q.ld, s.q_len * q.ld, s.head_dim, t,
                                    dkb, t, dk.ld, s.kv_len * dk.ld, s.head_dim, g, s.heads));
  }
  return OkStatus();
}

// probs = softmax(scale Q K^T), masked: forward's first two steps.
Status CudaBackend::Probabilities(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                  const MatrixRef& k, const Tensor& probs) {
  const DType t = q.t.dtype();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t pq = s.q_len * s.kv_len, hpq = s.heads * pq;
  SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, true, s.q_len, s.kv_len, s.head_dim, scale,
                                  Ptr(q.t, q.offset), q.ld, s.q_len * q.ld, s.head_dim,
                                  Ptr(k.t, k.offset), k.ld, s.kv_len * k.ld, s.head_dim, t,
                                  probs.data(), DType::kF32, s.kv_len, hpq, pq, s.batch,
                                  s.heads));
  SK_CUDA_OP("flash_attention_bwd",
             cuda::SoftmaxRows(F(probs), s.batch * s.heads * s.q_len, s.kv_len, s.causal,
                               s.q_len, s.heads, KeyStarts(s), cuda::Buf{}, S(ctx)));
  return OkStatus();
}

}  // namespace sk::ops
