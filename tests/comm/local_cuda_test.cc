// The local backend with every rank on ONE GPU (ranks as threads, each with
// its own stream on cuda:0): the conformance of local_collectives_test.cc,
// bit for bit against the serial reference. Skips without a GPU (always
// without --config=cuda).
#include <tuple>

#include "runtime/comm/local_backend.h"
#include "tests/comm/conformance.h"

namespace sk::comm {
namespace {

using Param = std::tuple<CollectiveKind, DType, int, int64_t>;
class LocalOnOneGpuTest : public ::testing::TestWithParam<Param> {};

TEST_P(LocalOnOneGpuTest, MatchesSerialReferenceBitForBit) {
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto [kind, dtype, world, n] = GetParam();
  auto groups = LocalProcessGroup::Create(world);
  ASSERT_TRUE(groups.ok()) << groups.status();
  testing::CheckOnAllRanks(*groups, testing::OpCase{kind, dtype, n, {}}, DeviceId::Cuda(0));
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, LocalOnOneGpuTest,
    ::testing::Combine(::testing::Values(CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                         CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                                         CollectiveKind::kBarrier),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(1, 2, 4), ::testing::Values(0, 1, 1001, 1 << 20)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::string(CollectiveName(std::get<0>(info.param))) + "_" +
             std::string(DTypeName(std::get<1>(info.param))) + "_world" +
             std::to_string(std::get<2>(info.param)) + "_n" + std::to_string(std::get<3>(info.param));
    });

TEST(LocalOnOneGpu, AvgWithPreAndPostScale) {
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    ReduceOptions opts;
    opts.op = ReduceOp::kAvg;
    opts.pre_scale = 0.5f;
    opts.post_scale = 3.0f;
    auto g3 = LocalProcessGroup::Create(3);
    ASSERT_TRUE(g3.ok());
    testing::CheckOnAllRanks(*g3, testing::OpCase{CollectiveKind::kReduceScatter, dtype, 777, opts},
                             DeviceId::Cuda(0));
    auto g4 = LocalProcessGroup::Create(4);
    ASSERT_TRUE(g4.ok());
    testing::CheckOnAllRanks(*g4, testing::OpCase{CollectiveKind::kAllReduce, dtype, 777, opts},
                             DeviceId::Cuda(0));
  }
}

}  // namespace
}  // namespace sk::comm
