#include "runtime/sim/sim_device.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <typeinfo>

namespace sk::sim {

namespace {

// Virtual addresses: from 2^56 up, above every canonical user address of
// x86-64 (4- and 5-level paging) and AArch64, so nothing can be mapped there
// and an accidental dereference faults. Shared by all sim devices so that
// IsSimAddress is one range check.
constexpr uintptr_t kAddressBase = uintptr_t{1} << 56;
constexpr uintptr_t kAddressAlignment = 512;
std::atomic<uintptr_t> g_next_address{kAddressBase};
// Virtual host memory (SimHostAllocator): a range of its own, far above the
// device range, so CopyAsync can tell host from device.
constexpr uintptr_t kHostAddressBase = uintptr_t{1} << 57;
std::atomic<uintptr_t> g_next_host_address{kHostAddressBase};

// Sim stream ids, apart from the CPU streams' small ids (trace tracks and
// the allocator's per-stream pools key on them).
std::atomic<int64_t> g_next_stream_id{500'000'000};
// Trace tracks of host threads within a device's trace process.
constexpr int64_t kHostTrackBase = 800'000'000;

constexpr double kMicros = 1e6;

bool FiniteNonNegative(double x) { return std::isfinite(x) && x >= 0; }

std::string Bytes(size_t n) { return std::to_string(n) + " bytes"; }

// `stream` as a SimStream, or null. SimStream and SimEvent are final, so an
// exact type match is what dynamic_cast would find, at the cost of one
// type_info comparison: every simulated op and event query passes here
// (the planner's hot path; dynamic_cast was 3% of a plan's instructions).
template <typename To, typename From>
To* ExactCast(From& from) {
  using Exact = std::remove_const_t<To>;
  static_assert(std::is_final_v<Exact>);
  return typeid(from) == typeid(Exact) ? static_cast<To*>(&from) : nullptr;
}

}  // namespace

Status SimDeviceSpec::Validate() const {
  const std::pair<const char*, double> fields[] = {
      {"launch_overhead_s", launch_overhead_s},
      {"raw_alloc_s", raw_alloc_s},
      {"raw_free_s", raw_free_s},
      {"memory_bandwidth_bytes_per_s", memory_bandwidth_bytes_per_s},
      {"host_link_bytes_per_s", host_link_bytes_per_s},
  };
  for (const auto& [field, value] : fields) {
    if (!FiniteNonNegative(value)) {
      return InvalidArgumentError("sim device spec '" + name + "': " + field + " is " +
                                  std::to_string(value) + "; it must be finite and >= 0");
    }
  }
  const size_t page = release_page_bytes;
  if (page != 0 && (page < 512 || (page & (page - 1)) != 0)) {
    return InvalidArgumentError("sim device spec '" + name + "': release_page_bytes is " +
                                std::to_string(page) +
                                "; it must be 0 or a power of two of at least 512");
  }
  return OkStatus();
}

// ---------------------------------------------------------------- SimStream

SimStream::SimStream(SimDevice* device, std::string name, bool host)
    : device_(device), id_(g_next_stream_id.fetch_add(1)), name_(std::move(name)), host_(host) {
  device_->trace_.NameTrack(device_->id_.index, id_, name_);
  std::lock_guard<std::mutex> lock(device_->mu_);
  device_->streams_.insert(this);
}

SimStream::~SimStream() {
  std::lock_guard<std::mutex> lock(device_->mu_);
  device_->retired_clock_ = std::max(device_->retired_clock_, clock_);
  device_->streams_.erase(this);
}

DeviceId SimStream::device() const { return device_->id(); }

Status SimStream::Enqueue(std::function<Status()> fn) {
  if (!fn) return InvalidArgumentError("Enqueue of an empty function on stream " + name_);
  double saved;
  {
    std::lock_guard<std::mutex> lock(device_->mu_);
    double& host = device_->HostClockLocked();
    saved = host;
    clock_ = std::max(clock_, host);
    host = clock_;
  }
  Status s = fn();
  fn = nullptr;
  std::lock_guard<std::mutex> lock(device_->mu_);
  device_->HostClockLocked() = saved;
  if (!s.ok() && error_.ok()) error_ = std::move(s);
  return OkStatus();
}

Status SimStream::WaitEvent(const Event& event) {
  const SimEvent* sim_event = ExactCast<const SimEvent>(event);
  if (sim_event == nullptr) {
    return InvalidArgumentError("sim stream '" + name_ + "' cannot wait on an event of " +
                                event.device().ToString());
  }
  // The event may belong to another sim device (another lock): read its time
  // first. Virtual times share one axis across devices.
  const double t = sim_event->time_s();
  std::lock_guard<std::mutex> lock(device_->mu_);
  clock_ = std::max(clock_, t);
  return OkStatus();
}

Status SimStream::Synchronize(Duration /*timeout*/) {
  std::lock_guard<std::mutex> lock(device_->mu_);
  device_->HostWaitLocked(clock_, "synchronize " + name_);
  return error_;
}

bool SimStream::Query() const {
  std::lock_guard<std::mutex> lock(device_->mu_);
  return clock_ <= device_->HostClockLocked();
}

Status SimStream::error() const {
  std::lock_guard<std::mutex> lock(device_->mu_);
  return error_;
}

void SimStream::ClearError() {
  std::lock_guard<std::mutex> lock(device_->mu_);
  error_ = OkStatus();
}

// ----------------------------------------------------------------- SimEvent

DeviceId SimEvent::device() const { return device_->id(); }

Status SimEvent::Record(Stream& stream) {
  SimStream* s = ExactCast<SimStream>(stream);
  if (s == nullptr || s->device_ != device_) {
    return InvalidArgumentError("an event of " + device_->id().ToString() +
                                " cannot be recorded on stream '" + stream.name() + "' of " +
                                stream.device().ToString());
  }
  std::lock_guard<std::mutex> lock(device_->mu_);
  recorded_ = true;
  epoch_ = device_->epoch_;
  time_s_ = std::max(s->clock_, device_->HostClockLocked());
  return OkStatus();
}

double SimEvent::time_s() const {
  std::lock_guard<std::mutex> lock(device_->mu_);
  return recorded_ && epoch_ == device_->epoch_ ? time_s_ : 0.0;
}

bool SimEvent::Query() const {
  std::lock_guard<std::mutex> lock(device_->mu_);
  if (!recorded_ || epoch_ != device_->epoch_) return true;
  return time_s_ <= device_->HostClockLocked();
}

Status SimEvent::Synchronize(Duration /*timeout*/) const {
  std::lock_guard<std::mutex> lock(device_->mu_);
  if (!recorded_ || epoch_ != device_->epoch_) return OkStatus();
  device_->HostWaitLocked(time_s_, "wait event");
  return OkStatus();
}

StatusOr<double> SimEvent::ElapsedMillis(const Event& end) const {
  const SimEvent* other = ExactCast<const SimEvent>(end);
  if (other == nullptr) {
    return InvalidArgumentError("ElapsedMillis between events of different device kinds");
  }
  if (!timing_ || !other->timing_) {
    return FailedPreconditionError("ElapsedMillis needs two events created with timing");
  }
  for (const SimEvent* e : {this, other}) {
    std::lock_guard<std::mutex> lock(e->device_->mu_);
    if (!e->recorded_) return FailedPreconditionError("ElapsedMillis on an event never recorded");
  }
  if (!Query() || !other->Query()) {
    return FailedPreconditionError("ElapsedMillis on an event that has not completed");
  }
  return (other->time_s() - time_s()) * 1e3;
}

// ---------------------------------------------------------------- SimDevice

StatusOr<SimDevice*> SimDevice::Get(int index) {
  if (index < 0) return InvalidArgumentError("negative sim device index " + std::to_string(index));
  static const Status registered = Device::RegisterFactory(
      DeviceKind::kSim,
      [](int i) -> StatusOr<std::unique_ptr<Device>> { return std::make_unique<SimDevice>(i); });
  if (!registered.ok()) return registered;
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(DeviceId::Sim(index)));
  return static_cast<SimDevice*>(device);
}

StatusOr<SimDevice*> SimDevice::For(Stream& stream) {
  SimStream* s = ExactCast<SimStream>(stream);
  if (s == nullptr) {
    return InvalidArgumentError("stream '" + stream.name() + "' of " +
                                stream.device().ToString() + " is not a sim stream");
  }
  return s->sim_device();
}

SimDevice::SimDevice(int index) : id_(DeviceId::Sim(index)), trace_(TraceRecorder::Global()) {}

Status SimDevice::Configure(const SimDeviceSpec& spec) {
  SK_RETURN_IF_ERROR(spec.Validate());
  std::lock_guard<std::mutex> lock(mu_);
  if (spec.memory_bytes != 0 && raw_in_use_ > spec.memory_bytes) {
    return FailedPreconditionError("cannot configure " + id_.ToString() + " as '" + spec.name +
                                   "' with " + Bytes(spec.memory_bytes) + ": " +
                                   Bytes(raw_in_use_) + " are in use");
  }
  spec_ = spec;
  release_page_bytes_.store(spec.release_page_bytes, std::memory_order_relaxed);
  trace_.NameProcess(id_.index, id_.ToString() + " (" + spec_.name + ", simulated)");
  return OkStatus();
}

SimDeviceSpec SimDevice::spec() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spec_;
}

void SimDevice::ResetClocks() {
  std::lock_guard<std::mutex> lock(mu_);
  ++epoch_;
  for (SimStream* s : streams_) s->clock_ = 0;
  retired_clock_ = 0;
  hosts_.clear();
  last_host_ = nullptr;
  next_host_track_ = 0;
  span_log_.clear();
}

StatusOr<std::unique_ptr<Stream>> SimDevice::CreateStream(std::string_view name) {
  return std::unique_ptr<Stream>(new SimStream(this, std::string(name)));
}

StatusOr<std::unique_ptr<Stream>> SimDevice::CreateHostStream(std::string_view name) {
  return std::unique_ptr<Stream>(new SimStream(this, std::string(name), /*host=*/true));
}

StatusOr<std::unique_ptr<Event>> SimDevice::CreateEvent(bool enable_timing) {
  return std::unique_ptr<Event>(new SimEvent(this, enable_timing));
}

StatusOr<void*> SimDevice::RawAllocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  // A device that releases pages starts every block of a page or more on one
  // (release_page_bytes' promise), as the CPU device does.
  const size_t page = spec_.release_page_bytes;
  const size_t alignment = page != 0 && bytes >= page ? page : kAddressAlignment;
  const size_t rounded =
      std::max<size_t>(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (bytes > (size_t{1} << 52) ||
      (spec_.memory_bytes != 0 && raw_in_use_ + bytes > spec_.memory_bytes)) {
    return ResourceExhaustedError(id_.ToString() + " (" + spec_.name + "): cannot reserve " +
                                  Bytes(bytes) + "; " + Bytes(raw_in_use_) + " of " +
                                  (spec_.memory_bytes == 0 ? std::string("unlimited")
                                                           : Bytes(spec_.memory_bytes)) +
                                  " are in use");
  }
  uintptr_t address = g_next_address.fetch_add(rounded + alignment - kAddressAlignment);
  address = (address + alignment - 1) / alignment * alignment;
  raw_blocks_.emplace(address, bytes);
  raw_in_use_ += bytes;
  ++raw_allocs_;
  HostState& host = Host();
  const double start = host.clock;
  host.clock += spec_.raw_alloc_s;
  if (trace_.enabled() && spec_.raw_alloc_s > 0) {
    trace_.Complete("raw alloc " + Bytes(bytes), "memory", id_.index, host.track, start * kMicros,
                    spec_.raw_alloc_s * kMicros);
  }
  return reinterpret_cast<void*>(address);
}

void SimDevice::RawFree(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = raw_blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  CHECK(it != raw_blocks_.end()) << id_.ToString() << ": RawFree of an address it never handed out";
  CHECK_EQ(it->second, bytes) << id_.ToString() << ": RawFree with a size other than allocated";
  raw_in_use_ -= bytes;
  raw_blocks_.erase(it);
  ++raw_frees_;
  // cudaFree synchronises the device before it returns the memory.
  HostWaitLocked(DeviceHorizonLocked(), "device synchronise (raw free)");
  HostState& host = Host();
  const double start = host.clock;
  host.clock += spec_.raw_free_s;
  if (trace_.enabled() && spec_.raw_free_s > 0) {
    trace_.Complete("raw free " + Bytes(bytes), "memory", id_.index, host.track, start * kMicros,
                    spec_.raw_free_s * kMicros);
  }
}

Status SimDevice::ReleasePages(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t page = spec_.release_page_bytes;
  if (page == 0) return Device::ReleasePages(ptr, bytes);
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  if (address % page != 0 || bytes % page != 0) {
    return InvalidArgumentError("ReleasePages on " + id_.ToString() +
                                " needs a page-aligned range (page " + std::to_string(page) +
                                " bytes)");
  }
  auto it = raw_blocks_.upper_bound(address);
  if (it == raw_blocks_.begin() || (--it, address + bytes > it->first + it->second)) {
    return InvalidArgumentError("ReleasePages on " + id_.ToString() +
                                ": the range is not inside one raw block");
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<Storage>> SimHostAllocator::AllocateBytes(size_t nbytes) {
  const size_t rounded =
      std::max<size_t>(kAddressAlignment, (nbytes + kAddressAlignment - 1) / kAddressAlignment *
                                              kAddressAlignment);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (nbytes > (size_t{1} << 52) || (capacity_ != 0 && in_use_ + nbytes > capacity_)) {
      return ResourceExhaustedError("host memory of " + device_.ToString() + ": cannot allocate " +
                                    Bytes(nbytes) + " for offloaded state; " + Bytes(in_use_) + " of " +
                                    (capacity_ == 0 ? std::string("unlimited") : Bytes(capacity_)) +
                                    " (the profile's host memory per GPU) are in use");
    }
    in_use_ += nbytes;
    peak_ = std::max(peak_, in_use_);
  }
  void* p = reinterpret_cast<void*>(g_next_host_address.fetch_add(rounded));
  // The handle carries the size: Release gives it back.
  return std::make_shared<Storage>(p, nbytes, device_, this, reinterpret_cast<void*>(nbytes), &Release);
}

void SimHostAllocator::Release(void* owner, void* handle) noexcept {
  auto* self = static_cast<SimHostAllocator*>(owner);
  std::lock_guard<std::mutex> lock(self->mu_);
  self->in_use_ -= reinterpret_cast<size_t>(handle);
}

size_t SimHostAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t SimHostAllocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void SimHostAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

bool SimHostAllocator::IsHostAddress(const void* ptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  return a >= kHostAddressBase && a < g_next_host_address.load();
}

bool SimDevice::IsSimAddress(const void* ptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  return a >= kAddressBase && a < g_next_address.load();
}

Status SimDevice::CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (dst == nullptr || src == nullptr) return InvalidArgumentError("CopyAsync with a null pointer");
  const bool dst_dev = IsSimAddress(dst);
  const bool src_dev = IsSimAddress(src);
  if (!dst_dev && !src_dev) {
    return InvalidArgumentError("CopyAsync on " + id_.ToString() +
                                " between two host buffers: a sim device moves no data");
  }
  double duration = 0;
  const char* name;
  if (dst_dev && src_dev) {
    name = "copy d2d";
    if (spec_.memory_bandwidth_bytes_per_s > 0) {
      duration = 2.0 * static_cast<double>(bytes) / spec_.memory_bandwidth_bytes_per_s;
    }
  } else {
    name = dst_dev ? "copy h2d" : "copy d2h";
    if (spec_.host_link_bytes_per_s > 0) {
      duration = static_cast<double>(bytes) / spec_.host_link_bytes_per_s;
    }
  }
  if (bytes == 0) return OkStatus();
  return EnqueueSpan(stream, name, duration, {.launch = true, .category = "copy"}).status();
}

double SimDevice::TraceNowMicros() const {
  std::lock_guard<std::mutex> lock(mu_);
  return const_cast<SimDevice*>(this)->HostClockLocked() * kMicros;
}

StatusOr<SimStream*> SimDevice::OwnStream(Stream& stream, std::string_view what) {
  SimStream* s = ExactCast<SimStream>(stream);
  if (s == nullptr || s->device_ != this) {
    return InvalidArgumentError(std::string(what) + " on stream '" + stream.name() + "' of " +
                                stream.device().ToString() + ", not a stream of " +
                                id_.ToString());
  }
  return s;
}

StatusOr<SimSpan> SimDevice::EnqueueSpan(Stream& stream, std::string_view name,
                                         double duration_s, const SpanOptions& options) {
  if (!FiniteNonNegative(duration_s)) {
    return InvalidArgumentError("span '" + std::string(name) + "' on " + id_.ToString() +
                                " has duration " + std::to_string(duration_s) +
                                " s; it must be finite and >= 0");
  }
  return EnqueueSpan(stream, name, [duration_s](double) { return duration_s; }, options);
}

StatusOr<SimSpan> SimDevice::EnqueueSpan(Stream& stream, std::string_view name,
                                         const std::function<double(double start_s)>& price,
                                         const SpanOptions& options) {
  // The error's context is built only when the stream is not this device's
  // (every simulated op passes here: the planner's hot path).
  SimStream* s = ExactCast<SimStream>(stream);
  if (s == nullptr || s->device_ != this) {
    return OwnStream(stream, "EnqueueSpan '" + std::string(name) + "'").status();
  }
  if (!price) return InvalidArgumentError("EnqueueSpan '" + std::string(name) + "' without a price");
  std::lock_guard<std::mutex> lock(mu_);
  double& host = HostClockLocked();
  if (options.launch) host += spec_.launch_overhead_s;
  const double start = std::max({s->clock_, host, options.not_before_s});
  const double duration = price(start);
  if (!FiniteNonNegative(duration)) {
    return InvalidArgumentError("span '" + std::string(name) + "' on " + id_.ToString() +
                                " was priced at " + std::to_string(duration) +
                                " s; a price must be finite and >= 0");
  }
  const SimSpan span = PlaceLocked(*s, name, duration, options);
  if (launch_blocking_ && options.launch) HostWaitLocked(span.end_s, "launch blocking");
  return span;
}

void SimDevice::NameTraceTracks() {
  if (!trace_.enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (const SimStream* s : streams_) trace_.NameTrack(id_.index, s->id_, s->name_);
  for (const auto& [thread, host] : hosts_) {
    trace_.NameTrack(id_.index, host.track,
                     "host thread " + std::to_string(host.track - kHostTrackBase));
  }
}

void SimDevice::set_launch_blocking(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  launch_blocking_ = on;
}

bool SimDevice::launch_blocking() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launch_blocking_;
}

SimSpan SimDevice::PlaceLocked(SimStream& stream, std::string_view name, double duration_s,
                               const SpanOptions& options) {
  const double start = std::max({stream.clock_, HostClockLocked(), options.not_before_s});
  const SimSpan span{start, start + duration_s};
  stream.clock_ = span.end_s;
  if (trace_.enabled()) {
    trace_.Complete(name, options.category, id_.index, stream.id_, span.start_s * kMicros,
                    duration_s * kMicros);
  }
  if (record_spans_) {
    span_log_.push_back(SpanRecord{stream.id_, stream.name_, std::string(name),
                                   std::string(options.category), span.start_s, span.end_s});
  }
  return span;
}

SimDevice::HostState& SimDevice::Host() {
  // The last thread's state is remembered: one host thread asks millions of
  // times per simulated step, and hashing its id each time cost 4% of a
  // plan's instructions. unordered_map nodes do not move, so the pointer
  // stays valid (hosts_ only grows).
  const std::thread::id self = std::this_thread::get_id();
  if (last_host_ != nullptr && last_host_thread_ == self) return *last_host_;
  auto [it, inserted] = hosts_.try_emplace(self);
  if (inserted) {
    it->second.track = kHostTrackBase + next_host_track_++;
    trace_.NameTrack(id_.index, it->second.track,
                     "host thread " + std::to_string(it->second.track - kHostTrackBase));
  }
  last_host_thread_ = self;
  last_host_ = &it->second;
  return it->second;
}

void SimDevice::HostWaitLocked(double time_s, std::string_view what) {
  HostState& host = Host();
  if (time_s <= host.clock) return;
  if (trace_.enabled()) {
    trace_.Complete(what, "host wait", id_.index, host.track, host.clock * kMicros,
                    (time_s - host.clock) * kMicros);
  }
  host.clock = time_s;
}

double SimDevice::DeviceHorizonLocked() const {
  double t = retired_clock_;
  for (const SimStream* s : streams_) t = std::max(t, s->clock_);
  return t;
}

double SimDevice::HostClock() const {
  std::lock_guard<std::mutex> lock(mu_);
  return const_cast<SimDevice*>(this)->HostClockLocked();
}

void SimDevice::AdvanceHostClock(double seconds) {
  if (!FiniteNonNegative(seconds)) return;
  std::lock_guard<std::mutex> lock(mu_);
  HostClockLocked() += seconds;
}

void SimDevice::WaitHostUntil(double time_s) {
  if (!std::isfinite(time_s)) return;
  std::lock_guard<std::mutex> lock(mu_);
  HostWaitLocked(time_s, "host wait");
}

double SimDevice::StreamClock(const Stream& stream) const {
  const SimStream* s = ExactCast<const SimStream>(stream);
  if (s == nullptr || s->device_ != this) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return s->clock_;
}

double SimDevice::Horizon() const {
  std::lock_guard<std::mutex> lock(mu_);
  double t = DeviceHorizonLocked();
  for (const auto& [thread, host] : hosts_) t = std::max(t, host.clock);
  return t;
}

void SimDevice::set_record_spans(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  record_spans_ = on;
  span_log_.clear();
}

std::vector<SpanRecord> SimDevice::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return span_log_;
}

void SimDevice::VisitSpans(const std::function<void(const SpanRecord&)>& visit) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const SpanRecord& r : span_log_) visit(r);
}

std::vector<SpanRecord> SimDevice::SpansOverlapping(std::string_view category, double start_s,
                                                    double end_s) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SpanRecord> out;
  for (const SpanRecord& r : span_log_) {
    if (r.category == category && r.start_s < end_s && r.end_s > start_s) out.push_back(r);
  }
  return out;
}

size_t SimDevice::raw_bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return raw_in_use_;
}

int64_t SimDevice::raw_alloc_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return raw_allocs_;
}

int64_t SimDevice::raw_free_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return raw_frees_;
}

}  // namespace sk::sim
