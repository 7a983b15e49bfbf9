#include "benchmarks/paper/progress.h"

#include <chrono>
#include <cmath>

namespace sk::bench {

std::string FormatDuration(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%lds", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  }
  return buf;
}

double EstimateRemaining(double elapsed, double done_weight, double total_weight) {
  if (done_weight <= 0) return -1;
  double left = total_weight - done_weight;
  return left <= 0 ? 0 : elapsed / done_weight * left;
}

Progress::Progress(std::string harness, std::vector<double> weights, std::FILE* out, Clock clock)
    : harness_(std::move(harness)), weights_(std::move(weights)), out_(out ? out : stderr),
      clock_(clock ? std::move(clock) : Clock([] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
      })) {
  start_ = clock_();
}

double Progress::Elapsed() const { return clock_() - start_; }

double Progress::DoneWeight() const {
  double w = finished_weight_;
  if (current_ >= 0 && current_ < total()) w += weights_[current_] * step_fraction_;
  return w;
}

double Progress::Remaining() const {
  double total_weight = 0;
  for (double w : weights_) total_weight += w;
  return EstimateRemaining(Elapsed(), DoneWeight(), total_weight);
}

void Progress::Print(const std::string& text) {
  last_line_ = "[" + harness_ + "] " + text + "  (elapsed " + FormatDuration(Elapsed()) +
               ", remaining ~" + FormatDuration(Remaining()) + ")";
  std::fprintf(out_, "%s\n", last_line_.c_str());
  std::fflush(out_);
}

void Progress::BeginConfig(int index, const std::string& label) {
  current_ = index;
  step_fraction_ = 0;
  label_ = label;
  Print("configuration " + std::to_string(index + 1) + " of " + std::to_string(total()) + ": " +
        label);
}

void Progress::StepDone(int step, int steps) {
  step_fraction_ = steps > 0 ? static_cast<double>(step) / steps : 1;
  if (step_fraction_ > 1) step_fraction_ = 1;
  Print("  " + label_ + ": step " + std::to_string(step) + " of " + std::to_string(steps));
}

void Progress::EndConfig(const std::string& outcome) {
  if (current_ >= 0 && current_ < total()) finished_weight_ += weights_[current_];
  ++finished_;
  step_fraction_ = 0;
  const int index = current_;
  current_ = -1;
  Print("  configuration " + std::to_string(index + 1) + " of " + std::to_string(total()) +
        " done: " + outcome);
}

}  // namespace sk::bench
