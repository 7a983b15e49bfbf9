// The elementwise kernels of the CUDA backend (kernels.h): cast, round,
// scale, axpy, fill, Philox init, bias broadcast and add, GELU, SwiGLU and
// RoPE. Shared helpers: kernels_common.cuh.
#include "runtime/ops/cuda/kernels_common.cuh"

namespace sk::ops::cuda {
namespace {

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

// The element functions (the generic kernels below compute the same).
struct GeluOp {
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const { y[0] = math::GeluTanh(x[0]); }
};
struct GeluGradOp {  // x, dy -> dx
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = x[1] * math::GeluTanhGrad(x[0]);
  }
};
struct SwiGluOp {  // gate, up -> y
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const { y[0] = math::Silu(x[0]) * x[1]; }
};
struct SwiGluGradOp {  // gate, up, dy -> dgate, dup
  __device__ void operator()(const float (&x)[3], float (&y)[2]) const {
    y[0] = x[2] * x[1] * math::SiluGrad(x[0]);
    y[1] = x[2] * math::Silu(x[0]);
  }
};

struct AxpyOp {  // x, y -> y
  float alpha;
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = x[1] + (alpha == 1.0f ? x[0] : alpha * x[0]);
  }
};

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
  if (i < n) StoreF(y, yt, i, math::GeluTanh(LoadF(x, xt, i)));
}

// dx may be dy (one dtype then).
__global__ void GeluGradKernel(const void* x, DType xt, const void* dy, DType dyt, int64_t n,
                               void* dx, DType dxt) {
  int64_t i = Index();
  if (i < n) StoreF(dx, dxt, i, LoadF(dy, dyt, i) * math::GeluTanhGrad(LoadF(x, xt, i)));
}

// ---- Llama-family elementwise kernels (math.h's arithmetic) ----------------

__global__ void SwiGluKernel(const void* gate, DType gt, const void* up, DType ut, int64_t n,
                             void* y, DType yt) {
  int64_t i = Index();
  if (i < n) StoreF(y, yt, i, math::Silu(LoadF(gate, gt, i)) * LoadF(up, ut, i));
}

__global__ void SwiGluGradKernel(const void* gate, DType gt, const void* up, DType ut,
                                 const void* dy, DType dyt, int64_t n, void* dgate, DType dgt,
                                 void* dup, DType dut) {
  int64_t i = Index();
  if (i >= n) return;
  const float g = LoadF(gate, gt, i), u = LoadF(up, ut, i), d = LoadF(dy, dyt, i);
  StoreF(dgate, dgt, i, d * u * math::SiluGrad(g));
  StoreF(dup, dut, i, d * math::Silu(g));
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
  math::RopePair(LoadF(x, xt, o), LoadF(x, xt, o + half),
                    math::RopeAngle(math::RopePosition(u / heads, seq_len, positions), i,
                                       head_dim, theta, scaling),
                    sign, &a, &b);
  StoreF(y, yt, o, a);
  StoreF(y, yt, o + half, b);
}

}  // namespace

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

}  // namespace sk::ops::cuda
