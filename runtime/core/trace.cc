#include "runtime/core/trace.h"

#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"

namespace sk {

TraceRecorder& TraceRecorder::Global() {
  static TraceRecorder* recorder = new TraceRecorder();  // never destroyed: used at exit
  return *recorder;
}

double TraceRecorder::NowMicros() {
  static const auto origin = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin)
      .count();
}

void TraceRecorder::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
  enabled_.store(true, std::memory_order_relaxed);
}

void TraceRecorder::Stop() { enabled_.store(false, std::memory_order_relaxed); }

void TraceRecorder::Append(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

void TraceRecorder::NameTrack(int pid, int64_t tid, std::string_view name) {
  if (!enabled()) return;
  Append(Event{'M', "thread_name", "", pid, tid, 0, 0, {}, std::string(name)});
}

void TraceRecorder::NameProcess(int pid, std::string_view name) {
  if (!enabled()) return;
  Append(Event{'M', "process_name", "", pid, 0, 0, 0, {}, std::string(name)});
}

void TraceRecorder::Complete(std::string_view name, std::string_view category, int pid,
                             int64_t tid, double ts_us, double dur_us) {
  if (!enabled()) return;
  Append(Event{'X', std::string(name), std::string(category), pid, tid, ts_us, dur_us, {}, ""});
}

void TraceRecorder::Counter(std::string_view name, int pid, double ts_us,
                            std::initializer_list<std::pair<std::string_view, double>> values) {
  if (!enabled()) return;
  Event e{'C', std::string(name), "", pid, 0, ts_us, 0, {}, ""};
  for (const auto& [k, v] : values) e.counters.emplace_back(std::string(k), v);
  Append(std::move(e));
}

void TraceRecorder::Instant(std::string_view name, int pid, int64_t tid, double ts_us) {
  if (!enabled()) return;
  Append(Event{'i', std::string(name), "", pid, tid, ts_us, 0, {}, ""});
}

size_t TraceRecorder::event_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

std::string TraceRecorder::ToJson() const {
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Event& e : events_) {
      nlohmann::json j;
      j["ph"] = std::string(1, e.phase);
      j["name"] = e.name;
      j["pid"] = e.pid;
      switch (e.phase) {
        case 'M':
          j["tid"] = e.tid;
          j["args"] = {{"name", e.label}};
          break;
        case 'X':
          j["cat"] = e.category.empty() ? "shardkit" : e.category;
          j["tid"] = e.tid;
          j["ts"] = e.ts;
          j["dur"] = e.dur;
          break;
        case 'C': {
          j["ts"] = e.ts;
          nlohmann::json args = nlohmann::json::object();
          for (const auto& [k, v] : e.counters) args[k] = v;
          j["args"] = args;
          break;
        }
        default:
          j["tid"] = e.tid;
          j["ts"] = e.ts;
          j["s"] = "t";
          break;
      }
      events.push_back(std::move(j));
    }
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

Status TraceRecorder::WriteJson(const std::string& path) const {
  return WriteFileDurably(path, ToJson()).WithContext("writing the trace");
}

}  // namespace sk
