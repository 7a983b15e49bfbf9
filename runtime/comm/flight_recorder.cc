#include "runtime/comm/flight_recorder.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "runtime/comm/process_group.h"
#include "runtime/core/env.h"
#include "runtime/core/file_io.h"

namespace sk::comm {

namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Cut(std::string s) {
  if (s.size() > FlightRecorder::kMaxTextBytes) s.resize(FlightRecorder::kMaxTextBytes);
  return s;
}

std::string FileSafe(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                    ch == '.' || ch == '_' || ch == '-';
    out.push_back(ok ? ch : '_');
  }
  return out.empty() ? "group" : out;
}

}  // namespace

const char* FlightStateName(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kQueued: return "queued";
    case FlightRecorder::State::kRunning: return "running";
    case FlightRecorder::State::kCompleted: return "completed";
    case FlightRecorder::State::kFailed: return "failed";
  }
  return "unknown";
}

FlightRecorder::FlightRecorder(std::string backend, std::string group, int rank, int size, size_t capacity)
    : backend_(std::move(backend)), group_(std::move(group)), rank_(rank), size_(size),
      ring_(capacity == 0 ? 1 : capacity) {}

void FlightRecorder::Enqueued(const Collective& c) {
  Entry e;
  e.seq = c.seq;
  e.kind = CollectiveName(c.kind);
  e.call = CallFingerprint::Of(c).ToString();
  e.label = Cut(c.label);
  e.bytes = c.nccl_bytes();
  e.enqueued_us = NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  ring_[next_] = std::move(e);
  next_ = (next_ + 1) % ring_.size();
  ++recorded_;
}

FlightRecorder::Entry* FlightRecorder::Find(uint64_t seq) {
  const size_t held = static_cast<size_t>(std::min<uint64_t>(recorded_, ring_.size()));
  for (size_t k = 1; k <= held; ++k) {  // newest first: the one asked for is usually recent
    Entry& e = ring_[(next_ + ring_.size() - k) % ring_.size()];
    if (e.seq == seq) return &e;
  }
  return nullptr;
}

void FlightRecorder::Started(uint64_t seq) {
  const int64_t now = NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = Find(seq)) {
    e->state = State::kRunning;
    e->started_us = now;
  }
}

void FlightRecorder::Ended(uint64_t seq, const Status& s) {
  const int64_t now = NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = Find(seq)) {
    e->state = s.ok() ? State::kCompleted : State::kFailed;
    e->ended_us = now;
    if (!s.ok()) e->error = Cut(s.ToString());
  }
}

std::vector<FlightRecorder::Entry> FlightRecorder::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  const size_t held = static_cast<size_t>(std::min<uint64_t>(recorded_, ring_.size()));
  for (size_t k = held; k >= 1; --k) out.push_back(ring_[(next_ + ring_.size() - k) % ring_.size()]);
  return out;
}

std::string FlightRecorder::ToJson(const std::string& reason) const {
  nlohmann::json entries = nlohmann::json::array();
  for (const Entry& e : Snapshot()) {
    entries.push_back({{"seq", e.seq},
                       {"kind", e.kind},
                       {"call", e.call},
                       {"label", e.label},
                       {"bytes", e.bytes},
                       {"state", FlightStateName(e.state)},
                       {"enqueued_us", e.enqueued_us},
                       {"started_us", e.started_us},
                       {"ended_us", e.ended_us},
                       {"error", e.error}});
  }
  nlohmann::json doc = {{"format", "shardkit.flight_recorder"},
                        {"version", 1},
                        {"group", group_},
                        {"backend", backend_},
                        {"rank", rank_},
                        {"size", size_},
                        {"pid", static_cast<int64_t>(::getpid())},
                        {"dumped_at_us", NowMicros()},
                        {"reason", Cut(reason)},
                        {"entries", entries}};
  // Replace invalid UTF-8 (a label is the caller's text) instead of throwing.
  return doc.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Status FlightRecorder::Dump(const std::string& path, const std::string& reason) const {
  return WriteFileDurably(path, ToJson(reason)).WithContext("dumping the flight recorder");
}

std::string FlightRecorder::DumpOnError(const Status& error) {
  const char* dir = GetEnv(EnvVar::kFlightRecorderDir);
  if (dir == nullptr || *dir == '\0') return "";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (dumped_) return "";
    dumped_ = true;
  }
  const std::string path = std::string(dir) + "/" + FileSafe(group_) + ".rank" + std::to_string(rank_) + ".json";
  Status s = Dump(path, error.ToString());
  if (!s.ok()) {
    LOG(WARNING) << "flight recorder of " << backend_ << " group '" << group_ << "' rank " << rank_ << ": " << s;
    return "";
  }
  return path;
}

}  // namespace sk::comm
