#include "runtime/ops/init.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"

namespace sk {
namespace {

TEST(Init, SliceInitialisationEqualsSliceOfFullInitialisationBitForBit) {
  const uint64_t id = ParamIdFromName("h.3.attn.qkv.w");
  for (Initializer init : {Initializer::Normal(0.0f, 0.02f), Initializer::Uniform(-0.5f, 2.0f),
                           Initializer::Ones(), Initializer::Zeros()}) {
    const int64_t n = 1000;
    std::vector<float> full(n);
    ASSERT_TRUE(InitializeSlice(init, 1234, id, 0, n, full.data()).ok());
    for (int64_t begin : {0, 1, 333, 999}) {
      for (int64_t end : {begin, begin + 1, n}) {
        if (end > n) continue;
        std::vector<float> part(static_cast<size_t>(end - begin) + 1);
        ASSERT_TRUE(InitializeSlice(init, 1234, id, begin, end, part.data()).ok());
        EXPECT_EQ(0, std::memcmp(part.data(), full.data() + begin, sizeof(float) * (end - begin)))
            << init.ToString() << " [" << begin << ", " << end << ")";
      }
    }
  }
}

TEST(Init, TensorSliceRoundsToBF16TheSameValuesAsF32) {
  const uint64_t id = ParamIdFromName("embed.wte");
  Initializer init = Initializer::Normal(0.0f, 1.0f);
  auto t = HostAllocator::Default().Empty(DType::kBF16, Shape{64});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(InitializeTensorSlice(init, 7, id, 100, *t).ok());
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(t->data_as<BF16>()[i].bits, FloatToBF16(InitValue(init, 7, id, 100 + i)).bits);
  }
}

TEST(Init, DifferentSeedsAndParametersGiveDifferentValues) {
  Initializer init = Initializer::Normal(0.0f, 1.0f);
  const uint64_t a = ParamIdFromName("a"), b = ParamIdFromName("b");
  int same_seed = 0, same_param = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    same_seed += InitValue(init, 1, a, i) == InitValue(init, 2, a, i);
    same_param += InitValue(init, 1, a, i) == InitValue(init, 1, b, i);
  }
  EXPECT_EQ(same_seed, 0);
  EXPECT_EQ(same_param, 0);
}

TEST(Init, NormalHasRequestedMomentsAndUniformStaysInRange) {
  const int64_t n = 200000;
  std::vector<float> v(n);
  ASSERT_TRUE(InitializeSlice(Initializer::Normal(1.0f, 2.0f), 9, 42, 0, n, v.data()).ok());
  double mean = 0, var = 0;
  for (float x : v) mean += x;
  mean /= n;
  for (float x : v) var += (x - mean) * (x - mean);
  var /= n;
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.02);
  ASSERT_TRUE(InitializeSlice(Initializer::Uniform(-1.0f, 3.0f), 9, 42, 0, n, v.data()).ok());
  mean = 0;
  for (float x : v) {
    ASSERT_GE(x, -1.0f);
    ASSERT_LT(x, 3.0f);
    mean += x;
  }
  EXPECT_NEAR(mean / n, 1.0, 0.02);
}

TEST(Init, BadRangesAndInitializersAreInvalidArgument) {
  float out[4];
  EXPECT_EQ(InitializeSlice(Initializer::Zeros(), 1, 1, 5, 3, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(InitializeSlice(Initializer::Zeros(), 1, 1, -1, 3, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(InitializeSlice(Initializer::Normal(0.0f, -1.0f), 1, 1, 0, 3, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(InitializeSlice(Initializer::Uniform(2.0f, 1.0f), 1, 1, 0, 3, out).code(),
            StatusCode::kInvalidArgument);
}

TEST(Init, PhiloxMatchesPublishedKnownAnswer) {
  // Random123's kat_vectors: philox4x32 10 rounds, counter and key all ones.
  Philox4x32Result r = Philox4x32(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                                  0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  Philox4x32Result z = Philox4x32(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
}

}  // namespace
}  // namespace sk
