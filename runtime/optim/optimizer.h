// Sharded optimizers: SGD (momentum, dampening, Nesterov, weight decay), Adam
// and AdamW, stepping on the local shards of flat parameters.
//
// Everything here touches tensor data only through the op layer
// (runtime/ops): each call takes the OpContext (device, stream, allocator) its
// ops run with, so a step runs on CPU, is enqueued on a CUDA stream or is
// priced by the simulator with the same code. The update rules themselves are
// the fused ops SgdUpdate/AdamUpdate (runtime/ops/update_rules.h).
//
// An optimizer keeps its state per parameter slot (one slot per flat-parameter
// shard, identified by a small integer the caller chooses) in f32 tensors from
// the allocator it was given, so optimizer memory counts in the allocator's
// statistics and under its cap — 8 bytes per element for Adam, the largest part
// of model state. State is created on a slot's first step.
//
// Thread safety: an Optimizer is used by one thread at a time.
#ifndef SHARDKIT_RUNTIME_OPTIM_OPTIMIZER_H_
#define SHARDKIT_RUNTIME_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/backend.h"
#include "runtime/optim/param_groups.h"

namespace sk {

// Values equal the C ABI's sk_optimizer_kind_t (capi/abi.cc asserts it):
// never renumbered. The ABI's 0 ("default": AdamW) is resolved when it
// translates options.
enum class OptimizerKind : int {
  kSgd = 1,
  kAdam = 2,
  kAdamW = 3,
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float lr = 1e-3f;
  // SGD
  float momentum = 0.f;
  float dampening = 0.f;
  bool nesterov = false;
  // Adam / AdamW
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  // L2 penalty for SGD and Adam, decoupled decay for AdamW.
  float weight_decay = 0.f;
  // Per-parameter overrides of weight_decay and the learning rate
  // (param_groups.h); applied by whoever knows where each parameter lies in
  // the slots (CreateEngineOptimizer, runtime/train/engine.h).
  std::vector<ParamGroup> param_groups;
  // An update rule of the caller's own (the engine's custom step): when
  // set, its name (recorded in checkpoints as the optimizer's kind, e.g.
  // "lion") and the per-element state tensors it keeps, in order (what
  // StateNames() returns and checkpoints save, e.g. {"exp_avg"}). Step()
  // then refuses (the caller steps); `kind` and its hyper-parameters are
  // ignored but lr, weight_decay and param_groups still reach the caller.
  std::string custom_name;
  std::vector<std::string> custom_state_names;
};

// InvalidArgument naming the field for an unknown kind, a negative or non-finite lr, betas
// outside [0, 1), eps <= 0, Nesterov without momentum or with dampening, etc.
Status ValidateOptimizerOptions(const OptimizerOptions& options);

// One slot's piece of work for a step: an f32 parameter tensor updated in
// place from an f32 gradient tensor of the same element count (any shapes: a
// flat shard, or one unflattened parameter).
struct ShardRef {
  int slot;
  Tensor param;
  Tensor grad;
};

// One ShardRef per pair, slot i for params[i]: the unsharded single-process
// case (every parameter its own slot). InvalidArgument if the lists differ in
// length.
StatusOr<std::vector<ShardRef>> ShardRefsFor(const std::vector<Tensor>& params,
                                             const std::vector<Tensor>& grads);

class Optimizer {
 public:
  // InvalidArgument for invalid options. `allocator` must outlive the optimizer.
  static StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerOptions& options,
                                                      Allocator* allocator);

  const OptimizerOptions& options() const { return options_; }
  // Changes the learning rate for later steps (schedules).
  void set_lr(float lr) { options_.lr = lr; }

  // Parameter groups at element granularity: elements [begin, end) of a
  // slot step with `weight_decay` instead of the options' and with the
  // learning rate times `lr_multiplier`. Elements no segment covers use the
  // options. What a flat shard holding several parameters needs: each
  // parameter's slice gets its group's values (runtime/optim/param_groups.h).
  struct HyperSegment {
    int64_t begin = 0;
    int64_t end = 0;
    float weight_decay = 0;
    float lr_multiplier = 1;
  };
  // Replaces the segments of `slot` (empty: none). InvalidArgument (nothing
  // changes) for an empty, negative or overlapping range, a negative or
  // non-finite weight decay or multiplier; a range past the slot's size is
  // InvalidArgument at its next Step.
  Status SetSegments(int slot, std::vector<HyperSegment> segments);

  // Updates every shard with the fused update ops on ctx (state tensors come
  // from the optimizer's allocator, on ctx's device). A slot's size is fixed by its first step:
  // InvalidArgument if it changes, if a tensor is undefined or not f32, if a
  // parameter and its gradient differ in element count, or a slot appears
  // twice; nothing is touched when an error is returned. ResourceExhausted if
  // state cannot be allocated.
  Status Step(const ops::OpContext& ctx, const std::vector<ShardRef>& shards);

  // The state tensors of `slot` in StateNames() order, created zeroed with
  // `n` elements (from ctx) on first use: where an update rule of the
  // caller's own keeps its state, so that checkpoints save it. The tensors
  // live as long as the optimizer. InvalidArgument if the slot has another
  // size; ResourceExhausted if state cannot be allocated.
  StatusOr<const std::vector<Tensor>*> SlotState(const ops::OpContext& ctx, int slot, int64_t n);
  // Counts one step of `slot` taken outside Step (a caller's own rule);
  // nothing for a slot without state (SlotState creates it).
  void CountStep(int slot);
  // Frees the state of every slot that has not stepped (created ahead of a
  // step that was then refused or failed): the optimizer is as it was
  // before, and the memory is returned.
  void ReleaseUnsteppedState();

  // The kind checkpoints record: the custom rule's name, else "SGD",
  // "ADAM" or "ADAMW".
  std::string Name() const;
  bool custom() const { return !options_.custom_name.empty(); }

  // Steps taken by `slot` (0 if never stepped).
  int64_t step_count(int slot) const;
  // Names of the per-element state tensors of this optimizer kind, in a fixed
  // order: {} for plain SGD, {"momentum"} for SGD with momentum,
  // {"exp_avg", "exp_avg_sq"} for Adam/AdamW; a custom rule's own names.
  std::vector<std::string> StateNames() const;
  // The state tensor `name` of `slot`; NotFound if the slot has not stepped.
  StatusOr<Tensor> State(int slot, const std::string& name) const;
  // Restores a slot (checkpoint loading): `state` holds one f32 tensor per
  // StateNames() entry, each of `n` elements (host memory or ctx's device),
  // copied with ctx. InvalidArgument on mismatch; the slot is unchanged then.
  Status LoadState(const ops::OpContext& ctx, int slot, int64_t n, int64_t step,
                   const std::vector<Tensor>& state);
  // Bytes of optimizer state currently held.
  size_t StateBytes() const;

 private:
  struct Slot {
    int64_t n = 0;
    int64_t step = 0;
    std::vector<Tensor> state;  // in StateNames() order
  };
  Optimizer(const OptimizerOptions& options, Allocator* allocator)
      : options_(options), allocator_(allocator) {}
  StatusOr<Slot*> GetOrCreateSlot(const ops::OpContext& ctx, int slot, int64_t n);
  // One update of `param` from `grad` with state `state` (views of a slot's
  // tensors) at step `step`.
  Status Update(const ops::OpContext& ctx, int64_t step, float lr, float weight_decay,
                const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state);

  OptimizerOptions options_;
  Allocator* allocator_;
  std::map<int, Slot> slots_;
  std::map<int, std::vector<HyperSegment>> segments_;  // sorted by begin
};

// Gradient-norm clipping across shards. The total norm of gradients spread
// over ranks is combined from per-rank partial results:
//   L2:  partial = sum of squares of the local shard elements, combined by SUM;
//   inf: partial = max |g| over the local shard elements,       combined by MAX.
// Padding elements of flat shards are zero and change neither.
enum class NormType : int { kL2 = 2, kInf = 0 };

// The local partial of the gradient norm over f32 gradient tensors: the
// SumOfSquares / MaxAbs ops into one f64 accumulator (from ctx.alloc), in
// order, read back with ops::ReadScalar (NaN on a device kind that does not
// execute). InvalidArgument for an undefined or non-f32 tensor.
StatusOr<double> LocalGradNormPartial(const ops::OpContext& ctx, const std::vector<Tensor>& grads,
                                      NormType type);
// The norm from the combined partial.
double FinishGradNorm(double combined_partial, NormType type);
// Scales f32 gradients by max_norm / (norm + 1e-6) when norm > max_norm
// (torch's clip_grad_norm_) with the Scale op on ctx; returns the factor
// applied (1 when not clipped). InvalidArgument for an undefined or non-f32
// tensor (nothing is scaled then).
StatusOr<float> ClipGradientsToNorm(const ops::OpContext& ctx, const std::vector<Tensor>& grads,
                                    double total_norm, double max_norm);
// Multiplies f32 gradients by `factor` (gradient accumulation's 1/M) with
// the Scale op on ctx. InvalidArgument for a non-finite factor or an
// undefined or non-f32 tensor (nothing is scaled then).
Status ScaleGradients(const ops::OpContext& ctx, const std::vector<Tensor>& grads, float factor);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPTIM_OPTIMIZER_H_
