// One thread per element: each reads rank j's element for j = 0..n-1 and
// reduces them in that order with reduce.h's arithmetic.
#include <cuda_runtime.h>

#include "runtime/comm/cuda_reduce.h"
#include "runtime/comm/reduce.h"

namespace sk::comm::cuda {
namespace {

constexpr int kThreads = 256;

struct Sources {
  const void* p[kMaxReduceSources];
};

template <typename T>
__device__ __forceinline__ float Load(const void* p, size_t i);
template <>
__device__ __forceinline__ float Load<float>(const void* p, size_t i) {
  return static_cast<const float*>(p)[i];
}
template <>
__device__ __forceinline__ float Load<BF16>(const void* p, size_t i) {
  return BF16ToFloat(static_cast<const BF16*>(p)[i]);
}
template <>
__device__ __forceinline__ float Load<F16>(const void* p, size_t i) {
  return F16ToFloat(static_cast<const F16*>(p)[i]);
}

__device__ __forceinline__ void Store(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(BF16* p, size_t i, float v) { p[i] = FloatToBF16(v); }
__device__ __forceinline__ void Store(F16* p, size_t i, float v) { p[i] = FloatToF16(v); }

template <typename T>
__global__ void ReduceKernel(Sources srcs, int n, size_t count, float pre, float divisor,
                             float post, T* dst) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float v = ReduceElement([&](int j) { return Load<T>(srcs.p[j], i); }, n, pre, divisor, post);
  Store(dst, i, v);
}

template <typename T>
int Launch(const Sources& srcs, int n, size_t count, float pre, float divisor, float post,
           void* dst, void* stream) {
  unsigned blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  ReduceKernel<T><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      srcs, n, count, pre, divisor, post, static_cast<T*>(dst));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int ReduceInRankOrderAsync(const void* const* srcs, int n, DType dtype, size_t count,
                           float pre_scale, float divisor, float post_scale, void* dst,
                           void* stream) {
  if (count == 0) return 0;
  if (n < 1 || n > kMaxReduceSources) return static_cast<int>(cudaErrorInvalidValue);
  Sources s{};
  for (int j = 0; j < n; ++j) s.p[j] = srcs[j];
  switch (dtype) {
    case DType::kF32: return Launch<float>(s, n, count, pre_scale, divisor, post_scale, dst, stream);
    case DType::kBF16: return Launch<BF16>(s, n, count, pre_scale, divisor, post_scale, dst, stream);
    case DType::kF16: return Launch<F16>(s, n, count, pre_scale, divisor, post_scale, dst, stream);
    default: break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace sk::comm::cuda
