// Reduction kernels shared by the CPU backends (local, gloo): the one place
// that fixes the arithmetic documented in process_group.h, so every backend
// produces the same bits.
#ifndef SHARDKIT_RUNTIME_COMM_REDUCE_H_
#define SHARDKIT_RUNTIME_COMM_REDUCE_H_

#include <cstddef>

#include "runtime/core/dtype.h"
#include "runtime/core/macros.h"

namespace sk::comm {

// dst[i] = round((sum_{j=0..n-1} srcs[j][i] * pre_scale) / divisor * post_scale)
// with the sum taken in f32 in the order j = 0, 1, ..., n-1; divisor is 1 for
// SUM and the world size for AVG. dst may alias srcs[j] only if it is the same
// pointer (elements are read before they are written, block by block).
void ReduceInRankOrder(const void* const* srcs, int n, DType dtype, size_t count, float pre_scale,
                       float divisor, float post_scale, void* dst);

// The same arithmetic for one element, for device code (the local backend's
// CUDA reduction, cuda_reduce.cu) and for the host test that checks it
// against ReduceInRankOrder. Every product and sum is rounded on its own, as
// the host loops do: nvcc would otherwise fuse `acc + x * pre` into an FMA
// and the GPU's bits would differ from the CPU's.
SK_HOST_DEVICE SK_INLINE float ReduceMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SK_HOST_DEVICE SK_INLINE float ReduceAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
// x[j] is rank j's value widened to f32; the result is still to be rounded
// to the dtype.
template <typename LoadJ>
SK_HOST_DEVICE SK_INLINE float ReduceElement(LoadJ x, int n, float pre_scale, float divisor,
                                             float post_scale) {
  float acc = pre_scale == 1.0f ? x(0) : ReduceMul(x(0), pre_scale);
  for (int j = 1; j < n; ++j) acc = ReduceAdd(acc, pre_scale == 1.0f ? x(j) : ReduceMul(x(j), pre_scale));
  if (divisor != 1.0f) acc = acc / divisor;
  if (post_scale != 1.0f) acc = ReduceMul(acc, post_scale);
  return acc;
}

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_REDUCE_H_
