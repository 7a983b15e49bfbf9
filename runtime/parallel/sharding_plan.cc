#include "runtime/parallel/sharding_plan.h"

#include <cctype>

namespace sk {

const char* ShardingStrategyName(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kShardOptim: return "SHARD_OPTIM";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
    case ShardingStrategy::kHybridShardGradOp: return "HYBRID_SHARD_GRAD_OP";
  }
  return "UNKNOWN";
}

StatusOr<ShardingStrategy> ParseShardingStrategy(const std::string& name) {
  std::string n;
  for (char c : name) n.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                             ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard,
                             ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardGradOp}) {
    if (n == ShardingStrategyName(s)) return s;
  }
  return InvalidArgumentError("unknown sharding strategy '" + name +
                              "' (FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIM, NO_SHARD, HYBRID_SHARD, "
                              "HYBRID_SHARD_GRAD_OP)");
}

bool IsHybrid(ShardingStrategy s) {
  return s == ShardingStrategy::kHybridShard || s == ShardingStrategy::kHybridShardGradOp;
}

ReshardPolicy ReshardPolicyFor(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kShardGradOp:
    case ShardingStrategy::kHybridShardGradOp:
      return ReshardPolicy{/*reshard_after_forward=*/false, /*keep_unsharded=*/false};
    case ShardingStrategy::kShardOptim:
    case ShardingStrategy::kNoShard:
      return ReshardPolicy{/*reshard_after_forward=*/false, /*keep_unsharded=*/true};
    default:
      return ReshardPolicy{/*reshard_after_forward=*/true, /*keep_unsharded=*/false};
  }
}

std::string ShardingPlan::ToString() const {
  return std::string(ShardingStrategyName(strategy)) + " on " + mesh.ToString() +
         (policy.keep_unsharded ? ", unsharded between steps"
          : policy.reshard_after_forward ? ", reshard after forward"
                                         : ", unsharded from forward to backward");
}

StatusOr<ShardingPlan> ResolveSharding(ShardingStrategy strategy, int shard_group_size, int world_size,
                                       int ranks_per_node) {
  if (world_size < 1) return InvalidArgumentError("world size must be >= 1");
  switch (strategy) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
    case ShardingStrategy::kShardOptim:
    case ShardingStrategy::kNoShard:
    case ShardingStrategy::kHybridShard:
    case ShardingStrategy::kHybridShardGradOp:
      break;
    default:
      return InvalidArgumentError("unknown sharding strategy value " +
                                  std::to_string(static_cast<int>(strategy)));
  }
  if (shard_group_size < 0) return InvalidArgumentError("shard_group_size must be >= 0");
  if (shard_group_size > 0 && world_size % shard_group_size != 0) {
    return InvalidArgumentError("shard_group_size " + std::to_string(shard_group_size) +
                                " does not divide the world size " + std::to_string(world_size));
  }
  if (ranks_per_node < 0) {
    return InvalidArgumentError("ranks per node must be >= 0 (0 = one node), not " +
                                std::to_string(ranks_per_node));
  }
  // F: the ranks that shard each flat parameter between them.
  int shard = world_size;
  if (strategy == ShardingStrategy::kNoShard) {
    shard = 1;
  } else if (IsHybrid(strategy)) {
    if (shard_group_size > 0) {
      shard = shard_group_size;
    } else if (ranks_per_node > 0 && ranks_per_node < world_size) {
      // Shard within a node, replicate across nodes; ranks that disagreed
      // about their groups would wait in different collectives, so a node
      // size that cannot tile the world is an error, not a fallback.
      if (world_size % ranks_per_node != 0) {
        return InvalidArgumentError(std::string(ShardingStrategyName(strategy)) +
                                    " without shard_group_size shards within a node, but " +
                                    std::to_string(ranks_per_node) + " ranks per node do not divide the world size " +
                                    std::to_string(world_size) + " (set shard_group_size)");
      }
      shard = ranks_per_node;
    }
  }
  ShardingPlan plan;
  plan.strategy = strategy;
  SK_ASSIGN_OR_RETURN(plan.mesh, comm::MeshShape::Make(world_size / shard, shard, world_size));
  plan.policy = ReshardPolicyFor(strategy);
  return plan;
}

}  // namespace sk
