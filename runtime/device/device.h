// Devices, streams and events: the execution model of shardkit.
//
// Everything asynchronous follows CUDA's model on every backend. A Stream is an
// in-order queue of work. An Event marks a point in a stream; the host can
// query or wait for it, and another stream can be told to wait for it without
// blocking the host. The same FSDP code therefore overlaps communication and
// compute on CPU and on GPU, and the CPU tests exercise the ordering a GPU run
// relies on.
//
// CPU: each Stream is a worker thread draining a FIFO of closures; an Event is
// a completion counter that the stream advances when it reaches the point where
// the event was recorded. CUDA: cudaStream_t and cudaEvent_t (cuda_device.cc,
// built under --config=cuda).
//
// Errors: a closure that returns a non-OK Status makes that status the stream's
// sticky error(), returned by Synchronize() until ClearError(); later closures
// still run (each asynchronous operation reports its own status too, e.g. a
// collective's Work). Every blocking wait takes a timeout and returns
// DeadlineExceeded when it passes: nothing in shardkit waits forever.
//
// Thread safety: all methods of Device, Stream and Event may be called from any
// thread, except that an Event must not be recorded concurrently with itself.
#ifndef SHARDKIT_RUNTIME_DEVICE_DEVICE_H_
#define SHARDKIT_RUNTIME_DEVICE_DEVICE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/device_kind.h"
#include "runtime/core/status.h"
#include "runtime/core/trace.h"

namespace sk {

using Duration = std::chrono::milliseconds;
// How long a wait lasts unless the caller says otherwise: long enough for a
// slow collective on a loaded machine, short enough that a dead peer is
// reported within minutes instead of never.
inline constexpr Duration kDefaultTimeout{300'000};
// The longest timeout accepted anywhere (7 days): deadlines are now() +
// timeout on a steady clock, which a larger value would overflow (a
// timeout of INT64_MAX ms made every collective time out at once).
inline constexpr Duration kMaxTimeout{7LL * 24 * 3600 * 1000};

class Stream;

class Event {
 public:
  virtual ~Event() = default;
  virtual DeviceId device() const = 0;

  // Captures all work enqueued on `stream` up to now; the event completes when
  // that work has. Recording again moves the event to the new point. Returns
  // when enqueued. InvalidArgument if `stream` is on another kind of device.
  virtual Status Record(Stream& stream) = 0;
  // True once the captured work has completed. A never-recorded event is complete.
  virtual bool Query() const = 0;
  // Blocks the calling thread until complete; DeadlineExceeded after `timeout`.
  virtual Status Synchronize(Duration timeout = kDefaultTimeout) const = 0;
  // Milliseconds from this event's completion to `end`'s. FailedPrecondition
  // unless both were created with timing, recorded, and are complete.
  virtual StatusOr<double> ElapsedMillis(const Event& end) const = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual DeviceId device() const = 0;
  // Process-unique; used as the trace track of the stream.
  virtual int64_t id() const = 0;
  virtual const std::string& name() const = 0;

  // Enqueues `fn` to run on the stream after everything enqueued before it.
  // Returns when enqueued. On CUDA, `fn` runs on a driver thread in stream
  // order (cudaLaunchHostFunc) and must not call CUDA.
  virtual Status Enqueue(std::function<Status()> fn) = 0;
  // Work enqueued after this call waits for `event` (as recorded now). The host
  // is not blocked. On CPU the wait gives up after the stream's wait timeout
  // and sets the stream's error to DeadlineExceeded.
  virtual Status WaitEvent(const Event& event) = 0;
  // Blocks until everything enqueued so far has run. Returns the sticky
  // error() if one is set, DeadlineExceeded after `timeout`.
  virtual Status Synchronize(Duration timeout = kDefaultTimeout) = 0;
  // True if everything enqueued so far has run.
  virtual bool Query() const = 0;
  // The first error of work run on this stream since the last ClearError().
  virtual Status error() const = 0;
  virtual void ClearError() = 0;
  // cudaStream_t on CUDA, nullptr on CPU.
  virtual void* native_handle() const { return nullptr; }
};

class Device {
 public:
  virtual ~Device() = default;

  // The process-wide Device for `id`, created on first use and never destroyed.
  // Any CPU index >= 0 is valid (local ranks run as threads, each with its own
  // logical CPU device and memory statistics). CUDA: Unavailable when shardkit
  // was built without CUDA, when no driver or GPU is present, or the index is
  // out of range.
  static StatusOr<Device*> Get(DeviceId id);
  // Number of usable CUDA devices; 0 without CUDA, without a driver
  // (cudaErrorInsufficientDriver) or without a GPU. Never an error.
  static int CudaDeviceCount();

  // Device kinds implemented above this layer (kSim, by runtime/sim) register
  // how Get creates their devices. `factory` is called under Get's lock, once
  // per index, and must not call Get. InvalidArgument for kCpu/kCuda or a null
  // factory; AlreadyExists if `kind` has a factory. Until one is registered,
  // Get returns Unavailable for ids of that kind. Thread-safe.
  using Factory = std::function<StatusOr<std::unique_ptr<Device>>(int index)>;
  static Status RegisterFactory(DeviceKind kind, Factory factory);

  // Page-locked host memory (cudaHostAlloc, portable to every GPU) for
  // copies between the host and a GPU that run asynchronously in stream
  // order: FSDP's CPU offload of shards on a GPU. Unavailable on a build
  // without CUDA or a machine without a usable GPU; ResourceExhausted when
  // the driver refuses. bytes == 0 gives nullptr. Free with FreePinnedHost.
  static StatusOr<void*> AllocatePinnedHost(size_t bytes);
  static void FreePinnedHost(void* ptr);

  // The GPU whose memory `ptr` points into (cuda:N for cudaMalloc'd or
  // managed memory), or nullopt for host memory (pageable or pinned), for
  // pointers CUDA does not know, and always on a build or machine without
  // CUDA. How the C ABI tells a caller's host buffer from a device buffer.
  static std::optional<DeviceId> PointerDevice(const void* ptr);

  virtual DeviceId id() const = 0;
  // This device's capabilities: KindCapabilities(id().kind).
  DeviceCapabilities capabilities() const { return KindCapabilities(id().kind); }
  // Device::Get(id)->capabilities(); Get's error otherwise.
  static StatusOr<DeviceCapabilities> CapabilitiesOf(DeviceId id);

  // A new stream. `name` labels it in traces and errors.
  virtual StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) = 0;
  // A Stream over a native stream someone else owns (a cudaStream_t on
  // CUDA: the caller's, for stream-ordered engine hooks). The Stream does
  // not destroy or synchronise it when it dies; the native stream must
  // outlive it. InvalidArgument for a null handle, a stream of another
  // device, and on devices without native streams (cpu, sim).
  virtual StatusOr<std::unique_ptr<Stream>> WrapNativeStream(void* native, std::string_view name);
  // A new event; timing costs a clock read per completion on CPU.
  virtual StatusOr<std::unique_ptr<Event>> CreateEvent(bool enable_timing = false) = 0;

  // Work enqueued on `waiter` from now on runs after everything enqueued on
  // `producer` so far (PyTorch's waiter.wait_stream(producer)): an event
  // recorded on `producer` that `waiter` waits for; the host does not block.
  // Both streams must be this device's.
  Status WaitStream(Stream& waiter, Stream& producer);

  // Raw device memory for the caching allocator: 64-byte aligned host memory
  // on CPU (page-aligned from a page up), cudaMalloc on CUDA. ResourceExhausted when the device refuses.
  virtual StatusOr<void*> RawAllocate(size_t bytes) = 0;
  virtual void RawFree(void* ptr, size_t bytes) = 0;
  // Hands the physical memory behind [ptr, ptr + bytes) back to the system;
  // the addresses stay valid and read as zeros until written again (cpu:
  // madvise MADV_DONTNEED). ptr and bytes are multiples of
  // release_page_bytes(), inside one RawAllocate'd block.
  // Unimplemented on a device whose release_page_bytes() is 0 (the default).
  virtual Status ReleasePages(void* ptr, size_t bytes);
  // Free memory inside a segment can be handed back to the system in pages
  // of this many bytes while its addresses stay reserved (ReleasePages), as
  // PyTorch's expandable segments unmap the pages of free blocks; the caching
  // allocator then counts only pages in use against its cap, so a request
  // fits whenever the bytes in use leave room for it, however fragmented the
  // segments are (cpu: the page size; sim: its spec's). 0 (the default):
  // memory goes back only as whole segments (RawFree), as cudaMalloc's does.
  // A device that says > 0 returns RawAllocate pointers aligned to it for
  // requests of at least that size.
  virtual size_t release_page_bytes() const { return 0; }

  // Copies `bytes` bytes in stream order. Host pointers are valid on CPU
  // devices; on CUDA either side may be host or device memory (cudaMemcpyDefault).
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) = 0;

  // The trace timestamp (microseconds) of "now" for the calling thread on this
  // device: the wall clock (TraceRecorder::NowMicros) on CPU and CUDA, the
  // calling thread's virtual host clock on sim. Components that trace what
  // they do to the device's memory or streams (the caching allocator) use it
  // so their events line up with the device's. Thread-safe.
  virtual double TraceNowMicros() const { return TraceRecorder::NowMicros(); }
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_DEVICE_DEVICE_H_
