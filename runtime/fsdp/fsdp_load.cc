// FullyShardedModel's loading: overwriting master shards from full
// parameters or from shards (checkpoints, LoadFullParam), each write in
// order with whatever still reads the master shards, and the regather of
// the persistent strategies' full parameters afterwards.
#include <string>

#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/fsdp_internal.h"
#include "runtime/ops/ops.h"

namespace sk {

using fsdp_internal::FsdpParamGroup;
using fsdp_internal::Slice;

Status FullyShardedModel::QuiesceMasterReaders() {
  if (!options_.cpu_offload) return OkStatus();
  return ag_stream_->Synchronize(options_.timeout)
      .WithContext("waiting for the all-gather stream before the host writes master shards");
}

Status FullyShardedModel::WriteMaster(const Tensor& src, const Tensor& dst) {
  if (!options_.cpu_offload) return ops::Copy(compute_ctx_, src, dst);
  SK_RETURN_IF_ERROR(QuiesceMasterReaders());
  SK_ASSIGN_OR_RETURN(DeviceCapabilities src_can, Device::CapabilitiesOf(src.device()));
  if (src_can.host_memory || src.device().kind == host_ctx_.device->id().kind) {
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
