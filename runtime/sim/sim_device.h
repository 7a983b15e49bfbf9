// The sim device: Device, Stream and Event on virtual clocks, with virtual
// memory (see device.h for the interfaces, docs/simulator.md).
//
// A sim device executes nothing. Everything that would take time on an
// accelerator becomes a span of virtual time on a stream, priced by whoever
// enqueues it (the sim op backend from an op's declared cost, the sim process
// group from the topology), and the unchanged FSDP/DDP/allocator code above
// runs against these clocks exactly as it runs against a GPU:
//
//   Clocks. Each stream has a clock: the virtual time at which everything
//   enqueued on it so far has completed. Each host thread has a clock per
//   device: the virtual time it has reached. Times are seconds (double) from
//   the device's last ResetClocks(); a thread's first use starts it at 0.
//
//   Spans. A span enqueued by a host thread on stream S starts at
//     max(S's clock, host clock + launch overhead (if launched), the times of
//         events S was told to wait for)
//   and lasts its price; S's clock moves to its end. Launching also advances
//   the host clock by the launch overhead (the host pays for launching), and
//   nothing else: the host does not wait for the span, so it runs ahead of
//   the device, as a CPU thread runs ahead of a GPU.
//
//   Events. Record(S) stamps the event with max(S's clock, host clock), the
//   moment S reaches the record. Stream::WaitEvent(e) moves the stream's clock
//   to at least e's time (work enqueued later starts after it; the host is not
//   blocked). Event::Query() and Stream::Query() compare with the calling
//   thread's host clock: true once the host has reached that time.
//
//   Host waits. Event::Synchronize and Stream::Synchronize (and through them
//   comm::Work::wait) move the calling thread's host clock forward to the
//   awaited time. They never block in real time, so they never time out: every
//   virtual time is known when it is enqueued.
//
//   Closures. Stream::Enqueue(fn) runs fn at once on the calling thread (it is
//   bookkeeping; there is no data) and places it at max(stream clock, host
//   clock) with zero duration. While fn runs, the thread's host clock reads
//   that position, so anything fn enqueues is placed after it; afterwards the
//   host clock is restored (the host did not wait for fn). A non-OK status
//   becomes the stream's sticky error, as on CPU.
//
//   Host streams. CreateHostStream makes a stream that stands for host CPU
//   work (FSDP's CPU offload: the host accumulation of gradients, the
//   optimizer step): the sim op backend prices ops on it with the profile's
//   host rates, and its spans are not launched (no launch overhead; they
//   start at max(stream clock, host clock, awaited events)). It is ordered
//   against the device's streams with events like any stream.
//
//   Host memory. SimHostAllocator (below) hands out virtual host addresses
//   (from 2^57, never mapped, not IsSimAddress) up to the profile's host
//   memory per GPU, outside RawAllocate's accounting: CopyAsync between them
//   and device memory is priced as a host<->device copy (host_link).
//
//   Memory. RawAllocate hands out 512-byte-aligned virtual addresses in a
//   range no process maps (from 2^56 up): never dereference them. At most
//   spec.memory_bytes may be held at once (ResourceExhausted beyond). Each
//   RawAllocate costs the host raw_alloc_s (cudaMalloc); each RawFree first
//   synchronises the device (the host clock reaches every stream's clock, as
//   cudaFree does) and then costs raw_free_s. That is the mechanism behind the
//   caching allocator's expensive retries on sim: the same CachingAllocator
//   runs over this device, and its free-cached-segments-and-retry path calls
//   RawFree. Values cannot be read back (no data): ops that would produce one
//   give NaN (ops::ReadScalar), labelled "simulated" by callers.
//
// For collectives (the sim process group): a collective is one launched span.
//   SK_ASSIGN_OR_RETURN(SimDevice* dev, SimDevice::For(stream));
//   SK_ASSIGN_OR_RETURN(SimSpan span, dev->EnqueueSpan(stream, "all_gather #3",
//       [&](double start_s) { return topology.AllGatherSeconds(bytes, start_s); },
//       {.launch = true, .category = "comm"}));
//   then record the Work's event on `stream` (it lands at span.end_s), so
//   Work::wait advances the host clock to the end and other streams can
//   WaitEvent on it. The price callback receives the span's start, so link
//   sharing between concurrent collectives can look at what else is in flight
//   (SpansOverlapping).
//
// Thread safety: every method of SimDevice, SimStream and SimEvent may be
// called from any thread; one mutex per device guards its clocks. Price
// callbacks run under that mutex and must not call the device.
#ifndef SHARDKIT_RUNTIME_SIM_SIM_DEVICE_H_
#define SHARDKIT_RUNTIME_SIM_SIM_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/device/device.h"

namespace sk::sim {

// What a sim device is: the hardware numbers the device layer itself needs.
// (Op and collective prices come from the profile, through their backends.)
struct SimDeviceSpec {
  // The hardware's name ("a100-80g"), for errors and traces.
  std::string name = "unconfigured";
  // Raw allocations beyond this many bytes held at once fail (0 = unlimited).
  size_t memory_bytes = 0;
  // Host seconds to launch one kernel, copy or collective.
  double launch_overhead_s = 0;
  // Host seconds of one RawAllocate (cudaMalloc).
  double raw_alloc_s = 0;
  // Host seconds of one RawFree, after its device synchronise (cudaFree).
  double raw_free_s = 0;
  // Device-to-device copies move 2 * bytes at this rate (0: they take no time).
  double memory_bandwidth_bytes_per_s = 0;
  // Host<->device copies move bytes at this rate (PCIe; 0: no time).
  double host_link_bytes_per_s = 0;
  // Host memory per simulated GPU for offloaded state (the node's memory
  // over its GPUs; 0: the profile models no host, and offload is refused).
  size_t host_memory_bytes = 0;
  // Free pages inside a segment go back to the system at this granularity
  // (DeviceCapabilities::release_page_bytes): 0, a GPU's cudaMalloc, or the
  // page size when the device it models is a CPU's host memory.
  size_t release_page_bytes = 0;

  // InvalidArgument naming the first negative or non-finite field.
  Status Validate() const;
};

// A span of virtual time, in seconds.
struct SimSpan {
  double start_s = 0;
  double end_s = 0;
};

struct SpanOptions {
  // Charge the launch overhead to the host and start no earlier than the
  // launch's end (kernels, copies, collectives); false for bookkeeping.
  bool launch = true;
  // The trace category and the category SpansOverlapping filters on:
  // "compute", "comm", "copy", ...
  std::string_view category = "compute";
  // The span starts no earlier than this (seconds): for a collective, when
  // the previous collective of its communicator ends (NCCL runs one
  // communicator's operations one after another: sim_process_group.h).
  double not_before_s = 0;
};

// One span as recorded for analysis (when span recording is on).
struct SpanRecord {
  int64_t stream_id = 0;
  std::string stream_name;
  std::string name;
  std::string category;
  double start_s = 0;
  double end_s = 0;
};

class SimDevice;

class SimStream final : public Stream {
 public:
  SimStream(SimDevice* device, std::string name, bool host = false);
  ~SimStream() override;
  // True for a host stream (SimDevice::CreateHostStream).
  bool host() const { return host_; }

  DeviceId device() const override;
  int64_t id() const override { return id_; }
  const std::string& name() const override { return name_; }
  // Runs `fn` now on the calling thread, placed in virtual time (file comment).
  Status Enqueue(std::function<Status()> fn) override;
  // `event` must be a sim event (InvalidArgument otherwise).
  Status WaitEvent(const Event& event) override;
  // Advances the host clock to this stream's clock; returns the sticky error.
  Status Synchronize(Duration timeout = kDefaultTimeout) override;
  bool Query() const override;
  Status error() const override;
  void ClearError() override;

  SimDevice* sim_device() const { return device_; }

 private:
  friend class SimDevice;
  friend class SimEvent;
  SimDevice* const device_;
  const int64_t id_;
  const std::string name_;
  const bool host_;
  // Guarded by the device's mutex.
  double clock_ = 0;
  Status error_;
};

class SimEvent final : public Event {
 public:
  SimEvent(SimDevice* device, bool timing) : device_(device), timing_(timing) {}
  DeviceId device() const override;
  // `stream` must be a stream of this event's device (InvalidArgument otherwise).
  Status Record(Stream& stream) override;
  // True if never recorded, recorded before the last ResetClocks, or the
  // calling thread's host clock has reached the event's time.
  bool Query() const override;
  // Advances the calling thread's host clock to the event's time.
  Status Synchronize(Duration timeout = kDefaultTimeout) const override;
  StatusOr<double> ElapsedMillis(const Event& end) const override;

  // The event's virtual time (0 if never recorded or recorded before the
  // last ResetClocks).
  double time_s() const;

 private:
  friend class SimDevice;
  friend class SimStream;
  SimDevice* const device_;
  const bool timing_;
  // Guarded by the device's mutex.
  bool recorded_ = false;
  double time_s_ = 0;
  uint64_t epoch_ = 0;
};

class SimDevice final : public Device {
 public:
  // sim:index, created (unconfigured: no costs, unlimited memory) on first
  // use and never destroyed; also what Device::Get(DeviceId::Sim(index))
  // returns once this has been called. InvalidArgument for a negative index.
  static StatusOr<SimDevice*> Get(int index);
  // The sim device of `stream`; InvalidArgument if it is not a sim stream.
  static StatusOr<SimDevice*> For(Stream& stream);

  explicit SimDevice(int index);

  // Replaces the spec (Validate()d first). FailedPrecondition if raw memory
  // in use exceeds the new spec's memory_bytes. Clocks are untouched.
  Status Configure(const SimDeviceSpec& spec);
  SimDeviceSpec spec() const;

  // Starts a new simulation on this device: every stream and host clock to 0,
  // events recorded before count as complete at time 0, span log cleared.
  // Memory is untouched. Call when no other thread is using the device.
  void ResetClocks();

  // --- Device ---
  DeviceId id() const override { return id_; }
  size_t release_page_bytes() const override {
    return release_page_bytes_.load(std::memory_order_relaxed);
  }
  StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) override;
  // A host stream (file comment): host CPU work on this device's clocks.
  StatusOr<std::unique_ptr<Stream>> CreateHostStream(std::string_view name);
  StatusOr<std::unique_ptr<Event>> CreateEvent(bool enable_timing = false) override;
  StatusOr<void*> RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;
  // Checks the range lies in one raw block and is page-aligned; nothing to
  // hand back (its memory is fake), so the caching allocator's books are
  // what the modelled device would keep.
  Status ReleasePages(void* ptr, size_t bytes) override;
  // Prices the copy (file comment) as a launched span on `stream`; no data
  // moves. Both pointers must be non-null, and at least one must be this
  // device's memory (a host-to-host copy is InvalidArgument: it would need data).
  Status CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) override;
  // The calling thread's host clock, in microseconds.
  double TraceNowMicros() const override;

  // --- Virtual time, for the sim op backend and the sim process group ---
  // Enqueues a span of `duration_s` (>= 0, finite) on `stream`, a stream of
  // this device, placed as the file comment says. InvalidArgument for a bad
  // stream or duration. Returns where it landed.
  StatusOr<SimSpan> EnqueueSpan(Stream& stream, std::string_view name, double duration_s,
                                const SpanOptions& options = {});
  // As above, with the duration computed from the span's start by `price`
  // (called once, under the device's mutex: it must not call the device).
  StatusOr<SimSpan> EnqueueSpan(Stream& stream, std::string_view name,
                                const std::function<double(double start_s)>& price,
                                const SpanOptions& options = {});

  // Launch blocking (CUDA_LAUNCH_BLOCKING=1): when on, the host waits for
  // every launched span to end before going on, so nothing overlaps and
  // events have passed when the host next looks. Off by default; kept across
  // ResetClocks and Configure.
  void set_launch_blocking(bool on);
  bool launch_blocking() const;

  // The calling thread's host clock (seconds).
  double HostClock() const;
  // The host spends `seconds` (>= 0) of its own time (host-side work that is
  // not a launch). Negative or non-finite is ignored.
  void AdvanceHostClock(double seconds);
  // The host waits until `time_s`: its clock becomes max(clock, time_s).
  void WaitHostUntil(double time_s);
  // `stream`'s clock (0 for a stream of another device).
  double StreamClock(const Stream& stream) const;
  // The latest time any stream or host thread of this device has reached:
  // the end of the simulation so far.
  double Horizon() const;

  // Span log for analysis (exposed communication, link sharing). Off by
  // default; turning it on clears it.
  void set_record_spans(bool on);
  // Recorded spans in enqueue order.
  std::vector<SpanRecord> spans() const;
  // Calls `visit` on each recorded span in enqueue order, under the device's
  // lock (`visit` must not call back into the device): spans() without the
  // copy, for a caller that only reads them once.
  void VisitSpans(const std::function<void(const SpanRecord&)>& visit) const;
  // Recorded spans of `category` that intersect [start_s, end_s).
  std::vector<SpanRecord> SpansOverlapping(std::string_view category, double start_s,
                                           double end_s) const;

  // Emits the trace names of this device's streams and host threads again,
  // for a trace started after they were created (TraceRecorder::Start drops
  // earlier names). No-op while the recorder is off.
  void NameTraceTracks();

  // Raw memory held now, and RawAllocate/RawFree calls so far.
  size_t raw_bytes_in_use() const;
  int64_t raw_alloc_count() const;
  int64_t raw_free_count() const;
  // True if `ptr` lies in memory handed out by some sim device.
  static bool IsSimAddress(const void* ptr);

 private:
  friend class SimStream;
  friend class SimEvent;
  struct HostState {
    double clock = 0;
    int64_t track = 0;  // trace tid of this host thread
  };

  // All below require mu_.
  HostState& Host();
  double& HostClockLocked() { return Host().clock; }
  SimSpan PlaceLocked(SimStream& stream, std::string_view name, double duration_s,
                      const SpanOptions& options);
  // The host waits until `time_s`, traced as a stall labelled `what`.
  void HostWaitLocked(double time_s, std::string_view what);
  double DeviceHorizonLocked() const;
  StatusOr<SimStream*> OwnStream(Stream& stream, std::string_view what);

  const DeviceId id_;
  TraceRecorder& trace_;
  mutable std::mutex mu_;
  SimDeviceSpec spec_;
  uint64_t epoch_ = 1;
  std::set<SimStream*> streams_;
  double retired_clock_ = 0;  // the latest clock of a destroyed stream
  mutable std::unordered_map<std::thread::id, HostState> hosts_;
  // Host()'s cache of the last thread's entry in hosts_ (cleared with it).
  std::thread::id last_host_thread_;
  HostState* last_host_ = nullptr;
  int64_t next_host_track_ = 0;
  bool record_spans_ = false;
  bool launch_blocking_ = false;
  std::vector<SpanRecord> span_log_;
  std::map<uintptr_t, size_t> raw_blocks_;  // address -> bytes
  size_t raw_in_use_ = 0;
  // spec_.release_page_bytes, readable without mu_ (capabilities()).
  std::atomic<size_t> release_page_bytes_{0};
  int64_t raw_allocs_ = 0;
  int64_t raw_frees_ = 0;
};

// Virtual host memory of a simulated GPU's host (FSDP's CPU offload): an
// Allocator on the sim device's id (so ops on its tensors are priced by the
// sim backend) whose addresses are host addresses (file comment), at most
// `capacity_bytes` held at once (ResourceExhausted beyond, naming the sizes;
// 0 = unlimited). It must outlive its storages.
//
// Thread safety: may be called from any thread.
class SimHostAllocator final : public Allocator {
 public:
  SimHostAllocator(DeviceId device, size_t capacity_bytes)
      : device_(device), capacity_(capacity_bytes) {}
  DeviceId device() const override { return device_; }
  StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) override;
  size_t capacity_bytes() const { return capacity_; }
  // Bytes held now (the sizes asked for, not rounded: nothing is cached, so
  // allocated and reserved are the same), and the most held at once since
  // construction or the last ResetPeak.
  size_t bytes_in_use() const;
  size_t peak_bytes() const;
  // Starts a new peak from the bytes held now (a step's peak, say).
  void ResetPeak();
  // True if `ptr` lies in memory handed out by some SimHostAllocator.
  static bool IsHostAddress(const void* ptr);

 private:
  static void Release(void* owner, void* handle) noexcept;
  const DeviceId device_;
  const size_t capacity_;
  mutable std::mutex mu_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

}  // namespace sk::sim

#endif  // SHARDKIT_RUNTIME_SIM_SIM_DEVICE_H_
