// Learning-rate schedules: the learning rate of each optimizer step as a
// function of the step's index, the rule a trainer applies before every
// optimizer step (TrainerOptions::lr_schedule).
//
//   constant          lr(s) = base
//   warmup            lr(s) = base * (s + 1) / warmup_steps   for s < warmup_steps
//   then cosine       lr(s) = floor + (base - floor) * (1 + cos(pi * p)) / 2
//   or linear         lr(s) = base + (floor - base) * p
//   with p = min(1, (s - warmup_steps) / decay_steps): after decay_steps the
//   rate stays at the floor.
//
// `s` counts optimizer steps from 0 (the first step is step 0), so a resumed
// run (checkpoints restore the step count) continues the same curve.
// Warmup starts at base / warmup_steps rather than 0, as the common linear
// warmup does, so no step is wasted at lr 0.
#ifndef SHARDKIT_RUNTIME_OPTIM_LR_SCHEDULE_H_
#define SHARDKIT_RUNTIME_OPTIM_LR_SCHEDULE_H_

#include <cstdint>

#include "runtime/core/status.h"

namespace sk {

// Values are part of the C ABI (sk_lr_schedule_kind_t): never renumbered.
enum class LrScheduleKind : int {
  kConstant = 1,
  kCosine = 2,  // warmup, then cosine decay to the floor
  kLinear = 3,  // warmup, then linear decay to the floor
};

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  // Steps of linear warmup (any kind, constant included); 0 = none.
  int64_t warmup_steps = 0;
  // Steps of decay after the warmup (cosine, linear): must be >= 1 there.
  int64_t decay_steps = 0;
  // The rate the decay ends at, as an absolute learning rate in [0, base].
  float min_lr = 0;
};

// InvalidArgument naming the field: an unknown kind, negative warmup,
// decay_steps < 1 for a decaying kind, a min_lr that is negative, not finite
// or above `base_lr`.
Status ValidateLrSchedule(const LrSchedule& schedule, float base_lr);

// The learning rate of step `step` (0-based) under `schedule` with base rate
// `base_lr`. Defined for every step >= 0; a negative step is treated as 0.
float LrAt(const LrSchedule& schedule, float base_lr, int64_t step);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPTIM_LR_SCHEDULE_H_
