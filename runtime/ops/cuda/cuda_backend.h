// The CUDA op backend: the op table (runtime/ops/backend.h) on NVIDIA GPUs.
//
// Every op is enqueued on ctx.stream's cudaStream_t and returns once
// enqueued; results are ready in stream order. GEMMs are cuBLAS
// (cublasGemmStridedBatchedEx: f32 inputs in f32 without TF32; bf16/f16
// inputs with f32 accumulation and output, on tensor cores); attention is
// composed from batched GEMMs and row softmax kernels; the other ops are the
// kernels of kernels.cu around the CPU backend's SK_HOST_DEVICE arithmetic.
// ReadScalar synchronises ctx.stream and copies the value to the host.
// Temporaries (cross-entropy's row losses, attention's score gradients, the
// reductions' partials) come from ctx.alloc, which must be stream-ordered on
// ctx.stream (a StreamAllocator over the device's CachingAllocator).
//
// Registered for DeviceKind::kCuda by //runtime/ops when built with
// --config=cuda (ops.cc); nothing else refers to it.
//
// Thread safety: ops may be called from any thread; each thread has its own
// cuBLAS handle per device.
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_CUDA_BACKEND_H_
#define SHARDKIT_RUNTIME_OPS_CUDA_CUDA_BACKEND_H_

#include "runtime/ops/backend.h"

namespace sk::ops {

// The process-wide CUDA backend (never destroyed).
OpBackend* CudaOpBackend();

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_CUDA_BACKEND_H_
