// FullyShardedModel: FSDP (ZeRO-1/2/3, hybrid, DDP-like) around any model that
// drives UnitHooks (runtime/nn/model.h).
//
// Every strategy is one recipe over a 2-D mesh of ranks, replicate x shard,
// with a shard group of F ranks and N/F replicas:
//
//   strategy              F        unsharded params live          grads
//   FULL_SHARD (ZeRO-3)   N        PreForward..PostForward,       reduce-scatter
//                                  PreBackward..PostBackward
//   SHARD_GRAD_OP (ZeRO-2) N       PreForward..PostBackward       reduce-scatter
//   SHARD_OPTIM (ZeRO-1)  N        always (re-gathered after      reduce-scatter from a
//                                  each optimizer step)           persistent full grad
//   NO_SHARD (DDP-like)   1        always                         all-reduce
//   HYBRID_SHARD          F        as FULL_SHARD                  reduce-scatter in the shard
//   HYBRID_SHARD_GRAD_OP  F        as SHARD_GRAD_OP               group, all-reduce of the
//                                                                 shard across replicas
//
// Each unit's parameters form one flat parameter (flat_param.h); each rank
// keeps an f32 master shard of it, materialised directly from the
// counter-based initialiser (deferred initialisation: the full unit never
// exists on any rank). The optimizer steps on master shards only.
//
// Streams. Per rank there are three streams of the allocator's device:
// "all-gather", "reduce" and "compute". The model's ops run on the compute
// stream (compute_stream()); on cpu the calling thread plays it (its
// allocations are owned by "compute"), on cuda and sim they are enqueued. All-gathers run on
// the all-gather stream and are waited for (Work::wait) just before a unit
// computes, so a prefetched all-gather overlaps the previous unit's compute.
// Reduce-scatters run on the reduce stream behind the backward pass; the
// full gradient buffer is record_stream'ed onto it so the allocator does not
// hand it out again before the reduction has read it.
//
// Prefetch and the rate limiter. The execution order of units is recorded
// during forward. BACKWARD_PRE prefetches in PreBackward, before the current
// unit's gradients are computed (while its parameters are still alive);
// BACKWARD_POST in PostBackward, after they are and after the current unit is
// freed; forward prefetch in PreForward, by the order the previous step
// recorded. A prefetch issues the following units' all-gathers, in order,
// while the rate limiter (rate_limiter.h: `all_gather_limit` unsharded flat
// parameters in flight, gathered for a unit that has not finished computing
// with them) admits one more; the rest are deferred and gathered when
// needed. The default limit 2 therefore prefetches one unit ahead, as
// PyTorch does. On a GPU the limiter is what stops the CPU thread from
// racing ahead of the device and over-allocating; here the issuing thread
// is the compute thread, so the limit is the depth of that run-ahead, and
// RateLimit::Off() prefetches every remaining unit at once, which
// reproduces the over-allocation. A unit needed now is always gathered.
//
// Data. FSDP touches tensor data only through the op layer (runtime/ops), each
// op naming the stream it belongs to: on the all-gather stream the cast of the
// master shard into the gathered buffer (Cast, f32 -> param_dtype); on the
// reduce stream the cast of the full gradient to reduce_dtype (Cast), the
// copy a persistent full gradient is reduced from (Copy), the accumulation of
// the reduced shard into the f32 gradient shard (Axpy, widening; the step's
// first reduction of a unit makes the shard and copies: Copy or Cast) and
// the zeroing of the persistent full gradient (Fill); on the compute stream
// initialisation (Fill, InitPhilox), zeroing gradients (Fill), the grad-norm
// partials (SumOfSquares/MaxAbs, ReadScalar), clipping (Scale) and the
// optimizer's fused updates. On cpu an op for the all-gather or reduce stream
// runs in a closure on that stream's worker (the CPU execution contract);
// cuda enqueues and the simulator prices it on that stream.
//
// CPU offload (cpu_offload). Master shards, gradient shards and (through
// the caller's optimizer allocator) optimizer state live in host memory
// from the offload allocator, and every op on them runs on the host op
// context (shard_context(): the host's device, the offload allocator, and
// the host stream given to Create, or the calling thread when there is
// none). The all-gather copies the f32 master shard host->device on the
// all-gather stream (Device::CopyAsync: asynchronous from pinned memory on
// cuda) into a device f32 buffer and casts it there (the copy lands in the
// gathered buffer directly when param_dtype is f32). After the reduction the
// reduce stream copies the reduced shard device->host into a host staging
// buffer, and the accumulation into the f32 gradient shard runs on the host
// in stream order after that copy: a closure on the reduce stream (cpu,
// cuda: cudaLaunchHostFunc), or, with a host stream (sim), an op on the host
// stream made to wait for the reduce stream. Grad-norm, clipping, scaling,
// zeroing and the optimizer step run on the host context once the reduce
// stream has drained; before the host writes master shards (optimizer step,
// loading) the all-gather stream is synchronised, so no copy still reads
// them. On cpu host and device are the same memory and the copies are plain
// copies: the same code path, with f32 results bit-identical to no offload.
//
// Mixed precision. param_dtype is what the model computes in (the gathered
// flat parameter's dtype); reduce_dtype is what gradients are communicated in
// (default: param_dtype); master shards, gradient shards and optimizer state
// are always f32. With f32_unsharded_gradients (the Trainer's setting), a
// unit's unsharded gradient is f32 when it is reduced right after its
// backward (a 16-bit param_dtype, gradient sync on, a strategy that frees
// it: FULL_SHARD, SHARD_GRAD_OP, the hybrids): the model accumulates into it
// directly. Otherwise (the option off, persistent full gradients, no_sync
// accumulation) it is in param_dtype, and the Trainer's model accumulates
// each backward in f32 sinks it rounds into it (runtime/nn UnitGrads). Any
// f32 gradient of a unit that frees it (so also an f32 param_dtype's) with
// a 16-bit reduce_dtype is rounded once into reduce_dtype by PostBackward on
// the compute stream and freed before the reduction is issued. Both forms
// round each backward's sum once, to the same bits, when reduce_dtype is
// 16-bit; with reduce_dtype f32 the f32 form reduces the sum unrounded (the
// other rounds it to param_dtype and widens it back). The f32 form needs 4
// bytes per element of the unit during its backward instead of 2 + 4, and
// no zeroing and flush of sinks
// (tests/fsdp/fsdp_equivalence_test.cc, F32UnshardedGradientsTest).
// Gradients are pre-divided by a factor p and post-divided by N/p (p chosen
// as PyTorch does: the largest power of two with p * p < N dividing N) so
// low-precision sums do not overflow.
//
// Tied parameters (UnitSpec::tied, e.g. GPT-2's head reading embed.wte).
// A parameter lives in its owner's flat parameter only: it is sharded,
// initialised, optimised, clipped and checkpointed once. A unit that uses it
// too gathers the owner's flat parameter for each use: in its PreForward and
// PreBackward the owner is all-gathered again (or found still gathered:
// SHARD_GRAD_OP and the persistent strategies keep it) and the tied views
// point into it; its PostForward and PostBackward free it again where the
// strategy frees after forward. Its PreBackward also makes the owner's
// unsharded gradient (zeroed) and hands out views into it, so the using
// unit adds its gradient where the owner's own backward adds later; the
// owner's PostBackward reduces the sum, once, as for any unit (the owner
// comes earlier in execution order, hence later in backward). The owner's
// unsharded gradient therefore lives from the user's backward to its own:
// for GPT-2 the embedding's, vocab x d, through the whole backward
// (PyTorch FSDP's alternative, one unit holding both, keeps the head's
// parameters gathered as long). No-sync accumulation, mixed precision,
// offload and caller streams apply unchanged: the borrowed buffers are the
// owner's.
//
// Errors. Every call out of order is FailedPrecondition naming the unit and
// its state. A failing collective fails the hook that waited for it; the step
// is then abandoned: every unit returns to idle, unsharded buffers are freed,
// and gradients are zeroed. Master shards and optimizer state are only
// changed by OptimizerStep, so a failed step loses nothing.
//
// Thread safety: one FullyShardedModel per rank, used by one thread.
#ifndef SHARDKIT_RUNTIME_FSDP_FSDP_H_
#define SHARDKIT_RUNTIME_FSDP_FSDP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/fsdp/flat_param.h"
#include "runtime/fsdp/fsdp_param_group.h"
#include "runtime/fsdp/rate_limiter.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/model.h"
#include "runtime/ops/backend.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/sharding_plan.h"

namespace sk {

// Values equal the C ABI's sk_backward_prefetch_t (capi/abi.cc asserts it);
// the ABI's 0 ("default": BACKWARD_PRE) is resolved when it translates options.
enum class BackwardPrefetch : int {
  kNone = 1,
  kBackwardPre = 2,
  kBackwardPost = 3,
};

// "BACKWARD_PRE", ...; and the inverse (accepts the lower-case forms too).
const char* BackwardPrefetchName(BackwardPrefetch p);
StatusOr<BackwardPrefetch> ParseBackwardPrefetch(const std::string& name);

// How gradients accumulate over the micro-batches of one optimizer step
// (the Trainer's grad_accum_steps). Values equal the C ABI's
// sk_grad_accumulation_t; 0 resolves by strategy (ReducesEveryMicroBatch).
enum class GradAccumulation : int {
  kDefault = 0,
  // Every micro-batch's backward reduces (reduce-scatters) into the f32
  // gradient shard, as FSDP2 does with gradient sync left on: the unsharded
  // gradients live only during each unit's backward, at the price of a
  // reduction per micro-batch. The default for the strategies that free
  // unsharded gradients (FULL_SHARD, SHARD_GRAD_OP and the hybrids).
  kSharded = 1,
  // no_sync: micro-batches accumulate in each unit's unsharded gradient,
  // reduced once by the last: one reduction per step, but every unit's
  // full gradient alive from the first micro-batch's backward to the last.
  // The default for SHARD_OPTIM and NO_SHARD, which keep full gradients
  // anyway.
  kUnsharded = 2,
};

// "DEFAULT", "SHARDED", "UNSHARDED"; and the inverse (any case).
const char* GradAccumulationName(GradAccumulation g);
StatusOr<GradAccumulation> ParseGradAccumulation(const std::string& name);

struct MixedPrecisionPolicy {
  // What the model computes in: the gathered parameters' dtype, and the
  // dtype of the gradient buffers the model adds into.
  DType param_dtype = DType::kF32;
  // What gradients are communicated (reduce-scattered / all-reduced) in;
  // unset: param_dtype.
  std::optional<DType> reduce_dtype;
  // The dtype gradients are communicated in: reduce_dtype, else param_dtype.
  // FSDP, the memory estimator, the planner and the C ABI all ask this.
  DType ReduceDType() const { return reduce_dtype.value_or(param_dtype); }
  // No buffer dtype: the models FSDP wraps have parameters only (UnitSpec),
  // no buffers (non-parameter state) it could apply to. The C ABI refuses
  // a non-default sk_fsdp_options.buffer_dtype for that reason.
};

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  // Ranks per shard group for the hybrid strategies (must divide the world
  // size; 0 = the ranks per node, below).
  int shard_group_size = 0;
  // Ranks per node, where the hybrids without shard_group_size shard; 0 =
  // one node holds the world. Set by the launch edge (the Trainer and the
  // engine: LOCAL_WORLD_SIZE, or a simulated cluster's GPUs per node); FSDP
  // reads no environment. ResolveSharding (runtime/parallel/sharding_plan.h)
  // decides the groups from these fields.
  int ranks_per_node = 0;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  // The rate limiter: most unsharded flat parameters in flight at once
  // (RateLimit::InFlight(N), N >= 1), or RateLimit::Off().
  RateLimit all_gather_limit = kDefaultRateLimit;
  MixedPrecisionPolicy mixed_precision;
  // Keep master shards, gradient shards and optimizer state in host memory
  // outside the device allocator (see offload_allocator in Create).
  bool cpu_offload = false;
  // 0 = automatic (see above).
  float gradient_predivide_factor = 0.f;
  // Seed of the counter-based initialiser.
  uint64_t seed = 0;
  // Timeout of every collective and wait.
  Duration timeout = kDefaultTimeout;
  // With a 16-bit param_dtype: hand the model f32 unsharded gradient buffers
  // for units reduced right after their backward (see "Mixed precision"
  // above). Off, gradient buffers are in param_dtype, the C ABI engine's
  // documented contract (sk_engine_grad); the Trainer, whose model
  // accumulates 16-bit gradients in f32 anyway, turns it on.
  bool f32_unsharded_gradients = false;
  // Gradient accumulation over micro-batches (see GradAccumulation). The
  // Trainer applies it: FullyShardedModel itself reduces whenever gradient
  // sync is on.
  GradAccumulation grad_accumulation = GradAccumulation::kDefault;
  // Leave the master shards zero instead of drawing them from the
  // initialisers, for a model whose weights a load will overwrite
  // (LoadFullStateDict, LoadShardedCheckpoint): creating it then costs no
  // random initialisation. The caller must load before training; the
  // Trainer refuses to step, evaluate or save until it has.
  bool skip_init = false;
};

// Whether gradient accumulation under `options` reduces every micro-batch
// (kSharded, or kDefault with a strategy that frees unsharded gradients).
bool ReducesEveryMicroBatch(const FsdpOptions& options);

// InvalidArgument naming the field.
Status ValidateFsdpOptions(const FsdpOptions& options, int world_size);

// Counters of one rank since creation (or ResetCounters).
namespace fsdp_internal {
// The collectives' communication context (fsdp_collectives.h).
struct FsdpComm;
// A group's reduction in flight: its last collective (waited for first, so
// a failed or timed-out peer is reported as the collective) and an event the
// reduce stream records after the reduced shard has been accumulated. On
// CPU the stream releases a closure's buffers before it completes it, so
// once the event has passed, the unit's full gradient and reduced shard are
// no longer held by any closure: waiting for both bounds what a reduction
// keeps alive to one unit's buffers (the memory estimator relies on it).
struct PendingReduction {
  std::shared_ptr<comm::Work> work;  // may be null (NO_SHARD without replicas)
  std::shared_ptr<Event> done;
};

}  // namespace fsdp_internal

struct FsdpCounters {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t all_reduces = 0;
  int64_t prefetches = 0;
  int64_t prefetches_deferred = 0;  // held back by the rate limiter
  int max_unsharded_alive = 0;      // most unsharded flat params alive at once
  int64_t all_gather_bytes = 0;     // nccl-tests bytes (output of all_gather)
  int64_t reduce_scatter_bytes = 0;
  int64_t all_reduce_bytes = 0;
  int64_t replica_bytes = 0;        // all-reduce bytes across replicas (hybrid, NO_SHARD)
};

class FullyShardedModel final : public DataParallelModel {
 public:
  // Wraps `units` (the model's) for this rank of `world`. Collective: every
  // rank calls it with the same units and options. `allocator` holds the
  // device memory (gathered params, gradients, activations through
  // activation_allocator()); `offload_allocator` holds master/grad shards
  // and the host staging buffer with cpu_offload (HostAllocator::Default()
  // when null; PinnedHostAllocator on cuda; the simulator's virtual host
  // memory on sim). Host ops run on the offload allocator's device, on
  // `host_stream` when given (required when that device is not a cpu: the
  // simulator prices host ops there), else on the calling thread.
  // InvalidArgument when a non-cpu host has no stream, or the host stream is
  // not on the offload allocator's device. Allocators, the host stream and
  // `world` must outlive the model.
  static StatusOr<std::unique_ptr<FullyShardedModel>> Create(
      const std::vector<UnitSpec>& units, comm::ProcessGroup* world, CachingAllocator* allocator,
      const FsdpOptions& options, Allocator* offload_allocator = nullptr,
      Stream* host_stream = nullptr);
  ~FullyShardedModel() override;

  // UnitHooks, driven by Model::ForwardBackward / Forward. The model's ops
  // run on FSDP's compute stream (on cpu: still the calling thread).
  Stream* compute_stream() override { return compute_stream_.get(); }
  StatusOr<std::vector<Tensor>> PreForward(int unit) override;
  Status PostForward(int unit) override;
  StatusOr<UnitBackwardBuffers> PreBackward(int unit) override;
  Status PostBackward(int unit) override;

  // The allocator to pass to the model for activations (the compute stream's).
  Allocator& activation_allocator() override { return *activation_allocator_; }

  // Stream-ordered hooks (the FSDP engine's caller stream). With a stream
  // set (null: none, the synchronous protocol above), the hooks called from
  // now on order the caller's work on `stream`, a stream of the allocator's
  // device, against FSDP's streams without blocking the host on it:
  //   PreForward/PreBackward make `stream` wait for the unit's all-gather (an
  //     event, not Work::wait) and record the gathered buffer (and, in
  //     PreBackward, the gradient buffer) onto `stream`, so the allocator
  //     reuses them only once `stream` has passed the point of their free;
  //     on cuda and sim `stream` also waits for the compute stream (the
  //     zeroing of the gradient buffer);
  //   PostBackward makes the reduce stream wait for an event recorded on
  //     `stream` before it reads the gradient buffer (and rounds it to
  //     reduce_dtype there: NarrowFullGradient would read it on the compute
  //     stream), and a kept gradient buffer (no_sync, SHARD_OPTIM,
  //     NO_SHARD) is handed out again only after the reduce stream's work.
  // An all-gather's outcome is then checked without blocking at the next
  // hook that finds it complete, and waited for by FinishBackward. `stream`
  // must outlive the model (and the allocator's blocks recorded on it).
  void set_caller_stream(Stream* stream) { caller_stream_ = stream; }
  Stream* caller_stream() const { return caller_stream_; }

  // Gradient synchronisation for the following backward passes (no_sync when
  // false): gradients accumulate unsharded and locally until a backward with
  // sync enabled reduces the total.
  void set_gradient_sync(bool enabled) override { gradient_sync_ = enabled; }
  // A token-weighted loss (the engine's SetLossTokens): the reductions
  // issued from now on divide the sum over ranks by `divisor` (the step's
  // counted targets over every rank) instead of by the world size, so that
  // gradients of per-token loss SUMS become the gradient of the global mean
  // over tokens; a divisor of 0 makes them 0. Applied in the collectives'
  // post-scale (p / divisor, after the usual pre-division by p), or by a
  // scale of the reduced gradient where no collective runs (one rank).
  // std::nullopt: the mean over ranks, the default. The caller resets it
  // (the engine does at ZeroGrad and when a step is abandoned).
  void set_reduction_divisor(std::optional<double> divisor) { reduction_divisor_ = divisor; }
  std::optional<double> reduction_divisor() const { return reduction_divisor_; }
  bool gradient_sync() const override { return gradient_sync_; }

  // Waits for every outstanding reduction of this step. Call after the last
  // backward of a step, before clipping and the optimizer step.
  Status FinishBackward() override;
  // The total gradient norm over all ranks' shards (collective). With
  // max_norm > 0, scales the gradients so the norm is at most max_norm.
  StatusOr<double> ClipGradNorm(double max_norm, NormType type = NormType::kL2) override;
  Status ScaleGradients(float factor) override;
  // Steps `optimizer` on every unit's master shard (slot = unit index), then,
  // for SHARD_OPTIM and NO_SHARD, refreshes the persistent full parameters.
  Status OptimizerStep(Optimizer& optimizer) override;
  Status PrepareOptimizer(Optimizer& optimizer) override;
  // OptimizerStep in two halves, for an update rule of the caller's own
  // (FsdpEngine's custom step): BeginMasterUpdate finishes the backward and
  // waits until nothing reads the master shards; the caller then updates
  // master_shard(u) from grad_shard(u) in shard_context()'s order;
  // EndMasterUpdate refreshes what FSDP keeps of the parameters (collective
  // for SHARD_OPTIM and NO_SHARD, which regather).
  Status BeginMasterUpdate();
  Status EndMasterUpdate();
  // Releases the gradient shards (a unit without one has a zero gradient)
  // and zeroes accumulated no_sync gradients.
  void ZeroGrad() override;
  void AbandonStep() override { Fail(OkStatus()).IgnoreError(); }
  // NO_SHARD and SHARD_OPTIM: EndMasterUpdate regathers the full parameters.
  bool UpdateEndsWithFallibleWork() const override;
  // As AbandonStep, then (NO_SHARD, SHARD_OPTIM) drops every unit's full
  // parameters, so that every rank's next PreForward gathers them from the
  // updated shards (a failed regather left them stale on some units).
  void AbandonAfterUpdate() override;

  const FsdpOptions& options() const { return options_; }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int shard_group_size() const { return sharding_.shard_size(); }
  // The resolved strategy: this model's mesh and reshard policy.
  const ShardingPlan& sharding() const { return sharding_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitSpec& unit(int u) const { return units_[u]; }
  const FlatParamLayout& layout(int unit) const { return groups_[unit].layout(); }
  // The unit's f32 master shard and gradient shard on this rank. Gradient
  // shards exist only while a step has gradients: from the unit's first
  // reduction of a step (every unit from FinishBackward, zeros for those
  // none reached) until ZeroGrad or a failed step; otherwise grad_shard is
  // an undefined Tensor.
  const Tensor& master_shard(int unit) const { return groups_[unit].master(); }
  const Tensor& grad_shard(int unit) const { return groups_[unit].grad(); }
  // Execution order recorded by the last forward.
  const std::vector<int>& forward_order() const { return forward_order_; }
  // Unit indices in the order their all-gathers were issued since the
  // current forward pass began (cleared when a new one begins, so it stays
  // bounded by one step's all-gathers however long training runs).
  const std::vector<int>& all_gather_log() const { return all_gather_log_; }
  const FsdpCounters& counters() const { return counters_; }
  int64_t bytes_communicated() const override {
    return counters_.all_gather_bytes + counters_.reduce_scatter_bytes + counters_.all_reduce_bytes;
  }
  void ResetCounters() { counters_ = FsdpCounters(); }

  // The full f32 value of parameter `param` of `unit`, in host memory
  // (collective over the shard group: every member calls it).
  StatusOr<Tensor> GatherFullParam(int unit, int param);
  // Overwrites the master shards from full f32 parameters (one per
  // ParamSpec; host memory or this model's device), keeping only this rank's
  // slices. InvalidArgument on shape
  // mismatch; nothing changes then.
  Status LoadFullParams(int unit, const std::vector<Tensor>& params);
  // Overwrites parameter `param` of `unit` from its full f32 value (any
  // shape of its element count; host memory or this model's device): each
  // rank keeps its slice. Collective over the shard group for the strategies
  // that keep full parameters (they regather the unit); every rank passes
  // the same value. OutOfRange/InvalidArgument before anything changes.
  Status LoadFullParam(int unit, int param, const Tensor& value);
  // Overwrites the master shard of `unit` from `shard` (f32[shard_numel], host
  // memory or this model's device; checkpoint loading). InvalidArgument on a
  // dtype or size mismatch; nothing changes then.
  Status LoadMasterShard(int unit, const Tensor& shard);
  // The op context of the master and gradient shards and of the optimizer
  // step: the host context with cpu_offload (its stream may be null: the
  // calling thread), else the compute stream's (the calling thread on cpu).
  // What checkpoints copy master shards and optimizer state with, and what
  // an optimizer's LoadState takes.
  const ops::OpContext& shard_context() const { return options_.cpu_offload ? host_ctx_ : compute_ctx_; }
  // Shard group and replicate group of this rank (for checkpoints and tests).
  comm::ProcessGroup& shard_group() { return *shard_group_; }
  comm::ProcessGroup* replicate_group() { return replicate_group_.get(); }

 private:
  // Each unit's flat parameter, its shards, unsharded buffers and state are
  // an FsdpParamGroup (fsdp_param_group.h, FSDP2's FSDPParamGroup), which
  // the model drives. The members are defined by responsibility: fsdp.cc
  // (creation, the hooks' unit state machine, prefetch, freeing and
  // regathering groups, abandoning a step, the step's end),
  // fsdp_gather_reduce.cc (when a group is gathered or reduced, handing its
  // parameters out, the caller stream's order), fsdp_tied.cc (tied
  // parameters: groups borrowed by other units), fsdp_load.cc (writing
  // master shards from outside), fsdp_options.cc (names and validation).
  // What goes over the wire is not the model's: free functions over a
  // communication context (fsdp_collectives.h, FSDP2's _fsdp_collectives).

  FullyShardedModel(std::vector<UnitSpec> units, comm::ProcessGroup* world,
                    CachingAllocator* allocator, Allocator* offload, Stream* host_stream,
                    const FsdpOptions& options);
  // Copies `src` (host memory or this model's device) into a master shard
  // (or a slice of one), in order before the next all-gather reads it.
  Status WriteMaster(const Tensor& src, const Tensor& dst);
  // Writes this rank's slice `s` of a parameter (`flat_param`, its full
  // value flattened) into group's master shard.
  Status WriteMasterSlice(const fsdp_internal::FsdpParamGroup& group, const FlatParamLayout::ShardSlice& s,
                          const Tensor& flat_param);
  // After a load wrote `unit`'s master shard: the next all-gather reads the
  // new values, and the persistent strategies regather the unit now.
  Status MastersWritten(int unit);
  // With cpu_offload, before the host writes master shards: waits until no
  // host->device copy still reads them. A no-op without offload.
  Status QuiesceMasterReaders();
  Status Init();
  bool ParamsPersistent() const;   // SHARD_OPTIM, NO_SHARD: full params never freed
  bool ReshardAfterForward() const;
  // The dtype of `unit`'s unsharded gradient when PreBackward allocates it
  // (see "Mixed precision" above), and the dtype gradients are reduced in.
  DType FullGradDType() const;
  DType ReduceDType() const;
  // With an f32 full gradient and a 16-bit reduce dtype: rounds it into a
  // reduce-dtype copy on the compute stream and drops the f32 one.
  Status NarrowFullGradient(int unit);
  // PreBackward with a caller stream: orders it after whatever FSDP still
  // does to `full_grad` (kept: the reduce stream's reading and zeroing) and
  // records the buffer onto it.
  Status OrderCallerBeforeGradients(const Tensor& full_grad, bool kept);
  Status Expect(int unit, UnitState want, const char* call) const;
  // Tied parameters (see above): gathers the owners of `unit`'s tied
  // parameters (FailedPrecondition unless each has finished its forward);
  // appends their views to `views`; makes the owners' unsharded gradients
  // and appends views into them; drops the owners' gathered buffers again
  // where the strategy reshards after forward.
  Status GatherTiedOwners(int unit, const char* call);
  StatusOr<std::vector<Tensor>> AppendTiedParams(int unit, std::vector<Tensor> views);
  Status AppendTiedGradients(int unit, std::vector<Tensor>* grads);
  void ReleaseTiedOwners(int unit);
  Status CheckUnit(int unit, const char* call) const;
  // Issues the all-gather of `unit` (fsdp_internal::AllGather) unless it is
  // gathered or in flight, after the master shards' last write.
  // `prefetch` only counts it as one: the rate limiter is asked by Prefetch.
  Status IssueAllGather(int unit, bool prefetch);
  // Waits for `unit`'s all-gather and returns its parameter views.
  StatusOr<std::vector<Tensor>> WaitAndViews(int unit);
  // The hooks' form of WaitAndViews: with a caller stream, orders that
  // stream after the all-gather instead of waiting on the host.
  StatusOr<std::vector<Tensor>> HandOutParams(int unit);
  // Reports the first failed all-gather among those the caller stream was
  // made to wait for: those complete now (block = false), or all of them.
  Status CheckCallerGathers(bool block);
  // Drops `unit`'s unsharded parameter and gathers it again from the
  // master shards, waiting for it (persistent strategies after a change).
  Status Regather(int unit);
  void Free(int unit);
  // Unsharded flat parameters in flight (what the rate limiter counts).
  int UnshardedAlive() const;
  // Issues the all-gathers of `candidates`, in order, while the rate
  // limiter admits them; the first it refuses ends the prefetch (deferred).
  Status Prefetch(const std::vector<int>& candidates);
  // Reduces `unit`'s full gradient (fsdp_internal::Reduce) and keeps the
  // reduction as pending.
  Status ReduceGradients(int unit);
  Status Fail(Status s);  // abandons the step, returns s

  std::vector<UnitSpec> units_;
  std::vector<std::vector<ParamRef>> tied_;   // per unit: owners of its tied parameters
  std::vector<std::vector<int>> tied_owners_; // per unit: the distinct owner units
  comm::ProcessGroup* world_;
  CachingAllocator* allocator_;
  Allocator* offload_;
  Stream* host_stream_;  // may be null (host ops on the calling thread)
  // Where master and gradient shards live: the offload allocator, or the
  // compute stream's pool of the device allocator (set by Init).
  Allocator* shard_allocator_ = nullptr;
  FsdpOptions options_;
  RateLimiter rate_limiter_;  // decides each prefetch (Prefetch)
  ShardingPlan sharding_;
  std::unique_ptr<comm::ProcessGroup> shard_group_;
  std::unique_ptr<comm::ProcessGroup> replicate_group_;  // null when there is one replica
  std::unique_ptr<Stream> ag_stream_, rs_stream_, compute_stream_;
  std::unique_ptr<StreamAllocator> activation_allocator_;
  std::unique_ptr<StreamAllocator> ag_allocator_;
  std::unique_ptr<StreamAllocator> rs_allocator_;
  // Op contexts of the three streams (set by Init).
  ops::OpContext compute_ctx_, ag_ctx_, rs_ctx_;
  // cpu_offload: the host's op context (offload allocator, host_stream_) and
  // the host buffer reduced shards are copied into before their host
  // accumulation (reduce dtype, the largest shard; one suffices: copies and
  // accumulations run in reduce-stream order).
  ops::OpContext host_ctx_;
  Tensor grad_staging_;
  // The collectives' context: the groups, streams and allocators above, the
  // timeout and counters_ (set by Init).
  std::unique_ptr<fsdp_internal::FsdpComm> comm_;
  std::vector<fsdp_internal::FsdpParamGroup> groups_;  // one per unit
  bool gradient_sync_ = true;
  // Set whenever the compute stream writes master shards (initialisation,
  // the optimizer step, loading): the next all-gather's stream first waits
  // for the compute stream, so it reads the written values. Only then: an
  // all-gather issued during forward or backward must overlap the compute
  // already enqueued, as PyTorch FSDP's unshard stream does.
  bool masters_written_ = true;
  float pre_scale_ = 1.f, post_scale_ = 1.f;
  std::optional<double> reduction_divisor_;  // set_reduction_divisor
  // post_scale_, or p / divisor under set_reduction_divisor (0 for 0).
  float ReductionPostScale() const;
  std::vector<int> forward_order_, last_forward_order_;
  std::vector<int> all_gather_log_;
  std::deque<fsdp_internal::PendingReduction> pending_reductions_;
  Stream* caller_stream_ = nullptr;
  // All-gathers a caller stream waits for by event, not yet checked.
  std::vector<std::pair<int, std::shared_ptr<comm::Work>>> caller_gathers_;
  FsdpCounters counters_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_FSDP_FSDP_H_
