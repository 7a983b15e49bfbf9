// EstimateTrainerMemory: TrainerOptions onto the estimator's request, as
// sk_estimate_memory answers it.
#include "runtime/train/memory_estimate.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/nn/configs.h"

namespace sk {
namespace {

TrainerOptions Options() {
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 3;
  o.seq_len = 16;
  o.checkpointing = ActivationCheckpointing::kFull;
  o.fsdp.strategy = ShardingStrategy::kShardGradOp;
  o.fsdp.ranks_per_node = 2;
  o.optimizer.kind = OptimizerKind::kAdamW;
  return o;
}

// Every field the estimate depends on is carried over from the options.
TEST(MemoryEstimateTest, MapsTheTrainerOptionsOntoTheEstimatorsRequest) {
  const TrainerOptions o = Options();
  MemoryEstimateRequest r;
  r.model = *FindModelConfig(o.model);
  r.fsdp = o.fsdp;
  r.optimizer = o.optimizer;
  r.world_size = 4;
  r.batch_size = o.batch_size;
  r.seq_len = o.seq_len;
  r.checkpointing = o.checkpointing;
  StatusOr<MemoryEstimate> want = EstimatePeakMemory(r);
  ASSERT_TRUE(want.ok()) << want.status();
  StatusOr<MemoryEstimate> got = EstimateTrainerMemory(o, 4);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->ToString(), want->ToString());
  EXPECT_EQ(got->peak_bytes, want->peak_bytes);

  TrainerOptions ddp = o;
  ddp.parallelism = Parallelism::kDdp;
  r.ddp = true;
  StatusOr<MemoryEstimate> want_ddp = EstimatePeakMemory(r);
  StatusOr<MemoryEstimate> got_ddp = EstimateTrainerMemory(ddp, 4);
  ASSERT_TRUE(got_ddp.ok()) << got_ddp.status();
  EXPECT_EQ(got_ddp->peak_bytes, want_ddp->peak_bytes);
  EXPECT_NE(got_ddp->peak_bytes, got->peak_bytes);
}

// A hybrid strategy without a node size shards within the node the Trainer
// would: on a sim device the simulated GPUs per node (a100-80g: 8; or
// sim_gpus_per_node), not LOCAL_WORLD_SIZE. The estimate used to take
// LOCAL_WORLD_SIZE there (unset: one node), so it priced 16-way shards of a
// run that a sim Trainer shards 8 ways (and 4 ways with sim_gpus_per_node
// 4).
TEST(MemoryEstimateTest, AHybridStrategyOnASimDeviceShardsWithinTheSimulatedNode) {
  ASSERT_EQ(unsetenv("LOCAL_WORLD_SIZE"), 0);
  TrainerOptions o = Options();
  o.fsdp.strategy = ShardingStrategy::kHybridShard;
  o.fsdp.ranks_per_node = 0;
  o.device.kind = DeviceKind::kSim;
  o.device.sim_profile = "a100-80g";
  o.device.sim_world_size = 16;
  for (int per_node : {0, 4}) {
    SCOPED_TRACE("sim_gpus_per_node " + std::to_string(per_node));
    o.device.sim_gpus_per_node = per_node;
    MemoryEstimateRequest r;
    r.model = *FindModelConfig(o.model);
    r.fsdp = o.fsdp;
    r.fsdp.ranks_per_node = per_node > 0 ? per_node : 8;
    r.optimizer = o.optimizer;
    r.world_size = 16;
    r.batch_size = o.batch_size;
    r.seq_len = o.seq_len;
    r.checkpointing = o.checkpointing;
    r.device = DeviceKind::kSim;
    StatusOr<MemoryEstimate> want = EstimatePeakMemory(r);
    ASSERT_TRUE(want.ok()) << want.status();
    StatusOr<MemoryEstimate> got = EstimateTrainerMemory(o, 16);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->ToString(), want->ToString());

    // One node of 16 (what the estimate used to assume) is a different answer.
    r.fsdp.ranks_per_node = 16;
    StatusOr<MemoryEstimate> one_node = EstimatePeakMemory(r);
    ASSERT_TRUE(one_node.ok()) << one_node.status();
    EXPECT_NE(got->peak_bytes, one_node->peak_bytes);
  }
  o.device.sim_profile = "no-such-profile";
  EXPECT_FALSE(EstimateTrainerMemory(o, 16).ok());
}

TEST(MemoryEstimateTest, InvalidOptionsAndSizesAreInvalidArgument) {
  TrainerOptions o = Options();
  o.batch_size = 0;
  EXPECT_EQ(EstimateTrainerMemory(o, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EstimateTrainerMemory(Options(), 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk
