// Several threads allocating, writing, recording and freeing through one
// allocator at once (run under --config=tsan and --config=asan as well).
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/memory/caching_allocator.h"
#include "tests/memory/test_util.h"

namespace sk {
namespace {

using testing::CpuDevice0;
using testing::ExpectConsistent;
using testing::MakeStream;

constexpr size_t kMiB = size_t{1} << 20;
constexpr int kThreads = 4;
constexpr int kIterations = 1500;

struct Held {
  std::shared_ptr<Storage> storage;
  unsigned char fill;
};

bool Intact(const Held& h) {
  const size_t n = h.storage->nbytes();
  if (n == 0) return true;
  const auto* p = static_cast<const unsigned char*>(h.storage->data());
  // Every byte equals the fill iff the first does and each equals the next.
  return p[0] == h.fill && std::memcmp(p, p + 1, n - 1) == 0;
}

// Each thread owns a stream, keeps a few storages filled with its own byte
// and checks them before freeing: overlapping blocks across threads would
// show as a foreign byte. Some storages are recorded on other threads'
// streams, some die on a stream's worker thread.
void Worker(CachingAllocator* allocator, const std::vector<std::unique_ptr<Stream>>* streams,
            int index, std::atomic<int64_t>* ooms, std::atomic<int>* corrupted) {
  std::mt19937_64 rng(1000 + index);
  Stream* mine = (*streams)[index].get();
  std::vector<Held> held;
  for (int i = 0; i < kIterations; ++i) {
    if (held.size() < 8 && rng() % 2 == 0) {
      const size_t bytes = rng() % 8 == 0 ? kMiB + rng() % kMiB : rng() % 16384;
      StatusOr<std::shared_ptr<Storage>> s = allocator->Allocate(bytes, mine);
      if (!s.ok()) {
        if (s.status().code() != StatusCode::kResourceExhausted) corrupted->fetch_add(1);
        ooms->fetch_add(1);
        continue;
      }
      const unsigned char fill = static_cast<unsigned char>(index * 64 + rng() % 64);
      if (bytes > 0) std::memset((*s)->data(), fill, bytes);
      held.push_back(Held{std::move(s).value(), fill});
    } else if (!held.empty()) {
      const size_t k = rng() % held.size();
      if (!Intact(held[k])) corrupted->fetch_add(1);
      Held h = std::move(held[k]);
      held.erase(held.begin() + static_cast<long>(k));
      const unsigned choice = rng() % 4;
      Stream* other = (*streams)[(index + 1 + rng() % (kThreads - 1)) % kThreads].get();
      if (choice == 0) {
        if (!allocator->RecordStream(*h.storage, other).ok()) corrupted->fetch_add(1);
      } else if (choice == 1) {
        // The last reference dies on `other`'s worker thread.
        std::shared_ptr<Storage> s = std::move(h.storage);
        if (!other->Enqueue([s]() -> Status { return OkStatus(); }).ok()) corrupted->fetch_add(1);
      }
    }
  }
}

TEST(CachingAllocatorThreadsTest, ConcurrentThreadsNeverShareALiveBlock) {
  Device* device = CpuDevice0();
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < kThreads; ++i) streams.push_back(MakeStream(device, "t" + std::to_string(i)));
  CachingAllocator allocator(device);
  std::atomic<int64_t> ooms{0};
  std::atomic<int> corrupted{0};
  std::atomic<bool> done{false};
  // An observer that reads stats and empties the cache while others allocate.
  std::thread observer([&] {
    for (int i = 0; !done.load(); ++i) {
      MemoryStats s = allocator.stats();
      if (s.allocated_bytes.current > s.reserved_bytes.current) corrupted.fetch_add(1);
      allocator.Snapshot();
      if (i % 64 == 0) allocator.EmptyCache();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < kThreads; ++i) {
    workers.emplace_back(Worker, &allocator, &streams, i, &ooms, &corrupted);
  }
  for (auto& t : workers) t.join();
  done.store(true);
  observer.join();
  for (auto& s : streams) ASSERT_TRUE(s->Synchronize().ok());
  allocator.EmptyCache();

  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(ooms.load(), 0);
  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.active_bytes.current, 0);
  EXPECT_EQ(stats.reserved_bytes.current, 0);
  EXPECT_EQ(stats.allocated_bytes.allocated, stats.allocated_bytes.freed);
  ExpectConsistent(allocator);
}

TEST(CachingAllocatorThreadsTest, ConcurrentThreadsUnderATightCapNeverExceedIt) {
  Device* device = CpuDevice0();
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < kThreads; ++i) streams.push_back(MakeStream(device, "c" + std::to_string(i)));
  CachingAllocator::Options options;
  options.capacity_bytes = 12 * kMiB;
  options.pending_free_timeout = Duration(50);
  CachingAllocator allocator(device, options);
  std::atomic<int64_t> ooms{0};
  std::atomic<int> corrupted{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < kThreads; ++i) {
    workers.emplace_back(Worker, &allocator, &streams, i, &ooms, &corrupted);
  }
  for (auto& t : workers) t.join();
  for (auto& s : streams) ASSERT_TRUE(s->Synchronize().ok());

  EXPECT_EQ(corrupted.load(), 0);
  MemoryStats stats = allocator.stats();
  EXPECT_LE(stats.reserved_bytes.peak, static_cast<int64_t>(12 * kMiB));
  EXPECT_EQ(stats.num_ooms, ooms.load());
  EXPECT_GT(stats.num_alloc_retries, 0);  // four streams cannot all cache under 12 MiB
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  ExpectConsistent(allocator);
}

TEST(CachingAllocatorThreadsTest, RanksAsThreadsEachUseTheirOwnDeviceAllocator) {
  std::vector<std::thread> ranks;
  std::atomic<int> failures{0};
  for (int rank = 0; rank < kThreads; ++rank) {
    ranks.emplace_back([rank, &failures] {
      StatusOr<CachingAllocator*> a = CachingAllocator::ForDevice(DeviceId::Cpu(20 + rank));
      StatusOr<Device*> d = Device::Get(DeviceId::Cpu(20 + rank));
      if (!a.ok() || !d.ok()) {
        failures.fetch_add(1);
        return;
      }
      std::unique_ptr<Stream> stream = MakeStream(*d, "compute");
      StreamAllocator alloc(*a, stream.get());
      for (int i = 0; i < 200; ++i) {
        StatusOr<Tensor> t = alloc.Zeros(DType::kF32, Shape{64, 1 + rank});
        if (!t.ok() || t->device() != DeviceId::Cpu(20 + rank)) failures.fetch_add(1);
      }
      // Only this rank's traffic is in this rank's stats.
      if ((*a)->stats().num_allocs != 200) failures.fetch_add(1);
      if ((*a)->stats().allocated_bytes.current != 0) failures.fetch_add(1);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace sk
