// EstimateTrainerMemory: TrainerOptions onto the estimator's request, as
// sk_estimate_memory answers it.
#include "runtime/train/memory_estimate.h"

#include <gtest/gtest.h>

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

TEST(MemoryEstimateTest, InvalidOptionsAndSizesAreInvalidArgument) {
  TrainerOptions o = Options();
  o.batch_size = 0;
  EXPECT_EQ(EstimateTrainerMemory(o, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EstimateTrainerMemory(Options(), 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk
