// Pieces shared by sharded checkpoints and full state dicts (private to the
// checkpoint library): tensor and file naming, state validation, and applying
// loaded shards to the live model.
#ifndef SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_INTERNAL_H_
#define SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/optim/optimizer.h"

namespace sk::checkpoint_internal {

// Tensor names inside rank files: "units.<u>.master", "units.<u>.optim.<state>".
std::string MasterName(int unit);
std::string OptimName(int unit, const std::string& state);
// "{a, b}".
std::string JoinNames(const std::vector<std::string>& names);
std::string StripTrailingSlashes(std::string p);

// InvalidArgument (prefixed with `call`) if `state` is incomplete or its
// units do not match the model's.
Status ValidateState(const TrainingState& state, const char* call);

// True on the ranks that write files: replica 0 of each shard group.
bool IsWriter(FullyShardedModel& f);

// Host staging. Checkpoint files are host bytes: every value a checkpoint
// reads or writes passes through host tensors. Copies between them and the
// master shards / optimizer state use the shards' op context
// (FullyShardedModel::shard_context: the host's with cpu_offload);
// copies and casts between file bytes and staging use ops::HostContext().

// The elements [offset, offset + n) of a tensor, flattened (a view).
StatusOr<Tensor> Slice(const Tensor& t, int64_t offset, int64_t n);
// A zeroed host f32 tensor of n elements.
StatusOr<Tensor> HostZeros(int64_t n);
// Copies `src` (a master shard or optimizer state: the model's device, or
// the host with cpu_offload) into `dst` (host) with the shards' op context
// and waits for the copy.
Status CopyToHost(const FullyShardedModel& f, const Tensor& src, const Tensor& dst);
// A host copy of `src` (the model's device or the host).
StatusOr<Tensor> ToHost(const FullyShardedModel& f, const Tensor& src);

// Everything a load brings in, in this rank's new shard space, before it
// touches the live model.
struct LoadedShards {
  std::vector<Tensor> master;  // [unit]: host f32[shard]
  bool has_optimizer = false;
  std::vector<std::vector<Tensor>> optim;  // [unit][state]: host f32[shard]
  std::vector<int64_t> optimizer_step;                 // [unit]
  int64_t step = 0;
};

// Applies loaded shards to the live model and optimizer. Sizes were checked
// while reading, so only a collective (persistent strategies re-gather) or an
// allocation can fail here.
Status Commit(const TrainingState& state, LoadedShards& loaded);

}  // namespace sk::checkpoint_internal

#endif  // SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_INTERNAL_H_
