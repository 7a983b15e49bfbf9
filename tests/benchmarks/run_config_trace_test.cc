// The paper harnesses' Chrome traces (RunConfig's trace_path): the compute
// track holds the ops the step ran, the hooks have a named track, and the
// collectives sit on their streams' tracks (issue 12 found no compute spans
// and the hooks on an unnamed track).
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "benchmarks/paper/run_config.h"

namespace sk::bench {
namespace {

// Span names by track name, over every rank.
std::map<std::string, std::multiset<std::string>> SpansByTrack(const nlohmann::json& doc) {
  std::map<std::pair<int, int64_t>, std::string> names;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      names[{e["pid"].get<int>(), e["tid"].get<int64_t>()}] = e["args"]["name"].get<std::string>();
    }
  }
  std::map<std::string, std::multiset<std::string>> out;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    auto it = names.find({e["pid"].get<int>(), e["tid"].get<int64_t>()});
    std::string track = it == names.end() ? "(unnamed)" : it->second;
    // "compute (rank 1)" -> "compute": one key per kind of track.
    track = track.substr(0, track.find(" ("));
    out[track].insert(e.value("name", ""));
  }
  return out;
}

std::string Dump(const std::map<std::string, std::multiset<std::string>>& spans) {
  std::string out;
  for (const auto& [track, names] : spans) out += track + ": " + std::to_string(names.size()) + " spans; ";
  return out;
}

class RunConfigTraceTest : public ::testing::TestWithParam<Parallelism> {};

TEST_P(RunConfigTraceTest, ComputeOpsOnTheComputeTrackAndHooksOnANamedTrack) {
  const std::string path = ::testing::TempDir() + "/run_config_trace_" +
                           std::to_string(static_cast<int>(GetParam())) + ".json";
  RunSpec spec;
  spec.trainer.model = "gpt-tiny";
  spec.trainer.parallelism = GetParam();
  spec.world = 2;
  spec.warmup_steps = 1;
  spec.steps = 1;
  spec.trace_path = path;
  RunResult r = RunConfig(spec, nullptr);
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(r.error.empty()) << r.error;
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  const nlohmann::json doc = nlohmann::json::parse(f);
  const auto spans = SpansByTrack(doc);
  const std::string hooks = GetParam() == Parallelism::kDdp ? "DDP hooks" : "FSDP hooks";
  ASSERT_TRUE(spans.count("compute")) << Dump(spans);
  EXPECT_TRUE(spans.at("compute").count("gemm")) << Dump(spans);
  ASSERT_TRUE(spans.count(hooks)) << Dump(spans);
  EXPECT_FALSE(spans.count("(unnamed)")) << Dump(spans);
  bool post_backward = false;
  for (const std::string& name : spans.at(hooks)) post_backward = post_backward || name.rfind("post_backward", 0) == 0;
  EXPECT_TRUE(post_backward) << Dump(spans);
  if (GetParam() == Parallelism::kFsdp) {
    ASSERT_TRUE(spans.count("all-gather")) << Dump(spans);
    EXPECT_TRUE(spans.at("all-gather").count("all_gather")) << Dump(spans);
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Both, RunConfigTraceTest, ::testing::Values(Parallelism::kFsdp, Parallelism::kDdp),
                         [](const auto& info) { return info.param == Parallelism::kDdp ? "Ddp" : "Fsdp"; });

}  // namespace
}  // namespace sk::bench
