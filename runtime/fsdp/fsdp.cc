#include "runtime/fsdp/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>

#include "runtime/core/trace.h"
#include "runtime/ops/init.h"
#include "runtime/ops/ops.h"

namespace sk {

namespace {

int64_t Bytes(const Tensor& t) { return static_cast<int64_t>(t.nbytes()); }

// Issues `op` with ctx on ctx.stream, from the thread that drives the model.
// CPU ops run on the thread that plays their stream, so on cpu the op runs
// in a closure on the stream's worker, in order with the collectives there;
// other kinds (cuda enqueues, sim prices) take it from this thread directly.
// The closure keeps what `op` captured alive until it has run.
Status OnStream(const ops::OpContext& ctx, std::function<Status(const ops::OpContext&)> op) {
  if (ctx.device->id().is_cpu()) {
    return ctx.stream->Enqueue([ctx, op = std::move(op)]() { return op(ctx); });
  }
  return op(ctx);
}

// The elements [offset, offset + n) of a 1-D tensor of `t`'s dtype.
StatusOr<Tensor> Slice(const Tensor& t, int64_t offset, int64_t n) {
  return t.View(static_cast<size_t>(offset) * DTypeSize(t.dtype()), t.dtype(), Shape{n});
}

}  // namespace

const char* BackwardPrefetchName(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::kNone: return "NONE";
    case BackwardPrefetch::kBackwardPre: return "BACKWARD_PRE";
    case BackwardPrefetch::kBackwardPost: return "BACKWARD_POST";
  }
  return "UNKNOWN";
}

StatusOr<BackwardPrefetch> ParseBackwardPrefetch(const std::string& name) {
  std::string n;
  for (char c : name) n.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  for (BackwardPrefetch p : {BackwardPrefetch::kNone, BackwardPrefetch::kBackwardPre,
                             BackwardPrefetch::kBackwardPost}) {
    if (n == BackwardPrefetchName(p)) return p;
  }
  return InvalidArgumentError("unknown backward prefetch '" + name +
                              "' (NONE, BACKWARD_PRE, BACKWARD_POST)");
}

Status ValidateFsdpOptions(const FsdpOptions& o, int world) {
  SK_RETURN_IF_ERROR(ResolveSharding(o.strategy, o.shard_group_size, world, o.ranks_per_node).status());
  switch (o.backward_prefetch) {
    case BackwardPrefetch::kNone:
    case BackwardPrefetch::kBackwardPre:
    case BackwardPrefetch::kBackwardPost:
      break;
    default:
      return InvalidArgumentError("unknown backward prefetch value " +
                                  std::to_string(static_cast<int>(o.backward_prefetch)));
  }
  SK_RETURN_IF_ERROR(ValidateRateLimit(o.all_gather_limit, "all_gather_limit"));
  const MixedPrecisionPolicy& mp = o.mixed_precision;
  SK_RETURN_IF_ERROR(ValidateDType(mp.param_dtype).WithContext("mixed_precision.param_dtype"));
  if (mp.reduce_dtype) {
    SK_RETURN_IF_ERROR(ValidateDType(*mp.reduce_dtype).WithContext("mixed_precision.reduce_dtype"));
  }
  if (!(o.gradient_predivide_factor >= 0) || !std::isfinite(o.gradient_predivide_factor)) {
    return InvalidArgumentError("gradient_predivide_factor must be finite and >= 0 (0 = automatic)");
  }
  if (o.timeout.count() <= 0) return InvalidArgumentError("timeout must be positive");
  if (o.timeout > kMaxTimeout) {
    return InvalidArgumentError("timeout " + std::to_string(o.timeout.count()) + " ms exceeds the maximum of " +
                                std::to_string(kMaxTimeout.count()) + " ms (7 days)");
  }
  return OkStatus();
}

FullyShardedModel::FullyShardedModel(std::vector<UnitSpec> units, comm::ProcessGroup* world,
                                     CachingAllocator* allocator, Allocator* offload,
                                     Stream* host_stream, const FsdpOptions& options)
    : units_(std::move(units)), world_(world), allocator_(allocator), offload_(offload),
      host_stream_(host_stream), options_(options) {}

FullyShardedModel::~FullyShardedModel() {
  // Outstanding reductions hold buffers from our allocators: let them finish.
  for (auto& r : pending_reductions_) {
    if (r.work) r.work->wait(options_.timeout).IgnoreError();
  }
  if (rs_stream_) rs_stream_->Synchronize(options_.timeout).IgnoreError();
  if (ag_stream_) ag_stream_->Synchronize(options_.timeout).IgnoreError();
  if (host_stream_) host_stream_->Synchronize(options_.timeout).IgnoreError();
  flat_.clear();
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
    if (host_stream == nullptr && !host.is_cpu()) {
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
  return options_.mixed_precision.reduce_dtype.value_or(options_.mixed_precision.param_dtype);
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
    Allocator* temporaries = offload_->device().is_cpu() ? &HostAllocator::Default() : offload_;
    host_ctx_ = ops::OpContext{host, host_stream_, temporaries};
  }
  Allocator& shard_alloc = options_.cpu_offload ? *offload_ : *activation_allocator_;
  const ops::OpContext& shard_ctx = shard_context();

  const int shard_rank = shard_group_->rank();
  flat_.resize(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    std::vector<std::pair<std::string, Shape>> params;
    for (const ParamSpec& p : units_[u].params) params.emplace_back(p.name, p.shape);
    SK_ASSIGN_OR_RETURN(flat_[u].layout, FlatParamLayout::Make(params, sharding_.shard_size()));
    const FlatParamLayout& layout = flat_[u].layout;
    SK_ASSIGN_OR_RETURN(flat_[u].master, shard_alloc.Empty(DType::kF32, Shape{layout.shard_numel()}));
    SK_ASSIGN_OR_RETURN(flat_[u].grad, shard_alloc.Empty(DType::kF32, Shape{layout.shard_numel()}));
    SK_RETURN_IF_ERROR(ops::Fill(shard_ctx, flat_[u].master, 0.f));
    SK_RETURN_IF_ERROR(ops::Fill(shard_ctx, flat_[u].grad, 0.f));
    // Deferred initialisation: only this rank's slices are ever computed.
    for (const auto& s : layout.ShardSlices(shard_rank)) {
      const ParamSpec& spec = units_[u].params[s.param];
      SK_ASSIGN_OR_RETURN(Tensor slice, Slice(flat_[u].master, s.shard_offset, s.param_end - s.param_begin));
      SK_RETURN_IF_ERROR(ops::InitPhilox(shard_ctx, spec.init, options_.seed,
                                         ParamIdFromName(FullParamName(units_[u], spec)),
                                         s.param_begin, slice));
    }
  }
  if (options_.cpu_offload) {
    int64_t largest = 0;
    for (const FlatUnit& f : flat_) largest = std::max(largest, f.layout.shard_numel());
    const DType rdt = ReduceDType();
    SK_ASSIGN_OR_RETURN(grad_staging_, offload_->Empty(rdt, Shape{largest}));
  }
  if (ParamsPersistent()) {
    for (int u = 0; u < num_units(); ++u) SK_RETURN_IF_ERROR(Regather(u));
  }
  TraceRecorder::Global().NameProcess(r, "rank " + std::to_string(r));
  // The hooks' spans (track 0; stream tracks start at 1) in wall-clock time:
  // not on the simulator, whose tracks run in virtual time.
  if (!allocator_->device().is_sim()) {
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
  if (flat_[unit].state != want) {
    return FailedPreconditionError(std::string(call) + " of unit '" + units_[unit].name + "' (" +
                                   std::to_string(unit) + ") in state '" +
                                   UnitStateName(flat_[unit].state) + "', expected '" +
                                   UnitStateName(want) + "'");
  }
  return OkStatus();
}

int FullyShardedModel::UnshardedAlive() const {
  if (ParamsPersistent()) return 0;
  int alive = 0;
  for (const FlatUnit& f : flat_) {
    if (f.full.defined() && f.in_flight) ++alive;
  }
  return alive;
}

Status FullyShardedModel::WaitForCompute(Stream& waiter) {
  Device& device = *compute_ctx_.device;
  if (device.id().is_cpu()) return OkStatus();
  SK_RETURN_IF_ERROR(device.WaitStream(waiter, *compute_stream_));
  // A host stream on the device (sim) orders the host's writes the same way.
  if (host_stream_ != nullptr && host_stream_->device() == device.id()) {
    SK_RETURN_IF_ERROR(device.WaitStream(waiter, *host_stream_));
  }
  return OkStatus();
}

Status FullyShardedModel::CopyMasterIn(const FlatUnit& f, const Tensor& input) {
  Device& device = *ag_ctx_.device;
  const Tensor master = f.master;
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

Status FullyShardedModel::AccumulateReduced(const FlatUnit& f, const Tensor& reduced) {
  Tensor grad = f.grad;
  if (!options_.cpu_offload) {
    return OnStream(rs_ctx_, [grad, reduced](const ops::OpContext& c) {
      return ops::Axpy(c, 1.f, reduced, grad);
    });
  }
  SK_ASSIGN_OR_RETURN(Tensor staged, Slice(grad_staging_, 0, reduced.numel()));
  SK_RETURN_IF_ERROR(rs_ctx_.device->CopyAsync(staged.data(), reduced.data(), reduced.nbytes(), *rs_stream_)
                         .WithContext("copying the reduced gradient shard to the host"));
  if (host_stream_ == nullptr) {
    // The host accumulates when the reduce stream reaches this point (a
    // closure on the stream: its worker on cpu, a driver thread on cuda).
    ops::OpContext host = host_ctx_;
    if (rs_ctx_.device->id().is_cpu()) {
      // As every cpu closure: `reduced` lives until the stream has read it.
      return rs_stream_->Enqueue([host, staged, grad, reduced]() {
        return ops::Axpy(host, 1.f, staged, grad);
      });
    }
    // cuda: `reduced` is the reduce stream's (stream-ordered reuse), and a
    // driver-thread closure must not free device memory (no CUDA calls there).
    return rs_stream_->Enqueue([host, staged, grad]() { return ops::Axpy(host, 1.f, staged, grad); });
  }
  // A host stream (sim): it waits for the copy, then accumulates.
  SK_RETURN_IF_ERROR(host_ctx_.device->WaitStream(*host_stream_, *rs_stream_));
  return ops::Axpy(host_ctx_, 1.f, staged, grad);
}

Status FullyShardedModel::QuiesceMasterReaders() {
  if (!options_.cpu_offload) return OkStatus();
  return ag_stream_->Synchronize(options_.timeout)
      .WithContext("waiting for the all-gather stream before the host writes master shards");
}

Status FullyShardedModel::WriteMaster(const Tensor& src, const Tensor& dst) {
  if (!options_.cpu_offload) return ops::Copy(compute_ctx_, src, dst);
  SK_RETURN_IF_ERROR(QuiesceMasterReaders());
  if (src.device().is_cpu() || src.device().kind == host_ctx_.device->id().kind) {
    return ops::Copy(host_ctx_, src, dst);
  }
  // A device tensor into host memory: copied by the compute stream, waited for.
  SK_RETURN_IF_ERROR(ops::Copy(compute_ctx_, src, dst));
  return compute_stream_->Synchronize(options_.timeout).WithContext("copying into a master shard");
}

Status FullyShardedModel::IssueAllGather(int unit, bool prefetch) {
  FlatUnit& f = flat_[unit];
  if (f.full.defined()) {
    f.in_flight = true;  // about to be computed with (kept unsharded, or prefetched)
    return OkStatus();
  }
  const RateLimit limit = options_.all_gather_limit;
  if (prefetch && !limit.off() && UnshardedAlive() >= limit.max_in_flight()) {
    ++counters_.prefetches_deferred;
    return OkStatus();
  }
  const DType dt = options_.mixed_precision.param_dtype;
  const int64_t shard = f.layout.shard_numel();
  if (masters_written_) {
    SK_RETURN_IF_ERROR(WaitForCompute(*ag_stream_));
    masters_written_ = false;
  }
  SK_ASSIGN_OR_RETURN(Tensor full, ag_allocator_->Empty(dt, Shape{f.layout.padded_numel()}));
  if (!compute_ctx_.device->id().is_cpu()) {
    // The compute stream reads it: its block returns to the all-gather
    // stream's pool only once that reading is done (record_stream).
    SK_RETURN_IF_ERROR(allocator_->RecordStream(*full.storage(), compute_stream_.get()));
  }
  const size_t offset = static_cast<size_t>(shard_group_->rank() * shard) * DTypeSize(dt);
  SK_ASSIGN_OR_RETURN(Tensor input, full.View(offset, dt, Shape{shard}));
  // Cast (with offload: copy in, then cast) the master shard on the
  // all-gather stream, in stream order before the collective reads it.
  if (options_.cpu_offload) {
    SK_RETURN_IF_ERROR(CopyMasterIn(f, input));
  } else {
    Tensor master = f.master;
    SK_RETURN_IF_ERROR(OnStream(ag_ctx_, [master, input](const ops::OpContext& c) {
      return ops::Cast(c, master, input);
    }));
  }
  comm::CollectiveOptions co;
  co.timeout = options_.timeout;
  SK_ASSIGN_OR_RETURN(f.gather_work, shard_group_->all_gather(full, input, *ag_stream_, co));
  f.full = std::move(full);
  f.in_flight = true;
  ++counters_.all_gathers;
  counters_.all_gather_bytes += Bytes(f.full);
  if (prefetch) ++counters_.prefetches;
  all_gather_log_.push_back(unit);
  counters_.max_unsharded_alive = std::max(counters_.max_unsharded_alive, UnshardedAlive());
  return OkStatus();
}

StatusOr<std::vector<Tensor>> FullyShardedModel::WaitAndViews(int unit, const Tensor& full) {
  FlatUnit& f = flat_[unit];
  if (f.gather_work) {
    Status s = f.gather_work->wait(options_.timeout);
    if (!s.ok()) return s.WithContext("all-gather of unit '" + units_[unit].name + "'");
    f.gather_work.reset();
  }
  const DType dt = options_.mixed_precision.param_dtype;
  std::vector<Tensor> views;
  for (const auto& p : f.layout.params()) {
    SK_ASSIGN_OR_RETURN(Tensor v, full.View(static_cast<size_t>(p.offset) * DTypeSize(dt), dt, p.shape));
    views.push_back(std::move(v));
  }
  return views;
}

StatusOr<std::vector<Tensor>> FullyShardedModel::HandOutParams(int unit) {
  FlatUnit& f = flat_[unit];
  if (caller_stream_ == nullptr) return WaitAndViews(unit, f.full);
  SK_RETURN_IF_ERROR(CheckCallerGathers(/*block=*/false));
  if (f.gather_work) {
    // The caller's kernels read the views after the all-gather, in stream
    // order; its outcome is checked once it has completed.
    SK_RETURN_IF_ERROR(caller_stream_->WaitEvent(f.gather_work->event()));
    caller_gathers_.emplace_back(unit, std::move(f.gather_work));
    f.gather_work.reset();
  }
  // Freed (PostForward, PostBackward, a refresh), the block is reused only
  // once the caller's stream has read it (record_stream).
  SK_RETURN_IF_ERROR(allocator_->RecordStream(*f.full.storage(), caller_stream_));
  return WaitAndViews(unit, f.full);  // nothing left to wait for: the views
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

Status FullyShardedModel::Regather(int unit) {
  flat_[unit].full = Tensor();
  SK_RETURN_IF_ERROR(IssueAllGather(unit, false));
  return WaitAndViews(unit, flat_[unit].full).status();
}

void FullyShardedModel::Free(int unit) {
  flat_[unit].in_flight = false;
  if (ParamsPersistent()) return;
  flat_[unit].full = Tensor();
  flat_[unit].gather_work.reset();
}

Status FullyShardedModel::Prefetch(const std::vector<int>& candidates) {
  for (int c : candidates) {
    if (flat_[c].full.defined()) continue;  // in flight already, or kept unsharded
    const RateLimit limit = options_.all_gather_limit;
    if (!limit.off() && UnshardedAlive() >= limit.max_in_flight()) {
      ++counters_.prefetches_deferred;
      return OkStatus();
    }
    SK_RETURN_IF_ERROR(IssueAllGather(c, true));
  }
  return OkStatus();
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
  for (int u = 0; u < num_units(); ++u) {
    FlatUnit& f = flat_[u];
    f.state = UnitState::kIdle;
    f.in_flight = false;
    if (!ParamsPersistent()) {
      f.full = Tensor();
      f.gather_work.reset();
    }
    f.full_grad = Tensor();
    // The streams are idle now: zeroing on the shards' context cannot race.
    ops::Fill(shard_context(), f.grad, 0.f).IgnoreError();  // valid operands: cannot fail
  }
  return s;
}

Status FullyShardedModel::GatherTiedOwners(int unit, const char* call) {
  for (int o : tied_owners_[unit]) {
    if (flat_[o].state != UnitState::kForwardDone) {
      return FailedPreconditionError(std::string(call) + " of unit '" + units_[unit].name +
                                     "' uses tied parameters of unit '" + units_[o].name + "', which is in state '" +
                                     UnitStateName(flat_[o].state) + "' (expected '" +
                                     UnitStateName(UnitState::kForwardDone) + "': it runs first)");
    }
    SK_RETURN_IF_ERROR(IssueAllGather(o, false));
  }
  return OkStatus();
}

StatusOr<std::vector<Tensor>> FullyShardedModel::AppendTiedParams(int unit, std::vector<Tensor> views) {
  for (const ParamRef& t : tied_[unit]) {
    SK_ASSIGN_OR_RETURN(std::vector<Tensor> owner, HandOutParams(t.unit));
    views.push_back(std::move(owner[t.param]));
  }
  return views;
}

Status FullyShardedModel::AppendTiedGradients(int unit, std::vector<Tensor>* grads) {
  for (int o : tied_owners_[unit]) {
    FlatUnit& owner = flat_[o];
    const bool kept = owner.full_grad.defined();
    if (!kept) {
      // The owner's unsharded gradient, made now and kept until the owner's
      // own backward has added to it and PostBackward reduces the sum.
      SK_ASSIGN_OR_RETURN(owner.full_grad,
                          activation_allocator_->Empty(FullGradDType(), Shape{owner.layout.padded_numel()}));
      SK_RETURN_IF_ERROR(ops::Fill(compute_ctx_, owner.full_grad, 0.f));
    }
    if (caller_stream_ != nullptr) SK_RETURN_IF_ERROR(OrderCallerBeforeGradients(owner.full_grad, kept));
  }
  for (const ParamRef& t : tied_[unit]) {
    const FlatUnit& owner = flat_[t.unit];
    const DType gdt = owner.full_grad.dtype();
    const auto& p = owner.layout.params()[t.param];
    SK_ASSIGN_OR_RETURN(Tensor v, owner.full_grad.View(static_cast<size_t>(p.offset) * DTypeSize(gdt), gdt, p.shape));
    grads->push_back(std::move(v));
  }
  return OkStatus();
}

void FullyShardedModel::ReleaseTiedOwners(int unit) {
  for (int o : tied_owners_[unit]) {
    flat_[o].in_flight = false;
    // Resharded after its own forward: gathered for this use only.
    if (ReshardAfterForward()) Free(o);
  }
}

StatusOr<std::vector<Tensor>> FullyShardedModel::PreForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PreForward"));
  FlatUnit& f = flat_[unit];
  if (f.state != UnitState::kIdle && f.state != UnitState::kForwardDone) {
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
  f.state = UnitState::kForward;
  return views;
}

Status FullyShardedModel::PostForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PostForward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kForward, "PostForward"));
  flat_[unit].in_flight = false;
  if (ReshardAfterForward()) Free(unit);
  ReleaseTiedOwners(unit);
  flat_[unit].state = UnitState::kForwardDone;
  return OkStatus();
}

StatusOr<UnitBackwardBuffers> FullyShardedModel::PreBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PreBackward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kForwardDone, "PreBackward"));
  FlatUnit& f = flat_[unit];
  TraceSpan span("pre_backward " + units_[unit].name, "fsdp", rank(), 0);
  Status s = IssueAllGather(unit, false);
  if (s.ok()) s = GatherTiedOwners(unit, "PreBackward");
  if (!s.ok()) return Fail(s);
  f.state = UnitState::kBackward;  // in use: counts as in flight from here
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
  const bool kept_grad = f.full_grad.defined();
  if (!kept_grad) {
    StatusOr<Tensor> g = activation_allocator_->Empty(FullGradDType(), Shape{f.layout.padded_numel()});
    if (!g.ok()) return Fail(g.status());
    Status z = ops::Fill(compute_ctx_, *g, 0.f);
    if (!z.ok()) return Fail(z);
    f.full_grad = std::move(*g);
  }
  if (caller_stream_ != nullptr) {
    s = OrderCallerBeforeGradients(f.full_grad, kept_grad);
    if (!s.ok()) return Fail(s);
  }
  // A full gradient kept from a no_sync backward keeps its dtype.
  const DType gdt = f.full_grad.dtype();
  for (const auto& p : f.layout.params()) {
    StatusOr<Tensor> v = f.full_grad.View(static_cast<size_t>(p.offset) * DTypeSize(gdt), gdt, p.shape);
    if (!v.ok()) return Fail(v.status());
    buffers.grads.push_back(std::move(*v));
  }
  s = AppendTiedGradients(unit, &buffers.grads);
  if (!s.ok()) return Fail(s);
  return buffers;
}

Status FullyShardedModel::PostBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PostBackward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kBackward, "PostBackward"));
  TraceSpan span("post_backward " + units_[unit].name, "fsdp", rank(), 0);
  flat_[unit].state = UnitState::kIdle;
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
    Status s = WaitPendingReductionWork();
    if (caller_stream_ != nullptr) {
      // The reduce stream reads the gradients once the caller's stream has
      // written them (an event recorded on it now); the rounding to
      // reduce_dtype then happens there too (ReduceGradients).
      if (s.ok()) s = compute_ctx_.device->WaitStream(*rs_stream_, *caller_stream_);
    } else if (s.ok()) {
      s = NarrowFullGradient(unit);
    }
    // The reduce stream reads the gradients the compute stream has produced.
    if (s.ok()) s = WaitForCompute(*rs_stream_);
    if (s.ok()) s = ReduceGradients(unit);
    if (!s.ok()) return Fail(s);
  }
  return OkStatus();
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

Status FullyShardedModel::OrderCallerBeforeGradients(const Tensor& full_grad, bool kept) {
  Device& device = *compute_ctx_.device;
  // A kept gradient buffer (no_sync, or the persistent strategies') may
  // still be read or zeroed by the reduce stream.
  if (kept) SK_RETURN_IF_ERROR(device.WaitStream(*caller_stream_, *rs_stream_));
  // cuda, sim: the zeroing of a new one is on the compute stream (on cpu the
  // calling thread has done it).
  if (!device.id().is_cpu()) SK_RETURN_IF_ERROR(device.WaitStream(*caller_stream_, *compute_stream_));
  return allocator_->RecordStream(*full_grad.storage(), caller_stream_);
}

Status FullyShardedModel::NarrowFullGradient(int unit) {
  FlatUnit& f = flat_[unit];
  const DType rdt = ReduceDType();
  if (!f.full_grad.defined() || f.full_grad.dtype() != DType::kF32 || rdt == DType::kF32 ||
      ParamsPersistent()) {
    return OkStatus();
  }
  SK_ASSIGN_OR_RETURN(Tensor narrow, activation_allocator_->Empty(rdt, f.full_grad.shape()));
  SK_RETURN_IF_ERROR(ops::Cast(compute_ctx_, f.full_grad, narrow));
  f.full_grad = std::move(narrow);  // the f32 gradient is free for the next unit
  return OkStatus();
}

Status FullyShardedModel::ReduceGradients(int unit) {
  FlatUnit& f = flat_[unit];
  const DType gdt = f.full_grad.dtype();
  const DType rdt = ReduceDType();
  const int64_t shard = f.layout.shard_numel();
  const int64_t padded = f.layout.padded_numel();
  Tensor full_grad = f.full_grad;
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
      comm::ReduceOptions ro;
      ro.op = comm::ReduceOp::kSum;
      ro.pre_scale = pre_scale_;
      ro.post_scale = post_scale_;
      ro.timeout = options_.timeout;
      SK_ASSIGN_OR_RETURN(last, replicate_group_->all_reduce(reduced, *rs_stream_, ro));
      ++counters_.all_reduces;
      counters_.all_reduce_bytes += Bytes(reduced);
      counters_.replica_bytes += Bytes(reduced);
    }
  } else {
    SK_ASSIGN_OR_RETURN(reduced, rs_allocator_->Empty(rdt, Shape{shard}));
    comm::ReduceOptions ro;
    ro.op = comm::ReduceOp::kSum;
    ro.pre_scale = pre_scale_;
    ro.post_scale = replicate_group_ ? 1.f : post_scale_;
    ro.timeout = options_.timeout;
    SK_ASSIGN_OR_RETURN(last, shard_group_->reduce_scatter(reduced, input, *rs_stream_, ro));
    ++counters_.reduce_scatters;
    counters_.reduce_scatter_bytes += Bytes(input);
    if (replicate_group_) {
      comm::ReduceOptions ar;
      ar.op = comm::ReduceOp::kSum;
      ar.post_scale = post_scale_;
      ar.timeout = options_.timeout;
      SK_ASSIGN_OR_RETURN(last, replicate_group_->all_reduce(reduced, *rs_stream_, ar));
      ++counters_.all_reduces;
      counters_.all_reduce_bytes += Bytes(reduced);
      counters_.replica_bytes += Bytes(reduced);
    }
  }
  // Accumulate into the f32 gradient shard (widening from reduce_dtype), in
  // stream order after the reduction (on the host with offload).
  SK_RETURN_IF_ERROR(AccumulateReduced(f, reduced));
  if (ParamsPersistent()) {
    // SHARD_OPTIM and NO_SHARD keep their full gradient: clear it once read.
    SK_RETURN_IF_ERROR(OnStream(rs_ctx_, [full_grad](const ops::OpContext& c) {
      return ops::Fill(c, full_grad, 0.f);
    }));
  } else {
    f.full_grad = Tensor();  // the reduce stream's closures keep it alive until read
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, rs_ctx_.device->CreateEvent());
  SK_RETURN_IF_ERROR(done->Record(*rs_stream_));
  pending_reductions_.push_back(PendingReduction{std::move(last), std::move(done)});
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

Status FullyShardedModel::FinishBackward() {
  for (int u = 0; u < num_units(); ++u) {
    if (flat_[u].state == UnitState::kForward || flat_[u].state == UnitState::kBackward) {
      return FailedPreconditionError("FinishBackward while unit '" + units_[u].name +
                                     "' is in state '" + UnitStateName(flat_[u].state) + "'");
    }
  }
  Status s = WaitPendingReductions();
  if (s.ok()) s = CheckCallerGathers(/*block=*/true);
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
  for (const FlatUnit& f : flat_) grads.push_back(f.grad);
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
  for (const FlatUnit& f : flat_) grads.push_back(f.grad);
  return sk::ScaleGradients(shard_context(), grads, factor);
}

Status FullyShardedModel::OptimizerStep(Optimizer& optimizer) {
  SK_RETURN_IF_ERROR(BeginMasterUpdate());
  std::vector<ShardRef> refs;
  for (int u = 0; u < num_units(); ++u) {
    refs.push_back(ShardRef{u, flat_[u].master, flat_[u].grad});
  }
  SK_RETURN_IF_ERROR(optimizer.Step(shard_context(), refs));
  return EndMasterUpdate();
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
    // The full parameters are stale: gather the updated shards.
    for (int u = 0; u < num_units(); ++u) {
      flat_[u].full = Tensor();
      SK_RETURN_IF_ERROR(IssueAllGather(u, false));
    }
    for (int u = 0; u < num_units(); ++u) {
      StatusOr<std::vector<Tensor>> v = WaitAndViews(u, flat_[u].full);
      if (!v.ok()) return Fail(v.status());
    }
  } else {
    // SHARD_GRAD_OP kept units unsharded after a forward-only pass: refresh.
    for (int u = 0; u < num_units(); ++u) {
      if (flat_[u].full.defined()) Free(u);
      flat_[u].state = UnitState::kIdle;
    }
  }
  return OkStatus();
}

void FullyShardedModel::ZeroGrad() {
  WaitPendingReductions().IgnoreError();
  // Valid operands on an idle reduce stream: these fills cannot fail.
  for (FlatUnit& f : flat_) {
    ops::Fill(shard_context(), f.grad, 0.f).IgnoreError();
    if (!f.full_grad.defined()) continue;
    if (!ParamsPersistent()) {
      f.full_grad = Tensor();  // recorded on a caller stream: reused after it
    } else if (caller_stream_ != nullptr) {
      // The caller's stream may still write it: zero it in that order, on
      // the reduce stream (which the next backward's caller stream waits for).
      Tensor g = f.full_grad;
      compute_ctx_.device->WaitStream(*rs_stream_, *caller_stream_).IgnoreError();
      OnStream(rs_ctx_, [g](const ops::OpContext& c) { return ops::Fill(c, g, 0.f); }).IgnoreError();
    } else {
      ops::Fill(compute_ctx_, f.full_grad, 0.f).IgnoreError();
    }
  }
}

StatusOr<Tensor> FullyShardedModel::GatherFullParam(int unit, int param) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "GatherFullParam"));
  const FlatUnit& f = flat_[unit];
  if (param < 0 || param >= static_cast<int>(f.layout.params().size())) {
    return InvalidArgumentError("parameter index " + std::to_string(param) + " out of range for unit '" +
                                units_[unit].name + "'");
  }
  const int64_t shard = f.layout.shard_numel();
  SK_ASSIGN_OR_RETURN(Tensor full, ag_allocator_->Empty(DType::kF32, Shape{f.layout.padded_numel()}));
  SK_ASSIGN_OR_RETURN(Tensor input, Slice(full, shard_group_->rank() * shard, shard));
  const auto& p = f.layout.params()[param];
  SK_ASSIGN_OR_RETURN(Tensor out, HostAllocator::Default().Empty(DType::kF32, p.shape));
  SK_ASSIGN_OR_RETURN(Tensor src, full.View(static_cast<size_t>(p.offset) * 4, DType::kF32, p.shape));
  // Copy in, gather and copy out to the host, all in all-gather stream order,
  // after every update of the master shard enqueued so far.
  SK_RETURN_IF_ERROR(WaitForCompute(*ag_stream_));
  Tensor master = f.master;
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

Status FullyShardedModel::LoadFullParams(int unit, const std::vector<Tensor>& params) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadFullParams"));
  FlatUnit& f = flat_[unit];
  const auto& specs = f.layout.params();
  if (params.size() != specs.size()) {
    return InvalidArgumentError("unit '" + units_[unit].name + "' has " + std::to_string(specs.size()) +
                                " parameters, got " + std::to_string(params.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (params[i].dtype() != DType::kF32 || params[i].shape() != specs[i].shape) {
      return InvalidArgumentError("parameter '" + units_[unit].name + "." + specs[i].name + "' must be f32" +
                                  specs[i].shape.ToString() + ", got " + params[i].ToString());
    }
  }
  for (const auto& s : f.layout.ShardSlices(shard_group_->rank())) {
    const int64_t n = s.param_end - s.param_begin;
    SK_ASSIGN_OR_RETURN(Tensor flat, params[s.param].Reshape(Shape{params[s.param].numel()}));
    SK_ASSIGN_OR_RETURN(Tensor src, Slice(flat, s.param_begin, n));
    SK_ASSIGN_OR_RETURN(Tensor dst, Slice(f.master, s.shard_offset, n));
    SK_RETURN_IF_ERROR(WriteMaster(src, dst));
  }
  masters_written_ = true;
  if (ParamsPersistent()) {
    SK_RETURN_IF_ERROR(Regather(unit));
  }
  return OkStatus();
}

Status FullyShardedModel::LoadFullParam(int unit, int param, const Tensor& value) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadFullParam"));
  FlatUnit& f = flat_[unit];
  const auto& specs = f.layout.params();
  if (param < 0 || static_cast<size_t>(param) >= specs.size()) {
    return OutOfRangeError("parameter " + std::to_string(param) + " out of range (unit '" + units_[unit].name +
                           "' has " + std::to_string(specs.size()) + ")");
  }
  if (value.dtype() != DType::kF32 || value.numel() != specs[param].shape.numel()) {
    return InvalidArgumentError("parameter '" + units_[unit].name + "." + specs[param].name + "' is f32" +
                                specs[param].shape.ToString() + ", got " + value.ToString());
  }
  SK_ASSIGN_OR_RETURN(Tensor flat, value.Reshape(Shape{value.numel()}));
  for (const auto& s : f.layout.ShardSlices(shard_group_->rank())) {
    if (s.param != param) continue;
    const int64_t n = s.param_end - s.param_begin;
    SK_ASSIGN_OR_RETURN(Tensor src, Slice(flat, s.param_begin, n));
    SK_ASSIGN_OR_RETURN(Tensor dst, Slice(f.master, s.shard_offset, n));
    SK_RETURN_IF_ERROR(WriteMaster(src, dst));
  }
  masters_written_ = true;
  if (ParamsPersistent()) {
    SK_RETURN_IF_ERROR(Regather(unit));
  }
  return OkStatus();
}

Status FullyShardedModel::LoadMasterShard(int unit, const Tensor& shard) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "LoadMasterShard"));
  FlatUnit& f = flat_[unit];
  if (!shard.defined() || shard.dtype() != DType::kF32 || shard.numel() != f.layout.shard_numel()) {
    return InvalidArgumentError("master shard of unit '" + units_[unit].name + "' is f32[" +
                                std::to_string(f.layout.shard_numel()) + "], got " + shard.ToString());
  }
  SK_RETURN_IF_ERROR(WriteMaster(shard, f.master).WithContext("LoadMasterShard"));
  masters_written_ = true;
  if (ParamsPersistent()) {
    SK_RETURN_IF_ERROR(Regather(unit));
  }
  return OkStatus();
}

}  // namespace sk
