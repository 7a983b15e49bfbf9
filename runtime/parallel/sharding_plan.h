// What a sharding strategy means, decided once.
//
// FSDP2's model: a strategy is a device mesh (which ranks shard a flat
// parameter between them, which ranks hold replicas of the same shard) plus
// a reshard policy (whether gathered parameters are freed after forward,
// whether full parameters live across steps). ResolveSharding turns the
// user's options and the launch's shape into that pair, and FSDP (its
// process groups and flat-parameter shards), the memory estimator and the
// planner all read the same ShardingPlan, so they cannot disagree about it.
//
//   strategy               mesh (replicate x shard)   reshard after forward   unsharded between steps
//   FULL_SHARD (ZeRO-3)    1 x N                      yes                     no
//   SHARD_GRAD_OP (ZeRO-2) 1 x N                      no                      no
//   SHARD_OPTIM (ZeRO-1)   1 x N                      no                      params and grads
//   NO_SHARD (DDP-like)    N x 1                      no                      params and grads
//   HYBRID_SHARD           N/F x F                    yes                     no
//   HYBRID_SHARD_GRAD_OP   N/F x F                    no                      no
//
// F, the hybrids' sharding factor: shard_group_size when it is > 0, else the
// ranks per node (one node's ranks shard, nodes replicate; a world within
// one node shards over all of it), else the world size. The ranks per node
// is an input: the launch edge reads it (LOCAL_WORLD_SIZE, or a simulated
// cluster's GPUs per node) and passes it in; nothing here reads the
// environment.
//
// Thread safety: plain values and pure functions.
#ifndef SHARDKIT_RUNTIME_PARALLEL_SHARDING_PLAN_H_
#define SHARDKIT_RUNTIME_PARALLEL_SHARDING_PLAN_H_

#include <string>
#include <vector>

#include "runtime/comm/device_mesh.h"
#include "runtime/core/status.h"

namespace sk {

// Values equal the C ABI's sk_sharding_strategy_t (capi/abi.cc asserts it):
// never renumbered. The ABI's 0 ("default": FULL_SHARD) is resolved when it
// translates options; no runtime value means "default".
enum class ShardingStrategy : int {
  kFullShard = 1,
  kShardGradOp = 2,
  kShardOptim = 3,
  kNoShard = 4,
  kHybridShard = 5,
  kHybridShardGradOp = 6,
};

// "FULL_SHARD", ...; and the inverse (accepts the lower-case forms too).
const char* ShardingStrategyName(ShardingStrategy s);
StatusOr<ShardingStrategy> ParseShardingStrategy(const std::string& name);

// HYBRID_SHARD and HYBRID_SHARD_GRAD_OP: the strategies whose shard group
// is smaller than the world (shard_group_size applies to them only).
bool IsHybrid(ShardingStrategy s);

// When gathered (unsharded) flat parameters are freed.
struct ReshardPolicy {
  // Free a unit's gathered parameters after its forward and gather them
  // again for its backward (FULL_SHARD, HYBRID_SHARD); otherwise they live
  // from forward to the end of the unit's backward.
  bool reshard_after_forward = true;
  // Full parameters and full gradients live across steps and are never
  // gathered per step (SHARD_OPTIM, NO_SHARD): only the master shards,
  // gradient shards and optimizer state are sharded.
  bool keep_unsharded = false;

  // Parameters are all-gathered in every forward (all but the two above).
  bool gathers_in_forward() const { return !keep_unsharded; }
  // ... and again in every backward.
  bool gathers_in_backward() const { return reshard_after_forward; }
};

// The policy of a strategy. A strategy value
// outside the enum gets FULL_SHARD's; ResolveSharding rejects it.
ReshardPolicy ReshardPolicyFor(ShardingStrategy s);

// A strategy resolved against a world: the mesh and the policy.
struct ShardingPlan {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  comm::MeshShape mesh;
  ReshardPolicy policy;

  int world_size() const { return mesh.world_size(); }
  // F: ranks sharing one flat parameter's shards (its all-gather and
  // reduce-scatter group); 1 for NO_SHARD.
  int shard_size() const { return mesh.shard; }
  // Replicas of each shard (the gradient all-reduce's group); 1 unless
  // NO_SHARD or hybrid.
  int replicate_size() const { return mesh.replicate; }
  // Master shards, gradient shards and optimizer state are 1/F of the model.
  bool shards_model_state() const { return mesh.shard > 1; }
  // The world ranks of `rank`'s shard group and of its replicate group.
  std::vector<int> ShardGroupRanks(int rank) const { return mesh.ShardGroupRanks(mesh.ReplicaOf(rank)); }
  std::vector<int> ReplicateGroupRanks(int rank) const {
    return mesh.ReplicateGroupRanks(mesh.ShardIndexOf(rank));
  }
  // "HYBRID_SHARD on DeviceMesh(replicate=2, shard=2), reshard after forward".
  std::string ToString() const;
};

// Resolves `strategy` with `shard_group_size` (0 = unset) on `world_size`
// ranks, `ranks_per_node` of them per node (0 = unknown: one node).
// InvalidArgument naming the value: world_size < 1, a strategy outside the
// enum, shard_group_size < 0 or not dividing the world size, ranks_per_node
// < 0, or (a hybrid without shard_group_size) ranks_per_node below the world
// size and not dividing it.
StatusOr<ShardingPlan> ResolveSharding(ShardingStrategy strategy, int shard_group_size, int world_size,
                                       int ranks_per_node);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_PARALLEL_SHARDING_PLAN_H_
