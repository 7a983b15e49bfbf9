// Reads a Chrome trace written by the simulator (TraceRecorder's JSON) back
// as spans on named tracks, for tests that check what a simulated step did.
#ifndef SHARDKIT_TESTS_SIM_TRACE_SPANS_H_
#define SHARDKIT_TESTS_SIM_TRACE_SPANS_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sk::sim_trace {

struct TraceSpan {
  std::string track;     // the thread_name of its track ("compute (rank 0)", ...)
  std::string name;      // the span's name ("gemm", "reduce_scatter #3 ...")
  std::string category;  // "compute", "comm", ...
  double start_us = 0, end_us = 0;
};

struct Trace {
  std::vector<TraceSpan> spans;  // complete ("X") events on named tracks
  // Categories of every complete event, on a named track or not.
  std::vector<std::string> categories;

  // The spans of the first track (by name order) whose name starts with
  // `prefix`; empty when there is none.
  std::vector<TraceSpan> Track(const std::string& prefix) const {
    std::map<std::string, std::vector<TraceSpan>> by_track;
    for (const TraceSpan& s : spans) {
      if (s.track.rfind(prefix, 0) == 0) by_track[s.track].push_back(s);
    }
    return by_track.empty() ? std::vector<TraceSpan>{} : by_track.begin()->second;
  }
};

// nullopt when the file is missing or not JSON with traceEvents.
inline std::optional<Trace> ReadTrace(const std::string& path) {
  std::ifstream f(path);
  if (!f.good()) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("traceEvents")) return std::nullopt;
  std::map<int64_t, std::string> tracks;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      tracks[e["tid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
    }
  }
  Trace t;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    t.categories.push_back(e.value("cat", ""));
    auto it = tracks.find(e["tid"].get<int64_t>());
    if (it == tracks.end()) continue;
    const double ts = e["ts"].get<double>();
    t.spans.push_back(TraceSpan{it->second, e.value("name", ""), e.value("cat", ""), ts,
                                ts + e["dur"].get<double>()});
  }
  return t;
}

}  // namespace sk::sim_trace

#endif  // SHARDKIT_TESTS_SIM_TRACE_SPANS_H_
