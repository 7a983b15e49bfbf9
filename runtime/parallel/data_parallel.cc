#include "runtime/parallel/data_parallel.h"

namespace sk {

const char* UnitStateName(UnitState s) {
  switch (s) {
    case UnitState::kIdle: return "idle";
    case UnitState::kForward: return "forward";
    case UnitState::kForwardDone: return "forward-done";
    case UnitState::kBackward: return "backward";
  }
  return "?";
}

float AutoGradientPredivideFactor(int world_size) {
  int p = 1;
  while (world_size % p == 0 && world_size / p > p) p *= 2;
  return static_cast<float>(p);
}

}  // namespace sk
