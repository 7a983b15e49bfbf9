// The optimizer step's kernels of the CUDA backend (kernels.h): the
// grad-norm reductions (SumOfSquares, MaxAbs), SGD and Adam/AdamW. Shared
// helpers: kernels_common.cuh.
#include "runtime/ops/cuda/kernels_common.cuh"

namespace sk::ops::cuda {
namespace {

struct AdamOp {  // param, grad, exp_avg, exp_avg_sq -> param, exp_avg, exp_avg_sq (f32)
  AdamHyper h;
  __device__ void operator()(const float (&x)[4], float (&y)[3]) const {
    float param = x[0], exp_avg = x[2], exp_avg_sq = x[3];
    sk::AdamUpdate(param, x[1], exp_avg, exp_avg_sq, h);
    y[0] = param;
    y[1] = exp_avg;
    y[2] = exp_avg_sq;
  }
};

// Grid-stride partials: thread t of block b sums (or maxes) elements
// i = b*kThreads + t + j*stride, j = 0, 1, ... in that order, where stride
// is every thread of the grid; the block then combines its threads' values
// in a fixed tree. Each iteration issues kReduceUnroll loads before it
// accumulates them (in index order): with one load in flight per thread the
// 256 x 256 grid this replaced read 0.5-0.7 TB/s on an H200 (gpt-1.3b's
// sum_of_squares, 8.5 ms of a 316 ms step), far from the card's memory
// bandwidth; the per-thread order, hence the result, depends only on n.
constexpr int kReduceUnroll = 4;

template <bool kSquares>
__device__ __forceinline__ double ReduceStep(double acc, double v) {
  return kSquares ? acc + v * v : fmax(acc, fabs(v));
}

// Two partial results combined: their sum (SumOfSquares) or their maximum
// (MaxAbs).
template <bool kSquares>
__device__ __forceinline__ double ReduceCombine(double a, double b) {
  return kSquares ? a + b : fmax(a, b);
}

// Combines every thread's v in a tree over `shared` (blockDim.x doubles, a
// power of two); the block's result is left in shared[0]. Every thread of
// the block calls it (it has barriers).
template <bool kSquares>
__device__ __forceinline__ void BlockReduce(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      shared[threadIdx.x] = ReduceCombine<kSquares>(shared[threadIdx.x], shared[threadIdx.x + s]);
    }
    __syncthreads();
  }
}

template <bool kSquares>
__global__ void ReducePartialsKernel(const void* x, DType t, int64_t n, double* partials) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = Index();
  for (; i + (kReduceUnroll - 1) * stride < n; i += kReduceUnroll * stride) {
    float v[kReduceUnroll];
#pragma unroll
    for (int u = 0; u < kReduceUnroll; ++u) v[u] = LoadF(x, t, i + u * stride);
#pragma unroll
    for (int u = 0; u < kReduceUnroll; ++u) acc = ReduceStep<kSquares>(acc, v[u]);
  }
  for (; i < n; i += stride) acc = ReduceStep<kSquares>(acc, LoadF(x, t, i));
  BlockReduce<kSquares>(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// One block: thread t combines partials t, t + kThreads, ... in order, the
// block's tree combines the threads, and thread 0 folds the result into acc
// (a single thread walking kReduceBlocks partials was a serial chain of
// loads per call).
template <bool kSquares>
__global__ void ReduceFinishKernel(const double* partials, int blocks, double* acc) {
  __shared__ double shared[kThreads];
  double a = 0.0;  // partials are sums of squares or |x|: never below 0
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    a = ReduceCombine<kSquares>(a, partials[b]);
  }
  BlockReduce<kSquares>(a, shared);
  if (threadIdx.x == 0) *acc = ReduceCombine<kSquares>(*acc, shared[0]);
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

namespace {
// SumOfSquares (kSquares) and MaxAbs: the per-block partials, then one
// block folds them into acc.
template <bool kSquares>
int LaunchReduction(const void* x, DType dt, int64_t n, double* partials, double* acc,
                    void* stream) {
  if (n <= 0) return 0;
  ReducePartialsKernel<kSquares><<<kReduceBlocks, kThreads, 0, S(stream)>>>(x, dt, n, partials);
  int err = Launched();
  if (err != 0) return err;
  ReduceFinishKernel<kSquares><<<1, kThreads, 0, S(stream)>>>(partials, kReduceBlocks, acc);
  return Launched();
}
}  // namespace
int SumOfSquares(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream) {
  return LaunchReduction<true>(x, dt, n, partials, acc, stream);
}
int MaxAbs(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream) {
  return LaunchReduction<false>(x, dt, n, partials, acc, stream);
}
int SgdUpdate(const SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n,
              void* stream) {
  SK_LAUNCH(n, SgdKernel, h, param, grad, h.momentum != 0.0f ? momentum : nullptr, n);
}
int AdamUpdate(const AdamHyper& h, float* param, const float* grad, float* exp_avg,
               float* exp_avg_sq, int64_t n, void* stream) {
  if (n <= 0) return 0;
  const DType f = DType::kF32;
  if (int err = TryVecMap<4, 3>(f, {CBuf{param, f}, CBuf{grad, f}, CBuf{exp_avg, f}, CBuf{exp_avg_sq, f}},
                                {Buf{param, f}, Buf{exp_avg, f}, Buf{exp_avg_sq, f}}, n, AdamOp{h},
                                S(stream));
      err >= 0) {
    return err;  // every flat shard's state is 16-byte aligned: the usual path
  }
  SK_LAUNCH(n, AdamKernel, h, param, grad, exp_avg, exp_avg_sq, n);
}

}  // namespace sk::ops::cuda
