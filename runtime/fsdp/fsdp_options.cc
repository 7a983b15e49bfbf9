// FSDP's options: the backward prefetch names and ValidateFsdpOptions.
#include <cctype>
#include <cmath>
#include <string>

#include "runtime/fsdp/fsdp.h"

namespace sk {

const char* BackwardPrefetchName(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::kNone: return "NONE";
    case BackwardPrefetch::kBackwardPre: return "BACKWARD_PRE";
    case BackwardPrefetch::kBackwardPost: return "BACKWARD_POST";
  }
  return "UNKNOWN";
}

StatusOr<BackwardPrefetch> ParseBackwardPrefetch(const std::string& name) {
  std::string n;
  for (char c : name) n.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  for (BackwardPrefetch p : {BackwardPrefetch::kNone, BackwardPrefetch::kBackwardPre,
                             BackwardPrefetch::kBackwardPost}) {
    if (n == BackwardPrefetchName(p)) return p;
  }
  return InvalidArgumentError("unknown backward prefetch '" + name +
                              "' (NONE, BACKWARD_PRE, BACKWARD_POST)");
}

const char* GradAccumulationName(GradAccumulation g) {
  switch (g) {
    case GradAccumulation::kDefault: return "DEFAULT";
    case GradAccumulation::kSharded: return "SHARDED";
    case GradAccumulation::kUnsharded: return "UNSHARDED";
  }
  return "UNKNOWN";
}

StatusOr<GradAccumulation> ParseGradAccumulation(const std::string& name) {
  std::string n;
  for (char c : name) n.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  for (GradAccumulation g : {GradAccumulation::kDefault, GradAccumulation::kSharded, GradAccumulation::kUnsharded}) {
    if (n == GradAccumulationName(g)) return g;
  }
  return InvalidArgumentError("unknown gradient accumulation '" + name + "' (DEFAULT, SHARDED, UNSHARDED)");
}

bool ReducesEveryMicroBatch(const FsdpOptions& o) {
  switch (o.grad_accumulation) {
    case GradAccumulation::kSharded: return true;
    case GradAccumulation::kUnsharded: return false;
    case GradAccumulation::kDefault: break;
  }
  return o.strategy != ShardingStrategy::kShardOptim && o.strategy != ShardingStrategy::kNoShard;
}

Status ValidateFsdpOptions(const FsdpOptions& o, int world) {
  SK_RETURN_IF_ERROR(ResolveSharding(o.strategy, o.shard_group_size, world, o.ranks_per_node).status());
  switch (o.backward_prefetch) {
    case BackwardPrefetch::kNone:
    case BackwardPrefetch::kBackwardPre:
    case BackwardPrefetch::kBackwardPost:
      break;
    default:
      return InvalidArgumentError("unknown backward prefetch value " +
                                  std::to_string(static_cast<int>(o.backward_prefetch)));
  }
  switch (o.grad_accumulation) {
    case GradAccumulation::kDefault:
    case GradAccumulation::kSharded:
    case GradAccumulation::kUnsharded:
      break;
    default:
      return InvalidArgumentError("unknown grad_accumulation value " +
                                  std::to_string(static_cast<int>(o.grad_accumulation)) +
                                  " (0 default, 1 sharded, 2 unsharded)");
  }
  SK_RETURN_IF_ERROR(ValidateRateLimit(o.all_gather_limit, "all_gather_limit"));
  const MixedPrecisionPolicy& mp = o.mixed_precision;
  SK_RETURN_IF_ERROR(ValidateDType(mp.param_dtype).WithContext("mixed_precision.param_dtype"));
  if (mp.reduce_dtype) {
    SK_RETURN_IF_ERROR(ValidateDType(*mp.reduce_dtype).WithContext("mixed_precision.reduce_dtype"));
  }
  if (!(o.gradient_predivide_factor >= 0) || !std::isfinite(o.gradient_predivide_factor)) {
    return InvalidArgumentError("gradient_predivide_factor must be finite and >= 0 (0 = automatic)");
  }
  if (o.timeout.count() <= 0) return InvalidArgumentError("timeout must be positive");
  if (o.timeout > kMaxTimeout) {
    return InvalidArgumentError("timeout " + std::to_string(o.timeout.count()) + " ms exceeds the maximum of " +
                                std::to_string(kMaxTimeout.count()) + " ms (7 days)");
  }
  return OkStatus();
}

}  // namespace sk
