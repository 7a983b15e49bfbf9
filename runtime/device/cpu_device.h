// The CPU implementation of Device, Stream and Event (see device.h).
//
// A CpuStream is one worker thread draining a FIFO of closures. Two counters
// describe it: `enqueued` (closures accepted) and `completed` (closures run);
// Synchronize waits for `completed` to reach the `enqueued` seen at the call.
//
// Launch blocking (CUDA_LAUNCH_BLOCKING=1's analogue, CpuDevice::
// set_launch_blocking): a stream created while it is on has no worker; each
// closure runs inside Enqueue on the calling thread, so work is complete when
// Enqueue returns, events fire as they are recorded and nothing overlaps. The
// schedule is then program order alone: deterministic, for debugging and for
// comparing memory with the simulator byte for byte.
//
// A CpuEvent is a completion counter shared with the closures that complete
// it: Record() bumps the event's generation and enqueues a marker closure that
// publishes that generation (and, with timing, the time) when the stream
// reaches it. Query() compares the two generations; the marker holds the
// event's state by shared_ptr, so an event may be destroyed before it fires.
#ifndef SHARDKIT_RUNTIME_DEVICE_CPU_DEVICE_H_
#define SHARDKIT_RUNTIME_DEVICE_CPU_DEVICE_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/device/device.h"

namespace sk {

class CpuDevice;

class CpuStream final : public Stream {
 public:
  // `blocking`: launch blocking (file comment), no worker thread.
  CpuStream(DeviceId device, std::string name, Duration wait_timeout, bool blocking = false);
  // Runs everything already enqueued, then stops the worker.
  ~CpuStream() override;

  DeviceId device() const override { return device_; }
  int64_t id() const override { return id_; }
  const std::string& name() const override { return name_; }
  Status Enqueue(std::function<Status()> fn) override;
  Status WaitEvent(const Event& event) override;
  Status Synchronize(Duration timeout = kDefaultTimeout) override;
  bool Query() const override;
  Status error() const override;
  void ClearError() override;

  // How long a WaitEvent closure waits before failing the stream.
  void set_wait_timeout(Duration timeout) { wait_timeout_ms_.store(timeout.count()); }

 private:
  void Run();

  const DeviceId device_;
  const int64_t id_;
  const std::string name_;
  const bool blocking_;
  std::atomic<int64_t> wait_timeout_ms_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // worker waits for work or stop
  std::condition_variable done_cv_;  // Synchronize waits for progress
  std::deque<std::function<Status()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stop_ = false;
  Status error_;
  std::thread worker_;
};

class CpuEvent final : public Event {
 public:
  CpuEvent(DeviceId device, bool timing);
  DeviceId device() const override { return device_; }
  Status Record(Stream& stream) override;
  bool Query() const override;
  Status Synchronize(Duration timeout = kDefaultTimeout) const override;
  StatusOr<double> ElapsedMillis(const Event& end) const override;

  // A function that waits (with a timeout) for the event as recorded now.
  std::function<Status(Duration)> WaitFunctionForCurrentRecord() const;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::atomic<uint64_t> recorded{0};
    std::atomic<uint64_t> completed{0};
    double completion_us = 0;  // guarded by mu
  };
  const DeviceId device_;
  const bool timing_;
  std::shared_ptr<State> state_;
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int index) : id_(DeviceId::Cpu(index)) {}
  DeviceId id() const override { return id_; }
  size_t release_page_bytes() const override { return PageBytes(); }
  // The system's page size (sysconf).
  static size_t PageBytes();
  StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) override;
  StatusOr<std::unique_ptr<Event>> CreateEvent(bool enable_timing = false) override;
  StatusOr<void*> RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;
  Status ReleasePages(void* ptr, size_t bytes) override;
  Status CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) override;

  // Streams created from now on are launch blocking (file comment) or not
  // (the default). Streams that exist keep their mode. Thread-safe.
  void set_launch_blocking(bool on) { launch_blocking_.store(on); }
  bool launch_blocking() const { return launch_blocking_.load(); }

 private:
  const DeviceId id_;
  std::atomic<bool> launch_blocking_{false};
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_DEVICE_CPU_DEVICE_H_
