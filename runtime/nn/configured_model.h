// Internal to runtime/nn: what every model built from a config struct shares
// (GPT, T5, the Llama family, unit tables), so that each model states only
// what is its own: its units, its batch check, its step and its costs.
//
// ConfiguredModel<Config> holds the config, the options and the unit specs
// behind Model's accessors, and implements ForwardBackward and Forward once:
// both check the batch (ValidateBatch) and then run the model's Run, with
// and without the backward half. Callers keep using the Model interface
// (model.h); nothing here is visible through it.
//
// Config needs a `std::string name`, used as the model's name, and a
// `Status Validate() const`.
//
// Thread safety: as Model's: immutable after construction.
#ifndef SHARDKIT_RUNTIME_NN_CONFIGURED_MODEL_H_
#define SHARDKIT_RUNTIME_NN_CONFIGURED_MODEL_H_

#include <string>
#include <vector>

#include "runtime/nn/model.h"
#include "runtime/nn/model_common.h"

namespace sk {

template <typename Config>
class ConfiguredModel : public Model {
 public:
  const std::string& name() const override { return config_.name; }
  const ModelOptions& options() const override { return options_; }
  const std::vector<UnitSpec>& units() const override { return units_; }
  const Config& config() const { return config_; }

  StatusOr<float> ForwardBackward(const TokenBatch& batch, UnitHooks& hooks,
                                  Allocator& alloc) const override {
    SK_RETURN_IF_ERROR(ValidateBatch(batch));
    return Run(batch, hooks, alloc, /*backward=*/true);
  }
  StatusOr<float> Forward(const TokenBatch& batch, UnitHooks& hooks,
                          Allocator& alloc) const override {
    SK_RETURN_IF_ERROR(ValidateBatch(batch));
    return Run(batch, hooks, alloc, /*backward=*/false);
  }

 protected:
  // The derived constructor appends the unit specs to units_.
  ConfiguredModel(const Config& config, const ModelOptions& options)
      : config_(config), options_(options) {}

  // The checks every model's Create makes before constructing: the config's
  // own (Config::Validate), a compute dtype the models compute in, and
  // options that do not contradict themselves or ask for selective
  // checkpointing from a model without it (ValidateCheckpointing). The first
  // error, naming the model.
  static Status ValidateCreate(const Config& config, const ModelOptions& options,
                               bool supports_selective, bool supports_selective_matmuls = false) {
    SK_RETURN_IF_ERROR(config.Validate());
    SK_RETURN_IF_ERROR(nn_internal::ValidateComputeDType(options.compute_dtype));
    return ValidateCheckpointing(options, supports_selective, config.name,
                                 supports_selective_matmuls);
  }

  // One step over a batch that ValidateBatch accepted: the forward, and the
  // backward when `backward` (gradients added through the hooks). Returns
  // the mean loss. Errors: the hooks' (with the unit named), the allocator's.
  virtual StatusOr<float> Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                              bool backward) const = 0;

  Config config_;
  ModelOptions options_;
  std::vector<UnitSpec> units_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_CONFIGURED_MODEL_H_
