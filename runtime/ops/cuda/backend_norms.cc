// The CUDA backend's LayerNorm and RMSNorm (backend_common.h).

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

Status CudaBackend::LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                                     const Tensor& beta, const Tensor& y, const Tensor& mean,
                                     const Tensor& rstd) {
  SK_RETURN_IF_ERROR(Enter(ctx, "layer_norm_fwd"));
  const int64_t cols = gamma.numel();
  if (cols == 0) return OkStatus();
  SK_CUDA_OP("layer_norm_fwd", cuda::LayerNormForward(C(x), C(gamma), C(beta), x.numel() / cols,
                                                      cols, B(y), F(mean), F(rstd), S(ctx)));
  return OkStatus();
}

Status CudaBackend::LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                                      const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  SK_RETURN_IF_ERROR(Enter(ctx, "layer_norm_bwd"));
  const int64_t cols = gamma.numel();
  if (cols == 0 || x.numel() == 0) return OkStatus();
  const int64_t rows = x.numel() / cols;
  SK_ASSIGN_OR_RETURN(Tensor partials, ctx.alloc->Empty(DType::kF32,
                                                        Shape{2 * cuda::ColumnChunks(rows) * cols}));
  SK_CUDA_OP("layer_norm_bwd",
             cuda::LayerNormBackward(C(x), C(gamma), C(dy), F(mean), F(rstd), rows, cols, B(dx),
                                     B(dgamma), B(dbeta), F(partials), S(ctx)));
  return OkStatus();
}

Status CudaBackend::RmsNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, float eps,
                                   const Tensor& y, const Tensor& rstd) {
  SK_RETURN_IF_ERROR(Enter(ctx, "rms_norm_fwd"));
  const int64_t cols = gamma.numel();
  if (cols == 0 || x.numel() == 0) return OkStatus();
  SK_CUDA_OP("rms_norm_fwd", cuda::RmsNormForward(C(x), C(gamma), x.numel() / cols, cols, eps,
                                                  B(y), F(rstd), S(ctx)));
  return OkStatus();
}

Status CudaBackend::RmsNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                                    const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                                    const Tensor& dgamma) {
  SK_RETURN_IF_ERROR(Enter(ctx, "rms_norm_bwd"));
  const int64_t cols = gamma.numel();
  if (cols == 0 || x.numel() == 0) return OkStatus();
  const int64_t rows = x.numel() / cols;
  SK_ASSIGN_OR_RETURN(Tensor partials, ctx.alloc->Empty(DType::kF32,
                                                        Shape{2 * cuda::ColumnChunks(rows) * cols}));
  SK_CUDA_OP("rms_norm_bwd", cuda::RmsNormBackward(C(x), C(gamma), C(dy), F(rstd), rows, cols,
                                                   B(dx), B(dgamma), F(partials), S(ctx)));
  return OkStatus();
}

}  // namespace sk::ops
