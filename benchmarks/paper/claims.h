// The claims table: each of the paper's claims (docs/benchmarks.md) beside
// what our harnesses measured, with a verdict.
//
// Columns: claim, evidence, can_differ ("yes" where the measurement decides
// the verdict; "no: why" or "partly: why" where the harness's setup decides
// it, or part of it), paper, ours, rel_error (ours against the paper's
// number where it gives one, else "-" and why), verdict, judged_by (the rule,
// so a reader can disagree with the rule, not just the result).
//
// Verdicts:
//   agrees        same direction and a size within the stated band;
//   partly        same direction, size outside the band (or only part holds);
//   disagrees     opposite direction, or no effect where the paper has one;
//   inconclusive  a timed comparison whose spread straddles a band edge:
//                 the effect is within this machine's noise (verdict.h);
//   not run       the harness that measures it did not run (or every
//                 configuration it needs failed).
// Timed comparisons are judged on the per-round ratios of alternating
// repetitions (the rows' rep_ms; experiments.h), two-sided, and need >= 3
// rounds. Memory, OOM, retries and traffic are counts and judged as such.
// The null control (prefetch_null_control): BACKWARD_PRE vs none with no
// network model must show no gain.
// Each row's "evidence" says what it rests on: measured (with its
// repetitions), or by construction where the harness's setup (a chosen cap, a
// calibrated link) guarantees the direction. The paper-scale claims (GPT-175B
// TFLOPS, scaling to 512 GPUs) are rows of the simulated table
// (benchmarks/paper/sim_claims.h).
//
// Pure functions of the tables, so tests can feed rows directly.
#ifndef SHARDKIT_BENCHMARKS_PAPER_CLAIMS_H_
#define SHARDKIT_BENCHMARKS_PAPER_CLAIMS_H_

#include <map>
#include <string>
#include <vector>

#include "benchmarks/paper/report.h"

namespace sk::bench {

// `tables` by name ("ddp_vs_fsdp", "prefetch", "rate_limiter", "hybrid");
// missing ones give "not run" rows. World size comes from the hybrid
// formulas' W (4 in our harnesses).
Table EvaluateClaims(const std::map<std::string, const Table*>& tables, int world);

// One line of the README's results block for `rows` (claims rows, simulated
// or measured): the claims grouped by verdict in the order agrees, partly,
// disagrees, inconclusive, not run, not modelled, as
// "**agrees** 2 (`a`, `b` (by construction)); **partly** 1 (`c`)", each
// claim whose verdict the setup decides marked from its can_differ column
// ("no..." -> "(by construction)", "partly..." -> "(partly by
// construction)"). "none" when `rows` is empty.
std::string VerdictSummary(const std::vector<const Row*>& rows);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_CLAIMS_H_
