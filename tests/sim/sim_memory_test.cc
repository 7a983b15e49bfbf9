// The caching allocator over a sim device keeps exactly the books it keeps
// over a CPU device: the same requests give the same allocated, reserved and
// segment counts at every point, and the same retries and OOMs under a cap.
// (The memory-exactness claim of the simulator rests on this.) Both ways a
// device can keep them: with the pages of free blocks handed back (a CPU's
// host memory; a sim spec with release_page_bytes) and without (a GPU's
// cudaMalloc; a sim spec's default, against a CPU that keeps its pages).
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/device/device.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/device/cpu_device.h"
#include "runtime/sim/sim_device.h"
#include "tests/memory/test_util.h"

namespace sk::sim {
namespace {

constexpr size_t kKiB = 1024;

struct Run {
  std::unique_ptr<Stream> a, b;
  std::unique_ptr<CachingAllocator> alloc;
  std::vector<std::shared_ptr<Storage>> live;
};

void Expect(const MemoryStats& cpu, const MemoryStats& sim, int step) {
  ASSERT_EQ(cpu.allocated_bytes.current, sim.allocated_bytes.current) << "step " << step;
  ASSERT_EQ(cpu.allocated_bytes.peak, sim.allocated_bytes.peak) << "step " << step;
  ASSERT_EQ(cpu.reserved_bytes.current, sim.reserved_bytes.current) << "step " << step;
  ASSERT_EQ(cpu.reserved_bytes.peak, sim.reserved_bytes.peak) << "step " << step;
  ASSERT_EQ(cpu.released_bytes.current, sim.released_bytes.current) << "step " << step;
  ASSERT_EQ(cpu.segments.current, sim.segments.current) << "step " << step;
  ASSERT_EQ(cpu.num_alloc_retries, sim.num_alloc_retries) << "step " << step;
  ASSERT_EQ(cpu.num_ooms, sim.num_ooms) << "step " << step;
}

void Replay(size_t cap, uint32_t seed, bool release_pages) {
  SCOPED_TRACE(release_pages ? "pages released" : "pages kept");
  sk::testing::PagesKeptDevice kept_pages;
  Device* cpu = release_pages ? Device::Get(DeviceId::Cpu(7)).value()
                              : static_cast<Device*>(&kept_pages);
  SimDevice* sim = SimDevice::Get(30 + static_cast<int>(seed % 8)).value();
  SimDeviceSpec spec;
  spec.release_page_bytes = release_pages ? CpuDevice::PageBytes() : 0;
  ASSERT_TRUE(sim->Configure(spec).ok());
  sim->ResetClocks();
  Run runs[2];
  Device* devices[2] = {cpu, sim};
  for (int r = 0; r < 2; ++r) {
    runs[r].a = std::move(devices[r]->CreateStream("a")).value();
    runs[r].b = std::move(devices[r]->CreateStream("b")).value();
    CachingAllocator::Options o;
    o.capacity_bytes = cap;
    runs[r].alloc = std::make_unique<CachingAllocator>(devices[r], o);
  }
  std::mt19937 rng(seed);
  // Sizes from 1 byte to 24 MiB, log-uniform: both pools, splits, own segments.
  std::uniform_real_distribution<double> log_size(0, 24.6);
  for (int step = 0; step < 3000; ++step) {
    const bool alloc = runs[0].live.empty() || rng() % 100 < 55;
    if (alloc) {
      const size_t bytes = static_cast<size_t>(std::exp2(log_size(rng)));
      const bool on_b = rng() % 4 == 0;
      bool ok[2];
      for (int r = 0; r < 2; ++r) {
        auto s = runs[r].alloc->Allocate(bytes, on_b ? runs[r].b.get() : runs[r].a.get());
        ok[r] = s.ok();
        if (s.ok()) runs[r].live.push_back(std::move(*s));
      }
      ASSERT_EQ(ok[0], ok[1]) << "step " << step << ": " << bytes << " bytes";
    } else {
      const size_t i = rng() % runs[0].live.size();
      for (int r = 0; r < 2; ++r) {
        runs[r].live[i] = std::move(runs[r].live.back());
        runs[r].live.pop_back();
      }
    }
    Expect(runs[0].alloc->stats(), runs[1].alloc->stats(), step);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int r = 0; r < 2; ++r) {
    runs[r].live.clear();
    ASSERT_TRUE(runs[r].alloc->CheckInvariants().ok());
    runs[r].alloc.reset();
  }
  EXPECT_EQ(sim->raw_bytes_in_use(), 0u);
}

TEST(SimMemoryTest, SameBooksAsCpuWithoutACap) {
  for (bool release : {false, true}) {
    for (uint32_t seed : {1u, 2u, 3u}) Replay(0, seed, release);
  }
}

TEST(SimMemoryTest, SameBooksAsCpuUnderACap) {
  // 96 MiB: requests up to 24 MiB force retries and some OOMs.
  for (bool release : {false, true}) {
    for (uint32_t seed : {4u, 5u, 6u}) Replay(96 * kKiB * kKiB, seed, release);
  }
}

}  // namespace
}  // namespace sk::sim
