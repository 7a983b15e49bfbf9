// The paper's experiments (docs/benchmarks.md), each a sweep of RunConfig
// measurements that fills one table:
//
//   ddp_vs_fsdp   models x {DDP, NO_SHARD, SHARD_OPTIM, SHARD_GRAD_OP,
//                 FULL_SHARD, HYBRID_SHARD} x {f32, bf16}, under a per-rank
//                 memory cap (the paper's 80 GB device) that DDP exceeds on
//                 the larger models; DDP and FULL_SHARD in f32 compared
//                 (repeated, alternating), the rest one run each.
//   prefetch      FULL_SHARD with no prefetch, BACKWARD_POST, BACKWARD_PRE and
//                 BACKWARD_PRE + forward prefetch, behind a network model whose
//                 bandwidth is calibrated to a chosen communication/compute
//                 ratio (one Chrome trace per mode); then the null control:
//                 none vs BACKWARD_PRE with no network model (rows with
//                 network_model "off").
//   rate_limiter  all_gather_limit 0 (off), 1, 2, 4 across models, plus one
//                 model under a cap just above its limited peak, where the
//                 unlimited run is pushed into allocator retries.
//   hybrid        FULL_SHARD, HYBRID_SHARD (2 x 2 mesh) and NO_SHARD at world 4
//                 on two "hosts" joined by a slow link (host_network.h).
//
// Compared variants run alternately (see comparison_steps); their rows carry
// reps, steps and rep_ms (each repetition's median step time, ms, in round
// order, ";"-separated) and step_ms / step_ms_min / step_ms_max are the
// median, min and max of those repetition medians. Rows run once carry
// reps 1 and step_ms_min/max over their steps.
//
// Every experiment takes its knobs from ExperimentOptions (the harness flags)
// and reports progress; it never fails as a whole: a configuration that
// fails is a row with its status.
#ifndef SHARDKIT_BENCHMARKS_PAPER_EXPERIMENTS_H_
#define SHARDKIT_BENCHMARKS_PAPER_EXPERIMENTS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/paper/report.h"
#include "runtime/comm/network_model.h"
#include "runtime/fsdp/rate_limiter.h"

namespace sk::bench {

struct ExperimentOptions {
  bool quick = false;
  int world = 4;
  int warmup_steps = 1;
  int steps = 3;
  std::string out_dir;  // traces are written here
  // ddp_vs_fsdp
  std::vector<std::string> models;      // empty: the experiment's default list
  std::vector<std::string> strategies;  // DDP or FSDP strategy names
  std::vector<std::string> dtypes;      // f32, bf16
  int64_t memory_cap_mib = 0;
  int64_t seq_len = 0;  // decoder (and encoder) tokens per sequence
  int64_t batch_size = 1;
  // prefetch: modelled all-gather time of one pass / measured step time.
  double comm_ratio = 0.22;
  // Timed comparisons (DDP vs FULL_SHARD in f32, the prefetch modes and
  // their null control, the limiter's limits, the hybrid strategies): their
  // effects are 5-20%, the size of one step's noise on a shared machine, so
  // each variant runs `reps` times with `comparison_steps` timed steps,
  // alternating the variants (verdict.h: AlternatingOrder), and the claims
  // are judged on the spread of the repetitions.
  int comparison_steps = 5;
  int reps = 3;
  std::string prefetch_model;
  // rate_limiter
  std::vector<RateLimit> limits;
  std::vector<std::string> limiter_models;
  std::string near_cap_model;
  double near_cap_headroom = 1.05;
  // hybrid: modelled cross-host time of FULL_SHARD / its step time.
  double inter_host_ratio = 1.0;
  std::string hybrid_model;
  comm::LinkModel intra_host_link;
};

// The defaults of each mode (quick or full), before flags override them.
ExperimentOptions DefaultExperimentOptions(bool quick);

class Progress;

// One configuration of an experiment: `run` measures it and appends its row
// (or, for a calibration, records what later configurations use).
struct Config {
  std::string label;
  double weight = 1;  // expected cost, for the remaining-time estimate
  std::function<void(Progress&)> run;
};

struct Experiment {
  std::string name;  // "ddp_vs_fsdp", ...: also the table's file name
  std::shared_ptr<Table> table;
  std::vector<Config> configs;
  // What is scaled and which network model was used, for the console and README.
  std::shared_ptr<std::vector<std::string>> notes;
};

Experiment PlanDdpVsFsdp(const ExperimentOptions& o);
Experiment PlanPrefetch(const ExperimentOptions& o);
Experiment PlanRateLimiter(const ExperimentOptions& o);
Experiment PlanHybrid(const ExperimentOptions& o);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_EXPERIMENTS_H_
