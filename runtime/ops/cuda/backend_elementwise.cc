// The CUDA backend's bias, GELU, RoPE and SwiGLU ops (backend_common.h).

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

Status CudaBackend::BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  SK_RETURN_IF_ERROR(Enter(ctx, "broadcast_rows"));
  const int64_t cols = src.numel();
  if (cols == 0) return OkStatus();
  SK_CUDA_OP("broadcast_rows", cuda::BroadcastRows(C(src), cols, B(dst), dst.numel() / cols, S(ctx)));
  return OkStatus();
}

Status CudaBackend::BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y) {
  SK_RETURN_IF_ERROR(Enter(ctx, "bias_add"));
  const int64_t cols = bias.numel();
  if (cols == 0) return OkStatus();
  SK_CUDA_OP("bias_add", cuda::BiasAdd(C(bias), cols, B(y), y.numel() / cols, S(ctx)));
  return OkStatus();
}

Status CudaBackend::BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias) {
  SK_RETURN_IF_ERROR(Enter(ctx, "bias_grad"));
  const int64_t cols = dbias.numel();
  if (cols == 0 || dy.numel() == 0) return OkStatus();
  const int64_t rows = dy.numel() / cols;
  SK_ASSIGN_OR_RETURN(Tensor partials,
                      ctx.alloc->Empty(DType::kF32, Shape{cuda::ColumnChunks(rows) * cols}));
  SK_CUDA_OP("bias_grad", cuda::BiasGrad(C(dy), rows, cols, B(dbias), F(partials), S(ctx)));
  return OkStatus();
}

Status CudaBackend::GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y) {
  SK_RETURN_IF_ERROR(Enter(ctx, "gelu_fwd"));
  SK_CUDA_OP("gelu_fwd", cuda::GeluForward(C(x), x.numel(), B(y), S(ctx)));
  return OkStatus();
}

Status CudaBackend::GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy,
                                 const Tensor& dx) {
  SK_RETURN_IF_ERROR(Enter(ctx, "gelu_bwd"));
  SK_CUDA_OP("gelu_bwd", cuda::GeluBackward(C(x), C(dy), x.numel(), B(dx), S(ctx)));
  return OkStatus();
}

Status CudaBackend::Rope(const OpContext& ctx, const Tensor& x, int64_t seq_len, int64_t heads,
                         int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
                         const Tensor& y, const Tensor& positions) {
  const char* op = inverse ? "rope_bwd" : "rope_fwd";
  SK_RETURN_IF_ERROR(Enter(ctx, op));
  const int32_t* pos = positions.defined() ? positions.data_as<int32_t>() : nullptr;
  SK_CUDA_OP(op, cuda::Rope(C(x), x.numel(), seq_len, heads, head_dim, theta, scaling,
                            inverse, B(y), pos, S(ctx)));
  return OkStatus();
}

Status CudaBackend::SwiGluForward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                                  const Tensor& y) {
  SK_RETURN_IF_ERROR(Enter(ctx, "swiglu_fwd"));
  SK_CUDA_OP("swiglu_fwd", cuda::SwiGluForward(C(gate), C(up), gate.numel(), B(y), S(ctx)));
  return OkStatus();
}

Status CudaBackend::SwiGluBackward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                                   const Tensor& dy, const Tensor& dgate, const Tensor& dup) {
  SK_RETURN_IF_ERROR(Enter(ctx, "swiglu_bwd"));
  SK_CUDA_OP("swiglu_bwd", cuda::SwiGluBackward(C(gate), C(up), C(dy), gate.numel(), B(dgate),
                                                B(dup), S(ctx)));
  return OkStatus();
}

}  // namespace sk::ops
