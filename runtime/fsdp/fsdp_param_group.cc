// FullyShardedModel's flat parameters (FSDP2's FSDPParamGroup): which units
// are unsharded and in flight, freeing and regathering them, the views the
// hooks hand out (a unit's own and its tied owners'), and writing master
// shards (loading full parameters or shards, in order with their readers).
#include <algorithm>
#include <string>

#include "runtime/fsdp/fsdp_param_group.h"

#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/fsdp_internal.h"
#include "runtime/ops/ops.h"

namespace sk {
namespace fsdp_internal {

StatusOr<FsdpParamGroup> FsdpParamGroup::Create(FlatParamLayout layout, Allocator& shard_allocator,
                                                const ops::OpContext& shard_context) {
  FsdpParamGroup group(std::move(layout));
  const Shape shard{group.layout_.shard_numel()};
  SK_ASSIGN_OR_RETURN(group.master_, shard_allocator.Empty(DType::kF32, shard));
  SK_ASSIGN_OR_RETURN(group.grad_, shard_allocator.Empty(DType::kF32, shard));
  SK_RETURN_IF_ERROR(ops::Fill(shard_context, group.master_, 0.f));
  SK_RETURN_IF_ERROR(group.ZeroGrad(shard_context));
  return group;
}

Status FsdpParamGroup::ZeroGrad(const ops::OpContext& context) {
  SK_RETURN_IF_ERROR(ops::Fill(context, grad_, 0.f));
  grad_zero_ = true;
  return OkStatus();
}

void FsdpParamGroup::RecordAllGather(Tensor unsharded, std::shared_ptr<comm::Work> work) {
  unsharded_ = std::move(unsharded);
  all_gather_ = std::move(work);
  in_flight_ = true;
}

void FsdpParamGroup::Reshard() {
  in_flight_ = false;
  unsharded_ = Tensor();
  all_gather_.reset();
}

Status FsdpParamGroup::WaitForAllGather(Duration timeout) {
  if (!all_gather_) return OkStatus();
  Status s = all_gather_->wait(timeout);
  if (!s.ok()) return s;
  all_gather_.reset();
  return OkStatus();
}

std::shared_ptr<comm::Work> FsdpParamGroup::TakeAllGather() { return std::move(all_gather_); }

StatusOr<std::vector<Tensor>> FsdpParamGroup::ParamViews() const {
  const DType dtype = unsharded_.dtype();
  std::vector<Tensor> views;
  for (const auto& p : layout_.params()) {
    SK_ASSIGN_OR_RETURN(Tensor v, unsharded_.View(static_cast<size_t>(p.offset) * DTypeSize(dtype), dtype, p.shape));
    views.push_back(std::move(v));
  }
  return views;
}

Status FsdpParamGroup::MakeFullGrad(DType dtype, const ops::OpContext& context) {
  SK_ASSIGN_OR_RETURN(Tensor full_grad, context.alloc->Empty(dtype, Shape{layout_.padded_numel()}));
  SK_RETURN_IF_ERROR(ops::Fill(context, full_grad, 0.f));
  full_grad_ = std::move(full_grad);
  return OkStatus();
}

StatusOr<Tensor> FsdpParamGroup::GradView(int param) const {
  const DType dtype = full_grad_.dtype();
  const auto& p = layout_.params()[param];
  return full_grad_.View(static_cast<size_t>(p.offset) * DTypeSize(dtype), dtype, p.shape);
}

StatusOr<std::vector<Tensor>> FsdpParamGroup::GradViews() const {
  std::vector<Tensor> views;
  for (int p = 0; p < static_cast<int>(layout_.params().size()); ++p) {
    SK_ASSIGN_OR_RETURN(Tensor v, GradView(p));
    views.push_back(std::move(v));
  }
  return views;
}

void FsdpParamGroup::Abandon(bool keep_unsharded) {
  state_ = UnitState::kIdle;
  in_flight_ = false;
  if (!keep_unsharded) Reshard();
  full_grad_ = Tensor();
}

}  // namespace fsdp_internal

using fsdp_internal::FsdpParamGroup;
using fsdp_internal::Slice;

int FullyShardedModel::UnshardedAlive() const {
  if (ParamsPersistent()) return 0;
  int alive = 0;
  for (const FsdpParamGroup& g : groups_) {
    if (g.unsharded() && g.in_flight()) ++alive;
  }
  return alive;
}

void FullyShardedModel::Free(int unit) {
  if (ParamsPersistent()) {
    groups_[unit].ClearInFlight();
  } else {
    groups_[unit].Reshard();
  }
}

Status FullyShardedModel::Regather(int unit) {
  groups_[unit].Reshard();
  SK_RETURN_IF_ERROR(IssueAllGather(unit, false));
  return WaitAndViews(unit).status();
}

StatusOr<std::vector<Tensor>> FullyShardedModel::WaitAndViews(int unit) {
  FsdpParamGroup& g = groups_[unit];
  Status s = g.WaitForAllGather(options_.timeout);
  if (!s.ok()) return s.WithContext("all-gather of unit '" + units_[unit].name + "'");
  return g.ParamViews();
}

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

Status FullyShardedModel::QuiesceMasterReaders() {
  if (!options_.cpu_offload) return OkStatus();
  return ag_stream_->Synchronize(options_.timeout)
      .WithContext("waiting for the all-gather stream before the host writes master shards");
}

Status FullyShardedModel::WriteMaster(const Tensor& src, const Tensor& dst) {
  if (!options_.cpu_offload) return ops::Copy(compute_ctx_, src, dst);
  SK_RETURN_IF_ERROR(QuiesceMasterReaders());
  if (src.device().is_cpu() || src.device().kind == host_ctx_.device->id().kind) {
    return ops::Copy(host_ctx_, src, dst);
  }
  // A device tensor into host memory: copied by the compute stream, waited for.
  SK_RETURN_IF_ERROR(ops::Copy(compute_ctx_, src, dst));
  return compute_stream_->Synchronize(options_.timeout).WithContext("copying into a master shard");
}

Status FullyShardedModel::WriteMasterSlice(const FsdpParamGroup& group, const FlatParamLayout::ShardSlice& s,
                                           const Tensor& flat_param) {
  const int64_t n = s.param_end - s.param_begin;
  SK_ASSIGN_OR_RETURN(Tensor src, Slice(flat_param, s.param_begin, n));
  SK_ASSIGN_OR_RETURN(Tensor dst, Slice(group.master(), s.shard_offset, n));
  return WriteMaster(src, dst);
}

Status FullyShardedModel::MastersWritten(int unit) {
  masters_written_ = true;
  if (ParamsPersistent()) SK_RETURN_IF_ERROR(Regather(unit));
  return OkStatus();
}

Status FullyShardedModel::LoadFullParams(int unit, const std::vector<Tensor>& params) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadFullParams"));
  const FsdpParamGroup& g = groups_[unit];
  const auto& specs = g.layout().params();
  if (params.size() != specs.size()) {
    return InvalidArgumentError("unit '" + units_[unit].name + "' has " + std::to_string(specs.size()) +
                                " parameters, got " + std::to_string(params.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (params[i].dtype() != DType::kF32 || params[i].shape() != specs[i].shape) {
      return InvalidArgumentError("parameter '" + units_[unit].name + "." + specs[i].name + "' must be f32" +
                                  specs[i].shape.ToString() + ", got " + params[i].ToString());
    }
  }
  for (const auto& s : g.layout().ShardSlices(shard_group_->rank())) {
    SK_ASSIGN_OR_RETURN(Tensor flat, params[s.param].Reshape(Shape{params[s.param].numel()}));
    SK_RETURN_IF_ERROR(WriteMasterSlice(g, s, flat));
  }
  return MastersWritten(unit);
}

Status FullyShardedModel::LoadFullParam(int unit, int param, const Tensor& value) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadFullParam"));
  const FsdpParamGroup& g = groups_[unit];
  const auto& specs = g.layout().params();
  if (param < 0 || static_cast<size_t>(param) >= specs.size()) {
    return OutOfRangeError("parameter " + std::to_string(param) + " out of range (unit '" + units_[unit].name +
                           "' has " + std::to_string(specs.size()) + ")");
  }
  if (value.dtype() != DType::kF32 || value.numel() != specs[param].shape.numel()) {
    return InvalidArgumentError("parameter '" + units_[unit].name + "." + specs[param].name + "' is f32" +
                                specs[param].shape.ToString() + ", got " + value.ToString());
  }
  SK_ASSIGN_OR_RETURN(Tensor flat, value.Reshape(Shape{value.numel()}));
  for (const auto& s : g.layout().ShardSlices(shard_group_->rank())) {
    if (s.param == param) SK_RETURN_IF_ERROR(WriteMasterSlice(g, s, flat));
  }
  return MastersWritten(unit);
}

Status FullyShardedModel::LoadMasterShard(int unit, const Tensor& shard) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadMasterShard"));
  const FsdpParamGroup& g = groups_[unit];
  if (!shard.defined() || shard.dtype() != DType::kF32 || shard.numel() != g.layout().shard_numel()) {
    return InvalidArgumentError("master shard of unit '" + units_[unit].name + "' is f32[" +
                                std::to_string(g.layout().shard_numel()) + "], got " + shard.ToString());
  }
  SK_RETURN_IF_ERROR(WriteMaster(shard, g.master()).WithContext("LoadMasterShard"));
  return MastersWritten(unit);
}

}  // namespace sk
