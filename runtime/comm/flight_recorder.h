// FlightRecorder: each rank's record of its last collectives, for diagnosing
// hangs and timeouts after the fact (what PyTorch's NCCL flight recorder
// offers, readable without Python: see flight_merge.cc).
//
// Every ProcessGroup keeps one. Each collective is recorded when it is
// launched (sequence number, kind, dtypes and sizes, the caller's label such
// as "unit 'h.3' forward", timestamps), when it starts running and when it
// ends (completed, or failed with its error). The record is a ring of the
// last `capacity` collectives, so its memory is fixed however long training
// runs (strings are cut to a fixed length).
//
// Dumps. Dump() writes the record as JSON, durably. When the environment
// variable SK_FLIGHT_RECORDER_DIR names a directory, a backend dumps
// automatically the first time one of its collectives fails with anything but
// InvalidArgument (a timeout, a dead peer), to
//   $SK_FLIGHT_RECORDER_DIR/<group>.rank<R>.json
// Give every rank the same directory (a shared filesystem across hosts) and
// run `flight_merge DIR` to learn which ranks are behind and where.
//
// JSON: {"format": "shardkit.flight_recorder", "version": 1, "group",
//   "backend", "rank", "size", "pid", "dumped_at_us", "reason",
//   "entries": [{"seq", "kind", "call", "label", "bytes", "state",
//                "enqueued_us", "started_us", "ended_us", "error"}]}
// Times are microseconds since the Unix epoch (comparable across hosts as far
// as their clocks agree); 0 means "not yet". state is "queued", "running",
// "completed" or "failed". `call` is CallFingerprint::ToString().
//
// Thread safety: all methods may be called from any thread.
#ifndef SHARDKIT_RUNTIME_COMM_FLIGHT_RECORDER_H_
#define SHARDKIT_RUNTIME_COMM_FLIGHT_RECORDER_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/core/status.h"

namespace sk::comm {

struct Collective;

class FlightRecorder {
 public:
  static constexpr size_t kDefaultCapacity = 256;
  // Longest label and error text kept per entry; longer ones are cut.
  static constexpr size_t kMaxTextBytes = 256;

  enum class State : uint8_t { kQueued = 0, kRunning = 1, kCompleted = 2, kFailed = 3 };

  struct Entry {
    uint64_t seq = 0;
    std::string kind;   // "all_gather"
    std::string call;   // "all_gather #4 (f32, 1024 -> 4096)"
    std::string label;  // the caller's, e.g. "unit 'h.3' forward"
    uint64_t bytes = 0;
    State state = State::kQueued;
    int64_t enqueued_us = 0, started_us = 0, ended_us = 0;
    std::string error;
  };

  // `group` names the group in dumps and file names ("world",
  // "world/sub[0,1]#0"); only [A-Za-z0-9._-] survive in file names.
  FlightRecorder(std::string backend, std::string group, int rank, int size,
                 size_t capacity = kDefaultCapacity);

  void Enqueued(const Collective& c);
  void Started(uint64_t seq);
  // Records the end of `seq`: completed if `s` is OK, else failed with `s`.
  void Ended(uint64_t seq, const Status& s);

  // The entries still held, oldest first.
  std::vector<Entry> Snapshot() const;
  // The record as JSON (see above); `reason` says why it was taken.
  std::string ToJson(const std::string& reason) const;
  // Writes ToJson(reason) to `path` durably. Unavailable on I/O failure.
  Status Dump(const std::string& path, const std::string& reason) const;
  // If SK_FLIGHT_RECORDER_DIR is set and this recorder has not dumped
  // automatically yet, dumps there (see above) and returns the path; else "".
  // A failed dump is logged, never returned: it must not hide `error`.
  std::string DumpOnError(const Status& error);

  const std::string& group() const { return group_; }
  int rank() const { return rank_; }

 private:
  Entry* Find(uint64_t seq);  // under mu_; null if already overwritten

  const std::string backend_;
  const std::string group_;
  const int rank_;
  const int size_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  size_t next_ = 0;      // ring slot of the next entry
  uint64_t recorded_ = 0;  // entries recorded in total
  bool dumped_ = false;
};

// "FAILED"-style name of a state: "queued", "running", "completed", "failed".
const char* FlightStateName(FlightRecorder::State s);

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_FLIGHT_RECORDER_H_
