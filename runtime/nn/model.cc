#include "runtime/nn/model.h"

namespace sk {

int64_t UnitSpec::numel() const {
  int64_t n = 0;
  for (const ParamSpec& p : params) n += p.shape.numel();
  return n;
}

std::string FullParamName(const UnitSpec& unit, const ParamSpec& param) {
  return unit.name + "." + param.name;
}

int64_t CountParameters(const std::vector<UnitSpec>& units) {
  int64_t n = 0;
  for (const UnitSpec& u : units) n += u.numel();
  return n;
}

}  // namespace sk
