// FullyShardedModel's flat parameters (FSDP2's FSDPParamGroup): which units
// are unsharded and in flight, freeing and regathering them, the views the
// hooks hand out (a unit's own and its tied owners'), and writing master
// shards (loading full parameters or shards, in order with their readers).
#include <algorithm>
#include <string>

#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/fsdp_internal.h"
#include "runtime/ops/ops.h"

namespace sk {

using fsdp_internal::Slice;

int FullyShardedModel::UnshardedAlive() const {
  if (ParamsPersistent()) return 0;
  int alive = 0;
  for (const FlatUnit& f : flat_) {
    if (f.full.defined() && f.in_flight) ++alive;
  }
  return alive;
}

void FullyShardedModel::Free(int unit) {
  flat_[unit].in_flight = false;
  if (ParamsPersistent()) return;
  flat_[unit].full = Tensor();
  flat_[unit].gather_work.reset();
}

Status FullyShardedModel::Regather(int unit) {
  flat_[unit].full = Tensor();
  SK_RETURN_IF_ERROR(IssueAllGather(unit, false));
  return WaitAndViews(unit, flat_[unit].full).status();
}

StatusOr<std::vector<Tensor>> FullyShardedModel::WaitAndViews(int unit, const Tensor& full) {
  FlatUnit& f = flat_[unit];
  if (f.gather_work) {
    Status s = f.gather_work->wait(options_.timeout);
    if (!s.ok()) return s.WithContext("all-gather of unit '" + units_[unit].name + "'");
    f.gather_work.reset();
  }
  const DType dt = options_.mixed_precision.param_dtype;
  std::vector<Tensor> views;
  for (const auto& p : f.layout.params()) {
    SK_ASSIGN_OR_RETURN(Tensor v, full.View(static_cast<size_t>(p.offset) * DTypeSize(dt), dt, p.shape));
    views.push_back(std::move(v));
  }
  return views;
}

Status FullyShardedModel::GatherTiedOwners(int unit, const char* call) {
  for (int o : tied_owners_[unit]) {
    if (flat_[o].state != UnitState::kForwardDone) {
      return FailedPreconditionError(std::string(call) + " of unit '" + units_[unit].name +
                                     "' uses tied parameters of unit '" + units_[o].name + "', which is in state '" +
                                     UnitStateName(flat_[o].state) + "' (expected '" +
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
    FlatUnit& owner = flat_[o];
    const bool kept = owner.full_grad.defined();
    if (!kept) {
      // The owner's unsharded gradient, made now and kept until the owner's
      // own backward has added to it and PostBackward reduces the sum.
      SK_ASSIGN_OR_RETURN(owner.full_grad,
                          activation_allocator_->Empty(FullGradDType(), Shape{owner.layout.padded_numel()}));
      SK_RETURN_IF_ERROR(ops::Fill(compute_ctx_, owner.full_grad, 0.f));
    }
    if (caller_stream_ != nullptr) SK_RETURN_IF_ERROR(OrderCallerBeforeGradients(owner.full_grad, kept));
  }
  for (const ParamRef& t : tied_[unit]) {
    const FlatUnit& owner = flat_[t.unit];
    const DType gdt = owner.full_grad.dtype();
    const auto& p = owner.layout.params()[t.param];
    SK_ASSIGN_OR_RETURN(Tensor v, owner.full_grad.View(static_cast<size_t>(p.offset) * DTypeSize(gdt), gdt, p.shape));
    grads->push_back(std::move(v));
  }
  return OkStatus();
}

void FullyShardedModel::ReleaseTiedOwners(int unit) {
  for (int o : tied_owners_[unit]) {
    flat_[o].in_flight = false;
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

Status FullyShardedModel::WriteMasterSlice(const FlatUnit& f, const FlatParamLayout::ShardSlice& s,
                                           const Tensor& flat_param) {
  const int64_t n = s.param_end - s.param_begin;
  SK_ASSIGN_OR_RETURN(Tensor src, Slice(flat_param, s.param_begin, n));
  SK_ASSIGN_OR_RETURN(Tensor dst, Slice(f.master, s.shard_offset, n));
  return WriteMaster(src, dst);
}

Status FullyShardedModel::MastersWritten(int unit) {
  masters_written_ = true;
  if (ParamsPersistent()) SK_RETURN_IF_ERROR(Regather(unit));
  return OkStatus();
}

Status FullyShardedModel::LoadFullParams(int unit, const std::vector<Tensor>& params) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadFullParams"));
  FlatUnit& f = flat_[unit];
  const auto& specs = f.layout.params();
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
  for (const auto& s : f.layout.ShardSlices(shard_group_->rank())) {
    SK_ASSIGN_OR_RETURN(Tensor flat, params[s.param].Reshape(Shape{params[s.param].numel()}));
    SK_RETURN_IF_ERROR(WriteMasterSlice(f, s, flat));
  }
  return MastersWritten(unit);
}

Status FullyShardedModel::LoadFullParam(int unit, int param, const Tensor& value) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadFullParam"));
  FlatUnit& f = flat_[unit];
  const auto& specs = f.layout.params();
  if (param < 0 || static_cast<size_t>(param) >= specs.size()) {
    return OutOfRangeError("parameter " + std::to_string(param) + " out of range (unit '" + units_[unit].name +
                           "' has " + std::to_string(specs.size()) + ")");
  }
  if (value.dtype() != DType::kF32 || value.numel() != specs[param].shape.numel()) {
    return InvalidArgumentError("parameter '" + units_[unit].name + "." + specs[param].name + "' is f32" +
                                specs[param].shape.ToString() + ", got " + value.ToString());
  }
  SK_ASSIGN_OR_RETURN(Tensor flat, value.Reshape(Shape{value.numel()}));
  for (const auto& s : f.layout.ShardSlices(shard_group_->rank())) {
    if (s.param == param) SK_RETURN_IF_ERROR(WriteMasterSlice(f, s, flat));
  }
  return MastersWritten(unit);
}

Status FullyShardedModel::LoadMasterShard(int unit, const Tensor& shard) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadMasterShard"));
  FlatUnit& f = flat_[unit];
  if (!shard.defined() || shard.dtype() != DType::kF32 || shard.numel() != f.layout.shard_numel()) {
    return InvalidArgumentError("master shard of unit '" + units_[unit].name + "' is f32[" +
                                std::to_string(f.layout.shard_numel()) + "], got " + shard.ToString());
  }
  SK_RETURN_IF_ERROR(WriteMaster(shard, f.master).WithContext("LoadMasterShard"));
  return MastersWritten(unit);
}

}  // namespace sk
