// What FSDP sends over the wire, as free functions over a communication
// context (FSDP2's _fsdp_collectives.py: foreach_all_gather and
// foreach_reduce take the process groups, streams and device they run on and
// the parameter group's buffers, not the module). FullyShardedModel decides
// when a unit is gathered or reduced (its hooks, prefetch, the rate
// limiter); these functions do the gathering and reducing: the all-gather of
// a group's flat parameter on the all-gather stream (with cpu_offload the
// host->device copy first), the reduction of its gradient on the reduce
// stream (reduce-scatter, all-reduce across replicas) with the accumulation
// into its gradient shard, the waits for reductions in flight, and the
// gather of one full parameter. Private to //runtime/fsdp:fsdp.
//
// Thread safety: as FullyShardedModel's, whose thread calls them.
#ifndef SHARDKIT_RUNTIME_FSDP_FSDP_COLLECTIVES_H_
#define SHARDKIT_RUNTIME_FSDP_FSDP_COLLECTIVES_H_

#include <deque>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/device/device.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/fsdp_param_group.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/ops/backend.h"

namespace sk::fsdp_internal {

// What the collectives run on: one rank's groups, streams, allocators and
// timeout, and the counters they add to. Set once by FullyShardedModel::Init;
// every pointer outlives the calls.
struct FsdpComm {
  comm::ProcessGroup* shard_group = nullptr;
  comm::ProcessGroup* replicate_group = nullptr;  // null when there is one replica
  // The op contexts of the compute, all-gather and reduce streams (their
  // allocators: each stream's pool of `allocator`), and with cpu_offload the
  // host's (stream `host_stream`, which may be null: the calling thread).
  ops::OpContext compute, all_gather, reduce, host;
  Stream* host_stream = nullptr;
  CachingAllocator* allocator = nullptr;
  bool cpu_offload = false;
  Duration timeout{};
  FsdpCounters* counters = nullptr;
};

// Work enqueued on `waiter` from now on runs after everything enqueued on
// the compute stream so far (PyTorch's waiter.wait_stream(current)), and on
// the simulator after the host stream's work too. Nothing to do where ops
// run when issued (cpu: the compute stream is the driving thread).
Status WaitForCompute(const FsdpComm& c, Stream& waiter);

// Issues the all-gather of `group`'s flat parameter in `dtype` on the
// all-gather stream: a buffer from that stream's pool (recorded on the
// compute stream, which reads it), this rank's master shard cast into its
// slice (with cpu_offload: copied to the device first), the collective; the
// group records the buffer and the work (RecordAllGather). Counts it.
// The caller has ordered the all-gather stream after any write of the
// master shards it must read (WaitForCompute).
Status AllGather(const FsdpComm& c, FsdpParamGroup& group, DType dtype);

// How a unit's gradient is reduced: resolved by the model per reduction.
struct ReduceArgs {
  DType reduce_dtype = DType::kF32;  // MixedPrecisionPolicy::ReduceDType()
  // The collectives' pre- and post-division; post_scale is applied by the
  // last collective (the all-reduce across replicas, else the
  // reduce-scatter).
  float pre_scale = 1.f, post_scale = 1.f;
  // One rank without replicas (nothing communicates): scale the gradient by
  // post_scale here (set_reduction_divisor), else leave it.
  bool scale_without_collective = false;
  // The strategies that keep full parameters (SHARD_OPTIM, NO_SHARD) keep
  // the full gradient too: it is reduced from a copy where it would be
  // overwritten, and zeroed once read; otherwise the group drops it.
  bool keep_full_grad = false;
  // Where a step's first gradient shard of a group comes from, and with
  // cpu_offload the host buffer (reduce dtype, at least a shard) that reduced
  // shards are copied into before their host accumulation.
  Allocator* shard_allocator = nullptr;
  Tensor grad_staging;
};

// Reduces `group`'s full gradient on the reduce stream (FSDP2's
// foreach_reduce): cast to the reduce dtype, reduce-scatter across the
// shard group (NO_SHARD: the whole flat gradient), all-reduce across
// replicas, and accumulate the reduced shard into the group's f32 gradient
// shard (the step's first reduction allocates it and copies, widening;
// later ones add; with cpu_offload on the host). The caller has ordered the
// reduce stream after the gradient's producer. Counts the collectives.
// PendingReduction: fsdp.h (the model keeps them).
StatusOr<PendingReduction> Reduce(const FsdpComm& c, FsdpParamGroup& group, const ReduceArgs& args);

// Waits for the collectives of `pending` reductions and for their
// accumulations, oldest first, removing each; the first failure ends it.
Status WaitForReductionWork(std::deque<PendingReduction>& pending, Duration timeout);
// WaitForReductionWork, then the reduce stream (and the host stream, whose
// accumulations wait for it) to drain.
Status WaitForReductions(const FsdpComm& c, std::deque<PendingReduction>& pending);

// The full f32 value of parameter `param` of `group` in host memory:
// the master shards all-gathered (collective over the shard group) and the
// parameter copied out, all in all-gather stream order after every update
// of the master shard enqueued so far; waits for it. `param` is valid.
StatusOr<Tensor> GatherFullParam(const FsdpComm& c, const FsdpParamGroup& group, int param);

}  // namespace sk::fsdp_internal

#endif  // SHARDKIT_RUNTIME_FSDP_FSDP_COLLECTIVES_H_
