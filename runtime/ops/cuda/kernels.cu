// CUDA kernels of the op layer, around the SK_HOST_DEVICE arithmetic the CPU
// backend runs (runtime/ops/math.h's per-element helpers), so host tests of
// that arithmetic cover what the GPU computes per element. Elementwise ops:
// eight elements per thread in 16-byte words where every operand shares one
// dtype and is aligned (VecMapKernel; GELU, SwiGLU, Axpy, BroadcastRows,
// Adam; Axpy of two aligned dtypes too),
// else one thread per element. Per-row ops (LayerNorm, softmax, cross-entropy):
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

// kCastVec elements per thread. With `vec` (both pointers 16-byte aligned,
// checked by the launcher) a thread whose kCastVec elements all exist moves
// them as 16-byte loads and stores (one for 16-bit data, two for f32);
// otherwise, and for the tail of n, element by element. Each element is one
// conversion of its own input, so the path taken does not change a bit.
constexpr int kCastVec = 8;

template <typename From, typename To>
__global__ void CastKernel(const From* __restrict__ src, To* __restrict__ dst, int64_t n,
                           bool vec) {
  const int64_t base = Index() * kCastVec;
  if (base >= n) return;
  if (vec && base + kCastVec <= n) {
    static_assert(kCastVec * sizeof(BF16) == sizeof(uint4), "8 16-bit elements are 16 bytes");
    alignas(16) From in[kCastVec];
    alignas(16) To out[kCastVec];
    constexpr int kInWords = kCastVec * sizeof(From) / sizeof(uint4);
    constexpr int kOutWords = kCastVec * sizeof(To) / sizeof(uint4);
    const uint4* s4 = reinterpret_cast<const uint4*>(src + base);
#pragma unroll
    for (int w = 0; w < kInWords; ++w) reinterpret_cast<uint4*>(in)[w] = s4[w];
#pragma unroll
    for (int e = 0; e < kCastVec; ++e) out[e] = FromF<To>(ToF(in[e]));
    uint4* d4 = reinterpret_cast<uint4*>(dst + base);
#pragma unroll
    for (int w = 0; w < kOutWords; ++w) d4[w] = reinterpret_cast<const uint4*>(out)[w];
    return;
  }
  const int64_t end = base + kCastVec < n ? base + kCastVec : n;
  for (int64_t i = base; i < end; ++i) dst[i] = FromF<To>(ToF(src[i]));
}

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

// The element functions (the generic kernels below compute the same).
struct GeluOp {
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const { y[0] = nn_math::GeluTanh(x[0]); }
};
struct GeluGradOp {  // x, dy -> dx
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = x[1] * nn_math::GeluTanhGrad(x[0]);
  }
};
struct SwiGluOp {  // gate, up -> y
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const { y[0] = nn_math::Silu(x[0]) * x[1]; }
};
struct SwiGluGradOp {  // gate, up, dy -> dgate, dup
  __device__ void operator()(const float (&x)[3], float (&y)[2]) const {
    y[0] = x[2] * x[1] * nn_math::SiluGrad(x[0]);
    y[1] = x[2] * nn_math::Silu(x[0]);
  }
};
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
struct AxpyOp {  // x, y -> y
  float alpha;
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = x[1] + (alpha == 1.0f ? x[0] : alpha * x[0]);
  }
};

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

// y += alpha x with x of type X and y of type Y (both 16-byte aligned),
// AxpyOp's arithmetic: kVec elements per thread, the tail element by
// element. The residual adds of the unfused GemmBiasResidual (a bf16
// residual into the f32 sum) take it.
template <typename X, typename Y>
__global__ void AxpyMixedVecKernel(float alpha, const X* x, Y* y, int64_t n) {
  const int64_t base = Index() * kVec;
  if (base >= n) return;
  const AxpyOp op{alpha};
  if (base + kVec <= n) {
    float xv[kVec], yv[kVec];
    LoadVec(x + base, xv);
    LoadVec(y + base, yv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      float out[1];
      op({xv[e], yv[e]}, out);
      yv[e] = out[0];
    }
    StoreVec(y + base, yv);
    return;
  }
  for (int64_t i = base; i < n; ++i) {
    float out[1];
    op({ToF(x[i]), ToF(y[i])}, out);
    y[i] = FromF<Y>(out[0]);
  }
}

// dst[r, c] = src[c] for rows x cols (dst dense) with cols a multiple of
// kVec and both 16-byte aligned: kVec elements of one row per thread.
template <typename T>
__global__ void BroadcastRowsVecKernel(const T* src, int64_t cols, T* dst, int64_t n) {
  const int64_t base = Index() * kVec;
  if (base >= n) return;
  float v[kVec];
  LoadVec(src + base % cols, v);
  StoreVec(dst + base, v);
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

__global__ void FillMatrixKernel(void* x, DType t, int64_t rows, int64_t cols, int64_t ld,
                                 float value) {
  int64_t i = Index();
  if (i < rows * cols) StoreF(x, t, (i / cols) * ld + i % cols, value);
}

__global__ void BatchPointersKernel(const char* a, int64_t a_seq, int64_t a_head, const char* b,
                                    int64_t b_seq, int64_t b_head, const char* c, int64_t c_seq,
                                    int64_t c_head, int64_t seqs, int64_t heads,
                                    const void** out) {
  const int64_t n = seqs * heads;
  const int64_t i = Index();
  if (i >= n) return;
  const int64_t s = i / heads, h = i % heads;
  out[i] = a + s * a_seq + h * a_head;
  out[n + i] = b + s * b_seq + h * b_head;
  out[2 * n + i] = c + s * c_seq + h * c_head;
}

__global__ void InitKernel(InitKind kind, float a, float b, uint64_t seed, uint64_t param_id,
                           int64_t begin, void* out, DType t, int64_t n) {
  int64_t i = Index();
  if (i < n) {
    StoreF(out, t, i, InitValueAt(kind, a, b, seed, param_id, static_cast<uint64_t>(begin + i)));
  }
}

// The model ops' kernels take each compute-dtype operand as a pointer and
// its dtype (f32, bf16 or f16, independently): LoadF reads an element
// exactly as f32, the arithmetic is f32, StoreF rounds a 16-bit result once
// (nearest even). So a 16-bit call gives the bits the f32 kernel gives on
// exact f32 copies of its operands, rounded once: what the dispatcher's f32
// staging gave, without the copies.

__global__ void BroadcastRowsKernel(const void* src, DType st, int64_t cols, void* dst, DType dt,
                                    int64_t rows) {
  int64_t i = Index();
  if (i < rows * cols) StoreF(dst, dt, i, LoadF(src, st, i % cols));
}

__global__ void BiasAddKernel(const void* bias, DType bt, int64_t cols, void* y, DType yt,
                              int64_t rows) {
  int64_t i = Index();
  if (i < rows * cols) StoreF(y, yt, i, LoadF(y, yt, i) + LoadF(bias, bt, i % cols));
}

// y may be x (one dtype then): each thread reads its element before writing it.
__global__ void GeluKernel(const void* x, DType xt, int64_t n, void* y, DType yt) {
  int64_t i = Index();
  if (i < n) StoreF(y, yt, i, nn_math::GeluTanh(LoadF(x, xt, i)));
}

// dx may be dy (one dtype then).
__global__ void GeluGradKernel(const void* x, DType xt, const void* dy, DType dyt, int64_t n,
                               void* dx, DType dxt) {
  int64_t i = Index();
  if (i < n) StoreF(dx, dxt, i, LoadF(dy, dyt, i) * nn_math::GeluTanhGrad(LoadF(x, xt, i)));
}

// ---- Llama-family elementwise kernels (math.h's arithmetic) ----------------

__global__ void SwiGluKernel(const void* gate, DType gt, const void* up, DType ut, int64_t n,
                             void* y, DType yt) {
  int64_t i = Index();
  if (i < n) StoreF(y, yt, i, nn_math::Silu(LoadF(gate, gt, i)) * LoadF(up, ut, i));
}

__global__ void SwiGluGradKernel(const void* gate, DType gt, const void* up, DType ut,
                                 const void* dy, DType dyt, int64_t n, void* dgate, DType dgt,
                                 void* dup, DType dut) {
  int64_t i = Index();
  if (i >= n) return;
  const float g = LoadF(gate, gt, i), u = LoadF(up, ut, i), d = LoadF(dy, dyt, i);
  StoreF(dgate, dgt, i, d * u * nn_math::SiluGrad(g));
  StoreF(dup, dut, i, d * nn_math::Silu(g));
}

// One thread per rotated pair p of n / 2: head row u = p / half, element i =
// p % half and i + half; y may be x (each thread reads its pair first).
__global__ void RopeKernel(const void* x, DType xt, int64_t pairs, int64_t seq_len, int64_t heads,
                           int64_t head_dim, float theta, RopeScaling scaling, float sign, void* y,
                           DType yt, const int32_t* positions) {
  int64_t p = Index();
  if (p >= pairs) return;
  const int64_t half = head_dim / 2;
  const int64_t u = p / half, i = p % half;
  const int64_t o = u * head_dim + i;
  float a, b;
  nn_math::RopePair(LoadF(x, xt, o), LoadF(x, xt, o + half),
                    nn_math::RopeAngle(nn_math::RopePosition(u / heads, seq_len, positions), i,
                                       head_dim, theta, scaling),
                    sign, &a, &b);
  StoreF(y, yt, o, a);
  StoreF(y, yt, o + half, b);
}

// Grouped-query attention's fallback: dst [rows, kv_heads * group * head_dim]
// (dense) = each key/value head of src (row stride ld) repeated for its group
// of query heads.
__global__ void RepeatKvHeadsKernel(const void* src, DType st, int64_t ld, int64_t rows,
                                    int64_t kv_heads, int64_t group, int64_t head_dim, void* dst,
                                    DType dt) {
  const int64_t cols = kv_heads * group * head_dim;
  int64_t i = Index();
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const int64_t h = c / head_dim, d = c % head_dim;
  StoreF(dst, dt, i, LoadF(src, st, r * ld + (h / group) * head_dim + d));
}

// dst (row stride ld) = for each key/value head, the f32 sum over its group
// of src's query-head columns (dense [rows, kv_heads * group * head_dim]) in
// head order, rounded once.
__global__ void SumKvHeadGroupsKernel(const void* src, DType st, int64_t rows, int64_t kv_heads,
                                      int64_t group, int64_t head_dim, void* dst, DType dt,
                                      int64_t ld) {
  const int64_t cols = kv_heads * head_dim;
  int64_t i = Index();
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const int64_t kh = c / head_dim, d = c % head_dim;
  const int64_t src_cols = cols * group;
  float acc = 0.0f;
  for (int64_t g = 0; g < group; ++g) {
    acc += LoadF(src, st, r * src_cols + (kh * group + g) * head_dim + d);
  }
  StoreF(dst, dt, r * ld + c, acc);
}

__global__ void EmbeddingKernel(const void* table, DType tt, const int32_t* ids, int64_t count,
                                int64_t dim, void* out, DType ot) {
  int64_t i = Index();
  if (i < count * dim) {
    StoreF(out, ot, i, LoadF(table, tt, static_cast<int64_t>(ids[i / dim]) * dim + i % dim));
  }
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
    const float rstd = nn_math::LayerNormRstd(G::Reduce(v, AddOp(), shared) / n);
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      float xv[kVec], gv[kVec], bv[kVec], out[kVec];
      LoadChunk(x, xt, o + j, m, vx, xv);
      LoadChunk(gamma, gt, j, m, vg, gv);
      LoadChunk(beta, bt, j, m, vb, bv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = nn_math::LayerNormOut(xv[e], mean, rstd, gv[e], bv[e]);
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
        const float xhat = nn_math::LayerNormXhat(c.x[e], mu, rs);
        const float g = c.dy[e] * c.gamma[e];
        sg += g;
        sgx += g * xhat;
      }
    }
    const float mean_g = G::Reduce(sg, AddOp(), shared) * inv_n;
    const float mean_g_xhat = G::Reduce(sgx, AddOp(), shared) * inv_n;
    SK_FOR_ROW_CHUNKS(G, cols, j, m) {
      ops.AddToDx(o, j, m, ops.Load(o, j, m), [&](const NormGradRow::Chunk& c, int e) {
        return nn_math::LayerNormGradIn(nn_math::LayerNormXhat(c.x[e], mu, rs), c.dy[e], c.gamma[e],
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
    const float rstd = nn_math::RmsNormRstd(G::Reduce(sq, AddOp(), shared) / n, eps);
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
        return nn_math::RmsNormGradIn(c.x[e], c.dy[e], c.gamma[e], rs, mean_g_xhat);
      });
    }
  }
}

// Row r softmaxed over the keys nn_math::AttentionRowKeys gives it (all;
// causal: the first (r % q_len) + 1; packed documents: from the row's key
// start on), every other entry 0, as nn_math::MaskedSoftmaxRowInPlace. x is
// f32 (attention's scores, then probabilities); with p16 (not null) each
// final probability is also stored rounded to p16's dtype pt at the same
// index (the operand of a 16-bit tensor-core GEMM).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    SoftmaxKernel(float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len, int64_t heads,
                  const int32_t* key_start, void* p16, DType pt) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    float* row = x + r * cols;
    const nn_math::AttentionKeys keys =
        nn_math::AttentionRowKeys(r, heads, q_len, cols, causal, key_start);
    const float m = GroupRowMax<G>(x, DType::kF32, r * cols + keys.first, keys.end - keys.first,
                                   shared);
    // Each thread visits the columns j = Rank() mod kSize here and below, so
    // every entry is read back by the thread that wrote it (a warp's
    // shuffles order no memory); those before the document are skipped.
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < keys.end; j += G::kSize) {
      if (j < keys.first) continue;
      const float e = expf(row[j] - m);
      row[j] = e;
      s += e;
    }
    const float inv = 1.0f / G::Reduce(s, AddOp(), shared);
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      const float p = j >= keys.first && j < keys.end ? row[j] * inv : 0.0f;
      row[j] = p;
      if (p16 != nullptr) StoreF(p16, pt, r * cols + j, p);
    }
  }
}

// Softmax's backward per row from the f32 probabilities p and their f32
// gradient dp: ds = scale p (dp - <p, dp>). Without ds16: ds overwrites dp
// (f32). With ds16 (not null): dp is only read; ds is stored rounded to
// ds16's dtype t, and p rounded to t into p16, both at the same index (the
// 16-bit operands of attention backward's tensor-core GEMMs).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    SoftmaxGradKernel(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                      void* ds16, void* p16, DType t) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const float* pr = p + r * cols;
    float* dr = dp + r * cols;
    float d = 0.0f;
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) d += pr[j] * dr[j];
    const float dot = G::Reduce(d, AddOp(), shared);
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      const float ds = nn_math::SoftmaxGradElement(pr[j], dr[j], dot, scale);
      if (ds16 == nullptr) {
        dr[j] = ds;
      } else {
        StoreF(ds16, t, r * cols + j, ds);
        StoreF(p16, t, r * cols + j, pr[j]);
      }
    }
  }
}

// row_loss[r]: 0 on ignored rows; NaN for a target outside [0, vocab) (the
// op's contract excludes it; nothing is read out of bounds).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyRowsKernel(const void* logits, DType lt, const int32_t* targets, int64_t rows,
                           int64_t vocab, float* row_loss) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int32_t t = targets[r];
    if (t == kIgnoreTarget || t < 0 || t >= vocab) {  // the same branch for the whole group
      if (G::Rank() == 0) row_loss[r] = t == kIgnoreTarget ? 0.0f : NAN;
      continue;
    }
    const int64_t o = r * vocab;
    const float m = GroupRowMax<G>(logits, lt, o, vocab, shared);
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) s += expf(LoadF(logits, lt, o + j) - m);
    s = G::Reduce(s, AddOp(), shared);
    if (G::Rank() == 0) row_loss[r] = nn_math::CrossEntropyFromStats(m, s, LoadF(logits, lt, o + t));
  }
}

// dlogits (may be logits, of one dtype then) per row: scale (softmax -
// onehot), scale = 1 / *count; zeros on ignored rows, NaN on rows whose
// target is outside [0, vocab). The sum pass writes nothing; the last pass
// recomputes each e = expf(logit - m) (the same bits) from the logit the
// thread itself reads before overwriting it, so a 16-bit dlogits is rounded
// once and the in-place form is safe.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyGradKernel(const void* logits, DType lt, const int32_t* targets, int64_t rows,
                           int64_t vocab, const int64_t* count, float given_scale, void* dlogits,
                           DType dt) {
  __shared__ float shared[kWarpsPerBlock];
  const float scale = given_scale > 0.0f ? given_scale
                      : *count == 0      ? 0.0f
                                         : 1.0f / static_cast<float>(*count);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int32_t t = targets[r];
    const int64_t o = r * vocab;
    if (t == kIgnoreTarget || t < 0 || t >= vocab) {  // the same branch for the whole group
      const float fill = t == kIgnoreTarget ? 0.0f : NAN;
      for (int64_t j = G::Rank(); j < vocab; j += G::kSize) StoreF(dlogits, dt, o + j, fill);
      continue;
    }
    const float m = GroupRowMax<G>(logits, lt, o, vocab, shared);
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) s += expf(LoadF(logits, lt, o + j) - m);
    const float inv = scale / G::Reduce(s, AddOp(), shared);
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) {
      const float e = expf(LoadF(logits, lt, o + j) - m);
      StoreF(dlogits, dt, o + j, nn_math::CrossEntropyGradElement(e, inv, j == t, scale));
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
// nn_math::LayerNormRowBackward. mean null: 0 (RMSNorm's xhat = x rstd).
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
      dg += g * nn_math::LayerNormXhat(LoadF(x, xt, r * cols + j),
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
                            int64_t dim, int64_t vocab, const void* dout, DType dt,
                            float* dtable) {
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
      for (int64_t k = i; k < end; ++k) {
        acc += LoadF(dout, dt, static_cast<int64_t>(positions[k]) * dim + j);
      }
      row[j] = acc;
    }
  }
}

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

// lse[r] = the log-sum-exp of row r's unmasked scores (nn_math::
// AttentionRowKeys; thread per row).
__global__ void RowLogSumExpKernel(const float* x, int64_t rows, int64_t cols, bool causal,
                                   int64_t q_len, int64_t heads, const int32_t* key_start,
                                   float* lse) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const nn_math::AttentionKeys keys =
      nn_math::AttentionRowKeys(r, heads, q_len, cols, causal, key_start);
  lse[r] = nn_math::RowLogSumExp(x + r * cols + keys.first, keys.end - keys.first);
}

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
  if (n <= 0) return 0;
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const unsigned blocks = Blocks((n + kCastVec - 1) / kCastVec);
  return LaunchTyped2(st, dt, [&](auto from, auto to) {
    using From = decltype(from);
    using To = decltype(to);
    CastKernel<From, To><<<blocks, kThreads, 0, S(stream)>>>(static_cast<const From*>(src),
                                                            static_cast<To*>(dst), n, vec);
  });
}
int RoundToDType(float* x, int64_t n, DType t, void* stream) {
  if (t == DType::kF32) return 0;
  SK_LAUNCH(n, RoundKernel, x, n, t);
}
int Scale(void* x, DType dt, int64_t n, float alpha, void* stream) {
  SK_LAUNCH(n, ScaleKernel, x, dt, n, alpha);
}
int Axpy(float alpha, const void* x, DType xt, void* y, DType yt, int64_t n, void* stream) {
  if (n <= 0) return 0;
  if (xt == yt) {
    const int err = TryVecMap<2, 1>(yt, {CBuf{x, xt}, CBuf{y, yt}}, {Buf{y, yt}}, n, AxpyOp{alpha},
                                    S(stream));
    if (err >= 0) return err;
  } else if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0) {
    const unsigned blocks = Blocks((n + kVec - 1) / kVec);
    return LaunchTyped2(xt, yt, [&](auto xz, auto yz) {
      using X = decltype(xz);
      using Y = decltype(yz);
      AxpyMixedVecKernel<X, Y><<<blocks, kThreads, 0, S(stream)>>>(alpha, static_cast<const X*>(x),
                                                                  static_cast<Y*>(y), n);
    });
  }
  SK_LAUNCH(n, AxpyKernel, alpha, x, xt, y, yt, n);
}
int Fill(void* x, DType dt, int64_t n, float value, void* stream) {
  SK_LAUNCH(n, FillKernel, x, dt, n, value);
}
int FillMatrix(Buf x, int64_t rows, int64_t cols, int64_t ld, float value, void* stream) {
  SK_LAUNCH(rows * cols, FillMatrixKernel, x.data, x.dtype, rows, cols, ld, value);
}
int BatchPointers(const void* a, int64_t a_seq, int64_t a_head, const void* b, int64_t b_seq,
                  int64_t b_head, const void* c, int64_t c_seq, int64_t c_head, int64_t seqs,
                  int64_t heads, const void** out, void* stream) {
  SK_LAUNCH(seqs * heads, BatchPointersKernel, static_cast<const char*>(a), a_seq, a_head,
            static_cast<const char*>(b), b_seq, b_head, static_cast<const char*>(c), c_seq,
            c_head, seqs, heads, out);
}
int InitPhilox(const Initializer& init, uint64_t seed, uint64_t param_id, int64_t begin, void* out,
               DType dt, int64_t n, void* stream) {
  SK_LAUNCH(n, InitKernel, init.kind, init.a, init.b, seed, param_id, begin, out, dt, n);
}
int BroadcastRows(CBuf src, int64_t cols, Buf dst, int64_t rows, void* stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return 0;
  if (src.dtype == dst.dtype && cols % kVec == 0 &&
      reinterpret_cast<uintptr_t>(src.data) % 16 == 0 && reinterpret_cast<uintptr_t>(dst.data) % 16 == 0) {
    const unsigned blocks = Blocks(n / kVec);
    return LaunchTyped2(src.dtype, dst.dtype, [&](auto from, auto) {
      using T = decltype(from);
      BroadcastRowsVecKernel<T><<<blocks, kThreads, 0, S(stream)>>>(
          static_cast<const T*>(src.data), cols, static_cast<T*>(dst.data), n);
    });
  }
  SK_LAUNCH(n, BroadcastRowsKernel, src.data, src.dtype, cols, dst.data, dst.dtype, rows);
}
int BiasAdd(CBuf bias, int64_t cols, Buf y, int64_t rows, void* stream) {
  SK_LAUNCH(rows * cols, BiasAddKernel, bias.data, bias.dtype, cols, y.data, y.dtype, rows);
}
int BiasGrad(CBuf dy, int64_t rows, int64_t cols, Buf dbias, float* partials, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  BiasGradPartialsKernel<<<ColumnGrid(rows, cols), kColumnTile, 0, S(stream)>>>(
      dy.data, dy.dtype, rows, cols, partials);
  const int err = Launched();
  if (err != 0) return err;
  SK_LAUNCH(cols, ColumnSumKernel, partials, ColumnChunks(rows), cols, dbias.data, dbias.dtype);
}
int GeluForward(CBuf x, int64_t n, Buf y, void* stream) {
  if (n <= 0) return 0;
  if (int err = TryVecMap<1, 1>(y.dtype, {x}, {y}, n, GeluOp{}, S(stream)); err >= 0) return err;
  SK_LAUNCH(n, GeluKernel, x.data, x.dtype, n, y.data, y.dtype);
}
int GeluBackward(CBuf x, CBuf dy, int64_t n, Buf dx, void* stream) {
  if (n <= 0) return 0;
  if (int err = TryVecMap<2, 1>(dx.dtype, {x, dy}, {dx}, n, GeluGradOp{}, S(stream)); err >= 0) {
    return err;
  }
  SK_LAUNCH(n, GeluGradKernel, x.data, x.dtype, dy.data, dy.dtype, n, dx.data, dx.dtype);
}
int SwiGluForward(CBuf gate, CBuf up, int64_t n, Buf y, void* stream) {
  if (n <= 0) return 0;
  if (int err = TryVecMap<2, 1>(y.dtype, {gate, up}, {y}, n, SwiGluOp{}, S(stream)); err >= 0) {
    return err;
  }
  SK_LAUNCH(n, SwiGluKernel, gate.data, gate.dtype, up.data, up.dtype, n, y.data, y.dtype);
}
int SwiGluBackward(CBuf gate, CBuf up, CBuf dy, int64_t n, Buf dgate, Buf dup, void* stream) {
  if (n <= 0) return 0;
  if (int err = TryVecMap<3, 2>(dgate.dtype, {gate, up, dy}, {dgate, dup}, n, SwiGluGradOp{},
                                S(stream));
      err >= 0) {
    return err;
  }
  SK_LAUNCH(n, SwiGluGradKernel, gate.data, gate.dtype, up.data, up.dtype, dy.data, dy.dtype, n,
            dgate.data, dgate.dtype, dup.data, dup.dtype);
}
int Rope(CBuf x, int64_t n, int64_t seq_len, int64_t heads, int64_t head_dim, float theta,
         const RopeScaling& scaling, bool inverse, Buf y, const int32_t* positions, void* stream) {
  SK_LAUNCH(n / 2, RopeKernel, x.data, x.dtype, n / 2, seq_len, heads, head_dim, theta, scaling,
            inverse ? -1.0f : 1.0f, y.data, y.dtype, positions);
}
int RepeatKvHeads(CBuf src, int64_t ld, int64_t rows, int64_t kv_heads, int64_t group,
                  int64_t head_dim, Buf dst, void* stream) {
  SK_LAUNCH(rows * kv_heads * group * head_dim, RepeatKvHeadsKernel, src.data, src.dtype, ld, rows,
            kv_heads, group, head_dim, dst.data, dst.dtype);
}
int SumKvHeadGroups(CBuf src, int64_t rows, int64_t kv_heads, int64_t group, int64_t head_dim,
                    Buf dst, int64_t ld, void* stream) {
  SK_LAUNCH(rows * kv_heads * head_dim, SumKvHeadGroupsKernel, src.data, src.dtype, rows, kv_heads,
            group, head_dim, dst.data, dst.dtype, ld);
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
int SoftmaxRows(float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len, int64_t heads,
                const int32_t* key_start, Buf p16, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, SoftmaxKernel, x, rows, cols, causal, q_len > 0 ? q_len : 1,
                  heads > 0 ? heads : 1, key_start, p16.data, p16.dtype);
  return Launched();
}
int SoftmaxBackwardRows(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                        Buf ds16, void* p16, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, SoftmaxGradKernel, p, dp, rows, cols, scale, ds16.data, p16,
                  ds16.dtype);
  return Launched();
}
int EmbeddingForward(CBuf table, const int32_t* ids, int64_t count, int64_t dim, Buf out,
                     void* stream) {
  SK_LAUNCH(count * dim, EmbeddingKernel, table.data, table.dtype, ids, count, dim, out.data,
            out.dtype);
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
int EmbeddingBackward(const int32_t* ids, CBuf dout, int64_t count, int64_t dim,
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
                                                            dim, vocab, dout.data, dout.dtype,
                                                            dtable);
  return Launched();
}
int CrossEntropyRowLosses(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                          float* row_loss, void* stream) {
  if (rows <= 0) return 0;  // vocab 0 (rejected by the dispatcher) writes NaN row losses
  SK_ENQUEUE_ROWS(rows, vocab, CrossEntropyRowsKernel, logits.data, logits.dtype, targets, rows,
                  vocab, row_loss);
  return Launched();
}
int CrossEntropyMean(const float* row_loss, const int32_t* targets, int64_t rows, float* loss,
                     void* stream) {
  CrossEntropyMeanKernel<<<1, kThreads, 0, S(stream)>>>(row_loss, targets, rows, loss);
  return Launched();
}
int CrossEntropyForward(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, float* loss, void* stream) {
  const int err = CrossEntropyRowLosses(logits, targets, rows, vocab, row_loss, stream);
  if (err != 0) return err;
  return CrossEntropyMean(row_loss, targets, rows, loss, stream);
}
int CrossEntropyBackward(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         Buf dlogits, int64_t* count_scratch, float scale, void* stream) {
  if (rows <= 0 || vocab <= 0) return 0;
  CountTargetsKernel<<<1, kThreads, 0, S(stream)>>>(targets, rows, count_scratch);
  const int err = Launched();
  if (err != 0) return err;
  SK_ENQUEUE_ROWS(rows, vocab, CrossEntropyGradKernel, logits.data, logits.dtype, targets, rows,
                  vocab, count_scratch, scale, dlogits.data, dlogits.dtype);
  return Launched();
}
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

int RowLogSumExp(const float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len,
                 int64_t heads, const int32_t* key_start, float* lse, void* stream) {
  if (cols <= 0) return 0;
  SK_LAUNCH(rows, RowLogSumExpKernel, x, rows, cols, causal, q_len > 0 ? q_len : 1,
            heads > 0 ? heads : 1, key_start, lse);
}

}  // namespace sk::ops::cuda
