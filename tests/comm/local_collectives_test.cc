// The local backend against the serial reference: every op x dtype x world
// size x size (0, 1, odd), plus 64 MiB buffers.
#include <cstring>
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

// 64 MiB buffers, checked without per-element work (so the test stays fast
// under tsan): every rank's input tiles a kPeriod-element pattern, so each
// expected output tiles a pattern computed once by the serial reference, and
// is compared period by period with memcmp.
constexpr int64_t kPeriod = 4096;

std::vector<char> Pattern(DType dt, int rank) {
  std::vector<char> p(kPeriod * DTypeSize(dt));
  for (int64_t i = 0; i < kPeriod; ++i) StoreFromFloat(p.data(), dt, i, testing::InputValue(dt, rank, i));
  return p;
}

void FillTiled(const Tensor& t, const std::vector<char>& pattern) {
  char* d = static_cast<char*>(t.data());
  for (size_t off = 0; off < t.nbytes(); off += pattern.size()) std::memcpy(d + off, pattern.data(), pattern.size());
}

// True if bytes [begin, begin + len) of `t` tile `pattern`.
bool Tiles(const Tensor& t, size_t begin, size_t len, const std::vector<char>& pattern) {
  const char* d = static_cast<const char*>(t.data()) + begin;
  for (size_t off = 0; off < len; off += pattern.size()) {
    if (std::memcmp(d + off, pattern.data(), pattern.size()) != 0) return false;
  }
  return true;
}

TEST(LocalCollectives, AllGatherOf64MiB) {
  constexpr int kWorld = 4;
  constexpr int64_t n = 4 << 20;  // f32: 16 MiB per rank, 64 MiB gathered
  auto groups = LocalGroup(kWorld);
  testing::RunRanks(kWorld, [&](int r) {
    auto stream = testing::MakeStream(r, "comm");
    Tensor in = testing::MakeTensor(r, DType::kF32, n);
    Tensor out = testing::MakeTensor(r, DType::kF32, n * kWorld);
    FillTiled(in, Pattern(DType::kF32, r));
    auto work = groups[r]->all_gather(out, in, *stream);
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE((*work)->wait(std::chrono::seconds(120)).ok());
    for (int j = 0; j < kWorld; ++j) {
      EXPECT_TRUE(Tiles(out, j * in.nbytes(), in.nbytes(), Pattern(DType::kF32, j))) << "chunk " << j;
    }
  });
}

TEST(LocalCollectives, ReduceScatterOf64MiB) {
  constexpr int kWorld = 2;
  constexpr int64_t n = 16 << 20;  // bf16: 64 MiB input per rank
  // Rank j's shard k tiles pattern j * kWorld + k, so a shard sent to the
  // wrong rank shows.
  auto pattern = [](int j, int k) { return Pattern(DType::kBF16, j * kWorld + k); };
  auto groups = LocalGroup(kWorld);
  testing::RunRanks(kWorld, [&](int r) {
    auto stream = testing::MakeStream(r, "comm");
    Tensor in = testing::MakeTensor(r, DType::kBF16, n * kWorld);
    Tensor out = testing::MakeTensor(r, DType::kBF16, n);
    for (int k = 0; k < kWorld; ++k) {
      FillTiled(*in.View(k * out.nbytes(), DType::kBF16, Shape({n})), pattern(r, k));
    }
    auto work = groups[r]->reduce_scatter(out, in, *stream);
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE((*work)->wait(std::chrono::seconds(120)).ok());
    std::vector<std::vector<char>> sent_to_me;
    for (int j = 0; j < kWorld; ++j) sent_to_me.push_back(pattern(j, r));
    std::vector<char> want(kPeriod * 2);
    for (int64_t i = 0; i < kPeriod; ++i) {
      std::vector<float> per_rank;
      for (int j = 0; j < kWorld; ++j) per_rank.push_back(LoadAsFloat(sent_to_me[j].data(), DType::kBF16, i));
      StoreFromFloat(want.data(), DType::kBF16, i,
                     testing::ReferenceReduce(per_rank, DType::kBF16, ReduceOp::kSum, 1, 1));
    }
    EXPECT_TRUE(Tiles(out, 0, out.nbytes(), want));
  });
}

}  // namespace
}  // namespace sk::comm
