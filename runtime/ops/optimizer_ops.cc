// The optimizer step's ops of ops.h: the gradient-norm partials
// (SumOfSquares, MaxAbs) and the fused SGD and Adam/AdamW updates over a
// flat shard. The shared dispatch: dispatch.h.
#include "runtime/ops/ops.h"

#include <utility>

#include "runtime/ops/dispatch.h"

namespace sk::ops {

// ---- Reductions ---------------------------------------------------------------------

namespace {

// SumOfSquares' and MaxAbs's operands: a float x and one f64 accumulator.
Status CheckReduction(const char* op, const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x));
  SK_RETURN_IF_ERROR(CheckTensor(op, "acc", ctx, acc, {DType::kF64}));
  return CheckNumel(op, "acc", acc, 1);
}

}  // namespace

Status SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  const char* op = "sum_of_squares";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckReduction(op, ctx, x, acc));
  return Dispatch(be, ctx, SumOfSquaresCost(x.numel(), x.dtype()),
                  [&] { return be->SumOfSquares(ctx, x, acc); });
}

Status MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  const char* op = "max_abs";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckReduction(op, ctx, x, acc));
  return Dispatch(be, ctx, MaxAbsCost(x.numel(), x.dtype()), [&] { return be->MaxAbs(ctx, x, acc); });
}

// ---- Optimizer updates -----------------------------------------------------------------

Status SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param, const Tensor& grad,
                 const Tensor& momentum) {
  const char* op = "sgd_update";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "param", ctx, param, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "grad", ctx, grad, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "grad", grad, param.numel()));
  const bool has_momentum = h.momentum != 0.0f;
  if (has_momentum) {
    SK_RETURN_IF_ERROR(CheckTensor(op, "momentum", ctx, momentum, {DType::kF32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, "momentum", momentum, param.numel()));
    if (Overlap(momentum, param) || Overlap(momentum, grad)) {
      return Bad(op, "momentum overlaps param or grad");
    }
  }
  if (Overlap(param, grad)) return Bad(op, "param overlaps grad");
  return Dispatch(be, ctx, SgdUpdateCost(param.numel(), has_momentum),
                  [&] { return be->SgdUpdate(ctx, h, param, grad, momentum); });
}

Status AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param,
                  const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  const char* op = h.decoupled ? "adamw_update" : "adam_update";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  for (auto [what, t] : {std::pair<const char*, const Tensor*>{"param", &param}, {"grad", &grad},
                         {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}}) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, *t, {DType::kF32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, what, *t, param.numel()));
  }
  const Tensor* ts[] = {&param, &grad, &exp_avg, &exp_avg_sq};
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      if (Overlap(*ts[i], *ts[j])) return Bad(op, "param, grad and state tensors overlap");
    }
  }
  return Dispatch(be, ctx, AdamUpdateCost(param.numel(), h.decoupled),
                  [&] { return be->AdamUpdate(ctx, h, param, grad, exp_avg, exp_avg_sq); });
}

}  // namespace sk::ops
