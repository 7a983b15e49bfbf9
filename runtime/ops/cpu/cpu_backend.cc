#include "runtime/ops/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/cpu/simd.h"

namespace sk::ops {

namespace {

// Runs fn(begin, end) over [0, n) split across up to GemmThreads() threads
// (the intra-op thread count: cores / local ranks, so one rank per core
// stays on one thread) when each part gets at least kMinPerThread
// elements: the optimizer updates over a large flat shard are memory-bound
// and one thread reaches a fraction of the socket's bandwidth (FSDP's CPU
// offload runs AdamW over the whole model on the host). Elementwise with no
// cross-element arithmetic and masked vector tails, so the bits are those of
// one call for any split. The calling thread takes the first part; if a
// thread cannot be started its part runs here.
template <typename Fn>
void SplitElementwise(int64_t n, const Fn& fn) {
  constexpr int64_t kMinPerThread = int64_t{1} << 20;
  constexpr int64_t kAlign = 1024;
  const int64_t parts = std::min<int64_t>(GemmThreads(), n / kMinPerThread);
  if (parts <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = ((n + parts - 1) / parts + kAlign - 1) / kAlign * kAlign;
  std::vector<std::thread> helpers;
  for (int64_t b = chunk; b < n; b += chunk) {
    const int64_t e = std::min(n, b + chunk);
    try {
      helpers.emplace_back([&fn, b, e] { fn(b, e); });
    } catch (const std::system_error&) {
      fn(b, e);
    }
  }
  fn(int64_t{0}, std::min(n, chunk));
  for (std::thread& t : helpers) t.join();
}

float* F(const Tensor& t) { return t.data_as<float>(); }
float* At(const MatrixRef& m) { return m.t.data_as<float>() + m.offset; }

// The matrix `m` of rows x cols (of any float dtype) widened into a
// contiguous f32 buffer, batch by batch.
std::vector<float> Widen(const MatrixRef& m, int64_t rows, int64_t cols, int64_t batch) {
  std::vector<float> out(static_cast<size_t>(rows * cols * batch));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      const size_t src = static_cast<size_t>(m.offset + b * m.batch_stride + i * m.ld);
      float* dst = out.data() + (b * rows + i) * cols;
      for (int64_t j = 0; j < cols; ++j) dst[j] = LoadAsFloat(m.t.data(), m.t.dtype(), src + j);
    }
  }
  return out;
}

class CpuBackend final : public OpBackend {
 public:
  const char* name() const override { return "cpu"; }
  bool executes() const override { return true; }

  Status Gemm(const OpContext&, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
              const MatrixRef& c) override {
    if (p.m == 0 || p.n == 0 || p.batch == 0) return OkStatus();
    if (p.k == 0) {  // C = beta C; the libraries disagree about empty products.
      for (int64_t i = 0; i < p.batch; ++i) {
        for (int64_t r = 0; r < p.m; ++r) {
          float* row = At(c) + i * c.batch_stride + r * c.ld;
          for (int64_t j = 0; j < p.n; ++j) row[j] = p.beta == 0.0f ? 0.0f : p.beta * row[j];
        }
      }
      return OkStatus();
    }
    const DType t = a.t.dtype();
    if (t == DType::kF32) {
      for (int64_t i = 0; i < p.batch; ++i) {
        sk::Gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, At(a) + i * a.batch_stride, a.ld,
                 At(b) + i * b.batch_stride, b.ld, p.beta, At(c) + i * c.batch_stride, c.ld);
      }
      return OkStatus();
    }
    // bf16 through oneDNN's bf16 matmul only where the CPU has bf16
    // dot-product instructions (NativeBf16Gemm); otherwise widening and the
    // f32 GEMM below is faster and gives the same numbers up to summation order.
    if (t == DType::kBF16 && NativeBf16Gemm() && p.alpha == 1.0f &&
        (p.beta == 0.0f || p.beta == 1.0f)) {
      const BF16* ab = a.t.data_as<BF16>() + a.offset;
      const BF16* bb = b.t.data_as<BF16>() + b.offset;
      for (int64_t i = 0; i < p.batch; ++i) {
        GemmBF16(p.trans_a, p.trans_b, p.m, p.n, p.k, ab + i * a.batch_stride, a.ld,
                 bb + i * b.batch_stride, b.ld, p.beta == 1.0f, At(c) + i * c.batch_stride, c.ld);
      }
      return OkStatus();
    }
    // Other 16-bit cases (and bf16 without bf16 hardware): widen exactly to
    // f32 and use the f32 GEMM.
    const int64_t ar = p.trans_a ? p.k : p.m, ac = p.trans_a ? p.m : p.k;
    const int64_t br = p.trans_b ? p.n : p.k, bc = p.trans_b ? p.k : p.n;
    std::vector<float> wa = Widen(a, ar, ac, p.batch);
    std::vector<float> wb = Widen(b, br, bc, p.batch);
    for (int64_t i = 0; i < p.batch; ++i) {
      sk::Gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, wa.data() + i * ar * ac, ac,
               wb.data() + i * br * bc, bc, p.beta, At(c) + i * c.batch_stride, c.ld);
    }
    return OkStatus();
  }

  Status Copy(const OpContext&, const Tensor& src, const Tensor& dst) override {
    if (src.nbytes() > 0) std::memcpy(dst.data(), src.data(), src.nbytes());
    return OkStatus();
  }

  Status Cast(const OpContext&, const Tensor& src, const Tensor& dst) override {
    return ConvertElements(src.data(), src.dtype(), dst.data(), dst.dtype(),
                           static_cast<size_t>(src.numel()));
  }

  Status RoundToDType(const OpContext&, const Tensor& x, DType t) override {
    RoundToDTypeInPlace(F(x), x.numel(), t);
    return OkStatus();
  }

  Status Scale(const OpContext&, const Tensor& x, float alpha) override {
    const int64_t n = x.numel();
    if (x.dtype() == DType::kF32) {
      simd::ScaleInPlace(F(x), alpha, n);
      return OkStatus();
    }
    for (int64_t i = 0; i < n; ++i) {
      StoreFromFloat(x.data(), x.dtype(), i, LoadAsFloat(x.data(), x.dtype(), i) * alpha);
    }
    return OkStatus();
  }

  Status Axpy(const OpContext&, float alpha, const Tensor& x, const Tensor& y) override {
    const int64_t n = x.numel();
    if (x.dtype() == DType::kF32) {
      const float* xs = F(x);
      if (alpha == 1.0f) {
        // y += x exactly as a plain add (AccumulateFromF32's rounding).
        AccumulateFromF32(xs, n, y.data(), y.dtype());
        return OkStatus();
      }
      if (y.dtype() == DType::kF32) {
        simd::Axpy(alpha, xs, F(y), n);
        return OkStatus();
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      float v = LoadAsFloat(y.data(), y.dtype(), i) + alpha * LoadAsFloat(x.data(), x.dtype(), i);
      StoreFromFloat(y.data(), y.dtype(), i, v);
    }
    return OkStatus();
  }

  Status Fill(const OpContext&, const Tensor& x, float value) override {
    const int64_t n = x.numel();
    switch (x.dtype()) {
      case DType::kF32: std::fill(F(x), F(x) + n, value); break;
      case DType::kBF16: std::fill(x.data_as<BF16>(), x.data_as<BF16>() + n, FloatToBF16(value)); break;
      case DType::kF16: std::fill(x.data_as<F16>(), x.data_as<F16>() + n, FloatToF16(value)); break;
      default: LOG(FATAL) << "fill: dtype not validated";
    }
    return OkStatus();
  }

  Status InitPhilox(const OpContext&, const Initializer& init, uint64_t seed, uint64_t param_id,
                    int64_t begin, const Tensor& out) override {
    return InitializeTensorSlice(init, seed, param_id, begin, out);
  }

  Status BroadcastRows(const OpContext&, const Tensor& src, const Tensor& dst) override {
    const int64_t cols = src.numel();
    if (cols == 0) return OkStatus();
    const int64_t rows = dst.numel() / cols;
    for (int64_t r = 0; r < rows; ++r) std::memcpy(F(dst) + r * cols, F(src), sizeof(float) * cols);
    return OkStatus();
  }

  Status BiasAdd(const OpContext&, const Tensor& bias, const Tensor& y) override {
    const int64_t cols = bias.numel();
    if (cols == 0) return OkStatus();
    const int64_t rows = y.numel() / cols;
    for (int64_t r = 0; r < rows; ++r) AddInPlace(F(y) + r * cols, F(bias), cols);
    return OkStatus();
  }

  Status BiasGrad(const OpContext&, const Tensor& dy, const Tensor& dbias) override {
    const int64_t cols = dbias.numel();
    if (cols == 0) return OkStatus();
    const int64_t rows = dy.numel() / cols;
    for (int64_t r = 0; r < rows; ++r) AddInPlace(F(dbias), F(dy) + r * cols, cols);
    return OkStatus();
  }

  Status GeluForward(const OpContext&, const Tensor& x, const Tensor& y) override {
    sk::GeluForward(F(x), x.numel(), F(y));
    return OkStatus();
  }

  Status GeluBackward(const OpContext&, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override {
    sk::GeluBackward(F(x), F(dy), x.numel(), F(dx));
    return OkStatus();
  }

  Status LayerNormForward(const OpContext&, const Tensor& x, const Tensor& gamma,
                          const Tensor& beta, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd) override {
    const int64_t cols = gamma.numel();
    sk::LayerNormForward(F(x), F(gamma), F(beta), x.numel() / cols, cols, F(y), F(mean), F(rstd));
    return OkStatus();
  }

  Status LayerNormBackward(const OpContext&, const Tensor& x, const Tensor& gamma,
                           const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override {
    const int64_t cols = gamma.numel();
    sk::LayerNormBackward(F(x), F(gamma), F(dy), F(mean), F(rstd), x.numel() / cols, cols, F(dx),
                          F(dgamma), F(dbeta));
    return OkStatus();
  }

  Status AttentionForward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& out) override {
    if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return OkStatus();
    sk::AttentionForward(s, At(q), q.ld, At(k), k.ld, At(v), v.ld, F(probs), At(out), out.ld);
    return OkStatus();
  }

  Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                           const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                           const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                           const MatrixRef& dv, const Tensor& scratch) override {
    if (s.batch == 0 || s.heads == 0) return OkStatus();
    if (s.q_len == 0) {
      // No query attends: the key and value gradients are zero.
      for (const MatrixRef* m : {&dk, &dv}) {
        for (int64_t r = 0; r < s.batch * s.kv_len; ++r) {
          std::memset(At(*m) + r * m->ld, 0, sizeof(float) * s.heads * s.head_dim);
        }
      }
      return OkStatus();
    }
    // One head's score gradients at a time: the first q_len * kv_len of it.
    sk::AttentionBackward(s, At(q), q.ld, At(k), k.ld, At(v), v.ld, F(probs), At(dout), dout.ld,
                          At(dq), dq.ld, At(dk), dk.ld, At(dv), dv.ld, F(scratch));
    return OkStatus();
  }

  Status EmbeddingForward(const OpContext&, const Tensor& table, const Tensor& ids,
                          const Tensor& out) override {
    sk::EmbeddingForward(F(table), ids.data_as<int32_t>(), ids.numel(), table.shape().dim(1),
                         F(out));
    return OkStatus();
  }

  Status EmbeddingBackward(const OpContext&, const Tensor& ids, const Tensor& dout,
                           const Tensor& dtable) override {
    sk::EmbeddingBackward(ids.data_as<int32_t>(), F(dout), ids.numel(), dtable.shape().dim(1),
                          F(dtable));
    return OkStatus();
  }

  Status CrossEntropyForward(const OpContext&, const Tensor& logits, const Tensor& targets,
                             const Tensor& loss) override {
    const int64_t rows = targets.numel();
    const int64_t vocab = rows == 0 ? 0 : logits.numel() / rows;
    int64_t count = 0;
    *F(loss) = sk::CrossEntropyForward(F(logits), targets.data_as<int32_t>(), rows, vocab, &count);
    return OkStatus();
  }

  Status CrossEntropyBackward(const OpContext&, const Tensor& logits, const Tensor& targets,
                              const Tensor& dlogits) override {
    const int64_t rows = targets.numel();
    if (rows == 0) return OkStatus();
    const int64_t vocab = logits.numel() / rows;
    const int32_t* t = targets.data_as<int32_t>();
    int64_t count = 0;
    for (int64_t r = 0; r < rows; ++r) count += t[r] != kIgnoreTarget;
    const float scale = count == 0 ? 0.0f : 1.0f / static_cast<float>(count);
    sk::CrossEntropyBackward(F(logits), t, rows, vocab, scale, F(dlogits));
    return OkStatus();
  }

  Status SumOfSquares(const OpContext&, const Tensor& x, const Tensor& acc) override {
    double a = *acc.data_as<double>();
    const int64_t n = x.numel();
    if (x.dtype() == DType::kF32) {
      a = simd::SumOfSquares(F(x), n, a);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        double v = LoadAsFloat(x.data(), x.dtype(), i);
        a += v * v;
      }
    }
    *acc.data_as<double>() = a;
    return OkStatus();
  }

  Status MaxAbs(const OpContext&, const Tensor& x, const Tensor& acc) override {
    double a = *acc.data_as<double>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      double v = x.dtype() == DType::kF32 ? static_cast<double>(F(x)[i])
                                          : static_cast<double>(LoadAsFloat(x.data(), x.dtype(), i));
      a = std::max(a, std::fabs(v));
    }
    *acc.data_as<double>() = a;
    return OkStatus();
  }

  Status SgdUpdate(const OpContext&, const SgdHyper& hyper, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum) override {
    float* p = F(param);
    const float* g = F(grad);
    float* m = hyper.momentum == 0.0f ? nullptr : F(momentum);
    SplitElementwise(param.numel(), [&](int64_t b, int64_t e) {
      simd::SgdUpdate(hyper, p + b, g + b, m ? m + b : nullptr, e - b);
    });
    return OkStatus();
  }

  Status AdamUpdate(const OpContext&, const AdamHyper& hyper, const Tensor& param, const Tensor& grad,
                    const Tensor& exp_avg, const Tensor& exp_avg_sq) override {
    float* p = F(param);
    const float* g = F(grad);
    float* m = F(exp_avg);
    float* v = F(exp_avg_sq);
    SplitElementwise(param.numel(), [&](int64_t b, int64_t e) {
      simd::AdamUpdate(hyper, p + b, g + b, m + b, v + b, e - b);
    });
    return OkStatus();
  }

  StatusOr<double> ReadScalar(const OpContext&, const Tensor& t) override {
    switch (t.dtype()) {
      case DType::kF64: return *t.data_as<double>();
      case DType::kI32: return static_cast<double>(*t.data_as<int32_t>());
      default: return static_cast<double>(LoadAsFloat(t.data(), t.dtype(), 0));
    }
  }
};

}  // namespace

Status SetCpuGemmThreads(int n) { return SetGemmThreads(n); }

int CpuGemmThreads() { return GemmThreads(); }

OpBackend* CpuOpBackend() {
  static CpuBackend* backend = new CpuBackend();
  return backend;
}

}  // namespace sk::ops
