// Collectives on the caller's buffers (issue 34, item 4), over the local
// backend: sum, mean and max all-reduce, broadcast, all-gather and barrier;
// calls that differ across ranks fail every rank naming both calls; a peer
// that never arrives is DeadlineExceeded within the timeout.
#include "runtime/comm/caller_collectives.h"

#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "tests/comm/gloo_world.h"

namespace sk::comm {
namespace {

constexpr Duration kTimeout{30'000};

void RunRanks(int world, const std::function<Status(int, ProcessGroup*)>& body) {
  Status s = RunLocalRanks(world, body);
  ASSERT_TRUE(s.ok()) << s;
}

TEST(CallerCollectives, AllReduceSumsAveragesAndTakesTheMaxOverRanks) {
  RunRanks(3, [](int rank, ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(auto c, CallerCollectives::Create(g, kTimeout));
    const float r = static_cast<float>(rank);
    std::vector<float> sum = {r, 10 * r};
    SK_RETURN_IF_ERROR(c->AllReduce(sum.data(), 2, CallerDType::kF32, CallerReduceOp::kSum));
    EXPECT_EQ(sum, (std::vector<float>{3, 30}));
    std::vector<float> mean = {r + 1, -r};
    SK_RETURN_IF_ERROR(c->AllReduce(mean.data(), 2, CallerDType::kF32, CallerReduceOp::kMean));
    EXPECT_FLOAT_EQ(mean[0], 2.f);
    EXPECT_FLOAT_EQ(mean[1], -1.f);
    // Rank 1 holds the largest first element, rank 0 the largest second.
    std::vector<float> mx = {rank == 1 ? 7.f : -r, rank == 0 ? 5.f : -r};
    SK_RETURN_IF_ERROR(c->AllReduce(mx.data(), 2, CallerDType::kF32, CallerReduceOp::kMax));
    EXPECT_EQ(mx, (std::vector<float>{7, 5}));
    std::vector<BF16> b = {FloatToBF16(r), FloatToBF16(-2 * r)};
    SK_RETURN_IF_ERROR(c->AllReduce(b.data(), 2, CallerDType::kBF16, CallerReduceOp::kMax));
    EXPECT_EQ(BF16ToFloat(b[0]), 2.f);
    EXPECT_EQ(BF16ToFloat(b[1]), 0.f);
    return OkStatus();
  });
}

TEST(CallerCollectives, BroadcastAllGatherAndBarrier) {
  RunRanks(2, [](int rank, ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(auto c, CallerCollectives::Create(g, kTimeout));
    std::vector<float> v = {rank == 1 ? 4.f : 0.f, rank == 1 ? 2.f : 0.f};
    SK_RETURN_IF_ERROR(c->Broadcast(v.data(), 2, CallerDType::kF32, 1));
    EXPECT_EQ(v, (std::vector<float>{4, 2}));
    std::vector<float> in = {static_cast<float>(rank), static_cast<float>(rank) + 0.5f};
    std::vector<float> out(4, -1.f);
    SK_RETURN_IF_ERROR(c->AllGather(in.data(), out.data(), 2, CallerDType::kF32));
    EXPECT_EQ(out, (std::vector<float>{0, 0.5f, 1, 1.5f}));
    return c->Barrier();
  });
}

TEST(CallerCollectives, BadArgumentsAreErrorsNamingWhatWasWrongWithoutCommunicating) {
  RunRanks(2, [](int, ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(auto c, CallerCollectives::Create(g, kTimeout));
    float x = 1;
    Status s = c->AllReduce(nullptr, 4, CallerDType::kF32, CallerReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("NULL"), std::string::npos) << s;
    s = c->AllReduce(&x, -1, CallerDType::kF32, CallerReduceOp::kSum);
    EXPECT_NE(std::string(s.message()).find("negative"), std::string::npos) << s;
    s = c->AllReduce(&x, 1, CallerDType::kF32, static_cast<CallerReduceOp>(9));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    s = c->Broadcast(&x, 1, CallerDType::kF32, 2);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
    std::vector<float> buf(3);
    s = c->AllGather(buf.data() + 1, buf.data(), 1, CallerDType::kF32);
    EXPECT_NE(std::string(s.message()).find("overlap"), std::string::npos) << s;
    return OkStatus();
  });
}

TEST(CallerCollectives, CallsThatDifferAcrossRanksFailEveryRankNamingBoth) {
  RunRanks(2, [](int rank, ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(auto c, CallerCollectives::Create(g, kTimeout));
    std::vector<float> v(4, 1.f);
    Status s = c->AllReduce(v.data(), rank == 0 ? 4 : 3, CallerDType::kF32, CallerReduceOp::kSum);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("all_reduce"), std::string::npos) << s;
    return OkStatus();
  });
}

TEST(CallerCollectives, APeerThatNeverArrivesIsDeadlineExceededWithinTheTimeout) {
  RunRanks(2, [](int rank, ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(auto c, CallerCollectives::Create(g, Duration(300)));
    if (rank == 1) return OkStatus();
    const auto t0 = std::chrono::steady_clock::now();
    Status s = c->Barrier();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
    EXPECT_LT(seconds, 10.0);
    return OkStatus();
  });
}

// Issue 47, item 8: a mismatched call fails once; the calls after it work,
// the MAX (whose result comes back through the group's stream) included.
// On gloo every later MAX failed with the first call's stale mismatch.
void MismatchThenEveryOpWorks(int rank, ProcessGroup* g) {
  auto c = CallerCollectives::Create(g, kTimeout);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> v(4, 1.f);
  Status s = (*c)->AllReduce(v.data(), rank == 0 ? 4 : 3, CallerDType::kF32, CallerReduceOp::kSum);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  for (int round = 0; round < 2; ++round) {
    std::vector<float> mx = {static_cast<float>(rank), -static_cast<float>(rank)};
    s = (*c)->AllReduce(mx.data(), 2, CallerDType::kF32, CallerReduceOp::kMax);
    ASSERT_TRUE(s.ok()) << "rank " << rank << " round " << round << ": " << s;
    EXPECT_EQ(mx, (std::vector<float>{1, 0}));
    std::vector<float> sum = {1.f};
    s = (*c)->AllReduce(sum.data(), 1, CallerDType::kF32, CallerReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(sum[0], 2.f);
  }
}

TEST(CallerCollectives, AfterAMismatchedCallLaterCallsWorkOnLocalGroups) {
  RunRanks(2, [](int rank, ProcessGroup* g) -> Status {
    MismatchThenEveryOpWorks(rank, g);
    return OkStatus();
  });
}

TEST(CallerCollectives, AfterAMismatchedCallLaterMaxAllReducesWorkOnGloo) {
  testing::GlooWorld world(2);
  testing::RunRanks(2, [&](int rank) { MismatchThenEveryOpWorks(rank, world.groups[rank].get()); });
}

// Issue 47 item 9: f64 and integer buffers, and MIN, on any group. Rank r
// of 3 contributes values whose reductions f32 could not hold exactly
// (2^53 + r as f64, 2^40 r as i64) and a negative i32 that sums with a wrap.
void WideAndIntegerReductions(int rank, ProcessGroup* g) {
  auto made = CallerCollectives::Create(g, kTimeout);
  ASSERT_TRUE(made.ok()) << made.status();
  CallerCollectives& c = **made;
  const int n = g->size();
  std::vector<double> d = {9007199254740992.0 + 2 * rank, 0.1 * rank};
  ASSERT_TRUE(c.AllReduce(d.data(), 2, CallerDType::kF64, CallerReduceOp::kSum).ok());
  double want0 = 0, want1 = 0;
  for (int r = 0; r < n; ++r) {
    want0 += 9007199254740992.0 + 2 * r;
    want1 += 0.1 * r;
  }
  EXPECT_EQ(d[0], want0);
  EXPECT_EQ(d[1], want1);  // the same bits: summed in rank order on every rank
  std::vector<double> dm = {static_cast<double>(rank)};
  ASSERT_TRUE(c.AllReduce(dm.data(), 1, CallerDType::kF64, CallerReduceOp::kMean).ok());
  EXPECT_EQ(dm[0], (n - 1) / 2.0);
  std::vector<int64_t> l = {int64_t{1} << 40 | rank, -rank, rank};
  ASSERT_TRUE(c.AllReduce(l.data(), 3, CallerDType::kI64, CallerReduceOp::kSum).ok());
  EXPECT_EQ(l[0], (int64_t{1} << 40) * n + n * (n - 1) / 2);
  EXPECT_EQ(l[1], -n * (n - 1) / 2);
  std::vector<int64_t> lmax = {-(int64_t{1} << 50) + rank, rank == 1 ? int64_t{1} << 60 : 0};
  ASSERT_TRUE(c.AllReduce(lmax.data(), 2, CallerDType::kI64, CallerReduceOp::kMax).ok());
  EXPECT_EQ(lmax, (std::vector<int64_t>{-(int64_t{1} << 50) + n - 1, int64_t{1} << 60}));
  std::vector<int32_t> i = {rank == 0 ? INT32_MAX : 1, 5 - rank, -rank};
  ASSERT_TRUE(c.AllReduce(i.data(), 3, CallerDType::kI32, CallerReduceOp::kSum).ok());
  EXPECT_EQ(i[0], static_cast<int32_t>(static_cast<uint32_t>(INT32_MAX) + static_cast<uint32_t>(n - 1)));  // wraps
  EXPECT_EQ(i[1], 5 * n - n * (n - 1) / 2);
  std::vector<int32_t> imin = {rank, -rank};
  ASSERT_TRUE(c.AllReduce(imin.data(), 2, CallerDType::kI32, CallerReduceOp::kMin).ok());
  EXPECT_EQ(imin, (std::vector<int32_t>{0, -(n - 1)}));
  std::vector<float> fmin = {static_cast<float>(rank), rank == 1 ? NAN : 0.f};
  ASSERT_TRUE(c.AllReduce(fmin.data(), 2, CallerDType::kF32, CallerReduceOp::kMin).ok());
  EXPECT_EQ(fmin[0], 0.f);
  EXPECT_TRUE(std::isnan(fmin[1]));  // NaN wins, as for MAX
  std::vector<double> dmin = {-1.5 * rank};
  ASSERT_TRUE(c.AllReduce(dmin.data(), 1, CallerDType::kF64, CallerReduceOp::kMin).ok());
  EXPECT_EQ(dmin[0], -1.5 * (n - 1));
  // Broadcast and all-gather move every byte of the wide types.
  std::vector<int64_t> b = {rank == 2 ? int64_t{0x123456789abcdef} : 0};
  ASSERT_TRUE(c.Broadcast(b.data(), 1, CallerDType::kI64, 2).ok());
  EXPECT_EQ(b[0], int64_t{0x123456789abcdef});
  const double mine = 1.0 / (rank + 3);
  std::vector<double> all(static_cast<size_t>(n));
  ASSERT_TRUE(c.AllGather(&mine, all.data(), 1, CallerDType::kF64).ok());
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[r], 1.0 / (r + 3));
  // MEAN of integers and unknown dtypes are refused on every rank alike.
  Status s = c.AllReduce(i.data(), 1, CallerDType::kI32, CallerReduceOp::kMean);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("i32"), std::string::npos) << s;
  s = c.AllReduce(i.data(), 1, static_cast<CallerDType>(7), CallerReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  // A dtype or op that differs with the same byte count is caught too.
  std::vector<int64_t> same_bytes = {1};
  s = c.AllReduce(same_bytes.data(), 1, rank == 0 ? CallerDType::kF64 : CallerDType::kI64,
                  rank == 0 ? CallerReduceOp::kSum : CallerReduceOp::kMax);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("sum of f64"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("max of i64"), std::string::npos) << s;
  EXPECT_EQ(same_bytes[0], 1) << "a refused all_reduce wrote the buffer";
  // A count that differs is still caught.
  s = c.AllReduce(l.data(), rank == 0 ? 2 : 1, CallerDType::kI64, CallerReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  // Broadcast and all-gather of dtypes that travel alike (f32 and i32
  // words; f64 and twice as many f32) moved the root's bytes into the
  // wrong type: now every rank fails naming both, its buffers unchanged.
  std::vector<int32_t> words = {rank == 0 ? 0x3f800000 : 7};
  s = c.Broadcast(words.data(), 1, rank == 1 ? CallerDType::kI32 : CallerDType::kF32, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("rank 0 passed f32 but rank 1 i32"), std::string::npos) << s;
  EXPECT_EQ(words[0], rank == 0 ? 0x3f800000 : 7) << "a refused broadcast wrote the buffer";
  std::vector<double> wide = {1.0 + rank, 0};
  std::vector<double> gathered(static_cast<size_t>(2 * n), -1.0);
  s = c.AllGather(wide.data(), gathered.data(), rank == 2 ? 2 : 1, rank == 2 ? CallerDType::kF32 : CallerDType::kF64);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("rank 2 f32"), std::string::npos) << s;
  for (double v : gathered) EXPECT_EQ(v, -1.0) << "a refused all_gather wrote the output";
  // And the next call works.
  std::vector<int32_t> agreed = {rank == 1 ? 42 : 0};
  ASSERT_TRUE(c.Broadcast(agreed.data(), 1, CallerDType::kI32, 1).ok());
  EXPECT_EQ(agreed[0], 42);
}

TEST(CallerCollectives, F64AndIntegerSumsMaxAndMinOnLocalGroups) {
  RunRanks(3, [](int rank, ProcessGroup* g) -> Status {
    WideAndIntegerReductions(rank, g);
    return OkStatus();
  });
}

TEST(CallerCollectives, F64AndIntegerSumsMaxAndMinOnGloo) {
  testing::GlooWorld world(3);
  testing::RunRanks(3, [&](int rank) { WideAndIntegerReductions(rank, world.groups[rank].get()); });
}

}  // namespace
}  // namespace sk::comm
