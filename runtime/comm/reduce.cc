#include "runtime/comm/reduce.h"

#include <algorithm>

namespace sk::comm {
namespace {

// Elements reduced per block: the f32 accumulator (16 KiB) stays in L1/L2
// while every source streams through it once.
constexpr size_t kBlock = 4096;

template <typename T>
inline float Load(const T* p, size_t i);
template <>
inline float Load<float>(const float* p, size_t i) { return p[i]; }
template <>
inline float Load<BF16>(const BF16* p, size_t i) { return BF16ToFloat(p[i]); }
template <>
inline float Load<F16>(const F16* p, size_t i) { return F16ToFloat(p[i]); }

template <typename T>
inline void Store(T* p, size_t i, float v);
template <>
inline void Store<float>(float* p, size_t i, float v) { p[i] = v; }
template <>
inline void Store<BF16>(BF16* p, size_t i, float v) { p[i] = FloatToBF16(v); }
template <>
inline void Store<F16>(F16* p, size_t i, float v) { p[i] = FloatToF16(v); }

template <typename T>
void Reduce(const void* const* srcs, int n, size_t count, float pre, float divisor, float post,
            void* dst_v) {
  T* dst = static_cast<T*>(dst_v);
  float acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    if (pre == 1.0f) {
      for (size_t i = 0; i < len; ++i) acc[i] = Load(s0, i);
    } else {
      for (size_t i = 0; i < len; ++i) acc[i] = Load(s0, i) * pre;
    }
    for (int j = 1; j < n; ++j) {
      const T* sj = static_cast<const T*>(srcs[j]) + base;
      if (pre == 1.0f) {
        for (size_t i = 0; i < len; ++i) acc[i] += Load(sj, i);
      } else {
        for (size_t i = 0; i < len; ++i) acc[i] += Load(sj, i) * pre;
      }
    }
    if (divisor != 1.0f) {
      for (size_t i = 0; i < len; ++i) acc[i] /= divisor;
    }
    if (post != 1.0f) {
      for (size_t i = 0; i < len; ++i) acc[i] *= post;
    }
    T* d = dst + base;
    for (size_t i = 0; i < len; ++i) Store(d, i, acc[i]);
  }
}

}  // namespace

void ReduceInRankOrder(const void* const* srcs, int n, DType dtype, size_t count, float pre_scale,
                       float divisor, float post_scale, void* dst) {
  if (count == 0 || n <= 0) return;
  switch (dtype) {
    case DType::kF32:
      Reduce<float>(srcs, n, count, pre_scale, divisor, post_scale, dst);
      return;
    case DType::kBF16:
      Reduce<BF16>(srcs, n, count, pre_scale, divisor, post_scale, dst);
      return;
    case DType::kF16:
      Reduce<F16>(srcs, n, count, pre_scale, divisor, post_scale, dst);
      return;
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid:
      break;
  }
  LOG(FATAL) << "ReduceInRankOrder on an invalid dtype (validated by ProcessGroup)";
}

}  // namespace sk::comm
