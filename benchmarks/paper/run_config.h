// RunConfig: one measured configuration of a paper harness. `world` local
// ranks run as threads of this process, each driving its own Trainer (its
// own capped caching allocator, as a GPU would have), optionally behind a
// network model. Warm-up steps (caches, optimizer state) are not timed; each
// timed step's time is the slowest rank's, as a synchronous data-parallel
// step is.
//
// Thread safety: one RunConfig at a time (ranks are threads, the trace
// recorder is process-wide).
#ifndef SHARDKIT_BENCHMARKS_PAPER_RUN_CONFIG_H_
#define SHARDKIT_BENCHMARKS_PAPER_RUN_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "benchmarks/paper/progress.h"
#include "runtime/comm/network_model.h"
#include "runtime/train/trainer.h"

namespace sk::bench {

struct RunSpec {
  TrainerOptions trainer;
  int world = 4;
  int warmup_steps = 1;
  int steps = 3;
  // Every group behind this link model (empty: the raw local backend).
  std::optional<comm::LinkModel> link;
  // Two-level model (host_network.h): with ranks_per_host > 0, groups within
  // a host use `link` (required) and groups across hosts `inter_host_link`.
  int ranks_per_host = 0;
  comm::LinkModel inter_host_link;
  // When set, one more (untimed) step is traced into this Chrome trace file.
  std::string trace_path;
};

struct RunResult {
  bool ok = false;
  bool oom = false;           // a rank hit its memory cap (ResourceExhausted)
  std::string error;          // first failing rank's status when !ok
  std::string network;        // ProcessGroup::label() of the world group
  int64_t parameters = 0;
  std::vector<double> step_seconds;  // slowest rank per timed step
  double median_seconds = 0, min_seconds = 0, max_seconds = 0;
  double model_tflops_per_rank = 0;  // model FLOPs per rank per step / median step time
  double tokens_per_second = 0;      // all ranks
  int64_t peak_allocated_bytes = 0;  // max over ranks and timed steps
  int64_t peak_reserved_bytes = 0;
  // Max over ranks, whole run (creation and warm-up included; a rank whose
  // creation failed counts with its allocator's statistics at the failure).
  int64_t alloc_retries = 0;
  int64_t ooms = 0;
  int64_t bytes_per_step = 0;        // rank 0, nccl-tests bytes
  // FSDP counters of rank 0 per timed step (zero under DDP).
  int64_t replica_bytes_per_step = 0;
  int64_t prefetches_per_step = 0;
  int64_t prefetches_deferred_per_step = 0;
  int max_unsharded_alive = 0;
  // Rank 0's bytes over groups that span hosts per timed step (two-level model only).
  int64_t cross_host_bytes_per_step = 0;
};

// Runs `spec`, reporting each step to `progress` when not null. Never fails:
// errors (OOM included) come back in the result.
RunResult RunConfig(const RunSpec& spec, Progress* progress);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_RUN_CONFIG_H_
