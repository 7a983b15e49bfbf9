// CUDA kernels of the op layer. Simple mappings (one thread per element, per
// row or per column) around the SK_HOST_DEVICE arithmetic the CPU backend
// runs, so host tests of that arithmetic cover what the GPU computes. Row and
// column kernels keep the CPU's summation order where the op states one
// (bias and LayerNorm parameter gradients, embedding backward, the loss), so
// those results are deterministic. Correct first: the per-row kernels
// (LayerNorm, softmax, cross-entropy) use one thread per row and are not
// tuned for speed; GEMMs, where the time goes, are cuBLAS's.
#include <cuda_runtime.h>

#include "runtime/core/dtype.h"
#include "runtime/ops/cuda/kernels.h"
#include "runtime/ops/init.h"
#include "runtime/ops/math.h"
#include "runtime/ops/update_rules.h"

namespace sk::ops::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }
cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }
int Launched() { return static_cast<int>(cudaGetLastError()); }

__device__ __forceinline__ int64_t Index() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}

__device__ __forceinline__ float LoadF(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return BF16ToFloat(static_cast<const BF16*>(p)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const F16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void StoreF(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16: static_cast<BF16*>(p)[i] = FloatToBF16(v); break;
    case DType::kF16: static_cast<F16*>(p)[i] = FloatToF16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

__global__ void CastKernel(const void* src, DType st, void* dst, DType dt, int64_t n) {
  int64_t i = Index();
  if (i < n) StoreF(dst, dt, i, LoadF(src, st, i));
}

__global__ void RoundKernel(float* x, int64_t n, DType t) {
  int64_t i = Index();
  if (i >= n) return;
  if (t == DType::kBF16) x[i] = BF16ToFloat(FloatToBF16(x[i]));
  if (t == DType::kF16) x[i] = F16ToFloat(FloatToF16(x[i]));
}

__global__ void ScaleKernel(void* x, DType t, int64_t n, float alpha) {
  int64_t i = Index();
  if (i < n) StoreF(x, t, i, LoadF(x, t, i) * alpha);
}

__global__ void AxpyKernel(float alpha, const void* x, DType xt, void* y, DType yt, int64_t n) {
  int64_t i = Index();
  if (i >= n) return;
  float xv = LoadF(x, xt, i);
  StoreF(y, yt, i, LoadF(y, yt, i) + (alpha == 1.0f ? xv : alpha * xv));
}

__global__ void FillKernel(void* x, DType t, int64_t n, float value) {
  int64_t i = Index();
  if (i < n) StoreF(x, t, i, value);
}

__global__ void FillMatrixKernel(float* x, int64_t rows, int64_t cols, int64_t ld, float value) {
  int64_t i = Index();
  if (i < rows * cols) x[(i / cols) * ld + i % cols] = value;
}

__global__ void InitKernel(InitKind kind, float a, float b, uint64_t seed, uint64_t param_id,
                           int64_t begin, void* out, DType t, int64_t n) {
  int64_t i = Index();
  if (i < n) {
    StoreF(out, t, i, InitValueAt(kind, a, b, seed, param_id, static_cast<uint64_t>(begin + i)));
  }
}

__global__ void BroadcastRowsKernel(const float* src, int64_t cols, float* dst, int64_t rows) {
  int64_t i = Index();
  if (i < rows * cols) dst[i] = src[i % cols];
}

__global__ void BiasAddKernel(const float* bias, int64_t cols, float* y, int64_t rows) {
  int64_t i = Index();
  if (i < rows * cols) y[i] += bias[i % cols];
}

__global__ void BiasGradKernel(const float* dy, int64_t rows, int64_t cols, float* dbias) {
  int64_t j = Index();
  if (j >= cols) return;
  float acc = dbias[j];
  for (int64_t r = 0; r < rows; ++r) acc += dy[r * cols + j];
  dbias[j] = acc;
}

__global__ void GeluKernel(const float* x, int64_t n, float* y) {
  int64_t i = Index();
  if (i < n) y[i] = nn_math::GeluTanh(x[i]);
}

__global__ void GeluGradKernel(const float* x, const float* dy, int64_t n, float* dx) {
  int64_t i = Index();
  if (i < n) dx[i] = dy[i] * nn_math::GeluTanhGrad(x[i]);
}

__global__ void LayerNormKernel(const float* x, const float* gamma, const float* beta,
                                int64_t rows, int64_t cols, float* y, float* mean, float* rstd) {
  int64_t r = Index();
  if (r < rows) {
    nn_math::LayerNormRowForward(x + r * cols, gamma, beta, cols, y + r * cols, mean + r,
                                 rstd + r);
  }
}

// The input gradient per row; the parameter gradients (sums over rows) are a
// per-column kernel so that no two threads write one element.
__global__ void LayerNormGradRowsKernel(const float* x, const float* gamma, const float* dy,
                                        const float* mean, const float* rstd, int64_t rows,
                                        int64_t cols, float* dx) {
  int64_t r = Index();
  if (r < rows) {
    nn_math::LayerNormRowBackward(x + r * cols, gamma, dy + r * cols, mean[r], rstd[r], cols,
                                  dx + r * cols, nullptr, nullptr);
  }
}

__global__ void LayerNormGradParamsKernel(const float* x, const float* dy, const float* mean,
                                          const float* rstd, int64_t rows, int64_t cols,
                                          float* dgamma, float* dbeta) {
  int64_t j = Index();
  if (j >= cols) return;
  float dg = dgamma[j], db = dbeta[j];
  for (int64_t r = 0; r < rows; ++r) {
    float g = dy[r * cols + j];
    dg += g * (x[r * cols + j] - mean[r]) * rstd[r];
    db += g;
  }
  dgamma[j] = dg;
  dbeta[j] = db;
}

__global__ void SoftmaxKernel(float* x, int64_t rows, int64_t cols, bool causal,
                              int64_t block_rows) {
  int64_t r = Index();
  if (r < rows) nn_math::SoftmaxRowInPlace(x + r * cols, cols, causal ? (r % block_rows) + 1 : cols);
}

__global__ void SoftmaxGradKernel(const float* p, float* dp, int64_t rows, int64_t cols,
                                  float scale) {
  int64_t r = Index();
  if (r < rows) nn_math::SoftmaxRowBackwardInPlace(p + r * cols, dp + r * cols, cols, scale);
}

__global__ void EmbeddingKernel(const float* table, const int32_t* ids, int64_t count,
                                int64_t dim, float* out) {
  int64_t i = Index();
  if (i < count * dim) out[i] = table[static_cast<int64_t>(ids[i / dim]) * dim + i % dim];
}

__global__ void EmbeddingGradKernel(const int32_t* ids, const float* dout, int64_t count,
                                    int64_t dim, float* dtable) {
  int64_t j = Index();
  if (j >= dim) return;
  for (int64_t i = 0; i < count; ++i) dtable[static_cast<int64_t>(ids[i]) * dim + j] += dout[i * dim + j];
}

__global__ void CrossEntropyRowsKernel(const float* logits, const int32_t* targets, int64_t rows,
                                       int64_t vocab, float* row_loss) {
  int64_t r = Index();
  if (r >= rows) return;
  row_loss[r] = targets[r] == -1 ? 0.0f : nn_math::CrossEntropyRow(logits + r * vocab, vocab, targets[r]);
}

// One thread: the mean in f64 in row order, as the CPU sums it.
__global__ void CrossEntropyMeanKernel(const float* row_loss, const int32_t* targets,
                                       int64_t rows, float* loss) {
  double sum = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == -1) continue;
    sum += row_loss[r];
    ++counted;
  }
  *loss = counted == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(counted));
}

__global__ void CountTargetsKernel(const int32_t* targets, int64_t rows, int64_t* count) {
  int64_t c = 0;
  for (int64_t r = 0; r < rows; ++r) c += targets[r] != -1;
  *count = c;
}

__global__ void CrossEntropyGradKernel(const float* logits, const int32_t* targets, int64_t rows,
                                       int64_t vocab, const int64_t* count, float* dlogits) {
  int64_t r = Index();
  if (r >= rows) return;
  if (targets[r] == -1) {
    for (int64_t j = 0; j < vocab; ++j) dlogits[r * vocab + j] = 0.0f;
    return;
  }
  const float scale = *count == 0 ? 0.0f : 1.0f / static_cast<float>(*count);
  nn_math::CrossEntropyRowBackward(logits + r * vocab, vocab, targets[r], scale,
                                   dlogits + r * vocab);
}

// Grid-stride partials: block b reduces elements b*kThreads + t + k*stride.
template <bool kSquares>
__global__ void ReducePartialsKernel(const void* x, DType t, int64_t n, double* partials) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = Index(); i < n; i += stride) {
    double v = LoadF(x, t, i);
    acc = kSquares ? acc + v * v : fmax(acc, fabs(v));
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      shared[threadIdx.x] = kSquares ? shared[threadIdx.x] + shared[threadIdx.x + s]
                                     : fmax(shared[threadIdx.x], shared[threadIdx.x + s]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

template <bool kSquares>
__global__ void ReduceFinishKernel(const double* partials, int blocks, double* acc) {
  double a = *acc;
  for (int b = 0; b < blocks; ++b) a = kSquares ? a + partials[b] : fmax(a, partials[b]);
  *acc = a;
}

__global__ void SgdKernel(SgdHyper h, float* param, const float* grad, float* momentum,
                          int64_t n) {
  int64_t i = Index();
  if (i >= n) return;
  float scratch = 0.0f;
  sk::SgdUpdate(param[i], grad[i], momentum != nullptr ? momentum[i] : scratch, h);
}

__global__ void AdamKernel(AdamHyper h, float* param, const float* grad, float* exp_avg,
                           float* exp_avg_sq, int64_t n) {
  int64_t i = Index();
  if (i < n) sk::AdamUpdate(param[i], grad[i], exp_avg[i], exp_avg_sq[i], h);
}

}  // namespace

#define SK_LAUNCH(n, kernel, ...)                              \
  do {                                                         \
    if ((n) <= 0) return 0;                                    \
    kernel<<<Blocks(n), kThreads, 0, S(stream)>>>(__VA_ARGS__); \
    return Launched();                                         \
  } while (0)

int Cast(const void* src, DType st, void* dst, DType dt, int64_t n, void* stream) {
  if (st == dt) {
    if (n <= 0) return 0;
    return static_cast<int>(
        cudaMemcpyAsync(dst, src, n * DTypeSize(st), cudaMemcpyDeviceToDevice, S(stream)));
  }
  SK_LAUNCH(n, CastKernel, src, st, dst, dt, n);
}
int RoundToDType(float* x, int64_t n, DType t, void* stream) {
  if (t == DType::kF32) return 0;
  SK_LAUNCH(n, RoundKernel, x, n, t);
}
int Scale(void* x, DType dt, int64_t n, float alpha, void* stream) {
  SK_LAUNCH(n, ScaleKernel, x, dt, n, alpha);
}
int Axpy(float alpha, const void* x, DType xt, void* y, DType yt, int64_t n, void* stream) {
  SK_LAUNCH(n, AxpyKernel, alpha, x, xt, y, yt, n);
}
int Fill(void* x, DType dt, int64_t n, float value, void* stream) {
  SK_LAUNCH(n, FillKernel, x, dt, n, value);
}
int FillMatrix(float* x, int64_t rows, int64_t cols, int64_t ld, float value, void* stream) {
  SK_LAUNCH(rows * cols, FillMatrixKernel, x, rows, cols, ld, value);
}
int InitPhilox(const Initializer& init, uint64_t seed, uint64_t param_id, int64_t begin, void* out,
               DType dt, int64_t n, void* stream) {
  SK_LAUNCH(n, InitKernel, init.kind, init.a, init.b, seed, param_id, begin, out, dt, n);
}
int BroadcastRows(const float* src, int64_t cols, float* dst, int64_t rows, void* stream) {
  SK_LAUNCH(rows * cols, BroadcastRowsKernel, src, cols, dst, rows);
}
int BiasAdd(const float* bias, int64_t cols, float* y, int64_t rows, void* stream) {
  SK_LAUNCH(rows * cols, BiasAddKernel, bias, cols, y, rows);
}
int BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias, void* stream) {
  SK_LAUNCH(cols, BiasGradKernel, dy, rows, cols, dbias);
}
int GeluForward(const float* x, int64_t n, float* y, void* stream) {
  SK_LAUNCH(n, GeluKernel, x, n, y);
}
int GeluBackward(const float* x, const float* dy, int64_t n, float* dx, void* stream) {
  SK_LAUNCH(n, GeluGradKernel, x, dy, n, dx);
}
int LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                     int64_t cols, float* y, float* mean, float* rstd, void* stream) {
  SK_LAUNCH(rows, LayerNormKernel, x, gamma, beta, rows, cols, y, mean, rstd);
}
int LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                      const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                      float* dbeta, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  LayerNormGradRowsKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(x, gamma, dy, mean, rstd,
                                                                    rows, cols, dx);
  int err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(cols, LayerNormGradParamsKernel, x, dy, mean, rstd, rows, cols, dgamma, dbeta);
}
int SoftmaxRows(float* x, int64_t rows, int64_t cols, bool causal, int64_t block_rows,
                void* stream) {
  SK_LAUNCH(rows, SoftmaxKernel, x, rows, cols, causal, block_rows > 0 ? block_rows : 1);
}
int SoftmaxBackwardRows(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                        void* stream) {
  SK_LAUNCH(rows, SoftmaxGradKernel, p, dp, rows, cols, scale);
}
int EmbeddingForward(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                     float* out, void* stream) {
  SK_LAUNCH(count * dim, EmbeddingKernel, table, ids, count, dim, out);
}
int EmbeddingBackward(const int32_t* ids, const float* dout, int64_t count, int64_t dim,
                      float* dtable, void* stream) {
  if (count <= 0) return 0;
  SK_LAUNCH(dim, EmbeddingGradKernel, ids, dout, count, dim, dtable);
}
int CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, float* loss, void* stream) {
  if (rows > 0) {
    CrossEntropyRowsKernel<<<Blocks(rows), kThreads, 0, S(stream)>>>(logits, targets, rows, vocab,
                                                                     row_loss);
    int err = Launched();
    if (err != 0) return err;
  }
  CrossEntropyMeanKernel<<<1, 1, 0, S(stream)>>>(row_loss, targets, rows, loss);
  return Launched();
}
int CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows,
                         int64_t vocab, float* dlogits, int64_t* count_scratch, void* stream) {
  if (rows <= 0) return 0;
  CountTargetsKernel<<<1, 1, 0, S(stream)>>>(targets, rows, count_scratch);
  int err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(rows, CrossEntropyGradKernel, logits, targets, rows, vocab, count_scratch, dlogits);
}
int SumOfSquares(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream) {
  if (n <= 0) return 0;
  ReducePartialsKernel<true><<<kReduceBlocks, kThreads, 0, S(stream)>>>(x, dt, n, partials);
  int err = Launched();
  if (err != 0) return err;
  ReduceFinishKernel<true><<<1, 1, 0, S(stream)>>>(partials, kReduceBlocks, acc);
  return Launched();
}
int MaxAbs(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream) {
  if (n <= 0) return 0;
  ReducePartialsKernel<false><<<kReduceBlocks, kThreads, 0, S(stream)>>>(x, dt, n, partials);
  int err = Launched();
  if (err != 0) return err;
  ReduceFinishKernel<false><<<1, 1, 0, S(stream)>>>(partials, kReduceBlocks, acc);
  return Launched();
}
int SgdUpdate(const SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n,
              void* stream) {
  SK_LAUNCH(n, SgdKernel, h, param, grad, h.momentum != 0.0f ? momentum : nullptr, n);
}
int AdamUpdate(const AdamHyper& h, float* param, const float* grad, float* exp_avg,
               float* exp_avg_sq, int64_t n, void* stream) {
  SK_LAUNCH(n, AdamKernel, h, param, grad, exp_avg, exp_avg_sq, n);
}

}  // namespace sk::ops::cuda
