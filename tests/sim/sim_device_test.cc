// The sim device's clock rules (runtime/sim/sim_device.h): run-ahead, launch
// overhead, event waits and queries, host waits, closures, virtual memory,
// and the caching allocator's retry synchronising the device.
#include "runtime/sim/sim_device.h"

#include <cmath>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/device/device.h"
#include "runtime/memory/caching_allocator.h"

namespace sk::sim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr double kUs = 1e-6;
constexpr double kMs = 1e-3;

// Each test uses its own device index, so process-wide devices do not share
// state between tests.
SimDevice* Fresh(int index, SimDeviceSpec spec = {}) {
  StatusOr<SimDevice*> d = SimDevice::Get(index);
  CHECK(d.ok()) << d.status();
  CHECK((*d)->Configure(spec).ok());
  (*d)->ResetClocks();
  return *d;
}

std::unique_ptr<Stream> MakeStream(SimDevice* d, const char* name) {
  return std::move(d->CreateStream(name)).value();
}

std::unique_ptr<Event> MakeEvent(SimDevice* d, bool timing = false) {
  return std::move(d->CreateEvent(timing)).value();
}

SimDeviceSpec Launching(double launch_s) {
  SimDeviceSpec spec;
  spec.name = "test";
  spec.launch_overhead_s = launch_s;
  return spec;
}

TEST(SimDeviceTest, DeviceGetReturnsTheSimDevice) {
  SimDevice* d = Fresh(1);
  StatusOr<Device*> via_get = Device::Get(DeviceId::Sim(1));
  ASSERT_TRUE(via_get.ok()) << via_get.status();
  EXPECT_EQ(*via_get, d);
  EXPECT_EQ(d->id().ToString(), "sim:1");
  EXPECT_TRUE(d->id().is_sim());
  // What FSDP and DDP ask instead of the kind: priced, not run.
  StatusOr<DeviceCapabilities> can = Device::CapabilitiesOf(DeviceId::Sim(1));
  ASSERT_TRUE(can.ok()) << can.status();
  EXPECT_TRUE(can->virtual_time);
  EXPECT_FALSE(can->ops_run_when_issued);
  EXPECT_FALSE(can->host_memory);
  EXPECT_EQ(SimDevice::Get(-1).status().code(), StatusCode::kInvalidArgument);
  // The factory is registered once; built-in kinds cannot be replaced.
  auto factory = [](int) -> StatusOr<std::unique_ptr<Device>> { return nullptr; };
  EXPECT_EQ(Device::RegisterFactory(DeviceKind::kSim, factory).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(Device::RegisterFactory(DeviceKind::kCpu, factory).code(),
            StatusCode::kInvalidArgument);
}

TEST(SimDeviceTest, HostRunsAheadOfTheStreamByTheLaunchOverhead) {
  SimDevice* d = Fresh(2, Launching(10 * kUs));
  auto s = MakeStream(d, "compute");
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(d->EnqueueSpan(*s, "op", 1 * kMs).ok());
  // The host paid ten launches; the stream runs the ops back to back after
  // the first launch.
  EXPECT_NEAR(d->HostClock(), 100 * kUs, 1e-12);
  EXPECT_NEAR(d->StreamClock(*s), 10 * kUs + 10 * kMs, 1e-12);
  EXPECT_FALSE(s->Query());
  ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_NEAR(d->HostClock(), 10 * kUs + 10 * kMs, 1e-12);
  EXPECT_TRUE(s->Query());
}

TEST(SimDeviceTest, TinyOpsAreBoundByTheLaunchOverhead) {
  SimDevice* d = Fresh(3, Launching(5 * kUs));
  auto s = MakeStream(d, "compute");
  for (int i = 0; i < 4; ++i) {
    StatusOr<SimSpan> span = d->EnqueueSpan(*s, "tiny", 1 * kUs);
    ASSERT_TRUE(span.ok());
    // Each op starts when its launch ends, not when the previous op ends.
    EXPECT_NEAR(span->start_s, (i + 1) * 5 * kUs, 1e-12);
  }
  EXPECT_NEAR(d->StreamClock(*s), 21 * kUs, 1e-12);
}

TEST(SimDeviceTest, BookkeepingSpansPayNoLaunch) {
  SimDevice* d = Fresh(4, Launching(5 * kUs));
  auto s = MakeStream(d, "compute");
  StatusOr<SimSpan> span = d->EnqueueSpan(*s, "mark", 0.0, {.launch = false});
  ASSERT_TRUE(span.ok());
  EXPECT_EQ(span->start_s, 0.0);
  EXPECT_EQ(d->HostClock(), 0.0);
}

TEST(SimDeviceTest, StreamWaitsForAnEventWithoutBlockingTheHost) {
  SimDevice* d = Fresh(5);
  auto ag = MakeStream(d, "all-gather");
  auto compute = MakeStream(d, "compute");
  auto gathered = MakeEvent(d);
  ASSERT_TRUE(d->EnqueueSpan(*ag, "all_gather", 5 * kMs, {.category = "comm"}).ok());
  ASSERT_TRUE(gathered->Record(*ag).ok());
  ASSERT_TRUE(compute->WaitEvent(*gathered).ok());
  // Recording the event again later does not move what compute waited for.
  ASSERT_TRUE(d->EnqueueSpan(*ag, "all_gather", 5 * kMs, {.category = "comm"}).ok());
  ASSERT_TRUE(gathered->Record(*ag).ok());
  StatusOr<SimSpan> fwd = d->EnqueueSpan(*compute, "forward", 1 * kMs);
  ASSERT_TRUE(fwd.ok());
  EXPECT_NEAR(fwd->start_s, 5 * kMs, 1e-12);
  EXPECT_NEAR(fwd->end_s, 6 * kMs, 1e-12);
  EXPECT_EQ(d->HostClock(), 0.0);  // the host waited for nothing
}

TEST(SimDeviceTest, EventQueryComparesWithTheCallingHostClock) {
  SimDevice* d = Fresh(6);
  auto s = MakeStream(d, "compute");
  auto e = MakeEvent(d);
  EXPECT_TRUE(e->Query());  // never recorded
  ASSERT_TRUE(d->EnqueueSpan(*s, "op", 2 * kMs).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  EXPECT_FALSE(e->Query());
  d->AdvanceHostClock(1 * kMs);
  EXPECT_FALSE(e->Query());
  d->AdvanceHostClock(1 * kMs);
  EXPECT_TRUE(e->Query());  // the host has reached the event's time
  // Another host thread has its own clock, still at 0.
  bool other_sees_complete = true;
  std::thread([&] { other_sees_complete = e->Query(); }).join();
  EXPECT_FALSE(other_sees_complete);
}

TEST(SimDeviceTest, EventSynchronizeMovesTheHostClock) {
  SimDevice* d = Fresh(7);
  auto s = MakeStream(d, "compute");
  auto start = MakeEvent(d, /*timing=*/true);
  auto end = MakeEvent(d, /*timing=*/true);
  ASSERT_TRUE(start->Record(*s).ok());
  ASSERT_TRUE(d->EnqueueSpan(*s, "op", 3 * kMs).ok());
  ASSERT_TRUE(end->Record(*s).ok());
  EXPECT_EQ(start->ElapsedMillis(*end).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(end->Synchronize().ok());
  EXPECT_NEAR(d->HostClock(), 3 * kMs, 1e-12);
  StatusOr<double> ms = start->ElapsedMillis(*end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_NEAR(*ms, 3.0, 1e-9);
  // A record cannot complete before the host issued it.
  d->AdvanceHostClock(10 * kMs);
  auto late = MakeEvent(d);
  ASSERT_TRUE(late->Record(*s).ok());
  EXPECT_NEAR(static_cast<SimEvent*>(late.get())->time_s(), 13 * kMs, 1e-12);
}

TEST(SimDeviceTest, ClosuresRunAtOnceAtTheStreamPosition) {
  SimDevice* d = Fresh(8, Launching(1 * kUs));
  auto s = MakeStream(d, "reduce");
  ASSERT_TRUE(d->EnqueueSpan(*s, "reduce_scatter", 4 * kMs).ok());
  double seen_inside = -1;
  bool ran = false;
  ASSERT_TRUE(s->Enqueue([&]() -> Status {
                 ran = true;
                 seen_inside = d->HostClock();
                 // Work issued by the closure lands after it.
                 return d->EnqueueSpan(*s, "inner", 1 * kMs).status();
               }).ok());
  EXPECT_TRUE(ran);  // ran before Enqueue returned
  EXPECT_NEAR(seen_inside, 1 * kUs + 4 * kMs, 1e-12);
  EXPECT_NEAR(d->StreamClock(*s), 2 * kUs + 5 * kMs, 1e-12);
  EXPECT_NEAR(d->HostClock(), 1 * kUs, 1e-12);  // restored: the host did not wait
  // A failing closure sets the sticky error, returned by Synchronize.
  ASSERT_TRUE(s->Enqueue([] { return InternalError("boom"); }).ok());
  EXPECT_EQ(s->Synchronize().code(), StatusCode::kInternal);
  s->ClearError();
  EXPECT_TRUE(s->Synchronize().ok());
  EXPECT_EQ(s->Enqueue(nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(SimDeviceTest, BadInputIsRefusedWithAClearError) {
  SimDevice* d = Fresh(9);
  auto s = MakeStream(d, "compute");
  EXPECT_EQ(d->EnqueueSpan(*s, "neg", -1.0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->EnqueueSpan(*s, "nan", std::nan("")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d->EnqueueSpan(*s, "badprice", [](double) { return -2.0; }).status().code(),
            StatusCode::kInvalidArgument);
  SimDevice* other = Fresh(10);
  auto foreign = MakeStream(other, "foreign");
  Status wrong_stream = d->EnqueueSpan(*foreign, "op", 1.0).status();
  EXPECT_EQ(wrong_stream.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_stream.message().find("sim:10"), std::string::npos) << wrong_stream;
  EXPECT_EQ(MakeEvent(d)->Record(*foreign).code(), StatusCode::kInvalidArgument);
  Device* cpu = Device::Get(DeviceId::Cpu()).value();
  auto cpu_event = std::move(cpu->CreateEvent(false)).value();
  EXPECT_EQ(s->WaitEvent(*cpu_event).code(), StatusCode::kInvalidArgument);
  auto cpu_stream = std::move(cpu->CreateStream("cpu")).value();
  EXPECT_EQ(SimDevice::For(*cpu_stream).status().code(), StatusCode::kInvalidArgument);
  char a[8], b[8];
  EXPECT_EQ(d->CopyAsync(a, b, 8, *s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->CopyAsync(nullptr, b, 8, *s).code(), StatusCode::kInvalidArgument);
  SimDeviceSpec bad;
  bad.raw_free_s = -1;
  EXPECT_EQ(d->Configure(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->StreamClock(*s), 0.0);  // nothing was placed
}

TEST(SimDeviceTest, RawMemoryIsVirtualCappedAndCostsHostTime) {
  SimDeviceSpec spec;
  spec.name = "small";
  spec.memory_bytes = 10 * kMiB;
  spec.raw_alloc_s = 100 * kUs;
  spec.raw_free_s = 50 * kUs;
  SimDevice* d = Fresh(11, spec);
  StatusOr<void*> a = d->RawAllocate(6 * kMiB);
  StatusOr<void*> b = d->RawAllocate(3 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(SimDevice::IsSimAddress(*a));
  EXPECT_TRUE(SimDevice::IsSimAddress(*b));
  EXPECT_FALSE(SimDevice::IsSimAddress(&spec));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 512, 0u);
  EXPECT_GE(reinterpret_cast<uintptr_t>(*b), reinterpret_cast<uintptr_t>(*a) + 6 * kMiB);
  EXPECT_NEAR(d->HostClock(), 200 * kUs, 1e-12);
  StatusOr<void*> c = d->RawAllocate(2 * kMiB);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("small"), std::string::npos) << c.status();
  EXPECT_EQ(d->raw_bytes_in_use(), 9 * kMiB);
  // Shrinking below what is in use is refused and changes nothing.
  SimDeviceSpec tiny = spec;
  tiny.memory_bytes = kMiB;
  EXPECT_EQ(d->Configure(tiny).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->spec().memory_bytes, 10 * kMiB);
  d->RawFree(*a, 6 * kMiB);
  d->RawFree(*b, 3 * kMiB);
  EXPECT_NEAR(d->HostClock(), 300 * kUs, 1e-12);
  EXPECT_EQ(d->raw_bytes_in_use(), 0u);
  EXPECT_EQ(d->raw_alloc_count(), 2);
  EXPECT_EQ(d->raw_free_count(), 2);
}

TEST(SimDeviceTest, RawFreeSynchronisesTheDevice) {
  SimDevice* d = Fresh(12);
  auto s1 = MakeStream(d, "compute");
  auto s2 = MakeStream(d, "all-gather");
  void* p = d->RawAllocate(kMiB).value();
  ASSERT_TRUE(d->EnqueueSpan(*s1, "op", 2 * kMs).ok());
  ASSERT_TRUE(d->EnqueueSpan(*s2, "op", 7 * kMs).ok());
  EXPECT_EQ(d->HostClock(), 0.0);
  d->RawFree(p, kMiB);
  EXPECT_NEAR(d->HostClock(), 7 * kMs, 1e-12);  // as cudaFree: every stream drained
}

// The caching allocator over the sim device: a request that only fits after
// cached segments go back to the device triggers one retry, and the retry's
// frees synchronise the device, stalling the host until the stream drains.
TEST(SimDeviceTest, AllocatorRetrySynchronisesTheDevice) {
  SimDeviceSpec spec;
  spec.name = "64MiB";
  spec.memory_bytes = 64 * kMiB;
  SimDevice* d = Fresh(13, spec);
  auto s = MakeStream(d, "compute");
  {
    CachingAllocator allocator(d);
    {
      auto held = allocator.Allocate(30 * kMiB, s.get());
      ASSERT_TRUE(held.ok()) << held.status();
      ASSERT_TRUE(d->EnqueueSpan(*s, "long op", 1.0).ok());
    }  // freed into the cache: 30 MiB stays reserved
    // Served from the cached segment: no retry, the host does not wait.
    {
      auto fits = allocator.Allocate(20 * kMiB, s.get());
      ASSERT_TRUE(fits.ok()) << fits.status();
      EXPECT_EQ(allocator.stats().num_alloc_retries, 0);
      EXPECT_LT(d->HostClock(), 1.0);
    }
    // 50 MiB fits only once the cached segments are released.
    auto big = allocator.Allocate(50 * kMiB, s.get());
    ASSERT_TRUE(big.ok()) << big.status();
    EXPECT_EQ(allocator.stats().num_alloc_retries, 1);
    EXPECT_NEAR(d->HostClock(), 1.0, 1e-12);
    EXPECT_EQ(allocator.stats().reserved_bytes.current, static_cast<int64_t>(50 * kMiB));
    // Beyond the device: a clear OOM, and the allocator stays usable.
    auto too_big = allocator.Allocate(100 * kMiB, s.get());
    EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(allocator.CheckInvariants().ok());
  }
  EXPECT_EQ(d->raw_bytes_in_use(), 0u);
}

// Blocks freed while another stream still uses them return to the pool only
// once the host has passed that stream's event, as on a GPU.
TEST(SimDeviceTest, RecordStreamReuseFollowsVirtualTime) {
  SimDevice* d = Fresh(14);
  auto ag = MakeStream(d, "all-gather");
  auto compute = MakeStream(d, "compute");
  CachingAllocator allocator(d);
  uintptr_t first = 0;
  {
    auto param = allocator.Allocate(4 * kMiB, ag.get()).value();
    first = reinterpret_cast<uintptr_t>(param->data());
    ASSERT_TRUE(allocator.RecordStream(*param, compute.get()).ok());
    ASSERT_TRUE(d->EnqueueSpan(*compute, "forward", 5 * kMs).ok());
  }
  // The host is at 0, the compute stream's event at 5 ms: not reusable yet,
  // so a same-size request gets another block.
  auto second = allocator.Allocate(4 * kMiB, ag.get()).value();
  EXPECT_NE(reinterpret_cast<uintptr_t>(second->data()), first);
  ASSERT_TRUE(compute->Synchronize().ok());
  auto third = allocator.Allocate(4 * kMiB, ag.get()).value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(third->data()), first);
}

TEST(SimDeviceTest, ResetClocksStartsANewSimulation) {
  SimDevice* d = Fresh(15, Launching(1 * kUs));
  auto s = MakeStream(d, "compute");
  auto e = MakeEvent(d);
  ASSERT_TRUE(d->EnqueueSpan(*s, "op", 1.0).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  d->set_record_spans(true);
  ASSERT_TRUE(d->EnqueueSpan(*s, "op2", 1.0).ok());
  EXPECT_EQ(d->spans().size(), 1u);
  EXPECT_NEAR(d->Horizon(), 2.0 + 1 * kUs, 1e-12);  // one launch, then back to back
  d->ResetClocks();
  EXPECT_EQ(d->HostClock(), 0.0);
  EXPECT_EQ(d->StreamClock(*s), 0.0);
  EXPECT_EQ(d->Horizon(), 0.0);
  EXPECT_TRUE(e->Query());  // recorded in an earlier simulation
  EXPECT_TRUE(d->spans().empty());
}

TEST(SimDeviceTest, SpanLogFindsOverlaps) {
  SimDevice* d = Fresh(16);
  auto compute = MakeStream(d, "compute");
  auto comm = MakeStream(d, "comm");
  d->set_record_spans(true);
  ASSERT_TRUE(d->EnqueueSpan(*comm, "ag", 2 * kMs, {.category = "comm"}).ok());
  ASSERT_TRUE(d->EnqueueSpan(*comm, "ag2", 2 * kMs, {.category = "comm"}).ok());
  double seen_start = -1;
  size_t overlapping = 0;
  auto priced = d->EnqueueSpan(*compute, "gemm", [&](double start) {
    seen_start = start;
    return 1 * kMs;
  });
  ASSERT_TRUE(priced.ok());
  EXPECT_EQ(seen_start, 0.0);
  overlapping = d->SpansOverlapping("comm", priced->start_s, priced->end_s).size();
  EXPECT_EQ(overlapping, 1u);
  EXPECT_EQ(d->SpansOverlapping("comm", 0, 4 * kMs).size(), 2u);
  EXPECT_EQ(d->SpansOverlapping("compute", 3 * kMs, 4 * kMs).size(), 0u);
}

TEST(SimDeviceTest, TraceIsOnVirtualTime) {
  SimDevice* d = Fresh(17);
  auto s = MakeStream(d, "compute");
  TraceRecorder& trace = TraceRecorder::Global();
  trace.Start();
  d->AdvanceHostClock(2.0);
  ASSERT_TRUE(d->EnqueueSpan(*s, "virtual_gemm", 0.5).ok());
  trace.Stop();
  const std::string json = trace.ToJson();
  EXPECT_NE(json.find("virtual_gemm"), std::string::npos);
  // The span starts at 2 s of virtual time: 2,000,000 us.
  EXPECT_NE(json.find("2000000"), std::string::npos) << json;
  EXPECT_DOUBLE_EQ(d->TraceNowMicros(), 2e6);
}

// Virtual host memory: its own address range (not device memory), capped
// at the capacity with a clear error, returned when its storage dies;
// copies between it and device memory are priced over the host link in
// either direction, and a host stream's spans are not launched.
TEST(SimDeviceTest, HostMemoryIsVirtualCappedAndCopiedOverTheHostLink) {
  SimDevice* d = SimDevice::Get(46).value();
  SimDeviceSpec spec;
  spec.name = "host-test";
  spec.launch_overhead_s = 5e-6;
  spec.host_link_bytes_per_s = 1e9;
  spec.host_memory_bytes = 1 << 20;
  ASSERT_TRUE(d->Configure(spec).ok());
  d->ResetClocks();
  SimHostAllocator host(d->id(), spec.host_memory_bytes);
  {
    StatusOr<std::shared_ptr<Storage>> a = host.AllocateBytes(768 << 10);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(SimHostAllocator::IsHostAddress((*a)->data()));
    EXPECT_FALSE(SimDevice::IsSimAddress((*a)->data()));
    EXPECT_EQ((*a)->device(), d->id());
    EXPECT_EQ(host.bytes_in_use(), size_t{768} << 10);
    StatusOr<std::shared_ptr<Storage>> b = host.AllocateBytes(512 << 10);
    EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(b.status().message().find("host memory"), std::string::npos) << b.status();
    EXPECT_EQ(d->raw_bytes_in_use(), 0u);  // not device memory

    void* dev = d->RawAllocate(1 << 20).value();
    auto s = std::move(d->CreateStream("copy")).value();
    const double t0 = d->StreamClock(*s);
    ASSERT_TRUE(d->CopyAsync(dev, (*a)->data(), 1000000, *s).ok());  // h2d
    ASSERT_TRUE(d->CopyAsync((*a)->data(), dev, 1000000, *s).ok());  // d2h
    EXPECT_NEAR(d->StreamClock(*s) - t0, 2 * 1e-3 + spec.launch_overhead_s, 1e-12);
    d->RawFree(dev, 1 << 20);

    auto h = std::move(d->CreateHostStream("host")).value();
    EXPECT_TRUE(static_cast<SimStream*>(h.get())->host());
    const double host_clock = d->HostClock();
    SimSpan span = d->EnqueueSpan(*h, "host op", 0.5, {.launch = false, .category = "host"}).value();
    EXPECT_EQ(span.start_s, host_clock);
    EXPECT_EQ(d->HostClock(), host_clock);
  }
  EXPECT_EQ(host.bytes_in_use(), 0u);
  EXPECT_EQ(host.peak_bytes(), size_t{768} << 10);
}

}  // namespace
}  // namespace sk::sim
