// CUDA kernels of runtime/nn. Simple mappings (one thread per element, or per
// row for the row ops) around the SK_HOST_DEVICE arithmetic of math.h, so a
// host test of the CPU kernels covers the same arithmetic. They are correct
// first; per-row kernels with one thread per row are not tuned for speed.
#include <cuda_runtime.h>

#include "runtime/core/dtype.h"
#include "runtime/nn/cuda/kernels_cuda.h"
#include "runtime/ops/math.h"

namespace sk {
namespace cuda_kernels {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }
cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }
int Launched() { return static_cast<int>(cudaGetLastError()); }

__global__ void AddKernel(float* x, const float* y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void AddBiasKernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * cols) y[i] += bias[i % cols];
}

__global__ void BiasGradKernel(const float* dy, int64_t rows, int64_t cols, float* dbias) {
  int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (int64_t r = 0; r < rows; ++r) s += dy[r * cols + j];
  dbias[j] += s;
}

__global__ void GeluKernel(const float* x, int64_t n, float* y) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = nn_math::GeluTanh(x[i]);
}

__global__ void GeluGradKernel(const float* x, const float* dy, int64_t n, float* dx) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dx[i] = dy[i] * nn_math::GeluTanhGrad(x[i]);
}

__global__ void LayerNormKernel(const float* x, const float* gamma, const float* beta, int64_t rows,
                                int64_t cols, float* y, float* mean, float* rstd) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r < rows) {
    nn_math::LayerNormRowForward(x + r * cols, gamma, beta, cols, y + r * cols, mean + r, rstd + r);
  }
}

// Input gradient per row; the parameter gradients (sums over rows) are a
// separate per-column kernel so that no two threads write one element.
__global__ void LayerNormGradRowsKernel(const float* x, const float* gamma, const float* dy,
                                        const float* mean, const float* rstd, int64_t rows,
                                        int64_t cols, float* dx) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r < rows) {
    nn_math::LayerNormRowBackward(x + r * cols, gamma, dy + r * cols, mean[r], rstd[r], cols,
                                  dx + r * cols, nullptr, nullptr);
  }
}

__global__ void LayerNormGradParamsKernel(const float* x, const float* dy, const float* mean,
                                          const float* rstd, int64_t rows, int64_t cols,
                                          float* dgamma, float* dbeta) {
  int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  float dg = 0.0f, db = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    float g = dy[r * cols + j];
    dg += g * (x[r * cols + j] - mean[r]) * rstd[r];
    db += g;
  }
  dgamma[j] += dg;
  dbeta[j] += db;
}

__global__ void SoftmaxKernel(float* x, int64_t rows, int64_t cols, bool causal, int64_t block_rows) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r < rows) {
    int64_t valid = causal ? (r % block_rows) + 1 : cols;
    nn_math::SoftmaxRowInPlace(x + r * cols, cols, valid);
  }
}

__global__ void SoftmaxGradKernel(const float* p, float* dp, int64_t rows, int64_t cols, float scale) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r < rows) nn_math::SoftmaxRowBackwardInPlace(p + r * cols, dp + r * cols, cols, scale);
}

__global__ void CrossEntropyKernel(const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab, float* row_loss) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  row_loss[r] = targets[r] < 0 ? 0.0f : nn_math::CrossEntropyRow(logits + r * vocab, vocab, targets[r]);
}

__global__ void CrossEntropyGradKernel(const float* logits, const int32_t* targets, int64_t rows,
                                       int64_t vocab, float scale, float* dlogits) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  if (targets[r] < 0) {
    for (int64_t j = 0; j < vocab; ++j) dlogits[r * vocab + j] = 0.0f;
    return;
  }
  nn_math::CrossEntropyRowBackward(logits + r * vocab, vocab, targets[r], scale, dlogits + r * vocab);
}

__global__ void EmbeddingKernel(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                                float* out) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count * dim) out[i] = table[static_cast<int64_t>(ids[i / dim]) * dim + i % dim];
}

__global__ void EmbeddingGradKernel(const int32_t* ids, const float* dout, int64_t count,
                                    int64_t dim, float* dtable) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count * dim) atomicAdd(dtable + static_cast<int64_t>(ids[i / dim]) * dim + i % dim, dout[i]);
}

__global__ void RoundBF16Kernel(float* x, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = BF16ToFloat(FloatToBF16(x[i]));
}

}  // namespace

int AddInPlace(float* x, const float* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  AddKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, y, n);
  return Launched();
}

int AddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols, void* stream) {
  if (rows * cols == 0) return 0;
  AddBiasKernel<<<Blocks(rows * cols), kThreads, 0, S(stream)>>>(y, bias, rows, cols);
  return Launched();
}

int BiasGradRows(const float* dy, int64_t rows, int64_t cols, float* dbias, void* stream) {
  if (cols == 0) return 0;
  BiasGradKernel<<<Blocks(cols), kThreads, 0, S(stream)>>>(dy, rows, cols, dbias);
  return Launched();
}

int GeluForward(const float* x, int64_t n, float* y, void* stream) {
  if (n == 0) return 0;
  GeluKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, n, y);
  return Launched();
}

int GeluBackward(const float* x, const float* dy, int64_t n, float* dx, void* stream) {
  if (n == 0) return 0;
  GeluGradKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, dy, n, dx);
  return Launched();
}

int LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                     int64_t cols, float* y, float* mean, float* rstd, void* stream) {
  if (rows == 0) return 0;
  LayerNormKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(x, gamma, beta, rows, cols, y, mean, rstd);
  return Launched();
}

int LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                      const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                      float* dbeta, void* stream) {
  if (rows == 0) return 0;
  LayerNormGradRowsKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(x, gamma, dy, mean, rstd, rows,
                                                                    cols, dx);
  int err = Launched();
  if (err != 0) return err;
  LayerNormGradParamsKernel<<<Blocks(cols), kThreads, 0, S(stream)>>>(x, dy, mean, rstd, rows, cols,
                                                                      dgamma, dbeta);
  return Launched();
}

int SoftmaxRowsInPlace(float* x, int64_t rows, int64_t cols, bool causal, int64_t block_rows,
                       void* stream) {
  if (rows == 0) return 0;
  SoftmaxKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(x, rows, cols, causal,
                                                          block_rows > 0 ? block_rows : 1);
  return Launched();
}

int SoftmaxBackwardRowsInPlace(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                               void* stream) {
  if (rows == 0) return 0;
  SoftmaxGradKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(p, dp, rows, cols, scale);
  return Launched();
}

int CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, void* stream) {
  if (rows == 0) return 0;
  CrossEntropyKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(logits, targets, rows, vocab, row_loss);
  return Launched();
}

int CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         float scale, float* dlogits, void* stream) {
  if (rows == 0) return 0;
  CrossEntropyGradKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(logits, targets, rows, vocab,
                                                                   scale, dlogits);
  return Launched();
}

int EmbeddingForward(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                     float* out, void* stream) {
  if (count * dim == 0) return 0;
  EmbeddingKernel<<<Blocks(count * dim), kThreads, 0, S(stream)>>>(table, ids, count, dim, out);
  return Launched();
}

int EmbeddingBackward(const int32_t* ids, const float* dout, int64_t count, int64_t dim,
                      float* dtable, void* stream) {
  if (count * dim == 0) return 0;
  EmbeddingGradKernel<<<Blocks(count * dim), kThreads, 0, S(stream)>>>(ids, dout, count, dim, dtable);
  return Launched();
}

int RoundToBF16InPlace(float* x, int64_t n, void* stream) {
  if (n == 0) return 0;
  RoundBF16Kernel<<<Blocks(n), kThreads, 0, S(stream)>>>(x, n);
  return Launched();
}

}  // namespace cuda_kernels
}  // namespace sk
