// CachingAllocator: a stream-ordered caching allocator for one device.
//
// Device allocation (cudaMalloc, or a page-faulting malloc on CPU) is slow and,
// on CUDA, synchronises the device. Training allocates and frees the same
// shapes every step, so the allocator keeps freed memory cached and hands it
// out again. Memory is tied to streams the way CUDA work is: a block belongs to
// the stream it was allocated on, and when it is freed it may be reused at once
// by later allocations on that stream, because the stream runs in order: any
// kernel that used the old contents runs before any kernel that uses the new.
// A block used on another stream must be announced with RecordStream; its
// reuse then waits until those streams pass an event recorded at free time.
//
// The design (pools, splitting, coalescing, the capacity cap, retries and OOM)
// is described in caching_allocator.cc.
//
// Lifetime: every Storage handed out must die before the allocator; a stream
// passed to Allocate or RecordStream must live until the blocks that use it
// have been freed and their events have completed.
//
// Thread safety: all methods may be called from any thread; Storages may die
// on any thread (including a stream's worker).
#ifndef SHARDKIT_RUNTIME_MEMORY_CACHING_ALLOCATOR_H_
#define SHARDKIT_RUNTIME_MEMORY_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/core/trace.h"
#include "runtime/device/device.h"

namespace sk {

// One statistic, as PyTorch keeps them: the value now, its high-water mark
// since the last ResetPeakStats, and the running totals added and removed
// (so allocated - freed == current).
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;

  void Increase(int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void Decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void ResetPeak() { peak = current; }
};

struct MemoryStats {
  // Bytes in blocks held by live Storages (block sizes, i.e. after rounding).
  Stat allocated_bytes;
  // Bytes obtained from the device (all segments, used or cached), less
  // released_bytes: what the capacity cap bounds.
  Stat reserved_bytes;
  // Bytes of cached free blocks whose pages were handed back to the system
  // while their segment stayed (on devices with release_page_bytes: see the
  // design notes in caching_allocator.cc).
  Stat released_bytes;
  // allocated_bytes plus freed blocks still waiting for other streams' events.
  Stat active_bytes;
  // Segments obtained from the device.
  Stat segments;
  // Successful Allocate calls (zero-byte ones included).
  int64_t num_allocs = 0;
  // Times a request did not fit, so every cached segment was returned to the
  // device and the request retried.
  int64_t num_alloc_retries = 0;
  // Requests that failed with ResourceExhausted.
  int64_t num_ooms = 0;
};

// One block of a segment, as reported by Snapshot().
struct BlockInfo {
  uintptr_t address = 0;
  size_t size = 0;
  int64_t stream_id = 0;  // the stream that owns the block
  bool allocated = false;          // held by a live Storage
  bool awaiting_events = false;    // freed, waiting for recorded streams
  size_t released_bytes = 0;       // free, and this many of its bytes' pages handed back
};

// One segment (one RawAllocate) and its blocks in address order.
struct SegmentInfo {
  uintptr_t address = 0;
  size_t size = 0;
  bool small_pool = false;
  std::vector<BlockInfo> blocks;
};

class CachingAllocator {
 public:
  struct Options {
    // Reserved bytes never exceed this (0 = unlimited). Emulates a device of
    // this size (an 80 GB GPU, a per-rank budget) on any machine.
    size_t capacity_bytes = 0;
    // Before declaring OOM, how long to wait for blocks whose recorded streams
    // have not yet passed their events. Long enough for a collective in
    // flight; a stream stuck longer than this is reported as OOM, not a hang.
    // (A closure running on stream S that allocates at the cap while frees
    // await S would wait for itself: it stalls this long, then gets OOM.)
    Duration pending_free_timeout{10'000};
  };

  // `device` must outlive the allocator. Memory comes from device->RawAllocate.
  CachingAllocator(Device* device, Options options);
  explicit CachingAllocator(Device* device) : CachingAllocator(device, Options()) {}
  // Waits (up to pending_free_timeout) for blocks awaiting events, then returns
  // every segment to the device; a segment whose blocks still await events
  // after that is leaked (and logged) rather than freed while a stream may use
  // it. CHECK-fails if a Storage is still alive.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The process-wide allocator of `id` (unlimited capacity until
  // SetCapacity), created on first use and never destroyed. Errors as
  // Device::Get.
  static StatusOr<CachingAllocator*> ForDevice(DeviceId id);

  DeviceId device() const { return device_id_; }

  // A storage of at least `bytes` bytes owned by `stream`. When it dies its
  // block returns to `stream`'s pool (after the events of any RecordStream).
  // bytes == 0 gives a valid storage without memory. InvalidArgument if
  // `stream` is null or on another device; ResourceExhausted (naming the
  // request, the cap and the stats) when the request cannot be met even after
  // waiting up to pending_free_timeout for frees awaiting events and then
  // freeing every cached segment (one alloc retry). The allocator stays usable
  // after an error.
  StatusOr<std::shared_ptr<Storage>> Allocate(size_t bytes, Stream* stream);

  // Declares that `stream` uses `storage` (as torch's record_stream): when the
  // storage dies, its block is reused only after `stream` completes the work
  // enqueued on it up to that moment. InvalidArgument if `storage` does not
  // come from this allocator or `stream` is null or on another device.
  Status RecordStream(const Storage& storage, Stream* stream);

  // Returns every fully unused cached segment to the device, and on a device
  // that can release pages, the pages of every other cached free block.
  void EmptyCache();

  // Changes the cap (0 = unlimited). Frees cached segments if needed;
  // FailedPrecondition (cap unchanged) if memory in use exceeds the new cap.
  Status SetCapacity(size_t capacity_bytes);
  size_t capacity_bytes() const;

  // Fault injection (tests and the fault-injection suite): the request
  // after `allocations` more (each counted in num_allocs) fails with
  // ResourceExhausted as the cap would ("out of memory on cpu:1 (injected)
  // ..."), counted in num_ooms; then the allocator behaves normally again.
  // A negative count disarms it. Thread-safe.
  void InjectOutOfMemoryAfter(int64_t allocations);

  MemoryStats stats() const;
  // Sets every peak to its current value.
  void ResetPeakStats();
  // Every segment and block, in address order (for tests and memory dumps).
  std::vector<SegmentInfo> Snapshot() const;
  // Verifies the internal structure (pools ordered and holding exactly the
  // free blocks, neighbour links, stats): Internal naming the first violation.
  // O(blocks); for tests.
  Status CheckInvariants() const;

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;
  // A freed block waiting for one event recorded on a stream that used it.
  struct PendingFree {
    std::shared_ptr<Event> event;
    Block* block;
  };

  static void ReleaseStorage(void* owner, void* handle) noexcept;
  void Free(Block* block);

  // All below require mu_.
  // The best-fitting free block of `stream_id` in `pool`, or pool.end().
  Pool::iterator FindFreeBlock(Pool& pool, int64_t stream_id, size_t size);
  StatusOr<Block*> AllocateSegment(size_t block_size, size_t segment_size, bool small,
                                   int64_t stream_id);
  // A new block for the top `size` bytes of free block `block`, which keeps
  // the rest (its size changes, so its pool position is fixed by the caller).
  Block* CarveTop(Block* block, size_t size);
  // Sets the size of the free block at `it`, moving it in the pool only if
  // its order among its neighbours changed.
  void ResizeFree(Pool& pool, Pool::iterator it, size_t new_size);
  void InsertFree(Block* block);
  void EraseFree(Block* block);
  void ReturnToPool(Block* block);
  void ProcessPendingFrees();
  // Releases mu_ (through `lock`) while waiting. True if anything became free.
  bool WaitForPendingFrees(std::unique_lock<std::mutex>& lock);
  void ReleaseCachedSegments();
  // On a device with release_page_bytes: hands back the whole pages of every
  // cached free block not yet released (a segment in part use keeps its
  // allocated blocks and addresses). Counted out of reserved_bytes.
  void ReleaseFreePages();
  // The whole pages (page_bytes_) inside [ptr, ptr + size): where the first
  // begins and how many bytes they span (0 when none, or no page size).
  struct PageSpan {
    char* begin = nullptr;
    size_t bytes = 0;
  };
  PageSpan WholePages(char* ptr, size_t size) const;
  // Makes free block `block` (released or not) released in full: its
  // whole pages handed back, its released_bytes their size. False (nothing
  // changed) if the device refused.
  bool ReleaseBlock(Block* block);
  // After a merge with a released neighbour: ReleaseBlock, or if the device
  // refuses, the block counted unreleased.
  void SettleMerged(Block* block);
  // What serving `size` bytes from free block `block` adds to reserved_bytes:
  // the released pages the request would use (0 for an unreleased block).
  size_t CommitCost(const Block* block, size_t size, bool split) const;
  Block* NewBlock();
  void DeleteBlock(Block* block);
  StatusOr<std::shared_ptr<Event>> TakeEvent();
  void EmitTraceCounters() {
    if (trace_.enabled()) EmitTraceCountersSlow();
  }
  void EmitTraceCountersSlow();
  // A span on the allocator's own trace track, from `start_us` to now, for
  // one alloc retry of a `request`-byte block.
  void TraceRetry(double start_us, size_t request);
  std::string DescribeStats() const;

  // The trace track (tid) of alloc retries, within the device's process.
  static constexpr int64_t kRetryTraceTrack = 900'000'000;

  Device* const device_;
  const DeviceId device_id_;
  TraceRecorder& trace_;
  Options options_;

  mutable std::mutex mu_;
  Pool small_pool_;
  Pool large_pool_;
  // Spare set nodes and Block objects, so the cached path does not malloc.
  std::vector<Pool::node_type> spare_nodes_;
  std::vector<Block*> spare_blocks_;
  std::vector<Block*> segments_;  // head block of each segment
  std::vector<PendingFree> pending_;
  std::vector<std::shared_ptr<Event>> spare_events_;
  MemoryStats stats_;
  int64_t injected_oom_countdown_ = -1;  // InjectOutOfMemoryAfter; -1: disarmed
  uint64_t segments_created_ = 0;  // numbers segments for the pools' order
  // The device's release_page_bytes when pages were first released (fixed
  // while any are: the books of released blocks are in its units).
  size_t page_bytes_ = 0;
};

// sk::Allocator over a CachingAllocator and one stream: the core interface that
// layers above memory/ use, so everything they allocate counts in the same
// statistics and under the same cap. Both must be non-null and outlive this
// object.
class StreamAllocator final : public Allocator {
 public:
  StreamAllocator(CachingAllocator* allocator, Stream* stream)
      : allocator_(allocator), stream_(stream) {}
  DeviceId device() const override { return allocator_->device(); }
  StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) override {
    return allocator_->Allocate(nbytes, stream_);
  }
  Stream* stream() const { return stream_; }
  CachingAllocator* caching_allocator() const { return allocator_; }

 private:
  CachingAllocator* allocator_;
  Stream* stream_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_MEMORY_CACHING_ALLOCATOR_H_
