// The local backend's reduction on a CUDA stream: ReduceInRankOrder (reduce.h)
// as one kernel, for ranks that run as threads on one GPU.
//
// Compiled by nvcc (cuda_reduce.cu) only under --config=cuda; without it the
// local backend never calls it. The per-element arithmetic is reduce.h's
// ReduceElement, which a host test checks against the CPU reduction, so a GPU
// reduction produces the CPU's bits.
#ifndef SHARDKIT_RUNTIME_COMM_CUDA_REDUCE_H_
#define SHARDKIT_RUNTIME_COMM_CUDA_REDUCE_H_

#include <cstddef>

#include "runtime/core/dtype.h"

namespace sk::comm::cuda {

// Sources one kernel launch can take (their pointers travel as a kernel
// argument).
inline constexpr int kMaxReduceSources = 64;

// Enqueues dst[i] = ReduceElement(srcs[0..n-1][i]) rounded to `dtype`, for i
// in [0, count), on `stream` (a cudaStream_t). All pointers are device
// pointers; dst may be one of srcs (each element is read before it is
// written by the same thread). Returns the launch's cudaError_t (0 =
// enqueued); n must be in [1, kMaxReduceSources] and dtype one of the three
// element types (the caller validates both).
int ReduceInRankOrderAsync(const void* const* srcs, int n, DType dtype, size_t count,
                           float pre_scale, float divisor, float post_scale, void* dst,
                           void* stream);

}  // namespace sk::comm::cuda

#endif  // SHARDKIT_RUNTIME_COMM_CUDA_REDUCE_H_
