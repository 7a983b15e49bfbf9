#include "runtime/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace sk {

Status ValidateLrSchedule(const LrSchedule& s, float base_lr) {
  switch (s.kind) {
    case LrScheduleKind::kConstant:
    case LrScheduleKind::kCosine:
    case LrScheduleKind::kLinear: break;
    default:
      return InvalidArgumentError("lr_schedule.kind " + std::to_string(static_cast<int>(s.kind)) +
                                  " is not constant (1), cosine (2) or linear (3)");
  }
  if (s.warmup_steps < 0) {
    return InvalidArgumentError("lr_schedule.warmup_steps must be >= 0, not " +
                                std::to_string(s.warmup_steps));
  }
  if (s.kind != LrScheduleKind::kConstant && s.decay_steps < 1) {
    return InvalidArgumentError("lr_schedule.decay_steps must be >= 1 for a decaying schedule, not " +
                                std::to_string(s.decay_steps));
  }
  if (!std::isfinite(s.min_lr) || s.min_lr < 0 || s.min_lr > base_lr) {
    return InvalidArgumentError("lr_schedule.min_lr " + std::to_string(s.min_lr) +
                                " must be finite and in [0, lr = " + std::to_string(base_lr) + "]");
  }
  return OkStatus();
}

float LrAt(const LrSchedule& s, float base_lr, int64_t step) {
  step = std::max<int64_t>(step, 0);
  if (step < s.warmup_steps) {
    return static_cast<float>(static_cast<double>(base_lr) * static_cast<double>(step + 1) /
                              static_cast<double>(s.warmup_steps));
  }
  if (s.kind == LrScheduleKind::kConstant || s.decay_steps < 1) return base_lr;
  const double p = std::min(1.0, static_cast<double>(step - s.warmup_steps) /
                                     static_cast<double>(s.decay_steps));
  const double base = base_lr, floor = s.min_lr;
  if (s.kind == LrScheduleKind::kCosine) {
    return static_cast<float>(floor + (base - floor) * 0.5 * (1.0 + std::cos(M_PI * p)));
  }
  return static_cast<float>(base + (floor - base) * p);
}

}  // namespace sk
