#include "runtime/train/engine.h"

#include <cstring>
#include <string>
#include <utility>

#include "runtime/device/device.h"

namespace sk {

StatusOr<std::unique_ptr<CachingAllocator>> CreateRankAllocator(int rank, size_t capacity_bytes) {
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(DeviceId::Cpu(rank)));
  CachingAllocator::Options options;
  options.capacity_bytes = capacity_bytes;
  return std::make_unique<CachingAllocator>(device, options);
}

StatusOr<std::unique_ptr<Optimizer>> CreateEngineOptimizer(const OptimizerOptions& options,
                                                           DataParallelModel& engine,
                                                           bool cpu_offload) {
  // With CPU offload the optimizer steps on the host, beside the shards.
  Allocator* state = cpu_offload ? static_cast<Allocator*>(&HostAllocator::Default())
                                 : &engine.activation_allocator();
  return Optimizer::Create(options, state);
}

StatusOr<std::unique_ptr<FsdpEngine>> FsdpEngine::Create(std::vector<UnitSpec> units,
                                                         comm::ProcessGroup* world,
                                                         const FsdpEngineOptions& options) {
  if (world == nullptr) return InvalidArgumentError("FsdpEngine needs a process group");
  if (units.empty()) return InvalidArgumentError("the model spec has no units");
  for (const UnitSpec& u : units) {
    if (u.params.empty()) return InvalidArgumentError("unit '" + u.name + "' has no parameters");
  }
  std::unique_ptr<FsdpEngine> e(new FsdpEngine());
  e->units_ = std::move(units);
  SK_ASSIGN_OR_RETURN(e->allocator_, CreateRankAllocator(world->rank(), options.memory_cap_bytes));
  SK_ASSIGN_OR_RETURN(e->fsdp_, FullyShardedModel::Create(e->units_, world, e->allocator_.get(),
                                                          options.fsdp));
  SK_ASSIGN_OR_RETURN(e->optimizer_, CreateEngineOptimizer(options.optimizer, *e->fsdp_,
                                                           options.fsdp.cpu_offload));
  e->params_.resize(e->units_.size());
  e->grads_.resize(e->units_.size());
  return e;
}

FsdpEngine::~FsdpEngine() = default;

Status FsdpEngine::CheckUnit(int unit) const {
  if (unit < 0 || static_cast<size_t>(unit) >= units_.size()) {
    return OutOfRangeError("unit " + std::to_string(unit) + " out of range (the model has " +
                           std::to_string(units_.size()) + " units)");
  }
  return OkStatus();
}

Status FsdpEngine::CheckParam(int unit, int param) const {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  const UnitSpec& u = units_[unit];
  if (param < 0 || static_cast<size_t>(param) >= u.params.size()) {
    return OutOfRangeError("parameter " + std::to_string(param) + " out of range (unit '" + u.name +
                           "' has " + std::to_string(u.params.size()) + " parameters)");
  }
  return OkStatus();
}

void FsdpEngine::ReleaseViews(int unit) {
  params_[unit].clear();
  grads_[unit].clear();
}

void FsdpEngine::ReleaseAllViews() {
  for (int u = 0; u < num_units(); ++u) ReleaseViews(u);
}

// FSDP reports a call out of order as FailedPrecondition and changes nothing;
// any other failure abandons the step (every unit back to idle, unsharded
// buffers dropped), so every view is void then and its buffers are released.
Status FsdpEngine::HookResult(Status s) {
  if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) ReleaseAllViews();
  return s;
}

Status FsdpEngine::PreForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  StatusOr<std::vector<Tensor>> params = fsdp_->PreForward(unit);
  if (!params.ok()) return HookResult(params.status());
  params_[unit] = std::move(params).value();
  return OkStatus();
}

Status FsdpEngine::PostForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  ReleaseViews(unit);
  return HookResult(fsdp_->PostForward(unit));
}

Status FsdpEngine::PreBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  StatusOr<UnitBackwardBuffers> buffers = fsdp_->PreBackward(unit);
  if (!buffers.ok()) return HookResult(buffers.status());
  params_[unit] = std::move(buffers->params);
  grads_[unit] = std::move(buffers->grads);
  return OkStatus();
}

Status FsdpEngine::PostBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  ReleaseViews(unit);
  return HookResult(fsdp_->PostBackward(unit));
}

StatusOr<const Tensor*> FsdpEngine::Param(int unit, int param) const {
  SK_RETURN_IF_ERROR(CheckParam(unit, param));
  const std::vector<Tensor>& held = params_[unit];
  if (held.empty()) {
    return FailedPreconditionError(
        "unit '" + units_[unit].name +
        "' has no gathered parameters now: they are readable between PreForward and "
        "PostForward, and between PreBackward and PostBackward");
  }
  return &held[param];
}

StatusOr<const Tensor*> FsdpEngine::Grad(int unit, int param) const {
  SK_RETURN_IF_ERROR(CheckParam(unit, param));
  const std::vector<Tensor>& held = grads_[unit];
  if (held.empty()) {
    return FailedPreconditionError("unit '" + units_[unit].name +
                                   "' has no gradient buffers now: they exist between "
                                   "PreBackward and PostBackward");
  }
  return &held[param];
}

StatusOr<double> FsdpEngine::ClipGradNorm(double max_norm) {
  if (!(max_norm >= 0)) {
    return InvalidArgumentError("max_norm must be >= 0 (0 = compute the norm only)");
  }
  return fsdp_->ClipGradNorm(max_norm);
}

Status FsdpEngine::ReadParam(int unit, int param, float* out, int64_t count) {
  SK_RETURN_IF_ERROR(CheckParam(unit, param));
  if (out == nullptr) return InvalidArgumentError("out is NULL");
  const ParamSpec& spec = units_[unit].params[param];
  if (count != spec.shape.numel()) {
    return InvalidArgumentError("count " + std::to_string(count) + " does not match parameter '" +
                                units_[unit].name + "." + spec.name + "' of shape " +
                                spec.shape.ToString() + " (" + std::to_string(spec.shape.numel()) +
                                " elements)");
  }
  SK_ASSIGN_OR_RETURN(Tensor full, fsdp_->GatherFullParam(unit, param));
  std::memcpy(out, full.data(), static_cast<size_t>(count) * sizeof(float));
  return OkStatus();
}

}  // namespace sk
