#include "runtime/core/status.h"

namespace sk {

std::string StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
  }
  return "UNKNOWN_CODE(" + std::to_string(static_cast<int>(code)) + ")";
}

Status::Status(StatusCode code, std::string_view message) {
  if (code != StatusCode::kOk) state_ = std::make_unique<State>(State{code, std::string(message)});
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

std::string_view Status::message() const {
  return state_ ? std::string_view(state_->message) : std::string_view();
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return StatusCodeName(state_->code) + ": " + state_->message;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += state_->message;
  return Status(state_->code, msg);
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

Status InvalidArgumentError(std::string_view m) { return Status(StatusCode::kInvalidArgument, m); }
Status FailedPreconditionError(std::string_view m) { return Status(StatusCode::kFailedPrecondition, m); }
Status ResourceExhaustedError(std::string_view m) { return Status(StatusCode::kResourceExhausted, m); }
Status DeadlineExceededError(std::string_view m) { return Status(StatusCode::kDeadlineExceeded, m); }
Status UnavailableError(std::string_view m) { return Status(StatusCode::kUnavailable, m); }
Status InternalError(std::string_view m) { return Status(StatusCode::kInternal, m); }
Status NotFoundError(std::string_view m) { return Status(StatusCode::kNotFound, m); }
Status AlreadyExistsError(std::string_view m) { return Status(StatusCode::kAlreadyExists, m); }
Status OutOfRangeError(std::string_view m) { return Status(StatusCode::kOutOfRange, m); }
Status UnimplementedError(std::string_view m) { return Status(StatusCode::kUnimplemented, m); }
Status CancelledError(std::string_view m) { return Status(StatusCode::kCancelled, m); }
Status AbortedError(std::string_view m) { return Status(StatusCode::kAborted, m); }
Status DataLossError(std::string_view m) { return Status(StatusCode::kDataLoss, m); }
Status UnknownError(std::string_view m) { return Status(StatusCode::kUnknown, m); }

namespace internal {
void LogPropagation(const Status& s, const char* file, int line) {
  VLOG(1) << "error passed " << file << ":" << line << ": " << s;
}
}  // namespace internal

}  // namespace sk
