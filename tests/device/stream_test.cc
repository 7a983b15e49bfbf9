// Streams and events on CPU: the ordering guarantees FSDP relies on.
// Every assertion is about order and completion, never about elapsed time.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"

namespace sk {
namespace {

class Gate {  // a closure-controlled latch, so tests block a stream deterministically
 public:
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, std::chrono::seconds(30), [&] { return open_; })) {
      return DeadlineExceededError("gate never opened");
    }
    return OkStatus();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

struct Fixture : ::testing::Test {
  Device* dev = *Device::Get(DeviceId::Cpu(0));
  std::unique_ptr<Stream> NewStream(const char* name) { return *dev->CreateStream(name); }
  std::unique_ptr<Event> NewEvent(bool timing = false) { return *dev->CreateEvent(timing); }
};

using StreamTest = Fixture;
using EventTest = Fixture;

TEST_F(StreamTest, RunsClosuresInEnqueueOrder) {
  auto s = NewStream("s");
  std::vector<int> order;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(s->Enqueue([&order, i] {
                   order.push_back(i);
                   return OkStatus();
                 }).ok());
  }
  ASSERT_TRUE(s->Synchronize().ok());
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[i], i);
  EXPECT_TRUE(s->Query());
}

TEST_F(StreamTest, EnqueueReturnsBeforeWorkRuns) {
  auto s = NewStream("s");
  Gate gate;
  std::atomic<bool> ran{false};
  ASSERT_TRUE(s->Enqueue([&] { return gate.Wait(); }).ok());
  ASSERT_TRUE(s->Enqueue([&] {
                 ran = true;
                 return OkStatus();
               }).ok());
  EXPECT_FALSE(ran.load());
  EXPECT_FALSE(s->Query());
  gate.Open();
  ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_TRUE(ran.load());
}

TEST_F(StreamTest, SynchronizeTimesOutWithDeadlineExceeded) {
  auto s = NewStream("blocked");
  Gate gate;
  ASSERT_TRUE(s->Enqueue([&] { return gate.Wait(); }).ok());
  Status st = s->Synchronize(Duration(20));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("blocked"), std::string::npos);
  gate.Open();
  EXPECT_TRUE(s->Synchronize().ok());
}

TEST_F(StreamTest, FirstErrorIsStickyUntilCleared) {
  auto s = NewStream("s");
  std::atomic<int> after{0};
  ASSERT_TRUE(s->Enqueue([] { return InternalError("first"); }).ok());
  ASSERT_TRUE(s->Enqueue([] { return InternalError("second"); }).ok());
  ASSERT_TRUE(s->Enqueue([&] {
                 ++after;
                 return OkStatus();
               }).ok());
  Status st = s->Synchronize();
  EXPECT_EQ(st.message(), "first");
  EXPECT_EQ(after.load(), 1);  // later work still ran
  s->ClearError();
  EXPECT_TRUE(s->Synchronize().ok());
}

TEST_F(StreamTest, EmptyClosureIsInvalidArgument) {
  auto s = NewStream("s");
  EXPECT_EQ(s->Enqueue(nullptr).code(), StatusCode::kInvalidArgument);
}

TEST_F(StreamTest, DestructorDrainsPendingWork) {
  std::atomic<int> n{0};
  {
    auto s = NewStream("s");
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(s->Enqueue([&] {
                     ++n;
                     return OkStatus();
                   }).ok());
    }
  }
  EXPECT_EQ(n.load(), 100);
}

TEST_F(EventTest, UnrecordedEventIsComplete) {
  auto e = NewEvent();
  EXPECT_TRUE(e->Query());
  EXPECT_TRUE(e->Synchronize(Duration(1)).ok());
}

TEST_F(EventTest, CompletesWhenStreamPassesRecordPoint) {
  auto s = NewStream("s");
  auto e = NewEvent();
  Gate gate;
  ASSERT_TRUE(s->Enqueue([&] { return gate.Wait(); }).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  EXPECT_FALSE(e->Query());
  EXPECT_EQ(e->Synchronize(Duration(10)).code(), StatusCode::kDeadlineExceeded);
  gate.Open();
  EXPECT_TRUE(e->Synchronize().ok());
  EXPECT_TRUE(e->Query());
}

TEST_F(EventTest, CrossStreamWaitOrdersConsumerAfterProducerWithoutBlockingHost) {
  auto producer = NewStream("producer");
  auto consumer = NewStream("consumer");
  auto ready = NewEvent();
  Gate gate;
  std::atomic<int> value{0};
  std::atomic<int> seen{-1};
  ASSERT_TRUE(producer->Enqueue([&] { return gate.Wait(); }).ok());
  ASSERT_TRUE(producer->Enqueue([&] {
                 value = 42;
                 return OkStatus();
               }).ok());
  ASSERT_TRUE(ready->Record(*producer).ok());
  ASSERT_TRUE(consumer->WaitEvent(*ready).ok());  // returns at once: host not blocked
  ASSERT_TRUE(consumer->Enqueue([&] {
                 seen = value.load();
                 return OkStatus();
               }).ok());
  EXPECT_FALSE(consumer->Query());
  gate.Open();
  ASSERT_TRUE(consumer->Synchronize().ok());
  EXPECT_EQ(seen.load(), 42);
}

TEST_F(EventTest, WaitTargetsTheRecordAtTheTimeOfTheWait) {
  auto a = NewStream("a");
  auto b = NewStream("b");
  auto e = NewEvent();
  Gate first, second;
  ASSERT_TRUE(a->Enqueue([&] { return first.Wait(); }).ok());
  ASSERT_TRUE(e->Record(*a).ok());
  ASSERT_TRUE(b->WaitEvent(*e).ok());
  std::atomic<bool> b_ran{false};
  ASSERT_TRUE(b->Enqueue([&] {
                 b_ran = true;
                 return OkStatus();
               }).ok());
  // Re-record behind a second gate; b must only wait for the first record.
  ASSERT_TRUE(a->Enqueue([&] { return second.Wait(); }).ok());
  ASSERT_TRUE(e->Record(*a).ok());
  first.Open();
  ASSERT_TRUE(b->Synchronize().ok());
  EXPECT_TRUE(b_ran.load());
  EXPECT_FALSE(e->Query());
  second.Open();
  EXPECT_TRUE(e->Synchronize().ok());
}

TEST_F(EventTest, StreamWaitGivesUpAfterItsTimeoutAndReportsIt) {
  auto a = NewStream("a");
  auto b = NewStream("waiter");
  auto e = NewEvent();
  Gate gate;
  ASSERT_TRUE(a->Enqueue([&] { return gate.Wait(); }).ok());
  ASSERT_TRUE(e->Record(*a).ok());
  static_cast<CpuStream*>(b.get())->set_wait_timeout(Duration(10));
  ASSERT_TRUE(b->WaitEvent(*e).ok());
  Status st = b->Synchronize();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("waiter"), std::string::npos);
  gate.Open();
  EXPECT_TRUE(a->Synchronize().ok());
}

TEST_F(EventTest, ElapsedTimeBetweenTimedEvents) {
  auto s = NewStream("s");
  auto start = NewEvent(true), end = NewEvent(true), untimed = NewEvent(false);
  ASSERT_TRUE(start->Record(*s).ok());
  ASSERT_TRUE(s->Enqueue([] { return OkStatus(); }).ok());
  ASSERT_TRUE(end->Record(*s).ok());
  ASSERT_TRUE(untimed->Record(*s).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  StatusOr<double> ms = start->ElapsedMillis(*end);
  ASSERT_TRUE(ms.ok());
  EXPECT_GE(*ms, 0.0);
  EXPECT_EQ(start->ElapsedMillis(*untimed).status().code(), StatusCode::kFailedPrecondition);
  auto never = NewEvent(true);
  EXPECT_EQ(start->ElapsedMillis(*never).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(EventTest, EventMayBeDestroyedBeforeItFires) {
  auto s = NewStream("s");
  Gate gate;
  ASSERT_TRUE(s->Enqueue([&] { return gate.Wait(); }).ok());
  {
    auto e = NewEvent();
    ASSERT_TRUE(e->Record(*s).ok());
  }
  gate.Open();
  EXPECT_TRUE(s->Synchronize().ok());
}

// Many producer streams each publish a sequence; one consumer stream per
// producer waits on the producer's event before reading. Run with tsan.
TEST_F(EventTest, ManyProducersAndConsumersSeeCompletedData) {
  constexpr int kPairs = 4, kRounds = 200;
  std::vector<std::unique_ptr<Stream>> producers, consumers;
  std::vector<std::vector<int>> data(kPairs, std::vector<int>(kRounds, 0));
  std::vector<int> bad(kPairs, 0);
  for (int p = 0; p < kPairs; ++p) {
    producers.push_back(NewStream("producer"));
    consumers.push_back(NewStream("consumer"));
  }
  std::vector<std::thread> hosts;
  for (int p = 0; p < kPairs; ++p) {
    hosts.emplace_back([&, p] {
      for (int r = 0; r < kRounds; ++r) {
        auto e = NewEvent();
        int* slot = &data[p][r];
        ASSERT_TRUE(producers[p]->Enqueue([slot, r] {
                                   *slot = r + 1;
                                   return OkStatus();
                                 }).ok());
        ASSERT_TRUE(e->Record(*producers[p]).ok());
        ASSERT_TRUE(consumers[p]->WaitEvent(*e).ok());
        int* b = &bad[p];
        ASSERT_TRUE(consumers[p]->Enqueue([slot, r, b] {
                                   if (*slot != r + 1) ++*b;
                                   return OkStatus();
                                 }).ok());
      }
    });
  }
  for (auto& h : hosts) h.join();
  for (int p = 0; p < kPairs; ++p) {
    ASSERT_TRUE(consumers[p]->Synchronize().ok());
    EXPECT_EQ(bad[p], 0);
  }
}

TEST_F(StreamTest, CopyAsyncCopiesInStreamOrder) {
  auto s = NewStream("copy");
  std::vector<char> a(1 << 16, 'x'), b(1 << 16, 0);
  ASSERT_TRUE(dev->CopyAsync(b.data(), a.data(), a.size(), *s).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(dev->CopyAsync(nullptr, a.data(), 1, *s).code(), StatusCode::kInvalidArgument);
}

TEST(DeviceTest, GetReturnsTheSameDeviceAndRejectsBadIds) {
  EXPECT_EQ(*Device::Get(DeviceId::Cpu(3)), *Device::Get(DeviceId::Cpu(3)));
  EXPECT_EQ(Device::Get(DeviceId::Cpu(-1)).status().code(), StatusCode::kInvalidArgument);
}

TEST(DeviceTest, CudaWithoutAGpuIsUnavailableNotAFailure) {
  int n = Device::CudaDeviceCount();
  EXPECT_GE(n, 0);
  if (n > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(Device::Get(DeviceId::Cuda(0)).status().code(), StatusCode::kUnavailable);
}

TEST(DeviceTest, RawAllocationIs64ByteAligned) {
  Device* dev = *Device::Get(DeviceId::Cpu(0));
  for (size_t bytes : {1u, 63u, 64u, 1000u, 1u << 20}) {
    StatusOr<void*> p = dev->RawAllocate(bytes);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 64, 0u);
    dev->RawFree(*p, bytes);
  }
}

// FSDP and DDP branch on these, never on the kind: a CPU op is done when
// issued and reads host memory; a GPU's (the defaults) is not.
TEST(DeviceCapabilities, CpuRunsOpsWhenIssuedOnHostMemory) {
  auto cpu = Device::CapabilitiesOf(DeviceId::Cpu(0));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->ops_run_when_issued);
  EXPECT_TRUE(cpu->host_memory);
  EXPECT_FALSE(cpu->virtual_time);
  EXPECT_FALSE(cpu->native_streams);
  const DeviceCapabilities defaults;
  EXPECT_FALSE(defaults.ops_run_when_issued || defaults.host_memory || defaults.virtual_time ||
               defaults.native_streams);
  EXPECT_EQ(Device::CapabilitiesOf(DeviceId::Cpu(-1)).status().code(), StatusCode::kInvalidArgument);
}

// Options are checked before their device exists: the kind's capabilities
// are the device's, and a GPU's ops are enqueued on native streams.
TEST(DeviceCapabilities, KnownBeforeTheDeviceExists) {
  const DeviceCapabilities cpu = KindCapabilities(DeviceKind::kCpu);
  EXPECT_TRUE(cpu.ops_run_when_issued && cpu.host_memory && cpu.masked_fused_attention);
  EXPECT_FALSE(cpu.virtual_time || cpu.native_streams || cpu.device_memory());
  const DeviceCapabilities cuda = KindCapabilities(DeviceKind::kCuda);
  EXPECT_TRUE(cuda.native_streams && cuda.device_memory());
  EXPECT_FALSE(cuda.ops_run_when_issued || cuda.host_memory || cuda.virtual_time ||
               cuda.masked_fused_attention);
  const DeviceCapabilities sim = KindCapabilities(DeviceKind::kSim);
  EXPECT_TRUE(sim.virtual_time && sim.masked_fused_attention);
  EXPECT_FALSE(sim.ops_run_when_issued || sim.host_memory || sim.native_streams ||
               sim.device_memory());
  const DeviceCapabilities unknown = KindCapabilities(static_cast<DeviceKind>(7));
  EXPECT_FALSE(unknown.ops_run_when_issued || unknown.host_memory || unknown.virtual_time ||
               unknown.native_streams || unknown.masked_fused_attention);
  auto dev = Device::Get(DeviceId::Cpu(0));
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_TRUE((*dev)->capabilities().host_memory);
}

}  // namespace
}  // namespace sk
