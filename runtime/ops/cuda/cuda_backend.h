// The CUDA op backend: the op table (runtime/ops/backend.h) on NVIDIA GPUs.
//
// Every op is enqueued on ctx.stream's cudaStream_t and returns once
// enqueued; results are ready in stream order. GEMMs are cuBLAS
// (cublasGemmStridedBatchedEx: f32 inputs in f32 without TF32; bf16/f16
// inputs with f32 accumulation and output, on tensor cores); attention is
// composed from batched GEMMs and row softmax kernels; the other ops are the
// kernels of kernels.h (one .cu file per op family) around the CPU
// backend's SK_HOST_DEVICE arithmetic.
//
// 16-bit operands (Native16Bit: every model op): the kernels read bf16/f16
// operands directly, compute in f32 and round each 16-bit output once --
// the numbers the dispatcher's f32 staging gave, without its casts.
// Attention with q, k, v, out (dout, dq, dk, dv) all in one 16-bit dtype t
// runs every GEMM on t operands (tensor cores, f32 accumulation): scores
// S = scale Q K^T and dP = dO V^T are f32, the softmax and its backward run
// in f32 on them (probs stays f32, as ops.h requires), and P is rounded to t
// before out = P V and dV = P^T dO, dS = scale P (dP - <P, dP>) before
// dQ = dS K and dK = dS^T Q; outputs are rounded once (FlashAttention
// rounds P the same way). The CPU backend rounds P too in bf16 where it has
// AVX512-BF16, but keeps dS in f32, and both in f32 elsewhere (and in
// f16): the roundings only one backend does are where their 16-bit
// attention differs, by at most t's unit roundoff times the sum of the
// magnitudes of the terms that meet a rounded P or dS.
// Packed documents (AttentionShape::key_start: block-diagonal causal
// attention) run composed in both attention ops: the softmax and
// log-sum-exp kernels keep each query's keys [key_start, i] (math.h:
// AttentionRowKeys) and write 0 elsewhere, so P V, and every backward GEMM
// through P and dS (exact zeros there), never mix documents. Every score is
// still computed: the work is the causal row's, not the masked pairs' the
// op declares, and the linear-memory op holds its probabilities in a
// temporary of the call (cuDNN's SDPA graph here takes no such mask).
// ReadScalar synchronises ctx.stream and copies the value to the host.
// Temporaries (cross-entropy's row losses, attention's score gradients, the
// reductions' partials) come from ctx.alloc, which must be stream-ordered on
// ctx.stream (a StreamAllocator over the device's CachingAllocator).
//
// Registers itself for DeviceKind::kCuda when its library is loaded
// (cuda_backend.cc; //runtime/ops:cuda is alwayslink and built under
// --config=cuda only).
//
// Thread safety: ops may be called from any thread; each thread has its own
// cuBLAS, cuBLASLt and cuDNN handle per device, lent from a per-device pool
// and given back when the thread exits (cuda/handle_pool.h), and the
// cuBLASLt algorithm choices are cached for the process.
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_CUDA_BACKEND_H_
#define SHARDKIT_RUNTIME_OPS_CUDA_CUDA_BACKEND_H_

#include "runtime/ops/backend.h"

namespace sk::ops {

// The process-wide CUDA backend (never destroyed).
OpBackend* CudaOpBackend();

namespace cuda {

// The library handles (cuBLAS, cuBLASLt and cuDNN together) made so far for
// cuda:`device` (handle_pool.h). A thread that follows another (a local
// session's next step) is lent the handle the other gave back, so this
// stops growing once every concurrent thread has its own
// (//tests/ops:cuda_handles_test checks it on a GPU).
int LibraryHandlesCreated(int device);

}  // namespace cuda

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_CUDA_BACKEND_H_
