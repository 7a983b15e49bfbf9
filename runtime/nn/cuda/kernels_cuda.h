// Raw CUDA launchers for the reference layers' element-wise and per-row ops.
//
// Compiled by nvcc (kernels.cu) only under --config=cuda. Each launcher
// enqueues one kernel on `stream` (a cudaStream_t, passed as void* so this
// header needs no CUDA headers) and returns the cudaError_t of the launch as
// an int (0 = success); it returns when the work is enqueued, not when it is
// done. Pointers are device pointers; sizes and layouts are those of the CPU
// kernels in runtime/ops/cpu/kernels.h, whose per-element arithmetic
// (runtime/ops/math.h) these kernels share. gpu_ops.h wraps them in Status.
#ifndef SHARDKIT_RUNTIME_NN_CUDA_KERNELS_CUDA_H_
#define SHARDKIT_RUNTIME_NN_CUDA_KERNELS_CUDA_H_

#include <cstdint>

namespace sk {
namespace cuda_kernels {

int AddInPlace(float* x, const float* y, int64_t n, void* stream);
int AddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols, void* stream);
int BiasGradRows(const float* dy, int64_t rows, int64_t cols, float* dbias, void* stream);
int GeluForward(const float* x, int64_t n, float* y, void* stream);
int GeluBackward(const float* x, const float* dy, int64_t n, float* dx, void* stream);
int LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                     int64_t cols, float* y, float* mean, float* rstd, void* stream);
// dx += input gradient; dgamma, dbeta += parameter gradients.
int LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                      const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                      float* dbeta, void* stream);
// Row softmax in place; with causal, row r of each block of `block_rows`
// rows keeps only its first (r % block_rows) + 1 entries.
int SoftmaxRowsInPlace(float* x, int64_t rows, int64_t cols, bool causal, int64_t block_rows,
                       void* stream);
// dp = scale * p (dp - <p, dp>) per row, in place.
int SoftmaxBackwardRowsInPlace(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                               void* stream);
// row_loss[r] = CE of row r (0 for ignored rows, target -1).
int CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, void* stream);
int CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         float scale, float* dlogits, void* stream);
int EmbeddingForward(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                     float* out, void* stream);
int EmbeddingBackward(const int32_t* ids, const float* dout, int64_t count, int64_t dim,
                      float* dtable, void* stream);
int RoundToBF16InPlace(float* x, int64_t n, void* stream);

}  // namespace cuda_kernels
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_CUDA_KERNELS_CUDA_H_
