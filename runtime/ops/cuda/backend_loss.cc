// The CUDA backend's cross-entropy (backend_common.h).

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

Status CudaBackend::CrossEntropyForward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                                        const Tensor& loss) {
  SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_fwd"));
  const int64_t rows = targets.numel();
  const int64_t vocab = rows == 0 ? 0 : logits.numel() / rows;
  SK_ASSIGN_OR_RETURN(Tensor row_loss, ctx.alloc->Empty(DType::kF32, Shape{rows}));
  SK_CUDA_OP("cross_entropy_fwd",
             cuda::CrossEntropyForward(C(logits), Ptr<int32_t>(targets), rows, vocab,
                                       F(row_loss), F(loss), S(ctx)));
  return OkStatus();
}

Status CudaBackend::CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                                         const Tensor& dlogits, float scale) {
  SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_bwd"));
  const int64_t rows = targets.numel();
  if (rows == 0) return OkStatus();
  SK_ASSIGN_OR_RETURN(Tensor count, ctx.alloc->Empty(DType::kF64, Shape{1}));
  SK_CUDA_OP("cross_entropy_bwd",
             cuda::CrossEntropyBackward(C(logits), Ptr<int32_t>(targets), rows,
                                        logits.numel() / rows, B(dlogits),
                                        Ptr<int64_t>(count), scale, S(ctx)));
  return OkStatus();
}

Status CudaBackend::CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                                          const Tensor& row_loss) {
  SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_rows"));
  const int64_t rows = targets.numel();
  const int64_t vocab = rows == 0 ? 0 : logits.numel() / rows;
  SK_CUDA_OP("cross_entropy_rows", cuda::CrossEntropyRowLosses(C(logits), Ptr<int32_t>(targets), rows,
                                                               vocab, F(row_loss), S(ctx)));
  return OkStatus();
}

Status CudaBackend::CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss, const Tensor& targets,
                                     const Tensor& loss) {
  SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_mean"));
  SK_CUDA_OP("cross_entropy_mean", cuda::CrossEntropyMean(F(row_loss), Ptr<int32_t>(targets),
                                                          targets.numel(), F(loss), S(ctx)));
  return OkStatus();
}

}  // namespace sk::ops
