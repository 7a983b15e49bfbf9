// CachingAllocator micro-benchmarks: the cached fast path, the cross-stream
// (record_stream) path, and fragmentation near the capacity cap.
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "runtime/device/device.h"
#include "runtime/memory/caching_allocator.h"

namespace sk {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

Device* Cpu0() { return Device::Get(DeviceId::Cpu(0)).value(); }

std::unique_ptr<Stream> NewStream(const char* name) {
  return Cpu0()->CreateStream(name).value();
}

// Baseline: the device's own allocation (aligned_alloc/free on CPU).
void BM_RawDeviceAllocFree(benchmark::State& state) {
  Device* device = Cpu0();
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = device->RawAllocate(bytes).value();
    benchmark::DoNotOptimize(p);
    device->RawFree(p, bytes);
  }
}
BENCHMARK(BM_RawDeviceAllocFree)->Arg(512)->Arg(64 << 10)->Arg(4 << 20);

// One Allocate plus the Storage's death, served from the stream's cache.
void BM_CachedAllocFree(benchmark::State& state) {
  auto stream = NewStream("bench");
  CachingAllocator allocator(Cpu0());
  const size_t bytes = static_cast<size_t>(state.range(0));
  allocator.Allocate(bytes, stream.get()).value().reset();  // warm the cache
  for (auto _ : state) {
    StatusOr<std::shared_ptr<Storage>> s = allocator.Allocate(bytes, stream.get());
    benchmark::DoNotOptimize(s->get()->data());
  }
  state.counters["segments"] = static_cast<double>(allocator.stats().segments.allocated);
}
BENCHMARK(BM_CachedAllocFree)->Arg(512)->Arg(64 << 10)->Arg(4 << 20);

// The same pair through the core Allocator interface, as other layers call it.
void BM_CachedAllocFreeThroughStreamAllocator(benchmark::State& state) {
  auto stream = NewStream("bench");
  CachingAllocator caching(Cpu0());
  StreamAllocator allocator(&caching, stream.get());
  Allocator& core = allocator;
  for (auto _ : state) {
    StatusOr<std::shared_ptr<Storage>> s = core.AllocateBytes(4096);
    benchmark::DoNotOptimize(s->get()->data());
  }
}
BENCHMARK(BM_CachedAllocFreeThroughStreamAllocator);

// Several threads, one allocator, each thread on its own stream: the cost of
// sharing one lock.
void BM_CachedAllocFreeContended(benchmark::State& state) {
  static CachingAllocator* allocator = new CachingAllocator(Cpu0());
  auto stream = NewStream("bench");
  for (auto _ : state) {
    StatusOr<std::shared_ptr<Storage>> s = allocator->Allocate(4096, stream.get());
    benchmark::DoNotOptimize(s->get()->data());
  }
}
BENCHMARK(BM_CachedAllocFreeContended)->Threads(1)->Threads(2)->Threads(4);

// Allocate on the producer stream, hand to a consumer stream (RecordStream),
// free: each free records an event on the consumer, and the block returns to
// the pool once the consumer's worker passes it. The cap (64 MiB) bounds how
// far the producer runs ahead: at the cap, Allocate waits for pending frees.
void BM_CrossStreamRecordFreeReuse(benchmark::State& state) {
  auto producer = NewStream("producer");
  auto consumer = NewStream("consumer");
  CachingAllocator::Options options;
  options.capacity_bytes = 64 * kMiB;
  CachingAllocator allocator(Cpu0(), options);
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    StatusOr<std::shared_ptr<Storage>> r = allocator.Allocate(bytes, producer.get());
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
    std::shared_ptr<Storage> s = std::move(r).value();
    benchmark::DoNotOptimize(s->data());
    if (!allocator.RecordStream(*s, consumer.get()).ok()) state.SkipWithError("RecordStream");
  }
  if (!consumer->Synchronize().ok()) state.SkipWithError("Synchronize");
  MemoryStats stats = allocator.stats();
  state.counters["segments"] = static_cast<double>(stats.segments.allocated);
  state.counters["peak_active_MiB"] = static_cast<double>(stats.active_bytes.peak) / kMiB;
  state.counters["retries"] = static_cast<double>(stats.num_alloc_retries);
  state.counters["ooms"] = static_cast<double>(stats.num_ooms);
}
BENCHMARK(BM_CrossStreamRecordFreeReuse)->Arg(4096)->Arg(4 << 20);

// Two streams alternately allocate large blocks whose sizes do not fit each
// other's cached segments, under a cap that holds only a little more than
// one stream's working set: the cached segments of the other stream must be
// freed and the request retried (what FSDP's rate limiter exists to avoid).
void BM_FragmentationNearCap(benchmark::State& state) {
  auto a = NewStream("a");
  auto b = NewStream("b");
  CachingAllocator::Options options;
  options.capacity_bytes = 64 * kMiB;
  CachingAllocator allocator(Cpu0(), options);
  int64_t i = 0;
  for (auto _ : state) {
    Stream* stream = i % 2 == 0 ? a.get() : b.get();
    const size_t bytes = (24 + 4 * (i % 3)) * kMiB;
    std::shared_ptr<Storage> s = allocator.Allocate(bytes, stream).value();
    benchmark::DoNotOptimize(s->data());
    ++i;
  }
  MemoryStats stats = allocator.stats();
  state.counters["retries"] = static_cast<double>(stats.num_alloc_retries);
  state.counters["retries_per_alloc"] =
      static_cast<double>(stats.num_alloc_retries) / static_cast<double>(stats.num_allocs);
  state.counters["ooms"] = static_cast<double>(stats.num_ooms);
  state.counters["peak_reserved_MiB"] = static_cast<double>(stats.reserved_bytes.peak) / kMiB;
}
BENCHMARK(BM_FragmentationNearCap);

}  // namespace
}  // namespace sk
