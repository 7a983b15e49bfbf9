// OwnedParameters: the UnitHooks for plain single-process training.
//
// Holds every unit's parameters and gradients in full f32 (the master copy),
// initialised with the counter-based RNG (init.h), so a model trains without
// FSDP. With a bf16 or f16 compute dtype it hands the model copies of the
// parameters, made at each PreForward/PreBackward, as FSDP's mixed precision
// does after its all-gather; gradients are always accumulated in f32.
//
// A tied parameter (UnitSpec::tied) is its owner's tensor: the using unit
// gets the owner's parameter (or its compute copy) and the owner's f32
// gradient, so both uses add into one gradient.
//
// It also checks the hook protocol: every call must follow the order that
// model.h specifies, otherwise the call returns FailedPrecondition naming the
// unit and its state. Tests use this to prove models drive the hooks right.
//
// Thread safety: not thread-safe; one training loop uses one instance.
#ifndef SHARDKIT_RUNTIME_NN_OWNED_PARAMETERS_H_
#define SHARDKIT_RUNTIME_NN_OWNED_PARAMETERS_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/nn/model.h"
#include "runtime/ops/ops.h"

namespace sk {

class OwnedParameters final : public UnitHooks {
 public:
  // Allocates and initialises f32 parameters (and zeroed f32 gradients) for
  // `units` under `seed`. compute_dtype is f32, bf16 or f16.
  static StatusOr<std::unique_ptr<OwnedParameters>> Create(
      const std::vector<UnitSpec>& units, uint64_t seed, DType compute_dtype = DType::kF32,
      Allocator& alloc = HostAllocator::Default());

  StatusOr<std::vector<Tensor>> PreForward(int unit) override;
  Status PostForward(int unit) override;
  StatusOr<UnitBackwardBuffers> PreBackward(int unit) override;
  Status PostBackward(int unit) override;

  int num_units() const { return static_cast<int>(units_.size()); }
  const std::vector<UnitSpec>& units() const { return units_; }
  // The f32 master parameter / gradient of (unit, index); CHECKs the indices.
  const Tensor& param(int unit, int index) const;
  const Tensor& grad(int unit, int index) const;

  // Sets all gradients to zero (call between steps; gradients accumulate).
  void ZeroGrad();

  // The hook calls made since construction, as
  // "PreForward(3)" strings, in order.
  const std::vector<std::string>& call_log() const { return call_log_; }

  // Every parameter and its gradient, unit by unit in spec order.
  std::vector<Tensor> all_params() const;
  std::vector<Tensor> all_grads() const;

 private:
  enum class UnitState { kIdle, kForward, kBackward };
  OwnedParameters(std::vector<UnitSpec> units, DType compute_dtype, Allocator& alloc);
  Status Transition(int unit, UnitState from, UnitState to, const char* call);

  // Initialisation, compute copies and ZeroGrad run as ops on the
  // allocator's device, on the calling thread's stream (none: cpu).
  ops::OpContext ctx_;
  StatusOr<std::vector<Tensor>> ComputeCopies(int unit);

  std::vector<UnitSpec> units_;
  DType compute_dtype_;
  Allocator& alloc_;
  std::vector<std::vector<Tensor>> params_;
  std::vector<std::vector<Tensor>> grads_;
  std::vector<std::vector<ParamRef>> tied_;  // per unit: owners of its tied parameters
  std::vector<UnitState> state_;
  std::vector<std::string> call_log_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_OWNED_PARAMETERS_H_
