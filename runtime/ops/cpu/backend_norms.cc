// The CPU backend's LayerNorm and RMSNorm (backend_common.h).

#include "runtime/ops/cpu/backend_common.h"
#include "runtime/ops/math.h"

namespace sk::ops {

Status CpuBackend::LayerNormForward(const OpContext&, const Tensor& x, const Tensor& gamma,
                                    const Tensor& beta, const Tensor& y, const Tensor& mean,
                                    const Tensor& rstd) {
  const int64_t cols = gamma.numel();
  const int64_t rows = x.numel() / cols;
  if (IsF32(x) && IsF32(gamma) && IsF32(beta) && IsF32(y)) {
    // Rows are independent: ranges of them in parallel.
    SplitRange(rows, std::max<int64_t>(1, kMinPassPart / std::max<int64_t>(1, cols)), 1,
               [&](int64_t b, int64_t e) {
                 sk::LayerNormForward(F(x) + b * cols, F(gamma), F(beta), e - b, cols,
                                      F(y) + b * cols, F(mean) + b, F(rstd) + b);
               });
    return OkStatus();
  }
  const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
  const float* b = InF32(beta, 0, cols, Scratch(1, cols));
  float* bx = Scratch(2, cols);
  float* by = Scratch(3, cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = OutF32(y, r * cols, by);
    sk::LayerNormForward(InF32(x, r * cols, cols, bx), g, b, 1, cols, yr, F(mean) + r,
                         F(rstd) + r);
    OutDone(y, r * cols, cols, yr);
  }
  return OkStatus();
}

Status CpuBackend::LayerNormBackward(const OpContext&, const Tensor& x, const Tensor& gamma,
                                     const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t cols = gamma.numel();
  const int64_t rows = x.numel() / cols;
  if (IsF32(x) && IsF32(gamma) && IsF32(dy) && IsF32(dx) && IsF32(dgamma) && IsF32(dbeta)) {
    sk::LayerNormBackward(F(x), F(gamma), F(dy), F(mean), F(rstd), rows, cols, F(dx),
                          F(dgamma), F(dbeta));
    return OkStatus();
  }
  const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
  // dgamma and dbeta accumulate in f32 over every row, rounded once.
  float* dg = InF32(dgamma, 0, cols, Scratch(1, cols));
  float* db = InF32(dbeta, 0, cols, Scratch(2, cols));
  float* bx = Scratch(3, cols);
  float* bdy = Scratch(4, cols);
  float* bdx = Scratch(5, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * cols;
    float* dxr = InF32(dx, o, cols, bdx);
    sk::LayerNormBackward(InF32(x, o, cols, bx), g, InF32(dy, o, cols, bdy), F(mean) + r,
                          F(rstd) + r, 1, cols, dxr, dg, db);
    OutDone(dx, o, cols, dxr);
  }
  OutDone(dgamma, 0, cols, dg);
  OutDone(dbeta, 0, cols, db);
  return OkStatus();
}

// The Llama-family ops: rows (or chunks) widened into f32 scratch when
// 16-bit, the vector loops of simd.h (RMSNorm's row sums in lanes) or
// math.h's row functions, each 16-bit output rounded once. Rows
// are independent in forward (ranges of them in parallel); RMSNorm's
// backward sums dgamma over rows in row order on one thread.
Status CpuBackend::RmsNormForward(const OpContext&, const Tensor& x, const Tensor& gamma, float eps,
                                  const Tensor& y, const Tensor& rstd) {
  const int64_t cols = gamma.numel();
  const int64_t rows = x.numel() / cols;
  SplitRange(rows, std::max<int64_t>(1, kMinPassPart / cols), 1, [&](int64_t b, int64_t e) {
    const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
    float* bx = Scratch(1, cols);
    float* by = Scratch(2, cols);
    for (int64_t r = b; r < e; ++r) {
      float* yr = OutF32(y, r * cols, by);
      simd::RmsNormForward(InF32(x, r * cols, cols, bx), g, 1, cols, eps, yr, F(rstd) + r);
      OutDone(y, r * cols, cols, yr);
    }
  });
  return OkStatus();
}

Status CpuBackend::RmsNormBackward(const OpContext&, const Tensor& x, const Tensor& gamma, const Tensor& dy,
                                   const Tensor& rstd, const Tensor& dx, const Tensor& dgamma) {
  const int64_t cols = gamma.numel();
  const int64_t rows = x.numel() / cols;
  const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
  float* dg = InF32(dgamma, 0, cols, Scratch(1, cols));  // f32 over every row, rounded once
  float* bx = Scratch(2, cols);
  float* bdy = Scratch(3, cols);
  float* bdx = Scratch(4, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * cols;
    float* dxr = InF32(dx, o, cols, bdx);
    simd::RmsNormBackward(InF32(x, o, cols, bx), g, InF32(dy, o, cols, bdy), F(rstd) + r, 1,
                          cols, dxr, dg);
    OutDone(dx, o, cols, dxr);
  }
  OutDone(dgamma, 0, cols, dg);
  return OkStatus();
}

}  // namespace sk::ops
