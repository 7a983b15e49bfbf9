// FsdpEngine: FSDP over units a caller describes and computes itself (the C
// ABI's low-level API). It owns what one rank needs around a
// FullyShardedModel: the rank's capped caching allocator on its device
// (cpu:rank by default; FsdpEngineOptions::device),
// the sharded optimizer (its state on the host under cpu_offload, else in
// FSDP's allocator), and the parameter and gradient views it has handed out,
// which it releases before the matching Post call so that FSDP can free the
// gathered buffers.
//
// A rank's device, allocator and optimizer are built by the helpers of
// runtime/train/rank.h, which the Trainer uses too.
//
// Thread safety: one thread per FsdpEngine (each rank drives its own).
#ifndef SHARDKIT_RUNTIME_TRAIN_ENGINE_H_
#define SHARDKIT_RUNTIME_TRAIN_ENGINE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/device_kind.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/device/device.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/train/rank.h"
#include "runtime/train/step_outcome.h"

namespace sk {

struct FsdpEngineOptions {
  FsdpOptions fsdp;
  OptimizerOptions optimizer;
  // Per-rank device memory cap in bytes; 0 = unlimited (sim: the profile's).
  size_t memory_cap_bytes = 0;
  // The rank's device (cpu:rank by default). On sim, parameter and gradient
  // views have shapes and no data (ReadParam is Unimplemented there).
  DeviceOptions device;
  // The caller's stream (see "Caller streams" at FsdpEngine::SetStream);
  // null: the calling thread, the synchronous protocol.
  std::shared_ptr<Stream> stream;
};

class FsdpEngine {
 public:
  // Collective over `world` (every rank calls it with the same units and
  // options). InvalidArgument when there are no units, a unit has no
  // parameters, or FSDP, the device or the optimizer reject their options.
  // On CPU worlds of several ranks (local, gloo) the ranks first agree on
  // the units (names, shapes, initialisers, ties) and on FSDP's and the
  // optimizer's options (rank_agreement.h): ranks that differ, a parameter
  // group given on one rank only say, all fail with InvalidArgument naming
  // the field and both values.
  // On sim, `world` may be null: the engine then creates and owns the
  // simulated world (CreateSimWorld). Otherwise `world` must outlive the
  // engine.
  static StatusOr<std::unique_ptr<FsdpEngine>> Create(std::vector<UnitSpec> units,
                                                      comm::ProcessGroup* world,
                                                      const FsdpEngineOptions& options);
  ~FsdpEngine();

  const std::vector<UnitSpec>& units() const { return units_; }
  int num_units() const { return static_cast<int>(units_.size()); }

  // The order of calls in one step (a small state machine over FSDP's
  // per-unit states):
  //
  //   ZeroGrad?  { PreForward(u) .. PostForward(u) }*   -- forward, any units
  //              { PreBackward(u) .. PostBackward(u) }* -- backward
  //   (more micro-batches: forward/backward again, set_gradient_sync)
  //   FinishBackward  ClipGradNorm*  OptimizerStep
  //
  // Every call out of order is FailedPrecondition naming the call made and
  // the call expected ("ZeroGrad while unit 'fc' (0) is between PreBackward
  // and PostBackward: expected PostBackward(0) first") and changes nothing.
  //
  // One rank's failure is every rank's (on backends that publish failures:
  // local, gloo, NCCL with its call check; StepAgreement, step_outcome.h):
  // when a hook, FinishBackward, ClipGradNorm or OptimizerStep fails on one
  // rank for any reason but a call out of order or a bad argument (out of
  // memory, say), that rank publishes its error to its peers, whose waiting
  // or next collective fails at once with it; each rank then abandons the
  // step inside the failing call and every rank's call returns the same
  // error, naming the rank that failed first ("rank 1 failed step 3: ...").
  // Nothing was updated, and the next step works on every rank.
  // OptimizerStep and BeginCustomStep agree on the step's outcome (one
  // all-gather of about 1.3 KiB) before anything changes: ranks whose
  // learning rates differ (set_lr) fail with InvalidArgument naming them.
  // Under NO_SHARD and SHARD_OPTIM, OptimizerStep and EndCustomStep then
  // regather the updated parameters, and agree on that too (one more such
  // all-gather): a rank failing there (out of memory) fails the call on
  // every rank with its error ("rank 1 failed step 3 after the update:
  // ..."), but the update was applied on every rank and is kept, the step
  // counts on every rank (a custom step is closed), and every rank's next
  // forward gathers the parameters again.
  // In particular: ZeroGrad, FinishBackward, ClipGradNorm, OptimizerStep and
  // set_gradient_sync with a unit between its Pre and Post call; ZeroGrad
  // between a PostBackward and FinishBackward (reductions in flight);
  // FinishBackward with no backward since the last step or FinishBackward;
  // ClipGradNorm and OptimizerStep before FinishBackward.
  // The hooks themselves follow FSDP's per-unit states (PostForward needs
  // PreForward, PreBackward needs PostForward, ...); forward-only passes
  // (evaluation) may run in any phase.

  // The hooks of FullyShardedModel (runtime/fsdp/fsdp.h), for unit `unit`.
  // OutOfRange for a unit index outside [0, num_units). Pre calls keep the
  // views they return until the matching Post call, which releases them
  // first. A call out of order is FailedPrecondition and changes nothing;
  // any other failure abandons the step on every rank (see above) and
  // releases every view.
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
  // What it holds: zeros in the first backward after ZeroGrad or after a
  // backward with gradient sync on; after a backward with sync off
  // (no_sync), the running sum of this rank's gradients since then: it IS
  // the accumulation buffer (as torch's .grad under no_sync), so the caller
  // must add, never assign. Chosen over zeroing per micro-batch because the
  // latter needs a second full-size buffer per unit while accumulating.
  StatusOr<const Tensor*> Grad(int unit, int param) const;

  // Caller streams. A caller that computes on its own stream S (a CUDA
  // stream, or on cpu a CpuStream whose closures are its kernels) sets S
  // here (or in FsdpEngineOptions::stream) and the hooks become
  // stream-ordered, without a host wait on S:
  //   PreForward(u), PreBackward(u): enqueue (or find) the gather, make S
  //     wait for it (an event) and return at once; the views are valid for
  //     work enqueued on S after the call.
  //   PostForward(u): the gathered buffers are freed (or resharded) only
  //     after the work enqueued on S before the call (record_stream).
  //   PostBackward(u): the reduce stream waits for an event recorded on S
  //     before it reads the gradient buffers; they and the parameters are
  //     reused only after that work.
  //   FinishBackward, ClipGradNorm, OptimizerStep: after the reductions,
  //     which come after S's gradients. FinishBackward returns when the
  //     reductions are done (the optimizer runs in the engine's order after
  //     it); ClipGradNorm returns the norm, which has reached the host.
  // Each Post call uses the stream its Pre call used. A stream set while a
  // unit is between its Pre and Post calls applies from the next call.
  // Null restores the synchronous protocol (views valid once the Pre call
  // returns, gradients read at the Post call). InvalidArgument for a stream
  // of another device than the engine's, or on a sim device. The engine
  // keeps every stream it used alive until it is destroyed.
  Status SetStream(std::shared_ptr<Stream> stream);
  Stream* stream() const { return stream_.get(); }

  // FullyShardedModel's step: collective except set_gradient_sync/ZeroGrad.
  // Each is FailedPrecondition when out of order (see above) and then
  // changes nothing.
  Status set_gradient_sync(bool enabled);
  Status FinishBackward();
  // InvalidArgument unless max_norm >= 0 (0 = compute the norm only),
  // checked before the order. A non-finite norm (the same on every rank) is
  // Aborted on every rank: the step is abandoned (gradients zeroed) and the
  // update skipped, so parameters and optimizer state stay as they were; the
  // caller goes on with the next step (or stops), as PyTorch's GradScaler
  // skips such a step.
  StatusOr<double> ClipGradNorm(double max_norm);
  Status OptimizerStep();
  Status ZeroGrad();

  // A token-weighted loss, PyTorch's cross_entropy(ignore_index=-100,
  // reduction="mean") over the whole global batch (docs/batches.md): the
  // step's loss is the sum of the counted tokens' losses of every
  // micro-batch on every rank divided by N, their number, however unevenly
  // they fall. `tokens` is this rank's count for the step (all of its
  // micro-batches); the ranks sum theirs (one all-gather of 8 bytes per
  // rank on the step agreement's group) and the call returns N. The
  // caller then adds into Grad() the gradient of each micro-batch's loss
  // SUM (reduction="sum", no division), and every gradient reduction until
  // ZeroGrad divides the sum over ranks by N instead of by the world size
  // (FullyShardedModel::set_reduction_divisor): after FinishBackward the
  // gradient shards hold the gradient of the global mean. N = 0 gives zero
  // gradients. ZeroGrad and an abandoned step return to the mean over
  // ranks. Collective (every rank calls it once per step it weights, before
  // the step's first reduction). InvalidArgument for tokens < 0;
  // FailedPrecondition, nothing changed, with a unit between its Pre and
  // Post call, inside a custom step, after a gradient reduction since the
  // last ZeroGrad (a PostBackward with gradient sync on: it was divided by
  // the world size), and on several ranks of a backend that does not
  // publish failures (NCCL without check_calls), which has no group to
  // exchange the counts on. On sim the ranks mirror this one (N = W x
  // tokens).
  StatusOr<int64_t> SetLossTokens(int64_t tokens);

  // The learning rate of the following OptimizerSteps (the optimizer
  // options' lr until set). 0 is valid. InvalidArgument for a negative or
  // non-finite rate. Not collective: every rank must set the same rate,
  // which the next OptimizerStep checks (see above).
  Status set_lr(float lr);
  float lr() const { return optimizer_->options().lr; }
  // Optimizer steps taken (restored by checkpoints and state dicts).
  int64_t steps() const { return steps_; }

  // An update rule of the caller's own, instead of OptimizerStep:
  //   FinishBackward, ClipGradNorm?, BeginCustomStep,
  //   for every unit: read GradShard(u), update MasterShard(u) in place
  //   (and OptimizerState(u, i), the caller's per-element state),
  //   EndCustomStep.
  // The shards are this rank's f32 slices of each unit's flat parameter
  // (padding included; the gradient is the mean over ranks, clipped if
  // ClipGradNorm clipped). They are host memory on cpu (and with
  // cpu_offload), device memory on cuda: the caller's device work on them
  // must be complete before EndCustomStep. OptimizerState gives the state
  // tensors of the unit's slot, zeroed on first use and saved by
  // checkpoints: those the custom rule declared
  // (OptimizerOptions::custom_name and custom_state_names, recorded in
  // checkpoints under its name), else the built-in kind's
  // (Optimizer::StateNames(), e.g. one for SGD with momentum, two for Adam).
  // An engine with a custom rule refuses OptimizerStep (FailedPrecondition). EndCustomStep refreshes
  // what FSDP keeps of the parameters (collective for SHARD_OPTIM and
  // NO_SHARD) and counts the step. FailedPrecondition: BeginCustomStep
  // before FinishBackward or with a unit's window open; the views outside
  // Begin..End; any other step call (hooks, OptimizerStep, ZeroGrad, ...)
  // inside it. OutOfRange for bad indices.
  //
  // Where each parameter lies in this rank's shards of a unit (any time;
  // the same for the master, gradient and state shards): this rank's
  // position in the unit's shard group and the group's size (not the rank:
  // under NO_SHARD every rank holds shard 0 of 1, under HYBRID_SHARD the
  // index within its replica), and one piece per parameter with elements in
  // the shard, in shard order. Padding is in no piece. A piece's parameter
  // group is the first of the optimizer options' param_groups that selects
  // it (-1: none), with the weight decay and learning-rate multiplier it
  // resolves to (the options' weight decay and 1 without one).
  struct ShardPiece {
    int param = 0;              // the parameter's index in its unit
    std::string name;           // "<unit>.<param>"
    int64_t shard_offset = 0;   // first element in the shard
    int64_t numel = 0;          // elements in the shard
    int64_t param_offset = 0;   // first element within the parameter (row-major)
    Shape shape;                // the whole parameter's shape
    int param_group = -1;
    float weight_decay = 0;
    float lr_multiplier = 1;
  };
  struct ShardLayout {
    int shard_index = 0;
    int num_shards = 1;
    int64_t shard_numel = 0;  // padding included
    std::vector<ShardPiece> pieces;
  };
  // OutOfRange for a bad unit.
  StatusOr<const ShardLayout*> GetShardLayout(int unit) const;

  Status BeginCustomStep();
  StatusOr<const Tensor*> MasterShard(int unit) const;
  StatusOr<const Tensor*> GradShard(int unit) const;
  StatusOr<const Tensor*> OptimizerState(int unit, int index);
  Status EndCustomStep();
  // True between a BeginCustomStep and an EndCustomStep that succeeded.
  bool in_custom_step() const { return custom_step_; }

  // Copies the full f32 parameter into out[0..count) (a tied parameter's
  // owner's value). Collective.
  // InvalidArgument when count is not the parameter's element count;
  // FailedPrecondition on a sim device (its tensors hold no data).
  Status ReadParam(int unit, int param, float* out, int64_t count);
  // Sets the full f32 value of a parameter from values[0..count) (host
  // memory; every rank passes the same values): each rank writes its slice
  // of the master shard. Collective (the strategies that keep full
  // parameters regather the unit). InvalidArgument when count is not the
  // parameter's element count or values is null; FailedPrecondition while a
  // unit is between a Pre and its Post call, and on a sim device. Optimizer
  // state is kept (a framework initialising its weights calls it before the
  // first step). Ranks that pass different values all fail with
  // InvalidArgument naming them, and nothing is written (a hash of the
  // values is compared: one all-gather of 8 bytes per rank, where the step
  // agreement exists).
  Status WriteParam(int unit, int param, const float* values, int64_t count);

  // A full state dict of the units (runtime/checkpoint/checkpoint.h): every
  // parameter in full as "<unit>.<param>" in `layout`, and in the shardkit
  // layout the optimizer state. Rank 0 writes. Collective; FailedPrecondition
  // while a unit is between a Pre call and its Post call, and on a sim device.
  Status SaveFullStateDict(const std::string& path, WeightLayout layout = WeightLayout::kShardkit);
  // Loads one (any world size and strategy); optimizer state and steps() are
  // restored when the file has them (the shardkit layout; other layouts set
  // steps() to 0). Collective; FailedPrecondition as above; on error
  // nothing changes.
  Status LoadFullStateDict(const std::string& path, WeightLayout layout = WeightLayout::kShardkit);

  // A sharded checkpoint in the trainer's format (runtime/checkpoint/checkpoint.h:
  // one file per shard rank and an index) with the optimizer state and
  // steps(); it loads at any world size and strategy, into an engine over
  // the same units (or a trainer of the same units). Collective;
  // FailedPrecondition as for the state dicts; a failed save leaves the
  // previous checkpoint in `dir`, a failed load changes nothing.
  Status SaveCheckpoint(const std::string& dir);
  Status LoadCheckpoint(const std::string& dir);

  FullyShardedModel& fsdp() { return *fsdp_; }
  Optimizer& optimizer() { return *optimizer_; }
  CachingAllocator& allocator() { return *allocator_; }

 private:
  FsdpEngine() = default;
  Status CheckUnit(int unit) const;
  Status CheckParam(int unit, int param) const;
  void ReleaseViews(int unit);
  void ReleaseAllViews();
  // FailedPrecondition naming the first unit that holds views.
  Status CheckIdle(const char* what) const;
  // A hook's result: any failure but FailedPrecondition releases every view
  // and resets the step (FSDP abandoned it), after the ranks agreed on it.
  Status HookResult(Status s);
  // A failed step: every rank's error (Agreed), then AbandonStep.
  Status FailStep(const Status& s);
  // Drops the step on this rank: gradients zeroed, units idle, views
  // released, phase idle.
  void AbandonStep();
  // The step's outcome over every rank (StepAgreement::Agree), when there is
  // an agreement; `mine` otherwise.
  Status Agreed(const Status& mine, const StepChecks& checks = {});
  // Ends a step whose update was applied (OptimizerStep, EndCustomStep):
  // `s` is this rank's status for what followed the update (the regather
  // under NO_SHARD and SHARD_OPTIM); the ranks agree on it, and on a
  // failure every rank returns the failing rank's error with the update
  // kept and the full parameters dropped (regathered at the next forward).
  // The step counts either way.
  Status FinishUpdate(const Status& s);
  std::vector<comm::ProcessGroup*> StepGroups();
  // FailedPrecondition naming `call` and the Post call that must come first
  // when any unit is between its Pre and Post call; OK otherwise.
  Status CheckNoOpenWindow(const char* call) const;
  // OutOfRange for a bad unit; FailedPrecondition outside a custom step.
  Status CheckCustomView(int unit, const char* what) const;
  // Points FSDP at the stream of a unit's open window (Post calls) or at the
  // current one (other calls).
  void UseStream(Stream* stream) { fsdp_->set_caller_stream(stream); }

  // Where the step is. kIdle: no backward since the last OptimizerStep,
  // ZeroGrad or abandoned step. kBackward: a PostBackward ran (reductions may
  // be in flight) and FinishBackward has not. kFinished: FinishBackward ran
  // since the last backward.
  enum class Phase { kIdle, kBackward, kFinished };
  static const char* PhaseName(Phase p);
  // The call a unit's open window expects next.
  enum class Window { kNone, kForward, kBackward };

  // Declaration order is destruction order reversed: views release their
  // buffers first, then the optimizer (its state may live in FSDP's
  // allocator), FSDP, and last the allocator.
  std::vector<UnitSpec> units_;
  // Every caller stream used (the allocator's blocks may wait for them):
  // destroyed after the allocator.
  std::vector<std::shared_ptr<Stream>> streams_used_;
  std::shared_ptr<Stream> stream_;
  std::unique_ptr<comm::ProcessGroup> owned_world_;  // the simulated world, when created here
  comm::ProcessGroup* world_ = nullptr;
  std::unique_ptr<CachingAllocator> allocator_;
  DeviceCapabilities device_can_;  // the rank's device's
  std::unique_ptr<OffloadHost> offload_;  // with cpu_offload
  std::unique_ptr<FullyShardedModel> fsdp_;
  std::unique_ptr<Optimizer> optimizer_;
  // Every rank's agreement on failed steps and before each update; null on
  // one rank, on sim and on backends that do not publish failures.
  std::unique_ptr<StepAgreement> outcome_;
  std::vector<std::vector<Tensor>> params_;
  std::vector<std::vector<Tensor>> grads_;
  Phase phase_ = Phase::kIdle;
  // A PostBackward with gradient sync on since the last ZeroGrad or
  // abandoned step: SetLossTokens would reweight half a step.
  bool reduced_since_zero_grad_ = false;
  int64_t steps_ = 0;
  bool custom_step_ = false;  // between BeginCustomStep and EndCustomStep
  std::vector<Window> windows_;  // per unit
  std::vector<Stream*> window_streams_;  // per unit: the stream its Pre call used
  std::vector<ShardLayout> shard_layouts_;  // per unit
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_ENGINE_H_
