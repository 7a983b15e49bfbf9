// Status and StatusOr: how every fallible operation in shardkit reports.
//
// Modelled on absl::Status. A Status is OK or carries a canonical code and a
// message that names what was wrong. Anything a caller can get wrong (bad
// arguments, a call in the wrong state, a peer that does not answer) is a
// non-OK Status, never an abort; CHECK failures are reserved for bugs inside
// shardkit. Status is cheap when OK (one null pointer) and is [[nodiscard]].
//
// Thread safety: Status and StatusOr are values; distinct objects may be used
// from different threads freely, one object is not synchronised.
#ifndef SHARDKIT_RUNTIME_CORE_STATUS_H_
#define SHARDKIT_RUNTIME_CORE_STATUS_H_

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include <glog/logging.h>

namespace sk {

// Canonical codes, numbered as absl/gRPC number them. Never renumbered: the C
// ABI exposes the same values.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

// "INVALID_ARGUMENT" etc.; "UNKNOWN_CODE(n)" for values outside the enum.
std::string StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  // A status with `code` and `message`. A kOk code yields OK and drops the message.
  Status(StatusCode code, std::string_view message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty for OK.
  std::string_view message() const;

  // "CODE: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context`: "context: message".
  // OK stays OK. Used to leave a trail as an error propagates outwards.
  Status WithContext(std::string_view context) const;

  // Explicitly ignores this status (for best-effort cleanup paths).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

inline Status OkStatus() { return Status(); }
Status InvalidArgumentError(std::string_view message);
Status FailedPreconditionError(std::string_view message);
Status ResourceExhaustedError(std::string_view message);
Status DeadlineExceededError(std::string_view message);
Status UnavailableError(std::string_view message);
Status InternalError(std::string_view message);
Status NotFoundError(std::string_view message);
Status AlreadyExistsError(std::string_view message);
Status OutOfRangeError(std::string_view message);
Status UnimplementedError(std::string_view message);
Status CancelledError(std::string_view message);
Status AbortedError(std::string_view message);
Status DataLossError(std::string_view message);
Status UnknownError(std::string_view message);

// Either a value or a non-OK Status. Constructing from an OK Status is a bug
// (CHECK). Accessing value() of a non-OK StatusOr is a bug (CHECK).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) { CheckNotOk(); }  // NOLINT
  StatusOr(Status&& status) : status_(std::move(status)) { CheckNotOk(); }  // NOLINT
  StatusOr(const T& value) : value_(value) {}  // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT
  template <typename U,
            typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, StatusOr<T>> &&
                                        !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  const T& value() const& {
    CHECK(ok()) << "StatusOr::value() on error: " << status_;
    return *value_;
  }
  T& value() & {
    CHECK(ok()) << "StatusOr::value() on error: " << status_;
    return *value_;
  }
  T&& value() && {
    CHECK(ok()) << "StatusOr::value() on error: " << status_;
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void CheckNotOk() { CHECK(!status_.ok()) << "StatusOr constructed from an OK Status"; }

  Status status_;
  std::optional<T> value_;
};

namespace internal {
inline Status AsStatus(const Status& s) { return s; }
inline Status AsStatus(Status&& s) { return std::move(s); }
template <typename T>
Status AsStatus(const StatusOr<T>& s) {
  return s.status();
}
// Logs where an error passed on its way out (NCCL's checks.h breadcrumbs):
// with --v=1 a failure deep inside reads as a trail of file:line.
void LogPropagation(const Status& s, const char* file, int line);
}  // namespace internal

}  // namespace sk

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define SK_RETURN_IF_ERROR(expr)                                            \
  do {                                                                      \
    ::sk::Status sk_status_ = ::sk::internal::AsStatus(expr);               \
    if (!sk_status_.ok()) {                                                 \
      ::sk::internal::LogPropagation(sk_status_, __FILE__, __LINE__);       \
      return sk_status_;                                                    \
    }                                                                       \
  } while (0)

// `lhs = value of expr` (a StatusOr), or return its error.
#define SK_ASSIGN_OR_RETURN(lhs, expr) \
  SK_ASSIGN_OR_RETURN_IMPL(SK_STATUS_CONCAT(sk_statusor_, __LINE__), lhs, expr)
#define SK_STATUS_CONCAT_INNER(a, b) a##b
#define SK_STATUS_CONCAT(a, b) SK_STATUS_CONCAT_INNER(a, b)
#define SK_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)                    \
  auto tmp = (expr);                                                \
  if (!tmp.ok()) {                                                  \
    ::sk::internal::LogPropagation(tmp.status(), __FILE__, __LINE__); \
    return std::move(tmp).status();                                 \
  }                                                                 \
  lhs = std::move(tmp).value()

#endif  // SHARDKIT_RUNTIME_CORE_STATUS_H_
