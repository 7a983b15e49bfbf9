// The attention ops of ops.h: the composed attention (probabilities kept)
// and attention in linear memory (FlashAttention: lse kept), forward and
// backward, with their workspaces and the backend's choice between them.
// The shared dispatch: dispatch.h.
#include "runtime/ops/ops.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "runtime/ops/dispatch.h"

namespace sk::ops {

// ---- Attention ------------------------------------------------------------------

namespace {

// The shape and the q/k/v-shaped views every attention op takes.
Status CheckAttentionViews(const char* op, const OpContext& ctx, const AttentionShape& s,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> q_rows,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> kv_rows) {
  if (s.batch < 0 || s.heads < 0 || s.q_len < 0 || s.kv_len < 0 || s.head_dim <= 0) {
    return Bad(op, "bad shape: batch=" + N(s.batch) + " heads=" + N(s.heads) + " q_len=" +
                       N(s.q_len) + " kv_len=" + N(s.kv_len) + " head_dim=" + N(s.head_dim));
  }
  if (s.causal && s.q_len != s.kv_len) {
    return Bad(op, "causal attention needs q_len == kv_len, got " + N(s.q_len) + " and " +
                       N(s.kv_len));
  }
  if (s.q_len > 0 && s.kv_len == 0) return Bad(op, "queries without keys (kv_len = 0)");
  if (s.key_start.defined()) {
    if (!s.causal) return Bad(op, "key_start (packed documents) needs causal attention");
    SK_RETURN_IF_ERROR(CheckTensor(op, "key_start", ctx, s.key_start, {DType::kI32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, "key_start", s.key_start, s.batch * s.q_len));
    const int64_t rows = s.batch * s.q_len;
    if (s.masked_pairs < rows || s.masked_pairs > rows * (s.q_len + 1) / 2) {
      return Bad(op, "masked_pairs=" + N(s.masked_pairs) + " is outside [" + N(rows) + ", " +
                         N(rows * (s.q_len + 1) / 2) + "] for batch=" + N(s.batch) +
                         " q_len=" + N(s.q_len));
    }
  } else if (s.masked_pairs != 0) {
    return Bad(op, "masked_pairs=" + N(s.masked_pairs) + " without key_start");
  }
  if (s.kv_heads < 0 || (s.kv_heads > 0 && s.heads % s.kv_heads != 0)) {
    return Bad(op, "kv_heads=" + N(s.kv_heads) + " does not divide heads=" + N(s.heads));
  }
  const int64_t cols = s.heads * s.head_dim;
  const int64_t kv_cols = s.KvHeads() * s.head_dim;
  for (auto [what, m] : q_rows) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, m->t));
    SK_RETURN_IF_ERROR(CheckMatrix(op, what, *m, s.batch * s.q_len, cols, 1));
  }
  for (auto [what, m] : kv_rows) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, m->t));
    SK_RETURN_IF_ERROR(CheckMatrix(op, what, *m, s.batch * s.kv_len, kv_cols, 1));
  }
  return OkStatus();
}

Status CheckAttention(const char* op, const OpContext& ctx, const AttentionShape& s,
                      std::initializer_list<std::pair<const char*, const MatrixRef*>> q_rows,
                      std::initializer_list<std::pair<const char*, const MatrixRef*>> kv_rows,
                      const Tensor& probs) {
  if (s.KvHeads() != s.heads) {
    return Bad(op, "grouped-query attention (kv_heads=" + N(s.kv_heads) + ", heads=" +
                       N(s.heads) + ") runs only in the linear-memory attention");
  }
  SK_RETURN_IF_ERROR(CheckAttentionViews(op, ctx, s, q_rows, kv_rows));
  SK_RETURN_IF_ERROR(CheckTensor(op, "probs", ctx, probs, {DType::kF32}));
  return CheckNumel(op, "probs", probs, s.batch * s.heads * s.q_len * s.kv_len);
}

}  // namespace

Status AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                        const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                        const MatrixRef& out) {
  const char* op = "attention_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckAttention(op, ctx, s, {{"q", &q}, {"out", &out}}, {{"k", &k}, {"v", &v}},
                                    probs));
  if (AnyOverlap({&out.t, &probs}, {&q.t, &k.t, &v.t})) {
    return Bad(op, "an output overlaps an input");
  }
  const OpCost cost =
      AttentionForwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, q.t.dtype());
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &out.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wo, st.Out(out));
                          return be->AttentionForward(ctx, s, wq, wk, wv, probs, wo);
                        });
}

int64_t ComposedAttentionBackwardGroup(const AttentionShape& s) {
  const int64_t per_seq = s.heads * s.q_len * s.kv_len;
  if (per_seq <= 0) return 1;
  return std::clamp<int64_t>((int64_t{1} << 26) / per_seq, 1, std::max<int64_t>(s.batch, 1));
}

ComposedAttentionBytes ComposedAttentionTemporaryBytes(const AttentionShape& s, DType t) {
  ComposedAttentionBytes b;
  if (s.batch <= 0 || s.heads <= 0 || s.q_len <= 0) return b;
  const int64_t hpq = s.heads * s.q_len * s.kv_len;  // one sequence's scores
  const int64_t all = s.batch * hpq;
  const int64_t half = t == DType::kF32 ? 0 : static_cast<int64_t>(DTypeSize(t));
  // k or v repeated per query head: [batch * kv_len, heads * head_dim] in t.
  const int64_t repeated =
      s.Group() > 1 ? s.batch * s.kv_len * s.heads * s.head_dim * static_cast<int64_t>(DTypeSize(t)) : 0;
  b.forward = 4 * all + half * all + 2 * repeated;
  const int64_t group = ComposedAttentionBackwardGroup(s);
  b.backward = 4 * all + 4 * hpq + (group > 1 ? 4 * group * hpq : 0) + 2 * half * group * hpq +
               4 * repeated;
  return b;
}

int64_t AttentionBackwardScratchElements(const AttentionShape& s) {
  if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return 0;
  return s.heads * s.q_len * s.kv_len;
}

Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                         const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                         const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                         const MatrixRef& dv) {
  const char* op = "attention_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckAttention(op, ctx, s, {{"q", &q}, {"dout", &dout}, {"dq", &dq}},
                                    {{"k", &k}, {"v", &v}, {"dk", &dk}, {"dv", &dv}}, probs));
  if (AnyOverlap({&dq.t, &dk.t, &dv.t}, {&q.t, &k.t, &v.t, &probs, &dout.t})) {
    return Bad(op, "an output overlaps an input");
  }
  // The workspace comes from ctx.alloc here, for every backend alike, so
  // the simulator's memory is the executing backends' (and is counted).
  Tensor scratch;
  if (const int64_t n = AttentionBackwardScratchElements(s); n > 0) {
    SK_ASSIGN_OR_RETURN(scratch, ctx.alloc->Empty(DType::kF32, Shape{n}));
  }
  const OpCost cost =
      AttentionBackwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, q.t.dtype());
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &dout.t, &dq.t, &dk.t, &dv.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdo, st.In(dout));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdq, st.Out(dq));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdk, st.Out(dk));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdv, st.Out(dv));
                          return be->AttentionBackward(ctx, s, wq, wk, wv, probs, wdo, wdq, wdk,
                                                       wdv, scratch);
                        });
}

// ---- Attention in linear memory ----------------------------------------------------

namespace {

// The views of AttentionForward's checks (probs aside) and lse
// [batch, heads, q_len] f32.
Status CheckFlashAttention(const char* op, const OpContext& ctx, const AttentionShape& s,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> q_rows,
                           std::initializer_list<std::pair<const char*, const MatrixRef*>> kv_rows,
                           const Tensor& lse) {
  SK_RETURN_IF_ERROR(CheckAttentionViews(op, ctx, s, q_rows, kv_rows));
  SK_RETURN_IF_ERROR(CheckTensor(op, "lse", ctx, lse, {DType::kF32}));
  return CheckNumel(op, "lse", lse, s.batch * s.heads * s.q_len);
}

}  // namespace

Status FlashAttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                             const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                             const Tensor& lse) {
  const char* op = "flash_attention_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(
      CheckFlashAttention(op, ctx, s, {{"q", &q}, {"out", &out}}, {{"k", &k}, {"v", &v}}, lse));
  if (AnyOverlap({&out.t, &lse}, {&q.t, &k.t, &v.t})) return Bad(op, "an output overlaps an input");
  if (Overlap(out.t, lse)) return Bad(op, "out overlaps lse");
  const OpCost cost =
      FlashAttentionForwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, s.causal,
                                q.t.dtype(), s.kv_heads, s.masked_pairs);
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &out.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wo, st.Out(out));
                          return be->FlashAttentionForward(ctx, s, wq, wk, wv, wo, lse);
                        });
}

bool PrefersFlashAttention(const OpContext& ctx, const AttentionShape& s, DType t) {
  return ctx.device != nullptr && PrefersFlashAttention(ctx.device->id().kind, s, t);
}

bool PrefersFlashAttention(DeviceKind kind, const AttentionShape& s, DType t) {
  if (const OpBackend* be = BackendFor(kind); be != nullptr) return be->PrefersFlashAttention(s, t);
  // A simulated device before its backend is set up answers as that
  // backend will: its memory is a CPU run's.
  return KindCapabilities(kind).virtual_time && CpuPrefersFlashAttention(s);
}

int64_t FlashAttentionBackwardWorkspaceElements(const AttentionShape& s) {
  return s.batch * s.heads * s.q_len * (s.head_dim + 1);
}

Status FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                              const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                              const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                              const MatrixRef& dk, const MatrixRef& dv) {
  const char* op = "flash_attention_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckFlashAttention(
      op, ctx, s, {{"q", &q}, {"out", &out}, {"dout", &dout}, {"dq", &dq}},
      {{"k", &k}, {"v", &v}, {"dk", &dk}, {"dv", &dv}}, lse));
  if (AnyOverlap({&dq.t, &dk.t, &dv.t}, {&q.t, &k.t, &v.t, &out.t, &dout.t, &lse})) {
    return Bad(op, "an output overlaps an input");
  }
  // From ctx.alloc for every backend alike, so the simulator's memory is
  // the executing backends'.
  Tensor workspace;
  if (const int64_t n = FlashAttentionBackwardWorkspaceElements(s); n > 0) {
    SK_ASSIGN_OR_RETURN(workspace, ctx.alloc->Empty(DType::kF32, Shape{n}));
  }
  const OpCost cost =
      FlashAttentionBackwardCost(s.batch, s.heads, s.q_len, s.kv_len, s.head_dim, s.causal,
                                 q.t.dtype(), s.kv_heads, s.masked_pairs);
  return DispatchStaged(be, ctx, op, cost, {&q.t, &k.t, &v.t, &out.t, &dout.t, &dq.t, &dk.t, &dv.t},
                        [&](F32Staging& st) -> Status {
                          SK_ASSIGN_OR_RETURN(MatrixRef wq, st.In(q));
                          SK_ASSIGN_OR_RETURN(MatrixRef wk, st.In(k));
                          SK_ASSIGN_OR_RETURN(MatrixRef wv, st.In(v));
                          SK_ASSIGN_OR_RETURN(MatrixRef wo, st.In(out));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdo, st.In(dout));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdq, st.Out(dq));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdk, st.Out(dk));
                          SK_ASSIGN_OR_RETURN(MatrixRef wdv, st.Out(dv));
                          return be->FlashAttentionBackward(ctx, s, wq, wk, wv, wo, wdo, lse, wdq,
                                                            wdk, wdv, workspace);
                        });
}

}  // namespace sk::ops
