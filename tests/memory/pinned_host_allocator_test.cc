// Pinned host memory: Unavailable (and nothing allocated) without CUDA or a
// GPU; on a GPU, an asynchronous round trip host -> device -> host in stream
// order.
#include <chrono>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/memory/caching_allocator.h"
#include "runtime/memory/pinned_host_allocator.h"

namespace sk {
namespace {

using namespace std::chrono_literals;

TEST(PinnedHostAllocator, ZeroBytesIsAValidEmptyStorage) {
  PinnedHostAllocator alloc;
  auto s = alloc.AllocateBytes(0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->nbytes(), 0u);
  EXPECT_TRUE((*s)->device().is_cpu());
}

TEST(PinnedHostAllocator, UnavailableWithoutAGpuNamingWhy) {
  if (Device::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  PinnedHostAllocator alloc;
  auto s = alloc.AllocateBytes(4096);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status();
  EXPECT_NE(std::string(s.status().message()).find("pinned host memory"), std::string::npos)
      << s.status();
}

TEST(PinnedHostAllocator, AsyncRoundTripThroughTheGpu) {
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  PinnedHostAllocator pinned;
  auto gpu = Device::Get(DeviceId::Cuda(0));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto stream = (*gpu)->CreateStream("copies");
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto cache = CachingAllocator::ForDevice(DeviceId::Cuda(0));
  ASSERT_TRUE(cache.ok()) << cache.status();
  constexpr size_t kFloats = 1 << 20;
  auto host_in = pinned.Empty(DType::kF32, Shape{static_cast<int64_t>(kFloats)});
  auto host_out = pinned.Empty(DType::kF32, Shape{static_cast<int64_t>(kFloats)});
  ASSERT_TRUE(host_in.ok() && host_out.ok());
  for (size_t i = 0; i < kFloats; ++i) host_in->data_as<float>()[i] = static_cast<float>(i) * 0.5f;
  std::memset(host_out->data(), 0, host_out->nbytes());
  auto dev = (*cache)->Allocate(host_in->nbytes(), stream->get());
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_TRUE((*gpu)->CopyAsync((*dev)->data(), host_in->data(), host_in->nbytes(), **stream).ok());
  ASSERT_TRUE((*gpu)->CopyAsync(host_out->data(), (*dev)->data(), host_in->nbytes(), **stream).ok());
  ASSERT_TRUE((*stream)->Synchronize(30s).ok());
  EXPECT_EQ(std::memcmp(host_in->data(), host_out->data(), host_in->nbytes()), 0);
}

}  // namespace
}  // namespace sk
