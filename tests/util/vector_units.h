// VectorUnits: `units` units of one f32 vector parameter "w" of `width`
// elements each, N(0, 1)-initialised, named layer0, layer1, ...: the model a
// framework-style caller drives through the low-level engine in the
// engine tests (tests/train, tests/cuda) and nccl_train_check.
#ifndef SHARDKIT_TESTS_UTIL_VECTOR_UNITS_H_
#define SHARDKIT_TESTS_UTIL_VECTOR_UNITS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/nn/model.h"

namespace sk {

inline std::vector<UnitSpec> VectorUnits(int units, int64_t width) {
  std::vector<UnitSpec> out;
  for (int u = 0; u < units; ++u) {
    UnitSpec unit;
    unit.name = "layer" + std::to_string(u);
    ParamSpec w;
    w.name = "w";
    w.shape = Shape{width};
    w.init = Initializer{InitKind::kNormal, 0.0f, 1.0f};
    unit.params.push_back(w);
    out.push_back(unit);
  }
  return out;
}

}  // namespace sk

#endif  // SHARDKIT_TESTS_UTIL_VECTOR_UNITS_H_
