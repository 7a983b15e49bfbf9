// FsdpEngine: FSDP over units a caller describes and computes itself (the C
// ABI's low-level API). It owns what one rank needs around a
// FullyShardedModel: the rank's capped caching allocator on device cpu:rank,
// the sharded optimizer (its state on the host under cpu_offload, else in
// FSDP's allocator), and the parameter and gradient views it has handed out,
// which it releases before the matching Post call so that FSDP can free the
// gathered buffers.
//
// The helpers below are the one place a rank's allocator and optimizer are
// built; the Trainer uses them too.
//
// Thread safety: one thread per FsdpEngine (each rank drives its own).
#ifndef SHARDKIT_RUNTIME_TRAIN_ENGINE_H_
#define SHARDKIT_RUNTIME_TRAIN_ENGINE_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel.h"

namespace sk {

// The caching allocator of rank `rank`'s device (cpu:rank), reserving at most
// `capacity_bytes` (0 = unlimited). Errors come from Device::Get.
StatusOr<std::unique_ptr<CachingAllocator>> CreateRankAllocator(int rank, size_t capacity_bytes);

// An optimizer whose state lives beside the engine's shards: on the host
// when `cpu_offload`, else in the engine's device allocator. InvalidArgument
// from ValidateOptimizerOptions. `engine` must outlive the optimizer.
StatusOr<std::unique_ptr<Optimizer>> CreateEngineOptimizer(const OptimizerOptions& options,
                                                           DataParallelModel& engine,
                                                           bool cpu_offload);

struct FsdpEngineOptions {
  FsdpOptions fsdp;
  OptimizerOptions optimizer;
  // Per-rank device memory cap in bytes; 0 = unlimited.
  size_t memory_cap_bytes = 0;
};

class FsdpEngine {
 public:
  // Collective over `world` (every rank calls it with the same units and
  // options). InvalidArgument when there are no units, a unit has no
  // parameters, or FSDP or the optimizer reject their options. `world` must
  // outlive the engine.
  static StatusOr<std::unique_ptr<FsdpEngine>> Create(std::vector<UnitSpec> units,
                                                      comm::ProcessGroup* world,
                                                      const FsdpEngineOptions& options);
  ~FsdpEngine();

  const std::vector<UnitSpec>& units() const { return units_; }
  int num_units() const { return static_cast<int>(units_.size()); }

  // The hooks of FullyShardedModel (runtime/fsdp/fsdp.h), for unit `unit`.
  // OutOfRange for a unit index outside [0, num_units). Pre calls keep the
  // views they return until the matching Post call, which releases them
  // first. A call out of order is FailedPrecondition and changes nothing;
  // any other failure abandons the step and releases every view.
  Status PreForward(int unit);
  Status PostForward(int unit);
  Status PreBackward(int unit);
  Status PostBackward(int unit);

  // The gathered parameter `param` of `unit` (in FSDP's param dtype), valid
  // until the unit's next Post call. OutOfRange for bad indices;
  // FailedPrecondition outside PreForward..PostForward and
  // PreBackward..PostBackward.
  StatusOr<const Tensor*> Param(int unit, int param) const;
  // The gradient buffer the caller adds into, in param_dtype (the compute
  // dtype; FSDP converts to reduce_dtype only to communicate), valid until
  // PostBackward.
  // FailedPrecondition outside PreBackward..PostBackward.
  StatusOr<const Tensor*> Grad(int unit, int param) const;

  // FullyShardedModel's step: collective except set_gradient_sync/ZeroGrad.
  void set_gradient_sync(bool enabled) { fsdp_->set_gradient_sync(enabled); }
  Status FinishBackward() { return fsdp_->FinishBackward(); }
  // InvalidArgument unless max_norm >= 0 (0 = compute the norm only).
  StatusOr<double> ClipGradNorm(double max_norm);
  Status OptimizerStep() { return fsdp_->OptimizerStep(*optimizer_); }
  void ZeroGrad() { fsdp_->ZeroGrad(); }

  // Copies the full f32 parameter into out[0..count). Collective.
  // InvalidArgument when count is not the parameter's element count.
  Status ReadParam(int unit, int param, float* out, int64_t count);

  FullyShardedModel& fsdp() { return *fsdp_; }
  Optimizer& optimizer() { return *optimizer_; }
  CachingAllocator& allocator() { return *allocator_; }

 private:
  FsdpEngine() = default;
  Status CheckUnit(int unit) const;
  Status CheckParam(int unit, int param) const;
  void ReleaseViews(int unit);
  void ReleaseAllViews();
  // A hook's result: any failure but FailedPrecondition releases every view.
  Status HookResult(Status s);

  // Declaration order is destruction order reversed: views release their
  // buffers first, then the optimizer (its state may live in FSDP's
  // allocator), FSDP, and last the allocator.
  std::vector<UnitSpec> units_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<FullyShardedModel> fsdp_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<std::vector<Tensor>> params_;
  std::vector<std::vector<Tensor>> grads_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_ENGINE_H_
