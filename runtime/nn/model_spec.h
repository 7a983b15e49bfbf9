// ModelSpecBuilder: a model's units (model.h's UnitSpec) built one unit and
// one parameter at a time, with the rules every unit list must keep checked
// as each piece is added, so that a bad name or a bad tie is refused where
// it is made (naming it) instead of when an engine is built from the list.
// What the C ABI's sk_model_spec holds; a C++ caller building units by hand
// for FsdpEngine::Create can use it the same way.
//
// The rules: unit names are non-empty UTF-8 and unique; parameter names are
// non-empty UTF-8 and unique within their unit (names go into checkpoint
// indexes and safetensors headers, which are JSON); a unit's own parameters
// come before its tied ones (they are numbered after its own); a tied
// parameter's owner is an own parameter of an earlier unit; initializers are
// valid (ValidateInitializer).
//
// Thread safety: const methods may run concurrently; the Add methods need
// exclusive access.
#ifndef SHARDKIT_RUNTIME_NN_MODEL_SPEC_H_
#define SHARDKIT_RUNTIME_NN_MODEL_SPEC_H_

#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/nn/model.h"

namespace sk {

class ModelSpecBuilder {
 public:
  // Appends a unit with no parameters; returns its index. InvalidArgument
  // when `name` is empty, not UTF-8, or another unit's name.
  StatusOr<int> AddUnit(const std::string& name);

  // Appends `param` to unit `unit`; returns its index among the unit's own
  // parameters. An initializer of kind zeros or ones has its a and b set to 0
  // (they take none). OutOfRange unless unit < units().size();
  // InvalidArgument when param.name is empty, not UTF-8, or already a tensor
  // of the unit, or when the initializer is invalid (the message names the
  // parameter); FailedPrecondition when the unit already has tied
  // parameters.
  StatusOr<int> AddParam(int unit, ParamSpec param);

  // Makes parameter `owner_param` of unit `owner_unit` a tensor of unit
  // `unit` too, called `name` there (TiedParamSpec); returns its index among
  // the unit's tensors (after its own parameters). OutOfRange when a unit or
  // the owner parameter does not exist; InvalidArgument when `name` is
  // empty, not UTF-8 or already a tensor of the unit, or when the owner unit
  // does not come before `unit`.
  StatusOr<int> AddTiedParam(int unit, const std::string& name, int owner_unit, int owner_param);

  // OutOfRange unless `unit` indexes units().
  Status CheckUnit(int unit) const;

  // The units so far, in the order added.
  const std::vector<UnitSpec>& units() const { return units_; }

 private:
  std::vector<UnitSpec> units_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_MODEL_SPEC_H_
