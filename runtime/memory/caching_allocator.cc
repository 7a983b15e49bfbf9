// The caching allocator: design.
//
// Segments and blocks. Memory is obtained from the device in segments (one
// Device::RawAllocate each) and handed out in blocks. A block is a contiguous
// range of one segment; the blocks of a segment tile it exactly and form a
// doubly linked list in address order (prev/next), so a freed block can find
// its neighbours in O(1). A block is in one of three states: free (cached in a
// pool), allocated (held by a live Storage), or awaiting events (freed, but
// another stream may still be using it; see below).
//
// Sizes. Requests are rounded up to a multiple of kMinBlockSize (512 bytes),
// which keeps every block aligned for any dtype and vector load and makes
// nearby sizes reuse each other's blocks. Requests up to kSmallSize (1 MiB)
// are served from the small pool, whose segments are kSmallBuffer (2 MiB)
// each; larger requests from the large pool, whose segments are kLargeBuffer
// (20 MiB) for requests under kMinLargeAlloc (10 MiB) and otherwise the request
// rounded up to kRoundLarge (2 MiB). Keeping small and large apart stops
// long-lived small tensors (biases, norms, scalars) from pinning the middle of
// a large segment, which would stop it from ever being returned or coalesced;
// these are the constants and reasons of PyTorch's CUDA caching allocator.
//
// Best fit, splitting, coalescing. Each pool is an ordered set of free blocks
// keyed by (stream, size, segment, address); a request takes the smallest free
// block of its stream that is large enough (lower_bound). Among blocks of
// equal size the oldest segment wins, and within a segment the lowest
// address: the choice never depends on where the device put a segment (what
// malloc returned, or a simulated device's fake addresses), so the same
// requests give the same books on every run and every device kind. PyTorch
// breaks the tie by address alone. If the block is larger than
// needed it is split: always in the small pool (remainder >= kMinBlockSize),
// and in the large pool only when the remainder exceeds kSmallSize, since a
// sliver of a large block is better given away whole than left to fragment
// the pool. The request is carved from the top of the free block, which keeps
// the rest at its address and in its pool entry (only its size shrinks); when
// a block is freed it is merged with free neighbours of its segment, the lower
// one absorbing it. In the steady state (one free block per stream, carved and
// merged back every step) neither path inserts into or erases from a pool; a
// segment whose blocks are all freed becomes one free block again and can be
// returned to the device.
//
// Streams. A block belongs to the stream it was allocated on (so does its
// segment and every block split from it). Freeing a block makes it reusable at
// once for later allocations on the same stream: work on one stream runs in
// order, so the next user's kernels run after the last user's. Blocks are
// never handed to another stream, which would need synchronisation.
//
// record_stream and deferred frees. If a block is used on other streams (a
// gathered parameter read by the compute stream, allocated on the all-gather
// stream), the caller says so with RecordStream. When such a block is freed,
// the allocator records an event on each of those streams and parks the block
// as awaiting events; it returns to its pool only when all of them have
// completed. Pending events are polled (Event::Query, a pair of atomic loads
// on CPU) at the start of every Allocate, so the cost is paid only while some
// block is awaiting. Events are pooled and reused.
//
// The capacity cap and OOM. Options::capacity_bytes bounds the reserved bytes
// (all segments), emulating a device of that size. A request that no cached
// block serves needs a new segment; if the preferred segment size would pass
// the cap, a segment of exactly the rounded request is tried instead (a capped
// device should fail only when the request itself does not fit). If that fails
// too (cap, or the device itself refused), the allocator in order:
//   1. waits, with the lock released, up to pending_free_timeout for blocks
//      awaiting events, since they are about to be free (once per request);
//   2. returns every fully free cached segment, of every stream and pool, to
//      the device and retries (counted in num_alloc_retries: a symptom of a
//      producer stream over-allocating, which FSDP's rate limiter prevents);
//   3. fails with ResourceExhausted naming the request, the cap and the
//      stats (counted in num_ooms). Nothing is left half-done: the allocator
//      stays consistent and usable.
//
// Releasing pages (devices with Device::release_page_bytes(): the
// CPU). Step 2 frees only segments with nothing allocated, so a cap can fail
// a request while the bytes in use leave room for it: free blocks stranded
// between allocated ones in many segments (a 1.2B model's step once failed a
// 1 GiB gather with 8.04 GiB allocated, 9.70 GiB reserved in 46 segments
// under a 10.4 GiB cap). Such a device can hand back the pages of a free
// block while its addresses stay in the segment, which is what PyTorch's
// expandable segments do by unmapping them. So step 2 also releases the whole
// pages of every cached free block (EmptyCache too), and reserved_bytes
// counts segments less released pages: under the cap, a request then fails
// only when the bytes in use, plus the partial pages at the ends of free
// blocks, leave no room for it. A free block is either unreleased or
// released in full (released_bytes = the whole pages inside it): a block
// freed next to a released one is merged and the merged block released, and
// serving a request from a released block takes back (counts in reserved,
// checked against the cap) exactly the pages the request's part covers; the
// remainder stays released. Pages are counted from the block's address, so
// devices whose segments start on a page (the promise of release_page_bytes)
// keep the same books.
//
// Concurrency. One mutex guards everything. The cached path (alloc from a
// pool, free back into it) allocates nothing under the lock: set nodes and
// Block objects are recycled through spare lists. The only waits (pending
// events, in step 1 and in the destructor) happen with the lock released,
// because the work that completes an event may itself free storages.
#include "runtime/memory/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "runtime/core/trace.h"

namespace sk {

namespace {

constexpr size_t kMiB = size_t{1} << 20;
// Every block size is a multiple of this; also the smallest block.
constexpr size_t kMinBlockSize = 512;
// Requests up to this size use the small pool.
constexpr size_t kSmallSize = 1 * kMiB;
// Segment size of the small pool.
constexpr size_t kSmallBuffer = 2 * kMiB;
// Segment size of the large pool for requests under kMinLargeAlloc.
constexpr size_t kLargeBuffer = 20 * kMiB;
// Large requests at least this big get a segment of their own size ...
constexpr size_t kMinLargeAlloc = 10 * kMiB;
// ... rounded up to this.
constexpr size_t kRoundLarge = 2 * kMiB;
// Requests above this are refused before any rounding could overflow.
constexpr size_t kMaxRequest = size_t{1} << 60;

size_t RoundUp(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

size_t RoundSize(size_t bytes) {
  return bytes < kMinBlockSize ? kMinBlockSize : RoundUp(bytes, kMinBlockSize);
}

size_t PreferredSegmentSize(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return RoundUp(size, kRoundLarge);
}

// Whether a free block that is `remaining` bytes larger than a request is
// split (see the essay) or handed out whole.
bool ShouldSplit(bool small, size_t remaining) {
  return small ? remaining >= kMinBlockSize : remaining > kSmallSize;
}

std::string FormatBytes(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f MiB (%lld bytes)", static_cast<double>(bytes) / kMiB,
                static_cast<long long>(bytes));
  return buf;
}

}  // namespace

struct CachingAllocator::Block {
  enum class State : uint8_t { kFree, kAllocated, kAwaitingEvents };

  char* ptr = nullptr;
  size_t size = 0;
  uint64_t segment_seq = 0;  // creation order of the block's segment
  int64_t stream_id = 0;
  bool small = false;
  State state = State::kFree;
  int pending_events = 0;
  // Free blocks only: bytes of its pages handed back to the system, 0 or all
  // the whole pages inside it (WholePages).
  size_t released = 0;
  Block* prev = nullptr;  // neighbours within the segment
  Block* next = nullptr;
  std::vector<Stream*> stream_uses;  // other streams named by RecordStream
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream_id != b->stream_id) return a->stream_id < b->stream_id;
  if (a->size != b->size) return a->size < b->size;
  if (a->segment_seq != b->segment_seq) return a->segment_seq < b->segment_seq;
  return std::less<const char*>()(a->ptr, b->ptr);
}

CachingAllocator::CachingAllocator(Device* device, Options options)
    : device_(device), device_id_(device->id()), trace_(TraceRecorder::Global()),
      options_(options) {}

CachingAllocator::~CachingAllocator() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!pending_.empty()) WaitForPendingFrees(lock);
  ProcessPendingFrees();
  ReleaseCachedSegments();
  int live = 0;
  int awaiting = 0;
  for (Block* head : segments_) {
    for (Block* b = head; b != nullptr; b = b->next) {
      live += b->state == Block::State::kAllocated;
      awaiting += b->state == Block::State::kAwaitingEvents;
    }
  }
  CHECK_EQ(live, 0) << "CachingAllocator for " << device_id_.ToString() << " destroyed while "
                    << live << " of its storages are alive: storages must not outlive it";
  if (awaiting > 0) {
    // A stream is still (or forever) using these blocks: leaking them is
    // safer than handing their memory back while it may be written.
    LOG(ERROR) << "CachingAllocator for " << device_id_.ToString() << ": " << awaiting
               << " freed blocks still await other streams; leaking their segments";
  }
  for (Block* b : spare_blocks_) delete b;
}

StatusOr<CachingAllocator*> CachingAllocator::ForDevice(DeviceId id) {
  static std::mutex* mu = new std::mutex;
  static auto* allocators = new std::map<std::pair<int, int>, CachingAllocator*>;
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(id));
  std::lock_guard<std::mutex> lock(*mu);
  auto key = std::make_pair(static_cast<int>(id.kind), id.index);
  auto it = allocators->find(key);
  if (it != allocators->end()) return it->second;
  auto* allocator = new CachingAllocator(device);  // never destroyed: storages may die at exit
  allocators->emplace(key, allocator);
  return allocator;
}

void CachingAllocator::InjectOutOfMemoryAfter(int64_t allocations) {
  std::lock_guard<std::mutex> lock(mu_);
  injected_oom_countdown_ = allocations < 0 ? -1 : allocations;
}

StatusOr<std::shared_ptr<Storage>> CachingAllocator::Allocate(size_t bytes, Stream* stream) {
  if (stream == nullptr) return InvalidArgumentError("Allocate on a null stream");
  if (stream->device() != device_id_) {
    return InvalidArgumentError("Allocate on stream '" + stream->name() + "' of " +
                                stream->device().ToString() + " from the allocator of " +
                                device_id_.ToString());
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (injected_oom_countdown_ == 0) {
    injected_oom_countdown_ = -1;
    ++stats_.num_ooms;
    return ResourceExhaustedError("out of memory on " + device_id_.ToString() + " (injected): cannot allocate " +
                                  FormatBytes(static_cast<int64_t>(bytes)) + " on stream '" + stream->name() +
                                  "'; " + DescribeStats());
  }
  if (injected_oom_countdown_ > 0) --injected_oom_countdown_;
  if (bytes == 0) {
    ++stats_.num_allocs;
    return std::make_shared<Storage>(nullptr, 0, device_id_, this, nullptr, nullptr);
  }
  if (bytes > kMaxRequest) {
    ++stats_.num_ooms;
    return ResourceExhaustedError("out of memory on " + device_id_.ToString() +
                                  ": request of " + std::to_string(bytes) +
                                  " bytes is beyond any device");
  }
  if (!pending_.empty()) ProcessPendingFrees();
  const size_t size = RoundSize(bytes);
  const bool small = size <= kSmallSize;
  Pool& pool = small ? small_pool_ : large_pool_;
  const int64_t stream_id = stream->id();

  Block* block = nullptr;
  bool waited = false;
  bool retried = false;
  for (;;) {
    auto it = FindFreeBlock(pool, stream_id, size);
    if (it != pool.end()) {
      Block* free_block = *it;
      const bool split = ShouldSplit(small, free_block->size - size);
      // Released pages come back into use: they count against the cap again.
      const size_t cost = CommitCost(free_block, size, split);
      const size_t cap = options_.capacity_bytes;
      if (cost == 0 || cap == 0 ||
          static_cast<size_t>(stats_.reserved_bytes.current) + cost <= cap) {
        if (split) {
          block = CarveTop(free_block, size);
          ResizeFree(pool, it, free_block->size - size);
          free_block->released -= cost;  // the remainder's whole pages
        } else {
          EraseFree(free_block);
          block = free_block;
          block->released = 0;
        }
        stats_.reserved_bytes.Increase(static_cast<int64_t>(cost));
        stats_.released_bytes.Decrease(static_cast<int64_t>(cost));
        break;
      }
    }
    StatusOr<Block*> fresh =
        AllocateSegment(size, PreferredSegmentSize(size), small, stream_id);
    if (fresh.ok()) {
      Block* segment = *fresh;
      if (ShouldSplit(small, segment->size - size)) {
        block = CarveTop(segment, size);
        segment->size -= size;
        InsertFree(segment);
      } else {
        block = segment;
      }
      break;
    }
    if (!waited && !pending_.empty()) {
      waited = true;
      WaitForPendingFrees(lock);
      continue;
    }
    if (!retried) {
      retried = true;
      ++stats_.num_alloc_retries;
      // Returning segments to the device synchronises it on CUDA (cudaFree)
      // and on sim (its RawFree advances the host clock past every stream):
      // the stall the rate limiter exists to avoid. Traced on its own track.
      const double start_us = trace_.enabled() ? device_->TraceNowMicros() : 0;
      ProcessPendingFrees();
      ReleaseCachedSegments();
      ReleaseFreePages();
      if (trace_.enabled()) TraceRetry(start_us, size);
      continue;
    }
    ++stats_.num_ooms;
    std::string cap = options_.capacity_bytes == 0
                          ? std::string("unlimited")
                          : FormatBytes(static_cast<int64_t>(options_.capacity_bytes));
    return ResourceExhaustedError(
        "out of memory on " + device_id_.ToString() + ": cannot allocate " +
        FormatBytes(static_cast<int64_t>(bytes)) + " on stream '" + stream->name() +
        "' after freeing cached segments and retrying; capacity " + cap + "; " + DescribeStats() +
        "; last failure: " + std::string(fresh.status().message()));
  }

  block->state = Block::State::kAllocated;
  stats_.allocated_bytes.Increase(static_cast<int64_t>(block->size));
  stats_.active_bytes.Increase(static_cast<int64_t>(block->size));
  ++stats_.num_allocs;
  EmitTraceCounters();
  char* ptr = block->ptr;
  lock.unlock();
  return std::make_shared<Storage>(ptr, bytes, device_id_, this, block, &ReleaseStorage);
}

Status CachingAllocator::RecordStream(const Storage& storage, Stream* stream) {
  if (storage.owner() != this) {
    return InvalidArgumentError("RecordStream on a storage that was not allocated by the "
                                "caching allocator of " +
                                device_id_.ToString());
  }
  if (stream == nullptr) return InvalidArgumentError("RecordStream on a null stream");
  if (stream->device() != device_id_) {
    return InvalidArgumentError("RecordStream on stream '" + stream->name() + "' of " +
                                stream->device().ToString() + " for memory of " +
                                device_id_.ToString());
  }
  Block* block = static_cast<Block*>(storage.handle());
  if (block == nullptr) return OkStatus();  // zero bytes: nothing to protect
  std::lock_guard<std::mutex> lock(mu_);
  if (stream->id() == block->stream_id) return OkStatus();
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  return OkStatus();
}

void CachingAllocator::ReleaseStorage(void* owner, void* handle) noexcept {
  static_cast<CachingAllocator*>(owner)->Free(static_cast<Block*>(handle));
}

void CachingAllocator::Free(Block* block) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(block->state == Block::State::kAllocated) << "double free of a block";
  stats_.allocated_bytes.Decrease(static_cast<int64_t>(block->size));
  if (block->stream_uses.empty()) {
    stats_.active_bytes.Decrease(static_cast<int64_t>(block->size));
    ReturnToPool(block);
  } else {
    block->state = Block::State::kAwaitingEvents;
    for (Stream* s : block->stream_uses) {
      // RecordStream checked the stream's device, so creating and recording a
      // CPU event on a CPU stream (or CUDA on CUDA) cannot fail but by a bug.
      StatusOr<std::shared_ptr<Event>> event = TakeEvent();
      CHECK(event.ok()) << event.status();
      Status recorded = (*event)->Record(*s);
      CHECK(recorded.ok()) << recorded;
      pending_.push_back(PendingFree{std::move(*event), block});
      ++block->pending_events;
    }
    block->stream_uses.clear();
  }
  EmitTraceCounters();
}

CachingAllocator::Pool::iterator CachingAllocator::FindFreeBlock(Pool& pool, int64_t stream_id,
                                                                 size_t size) {
  Block key;
  key.stream_id = stream_id;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream_id != stream_id) return pool.end();
  CHECK_GE((*it)->size, size) << "pool out of order";
  return it;
}

StatusOr<CachingAllocator::Block*> CachingAllocator::AllocateSegment(size_t block_size,
                                                                     size_t segment_size,
                                                                     bool small,
                                                                     int64_t stream_id) {
  const size_t cap = options_.capacity_bytes;
  const size_t reserved = static_cast<size_t>(stats_.reserved_bytes.current);
  if (cap != 0 && reserved + segment_size > cap) segment_size = block_size;
  if (cap != 0 && reserved + segment_size > cap) {
    return ResourceExhaustedError("a segment of " +
                                  FormatBytes(static_cast<int64_t>(segment_size)) +
                                  " would exceed the capacity");
  }
  SK_ASSIGN_OR_RETURN(void* ptr, device_->RawAllocate(segment_size));
  Block* block = NewBlock();
  block->ptr = static_cast<char*>(ptr);
  block->size = segment_size;
  block->segment_seq = ++segments_created_;
  block->stream_id = stream_id;
  block->small = small;
  block->state = Block::State::kFree;
  block->released = 0;
  segments_.push_back(block);
  stats_.reserved_bytes.Increase(static_cast<int64_t>(segment_size));
  stats_.segments.Increase(1);
  return block;
}

CachingAllocator::Block* CachingAllocator::CarveTop(Block* block, size_t size) {
  Block* top = NewBlock();
  top->ptr = block->ptr + block->size - size;
  top->size = size;
  top->segment_seq = block->segment_seq;
  top->stream_id = block->stream_id;
  top->small = block->small;
  top->state = Block::State::kFree;
  top->released = 0;
  top->prev = block;
  top->next = block->next;
  if (top->next != nullptr) top->next->prev = top;
  block->next = top;
  return top;
}

void CachingAllocator::ResizeFree(Pool& pool, Pool::iterator it, size_t new_size) {
  Block* block = *it;
  block->size = new_size;
  // The set orders by (stream, size, address); changing the size of an
  // element in place is sound while it stays between its neighbours, which
  // is the common case (one cached free block per stream and pool) and saves
  // the erase and insert of a rebalancing tree on the hot path.
  BlockOrder less;
  const bool after_prev = it == pool.begin() || less(*std::prev(it), block);
  const bool before_next = std::next(it) == pool.end() || less(block, *std::next(it));
  if (after_prev && before_next) return;
  spare_nodes_.push_back(pool.extract(it));
  InsertFree(block);
}

void CachingAllocator::InsertFree(Block* block) {
  Pool& pool = block->small ? small_pool_ : large_pool_;
  if (spare_nodes_.empty()) {
    pool.insert(block);
    return;
  }
  Pool::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.value() = block;
  pool.insert(std::move(node));
}

void CachingAllocator::EraseFree(Block* block) {
  Pool& pool = block->small ? small_pool_ : large_pool_;
  Pool::node_type node = pool.extract(block);
  CHECK(!node.empty()) << "free block missing from its pool";
  spare_nodes_.push_back(std::move(node));
}

void CachingAllocator::ReturnToPool(Block* block) {
  block->state = Block::State::kFree;
  block->released = 0;
  Block* prev = block->prev;
  Block* next = block->next;
  const bool prev_free = prev != nullptr && prev->state == Block::State::kFree;
  const bool next_free = next != nullptr && next->state == Block::State::kFree;
  // A block merged with a released neighbour is released in full (the design
  // notes): a free block is either unreleased or released.
  const bool released_neighbour =
      (prev_free && prev->released > 0) || (next_free && next->released > 0);
  if (!prev_free) {
    if (next_free) {
      EraseFree(next);
      block->size += next->size;
      block->released += next->released;
      block->next = next->next;
      if (block->next != nullptr) block->next->prev = block;
      DeleteBlock(next);
    }
    InsertFree(block);
    if (released_neighbour) SettleMerged(block);
    return;
  }
  // The lower block absorbs the higher ones, so a segment's head Block
  // (listed in segments_) survives every merge. Blocks are carved from the
  // top of free blocks, so this is the path of the steady state.
  size_t merged = prev->size + block->size;
  prev->next = next;
  if (next != nullptr) next->prev = prev;
  DeleteBlock(block);
  if (next_free) {
    EraseFree(next);
    merged += next->size;
    prev->released += next->released;
    prev->next = next->next;
    if (prev->next != nullptr) prev->next->prev = prev;
    DeleteBlock(next);
  }
  Pool& pool = prev->small ? small_pool_ : large_pool_;
  auto it = pool.find(prev);
  CHECK(it != pool.end()) << "free block missing from its pool";
  ResizeFree(pool, it, merged);
  if (released_neighbour) SettleMerged(prev);
}

void CachingAllocator::SettleMerged(Block* block) {
  if (ReleaseBlock(block)) return;
  // The device refused to release the rest: count the released parts as
  // reserved again (their pages come back on their next use) so that the
  // block is unreleased, as the books require.
  LOG(WARNING) << "CachingAllocator for " << device_id_.ToString()
               << ": could not release a merged free block's pages; counting them reserved";
  stats_.reserved_bytes.Increase(static_cast<int64_t>(block->released));
  stats_.released_bytes.Decrease(static_cast<int64_t>(block->released));
  block->released = 0;
}

CachingAllocator::PageSpan CachingAllocator::WholePages(char* ptr, size_t size) const {
  const size_t page = page_bytes_;
  if (page == 0) return {};
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t lo = (begin + page - 1) / page * page;
  const uintptr_t hi = (begin + size) / page * page;
  if (hi <= lo) return {};
  return {ptr + (lo - begin), hi - lo};
}

bool CachingAllocator::ReleaseBlock(Block* block) {
  const PageSpan pages = WholePages(block->ptr, block->size);
  const size_t whole = pages.bytes;
  if (whole <= block->released) return true;  // nothing more inside it to release
  Status released = device_->ReleasePages(pages.begin, whole);
  if (!released.ok()) {
    LOG(WARNING) << "CachingAllocator for " << device_id_.ToString() << ": " << released;
    return false;
  }
  const size_t more = whole - block->released;
  stats_.reserved_bytes.Decrease(static_cast<int64_t>(more));
  stats_.released_bytes.Increase(static_cast<int64_t>(more));
  block->released = whole;
  return true;
}

size_t CachingAllocator::CommitCost(const Block* block, size_t size, bool split) const {
  if (block->released == 0) return 0;
  if (!split) return block->released;
  // The request is carved from the top; the remainder keeps its whole pages.
  return block->released - WholePages(block->ptr, block->size - size).bytes;
}

void CachingAllocator::ReleaseFreePages() {
  const size_t page = device_->release_page_bytes();
  if (stats_.released_bytes.current == 0) page_bytes_ = page;
  if (page_bytes_ == 0 || page != page_bytes_) return;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    // ReleaseBlock changes no block's size, so the pool's order holds.
    for (Block* b : *pool) {
      if (b->released == 0) ReleaseBlock(b);
    }
  }
}

void CachingAllocator::ProcessPendingFrees() {
  size_t i = 0;
  while (i < pending_.size()) {
    if (!pending_[i].event->Query()) {
      ++i;
      continue;
    }
    Block* block = pending_[i].block;
    spare_events_.push_back(std::move(pending_[i].event));
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    if (--block->pending_events == 0) {
      stats_.active_bytes.Decrease(static_cast<int64_t>(block->size));
      ReturnToPool(block);
    }
  }
}

bool CachingAllocator::WaitForPendingFrees(std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<Event>> events;
  events.reserve(pending_.size());
  for (const PendingFree& p : pending_) events.push_back(p.event);
  const size_t before = pending_.size();
  lock.unlock();
  const auto deadline = std::chrono::steady_clock::now() + options_.pending_free_timeout;
  for (const auto& event : events) {
    auto left = std::chrono::duration_cast<Duration>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    // A timeout only means the block stays parked; the caller goes on to
    // retry or report OOM.
    event->Synchronize(left).IgnoreError();
  }
  lock.lock();
  ProcessPendingFrees();
  return pending_.size() < before;
}

void CachingAllocator::ReleaseCachedSegments() {
  size_t i = 0;
  while (i < segments_.size()) {
    Block* head = segments_[i];
    if (head->state != Block::State::kFree || head->next != nullptr) {
      ++i;
      continue;
    }
    EraseFree(head);
    device_->RawFree(head->ptr, head->size);
    stats_.reserved_bytes.Decrease(static_cast<int64_t>(head->size - head->released));
    stats_.released_bytes.Decrease(static_cast<int64_t>(head->released));
    stats_.segments.Decrease(1);
    DeleteBlock(head);
    segments_[i] = segments_.back();
    segments_.pop_back();
  }
}

CachingAllocator::Block* CachingAllocator::NewBlock() {
  if (spare_blocks_.empty()) return new Block();
  Block* block = spare_blocks_.back();
  spare_blocks_.pop_back();
  return block;
}

void CachingAllocator::DeleteBlock(Block* block) {
  block->prev = nullptr;
  block->next = nullptr;
  block->pending_events = 0;
  block->released = 0;
  block->stream_uses.clear();
  spare_blocks_.push_back(block);
}

StatusOr<std::shared_ptr<Event>> CachingAllocator::TakeEvent() {
  if (!spare_events_.empty()) {
    std::shared_ptr<Event> event = std::move(spare_events_.back());
    spare_events_.pop_back();
    return event;
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device_->CreateEvent(false));
  return std::shared_ptr<Event>(std::move(event));
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  ProcessPendingFrees();
  ReleaseCachedSegments();
  ReleaseFreePages();
  EmitTraceCounters();
}

Status CachingAllocator::SetCapacity(size_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity_bytes != 0 &&
      static_cast<size_t>(stats_.reserved_bytes.current) > capacity_bytes) {
    ProcessPendingFrees();
    ReleaseCachedSegments();
    ReleaseFreePages();
    EmitTraceCounters();
    if (static_cast<size_t>(stats_.reserved_bytes.current) > capacity_bytes) {
      return FailedPreconditionError(
          "cannot cap " + device_id_.ToString() + " at " +
          FormatBytes(static_cast<int64_t>(capacity_bytes)) + ": " + DescribeStats());
    }
  }
  options_.capacity_bytes = capacity_bytes;
  return OkStatus();
}

size_t CachingAllocator::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.capacity_bytes;
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeakStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocated_bytes.ResetPeak();
  stats_.reserved_bytes.ResetPeak();
  stats_.released_bytes.ResetPeak();
  stats_.active_bytes.ResetPeak();
  stats_.segments.ResetPeak();
}

std::vector<SegmentInfo> CachingAllocator::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SegmentInfo> segments;
  segments.reserve(segments_.size());
  for (const Block* head : segments_) {
    SegmentInfo seg;
    seg.address = reinterpret_cast<uintptr_t>(head->ptr);
    seg.small_pool = head->small;
    for (const Block* b = head; b != nullptr; b = b->next) {
      seg.size += b->size;
      seg.blocks.push_back(BlockInfo{reinterpret_cast<uintptr_t>(b->ptr), b->size, b->stream_id,
                                     b->state == Block::State::kAllocated,
                                     b->state == Block::State::kAwaitingEvents, b->released});
    }
    segments.push_back(std::move(seg));
  }
  std::sort(segments.begin(), segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
  return segments;
}

Status CachingAllocator::CheckInvariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockOrder less;
  size_t free_blocks = 0;
  for (const Pool* pool : {&small_pool_, &large_pool_}) {
    const Block* previous = nullptr;
    for (const Block* b : *pool) {
      if (previous != nullptr && !less(previous, b)) return InternalError("pool out of order");
      if (b->state != Block::State::kFree) return InternalError("non-free block in a pool");
      if (b->small != (pool == &small_pool_)) return InternalError("block in the wrong pool");
      previous = b;
    }
    free_blocks += pool->size();
  }
  size_t free_seen = 0;
  int64_t allocated = 0, active = 0, reserved = 0, released = 0;
  for (const Block* head : segments_) {
    if (head->prev != nullptr) return InternalError("segment head has a predecessor");
    for (const Block* b = head; b != nullptr; b = b->next) {
      reserved += static_cast<int64_t>(b->size - b->released);
      released += static_cast<int64_t>(b->released);
      if (b->released != 0 && (b->state != Block::State::kFree ||
                               b->released != WholePages(b->ptr, b->size).bytes)) {
        return InternalError("a block released in part, or released while not free");
      }
      if (b->next != nullptr) {
        if (b->next->prev != b) return InternalError("broken neighbour links");
        if (b->next->ptr != b->ptr + b->size) return InternalError("blocks do not tile");
        if (b->next->stream_id != b->stream_id) return InternalError("segment spans streams");
        if (b->state == Block::State::kFree && b->next->state == Block::State::kFree) {
          return InternalError("adjacent free blocks not coalesced");
        }
      }
      switch (b->state) {
        case Block::State::kFree: {
          ++free_seen;
          const Pool& pool = b->small ? small_pool_ : large_pool_;
          if (pool.find(const_cast<Block*>(b)) == pool.end()) {
            return InternalError("free block missing from its pool");
          }
          break;
        }
        case Block::State::kAllocated:
          allocated += static_cast<int64_t>(b->size);
          active += static_cast<int64_t>(b->size);
          break;
        case Block::State::kAwaitingEvents:
          active += static_cast<int64_t>(b->size);
          if (b->pending_events <= 0) return InternalError("awaiting block without events");
          break;
      }
    }
  }
  if (free_seen != free_blocks) return InternalError("pools hold blocks of no segment");
  if (allocated != stats_.allocated_bytes.current || active != stats_.active_bytes.current ||
      reserved != stats_.reserved_bytes.current || released != stats_.released_bytes.current ||
      static_cast<int64_t>(segments_.size()) != stats_.segments.current) {
    return InternalError("stats differ from a recount: " + DescribeStats());
  }
  return OkStatus();
}

void CachingAllocator::TraceRetry(double start_us, size_t request) {
  // Named with every traced retry (retries are rare): a trace started after
  // an earlier retry still names the track.
  if (trace_.enabled()) trace_.NameTrack(device_id_.index, kRetryTraceTrack, "allocator retries");
  trace_.Complete("alloc retry (" + FormatBytes(static_cast<int64_t>(request)) + ")", "memory",
                  device_id_.index, kRetryTraceTrack, start_us,
                  device_->TraceNowMicros() - start_us);
}

void CachingAllocator::EmitTraceCountersSlow() {
  trace_.Counter("memory " + device_id_.ToString(), device_id_.index, device_->TraceNowMicros(),
                 {{"allocated", static_cast<double>(stats_.allocated_bytes.current)},
                  {"reserved", static_cast<double>(stats_.reserved_bytes.current)}});
}

std::string CachingAllocator::DescribeStats() const {
  return "allocated " + FormatBytes(stats_.allocated_bytes.current) + " (peak " +
         FormatBytes(stats_.allocated_bytes.peak) + "), reserved " +
         FormatBytes(stats_.reserved_bytes.current) + " (peak " +
         FormatBytes(stats_.reserved_bytes.peak) + ") in " +
         std::to_string(stats_.segments.current) + " segments" +
         (stats_.released_bytes.current > 0
              ? " (and " + FormatBytes(stats_.released_bytes.current) +
                    " of their free blocks' pages released)"
              : std::string()) +
         ", " +
         std::to_string(pending_.size()) + " frees awaiting other streams";
}

}  // namespace sk
