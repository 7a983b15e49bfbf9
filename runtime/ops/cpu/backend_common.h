// The CPU backend's class and what its op families share; private to
// //runtime/ops:cpu (cpu_backend.h is the public interface). The backend's
// methods live by op family, as the op layer's dispatchers do:
//   cpu_backend.cc          the backend object and its registration, the
//                           threads' f32 scratch
//   backend_gemm.cc         Gemm, GemmBias (16-bit operands widened in blocks)
//   backend_data.cc         Copy, Cast, RoundToDType, Scale, Axpy, Fill,
//                           InitPhilox, ReadScalar, ReadValues
//   backend_elementwise.cc  bias, GELU, RoPE, SwiGLU
//   backend_norms.cc        LayerNorm, RMSNorm
//   backend_attention.cc    the composed attention and attention in linear
//                           memory, and how they spread over threads
//   backend_embedding.cc    embedding
//   backend_loss.cc         cross-entropy
//   backend_optimizer.cc    grad-norm partials, SGD, Adam
//
// The model ops take f32, bf16 and f16 operands in any mix
// (Native16Bit): 16-bit operands are widened a row or a chunk at a time
// into the calling thread's f32 scratch (vectorised, exact), the f32 loop
// runs on it, and 16-bit outputs are rounded once when stored back. Per
// row and per chunk the arithmetic is the f32 path's, so the results are
// the f32 op's on widened copies, rounded once: what the dispatcher's
// whole-tensor staging gave, bit for bit.
//
// The helpers below have internal linkage on purpose (an unnamed namespace,
// as in the one file they came from): each family file inlines its own
// copies. Scratch is the exception: one set of buffers per thread for every
// family, defined in cpu_backend.cc.
#ifndef SHARDKIT_RUNTIME_OPS_CPU_BACKEND_COMMON_H_
#define SHARDKIT_RUNTIME_OPS_CPU_BACKEND_COMMON_H_

#include <algorithm>
#include <cstring>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "runtime/ops/backend.h"
#include "runtime/ops/cpu/flash_attention.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/cpu/simd.h"

namespace sk::ops {

// The calling thread's f32 scratch buffers (8 slots, each grown to the
// largest size asked for and kept): the f32 rows and chunks that 16-bit
// operands are widened into and narrowed from, small enough to stay in
// cache, instead of whole-tensor f32 copies.
float* Scratch(int slot, int64_t n);

namespace {

// The sanitizer builds run parts on std::threads: ThreadSanitizer does not
// see libgomp's synchronisation (libgomp is not instrumented), so OpenMP
// regions would report races that are not there.
#if defined(__SANITIZE_THREAD__)
#define SK_CPU_PARTS_ON_STD_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SK_CPU_PARTS_ON_STD_THREADS 1
#endif
#endif

// Runs fn(p) for every part p in [0, parts) and returns when all have run.
// Part 0 runs on the calling thread. The others run on the calling
// thread's OpenMP team, the threads oneDNN's GEMMs run on: they stay alive
// between calls (their thread-local scratch with them) and, right after a
// GEMM, are still spinning for work. Threads of our own would have to take
// the core from a spinning OpenMP thread: measured on 2 cores after a
// 2-thread GEMM, causal attention on two std::threads per call ran no
// faster than on one (gpt-10m shapes 10.4 against 10.3 ms forward). fn
// must not throw.
template <typename Fn>
inline void RunParts(int64_t parts, const Fn& fn) {
  if (parts <= 1) {
    fn(int64_t{0});
    return;
  }
#if defined(SK_CPU_PARTS_ON_STD_THREADS)
  std::vector<std::thread> helpers;
  for (int64_t p = 1; p < parts; ++p) {
    try {
      helpers.emplace_back([&fn, p] { fn(p); });
    } catch (const std::system_error&) {
      fn(p);  // a part whose thread cannot be started runs here
    }
  }
  fn(int64_t{0});
  for (std::thread& t : helpers) t.join();
#else
#pragma omp parallel for num_threads(static_cast<int>(parts)) schedule(static, 1)
  for (int64_t p = 0; p < parts; ++p) fn(p);
#endif
}

// Runs fn(begin, end) over [0, n) split across up to GemmThreads() threads
// (the intra-op thread count: cores / local ranks, so one rank per core
// stays on one thread), each part at least min_per_part long and, but for
// the last, a multiple of align. For work whose bits do not depend on where
// [0, n) is cut: elementwise loops (masked vector tails: align keeps the
// cuts on whole vectors) and independent rows or columns.
template <typename Fn>
inline void SplitRange(int64_t n, int64_t min_per_part, int64_t align, const Fn& fn) {
  const int64_t parts = std::min<int64_t>(GemmThreads(), n / std::max<int64_t>(1, min_per_part));
  if (parts <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = ((n + parts - 1) / parts + align - 1) / align * align;
  RunParts((n + chunk - 1) / chunk,
           [&fn, n, chunk](int64_t p) { fn(p * chunk, std::min(n, (p + 1) * chunk)); });
}

// The optimizer updates over a large flat shard are memory-bound and one
// thread reaches a fraction of the socket's bandwidth (FSDP's CPU offload
// runs AdamW over the whole model on the host): parts of at least 2^20.
template <typename Fn>
inline void SplitElementwise(int64_t n, const Fn& fn) {
  SplitRange(n, int64_t{1} << 20, 1024, fn);
}

// The model's per-element and per-row passes (GELU, LayerNorm forward, a
// bias broadcast or gradient) in parts of at least 2^16 elements, whole
// vectors: they run a few microseconds per part, well above an OpenMP
// dispatch to a team that is awake.
constexpr int64_t kMinPassPart = int64_t{1} << 16;
constexpr int64_t kVectorAlign = 16;

inline float* F(const Tensor& t) { return t.data_as<float>(); }
inline float* At(const MatrixRef& m) { return m.t.data_as<float>() + m.offset; }

inline bool IsF32(const Tensor& t) { return t.dtype() == DType::kF32; }

// Element i of t's buffer, for any dtype.
inline void* Elem(const Tensor& t, int64_t i) {
  return static_cast<char*>(t.data()) + i * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// n elements of dtype t at src widened exactly into f32 (vectorised for bf16).
inline void ToF32(const void* src, DType t, int64_t n, float* dst) {
  if (t == DType::kBF16) {
    simd::WidenBf16(static_cast<const BF16*>(src), n, dst);
  } else {
    WidenToF32(src, t, n, dst);
  }
}

// n f32 values stored into dtype t at dst, rounded to nearest even once.
inline void FromF32(const float* src, int64_t n, void* dst, DType t) {
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, sizeof(float) * n); return;
    case DType::kBF16: simd::NarrowToBf16(src, n, static_cast<BF16*>(dst)); return;
    default:
      for (int64_t i = 0; i < n; ++i) StoreFromFloat(dst, t, i, src[i]);
  }
}

// Elements [i, i + n) of t as f32: t's own memory when f32, otherwise
// widened into `buf` (which then holds them).
inline float* InF32(const Tensor& t, int64_t i, int64_t n, float* buf) {
  if (IsF32(t)) return F(t) + i;
  ToF32(Elem(t, i), t.dtype(), n, buf);
  return buf;
}
// Where an f32 result for elements [i, i + n) of t goes: t itself when f32,
// otherwise `buf`, narrowed into t by OutDone.
inline float* OutF32(const Tensor& t, int64_t i, float* buf) { return IsF32(t) ? F(t) + i : buf; }
inline void OutDone(const Tensor& t, int64_t i, int64_t n, const float* buf) {
  if (!IsF32(t)) FromF32(buf, n, Elem(t, i), t.dtype());
}

// Elementwise ops on 16-bit operands run over chunks of this many elements
// (three f32 chunks fit in L1).
constexpr int64_t kChunk = 2048;

// Runs body(i, c) over [0, n) in chunks of at most kChunk.
template <typename Body>
inline void ForChunks(int64_t n, Body body) {
  for (int64_t i = 0; i < n; i += kChunk) body(i, std::min(kChunk, n - i));
}

}  // namespace

class CpuBackend final : public OpBackend {
 public:
  const char* name() const override { return "cpu"; }
  bool executes() const override { return true; }

  // A 16-bit C is stored here (f32 accumulation, rounded once): no f32
  // staging of the whole C by the dispatcher. For k = 0 (C = beta C) the
  // dispatcher stages a 16-bit C.
  bool GemmStores16Bit(const GemmParams& p) const override { return p.k > 0; }
  // Every model op takes its 16-bit operands itself (bf16 conversions
  // vectorised, f16 through core/dtype.h's scalar ones), computing exactly
  // what the dispatcher's staging would (backend_common.h).
  bool Native16Bit(std::string_view op) const override { return IsStagedModelOp(op); }

  // A bf16 linear layer on bf16 hardware: the bias inside oneDNN's matmul
  // (kernels.h: GemmBF16Bias; the two-op form up to f32 summation order), so the
  // activation is written once, not broadcast into and read back. Elsewhere
  // the dispatcher's two ops (f32 keeps its GEMM library and its bits).
  bool GemmAddsBias(const GemmParams& p, DType ab, DType bias, DType c) const override {
    return ab == DType::kBF16 && bias == DType::kBF16 && (c == DType::kBF16 || c == DType::kF32) &&
           p.alpha == 1.0f && NativeBf16Gemm();
  }
  // Linear-memory attention (cpu/flash_attention.h), f32 only: the
  // dispatcher stages 16-bit operands (Native16Bit says false for it).
  bool PrefersFlashAttention(const AttentionShape& s, DType) const override {
    return CpuPrefersFlashAttention(s);
  }

  // GEMMs (cpu/backend_gemm.cc).
  Status GemmBias(const OpContext&, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                  const Tensor& bias, const MatrixRef& c) override;
  Status Gemm(const OpContext&, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
              const MatrixRef& c) override;

  // Copies, casts, fills and reads (cpu/backend_data.cc).
  Status Copy(const OpContext&, const Tensor& src, const Tensor& dst) override;
  Status Cast(const OpContext&, const Tensor& src, const Tensor& dst) override;
  Status RoundToDType(const OpContext&, const Tensor& x, DType t) override;
  Status Scale(const OpContext&, const Tensor& x, float alpha) override;
  Status Axpy(const OpContext&, float alpha, const Tensor& x, const Tensor& y) override;
  Status Fill(const OpContext&, const Tensor& x, float value) override;
  Status InitPhilox(const OpContext&, const Initializer& init, uint64_t seed, uint64_t param_id,
                    int64_t begin, const Tensor& out) override;
  StatusOr<double> ReadScalar(const OpContext&, const Tensor& t) override;
  Status ReadValues(const OpContext&, const Tensor& t, double* out) override;

  // Bias, GELU, RoPE, SwiGLU (cpu/backend_elementwise.cc).
  Status BroadcastRows(const OpContext&, const Tensor& src, const Tensor& dst) override;
  Status BiasAdd(const OpContext&, const Tensor& bias, const Tensor& y) override;
  Status BiasGrad(const OpContext&, const Tensor& dy, const Tensor& dbias) override;
  Status GeluForward(const OpContext&, const Tensor& x, const Tensor& y) override;
  Status GeluBackward(const OpContext&, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override;
  Status Rope(const OpContext&, const Tensor& x, int64_t seq_len, int64_t heads,
              int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
              const Tensor& y, const Tensor& positions) override;
  Status SwiGluForward(const OpContext&, const Tensor& gate, const Tensor& up,
                       const Tensor& y) override;
  Status SwiGluBackward(const OpContext&, const Tensor& gate, const Tensor& up, const Tensor& dy,
                        const Tensor& dgate, const Tensor& dup) override;

  // LayerNorm, RMSNorm (cpu/backend_norms.cc).
  Status LayerNormForward(const OpContext&, const Tensor& x, const Tensor& gamma,
                          const Tensor& beta, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd) override;
  Status LayerNormBackward(const OpContext&, const Tensor& x, const Tensor& gamma,
                           const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override;
  Status RmsNormForward(const OpContext&, const Tensor& x, const Tensor& gamma, float eps,
                        const Tensor& y, const Tensor& rstd) override;
  Status RmsNormBackward(const OpContext&, const Tensor& x, const Tensor& gamma, const Tensor& dy,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dgamma) override;

  // Attention, composed and in linear memory (cpu/backend_attention.cc).
  Status AttentionForward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& out) override;
  Status AttentionBackward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                           const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                           const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                           const MatrixRef& dv, const Tensor& scratch) override;
  Status FlashAttentionForward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                               const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                               const Tensor& lse) override;
  Status FlashAttentionBackward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                                const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                                const MatrixRef& dk, const MatrixRef& dv,
                                const Tensor& workspace) override;

  // Embedding (cpu/backend_embedding.cc).
  Status EmbeddingForward(const OpContext&, const Tensor& table, const Tensor& ids,
                          const Tensor& out) override;
  Status EmbeddingBackward(const OpContext&, const Tensor& ids, const Tensor& dout,
                           const Tensor& dtable) override;

  // Cross-entropy (cpu/backend_loss.cc).
  Status CrossEntropyForward(const OpContext&, const Tensor& logits, const Tensor& targets,
                             const Tensor& loss) override;
  Status CrossEntropyBackward(const OpContext&, const Tensor& logits, const Tensor& targets,
                              const Tensor& dlogits, float given_scale) override;
  Status CrossEntropyRowLosses(const OpContext&, const Tensor& logits, const Tensor& targets,
                               const Tensor& row_loss) override;
  Status CrossEntropyMean(const OpContext&, const Tensor& row_loss, const Tensor& targets,
                          const Tensor& loss) override;

  // Gradient norms and the optimizer updates (cpu/backend_optimizer.cc).
  Status SumOfSquares(const OpContext&, const Tensor& x, const Tensor& acc) override;
  Status MaxAbs(const OpContext&, const Tensor& x, const Tensor& acc) override;
  Status SgdUpdate(const OpContext&, const SgdHyper& hyper, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum) override;
  Status AdamUpdate(const OpContext&, const AdamHyper& hyper, const Tensor& param, const Tensor& grad,
                    const Tensor& exp_avg, const Tensor& exp_avg_sq) override;
};

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CPU_BACKEND_COMMON_H_
