// FullyShardedModel's tied parameters (fsdp.h, "Tied parameters"): a unit
// that uses parameters of an earlier unit (their owner) gathers the owner's
// parameter group for each use, borrows views into its unsharded parameter
// and full gradient, and releases it again after. This spans groups, so it
// is the model's, not FsdpParamGroup's.
#include <string>
#include <utility>

#include "runtime/fsdp/fsdp.h"

namespace sk {

using fsdp_internal::FsdpParamGroup;

Status FullyShardedModel::GatherTiedOwners(int unit, const char* call) {
  for (int o : tied_owners_[unit]) {
    if (groups_[o].state() != UnitState::kForwardDone) {
      return FailedPreconditionError(std::string(call) + " of unit '" + units_[unit].name +
                                     "' uses tied parameters of unit '" + units_[o].name + "', which is in state '" +
                                     UnitStateName(groups_[o].state()) + "' (expected '" +
                                     UnitStateName(UnitState::kForwardDone) + "': it runs first)");
    }
    SK_RETURN_IF_ERROR(IssueAllGather(o, false));
  }
  return OkStatus();
}

StatusOr<std::vector<Tensor>> FullyShardedModel::AppendTiedParams(int unit, std::vector<Tensor> views) {
  for (const ParamRef& t : tied_[unit]) {
    SK_ASSIGN_OR_RETURN(std::vector<Tensor> owner, HandOutParams(t.unit));
    views.push_back(std::move(owner[t.param]));
  }
  return views;
}

Status FullyShardedModel::AppendTiedGradients(int unit, std::vector<Tensor>* grads) {
  for (int o : tied_owners_[unit]) {
    FsdpParamGroup& owner = groups_[o];
    const bool kept = owner.has_full_grad();
    // The owner's unsharded gradient, made now and kept until the owner's
    // own backward has added to it and PostBackward reduces the sum.
    if (!kept) SK_RETURN_IF_ERROR(owner.MakeFullGrad(FullGradDType(), compute_ctx_));
    if (caller_stream_ != nullptr) SK_RETURN_IF_ERROR(OrderCallerBeforeGradients(owner.full_grad(), kept));
  }
  for (const ParamRef& t : tied_[unit]) {
    SK_ASSIGN_OR_RETURN(Tensor v, groups_[t.unit].GradView(t.param));
    grads->push_back(std::move(v));
  }
  return OkStatus();
}

void FullyShardedModel::ReleaseTiedOwners(int unit) {
  for (int o : tied_owners_[unit]) {
    groups_[o].ClearInFlight();
    // Resharded after its own forward: gathered for this use only.
    if (ReshardAfterForward()) Free(o);
  }
}

}  // namespace sk
