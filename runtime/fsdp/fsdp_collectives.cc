// FSDP's collectives over a communication context (fsdp_collectives.h).
#include "runtime/fsdp/fsdp_collectives.h"

#include <string>
#include <utility>

#include "runtime/fsdp/fsdp_internal.h"
#include "runtime/ops/ops.h"

namespace sk::fsdp_internal {

namespace {

// cpu_offload: writes the f32 master shard of `group` into `input` (the
// all-gather's slice of its unsharded parameter) on the all-gather stream:
// host->device copy, then the cast to the all-gather's dtype on the device.
Status CopyMasterIn(const FsdpComm& c, const FsdpParamGroup& group, const Tensor& input) {
  Device& device = *c.all_gather.device;
  Stream& stream = *c.all_gather.stream;
  const Tensor master = group.master();
  if (input.dtype() == DType::kF32) {
    return device.CopyAsync(input.data(), master.data(), master.nbytes(), stream)
        .WithContext("copying the master shard to the device");
  }
  // Stream-ordered on the all-gather stream's pool: free for reuse once the
  // cast, enqueued after the copy on the same stream, has read it.
  SK_ASSIGN_OR_RETURN(Tensor staged, c.all_gather.alloc->Empty(DType::kF32, master.shape()));
  SK_RETURN_IF_ERROR(device.CopyAsync(staged.data(), master.data(), master.nbytes(), stream)
                         .WithContext("copying the master shard to the device"));
  return OnStream(c.all_gather, [staged, input](const ops::OpContext& ctx) {
    return ops::Cast(ctx, staged, input);
  });
}

// The all-reduce of a reduced gradient (shard) across replicas on the
// reduce stream, post-divided by post_scale, counted.
StatusOr<std::shared_ptr<comm::Work>> AllReduceAcrossReplicas(const FsdpComm& c, const Tensor& reduced,
                                                              float pre_scale, float post_scale) {
  comm::ReduceOptions ro;
  ro.op = comm::ReduceOp::kSum;
  ro.pre_scale = pre_scale;
  ro.post_scale = post_scale;
  ro.timeout = c.timeout;
  SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work,
                      c.replicate_group->all_reduce(reduced, *c.reduce.stream, ro));
  ++c.counters->all_reduces;
  c.counters->all_reduce_bytes += Bytes(reduced);
  c.counters->replica_bytes += Bytes(reduced);
  return work;
}

// Adds `reduced` (this rank's reduced shard, on the device, reduce dtype)
// into group's gradient shard in reduce-stream order: without offload an
// Axpy on the reduce stream; with it a device->host copy and the host
// accumulation. The step's first reduction of the unit allocates the shard
// and copies (widening) into it instead: 0 + x is x, one pass and one
// shard's memory fewer until then.
Status AccumulateReduced(const FsdpComm& c, FsdpParamGroup& group, const Tensor& reduced,
                         const ReduceArgs& args) {
  // The step's first reduction of the unit makes its shard: from the
  // compute stream's pool, which the reduce stream is ordered after here
  // (PostBackward's WaitForCompute), recorded on the reduce stream that
  // writes it so a release reuses it only after that write.
  const bool first = !group.has_grad();
  if (first) {
    SK_RETURN_IF_ERROR(group.AllocateGrad(*args.shard_allocator));
    if (!c.cpu_offload && !c.compute.device->capabilities().ops_run_when_issued) {
      SK_RETURN_IF_ERROR(c.allocator->RecordStream(*group.grad().storage(), c.reduce.stream));
    }
  }
  Tensor grad = group.grad();
  // 0 + x is x: the first reduction copies (widening from reduce_dtype)
  // where later ones add, the same bits either way.
  auto accumulate = [first](const ops::OpContext& ctx, const Tensor& src, const Tensor& dst) {
    if (!first) return ops::Axpy(ctx, 1.f, src, dst);
    return src.dtype() == dst.dtype() ? ops::Copy(ctx, src, dst) : ops::Cast(ctx, src, dst);
  };
  if (!c.cpu_offload) {
    return OnStream(c.reduce, [grad, reduced, accumulate](const ops::OpContext& ctx) {
      return accumulate(ctx, reduced, grad);
    });
  }
  Stream& rs = *c.reduce.stream;
  SK_ASSIGN_OR_RETURN(Tensor staged, Slice(args.grad_staging, 0, reduced.numel()));
  SK_RETURN_IF_ERROR(c.reduce.device->CopyAsync(staged.data(), reduced.data(), reduced.nbytes(), rs)
                         .WithContext("copying the reduced gradient shard to the host"));
  if (c.host_stream == nullptr) {
    // The host accumulates when the reduce stream reaches this point (a
    // closure on the stream: its worker on cpu, a driver thread on cuda).
    ops::OpContext host = c.host;
    if (c.reduce.device->capabilities().ops_run_when_issued) {
      // As every cpu closure: `reduced` lives until the stream has read it.
      return rs.Enqueue([host, staged, grad, reduced, accumulate]() {
        return accumulate(host, staged, grad);
      });
    }
    // cuda: `reduced` is the reduce stream's (stream-ordered reuse), and a
    // driver-thread closure must not free device memory (no CUDA calls there).
    return rs.Enqueue([host, staged, grad, accumulate]() { return accumulate(host, staged, grad); });
  }
  // A host stream (sim): it waits for the copy, then accumulates.
  SK_RETURN_IF_ERROR(c.host.device->WaitStream(*c.host_stream, rs));
  return accumulate(c.host, staged, grad);
}

}  // namespace

Status WaitForCompute(const FsdpComm& c, Stream& waiter) {
  Device& device = *c.compute.device;
  if (device.capabilities().ops_run_when_issued) return OkStatus();
  SK_RETURN_IF_ERROR(device.WaitStream(waiter, *c.compute.stream));
  // A host stream on the device (sim) orders the host's writes the same way.
  if (c.host_stream != nullptr && c.host_stream->device() == device.id()) {
    SK_RETURN_IF_ERROR(device.WaitStream(waiter, *c.host_stream));
  }
  return OkStatus();
}

Status AllGather(const FsdpComm& c, FsdpParamGroup& group, DType dtype) {
  const int64_t shard = group.layout().shard_numel();
  SK_ASSIGN_OR_RETURN(Tensor full, c.all_gather.alloc->Empty(dtype, Shape{group.layout().padded_numel()}));
  if (!c.compute.device->capabilities().ops_run_when_issued) {
    // The compute stream reads it: its block returns to the all-gather
    // stream's pool only once that reading is done (record_stream).
    SK_RETURN_IF_ERROR(c.allocator->RecordStream(*full.storage(), c.compute.stream));
  }
  const size_t offset = static_cast<size_t>(c.shard_group->rank() * shard) * DTypeSize(dtype);
  SK_ASSIGN_OR_RETURN(Tensor input, full.View(offset, dtype, Shape{shard}));
  // Cast (with offload: copy in, then cast) the master shard on the
  // all-gather stream, in stream order before the collective reads it.
  if (c.cpu_offload) {
    SK_RETURN_IF_ERROR(CopyMasterIn(c, group, input));
  } else {
    Tensor master = group.master();
    SK_RETURN_IF_ERROR(OnStream(c.all_gather, [master, input](const ops::OpContext& ctx) {
      return ops::Cast(ctx, master, input);
    }));
  }
  comm::CollectiveOptions co;
  co.timeout = c.timeout;
  SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> work,
                      c.shard_group->all_gather(full, input, *c.all_gather.stream, co));
  const int64_t bytes = Bytes(full);
  group.RecordAllGather(std::move(full), std::move(work));
  ++c.counters->all_gathers;
  c.counters->all_gather_bytes += bytes;
  return OkStatus();
}

StatusOr<PendingReduction> Reduce(const FsdpComm& c, FsdpParamGroup& group, const ReduceArgs& args) {
  const DType gdt = group.full_grad().dtype();
  const DType rdt = args.reduce_dtype;
  const int64_t shard = group.layout().shard_numel();
  const int64_t padded = group.layout().padded_numel();
  Stream& rs = *c.reduce.stream;
  Tensor full_grad = group.full_grad();
  SK_RETURN_IF_ERROR(c.allocator->RecordStream(*full_grad.storage(), &rs));

  Tensor input = full_grad;
  if (rdt != gdt) {
    SK_ASSIGN_OR_RETURN(input, c.reduce.alloc->Empty(rdt, Shape{padded}));
    Tensor in = input;
    SK_RETURN_IF_ERROR(OnStream(c.reduce, [full_grad, in](const ops::OpContext& ctx) {
      return ops::Cast(ctx, full_grad, in);
    }));
  }
  std::shared_ptr<comm::Work> last;
  Tensor reduced;
  if (c.shard_group->size() == 1) {
    // NO_SHARD: the "shard" is the whole flat parameter; only replicas reduce.
    if (rdt == gdt && !args.keep_full_grad) {
      reduced = input;
    } else if (rdt == gdt) {
      // The persistent full gradient is zeroed after its reduction: reduce a copy.
      SK_ASSIGN_OR_RETURN(reduced, c.reduce.alloc->Empty(rdt, Shape{padded}));
      Tensor dst = reduced;
      SK_RETURN_IF_ERROR(OnStream(c.reduce, [dst, input](const ops::OpContext& ctx) {
        return ops::Copy(ctx, input, dst);
      }));
    } else {
      reduced = input;
    }
    if (c.replicate_group != nullptr) {
      SK_ASSIGN_OR_RETURN(last, AllReduceAcrossReplicas(c, reduced, args.pre_scale, args.post_scale));
    } else if (args.scale_without_collective) {
      // One rank: no collective divides, so the divisor scales here.
      // `reduced` is a copy made above, or the full gradient that is
      // dropped after this reduction: nothing else reads it.
      const float scale = args.post_scale;
      Tensor r = reduced;
      SK_RETURN_IF_ERROR(OnStream(c.reduce, [r, scale](const ops::OpContext& ctx) {
        return ops::Scale(ctx, r, scale);
      }));
    }
  } else {
    SK_ASSIGN_OR_RETURN(reduced, c.reduce.alloc->Empty(rdt, Shape{shard}));
    comm::ReduceOptions ro;
    ro.op = comm::ReduceOp::kSum;
    ro.pre_scale = args.pre_scale;
    ro.post_scale = c.replicate_group != nullptr ? 1.f : args.post_scale;
    ro.timeout = c.timeout;
    SK_ASSIGN_OR_RETURN(last, c.shard_group->reduce_scatter(reduced, input, rs, ro));
    ++c.counters->reduce_scatters;
    c.counters->reduce_scatter_bytes += Bytes(input);
    // Pre-divided already by the reduce-scatter.
    if (c.replicate_group != nullptr) {
      SK_ASSIGN_OR_RETURN(last, AllReduceAcrossReplicas(c, reduced, 1.f, args.post_scale));
    }
  }
  // Accumulate into the f32 gradient shard (widening from reduce_dtype), in
  // stream order after the reduction (on the host with offload).
  SK_RETURN_IF_ERROR(AccumulateReduced(c, group, reduced, args));
  if (args.keep_full_grad) {
    // SHARD_OPTIM and NO_SHARD keep their full gradient: clear it once read.
    SK_RETURN_IF_ERROR(OnStream(c.reduce, [full_grad](const ops::OpContext& ctx) {
      return ops::Fill(ctx, full_grad, 0.f);
    }));
  } else {
    group.DropFullGrad();  // the reduce stream's closures keep it alive until read
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, c.reduce.device->CreateEvent());
  SK_RETURN_IF_ERROR(done->Record(rs));
  return PendingReduction{std::move(last), std::move(done)};
}

Status WaitForReductionWork(std::deque<PendingReduction>& pending, Duration timeout) {
  while (!pending.empty()) {
    PendingReduction r = std::move(pending.front());
    pending.pop_front();
    if (r.work) {
      Status s = r.work->wait(timeout);
      if (!s.ok()) return s.WithContext("gradient reduction");
    }
    // The collective is done; the accumulation after it may not be, and its
    // closure still holds the reduced shard (and the full gradient until the
    // collective's closure is released).
    Status s = r.done->Synchronize(timeout);
    if (!s.ok()) return s.WithContext("accumulating a reduced gradient shard on the reduce stream");
  }
  return OkStatus();
}

Status WaitForReductions(const FsdpComm& c, std::deque<PendingReduction>& pending) {
  SK_RETURN_IF_ERROR(WaitForReductionWork(pending, c.timeout));
  Status s = c.reduce.stream->Synchronize(c.timeout);
  if (!s.ok()) return s.WithContext("reduce stream");
  if (c.host_stream != nullptr) {
    // The host accumulations wait for the reduce stream on the host stream.
    s = c.host_stream->Synchronize(c.timeout);
    if (!s.ok()) return s.WithContext("host stream");
  }
  return OkStatus();
}

StatusOr<Tensor> GatherFullParam(const FsdpComm& c, const FsdpParamGroup& group, int param) {
  const ops::OpContext& ag = c.all_gather;
  const int64_t shard = group.layout().shard_numel();
  SK_ASSIGN_OR_RETURN(Tensor full, ag.alloc->Empty(DType::kF32, Shape{group.layout().padded_numel()}));
  SK_ASSIGN_OR_RETURN(Tensor input, Slice(full, c.shard_group->rank() * shard, shard));
  const auto& p = group.layout().params()[param];
  SK_ASSIGN_OR_RETURN(Tensor out, HostAllocator::Default().Empty(DType::kF32, p.shape));
  SK_ASSIGN_OR_RETURN(Tensor src, full.View(static_cast<size_t>(p.offset) * 4, DType::kF32, p.shape));
  // Copy in, gather and copy out to the host, all in all-gather stream order,
  // after every update of the master shard enqueued so far.
  SK_RETURN_IF_ERROR(WaitForCompute(c, *ag.stream));
  Tensor master = group.master();
  if (c.cpu_offload) {
    SK_RETURN_IF_ERROR(ag.device->CopyAsync(input.data(), master.data(), master.nbytes(), *ag.stream));
  } else {
    SK_RETURN_IF_ERROR(OnStream(ag, [master, input](const ops::OpContext& ctx) {
      return ops::Copy(ctx, master, input);
    }));
  }
  comm::CollectiveOptions co;
  co.timeout = c.timeout;
  SK_ASSIGN_OR_RETURN(auto w, c.shard_group->all_gather(full, input, *ag.stream, co));
  SK_RETURN_IF_ERROR(OnStream(ag, [src, out](const ops::OpContext& ctx) {
    return ops::Copy(ctx, src, out);
  }));
  SK_RETURN_IF_ERROR(w->wait(c.timeout));
  SK_RETURN_IF_ERROR(ag.stream->Synchronize(c.timeout).WithContext("GatherFullParam"));
  return out;
}

}  // namespace sk::fsdp_internal
