#include "runtime/train/engine.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "runtime/device/device.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/train/rank_agreement.h"

namespace sk {

namespace {

// What every rank's engine must share: the units (each parameter's name,
// shape and initialiser, each tie) and FSDP's and the optimizer's options.
std::vector<std::pair<std::string, std::string>> EngineFields(const std::vector<UnitSpec>& units,
                                                              const FsdpEngineOptions& o) {
  std::vector<std::pair<std::string, std::string>> v = {{"units", std::to_string(units.size())}};
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string k = "units[" + std::to_string(u) + "]";
    v.push_back({k + ".name", units[u].name});
    for (const ParamSpec& p : units[u].params) {
      v.push_back({k + " parameter", p.name + " " + p.shape.ToString() + " " + p.init.ToString()});
    }
    for (const TiedParamSpec& t : units[u].tied) {
      v.push_back({k + " tied parameter", t.name + " = " + t.owner + " " + t.shape.ToString()});
    }
  }
  for (auto& f : SharedFsdpAndOptimizerFields(o.fsdp, o.optimizer)) v.push_back(std::move(f));
  return v;
}

// FNV-1a over the bytes of `values` (the engine's WriteParam check).
uint64_t HashValues(const float* values, int64_t count) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(values);
  for (size_t i = 0; i < static_cast<size_t>(count) * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace

StatusOr<std::unique_ptr<FsdpEngine>> FsdpEngine::Create(std::vector<UnitSpec> units,
                                                         comm::ProcessGroup* world,
                                                         const FsdpEngineOptions& options) {
  SK_RETURN_IF_ERROR(ValidateDeviceOptions(options.device));
  // A simulated device's world can be made here, from its profile.
  const DeviceCapabilities can = KindCapabilities(options.device.kind);
  if (world == nullptr && !can.virtual_time) {
    return InvalidArgumentError("FsdpEngine needs a process group");
  }
  if (units.empty()) return InvalidArgumentError("the model spec has no units");
  for (const UnitSpec& u : units) {
    if (u.params.empty()) return InvalidArgumentError("unit '" + u.name + "' has no parameters");
  }
  std::unique_ptr<FsdpEngine> e(new FsdpEngine());
  if (world == nullptr) {
    SK_ASSIGN_OR_RETURN(e->owned_world_, CreateSimWorld(options.device));
    world = e->owned_world_.get();
  }
  SK_RETURN_IF_ERROR(CheckWorldForDevice(options.device, *world));
  // Ranks of CPU worlds (host memory over local or gloo) agree on the units
  // and options before anything else collective (a parameter group on one
  // rank only trained silently apart).
  if (can.host_memory && world->size() > 1 &&
      (world->backend_name() == "local" || world->backend_name() == "gloo")) {
    const Duration timeout = options.fsdp.timeout.count() > 0 && options.fsdp.timeout <= kMaxTimeout
                                 ? options.fsdp.timeout
                                 : kDefaultTimeout;
    SK_RETURN_IF_ERROR(AgreeOnFields(EngineFields(units, options), ValidateFsdpOptions(options.fsdp, world->size()),
                                     *world, timeout, "engine"));
  }
  e->world_ = world;
  e->units_ = std::move(units);
  SK_ASSIGN_OR_RETURN(Device * device, ResolveRankDevice(options.device, *world));
  SK_ASSIGN_OR_RETURN(e->allocator_, CreateRankAllocator(device, options.memory_cap_bytes));
  e->device_can_ = device->capabilities();
  if (options.fsdp.cpu_offload) {
    SK_ASSIGN_OR_RETURN(e->offload_, CreateOffloadHost(device));
  }
  FsdpOptions fsdp = options.fsdp;
  if (fsdp.ranks_per_node == 0) fsdp.ranks_per_node = RanksPerNode(*world);
  SK_ASSIGN_OR_RETURN(e->fsdp_, FullyShardedModel::Create(
                                    e->units_, world, e->allocator_.get(), fsdp,
                                    e->offload_ ? e->offload_->shards : nullptr,
                                    e->offload_ ? e->offload_->stream : nullptr));
  SK_ASSIGN_OR_RETURN(e->optimizer_, CreateEngineOptimizer(options.optimizer, *e->fsdp_,
                                                           e->offload_ ? e->offload_->optimizer_state
                                                                       : nullptr));
  if (!e->device_can_.virtual_time) {
    SK_ASSIGN_OR_RETURN(e->outcome_, StepAgreement::Create(*world, *device, fsdp.timeout));
  }
  for (int u = 0; u < e->num_units(); ++u) {
    const UnitSpec& spec = e->units_[u];
    const FlatParamLayout& l = e->fsdp_->layout(u);
    ShardLayout layout;
    layout.shard_index = e->fsdp_->shard_group().rank();
    layout.num_shards = e->fsdp_->shard_group().size();
    layout.shard_numel = l.shard_numel();
    for (const FlatParamLayout::ShardSlice& s : l.ShardSlices(layout.shard_index)) {
      const ParamSpec& p = spec.params[s.param];
      ShardPiece piece;
      piece.param = s.param;
      piece.name = spec.name + "." + p.name;
      piece.shard_offset = s.shard_offset;
      piece.numel = s.param_end - s.param_begin;
      piece.param_offset = s.param_begin;
      piece.shape = p.shape;
      piece.param_group = SelectParamGroup(options.optimizer.param_groups, spec.name, p.name, p.shape.rank());
      piece.weight_decay = options.optimizer.weight_decay;
      if (piece.param_group >= 0) {
        const ParamGroup& g = options.optimizer.param_groups[piece.param_group];
        if (g.weight_decay >= 0) piece.weight_decay = g.weight_decay;
        piece.lr_multiplier = g.lr_multiplier;
      }
      if (piece.numel > 0) layout.pieces.push_back(std::move(piece));
    }
    e->shard_layouts_.push_back(std::move(layout));
  }
  e->params_.resize(e->units_.size());
  e->grads_.resize(e->units_.size());
  e->windows_.assign(e->units_.size(), Window::kNone);
  e->window_streams_.assign(e->units_.size(), nullptr);
  if (options.stream) SK_RETURN_IF_ERROR(e->SetStream(options.stream));
  return e;
}

Status FsdpEngine::SetStream(std::shared_ptr<Stream> stream) {
  if (stream) {
    const DeviceId device = allocator_->device();
    if (device_can_.virtual_time) {
      return InvalidArgumentError("a caller stream on " + device.ToString() +
                                  ": the simulator prices its own streams; use cpu or cuda");
    }
    if (stream->device() != device) {
      return InvalidArgumentError("the caller stream '" + stream->name() + "' is on " +
                                  stream->device().ToString() + ", the engine on " +
                                  device.ToString() + ": pass a stream of the engine's device");
    }
    if (std::find(streams_used_.begin(), streams_used_.end(), stream) == streams_used_.end()) {
      streams_used_.push_back(stream);
    }
  }
  stream_ = std::move(stream);
  return OkStatus();
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
  if (param < 0 || static_cast<size_t>(param) >= u.num_tensors()) {
    return OutOfRangeError("parameter " + std::to_string(param) + " out of range (unit '" + u.name +
                           "' has " + std::to_string(u.params.size()) + " parameters" +
                           (u.tied.empty() ? std::string() : " and " + std::to_string(u.tied.size()) + " tied") +
                           ")");
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
  if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) return FailStep(s);
  return s;
}

std::vector<comm::ProcessGroup*> FsdpEngine::StepGroups() {
  std::vector<comm::ProcessGroup*> groups = {world_, &fsdp_->shard_group()};
  if (fsdp_->replicate_group() != nullptr) groups.push_back(fsdp_->replicate_group());
  return groups;
}

Status FsdpEngine::Agreed(const Status& mine, const StepChecks& checks) {
  if (outcome_ == nullptr) return mine;
  return outcome_->Agree(mine, steps_ + 1, StepGroups(), *fsdp_, checks);
}

Status FsdpEngine::FinishUpdate(const Status& s) {
  Status outcome = s;
  if (outcome_ != nullptr && fsdp_->UpdateEndsWithFallibleWork()) {
    outcome = outcome_->AgreeAfterUpdate(s, steps_ + 1, StepGroups(), *fsdp_);
  } else if (!s.ok()) {
    fsdp_->AbandonAfterUpdate();
    outcome = NoteUpdateApplied(s.WithContext("step " + std::to_string(steps_ + 1) + " on rank " +
                                              std::to_string(world_->rank())),
                                steps_ + 1);
  }
  if (!outcome.ok()) {
    ReleaseAllViews();
    windows_.assign(units_.size(), Window::kNone);
  }
  custom_step_ = false;
  phase_ = Phase::kIdle;
  ++steps_;
  return outcome;
}

// Every rank learns of the failure (and its peers' failing collectives tell
// them at once), then every rank abandons the step.
Status FsdpEngine::FailStep(const Status& s) {
  UseStream(stream_.get());
  Status agreed = Agreed(s);
  AbandonStep();
  return agreed.ok() ? s : agreed;
}

void FsdpEngine::AbandonStep() {
  fsdp_->set_gradient_sync(true);
  fsdp_->set_reduction_divisor(std::nullopt);
  reduced_since_zero_grad_ = false;
  fsdp_->AbandonStep();
  ReleaseAllViews();
  windows_.assign(units_.size(), Window::kNone);
  phase_ = Phase::kIdle;  // FSDP abandoned the step and zeroed the gradients
}

const char* FsdpEngine::PhaseName(Phase p) {
  switch (p) {
    case Phase::kIdle:
      return "no backward since the last optimizer step or ZeroGrad";
    case Phase::kBackward:
      return "after a backward, before FinishBackward";
    case Phase::kFinished:
      return "after FinishBackward";
  }
  return "?";
}

Status FsdpEngine::CheckNoOpenWindow(const char* call) const {
  if (custom_step_) {
    return FailedPreconditionError(std::string(call) + " during a custom step: expected EndCustomStep first");
  }
  for (int u = 0; u < num_units(); ++u) {
    if (windows_[u] == Window::kNone) continue;
    const bool fwd = windows_[u] == Window::kForward;
    const std::string id = std::to_string(u);
    return FailedPreconditionError(std::string(call) + " while unit '" + units_[u].name + "' (" + id +
                                   ") is between " + (fwd ? "PreForward and PostForward" : "PreBackward and PostBackward") +
                                   ": expected " + (fwd ? "PostForward(" : "PostBackward(") + id + ") first");
  }
  return OkStatus();
}

Status FsdpEngine::PreForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  if (custom_step_) {
    return FailedPreconditionError("PreForward during a custom step: expected EndCustomStep first");
  }
  UseStream(stream_.get());
  StatusOr<std::vector<Tensor>> params = fsdp_->PreForward(unit);
  if (!params.ok()) return HookResult(params.status());
  params_[unit] = std::move(params).value();
  windows_[unit] = Window::kForward;
  window_streams_[unit] = stream_.get();
  return OkStatus();
}

Status FsdpEngine::PostForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  UseStream(windows_[unit] == Window::kForward ? window_streams_[unit] : stream_.get());
  if (windows_[unit] != Window::kForward) return HookResult(fsdp_->PostForward(unit));  // FSDP names the state
  ReleaseViews(unit);
  windows_[unit] = Window::kNone;
  return HookResult(fsdp_->PostForward(unit));
}

Status FsdpEngine::PreBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  if (custom_step_) {
    return FailedPreconditionError("PreBackward during a custom step: expected EndCustomStep first");
  }
  UseStream(stream_.get());
  StatusOr<UnitBackwardBuffers> buffers = fsdp_->PreBackward(unit);
  if (!buffers.ok()) return HookResult(buffers.status());
  params_[unit] = std::move(buffers->params);
  grads_[unit] = std::move(buffers->grads);
  windows_[unit] = Window::kBackward;
  window_streams_[unit] = stream_.get();
  return OkStatus();
}

Status FsdpEngine::PostBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  UseStream(windows_[unit] == Window::kBackward ? window_streams_[unit] : stream_.get());
  if (windows_[unit] != Window::kBackward) return HookResult(fsdp_->PostBackward(unit));  // FSDP names the state
  ReleaseViews(unit);
  windows_[unit] = Window::kNone;
  phase_ = Phase::kBackward;
  if (fsdp_->gradient_sync()) reduced_since_zero_grad_ = true;
  return HookResult(fsdp_->PostBackward(unit));
}

Status FsdpEngine::set_gradient_sync(bool enabled) {
  SK_RETURN_IF_ERROR(CheckNoOpenWindow("set_gradient_sync"));
  fsdp_->set_gradient_sync(enabled);
  return OkStatus();
}

Status FsdpEngine::FinishBackward() {
  SK_RETURN_IF_ERROR(CheckNoOpenWindow("FinishBackward"));
  if (phase_ != Phase::kBackward) {
    return FailedPreconditionError(std::string("FinishBackward ") + PhaseName(phase_) +
                                   ": expected a backward pass (PreBackward .. PostBackward of the "
                                   "units) first");
  }
  UseStream(stream_.get());
  Status s = fsdp_->FinishBackward();
  // A failed reduction abandoned the step (FSDP zeroed the gradients).
  if (!s.ok()) return FailStep(s);
  phase_ = Phase::kFinished;
  return s;
}

Status FsdpEngine::OptimizerStep() {
  SK_RETURN_IF_ERROR(CheckNoOpenWindow("OptimizerStep"));
  if (optimizer_->custom()) {
    return FailedPreconditionError("OptimizerStep on an engine whose optimizer is the caller's rule '" +
                                   optimizer_->Name() + "': expected BeginCustomStep .. EndCustomStep");
  }
  if (phase_ != Phase::kFinished) {
    return FailedPreconditionError(std::string("OptimizerStep ") + PhaseName(phase_) + ": expected " +
                                   (phase_ == Phase::kIdle ? "a backward pass and FinishBackward"
                                                           : "FinishBackward") +
                                   " first");
  }
  UseStream(stream_.get());
  // The optimizer's state exists before the ranks agree (a first step's
  // allocation failing on one rank after its peers updated trained them
  // apart); then nothing changes unless every rank is ready, with one rate.
  const Status ready = fsdp_->PrepareOptimizer(*optimizer_);
  StepChecks checks;
  checks.same = {StepChecks::F32("the learning rate", optimizer_->options().lr)};
  if (Status agreed = Agreed(ready, checks); !agreed.ok()) {
    optimizer_->ReleaseUnsteppedState();
    AbandonStep();
    return agreed;
  }
  // PrepareOptimizer did what can fail before the update: from here the
  // update is applied on every rank, and what follows it is agreed on.
  return FinishUpdate(fsdp_->OptimizerStep(*optimizer_));
}

Status FsdpEngine::BeginCustomStep() {
  SK_RETURN_IF_ERROR(CheckNoOpenWindow("BeginCustomStep"));
  if (phase_ != Phase::kFinished) {
    return FailedPreconditionError(std::string("BeginCustomStep ") + PhaseName(phase_) + ": expected " +
                                   (phase_ == Phase::kIdle ? "a backward pass and FinishBackward"
                                                           : "FinishBackward") +
                                   " first");
  }
  UseStream(stream_.get());
  // The state the rule's views hand out exists before the ranks agree: a
  // rank that could not allocate it inside the step, after its peers had
  // begun updating, left them updated and itself not (and, where the end
  // of the step regathers, waiting for it until the timeout).
  const Status ready = fsdp_->PrepareOptimizer(*optimizer_);
  StepChecks checks;
  checks.same = {StepChecks::F32("the learning rate", optimizer_->options().lr)};
  if (Status agreed = Agreed(ready, checks); !agreed.ok()) {
    optimizer_->ReleaseUnsteppedState();
    AbandonStep();
    return agreed;
  }
  SK_RETURN_IF_ERROR(fsdp_->BeginMasterUpdate());
  custom_step_ = true;
  return OkStatus();
}

StatusOr<const FsdpEngine::ShardLayout*> FsdpEngine::GetShardLayout(int unit) const {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  return &shard_layouts_[unit];
}

Status FsdpEngine::CheckCustomView(int unit, const char* what) const {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  if (!custom_step_) {
    return FailedPreconditionError(std::string(what) + " outside a custom step: expected BeginCustomStep first");
  }
  return OkStatus();
}

StatusOr<const Tensor*> FsdpEngine::MasterShard(int unit) const {
  SK_RETURN_IF_ERROR(CheckCustomView(unit, "MasterShard"));
  return &fsdp_->master_shard(unit);
}

StatusOr<const Tensor*> FsdpEngine::GradShard(int unit) const {
  SK_RETURN_IF_ERROR(CheckCustomView(unit, "GradShard"));
  return &fsdp_->grad_shard(unit);
}

StatusOr<const Tensor*> FsdpEngine::OptimizerState(int unit, int index) {
  SK_RETURN_IF_ERROR(CheckCustomView(unit, "OptimizerState"));
  const std::vector<std::string> names = optimizer_->StateNames();
  if (index < 0 || static_cast<size_t>(index) >= names.size()) {
    return OutOfRangeError("optimizer state " + std::to_string(index) + " out of range: the optimizer '" +
                           optimizer_->Name() + "' keeps " + std::to_string(names.size()) +
                           " state tensors per unit (" +
                           (optimizer_->custom() ? std::string("as its custom rule declared")
                                                 : std::string("SGD with momentum one, Adam and AdamW two")) +
                           ")");
  }
  SK_ASSIGN_OR_RETURN(const std::vector<Tensor>* state,
                      optimizer_->SlotState(fsdp_->shard_context(), unit, fsdp_->master_shard(unit).numel()));
  return &(*state)[static_cast<size_t>(index)];
}

Status FsdpEngine::EndCustomStep() {
  if (!custom_step_) return FailedPreconditionError("EndCustomStep: expected BeginCustomStep first");
  UseStream(stream_.get());
  // The rule has updated the masters and its state (created before the
  // agreement, so SlotState finds it): the step counts, and the regather
  // that follows is agreed on.
  for (int u = 0; u < num_units(); ++u) {
    SK_RETURN_IF_ERROR(optimizer_->SlotState(fsdp_->shard_context(), u, fsdp_->master_shard(u).numel()).status());
    optimizer_->CountStep(u);
  }
  return FinishUpdate(fsdp_->EndMasterUpdate());
}

Status FsdpEngine::set_lr(float lr) {
  if (!std::isfinite(lr) || lr < 0) {
    return InvalidArgumentError("learning rate must be finite and >= 0, not " + std::to_string(lr));
  }
  optimizer_->set_lr(lr);
  return OkStatus();
}

Status FsdpEngine::ZeroGrad() {
  SK_RETURN_IF_ERROR(CheckNoOpenWindow("ZeroGrad"));
  if (phase_ == Phase::kBackward) {
    return FailedPreconditionError(std::string("ZeroGrad ") + PhaseName(phase_) +
                                   " (gradient reductions may be in flight): expected FinishBackward "
                                   "first");
  }
  UseStream(stream_.get());
  fsdp_->ZeroGrad();
  fsdp_->set_reduction_divisor(std::nullopt);
  reduced_since_zero_grad_ = false;
  phase_ = Phase::kIdle;
  return OkStatus();
}

StatusOr<int64_t> FsdpEngine::SetLossTokens(int64_t tokens) {
  if (tokens < 0) {
    return InvalidArgumentError("SetLossTokens: tokens is " + std::to_string(tokens) +
                                " (expected this rank's count of counted targets in the step, >= 0)");
  }
  SK_RETURN_IF_ERROR(CheckNoOpenWindow("SetLossTokens"));
  if (reduced_since_zero_grad_) {
    return FailedPreconditionError(
        "SetLossTokens after a gradient reduction of this step (a PostBackward with gradient sync on "
        "since the last ZeroGrad, divided by the world size): expected ZeroGrad first, then "
        "SetLossTokens before the step's first reduction");
  }
  const int w = world_->size();
  int64_t global = 0;
  if (device_can_.virtual_time || w == 1) {
    global = tokens * w;  // the simulator's ranks mirror this one
  } else if (outcome_ != nullptr) {
    SK_ASSIGN_OR_RETURN(std::vector<uint64_t> counts,
                        outcome_->GatherU64(static_cast<uint64_t>(tokens), "SetLossTokens (the step's token counts)"));
    for (size_t r = 0; r < counts.size(); ++r) {
      const int64_t c = static_cast<int64_t>(counts[r]);
      if (c < 0 || global > std::numeric_limits<int64_t>::max() - c) {
        return InvalidArgumentError("SetLossTokens: the ranks' token counts overflow an int64 at rank " +
                                    std::to_string(r));
      }
      global += c;
    }
  } else {
    return FailedPreconditionError(
        "SetLossTokens on " + std::to_string(w) +
        " ranks of a backend that does not publish failures (NCCL without check_calls): there is no "
        "agreement group to sum the token counts on; enable the NCCL call check");
  }
  fsdp_->set_reduction_divisor(static_cast<double>(global));
  return global;
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
  SK_RETURN_IF_ERROR(CheckNoOpenWindow("ClipGradNorm"));
  if (phase_ != Phase::kFinished) {
    return FailedPreconditionError(std::string("ClipGradNorm ") + PhaseName(phase_) + ": expected " +
                                   (phase_ == Phase::kIdle ? "a backward pass and FinishBackward"
                                                           : "FinishBackward") +
                                   " first");
  }
  UseStream(stream_.get());
  StatusOr<double> norm = fsdp_->ClipGradNorm(max_norm);
  if (!norm.ok()) return FailStep(norm.status());
  if (!std::isfinite(*norm)) {
    // Every rank holds the same (all-reduced) norm: each decides alike.
    AbandonStep();
    return AbortedError("step " + std::to_string(steps_ + 1) + " skipped on every rank: the gradient norm is " +
                        std::to_string(*norm) +
                        "; the gradients were dropped and no update applied (parameters and optimizer state "
                        "are unchanged)");
  }
  return norm;
}

Status FsdpEngine::ReadParam(int unit, int param, float* out, int64_t count) {
  SK_RETURN_IF_ERROR(CheckParam(unit, param));
  if (out == nullptr) return InvalidArgumentError("out is NULL");
  if (static_cast<size_t>(param) >= units_[unit].params.size()) {
    // A tied parameter: its owner's value.
    SK_ASSIGN_OR_RETURN(auto tied, ResolveTiedParams(units_));
    const ParamRef owner = tied[unit][param - units_[unit].params.size()];
    return ReadParam(owner.unit, owner.param, out, count);
  }
  const ParamSpec& spec = units_[unit].params[param];
  if (count != spec.shape.numel()) {
    return InvalidArgumentError("count " + std::to_string(count) + " does not match parameter '" +
                                units_[unit].name + "." + spec.name + "' of shape " +
                                spec.shape.ToString() + " (" + std::to_string(spec.shape.numel()) +
                                " elements)");
  }
  if (device_can_.virtual_time) {
    return FailedPreconditionError("ReadParam on " + allocator_->device().ToString() +
                                   ": a simulated device's tensors hold no data");
  }
  SK_ASSIGN_OR_RETURN(Tensor full, fsdp_->GatherFullParam(unit, param));
  std::memcpy(out, full.data(), static_cast<size_t>(count) * sizeof(float));
  return OkStatus();
}

Status FsdpEngine::WriteParam(int unit, int param, const float* values, int64_t count) {
  SK_RETURN_IF_ERROR(CheckParam(unit, param));
  SK_RETURN_IF_ERROR(CheckIdle("WriteParam"));
  const ParamSpec& p = units_[unit].params[param];
  if (count != p.shape.numel()) {
    return InvalidArgumentError("parameter '" + units_[unit].name + "." + p.name + "' has " +
                                std::to_string(p.shape.numel()) + " elements, count is " + std::to_string(count));
  }
  if (values == nullptr && count > 0) return InvalidArgumentError("values is NULL");
  if (outcome_ != nullptr) {
    // Each rank writes its own slice: values that differ by rank left a
    // parameter holding values no rank wrote.
    SK_ASSIGN_OR_RETURN(std::vector<uint64_t> hashes,
                        outcome_->GatherU64(count > 0 ? HashValues(values, count) : 0,
                                            "WriteParam of '" + units_[unit].name + "." + p.name + "'"));
    std::vector<int> differ;
    for (size_t r = 1; r < hashes.size(); ++r) {
      if (hashes[r] != hashes[0]) differ.push_back(static_cast<int>(r));
    }
    if (!differ.empty()) {
      return InvalidArgumentError("WriteParam of '" + units_[unit].name + "." + p.name + "': " +
                                  comm::NameRanks(differ) + " passed values that differ from rank 0's (every "
                                  "rank must pass the same values); nothing was written");
    }
  }
  SK_ASSIGN_OR_RETURN(Tensor t, Tensor::Wrap(const_cast<float*>(values), DType::kF32, Shape{count}));
  return fsdp_->LoadFullParam(unit, param, t);
}

Status FsdpEngine::CheckIdle(const char* what) const {
  if (device_can_.virtual_time) {
    return FailedPreconditionError(std::string(what) + ": a sim device's tensors hold no data");
  }
  for (int u = 0; u < num_units(); ++u) {
    if (!params_[u].empty() || !grads_[u].empty()) {
      return FailedPreconditionError(std::string(what) + " while unit '" + units_[u].name +
                                     "' is between a Pre call and its Post call");
    }
  }
  return OkStatus();
}

Status FsdpEngine::SaveFullStateDict(const std::string& path, WeightLayout layout) {
  SK_RETURN_IF_ERROR(CheckIdle("SaveFullStateDict"));
  TrainingState state{"engine", &units_, fsdp_.get(), optimizer_.get()};
  FullStateDictOptions o;
  o.layout = layout;
  return sk::SaveFullStateDict(path, state, steps_, o);
}

Status FsdpEngine::LoadFullStateDict(const std::string& path, WeightLayout layout) {
  SK_RETURN_IF_ERROR(CheckIdle("LoadFullStateDict"));
  TrainingState state{"engine", &units_, fsdp_.get(), optimizer_.get()};
  FullStateDictOptions o;
  o.layout = layout;
  SK_ASSIGN_OR_RETURN(steps_, sk::LoadFullStateDict(path, state, o));
  return OkStatus();
}

Status FsdpEngine::SaveCheckpoint(const std::string& dir) {
  SK_RETURN_IF_ERROR(CheckIdle("SaveCheckpoint"));
  TrainingState state{"engine", &units_, fsdp_.get(), optimizer_.get()};
  return SaveShardedCheckpoint(dir, state, steps_);
}

Status FsdpEngine::LoadCheckpoint(const std::string& dir) {
  SK_RETURN_IF_ERROR(CheckIdle("LoadCheckpoint"));
  TrainingState state{"engine", &units_, fsdp_.get(), optimizer_.get()};
  SK_ASSIGN_OR_RETURN(steps_, LoadShardedCheckpoint(dir, state));
  return OkStatus();
}

}  // namespace sk
