// The CPU backend's grad-norm partials and optimizer updates (backend_common.h).

#include "runtime/ops/cpu/backend_common.h"
#include "runtime/ops/update_rules.h"

namespace sk::ops {

Status CpuBackend::SumOfSquares(const OpContext&, const Tensor& x, const Tensor& acc) {
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

Status CpuBackend::MaxAbs(const OpContext&, const Tensor& x, const Tensor& acc) {
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

Status CpuBackend::SgdUpdate(const OpContext&, const SgdHyper& hyper, const Tensor& param, const Tensor& grad,
                             const Tensor& momentum) {
  float* p = F(param);
  const float* g = F(grad);
  float* m = hyper.momentum == 0.0f ? nullptr : F(momentum);
  SplitElementwise(param.numel(), [&](int64_t b, int64_t e) {
    simd::SgdUpdate(hyper, p + b, g + b, m ? m + b : nullptr, e - b);
  });
  return OkStatus();
}

Status CpuBackend::AdamUpdate(const OpContext&, const AdamHyper& hyper, const Tensor& param,
                              const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  float* p = F(param);
  const float* g = F(grad);
  float* m = F(exp_avg);
  float* v = F(exp_avg_sq);
  SplitElementwise(param.numel(), [&](int64_t b, int64_t e) {
    simd::AdamUpdate(hyper, p + b, g + b, m + b, v + b, e - b);
  });
  return OkStatus();
}

}  // namespace sk::ops
