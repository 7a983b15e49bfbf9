// The normalisation ops of ops.h: LayerNorm and RMSNorm, forward and
// backward, over the rows of x. The shared dispatch: dispatch.h.
#include "runtime/ops/ops.h"

#include <string>

#include "runtime/ops/dispatch.h"

namespace sk::ops {

namespace {

// The layer and RMS norms' x: [rows, cols] for gamma's cols; an empty
// gamma is an error.
Status NormShape(const char* op, const Tensor& x, const Tensor& gamma, int64_t* rows,
                 int64_t* cols) {
  *cols = gamma.numel();
  if (*cols == 0) return Bad(op, "gamma is empty");
  return RowsOf(op, "x", x.numel(), *cols, rows);
}

}  // namespace

// ---- LayerNorm ----------------------------------------------------------------

Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, const Tensor& y, const Tensor& mean,
                        const Tensor& rstd) {
  const char* op = "layer_norm_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "gamma", gamma, "beta", beta, "y", y));
  SK_RETURN_IF_ERROR(CheckTensor(op, "mean", ctx, mean, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "beta", beta, cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "mean", mean, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  if (AnyOverlap({&y, &mean, &rstd}, {&x, &gamma, &beta})) {
    return Bad(op, "an output overlaps an input");
  }
  const OpCost cost = LayerNormForwardCost(rows, cols, x.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wb, st.In(beta));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->LayerNormForward(ctx, wx, wg, wb, wy, mean, rstd);
  });
}

Status LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                         const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const char* op = "layer_norm_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "gamma", gamma, "dy", dy, "dx", dx, "dgamma", dgamma,
                                  "dbeta", dbeta));
  SK_RETURN_IF_ERROR(CheckTensor(op, "mean", ctx, mean, {DType::kF32}));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dy", dy, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dx", dx, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "mean", mean, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dgamma", dgamma, cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dbeta", dbeta, cols));
  if (AnyOverlap({&dx, &dgamma, &dbeta}, {&x, &gamma, &dy, &mean, &rstd})) {
    return Bad(op, "an output overlaps an input");
  }
  const OpCost cost = LayerNormBackwardCost(rows, cols, x.dtype(), dx.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdx, st.InOut(dx));
    SK_ASSIGN_OR_RETURN(Tensor wdg, st.InOut(dgamma));
    SK_ASSIGN_OR_RETURN(Tensor wdb, st.InOut(dbeta));
    return be->LayerNormBackward(ctx, wx, wg, wdy, mean, rstd, wdx, wdg, wdb);
  });
}

// ---- RMSNorm ------------------------------------------------------------------

Status RmsNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, float eps,
                      const Tensor& y, const Tensor& rstd) {
  const char* op = "rms_norm_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "gamma", gamma, "y", y));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  if (!(eps > 0.0f)) return Bad(op, "eps must be positive, got " + std::to_string(eps));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  if (AnyOverlap({&y, &rstd}, {&x, &gamma})) return Bad(op, "an output overlaps an input");
  if (Overlap(y, rstd)) return Bad(op, "y overlaps rstd");
  const OpCost cost = RmsNormForwardCost(rows, cols, x.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->RmsNormForward(ctx, wx, wg, eps, wy, rstd);
  });
}

Status RmsNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                       const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dgamma) {
  const char* op = "rms_norm_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(
      CheckTensors(op, ctx, "x", x, "gamma", gamma, "dy", dy, "dx", dx, "dgamma", dgamma));
  SK_RETURN_IF_ERROR(CheckTensor(op, "rstd", ctx, rstd, {DType::kF32}));
  int64_t rows = 0, cols = 0;
  SK_RETURN_IF_ERROR(NormShape(op, x, gamma, &rows, &cols));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dy", dy, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dx", dx, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "rstd", rstd, rows));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dgamma", dgamma, cols));
  if (AnyOverlap({&dx, &dgamma}, {&x, &gamma, &dy, &rstd})) {
    return Bad(op, "an output overlaps an input");
  }
  if (Overlap(dx, dgamma)) return Bad(op, "dx overlaps dgamma");
  const OpCost cost = RmsNormBackwardCost(rows, cols, x.dtype(), dx.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gamma));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdx, st.InOut(dx));
    SK_ASSIGN_OR_RETURN(Tensor wdg, st.InOut(dgamma));
    return be->RmsNormBackward(ctx, wx, wg, wdy, rstd, wdx, wdg);
  });
}

}  // namespace sk::ops
