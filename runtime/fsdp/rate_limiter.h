// The rate limiter: how many unsharded flat parameters FSDP lets be in
// flight at once, and the rule that decides whether a prefetch may add one.
//
// The FSDP paper (section 4.4) bounds in-flight all-gathers to two: on a GPU
// the CPU thread issues all-gathers far ahead of the device, and the
// producer stream's allocations then force the caching allocator into
// free-all-and-retry cycles. PyTorch FSDP1 calls it `_FreeEventQueue`. Here
// "in flight" means gathered for a computation that has not finished yet:
// a unit counts from the all-gather's issue until its forward (or backward)
// has finished computing with it (FsdpParamGroup::in_flight()).
//
// The limiter holds back prefetches only. A unit needed now is always
// gathered; a prefetch (backward PRE/POST, forward prefetch) issues the next
// units' all-gathers in order while the limiter admits one more, and stops
// at the first it refuses (the rest are gathered when needed). The default
// limit 2 therefore prefetches one unit ahead, as PyTorch does; off
// prefetches every remaining unit at once, which reproduces the paper's
// over-allocation.
#ifndef SHARDKIT_RUNTIME_FSDP_RATE_LIMITER_H_
#define SHARDKIT_RUNTIME_FSDP_RATE_LIMITER_H_

#include <optional>
#include <ostream>
#include <string>

#include "runtime/core/status.h"

namespace sk {

// The rate limiter's setting (FsdpOptions::all_gather_limit): at most N
// unsharded flat parameters in flight (N >= 1), or off. The runtime's only
// encoding of it; the C ABI (0 = 2, -1 = off), the planner's JSON (-1 = off)
// and the benchmark tables (0 = off) translate at their edges.
class RateLimit {
 public:
  // No limit: every remaining unit may be prefetched at once.
  static constexpr RateLimit Off() { return RateLimit(std::nullopt); }
  // At most `n` unsharded flat parameters in flight. Only n >= 1 is a
  // limit: ValidateRateLimit rejects the others.
  static constexpr RateLimit InFlight(int n) { return RateLimit(n); }

  constexpr bool off() const { return !max_in_flight_.has_value(); }
  // The limit N; only meaningful when !off().
  constexpr int max_in_flight() const { return max_in_flight_.value_or(0); }
  // "off", or N.
  std::string ToString() const { return off() ? "off" : std::to_string(*max_in_flight_); }

  friend constexpr bool operator==(const RateLimit&, const RateLimit&) = default;

 private:
  explicit constexpr RateLimit(std::optional<int> n) : max_in_flight_(n) {}
  std::optional<int> max_in_flight_;
};

// FSDP's default: two in flight, one unit prefetched ahead.
inline constexpr RateLimit kDefaultRateLimit = RateLimit::InFlight(2);

// OK when `limit` is off or N >= 1; otherwise InvalidArgument naming `field`.
Status ValidateRateLimit(RateLimit limit, const std::string& field);

// The rule, written once: whether a prefetch may issue one more all-gather.
// FSDP counts what is in flight (its units' state); the limiter decides.
class RateLimiter {
 public:
  explicit RateLimiter(RateLimit limit) : limit_(limit) {}

  RateLimit limit() const { return limit_; }
  // With `in_flight` unsharded flat parameters in flight, whether a
  // prefetch may gather one more: always when off, else while fewer than N
  // are. (A unit needed now is gathered without asking.)
  bool AdmitsPrefetch(int in_flight) const { return limit_.off() || in_flight < limit_.max_in_flight(); }

 private:
  RateLimit limit_;
};

inline std::ostream& operator<<(std::ostream& os, RateLimit limit) { return os << limit.ToString(); }

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_FSDP_RATE_LIMITER_H_
