// The CUDA backend's grad-norm partials and optimizer updates (backend_common.h).

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

Status CudaBackend::SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  SK_RETURN_IF_ERROR(Enter(ctx, "sum_of_squares"));
  if (x.numel() == 0) return OkStatus();
  SK_ASSIGN_OR_RETURN(Tensor partials,
                      ctx.alloc->Empty(DType::kF64, Shape{cuda::kReduceBlocks}));
  SK_CUDA_OP("sum_of_squares", cuda::SumOfSquares(x.data(), x.dtype(), x.numel(),
                                                  Ptr<double>(partials), Ptr<double>(acc), S(ctx)));
  return OkStatus();
}

Status CudaBackend::MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc) {
  SK_RETURN_IF_ERROR(Enter(ctx, "max_abs"));
  if (x.numel() == 0) return OkStatus();
  SK_ASSIGN_OR_RETURN(Tensor partials,
                      ctx.alloc->Empty(DType::kF64, Shape{cuda::kReduceBlocks}));
  SK_CUDA_OP("max_abs", cuda::MaxAbs(x.data(), x.dtype(), x.numel(), Ptr<double>(partials),
                                     Ptr<double>(acc), S(ctx)));
  return OkStatus();
}

Status CudaBackend::SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param,
                              const Tensor& grad, const Tensor& momentum) {
  SK_RETURN_IF_ERROR(Enter(ctx, "sgd_update"));
  SK_CUDA_OP("sgd_update", cuda::SgdUpdate(h, F(param), F(grad),
                                           h.momentum != 0.0f ? F(momentum) : nullptr,
                                           param.numel(), S(ctx)));
  return OkStatus();
}

Status CudaBackend::AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param,
                               const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  const char* op = h.decoupled ? "adamw_update" : "adam_update";
  SK_RETURN_IF_ERROR(Enter(ctx, op));
  SK_CUDA_OP(op, cuda::AdamUpdate(h, F(param), F(grad), F(exp_avg), F(exp_avg_sq),
                                  param.numel(), S(ctx)));
  return OkStatus();
}

}  // namespace sk::ops
