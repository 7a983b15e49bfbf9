// Per-element optimizer arithmetic, shared by the CPU backend (runtime/ops/cpu)
// and CUDA kernels. Each rule updates one element of a parameter shard in
// place; since every rule is element-wise, a sharded step computes exactly what
// an unsharded step computes for the same elements, whatever the world size.
//
// The rules follow torch.optim's definitions (SGD with dampening and Nesterov,
// Adam with L2 weight decay folded into the gradient, AdamW with decoupled
// decay), so results can be compared with PyTorch element for element.
#ifndef SHARDKIT_RUNTIME_OPS_UPDATE_RULES_H_
#define SHARDKIT_RUNTIME_OPS_UPDATE_RULES_H_

#include <cmath>

#include "runtime/core/macros.h"

namespace sk {

struct SgdHyper {
  float lr;
  float momentum;
  float dampening;
  float weight_decay;
  bool nesterov;
  bool first_step;  // the momentum buffer starts as the first gradient
};

SK_HOST_DEVICE SK_INLINE void SgdUpdate(float& param, float grad, float& momentum_buf,
                                        const SgdHyper& h) {
  float g = grad;
  if (h.weight_decay != 0.f) g += h.weight_decay * param;
  if (h.momentum != 0.f) {
    momentum_buf = h.first_step ? g : h.momentum * momentum_buf + (1.f - h.dampening) * g;
    g = h.nesterov ? g + h.momentum * momentum_buf : momentum_buf;
  }
  param -= h.lr * g;
}

struct AdamHyper {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  bool decoupled;           // AdamW: decay the parameter, not the gradient
  float bias_correction1;   // 1 - beta1^t
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

SK_HOST_DEVICE SK_INLINE void AdamUpdate(float& param, float grad, float& exp_avg,
                                         float& exp_avg_sq, const AdamHyper& h) {
  float g = grad;
  if (h.weight_decay != 0.f) {
    if (h.decoupled) {
      param *= 1.f - h.lr * h.weight_decay;
    } else {
      g += h.weight_decay * param;
    }
  }
  exp_avg = h.beta1 * exp_avg + (1.f - h.beta1) * g;
  exp_avg_sq = h.beta2 * exp_avg_sq + (1.f - h.beta2) * g * g;
  float denom = sqrtf(exp_avg_sq) / h.bias_correction2_sqrt + h.eps;
  param -= (h.lr / h.bias_correction1) * (exp_avg / denom);
}

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_UPDATE_RULES_H_
