// FsdpParamGroup: one FSDP unit's flat parameter and gradient on this rank,
// as PyTorch FSDP2's FSDPParamGroup is one fully_shard'ed module's. Private
// to //runtime/fsdp: FullyShardedModel (fsdp.h) keeps one per unit and
// drives it through the hooks' state machine; the collectives that fill and
// drain a group's buffers are free functions over a communication context
// (fsdp_collectives.h), kept apart as FSDP2 keeps _fsdp_collectives.py apart
// from the group.
//
// What a group holds:
//   master shard     f32 [shard_numel], for the model's lifetime: the
//                    optimizer's parameters.
//   gradient shard   f32 [shard_numel], only while the step has a gradient
//                    for the unit: the unit's first reduction of a step
//                    allocates it and copies its result there, later ones
//                    add into it, and ReleaseGrad (ZeroGrad) drops it. A
//                    unit without one has a zero gradient.
//   unsharded param  param_dtype [padded_numel], from the issue of its
//                    all-gather to Reshard (never dropped by the persistent
//                    strategies except to regather).
//   all-gather work  the pending all-gather into the unsharded parameter,
//                    until it has been waited for or handed to a caller
//                    stream (TakeAllGather).
//   full gradient    the unsharded gradient [padded_numel] the model adds
//                    into: from PreBackward to its reduction (kept across
//                    no_sync backwards and by the persistent strategies).
//   state            where the unit is in the hooks' state machine.
//   in flight        gathered for a computation that has not finished yet
//                    (what the rate limiter counts); false for parameters
//                    SHARD_GRAD_OP keeps after forward.
//
// Invariants: a pending all-gather and "in flight" each imply an unsharded
// parameter (Reshard drops all three together).
//
// The group holds tensors, not streams: it runs no op except the zeroing
// fills it is given a context for, and the stream order of everything else
// done to its buffers is the model's.
//
// Thread safety: as FullyShardedModel, used by one thread.
#ifndef SHARDKIT_RUNTIME_FSDP_FSDP_PARAM_GROUP_H_
#define SHARDKIT_RUNTIME_FSDP_FSDP_PARAM_GROUP_H_

#include <memory>
#include <utility>
#include <vector>

#include "runtime/comm/work.h"
#include "runtime/core/allocator.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/fsdp/flat_param.h"
#include "runtime/ops/backend.h"
#include "runtime/parallel/data_parallel.h"

namespace sk::fsdp_internal {

class FsdpParamGroup {
 public:
  // A group of `layout` with its master shard allocated from
  // `shard_allocator` and zeroed on `shard_context`. Idle, sharded, no
  // gradient shard, no full gradient.
  static StatusOr<FsdpParamGroup> Create(FlatParamLayout layout, Allocator& shard_allocator,
                                         const ops::OpContext& shard_context);

  const FlatParamLayout& layout() const { return layout_; }
  // The f32 shards. The master's handle is fixed; its data is written by
  // the model's ops (initialisation, loading, the optimizer step). The
  // gradient shard is undefined while has_grad() is false.
  const Tensor& master() const { return master_; }
  const Tensor& grad() const { return grad_; }

  UnitState state() const { return state_; }
  void set_state(UnitState state) { state_ = state; }

  // Gradient shard. AllocateGrad makes it, uninitialised (the caller writes
  // all of it: the first reduction's copy), from `allocator`; ZeroGrad
  // makes it and fills it with zeros on `context` (for a unit that had no
  // gradient this step, before anything reads it). Both require
  // !has_grad(); unchanged when they fail. ReleaseGrad drops it (the
  // caching allocator reuses the block once its recorded streams are done).
  bool has_grad() const { return grad_.defined(); }
  Status AllocateGrad(Allocator& allocator);
  Status ZeroGrad(Allocator& allocator, const ops::OpContext& context);
  void ReleaseGrad() { grad_ = Tensor(); }

  // Unsharded parameter.
  bool unsharded() const { return unsharded_.defined(); }
  const Tensor& unsharded_param() const { return unsharded_; }
  bool in_flight() const { return in_flight_; }
  // An all-gather into `unsharded` has been issued: the group is unsharded,
  // its all-gather pending and it is in flight.
  void RecordAllGather(Tensor unsharded, std::shared_ptr<comm::Work> work);
  // Found unsharded (kept, or prefetched) and about to be computed with.
  // Requires unsharded().
  void MarkInFlight() { in_flight_ = true; }
  // Its computation has finished (the unsharded parameter may be kept).
  void ClearInFlight() { in_flight_ = false; }
  // Drops the unsharded parameter and its pending all-gather (the caching
  // allocator reuses the block once its recorded streams are done with it);
  // no longer in flight.
  void Reshard();
  bool all_gather_pending() const { return all_gather_ != nullptr; }
  // The pending all-gather (requires all_gather_pending()).
  const comm::Work& pending_all_gather() const { return *all_gather_; }
  // Waits up to `timeout` for the pending all-gather, if any, and forgets it
  // once it succeeded; returns the wait's error otherwise (still pending).
  Status WaitForAllGather(Duration timeout);
  // Hands the pending all-gather (null when none) to the caller, who
  // checks its outcome; the group no longer waits for it.
  std::shared_ptr<comm::Work> TakeAllGather();
  // One view per parameter into the unsharded parameter, in layout order
  // (requires unsharded()).
  StatusOr<std::vector<Tensor>> ParamViews() const;

  // Full (unsharded) gradient.
  bool has_full_grad() const { return full_grad_.defined(); }
  const Tensor& full_grad() const { return full_grad_; }
  // Allocates it from `context`'s allocator in `dtype` and zeroes it on
  // `context`; unchanged when either fails.
  Status MakeFullGrad(DType dtype, const ops::OpContext& context);
  // Replaces it (a narrowed copy).
  void set_full_grad(Tensor full_grad) { full_grad_ = std::move(full_grad); }
  // Drops it (streams it was recorded on keep its block until they are done).
  void DropFullGrad() { full_grad_ = Tensor(); }
  // The view of parameter `param`'s gradient, and all of them in layout
  // order, in the full gradient's dtype (requires has_full_grad()).
  StatusOr<Tensor> GradView(int param) const;
  StatusOr<std::vector<Tensor>> GradViews() const;

  // A failed step: idle, not in flight, the full gradient dropped, and the
  // unsharded parameter too unless `keep_unsharded` (the persistent
  // strategies). The gradient shard is left to ReleaseGrad.
  void Abandon(bool keep_unsharded);

 private:
  explicit FsdpParamGroup(FlatParamLayout layout) : layout_(std::move(layout)) {}

  FlatParamLayout layout_;
  Tensor master_;     // f32 [shard_numel]
  Tensor grad_;       // f32 [shard_numel], accumulated reduced gradients (or none)
  Tensor unsharded_;  // param_dtype [padded_numel], alive while unsharded
  std::shared_ptr<comm::Work> all_gather_;  // pending all-gather into unsharded_
  Tensor full_grad_;  // gradient dtype [padded_numel]
  UnitState state_ = UnitState::kIdle;
  bool in_flight_ = false;
};

}  // namespace sk::fsdp_internal

#endif  // SHARDKIT_RUNTIME_FSDP_FSDP_PARAM_GROUP_H_
