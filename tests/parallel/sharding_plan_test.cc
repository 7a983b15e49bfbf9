// ResolveSharding: each strategy's mesh and reshard policy, the hybrids'
// sharding factor, and the options it refuses.
#include "runtime/parallel/sharding_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sk {
namespace {

ShardingPlan Resolve(ShardingStrategy s, int shard_group_size, int world, int ranks_per_node) {
  StatusOr<ShardingPlan> plan = ResolveSharding(s, shard_group_size, world, ranks_per_node);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : ShardingPlan{};
}

struct Row {
  ShardingStrategy strategy;
  int replicate;
  int shard;
  bool reshard_after_forward;
  bool keep_unsharded;
};

TEST(ResolveShardingTest, EachStrategyIsAMeshAndAReshardPolicy) {
  // World 8, 4 ranks per node, no shard_group_size.
  const Row rows[] = {
      {ShardingStrategy::kFullShard, 1, 8, true, false},
      {ShardingStrategy::kShardGradOp, 1, 8, false, false},
      {ShardingStrategy::kShardOptim, 1, 8, false, true},
      {ShardingStrategy::kNoShard, 8, 1, false, true},
      {ShardingStrategy::kHybridShard, 2, 4, true, false},
      {ShardingStrategy::kHybridShardGradOp, 2, 4, false, false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(ShardingStrategyName(row.strategy));
    const ShardingPlan p = Resolve(row.strategy, 0, 8, 4);
    EXPECT_EQ(p.strategy, row.strategy);
    EXPECT_EQ(p.replicate_size(), row.replicate);
    EXPECT_EQ(p.shard_size(), row.shard);
    EXPECT_EQ(p.world_size(), 8);
    EXPECT_EQ(p.policy.reshard_after_forward, row.reshard_after_forward);
    EXPECT_EQ(p.policy.keep_unsharded, row.keep_unsharded);
    EXPECT_EQ(p.policy.gathers_in_forward(), !row.keep_unsharded);
    EXPECT_EQ(p.policy.gathers_in_backward(), row.reshard_after_forward);
    EXPECT_EQ(p.shards_model_state(), row.shard > 1);
  }
}

TEST(ResolveShardingTest, HybridWithoutShardGroupSizeShardsWithinANode) {
  const ShardingPlan p = Resolve(ShardingStrategy::kHybridShard, 0, 4, 2);
  EXPECT_EQ(p.shard_size(), 2);
  EXPECT_EQ(p.replicate_size(), 2);
  EXPECT_EQ(p.ShardGroupRanks(3), (std::vector<int>{2, 3}));
  EXPECT_EQ(p.ReplicateGroupRanks(3), (std::vector<int>{1, 3}));
  EXPECT_EQ(p.ShardGroupRanks(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(p.ReplicateGroupRanks(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(p.ToString(), "HYBRID_SHARD on DeviceMesh(replicate=2, shard=2), reshard after forward");
}

TEST(ResolveShardingTest, HybridWithoutANodeSizeShardsOverTheWorld) {
  EXPECT_EQ(Resolve(ShardingStrategy::kHybridShard, 0, 4, 0).shard_size(), 4);
  // A world inside one node (a node larger than the world) is one shard group.
  EXPECT_EQ(Resolve(ShardingStrategy::kHybridShard, 0, 4, 8).shard_size(), 4);
}

TEST(ResolveShardingTest, ShardGroupSizeWinsOverTheNodeAndAppliesToHybridsOnly) {
  EXPECT_EQ(Resolve(ShardingStrategy::kHybridShardGradOp, 4, 8, 2).shard_size(), 4);
  EXPECT_EQ(Resolve(ShardingStrategy::kFullShard, 2, 8, 2).shard_size(), 8);
  EXPECT_EQ(Resolve(ShardingStrategy::kNoShard, 2, 8, 2).shard_size(), 1);
  // A node size that cannot tile the world matters only where it is used.
  EXPECT_EQ(Resolve(ShardingStrategy::kFullShard, 0, 4, 3).shard_size(), 4);
  EXPECT_EQ(Resolve(ShardingStrategy::kHybridShard, 2, 4, 3).shard_size(), 2);
}

void ExpectInvalid(ShardingStrategy s, int shard_group_size, int world, int ranks_per_node,
                   const std::string& fragment) {
  Status st = ResolveSharding(s, shard_group_size, world, ranks_per_node).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find(fragment), std::string::npos) << st;
}

TEST(ResolveShardingTest, RefusesWhatCannotFormGroups) {
  ExpectInvalid(ShardingStrategy::kHybridShard, 3, 4, 0, "shard_group_size 3 does not divide the world size 4");
  ExpectInvalid(ShardingStrategy::kFullShard, 3, 4, 0, "shard_group_size 3 does not divide");
  ExpectInvalid(ShardingStrategy::kHybridShard, -1, 4, 0, "shard_group_size must be >= 0");
  ExpectInvalid(ShardingStrategy::kHybridShard, 0, 6, 4, "4 ranks per node do not divide the world size 6");
  ExpectInvalid(ShardingStrategy::kFullShard, 0, 4, -1, "ranks per node must be >= 0");
  ExpectInvalid(static_cast<ShardingStrategy>(77), 0, 4, 0, "unknown sharding strategy value 77");
  // The C ABI's 0 ("default") is resolved when it translates options; the
  // runtime has no default value to resolve again.
  ExpectInvalid(static_cast<ShardingStrategy>(0), 0, 4, 0, "unknown sharding strategy value 0");
  ExpectInvalid(ShardingStrategy::kFullShard, 0, 0, 0, "world size must be >= 1");
}

TEST(ResolveShardingTest, StrategyNamesRoundTrip) {
  for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                             ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard,
                             ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardGradOp}) {
    StatusOr<ShardingStrategy> parsed = ParseShardingStrategy(ShardingStrategyName(s));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(*ParseShardingStrategy("hybrid_shard"), ShardingStrategy::kHybridShard);
  EXPECT_FALSE(ParseShardingStrategy("ZERO_4").ok());
  EXPECT_TRUE(IsHybrid(ShardingStrategy::kHybridShardGradOp));
  EXPECT_FALSE(IsHybrid(ShardingStrategy::kNoShard));
}

}  // namespace
}  // namespace sk
