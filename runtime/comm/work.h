// Work: the handle of one asynchronous collective.
//
// A collective is enqueued on a stream and returns at once with a Work. The
// Work completes through an Event recorded on that stream right after the
// collective, so
//   - the host can poll (is_completed) or block with a timeout (wait), and
//   - another stream can order itself after the collective without blocking
//     the host: `compute.WaitEvent(work->event())` (FSDP's pattern: all-gather
//     on one stream, compute on another).
// The collective's own outcome (a peer that did not arrive, a size mismatch)
// is its status(); it is also the stream's sticky error (device.h).
//
// Modelled on c10d's Work: is_completed(), wait(timeout), exception().
//
// Thread safety: every method may be called from any thread.
#ifndef SHARDKIT_RUNTIME_COMM_WORK_H_
#define SHARDKIT_RUNTIME_COMM_WORK_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace sk::comm {

class Work {
 public:
  // `description` names the call in errors ("all_gather #3 on local rank 1").
  // `event` must be recorded on the collective's stream after the collective
  // by the backend (see Launch helpers in process_group.h).
  Work(std::string description, std::unique_ptr<Event> event);
  // The same, with the description built by `describe` the first time it is
  // needed (an error, description()): the simulator launches millions of
  // collectives while planning and formatting each one's description cost
  // about a tenth of a plan's instructions. `describe` must be callable from
  // any thread and own what it reads.
  Work(std::function<std::string()> describe, std::unique_ptr<Event> event);
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // True once the collective (and everything before it on its stream) has run,
  // successfully or not. Never blocks.
  bool is_completed() const;

  // Blocks until completed, then returns status(). DeadlineExceeded naming the
  // collective if it has not completed within `timeout` plus a grace of
  // min(timeout / 4, 2 s) in which the collective's own outcome is still
  // taken (its timeout started later, when it began running, and its error
  // names the ranks that did not arrive); the collective keeps running and
  // the Work may be waited on again.
  Status wait(Duration timeout = kDefaultTimeout) const;

  // OK while running or after success; the collective's error once it failed.
  Status status() const;

  // The completion event, for Stream::WaitEvent on other streams.
  const Event& event() const { return *event_; }
  const std::string& description() const;

  // Backends: the completion event, to be recorded once on the collective's
  // stream right after the collective is enqueued.
  Event& mutable_event() { return *event_; }

  // Backends: records the collective's outcome (called on the stream, before
  // the completion event fires). The first non-OK status is kept.
  void SetStatus(Status s);

 private:
  mutable std::once_flag described_;
  mutable std::function<std::string()> describe_;
  mutable std::string description_;
  std::unique_ptr<Event> event_;
  mutable std::mutex mu_;
  Status status_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_WORK_H_
