// The local backend against the serial reference: every op x dtype x world
// size x size (0, 1, odd), plus 64 MiB buffers.
#include <tuple>

#include "runtime/comm/local_backend.h"
#include "tests/comm/conformance.h"

namespace sk::comm {
namespace {

using testing::CheckOnAllRanks;
using testing::OpCase;

std::vector<std::unique_ptr<ProcessGroup>> LocalGroup(int world) {
  auto groups = LocalProcessGroup::Create(world);
  CHECK(groups.ok()) << groups.status();
  return std::move(groups).value();
}

using Param = std::tuple<CollectiveKind, DType, int, int64_t>;

class LocalCollectiveTest : public ::testing::TestWithParam<Param> {};

TEST_P(LocalCollectiveTest, MatchesSerialReferenceBitForBit) {
  auto [kind, dtype, world, n] = GetParam();
  CheckOnAllRanks(LocalGroup(world), OpCase{kind, dtype, n, {}});
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, LocalCollectiveTest,
    ::testing::Combine(::testing::Values(CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                         CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                                         CollectiveKind::kBarrier),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(1, 2, 3, 4, 8), ::testing::Values(0, 1, 1001)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::string(CollectiveName(std::get<0>(info.param))) + "_" +
             std::string(DTypeName(std::get<1>(info.param))) + "_world" +
             std::to_string(std::get<2>(info.param)) + "_n" + std::to_string(std::get<3>(info.param));
    });

TEST(LocalCollectives, ReduceScatterAvgWithPreAndPostScale) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    ReduceOptions opts;
    opts.op = ReduceOp::kAvg;
    opts.pre_scale = 0.5f;
    opts.post_scale = 3.0f;
    CheckOnAllRanks(LocalGroup(3), OpCase{CollectiveKind::kReduceScatter, dtype, 777, opts});
    CheckOnAllRanks(LocalGroup(4), OpCase{CollectiveKind::kAllReduce, dtype, 777, opts});
  }
}

// 64 MiB: the all_gather output and the reduce_scatter input.
TEST(LocalCollectives, AllGatherOf64MiB) {
  CheckOnAllRanks(LocalGroup(4), OpCase{CollectiveKind::kAllGather, DType::kF32, 4 << 20, {}});
}

TEST(LocalCollectives, ReduceScatterOf64MiB) {
  CheckOnAllRanks(LocalGroup(2), OpCase{CollectiveKind::kReduceScatter, DType::kBF16, 16 << 20, {}});
}

}  // namespace
}  // namespace sk::comm
