// The CUDA backend's copies, casts, scaling, fills, initialisation and reads
// (backend_common.h).

#include <vector>

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

Status CudaBackend::Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  SK_RETURN_IF_ERROR(Enter(ctx, "copy"));
  if (src.nbytes() == 0) return OkStatus();
  SK_CUDA_OP("copy", cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault,
                                     static_cast<cudaStream_t>(S(ctx))));
  return OkStatus();
}

Status CudaBackend::Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  SK_RETURN_IF_ERROR(Enter(ctx, "cast"));
  SK_CUDA_OP("cast", cuda::Cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(),
                                S(ctx)));
  return OkStatus();
}

Status CudaBackend::RoundToDType(const OpContext& ctx, const Tensor& x, DType t) {
  SK_RETURN_IF_ERROR(Enter(ctx, "round_to_dtype"));
  SK_CUDA_OP("round_to_dtype", cuda::RoundToDType(F(x), x.numel(), t, S(ctx)));
  return OkStatus();
}

Status CudaBackend::Scale(const OpContext& ctx, const Tensor& x, float alpha) {
  SK_RETURN_IF_ERROR(Enter(ctx, "scale"));
  SK_CUDA_OP("scale", cuda::Scale(x.data(), x.dtype(), x.numel(), alpha, S(ctx)));
  return OkStatus();
}

Status CudaBackend::Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y) {
  SK_RETURN_IF_ERROR(Enter(ctx, "axpy"));
  SK_CUDA_OP("axpy",
             cuda::Axpy(alpha, x.data(), x.dtype(), y.data(), y.dtype(), x.numel(), S(ctx)));
  return OkStatus();
}

Status CudaBackend::Fill(const OpContext& ctx, const Tensor& x, float value) {
  SK_RETURN_IF_ERROR(Enter(ctx, "fill"));
  if (value == 0.0f && !std::signbit(value)) {  // +0 is all-zero bits in f32, bf16 and f16
    if (x.nbytes() == 0) return OkStatus();
    SK_CUDA_OP("fill", cudaMemsetAsync(x.data(), 0, x.nbytes(), static_cast<cudaStream_t>(S(ctx))));
    return OkStatus();
  }
  SK_CUDA_OP("fill", cuda::Fill(x.data(), x.dtype(), x.numel(), value, S(ctx)));
  return OkStatus();
}

Status CudaBackend::InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed,
                               uint64_t param_id, int64_t begin, const Tensor& out) {
  SK_RETURN_IF_ERROR(Enter(ctx, "init_philox"));
  SK_CUDA_OP("init_philox", cuda::InitPhilox(init, seed, param_id, begin, out.data(),
                                             out.dtype(), out.numel(), S(ctx)));
  return OkStatus();
}

StatusOr<double> CudaBackend::ReadScalar(const OpContext& ctx, const Tensor& t) {
  double v = 0;
  SK_RETURN_IF_ERROR(CopyToHost(ctx, t, &v, "read_scalar"));
  return v;
}

Status CudaBackend::ReadValues(const OpContext& ctx, const Tensor& t, double* out) {
  return CopyToHost(ctx, t, out, "read_values");
}

// Synchronises ctx.stream (the values must have been computed), then
// copies all of t in one cudaMemcpy and widens each element into out.
Status CudaBackend::CopyToHost(const OpContext& ctx, const Tensor& t, double* out, const char* op) {
  SK_RETURN_IF_ERROR(Enter(ctx, op));
  SK_RETURN_IF_ERROR(ctx.stream->Synchronize());
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<double> staging(n);  // 8-byte aligned, large enough for any dtype
  SK_CUDA_OP(op, cudaMemcpy(staging.data(), t.data(), n * DTypeSize(t.dtype()), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) out[i] = LoadAsDouble(staging.data(), t.dtype(), i);
  return OkStatus();
}

}  // namespace sk::ops
