// Checkpoints of a FullyShardedModel and its optimizer: sharded (one file per
// shard rank plus an index, loadable at any world size and strategy) and full
// state dicts (one safetensors file with every parameter under its own name).
//
// Sharded checkpoint on disk (format version 1), a directory:
//
//   <dir>/index.json               written last, by world rank 0
//   <dir>/rank-00000.safetensors   one per rank of the shard group (F files)
//   ...
//
// rank-NNNNN.safetensors holds shard rank NNNNN's f32 flat shards, for every
// unit u: "units.<u>.master" (f32[shard_numel]) and, once the optimizer has
// stepped unit u, "units.<u>.optim.<state>" for each of the optimizer's
// StateNames() ("momentum", "exp_avg", "exp_avg_sq"). Its __metadata__ carries
// the checkpoint id (also in the index, so files of two checkpoints are never
// mixed), its shard rank and the group size. Shard k of unit u holds flat
// elements [k * shard_numel, (k + 1) * shard_numel). With several replicas
// (HYBRID_*, NO_SHARD) only replica 0 writes: every replica holds the same
// shards. NO_SHARD therefore writes one file.
//
// index.json: see checkpoint_index.h.
//
// Resharding. A parameter's offset in its flat parameter does not depend on
// the group size (only the trailing padding does), and master weights and
// optimizer state both live in flat-shard space. Loading at group size F'
// therefore lets new shard rank r take flat elements [r * S', (r + 1) * S')
// from the old files that overlap them (elements past the old padding are
// zero, as padding always is). Each rank reads only the files it needs from
// the shared filesystem.
//
// Atomicity. Files are written into "<dir>.tmp" (each file itself written
// durably by WriteFileDurably, runtime/core/file_io.h), then rank 0 writes the
// index and swaps the directory into place with one renameat2(RENAME_EXCHANGE)
// (rename when <dir> did not exist) and removes the old one. A save that fails
// anywhere, on any rank, leaves the previous checkpoint as it was.
//
// Collectives and errors. Every function here is collective over the model's
// world: all ranks call it with the same arguments. Ranks agree on success
// after each phase, so an error on one rank (a missing file, a full disk)
// returns the same error on every rank (prefixed with the rank that saw it)
// instead of leaving the others waiting. Loading reads and validates
// everything into temporaries first; the live model and optimizer change only
// after every rank has succeeded. Errors: NotFound for a missing file, DataLoss
// naming the file for a corrupt, truncated or mismatched one, InvalidArgument
// naming the unit or parameter when the checkpoint is of another model or
// optimizer, Unavailable for I/O failures while saving.
//
// Data: master shards and optimizer state are staged through host tensors
// with the op layer's Copy on the model's compute stream (then synchronised),
// and file bytes are copied or widened into staging with Copy/Cast on
// ops::HostContext(), so the same code serves every device kind. The rank
// agreement's short status messages travel in host tensors of their own.
//
// Thread safety: one call per rank at a time, on the rank's model thread.
#ifndef SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_H_
#define SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/nn/model.h"
#include "runtime/optim/optimizer.h"

namespace sk {

// What a checkpoint saves and restores. `units` are the model's units, as
// given to FullyShardedModel::Create; the optimizer's slots are unit indices
// (as FullyShardedModel::OptimizerStep uses them). A null optimizer saves and
// loads parameters only (a loaded checkpoint then leaves the optimizer alone).
struct TrainingState {
  std::string model_name;  // recorded in the index; not required to match
  const std::vector<UnitSpec>* units = nullptr;
  FullyShardedModel* fsdp = nullptr;
  Optimizer* optimizer = nullptr;
  // Saved into the index when set (a trainer reading a dataset); not owned.
  const CheckpointIndex::DataPosition* data = nullptr;
};

struct CheckpointOptions {
  // Called on each writing rank after it has written its file (the path, in
  // the temporary directory) and before the checkpoint is committed. A non-OK
  // result aborts the save on every rank; the previous checkpoint stays. For
  // progress reporting, copying files elsewhere, and failure tests.
  std::function<Status(const std::string& path)> on_file_written;
  // Called on rank 0 right after the new checkpoint replaced the previous
  // one in `dir` (the directory written, after symlinks), before the ranks
  // agree that the save succeeded. A non-OK result fails the save on every
  // rank with the new checkpoint already in place, as a crash at that point
  // would (failure tests: the message must say what is on disk).
  std::function<Status(const std::string& dir)> on_committed;
};

// Writes a sharded checkpoint of `state` at training step `step` to `dir`
// (created, or replaced if it holds a checkpoint). InvalidArgument if `dir`
// exists and is not a checkpoint directory (never overwritten) or `state` is
// incomplete or does not match the model. A `dir` that is a symlink to a
// directory is written through: the checkpoint replaces the target's
// contents atomically and the link stays; a symlink to anything else, or to
// nothing, is InvalidArgument. A failed save's message says what `dir` holds
// afterwards (read from the disk): the previous checkpoint, the new one (the
// failure came after the exchange), or none. Collective.
Status SaveShardedCheckpoint(const std::string& dir, const TrainingState& state, int64_t step,
                             const CheckpointOptions& options = {});

// Restores `state` from the sharded checkpoint in `dir`, whatever world size,
// shard group size and strategy it was saved with, and returns its training
// step. On error nothing in the model or optimizer has changed (except if a
// collective or an allocation fails while committing, which is reported as
// such). Collective. `data`, if not null, receives the index's data position
// (nullopt when it has none; state.data is not read).
StatusOr<int64_t> LoadShardedCheckpoint(const std::string& dir, const TrainingState& state,
                                        std::optional<CheckpointIndex::DataPosition>* data = nullptr);

// Rotating checkpoints: sharded checkpoints saved every so many steps into
// one root directory, each in root/step_<step as 12 digits>, the newest few
// kept, and a resume from the newest complete one (checkpoint_rotation.cc
// says why a half-written one is never picked). What the Trainer's
// SaveCheckpointRotating and ResumeLatest are made of.

// root/step_<step, 12 digits, zero-padded>.
std::string RotatingCheckpointDir(const std::string& root, int64_t step);

// The complete checkpoints under `root` (named step_<digits>, with an index
// that reads), newest first; none when `root` does not exist.
// InvalidArgument when `root` is not a directory. Not collective.
StatusOr<std::vector<std::pair<int64_t, std::string>>> ListRotatingCheckpoints(const std::string& root);

// Creates `root` on world rank 0 (with its parents). Collective: an error
// anywhere is returned on every rank.
Status PrepareCheckpointRoot(const std::string& root, FullyShardedModel& f);

// Removes all but the newest `keep` (>= 1) complete checkpoints under
// `root`, each renamed to "<dir>.deleting" first, and any "<dir>.deleting"
// a process killed mid-removal left behind. Not collective: world rank
// 0 calls it once the save has returned on every rank.
Status PruneRotatingCheckpoints(const std::string& root, int keep);

// The directory of the newest complete checkpoint under `root` as world rank
// 0 sees it, on every rank; "" when there is none (or no `root`).
// Collective.
StatusOr<std::string> PickLatestCheckpoint(const std::string& root, FullyShardedModel& f);

struct FullStateDictOptions {
  // The layout of the file's names and tensors (weight_layout.h). Only the
  // shardkit layout holds optimizer state and the step; the others are
  // weights only.
  WeightLayout layout = WeightLayout::kShardkit;
};

// Gathers every parameter in full and writes one safetensors file at `path`
// (world rank 0 writes, durably: WriteFileDurably) with tensors
// "<unit>.<param>" (f32, the parameter's shape), readable by any safetensors
// tool. With an optimizer, its state is included in full as
// "optimizer.<state>.<unit>.<param>" with per-unit step counts in the
// metadata, so training resumes exactly. In another layout the weights are
// converted on rank 0 (ConvertWeights) and the optimizer is left out.
// In the hf-gpt2 and hf-llama layouts a `path` that is a directory or ends
// in '/' gets a Hugging Face model directory (hf_checkpoint.h: config.json
// for the model FindModelConfig(state.model_name) names, model.safetensors),
// which transformers' from_pretrained loads. A tied head (a unit with the
// tied parameter head.lm_head.w, GPT-2's or a tied Llama's) is stored once,
// as the embedding. InvalidArgument for an invalid layout or one that has
// no name for a parameter (hf-gpt2 and a T5 model). Collective.
Status SaveFullStateDict(const std::string& path, const TrainingState& state, int64_t step,
                         const FullStateDictOptions& options = {});

// Loads a full state dict (every rank reads the file, converts it from
// options.layout, and keeps its slices). Every model parameter must be
// present with its shape (f32, or bf16/f16, widened exactly); a tensor that
// is not a model parameter or optimizer state is InvalidArgument naming it
// (in another layout, by both names; shape mismatches name both shapes).
// Optimizer state is restored when the file has it and `state.optimizer` is
// set. In a layout other than shardkit's, a `path` that is a directory is a
// Hugging Face model directory (model.safetensors, or the sharded files and
// their index: ReadHfWeights). Returns the recorded step (0 for files from
// other tools). Collective; nothing changes on error.
StatusOr<int64_t> LoadFullStateDict(const std::string& path, const TrainingState& state,
                                    const FullStateDictOptions& options = {});

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_H_
