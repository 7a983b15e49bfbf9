// Transitional: the CPU kernels moved to the op layer's CPU backend
// (runtime/ops/cpu/kernels.h). runtime/nn calls ops (runtime/ops/ops.h); this
// header goes away once nothing includes it.
#ifndef SHARDKIT_RUNTIME_NN_KERNELS_H_
#define SHARDKIT_RUNTIME_NN_KERNELS_H_

#include "runtime/ops/cpu/kernels.h"

#endif  // SHARDKIT_RUNTIME_NN_KERNELS_H_
