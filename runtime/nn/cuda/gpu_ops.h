// GPU versions of the reference layers' ops, as Status-returning calls.
//
// Built for real only under --config=cuda (cuBLAS GEMM plus the kernels of
// kernels.cu); without it every call returns Unavailable saying so, and
// CudaDeviceCount() returns 0, so code and tests take their CPU-only path.
// The CPU library //runtime/nn never depends on this one.
//
// All pointers are device pointers; `stream` is a cudaStream_t as void*
// (nullptr = the default stream). Calls return once the work is enqueued.
// Thread safety: calls may be made from several threads; the cuBLAS handle
// is per thread.
#ifndef SHARDKIT_RUNTIME_NN_CUDA_GPU_OPS_H_
#define SHARDKIT_RUNTIME_NN_CUDA_GPU_OPS_H_

#include <cstdint>
#include <string>

#include "runtime/core/status.h"

namespace sk {
namespace gpu {

// Number of visible CUDA devices; 0 when there are none, the driver is
// missing, or shardkit was built without CUDA. *reason (if given) says why
// when the answer is 0.
int CudaDeviceCount(std::string* reason = nullptr);

// C = alpha op(A) op(B) + beta C, row-major, as sk::Gemm on the CPU, via cublasSgemm.
Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc, void* stream = nullptr);

Status GeluForward(const float* x, int64_t n, float* y, void* stream = nullptr);
Status GeluBackward(const float* x, const float* dy, int64_t n, float* dx, void* stream = nullptr);
Status LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                        int64_t cols, float* y, float* mean, float* rstd, void* stream = nullptr);
Status LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                         const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                         float* dbeta, void* stream = nullptr);
Status SoftmaxRowsInPlace(float* x, int64_t rows, int64_t cols, void* stream = nullptr);
Status CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab, float* row_loss, void* stream = nullptr);
Status CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows,
                            int64_t vocab, float scale, float* dlogits, void* stream = nullptr);
Status AddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols, void* stream = nullptr);

// Host <-> device copies and memory for tests and tools (synchronous).
StatusOr<void*> Malloc(size_t bytes);
void Free(void* p);
Status CopyToDevice(void* dst, const void* src, size_t bytes);
Status CopyToHost(void* dst, const void* src, size_t bytes);
Status Synchronize();

}  // namespace gpu
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_CUDA_GPU_OPS_H_
