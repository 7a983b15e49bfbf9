#include "runtime/fsdp/rate_limiter.h"

namespace sk {

Status ValidateRateLimit(RateLimit limit, const std::string& field) {
  if (limit.off() || limit.max_in_flight() >= 1) return OkStatus();
  return InvalidArgumentError(field + " must be at least 1 unsharded flat parameter in flight, or RateLimit::Off(); not " +
                              limit.ToString());
}

}  // namespace sk
