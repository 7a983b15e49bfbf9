#include "runtime/nn/model_spec.h"

#include <utility>

#include "runtime/core/file_io.h"
#include "runtime/ops/init.h"

namespace sk {

Status ModelSpecBuilder::CheckUnit(int unit) const {
  if (unit < 0 || static_cast<size_t>(unit) >= units_.size()) {
    return OutOfRangeError("unit " + std::to_string(unit) + " out of range (the model has " +
                           std::to_string(units_.size()) + " units)");
  }
  return OkStatus();
}

StatusOr<int> ModelSpecBuilder::AddUnit(const std::string& name) {
  if (name.empty()) return InvalidArgumentError("unit name is empty");
  if (!IsValidUtf8(name)) return InvalidArgumentError("unit name '" + name + "' is not valid UTF-8");
  for (const UnitSpec& u : units_) {
    if (u.name == name) return InvalidArgumentError("a unit named '" + u.name + "' already exists");
  }
  UnitSpec u;
  u.name = name;
  units_.push_back(std::move(u));
  return static_cast<int>(units_.size() - 1);
}

StatusOr<int> ModelSpecBuilder::AddParam(int unit, ParamSpec param) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  UnitSpec& u = units_[unit];
  if (param.name.empty()) return InvalidArgumentError("parameter name is empty (unit '" + u.name + "')");
  if (!IsValidUtf8(param.name)) {
    return InvalidArgumentError("parameter name '" + param.name + "' (unit '" + u.name + "') is not valid UTF-8");
  }
  for (const ParamSpec& p : u.params) {
    if (p.name == param.name) {
      return InvalidArgumentError("unit '" + u.name + "' already has a parameter named '" + param.name + "'");
    }
  }
  if (!u.tied.empty()) {
    return FailedPreconditionError("unit '" + u.name +
                                   "' already has tied parameters, which are numbered after its own: add '" +
                                   param.name + "' before them");
  }
  if (param.init.kind == InitKind::kZeros || param.init.kind == InitKind::kOnes) {
    param.init.a = param.init.b = 0.f;
  }
  Status valid = ValidateInitializer(param.init);
  if (!valid.ok()) return valid.WithContext("parameter '" + u.name + "." + param.name + "': initializer");
  u.params.push_back(std::move(param));
  return static_cast<int>(u.params.size() - 1);
}

StatusOr<int> ModelSpecBuilder::AddTiedParam(int unit, const std::string& name, int owner_unit,
                                              int owner_param) {
  SK_RETURN_IF_ERROR(CheckUnit(unit));
  SK_RETURN_IF_ERROR(CheckUnit(owner_unit));
  UnitSpec& u = units_[unit];
  if (name.empty() || !IsValidUtf8(name)) {
    return InvalidArgumentError("tied parameter name of unit '" + u.name + "' is empty or not UTF-8");
  }
  const UnitSpec& owner = units_[owner_unit];
  if (owner_param < 0 || static_cast<size_t>(owner_param) >= owner.params.size()) {
    return OutOfRangeError("owner parameter " + std::to_string(owner_param) + " out of range (unit '" +
                           owner.name + "' has " + std::to_string(owner.params.size()) +
                           " parameters of its own)");
  }
  if (owner_unit >= unit) {
    return InvalidArgumentError("tied parameter '" + u.name + "." + name + "': its owner unit '" + owner.name +
                                "' must come before unit '" + u.name + "'");
  }
  for (size_t i = 0; i < u.num_tensors(); ++i) {
    if (UnitTensorName(u, i) == u.name + "." + name) {
      return InvalidArgumentError("unit '" + u.name + "' already has a parameter named '" + name + "'");
    }
  }
  const ParamSpec& p = owner.params[owner_param];
  u.tied.push_back(TiedParamSpec{name, FullParamName(owner, p), p.shape});
  return static_cast<int>(u.num_tensors() - 1);
}

}  // namespace sk
