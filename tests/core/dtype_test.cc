// DType conversions, checked exhaustively over every 16-bit pattern.
//
// References: f16 against the compiler's _Float16 (IEEE binary16 conversions
// with round-to-nearest-even, done by the F16C instructions or libgcc);
// bf16 against arithmetic in double that finds the nearest representable
// neighbours directly, without bit tricks.
#include "runtime/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace sk {
namespace {

bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return FloatBits(a) == FloatBits(b);
}

float RefF16ToFloat(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

uint16_t RefFloatToF16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// bf16 value of a pattern computed from its fields in double.
double RefBF16Value(uint16_t bits) {
  int sign = bits >> 15;
  int exp = (bits >> 7) & 0xff;
  int man = bits & 0x7f;
  double v;
  if (exp == 0xff) {
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(man / 128.0, -126);
  } else {
    v = std::ldexp(1.0 + man / 128.0, exp - 127);
  }
  return sign ? -v : v;
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kInvalid), 0u);
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("half"), DType::kF16);
  EXPECT_EQ(ParseDType("f64").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDType(static_cast<DType>(7)).code(), StatusCode::kInvalidArgument);
}

TEST(DTypeTest, BF16WideningIsExactForAll65536Patterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float got = BF16ToFloat(BF16{static_cast<uint16_t>(b)});
    double want = RefBF16Value(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << "pattern " << b;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << "pattern " << b;
    }
  }
}

TEST(DTypeTest, F16WideningMatchesHardwareForAll65536Patterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float got = F16ToFloat(F16{static_cast<uint16_t>(b)});
    ASSERT_TRUE(SameFloat(got, RefF16ToFloat(static_cast<uint16_t>(b)))) << "pattern " << b;
  }
}

TEST(DTypeTest, RoundTripOfEvery16BitPatternIsIdentityExceptNaNPayloads) {
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t bits = static_cast<uint16_t>(b);
    float bf = BF16ToFloat(BF16{bits});
    float hf = F16ToFloat(F16{bits});
    if (std::isnan(bf)) {
      EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(bf))));
    } else {
      ASSERT_EQ(FloatToBF16(bf).bits, bits) << b;
    }
    if (std::isnan(hf)) {
      EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(hf))));
    } else {
      ASSERT_EQ(FloatToF16(hf).bits, bits) << b;
    }
  }
}

// For every pair of adjacent finite bf16 values (lo, hi): the exact midpoint
// rounds to the one with an even mantissa, and the f32 values just inside the
// midpoint round to the nearer one. Together with the round trip this pins
// rounding at every pattern.
TEST(DTypeTest, BF16RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t b = 0; b < 0x7f7f; ++b) {  // up to the largest finite below max
    for (uint32_t sign : {0u, 0x8000u}) {
      uint16_t lo = static_cast<uint16_t>(b | sign);
      uint16_t hi = static_cast<uint16_t>((b + 1) | sign);
      float flo = BF16ToFloat(BF16{lo});
      float fhi = BF16ToFloat(BF16{hi});
      // The midpoint has one more mantissa bit than bf16: exact in f32.
      float mid = static_cast<float>((static_cast<double>(flo) + static_cast<double>(fhi)) / 2);
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(flo) + fhi) / 2);
      uint16_t even = (lo & 1) ? hi : lo;
      ASSERT_EQ(FloatToBF16(mid).bits, even) << "midpoint of " << b;
      float below = std::nextafter(mid, flo);
      float above = std::nextafter(mid, fhi);
      ASSERT_EQ(FloatToBF16(below).bits, lo) << b;
      ASSERT_EQ(FloatToBF16(above).bits, hi) << b;
    }
  }
}

TEST(DTypeTest, BF16OverflowAndSpecials) {
  float max_bf16 = BF16ToFloat(BF16{0x7f7f});
  float next = BF16ToFloat(BF16{0x7f7f}) * (1 + 1.0f / 256);  // beyond the max/inf midpoint
  EXPECT_EQ(FloatToBF16(max_bf16).bits, 0x7f7f);
  EXPECT_EQ(FloatToBF16(next).bits, 0x7f80);  // +inf
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  // A signalling NaN whose payload lives only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(BitsToFloat(0x7f800001u)))));
  EXPECT_EQ(FloatToBF16(-0.0f).bits, 0x8000);
}

// f32 -> f16 against the hardware conversion: every f16 pattern's midpoints
// and neighbours, plus a dense sweep of f32 patterns across f16's range
// (subnormals, the overflow boundary, NaNs).
TEST(DTypeTest, F16NarrowingMatchesHardwareAtEveryMidpoint) {
  for (uint32_t b = 0; b < 0x7bff; ++b) {
    for (uint32_t sign : {0u, 0x8000u}) {
      float flo = F16ToFloat(F16{static_cast<uint16_t>(b | sign)});
      float fhi = F16ToFloat(F16{static_cast<uint16_t>((b + 1) | sign)});
      float mid = static_cast<float>((static_cast<double>(flo) + fhi) / 2);
      for (float x : {mid, std::nextafter(mid, flo), std::nextafter(mid, fhi), flo, fhi}) {
        ASSERT_EQ(FloatToF16(x).bits, RefFloatToF16(x)) << "x=" << x << " near pattern " << b;
      }
    }
  }
}

TEST(DTypeTest, F16NarrowingMatchesHardwareOnASweepOfF32Patterns) {
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) {  // a prime stride hits every exponent
    float x = BitsToFloat(static_cast<uint32_t>(u));
    uint16_t got = FloatToF16(x).bits;
    uint16_t want = RefFloatToF16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(F16ToFloat(F16{got}))) << std::hex << u;
    } else {
      ASSERT_EQ(got, want) << std::hex << "f32 pattern 0x" << u;
    }
  }
  EXPECT_EQ(FloatToF16(65520.0f).bits, 0x7c00);  // the max/inf midpoint rounds to even: inf
  EXPECT_EQ(FloatToF16(65519.0f).bits, 0x7bff);
}

TEST(DTypeTest, ConvertElementsBetweenAllTypePairs) {
  const float src[5] = {1.0f, -2.5f, 0.333333f, 65504.0f, 1e-8f};
  for (DType a : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType b : {DType::kF32, DType::kBF16, DType::kF16}) {
      alignas(8) char abuf[20], bbuf[20];
      ASSERT_TRUE(ConvertElements(src, DType::kF32, abuf, a, 5).ok());
      ASSERT_TRUE(ConvertElements(abuf, a, bbuf, b, 5).ok());
      for (size_t i = 0; i < 5; ++i) {
        float through_a = LoadAsFloat(abuf, a, i);
        float want = through_a;
        // Converting onwards rounds once more, exactly as a direct store does.
        alignas(4) char one[4];
        StoreFromFloat(one, b, 0, through_a);
        want = LoadAsFloat(one, b, 0);
        EXPECT_TRUE(SameFloat(LoadAsFloat(bbuf, b, i), want)) << DTypeName(a) << "->" << DTypeName(b);
      }
    }
  }
  EXPECT_EQ(ConvertElements(src, DType::kInvalid, nullptr, DType::kF32, 1).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk
