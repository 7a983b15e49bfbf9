// Helpers shared by the comm tests: ranks as threads, deterministic data, and
// the serial reference every backend is checked against.
#ifndef SHARDKIT_TESTS_COMM_COMM_TEST_UTIL_H_
#define SHARDKIT_TESTS_COMM_COMM_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/comm/local_backend.h"
#include "runtime/comm/process_group.h"
#include "runtime/core/allocator.h"
#include "runtime/core/dtype.h"
#include "runtime/device/device.h"

namespace sk::comm::testing {

// Whether `s`'s message contains `text`.
inline bool Contains(const Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// Runs fn(rank) on `n` threads and joins them.
inline void RunRanks(int n, const std::function<void(int)>& fn) {
  Status s = RunRankThreads(n, [&](int r) {
    fn(r);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

inline std::unique_ptr<Stream> MakeStream(int rank, const std::string& name) {
  StatusOr<Device*> device = Device::Get(DeviceId::Cpu(rank));
  CHECK(device.ok()) << device.status();
  StatusOr<std::unique_ptr<Stream>> stream = (*device)->CreateStream(name);
  CHECK(stream.ok()) << stream.status();
  return std::move(stream).value();
}

inline Tensor MakeTensor(int rank, DType dtype, int64_t numel) {
  HostAllocator allocator(DeviceId::Cpu(rank));
  StatusOr<Tensor> t = allocator.Zeros(dtype, Shape({numel}));
  CHECK(t.ok()) << t.status();
  return std::move(t).value();
}

// A value that depends on (seed, index), not an integer, so that a different
// summation order changes f32 bits.
inline float TestValue(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ULL ^ (i + 7) * 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int64_t>(x % 2000001) - 1000000) / 333333.3f;
}

inline void Fill(const Tensor& t, uint64_t seed) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    StoreFromFloat(t.data(), t.dtype(), i, TestValue(seed, i));
  }
}

inline std::vector<float> Values(const Tensor& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = LoadAsFloat(t.data(), t.dtype(), i);
  return v;
}

// The documented arithmetic (process_group.h), written independently of the
// backends: f32 accumulation in rank order, one rounding at the end.
inline float ReferenceReduce(const std::vector<float>& per_rank, DType dtype, ReduceOp op,
                             float pre, float post) {
  float acc = per_rank[0] * pre;
  for (size_t j = 1; j < per_rank.size(); ++j) acc += per_rank[j] * pre;
  if (op == ReduceOp::kAvg) acc /= static_cast<float>(per_rank.size());
  acc *= post;
  // Round to the dtype and back.
  if (dtype == DType::kBF16) return BF16ToFloat(FloatToBF16(acc));
  if (dtype == DType::kF16) return F16ToFloat(FloatToF16(acc));
  return acc;
}

// Bitwise equality of float vectors (treats -0 and +0 as different, NaN by bits).
inline ::testing::AssertionResult BitsEqual(const std::vector<float>& got,
                                            const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (FloatBits(got[i]) != FloatBits(want[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << " want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace sk::comm::testing

#endif  // SHARDKIT_TESTS_COMM_COMM_TEST_UTIL_H_
