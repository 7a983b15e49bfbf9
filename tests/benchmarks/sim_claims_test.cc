#include "benchmarks/paper/sim_claims.h"

#include <cstdio>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace sk::bench {
namespace {

// Two runs (each ~20 simulated trainers, slow under the sanitizers) serve
// every check: the rows and the plot points they carry.
class SimClaimsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (int i = 0; i < 2; ++i) {
      points_[i] = new Table("unset");
      rows_[i] = new StatusOr<Table>(SimulatedClaims("a100-80g", points_[i]));
    }
  }
  static void TearDownTestSuite() {
    for (int i = 0; i < 2; ++i) {
      delete rows_[i];
      delete points_[i];
    }
  }
  static StatusOr<Table>* rows_[2];
  static Table* points_[2];
};
StatusOr<Table>* SimClaimsTest::rows_[2];
Table* SimClaimsTest::points_[2];

TEST_F(SimClaimsTest, TwoRunsGiveTheSameBytesAndEveryRowIsJudged) {
  StatusOr<Table>& a = *rows_[0];
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  StatusOr<Table>& b = *rows_[1];
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->ToCsv(), b->ToCsv());
  EXPECT_EQ(a->ToJson(), b->ToJson());

  std::set<std::string> ids;
  const std::set<std::string> verdicts = {"agrees", "partly", "disagrees", "not modelled"};
  for (const Row& r : a->rows()) {
    ids.insert(r.Text("claim"));
    EXPECT_FALSE(r.Text("evidence").empty()) << r.Text("claim");
    EXPECT_FALSE(r.Text("paper").empty()) << r.Text("claim");
    EXPECT_FALSE(r.Text("ours").empty()) << r.Text("claim");
    EXPECT_TRUE(verdicts.count(r.Text("verdict"))) << r.Text("claim") << ": " << r.Text("verdict");
    if (r.Text("verdict") != "not modelled") {
      EXPECT_EQ(r.Text("evidence"), "simulated (a100-80g)") << r.Text("claim");
    }
  }
  for (const char* id : {"fsdp_ddp_parity_t5-611m", "fsdp_ddp_parity_t5-2.28b", "ddp_oom_above_2.28b",
                         "backward_prefetch_gpt175b", "rate_limiter_t5_11b", "rate_limiter_regnet_deepvit",
                         "gpt175b_tflops", "gpt175b_scaling", "t5_11b_scaling", "hybrid_vs_full_t5_11b"}) {
    EXPECT_TRUE(ids.count(id)) << "missing claim " << id;
  }
}

// The numbers plot.py draws: every paper figure has points, the paper's
// value sits beside ours where the paper gives one, they repeat byte for
// byte, and they agree with the rows (GPT-175B's TFLOPS appear in both).
TEST_F(SimClaimsTest, PlotPointsCoverEveryFigureAndMatchTheRows) {
  StatusOr<Table>& rows = *rows_[0];
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  const Table& a = *points_[0];
  const Table& b = *points_[1];
  EXPECT_EQ(a.name(), "claims_simulated_points");
  EXPECT_EQ(a.ToCsv(), b.ToCsv());
  std::set<std::string> figures;
  int with_paper = 0;
  for (const Row& r : a.rows()) {
    figures.insert(r.Text("figure"));
    const Cell* paper = r.Find("paper");
    ASSERT_NE(paper, nullptr);
    if (paper->is_number) ++with_paper;
    if (r.Text("figure") == "capacity") {
      EXPECT_EQ(r.Text("x"), "a100-80g");
      EXPECT_NEAR(r.Number("value"), 80.0, 1.0);  // the A100-80G's HBM in GiB
    }
    if (r.Text("figure") == "gpt175b_scaling") {
      // "... 161.3 TFLOPS/GPU ..." in the row, the same number here.
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%s GPUs %.1f TFLOPS/GPU", r.Text("x").c_str(), r.Number("value"));
      bool found = false;
      for (const Row& row : rows->rows()) {
        if (row.Text("claim") == "gpt175b_tflops") found = row.Text("ours").find(buf) != std::string::npos;
      }
      EXPECT_TRUE(found) << buf;
    }
  }
  for (const char* f : {"capacity", "parity", "prefetch", "limiter", "limiter_memory", "gpt175b_scaling",
                        "t5_11b_scaling", "hybrid", "hybrid_memory", "hybrid_traffic"}) {
    EXPECT_TRUE(figures.count(f)) << "no points for figure " << f;
  }
  EXPECT_GE(with_paper, 8);
}

TEST(SimClaimsErrors, AnUnknownProfileIsAnError) {
  StatusOr<Table> t = SimulatedClaims("no-such-profile");
  EXPECT_FALSE(t.ok());
}

}  // namespace
}  // namespace sk::bench
