// Plain (unsharded) optimizers over f32 parameter/gradient tensor lists, for
// standalone training of the reference models. FSDP's sharded optimizers
// live in runtime/optim; these are the single-process reference they match.
//
// Thread safety: an Adam instance is not thread-safe.
#ifndef SHARDKIT_RUNTIME_NN_OPTIMIZER_H_
#define SHARDKIT_RUNTIME_NN_OPTIMIZER_H_

#include <vector>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

namespace sk {

// p -= lr * g for each pair. InvalidArgument if the lists differ in length,
// a pair differs in shape, or a tensor is not f32 host memory.
Status SgdStep(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, float lr);

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW) when > 0
};

// Adam / AdamW with bias correction, state in f32.
class Adam {
 public:
  explicit Adam(const AdamOptions& options) : options_(options) {}
  // One step. The first call fixes the parameter list's shapes; later calls
  // with a different list are InvalidArgument.
  Status Step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads);
  int64_t steps() const { return step_; }

 private:
  AdamOptions options_;
  int64_t step_ = 0;
  std::vector<std::vector<float>> m_, v_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_OPTIMIZER_H_
