// The paper-scale rows of the claims table: the paper's own model sizes
// (T5-611M, T5-2.28B, T5-11B, GPT-175B) on a simulated cluster of A100-80G
// (the real Trainer, FSDP/DDP and CachingAllocator on the sim device through
// SimulateTraining; runtime/train/sim_run.h), each with the paper's figure
// beside ours, the relative error and a verdict.
//
// Columns: claim, evidence ("simulated (<profile>)", or "not modelled" where
// the model does not exist here), paper (the paper's value, as
// each row states it), ours, rel_error
// ((ours - paper) / paper where the paper gives a number; "-" otherwise),
// verdict (agrees / partly / disagrees / not modelled) and judged_by (the
// rule). Verdicts are never inconclusive here: simulated figures are exact.
//
// Deterministic: two calls with the same profile give byte-identical tables
// (virtual time; the sim device's clocks are reset per run). Not
// thread-safe: uses the sim device sim:0 and the process-wide trainer state
// for the duration of the call. Takes a few seconds on one core.
#ifndef SHARDKIT_BENCHMARKS_PAPER_SIM_CLAIMS_H_
#define SHARDKIT_BENCHMARKS_PAPER_SIM_CLAIMS_H_

#include <string>

#include "benchmarks/paper/report.h"
#include "runtime/core/status.h"

namespace sk::bench {

// The simulated claims on `profile` ("a100-80g"). An error only when a
// simulation itself fails (a profile that does not load, say); simulated out
// of memory is a result and shows in the rows.
//
// With `points`, it is also set to the table "claims_simulated_points": the
// numbers behind the rows for plot.py, one row per plotted value with columns
// figure (parity, prefetch, limiter, limiter_memory, gpt175b_scaling,
// t5_11b_scaling, hybrid, hybrid_memory, hybrid_traffic), series, x, value and paper (the
// paper's value at that point, empty where it gives none; for the limiter on
// T5-11B its "up to 5x", on GPT-175B the midpoint of 173-186). Out-of-memory
// runs give no point. Deterministic like the rows.
StatusOr<Table> SimulatedClaims(const std::string& profile, Table* points = nullptr);

// The t5_11b_scaling row's verdict for `change`, T5-11B's TFLOPS/GPU at 512
// GPUs / at 8 - 1 (the paper: -0.07, given without error bars): "agrees" for
// a loss of 3.5%..10.5% (half to 1.5x the paper's), "partly" for any other
// loss up to 14% (twice), "disagrees" for a larger loss or no loss at all.
std::string T5ScalingVerdict(double change);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_SIM_CLAIMS_H_
