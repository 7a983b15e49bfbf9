// FullyShardedModel's collectives and their stream order (FSDP2's
// _fsdp_collectives), each on one FsdpParamGroup's buffers: the all-gather
// of a unit's flat parameter on the all-gather stream (with cpu_offload, the host->device copy first), the
// caller stream's ordering against it, the reduction of a unit's gradient on
// the reduce stream (reduce-scatter, all-reduce across replicas) and the
// accumulation into the gradient shard, the pending reductions' bound, and
// the full-parameter gather of GatherFullParam.
#include <algorithm>
#include <string>

#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/fsdp_internal.h"
#include "runtime/ops/ops.h"

namespace sk {

using fsdp_internal::Bytes;
using fsdp_internal::FsdpParamGroup;
using fsdp_internal::OnStream;
using fsdp_internal::Slice;

Status FullyShardedModel::WaitForCompute(Stream& waiter) {
  Device& device = *compute_ctx_.device;
  if (device.capabilities().ops_run_when_issued) return OkStatus();
  SK_RETURN_IF_ERROR(device.WaitStream(waiter, *compute_stream_));
  // A host stream on the device (sim) orders the host's writes the same way.
  if (host_stream_ != nullptr && host_stream_->device() == device.id()) {
    SK_RETURN_IF_ERROR(device.WaitStream(waiter, *host_stream_));
  }
  return OkStatus();
}

Status FullyShardedModel::CopyMasterIn(const FsdpParamGroup& group, const Tensor& input) {
  Device& device = *ag_ctx_.device;
  const Tensor master = group.master();
  if (input.dtype() == DType::kF32) {
    return device.CopyAsync(input.data(), master.data(), master.nbytes(), *ag_stream_)
        .WithContext("copying the master shard to the device");
  }
  // Stream-ordered on the all-gather stream's pool: free for reuse once the
  // cast, enqueued after the copy on the same stream, has read it.
  SK_ASSIGN_OR_RETURN(Tensor staged, ag_allocator_->Empty(DType::kF32, master.shape()));
  SK_RETURN_IF_ERROR(device.CopyAsync(staged.data(), master.data(), master.nbytes(), *ag_stream_)
                         .WithContext("copying the master shard to the device"));
  return OnStream(ag_ctx_, [staged, input](const ops::OpContext& c) {
    return ops::Cast(c, staged, input);
  });
}

Status FullyShardedModel::IssueAllGather(int unit, bool prefetch) {
  FsdpParamGroup& g = groups_[unit];
  if (g.unsharded()) {
    g.MarkInFlight();  // about to be computed with (kept unsharded, or prefetched)
    return OkStatus();
  }
  const DType dt = options_.mixed_precision.param_dtype;
  const int64_t shard = g.layout().shard_numel();
  if (masters_written_) {
    SK_RETURN_IF_ERROR(WaitForCompute(*ag_stream_));
    masters_written_ = false;
  }
  SK_ASSIGN_OR_RETURN(Tensor full, ag_allocator_->Empty(dt, Shape{g.layout().padded_numel()}));
  if (!compute_ctx_.device->capabilities().ops_run_when_issued) {
    // The compute stream reads it: its block returns to the all-gather
    // stream's pool only once that reading is done (record_stream).
    SK_RETURN_IF_ERROR(allocator_->RecordStream(*full.storage(), compute_stream_.get()));
  }
  const size_t offset = static_cast<size_t>(shard_group_->rank() * shard) * DTypeSize(dt);
  SK_ASSIGN_OR_RETURN(Tensor input, full.View(offset, dt, Shape{shard}));
  // Cast (with offload: copy in, then cast) the master shard on the
  // all-gather stream, in stream order before the collective reads it.
  if (options_.cpu_offload) {
    SK_RETURN_IF_ERROR(CopyMasterIn(g, input));
  } else {
    Tensor master = g.master();
    SK_RETURN_IF_ERROR(OnStream(ag_ctx_, [master, input](const ops::OpContext& c) {
      return ops::Cast(c, master, input);
    }));
  }
  comm::CollectiveOptions co;
  co.timeout = options_.timeout;
  SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work, shard_group_->all_gather(full, input, *ag_stream_, co));
  const int64_t bytes = Bytes(full);
  g.RecordAllGather(std::move(full), std::move(work));
  ++counters_.all_gathers;
  counters_.all_gather_bytes += bytes;
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

StatusOr<std::shared_ptr<comm::Work>> FullyShardedModel::AllReduceAcrossReplicas(const Tensor& reduced,
                                                                                float pre_scale) {
  comm::ReduceOptions ro;
  ro.op = comm::ReduceOp::kSum;
  ro.pre_scale = pre_scale;
  ro.post_scale = ReductionPostScale();
  ro.timeout = options_.timeout;
  SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work, replicate_group_->all_reduce(reduced, *rs_stream_, ro));
  ++counters_.all_reduces;
  counters_.all_reduce_bytes += Bytes(reduced);
  counters_.replica_bytes += Bytes(reduced);
  return work;
}

float FullyShardedModel::ReductionPostScale() const {
  if (!reduction_divisor_) return post_scale_;
  if (!(*reduction_divisor_ > 0)) return 0.f;
  // p / divisor, with p = 1 / pre_scale_ (a power of two: exact).
  return static_cast<float>(1.0 / (static_cast<double>(pre_scale_) * *reduction_divisor_));
}

Status FullyShardedModel::ReduceGradients(int unit) {
  FsdpParamGroup& g = groups_[unit];
  const DType gdt = g.full_grad().dtype();
  const DType rdt = ReduceDType();
  const int64_t shard = g.layout().shard_numel();
  const int64_t padded = g.layout().padded_numel();
  Tensor full_grad = g.full_grad();
  SK_RETURN_IF_ERROR(allocator_->RecordStream(*full_grad.storage(), rs_stream_.get()));

  Tensor input = full_grad;
  if (rdt != gdt) {
    SK_ASSIGN_OR_RETURN(input, rs_allocator_->Empty(rdt, Shape{padded}));
    Tensor in = input;
    SK_RETURN_IF_ERROR(OnStream(rs_ctx_, [full_grad, in](const ops::OpContext& c) {
      return ops::Cast(c, full_grad, in);
    }));
  }
  std::shared_ptr<comm::Work> last;
  Tensor reduced;
  if (sharding_.shard_size() == 1) {
    // NO_SHARD: the "shard" is the whole flat parameter; only replicas reduce.
    if (rdt == gdt && !ParamsPersistent()) {
      reduced = input;
    } else if (rdt == gdt) {
      // The persistent full gradient is zeroed after its reduction: reduce a copy.
      SK_ASSIGN_OR_RETURN(reduced, rs_allocator_->Empty(rdt, Shape{padded}));
      Tensor dst = reduced;
      SK_RETURN_IF_ERROR(OnStream(rs_ctx_, [dst, input](const ops::OpContext& c) {
        return ops::Copy(c, input, dst);
      }));
    } else {
      reduced = input;
    }
    if (replicate_group_) {
      SK_ASSIGN_OR_RETURN(last, AllReduceAcrossReplicas(reduced, pre_scale_));
    } else if (reduction_divisor_) {
      // One rank: no collective divides, so the divisor scales here.
      // `reduced` is a copy made above, or the full gradient that is
      // dropped after this reduction: nothing else reads it.
      const float scale = ReductionPostScale();
      Tensor r = reduced;
      SK_RETURN_IF_ERROR(OnStream(rs_ctx_, [r, scale](const ops::OpContext& c) {
        return ops::Scale(c, r, scale);
      }));
    }
  } else {
    SK_ASSIGN_OR_RETURN(reduced, rs_allocator_->Empty(rdt, Shape{shard}));
    comm::ReduceOptions ro;
    ro.op = comm::ReduceOp::kSum;
    ro.pre_scale = pre_scale_;
    ro.post_scale = replicate_group_ ? 1.f : ReductionPostScale();
    ro.timeout = options_.timeout;
    SK_ASSIGN_OR_RETURN(last, shard_group_->reduce_scatter(reduced, input, *rs_stream_, ro));
    ++counters_.reduce_scatters;
    counters_.reduce_scatter_bytes += Bytes(input);
    // Pre-divided already by the reduce-scatter.
    if (replicate_group_) {
      SK_ASSIGN_OR_RETURN(last, AllReduceAcrossReplicas(reduced, 1.f));
    }
  }
  // Accumulate into the f32 gradient shard (widening from reduce_dtype), in
  // stream order after the reduction (on the host with offload).
  SK_RETURN_IF_ERROR(AccumulateReduced(g, reduced));
  if (ParamsPersistent()) {
    // SHARD_OPTIM and NO_SHARD keep their full gradient: clear it once read.
    SK_RETURN_IF_ERROR(OnStream(rs_ctx_, [full_grad](const ops::OpContext& c) {
      return ops::Fill(c, full_grad, 0.f);
    }));
  } else {
    g.DropFullGrad();  // the reduce stream's closures keep it alive until read
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, rs_ctx_.device->CreateEvent());
  SK_RETURN_IF_ERROR(done->Record(*rs_stream_));
  pending_reductions_.push_back(PendingReduction{std::move(last), std::move(done)});
  return OkStatus();
}

Status FullyShardedModel::AccumulateReduced(FsdpParamGroup& group, const Tensor& reduced) {
  // The step's first reduction of the unit makes its shard: from the
  // compute stream's pool, which the reduce stream is ordered after here
  // (PostBackward's WaitForCompute), recorded on the reduce stream that
  // writes it so a release reuses it only after that write.
  const bool first = !group.has_grad();
  if (first) {
    SK_RETURN_IF_ERROR(group.AllocateGrad(*shard_allocator_));
    if (!options_.cpu_offload && !compute_ctx_.device->capabilities().ops_run_when_issued) {
      SK_RETURN_IF_ERROR(allocator_->RecordStream(*group.grad().storage(), rs_stream_.get()));
    }
  }
  Tensor grad = group.grad();
  // 0 + x is x: the first reduction copies (widening from reduce_dtype)
  // where later ones add, the same bits either way.
  auto accumulate = [first](const ops::OpContext& c, const Tensor& src, const Tensor& dst) {
    if (!first) return ops::Axpy(c, 1.f, src, dst);
    return src.dtype() == dst.dtype() ? ops::Copy(c, src, dst) : ops::Cast(c, src, dst);
  };
  if (!options_.cpu_offload) {
    return OnStream(rs_ctx_, [grad, reduced, accumulate](const ops::OpContext& c) {
      return accumulate(c, reduced, grad);
    });
  }
  SK_ASSIGN_OR_RETURN(Tensor staged, Slice(grad_staging_, 0, reduced.numel()));
  SK_RETURN_IF_ERROR(rs_ctx_.device->CopyAsync(staged.data(), reduced.data(), reduced.nbytes(), *rs_stream_)
                         .WithContext("copying the reduced gradient shard to the host"));
  if (host_stream_ == nullptr) {
    // The host accumulates when the reduce stream reaches this point (a
    // closure on the stream: its worker on cpu, a driver thread on cuda).
    ops::OpContext host = host_ctx_;
    if (rs_ctx_.device->capabilities().ops_run_when_issued) {
      // As every cpu closure: `reduced` lives until the stream has read it.
      return rs_stream_->Enqueue([host, staged, grad, reduced, accumulate]() {
        return accumulate(host, staged, grad);
      });
    }
    // cuda: `reduced` is the reduce stream's (stream-ordered reuse), and a
    // driver-thread closure must not free device memory (no CUDA calls there).
    return rs_stream_->Enqueue([host, staged, grad, accumulate]() { return accumulate(host, staged, grad); });
  }
  // A host stream (sim): it waits for the copy, then accumulates.
  SK_RETURN_IF_ERROR(host_ctx_.device->WaitStream(*host_stream_, *rs_stream_));
  return accumulate(host_ctx_, staged, grad);
}

Status FullyShardedModel::WaitPendingReductionWork() {
  while (!pending_reductions_.empty()) {
    PendingReduction r = std::move(pending_reductions_.front());
    pending_reductions_.pop_front();
    if (r.work) {
      Status s = r.work->wait(options_.timeout);
      if (!s.ok()) return s.WithContext("gradient reduction");
    }
    // The collective is done; the accumulation after it may not be, and its
    // closure still holds the reduced shard (and the full gradient until the
    // collective's closure is released).
    Status s = r.done->Synchronize(options_.timeout);
    if (!s.ok()) return s.WithContext("accumulating a reduced gradient shard on the reduce stream");
  }
  return OkStatus();
}

Status FullyShardedModel::WaitPendingReductions() {
  SK_RETURN_IF_ERROR(WaitPendingReductionWork());
  Status s = rs_stream_->Synchronize(options_.timeout);
  if (!s.ok()) return s.WithContext("reduce stream");
  if (host_stream_ != nullptr) {
    // The host accumulations wait for the reduce stream on the host stream.
    s = host_stream_->Synchronize(options_.timeout);
    if (!s.ok()) return s.WithContext("host stream");
  }
  return OkStatus();
}

StatusOr<Tensor> FullyShardedModel::GatherFullParam(int unit, int param) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "GatherFullParam"));
  const FsdpParamGroup& g = groups_[unit];
  if (param < 0 || param >= static_cast<int>(g.layout().params().size())) {
    return InvalidArgumentError("parameter index " + std::to_string(param) + " out of range for unit '" +
                                units_[unit].name + "'");
  }
  const int64_t shard = g.layout().shard_numel();
  SK_ASSIGN_OR_RETURN(Tensor full, ag_allocator_->Empty(DType::kF32, Shape{g.layout().padded_numel()}));
  SK_ASSIGN_OR_RETURN(Tensor input, Slice(full, shard_group_->rank() * shard, shard));
  const auto& p = g.layout().params()[param];
  SK_ASSIGN_OR_RETURN(Tensor out, HostAllocator::Default().Empty(DType::kF32, p.shape));
  SK_ASSIGN_OR_RETURN(Tensor src, full.View(static_cast<size_t>(p.offset) * 4, DType::kF32, p.shape));
  // Copy in, gather and copy out to the host, all in all-gather stream order,
  // after every update of the master shard enqueued so far.
  SK_RETURN_IF_ERROR(WaitForCompute(*ag_stream_));
  Tensor master = g.master();
  if (options_.cpu_offload) {
    SK_RETURN_IF_ERROR(ag_ctx_.device->CopyAsync(input.data(), master.data(), master.nbytes(), *ag_stream_));
  } else {
    SK_RETURN_IF_ERROR(OnStream(ag_ctx_, [master, input](const ops::OpContext& c) {
      return ops::Copy(c, master, input);
    }));
  }
  comm::CollectiveOptions co;
  co.timeout = options_.timeout;
  SK_ASSIGN_OR_RETURN(auto w, shard_group_->all_gather(full, input, *ag_stream_, co));
  SK_RETURN_IF_ERROR(OnStream(ag_ctx_, [src, out](const ops::OpContext& c) {
    return ops::Copy(c, src, out);
  }));
  SK_RETURN_IF_ERROR(w->wait(options_.timeout));
  SK_RETURN_IF_ERROR(ag_stream_->Synchronize(options_.timeout).WithContext("GatherFullParam"));
  return out;
}

}  // namespace sk
