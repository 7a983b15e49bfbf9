// Helpers shared by the caching allocator tests.
#ifndef SHARDKIT_TESTS_MEMORY_TEST_UTIL_H_
#define SHARDKIT_TESTS_MEMORY_TEST_UTIL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <gtest/gtest.h>

#include "runtime/device/device.h"
#include "runtime/memory/caching_allocator.h"

namespace sk::testing {

// Holds a stream at a point until opened, so tests control exactly when a
// stream passes an event (no sleeps). The closure gives up after a long
// timeout so a broken test fails instead of hanging.
class Gate {
 public:
  Gate() : state_(std::make_shared<State>()) {}
  // Opens, so that a test that fails early does not leave a stream held.
  ~Gate() { Open(); }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Enqueues the blocking closure on `stream`.
  void Block(Stream& stream) {
    std::shared_ptr<State> state = state_;
    ASSERT_TRUE(stream
                    .Enqueue([state]() -> Status {
                      std::unique_lock<std::mutex> lock(state->mu);
                      if (!state->cv.wait_for(lock, std::chrono::seconds(60),
                                              [&] { return state->open; })) {
                        return DeadlineExceededError("gate never opened");
                      }
                      return OkStatus();
                    })
                    .ok());
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->open = true;
    }
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  std::shared_ptr<State> state_;
};

// Stats recomputed from a Snapshot, to compare with stats().
struct Recount {
  int64_t allocated = 0;
  int64_t active = 0;
  int64_t reserved = 0;
  int64_t released = 0;
  int64_t segments = 0;
};

inline Recount RecountSnapshot(const std::vector<SegmentInfo>& snapshot) {
  Recount r;
  for (const SegmentInfo& seg : snapshot) {
    r.reserved += static_cast<int64_t>(seg.size);
    ++r.segments;
    for (const BlockInfo& b : seg.blocks) {
      r.reserved -= static_cast<int64_t>(b.released_bytes);
      r.released += static_cast<int64_t>(b.released_bytes);
      if (b.allocated) r.allocated += static_cast<int64_t>(b.size);
      if (b.allocated || b.awaiting_events) r.active += static_cast<int64_t>(b.size);
    }
  }
  return r;
}

// Checks that stats() agree with a recount of the snapshot and that each
// segment's blocks tile it without gaps or overlaps.
inline void ExpectConsistent(const CachingAllocator& allocator) {
  Status internal = allocator.CheckInvariants();
  EXPECT_TRUE(internal.ok()) << internal;
  std::vector<SegmentInfo> snapshot = allocator.Snapshot();
  MemoryStats stats = allocator.stats();
  Recount r = RecountSnapshot(snapshot);
  EXPECT_EQ(stats.allocated_bytes.current, r.allocated);
  EXPECT_EQ(stats.active_bytes.current, r.active);
  EXPECT_EQ(stats.reserved_bytes.current, r.reserved);
  EXPECT_EQ(stats.released_bytes.current, r.released);
  EXPECT_EQ(stats.segments.current, r.segments);
  for (const Stat* s : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.released_bytes,
                        &stats.active_bytes, &stats.segments}) {
    EXPECT_EQ(s->allocated - s->freed, s->current);
    EXPECT_GE(s->peak, s->current);
  }
  uintptr_t previous_end = 0;
  for (const SegmentInfo& seg : snapshot) {
    EXPECT_GE(seg.address, previous_end) << "segments overlap";
    uintptr_t at = seg.address;
    for (const BlockInfo& b : seg.blocks) {
      EXPECT_EQ(b.address, at) << "blocks do not tile their segment";
      EXPECT_GT(b.size, 0u);
      if (b.released_bytes > 0) {
        EXPECT_FALSE(b.allocated || b.awaiting_events);
      }
      at += b.size;
    }
    previous_end = seg.address + seg.size;
  }
}

inline std::unique_ptr<Stream> MakeStream(Device* device, const std::string& name) {
  StatusOr<std::unique_ptr<Stream>> s = device->CreateStream(name);
  CHECK(s.ok()) << s.status();
  return std::move(s).value();
}

inline Device* CpuDevice0() {
  StatusOr<Device*> d = Device::Get(DeviceId::Cpu(0));
  CHECK(d.ok()) << d.status();
  return *d;
}

// cpu:0's memory and streams, but its pages are never handed back
// (release_page_bytes() 0, the default): the books a GPU's cudaMalloc keeps, on the host.
class PagesKeptDevice final : public Device {
 public:
  PagesKeptDevice() : inner_(CpuDevice0()) {}
  DeviceId id() const override { return inner_->id(); }
  StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) override {
    return inner_->CreateStream(name);
  }
  StatusOr<std::unique_ptr<Event>> CreateEvent(bool timing) override {
    return inner_->CreateEvent(timing);
  }
  StatusOr<void*> RawAllocate(size_t bytes) override { return inner_->RawAllocate(bytes); }
  void RawFree(void* ptr, size_t bytes) override { inner_->RawFree(ptr, bytes); }
  Status CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) override {
    return inner_->CopyAsync(dst, src, bytes, stream);
  }

 private:
  Device* inner_;
};

}  // namespace sk::testing

#endif  // SHARDKIT_TESTS_MEMORY_TEST_UTIL_H_
