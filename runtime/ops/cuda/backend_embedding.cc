// The CUDA backend's embedding lookup and its gradient (backend_common.h).

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

Status CudaBackend::EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                                     const Tensor& out) {
  SK_RETURN_IF_ERROR(Enter(ctx, "embedding_fwd"));
  SK_CUDA_OP("embedding_fwd", cuda::EmbeddingForward(C(table), Ptr<int32_t>(ids), ids.numel(),
                                                     table.shape().dim(1), B(out), S(ctx)));
  return OkStatus();
}

Status CudaBackend::EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout,
                                      const Tensor& dtable) {
  SK_RETURN_IF_ERROR(Enter(ctx, "embedding_bwd"));
  const int64_t count = ids.numel(), dim = dtable.shape().dim(1);
  if (count == 0 || dim == 0) return OkStatus();
  if (count > cuda::kMaxEmbeddingBackwardIds) {
    return InvalidArgumentError("embedding_bwd on CUDA: " + std::to_string(count) +
                                " ids, more than the " +
                                std::to_string(cuda::kMaxEmbeddingBackwardIds) + " it supports");
  }
  size_t bytes = 0;
  SK_CUDA_OP("embedding_bwd", cuda::EmbeddingBackwardScratchBytes(count, &bytes));
  // Sorted ids and positions plus CUB's temporaries, as f64 for 8-byte units.
  SK_ASSIGN_OR_RETURN(Tensor scratch, ctx.alloc->Empty(DType::kF64,
                                                       Shape{static_cast<int64_t>((bytes + 7) / 8)}));
  SK_CUDA_OP("embedding_bwd",
             cuda::EmbeddingBackward(Ptr<int32_t>(ids), C(dout), count, dim,
                                     dtable.shape().dim(0), F(dtable), scratch.data(),
                                     scratch.nbytes(), S(ctx)));
  return OkStatus();
}

}  // namespace sk::ops
