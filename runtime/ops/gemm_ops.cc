// The GEMM ops of ops.h: Gemm and the linear layer's fused forms (GemmBias,
// GemmBiasResidual, GemmBiasGelu, GemmGeluBackward), each composed of other
// ops where its backend does not fuse it. The shared dispatch: dispatch.h.
#include "runtime/ops/ops.h"

#include <string>

#include "runtime/ops/dispatch.h"

namespace sk::ops {

// Gemm's and GemmBias's operands: dimensions, devices, dtypes, extents and
// overlaps.
Status CheckGemmOperands(const char* op, const OpContext& ctx, const GemmParams& p,
                         const MatrixRef& a, const MatrixRef& b, const MatrixRef& c) {
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 0) {
    return Bad(op, "negative dimension m=" + N(p.m) + " n=" + N(p.n) + " k=" + N(p.k) +
                       " batch=" + N(p.batch));
  }
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "A", a.t, "B", b.t, "C", c.t));
  if (a.t.dtype() != b.t.dtype()) {
    return Bad(op, "A is " + std::string(DTypeName(a.t.dtype())) + " but B is " +
                       std::string(DTypeName(b.t.dtype())));
  }
  if (c.t.dtype() != DType::kF32 && c.t.dtype() != a.t.dtype()) {
    return Bad(op, "C is " + std::string(DTypeName(c.t.dtype())) + ", expected f32 or A's " +
                       std::string(DTypeName(a.t.dtype())));
  }
  SK_RETURN_IF_ERROR(CheckMatrix(op, "A", a, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.batch));
  SK_RETURN_IF_ERROR(CheckMatrix(op, "B", b, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.batch));
  SK_RETURN_IF_ERROR(CheckMatrix(op, "C", c, p.m, p.n, p.batch));
  if (p.m > 0 && p.n > 0 && p.batch > 0 && (Overlap(c.t, a.t) || Overlap(c.t, b.t))) {
    return Bad(op, "C overlaps A or B");
  }
  return OkStatus();
}

Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
            const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckGemmOperands(op, ctx, p, a, b, c));
  return Dispatch(be, ctx,
                  GemmCost(p.m, p.n, p.k, p.batch, a.t.dtype(), p.beta != 0.0f, c.t.dtype()),
                  [&] {
                    if (c.t.dtype() == DType::kF32 || be->GemmStores16Bit(p)) {
                      return be->Gemm(ctx, p, a, b, c);
                    }
                    // A 16-bit C: accumulated in f32, rounded once when stored.
                    return Staged(be, ctx, false, [&](F32Staging& st) -> Status {
                      SK_ASSIGN_OR_RETURN(MatrixRef wc, p.beta != 0.0f ? st.InOut(c) : st.Out(c));
                      return be->Gemm(ctx, p, a, b, wc);
                    });
                  });
}

// GemmBias's operands (and GemmBiasResidual's but the residual). The
// bias's own conditions first (C's ld among them, before C's extent is
// checked against it), then Gemm's.
Status CheckGemmBiasOperands(const char* op, const OpContext& ctx, const GemmParams& p,
                             const MatrixRef& a, const MatrixRef& b, const Tensor& bias,
                             const MatrixRef& c) {
  SK_RETURN_IF_ERROR(CheckTensor(op, "bias", ctx, bias));
  if (p.beta != 0.0f) return Bad(op, "a bias with beta=" + std::to_string(p.beta) + " (needs 0)");
  if (p.batch != 1) return Bad(op, "a bias with batch=" + N(p.batch) + " (needs 1)");
  if (bias.numel() != p.n) {
    return Bad(op, "bias has " + N(bias.numel()) + " elements, expected n=" + N(p.n));
  }
  if (c.ld != p.n) return Bad(op, "a bias with C's ld=" + N(c.ld) + " (needs n=" + N(p.n) + ")");
  SK_RETURN_IF_ERROR(CheckGemmOperands(op, ctx, p, a, b, c));
  if (Overlap(bias, c.t)) return Bad(op, "bias overlaps C");
  return OkStatus();
}

Status GemmBias(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                const Tensor& bias, const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  // Everything is checked before anything is written: the two-op form
  // writes C before its GEMM would find a bad A or B.
  SK_RETURN_IF_ERROR(CheckGemmBiasOperands(op, ctx, p, a, b, bias, c));
  if (p.m == 0 || p.n == 0) return OkStatus();
  if (!be->GemmAddsBias(p, a.t.dtype(), bias.dtype(), c.t.dtype())) {
    // Two ops: the bias written into C, the product accumulated onto it.
    SK_ASSIGN_OR_RETURN(Tensor rows, c.t.View(static_cast<size_t>(c.offset) * DTypeSize(c.t.dtype()),
                                              c.t.dtype(), Shape{p.m * p.n}));
    SK_RETURN_IF_ERROR(BroadcastRows(ctx, bias, rows));
    GemmParams q = p;
    q.beta = 1.0f;
    return Gemm(ctx, q, a, b, c);
  }
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), false, c.t.dtype());
  cost.bytes_read += static_cast<double>(p.n) * DTypeSize(bias.dtype());
  return Dispatch(be, ctx, cost, [&] { return be->GemmBias(ctx, p, a, b, bias, c); });
}

Status GemmBiasResidual(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                        const MatrixRef& b, const Tensor& bias, const Tensor& residual,
                        const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckGemmBiasOperands(op, ctx, p, a, b, bias, c));
  SK_RETURN_IF_ERROR(CheckTensor(op, "residual", ctx, residual));
  SK_RETURN_IF_ERROR(CheckNumel(op, "residual", residual, p.m * p.n));
  if (Overlap(residual, c.t)) return Bad(op, "residual overlaps C");
  if (p.m == 0 || p.n == 0) return OkStatus();
  SK_ASSIGN_OR_RETURN(Tensor rows, c.t.View(static_cast<size_t>(c.offset) * DTypeSize(c.t.dtype()),
                                            c.t.dtype(), Shape{p.m * p.n}));
  if (!be->GemmAddsResidual(p, a.t.dtype(), bias.dtype(), residual.dtype(), c.t.dtype())) {
    // The ops that define it: the linear layer in f32, the residual added
    // in f32, one rounding of a 16-bit C.
    if (c.t.dtype() == DType::kF32) {
      SK_RETURN_IF_ERROR(GemmBias(ctx, p, a, b, bias, c));
      return Axpy(ctx, 1.0f, residual, rows);
    }
    SK_ASSIGN_OR_RETURN(Tensor sum, ctx.alloc->Empty(DType::kF32, Shape{p.m * p.n}));
    SK_RETURN_IF_ERROR(GemmBias(ctx, p, a, b, bias, MatrixRef{sum, 0, p.n}));
    SK_RETURN_IF_ERROR(Axpy(ctx, 1.0f, residual, sum));
    return Cast(ctx, sum, rows);
  }
  // One GEMM whose beta = 1 term is the residual: C is written once.
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), true, c.t.dtype());
  cost.name = "gemm_bias_residual";
  cost.bytes_read += static_cast<double>(p.n) * DTypeSize(bias.dtype());
  if (residual.dtype() != c.t.dtype()) {
    cost.bytes_read += static_cast<double>(p.m * p.n) *
                       (static_cast<double>(DTypeSize(residual.dtype())) - DTypeSize(c.t.dtype()));
  }
  return Dispatch(be, ctx, cost, [&] { return be->GemmBiasResidual(ctx, p, a, b, bias, residual, c); });
}

Status GemmBiasGelu(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                    const MatrixRef& b, const Tensor& bias, const Tensor& pre, const Tensor& out) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "pre", ctx, pre));
  SK_RETURN_IF_ERROR(CheckNumel(op, "pre", pre, p.m * p.n));
  if (pre.dtype() != DType::kF32 && pre.dtype() != a.t.dtype()) {
    return Bad(op, "pre has dtype " + std::string(DTypeName(pre.dtype())) + ", expected f32 or A's " +
                       std::string(DTypeName(a.t.dtype())));
  }
  SK_RETURN_IF_ERROR(CheckGemmBiasOperands(op, ctx, p, a, b, bias, MatrixRef{out, 0, p.n}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "out", out, p.m * p.n));
  if (Overlap(pre, out)) return Bad(op, "pre overlaps out");
  if (Overlap(pre, a.t) || Overlap(pre, b.t) || Overlap(pre, bias)) return Bad(op, "pre overlaps an input");
  if (p.m == 0 || p.n == 0) return OkStatus();
  if (!be->GemmFusesGelu(p, a.t.dtype(), bias.dtype(), pre.dtype(), out.dtype())) {
    SK_RETURN_IF_ERROR(GemmBias(ctx, p, a, b, bias, MatrixRef{pre, 0, p.n}));
    return GeluForward(ctx, pre, out);
  }
  // One GEMM whose epilogue adds the bias, stores its input to GELU as pre
  // and GELU's output as out.
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), false, out.dtype());
  cost.name = "gemm_bias_gelu";
  cost.flops += kGeluForwardFlops * static_cast<double>(p.m * p.n);
  cost.bytes_read += static_cast<double>(p.n) * DTypeSize(bias.dtype());
  cost.bytes_written += static_cast<double>(p.m * p.n) * DTypeSize(pre.dtype());
  return Dispatch(be, ctx, cost, [&] { return be->GemmBiasGelu(ctx, p, a, b, bias, pre, out); });
}

Status GemmGeluBackward(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                        const MatrixRef& b, const Tensor& pre, const MatrixRef& c) {
  const char* op = "gemm";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "pre", ctx, pre));
  if (p.beta != 0.0f) return Bad(op, "GELU's gradient with beta=" + std::to_string(p.beta) + " (needs 0)");
  if (p.batch != 1) return Bad(op, "GELU's gradient with batch=" + N(p.batch) + " (needs 1)");
  if (c.ld != p.n) return Bad(op, "GELU's gradient with C's ld=" + N(c.ld) + " (needs n=" + N(p.n) + ")");
  SK_RETURN_IF_ERROR(CheckGemmOperands(op, ctx, p, a, b, c));
  SK_RETURN_IF_ERROR(CheckNumel(op, "pre", pre, p.m * p.n));
  if (Overlap(pre, c.t)) return Bad(op, "pre overlaps C");
  if (p.m == 0 || p.n == 0) return OkStatus();
  if (!be->GemmFusesGelu(p, a.t.dtype(), c.t.dtype(), pre.dtype(), c.t.dtype())) {
    SK_RETURN_IF_ERROR(Gemm(ctx, p, a, b, c));
    SK_ASSIGN_OR_RETURN(Tensor rows, c.t.View(static_cast<size_t>(c.offset) * DTypeSize(c.t.dtype()),
                                              c.t.dtype(), Shape{p.m * p.n}));
    return GeluBackward(ctx, pre, rows, rows);
  }
  OpCost cost = GemmCost(p.m, p.n, p.k, 1, a.t.dtype(), false, c.t.dtype());
  cost.name = "gemm_dgelu";
  cost.flops += kGeluBackwardFlops * static_cast<double>(p.m * p.n);
  cost.bytes_read += static_cast<double>(p.m * p.n) * DTypeSize(pre.dtype());
  return Dispatch(be, ctx, cost, [&] { return be->GemmGeluBackward(ctx, p, a, b, pre, c); });
}

}  // namespace sk::ops
