// Counter-based parameter initialisation.
//
// Every value is a pure function of (seed, parameter id, element index):
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11) keyed by the seed, with the parameter id and the element index
// as its 128-bit counter. Any slice [begin, end) of any parameter can
// therefore be initialised alone, bit-identical to the same elements of a
// full initialisation, without replaying a stream: FSDP's deferred
// initialisation materialises only a rank's shard this way.
//
// Parameter ids are the 64-bit FNV-1a hash of the parameter's full name
// ("h.3.attn.qkv.w"), so they do not depend on how a model is cut into units.
//
// Thread safety: all functions are pure and may be called concurrently.
#ifndef SHARDKIT_RUNTIME_OPS_INIT_H_
#define SHARDKIT_RUNTIME_OPS_INIT_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/core/macros.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

namespace sk {

// Philox4x32 with 10 rounds: four 32-bit outputs for a 128-bit counter.
struct Philox4x32Result {
  uint32_t v[4];
};

SK_HOST_DEVICE SK_INLINE Philox4x32Result Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2,
                                                     uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u;
  constexpr uint32_t kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

// 64-bit FNV-1a of `name`: the id of the parameter called `name`.
uint64_t ParamIdFromName(std::string_view name);

// How a parameter's elements are drawn. Values are stable (checkpoint metadata).
enum class InitKind : uint8_t {
  kZeros = 1,
  kOnes = 2,
  kNormal = 3,   // mean a, standard deviation b
  kUniform = 4,  // [a, b)
};

struct Initializer {
  InitKind kind = InitKind::kZeros;
  float a = 0.0f;
  float b = 0.0f;

  static Initializer Zeros() { return {InitKind::kZeros, 0.0f, 0.0f}; }
  static Initializer Ones() { return {InitKind::kOnes, 0.0f, 0.0f}; }
  static Initializer Normal(float mean, float stddev) { return {InitKind::kNormal, mean, stddev}; }
  static Initializer Uniform(float low, float high) { return {InitKind::kUniform, low, high}; }

  // "normal(0, 0.02)".
  std::string ToString() const;
  friend bool operator==(const Initializer& x, const Initializer& y) {
    return x.kind == y.kind && x.a == y.a && x.b == y.b;
  }
};

// InvalidArgument for an unknown kind, a negative or non-finite standard
// deviation, or an empty/inverted uniform range.
Status ValidateInitializer(const Initializer& init);

// A double in (0, 1] from 53 random bits.
SK_HOST_DEVICE SK_INLINE double OpenUnit53(uint32_t hi, uint32_t lo) {
  uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  bits &= (uint64_t{1} << 53) - 1;
  return (static_cast<double>(bits) + 1.0) * 0x1.0p-53;
}

// Element `index` of the parameter `param_id` under `seed`, as f32: the one
// definition the CPU (InitValue) and the CUDA kernel (runtime/ops/cuda) run.
// Uniform: a + (b - a) u with u in [0, 1); normal: Box-Muller in double from
// two 53-bit uniforms. (The device's double log and cos may differ from
// glibc's in the last place, which changes the f32 result only when that
// lands on a rounding boundary.)
SK_HOST_DEVICE SK_INLINE float InitValueAt(InitKind kind, float a, float b, uint64_t seed,
                                           uint64_t param_id, uint64_t index) {
  if (kind == InitKind::kZeros) return 0.0f;
  if (kind == InitKind::kOnes) return 1.0f;
  Philox4x32Result r =
      Philox4x32(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                 static_cast<uint32_t>(param_id), static_cast<uint32_t>(param_id >> 32),
                 static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  if (kind == InitKind::kUniform) {
    double u = OpenUnit53(r.v[0], r.v[1]) - 0x1.0p-53;  // [0, 1)
    return static_cast<float>(a + (static_cast<double>(b) - a) * u);
  }
  double u1 = OpenUnit53(r.v[0], r.v[1]);
  double u2 = OpenUnit53(r.v[2], r.v[3]);
  double z = sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
  return static_cast<float>(a + static_cast<double>(b) * z);
}

// Element `index` of the parameter `param_id` under `seed`, as f32.
float InitValue(const Initializer& init, uint64_t seed, uint64_t param_id, uint64_t index);

// Writes elements [begin, end) of the parameter into out[0, end - begin).
// InvalidArgument if the range is inverted or negative, or the initializer is invalid.
Status InitializeSlice(const Initializer& init, uint64_t seed, uint64_t param_id, int64_t begin,
                       int64_t end, float* out);

// Fills `out` (f32, bf16 or f16, on the host) with elements
// [begin, begin + out.numel()) of the parameter, rounding to out's dtype.
Status InitializeTensorSlice(const Initializer& init, uint64_t seed, uint64_t param_id,
                             int64_t begin, const Tensor& out);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_INIT_H_
