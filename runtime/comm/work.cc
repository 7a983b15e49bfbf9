#include "runtime/comm/work.h"

#include <algorithm>

namespace sk::comm {

Work::Work(std::string description, std::unique_ptr<Event> event)
    : description_(std::move(description)), event_(std::move(event)) {}

Work::Work(std::function<std::string()> describe, std::unique_ptr<Event> event)
    : describe_(std::move(describe)), event_(std::move(event)) {}

const std::string& Work::description() const {
  std::call_once(described_, [this] {
    if (describe_) {
      description_ = describe_();
      describe_ = nullptr;
    }
  });
  return description_;
}

bool Work::is_completed() const { return event_->Query(); }

Status Work::wait(Duration timeout) const {
  Status s = event_->Synchronize(timeout);
  if (!s.ok()) {
    // The collective's own timeout began when it started running, a little
    // after this wait began: a short grace lets its verdict, which names the
    // ranks that did not arrive, be the answer instead of this one.
    const Duration grace = std::min(Duration(2000), timeout / 4);
    if (grace.count() > 0 && event_->Synchronize(grace).ok()) return status();
    return DeadlineExceededError(description() + " did not complete within " +
                                 std::to_string(timeout.count()) + " ms");
  }
  return status();
}

Status Work::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void Work::SetStatus(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok()) status_ = std::move(s);
}

}  // namespace sk::comm
