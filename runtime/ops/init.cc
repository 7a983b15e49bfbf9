#include "runtime/ops/init.h"

#include "runtime/device/device.h"

#include <cmath>
#include <vector>

#include "runtime/core/dtype.h"

namespace sk {

uint64_t ParamIdFromName(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Initializer::ToString() const {
  switch (kind) {
    case InitKind::kZeros: return "zeros";
    case InitKind::kOnes: return "ones";
    case InitKind::kNormal: return "normal(" + std::to_string(a) + ", " + std::to_string(b) + ")";
    case InitKind::kUniform: return "uniform(" + std::to_string(a) + ", " + std::to_string(b) + ")";
  }
  return "invalid";
}

Status ValidateInitializer(const Initializer& init) {
  switch (init.kind) {
    case InitKind::kZeros:
    case InitKind::kOnes:
      return OkStatus();
    case InitKind::kNormal:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || init.b < 0.0f) {
        return InvalidArgumentError("normal initializer needs a finite mean and stddev >= 0, got " +
                                    init.ToString());
      }
      return OkStatus();
    case InitKind::kUniform:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || !(init.a < init.b)) {
        return InvalidArgumentError("uniform initializer needs finite low < high, got " +
                                    init.ToString());
      }
      return OkStatus();
  }
  return InvalidArgumentError("unknown initializer kind " +
                              std::to_string(static_cast<int>(init.kind)));
}

float InitValue(const Initializer& init, uint64_t seed, uint64_t param_id, uint64_t index) {
  return InitValueAt(init.kind, init.a, init.b, seed, param_id, index);
}

Status InitializeSlice(const Initializer& init, uint64_t seed, uint64_t param_id, int64_t begin,
                       int64_t end, float* out) {
  SK_RETURN_IF_ERROR(ValidateInitializer(init));
  if (begin < 0 || end < begin) {
    return InvalidArgumentError("bad initialisation range [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ")");
  }
  if (end > begin && out == nullptr) return InvalidArgumentError("null output for initialisation");
  for (int64_t i = begin; i < end; ++i) {
    out[i - begin] = InitValue(init, seed, param_id, static_cast<uint64_t>(i));
  }
  return OkStatus();
}

Status InitializeTensorSlice(const Initializer& init, uint64_t seed, uint64_t param_id,
                             int64_t begin, const Tensor& out) {
  if (!out.defined()) return InvalidArgumentError("initialising an undefined tensor");
  if (!KindCapabilities(out.device().kind).host_memory) {
    return InvalidArgumentError("InitializeTensorSlice writes host tensors, got " + out.ToString());
  }
  const int64_t n = out.numel();
  if (out.dtype() == DType::kF32) {
    return InitializeSlice(init, seed, param_id, begin, begin + n, out.data_as<float>());
  }
  std::vector<float> tmp(static_cast<size_t>(n));
  SK_RETURN_IF_ERROR(InitializeSlice(init, seed, param_id, begin, begin + n, tmp.data()));
  return ConvertElements(tmp.data(), DType::kF32, out.data(), out.dtype(), static_cast<size_t>(n));
}

}  // namespace sk
