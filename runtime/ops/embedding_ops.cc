// The embedding ops of ops.h: rows of a table by token id, and the table's
// gradient accumulated in id order. The shared dispatch: dispatch.h.
#include "runtime/ops/ops.h"

#include "runtime/ops/dispatch.h"

namespace sk::ops {

Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                        const Tensor& out) {
  const char* op = "embedding_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "table", ctx, table));
  SK_RETURN_IF_ERROR(CheckTensor(op, "ids", ctx, ids, {DType::kI32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "out", ctx, out));
  if (table.shape().rank() != 2) return Bad(op, "table must be [vocab, dim], got " + table.ToString());
  const int64_t dim = table.shape().dim(1);
  SK_RETURN_IF_ERROR(CheckNumel(op, "out", out, ids.numel() * dim));
  if (Overlap(out, table)) return Bad(op, "out overlaps table");
  const OpCost cost = EmbeddingForwardCost(ids.numel(), dim, table.dtype(), out.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wt, st.In(table));
    SK_ASSIGN_OR_RETURN(Tensor wo, st.Out(out));
    return be->EmbeddingForward(ctx, wt, ids, wo);
  });
}

Status EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout,
                         const Tensor& dtable) {
  const char* op = "embedding_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "ids", ctx, ids, {DType::kI32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "dout", ctx, dout));
  SK_RETURN_IF_ERROR(CheckTensor(op, "dtable", ctx, dtable, {DType::kF32}));
  if (dtable.shape().rank() != 2) {
    return Bad(op, "dtable must be [vocab, dim], got " + dtable.ToString());
  }
  const int64_t dim = dtable.shape().dim(1);
  SK_RETURN_IF_ERROR(CheckNumel(op, "dout", dout, ids.numel() * dim));
  if (Overlap(dout, dtable)) return Bad(op, "dout overlaps dtable");
  const OpCost cost = EmbeddingBackwardCost(ids.numel(), dim, dout.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wd, st.In(dout));
    return be->EmbeddingBackward(ctx, ids, wd, dtable);
  });
}

}  // namespace sk::ops
