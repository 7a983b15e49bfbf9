// FullyShardedModel's lifecycle and its hooks: creation (process groups,
// streams, deferred initialisation of the master shards), the unit state
// machine driven by the model (PreForward .. PostBackward, with prefetch
// through the rate limiter), abandoning a failed step, and the step's end
// (FinishBackward, clipping, the optimizer step, ZeroGrad). Each unit's
// state is its FsdpParamGroup (fsdp_param_group.h); what goes over the wire
// is in fsdp_collectives.h (free functions over a communication context),
// when the model gathers and reduces in fsdp_gather_reduce.cc, tied
// parameters in fsdp_tied.cc, loading master shards in fsdp_load.cc, the
// options in fsdp_options.cc.
#include "runtime/fsdp/fsdp.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/trace.h"
#include "runtime/fsdp/fsdp_collectives.h"
#include "runtime/fsdp/fsdp_internal.h"
#include "runtime/ops/init.h"
#include "runtime/ops/ops.h"

namespace sk {

using fsdp_internal::FsdpParamGroup;
using fsdp_internal::OnStream;
using fsdp_internal::Slice;

FullyShardedModel::FullyShardedModel(std::vector<UnitSpec> units, comm::ProcessGroup* world,
                                     CachingAllocator* allocator, Allocator* offload,
                                     Stream* host_stream, const FsdpOptions& options)
    : units_(std::move(units)), world_(world), allocator_(allocator), offload_(offload),
      host_stream_(host_stream), options_(options), rate_limiter_(options.all_gather_limit) {}

FullyShardedModel::~FullyShardedModel() {
  // Outstanding reductions hold buffers from our allocators: let them finish.
  for (auto& r : pending_reductions_) {
    if (r.work) r.work->wait(options_.timeout).IgnoreError();
  }
  if (rs_stream_) rs_stream_->Synchronize(options_.timeout).IgnoreError();
  if (ag_stream_) ag_stream_->Synchronize(options_.timeout).IgnoreError();
  if (host_stream_) host_stream_->Synchronize(options_.timeout).IgnoreError();
  groups_.clear();
}

StatusOr<std::unique_ptr<FullyShardedModel>> FullyShardedModel::Create(
    const std::vector<UnitSpec>& units, comm::ProcessGroup* world, CachingAllocator* allocator,
    const FsdpOptions& options, Allocator* offload_allocator, Stream* host_stream) {
  if (world == nullptr) return InvalidArgumentError("FSDP needs a process group");
  if (allocator == nullptr) return InvalidArgumentError("FSDP needs a caching allocator");
  SK_RETURN_IF_ERROR(ValidateFsdpOptions(options, world->size()));
  if (units.empty()) return InvalidArgumentError("FSDP needs at least one unit");
  for (const UnitSpec& u : units) {
    if (u.name.empty()) return InvalidArgumentError("a unit has an empty name");
    for (const ParamSpec& p : u.params) {
      SK_RETURN_IF_ERROR(ValidateInitializer(p.init).WithContext("parameter '" + FullParamName(u, p) + "'"));
    }
  }
  // A parameter lives in its owner's flat parameter only; units that use it
  // too (tied) borrow the owner's gathered buffer and gradient.
  SK_ASSIGN_OR_RETURN(std::vector<std::vector<ParamRef>> tied, ResolveTiedParams(units));
  const FsdpOptions& o = options;
  if (offload_allocator == nullptr) offload_allocator = &HostAllocator::Default();
  if (o.cpu_offload) {
    const DeviceId host = offload_allocator->device();
    SK_ASSIGN_OR_RETURN(DeviceCapabilities host_can, Device::CapabilitiesOf(host));
    if (host_stream == nullptr && !host_can.ops_run_when_issued) {
      return InvalidArgumentError("cpu_offload with an offload allocator on " + host.ToString() +
                                  " needs a host stream (host ops there are not run by the calling thread)");
    }
    if (host_stream != nullptr && host_stream->device() != host) {
      return InvalidArgumentError("cpu_offload: the host stream '" + host_stream->name() + "' is on " +
                                  host_stream->device().ToString() + ", the offload allocator on " +
                                  host.ToString());
    }
  }
  std::unique_ptr<FullyShardedModel> m(new FullyShardedModel(
      units, world, allocator, offload_allocator, o.cpu_offload ? host_stream : nullptr, o));
  m->tied_ = std::move(tied);
  for (const auto& refs : m->tied_) {
    std::vector<int> owners;
    for (const ParamRef& r : refs) {
      if (std::find(owners.begin(), owners.end(), r.unit) == owners.end()) owners.push_back(r.unit);
    }
    m->tied_owners_.push_back(std::move(owners));
  }
  SK_RETURN_IF_ERROR(m->Init());
  return m;
}

bool FullyShardedModel::ParamsPersistent() const { return sharding_.policy.keep_unsharded; }

bool FullyShardedModel::ReshardAfterForward() const { return sharding_.policy.reshard_after_forward; }

DType FullyShardedModel::FullGradDType() const {
  const DType pd = options_.mixed_precision.param_dtype;
  return options_.f32_unsharded_gradients && pd != DType::kF32 && gradient_sync_ &&
                 !ParamsPersistent()
             ? DType::kF32
             : pd;
}

DType FullyShardedModel::ReduceDType() const {
  return options_.mixed_precision.ReduceDType();
}

Status FullyShardedModel::Init() {
  const int n = world_->size();
  const int r = world_->rank();
  SK_ASSIGN_OR_RETURN(sharding_, ResolveSharding(options_.strategy, options_.shard_group_size, n,
                                                 options_.ranks_per_node));
  // Collective over the world, in the same order on every rank: the shard
  // group, then (when there are replicas) the replicate group.
  SK_ASSIGN_OR_RETURN(shard_group_, world_->NewGroup(sharding_.ShardGroupRanks(r), options_.timeout));
  if (sharding_.replicate_size() > 1) {
    SK_ASSIGN_OR_RETURN(replicate_group_,
                        world_->NewGroup(sharding_.ReplicateGroupRanks(r), options_.timeout));
  }
  float p = options_.gradient_predivide_factor > 0 ? options_.gradient_predivide_factor
                                                   : AutoGradientPredivideFactor(n);
  pre_scale_ = 1.f / p;
  post_scale_ = p / static_cast<float>(n);

  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(allocator_->device()));
  std::string tag = " (rank " + std::to_string(r) + ")";
  SK_ASSIGN_OR_RETURN(ag_stream_, device->CreateStream("all-gather" + tag));
  SK_ASSIGN_OR_RETURN(rs_stream_, device->CreateStream("reduce" + tag));
  SK_ASSIGN_OR_RETURN(compute_stream_, device->CreateStream("compute" + tag));
  activation_allocator_ = std::make_unique<StreamAllocator>(allocator_, compute_stream_.get());
  ag_allocator_ = std::make_unique<StreamAllocator>(allocator_, ag_stream_.get());
  rs_allocator_ = std::make_unique<StreamAllocator>(allocator_, rs_stream_.get());
  compute_ctx_ = ops::OpContext{device, compute_stream_.get(), activation_allocator_.get()};
  ag_ctx_ = ops::OpContext{device, ag_stream_.get(), ag_allocator_.get()};
  rs_ctx_ = ops::OpContext{device, rs_stream_.get(), rs_allocator_.get()};
  if (options_.cpu_offload) {
    SK_ASSIGN_OR_RETURN(Device * host, Device::Get(offload_->device()));
    // Host temporaries (the grad-norm accumulator) from pageable memory on a
    // real host: one cudaHostAlloc per temporary would cost milliseconds.
    Allocator* temporaries = host->capabilities().host_memory ? &HostAllocator::Default() : offload_;
    host_ctx_ = ops::OpContext{host, host_stream_, temporaries};
  }
  shard_allocator_ = options_.cpu_offload ? offload_ : activation_allocator_.get();
  comm_ = std::make_unique<fsdp_internal::FsdpComm>();
  comm_->shard_group = shard_group_.get();
  comm_->replicate_group = replicate_group_.get();
  comm_->compute = compute_ctx_;
  comm_->all_gather = ag_ctx_;
  comm_->reduce = rs_ctx_;
  comm_->host = host_ctx_;
  comm_->host_stream = host_stream_;
  comm_->allocator = allocator_;
  comm_->cpu_offload = options_.cpu_offload;
  comm_->timeout = options_.timeout;
  comm_->counters = &counters_;
  Allocator& shard_alloc = *shard_allocator_;
  const ops::OpContext& shard_ctx = shard_context();

  const int shard_rank = shard_group_->rank();
  groups_.reserve(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    std::vector<std::pair<std::string, Shape>> params;
    for (const ParamSpec& p : units_[u].params) params.emplace_back(p.name, p.shape);
    SK_ASSIGN_OR_RETURN(FlatParamLayout layout, FlatParamLayout::Make(params, sharding_.shard_size()));
    SK_ASSIGN_OR_RETURN(FsdpParamGroup group, FsdpParamGroup::Create(std::move(layout), shard_alloc, shard_ctx));
    groups_.push_back(std::move(group));
    const FsdpParamGroup& g = groups_.back();
    // Deferred initialisation: only this rank's slices are ever computed
    // (none with skip_init: the shard stays as Create zeroed it).
    if (options_.skip_init) continue;
    for (const auto& s : g.layout().ShardSlices(shard_rank)) {
      const ParamSpec& spec = units_[u].params[s.param];
      SK_ASSIGN_OR_RETURN(Tensor slice, Slice(g.master(), s.shard_offset, s.param_end - s.param_begin));
      SK_RETURN_IF_ERROR(ops::InitPhilox(shard_ctx, spec.init, options_.seed,
                                         ParamIdFromName(FullParamName(units_[u], spec)),
                                         s.param_begin, slice));
    }
  }
  if (options_.cpu_offload) {
    int64_t largest = 0;
    for (const FsdpParamGroup& g : groups_) largest = std::max(largest, g.layout().shard_numel());
    const DType rdt = ReduceDType();
    SK_ASSIGN_OR_RETURN(grad_staging_, offload_->Empty(rdt, Shape{largest}));
  }
  if (ParamsPersistent()) {
    for (int u = 0; u < num_units(); ++u) SK_RETURN_IF_ERROR(Regather(u));
  }
  TraceRecorder::Global().NameProcess(r, "rank " + std::to_string(r));
  // The hooks' spans (track 0; stream tracks start at 1) in wall-clock time:
  // not on the simulator, whose tracks run in virtual time.
  if (!device->capabilities().virtual_time) {
    TraceRecorder::Global().NameTrack(r, 0, "FSDP hooks (rank " + std::to_string(r) + ")");
  }
  return OkStatus();
}

Status FullyShardedModel::CheckUnit(int unit, const char* call) const {
  if (unit < 0 || unit >= num_units()) {
    return InvalidArgumentError(std::string(call) + ": unit index " + std::to_string(unit) +
                                " out of range (the model has " + std::to_string(num_units()) +
                                " units)");
  }
  return OkStatus();
}

Status FullyShardedModel::Expect(int unit, UnitState want, const char* call) const {
  if (groups_[unit].state() != want) {
    return FailedPreconditionError(std::string(call) + " of unit '" + units_[unit].name + "' (" +
                                   std::to_string(unit) + ") in state '" +
                                   UnitStateName(groups_[unit].state()) + "', expected '" +
                                   UnitStateName(want) + "'");
  }
  return OkStatus();
}

Status FullyShardedModel::Prefetch(const std::vector<int>& candidates) {
  for (int c : candidates) {
    if (groups_[c].unsharded()) continue;  // in flight already, or kept unsharded
    if (!rate_limiter_.AdmitsPrefetch(UnshardedAlive())) {
      ++counters_.prefetches_deferred;
      return OkStatus();
    }
    SK_RETURN_IF_ERROR(IssueAllGather(c, true));
  }
  return OkStatus();
}

int FullyShardedModel::UnshardedAlive() const {
  if (ParamsPersistent()) return 0;
  int alive = 0;
  for (const FsdpParamGroup& g : groups_) {
    if (g.unsharded() && g.in_flight()) ++alive;
  }
  return alive;
}

void FullyShardedModel::Free(int unit) {
  if (ParamsPersistent()) {
    groups_[unit].ClearInFlight();
  } else {
    groups_[unit].Reshard();
  }
}

Status FullyShardedModel::Regather(int unit) {
  groups_[unit].Reshard();
  SK_RETURN_IF_ERROR(IssueAllGather(unit, false));
  return WaitAndViews(unit).status();
}

StatusOr<std::vector<Tensor>> FullyShardedModel::WaitAndViews(int unit) {
  FsdpParamGroup& g = groups_[unit];
  Status s = g.WaitForAllGather(options_.timeout);
  if (!s.ok()) return s.WithContext("all-gather of unit '" + units_[unit].name + "'");
  return g.ParamViews();
}

Status FullyShardedModel::Fail(Status s) {
  for (auto& r : pending_reductions_) {
    if (r.work) r.work->wait(options_.timeout).IgnoreError();
  }
  pending_reductions_.clear();
  caller_gathers_.clear();
  rs_stream_->Synchronize(options_.timeout).IgnoreError();
  ag_stream_->Synchronize(options_.timeout).IgnoreError();
  if (host_stream_ != nullptr) host_stream_->Synchronize(options_.timeout).IgnoreError();
  rs_stream_->ClearError();
  ag_stream_->ClearError();
  if (host_stream_ != nullptr) host_stream_->ClearError();
  for (FsdpParamGroup& g : groups_) {
    g.Abandon(/*keep_unsharded=*/ParamsPersistent());
    g.ReleaseGrad();  // the streams are idle now: nothing reads it
  }
  return s;
}

StatusOr<std::vector<Tensor>> FullyShardedModel::PreForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PreForward"));
  FsdpParamGroup& g = groups_[unit];
  if (g.state() != UnitState::kIdle && g.state() != UnitState::kForwardDone) {
    return Expect(unit, UnitState::kIdle, "PreForward");
  }
  if (std::find(forward_order_.begin(), forward_order_.end(), unit) != forward_order_.end()) {
    last_forward_order_ = std::move(forward_order_);  // a new forward pass begins
    forward_order_.clear();
    all_gather_log_.clear();  // the log covers one step, so it never grows with training
  }
  forward_order_.push_back(unit);
  TraceSpan span("pre_forward " + units_[unit].name, "fsdp", rank(), 0);
  Status s = IssueAllGather(unit, false);
  if (s.ok()) s = GatherTiedOwners(unit, "PreForward");
  if (!s.ok()) return Fail(s);
  if (options_.forward_prefetch && !last_forward_order_.empty()) {
    auto it = std::find(last_forward_order_.begin(), last_forward_order_.end(), unit);
    if (it != last_forward_order_.end()) {
      s = Prefetch(std::vector<int>(it + 1, last_forward_order_.end()));
      if (!s.ok()) return Fail(s);
    }
  }
  StatusOr<std::vector<Tensor>> views = HandOutParams(unit);
  if (views.ok()) views = AppendTiedParams(unit, std::move(*views));
  if (!views.ok()) return Fail(views.status());
  g.set_state(UnitState::kForward);
  return views;
}

Status FullyShardedModel::PostForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PostForward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kForward, "PostForward"));
  groups_[unit].ClearInFlight();
  if (ReshardAfterForward()) Free(unit);
  ReleaseTiedOwners(unit);
  groups_[unit].set_state(UnitState::kForwardDone);
  return OkStatus();
}

StatusOr<UnitBackwardBuffers> FullyShardedModel::PreBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PreBackward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kForwardDone, "PreBackward"));
  FsdpParamGroup& g = groups_[unit];
  TraceSpan span("pre_backward " + units_[unit].name, "fsdp", rank(), 0);
  Status s = IssueAllGather(unit, false);
  if (s.ok()) s = GatherTiedOwners(unit, "PreBackward");
  if (!s.ok()) return Fail(s);
  g.set_state(UnitState::kBackward);  // in use: counts as in flight from here
  if (options_.backward_prefetch == BackwardPrefetch::kBackwardPre) {
    auto it = std::find(forward_order_.begin(), forward_order_.end(), unit);
    if (it != forward_order_.end()) {
      std::vector<int> next(std::make_reverse_iterator(it), forward_order_.rend());
      s = Prefetch(next);
      if (!s.ok()) return Fail(s);
    }
  }
  UnitBackwardBuffers buffers;
  StatusOr<std::vector<Tensor>> views = HandOutParams(unit);
  if (views.ok()) views = AppendTiedParams(unit, std::move(*views));
  if (!views.ok()) return Fail(views.status());
  buffers.params = std::move(*views);
  const bool kept_grad = g.has_full_grad();
  if (!kept_grad) {
    s = g.MakeFullGrad(FullGradDType(), compute_ctx_);
    if (!s.ok()) return Fail(s);
  }
  if (caller_stream_ != nullptr) {
    s = OrderCallerBeforeGradients(g.full_grad(), kept_grad);
    if (!s.ok()) return Fail(s);
  }
  // A full gradient kept from a no_sync backward keeps its dtype.
  StatusOr<std::vector<Tensor>> grads = g.GradViews();
  if (!grads.ok()) return Fail(grads.status());
  buffers.grads = std::move(*grads);
  s = AppendTiedGradients(unit, &buffers.grads);
  if (!s.ok()) return Fail(s);
  return buffers;
}

Status FullyShardedModel::PostBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PostBackward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kBackward, "PostBackward"));
  TraceSpan span("post_backward " + units_[unit].name, "fsdp", rank(), 0);
  groups_[unit].set_state(UnitState::kIdle);
  Free(unit);
  ReleaseTiedOwners(unit);
  if (options_.backward_prefetch == BackwardPrefetch::kBackwardPost) {
    auto it = std::find(forward_order_.begin(), forward_order_.end(), unit);
    if (it != forward_order_.end()) {
      Status s = Prefetch(std::vector<int>(std::make_reverse_iterator(it), forward_order_.rend()));
      if (!s.ok()) return Fail(s);
    }
  }
  if (gradient_sync_) {
    // At most one reduction in flight: the previous unit's reduce-scatter
    // overlapped this unit's gradient compute; waiting for it here bounds the
    // full gradients alive to two (this unit's and the one being reduced), so
    // a slow reduce stream cannot pile them up. Before the narrowing below,
    // so that its copy is not alive beside the previous reduction's buffers.
    Status s = fsdp_internal::WaitForReductionWork(pending_reductions_, options_.timeout);
    if (caller_stream_ != nullptr) {
      // The reduce stream reads the gradients once the caller's stream has
      // written them (an event recorded on it now); the rounding to
      // reduce_dtype then happens there too (ReduceGradients).
      if (s.ok()) s = compute_ctx_.device->WaitStream(*rs_stream_, *caller_stream_);
    } else if (s.ok()) {
      s = NarrowFullGradient(unit);
    }
    // The reduce stream reads the gradients the compute stream has produced.
    if (s.ok()) s = fsdp_internal::WaitForCompute(*comm_, *rs_stream_);
    if (s.ok()) s = ReduceGradients(unit);
    if (!s.ok()) return Fail(s);
  }
  return OkStatus();
}

Status FullyShardedModel::FinishBackward() {
  for (int u = 0; u < num_units(); ++u) {
    const UnitState state = groups_[u].state();
    if (state == UnitState::kForward || state == UnitState::kBackward) {
      return FailedPreconditionError("FinishBackward while unit '" + units_[u].name +
                                     "' is in state '" + UnitStateName(state) + "'");
    }
  }
  Status s = fsdp_internal::WaitForReductions(*comm_, pending_reductions_);
  if (s.ok()) s = CheckCallerGathers(/*block=*/true);
  // A unit no reduction reached this step (a no_sync backward, a unit the
  // model did not use) has a zero gradient: give it one to read and step.
  for (int u = 0; s.ok() && u < num_units(); ++u) {
    if (!groups_[u].has_grad()) s = groups_[u].ZeroGrad(*shard_allocator_, shard_context());
  }
  if (!s.ok()) return Fail(s);
  return OkStatus();
}

StatusOr<double> FullyShardedModel::ClipGradNorm(double max_norm, NormType type) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm)) {
    return InvalidArgumentError("max_norm must be finite and >= 0 (0 = only compute the norm)");
  }
  if (type != NormType::kL2 && type != NormType::kInf) return InvalidArgumentError("unknown norm type");
  SK_RETURN_IF_ERROR(FinishBackward());
  std::vector<Tensor> grads;
  for (const FsdpParamGroup& g : groups_) grads.push_back(g.grad());
  SK_ASSIGN_OR_RETURN(double partial, LocalGradNormPartial(shard_context(), grads, type));
  // Replicas hold identical shards: combine over the shard group only.
  comm::ProcessGroup& g = *shard_group_;
  double combined = partial;
  if (g.size() > 1) {
    comm::CollectiveOptions co;
    co.timeout = options_.timeout;
    SK_ASSIGN_OR_RETURN(Tensor mine, activation_allocator_->Empty(DType::kF32, Shape{1}));
    SK_ASSIGN_OR_RETURN(Tensor all, activation_allocator_->Empty(DType::kF32, Shape{g.size()}));
    // Send the partial as f32: its relative error (1e-7) is far below any use.
    SK_RETURN_IF_ERROR(ops::Fill(compute_ctx_, mine, static_cast<float>(partial)));
    SK_ASSIGN_OR_RETURN(auto w, g.all_gather(all, mine, *compute_stream_, co));
    SK_RETURN_IF_ERROR(w->wait(options_.timeout).WithContext("clip_grad_norm"));
    // One read of the group's partials (a round trip per rank cost a device
    // synchronisation each: g.size() of them per step), summed in rank order.
    SK_ASSIGN_OR_RETURN(std::vector<double> partials, ops::ReadValues(compute_ctx_, all));
    combined = 0;
    for (double v : partials) combined = type == NormType::kL2 ? combined + v : std::max(combined, v);
  }
  double norm = FinishGradNorm(combined, type);
  if (max_norm > 0) {
    SK_RETURN_IF_ERROR(ClipGradientsToNorm(shard_context(), grads, norm, max_norm).status());
  }
  return norm;
}

Status FullyShardedModel::ScaleGradients(float factor) {
  SK_RETURN_IF_ERROR(FinishBackward());
  std::vector<Tensor> grads;
  for (const FsdpParamGroup& g : groups_) grads.push_back(g.grad());
  return sk::ScaleGradients(shard_context(), grads, factor);
}

Status FullyShardedModel::OptimizerStep(Optimizer& optimizer) {
  SK_RETURN_IF_ERROR(BeginMasterUpdate());
  std::vector<ShardRef> refs;
  for (int u = 0; u < num_units(); ++u) {
    refs.push_back(ShardRef{u, groups_[u].master(), groups_[u].grad()});
  }
  SK_RETURN_IF_ERROR(optimizer.Step(shard_context(), refs));
  return EndMasterUpdate();
}

Status FullyShardedModel::PrepareOptimizer(Optimizer& optimizer) {
  SK_RETURN_IF_ERROR(BeginMasterUpdate());
  for (int u = 0; u < num_units(); ++u) {
    SK_RETURN_IF_ERROR(optimizer.SlotState(shard_context(), u, groups_[u].master().numel()).status());
  }
  return OkStatus();
}

Status FullyShardedModel::BeginMasterUpdate() {
  SK_RETURN_IF_ERROR(FinishBackward());
  return QuiesceMasterReaders();
}

Status FullyShardedModel::EndMasterUpdate() {
  if (host_stream_ != nullptr) {
    // The host steps synchronously (the driving thread runs the optimizer):
    // on a host stream (sim), the caller waits for it.
    SK_RETURN_IF_ERROR(host_stream_->Synchronize(options_.timeout).WithContext("host optimizer step"));
  }
  masters_written_ = true;
  if (ParamsPersistent()) {
    // The full parameters are stale: gather the updated shards. A failure
    // (this rank out of memory for a unit's buffer, a peer's published
    // failure) leaves the update applied and the full parameters stale on
    // some units: they are all dropped, and the next forward gathers them.
    // The callers agree on this outcome (UpdateEndsWithFallibleWork), so
    // every rank drops them alike.
    Status s;
    for (int u = 0; s.ok() && u < num_units(); ++u) {
      groups_[u].Reshard();
      s = IssueAllGather(u, false).WithContext("all-gather of unit '" + units_[u].name + "'");
    }
    for (int u = 0; s.ok() && u < num_units(); ++u) s = WaitAndViews(u).status();
    if (!s.ok()) {
      AbandonAfterUpdate();
      return s.WithContext("regathering the parameters after the optimizer update");
    }
  } else {
    // SHARD_GRAD_OP kept units unsharded after a forward-only pass: refresh.
    for (int u = 0; u < num_units(); ++u) {
      if (groups_[u].unsharded()) Free(u);
      groups_[u].set_state(UnitState::kIdle);
    }
  }
  return OkStatus();
}

bool FullyShardedModel::UpdateEndsWithFallibleWork() const { return ParamsPersistent(); }

void FullyShardedModel::AbandonAfterUpdate() {
  Fail(OkStatus()).IgnoreError();
  if (!ParamsPersistent()) return;
  for (FsdpParamGroup& g : groups_) g.Reshard();
  masters_written_ = true;  // the next all-gather reads the updated masters after the update
}

void FullyShardedModel::ZeroGrad() {
  fsdp_internal::WaitForReductions(*comm_, pending_reductions_).IgnoreError();
  // Valid operands on an idle reduce stream: these fills cannot fail.
  for (FsdpParamGroup& g : groups_) {
    // Its block is reused in stream order: after the compute stream's
    // reading (the optimizer step; the block is from its pool, or host
    // memory with offload, read by the synchronous host), and after the
    // reduce stream's writing (recorded there when it was allocated).
    g.ReleaseGrad();
    if (!g.has_full_grad()) continue;
    if (!ParamsPersistent()) {
      g.DropFullGrad();  // recorded on a caller stream: reused after it
    } else if (caller_stream_ != nullptr) {
      // The caller's stream may still write it: zero it in that order, on
      // the reduce stream (which the next backward's caller stream waits for).
      Tensor full_grad = g.full_grad();
      compute_ctx_.device->WaitStream(*rs_stream_, *caller_stream_).IgnoreError();
      OnStream(rs_ctx_, [full_grad](const ops::OpContext& c) { return ops::Fill(c, full_grad, 0.f); })
          .IgnoreError();
    } else {
      ops::Fill(compute_ctx_, g.full_grad(), 0.f).IgnoreError();
    }
  }
}

}  // namespace sk
