#include "runtime/core/dtype.h"

#include <string>

namespace sk {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kF64: return "f64";
    case DType::kInvalid: break;
  }
  return "invalid";
}

StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "fp32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16" || name == "fp16" || name == "half") return DType::kF16;
  return InvalidArgumentError("unknown dtype '" + std::string(name) +
                              "' (expected f32, bf16 or f16)");
}

Status ValidateDType(DType t) {
  if (t == DType::kF32 || t == DType::kBF16 || t == DType::kF16) return OkStatus();
  return InvalidArgumentError("invalid dtype value " + std::to_string(static_cast<int>(t)) +
                              " (expected f32=1, bf16=2 or f16=3)");
}

Status ValidateTensorDType(DType t) {
  if (t == DType::kI32 || t == DType::kF64) return OkStatus();
  if (t == DType::kF32 || t == DType::kBF16 || t == DType::kF16) return OkStatus();
  return InvalidArgumentError("invalid tensor dtype value " + std::to_string(static_cast<int>(t)) +
                              " (expected f32=1, bf16=2, f16=3, i32=4 or f64=5)");
}

float LoadAsFloat(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kBF16: return BF16ToFloat(static_cast<const BF16*>(data)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const F16*>(data)[i]);
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  LOG(FATAL) << "LoadAsFloat on a non-float dtype";
  return 0.f;
}

double LoadAsDouble(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF64: return static_cast<const double*>(data)[i];
    case DType::kI32: return static_cast<double>(static_cast<const int32_t*>(data)[i]);
    default: return static_cast<double>(LoadAsFloat(data, t, i));
  }
}

void StoreFromFloat(void* data, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(data)[i] = v; return;
    case DType::kBF16: static_cast<BF16*>(data)[i] = FloatToBF16(v); return;
    case DType::kF16: static_cast<F16*>(data)[i] = FloatToF16(v); return;
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  LOG(FATAL) << "StoreFromFloat on a non-float dtype";
}

Status ConvertElements(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  SK_RETURN_IF_ERROR(ValidateDType(src_type));
  SK_RETURN_IF_ERROR(ValidateDType(dst_type));
  if (n == 0) return OkStatus();
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * DTypeSize(src_type));
    return OkStatus();
  }
  if (src_type == DType::kF32) {
    const float* s = static_cast<const float*>(src);
    if (dst_type == DType::kBF16) {
      BF16* d = static_cast<BF16*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToBF16(s[i]);
    } else {
      F16* d = static_cast<F16*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToF16(s[i]);
    }
    return OkStatus();
  }
  if (dst_type == DType::kF32) {
    float* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = LoadAsFloat(src, src_type, i);
    return OkStatus();
  }
  for (size_t i = 0; i < n; ++i) StoreFromFloat(dst, dst_type, i, LoadAsFloat(src, src_type, i));
  return OkStatus();
}

}  // namespace sk
