// Randomized alloc / free / record_stream sequences over several streams, with
// streams held and released at random, checked after every step against the
// allocator's invariants.
#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/memory/caching_allocator.h"
#include "tests/memory/test_util.h"

namespace sk {
namespace {

using testing::CpuDevice0;
using testing::ExpectConsistent;
using testing::Gate;
using testing::MakeStream;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kCap = 32 * kMiB;

// What the test knows about one of its storages.
struct LiveBlock {
  std::shared_ptr<Storage> storage;
  size_t stream;
  unsigned char fill;
  // One flag per RecordStream: set by a closure enqueued on the recorded
  // stream, i.e. once that stream has passed the block's last use.
  std::vector<std::shared_ptr<std::atomic<bool>>> uses;
};

// A freed block whose recorded streams may still be using it.
struct FreedBlock {
  uintptr_t begin;
  uintptr_t end;
  std::vector<std::shared_ptr<std::atomic<bool>>> uses;
  bool InUse() const {
    for (const auto& u : uses) {
      if (!u->load()) return true;
    }
    return false;
  }
};

size_t RandomSize(std::mt19937_64& rng) {
  const unsigned kind = rng() % 20;
  if (kind < 10) return rng() % 2048;  // includes zero
  if (kind < 15) return rng() % kMiB + 1;
  if (kind < 18) return kMiB + rng() % (6 * kMiB);
  return 10 * kMiB + rng() % (4 * kMiB);
}

// `release_pages`: on cpu:0 itself, whose free pages go back to the system;
// otherwise on a device that keeps them (a GPU's books).
void RunSequence(uint64_t seed, int steps, bool release_pages) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (release_pages ? ", pages released" : ""));
  testing::PagesKeptDevice kept_pages;
  Device* device = release_pages ? CpuDevice0() : static_cast<Device*>(&kept_pages);
  const size_t page = device->release_page_bytes();
  constexpr size_t kStreams = 3;
  std::vector<std::unique_ptr<Stream>> streams;
  for (size_t i = 0; i < kStreams; ++i) streams.push_back(MakeStream(device, "s" + std::to_string(i)));
  std::vector<std::unique_ptr<Gate>> gates(kStreams);

  CachingAllocator::Options options;
  options.capacity_bytes = kCap;
  options.pending_free_timeout = Duration(2);  // held streams are only released by this thread
  auto allocator = std::make_unique<CachingAllocator>(device, options);
  std::mt19937_64 rng(seed);
  std::map<uintptr_t, LiveBlock> live;  // by address (non-empty storages only)
  std::vector<std::shared_ptr<Storage>> empty;
  std::vector<FreedBlock> freed;
  int64_t ooms = 0;
  int64_t deferred_frees = 0;

  for (int step = 0; step < steps && !::testing::Test::HasFailure(); ++step) {
    const unsigned op = rng() % 100;
    if (op < 40) {
      const size_t s = rng() % kStreams;
      const size_t bytes = RandomSize(rng);
      StatusOr<std::shared_ptr<Storage>> r = allocator->Allocate(bytes, streams[s].get());
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
        ++ooms;
        if (release_pages) {
          // Refused only when the bytes in use (allocated or awaiting other
          // streams), the request, and the partial pages at the ends of the
          // free blocks pass the cap: fragmentation never refuses.
          int64_t free_blocks = 0;
          for (const SegmentInfo& seg : allocator->Snapshot()) {
            for (const BlockInfo& b : seg.blocks) free_blocks += !b.allocated && !b.awaiting_events;
          }
          const int64_t request = static_cast<int64_t>((bytes + 511) / 512 * 512);
          ASSERT_GT(allocator->stats().active_bytes.current + request +
                        2 * static_cast<int64_t>(page) * free_blocks,
                    static_cast<int64_t>(kCap))
              << "refused " << bytes << " bytes that fit: " << r.status();
        }
        continue;
      }
      std::shared_ptr<Storage> storage = std::move(r).value();
      if (bytes == 0) {
        empty.push_back(std::move(storage));
        continue;
      }
      const uintptr_t begin = reinterpret_cast<uintptr_t>(storage->data());
      const uintptr_t end = begin + bytes;
      // No overlap with a live block.
      auto next = live.lower_bound(begin);
      if (next != live.end()) {
        ASSERT_GE(next->first, end) << "overlaps a live block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.storage->nbytes(), begin) << "overlaps a live block";
      }
      // Not reused before its recorded streams passed their events.
      for (const FreedBlock& f : freed) {
        if (f.begin < end && begin < f.end) {
          ASSERT_FALSE(f.InUse()) << "reused before its event";
        }
      }
      const unsigned char fill = static_cast<unsigned char>(rng());
      // Marks at both ends and the middle (whole fills would dominate the run).
      auto* data = static_cast<unsigned char*>(storage->data());
      data[0] = data[bytes / 2] = data[bytes - 1] = fill;
      live.emplace(begin, LiveBlock{std::move(storage), s, fill, {}});
    } else if (op < 80) {
      if (live.empty()) continue;
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      // Nobody wrote into our block while we held it.
      const auto* bytes = static_cast<const unsigned char*>(it->second.storage->data());
      const size_t n = it->second.storage->nbytes();
      ASSERT_EQ(bytes[0], it->second.fill);
      ASSERT_EQ(bytes[n / 2], it->second.fill);
      ASSERT_EQ(bytes[n - 1], it->second.fill);
      FreedBlock f{it->first, it->first + n, std::move(it->second.uses)};
      live.erase(it);  // the storage dies here
      if (!f.uses.empty()) {
        ++deferred_frees;
        freed.push_back(std::move(f));
      }
      if (!empty.empty() && rng() % 2) empty.pop_back();
    } else if (op < 92) {
      if (live.empty()) continue;
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const size_t s = rng() % kStreams;
      ASSERT_TRUE(allocator->RecordStream(*it->second.storage, streams[s].get()).ok());
      if (s != it->second.stream) {
        auto used = std::make_shared<std::atomic<bool>>(false);
        ASSERT_TRUE(streams[s]
                        ->Enqueue([used]() -> Status {
                          used->store(true);
                          return OkStatus();
                        })
                        .ok());
        it->second.uses.push_back(std::move(used));
      }
    } else if (op < 96) {
      const size_t s = rng() % kStreams;
      if (gates[s] == nullptr) {
        gates[s] = std::make_unique<Gate>();
        gates[s]->Block(*streams[s]);
      } else {
        gates[s]->Open();
        gates[s].reset();
      }
    } else if (op < 98) {
      allocator->EmptyCache();
    } else {
      allocator->ResetPeakStats();
    }

    std::erase_if(freed, [](const FreedBlock& f) { return !f.InUse(); });
    MemoryStats stats = allocator->stats();
    ASSERT_LE(stats.reserved_bytes.current, static_cast<int64_t>(kCap));
    ASSERT_LE(stats.reserved_bytes.peak, static_cast<int64_t>(kCap));
    int64_t live_bytes = 0;
    for (const auto& [addr, b] : live) live_bytes += static_cast<int64_t>(b.storage->nbytes());
    ASSERT_GE(stats.allocated_bytes.current, live_bytes);
    ASSERT_EQ(stats.num_ooms, ooms);
    ExpectConsistent(*allocator);
  }

  // The sequence reached the paths it is meant to check.
  EXPECT_GT(deferred_frees, 0);
  EXPECT_GT(allocator->stats().num_alloc_retries, 0);
  if (release_pages) {
    EXPECT_GT(allocator->stats().released_bytes.allocated, 0);  // pages went back
    EXPECT_GT(allocator->stats().released_bytes.freed, 0);      // and came into use again
  } else {
    EXPECT_GT(ooms, 0);
    EXPECT_EQ(allocator->stats().released_bytes.allocated, 0);
  }

  // Free everything (recording events on the streams), then let the streams
  // pass them: afterwards every block must be back and every segment free.
  live.clear();
  empty.clear();
  for (auto& g : gates) {
    if (g != nullptr) g->Open();
  }
  for (auto& s : streams) ASSERT_TRUE(s->Synchronize().ok());
  allocator->EmptyCache();
  MemoryStats stats = allocator->stats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.active_bytes.current, 0);
  EXPECT_EQ(stats.reserved_bytes.current, 0);
  EXPECT_GT(stats.num_allocs, 0);
  allocator.reset();
}

TEST(CachingAllocatorRandomTest, InvariantsHoldUnderRandomTrafficSeed1) { RunSequence(1, 3000, false); }
TEST(CachingAllocatorRandomTest, InvariantsHoldUnderRandomTrafficSeed2) { RunSequence(2, 3000, false); }
TEST(CachingAllocatorRandomTest, InvariantsHoldUnderRandomTrafficSeed3) { RunSequence(3, 3000, false); }
TEST(CachingAllocatorRandomTest, InvariantsHoldUnderRandomTrafficSeed4) { RunSequence(4, 3000, false); }
TEST(CachingAllocatorRandomTest, InvariantsHoldWithPagesReleasedSeed1) { RunSequence(1, 3000, true); }
TEST(CachingAllocatorRandomTest, InvariantsHoldWithPagesReleasedSeed2) { RunSequence(2, 3000, true); }
TEST(CachingAllocatorRandomTest, InvariantsHoldWithPagesReleasedSeed3) { RunSequence(3, 3000, true); }
TEST(CachingAllocatorRandomTest, InvariantsHoldWithPagesReleasedSeed4) { RunSequence(4, 3000, true); }

}  // namespace
}  // namespace sk
