// Element types and their conversions.
//
// shardkit computes in f32, bf16 and f16. Master weights and optimizer state are
// always f32; the 16-bit types are storage formats for compute and
// communication, converted with round-to-nearest-even exactly as CUDA's
// __float2bfloat16_rn / __float2half_rn do. The conversion functions are
// SK_HOST_DEVICE: CPU kernels, CUDA kernels and tests share them.
#ifndef SHARDKIT_RUNTIME_CORE_DTYPE_H_
#define SHARDKIT_RUNTIME_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "runtime/core/macros.h"
#include "runtime/core/status.h"

namespace sk {

// Values are part of the C ABI and of checkpoint files: never renumbered.
// 0 is "unset" so zero-initialised option structs mean "default".
enum class DType : uint8_t {
  kInvalid = 0,
  kF32 = 1,
  kBF16 = 2,
  kF16 = 3,
  // 32-bit signed integers: token ids and targets on their way to a device.
  // An index type, not a compute type: ValidateDType rejects it, tensors and
  // the op layer accept it where they say so.
  kI32 = 4,
  // 64-bit floats: host-readable accumulators (the grad-norm partial sums).
  // Like kI32, not a compute type.
  kF64 = 5,
};

// Size in bytes of one element; 0 for kInvalid.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kF64: return 8;
    case DType::kInvalid: return 0;
  }
  return 0;
}

// "f32", "bf16", "f16", "i32", "f64"; "invalid" otherwise.
std::string_view DTypeName(DType t);
// Parses "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"/"half".
StatusOr<DType> ParseDType(std::string_view name);
// InvalidArgument unless t is one of the three element types.
Status ValidateDType(DType t);
// InvalidArgument unless a tensor may hold t: the three element types, kI32 or kF64.
Status ValidateTensorDType(DType t);

// 16-bit storage types: plain bit patterns, so they are trivially copyable and
// identical on host and device.
struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

SK_HOST_DEVICE SK_INLINE uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

SK_HOST_DEVICE SK_INLINE float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 is the top half of an f32: widening is exact.
SK_HOST_DEVICE SK_INLINE float BF16ToFloat(BF16 h) { return BitsToFloat(uint32_t{h.bits} << 16); }

// Round to nearest, ties to even. NaNs stay NaN (quietened, sign kept);
// values beyond bf16's range round to infinity as IEEE rounding says.
SK_HOST_DEVICE SK_INLINE BF16 FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return BF16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return BF16{static_cast<uint16_t>(u >> 16)};
}

// Exact widening of an IEEE binary16 value.
SK_HOST_DEVICE SK_INLINE float F16ToFloat(F16 h) {
  uint32_t sign = uint32_t{static_cast<uint32_t>(h.bits & 0x8000u)} << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) {  // inf / NaN
    return BitsToFloat(sign | 0x7f800000u | (man << 13));
  }
  if (exp == 0) {
    if (man == 0) return BitsToFloat(sign);
    // Subnormal: value = man * 2^-24, exactly representable in f32.
    float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest, ties to even, with gradual underflow and overflow to inf.
SK_HOST_DEVICE SK_INLINE F16 FloatToF16(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return F16{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  }
  if (a >= 0x477ff000u) {  // >= 65520 rounds to infinity
    return F16{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (a < 0x38800000u) {  // below 2^-14: subnormal or zero in f16
    if (a < 0x33000000u) return F16{sign};  // < 2^-25: rounds to zero (ties at 2^-25 to even 0)
    uint32_t exp = a >> 23;                 // 102..112
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;            // 14..24
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return F16{static_cast<uint16_t>(sign | half)};
  }
  uint32_t lsb = (a >> 13) & 1u;
  a += 0xfffu + lsb;
  a -= 0x38000000u;  // rebias 127 -> 15
  return F16{static_cast<uint16_t>(sign | (a >> 13))};
}

// Converts `n` elements between any two of the three types (same type: copy).
// Host only. InvalidArgument for kInvalid.
Status ConvertElements(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

// Reads element i of a buffer of type t as float.
float LoadAsFloat(const void* data, DType t, size_t i);
// Reads element i of a buffer of any type but kInvalid as double, exactly
// (f64 and i32 too: what a host reads back of a device value).
double LoadAsDouble(const void* data, DType t, size_t i);
// Stores v into element i of a buffer of type t, rounding to nearest even.
void StoreFromFloat(void* data, DType t, size_t i, float v);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_DTYPE_H_
