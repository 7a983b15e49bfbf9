// Every layer's forward against a reference written in double, and its
// backward against central finite differences of that reference in double.
// The f32 kernels see the same inputs rounded to f32; the loss is
// L = sum(y * w) with a fixed random w, so dL/dy = w is fed to the backward.
#include "runtime/ops/cpu/kernels.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/ops/cpu/simd.h"

namespace sk {
namespace {

using Vec = std::vector<double>;

Vec Random(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  Vec v(n);
  for (double& x : v) x = static_cast<float>(dist(gen));  // representable in f32
  return v;
}

std::vector<float> ToF32(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central difference of loss() with respect to x[i], in double.
double FiniteDiff(Vec& x, size_t i, const std::function<double()>& loss) {
  const double eps = 1e-6;
  double saved = x[i];
  x[i] = saved + eps;
  double lp = loss();
  x[i] = saved - eps;
  double lm = loss();
  x[i] = saved;
  return (lp - lm) / (2 * eps);
}

// Checks analytic (f32 kernel) gradient of every element of x against
// finite differences of the double reference.
void ExpectGradient(const std::string& what, Vec& x, const std::vector<float>& analytic,
                    const std::function<double()>& loss, double tol = 2e-3) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) {
    double fd = FiniteDiff(x, i, loss);
    EXPECT_NEAR(analytic[i], fd, tol * std::max(1.0, std::fabs(fd))) << what << "[" << i << "]";
  }
}

void ExpectForward(const std::string& what, const std::vector<float>& got, const Vec& want,
                   double tol = 1e-4) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << "[" << i << "]";
  }
}

// ---- references in double ----

Vec LinearRef(const Vec& x, const Vec& w, const Vec& b, int64_t rows, int64_t in, int64_t out) {
  Vec y(rows * out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[i * out + o];
      y[r * out + o] = s;
    }
  return y;
}

Vec LayerNormRef(const Vec& x, const Vec& g, const Vec& b, int64_t rows, int64_t cols) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mean += x[r * cols + j];
    mean /= cols;
    for (int64_t j = 0; j < cols; ++j) var += (x[r * cols + j] - mean) * (x[r * cols + j] - mean);
    var /= cols;
    double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = (x[r * cols + j] - mean) * rstd * g[j] + b[j];
  }
  return y;
}

Vec GeluRef(const Vec& x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double v = x[i];
    y[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  return y;
}

Vec SoftmaxRef(const Vec& x, int64_t rows, int64_t cols) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, x[r * cols + j]);
    for (int64_t j = 0; j < cols; ++j) s += std::exp(x[r * cols + j] - m);
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = std::exp(x[r * cols + j] - m) / s;
  }
  return y;
}

// q [B*Tq, H*D], k and v [B*Tk, H*D]; returns out [B*Tq, H*D].
Vec AttentionRef(const Vec& q, const Vec& k, const Vec& v, const AttentionShape& s) {
  const int64_t c = s.heads * s.head_dim;
  Vec out(s.batch * s.q_len * c, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.q_len; ++i) {
        int64_t valid = s.causal ? i + 1 : s.kv_len;
        Vec sc(valid);
        double m = -1e300;
        for (int64_t j = 0; j < valid; ++j) {
          double d = 0;
          for (int64_t e = 0; e < s.head_dim; ++e)
            d += q[(b * s.q_len + i) * c + h * s.head_dim + e] *
                 k[(b * s.kv_len + j) * c + h * s.head_dim + e];
          sc[j] = d * scale;
          m = std::max(m, sc[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < valid; ++j) z += (sc[j] = std::exp(sc[j] - m));
        for (int64_t j = 0; j < valid; ++j)
          for (int64_t e = 0; e < s.head_dim; ++e)
            out[(b * s.q_len + i) * c + h * s.head_dim + e] +=
                sc[j] / z * v[(b * s.kv_len + j) * c + h * s.head_dim + e];
      }
  return out;
}

double CrossEntropyRef(const Vec& logits, const std::vector<int32_t>& t, int64_t rows,
                       int64_t vocab) {
  double sum = 0;
  int count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == kIgnoreTarget) continue;
    double m = -1e300, z = 0;
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, logits[r * vocab + j]);
    for (int64_t j = 0; j < vocab; ++j) z += std::exp(logits[r * vocab + j] - m);
    sum += std::log(z) + m - logits[r * vocab + t[r]];
    ++count;
  }
  return count ? sum / count : 0.0;
}

// ---- tests ----

TEST(Kernels, GemmBackendsAgreeWithEachOtherAndDoubleReference) {
  const int64_t m = 7, n = 5, k = 9;
  Vec a = Random(m * k, 1), b = Random(k * n, 2);
  Vec want = LinearRef(a, b, {}, m, k, n);
  for (GemmBackend be : {GemmBackend::kOpenBlas, GemmBackend::kOneDnn}) {
    std::vector<float> af = ToF32(a), bf = ToF32(b), c(m * n, 0.0f);
    Gemm(false, false, m, n, k, 1.0f, af.data(), k, bf.data(), n, 0.0f, c.data(), n, be);
    ExpectForward(std::string(GemmBackendName(be)), c, want);
  }
}

TEST(Kernels, GemmThreadsIsAPerThreadSettingAndRejectsZero) {
  const int before = GemmThreads();
  ASSERT_TRUE(SetGemmThreads(1).ok());
  EXPECT_EQ(GemmThreads(), 1);
  int other = 0;
  std::thread t([&] { other = GemmThreads(); });
  t.join();
  EXPECT_EQ(other, before);  // a new thread starts from the process default
  EXPECT_EQ(SetGemmThreads(0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(SetGemmThreads(before).ok());
}

TEST(Kernels, GemmTransposedOperandsMatchExplicitTranspose) {
  const int64_t m = 4, n = 6, k = 3;
  Vec a = Random(m * k, 3), b = Random(k * n, 4);
  Vec at(k * m), bt(n * k);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) at[j * m + i] = a[i * k + j];
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) bt[j * k + i] = b[i * n + j];
  Vec want = LinearRef(a, b, {}, m, k, n);
  std::vector<float> atf = ToF32(at), btf = ToF32(bt), c(m * n);
  Gemm(true, true, m, n, k, 1.0f, atf.data(), m, btf.data(), k, 0.0f, c.data(), n);
  ExpectForward("AtBt", c, want);
}

// bf16 operands, f32 accumulation: equals the double product of the
// bf16-rounded operands up to f32 summation error, for every transposition,
// and accumulates when asked.
TEST(Kernels, Bf16GemmAccumulatesInF32ForEveryTransposition) {
  const int64_t m = 19, n = 23, k = 37;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Vec a = Random(m * k, 200), b = Random(k * n, 201);
      std::vector<BF16> ab(a.size()), bb(b.size());
      for (size_t i = 0; i < a.size(); ++i) a[i] = BF16ToFloat(ab[i] = FloatToBF16(static_cast<float>(a[i])));
      for (size_t i = 0; i < b.size(); ++i) b[i] = BF16ToFloat(bb[i] = FloatToBF16(static_cast<float>(b[i])));
      // Logical A [m, k] and B [k, n], laid out transposed when asked.
      std::vector<BF16> as(a.size()), bs(b.size());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p) as[ta ? p * m + i : i * k + p] = ab[i * k + p];
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < n; ++j) bs[tb ? j * k + p : p * n + j] = bb[p * n + j];
      Vec want = LinearRef(a, b, {}, m, k, n);
      std::vector<float> c(m * n, 0.0f);
      GemmBF16(ta, tb, m, n, k, as.data(), ta ? m : k, bs.data(), tb ? k : n, false, c.data(), n);
      ExpectForward("bf16 gemm", c, want);
      GemmBF16(ta, tb, m, n, k, as.data(), ta ? m : k, bs.data(), tb ? k : n, true, c.data(), n);
      for (double& w : want) w *= 2;
      ExpectForward("bf16 gemm accumulate", c, want);
    }
  }
}

// C in bf16: what the f32-C GEMM gives, rounded once to bf16 (within one
// bf16 unit: the primitive may sum in another order), accumulating into the
// widened C when asked, for every transposition, with a padded ldc whose
// padding stays untouched.
TEST(Kernels, Bf16GemmIntoBf16CIsTheF32ResultRoundedOnce) {
  const int64_t m = 19, n = 23, k = 37, ldc = n + 5;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Vec a = Random(m * k, 210), b = Random(k * n, 211), c0 = Random(m * n, 212);
      std::vector<BF16> as(a.size()), bs(b.size());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p) as[ta ? p * m + i : i * k + p] = FloatToBF16(static_cast<float>(a[i * k + p]));
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < n; ++j) bs[tb ? j * k + p : p * n + j] = FloatToBF16(static_cast<float>(b[p * n + j]));
      for (bool acc : {false, true}) {
        const BF16 pad = FloatToBF16(7.0f);
        std::vector<BF16> c16(m * ldc, pad);
        std::vector<float> c32(m * n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            c16[i * ldc + j] = FloatToBF16(static_cast<float>(c0[i * n + j]));
            c32[i * n + j] = BF16ToFloat(c16[i * ldc + j]);
          }
        }
        GemmBF16(ta, tb, m, n, k, as.data(), ta ? m : k, bs.data(), tb ? k : n, acc, c32.data(), n);
        GemmBF16(ta, tb, m, n, k, as.data(), ta ? m : k, bs.data(), tb ? k : n, acc, c16.data(), ldc);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const float got = BF16ToFloat(c16[i * ldc + j]), want = c32[i * n + j];
            // One bf16 unit in the last place of the larger magnitude.
            const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(got), std::fabs(want))) - 7);
            ASSERT_LE(std::fabs(got - want), ulp) << "ta " << ta << " tb " << tb << " acc " << acc
                                                  << " [" << i << "," << j << "]";
          }
          for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c16[i * ldc + j].bits, pad.bits) << "padding";
        }
      }
    }
  }
}

// The bias added inside the matmul: C = op(A) op(B) + bias within the f32
// summation bound of the f64 result ((k + 1) u32 of the sum of magnitudes,
// the bias one more term), then one rounding of a bf16 C; C in bf16 or f32,
// every transposition, a padded ldc whose padding stays untouched, odd
// shapes, the models' k (up to 1536, where oneDNN blocks the sum over k) and
// k = 0 (C = bias). Where oneDNN does not block k the bits are those of the
// bias written into C and the product accumulated onto it (the two-op form);
// for k >= 1024 the bias may join the sum at another point (seen here at
// 1024x256x1024), so only the bound is promised.
TEST(Kernels, Bf16GemmBiasIsTheProductPlusTheBiasRoundedOnce) {
  struct Shape { int64_t m, n, k; };
  // Outputs kept small (the f64 reference is m n k per transposition; the
  // suite runs under tsan), k at the models' sizes.
  for (Shape sh : {Shape{19, 23, 37}, Shape{64, 48, 96}, Shape{96, 128, 256}, Shape{64, 96, 1024},
                   Shape{48, 64, 1536}, Shape{7, 5, 0}}) {
    const int64_t m = sh.m, n = sh.n, k = sh.k, ldc = n + 3;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Vec a = Random(m * k, 220), b = Random(k * n, 221), bias = Random(n, 222, 4.0);
        std::vector<BF16> as(a.size()), bs(b.size()), bias16(n);
        Vec ar(a.size()), br(b.size());  // the bf16 values, in double
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t p = 0; p < k; ++p) {
            as[ta ? p * m + i : i * k + p] = FloatToBF16(static_cast<float>(a[i * k + p]));
            ar[i * k + p] = BF16ToFloat(as[ta ? p * m + i : i * k + p]);
          }
        }
        for (int64_t p = 0; p < k; ++p) {
          for (int64_t j = 0; j < n; ++j) {
            bs[tb ? j * k + p : p * n + j] = FloatToBF16(static_cast<float>(b[p * n + j]));
            br[p * n + j] = BF16ToFloat(bs[tb ? j * k + p : p * n + j]);
          }
        }
        for (int64_t j = 0; j < n; ++j) bias16[j] = FloatToBF16(static_cast<float>(bias[j]));
        const BF16 pad = FloatToBF16(7.0f);
        std::vector<BF16> c16(m * ldc, pad);
        std::vector<float> c32(m * ldc, 7.0f);
        GemmBF16Bias(ta, tb, m, n, k, as.data(), ta ? m : k, bs.data(), tb ? k : n, bias16.data(),
                     c16.data(), ldc);
        GemmBF16Bias(ta, tb, m, n, k, as.data(), ta ? m : k, bs.data(), tb ? k : n, bias16.data(),
                     c32.data(), ldc);
        // The exact result per row (row i of op(A) against every column).
        std::vector<double> exact(n), mag(n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            exact[j] = BF16ToFloat(bias16[j]);
            mag[j] = std::fabs(exact[j]);
          }
          for (int64_t p = 0; p < k; ++p) {
            const double av = ar[i * k + p];
            for (int64_t j = 0; j < n; ++j) {
              exact[j] += av * br[p * n + j];
              mag[j] += std::fabs(av * br[p * n + j]);
            }
          }
          for (int64_t j = 0; j < n; ++j) {
            const double f32_bound = (k + 1) * std::ldexp(1.0, -24) * mag[j];
            ASSERT_NEAR(c32[i * ldc + j], exact[j], f32_bound)
                << m << "x" << n << "x" << k << " f32 C, ta " << ta << " tb " << tb << " [" << i << "," << j << "]";
            // A bf16 C: that f32 sum rounded once (half a bf16 unit, 2^-8
            // relative at most; more where the sum is subnormal in bf16).
            const double got = BF16ToFloat(c16[i * ldc + j]);
            ASSERT_NEAR(got, exact[j], f32_bound + std::ldexp(std::fabs(exact[j]) + f32_bound, -8))
                << m << "x" << n << "x" << k << " bf16 C, ta " << ta << " tb " << tb << " [" << i << "," << j << "]";
          }
          for (int64_t j = n; j < ldc; ++j) {
            ASSERT_EQ(c16[i * ldc + j].bits, pad.bits) << "padding";
            ASSERT_EQ(c32[i * ldc + j], 7.0f) << "padding";
          }
        }
      }
    }
  }
}

// Ranks as threads run the same cached bf16 matmul primitives at once (two
// FSDP ranks' weight gradients, same shapes). Every thread's result must be
// the bits one thread alone computes: oneDNN's default (library) scratchpad
// is shared by all primitives and must not be used by two executions at
// once, so the primitives take a scratchpad of the calling thread's. Shapes
// with few output elements and long sums (weight gradients), where oneDNN
// splits the sum over its threads into scratchpad partials, and transposed
// operands, which it packs into scratchpad, are the ones a shared
// scratchpad corrupts.
TEST(Kernels, Bf16GemmFromSeveralThreadsAtOnceGivesOneThreadsBits) {
  struct Shape {
    bool ta, tb;
    int64_t m, n, k;
  };
  const std::vector<Shape> shapes = {
      {true, false, 16, 16, 8192}, {true, false, 64, 48, 2048}, {false, true, 96, 80, 512},
      {false, false, 128, 128, 256}};
  constexpr int kThreads = 4, kRepeats = 20;
  for (const Shape& sh : shapes) {
    // Per thread its own operands (different values, same shape).
    std::vector<std::vector<BF16>> as(kThreads), bs(kThreads);
    std::vector<std::vector<float>> want(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      Vec a = Random(sh.m * sh.k, 300 + t), b = Random(sh.k * sh.n, 400 + t);
      for (double x : a) as[t].push_back(FloatToBF16(static_cast<float>(x)));
      for (double x : b) bs[t].push_back(FloatToBF16(static_cast<float>(x)));
      want[t].assign(sh.m * sh.n, 0.0f);
      GemmBF16(sh.ta, sh.tb, sh.m, sh.n, sh.k, as[t].data(), sh.ta ? sh.m : sh.k, bs[t].data(),
               sh.tb ? sh.k : sh.n, false, want[t].data(), sh.n);
    }
    std::vector<int> wrong(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<float> c(sh.m * sh.n);
        for (int r = 0; r < kRepeats; ++r) {
          GemmBF16(sh.ta, sh.tb, sh.m, sh.n, sh.k, as[t].data(), sh.ta ? sh.m : sh.k,
                   bs[t].data(), sh.tb ? sh.k : sh.n, false, c.data(), sh.n);
          if (std::memcmp(c.data(), want[t].data(), c.size() * sizeof(float)) != 0) ++wrong[t];
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_EQ(wrong[t], 0) << "thread " << t << ": " << wrong[t] << " of " << kRepeats
                             << " concurrent bf16 GEMMs (" << (sh.ta ? "T" : "N") << (sh.tb ? "T" : "N")
                             << " " << sh.m << "x" << sh.n << "x" << sh.k
                             << ") differ from the single-threaded result";
    }
  }
}

// oneDNN runs bf16 GEMMs on bf16 dot-product hardware exactly where the
// kernel flags in /proc/cpuinfo show it; the CPU backend prefers that matmul
// to widening where it has AMX or the CPU is not Intel's (kernels.h:
// NativeBf16Gemm), and SetNativeBf16Gemm overrides that, never past the
// hardware.
TEST(Kernels, Bf16GemmPathFollowsTheCpuFlags) {
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line;
  bool bf16 = false, amx = false, intel = false;
  while (std::getline(in, line)) {
    if (line.rfind("vendor_id", 0) == 0) intel = line.find("GenuineIntel") != std::string::npos;
    if (line.rfind("flags", 0) != 0) continue;
    amx = line.find(" amx_bf16") != std::string::npos;
    bf16 = line.find(" avx512_bf16") != std::string::npos || amx;
    break;
  }
  EXPECT_EQ(Bf16GemmHardware(), bf16);
  EXPECT_EQ(NativeBf16Gemm(), bf16 && (amx || !intel));
  const bool before = SetNativeBf16Gemm(true);
  EXPECT_EQ(before, bf16 && (amx || !intel));
  EXPECT_EQ(NativeBf16Gemm(), bf16);
  EXPECT_EQ(SetNativeBf16Gemm(false), bf16);
  EXPECT_FALSE(NativeBf16Gemm());
  SetNativeBf16Gemm(before);
  EXPECT_EQ(NativeBf16Gemm(), before);
}

TEST(Kernels, LinearBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, in = 4, out = 5;
  Vec x = Random(rows * in, 10), w = Random(in * out, 11), b = Random(out, 12),
      dy = Random(rows * out, 13);
  std::vector<float> y(rows * out);
  auto xf = ToF32(x), wf = ToF32(w), bf = ToF32(b), dyf = ToF32(dy);
  LinearForward(xf.data(), wf.data(), bf.data(), rows, in, out, y.data());
  ExpectForward("y", y, LinearRef(x, w, b, rows, in, out));
  std::vector<float> dx(rows * in, 0.0f), dw(in * out, 0.0f), db(out, 0.0f);
  LinearBackward(xf.data(), wf.data(), dyf.data(), rows, in, out, dx.data(), false, dw.data(),
                 db.data());
  auto loss = [&] { return Dot(LinearRef(x, w, b, rows, in, out), dy); };
  ExpectGradient("dx", x, dx, loss);
  ExpectGradient("dw", w, dw, loss);
  ExpectGradient("db", b, db, loss);
}

TEST(Kernels, LinearBackwardAccumulatesIntoParameterGradients) {
  const int64_t rows = 2, in = 3, out = 2;
  auto x = ToF32(Random(rows * in, 20)), w = ToF32(Random(in * out, 21)),
       dy = ToF32(Random(rows * out, 22));
  std::vector<float> dx(rows * in), dw1(in * out, 0.0f), db1(out, 0.0f);
  LinearBackward(x.data(), w.data(), dy.data(), rows, in, out, dx.data(), false, dw1.data(), db1.data());
  std::vector<float> dw2 = dw1, db2 = db1, dx2 = dx;
  LinearBackward(x.data(), w.data(), dy.data(), rows, in, out, dx2.data(), true, dw2.data(), db2.data());
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2 * dw1[i]);
  for (size_t i = 0; i < db1.size(); ++i) EXPECT_FLOAT_EQ(db2[i], 2 * db1[i]);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx[i]);
}

TEST(Kernels, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 6;
  Vec x = Random(rows * cols, 30, 2.0), g = Random(cols, 31), b = Random(cols, 32),
      dy = Random(rows * cols, 33);
  auto xf = ToF32(x), gf = ToF32(g), bf = ToF32(b), dyf = ToF32(dy);
  std::vector<float> y(rows * cols), mean(rows), rstd(rows);
  LayerNormForward(xf.data(), gf.data(), bf.data(), rows, cols, y.data(), mean.data(), rstd.data());
  ExpectForward("y", y, LayerNormRef(x, g, b, rows, cols));
  std::vector<float> dx(rows * cols, 0.0f), dg(cols, 0.0f), db(cols, 0.0f);
  LayerNormBackward(xf.data(), gf.data(), dyf.data(), mean.data(), rstd.data(), rows, cols,
                    dx.data(), dg.data(), db.data());
  auto loss = [&] { return Dot(LayerNormRef(x, g, b, rows, cols), dy); };
  ExpectGradient("dx", x, dx, loss);
  ExpectGradient("dgamma", g, dg, loss);
  ExpectGradient("dbeta", b, db, loss);
}

TEST(Kernels, GeluBackwardMatchesFiniteDifferences) {
  Vec x = Random(40, 40, 4.0), dy = Random(40, 41);
  auto xf = ToF32(x), dyf = ToF32(dy);
  std::vector<float> y(40), dx(40);
  GeluForward(xf.data(), 40, y.data());
  ExpectForward("y", y, GeluRef(x));
  GeluBackward(xf.data(), dyf.data(), 40, dx.data());
  ExpectGradient("dx", x, dx, [&] { return Dot(GeluRef(x), dy); });
}

TEST(Kernels, SoftmaxBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 7;
  Vec x = Random(rows * cols, 50, 3.0), dy = Random(rows * cols, 51);
  auto xf = ToF32(x), dyf = ToF32(dy);
  std::vector<float> y(rows * cols), dx(rows * cols);
  SoftmaxForward(xf.data(), rows, cols, y.data());
  ExpectForward("y", y, SoftmaxRef(x, rows, cols));
  SoftmaxBackward(y.data(), dyf.data(), rows, cols, dx.data());
  ExpectGradient("dx", x, dx, [&] { return Dot(SoftmaxRef(x, rows, cols), dy); });
}

void CheckAttention(const AttentionShape& s, uint32_t seed) {
  const int64_t c = s.heads * s.head_dim;
  Vec q = Random(s.batch * s.q_len * c, seed), k = Random(s.batch * s.kv_len * c, seed + 1),
      v = Random(s.batch * s.kv_len * c, seed + 2), dout = Random(s.batch * s.q_len * c, seed + 3);
  auto qf = ToF32(q), kf = ToF32(k), vf = ToF32(v), dof = ToF32(dout);
  std::vector<float> probs(s.batch * s.heads * s.q_len * s.kv_len), out(s.batch * s.q_len * c);
  AttentionForward(s, qf.data(), c, kf.data(), c, vf.data(), c, probs.data(), out.data(), c);
  ExpectForward("out", out, AttentionRef(q, k, v, s));
  std::vector<float> dq(qf.size()), dk(kf.size()), dv(vf.size()), scratch(s.q_len * s.kv_len);
  AttentionBackward(s, qf.data(), c, kf.data(), c, vf.data(), c, probs.data(), dof.data(), c,
                    dq.data(), c, dk.data(), c, dv.data(), c, scratch.data());
  auto loss = [&] { return Dot(AttentionRef(q, k, v, s), dout); };
  ExpectGradient("dq", q, dq, loss);
  ExpectGradient("dk", k, dk, loss);
  ExpectGradient("dv", v, dv, loss);
}

TEST(Kernels, CausalSelfAttentionBackwardMatchesFiniteDifferences) {
  AttentionShape s{2, 2, 4, 4, 3, true};
  CheckAttention(s, 60);
}

TEST(Kernels, NonCausalSelfAttentionBackwardMatchesFiniteDifferences) {
  AttentionShape s{2, 2, 4, 4, 3, false};
  CheckAttention(s, 70);
}

TEST(Kernels, CrossAttentionWithDifferentLengthsMatchesFiniteDifferences) {
  AttentionShape s{2, 3, 3, 5, 2, false};
  CheckAttention(s, 80);
}

// Causal attention runs in blocks of 32 query rows that see only the keys
// up to their diagonal: 150 positions give four full blocks and a ragged one.
// Forward against the f64 reference; backward as directional derivatives
// (the gradient's dot product with a random direction against a central
// difference of the f64 loss along it: one check per input, all elements).
TEST(Kernels, BlockedCausalAttentionMatchesReferenceAcrossQueryBlocks) {
  const AttentionShape s{2, 2, 150, 150, 8, true};
  const int64_t c = s.heads * s.head_dim, n = s.batch * s.q_len * c;
  Vec q = Random(n, 100), k = Random(n, 101), v = Random(n, 102), dout = Random(n, 103);
  auto qf = ToF32(q), kf = ToF32(k), vf = ToF32(v), dof = ToF32(dout);
  std::vector<float> probs(s.batch * s.heads * s.q_len * s.kv_len, -1.0f), out(n);
  AttentionForward(s, qf.data(), c, kf.data(), c, vf.data(), c, probs.data(), out.data(), c);
  ExpectForward("out", out, AttentionRef(q, k, v, s));
  for (int64_t i = 0; i < s.q_len; ++i) {
    for (int64_t j = i + 1; j < s.kv_len; ++j) ASSERT_EQ(probs[i * s.kv_len + j], 0.0f) << i << "," << j;
  }
  std::vector<float> dq(n, 7.0f), dk(n, 7.0f), dv(n, 7.0f), scratch(s.q_len * s.kv_len);
  AttentionBackward(s, qf.data(), c, kf.data(), c, vf.data(), c, probs.data(), dof.data(), c, dq.data(), c,
                    dk.data(), c, dv.data(), c, scratch.data());
  const Vec dir = Random(n, 104);
  for (auto [name, x, grad] : {std::tuple{"dq", &q, &dq}, std::tuple{"dk", &k, &dk}, std::tuple{"dv", &v, &dv}}) {
    const double eps = 1e-5;
    Vec saved = *x;
    for (int64_t i = 0; i < n; ++i) (*x)[i] = saved[i] + eps * dir[i];
    const double lp = Dot(AttentionRef(q, k, v, s), dout);
    for (int64_t i = 0; i < n; ++i) (*x)[i] = saved[i] - eps * dir[i];
    const double lm = Dot(AttentionRef(q, k, v, s), dout);
    *x = saved;
    double analytic = 0;
    for (int64_t i = 0; i < n; ++i) analytic += (*grad)[i] * dir[i];
    const double fd = (lp - lm) / (2 * eps);
    EXPECT_NEAR(analytic, fd, 1e-3 * std::max(1.0, std::fabs(fd))) << name;
  }
}

// Attention's forward and backward in double, with each result's magnitude
// (the sum of its terms' absolute values, propagated through the softmax and
// its gradient) for a rounding bound. q [B*Tq, H*D], k, v [B*Tk, H*D], dout
// like q; all packed (row stride H*D).
struct AttnExact {
  Vec probs, out, dq, dk, dv;                   // values
  Vec probs_mag, out_mag, dq_mag, dk_mag, dv_mag;  // magnitudes
};

AttnExact AttentionExact(const AttentionShape& s, const Vec& q, const Vec& k, const Vec& v,
                         const Vec& dout) {
  const int64_t c = s.heads * s.head_dim, D = s.head_dim, Tq = s.q_len, Tk = s.kv_len;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  AttnExact r;
  r.probs.assign(s.batch * s.heads * Tq * Tk, 0.0);
  r.probs_mag = r.probs;
  r.out.assign(s.batch * Tq * c, 0.0);
  r.out_mag = r.dq = r.dq_mag = r.out;
  r.dk.assign(s.batch * Tk * c, 0.0);
  r.dk_mag = r.dv = r.dv_mag = r.dk;
  auto Q = [&](int64_t b, int64_t i, int64_t h, int64_t e) { return (b * Tq + i) * c + h * D + e; };
  auto K = [&](int64_t b, int64_t j, int64_t h, int64_t e) { return (b * Tk + j) * c + h * D + e; };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t base = (b * s.heads + h) * Tq * Tk;
      Vec p(Tq * Tk, 0.0), smag(Tq * Tk, 0.0), dp(Tq * Tk, 0.0), dpmag(Tq * Tk, 0.0),
          ds(Tq * Tk, 0.0), dsmag(Tq * Tk, 0.0);
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t valid = s.causal ? i + 1 : Tk;
        double m = -1e300, z = 0;
        for (int64_t j = 0; j < valid; ++j) {
          double dot = 0, mag = 0;
          for (int64_t e = 0; e < D; ++e) {
            dot += q[Q(b, i, h, e)] * k[K(b, j, h, e)];
            mag += std::fabs(q[Q(b, i, h, e)] * k[K(b, j, h, e)]);
          }
          p[i * Tk + j] = dot * scale;
          smag[i * Tk + j] = mag * scale;
          m = std::max(m, p[i * Tk + j]);
        }
        for (int64_t j = 0; j < valid; ++j) z += (p[i * Tk + j] = std::exp(p[i * Tk + j] - m));
        double rowdot = 0, rowdot_mag = 0;
        for (int64_t j = 0; j < valid; ++j) {
          p[i * Tk + j] /= z;
          for (int64_t e = 0; e < D; ++e) {
            dp[i * Tk + j] += dout[Q(b, i, h, e)] * v[K(b, j, h, e)];
            dpmag[i * Tk + j] += std::fabs(dout[Q(b, i, h, e)] * v[K(b, j, h, e)]);
          }
          rowdot += p[i * Tk + j] * dp[i * Tk + j];
          rowdot_mag += p[i * Tk + j] * dpmag[i * Tk + j];
        }
        for (int64_t j = 0; j < valid; ++j) {
          const double pij = p[i * Tk + j];
          // A score's absolute error e moves p by about p * 2e (its own and
          // the max's); the row's sum and the exp add relative errors.
          r.probs[base + i * Tk + j] = pij;
          r.probs_mag[base + i * Tk + j] = pij * (2 * smag[i * Tk + j] + 1.0);
          ds[i * Tk + j] = scale * pij * (dp[i * Tk + j] - rowdot);
          dsmag[i * Tk + j] = scale * pij * (dpmag[i * Tk + j] + rowdot_mag);
        }
      }
      for (int64_t i = 0; i < Tq; ++i) {
        for (int64_t j = 0; j < Tk; ++j) {
          for (int64_t e = 0; e < D; ++e) {
            const double pij = p[i * Tk + j], dsij = ds[i * Tk + j];
            r.out[Q(b, i, h, e)] += pij * v[K(b, j, h, e)];
            r.out_mag[Q(b, i, h, e)] += std::fabs(pij * v[K(b, j, h, e)]);
            r.dv[K(b, j, h, e)] += pij * dout[Q(b, i, h, e)];
            r.dv_mag[K(b, j, h, e)] += std::fabs(pij * dout[Q(b, i, h, e)]);
            r.dq[Q(b, i, h, e)] += dsij * k[K(b, j, h, e)];
            r.dq_mag[Q(b, i, h, e)] += dsmag[i * Tk + j] * std::fabs(k[K(b, j, h, e)]);
            r.dk[K(b, j, h, e)] += dsij * q[Q(b, i, h, e)];
            r.dk_mag[K(b, j, h, e)] += dsmag[i * Tk + j] * std::fabs(q[Q(b, i, h, e)]);
          }
        }
      }
    }
  }
  return r;
}

// The attention kernels on awkward shapes against AttentionExact: head
// dims that are no multiple of a vector (24, 40, 80, 1), lengths that are no
// multiple of the 32-row query block, cross attention, batch > 1, heads
// split into groups; q, k, v
// interleaved in one buffer with padding columns and dq, dk, dv likewise
// (row strides larger than heads * head_dim, as fused projections pass
// them), outputs pre-filled with garbage (they must be overwritten) and the
// padding checked untouched; on every ISA the vector loops offer.
// Tolerance: f32 rounding of length-n sums is at most n u times the sum of
// the terms' magnitudes (u = 2^-24), with n the longest reduction (kv + d)
// and a factor 8 for the vector exp (~2 ulp) and the softmax's steps.
TEST(Kernels, AttentionMatchesExactReferenceOnAwkwardShapesStridesAndIsas) {
  const AttentionShape shapes[] = {
      {3, 2, 70, 70, 24, true},  {2, 3, 45, 45, 40, true},  {2, 2, 37, 53, 80, false},
      {1, 2, 64, 64, 32, false}, {2, 1, 33, 33, 1, true},   {1, 3, 129, 129, 16, true},
      // Backward splits these heads 2 + 1 (a group's copies stay within the
      // per-thread scratch budget of 1 Mi floats).
      {1, 3, 70, 70, 1024, true},
  };
  const double u = std::ldexp(1.0, -24);
  uint32_t seed = 300;
  for (const AttentionShape& s : shapes) {
    const int64_t c = s.heads * s.head_dim, pad = 5, ld = 3 * c + pad, ldo = c + 3;
    const int64_t nq = s.batch * s.q_len, nk = s.batch * s.kv_len;
    Vec q = Random(nq * c, seed++), k = Random(nk * c, seed++), v = Random(nk * c, seed++),
        dout = Random(nq * c, seed++);
    const AttnExact want = AttentionExact(s, q, k, v, dout);
    const double tol = 8 * static_cast<double>(s.kv_len + s.head_dim) * u;
    // Inputs: q in columns [0, c) of an [nq, ld] buffer, k and v in [c, 2c)
    // and [2c, 3c) of an [nk, ld] one; padding holds a sentinel.
    constexpr float kSentinel = -1234.5f;
    std::vector<float> qbuf(nq * ld, kSentinel), kvbuf(nk * ld, kSentinel), dobuf(nq * ldo, kSentinel);
    for (int64_t r = 0; r < nq; ++r) {
      for (int64_t j = 0; j < c; ++j) {
        qbuf[r * ld + j] = static_cast<float>(q[r * c + j]);
        dobuf[r * ldo + j] = static_cast<float>(dout[r * c + j]);
      }
    }
    for (int64_t r = 0; r < nk; ++r) {
      for (int64_t j = 0; j < c; ++j) {
        kvbuf[r * ld + c + j] = static_cast<float>(k[r * c + j]);
        kvbuf[r * ld + 2 * c + j] = static_cast<float>(v[r * c + j]);
      }
    }
    for (simd::Isa isa : simd::RunnableIsas()) {
      const simd::Isa before = simd::SetIsa(isa);
      const std::string what = std::string(simd::IsaName(isa)) + " B" + std::to_string(s.batch) +
                               " H" + std::to_string(s.heads) + " Tq" + std::to_string(s.q_len) +
                               " Tk" + std::to_string(s.kv_len) + " D" + std::to_string(s.head_dim) +
                               (s.causal ? " causal" : "");
      std::vector<float> probs(want.probs.size(), 7.0f), out(nq * ldo, kSentinel);
      for (int64_t r = 0; r < nq; ++r) {
        for (int64_t j = 0; j < c; ++j) out[r * ldo + j] = 7.0f;
      }
      AttentionForward(s, qbuf.data(), ld, kvbuf.data() + c, ld, kvbuf.data() + 2 * c, ld,
                       probs.data(), out.data(), ldo);
      for (size_t i = 0; i < probs.size(); ++i) {
        if (want.probs[i] == 0.0) {
          ASSERT_EQ(probs[i], 0.0f) << what << " masked probs[" << i << "]";
        } else {
          ASSERT_NEAR(probs[i], want.probs[i], tol * want.probs_mag[i]) << what << " probs[" << i << "]";
        }
      }
      // dq, dk, dv: columns [0, c), [c, 2c), [2c, 3c) of one [rows, ld]
      // buffer per length (q rows and kv rows), garbage before the call.
      std::vector<float> dqbuf(nq * ld, kSentinel), dkvbuf(nk * ld, kSentinel);
      for (int64_t r = 0; r < nq; ++r) {
        for (int64_t j = 0; j < c; ++j) dqbuf[r * ld + j] = 7.0f;
      }
      for (int64_t r = 0; r < nk; ++r) {
        for (int64_t j = c; j < 3 * c; ++j) dkvbuf[r * ld + j] = 7.0f;
      }
      std::vector<float> scratch(s.q_len * s.kv_len);
      AttentionBackward(s, qbuf.data(), ld, kvbuf.data() + c, ld, kvbuf.data() + 2 * c, ld,
                        probs.data(), dobuf.data(), ldo, dqbuf.data(), ld, dkvbuf.data() + c, ld,
                        dkvbuf.data() + 2 * c, ld, scratch.data());
      auto check = [&](const char* name, const std::vector<float>& buf, int64_t stride, int64_t offset,
                       int64_t rows, const Vec& value, const Vec& mag, int64_t first_pad,
                       int64_t last_pad) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < c; ++j) {
            const double got = buf[r * stride + offset + j], w = value[r * c + j];
            ASSERT_NEAR(got, w, tol * mag[r * c + j] + 1e-30) << what << " " << name << "[" << r << "," << j << "]";
          }
          for (int64_t j = first_pad; j < last_pad; ++j) {
            ASSERT_EQ(buf[r * stride + j], kSentinel) << what << " " << name << " padding [" << r << "," << j << "]";
          }
        }
      };
      check("out", out, ldo, 0, nq, want.out, want.out_mag, c, ldo);
      check("dq", dqbuf, ld, 0, nq, want.dq, want.dq_mag, c, ld);
      check("dk", dkvbuf, ld, c, nk, want.dk, want.dk_mag, 3 * c, ld);
      check("dv", dkvbuf, ld, 2 * c, nk, want.dv, want.dv_mag, 3 * c, ld);
      simd::SetIsa(before);
    }
  }
}

// The bf16 attention kernels (bf16 dot products; kernels.h) against
// AttentionExact on bf16 inputs: lengths that are no multiple of the query
// block and odd (the VNNI pairs' zero padding), head dims from 2 to 80, cross
// attention, fused strides with padding. Bound per element: the f32
// tolerance of the f32 test, plus for out and dV what rounding P to bf16
// may add (u16 times the magnitude, the sum of |P V| or |P dO|; dQ and dK
// get no such term: dS stays f32), plus the output's own rounding
// (u16 |want|). Outputs are pre-filled and must be
// overwritten; padding must stay untouched. Where the kernels cannot run
// (odd head_dim, an odd stride of the operand read in 32-bit pairs, or no
// AVX512-BF16 here) they return false having written nothing.
TEST(Kernels, Bf16AttentionRoundsOnlyPAndEachOutputOnce) {
  struct Case {
    AttentionShape s;
    int64_t pad;  // extra columns per row of the fused buffers
  };
  const Case cases[] = {
      {{3, 2, 70, 70, 24, true}, 6},  {{2, 3, 45, 45, 40, true}, 2},
      {{2, 2, 37, 53, 80, false}, 4}, {{1, 2, 64, 64, 32, false}, 0},
      {{2, 1, 33, 33, 2, true}, 2},   {{1, 3, 129, 129, 16, true}, 8},
      {{1, 1, 1, 1, 2, true}, 2},     {{2, 2, 5, 17, 64, false}, 2},
      // Declined: odd head_dim; odd stride (k and v read in 32-bit pairs).
      {{1, 2, 9, 9, 3, true}, 2},     {{1, 2, 9, 9, 4, true}, 1},
  };
  const bool native = NativeBf16Attention();
  const double u = std::ldexp(1.0, -24), u16 = std::ldexp(1.0, -8);
  const uint16_t kSentinel = FloatToBF16(-1232.0f).bits;
  uint32_t seed = 700;
  for (const Case& cs : cases) {
    const AttentionShape& s = cs.s;
    const int64_t c = s.heads * s.head_dim, ld = 3 * c + cs.pad, ldo = c + cs.pad;
    const int64_t nq = s.batch * s.q_len, nk = s.batch * s.kv_len;
    auto rounded = [&](int64_t n) {
      Vec x = Random(n, seed++);
      for (double& e : x) e = BF16ToFloat(FloatToBF16(static_cast<float>(e)));
      return x;
    };
    const Vec q = rounded(nq * c), k = rounded(nk * c), v = rounded(nk * c), dout = rounded(nq * c);
    const bool runs = native && s.head_dim % 2 == 0 && ld % 2 == 0;
    const std::string what = "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) +
                             " Tq" + std::to_string(s.q_len) + " Tk" + std::to_string(s.kv_len) +
                             " D" + std::to_string(s.head_dim) + " ld " + std::to_string(ld);
    // q in columns [0, c) of an [nq, ld] buffer, k and v in [c, 2c) and
    // [2c, 3c) of an [nk, ld] one, dout [nq, ldo]; the rest sentinels.
    auto filled = [&](int64_t rows, int64_t stride) {
      return std::vector<BF16>(static_cast<size_t>(rows * stride), BF16{kSentinel});
    };
    std::vector<BF16> qbuf = filled(nq, ld), kvbuf = filled(nk, ld), dobuf = filled(nq, ldo);
    auto place = [](std::vector<BF16>& buf, int64_t stride, int64_t col, const Vec& x,
                    int64_t rows, int64_t cols) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          buf[r * stride + col + j] = FloatToBF16(static_cast<float>(x[r * cols + j]));
        }
      }
    };
    place(qbuf, ld, 0, q, nq, c);
    place(kvbuf, ld, c, k, nk, c);
    place(kvbuf, ld, 2 * c, v, nk, c);
    place(dobuf, ldo, 0, dout, nq, c);
    std::vector<float> probs(static_cast<size_t>(s.batch * s.heads * s.q_len * s.kv_len), 7.0f);
    std::vector<BF16> out = filled(nq, ldo), dqbuf = filled(nq, ld), dkvbuf = filled(nk, ld);
    ASSERT_EQ(AttentionForwardBF16(s, qbuf.data(), ld, kvbuf.data() + c, ld, kvbuf.data() + 2 * c,
                                   ld, probs.data(), out.data(), ldo),
              runs)
        << what;
    std::vector<float> scratch(static_cast<size_t>(s.q_len * s.kv_len));
    ASSERT_EQ(AttentionBackwardBF16(s, qbuf.data(), ld, kvbuf.data() + c, ld, kvbuf.data() + 2 * c,
                                    ld, probs.data(), dobuf.data(), ldo, dqbuf.data(), ld,
                                    dkvbuf.data() + c, ld, dkvbuf.data() + 2 * c, ld,
                                    scratch.data()),
              runs)
        << what;
    if (!runs) {
      for (const auto* buf : {&out, &dqbuf, &dkvbuf}) {
        for (BF16 x : *buf) ASSERT_EQ(x.bits, kSentinel) << what << ": declined but wrote";
      }
      for (float p : probs) ASSERT_EQ(p, 7.0f) << what << ": declined but wrote probs";
      continue;
    }
    const AttnExact want = AttentionExact(s, q, k, v, dout);
    const double tol = 8 * static_cast<double>(s.kv_len + s.head_dim) * u;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (want.probs[i] == 0.0) {
        ASSERT_EQ(probs[i], 0.0f) << what << " masked probs[" << i << "]";
      } else {
        ASSERT_NEAR(probs[i], want.probs[i], tol * want.probs_mag[i]) << what << " probs[" << i << "]";
      }
    }
    // Each output's columns against the bound; columns [first_pad,
    // last_pad) of its buffer (padding) still sentinels.
    auto check = [&](const char* name, const std::vector<BF16>& buf, int64_t stride, int64_t col,
                     int64_t rows, const Vec& value, const Vec& mag, bool rounded_p,
                     int64_t first_pad, int64_t last_pad) {
      const double operand = rounded_p ? u16 : 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < c; ++j) {
          const double w = value[r * c + j], m = mag[r * c + j];
          const double bound = u16 * std::fabs(w) + (1 + u16) * (tol + operand) * m + 1e-30;
          ASSERT_NEAR(BF16ToFloat(buf[r * stride + col + j]), w, bound)
              << what << " " << name << "[" << r << "," << j << "]";
        }
        for (int64_t j = first_pad; j < last_pad; ++j) {
          ASSERT_EQ(buf[r * stride + j].bits, kSentinel)
              << what << " " << name << " padding [" << r << "," << j << "]";
        }
      }
    };
    check("out", out, ldo, 0, nq, want.out, want.out_mag, true, c, ldo);
    check("dq", dqbuf, ld, 0, nq, want.dq, want.dq_mag, false, c, ld);
    check("dk", dkvbuf, ld, c, nk, want.dk, want.dk_mag, false, 0, c);
    check("dv", dkvbuf, ld, 2 * c, nk, want.dv, want.dv_mag, true, 3 * c, ld);
  }
  if (!native) GTEST_SKIP() << "no AVX512-BF16 here: only the declining cases ran";
}

// The kernels run on the calling thread only: results from several threads
// at once (ranks are threads) are one thread's bits.
TEST(Kernels, AttentionFromSeveralThreadsAtOnceGivesOneThreadsBits) {
  const AttentionShape s{2, 4, 96, 96, 32, true};
  const int64_t c = s.heads * s.head_dim, n = s.batch * s.q_len * c;
  const auto q = ToF32(Random(n, 500)), k = ToF32(Random(n, 501)), v = ToF32(Random(n, 502)),
             dout = ToF32(Random(n, 503));
  struct Result {
    std::vector<float> probs, out, dq, dk, dv;
  };
  auto run = [&] {
    Result r{std::vector<float>(s.batch * s.heads * s.q_len * s.kv_len), std::vector<float>(n),
             std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
    std::vector<float> scratch(s.q_len * s.kv_len);
    AttentionForward(s, q.data(), c, k.data(), c, v.data(), c, r.probs.data(), r.out.data(), c);
    AttentionBackward(s, q.data(), c, k.data(), c, v.data(), c, r.probs.data(), dout.data(), c,
                      r.dq.data(), c, r.dk.data(), c, r.dv.data(), c, scratch.data());
    return r;
  };
  const Result alone = run();
  std::vector<Result> results(3);
  std::vector<std::thread> threads;
  for (Result& r : results) threads.emplace_back([&r, &run] { r = run(); });
  for (std::thread& t : threads) t.join();
  for (const Result& r : results) {
    EXPECT_EQ(std::memcmp(r.probs.data(), alone.probs.data(), sizeof(float) * r.probs.size()), 0);
    EXPECT_EQ(std::memcmp(r.out.data(), alone.out.data(), sizeof(float) * n), 0);
    EXPECT_EQ(std::memcmp(r.dq.data(), alone.dq.data(), sizeof(float) * n), 0);
    EXPECT_EQ(std::memcmp(r.dk.data(), alone.dk.data(), sizeof(float) * n), 0);
    EXPECT_EQ(std::memcmp(r.dv.data(), alone.dv.data(), sizeof(float) * n), 0);
  }
}

TEST(Kernels, CausalAttentionIgnoresFutureKeys) {
  AttentionShape s{1, 1, 3, 3, 2, true};
  auto q = ToF32(Random(6, 90)), k = ToF32(Random(6, 91)), v = ToF32(Random(6, 92));
  std::vector<float> probs(9), out1(6), out2(6);
  AttentionForward(s, q.data(), 2, k.data(), 2, v.data(), 2, probs.data(), out1.data(), 2);
  k[4] += 5.0f;  // key and value of the last position change
  v[5] -= 3.0f;
  AttentionForward(s, q.data(), 2, k.data(), 2, v.data(), 2, probs.data(), out2.data(), 2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out1[i], out2[i]) << i;  // rows 0 and 1 unchanged
  EXPECT_NE(out1[5], out2[5]);
  EXPECT_EQ(probs[1], 0.0f);
  EXPECT_EQ(probs[2], 0.0f);
  EXPECT_EQ(probs[5], 0.0f);
}

TEST(Kernels, EmbeddingBackwardScatterAddsRepeatedIds) {
  const int64_t vocab = 4, dim = 3;
  Vec table = Random(vocab * dim, 100), dout = Random(5 * dim, 101);
  std::vector<int32_t> ids = {2, 0, 2, 3, 2};
  auto tf = ToF32(table), dof = ToF32(dout);
  std::vector<float> out(5 * dim), dtable(vocab * dim, 0.0f);
  EmbeddingForward(tf.data(), ids.data(), 5, dim, out.data());
  for (int n = 0; n < 5; ++n)
    for (int j = 0; j < dim; ++j) EXPECT_EQ(out[n * dim + j], tf[ids[n] * dim + j]);
  EmbeddingBackward(ids.data(), dof.data(), 5, dim, dtable.data());
  auto loss = [&] {
    double s = 0;
    for (int n = 0; n < 5; ++n)
      for (int j = 0; j < dim; ++j) s += table[ids[n] * dim + j] * dout[n * dim + j];
    return s;
  };
  ExpectGradient("dtable", table, dtable, loss);
}

TEST(Kernels, CrossEntropyBackwardMatchesFiniteDifferencesAndSkipsIgnoredRows) {
  const int64_t rows = 4, vocab = 6;
  Vec logits = Random(rows * vocab, 110, 3.0);
  std::vector<int32_t> t = {1, kIgnoreTarget, 5, 0};
  auto lf = ToF32(logits);
  int64_t count = 0;
  float loss = CrossEntropyForward(lf.data(), t.data(), rows, vocab, &count);
  EXPECT_EQ(count, 3);
  EXPECT_NEAR(loss, CrossEntropyRef(logits, t, rows, vocab), 1e-5);
  std::vector<float> d(rows * vocab);
  CrossEntropyBackward(lf.data(), t.data(), rows, vocab, 1.0f / count, d.data());
  for (int j = 0; j < vocab; ++j) EXPECT_EQ(d[1 * vocab + j], 0.0f);
  ExpectGradient("dlogits", logits, d, [&] { return CrossEntropyRef(logits, t, rows, vocab); });
}

TEST(Kernels, BF16RoundingAndAccumulationRoundToNearestEven) {
  std::vector<float> x = {1.0f, 1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f};
  RoundToBF16InPlace(x.data(), 3);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], 1.0f);                  // tie rounds to the even mantissa
  EXPECT_EQ(x[2], 1.0f + 4.0f / 256.0f);  // tie rounds up to even
  BF16 acc[1] = {FloatToBF16(2.0f)};
  float add = 0.5f;
  AccumulateFromF32(&add, 1, acc, DType::kBF16);
  EXPECT_EQ(BF16ToFloat(acc[0]), 2.5f);
}

}  // namespace
}  // namespace sk
