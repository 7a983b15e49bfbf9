// The peak device memory a Trainer of these options would need per rank,
// without building one: TrainerOptions mapped onto the estimator's request
// (runtime/fsdp/memory_estimator.h), as the Trainer itself would resolve
// them. What sk_estimate_memory answers.
#ifndef SHARDKIT_RUNTIME_TRAIN_MEMORY_ESTIMATE_H_
#define SHARDKIT_RUNTIME_TRAIN_MEMORY_ESTIMATE_H_

#include "runtime/core/status.h"
#include "runtime/fsdp/memory_estimator.h"
#include "runtime/train/trainer.h"

namespace sk {

// The estimate for one rank of `world_size` ranks training with `options`.
// A hybrid strategy's node size is options.fsdp.ranks_per_node, or when 0
// the node size the trainers of this process would shard within
// (RanksPerNode(options.device): a sim device's simulated GPUs per node,
// else LocalWorldSizeFromEnvironment). InvalidArgument for invalid options
// (ValidateTrainerOptions) or sizes (EstimatePeakMemory). Thread-safe.
StatusOr<MemoryEstimate> EstimateTrainerMemory(const TrainerOptions& options, int world_size);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_MEMORY_ESTIMATE_H_
