// Pieces shared by sharded checkpoints and full state dicts (private to the
// checkpoint library): tensor and file naming, state validation, and applying
// loaded shards to the live model.
#ifndef SHARDKIT_RUNTIME_FSDP_CHECKPOINT_INTERNAL_H_
#define SHARDKIT_RUNTIME_FSDP_CHECKPOINT_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/fsdp/checkpoint.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/optim/optimizer.h"

namespace sk::checkpoint_internal {

// Tensor names inside rank files: "units.<u>.master", "units.<u>.optim.<state>".
std::string MasterName(int unit);
std::string OptimName(int unit, const std::string& state);
// "SGD", "ADAM", "ADAMW" (kDefault is AdamW).
const char* OptimizerKindName(OptimizerKind k);
// "{a, b}".
std::string JoinNames(const std::vector<std::string>& names);
std::string StripTrailingSlashes(std::string p);

// InvalidArgument (prefixed with `call`) if `state` is incomplete or its
// units do not match the model's.
Status ValidateState(const TrainingState& state, const char* call);

// True on the ranks that write files: replica 0 of each shard group.
bool IsWriter(FullyShardedModel& f);

// Everything a load brings in, in this rank's new shard space, before it
// touches the live model.
struct LoadedShards {
  std::vector<std::vector<float>> master;  // [unit][shard elem]
  bool has_optimizer = false;
  std::vector<std::vector<std::vector<float>>> optim;  // [unit][state][shard elem]
  std::vector<int64_t> optimizer_step;                 // [unit]
  int64_t step = 0;
};

// Applies loaded shards to the live model and optimizer. Sizes were checked
// while reading, so only a collective (persistent strategies re-gather) or an
// allocation can fail here.
Status Commit(const TrainingState& state, LoadedShards& loaded);

}  // namespace sk::checkpoint_internal

#endif  // SHARDKIT_RUNTIME_FSDP_CHECKPOINT_INTERNAL_H_
