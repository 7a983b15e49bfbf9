// The index of a sharded checkpoint (<dir>/index.json): its format, parsing
// and validation. Reading an index needs no model, so tools can inspect a
// checkpoint alone.
//
// index.json: {"format": "shardkit.sharded_checkpoint", "format_version": 1,
//   "checkpoint_id", "model", "world_size", "shard_group_size", "strategy",
//   "step", "optimizer": null | {"kind", "state_names": [...], "lr", ...},
//   "units": [{"name", "unpadded_numel", "padded_numel", "shard_numel",
//              "optimizer_step", "params": [{"name", "shape", "offset", "numel"}]}],
//   "files": [{"name", "shard_rank", "bytes", "header_crc32"}],
//   "data": {"samples_consumed", "epoch", "seed", "samples_per_epoch",
//            "global_batch"} (only when the trainer read a dataset),
//   "index_crc32"}
// "index_crc32" is the CRC-32 of the compact JSON without that key, so a
// flipped digit in a step or a size is DataLoss rather than a silent change.
//
// Thread safety: all functions are pure (or read one file) and may be called
// from any thread.
#ifndef SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_INDEX_H_
#define SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/shape.h"
#include "runtime/core/status.h"
#include "runtime/optim/optimizer.h"

namespace sk {

inline constexpr int kCheckpointFormatVersion = 1;
// The index's file name inside a checkpoint directory.
inline constexpr char kCheckpointIndexName[] = "index.json";

// A parsed and self-consistent index.json.
struct CheckpointIndex {
  struct Param {
    std::string name;
    Shape shape;
    int64_t offset = 0;
    int64_t numel = 0;
  };
  struct Unit {
    std::string name;
    int64_t unpadded_numel = 0;
    int64_t padded_numel = 0;
    int64_t shard_numel = 0;
    int64_t optimizer_step = 0;  // 0: no optimizer state saved for this unit
    std::vector<Param> params;
  };
  struct File {
    std::string name;  // "rank-00003.safetensors", relative to the directory
    int shard_rank = 0;
    int64_t bytes = 0;
    // CRC-32 of the file's safetensors header (length prefix and JSON), which
    // holds every tensor's CRC-32, its shard rank and the checkpoint id: binds
    // the file's whole content to the index. -1 in indexes written before it
    // was recorded (then only size, id and shard rank are checked).
    int64_t header_crc32 = -1;
  };
  int format_version = kCheckpointFormatVersion;
  std::string checkpoint_id;
  std::string model;
  int world_size = 0;
  int shard_group_size = 0;
  std::string strategy;
  int64_t step = 0;
  bool has_optimizer = false;
  std::string optimizer_kind;  // "SGD", "ADAM", "ADAMW"
  std::vector<std::string> optimizer_state_names;
  std::vector<Unit> units;
  std::vector<File> files;
  // Where a trainer that reads a dataset stands in it (docs/data.md,
  // "Resuming"): the global samples consumed, the order's seed, the samples
  // per epoch and the global batch (samples a step takes) it ran with. The
  // epoch written beside them is samples_consumed / samples_per_epoch, for
  // readers. The seed is a decimal string (JSON integers stop at 2^63).
  struct DataPosition {
    int64_t samples_consumed = 0;
    uint64_t seed = 0;
    int64_t samples_per_epoch = 0;
    int64_t global_batch = 0;
  };
  std::optional<DataPosition> data;
};

// Reads and validates `dir`/index.json alone (no model needed). NotFound if
// absent, DataLoss if malformed, inconsistent or nested deeper than our
// format ever is, ResourceExhausted if larger than 256 MiB (a path pointing
// at an endless file such as /dev/zero is read no further than that).
StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& dir);


// Parses and validates the text of an index read from `path` (used only in
// errors). DataLoss naming the field if malformed or inconsistent.
StatusOr<CheckpointIndex> ParseCheckpointIndex(const std::string& path, const std::string& text);

// The text of index.json for `ix` (its checksum included). `opt`, if set,
// records the optimizer's hyperparameters for people reading the file; they
// are not read back.
std::string SerializeCheckpointIndex(const CheckpointIndex& ix, const OptimizerOptions* opt);

// "rank-00003.safetensors": the file name of shard rank `shard_rank`.
std::string CheckpointRankFileName(int shard_rank);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CHECKPOINT_CHECKPOINT_INDEX_H_
