// FullyShardedModel's side of its collectives (fsdp_collectives.h does the
// gathering and reducing): when a unit's all-gather is issued and what the
// model counts of it, how the gathered parameters are handed out (to the
// calling thread, or in order on a caller's stream), how a gradient is made
// ready for its reduction and what the reduction is told, and the gather of
// one full parameter.
#include <algorithm>
#include <string>

#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/fsdp_collectives.h"
#include "runtime/fsdp/fsdp_internal.h"
#include "runtime/ops/ops.h"

namespace sk {

using fsdp_internal::FsdpParamGroup;

Status FullyShardedModel::IssueAllGather(int unit, bool prefetch) {
  FsdpParamGroup& g = groups_[unit];
  if (g.unsharded()) {
    g.MarkInFlight();  // about to be computed with (kept unsharded, or prefetched)
    return OkStatus();
  }
  if (masters_written_) {
    SK_RETURN_IF_ERROR(fsdp_internal::WaitForCompute(*comm_, *ag_stream_));
    masters_written_ = false;
  }
  SK_RETURN_IF_ERROR(fsdp_internal::AllGather(*comm_, g, options_.mixed_precision.param_dtype));
  if (prefetch) ++counters_.prefetches;
  all_gather_log_.push_back(unit);
  counters_.max_unsharded_alive = std::max(counters_.max_unsharded_alive, UnshardedAlive());
  return OkStatus();
}

StatusOr<std::vector<Tensor>> FullyShardedModel::HandOutParams(int unit) {
  FsdpParamGroup& g = groups_[unit];
  if (caller_stream_ == nullptr) return WaitAndViews(unit);
  SK_RETURN_IF_ERROR(CheckCallerGathers(/*block=*/false));
  if (g.all_gather_pending()) {
    // The caller's kernels read the views after the all-gather, in stream
    // order; its outcome is checked once it has completed.
    SK_RETURN_IF_ERROR(caller_stream_->WaitEvent(g.pending_all_gather().event()));
    caller_gathers_.emplace_back(unit, g.TakeAllGather());
  }
  // Freed (PostForward, PostBackward, a refresh), the block is reused only
  // once the caller's stream has read it (record_stream).
  SK_RETURN_IF_ERROR(allocator_->RecordStream(*g.unsharded_param().storage(), caller_stream_));
  return WaitAndViews(unit);  // nothing left to wait for: the views
}

Status FullyShardedModel::CheckCallerGathers(bool block) {
  for (auto it = caller_gathers_.begin(); it != caller_gathers_.end();) {
    if (!block && !it->second->is_completed()) {
      ++it;
      continue;
    }
    Status s = it->second->wait(options_.timeout);
    const int unit = it->first;
    it = caller_gathers_.erase(it);
    if (!s.ok()) return s.WithContext("all-gather of unit '" + units_[unit].name + "'");
  }
  return OkStatus();
}

Status FullyShardedModel::OrderCallerBeforeGradients(const Tensor& full_grad, bool kept) {
  Device& device = *compute_ctx_.device;
  // A kept gradient buffer (no_sync, or the persistent strategies') may
  // still be read or zeroed by the reduce stream.
  if (kept) SK_RETURN_IF_ERROR(device.WaitStream(*caller_stream_, *rs_stream_));
  // cuda, sim: the zeroing of a new one is on the compute stream (on cpu the
  // calling thread has done it).
  if (!device.capabilities().ops_run_when_issued) {
    SK_RETURN_IF_ERROR(device.WaitStream(*caller_stream_, *compute_stream_));
  }
  return allocator_->RecordStream(*full_grad.storage(), caller_stream_);
}

Status FullyShardedModel::NarrowFullGradient(int unit) {
  FsdpParamGroup& g = groups_[unit];
  const DType rdt = ReduceDType();
  if (!g.has_full_grad() || g.full_grad().dtype() != DType::kF32 || rdt == DType::kF32 ||
      ParamsPersistent()) {
    return OkStatus();
  }
  SK_ASSIGN_OR_RETURN(Tensor narrow, activation_allocator_->Empty(rdt, g.full_grad().shape()));
  SK_RETURN_IF_ERROR(ops::Cast(compute_ctx_, g.full_grad(), narrow));
  g.set_full_grad(std::move(narrow));  // the f32 gradient is free for the next unit
  return OkStatus();
}

float FullyShardedModel::ReductionPostScale() const {
  if (!reduction_divisor_) return post_scale_;
  if (!(*reduction_divisor_ > 0)) return 0.f;
  // p / divisor, with p = 1 / pre_scale_ (a power of two: exact).
  return static_cast<float>(1.0 / (static_cast<double>(pre_scale_) * *reduction_divisor_));
}

Status FullyShardedModel::ReduceGradients(int unit) {
  fsdp_internal::ReduceArgs args;
  args.reduce_dtype = ReduceDType();
  args.pre_scale = pre_scale_;
  args.post_scale = ReductionPostScale();
  args.scale_without_collective = reduction_divisor_.has_value();
  args.keep_full_grad = ParamsPersistent();
  args.shard_allocator = shard_allocator_;
  args.grad_staging = grad_staging_;
  SK_ASSIGN_OR_RETURN(fsdp_internal::PendingReduction pending, fsdp_internal::Reduce(*comm_, groups_[unit], args));
  pending_reductions_.push_back(std::move(pending));
  return OkStatus();
}

StatusOr<Tensor> FullyShardedModel::GatherFullParam(int unit, int param) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "GatherFullParam"));
  const FsdpParamGroup& g = groups_[unit];
  if (param < 0 || param >= static_cast<int>(g.layout().params().size())) {
    return InvalidArgumentError("parameter index " + std::to_string(param) + " out of range for unit '" +
                                units_[unit].name + "'");
  }
  return fsdp_internal::GatherFullParam(*comm_, g, param);
}

}  // namespace sk
