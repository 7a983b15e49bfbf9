// Device::ReleasePages: a CPU hands the physical pages of a range back to the
// system (they leave the process's resident set) while the addresses stay
// usable; bad ranges are refused with a clear error; devices that cannot
// release say so.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"
#include "runtime/sim/sim_device.h"

namespace sk {
namespace {

// How many of the `pages` pages from `p` are resident.
int Resident(void* p, size_t pages, size_t page) {
  std::vector<unsigned char> v(pages);
  EXPECT_EQ(mincore(p, pages * page, v.data()), 0) << std::strerror(errno);
  int n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(ReleasePagesTest, CpuPagesLeaveTheResidentSetAndStayUsable) {
  Device* cpu = Device::Get(DeviceId::Cpu(0)).value();
  const size_t page = cpu->release_page_bytes();
  ASSERT_GT(page, 0u);
  ASSERT_EQ(page, CpuDevice::PageBytes());
  constexpr size_t kPages = 16;
  void* raw = cpu->RawAllocate(kPages * page).value();
  ASSERT_EQ(reinterpret_cast<uintptr_t>(raw) % page, 0u) << "a block of pages starts on one";
  auto* bytes = static_cast<unsigned char*>(raw);
  std::memset(bytes, 0xab, kPages * page);
  EXPECT_EQ(Resident(raw, kPages, page), static_cast<int>(kPages));

  ASSERT_TRUE(cpu->ReleasePages(bytes + 4 * page, 8 * page).ok());
  EXPECT_EQ(Resident(raw, kPages, page), static_cast<int>(kPages - 8));
  EXPECT_EQ(bytes[4 * page], 0);              // released pages read as zeros
  EXPECT_EQ(bytes[4 * page - 1], 0xab);       // the neighbours kept their bytes
  EXPECT_EQ(bytes[12 * page], 0xab);
  bytes[5 * page] = 7;                        // and the addresses are still ours
  EXPECT_EQ(bytes[5 * page], 7);
  cpu->RawFree(raw, kPages * page);
}

TEST(ReleasePagesTest, CpuRefusesRangesThatAreNotWholePages) {
  Device* cpu = Device::Get(DeviceId::Cpu(0)).value();
  const size_t page = cpu->release_page_bytes();
  void* raw = cpu->RawAllocate(4 * page).value();
  auto* bytes = static_cast<unsigned char*>(raw);
  bytes[page + 1] = 3;
  Status misaligned = cpu->ReleasePages(bytes + 1, page);
  EXPECT_EQ(misaligned.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(misaligned.message().find("page-aligned"), std::string_view::npos) << misaligned;
  EXPECT_EQ(cpu->ReleasePages(bytes, page + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu->ReleasePages(nullptr, page).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bytes[page + 1], 3);  // nothing was released
  cpu->RawFree(raw, 4 * page);
}

TEST(ReleasePagesTest, SimReleasesOnlyWhenItsSpecSaysAndChecksTheRange) {
  sim::SimDevice* sim = sim::SimDevice::Get(45).value();
  ASSERT_TRUE(sim->Configure(sim::SimDeviceSpec{}).ok());
  EXPECT_EQ(sim->release_page_bytes(), 0u);
  void* a = sim->RawAllocate(1 << 20).value();
  EXPECT_EQ(sim->ReleasePages(a, 4096).code(), StatusCode::kUnimplemented);
  sim->RawFree(a, 1 << 20);

  sim::SimDeviceSpec spec;
  spec.release_page_bytes = 4096;
  ASSERT_TRUE(sim->Configure(spec).ok());
  EXPECT_EQ(sim->release_page_bytes(), 4096u);
  void* b = sim->RawAllocate(1 << 20).value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 4096, 0u);
  auto* p = static_cast<char*>(b);
  EXPECT_TRUE(sim->ReleasePages(p + 4096, 8192).ok());
  EXPECT_EQ(sim->ReleasePages(p + 100, 4096).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->ReleasePages(p + (1 << 20) - 4096, 8192).code(), StatusCode::kInvalidArgument);
  sim->RawFree(b, 1 << 20);

  spec.release_page_bytes = 1000;  // not a power of two
  EXPECT_EQ(sim->Configure(spec).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk
