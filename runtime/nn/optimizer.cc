#include "runtime/nn/optimizer.h"

#include <cmath>

namespace sk {
namespace {

Status CheckPairs(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  if (params.size() != grads.size()) {
    return InvalidArgumentError("optimizer: " + std::to_string(params.size()) + " parameters but " +
                                std::to_string(grads.size()) + " gradients");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const Tensor& g = grads[i];
    if (!p.defined() || !g.defined() || p.dtype() != DType::kF32 || g.dtype() != DType::kF32 ||
        !p.device().is_cpu() || !g.device().is_cpu()) {
      return InvalidArgumentError("optimizer: pair " + std::to_string(i) +
                                  " is not two f32 host tensors");
    }
    if (p.shape() != g.shape()) {
      return InvalidArgumentError("optimizer: pair " + std::to_string(i) + " has parameter shape " +
                                  p.shape().ToString() + " but gradient shape " +
                                  g.shape().ToString());
    }
  }
  return OkStatus();
}

}  // namespace

Status SgdStep(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, float lr) {
  SK_RETURN_IF_ERROR(CheckPairs(params, grads));
  for (size_t i = 0; i < params.size(); ++i) {
    float* p = params[i].data_as<float>();
    const float* g = grads[i].data_as<float>();
    const int64_t n = params[i].numel();
    for (int64_t j = 0; j < n; ++j) p[j] -= lr * g[j];
  }
  return OkStatus();
}

Status Adam::Step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  SK_RETURN_IF_ERROR(CheckPairs(params, grads));
  if (m_.empty()) {
    for (const Tensor& p : params) {
      m_.emplace_back(static_cast<size_t>(p.numel()), 0.0f);
      v_.emplace_back(static_cast<size_t>(p.numel()), 0.0f);
    }
  }
  if (m_.size() != params.size()) {
    return InvalidArgumentError("Adam: stepped with " + std::to_string(params.size()) +
                                " parameters, state has " + std::to_string(m_.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (static_cast<size_t>(params[i].numel()) != m_[i].size()) {
      return InvalidArgumentError("Adam: parameter " + std::to_string(i) + " changed size");
    }
  }
  ++step_;
  const float bc1 = 1.0f - std::pow(options_.beta1, static_cast<float>(step_));
  const float bc2 = 1.0f - std::pow(options_.beta2, static_cast<float>(step_));
  for (size_t i = 0; i < params.size(); ++i) {
    float* p = params[i].data_as<float>();
    const float* g = grads[i].data_as<float>();
    float* m = m_[i].data();
    float* v = v_[i].data();
    const int64_t n = params[i].numel();
    for (int64_t j = 0; j < n; ++j) {
      m[j] = options_.beta1 * m[j] + (1.0f - options_.beta1) * g[j];
      v[j] = options_.beta2 * v[j] + (1.0f - options_.beta2) * g[j] * g[j];
      float mhat = m[j] / bc1;
      float vhat = v[j] / bc2;
      if (options_.weight_decay > 0.0f) p[j] -= options_.lr * options_.weight_decay * p[j];
      p[j] -= options_.lr * mhat / (std::sqrt(vhat) + options_.eps);
    }
  }
  return OkStatus();
}

}  // namespace sk
