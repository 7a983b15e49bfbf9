// The data-movement ops of ops.h (Copy, Cast, RoundToDType, Scale, Axpy,
// Fill, InitPhilox) and the reads of values back to the host (ReadScalar,
// ReadValues). The shared dispatch: dispatch.h.
#include "runtime/ops/ops.h"

#include <limits>
#include <string>
#include <vector>

#include "runtime/ops/dispatch.h"

namespace sk::ops {

// ---- Data movement ------------------------------------------------------------

Status Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  const char* op = "copy";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  const DeviceKind kind = ctx.device->id().kind;
  for (const Tensor* t : {&src, &dst}) {
    const char* what = t == &src ? "src" : "dst";
    if (!t->defined()) return Bad(op, std::string(what) + " is undefined");
    if (t->device().kind != kind && !KindCapabilities(t->device().kind).host_memory) {
      return Bad(op, std::string(what) + " " + t->ToString() + " is neither host memory nor on " +
                         ctx.device->id().ToString());
    }
  }
  if (src.dtype() != dst.dtype()) {
    return Bad(op, "src is " + std::string(DTypeName(src.dtype())) + " but dst is " +
                       std::string(DTypeName(dst.dtype())) + " (use cast)");
  }
  SK_RETURN_IF_ERROR(CheckNumel(op, "dst", dst, src.numel()));
  if (!Same(src, dst) && Overlap(src, dst)) return Bad(op, "src and dst overlap");
  return Dispatch(be, ctx, CopyCost(src.numel(), src.dtype()),
                  [&] { return Same(src, dst) ? OkStatus() : be->Copy(ctx, src, dst); });
}

Status Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  const char* op = "cast";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "src", src, "dst", dst));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dst", dst, src.numel()));
  if (Overlap(src, dst)) return Bad(op, "src and dst overlap");
  return Dispatch(be, ctx, CastCost(src.numel(), src.dtype(), dst.dtype()),
                  [&] { return be->Cast(ctx, src, dst); });
}

Status RoundToDType(const OpContext& ctx, const Tensor& x, DType t) {
  const char* op = "round_to_dtype";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x, {DType::kF32}));
  if (!IsFloat(t)) return Bad(op, "target dtype " + std::string(DTypeName(t)) + " is not a float type");
  if (t == DType::kF32) return be->Account(ctx, RoundToDTypeCost(0));
  return Dispatch(be, ctx, RoundToDTypeCost(x.numel()), [&] { return be->RoundToDType(ctx, x, t); });
}

Status Scale(const OpContext& ctx, const Tensor& x, float alpha) {
  const char* op = "scale";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x));
  return Dispatch(be, ctx, ScaleCost(x.numel(), x.dtype()), [&] { return be->Scale(ctx, x, alpha); });
}

Status Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y) {
  const char* op = "axpy";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "y", y));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  if (Overlap(x, y) && !(Same(x, y) && x.dtype() == y.dtype())) return Bad(op, "x and y overlap");
  return Dispatch(be, ctx, AxpyCost(x.numel(), x.dtype(), y.dtype()),
                  [&] { return be->Axpy(ctx, alpha, x, y); });
}

Status Fill(const OpContext& ctx, const Tensor& x, float value) {
  const char* op = "fill";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "x", ctx, x));
  return Dispatch(be, ctx, FillCost(x.numel(), x.dtype()), [&] { return be->Fill(ctx, x, value); });
}

Status InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed, uint64_t param_id,
                  int64_t begin, const Tensor& out) {
  const char* op = "init_philox";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(ValidateInitializer(init).WithContext(op));
  if (begin < 0) return Bad(op, "negative begin " + N(begin));
  SK_RETURN_IF_ERROR(CheckTensor(op, "out", ctx, out));
  return Dispatch(be, ctx, InitCost(out.numel(), out.dtype()),
                  [&] { return be->InitPhilox(ctx, init, seed, param_id, begin, out); });
}

// ---- Reading values back ---------------------------------------------------------------

StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t) {
  const char* op = "read_scalar";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "t", ctx, t,
                                 {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32}));
  SK_RETURN_IF_ERROR(CheckNumel(op, "t", t, 1));
  SK_RETURN_IF_ERROR(be->Account(ctx, ReadScalarCost(t.dtype())));
  if (!be->executes()) return std::numeric_limits<double>::quiet_NaN();
  return be->ReadScalar(ctx, t);
}

StatusOr<std::vector<double>> ReadValues(const OpContext& ctx, const Tensor& t) {
  const char* op = "read_values";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensor(op, "t", ctx, t,
                                 {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32}));
  if (t.numel() < 1 || t.numel() > kMaxReadValues) {
    return InvalidArgumentError(std::string(op) + ": t has " + std::to_string(t.numel()) +
                                " elements; reads 1 to " + std::to_string(kMaxReadValues));
  }
  SK_RETURN_IF_ERROR(be->Account(ctx, ReadValuesCost(t.dtype(), t.numel())));
  std::vector<double> out(static_cast<size_t>(t.numel()), std::numeric_limits<double>::quiet_NaN());
  if (!be->executes()) return out;
  SK_RETURN_IF_ERROR(be->ReadValues(ctx, t, out.data()));
  return out;
}

}  // namespace sk::ops
