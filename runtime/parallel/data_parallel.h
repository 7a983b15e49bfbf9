// DataParallelModel: what a training loop needs from any data-parallel
// wrapper of a model, so one trainer drives DDP and FSDP alike.
//
// A step is: ZeroGrad, one or more Model::ForwardBackward calls with the
// wrapper as hooks and activation_allocator() for activations (gradient sync
// off for all but the last micro-batch when accumulating), FinishBackward,
// optionally ClipGradNorm, then OptimizerStep.
//
// DistributedDataParallel (runtime/ddp) and FullyShardedModel (runtime/fsdp)
// implement it; the Trainer (runtime/train) drives either through it.
//
// Thread safety: one instance per rank, used by one thread.
#ifndef SHARDKIT_RUNTIME_PARALLEL_DATA_PARALLEL_H_
#define SHARDKIT_RUNTIME_PARALLEL_DATA_PARALLEL_H_

#include "runtime/core/allocator.h"
#include "runtime/core/status.h"
#include "runtime/nn/model.h"
#include "runtime/optim/optimizer.h"

namespace sk {

// Where a unit is in the hook protocol of one step (runtime/nn/model.h):
// idle -> PreForward -> forward -> PostForward -> forward-done ->
// PreBackward -> backward -> PostBackward -> idle.
enum class UnitState { kIdle, kForward, kForwardDone, kBackward };
// "idle", "forward", "forward-done", "backward".
const char* UnitStateName(UnitState s);

// PyTorch's _get_gradient_predivide_factor: the largest power of two p with
// N % p == 0 and N / p > p. Gradients are multiplied by 1/p before the sum and
// by p/N after it, so low-precision sums neither overflow nor underflow.
float AutoGradientPredivideFactor(int world_size);

class DataParallelModel : public UnitHooks {
 public:
  ~DataParallelModel() override = default;

  // The allocator to pass to Model::ForwardBackward for activations.
  virtual Allocator& activation_allocator() = 0;
  // Gradient synchronisation for the following backward passes; when off
  // (no_sync), gradients accumulate locally until a backward with sync on
  // reduces the total. Call between backward passes.
  virtual void set_gradient_sync(bool enabled) = 0;
  virtual bool gradient_sync() const = 0;
  // Waits for every gradient reduction of this step; gradients are final
  // (averaged over ranks) when it returns OK. A failed reduction abandons the
  // step (gradients zeroed, parameters untouched) and is returned.
  virtual Status FinishBackward() = 0;
  // The global gradient norm; with max_norm > 0 scales the gradients so it is
  // at most max_norm. InvalidArgument for a negative or non-finite max_norm.
  virtual StatusOr<double> ClipGradNorm(double max_norm, NormType type = NormType::kL2) = 0;
  // FinishBackward, then multiplies this rank's gradients by `factor`
  // (the Trainer's 1/M over M accumulated micro-batches). Not collective.
  // InvalidArgument for a non-finite factor.
  virtual Status ScaleGradients(float factor) = 0;
  // FinishBackward, then one optimizer step on this rank's parameters.
  virtual Status OptimizerStep(Optimizer& optimizer) = 0;
  // Creates the optimizer's state for every slot OptimizerStep steps (what
  // a first step allocates), changing nothing else: callers run it before
  // the ranks agree on a step, so that running out of memory there is a
  // failure every rank learns of before any rank updates anything (a rank
  // whose first step failed after its peers updated trained apart from
  // them). ResourceExhausted when the state does not fit; OK when it exists.
  // Also finishes whatever else OptimizerStep would do before updating
  // (FinishBackward, waiting for readers of the parameters), so that after
  // the ranks agreed the update itself cannot fail on one rank alone.
  virtual Status PrepareOptimizer(Optimizer& optimizer) = 0;
  // Zeroes gradients (waiting for reductions in flight first).
  virtual void ZeroGrad() = 0;
  // Abandons the step in progress after a failure outside the hooks (an
  // allocation inside the model's compute, between a unit's Pre and Post
  // hooks): waits (each wait bounded by the timeout) for collectives in
  // flight, returns every unit to idle, frees unsharded buffers and zeroes
  // gradients, as a failed hook does. Parameters and optimizer state are
  // untouched; the next step starts clean. A no-op between steps.
  virtual void AbandonStep() = 0;
  // Whether OptimizerStep does work after the update that can fail on one
  // rank alone (FSDP under NO_SHARD and SHARD_OPTIM regathers the updated
  // parameters it keeps unsharded: an allocation there may fail on one rank
  // only). Its callers then agree on the outcome after the update
  // (StepAgreement::AgreeAfterUpdate). Everything that can fail before the
  // update runs in PrepareOptimizer.
  virtual bool UpdateEndsWithFallibleWork() const { return false; }
  // After an update that was applied on every rank but whose completion
  // failed on some rank: abandons the step as AbandonStep does, and drops
  // the copies of the parameters made from the updated ones (stale or
  // incomplete on some rank), so the next forward makes them again on every
  // rank alike. The update itself (parameters, optimizer state) stays.
  virtual void AbandonAfterUpdate() { AbandonStep(); }
  // Bytes moved by this rank's collectives since creation, counted as
  // nccl-tests count them (all-gather output, reduce-scatter input,
  // all-reduce buffer).
  virtual int64_t bytes_communicated() const = 0;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_PARALLEL_DATA_PARALLEL_H_
