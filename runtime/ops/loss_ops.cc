// The cross-entropy ops of ops.h: the mean loss over non-ignored rows, its
// gradient, and the forward in two parts (row losses, then their mean) that
// ops/classifier.h computes a chunk of rows at a time. The shared dispatch:
// dispatch.h.
#include "runtime/ops/ops.h"

#include <cmath>
#include <string>

#include "runtime/ops/dispatch.h"

namespace sk::ops {

namespace {

Status CheckLoss(const char* op, const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                 int64_t* vocab) {
  SK_RETURN_IF_ERROR(CheckTensor(op, "logits", ctx, logits));
  SK_RETURN_IF_ERROR(CheckTensor(op, "targets", ctx, targets, {DType::kI32}));
  SK_RETURN_IF_ERROR(RowsOf(op, "logits", logits.numel(), targets.numel(), vocab));
  if (targets.numel() > 0 && *vocab == 0) return Bad(op, "logits have no columns");
  return OkStatus();
}

}  // namespace

Status CrossEntropyForward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                           const Tensor& loss) {
  const char* op = "cross_entropy_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  int64_t vocab = 0;
  SK_RETURN_IF_ERROR(CheckLoss(op, ctx, logits, targets, &vocab));
  SK_RETURN_IF_ERROR(CheckTensor(op, "loss", ctx, loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "loss", loss, 1));
  if (Overlap(loss, logits)) return Bad(op, "loss overlaps logits");
  const OpCost cost = CrossEntropyForwardCost(targets.numel(), vocab, logits.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wl, st.In(logits));
    return be->CrossEntropyForward(ctx, wl, targets, loss);
  });
}

Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                            const Tensor& dlogits, float scale) {
  const char* op = "cross_entropy_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  int64_t vocab = 0;
  SK_RETURN_IF_ERROR(CheckLoss(op, ctx, logits, targets, &vocab));
  SK_RETURN_IF_ERROR(CheckTensor(op, "dlogits", ctx, dlogits));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dlogits", dlogits, logits.numel()));
  if (Same(logits, dlogits) ? logits.dtype() != dlogits.dtype() : Overlap(logits, dlogits)) {
    return Bad(op, "dlogits overlaps logits");
  }
  if (!(scale >= 0.0f) || !std::isfinite(scale)) {
    return Bad(op, "scale must be finite and >= 0 (0: 1 / count), got " + std::to_string(scale));
  }
  const OpCost cost =
      CrossEntropyBackwardCost(targets.numel(), vocab, logits.dtype(), dlogits.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wl, st.In(logits));
    SK_ASSIGN_OR_RETURN(Tensor wd, st.Out(dlogits));
    return be->CrossEntropyBackward(ctx, wl, targets, wd, scale);
  });
}

Status CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                             const Tensor& row_loss) {
  const char* op = "cross_entropy_rows";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  int64_t vocab = 0;
  SK_RETURN_IF_ERROR(CheckLoss(op, ctx, logits, targets, &vocab));
  SK_RETURN_IF_ERROR(CheckTensor(op, "row_loss", ctx, row_loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "row_loss", row_loss, targets.numel()));
  if (Overlap(row_loss, logits)) return Bad(op, "row_loss overlaps logits");
  const OpCost cost = CrossEntropyRowLossesCost(targets.numel(), vocab, logits.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wl, st.In(logits));
    return be->CrossEntropyRowLosses(ctx, wl, targets, row_loss);
  });
}

Status CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss, const Tensor& targets,
                        const Tensor& loss) {
  const char* op = "cross_entropy_mean";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "row_loss", ctx, row_loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "targets", ctx, targets, {DType::kI32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "row_loss", row_loss, targets.numel()));
  SK_RETURN_IF_ERROR(CheckTensor(op, "loss", ctx, loss, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "loss", loss, 1));
  if (Overlap(loss, row_loss)) return Bad(op, "loss overlaps row_loss");
  return Dispatch(be, ctx, CrossEntropyMeanCost(targets.numel()),
                  [&] { return be->CrossEntropyMean(ctx, row_loss, targets, loss); });
}

}  // namespace sk::ops
