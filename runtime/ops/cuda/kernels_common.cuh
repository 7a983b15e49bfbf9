// The CUDA kernels of the op layer, around the SK_HOST_DEVICE arithmetic the
// CPU backend runs (runtime/ops/math.h's per-element helpers), so host tests
// of that arithmetic cover what the GPU computes per element. Elementwise
// ops: eight elements per thread in 16-byte words where every operand shares
// one dtype and is aligned (VecMapKernel; GELU, SwiGLU, Axpy, BroadcastRows,
// Adam; Axpy of two aligned dtypes too), else one thread per element.
// Per-row ops (LayerNorm, softmax, cross-entropy): a warp or a block per row
// with fixed-order tree reductions. Per-column sums (bias and LayerNorm
// parameter gradients): two levels, column tiles by row chunks, then the
// chunks in order. Embedding backward: a stable sort of the ids, then one
// block per distinct id adding its tokens in position order. Every reduction
// has a fixed order, so every result is deterministic (same inputs, same bits
// on every run); only the embedding gradient keeps the CPU's summation order.
// GEMMs are cuBLAS's.
//
// The launchers (kernels.h) live by op family, one .cu file each:
//   elementwise.cu    cast, scale, axpy, fill, init, bias, GELU, SwiGLU, RoPE
//   norms.cu          LayerNorm, RMSNorm, and the per-column sums of their
//                     parameter gradients and of the bias gradient
//   attention.cu      softmax rows and their gradient, log-sum-exp, the
//                     batched GEMMs' pointer arrays, grouped-query repeats
//   embedding.cu      embedding forward, backward (CUB's radix sort)
//   cross_entropy.cu  row losses, their mean, the gradient
//   optimizer.cu      grad-norm reductions, SGD, Adam
// This header, private to them, holds what several share: launch helpers,
// typed loads and stores, the vectorised elementwise map and the per-row
// thread groups with their fixed-order reductions. Its definitions have
// internal linkage on purpose: nvcc compiles each .cu file as a whole
// program (no -rdc), so each file keeps its own copy of the kernels and
// device functions it instantiates, as when they were one file.
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_KERNELS_COMMON_CUH_
#define SHARDKIT_RUNTIME_OPS_CUDA_KERNELS_COMMON_CUH_

#include <cuda_runtime.h>

#include "runtime/core/dtype.h"
#include "runtime/ops/backend.h"
#include "runtime/ops/cuda/kernels.h"
#include "runtime/ops/init.h"
#include "runtime/ops/math.h"
#include "runtime/ops/update_rules.h"

namespace sk::ops::cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }
inline cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }
inline int Launched() { return static_cast<int>(cudaGetLastError()); }

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

// Typed loads and stores through f32 (core/dtype.h's conversions: round to
// nearest even, the CPU's bits).
__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(BF16 v) { return BF16ToFloat(v); }
__device__ __forceinline__ float ToF(F16 v) { return F16ToFloat(v); }
template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) { return v; }
template <>
__device__ __forceinline__ BF16 FromF<BF16>(float v) { return FloatToBF16(v); }
template <>
__device__ __forceinline__ F16 FromF<F16>(float v) { return FloatToF16(v); }

// ---- Vectorised elementwise maps ------------------------------------------
//
// The elementwise ops whose operands all share one dtype T and are 16-byte
// aligned (the model's activations and gradients: every tensor starts on a
// 256-byte boundary) run VecMapKernel: kVec elements per thread moved as
// 16-byte words (one per operand for 16-bit data, two for f32), as the cast
// above. The one-thread-per-element kernels below read 2 bytes per load in
// bf16 and reached 1.2 TB/s on an H200 (27 Nov breakdown: gelu_fwd, gelu_bwd)
// where the vectorised cast reached 3.9. Each element goes through the same
// functor as the generic kernel's element (f32 arithmetic on exact f32
// loads, one rounding per 16-bit store; nvcc runs with -fmad=false), so the
// path taken does not change a bit. Anything else (mixed dtypes, an
// unaligned view) runs the generic kernel.
constexpr int kVec = 8;

// kVec elements of p (16-byte aligned) as f32.
template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&v)[kVec]) {
  alignas(16) T raw[kVec];
  constexpr int kWords = kVec * sizeof(T) / sizeof(uint4);
#pragma unroll
  for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(raw)[w] = reinterpret_cast<const uint4*>(p)[w];
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] = ToF(raw[e]);
}

// v rounded to T (once per element) into kVec elements of p (16-byte aligned).
template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[kVec]) {
  alignas(16) T raw[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) raw[e] = FromF<T>(v[e]);
  constexpr int kWords = kVec * sizeof(T) / sizeof(uint4);
#pragma unroll
  for (int w = 0; w < kWords; ++w) reinterpret_cast<uint4*>(p)[w] = reinterpret_cast<const uint4*>(raw)[w];
}

// kIns input and kOuts output pointers of one element type.
template <typename T, int kIns, int kOuts>
struct VecOperands {
  const T* in[kIns];
  T* out[kOuts];
};

// out[o][i] = f(in[.][i])[o] for i < n: f(const float (&)[kIns], float (&)[kOuts]).
// An output may be an input (each thread reads its elements before it
// writes them).
template <typename T, int kIns, int kOuts, typename F>
__global__ void VecMapKernel(VecOperands<T, kIns, kOuts> a, int64_t n, F f) {
  const int64_t base = Index() * kVec;
  if (base >= n) return;
  if (base + kVec <= n) {
    float in[kIns][kVec], out[kOuts][kVec];
#pragma unroll
    for (int k = 0; k < kIns; ++k) LoadVec(a.in[k] + base, in[k]);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      float x[kIns], y[kOuts];
#pragma unroll
      for (int k = 0; k < kIns; ++k) x[k] = in[k][e];
      f(x, y);
#pragma unroll
      for (int o = 0; o < kOuts; ++o) out[o][e] = y[o];
    }
#pragma unroll
    for (int o = 0; o < kOuts; ++o) StoreVec(a.out[o] + base, out[o]);
    return;
  }
  for (int64_t i = base; i < n; ++i) {  // the tail of n: fewer than kVec
    float x[kIns], y[kOuts];
#pragma unroll
    for (int k = 0; k < kIns; ++k) x[k] = ToF(a.in[k][i]);
    f(x, y);
#pragma unroll
    for (int o = 0; o < kOuts; ++o) a.out[o][i] = FromF<T>(y[o]);
  }
}

// Launches VecMapKernel when every operand has dtype t and a 16-byte
// aligned address; returns Launched(), or -1 without launching anything
// (the caller runs the generic kernel). n > 0.
template <int kIns, int kOuts, typename F>
int TryVecMap(DType t, const CBuf (&ins)[kIns], const Buf (&outs)[kOuts], int64_t n, F f,
              cudaStream_t stream) {
  for (const CBuf& b : ins) {
    if (b.dtype != t || reinterpret_cast<uintptr_t>(b.data) % 16 != 0) return -1;
  }
  for (const Buf& b : outs) {
    if (b.dtype != t || reinterpret_cast<uintptr_t>(b.data) % 16 != 0) return -1;
  }
  const unsigned blocks = Blocks((n + kVec - 1) / kVec);
  auto launch = [&](auto zero) {
    using T = decltype(zero);
    VecOperands<T, kIns, kOuts> a;
    for (int k = 0; k < kIns; ++k) a.in[k] = static_cast<const T*>(ins[k].data);
    for (int o = 0; o < kOuts; ++o) a.out[o] = static_cast<T*>(outs[o].data);
    VecMapKernel<T, kIns, kOuts, F><<<blocks, kThreads, 0, stream>>>(a, n, f);
  };
  switch (t) {
    case DType::kBF16: launch(BF16{}); break;
    case DType::kF16: launch(F16{}); break;
    case DType::kF32: launch(0.0f); break;
    default: return -1;
  }
  return Launched();
}

// ---- Per-row kernels -------------------------------------------------------
//
// A row is handled by a group of threads: one warp (WarpRows) when it has at
// most kWarpRowMaxCols columns, else one block of kThreads (BlockRows). Thread
// `Rank()` of the group owns the row's elements j = Rank() + k * kSize (the
// normalisation kernels hand out chunks of eight instead, below): it
// reads, writes and accumulates only those, sequentially in k (coalesced:
// neighbouring lanes touch neighbouring elements), so an in-place kernel
// (y = x, dlogits = logits) never reads an element another thread wrote.
// Row-wide sums and maxima then combine the per-thread values in a fixed tree
// (Reduce), and every thread of the group gets the same bits; so each kernel
// is deterministic: the same inputs and shape give the same bits on every run
// (not the CPU's, whose sums run in row order). Rows are visited by a
// grid-stride loop over at most kMaxRowBlocks blocks; the loop bounds are the
// same for every thread of a group, so the shuffles and __syncthreads() in
// Reduce are reached by the whole group.

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr unsigned kAllLanes = 0xffffffffu;
constexpr int64_t kWarpRowMaxCols = 1024;  // up to 32 elements per lane
constexpr int64_t kMaxRowBlocks = 1024;    // about one wave on an H100 (132 SMs x 8 blocks)

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
// b > a ? b : a, as the CPU's row max (a NaN is passed over; the row's sum
// of exponentials is NaN then anyway).
struct MaxOp {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

// Lane 0 combines the warp's 32 values in a fixed tree (lane i takes lane
// i + s for s = 16, 8, 4, 2, 1) and every lane gets lane 0's result.
template <typename Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
  for (int s = kWarpSize / 2; s > 0; s /= 2) v = op(v, __shfl_down_sync(kAllLanes, v, s));
  return __shfl_sync(kAllLanes, v, 0);
}

struct WarpRows {
  static constexpr int kSize = kWarpSize;
  static constexpr int kRowsPerBlock = kWarpsPerBlock;
  __device__ static int Rank() { return threadIdx.x % kWarpSize; }
  __device__ static int64_t FirstRow() {
    return blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  }
  __device__ static int64_t RowStride() { return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock; }
  template <typename Op>
  __device__ static float Reduce(float v, Op op, float* /*shared*/) {
    return WarpReduce(v, op);
  }
};

struct BlockRows {
  static constexpr int kSize = kThreads;
  static constexpr int kRowsPerBlock = 1;
  __device__ static int Rank() { return threadIdx.x; }
  __device__ static int64_t FirstRow() { return blockIdx.x; }
  __device__ static int64_t RowStride() { return gridDim.x; }
  // Each warp's tree, then warp 0's, 1's, ... results in order (shared:
  // kWarpsPerBlock floats). Ends with a barrier so that the next Reduce may
  // reuse `shared`.
  template <typename Op>
  __device__ static float Reduce(float v, Op op, float* shared) {
    v = WarpReduce(v, op);
    if (threadIdx.x % kWarpSize == 0) shared[threadIdx.x / kWarpSize] = v;
    __syncthreads();
    float r = shared[0];
    for (int w = 1; w < kWarpsPerBlock; ++w) r = op(r, shared[w]);
    __syncthreads();
    return r;
  }
};

// The maximum of the n elements of x (dtype t) from element `row` on, over
// group G: each thread takes its strided elements in order, then G::Reduce's
// fixed tree (the softmax and cross-entropy kernels' first pass).
template <typename G>
__device__ __forceinline__ float GroupRowMax(const void* x, DType t, int64_t row, int64_t n,
                                             float* shared) {
  float m = -INFINITY;
  for (int64_t j = G::Rank(); j < n; j += G::kSize) m = MaxOp()(m, LoadF(x, t, row + j));
  return G::Reduce(m, MaxOp(), shared);
}

// Calls fn(From{}, To{}) with the element types of the float dtypes a and b
// (f32 / BF16 / F16) and returns the launch's error.
template <typename Fn>
int LaunchTyped2(DType a, DType b, Fn fn) {
  auto with_b = [&](auto from) {
    switch (b) {
      case DType::kBF16: fn(from, BF16{}); break;
      case DType::kF16: fn(from, F16{}); break;
      default: fn(from, 0.0f); break;
    }
  };
  switch (a) {
    case DType::kBF16: with_b(BF16{}); break;
    case DType::kF16: with_b(F16{}); break;
    default: with_b(0.0f); break;
  }
  return Launched();
}

// Blocks of a row kernel over `rows` rows (a grid-stride loop visits the rest).
template <typename G>
unsigned RowBlocks(int64_t rows) {
  const int64_t blocks = (rows + G::kRowsPerBlock - 1) / G::kRowsPerBlock;
  return static_cast<unsigned>(blocks < kMaxRowBlocks ? blocks : kMaxRowBlocks);
}

}  // namespace
}  // namespace sk::ops::cuda

// Launches kernel over n > 0 elements, a thread each, on `stream` and returns
// the launch's error (0 without launching for n <= 0).
#define SK_LAUNCH(n, kernel, ...)                              \
  do {                                                         \
    if ((n) <= 0) return 0;                                    \
    kernel<<<Blocks(n), kThreads, 0, S(stream)>>>(__VA_ARGS__); \
    return Launched();                                         \
  } while (0)

// Enqueues kernel<WarpRows> (cols <= kWarpRowMaxCols) or kernel<BlockRows>
// over rows > 0 rows; the caller checks Launched().
#define SK_ENQUEUE_ROWS(rows, cols, kernel, ...)                                                \
  do {                                                                                         \
    if ((cols) > kWarpRowMaxCols) {                                                            \
      kernel<BlockRows><<<RowBlocks<BlockRows>(rows), kThreads, 0, S(stream)>>>(__VA_ARGS__);  \
    } else {                                                                                   \
      kernel<WarpRows><<<RowBlocks<WarpRows>(rows), kThreads, 0, S(stream)>>>(__VA_ARGS__);    \
    }                                                                                          \
  } while (0)

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_KERNELS_COMMON_CUH_
