// The vectorised loops (runtime/ops/cpu/simd.h) on every ISA this CPU runs:
// - elementwise ops without exp (optimizer updates, adds, scaling) must be
//   bit-identical to the scalar loops of update_rules.h / math.h;
// - GELU, LayerNorm, softmax, cross-entropy and the sum of squares use a
//   vector exp and/or another summation order, so they are compared with f64
//   references within stated tolerances (the scalar loop must meet the same);
// - special values (0, +-inf, NaN, saturating GELU arguments) behave as expf's.
// Lengths cover every tail (1 .. 2 vectors + 1) and a long row.
#include "runtime/ops/cpu/simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/ops/math.h"

namespace sk::simd {
namespace {

// Runs the test body once per ISA and restores the active one.
class OnIsa {
 public:
  explicit OnIsa(Isa isa) : before_(SetIsa(isa)) {}
  ~OnIsa() { SetIsa(before_); }

 private:
  Isa before_;
};

const std::vector<int64_t> kLengths = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 384, 1031};

std::vector<float> Random(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(SameBits(got[i], want[i])) << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
}

void ExpectClose(double got, double want, double rel, double abs, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), abs + rel * std::fabs(want)) << what << ": " << got << " vs " << want;
}

TEST(Simd, SetIsaClampsToTheBestAndReturnsThePrevious) {
  const Isa before = ActiveIsa();
  EXPECT_EQ(SetIsa(Isa::kScalar), before);
  EXPECT_EQ(ActiveIsa(), Isa::kScalar);
  SetIsa(Isa::kAvx512Bf16);
  EXPECT_EQ(ActiveIsa(), BestIsa());
  SetIsa(before);
  EXPECT_STREQ(IsaName(Isa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(Isa::kAvx512Bf16), "avx512_bf16");
}

TEST(Simd, OptimizerUpdatesAreBitIdenticalToTheScalarRules) {
  AdamHyper adamw{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, true, 0.19f, 0.0447f};
  AdamHyper adam_l2 = adamw;
  adam_l2.decoupled = false;
  AdamHyper adam_plain = adamw;
  adam_plain.weight_decay = 0;
  for (int64_t n : kLengths) {
    const auto p0 = Random(n, 1, -1, 1), g = Random(n, 2, -0.1f, 0.1f), m0 = Random(n, 3, -0.01f, 0.01f),
               v0 = Random(n, 4, 0, 1e-4f);
    for (const AdamHyper& h : {adamw, adam_l2, adam_plain}) {
      std::vector<float> p_ref = p0, m_ref = m0, v_ref = v0;
      for (int64_t i = 0; i < n; ++i) sk::AdamUpdate(p_ref[i], g[i], m_ref[i], v_ref[i], h);
      for (Isa isa : RunnableIsas()) {
        OnIsa on(isa);
        std::vector<float> p = p0, m = m0, v = v0;
        AdamUpdate(h, p.data(), g.data(), m.data(), v.data(), n);
        const std::string what = std::string("adam ") + IsaName(isa) + " n=" + std::to_string(n);
        ExpectSameBits(p, p_ref, what + " param");
        ExpectSameBits(m, m_ref, what + " exp_avg");
        ExpectSameBits(v, v_ref, what + " exp_avg_sq");
      }
    }
    for (SgdHyper h : {SgdHyper{0.1f, 0.9f, 0.1f, 0.01f, true, false}, SgdHyper{0.1f, 0.9f, 0.0f, 0.0f, false, true},
                       SgdHyper{0.05f, 0.0f, 0.0f, 0.01f, false, false}}) {
      std::vector<float> p_ref = p0, b_ref = m0;
      for (int64_t i = 0; i < n; ++i) {
        float scratch = 0;
        sk::SgdUpdate(p_ref[i], g[i], h.momentum == 0 ? scratch : b_ref[i], h);
      }
      for (Isa isa : RunnableIsas()) {
        OnIsa on(isa);
        std::vector<float> p = p0, b = m0;
        SgdUpdate(h, p.data(), g.data(), h.momentum == 0 ? nullptr : b.data(), n);
        const std::string what = std::string("sgd ") + IsaName(isa) + " n=" + std::to_string(n);
        ExpectSameBits(p, p_ref, what + " param");
        ExpectSameBits(b, b_ref, what + " momentum");
      }
    }
  }
}

TEST(Simd, AddsAndScalingAreBitIdenticalToTheScalarLoops) {
  for (int64_t n : kLengths) {
    const auto x0 = Random(n, 5, -3, 3), y0 = Random(n, 6, -3, 3);
    std::vector<float> add = x0, axpy = y0, scale = x0;
    for (int64_t i = 0; i < n; ++i) {
      add[i] += y0[i];
      axpy[i] += 0.37f * x0[i];
      scale[i] *= -1.7f;
    }
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> a = x0, b = y0, c = x0;
      AddInPlace(a.data(), y0.data(), n);
      Axpy(0.37f, x0.data(), b.data(), n);
      ScaleInPlace(c.data(), -1.7f, n);
      const std::string what = std::string(IsaName(isa)) + " n=" + std::to_string(n);
      ExpectSameBits(a, add, "add " + what);
      ExpectSameBits(b, axpy, "axpy " + what);
      ExpectSameBits(c, scale, "scale " + what);
    }
  }
}

double GeluRef(double x) {
  const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(k0 * (x + k1 * x * x * x)));
}

double GeluGradRef(double x) {
  const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
  const double t = std::tanh(k0 * (x + k1 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * x * x);
}

// Vector exp (~2 ulp) instead of expf: GELU within 2e-6 relative of the f64
// reference on every ISA, plus the absolute error of tanh via exp near -1
// (1 + t cancels: ~1.2e-7, times 0.5 |x|) that the scalar loop has as well.
TEST(Simd, GeluMatchesDoubleReferenceOnEveryIsa) {
  for (int64_t n : kLengths) {
    auto x = Random(n, 7, -8, 8);
    x[0] = 0.0f;
    if (n > 2) x[1] = 30.0f, x[2] = -30.0f;  // saturated tanh: exactly x and -0
    const auto dy = Random(n, 8, -1, 1);
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> y(n), dx(n);
      GeluForward(x.data(), n, y.data());
      GeluBackward(x.data(), dy.data(), n, dx.data());
      for (int64_t i = 0; i < n; ++i) {
        const std::string what = std::string("gelu ") + IsaName(isa) + " x=" + std::to_string(x[i]);
        const double cancel = 1.2e-7 * (1.0 + std::fabs(x[i]));
        ExpectClose(y[i], GeluRef(x[i]), 2e-6, cancel, what);
        ExpectClose(dx[i], dy[i] * GeluGradRef(x[i]), 2e-6, 2 * cancel * (1.0 + x[i] * x[i]), what + " grad");
      }
      if (n > 2) {
        EXPECT_EQ(y[1], 30.0f) << IsaName(isa);
        EXPECT_EQ(y[2], 0.0f) << IsaName(isa);
      }
    }
  }
}

TEST(Simd, GeluPropagatesNanAndSaturatesAtInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {std::nanf(""), inf, -inf, 100.0f, -100.0f, 1e-30f, 0.5f, -0.5f, 3.0f};
  for (Isa isa : RunnableIsas()) {
    OnIsa on(isa);
    std::vector<float> y(x.size());
    GeluForward(x.data(), static_cast<int64_t>(x.size()), y.data());
    EXPECT_TRUE(std::isnan(y[0])) << IsaName(isa);
    EXPECT_EQ(y[1], inf) << IsaName(isa);
    EXPECT_EQ(y[3], 100.0f) << IsaName(isa);
    EXPECT_EQ(y[4], 0.0f) << IsaName(isa);
  }
}

// The bf16 GELU converts in registers; it must give exactly what widening,
// the f32 loop and narrowing give, on every ISA, every tail, special values
// (NaN, infinities, subnormals, saturation) and dx aliasing dy.
TEST(Simd, Bf16GeluIsWidenF32GeluNarrowBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {std::nanf(""), inf, -inf, 100.0f, -100.0f, 1e-39f, -1e-39f,
                                      0.0f, -0.0f, 30.0f, -30.0f, 1e-30f, 0.5f, -3.0f};
  for (int64_t n : kLengths) {
    std::vector<float> xf = Random(n, 11, -8, 8), dyf = Random(n, 12, -2, 2);
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(special.size()); ++i) {
      xf[i] = special[i];
      dyf[n - 1 - i] = special[i];
    }
    std::vector<BF16> x(n), dy(n);
    NarrowToBf16(xf.data(), n, x.data());
    NarrowToBf16(dyf.data(), n, dy.data());
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> wx(n), wdy(n), wy(n), wdx(n);
      WidenBf16(x.data(), n, wx.data());
      WidenBf16(dy.data(), n, wdy.data());
      GeluForward(wx.data(), n, wy.data());
      GeluBackward(wx.data(), wdy.data(), n, wdx.data());
      std::vector<BF16> want_y(n), want_dx(n), y(n), dx = dy;
      NarrowToBf16(wy.data(), n, want_y.data());
      NarrowToBf16(wdx.data(), n, want_dx.data());
      GeluForwardBf16(x.data(), n, y.data());
      GeluBackwardBf16(x.data(), dx.data(), n, dx.data());  // dx aliases dy
      // A NaN's sign and payload from two NaN operands (dy NaN times a NaN
      // derivative) depend on the order the compiler gives a product, in
      // either path (seen under -O1): any NaN there; every other result bit
      // for bit.
      auto is_nan = [](BF16 h) { return (h.bits & 0x7f80) == 0x7f80 && (h.bits & 0x007f) != 0; };
      auto same = [&](BF16 got, BF16 want) {
        return is_nan(want) ? is_nan(got) : got.bits == want.bits;
      };
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same(y[i], want_y[i]))
            << IsaName(isa) << " n=" << n << " y[" << i << "]: " << y[i].bits << " vs " << want_y[i].bits;
        ASSERT_TRUE(same(dx[i], want_dx[i]))
            << IsaName(isa) << " n=" << n << " dx[" << i << "]: " << dx[i].bits << " vs " << want_dx[i].bits;
      }
    }
  }
}

double SigmoidRef(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// SwiGLU through the vector exp (Cephes, ~2 ulp) on every ISA: silu(g) u and
// dy u silu'(g) within 1e-6 relative of the f64 reference, plus, for the
// gradient, the absolute error of 1 + g (1 - s) cancelling near its zero at
// g = -1.278 (silu's minimum; the scalar loop has it too). Measured on a
// sweep of 6,000,001 points over g in [-30, 30] (7 Dec 2026): silu at most
// 3.42 ulp from the f64 value (2.4e-7 relative; the scalar expf loop 2.87
// ulp), silu' within 1e-6 relative plus 2.3e-8 absolute, alike on every ISA.
// Saturation at large |g| (silu(g) = g and -0) and NaN as expf's.
TEST(Simd, SwiGluMatchesDoubleReferenceOnEveryIsa) {
  for (int64_t n : kLengths) {
    auto g = Random(n, 21, -20, 20);
    const auto u = Random(n, 22, -2, 2), dy = Random(n, 23, -1, 1);
    g[0] = 0.0f;
    if (n > 2) g[1] = 100.0f, g[2] = -200.0f;
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> y(n), dg(n), du(n);
      SwiGluForward(g.data(), u.data(), n, y.data());
      SwiGluBackward(g.data(), u.data(), dy.data(), n, dg.data(), du.data());
      for (int64_t i = 0; i < n; ++i) {
        const std::string what = std::string("swiglu ") + IsaName(isa) + " g=" + std::to_string(g[i]);
        const double s = SigmoidRef(g[i]);
        const double grad = s * (1.0 + g[i] * (1.0 - s));
        ExpectClose(y[i], g[i] * s * u[i], 1e-6, 1e-37, what);
        ExpectClose(du[i], dy[i] * g[i] * s, 1e-6, 1e-37, what + " dup");
        ExpectClose(dg[i], dy[i] * u[i] * grad, 1e-6,
                    1.2e-7 * std::fabs(dy[i] * u[i]) * (1.0 + std::fabs(g[i])), what + " dgate");
      }
      if (n > 2) {
        EXPECT_EQ(y[1], 100.0f * u[1]) << IsaName(isa);
        EXPECT_EQ(y[2], 0.0f) << IsaName(isa);
      }
    }
  }
  const std::vector<float> nan = {std::nanf("")}, one = {1.0f};
  for (Isa isa : RunnableIsas()) {
    OnIsa on(isa);
    float y = 0.0f;
    SwiGluForward(nan.data(), one.data(), 1, &y);
    EXPECT_TRUE(std::isnan(y)) << IsaName(isa);
  }
}

// The bf16 SwiGLU converts in registers: exactly widening, the f32 loops and
// narrowing, on every ISA, tail and special value.
TEST(Simd, Bf16SwiGluIsWidenF32SwiGluNarrowBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {std::nanf(""), inf, -inf, 100.0f, -100.0f, 1e-39f, -1e-39f,
                                      0.0f, -0.0f, 30.0f, -30.0f, 1e-30f, 0.5f, -3.0f};
  for (int64_t n : kLengths) {
    std::vector<float> gf = Random(n, 31, -8, 8), uf = Random(n, 32, -2, 2),
                       dyf = Random(n, 33, -2, 2);
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(special.size()); ++i) {
      gf[i] = special[i];
      uf[n - 1 - i] = special[i];
    }
    std::vector<BF16> g(n), u(n), dy(n);
    NarrowToBf16(gf.data(), n, g.data());
    NarrowToBf16(uf.data(), n, u.data());
    NarrowToBf16(dyf.data(), n, dy.data());
    auto is_nan = [](BF16 h) { return (h.bits & 0x7f80) == 0x7f80 && (h.bits & 0x007f) != 0; };
    auto same = [&](BF16 got, BF16 want) { return is_nan(want) ? is_nan(got) : got.bits == want.bits; };
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> wg(n), wu(n), wdy(n), wy(n), wdg(n), wdu(n);
      WidenBf16(g.data(), n, wg.data());
      WidenBf16(u.data(), n, wu.data());
      WidenBf16(dy.data(), n, wdy.data());
      SwiGluForward(wg.data(), wu.data(), n, wy.data());
      SwiGluBackward(wg.data(), wu.data(), wdy.data(), n, wdg.data(), wdu.data());
      std::vector<BF16> want_y(n), want_dg(n), want_du(n), y(n), dg(n), du(n);
      NarrowToBf16(wy.data(), n, want_y.data());
      NarrowToBf16(wdg.data(), n, want_dg.data());
      NarrowToBf16(wdu.data(), n, want_du.data());
      SwiGluForwardBf16(g.data(), u.data(), n, y.data());
      SwiGluBackwardBf16(g.data(), u.data(), dy.data(), n, dg.data(), du.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same(y[i], want_y[i])) << IsaName(isa) << " n=" << n << " y[" << i << "]";
        ASSERT_TRUE(same(dg[i], want_dg[i])) << IsaName(isa) << " n=" << n << " dg[" << i << "]";
        ASSERT_TRUE(same(du[i], want_du[i])) << IsaName(isa) << " n=" << n << " du[" << i << "]";
      }
    }
  }
}

// RoPE's rotation of a position's heads is math.h's RopeRotate on every
// pair, bit for bit on every ISA (no FMA), forward and inverse, in place.
TEST(Simd, RopeRotateHeadsIsRopeRotateBitForBit) {
  for (int64_t head_dim : {2, 6, 16, 34, 64, 128}) {
    const int64_t heads = 3, half = head_dim / 2;
    const auto x = Random(heads * head_dim, 41, -3, 3);
    const auto c = Random(half, 42, -1, 1), s = Random(half, 43, -1, 1);
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> want(x.size());
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < half; ++i) {
          const int64_t o = h * head_dim + i;
          ops::math::RopeRotate(x[o], x[o + half], c[i], s[i], sign, &want[o], &want[o + half]);
        }
      }
      for (Isa isa : RunnableIsas()) {
        OnIsa on(isa);
        std::vector<float> y(x.size()), inplace = x;
        RopeRotateHeads(x.data(), c.data(), s.data(), heads, head_dim, sign, y.data());
        RopeRotateHeads(inplace.data(), c.data(), s.data(), heads, head_dim, sign, inplace.data());
        const std::string what = std::string("rope ") + IsaName(isa) + " hd " + std::to_string(head_dim);
        ExpectSameBits(y, want, what);
        ExpectSameBits(inplace, want, what + " in place");
      }
    }
  }
}

// The bf16 accumulation (a 16-bit gradient's flush) converts in registers;
// it must give exactly the scalar widen-add-round, including NaN, overflow
// to infinity, subnormal sums, cancellation to zero and every tail length.
TEST(Simd, Bf16AccumulateIsWidenAddNarrowBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {std::nanf(""), inf, -inf, 3e38f, -3e38f, 1e-39f, -1e-39f,
                                      0.0f, -0.0f, 1.0f, -1.0f, 1e-30f};
  for (int64_t n : kLengths) {
    std::vector<float> src = Random(n, 21, -4, 4), d0 = Random(n, 22, -4, 4);
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(special.size()); ++i) {
      src[i] = special[i];
      d0[n - 1 - i] = special[i];
    }
    if (n > 2) d0[1] = -inf;  // src[1] is inf: inf + -inf is NaN
    std::vector<BF16> dst0(n);
    NarrowToBf16(d0.data(), n, dst0.data());
    std::vector<BF16> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = FloatToBF16(BF16ToFloat(dst0[i]) + src[i]);
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<BF16> got = dst0;
      AccumulateBf16(src.data(), n, got.data());
      // NaN plus NaN (n = 1) returns one operand's payload, and the
      // compiler may order a scalar add either way: any NaN there.
      auto is_nan = [](BF16 h) { return (h.bits & 0x7f80) == 0x7f80 && (h.bits & 0x007f) != 0; };
      for (int64_t i = 0; i < n; ++i) {
        if (is_nan(want[i])) {
          ASSERT_TRUE(is_nan(got[i])) << IsaName(isa) << " n=" << n << " [" << i << "]";
        } else {
          ASSERT_EQ(got[i].bits, want[i].bits) << IsaName(isa) << " n=" << n << " [" << i << "]";
        }
      }
    }
  }
}

TEST(Simd, AddWidenedBf16IsWidenThenAddBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {inf, -inf, 3e38f, -3e38f, 1e-39f, -1e-39f,
                                      0.0f, -0.0f, 1.0f, -1.0f, 1e-30f};
  for (int64_t n : kLengths) {
    std::vector<float> x32 = Random(n, 23, -4, 4), acc0 = Random(n, 24, -4, 4);
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(special.size()); ++i) {
      x32[i] = special[i];
      acc0[n - 1 - i] = special[i];
    }
    std::vector<BF16> x(n);
    NarrowToBf16(x32.data(), n, x.data());
    std::vector<float> want = acc0;
    for (int64_t i = 0; i < n; ++i) want[i] += BF16ToFloat(x[i]);
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> got = acc0;
      AddWidenedBf16(got.data(), x.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(got[i])) << IsaName(isa) << " n=" << n << " [" << i << "]";
        } else {
          ASSERT_TRUE(SameBits(got[i], want[i])) << IsaName(isa) << " n=" << n << " [" << i << "]";
        }
      }
    }
  }
}

// Softmax over `valid` entries of a row: sums in lanes and a vector exp.
TEST(Simd, SoftmaxRowsMatchDoubleReferenceAndZeroTheMaskedTail) {
  for (int64_t cols : kLengths) {
    for (int64_t valid : {int64_t{1}, (cols + 1) / 2, cols}) {
      const auto row0 = Random(cols, 9 + cols, -12, 12), dp0 = Random(cols, 10, -1, 1);
      double m = row0[0], sum = 0;
      for (int64_t j = 0; j < valid; ++j) m = std::max(m, static_cast<double>(row0[j]));
      for (int64_t j = 0; j < valid; ++j) sum += std::exp(row0[j] - m);
      std::vector<double> p(cols, 0.0);
      for (int64_t j = 0; j < valid; ++j) p[j] = std::exp(row0[j] - m) / sum;
      double dot = 0;
      for (int64_t j = 0; j < cols; ++j) dot += p[j] * dp0[j];
      for (Isa isa : RunnableIsas()) {
        OnIsa on(isa);
        std::vector<float> row = row0;
        SoftmaxRowInPlace(row.data(), cols, valid);
        std::vector<float> dp = dp0;
        SoftmaxRowBackwardInPlace(row.data(), dp.data(), cols, 0.5f);
        for (int64_t j = 0; j < cols; ++j) {
          const std::string what = std::string("softmax ") + IsaName(isa) + " cols=" + std::to_string(cols) +
                                   " valid=" + std::to_string(valid) + " j=" + std::to_string(j);
          ExpectClose(row[j], p[j], 1e-5, 1e-9, what);
          if (j >= valid) {
            EXPECT_EQ(row[j], 0.0f) << what;
          }
          ExpectClose(dp[j], 0.5 * p[j] * (dp0[j] - dot), 1e-4, 1e-7, what + " bwd");
        }
      }
    }
  }
}

// Attention's softmax takes the 1/sqrt(d) scale inside the exp pass; it must
// give the bits of scaling the row first and then taking the softmax, on
// every ISA (the max commutes with a positive scale under rounding).
TEST(Simd, ScaledSoftmaxRowIsScalingFirstBitForBit) {
  for (int64_t cols : kLengths) {
    for (float scale : {1.0f, 0.125f, 0.17677669f, 0.111803398f, 3.0f}) {
      const int64_t valid = (cols + 2) / 3;
      const auto row0 = Random(cols, 90 + cols, -30, 30);
      for (Isa isa : RunnableIsas()) {
        OnIsa on(isa);
        std::vector<float> fused = row0, first = row0;
        SoftmaxRowInPlace(fused.data(), cols, valid, scale);
        ScaleInPlace(first.data(), scale, valid);
        SoftmaxRowInPlace(first.data(), cols, valid);
        ExpectSameBits(fused, first, std::string("scaled softmax ") + IsaName(isa) + " cols=" +
                                         std::to_string(cols) + " scale=" + std::to_string(scale));
      }
    }
  }
}

// Attention's block softmax (forward and backward over many rows at a row
// stride, causal or not) is the row functions' arithmetic bit for bit.
TEST(Simd, SoftmaxRowBlocksAreTheRowFunctionsBitForBit) {
  for (int64_t cols : {int64_t{1}, int64_t{17}, int64_t{64}, int64_t{150}}) {
    for (bool causal : {false, true}) {
      const int64_t rows = 70, ld = cols + 3, valid = causal ? 1 : cols;
      const auto x0 = Random(rows * ld, 70 + cols, -20, 20), dp0 = Random(rows * ld, 71, -1, 1);
      for (Isa isa : RunnableIsas()) {
        OnIsa on(isa);
        const std::string what = std::string(IsaName(isa)) + " cols=" + std::to_string(cols) +
                                 (causal ? " causal" : "");
        std::vector<float> block = x0, rowwise = x0;
        SoftmaxRowsInPlace(block.data(), rows, cols, ld, valid, causal, 0.125f);
        for (int64_t r = 0; r < rows; ++r) {
          SoftmaxRowInPlace(rowwise.data() + r * ld, cols, std::min(cols, valid + (causal ? r : 0)),
                            0.125f);
        }
        ExpectSameBits(block, rowwise, "softmax rows " + what);
        std::vector<float> dblock = dp0, drow = dp0;
        SoftmaxRowsBackwardInPlace(block.data(), ld, dblock.data(), ld, rows, cols, 0.5f);
        for (int64_t r = 0; r < rows; ++r) {
          SoftmaxRowBackwardInPlace(block.data() + r * ld, drow.data() + r * ld, cols, 0.5f);
        }
        ExpectSameBits(dblock, drow, "softmax rows backward " + what);
      }
    }
  }
}

// The linear-memory attention's dS row, (p (dp - delta)) scale, is the
// scalar expression's bits on every ISA (no FMA, the same order), masked
// tails included, and leaves the entries past n alone.
TEST(Simd, SoftmaxGradFromDeltaIsTheScalarExpressionBitForBit) {
  for (int64_t n : kLengths) {
    const auto p = Random(n + 3, 120 + n, 0, 1), dp0 = Random(n + 3, 121 + n, -2, 2);
    const float delta = 0.37f, scale = 0.125f;
    std::vector<float> want = dp0;
    for (int64_t j = 0; j < n; ++j) want[j] = p[j] * (dp0[j] - delta) * scale;
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> got = dp0;
      SoftmaxGradFromDeltaInPlace(p.data(), got.data(), n, delta, scale);
      ExpectSameBits(got, want, std::string("dS row ") + IsaName(isa) + " n=" + std::to_string(n));
    }
  }
}

TEST(Simd, CrossEntropyRowsMatchDoubleReference) {
  for (int64_t cols : kLengths) {
    const auto logits = Random(cols, 11 + cols, -20, 20);
    const int32_t target = static_cast<int32_t>(cols / 3);
    double m = logits[0], sum = 0;
    for (float l : logits) m = std::max(m, static_cast<double>(l));
    for (float l : logits) sum += std::exp(l - m);
    const double loss = std::log(sum) + m - logits[target];
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      const std::string what = std::string("cross-entropy ") + IsaName(isa) + " cols=" + std::to_string(cols);
      ExpectClose(CrossEntropyRow(logits.data(), cols, target), loss, 1e-5, 1e-5, what);
      std::vector<float> d(cols);
      CrossEntropyRowBackward(logits.data(), cols, target, 0.25f, d.data());
      for (int64_t j = 0; j < cols; ++j) {
        const double want = 0.25 * (std::exp(logits[j] - m) / sum - (j == target ? 1.0 : 0.0));
        ExpectClose(d[j], want, 1e-5, 1e-9, what + " d[" + std::to_string(j) + "]");
      }
    }
  }
}

TEST(Simd, CrossEntropyOfNanLogitsIsNan) {
  std::vector<float> logits(40, 0.5f);
  logits[21] = std::nanf("");
  for (Isa isa : RunnableIsas()) {
    OnIsa on(isa);
    EXPECT_TRUE(std::isnan(CrossEntropyRow(logits.data(), 40, 3))) << IsaName(isa);
  }
}

// LayerNorm: the row sums add in lanes; dgamma/dbeta accumulate row by row
// as in the scalar loop.
TEST(Simd, LayerNormMatchesDoubleReference) {
  for (int64_t cols : kLengths) {
    const int64_t rows = 3;
    const auto x = Random(rows * cols, 12, -2, 3), gamma = Random(cols, 13, 0.5f, 1.5f),
               beta = Random(cols, 14, -0.5f, 0.5f), dy = Random(rows * cols, 15, -1, 1),
               dx0 = Random(rows * cols, 16, -0.1f, 0.1f);
    std::vector<double> y_ref(rows * cols), dx_ref(rows * cols), dg_ref(cols, 0.0), db_ref(cols, 0.0);
    std::vector<double> rstd_ref(rows), mean_ref(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      double mean = 0, var = 0;
      for (int64_t j = 0; j < cols; ++j) mean += xr[j];
      mean /= cols;
      for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mean) * (xr[j] - mean);
      var /= cols;
      const double rstd = 1.0 / std::sqrt(var + 1e-5);
      mean_ref[r] = mean;
      rstd_ref[r] = rstd;
      double sg = 0, sgx = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double xhat = (xr[j] - mean) * rstd, g = dy[r * cols + j] * gamma[j];
        y_ref[r * cols + j] = xhat * gamma[j] + beta[j];
        sg += g;
        sgx += g * xhat;
        dg_ref[j] += dy[r * cols + j] * xhat;
        db_ref[j] += dy[r * cols + j];
      }
      for (int64_t j = 0; j < cols; ++j) {
        const double xhat = (xr[j] - mean) * rstd, g = dy[r * cols + j] * gamma[j];
        dx_ref[r * cols + j] = dx0[r * cols + j] + rstd * (g - sg / cols - xhat * sgx / cols);
      }
    }
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx = dx0, dg(cols, 0.0f), db(cols, 0.0f);
      LayerNormForward(x.data(), gamma.data(), beta.data(), rows, cols, y.data(), mean.data(), rstd.data());
      LayerNormBackward(x.data(), gamma.data(), dy.data(), mean.data(), rstd.data(), rows, cols, dx.data(),
                        dg.data(), db.data());
      const std::string what = std::string("layernorm ") + IsaName(isa) + " cols=" + std::to_string(cols);
      for (int64_t r = 0; r < rows; ++r) {
        ExpectClose(mean[r], mean_ref[r], 1e-5, 1e-6, what + " mean");
        ExpectClose(rstd[r], rstd_ref[r], 1e-5, 0, what + " rstd");
      }
      for (int64_t i = 0; i < rows * cols; ++i) {
        ExpectClose(y[i], y_ref[i], 1e-5, 1e-5, what + " y");
        ExpectClose(dx[i], dx_ref[i], 1e-4, 1e-5, what + " dx");
      }
      for (int64_t j = 0; j < cols; ++j) {
        ExpectClose(dg[j], dg_ref[j], 1e-5, 1e-6, what + " dgamma");
        ExpectClose(db[j], db_ref[j], 1e-6, 1e-6, what + " dbeta");
      }
      // Null parameter gradients are allowed (a LayerNorm without affine grads).
      std::vector<float> dx2 = dx0;
      LayerNormBackward(x.data(), gamma.data(), dy.data(), mean.data(), rstd.data(), rows, cols, dx2.data(),
                        nullptr, nullptr);
      ExpectSameBits(dx2, dx, what + " dx without dgamma/dbeta");
    }
  }
}

// RMSNorm: the row sums add in lanes; dgamma accumulates row by row as in
// math.h's row loop, and dx and dgamma are accumulated onto.
TEST(Simd, RmsNormMatchesDoubleReference) {
  const float eps = 1e-5f;
  for (int64_t cols : kLengths) {
    const int64_t rows = 3;
    const auto x = Random(rows * cols, 22, -2, 3), gamma = Random(cols, 23, 0.5f, 1.5f),
               dy = Random(rows * cols, 25, -1, 1), dx0 = Random(rows * cols, 26, -0.1f, 0.1f),
               dg0 = Random(cols, 27, -0.1f, 0.1f);
    std::vector<double> y_ref(rows * cols), dx_ref(rows * cols), dg_ref(dg0.begin(), dg0.end());
    std::vector<double> rstd_ref(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      double sq = 0;
      for (int64_t j = 0; j < cols; ++j) sq += static_cast<double>(xr[j]) * xr[j];
      const double rstd = 1.0 / std::sqrt(sq / cols + eps);
      rstd_ref[r] = rstd;
      double sgx = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double xhat = xr[j] * rstd, d = dy[r * cols + j];
        y_ref[r * cols + j] = xhat * gamma[j];
        sgx += d * gamma[j] * xhat;
        dg_ref[j] += d * xhat;
      }
      for (int64_t j = 0; j < cols; ++j) {
        const double xhat = xr[j] * rstd;
        dx_ref[r * cols + j] = dx0[r * cols + j] + rstd * (dy[r * cols + j] * gamma[j] - xhat * sgx / cols);
      }
    }
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      std::vector<float> y(rows * cols), rstd(rows), dx = dx0, dg = dg0;
      RmsNormForward(x.data(), gamma.data(), rows, cols, eps, y.data(), rstd.data());
      RmsNormBackward(x.data(), gamma.data(), dy.data(), rstd.data(), rows, cols, dx.data(), dg.data());
      const std::string what = std::string("rmsnorm ") + IsaName(isa) + " cols=" + std::to_string(cols);
      for (int64_t r = 0; r < rows; ++r) ExpectClose(rstd[r], rstd_ref[r], 1e-5, 0, what + " rstd");
      for (int64_t i = 0; i < rows * cols; ++i) {
        ExpectClose(y[i], y_ref[i], 1e-5, 1e-5, what + " y");
        ExpectClose(dx[i], dx_ref[i], 1e-4, 1e-5, what + " dx");
      }
      for (int64_t j = 0; j < cols; ++j) ExpectClose(dg[j], dg_ref[j], 1e-5, 1e-6, what + " dgamma");
      // A null dgamma is allowed and leaves dx's bits alone.
      std::vector<float> dx2 = dx0;
      RmsNormBackward(x.data(), gamma.data(), dy.data(), rstd.data(), rows, cols, dx2.data(), nullptr);
      ExpectSameBits(dx2, dx, what + " dx without dgamma");
      // Rows one at a time (as the CPU backend calls it) give the same bits.
      std::vector<float> y1(rows * cols), rstd1(rows), dx1 = dx0, dg1 = dg0;
      for (int64_t r = 0; r < rows; ++r) {
        RmsNormForward(x.data() + r * cols, gamma.data(), 1, cols, eps, y1.data() + r * cols, rstd1.data() + r);
        RmsNormBackward(x.data() + r * cols, gamma.data(), dy.data() + r * cols, rstd1.data() + r, 1, cols,
                        dx1.data() + r * cols, dg1.data());
      }
      ExpectSameBits(y1, y, what + " y row by row");
      ExpectSameBits(dx1, dx, what + " dx row by row");
      ExpectSameBits(dg1, dg, what + " dgamma row by row");
    }
  }
}

TEST(Simd, SumOfSquaresMatchesLongDoubleAndAddsToTheAccumulator) {
  for (int64_t n : kLengths) {
    const auto x = Random(n, 17, -2, 2);
    long double want = 1.5L;
    for (float v : x) want += static_cast<long double>(v) * v;
    for (Isa isa : RunnableIsas()) {
      OnIsa on(isa);
      ExpectClose(SumOfSquares(x.data(), n, 1.5), static_cast<double>(want), 1e-14, 0,
                  std::string("sum of squares ") + IsaName(isa) + " n=" + std::to_string(n));
    }
  }
  for (Isa isa : RunnableIsas()) {
    OnIsa on(isa);
    EXPECT_EQ(SumOfSquares(nullptr, 0, 2.0), 2.0) << IsaName(isa);
  }
}

// bf16 <-> f32 on every ISA gives core/dtype.h's scalar conversions bit for
// bit: every bf16 pattern widens exactly; narrowing rounds to nearest even,
// ties included, keeps subnormals (no flush to zero), overflows to infinity
// and keeps NaNs quiet with their sign. Every tail length 1..33 at every
// element offset 0..3 (unaligned), and nothing is written past the end.
TEST(Simd, Bf16ConversionsAreTheScalarOnesBitForBit) {
  std::vector<BF16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = static_cast<uint16_t>(i);
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  // Narrowing inputs: random values, every bf16 value, the ties and their
  // neighbours around a few of them, subnormals, the overflow boundary, NaNs.
  std::vector<float> in = Random(4000, 23, -1e3f, 1e3f);
  for (const BF16& b : all) in.push_back(BF16ToFloat(b));
  for (uint32_t hi : {0x3f80u, 0x3f81u, 0x0001u, 0x007fu, 0x8040u, 0x7f7fu, 0xff7fu}) {
    for (uint32_t lo : {0x7fffu, 0x8000u, 0x8001u, 0x0001u, 0xffffu}) in.push_back(from_bits(hi << 16 | lo));
  }
  for (uint32_t u : {0x00000001u, 0x00400000u, 0x807fffffu, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                     0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff812345u, 0x7fffffffu}) {
    in.push_back(from_bits(u));
  }
  for (Isa isa : RunnableIsas()) {
    OnIsa on(isa);
    const std::string name = IsaName(isa);
    std::vector<float> wide(all.size());
    WidenBf16(all.data(), static_cast<int64_t>(all.size()), wide.data());
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(bits(wide[i]), bits(BF16ToFloat(all[i]))) << name << " widen " << i;
    }
    std::vector<BF16> narrow(in.size());
    NarrowToBf16(in.data(), static_cast<int64_t>(in.size()), narrow.data());
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(narrow[i].bits, FloatToBF16(in[i]).bits)
          << name << " narrow " << in[i] << " (bits " << std::hex << bits(in[i]) << ")";
    }
    for (int64_t off = 0; off < 4; ++off) {
      for (int64_t n = 1; n <= 33; ++n) {
        const std::string what = name + " offset " + std::to_string(off) + " n=" + std::to_string(n);
        std::vector<float> f(off + n + 1, -7.0f);
        WidenBf16(all.data() + 0x3f00 + off, n, f.data() + off);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(bits(f[off + i]), bits(BF16ToFloat(all[0x3f00 + off + i]))) << what;
        }
        ASSERT_EQ(f[off + n], -7.0f) << what << ": widen wrote past the end";
        std::vector<BF16> h(off + n + 1, BF16{0x1234});
        NarrowToBf16(in.data() + off, n, h.data() + off);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[off + i].bits, FloatToBF16(in[off + i]).bits) << what;
        ASSERT_EQ(h[off + n].bits, 0x1234) << what << ": narrow wrote past the end";
      }
    }
  }
}

}  // namespace
}  // namespace sk::simd
