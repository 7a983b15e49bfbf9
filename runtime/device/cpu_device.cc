#include "runtime/device/cpu_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "runtime/core/allocator.h"
#include "runtime/core/trace.h"

namespace sk {

namespace {
std::atomic<int64_t> g_next_stream_id{1};
}  // namespace

CpuStream::CpuStream(DeviceId device, std::string name, Duration wait_timeout, bool blocking)
    : device_(device), id_(g_next_stream_id.fetch_add(1)), name_(std::move(name)),
      blocking_(blocking), wait_timeout_ms_(wait_timeout.count()) {
  TraceRecorder::Global().NameTrack(device_.index, id_, name_);
  if (!blocking_) worker_ = std::thread([this] { Run(); });
}

CpuStream::~CpuStream() {
  if (blocking_) return;  // no worker; nothing is ever queued
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
}

void CpuStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    std::function<Status()> fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Status s = fn();
    fn = nullptr;  // release captures outside the lock, before completion is published
    lock.lock();
    if (!s.ok() && error_.ok()) error_ = std::move(s);
    ++completed_;
    done_cv_.notify_all();
  }
}

Status CpuStream::Enqueue(std::function<Status()> fn) {
  if (!fn) return InvalidArgumentError("Enqueue of an empty function on stream " + name_);
  if (blocking_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++enqueued_;
    }
    Status s = fn();
    fn = nullptr;  // captures released before completion is published, as Run does
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && error_.ok()) error_ = std::move(s);
    ++completed_;
    done_cv_.notify_all();
    return OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    ++enqueued_;
  }
  work_cv_.notify_one();
  return OkStatus();
}

Status CpuStream::WaitEvent(const Event& event) {
  if (event.Query()) return OkStatus();  // already passed: nothing to wait for
  // The wait targets the event as recorded now (CUDA's semantics): recording
  // it again later does not move what this stream waits for. A foreign event
  // (a CUDA event on a CPU stream) is waited for by host synchronisation.
  const CpuEvent* cpu_event = dynamic_cast<const CpuEvent*>(&event);
  auto target = std::make_shared<std::function<Status(Duration)>>();
  if (cpu_event != nullptr) {
    *target = cpu_event->WaitFunctionForCurrentRecord();
  } else {
    const Event* e = &event;
    *target = [e](Duration t) { return e->Synchronize(t); };
  }
  return Enqueue([this, target]() -> Status {
    Status s = (*target)(Duration(wait_timeout_ms_.load()));
    if (!s.ok()) return s.WithContext("stream '" + name_ + "' waiting on an event");
    return OkStatus();
  });
}

Status CpuStream::Synchronize(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t target = enqueued_;
  if (!done_cv_.wait_for(lock, timeout, [&] { return completed_ >= target; })) {
    return DeadlineExceededError("stream '" + name_ + "' did not finish its work within " +
                                 std::to_string(timeout.count()) + " ms (" +
                                 std::to_string(target - completed_) + " operations pending)");
  }
  return error_;
}

bool CpuStream::Query() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= enqueued_;
}

Status CpuStream::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void CpuStream::ClearError() {
  std::lock_guard<std::mutex> lock(mu_);
  error_ = OkStatus();
}

CpuEvent::CpuEvent(DeviceId device, bool timing)
    : device_(device), timing_(timing), state_(std::make_shared<State>()) {}

Status CpuEvent::Record(Stream& stream) {
  if (dynamic_cast<CpuStream*>(&stream) == nullptr) {
    return InvalidArgumentError("a CPU event cannot be recorded on stream '" + stream.name() +
                                "' of " + stream.device().ToString());
  }
  uint64_t gen = state_->recorded.fetch_add(1) + 1;
  std::shared_ptr<State> state = state_;
  bool timing = timing_;
  return stream.Enqueue([state, gen, timing]() -> Status {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (timing) state->completion_us = TraceRecorder::NowMicros();
      // Generations complete in order on one stream; across streams the latest wins.
      if (state->completed.load() < gen) state->completed.store(gen);
    }
    state->cv.notify_all();
    return OkStatus();
  });
}

bool CpuEvent::Query() const { return state_->completed.load() >= state_->recorded.load(); }

std::function<Status(Duration)> CpuEvent::WaitFunctionForCurrentRecord() const {
  std::shared_ptr<State> state = state_;
  uint64_t target = state->recorded.load();
  return [state, target](Duration timeout) -> Status {
    std::unique_lock<std::mutex> lock(state->mu);
    if (!state->cv.wait_for(lock, timeout, [&] { return state->completed.load() >= target; })) {
      return DeadlineExceededError("event not reached within " + std::to_string(timeout.count()) +
                                   " ms");
    }
    return OkStatus();
  };
}

Status CpuEvent::Synchronize(Duration timeout) const {
  return WaitFunctionForCurrentRecord()(timeout);
}

StatusOr<double> CpuEvent::ElapsedMillis(const Event& end) const {
  const CpuEvent* other = dynamic_cast<const CpuEvent*>(&end);
  if (other == nullptr) return InvalidArgumentError("ElapsedMillis between events of different devices");
  if (!timing_ || !other->timing_) {
    return FailedPreconditionError("ElapsedMillis needs two events created with timing");
  }
  if (state_->recorded.load() == 0 || other->state_->recorded.load() == 0) {
    return FailedPreconditionError("ElapsedMillis on an event that was never recorded");
  }
  if (!Query() || !other->Query()) {
    return FailedPreconditionError("ElapsedMillis on an event that has not completed");
  }
  double a, b;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    a = state_->completion_us;
  }
  {
    std::lock_guard<std::mutex> lock(other->state_->mu);
    b = other->state_->completion_us;
  }
  return (b - a) / 1000.0;
}

StatusOr<std::unique_ptr<Stream>> CpuDevice::CreateStream(std::string_view name) {
  return std::unique_ptr<Stream>(
      new CpuStream(id_, std::string(name), kDefaultTimeout, launch_blocking_.load()));
}

StatusOr<std::unique_ptr<Event>> CpuDevice::CreateEvent(bool enable_timing) {
  return std::unique_ptr<Event>(new CpuEvent(id_, enable_timing));
}

size_t CpuDevice::PageBytes() {
  static const size_t page = [] {
    const long n = sysconf(_SC_PAGESIZE);
    return n > 0 ? static_cast<size_t>(n) : size_t{4096};
  }();
  return page;
}

StatusOr<void*> CpuDevice::RawAllocate(size_t bytes) {
  // Blocks of a page or more start on a page (release_page_bytes' promise),
  // so the caching allocator's page arithmetic is the same on every device
  // that releases pages, and a segment's pages are its own.
  const size_t page = PageBytes();
  const size_t alignment = bytes >= page ? page : kHostAlignment;
  size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (p == nullptr) {
    return ResourceExhaustedError("host allocation of " + std::to_string(bytes) +
                                  " bytes failed on " + id_.ToString());
  }
  return p;
}

void CpuDevice::RawFree(void* ptr, size_t /*bytes*/) { std::free(ptr); }

Status CpuDevice::ReleasePages(void* ptr, size_t bytes) {
  const size_t page = PageBytes();
  if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % page != 0 || bytes % page != 0) {
    return InvalidArgumentError("ReleasePages on " + id_.ToString() +
                                " needs a page-aligned range (page " + std::to_string(page) +
                                " bytes), got " + std::to_string(bytes) + " bytes");
  }
  if (bytes == 0) return OkStatus();
  // Private anonymous pages (malloc's, whether from its heap or its own
  // mmap): the next touch maps a zero page. glibc trims its heap the same way.
  if (madvise(ptr, bytes, MADV_DONTNEED) != 0) {
    return InternalError("madvise(MADV_DONTNEED) of " + std::to_string(bytes) + " bytes on " +
                         id_.ToString() + " failed: " + std::strerror(errno));
  }
  return OkStatus();
}

Status CpuDevice::CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (bytes == 0) return OkStatus();
  if (dst == nullptr || src == nullptr) return InvalidArgumentError("CopyAsync with a null pointer");
  return stream.Enqueue([dst, src, bytes]() -> Status {
    std::memcpy(dst, src, bytes);
    return OkStatus();
  });
}

}  // namespace sk
