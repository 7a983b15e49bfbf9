// Progress lines for long harness runs: "configuration i of n", "step j of
// m", elapsed and remaining time.
//
// The remaining time is estimated from the work done so far, weighted: each
// configuration has a weight (its expected cost in arbitrary units; the
// harnesses use parameters x steps), and
//   remaining = elapsed / done_weight * (total_weight - done_weight)
// where done_weight counts finished configurations plus the finished fraction
// of the current one's steps. Before any work is done it is unknown ("?").
//
// The clock is injected so tests can drive it. Thread safety: none.
#ifndef SHARDKIT_BENCHMARKS_PAPER_PROGRESS_H_
#define SHARDKIT_BENCHMARKS_PAPER_PROGRESS_H_

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace sk::bench {

// "42s", "3m05s", "1h02m"; "?" for a negative value (unknown).
std::string FormatDuration(double seconds);

// Seconds remaining, or -1 when nothing is done yet.
double EstimateRemaining(double elapsed, double done_weight, double total_weight);

class Progress {
 public:
  using Clock = std::function<double()>;  // seconds on a monotonic clock

  // `weights`: one per configuration, in run order. Lines go to `out`
  // (stderr when null) prefixed by "[harness]".
  Progress(std::string harness, std::vector<double> weights, std::FILE* out = nullptr,
           Clock clock = nullptr);

  // Starts configuration `index` (0-based) named `label`; prints a line.
  void BeginConfig(int index, const std::string& label);
  // Step `step` (1-based) of `steps` of the current configuration is done.
  void StepDone(int step, int steps);
  // The current configuration is finished (also when it failed).
  void EndConfig(const std::string& outcome);

  int total() const { return static_cast<int>(weights_.size()); }
  double Elapsed() const;
  double Remaining() const;
  // The last line printed (for tests).
  const std::string& last_line() const { return last_line_; }

 private:
  void Print(const std::string& text);
  double DoneWeight() const;

  std::string harness_;
  std::vector<double> weights_;
  std::FILE* out_;
  Clock clock_;
  double start_ = 0;
  int current_ = -1;
  int finished_ = 0;
  double finished_weight_ = 0;
  double step_fraction_ = 0;
  std::string label_;
  std::string last_line_;
};

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_PROGRESS_H_
