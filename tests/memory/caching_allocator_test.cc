#include "runtime/memory/caching_allocator.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/trace.h"
#include "tests/memory/test_util.h"

namespace sk {
namespace {

using testing::CpuDevice0;
using testing::ExpectConsistent;
using testing::Gate;
using testing::MakeStream;

constexpr size_t kMiB = size_t{1} << 20;

uintptr_t Addr(const std::shared_ptr<Storage>& s) { return reinterpret_cast<uintptr_t>(s->data()); }

std::shared_ptr<Storage> MustAllocate(CachingAllocator& a, size_t bytes, Stream* stream) {
  StatusOr<std::shared_ptr<Storage>> s = a.Allocate(bytes, stream);
  CHECK(s.ok()) << s.status();
  return std::move(s).value();
}

// A device that forwards to cpu:0 but refuses RawAllocate beyond `limit`
// outstanding bytes, like a real device running out of memory below any cap,
// and tracks what was not given back.
class LimitedDevice final : public Device {
 public:
  explicit LimitedDevice(size_t limit) : inner_(CpuDevice0()), limit_(limit) {}
  DeviceId id() const override { return inner_->id(); }
  StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) override {
    return inner_->CreateStream(name);
  }
  StatusOr<std::unique_ptr<Event>> CreateEvent(bool timing) override {
    return inner_->CreateEvent(timing);
  }
  StatusOr<void*> RawAllocate(size_t bytes) override {
    if (outstanding_ + bytes > limit_) return ResourceExhaustedError("device is full");
    SK_ASSIGN_OR_RETURN(void* p, inner_->RawAllocate(bytes));
    outstanding_ += bytes;
    return p;
  }
  void RawFree(void* ptr, size_t bytes) override {
    outstanding_ -= bytes;
    inner_->RawFree(ptr, bytes);
  }
  Status CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) override {
    return inner_->CopyAsync(dst, src, bytes, stream);
  }
  size_t outstanding() const { return outstanding_; }

 private:
  Device* inner_;
  size_t limit_;
  size_t outstanding_ = 0;  // only touched under the allocator's lock
};

class CachingAllocatorTest : public ::testing::Test {
 protected:
  Device* device_ = CpuDevice0();
  std::unique_ptr<Stream> s0_ = MakeStream(device_, "s0");
  std::unique_ptr<Stream> s1_ = MakeStream(device_, "s1");
};

TEST_F(CachingAllocatorTest, FreedBlockIsReusedOnTheSameStream) {
  CachingAllocator a(device_);
  uintptr_t first;
  {
    auto s = MustAllocate(a, 1000, s0_.get());
    first = Addr(s);
    EXPECT_EQ(s->nbytes(), 1000u);
    EXPECT_EQ(first % kHostAlignment, 0u);
  }
  auto again = MustAllocate(a, 1000, s0_.get());
  EXPECT_EQ(Addr(again), first);
  EXPECT_EQ(a.stats().segments.allocated, 1);
  EXPECT_EQ(a.stats().num_allocs, 2);
}

TEST_F(CachingAllocatorTest, CachedBlockIsNotHandedToAnotherStream) {
  CachingAllocator a(device_);
  uintptr_t first;
  {
    auto s = MustAllocate(a, 1000, s0_.get());
    first = Addr(s);
  }
  auto other = MustAllocate(a, 1000, s1_.get());
  EXPECT_NE(Addr(other), first);
  EXPECT_EQ(a.stats().segments.current, 2);
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, SmallRequestsSplitOneSegmentAndCoalesceWhenFreed) {
  CachingAllocator a(device_);
  auto x = MustAllocate(a, 1, s0_.get());
  auto y = MustAllocate(a, 512, s0_.get());
  auto z = MustAllocate(a, 513, s0_.get());
  // Carved downwards from the top of one 2 MiB segment.
  std::vector<SegmentInfo> snap = a.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  const uintptr_t base = snap[0].address;
  EXPECT_EQ(Addr(x), base + 2 * kMiB - 512);
  EXPECT_EQ(Addr(y), Addr(x) - 512);
  EXPECT_EQ(Addr(z), Addr(y) - 1024);
  EXPECT_EQ(a.stats().allocated_bytes.current, 512 + 512 + 1024);
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(2 * kMiB));

  y.reset();  // between z and x: nothing to merge with
  snap = a.Snapshot();
  ASSERT_EQ(snap[0].blocks.size(), 4u);
  x.reset();  // merges with y's block below it
  snap = a.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  ASSERT_EQ(snap[0].blocks.size(), 3u);
  EXPECT_EQ(snap[0].blocks[0].address, base);
  EXPECT_FALSE(snap[0].blocks[0].allocated);
  EXPECT_TRUE(snap[0].blocks[1].allocated);  // z
  EXPECT_EQ(snap[0].blocks[2].address, Addr(z) + 1024);
  EXPECT_EQ(snap[0].blocks[2].size, 1024u);  // x and y merged
  EXPECT_FALSE(snap[0].blocks[2].allocated);
  ExpectConsistent(a);

  z.reset();  // merges with both neighbours
  snap = a.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  ASSERT_EQ(snap[0].blocks.size(), 1u);
  EXPECT_EQ(snap[0].blocks[0].size, 2 * kMiB);
  EXPECT_FALSE(snap[0].blocks[0].allocated);
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, SmallAndLargeRequestsUseSeparatePoolsAndSegmentSizes) {
  CachingAllocator a(device_);
  auto small = MustAllocate(a, 1 * kMiB, s0_.get());
  auto huge = MustAllocate(a, 11 * kMiB, s0_.get());  // takes all 12 MiB: 1 MiB is no split
  auto large = MustAllocate(a, 1 * kMiB + 1, s0_.get());
  std::vector<SegmentInfo> snap = a.Snapshot();
  ASSERT_EQ(snap.size(), 3u);
  std::vector<std::pair<size_t, bool>> sizes;
  for (const SegmentInfo& seg : snap) sizes.emplace_back(seg.size, seg.small_pool);
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes[0], std::make_pair(2 * kMiB, true));    // kSmallBuffer
  EXPECT_EQ(sizes[1], std::make_pair(12 * kMiB, false));  // 11 MiB rounded to 2 MiB
  EXPECT_EQ(sizes[2], std::make_pair(20 * kMiB, false));  // kLargeBuffer
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, LargeBlockKeepsASliverNoLargerThanSmallSize) {
  CachingAllocator a(device_);
  auto two = MustAllocate(a, 2 * kMiB, s0_.get());  // from a 20 MiB segment, 18 MiB left
  auto rest = MustAllocate(a, 17 * kMiB + kMiB / 2, s0_.get());
  EXPECT_EQ(Addr(rest), Addr(two) - 18 * kMiB);  // the whole rest of the segment
  // The 0.5 MiB remainder is not split off: the whole 18 MiB is allocated.
  EXPECT_EQ(a.stats().allocated_bytes.current, static_cast<int64_t>(20 * kMiB));
  EXPECT_EQ(a.stats().segments.current, 1);
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, ZeroByteAllocationIsValidWithoutMemory) {
  CachingAllocator a(device_);
  auto s = MustAllocate(a, 0, s0_.get());
  EXPECT_EQ(s->data(), nullptr);
  EXPECT_EQ(s->nbytes(), 0u);
  EXPECT_EQ(s->device(), device_->id());
  EXPECT_TRUE(a.RecordStream(*s, s1_.get()).ok());
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().num_allocs, 1);
}

TEST_F(CachingAllocatorTest, StatsEqualARecountAfterMixedTraffic) {
  CachingAllocator a(device_);
  std::vector<std::shared_ptr<Storage>> live;
  const size_t sizes[] = {1, 700, 4096, kMiB - 1, kMiB + 5, 3 * kMiB, 12 * kMiB + 7};
  for (int round = 0; round < 3; ++round) {
    for (size_t n : sizes) {
      live.push_back(MustAllocate(a, n, round % 2 ? s0_.get() : s1_.get()));
    }
    for (size_t i = 0; i < live.size(); i += 2) live[i].reset();
    ExpectConsistent(a);
  }
  live.clear();
  ExpectConsistent(a);
  MemoryStats stats = a.stats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.active_bytes.current, 0);
  EXPECT_EQ(stats.allocated_bytes.allocated, stats.allocated_bytes.freed);
  EXPECT_EQ(stats.num_allocs, 21);
}

TEST_F(CachingAllocatorTest, EmptyCacheReturnsUnusedSegmentsOnlyWherePagesAreKept) {
  testing::PagesKeptDevice kept_pages;  // a GPU's books: segments go back whole
  CachingAllocator a(&kept_pages);
  auto kept = MustAllocate(a, 100, s0_.get());
  MustAllocate(a, 5 * kMiB, s0_.get()).reset();
  MustAllocate(a, 100, s1_.get()).reset();
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>((2 + 20 + 2) * kMiB));
  a.EmptyCache();
  MemoryStats stats = a.stats();
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(2 * kMiB));  // kept's segment
  EXPECT_EQ(stats.segments.current, 1);
  EXPECT_EQ(stats.allocated_bytes.current, 512);
  kept.reset();
  a.EmptyCache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().reserved_bytes.peak, static_cast<int64_t>(24 * kMiB));
}

TEST_F(CachingAllocatorTest, ResetPeakStatsSetsPeaksToCurrent) {
  CachingAllocator a(device_);
  auto kept = MustAllocate(a, 1024, s0_.get());
  MustAllocate(a, 4096, s0_.get()).reset();
  EXPECT_EQ(a.stats().allocated_bytes.peak, 1024 + 4096);
  a.ResetPeakStats();
  MemoryStats stats = a.stats();
  EXPECT_EQ(stats.allocated_bytes.peak, 1024);
  EXPECT_EQ(stats.active_bytes.peak, 1024);
  EXPECT_EQ(stats.reserved_bytes.peak, static_cast<int64_t>(2 * kMiB));
  auto more = MustAllocate(a, 512, s0_.get());
  EXPECT_EQ(a.stats().allocated_bytes.peak, 1024 + 512);
}

TEST_F(CachingAllocatorTest, AllocateRejectsNullStreamAndStreamOfAnotherDevice) {
  CachingAllocator a(device_);
  StatusOr<Device*> other = Device::Get(DeviceId::Cpu(1));
  ASSERT_TRUE(other.ok());
  std::unique_ptr<Stream> foreign = MakeStream(*other, "foreign");
  EXPECT_EQ(a.Allocate(16, nullptr).status().code(), StatusCode::kInvalidArgument);
  StatusOr<std::shared_ptr<Storage>> s = a.Allocate(16, foreign.get());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("cpu:1"), std::string_view::npos);
}

TEST_F(CachingAllocatorTest, RecordStreamRejectsStoragesOfOtherAllocators) {
  CachingAllocator a(device_);
  CachingAllocator b(device_);
  auto from_b = MustAllocate(b, 64, s0_.get());
  EXPECT_EQ(a.RecordStream(*from_b, s1_.get()).code(), StatusCode::kInvalidArgument);
  StatusOr<std::shared_ptr<Storage>> host = HostAllocator::Default().AllocateBytes(64);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(a.RecordStream(**host, s1_.get()).code(), StatusCode::kInvalidArgument);
  auto wrapped = Storage::Wrap(from_b->data(), 64, device_->id());
  EXPECT_EQ(a.RecordStream(*wrapped, s1_.get()).code(), StatusCode::kInvalidArgument);
  auto mine = MustAllocate(a, 64, s0_.get());
  EXPECT_EQ(a.RecordStream(*mine, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST_F(CachingAllocatorTest, StreamAllocatorServesTheCoreAllocatorInterface) {
  CachingAllocator a(device_);
  StreamAllocator alloc(&a, s0_.get());
  Allocator& core = alloc;
  EXPECT_EQ(core.device(), device_->id());
  StatusOr<Tensor> t = core.Zeros(DType::kF32, Shape{4, 8});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nbytes(), 128u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(t->data_as<float>()[i], 0.0f);
  EXPECT_EQ(a.stats().allocated_bytes.current, 512);
  EXPECT_TRUE(a.RecordStream(*t->storage(), s1_.get()).ok());
}

TEST_F(CachingAllocatorTest, EmitsAllocatedAndReservedTraceCountersWhenTracing) {
  CachingAllocator a(device_);
  TraceRecorder& trace = TraceRecorder::Global();
  trace.Start();
  MustAllocate(a, 4096, s0_.get()).reset();
  trace.Stop();
  std::string json = trace.ToJson();
  EXPECT_NE(json.find("memory cpu:0"), std::string::npos);
  EXPECT_NE(json.find("reserved"), std::string::npos);
  EXPECT_NE(json.find("allocated"), std::string::npos);
  const size_t events = trace.event_count();
  MustAllocate(a, 4096, s0_.get()).reset();
  EXPECT_EQ(trace.event_count(), events);  // nothing recorded when off
}

TEST_F(CachingAllocatorTest, ForDeviceGivesOneAllocatorPerDevice) {
  StatusOr<CachingAllocator*> a = CachingAllocator::ForDevice(DeviceId::Cpu(3));
  StatusOr<CachingAllocator*> b = CachingAllocator::ForDevice(DeviceId::Cpu(3));
  StatusOr<CachingAllocator*> c = CachingAllocator::ForDevice(DeviceId::Cpu(4));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_EQ((*c)->device(), DeviceId::Cpu(4));
  EXPECT_EQ(CachingAllocator::ForDevice(DeviceId::Cpu(-1)).status().code(),
            StatusCode::kInvalidArgument);
}

// --- record_stream -------------------------------------------------------

TEST_F(CachingAllocatorTest, RecordedBlockIsNotReusedBeforeTheOtherStreamPassesItsEvent) {
  CachingAllocator a(device_);
  Gate gate;
  gate.Block(*s1_);  // s1 cannot pass anything recorded from now on
  auto x = MustAllocate(a, 512, s0_.get());
  const uintptr_t x_addr = Addr(x);
  ASSERT_TRUE(a.RecordStream(*x, s1_.get()).ok());
  x.reset();
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
  EXPECT_EQ(a.stats().active_bytes.current, 512);  // awaiting s1

  auto y = MustAllocate(a, 512, s0_.get());
  EXPECT_NE(Addr(y), x_addr);
  ASSERT_TRUE(a.Snapshot()[0].blocks.back().awaiting_events);
  ExpectConsistent(a);

  gate.Open();
  ASSERT_TRUE(s1_->Synchronize().ok());
  y.reset();
  auto z = MustAllocate(a, 512, s0_.get());  // processes the event first
  EXPECT_EQ(Addr(z), x_addr);
  EXPECT_EQ(a.stats().active_bytes.current, 512);
  EXPECT_EQ(a.stats().segments.current, 1);
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, RecordStreamOnTheOwningStreamDoesNotDeferTheFree) {
  CachingAllocator a(device_);
  Gate gate;
  gate.Block(*s0_);
  auto x = MustAllocate(a, 512, s0_.get());
  const uintptr_t x_addr = Addr(x);
  ASSERT_TRUE(a.RecordStream(*x, s0_.get()).ok());
  x.reset();
  EXPECT_EQ(Addr(MustAllocate(a, 512, s0_.get())), x_addr);
  gate.Open();
}

TEST_F(CachingAllocatorTest, BlockRecordedOnTwoStreamsWaitsForBoth) {
  CachingAllocator a(device_);
  std::unique_ptr<Stream> s2 = MakeStream(device_, "s2");
  Gate g1, g2;
  g1.Block(*s1_);
  g2.Block(*s2);
  auto x = MustAllocate(a, 512, s0_.get());
  ASSERT_TRUE(a.RecordStream(*x, s1_.get()).ok());
  ASSERT_TRUE(a.RecordStream(*x, s2.get()).ok());
  ASSERT_TRUE(a.RecordStream(*x, s2.get()).ok());  // twice is once
  x.reset();
  g1.Open();
  ASSERT_TRUE(s1_->Synchronize().ok());
  a.EmptyCache();  // processes events: one of two has completed
  EXPECT_EQ(a.stats().active_bytes.current, 512);
  g2.Open();
  ASSERT_TRUE(s2->Synchronize().ok());
  a.EmptyCache();
  EXPECT_EQ(a.stats().active_bytes.current, 0);
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
}

TEST_F(CachingAllocatorTest, AllocationAtTheCapWaitsForAPendingFree) {
  CachingAllocator::Options options;
  options.capacity_bytes = 2 * kMiB;
  CachingAllocator a(device_, options);
  Gate gate;
  gate.Block(*s1_);
  auto x = MustAllocate(a, kMiB, s0_.get());
  auto other_half = MustAllocate(a, kMiB, s0_.get());
  const uintptr_t x_addr = Addr(x);
  ASSERT_TRUE(a.RecordStream(*x, s1_.get()).ok());
  x.reset();
  // The only memory under the cap awaits s1; open it from another thread
  // while (or before) this thread waits inside Allocate.
  std::thread opener([&gate] { gate.Open(); });
  StatusOr<std::shared_ptr<Storage>> y = a.Allocate(kMiB, s0_.get());
  opener.join();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(Addr(*y), x_addr);
  MemoryStats stats = a.stats();
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.num_alloc_retries, 0);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(2 * kMiB));
}

TEST_F(CachingAllocatorTest, PendingFreeThatNeverCompletesEndsInOomNotAHang) {
  CachingAllocator::Options options;
  options.capacity_bytes = 2 * kMiB;
  options.pending_free_timeout = Duration(20);
  CachingAllocator a(device_, options);
  Gate gate;
  gate.Block(*s1_);
  auto x = MustAllocate(a, kMiB, s0_.get());
  ASSERT_TRUE(a.RecordStream(*x, s1_.get()).ok());
  x.reset();
  StatusOr<std::shared_ptr<Storage>> y = a.Allocate(2 * kMiB, s0_.get());
  EXPECT_EQ(y.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(y.status().message().find("1 frees awaiting other streams"), std::string_view::npos)
      << y.status();
  gate.Open();
  ASSERT_TRUE(s1_->Synchronize().ok());
  EXPECT_TRUE(a.Allocate(2 * kMiB, s0_.get()).ok());
}

// --- capacity cap, retries and OOM ---------------------------------------

TEST_F(CachingAllocatorTest, OomAtTheCapNamesTheRequestAndLeavesTheAllocatorUsable) {
  CachingAllocator::Options options;
  options.capacity_bytes = 8 * kMiB;
  CachingAllocator a(device_, options);
  auto kept = MustAllocate(a, 3 * kMiB, s0_.get());  // 20 MiB segment won't fit: 3 MiB one
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(3 * kMiB));

  StatusOr<std::shared_ptr<Storage>> big = a.Allocate(6 * kMiB, s0_.get());
  ASSERT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  std::string_view msg = big.status().message();
  EXPECT_NE(msg.find("6.00 MiB (6291456 bytes)"), std::string_view::npos) << msg;
  EXPECT_NE(msg.find("capacity 8.00 MiB"), std::string_view::npos) << msg;
  EXPECT_NE(msg.find("allocated 3.00 MiB"), std::string_view::npos) << msg;
  EXPECT_NE(msg.find("reserved 3.00 MiB"), std::string_view::npos) << msg;
  EXPECT_NE(msg.find("cpu:0"), std::string_view::npos) << msg;
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().num_alloc_retries, 1);

  auto fits = MustAllocate(a, 5 * kMiB, s0_.get());
  EXPECT_LE(a.stats().reserved_bytes.current, static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(a.stats().num_ooms, 1);
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, AbsurdRequestIsResourceExhaustedNotAnOverflow) {
  CachingAllocator a(device_);
  StatusOr<std::shared_ptr<Storage>> s = a.Allocate(~size_t{0}, s0_.get());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_TRUE(a.Allocate(64, s0_.get()).ok());
}

TEST_F(CachingAllocatorTest, FragmentationAtTheCapFreesCachedSegmentsAndRetries) {
  CachingAllocator::Options options;
  options.capacity_bytes = 40 * kMiB;
  CachingAllocator a(device_, options);
  MustAllocate(a, 12 * kMiB, s0_.get()).reset();  // cached, but too small for what follows
  MustAllocate(a, 12 * kMiB, s1_.get()).reset();  // cached on another stream
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(24 * kMiB));
  auto big = MustAllocate(a, 30 * kMiB, s0_.get());
  MemoryStats stats = a.stats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(30 * kMiB));
  EXPECT_EQ(stats.reserved_bytes.peak, static_cast<int64_t>(30 * kMiB));  // never above the cap
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, DeviceRefusalBelowTheCapAlsoRetriesThenReportsOom) {
  LimitedDevice device(24 * kMiB);
  {
    CachingAllocator a(&device);  // no cap: the device itself is the limit
    MustAllocate(a, 12 * kMiB, s0_.get()).reset();
    auto x = MustAllocate(a, 14 * kMiB, s0_.get());
    EXPECT_EQ(a.stats().num_alloc_retries, 1);
    StatusOr<std::shared_ptr<Storage>> y = a.Allocate(12 * kMiB, s0_.get());
    EXPECT_EQ(y.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(y.status().message().find("device is full"), std::string_view::npos);
    EXPECT_NE(y.status().message().find("capacity unlimited"), std::string_view::npos);
    EXPECT_EQ(a.stats().num_ooms, 1);
  }
  EXPECT_EQ(device.outstanding(), 0u);  // the destructor returned every segment
}

TEST_F(CachingAllocatorTest, SetCapacityBelowMemoryInUseFailsAndKeepsTheOldCap) {
  testing::PagesKeptDevice kept_pages;  // the 20 MiB segment cannot shrink
  CachingAllocator a(&kept_pages);
  auto kept = MustAllocate(a, 3 * kMiB, s0_.get());  // a 20 MiB segment
  MustAllocate(a, 100, s0_.get()).reset();          // a cached 2 MiB segment
  EXPECT_EQ(a.SetCapacity(10 * kMiB).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.capacity_bytes(), 0u);
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(20 * kMiB));  // cache freed
  EXPECT_TRUE(a.SetCapacity(21 * kMiB).ok());
  EXPECT_EQ(a.capacity_bytes(), 21 * kMiB);
  EXPECT_EQ(a.Allocate(2 * kMiB, s1_.get()).status().code(), StatusCode::kResourceExhausted);
}

// --- releasing the pages of free blocks (cpu) -------------------------------

TEST_F(CachingAllocatorTest, EmptyCacheAlsoReleasesThePagesOfFreeBlocksInSegmentsInUse) {
  const size_t page = device_->release_page_bytes();
  ASSERT_GT(page, 0u);
  CachingAllocator a(device_);
  auto kept = MustAllocate(a, 100, s0_.get());  // carved from the top of a 2 MiB segment
  MustAllocate(a, 5 * kMiB, s0_.get()).reset();
  a.EmptyCache();
  MemoryStats stats = a.stats();
  EXPECT_EQ(stats.segments.current, 1);
  // Only the page under `kept` is still counted; the rest of its segment went back.
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(page));
  EXPECT_EQ(stats.released_bytes.current, static_cast<int64_t>(2 * kMiB - page));
  ExpectConsistent(a);
  // The released block serves again, and what is written there stays.
  auto again = MustAllocate(a, kMiB, s0_.get());
  std::memset(again->data(), 0x5a, kMiB);
  EXPECT_EQ(static_cast<unsigned char*>(again->data())[kMiB - 1], 0x5a);
  EXPECT_EQ(a.stats().reserved_bytes.current + a.stats().released_bytes.current,
            static_cast<int64_t>(2 * kMiB));
  EXPECT_GE(a.stats().reserved_bytes.current, static_cast<int64_t>(kMiB + page));
  ExpectConsistent(a);
  kept.reset();
  again.reset();
  a.EmptyCache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().released_bytes.current, 0);
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, SetCapacityReleasesFreePagesBeforeRefusing) {
  CachingAllocator a(device_);
  auto kept = MustAllocate(a, 3 * kMiB, s0_.get());  // a 20 MiB segment, 17 MiB of it free
  EXPECT_TRUE(a.SetCapacity(10 * kMiB).ok());
  EXPECT_EQ(a.capacity_bytes(), 10 * kMiB);
  EXPECT_LE(a.stats().reserved_bytes.current, static_cast<int64_t>(3 * kMiB + 4096 * 2));
  EXPECT_EQ(a.SetCapacity(2 * kMiB).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.capacity_bytes(), 10 * kMiB);
  ExpectConsistent(a);
}

// Free blocks stranded between allocated ones in several segments (what a
// 1.2B model's step met: 8.04 GiB allocated, 9.70 GiB reserved, a 1 GiB
// gather refused under a 10.4 GiB cap). Where pages can be released the
// request is served as long as the bytes in use leave room for it; where
// they cannot (a GPU's books) it fails as before.
void StrandFreeBlocks(CachingAllocator& a, Stream* s, std::vector<std::shared_ptr<Storage>>& held) {
  // Two 24 MiB segments of their own, cached ...
  held.push_back(MustAllocate(a, 24 * kMiB, s));
  held.push_back(MustAllocate(a, 24 * kMiB, s));
  held.clear();
  // ... then each cut into three 8 MiB blocks (best fit fills the first
  // before the second), and the middle one of each freed.
  std::vector<std::shared_ptr<Storage>> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(MustAllocate(a, 8 * kMiB, s));
  for (int i : {0, 2, 3, 5}) held.push_back(std::move(blocks[i]));
}

TEST_F(CachingAllocatorTest, FragmentedSegmentsServeARequestThatTheBytesInUseLeaveRoomFor) {
  CachingAllocator::Options options;
  options.capacity_bytes = 56 * kMiB;
  CachingAllocator a(device_, options);
  std::vector<std::shared_ptr<Storage>> held;
  StrandFreeBlocks(a, s0_.get(), held);
  MemoryStats before = a.stats();
  EXPECT_EQ(before.allocated_bytes.current, static_cast<int64_t>(32 * kMiB));
  EXPECT_EQ(before.reserved_bytes.current, static_cast<int64_t>(48 * kMiB));
  // 16 MiB is free, but in two 8 MiB holes; 48 + 16 would pass the cap.
  auto big = a.Allocate(16 * kMiB, s0_.get());
  ASSERT_TRUE(big.ok()) << big.status();
  MemoryStats after = a.stats();
  EXPECT_EQ(after.num_alloc_retries, 1);
  EXPECT_EQ(after.num_ooms, 0);
  EXPECT_EQ(after.released_bytes.current, static_cast<int64_t>(16 * kMiB));
  EXPECT_EQ(after.reserved_bytes.current, static_cast<int64_t>(48 * kMiB));  // 32 + the new 16
  EXPECT_LE(after.reserved_bytes.peak, static_cast<int64_t>(56 * kMiB));
  std::memset((*big)->data(), 1, 16 * kMiB);
  ExpectConsistent(a);
  // A hole serves again, its pages counted back against the cap.
  auto hole = MustAllocate(a, 8 * kMiB, s0_.get());
  std::memset(hole->data(), 2, 8 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(56 * kMiB));
  EXPECT_EQ(a.stats().released_bytes.current, static_cast<int64_t>(8 * kMiB));
  // Nothing is left for a third 8 MiB: the cap holds, with a clear error.
  auto over = a.Allocate(8 * kMiB, s0_.get());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("pages released"), std::string_view::npos)
      << over.status().message();
  EXPECT_LE(a.stats().reserved_bytes.peak, static_cast<int64_t>(56 * kMiB));
  ExpectConsistent(a);
  // Freeing next to a released hole releases the merged block in full.
  held[2].reset();  // the second segment's top block, above its hole
  EXPECT_EQ(a.stats().released_bytes.current, static_cast<int64_t>(16 * kMiB));
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(48 * kMiB));
  ExpectConsistent(a);
  hole.reset();
  big->reset();
  held.clear();
  a.EmptyCache();
  EXPECT_EQ(a.stats().reserved_bytes.current, 0);
  EXPECT_EQ(a.stats().released_bytes.current, 0);
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, FragmentedSegmentsRefuseTheRequestWherePagesAreKept) {
  testing::PagesKeptDevice kept_pages;
  CachingAllocator::Options options;
  options.capacity_bytes = 56 * kMiB;
  CachingAllocator a(&kept_pages, options);
  std::vector<std::shared_ptr<Storage>> held;
  StrandFreeBlocks(a, s0_.get(), held);
  auto big = a.Allocate(16 * kMiB, s0_.get());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.stats().released_bytes.current, 0);
  EXPECT_EQ(a.stats().reserved_bytes.current, static_cast<int64_t>(48 * kMiB));
  ExpectConsistent(a);
}

TEST_F(CachingAllocatorTest, StorageMayDieOnAStreamWorkerThread) {
  CachingAllocator a(device_);
  auto x = MustAllocate(a, 4096, s0_.get());
  std::memset(x->data(), 1, 4096);
  ASSERT_TRUE(s1_->Enqueue([x]() -> Status { return OkStatus(); }).ok());
  x.reset();
  ASSERT_TRUE(s1_->Synchronize().ok());
  EXPECT_EQ(a.stats().allocated_bytes.current, 0);
  ExpectConsistent(a);
}

}  // namespace
}  // namespace sk
