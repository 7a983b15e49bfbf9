// The normalisation kernels of the CUDA backend (kernels.h): LayerNorm and
// RMSNorm per row, and the per-column sums of their parameter gradients and
// of the bias gradient. Shared helpers: kernels_common.cuh.
#include "runtime/ops/cuda/kernels_common.cuh"

namespace sk::ops::cuda {
namespace {

// The normalisation kernels (LayerNorm, RMSNorm; forward and the input
// gradient) hand out a row in chunks of kVec elements instead: thread
// Rank() owns chunks c = Rank() + k * kSize, elements [c kVec, c kVec +
// kVec) of the row, and visits them in k order and each chunk's elements in
// order (loops over a chunk run to kVec with the chunk's length as a
// condition, unrolled, so a chunk stays in registers). A chunk is one or two
// 16-byte loads where the operand allows it
// (RowVec: 16-byte aligned and rows a whole number of 16-byte words; the
// row's last chunk may be short and goes element by element), else eight
// scalar loads: the order of every sum is the chunks', whichever loads ran,
// so a 16-bit operand at an odd offset gives the bits an aligned one does.

// Whether rows of `cols` elements of p (dtype t) start on 16-byte boundaries.
__device__ __forceinline__ bool RowVec(const void* p, DType t, int64_t cols) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (cols * static_cast<int64_t>(DTypeSize(t))) % 16 == 0;
}

// count (1..kVec) elements of p (dtype t) from element `at` as f32 into v
// (the rest of v 0): 16-byte loads when vec and count == kVec.
__device__ __forceinline__ void LoadChunk(const void* p, DType t, int64_t at, int count, bool vec,
                                          float (&v)[kVec]) {
  if (vec && count == kVec) {
    switch (t) {
      case DType::kBF16: LoadVec(static_cast<const BF16*>(p) + at, v); return;
      case DType::kF16: LoadVec(static_cast<const F16*>(p) + at, v); return;
      default: LoadVec(static_cast<const float*>(p) + at, v); return;
    }
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] = e < count ? LoadF(p, t, at + e) : 0.0f;
}

// v's first count elements rounded to t into p from element `at`.
__device__ __forceinline__ void StoreChunk(void* p, DType t, int64_t at, int count, bool vec,
                                           const float (&v)[kVec]) {
  if (vec && count == kVec) {
    switch (t) {
      case DType::kBF16: StoreVec(static_cast<BF16*>(p) + at, v); return;
      case DType::kF16: StoreVec(static_cast<F16*>(p) + at, v); return;
      default: StoreVec(static_cast<float*>(p) + at, v); return;
    }
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    if (e < count) StoreF(p, t, at + e, v[e]);
  }
}

// The chunks of a row of `cols` that thread G::Rank() owns: for (c ...) with
// j = c * kVec its first element and n = its length.
#define SK_FOR_ROW_CHUNKS(G, cols, j, n)                                                         \
  for (int64_t sk_c_ = G::Rank(), j = sk_c_ * kVec; j < (cols); sk_c_ += G::kSize, j = sk_c_ * kVec) \
    if (const int n = static_cast<int>((cols) - j < kVec ? (cols) - j : kVec); true)

// A norm backward's row operands (x, gamma, dy and the accumulated dx) and
// whether each takes 16-byte loads (RowVec, once per kernel).
struct NormGradRow {
  const void* x;
  DType xt;
  const void* gamma;
  DType gt;
  const void* dy;
  DType dyt;
  void* dx;
  DType dxt;
  bool vx, vg, vdy, vdx;

  __device__ NormGradRow(const void* x_, DType xt_, const void* gamma_, DType gt_, const void* dy_,
                         DType dyt_, void* dx_, DType dxt_, int64_t cols)
      : x(x_), xt(xt_), gamma(gamma_), gt(gt_), dy(dy_), dyt(dyt_), dx(dx_), dxt(dxt_),
        vx(RowVec(x_, xt_, cols)), vg(RowVec(gamma_, gt_, cols)), vdy(RowVec(dy_, dyt_, cols)),
        vdx(RowVec(dx_, dxt_, cols)) {}

  // x, gamma and dy of the chunk at element j (length n) of the row
  // starting at element o, as f32.
  struct Chunk {
    float x[kVec], gamma[kVec], dy[kVec];
  };
  __device__ __forceinline__ Chunk Load(int64_t o, int64_t j, int n) const {
    Chunk c;
    LoadChunk(x, xt, o + j, n, vx, c.x);
    LoadChunk(gamma, gt, j, n, vg, c.gamma);
    LoadChunk(dy, dyt, o + j, n, vdy, c.dy);
    return c;
  }
  // dx[o + j + e] += in(c, e) for the chunk's elements, rounded once.
  template <typename In>
  __device__ __forceinline__ void AddToDx(int64_t o, int64_t j, int n, const Chunk& c, In in) const {
    float acc[kVec];
    LoadChunk(dx, dxt, o + j, n, vdx, acc);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] += in(c, e);
    StoreChunk(dx, dxt, o + j, n, vdx, acc);
  }
};

template <typename G>
__global__ void __launch_bounds__(kThreads)
    LayerNormKernel(const void* x, DType xt, const void* gamma, DType gt, const void* beta,
                    DType bt, int64_t rows, int64_t cols, void* y, DType yt, float* mean_out,
                    float* rstd_out) {
  __shared__ float shared[kWarpsPerBlock];
  const float n = static_cast<float>(cols);
  const bool vx = RowVec(x, xt, cols), vy = RowVec(y, yt, cols);
  const bool vg = RowVec(gamma, gt, cols), vb = RowVec(beta, bt, cols);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int64_t o = r * cols;
    float s = 0.0f;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      float xv[kVec];
      LoadChunk(x, xt, o + j, m, vx, xv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (e < m) s += xv[e];
      }
    }
    const float mean = G::Reduce(s, AddOp(), shared) / n;
    float v = 0.0f;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      float xv[kVec];
      LoadChunk(x, xt, o + j, m, vx, xv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (e >= m) continue;
        const float d = xv[e] - mean;
        v += d * d;
      }
    }
    const float rstd = math::LayerNormRstd(G::Reduce(v, AddOp(), shared) / n);
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      float xv[kVec], gv[kVec], bv[kVec], out[kVec];
      LoadChunk(x, xt, o + j, m, vx, xv);
      LoadChunk(gamma, gt, j, m, vg, gv);
      LoadChunk(beta, bt, j, m, vb, bv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = math::LayerNormOut(xv[e], mean, rstd, gv[e], bv[e]);
      StoreChunk(y, yt, o + j, m, vy, out);
    }
    if (G::Rank() == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// The input gradient per row (accumulated into dx: read, added to, rounded
// once); the parameter gradients are the column reduction below.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    LayerNormGradRowsKernel(const void* x, DType xt, const void* gamma, DType gt, const void* dy,
                            DType dyt, const float* mean, const float* rstd, int64_t rows,
                            int64_t cols, void* dx, DType dxt) {
  __shared__ float shared[kWarpsPerBlock];
  const float inv_n = 1.0f / static_cast<float>(cols);
  const NormGradRow ops(x, xt, gamma, gt, dy, dyt, dx, dxt, cols);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int64_t o = r * cols;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      const NormGradRow::Chunk c = ops.Load(o, j, m);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (e >= m) continue;
        const float xhat = math::LayerNormXhat(c.x[e], mu, rs);
        const float g = c.dy[e] * c.gamma[e];
        sg += g;
        sgx += g * xhat;
      }
    }
    const float mean_g = G::Reduce(sg, AddOp(), shared) * inv_n;
    const float mean_g_xhat = G::Reduce(sgx, AddOp(), shared) * inv_n;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      ops.AddToDx(o, j, m, ops.Load(o, j, m), [&](const NormGradRow::Chunk& c, int e) {
        return math::LayerNormGradIn(math::LayerNormXhat(c.x[e], mu, rs), c.dy[e], c.gamma[e],
                                        rs, mean_g, mean_g_xhat);
      });
    }
  }
}

// RMSNorm per row: rstd from the mean square, y = x rstd gamma.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const void* x, DType xt, const void* gamma, DType gt, int64_t rows,
                  int64_t cols, float eps, void* y, DType yt, float* rstd_out) {
  __shared__ float shared[kWarpsPerBlock];
  const float n = static_cast<float>(cols);
  const bool vx = RowVec(x, xt, cols), vg = RowVec(gamma, gt, cols), vy = RowVec(y, yt, cols);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int64_t o = r * cols;
    float sq = 0.0f;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      float xv[kVec];
      LoadChunk(x, xt, o + j, m, vx, xv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (e < m) sq += xv[e] * xv[e];
      }
    }
    const float rstd = math::RmsNormRstd(G::Reduce(sq, AddOp(), shared) / n, eps);
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      float xv[kVec], gv[kVec], out[kVec];
      LoadChunk(x, xt, o + j, m, vx, xv);
      LoadChunk(gamma, gt, j, m, vg, gv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = xv[e] * rstd * gv[e];
      StoreChunk(y, yt, o + j, m, vy, out);
    }
    if (G::Rank() == 0) rstd_out[r] = rstd;
  }
}

// RMSNorm's input gradient per row, accumulated into dx (read, added to,
// rounded once); gamma's gradient is the column reduction below.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    RmsNormGradRowsKernel(const void* x, DType xt, const void* gamma, DType gt, const void* dy,
                          DType dyt, const float* rstd, int64_t rows, int64_t cols, void* dx,
                          DType dxt) {
  __shared__ float shared[kWarpsPerBlock];
  const float inv_n = 1.0f / static_cast<float>(cols);
  const NormGradRow ops(x, xt, gamma, gt, dy, dyt, dx, dxt, cols);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int64_t o = r * cols;
    const float rs = rstd[r];
    float sgx = 0.0f;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      const NormGradRow::Chunk c = ops.Load(o, j, m);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (e < m) sgx += c.dy[e] * c.gamma[e] * c.x[e] * rs;
      }
    }
    const float mean_g_xhat = G::Reduce(sgx, AddOp(), shared) * inv_n;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      ops.AddToDx(o, j, m, ops.Load(o, j, m), [&](const NormGradRow::Chunk& c, int e) {
        return math::RmsNormGradIn(c.x[e], c.dy[e], c.gamma[e], rs, mean_g_xhat);
      });
    }
  }
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
    BiasGradPartialsKernel(const void* dy, DType dyt, int64_t rows, int64_t cols,
                           float* partials) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  if (j >= cols) return;
  const int64_t chunks = ColumnChunks(rows);
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t end = (c + 1) * kColumnChunkRows < rows ? (c + 1) * kColumnChunkRows : rows;
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t r = c * kColumnChunkRows; r < end; ++r) acc += LoadF(dy, dyt, r * cols + j);
    partials[c * cols + j] = acc;
  }
}

// dgamma partials at partials[chunk * cols + j], dbeta partials at
// partials[(chunks + chunk) * cols + j]; dgamma's terms are dy * xhat as in
// math::LayerNormRowBackward. mean null: 0 (RMSNorm's xhat = x rstd).
__global__ void __launch_bounds__(kColumnTile)
    LayerNormGradParamsPartialsKernel(const void* x, DType xt, const void* dy, DType dyt,
                                      const float* mean, const float* rstd, int64_t rows,
                                      int64_t cols, float* partials) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  if (j >= cols) return;
  const int64_t chunks = ColumnChunks(rows);
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t end = (c + 1) * kColumnChunkRows < rows ? (c + 1) * kColumnChunkRows : rows;
    float dg = 0.0f, db = 0.0f;
#pragma unroll 4
    for (int64_t r = c * kColumnChunkRows; r < end; ++r) {
      const float g = LoadF(dy, dyt, r * cols + j);
      dg += g * math::LayerNormXhat(LoadF(x, xt, r * cols + j),
                                       mean != nullptr ? mean[r] : 0.0f, rstd[r]);
      db += g;
    }
    partials[c * cols + j] = dg;
    partials[(chunks + c) * cols + j] = db;
  }
}

// out (dtype ot) += the chunk sum, rounded once.
__global__ void ColumnSumKernel(const float* partials, int64_t chunks, int64_t cols, void* out,
                                DType ot) {
  const int64_t j = Index();
  if (j >= cols) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += partials[c * cols + j];
  StoreF(out, ot, j, LoadF(out, ot, j) + acc);
}

}  // namespace

int BiasGrad(CBuf dy, int64_t rows, int64_t cols, Buf dbias, float* partials, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  BiasGradPartialsKernel<<<ColumnGrid(rows, cols), kColumnTile, 0, S(stream)>>>(
      dy.data, dy.dtype, rows, cols, partials);
  const int err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(cols, ColumnSumKernel, partials, ColumnChunks(rows), cols, dbias.data, dbias.dtype);
}

int RmsNormForward(CBuf x, CBuf gamma, int64_t rows, int64_t cols, float eps, Buf y, float* rstd,
                   void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, RmsNormKernel, x.data, x.dtype, gamma.data, gamma.dtype, rows, cols,
                  eps, y.data, y.dtype, rstd);
  return Launched();
}
int RmsNormBackward(CBuf x, CBuf gamma, CBuf dy, const float* rstd, int64_t rows, int64_t cols,
                    Buf dx, Buf dgamma, float* partials, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, RmsNormGradRowsKernel, x.data, x.dtype, gamma.data, gamma.dtype,
                  dy.data, dy.dtype, rstd, rows, cols, dx.data, dx.dtype);
  int err = Launched();
  if (err != 0) return err;
  LayerNormGradParamsPartialsKernel<<<ColumnGrid(rows, cols), kColumnTile, 0, S(stream)>>>(
      x.data, x.dtype, dy.data, dy.dtype, nullptr, rstd, rows, cols, partials);
  err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(cols, ColumnSumKernel, partials, ColumnChunks(rows), cols, dgamma.data, dgamma.dtype);
}
int LayerNormForward(CBuf x, CBuf gamma, CBuf beta, int64_t rows, int64_t cols, Buf y,
                     float* mean, float* rstd, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, LayerNormKernel, x.data, x.dtype, gamma.data, gamma.dtype, beta.data,
                  beta.dtype, rows, cols, y.data, y.dtype, mean, rstd);
  return Launched();
}
int LayerNormBackward(CBuf x, CBuf gamma, CBuf dy, const float* mean, const float* rstd,
                      int64_t rows, int64_t cols, Buf dx, Buf dgamma, Buf dbeta, float* partials,
                      void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, LayerNormGradRowsKernel, x.data, x.dtype, gamma.data, gamma.dtype,
                  dy.data, dy.dtype, mean, rstd, rows, cols, dx.data, dx.dtype);
  int err = Launched();
  if (err != 0) return err;
  LayerNormGradParamsPartialsKernel<<<ColumnGrid(rows, cols), kColumnTile, 0, S(stream)>>>(
      x.data, x.dtype, dy.data, dy.dtype, mean, rstd, rows, cols, partials);
  err = Launched();
  if (err != 0) return err;
  const int64_t chunks = ColumnChunks(rows);
  ColumnSumKernel<<<Blocks(cols), kThreads, 0, S(stream)>>>(partials, chunks, cols, dgamma.data,
                                                            dgamma.dtype);
  err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(cols, ColumnSumKernel, partials + chunks * cols, chunks, cols, dbeta.data, dbeta.dtype);
}

}  // namespace sk::ops::cuda
