// Reduction kernels shared by the CPU backends (local, gloo): the one place
// that fixes the arithmetic documented in process_group.h, so every backend
// produces the same bits.
#ifndef SHARDKIT_RUNTIME_COMM_REDUCE_H_
#define SHARDKIT_RUNTIME_COMM_REDUCE_H_

#include <cstddef>

#include "runtime/core/dtype.h"

namespace sk::comm {

// dst[i] = round((sum_{j=0..n-1} srcs[j][i] * pre_scale) / divisor * post_scale)
// with the sum taken in f32 in the order j = 0, 1, ..., n-1; divisor is 1 for
// SUM and the world size for AVG. dst may alias srcs[j] only if it is the same
// pointer (elements are read before they are written, block by block).
void ReduceInRankOrder(const void* const* srcs, int n, DType dtype, size_t count, float pre_scale,
                       float divisor, float post_scale, void* dst);

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_REDUCE_H_
