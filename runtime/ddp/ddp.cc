#include "runtime/ddp/ddp.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "runtime/core/trace.h"
#include "runtime/ops/init.h"
#include "runtime/ops/ops.h"

namespace sk {

namespace {

// Every parameter starts 16 bytes into its bucket (as flat parameters do),
// so vectorised kernels see aligned rows.
constexpr int64_t kAlignElements = 16 / sizeof(float);

int64_t AlignUp(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }

}  // namespace

Status ValidateDdpOptions(const DdpOptions& o) {
  if (o.bucket_bytes <= 0) {
    return InvalidArgumentError("bucket_bytes must be > 0, got " + std::to_string(o.bucket_bytes));
  }
  if (o.first_bucket_bytes <= 0) {
    return InvalidArgumentError("first_bucket_bytes must be > 0, got " +
                                std::to_string(o.first_bucket_bytes));
  }
  if (o.compute_dtype != DType::kF32 && o.compute_dtype != DType::kBF16) {
    return InvalidArgumentError(std::string("compute_dtype must be f32 or bf16, got ") +
                                std::string(DTypeName(o.compute_dtype)));
  }
  if (!(o.gradient_predivide_factor >= 0) || !std::isfinite(o.gradient_predivide_factor)) {
    return InvalidArgumentError("gradient_predivide_factor must be finite and >= 0 (0 = automatic)");
  }
  if (o.timeout.count() <= 0) return InvalidArgumentError("timeout must be positive");
  return OkStatus();
}

DistributedDataParallel::DistributedDataParallel(std::vector<UnitSpec> units,
                                                 comm::ProcessGroup* world,
                                                 CachingAllocator* allocator,
                                                 const DdpOptions& options)
    : units_(std::move(units)), world_(world), allocator_(allocator), options_(options) {}

DistributedDataParallel::~DistributedDataParallel() {
  // In-flight reductions read and write our buckets: let them finish.
  for (Bucket& b : buckets_) {
    if (b.reduction) b.reduction->wait(options_.timeout).IgnoreError();
  }
  if (reduce_stream_) reduce_stream_->Synchronize(options_.timeout).IgnoreError();
  buckets_.clear();
}

StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::Create(
    const std::vector<UnitSpec>& units, comm::ProcessGroup* world, CachingAllocator* allocator,
    const DdpOptions& options) {
  if (world == nullptr) return InvalidArgumentError("DDP needs a process group");
  if (allocator == nullptr) return InvalidArgumentError("DDP needs a caching allocator");
  SK_RETURN_IF_ERROR(ValidateDdpOptions(options));
  if (units.empty()) return InvalidArgumentError("DDP needs at least one unit");
  for (const UnitSpec& u : units) {
    if (u.name.empty()) return InvalidArgumentError("a unit has an empty name");
    for (const ParamSpec& p : u.params) {
      const std::string full = FullParamName(u, p);
      if (p.name.empty()) return InvalidArgumentError("unit '" + u.name + "' has a parameter with an empty name");
      SK_RETURN_IF_ERROR(ValidateInitializer(p.init).WithContext("parameter '" + full + "'"));
    }
  }
  // Each parameter is declared once (two declarations would train two
  // copies); a unit that uses another's parameter declares it as tied.
  SK_ASSIGN_OR_RETURN(std::vector<std::vector<ParamRef>> tied, ResolveTiedParams(units));
  std::unique_ptr<DistributedDataParallel> d(
      new DistributedDataParallel(units, world, allocator, options));
  d->tied_ = std::move(tied);
  SK_RETURN_IF_ERROR(d->Init());
  return d;
}

Status DistributedDataParallel::Init() {
  const int n = world_->size();
  const float p = options_.gradient_predivide_factor > 0 ? options_.gradient_predivide_factor
                                                         : AutoGradientPredivideFactor(n);
  pre_scale_ = 1.f / p;
  post_scale_ = p / static_cast<float>(n);

  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(allocator_->device()));
  const std::string tag = " (rank " + std::to_string(world_->rank()) + ")";
  SK_ASSIGN_OR_RETURN(reduce_stream_, device->CreateStream("reduce" + tag));
  SK_ASSIGN_OR_RETURN(compute_stream_, device->CreateStream("compute" + tag));
  compute_allocator_ = std::make_unique<StreamAllocator>(allocator_, compute_stream_.get());
  ctx_ = ops::OpContext{device, compute_stream_.get(), compute_allocator_.get()};

  // Bucket assignment, in the order gradients become final.
  where_.resize(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) where_[u].resize(units_[u].params.size());
  int open = -1;
  for (int u = num_units() - 1; u >= 0; --u) {
    for (int i = static_cast<int>(units_[u].params.size()) - 1; i >= 0; --i) {
      if (open < 0) {
        buckets_.emplace_back();
        open = num_buckets() - 1;
      }
      Bucket& b = buckets_[open];
      const int64_t offset = AlignUp(b.numel);
      where_[u][i] = Location{open, offset};
      b.numel = offset + units_[u].params[i].shape.numel();
      ++b.num_params;
      if (b.units.empty() || b.units.back() != u) b.units.push_back(u);
      const int64_t cap = open == 0 ? std::min(options_.first_bucket_bytes, options_.bucket_bytes)
                                    : options_.bucket_bytes;
      if (b.numel * static_cast<int64_t>(sizeof(float)) >= cap) open = -1;
    }
  }

  state_.assign(units_.size(), UnitState::kIdle);
  for (Bucket& b : buckets_) {
    b.numel = AlignUp(b.numel);
    b.units_pending = static_cast<int>(b.units.size());
    SK_ASSIGN_OR_RETURN(b.params, compute_allocator_->Empty(DType::kF32, Shape{b.numel}));
    SK_ASSIGN_OR_RETURN(b.grads, compute_allocator_->Empty(DType::kF32, Shape{b.numel}));
    SK_RETURN_IF_ERROR(ops::Fill(ctx_, b.params, 0.f));
    SK_RETURN_IF_ERROR(ops::Fill(ctx_, b.grads, 0.f));
    // The reduce stream reads and writes the gradients in place.
    SK_RETURN_IF_ERROR(allocator_->RecordStream(*b.grads.storage(), reduce_stream_.get()));
    if (options_.compute_dtype != DType::kF32) {
      SK_ASSIGN_OR_RETURN(b.compute, compute_allocator_->Empty(options_.compute_dtype, Shape{b.numel}));
    }
  }
  for (int u = 0; u < num_units(); ++u) {
    for (size_t i = 0; i < units_[u].params.size(); ++i) {
      const ParamSpec& spec = units_[u].params[i];
      const Location& at = where_[u][i];
      SK_ASSIGN_OR_RETURN(Tensor view, buckets_[at.bucket].params.View(
                                           static_cast<size_t>(at.offset) * sizeof(float),
                                           DType::kF32, Shape{spec.shape.numel()}));
      SK_RETURN_IF_ERROR(ops::InitPhilox(ctx_, spec.init, options_.seed,
                                         ParamIdFromName(FullParamName(units_[u], spec)), 0, view));
    }
  }
  SK_RETURN_IF_ERROR(RefreshComputeCopies());
  TraceRecorder::Global().NameProcess(world_->rank(), "rank " + std::to_string(world_->rank()));
  // The hooks' spans (track 0; stream tracks start at 1) in wall-clock time:
  // not on the simulator, whose tracks run in virtual time.
  if (!ctx_.device->capabilities().virtual_time) {
    TraceRecorder::Global().NameTrack(world_->rank(), 0, "DDP hooks (rank " + std::to_string(world_->rank()) + ")");
  }
  return OkStatus();
}

Status DistributedDataParallel::RefreshComputeCopies() {
  for (Bucket& b : buckets_) {
    if (!b.compute.defined()) continue;
    SK_RETURN_IF_ERROR(ops::Cast(ctx_, b.params, b.compute));
  }
  return OkStatus();
}

DdpBucketInfo DistributedDataParallel::bucket_info(int bucket) const {
  const Bucket& b = buckets_.at(static_cast<size_t>(bucket));
  DdpBucketInfo info;
  info.numel = b.numel;
  info.num_params = b.num_params;
  info.highest_unit = b.units.front();
  info.lowest_unit = b.units.back();
  return info;
}

Tensor DistributedDataParallel::param(int unit, int index) const {
  const ParamSpec& spec = units_.at(static_cast<size_t>(unit)).params.at(static_cast<size_t>(index));
  const Location& at = where_[unit][index];
  return *buckets_[at.bucket].params.View(static_cast<size_t>(at.offset) * sizeof(float), DType::kF32,
                                         spec.shape);
}

Status DistributedDataParallel::Synchronize(Duration timeout) const {
  SK_RETURN_IF_ERROR(compute_stream_->Synchronize(timeout).WithContext("DDP compute stream"));
  return reduce_stream_->Synchronize(timeout).WithContext("DDP reduce stream");
}

Tensor DistributedDataParallel::grad(int unit, int index) const {
  const ParamSpec& spec = units_.at(static_cast<size_t>(unit)).params.at(static_cast<size_t>(index));
  const Location& at = where_[unit][index];
  return *buckets_[at.bucket].grads.View(static_cast<size_t>(at.offset) * sizeof(float), DType::kF32,
                                        spec.shape);
}

Status DistributedDataParallel::CheckUnit(int unit, const char* call) const {
  if (unit < 0 || unit >= num_units()) {
    return InvalidArgumentError(std::string(call) + ": unit index " + std::to_string(unit) +
                                " out of range (the model has " + std::to_string(num_units()) +
                                " units)");
  }
  return OkStatus();
}

Status DistributedDataParallel::Expect(int unit, UnitState want, const char* call) const {
  if (state_[unit] != want) {
    return FailedPreconditionError(std::string(call) + " of unit '" + units_[unit].name + "' (" +
                                   std::to_string(unit) + ") in state '" +
                                   UnitStateName(state_[unit]) + "', expected '" + UnitStateName(want) +
                                   "'");
  }
  return OkStatus();
}

StatusOr<std::vector<Tensor>> DistributedDataParallel::ParamViews(int unit) const {
  const DType dt = options_.compute_dtype;
  std::vector<Tensor> views;
  for (size_t i = 0; i < units_[unit].params.size(); ++i) {
    const Location& at = where_[unit][i];
    const Bucket& b = buckets_[at.bucket];
    const Tensor& src = dt == DType::kF32 ? b.params : b.compute;
    SK_ASSIGN_OR_RETURN(Tensor v, src.View(static_cast<size_t>(at.offset) * DTypeSize(dt), dt,
                                           units_[unit].params[i].shape));
    views.push_back(std::move(v));
  }
  for (const ParamRef& t : tied_[unit]) {
    const Location& at = where_[t.unit][t.param];
    const Bucket& b = buckets_[at.bucket];
    const Tensor& src = dt == DType::kF32 ? b.params : b.compute;
    SK_ASSIGN_OR_RETURN(Tensor v, src.View(static_cast<size_t>(at.offset) * DTypeSize(dt), dt,
                                           units_[t.unit].params[t.param].shape));
    views.push_back(std::move(v));
  }
  return views;
}

StatusOr<std::vector<Tensor>> DistributedDataParallel::PreForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PreForward"));
  // A forward-only pass leaves units forward-done; a new forward may follow.
  if (state_[unit] != UnitState::kIdle && state_[unit] != UnitState::kForwardDone) {
    return Expect(unit, UnitState::kIdle, "PreForward");
  }
  SK_ASSIGN_OR_RETURN(std::vector<Tensor> views, ParamViews(unit));
  state_[unit] = UnitState::kForward;
  return views;
}

Status DistributedDataParallel::PostForward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PostForward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kForward, "PostForward"));
  state_[unit] = UnitState::kForwardDone;
  return OkStatus();
}

StatusOr<UnitBackwardBuffers> DistributedDataParallel::PreBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PreBackward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kForwardDone, "PreBackward"));
  TraceSpan span("pre_backward " + units_[unit].name, "ddp", rank(), 0);
  // The model is about to add into these gradients: a reduction of the
  // previous backward (no FinishBackward in between) must not see that.
  for (size_t i = 0; i < units_[unit].params.size(); ++i) {
    Status s = WaitReduction(where_[unit][i].bucket);
    if (!s.ok()) return Fail(s);
  }
  for (const ParamRef& t : tied_[unit]) {
    Status s = WaitReduction(where_[t.unit][t.param].bucket);
    if (!s.ok()) return Fail(s);
  }
  UnitBackwardBuffers buffers;
  StatusOr<std::vector<Tensor>> views = ParamViews(unit);
  if (!views.ok()) return views.status();
  buffers.params = std::move(*views);
  for (size_t i = 0; i < units_[unit].params.size(); ++i) {
    buffers.grads.push_back(grad(unit, static_cast<int>(i)));
  }
  // A tied parameter's gradient is its owner's: the owner's bucket is
  // reduced after the owner's own backward, which comes later.
  for (const ParamRef& t : tied_[unit]) buffers.grads.push_back(grad(t.unit, t.param));
  state_[unit] = UnitState::kBackward;
  return buffers;
}

Status DistributedDataParallel::PostBackward(int unit) {
  SK_RETURN_IF_ERROR(CheckUnit(unit, "PostBackward"));
  SK_RETURN_IF_ERROR(Expect(unit, UnitState::kBackward, "PostBackward"));
  TraceSpan span("post_backward " + units_[unit].name, "ddp", rank(), 0);
  state_[unit] = UnitState::kIdle;
  // Buckets holding this unit's parameters, in index order (the order every
  // rank issues them in).
  std::vector<int> touched;
  for (const Location& at : where_[unit]) touched.push_back(at.bucket);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (int b : touched) {
    Bucket& bucket = buckets_[b];
    if (--bucket.units_pending > 0) continue;
    bucket.units_pending = static_cast<int>(bucket.units.size());
    ++counters_.buckets_ready;
    if (gradient_sync_) {
      Status s = IssueAllReduce(b);
      if (!s.ok()) return Fail(s);
    }
  }
  return OkStatus();
}

Status DistributedDataParallel::IssueAllReduce(int bucket) {
  Bucket& b = buckets_[bucket];
  comm::ReduceOptions ro;
  ro.op = comm::ReduceOp::kSum;
  ro.pre_scale = pre_scale_;
  ro.post_scale = post_scale_;
  ro.timeout = options_.timeout;
  if (!ctx_.device->capabilities().ops_run_when_issued) {
    // The reduce stream reads the bucket the compute stream has been filling
    // (on cpu the compute stream is this thread: nothing is pending).
    SK_RETURN_IF_ERROR(ctx_.device->WaitStream(*reduce_stream_, *ctx_.stream));
  }
  SK_ASSIGN_OR_RETURN(b.reduction, world_->all_reduce(b.grads, *reduce_stream_, ro));
  ++counters_.all_reduces;
  counters_.all_reduce_bytes += static_cast<int64_t>(b.grads.nbytes());
  if (std::any_of(state_.begin(), state_.end(), [](UnitState s) {
        return s == UnitState::kForwardDone || s == UnitState::kBackward;
      })) {
    ++counters_.all_reduces_overlapping_backward;
  }
  return OkStatus();
}

Status DistributedDataParallel::WaitReduction(int bucket) {
  Bucket& b = buckets_[bucket];
  if (!b.reduction) return OkStatus();
  Status s = b.reduction->wait(options_.timeout);
  if (!s.ok()) return s.WithContext("all-reduce of gradient bucket " + std::to_string(bucket));
  b.reduction.reset();
  return OkStatus();
}

Status DistributedDataParallel::WaitAllReductions() {
  for (int b = 0; b < num_buckets(); ++b) SK_RETURN_IF_ERROR(WaitReduction(b));
  Status s = reduce_stream_->Synchronize(options_.timeout);
  if (!s.ok()) return s.WithContext("reduce stream");
  return OkStatus();
}

Status DistributedDataParallel::Fail(Status s) {
  for (Bucket& b : buckets_) {
    if (b.reduction) b.reduction->wait(options_.timeout).IgnoreError();
    b.reduction.reset();
  }
  reduce_stream_->Synchronize(options_.timeout).IgnoreError();
  reduce_stream_->ClearError();
  for (Bucket& b : buckets_) {
    b.units_pending = static_cast<int>(b.units.size());
    ops::Fill(ctx_, b.grads, 0.f).IgnoreError();  // valid operands, idle streams: cannot fail
  }
  std::fill(state_.begin(), state_.end(), UnitState::kIdle);
  return s;
}

Status DistributedDataParallel::FinishBackward() {
  for (int u = 0; u < num_units(); ++u) {
    if (state_[u] == UnitState::kForward || state_[u] == UnitState::kBackward) {
      return FailedPreconditionError("FinishBackward while unit '" + units_[u].name +
                                     "' is in state '" + UnitStateName(state_[u]) + "'");
    }
  }
  for (int b = 0; b < num_buckets(); ++b) {
    const Bucket& bucket = buckets_[b];
    if (bucket.units_pending == static_cast<int>(bucket.units.size())) continue;
    for (int u : bucket.units) {
      if (state_[u] == UnitState::kForwardDone) {
        return FailedPreconditionError("FinishBackward while gradient bucket " + std::to_string(b) +
                                       " is partly final: unit '" + units_[u].name +
                                       "' has not finished its backward");
      }
    }
  }
  Status s = WaitAllReductions();
  if (!s.ok()) return Fail(s);
  return OkStatus();
}

StatusOr<double> DistributedDataParallel::ClipGradNorm(double max_norm, NormType type) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm)) {
    return InvalidArgumentError("max_norm must be finite and >= 0 (0 = only compute the norm)");
  }
  if (type != NormType::kL2 && type != NormType::kInf) return InvalidArgumentError("unknown norm type");
  SK_RETURN_IF_ERROR(FinishBackward());
  std::vector<Tensor> grads;
  for (const Bucket& b : buckets_) grads.push_back(b.grads);
  // Padding is zero and changes neither norm.
  SK_ASSIGN_OR_RETURN(double partial, LocalGradNormPartial(ctx_, grads, type));
  const double norm = FinishGradNorm(partial, type);
  if (max_norm > 0) SK_RETURN_IF_ERROR(ClipGradientsToNorm(ctx_, grads, norm, max_norm).status());
  return norm;
}

Status DistributedDataParallel::ScaleGradients(float factor) {
  SK_RETURN_IF_ERROR(FinishBackward());
  std::vector<Tensor> grads;
  for (const Bucket& b : buckets_) grads.push_back(b.grads);
  return sk::ScaleGradients(ctx_, grads, factor);
}

Status DistributedDataParallel::OptimizerStep(Optimizer& optimizer) {
  SK_RETURN_IF_ERROR(FinishBackward());
  std::vector<ShardRef> refs;
  for (int b = 0; b < num_buckets(); ++b) {
    refs.push_back(ShardRef{b, buckets_[b].params, buckets_[b].grads});
  }
  SK_RETURN_IF_ERROR(optimizer.Step(ctx_, refs));
  // A forward-only pass may have left units forward-done: the step ends it.
  std::fill(state_.begin(), state_.end(), UnitState::kIdle);
  return RefreshComputeCopies();
}

Status DistributedDataParallel::PrepareOptimizer(Optimizer& optimizer) {
  for (int b = 0; b < num_buckets(); ++b) {
    SK_RETURN_IF_ERROR(optimizer.SlotState(ctx_, b, buckets_[b].params.numel()).status());
  }
  return OkStatus();
}

void DistributedDataParallel::ZeroGrad() {
  Status s = WaitAllReductions();
  if (!s.ok()) {
    Fail(s).IgnoreError();  // zeroes the gradients too
    return;
  }
  for (Bucket& b : buckets_) ops::Fill(ctx_, b.grads, 0.f).IgnoreError();  // cannot fail
}

}  // namespace sk
