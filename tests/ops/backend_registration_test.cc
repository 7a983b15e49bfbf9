// The backends register themselves: a binary that links //runtime/ops, and
// includes neither backend, has the CPU backend (and under --config=cuda the
// CUDA one) in the registry before main, and ops run on cpu with nothing
// set up. Built twice (BUILD): linked against shared libraries as tests
// are by default, and statically, where only alwayslink keeps a backend's
// registration object that no symbol reference pulls in.
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/ops/backend.h"
#include "runtime/ops/ops.h"

namespace sk::ops {
namespace {

TEST(BackendRegistration, TheCpuBackendIsRegisteredBeforeMain) {
  OpBackend* cpu = BackendFor(DeviceKind::kCpu);
  ASSERT_NE(cpu, nullptr);
  EXPECT_STREQ(cpu->name(), "cpu");
  EXPECT_TRUE(cpu->executes());
}

TEST(BackendRegistration, OpsRunOnCpuWithNothingSetUp) {
  auto x = HostAllocator::Default().Empty(DType::kF32, Shape{3});
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ASSERT_TRUE(Fill(HostContext(), *x, 2.5f).ok());
  ASSERT_TRUE(Scale(HostContext(), *x, 2.0f).ok());
  auto values = ReadValues(HostContext(), *x);
  ASSERT_TRUE(values.ok()) << values.status().ToString();
  EXPECT_EQ(*values, (std::vector<double>{5.0, 5.0, 5.0}));
}

TEST(BackendRegistration, TheCudaBackendIsRegisteredExactlyWhenBuilt) {
  OpBackend* cuda = BackendFor(DeviceKind::kCuda);
#if defined(SHARDKIT_WITH_CUDA)
  // Registration touches no GPU: a machine without one has the backend too.
  ASSERT_NE(cuda, nullptr);
  EXPECT_STREQ(cuda->name(), "cuda");
#else
  EXPECT_EQ(cuda, nullptr);
#endif
}

}  // namespace
}  // namespace sk::ops
