// verdict.h: the run order of compared variants, spreads, paired ratios and
// the two-sided bands with their inconclusive middle.
#include "benchmarks/paper/verdict.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace sk::bench {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(AlternatingOrderTest, EveryOtherRoundRunsTheVariantsBackward) {
  EXPECT_EQ(AlternatingOrder(2, 3), (std::vector<int>{0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(AlternatingOrder(3, 2), (std::vector<int>{0, 1, 2, 2, 1, 0}));
  EXPECT_EQ(AlternatingOrder(1, 3), (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(AlternatingOrder(0, 3).empty());
  EXPECT_TRUE(AlternatingOrder(3, 0).empty());
}

TEST(AlternatingOrderTest, EveryVariantRunsOncePerRoundAndDriftHitsAllAlike) {
  // A load that grows linearly with the run index: over an even number of
  // rounds every variant's mean position, hence its mean drift, is equal.
  const int variants = 4, reps = 4;
  const std::vector<int> order = AlternatingOrder(variants, reps);
  ASSERT_EQ(order.size(), static_cast<size_t>(variants * reps));
  std::vector<double> position_sum(variants, 0);
  for (int round = 0; round < reps; ++round) {
    std::vector<int> seen(variants, 0);
    for (int i = 0; i < variants; ++i) {
      const int v = order[round * variants + i];
      ++seen[v];
      position_sum[v] += round * variants + i;
    }
    for (int v = 0; v < variants; ++v) EXPECT_EQ(seen[v], 1) << "round " << round;
  }
  for (int v = 1; v < variants; ++v) EXPECT_DOUBLE_EQ(position_sum[v], position_sum[0]);
}

TEST(SpreadTest, MedianMinMax) {
  const Spread s = SpreadOf({3, 1, 2});
  EXPECT_EQ(s.n, 3);
  EXPECT_DOUBLE_EQ(s.median, 2);
  EXPECT_DOUBLE_EQ(s.lo, 1);
  EXPECT_DOUBLE_EQ(s.hi, 3);
  EXPECT_DOUBLE_EQ(SpreadOf({4, 1, 3, 2}).median, 3);  // upper median
  EXPECT_EQ(SpreadOf({}).n, 0);
}

TEST(SpreadTest, PairedRatiosCancelADriftThatHitsBothSides) {
  // Rounds at 100, 150, 80 ms (the machine's load); B is 10% slower in each.
  const Spread r = PairedRatios({110, 165, 88}, {100, 150, 80});
  EXPECT_EQ(r.n, 3);
  EXPECT_NEAR(r.lo, 1.1, 1e-12);
  EXPECT_NEAR(r.hi, 1.1, 1e-12);
  // Unequal lengths pair the common rounds; a zero denominator is skipped.
  EXPECT_EQ(PairedRatios({1, 2, 3}, {1, 2}).n, 2);
  EXPECT_EQ(PairedRatios({1, 2}, {0, 2}).n, 1);
  const Spread shifted = Shifted(r, -1);
  EXPECT_NEAR(shifted.median, 0.1, 1e-12);
  EXPECT_EQ(Shifted(Spread(), -1).n, 0);
}

TEST(JudgeTest, AVerdictOnlyWhenTheWholeSpreadIsInOneRegion) {
  const Bands parity{0.9, 1.1, 0.5, 1.5};
  auto at = [](double lo, double hi) {
    Spread s;
    s.n = 3;
    s.lo = lo;
    s.hi = hi;
    s.median = (lo + hi) / 2;
    return s;
  };
  EXPECT_EQ(Judge(at(0.95, 1.05), parity), Verdict::kAgrees);
  EXPECT_EQ(Judge(at(0.9, 1.1), parity), Verdict::kAgrees);  // edges belong to the agree band
  EXPECT_EQ(Judge(at(1.2, 1.4), parity), Verdict::kPartly);
  EXPECT_EQ(Judge(at(0.6, 0.8), parity), Verdict::kPartly);
  EXPECT_EQ(Judge(at(1.6, 2.0), parity), Verdict::kDisagrees);
  EXPECT_EQ(Judge(at(0.2, 0.4), parity), Verdict::kDisagrees);
  // Straddling an edge: the effect is inside the spread.
  EXPECT_EQ(Judge(at(1.0, 1.2), parity), Verdict::kInconclusive);
  EXPECT_EQ(Judge(at(1.4, 1.6), parity), Verdict::kInconclusive);
  // Partly on both sides spans the agree band: not partly.
  EXPECT_EQ(Judge(at(0.8, 1.2), parity), Verdict::kInconclusive);
  // Disagreeing on both sides is no verdict either.
  EXPECT_EQ(Judge(at(0.4, 1.6), parity), Verdict::kInconclusive);
  EXPECT_EQ(Judge(Spread(), parity), Verdict::kInconclusive);
}

TEST(JudgeTest, OpenBandsForOneSidedExpectations) {
  const Bands no_gain{-kInf, 0.02, -kInf, 0.02};
  Spread overhead = SpreadOf({-0.05, -0.01, 0.0});
  EXPECT_EQ(Judge(overhead, no_gain), Verdict::kAgrees);
  EXPECT_EQ(Judge(SpreadOf({0.05, 0.08, 0.1}), no_gain), Verdict::kDisagrees);
  EXPECT_EQ(Judge(SpreadOf({-0.01, 0.03, 0.0}), no_gain), Verdict::kInconclusive);
}

TEST(CombineTest, WorstOfTheComparisons) {
  EXPECT_EQ(Combine({Verdict::kAgrees, Verdict::kAgrees}), Verdict::kAgrees);
  EXPECT_EQ(Combine({Verdict::kAgrees, Verdict::kPartly}), Verdict::kPartly);
  EXPECT_EQ(Combine({Verdict::kPartly, Verdict::kInconclusive}), Verdict::kInconclusive);
  EXPECT_EQ(Combine({Verdict::kInconclusive, Verdict::kDisagrees}), Verdict::kDisagrees);
  EXPECT_EQ(Combine({}), Verdict::kInconclusive);
  EXPECT_STREQ(VerdictName(Verdict::kInconclusive), "inconclusive");
}

TEST(ParseListTest, SemicolonSeparatedNumbers) {
  EXPECT_EQ(ParseList("1.5;2;;x;3e1"), (std::vector<double>{1.5, 2, 30}));
  EXPECT_TRUE(ParseList("").empty());
}

}  // namespace
}  // namespace sk::bench
