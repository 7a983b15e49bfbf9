#include "runtime/core/trace.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace sk {
namespace {

TEST(TraceTest, RecordsNothingWhenOff) {
  TraceRecorder r;
  r.Complete("x", "c", 0, 1, 0, 1);
  r.Counter("mem", 0, 0, {{"allocated", 1}});
  { TraceSpan span("y", "c", 0, 1, r); }
  EXPECT_EQ(r.event_count(), 0u);
}

TEST(TraceTest, WritesChromeTraceEventJson) {
  TraceRecorder r;
  r.Start();
  r.NameProcess(0, "rank 0");
  r.NameTrack(0, 7, "all-gather stream");
  r.Complete("all_gather", "comm", 0, 7, 10.0, 5.0);
  r.Counter("memory", 0, 12.0, {{"allocated", 1024}, {"reserved", 2048}});
  { TraceSpan span("forward", "compute", 0, 1, r); }
  r.Stop();
  r.Complete("after stop", "c", 0, 1, 0, 1);
  nlohmann::json doc = nlohmann::json::parse(r.ToJson());
  const auto& ev = doc["traceEvents"];
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[1]["ph"], "M");
  EXPECT_EQ(ev[1]["args"]["name"], "all-gather stream");
  EXPECT_EQ(ev[2]["ph"], "X");
  EXPECT_EQ(ev[2]["tid"], 7);
  EXPECT_EQ(ev[2]["dur"], 5.0);
  EXPECT_EQ(ev[3]["ph"], "C");
  EXPECT_EQ(ev[3]["args"]["reserved"], 2048);
  EXPECT_EQ(ev[4]["name"], "forward");
  EXPECT_GE(ev[4]["dur"].get<double>(), 0.0);
}

TEST(TraceTest, ConcurrentRecordingKeepsEveryEvent) {
  TraceRecorder r;
  r.Start();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 500; ++i) r.Complete("op", "c", 0, t, i, 1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(r.event_count(), 2000u);
}

TEST(TraceTest, WriteJsonToFileAndReportUnwritablePath) {
  TraceRecorder r;
  r.Start();
  r.Instant("mark", 0, 0, 1.0);
  std::string path = ::testing::TempDir() + "/trace_test.json";
  ASSERT_TRUE(r.WriteJson(path).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(ss.str())["traceEvents"].size(), 1u);
  std::remove(path.c_str());
  EXPECT_EQ(r.WriteJson("/nonexistent-dir/x/trace.json").code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sk
