#include <cstdio>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "benchmarks/claims.h"
#include "benchmarks/progress.h"
#include "benchmarks/report.h"

namespace sk::bench {
namespace {

TEST(ReportTest, CsvQuotesFieldsWithCommasQuotesAndNewlines) {
  Table t("x");
  t.Add(Row().Set("name", "a,b").Set("note", "say \"hi\"").Set("n", int64_t{3}));
  t.Add(Row().Set("name", "line\nbreak").Set("n", 2.5, 2));
  EXPECT_EQ(t.ToCsv(),
            "name,note,n\n"
            "\"a,b\",\"say \"\"hi\"\"\",3\n"
            "\"line\nbreak\",,2.50\n");
}

TEST(ReportTest, ColumnsAreTheUnionInFirstSeenOrder) {
  Table t("x");
  t.Add(Row().Set("a", "1").Set("b", "2"));
  t.Add(Row().Set("c", "3").Set("a", "4"));
  EXPECT_EQ(t.Columns(), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(ReportTest, JsonHasNumbersTextAndNullForMissingOrNonFiniteCells) {
  Table t("runs");
  t.Add(Row().Set("model", "gpt-1m").Set("step_ms", 12.5, 1));
  t.Add(Row().Set("model", "gpt-50m").Set("status", "OOM").Set("ratio", 1.0 / 0.0));
  auto doc = nlohmann::json::parse(t.ToJson());
  EXPECT_EQ(doc["table"], "runs");
  ASSERT_EQ(doc["rows"].size(), 2u);
  EXPECT_DOUBLE_EQ(doc["rows"][0]["step_ms"].get<double>(), 12.5);
  EXPECT_TRUE(doc["rows"][0]["status"].is_null());
  EXPECT_EQ(doc["rows"][1]["status"], "OOM");
  EXPECT_TRUE(doc["rows"][1]["step_ms"].is_null());
  EXPECT_TRUE(doc["rows"][1]["ratio"].is_null());
}

TEST(ReportTest, SetReplacesAnExistingCell) {
  Row r;
  r.Set("a", 1.0, 1).Set("a", "text");
  ASSERT_EQ(r.cells().size(), 1u);
  EXPECT_EQ(r.Text("a"), "text");
  EXPECT_EQ(r.Number("a", -1), -1);
}

TEST(ReportTest, IntegersPrintWithoutAPointAndPrecisionIsHonoured) {
  EXPECT_EQ(Row().Set("n", int64_t{1234567}).Text("n"), "1234567");
  EXPECT_EQ(Row().Set("x", 0.123456, 3).Text("x"), "0.123");
}

TEST(ReportTest, MarkdownEscapesPipes) {
  Table t("x");
  t.Add(Row().Set("a", "p|q"));
  EXPECT_EQ(t.ToMarkdown(), "| a |\n|---|\n| p\\|q |\n");
}

TEST(ProgressTest, FormatDurationPicksUnits) {
  EXPECT_EQ(FormatDuration(42.4), "42s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(3720), "1h02m");
  EXPECT_EQ(FormatDuration(-1), "?");
}

TEST(ProgressTest, RemainingIsUnknownBeforeAnyWorkAndProportionalAfter) {
  EXPECT_EQ(EstimateRemaining(10, 0, 100), -1);
  EXPECT_DOUBLE_EQ(EstimateRemaining(10, 25, 100), 30);
  EXPECT_DOUBLE_EQ(EstimateRemaining(10, 100, 100), 0);
}

TEST(ProgressTest, WeightsAndStepsDriveTheEstimate) {
  double now = 0;
  std::FILE* sink = std::tmpfile();
  Progress p("h", {1, 3}, sink, [&] { return now; });
  p.BeginConfig(0, "small");
  EXPECT_NE(p.last_line().find("configuration 1 of 2: small"), std::string::npos);
  EXPECT_NE(p.last_line().find("remaining ~?"), std::string::npos);
  now = 2;
  p.StepDone(1, 2);  // half of weight 1 done in 2 s: 3.5 units left at 4 s each
  EXPECT_NE(p.last_line().find("step 1 of 2"), std::string::npos);
  EXPECT_DOUBLE_EQ(p.Remaining(), 14);
  now = 4;
  p.EndConfig("ok");
  EXPECT_DOUBLE_EQ(p.Remaining(), 12);  // 1 unit in 4 s, 3 left
  EXPECT_NE(p.last_line().find("elapsed 4s, remaining ~12s"), std::string::npos);
  std::fclose(sink);
}

Row DdpRow(const std::string& model, const std::string& strategy, const std::string& status,
        double step_ms, double peak) {
  Row r;
  r.Set("model", model).Set("params_m", 10.0, 2).Set("strategy", strategy).Set("dtype", "f32");
  r.Set("memory_cap_mib", int64_t{640}).Set("status", status);
  if (status == "ok") r.Set("step_ms", step_ms, 1).Set("peak_alloc_mib", peak, 1);
  return r;
}

const Row& ClaimRow(const Table& claims, const std::string& id) {
  for (const Row& r : claims.rows()) {
    if (r.Text("claim") == id) return r;
  }
  static Row missing;
  ADD_FAILURE() << "no claim " << id;
  return missing;
}

TEST(ClaimsTest, MissingTablesAreNotRun) {
  Table claims = EvaluateClaims({}, 4);
  EXPECT_EQ(ClaimRow(claims, "fsdp_matches_ddp").Text("verdict"), "not run");
  EXPECT_EQ(ClaimRow(claims, "backward_prefetch_18pct").Text("verdict"), "not run");
  EXPECT_EQ(ClaimRow(claims, "backward_prefetch_18pct").Text("evidence").rfind("by construction", 0), 0u);
}

TEST(ClaimsTest, SpeedParityBandsDecideTheVerdict) {
  for (auto [ratio, verdict] : std::vector<std::pair<double, std::string>>{
           {1.05, "agrees"}, {0.95, "agrees"}, {1.3, "partly"}, {0.7, "partly"}, {2.0, "disagrees"},
           {0.4, "disagrees"}}) {
    Table t("ddp_vs_fsdp");
    t.Add(DdpRow("m", "DDP", "ok", 100, 200));
    t.Add(DdpRow("m", "FULL_SHARD", "ok", 100 * ratio, 80));
    Table claims = EvaluateClaims({{"ddp_vs_fsdp", &t}}, 4);
    EXPECT_EQ(ClaimRow(claims, "fsdp_matches_ddp").Text("verdict"), verdict) << ratio;
  }
}

TEST(ClaimsTest, DdpOomWhileFullShardTrainsAgrees) {
  Table t("ddp_vs_fsdp");
  t.Add(DdpRow("small", "DDP", "ok", 100, 200));
  t.Add(DdpRow("small", "FULL_SHARD", "ok", 100, 80));
  t.Add(DdpRow("large", "DDP", "OOM", 0, 0));
  t.Add(DdpRow("large", "FULL_SHARD", "ok", 300, 400));
  Table claims = EvaluateClaims({{"ddp_vs_fsdp", &t}}, 4);
  const Row& c = ClaimRow(claims, "ddp_ooms_fsdp_trains");
  EXPECT_EQ(c.Text("verdict"), "agrees");
  EXPECT_NE(c.Text("ours").find("DDP OOM on large"), std::string::npos);
  EXPECT_NE(c.Text("ours").find("small 0.40x"), std::string::npos);
}

TEST(ClaimsTest, FullShardOomWhereDdpOomsDisagrees) {
  Table t("ddp_vs_fsdp");
  t.Add(DdpRow("large", "DDP", "OOM", 0, 0));
  t.Add(DdpRow("large", "FULL_SHARD", "OOM", 0, 0));
  Table claims = EvaluateClaims({{"ddp_vs_fsdp", &t}}, 4);
  EXPECT_EQ(ClaimRow(claims, "ddp_ooms_fsdp_trains").Text("verdict"), "disagrees");
}

TEST(ClaimsTest, PrefetchSpeedupBands) {
  for (auto [pre_ms, verdict] : std::vector<std::pair<double, std::string>>{
           {100 / 1.18, "agrees"}, {100 / 1.05, "partly"}, {100 / 1.01, "disagrees"}, {110, "disagrees"}}) {
    Table t("prefetch");
    t.Add(Row().Set("model", "g").Set("mode", "none").Set("status", "ok").Set("step_ms", 100.0));
    t.Add(Row().Set("model", "g").Set("mode", "BACKWARD_PRE").Set("status", "ok").Set("step_ms", pre_ms));
    Table claims = EvaluateClaims({{"prefetch", &t}}, 4);
    EXPECT_EQ(ClaimRow(claims, "backward_prefetch_18pct").Text("verdict"), verdict) << pre_ms;
  }
}

Row Limiter(const std::string& setting, int limit, const std::string& status, double ms,
            int64_t retries) {
  Row r;
  r.Set("model", "g").Set("limit", int64_t{limit}).Set("setting", setting).Set("status", status);
  r.Set("memory_cap_mib", 100.0, 1).Set("alloc_retries", retries).Set("peak_reserved_mib", 90.0, 1);
  if (status == "ok") r.Set("step_ms", ms);
  return r;
}

TEST(ClaimsTest, LimiterNearCapCountsRetriesAndOoms) {
  Table partly("rate_limiter");
  partly.Add(Limiter("near cap", 0, "ok", 105, 7));
  partly.Add(Limiter("near cap", 2, "ok", 100, 0));
  EXPECT_EQ(ClaimRow(EvaluateClaims({{"rate_limiter", &partly}}, 4), "limiter_near_cap").Text("verdict"),
            "partly");
  Table oom("rate_limiter");
  oom.Add(Limiter("near cap", 0, "OOM", 0, 3));
  oom.Add(Limiter("near cap", 2, "ok", 100, 0));
  EXPECT_EQ(ClaimRow(EvaluateClaims({{"rate_limiter", &oom}}, 4), "limiter_near_cap").Text("verdict"),
            "agrees");
  Table none("rate_limiter");
  none.Add(Limiter("near cap", 0, "ok", 100, 0));
  none.Add(Limiter("near cap", 2, "ok", 100, 0));
  EXPECT_EQ(ClaimRow(EvaluateClaims({{"rate_limiter", &none}}, 4), "limiter_near_cap").Text("verdict"),
            "disagrees");
}

TEST(ClaimsTest, LimiterFarFromCapAgreesWhenTheEffectIsSmall) {
  Table t("rate_limiter");
  t.Add(Limiter("uncapped", 0, "ok", 100, 0));
  t.Add(Limiter("uncapped", 2, "ok", 104, 0));
  EXPECT_EQ(ClaimRow(EvaluateClaims({{"rate_limiter", &t}}, 4), "limiter_small_effect").Text("verdict"),
            "agrees");
}

TEST(ClaimsTest, HybridTrafficComparesWithThePaperFormulas) {
  // M = 1 Mi f32 parameters = 4 MiB; W = 4, G = 2.
  auto row = [](const std::string& s, int64_t g, double cross, double ms, double peak) {
    Row r;
    r.Set("model", "g").Set("params_m", 1.048576, 6).Set("strategy", s).Set("shard_group_size", g);
    r.Set("status", "ok").Set("cross_host_mib_per_step", cross).Set("step_ms", ms).Set("peak_alloc_mib", peak);
    return r;
  };
  Table t("hybrid");
  t.Add(row("FULL_SHARD", 4, 9.0, 300, 10));  // 3M(W-1)/W = 9
  t.Add(row("HYBRID_SHARD", 2, 2.0, 150, 15));
  t.Add(row("NO_SHARD", 1, 6.0, 200, 30));    // 2M(W-1)/W = 6
  Table claims = EvaluateClaims({{"hybrid", &t}}, 4);
  EXPECT_EQ(ClaimRow(claims, "hybrid_cross_host_traffic").Text("verdict"), "agrees");
  EXPECT_NE(ClaimRow(claims, "hybrid_cross_host_traffic").Text("ours").find("HYBRID_SHARD 2.0 (3.0"),
            std::string::npos);
  EXPECT_EQ(ClaimRow(claims, "hybrid_memory_for_speed").Text("verdict"), "agrees");
}

}  // namespace
}  // namespace sk::bench
