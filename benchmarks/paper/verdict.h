// Judging measured comparisons on a noisy machine (issue 12): each compared
// configuration runs `reps` times, ALTERNATING the variants so that a drift in
// the machine's load hits every variant alike, and a claim is judged on the
// spread of the repetitions, never on one number.
//
//   AlternatingOrder   the run order: round r runs the variants forward when r
//                      is even and backward when r is odd (A B C, C B A, ...),
//                      so every variant's mean position is the same.
//   SpreadOf           median, min and max of some values (the repetition
//                      medians of one variant, or per-round ratios).
//   PairedRatios       per round, numerator / denominator: rounds pair the
//                      variants (they ran back to back), so a slow round
//                      moves both sides and leaves the ratio.
//   Judge              a spread against two-sided bands. A verdict is given
//                      only when the whole spread lies in one region:
//                        agrees      inside [agree_lo, agree_hi];
//                        partly      inside [partly_lo, partly_hi] on one
//                                    side of the agree band;
//                        disagrees   outside the partly band, on one side;
//                      and inconclusive when the spread straddles an edge
//                      (the effect is within this machine's noise of it).
//
// Pure functions; thread-safe.
#ifndef SHARDKIT_BENCHMARKS_PAPER_VERDICT_H_
#define SHARDKIT_BENCHMARKS_PAPER_VERDICT_H_

#include <string>
#include <vector>

namespace sk::bench {

// Variant indices in run order: `reps` rounds of 0..variants-1, every odd
// round reversed. Empty when either count is below 1.
std::vector<int> AlternatingOrder(int variants, int reps);

struct Spread {
  double median = 0;  // upper median for even counts (as bench::UpperMedian)
  double lo = 0;      // smallest value
  double hi = 0;      // largest value
  int n = 0;          // 0: no values (median, lo and hi are 0)
};

Spread SpreadOf(const std::vector<double>& values);

// Spread of numerator[i] / denominator[i] over the rounds both have (the
// shorter length); rounds with a non-positive denominator are skipped.
Spread PairedRatios(const std::vector<double>& numerator, const std::vector<double>& denominator);

// `s` with `offset` added to median, lo and hi (a ratio as a speedup: -1).
Spread Shifted(const Spread& s, double offset);

enum class Verdict { kAgrees, kPartly, kDisagrees, kInconclusive };

// "agrees", "partly", "disagrees", "inconclusive".
const char* VerdictName(Verdict v);

// Two-sided bands on one quantity; requires partly_lo <= agree_lo <=
// agree_hi <= partly_hi (use +-infinity for an open side).
struct Bands {
  double agree_lo, agree_hi;
  double partly_lo, partly_hi;
};

// Judges the whole spread [s.lo, s.hi] (see the file comment). A spread with
// no values is inconclusive.
Verdict Judge(const Spread& s, const Bands& bands);

// Several judged comparisons of one claim (one per model): disagrees if any
// disagrees, else inconclusive if any is, else agrees if all agree, else
// partly. Inconclusive for none.
Verdict Combine(const std::vector<Verdict>& verdicts);

// Parses "12.5;13.0;12.8" (a table's rep_ms cell) into numbers; skips empty
// and unparsable items.
std::vector<double> ParseList(const std::string& text);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_VERDICT_H_
