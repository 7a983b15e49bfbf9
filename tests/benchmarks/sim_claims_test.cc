#include "benchmarks/sim_claims.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

namespace sk::bench {
namespace {

TEST(SimClaimsTest, TwoRunsGiveTheSameBytesAndEveryRowIsJudged) {
  StatusOr<Table> a = SimulatedClaims("a100-80g");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  StatusOr<Table> b = SimulatedClaims("a100-80g");
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

TEST(SimClaimsTest, AnUnknownProfileIsAnError) {
  StatusOr<Table> t = SimulatedClaims("no-such-profile");
  EXPECT_FALSE(t.ok());
}

}  // namespace
}  // namespace sk::bench
