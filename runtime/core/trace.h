// TraceRecorder: Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev).
//
// Spans are placed on tracks: `pid` is the rank, `tid` a track within it (one
// per stream, so a trace shows all-gather, compute and reduce-scatter streams
// side by side and whether they overlap). Counters plot values such as
// allocated and reserved memory over time.
//
// Cheap when off: every recording call first reads one relaxed atomic and
// returns. When on, events are appended under a mutex.
//
// Thread safety: all methods may be called from any thread.
#ifndef SHARDKIT_RUNTIME_CORE_TRACE_H_
#define SHARDKIT_RUNTIME_CORE_TRACE_H_

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/status.h"

namespace sk {

class TraceRecorder {
 public:
  TraceRecorder() = default;
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // The process-wide recorder that runtime components record into.
  static TraceRecorder& Global();

  // Microseconds on a monotonic clock, relative to the first call in the process.
  static double NowMicros();

  // Drops previous events and starts recording.
  void Start();
  // Stops recording; events are kept until the next Start().
  void Stop();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Names a track ("ag stream", "compute") and a process ("rank 0") in the viewer.
  void NameTrack(int pid, int64_t tid, std::string_view name);
  void NameProcess(int pid, std::string_view name);

  // A span [ts_us, ts_us + dur_us) on track (pid, tid).
  void Complete(std::string_view name, std::string_view category, int pid, int64_t tid,
                double ts_us, double dur_us);
  // A counter sample: each (series, value) is one line in the counter's plot.
  void Counter(std::string_view name, int pid, double ts_us,
               std::initializer_list<std::pair<std::string_view, double>> values);
  // A point in time on a track.
  void Instant(std::string_view name, int pid, int64_t tid, double ts_us);

  size_t event_count() const;
  // {"traceEvents": [...], "displayTimeUnit": "ms"}.
  std::string ToJson() const;
  // Writes ToJson() to `path` durably (WriteFileDurably: temporary file, fsync,
  // rename, fsync of the directory). Unavailable on I/O failure.
  Status WriteJson(const std::string& path) const;

 private:
  struct Event {
    char phase;
    std::string name;
    std::string category;
    int pid;
    int64_t tid;
    double ts;
    double dur;
    std::vector<std::pair<std::string, double>> counters;
    std::string label;  // metadata events: the name given to a track or process
  };
  void Append(Event e);

  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// Records a span from construction to destruction if the recorder was enabled
// at construction.
class TraceSpan {
 public:
  TraceSpan(std::string_view name, std::string_view category, int pid, int64_t tid,
            TraceRecorder& recorder = TraceRecorder::Global())
      : recorder_(recorder.enabled() ? &recorder : nullptr) {
    if (recorder_ != nullptr) {
      name_ = name;
      category_ = category;
      pid_ = pid;
      tid_ = tid;
      start_ = TraceRecorder::NowMicros();
    }
  }
  ~TraceSpan() {
    if (recorder_ != nullptr) {
      recorder_->Complete(name_, category_, pid_, tid_, start_, TraceRecorder::NowMicros() - start_);
    }
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  TraceRecorder* recorder_;
  std::string name_;
  std::string category_;
  int pid_ = 0;
  int64_t tid_ = 0;
  double start_ = 0;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_TRACE_H_
