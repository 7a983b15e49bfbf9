#include "runtime/nn/owned_parameters.h"


namespace sk {

OwnedParameters::OwnedParameters(std::vector<UnitSpec> units, DType compute_dtype,
                                 Allocator& alloc)
    : units_(std::move(units)), compute_dtype_(compute_dtype), alloc_(alloc) {}

StatusOr<std::unique_ptr<OwnedParameters>> OwnedParameters::Create(
    const std::vector<UnitSpec>& units, uint64_t seed, DType compute_dtype, Allocator& alloc) {
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16 &&
      compute_dtype != DType::kF16) {
    return InvalidArgumentError("OwnedParameters: compute dtype must be f32, bf16 or f16, got " +
                                std::string(DTypeName(compute_dtype)));
  }
  SK_ASSIGN_OR_RETURN(auto tied, ResolveTiedParams(units));
  std::unique_ptr<OwnedParameters> o(new OwnedParameters(units, compute_dtype, alloc));
  o->tied_ = std::move(tied);
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(alloc.device()));
  o->ctx_ = ops::OpContext{device, nullptr, &alloc};
  for (const UnitSpec& u : units) {
    std::vector<Tensor> ps, gs;
    for (const ParamSpec& spec : u.params) {
      SK_ASSIGN_OR_RETURN(Tensor p, alloc.Empty(DType::kF32, spec.shape));
      SK_RETURN_IF_ERROR(ops::InitPhilox(o->ctx_, spec.init, seed,
                                         ParamIdFromName(FullParamName(u, spec)), 0, p)
                             .WithContext("initialising '" + FullParamName(u, spec) + "'"));
      SK_ASSIGN_OR_RETURN(Tensor g, alloc.Empty(DType::kF32, spec.shape));
      SK_RETURN_IF_ERROR(ops::Fill(o->ctx_, g, 0.0f));
      ps.push_back(std::move(p));
      gs.push_back(std::move(g));
    }
    o->params_.push_back(std::move(ps));
    o->grads_.push_back(std::move(gs));
    o->state_.push_back(UnitState::kIdle);
  }
  return o;
}

Status OwnedParameters::Transition(int unit, UnitState from, UnitState to, const char* call) {
  call_log_.push_back(std::string(call) + "(" + std::to_string(unit) + ")");
  if (unit < 0 || unit >= num_units()) {
    return OutOfRangeError(std::string(call) + ": unit " + std::to_string(unit) +
                           " does not exist (" + std::to_string(num_units()) + " units)");
  }
  if (state_[unit] != from) {
    static const char* kNames[] = {"idle", "in forward", "in backward"};
    return FailedPreconditionError(std::string(call) + " of unit '" + units_[unit].name +
                                   "' while it is " + kNames[static_cast<int>(state_[unit])]);
  }
  state_[unit] = to;
  return OkStatus();
}

StatusOr<std::vector<Tensor>> OwnedParameters::ComputeCopies(int unit) {
  std::vector<Tensor> masters = params_[unit];
  for (const ParamRef& t : tied_[unit]) masters.push_back(params_[t.unit][t.param]);
  if (compute_dtype_ == DType::kF32) return masters;
  std::vector<Tensor> out;
  for (const Tensor& p : masters) {
    SK_ASSIGN_OR_RETURN(Tensor c, alloc_.Empty(compute_dtype_, p.shape()));
    SK_RETURN_IF_ERROR(ops::Cast(ctx_, p, c));
    out.push_back(std::move(c));
  }
  return out;
}

StatusOr<std::vector<Tensor>> OwnedParameters::PreForward(int unit) {
  SK_RETURN_IF_ERROR(Transition(unit, UnitState::kIdle, UnitState::kForward, "PreForward"));
  return ComputeCopies(unit);
}

Status OwnedParameters::PostForward(int unit) {
  return Transition(unit, UnitState::kForward, UnitState::kIdle, "PostForward");
}

StatusOr<UnitBackwardBuffers> OwnedParameters::PreBackward(int unit) {
  SK_RETURN_IF_ERROR(Transition(unit, UnitState::kIdle, UnitState::kBackward, "PreBackward"));
  UnitBackwardBuffers b;
  SK_ASSIGN_OR_RETURN(b.params, ComputeCopies(unit));
  b.grads = grads_[unit];
  for (const ParamRef& t : tied_[unit]) b.grads.push_back(grads_[t.unit][t.param]);
  return b;
}

Status OwnedParameters::PostBackward(int unit) {
  return Transition(unit, UnitState::kBackward, UnitState::kIdle, "PostBackward");
}

const Tensor& OwnedParameters::param(int unit, int index) const {
  return params_.at(static_cast<size_t>(unit)).at(static_cast<size_t>(index));
}

const Tensor& OwnedParameters::grad(int unit, int index) const {
  return grads_.at(static_cast<size_t>(unit)).at(static_cast<size_t>(index));
}

void OwnedParameters::ZeroGrad() {
  for (auto& unit : grads_) {
    for (Tensor& g : unit) {
      Status s = ops::Fill(ctx_, g, 0.0f);
      CHECK(s.ok()) << s.ToString();  // our own tensors: an error is a bug
    }
  }
}

std::vector<Tensor> OwnedParameters::all_params() const {
  std::vector<Tensor> out;
  for (const auto& unit : params_) out.insert(out.end(), unit.begin(), unit.end());
  return out;
}

std::vector<Tensor> OwnedParameters::all_grads() const {
  std::vector<Tensor> out;
  for (const auto& unit : grads_) out.insert(out.end(), unit.begin(), unit.end());
  return out;
}

}  // namespace sk
