// Ranks that must be configured alike are checked at creation: one
// all-gather of each rank's options as fixed slots, compared field by field,
// so ranks created inconsistently (FSDP on one, DDP on another; a parameter
// group on one rank only) all fail at once naming the field and both values,
// instead of training silently apart or waiting out a collective's timeout.
// The Trainer (AgreeOnTrainerOptions) and the FsdpEngine use it.
#ifndef SHARDKIT_RUNTIME_TRAIN_RANK_AGREEMENT_H_
#define SHARDKIT_RUNTIME_TRAIN_RANK_AGREEMENT_H_

#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/optim/optimizer.h"

namespace sk {

// (field, exact value) for everything of FSDP's and the optimizer's options
// that shapes collectives or training: strategy, shard group, prefetch,
// dtypes, offload, seed, the optimizer's kind and hyperparameters and each
// parameter group. Timeouts and ranks_per_node may differ per rank.
std::vector<std::pair<std::string, std::string>> SharedFsdpAndOptimizerFields(const FsdpOptions& fsdp,
                                                                              const OptimizerOptions& optimizer);

// Collective over `world` (one all-gather of 64 bytes per field and rank,
// waiting at most `timeout`). Fails on every rank alike: with
// InvalidArgument naming the first field (in the given order) where a rank
// differs from rank 0, both values and the lowest such rank ("<what> options
// differ across ranks: fsdp.strategy is FULL_SHARD on rank 0 but NO_SHARD
// on rank 1"); then, when `local_validity` (this rank's own validation)
// failed, with it; then, naming the rank, when another rank's failed. A
// value of 64 bytes or more is compared by its head and a hash of the whole.
// `what` names the object in messages ("trainer", "engine").
Status AgreeOnFields(const std::vector<std::pair<std::string, std::string>>& fields, const Status& local_validity,
                     comm::ProcessGroup& world, Duration timeout, const std::string& what);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_RANK_AGREEMENT_H_
