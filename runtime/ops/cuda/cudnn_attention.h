// cuDNN's fused scaled-dot-product attention (FlashAttention-style, memory
// linear in the sequence) through the cuDNN C++ frontend's graph API: the
// CUDA backend's flash_attention_fwd/bwd where SdpaSupports (sdpa_plan.h)
// accepts the call.
//
// - libcudnn.so.9 is opened with dlopen on first use (the frontend's
//   NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), from the library path: a
//   binary starts without cuDNN, and a machine without it gets an error
//   here, never an abort. SK_CUDNN_ATTENTION=0 turns the path off.
// - Graphs are built once per SdpaPlan::CacheKey() and cuDNN handle
//   (heuristics mode A, the first plan that builds) and cached for the
//   process.
// - One cudnnHandle_t per thread and device (as the cuBLAS handles), lent
//   from a per-device pool and given back when the thread exits
//   (handle_pool.h), so a thread that follows another (a local session's
//   next step) runs on the graphs already built; bound to ctx.stream before
//   each execution.
// - Workspace: `workspace` when it is large enough (the op layer's declared
//   bytes), else a temporary from ctx.alloc for the call, in stream order.
//
// Every function returns OK once the work is enqueued on ctx.stream, or an
// error saying why cuDNN did not take it (nothing was enqueued then): the
// caller falls back to the composed attention. Exceptions thrown by the
// frontend are caught and returned as errors.
//
// Thread safety: safe from several threads (the cache is locked).
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_CUDNN_ATTENTION_H_
#define SHARDKIT_RUNTIME_OPS_CUDA_CUDNN_ATTENTION_H_

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/backend.h"
#include "runtime/ops/cuda/sdpa_plan.h"

namespace sk::ops::cuda {

// OK when libcudnn.so.9 is loaded (it is opened on the first call) and the
// path is not turned off; else Unavailable with the reason. The cuDNN
// version loaded, as cudnnGetVersion() gives it, in *version (0 if none).
Status CudnnAvailable(int64_t* version = nullptr);

// cuDNN handles made so far for cuda:`device` (LibraryHandlesCreated).
int CudnnHandlesCreated(int device);

// plan: MakeSdpaForwardPlan; pointers to the first element of each operand.
Status CudnnSdpaForward(const OpContext& ctx, const SdpaPlan& plan, const void* q, const void* k,
                        const void* v, void* out, float* lse);

// plan: MakeSdpaBackwardPlan.
Status CudnnSdpaBackward(const OpContext& ctx, const SdpaPlan& plan, const void* q, const void* k,
                         const void* v, const void* out, const void* dout, const float* lse,
                         void* dq, void* dk, void* dv, const Tensor& workspace);

}  // namespace sk::ops::cuda

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_CUDNN_ATTENTION_H_
