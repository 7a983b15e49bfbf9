// CUDA kernels of the op layer, around the SK_HOST_DEVICE arithmetic the CPU
// backend runs (runtime/ops/math.h's per-element helpers), so host tests of
// that arithmetic cover what the GPU computes per element. Elementwise ops:
// one thread per element. Per-row ops (LayerNorm, softmax, cross-entropy):
// a warp or a block per row with fixed-order tree reductions. Per-column sums
// (bias and LayerNorm parameter gradients): two levels, column tiles by row
// chunks, then the chunks in order. Embedding backward: a stable sort of the
// ids, then one block per distinct id adding its tokens in position order.
// Every reduction has a fixed order, so every result is deterministic (same
// inputs, same bits on every run); only the embedding gradient keeps the
// CPU's summation order. GEMMs are cuBLAS's.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "runtime/core/dtype.h"
#include "runtime/ops/backend.h"
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

__global__ void GeluKernel(const float* x, int64_t n, float* y) {
  int64_t i = Index();
  if (i < n) y[i] = nn_math::GeluTanh(x[i]);
}

__global__ void GeluGradKernel(const float* x, const float* dy, int64_t n, float* dx) {
  int64_t i = Index();
  if (i < n) dx[i] = dy[i] * nn_math::GeluTanhGrad(x[i]);
}

__global__ void EmbeddingKernel(const float* table, const int32_t* ids, int64_t count,
                                int64_t dim, float* out) {
  int64_t i = Index();
  if (i < count * dim) out[i] = table[static_cast<int64_t>(ids[i / dim]) * dim + i % dim];
}

// ---- Per-row kernels -------------------------------------------------------
//
// A row is handled by a group of threads: one warp (WarpRows) when it has at
// most kWarpRowMaxCols columns, else one block of kThreads (BlockRows). Thread
// `Rank()` of the group owns the row's elements j = Rank() + k * kSize: it
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

// The maximum of row[0, n) over group G: each thread takes its strided
// elements in order, then G::Reduce's fixed tree (the softmax and
// cross-entropy kernels' first pass).
template <typename G>
__device__ __forceinline__ float GroupRowMax(const float* row, int64_t n, float* shared) {
  float m = -INFINITY;
  for (int64_t j = G::Rank(); j < n; j += G::kSize) m = MaxOp()(m, row[j]);
  return G::Reduce(m, MaxOp(), shared);
}

template <typename G>
__global__ void __launch_bounds__(kThreads)
    LayerNormKernel(const float* x, const float* gamma, const float* beta, int64_t rows,
                    int64_t cols, float* y, float* mean_out, float* rstd_out) {
  __shared__ float shared[kWarpsPerBlock];
  const float n = static_cast<float>(cols);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) s += xr[j];
    const float mean = G::Reduce(s, AddOp(), shared) / n;
    float v = 0.0f;
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      const float d = xr[j] - mean;
      v += d * d;
    }
    const float rstd = nn_math::LayerNormRstd(G::Reduce(v, AddOp(), shared) / n);
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      yr[j] = nn_math::LayerNormOut(xr[j], mean, rstd, gamma[j], beta[j]);
    }
    if (G::Rank() == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// The input gradient per row (accumulated into dx); the parameter gradients
// are the column reduction below.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    LayerNormGradRowsKernel(const float* x, const float* gamma, const float* dy,
                            const float* mean, const float* rstd, int64_t rows, int64_t cols,
                            float* dx) {
  __shared__ float shared[kWarpsPerBlock];
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      const float xhat = nn_math::LayerNormXhat(xr[j], mu, rs);
      const float g = dyr[j] * gamma[j];
      sg += g;
      sgx += g * xhat;
    }
    const float mean_g = G::Reduce(sg, AddOp(), shared) * inv_n;
    const float mean_g_xhat = G::Reduce(sgx, AddOp(), shared) * inv_n;
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      dxr[j] += nn_math::LayerNormGradIn(nn_math::LayerNormXhat(xr[j], mu, rs), dyr[j], gamma[j],
                                         rs, mean_g, mean_g_xhat);
    }
  }
}

// Row r keeps its first `valid` entries (causal: (r % block_rows) + 1) and
// sets the rest to 0, as nn_math::SoftmaxRowInPlace.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    SoftmaxKernel(float* x, int64_t rows, int64_t cols, bool causal, int64_t block_rows) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    float* row = x + r * cols;
    const int64_t valid = causal ? ((r % block_rows) + 1 < cols ? (r % block_rows) + 1 : cols) : cols;
    const float m = GroupRowMax<G>(row, valid, shared);
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < valid; j += G::kSize) {
      const float e = expf(row[j] - m);
      row[j] = e;
      s += e;
    }
    const float inv = 1.0f / G::Reduce(s, AddOp(), shared);
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) row[j] = j < valid ? row[j] * inv : 0.0f;
  }
}

template <typename G>
__global__ void __launch_bounds__(kThreads)
    SoftmaxGradKernel(const float* p, float* dp, int64_t rows, int64_t cols, float scale) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const float* pr = p + r * cols;
    float* dr = dp + r * cols;
    float d = 0.0f;
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) d += pr[j] * dr[j];
    const float dot = G::Reduce(d, AddOp(), shared);
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      dr[j] = nn_math::SoftmaxGradElement(pr[j], dr[j], dot, scale);
    }
  }
}

// row_loss[r]: 0 on ignored rows; NaN for a target outside [0, vocab) (the
// op's contract excludes it; nothing is read out of bounds).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyRowsKernel(const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab, float* row_loss) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int32_t t = targets[r];
    if (t == kIgnoreTarget || t < 0 || t >= vocab) {  // the same branch for the whole group
      if (G::Rank() == 0) row_loss[r] = t == kIgnoreTarget ? 0.0f : NAN;
      continue;
    }
    const float* lr = logits + r * vocab;
    const float m = GroupRowMax<G>(lr, vocab, shared);
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) s += expf(lr[j] - m);
    s = G::Reduce(s, AddOp(), shared);
    if (G::Rank() == 0) row_loss[r] = nn_math::CrossEntropyFromStats(m, s, lr[t]);
  }
}

// dlogits (may be logits) per row: scale (softmax - onehot), scale = 1 /
// *count; zeros on ignored rows, NaN on rows whose target is outside
// [0, vocab).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyGradKernel(const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab, const int64_t* count, float* dlogits) {
  __shared__ float shared[kWarpsPerBlock];
  const float scale = *count == 0 ? 0.0f : 1.0f / static_cast<float>(*count);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int32_t t = targets[r];
    float* dr = dlogits + r * vocab;
    if (t == kIgnoreTarget || t < 0 || t >= vocab) {  // the same branch for the whole group
      const float fill = t == kIgnoreTarget ? 0.0f : NAN;
      for (int64_t j = G::Rank(); j < vocab; j += G::kSize) dr[j] = fill;
      continue;
    }
    const float* lr = logits + r * vocab;
    const float m = GroupRowMax<G>(lr, vocab, shared);
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) {
      const float e = expf(lr[j] - m);
      dr[j] = e;  // the element this thread read: safe in place
      s += e;
    }
    const float inv = scale / G::Reduce(s, AddOp(), shared);
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) {
      dr[j] = nn_math::CrossEntropyGradElement(dr[j], inv, j == t, scale);
    }
  }
}

// ---- Loss mean and target count: one block, a fixed tree in f64 ------------

// Thread i sums rows i, i + kThreads, ... in order; then a halving tree over
// the threads (i takes i + s for s = kThreads/2, ..., 1). Launched <<<1, kThreads>>>.
__global__ void __launch_bounds__(kThreads)
    CrossEntropyMeanKernel(const float* row_loss, const int32_t* targets, int64_t rows,
                           float* loss) {
  __shared__ double sums[kThreads];
  __shared__ int64_t counts[kThreads];
  double s = 0.0;
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    if (targets[r] == kIgnoreTarget) continue;
    s += row_loss[r];
    ++c;
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sums[threadIdx.x] += sums[threadIdx.x + w];
      counts[threadIdx.x] += counts[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = counts[0] == 0 ? 0.0f : static_cast<float>(sums[0] / static_cast<double>(counts[0]));
  }
}

__global__ void __launch_bounds__(kThreads)
    CountTargetsKernel(const int32_t* targets, int64_t rows, int64_t* count) {
  __shared__ int64_t counts[kThreads];
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) c += targets[r] != kIgnoreTarget;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) counts[threadIdx.x] += counts[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = counts[0];
}

// ---- Per-column reductions: two levels, fixed order --------------------------
//
// Level 1: block (x, y) owns columns [x * kColumnTile, +kColumnTile), one
// thread each (a warp reads 32 neighbouring floats of a row), and row chunks
// y, y + gridDim.y, ... of kColumnChunkRows rows; for each chunk a thread
// sums its column over the chunk's rows in row order from 0 and stores the
// partial at partials[chunk * cols + j]. Level 2 (ColumnSumKernel): one
// thread per column adds the partials in chunk order and adds that sum into
// the destination. Deterministic; not the CPU's row-order sum.

constexpr int kColumnTile = 128;

dim3 ColumnGrid(int64_t rows, int64_t cols) {
  const int64_t chunks = ColumnChunks(rows);
  return dim3(static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile),
              static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
}

__global__ void __launch_bounds__(kColumnTile)
    BiasGradPartialsKernel(const float* dy, int64_t rows, int64_t cols, float* partials) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  if (j >= cols) return;
  const int64_t chunks = ColumnChunks(rows);
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t end = (c + 1) * kColumnChunkRows < rows ? (c + 1) * kColumnChunkRows : rows;
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t r = c * kColumnChunkRows; r < end; ++r) acc += dy[r * cols + j];
    partials[c * cols + j] = acc;
  }
}

// dgamma partials at partials[chunk * cols + j], dbeta partials at
// partials[(chunks + chunk) * cols + j]; dgamma's terms are dy * xhat as in
// nn_math::LayerNormRowBackward.
__global__ void __launch_bounds__(kColumnTile)
    LayerNormGradParamsPartialsKernel(const float* x, const float* dy, const float* mean,
                                      const float* rstd, int64_t rows, int64_t cols,
                                      float* partials) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  if (j >= cols) return;
  const int64_t chunks = ColumnChunks(rows);
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t end = (c + 1) * kColumnChunkRows < rows ? (c + 1) * kColumnChunkRows : rows;
    float dg = 0.0f, db = 0.0f;
#pragma unroll 4
    for (int64_t r = c * kColumnChunkRows; r < end; ++r) {
      const float g = dy[r * cols + j];
      dg += g * nn_math::LayerNormXhat(x[r * cols + j], mean[r], rstd[r]);
      db += g;
    }
    partials[c * cols + j] = dg;
    partials[(chunks + c) * cols + j] = db;
  }
}

__global__ void ColumnSumKernel(const float* partials, int64_t chunks, int64_t cols, float* out) {
  const int64_t j = Index();
  if (j >= cols) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += partials[c * cols + j];
  out[j] += acc;
}

// ---- Embedding backward: sort by id, then one block per id -----------------
//
// The ids are sorted as unsigned keys with their positions as values by CUB's
// stable radix sort (all 32 bits), so equal ids form runs whose positions
// ascend. A block whose sorted index i starts a run (i == 0 or the id before
// differs) owns that id's dtable row: its threads stride the columns, and
// each element gets dout of the run's positions added in position order, the
// CPU's order (so the bits are the CPU's). No two blocks write one row; no
// atomics. Ids outside [0, vocab) are out of the op's contract and are
// written nowhere.

__global__ void IotaKernel(int32_t* out, int64_t n) {
  const int64_t i = Index();
  if (i < n) out[i] = static_cast<int32_t>(i);
}

constexpr int64_t kMaxEmbeddingRunBlocks = 1 << 20;

__global__ void __launch_bounds__(kThreads)
    EmbeddingGradRunsKernel(const uint32_t* sorted_ids, const int32_t* positions, int64_t count,
                            int64_t dim, int64_t vocab, const float* dout, float* dtable) {
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const uint32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // inside a run another block owns
    if (static_cast<int64_t>(id) >= vocab) continue;
    int64_t end = i + 1;
    while (end < count && sorted_ids[end] == id) ++end;
    float* row = dtable + static_cast<int64_t>(id) * dim;
    for (int64_t j = blockIdx.y * static_cast<int64_t>(kThreads) + threadIdx.x; j < dim;
         j += static_cast<int64_t>(gridDim.y) * kThreads) {
      float acc = row[j];
#pragma unroll 4
      for (int64_t k = i; k < end; ++k) acc += dout[static_cast<int64_t>(positions[k]) * dim + j];
      row[j] = acc;
    }
  }
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

namespace {

// Blocks of a row kernel over `rows` rows (a grid-stride loop visits the rest).
template <typename G>
unsigned RowBlocks(int64_t rows) {
  const int64_t blocks = (rows + G::kRowsPerBlock - 1) / G::kRowsPerBlock;
  return static_cast<unsigned>(blocks < kMaxRowBlocks ? blocks : kMaxRowBlocks);
}

// `bytes` rounded up to a multiple of 256 (the alignment of scratch pieces).
size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

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
int BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias, float* partials,
             void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  BiasGradPartialsKernel<<<ColumnGrid(rows, cols), kColumnTile, 0, S(stream)>>>(dy, rows, cols,
                                                                               partials);
  const int err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(cols, ColumnSumKernel, partials, ColumnChunks(rows), cols, dbias);
}
int GeluForward(const float* x, int64_t n, float* y, void* stream) {
  SK_LAUNCH(n, GeluKernel, x, n, y);
}
int GeluBackward(const float* x, const float* dy, int64_t n, float* dx, void* stream) {
  SK_LAUNCH(n, GeluGradKernel, x, dy, n, dx);
}
int LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                     int64_t cols, float* y, float* mean, float* rstd, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, LayerNormKernel, x, gamma, beta, rows, cols, y, mean, rstd);
  return Launched();
}
int LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                      const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                      float* dbeta, float* partials, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, LayerNormGradRowsKernel, x, gamma, dy, mean, rstd, rows, cols, dx);
  int err = Launched();
  if (err != 0) return err;
  LayerNormGradParamsPartialsKernel<<<ColumnGrid(rows, cols), kColumnTile, 0, S(stream)>>>(
      x, dy, mean, rstd, rows, cols, partials);
  err = Launched();
  if (err != 0) return err;
  const int64_t chunks = ColumnChunks(rows);
  ColumnSumKernel<<<Blocks(cols), kThreads, 0, S(stream)>>>(partials, chunks, cols, dgamma);
  err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(cols, ColumnSumKernel, partials + chunks * cols, chunks, cols, dbeta);
}
int SoftmaxRows(float* x, int64_t rows, int64_t cols, bool causal, int64_t block_rows,
                void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, SoftmaxKernel, x, rows, cols, causal, block_rows > 0 ? block_rows : 1);
  return Launched();
}
int SoftmaxBackwardRows(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                        void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, SoftmaxGradKernel, p, dp, rows, cols, scale);
  return Launched();
}
int EmbeddingForward(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                     float* out, void* stream) {
  SK_LAUNCH(count * dim, EmbeddingKernel, table, ids, count, dim, out);
}
int EmbeddingBackwardScratchBytes(int64_t count, size_t* bytes) {
  *bytes = 0;
  if (count <= 0) return 0;
  if (count > kMaxEmbeddingBackwardIds) return static_cast<int>(cudaErrorInvalidValue);
  size_t sort_bytes = 0;
  const cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int>(count), 0, 32);
  if (err != cudaSuccess) return static_cast<int>(err);
  *bytes = 3 * Align256(static_cast<size_t>(count) * 4) + sort_bytes;
  return 0;
}
int EmbeddingBackward(const int32_t* ids, const float* dout, int64_t count, int64_t dim,
                      int64_t vocab, float* dtable, void* scratch, size_t scratch_bytes,
                      void* stream) {
  if (count <= 0 || dim <= 0) return 0;
  if (count > kMaxEmbeddingBackwardIds) return static_cast<int>(cudaErrorInvalidValue);
  // scratch: sorted ids | positions 0..count-1 | sorted positions | CUB's temporaries.
  const size_t piece = Align256(static_cast<size_t>(count) * 4);
  if (scratch_bytes < 3 * piece) return static_cast<int>(cudaErrorInvalidValue);
  char* base = static_cast<char*>(scratch);
  auto* sorted_ids = reinterpret_cast<uint32_t*>(base);
  auto* positions = reinterpret_cast<int32_t*>(base + piece);
  auto* sorted_positions = reinterpret_cast<int32_t*>(base + 2 * piece);
  size_t sort_bytes = scratch_bytes - 3 * piece;
  IotaKernel<<<Blocks(count), kThreads, 0, S(stream)>>>(positions, count);
  int err = Launched();
  if (err != 0) return err;
  err = static_cast<int>(cub::DeviceRadixSort::SortPairs(
      base + 3 * piece, sort_bytes, reinterpret_cast<const uint32_t*>(ids), sorted_ids, positions,
      sorted_positions, static_cast<int>(count), 0, 32, S(stream)));
  if (err != 0) return err;
  const int64_t tiles = (dim + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(count < kMaxEmbeddingRunBlocks ? count : kMaxEmbeddingRunBlocks),
                  static_cast<unsigned>(tiles < 65535 ? tiles : 65535));
  EmbeddingGradRunsKernel<<<grid, kThreads, 0, S(stream)>>>(sorted_ids, sorted_positions, count,
                                                            dim, vocab, dout, dtable);
  return Launched();
}
int CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, float* loss, void* stream) {
  if (rows > 0) {  // vocab 0 (rejected by the dispatcher) writes NaN row losses
    SK_ENQUEUE_ROWS(rows, vocab, CrossEntropyRowsKernel, logits, targets, rows, vocab, row_loss);
    const int err = Launched();
    if (err != 0) return err;
  }
  CrossEntropyMeanKernel<<<1, kThreads, 0, S(stream)>>>(row_loss, targets, rows, loss);
  return Launched();
}
int CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows,
                         int64_t vocab, float* dlogits, int64_t* count_scratch, void* stream) {
  if (rows <= 0 || vocab <= 0) return 0;
  CountTargetsKernel<<<1, kThreads, 0, S(stream)>>>(targets, rows, count_scratch);
  const int err = Launched();
  if (err != 0) return err;
  SK_ENQUEUE_ROWS(rows, vocab, CrossEntropyGradKernel, logits, targets, rows, vocab, count_scratch,
                  dlogits);
  return Launched();
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
