// The backend conformance suite: every op of runtime/ops/ops.h, for every
// dtype it accepts, over awkward shapes (empty, 1, primes, sizes that are not
// multiples of 16), against a reference computed in double on the host.
//
// Parameterised by device kind: it runs for cpu, and for cuda wherever a GPU
// and a registered CUDA op backend exist (skipping cleanly otherwise). Inputs
// travel to the device and results back through the copy op, so the suite
// only needs the op layer.
//
// Tolerances (relative to the reference's scale, per output dtype):
// - f32 results: 2e-6 per reduced term (sqrt(terms) scaling for sums, a
//   floor of 1e-5) -- f32 arithmetic with any summation order.
// - results stored in bf16 / f16: one unit in the last place of the output
//   type (2^-8 / 2^-11 relative): f32 arithmetic then round-to-nearest-even
//   may double-round against the f64 reference.
// - transcendental ops (gelu, softmax, layer norm, cross-entropy, attention):
//   1e-5 relative plus 1e-6 absolute (f32 exp/sqrt).
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/ops/classifier.h"
#include "runtime/ops/cpu/cpu_backend.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/math.h"
#include "runtime/ops/ops.h"

namespace sk::ops {
namespace {

using Vec = std::vector<double>;

// ---- Environment: a device, its stream and allocator -----------------------

struct Env {
  Device* device = nullptr;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<CachingAllocator> caching;
  std::unique_ptr<Allocator> alloc;
  OpContext ctx;
};

std::string KindName(DeviceKind k) { return k == DeviceKind::kCpu ? "cpu" : "cuda"; }

// Runs body once per path the CPU backend has for bf16 GEMMs here
// (cpu/kernels.h: NativeBf16Gemm): oneDNN's bf16 matmul where the hardware
// has one, and the operands widened to f32 for the f32 GEMM; the CPU's
// default is restored after. Once for other device kinds.
template <typename Body>
void ForEachBf16GemmPath(DeviceKind kind, Body body) {
  if (kind != DeviceKind::kCpu) {
    body();
    return;
  }
  const bool before = NativeBf16Gemm();
  for (bool native : {true, false}) {
    if (native && !Bf16GemmHardware()) continue;
    SetNativeBf16Gemm(native);
    SCOPED_TRACE(native ? "bf16 GEMMs in oneDNN's bf16 matmul" : "bf16 GEMMs widened to f32");
    body();
    if (::testing::Test::HasFatalFailure()) break;
  }
  SetNativeBf16Gemm(before);
}

class Conformance : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    const DeviceKind kind = GetParam();
    if (kind == DeviceKind::kCuda) {
      if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
      if (BackendFor(kind) == nullptr) GTEST_SKIP() << "no CUDA op backend registered";
    }
    auto dev = Device::Get(DeviceId{kind, 0});
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    env_.device = *dev;
    if (kind == DeviceKind::kCpu) {
      env_.alloc = std::make_unique<HostAllocator>();
    } else {
      auto s = env_.device->CreateStream("conformance");
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      env_.stream = std::move(*s);
      env_.caching = std::make_unique<CachingAllocator>(env_.device);
      env_.alloc = std::make_unique<StreamAllocator>(env_.caching.get(), env_.stream.get());
    }
    env_.ctx = OpContext{env_.device, env_.stream.get(), env_.alloc.get()};
  }

  const OpContext& ctx() const { return env_.ctx; }

  // A device tensor holding `v` rounded to `t`.
  Tensor Up(const Vec& v, DType t, Shape shape = Shape{}) {
    if (shape.rank() == 0 && v.size() != 1) shape = Shape{static_cast<int64_t>(v.size())};
    auto host = HostAllocator::Default().Empty(t, shape);
    EXPECT_TRUE(host.ok());
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == DType::kI32) {
        host->data_as<int32_t>()[i] = static_cast<int32_t>(v[i]);
      } else if (t == DType::kF64) {
        host->data_as<double>()[i] = v[i];
      } else {
        StoreFromFloat(host->data(), t, i, static_cast<float>(v[i]));
      }
    }
    auto dev = env_.alloc->Empty(t, shape);
    EXPECT_TRUE(dev.ok());
    Status s = Copy(ctx(), *host, *dev);
    EXPECT_TRUE(s.ok()) << s.ToString();
    Sync();
    return *dev;
  }

  Vec Down(const Tensor& dev) {
    auto host = HostAllocator::Default().Empty(dev.dtype(), dev.shape());
    EXPECT_TRUE(host.ok());
    Status s = Copy(ctx(), dev, *host);
    EXPECT_TRUE(s.ok()) << s.ToString();
    Sync();
    Vec out(static_cast<size_t>(dev.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (dev.dtype() == DType::kI32) {
        out[i] = host->data_as<int32_t>()[i];
      } else if (dev.dtype() == DType::kF64) {
        out[i] = host->data_as<double>()[i];
      } else {
        out[i] = LoadAsFloat(host->data(), dev.dtype(), i);
      }
    }
    return out;
  }

  void Sync() {
    if (env_.stream) {
      ASSERT_TRUE(env_.stream->Synchronize().ok());
    }
  }

  Env env_;
};

// ---- References and comparisons --------------------------------------------

Vec Random(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// v rounded to t (what a tensor of t holds), back in double.
double R(double v, DType t) {
  switch (t) {
    case DType::kBF16: return BF16ToFloat(FloatToBF16(static_cast<float>(v)));
    case DType::kF16: return F16ToFloat(FloatToF16(static_cast<float>(v)));
    default: return static_cast<float>(v);
  }
}
Vec R(const Vec& v, DType t) {
  Vec o(v);
  for (double& x : o) x = R(x, t);
  return o;
}

double Ulp(DType t) {
  switch (t) {
    case DType::kBF16: return 1.0 / 256;
    case DType::kF16: return 1.0 / 2048;
    default: return 2e-6;
  }
}

void ExpectNear(const char* what, const Vec& got, const Vec& want, double rel, double abs = 0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::max(std::fabs(want[i]), 1e-3 * scale) + abs;
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i << " of " << got.size();
  }
}

// Tolerance for an f32 sum of `terms` products.
double SumTol(int64_t terms) { return std::max(1e-5, 2e-6 * std::sqrt(static_cast<double>(terms))); }

const DType kFloats[] = {DType::kF32, DType::kBF16, DType::kF16};
const int64_t kSizes[] = {0, 1, 7, 13, 17, 33};

// (rows, cols) pairs: every kSizes row count with every one of `cols`, then
// `extra`. The extras reach the CUDA kernels' other launch branches
// (runtime/ops/cuda/*.cu): rows longer than 1024 columns go to a block
// of 256 threads instead of a warp; a row kernel's grid stops at 1024 blocks
// (8192 rows of a warp each, 1024 rows of a block each) and strides over the
// rest; column sums run in chunks of 128 rows and tiles of 128 columns.
std::vector<std::pair<int64_t, int64_t>> RowShapes(
    std::initializer_list<int64_t> cols, std::initializer_list<std::pair<int64_t, int64_t>> extra) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t r : kSizes) {
    for (int64_t c : cols) out.emplace_back(r, c);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// ---- GEMM -------------------------------------------------------------------

TEST_P(Conformance, Gemm) {
 ForEachBf16GemmPath(GetParam(), [&] {
  struct Case {
    int64_t m, n, k, batch;
  };
  // The last two reach the models' k, where results can cancel to near zero
  // (see the bound below).
  const Case cases[] = {{1, 1, 1, 1}, {7, 13, 17, 1}, {33, 5, 19, 2}, {3, 0, 4, 1},
                        {0, 3, 4, 1}, {5, 6, 0, 1},  {17, 31, 1, 3}, {9, 20, 384, 1},
                        {5, 7, 1536, 2}};
  for (DType t : kFloats) {
   // C in f32, and (16-bit A/B) in A's dtype: accumulated in f32, rounded once.
   for (DType ct : {DType::kF32, t}) {
    for (const Case& cs : cases) {
      for (int tr = 0; tr < 4; ++tr) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          for (float alpha : {1.0f, -0.75f}) {
            GemmParams p;
            p.trans_a = tr & 1;
            p.trans_b = tr & 2;
            p.m = cs.m, p.n = cs.n, p.k = cs.k, p.batch = cs.batch;
            p.alpha = alpha;
            p.beta = beta;
            const int64_t ar = p.trans_a ? p.k : p.m, ac = p.trans_a ? p.m : p.k;
            const int64_t br = p.trans_b ? p.n : p.k, bc = p.trans_b ? p.k : p.n;
            // Padded leading dimensions and a gap between batches.
            const int64_t lda = ac + 3, ldb = bc + 1, ldc = p.n + 2;
            const int64_t sa = ar * lda + 5, sb = br * ldb + 2, sc = p.m * ldc + 1;
            Vec a = R(Random(static_cast<size_t>(sa * p.batch + 4), 1), t);
            Vec b = R(Random(static_cast<size_t>(sb * p.batch + 3), 2), t);
            Vec c = R(Random(static_cast<size_t>(sc * p.batch + 1), 3), ct);
            MatrixRef ma{Up(a, t), 4, lda, sa}, mb{Up(b, t), 3, ldb, sb}, mc{Up(c, ct), 1, ldc, sc};
            Status s = Gemm(ctx(), p, ma, mb, mc);
            ASSERT_TRUE(s.ok()) << s.ToString();
            Vec want = c, sum_bound(c.size(), 0.0);
            for (int64_t bi = 0; bi < p.batch; ++bi) {
              for (int64_t i = 0; i < p.m; ++i) {
                for (int64_t j = 0; j < p.n; ++j) {
                  double acc = 0, mag = 0;
                  for (int64_t l = 0; l < p.k; ++l) {
                    double av = a[4 + bi * sa + (p.trans_a ? l * lda + i : i * lda + l)];
                    double bv = b[3 + bi * sb + (p.trans_b ? j * ldb + l : l * ldb + j)];
                    acc += av * bv;
                    mag += std::fabs(av * bv);
                  }
                  double& cv = want[1 + bi * sc + i * ldc + j];
                  const double beta_c = beta == 0.0f ? 0.0 : beta * cv;
                  // Any f32 summation order of the k products and beta C
                  // is within (k + 2) u32 of the sum of their magnitudes
                  // (Higham's gamma bound); the roundings of random-signed
                  // terms add like a random walk, so 4 sqrt(k + 2) u32 of
                  // it holds with a wide margin and still sees a bf16-sized
                  // error in an f32 result at k = 1536.
                  sum_bound[1 + bi * sc + i * ldc + j] =
                      4 * std::sqrt(static_cast<double>(p.k + 2)) * std::ldexp(1.0, -24) *
                      (std::fabs(alpha) * mag + std::fabs(beta_c));
                  cv = alpha * acc + beta_c;
                  if (ct != DType::kF32) cv = R(cv, ct);
                }
              }
            }
            // The relative tolerance below (a 16-bit C: the f32 sum may round
            // to the neighbouring value, one unit in the last place, at most
            // 2 Ulp() relative in a binade), or where a result cancels to
            // near zero the summation bound: each element passes within the
            // larger of the two.
            const double rel = ct == DType::kF32 ? SumTol(p.k) : 2 * Ulp(ct) + SumTol(p.k);
            const std::string what = "gemm " + std::string(DTypeName(t)) + " -> " +
                                     std::string(DTypeName(ct)) + " m=" + std::to_string(p.m) +
                                     " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
                                     " tr=" + std::to_string(tr) + " beta=" + std::to_string(beta) +
                                     " alpha=" + std::to_string(alpha);
            const Vec got = Down(mc.t);
            double scale = 0;
            for (double w : want) scale = std::max(scale, std::fabs(w));
            for (size_t i = 0; i < got.size(); ++i) {
              const double relative = rel * std::max(std::fabs(want[i]), 1e-3 * scale) + 1e-6;
              const double rounding = ct == DType::kF32 ? 0.0 : 2 * Ulp(ct) * std::fabs(want[i]);
              ASSERT_NEAR(got[i], want[i], std::max(relative, sum_bound[i] * 1.01 + rounding))
                  << what << " element " << i << " of " << got.size();
            }
          }
        }
      }
    }
    if (t == DType::kF32) break;  // one pass for f32 A/B
   }
  }
 });
}

TEST_P(Conformance, GemmBetaZeroIgnoresNaNInC) {
  GemmParams p;
  p.m = 2, p.n = 2, p.k = 3;
  Tensor a = Up(Vec(6, 1.0), DType::kF32), b = Up(Vec(6, 2.0), DType::kF32);
  Tensor c = Up(Vec(4, std::nan("")), DType::kF32);
  ASSERT_TRUE(Gemm(ctx(), p, {a, 0, 3}, {b, 0, 2}, {c, 0, 2}).ok());
  for (double v : Down(c)) EXPECT_EQ(v, 6.0);
}

// GemmBias: what BroadcastRows then Gemm with beta = 1 gives up to f32
// summation order (the bias rounded to C's dtype, one more term of the f32
// sum), whether or not the backend adds the bias inside its GEMM (cpu does
// for bf16 on bf16 hardware), for every float dtype, C in f32 or A's dtype,
// a bias in f32 or A's dtype, every transposition, alpha != 1, empty
// dimensions and NaN in C beforehand (C is not read; nothing else written).
// Element (i, j) of the GEMM `p` (alpha left out) in f64, with A and B at
// offsets a_off and b_off of their buffers, and the sum of the products'
// magnitudes (Higham's bound scales with it).
struct RefProduct {
  double acc = 0, mag = 0;
};
RefProduct RefGemmAt(const Vec& a, int64_t a_off, int64_t lda, const Vec& b, int64_t b_off, int64_t ldb,
                     const GemmParams& p, int64_t i, int64_t j) {
  RefProduct r;
  for (int64_t l = 0; l < p.k; ++l) {
    const double prod = a[static_cast<size_t>(a_off + (p.trans_a ? l * lda + i : i * lda + l))] *
                        b[static_cast<size_t>(b_off + (p.trans_b ? j * ldb + l : l * ldb + j))];
    r.acc += prod;
    r.mag += std::fabs(prod);
  }
  return r;
}

TEST_P(Conformance, GemmBiasIsTheProductPlusTheBias) {
 ForEachBf16GemmPath(GetParam(), [&] {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{1, 1, 1}, {7, 13, 17}, {64, 48, 96}, {96, 256, 64}, {5, 6, 0}, {0, 3, 4}, {3, 0, 4}};
  for (DType t : kFloats) {
    for (DType ct : {DType::kF32, t}) {
      for (DType bt : {DType::kF32, t}) {
        for (const Case& cs : cases) {
          for (int tr = 0; tr < 4; ++tr) {
            for (float alpha : {1.0f, -0.75f}) {
              GemmParams p;
              p.trans_a = tr & 1;
              p.trans_b = tr & 2;
              p.m = cs.m, p.n = cs.n, p.k = cs.k;
              p.alpha = alpha;
              const int64_t lda = (p.trans_a ? p.m : p.k) + 3, ldb = (p.trans_b ? p.k : p.n) + 1;
              const int64_t ar = p.trans_a ? p.k : p.m, br = p.trans_b ? p.n : p.k;
              Vec a = R(Random(static_cast<size_t>(ar * lda + 4), 11), t);
              Vec b = R(Random(static_cast<size_t>(br * ldb + 3), 12), t);
              Vec bias = R(Random(static_cast<size_t>(p.n), 13), bt);
              Tensor ta = Up(a, t), tb = Up(b, t), tbias = Up(bias, bt);
              Tensor fused = Up(Vec(static_cast<size_t>(p.m * p.n + 2), std::nan("")), ct);
              const std::string what = "gemm+bias " + std::string(DTypeName(t)) + " bias " +
                                       std::string(DTypeName(bt)) + " -> " +
                                       std::string(DTypeName(ct)) + " m=" + std::to_string(p.m) +
                                       " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
                                       " tr=" + std::to_string(tr) + " alpha=" + std::to_string(alpha);
              Status s = GemmBias(ctx(), p, {ta, 4, lda}, {tb, 3, ldb}, tbias, {fused, 2, p.n});
              ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
              const Vec got = Down(fused);
              // Against f64: an f32 sum of k products and the bias in any
              // order is within (k + 2) u32 of the sum of magnitudes
              // (Higham's gamma bound, rounding C's 16-bit bias included),
              // then one rounding of a 16-bit C. Element-wise, so a result
              // that cancels to near zero is not held to a relative bound.
              for (size_t i = 0; i < 2; ++i) ASSERT_TRUE(std::isnan(got[i])) << what;
              for (int64_t i = 0; i < p.m; ++i) {
                for (int64_t j = 0; j < p.n; ++j) {
                  const auto [acc, mag] = RefGemmAt(a, 4, lda, b, 3, ldb, p, i, j);
                  const double bias_c = R(bias[j], ct);
                  const double exact = alpha * acc + bias_c;
                  const double bound = (p.k + 2) * std::ldexp(1.0, -24) * (std::fabs(alpha) * mag + std::fabs(bias_c)) +
                                       (ct == DType::kF32 ? 0.0 : Ulp(ct) * std::fabs(exact) * 1.01);
                  ASSERT_NEAR(got[2 + i * p.n + j], exact, bound)
                      << what << " [" << i << "," << j << "]; the product rounded to C's dtype "
                      << "before the bias is added would give " << R(R(alpha * acc, ct) + bias_c, ct);
                }
              }
            }
          }
        }
      }
      if (t == DType::kF32) break;
    }
  }
 });
}

TEST_P(Conformance, GemmBiasRejectsWhatItCannotAddAndWritesNothing) {
  GemmParams p;
  p.m = 2, p.n = 3, p.k = 4;
  Tensor a = Up(Vec(8, 1.0), DType::kF32), b = Up(Vec(12, 1.0), DType::kF32);
  Tensor bias = Up(Vec(3, 2.0), DType::kF32), c = Up(Vec(6, -1.0), DType::kF32);
  auto expect_bad = [&](const GemmParams& q, const Tensor& bs, const MatrixRef& mc,
                        const char* names) {
    Status s = GemmBias(ctx(), q, {a, 0, 4}, {b, 0, 3}, bs, mc);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << names << ": " << s.ToString();
    EXPECT_NE(s.message().find(names), std::string::npos) << s.ToString();
    for (double v : Down(c)) ASSERT_EQ(v, -1.0) << names << ": C was written";
  };
  GemmParams q = p;
  q.beta = 1.0f;
  expect_bad(q, bias, {c, 0, 3}, "beta");
  q = p;
  q.batch = 2;
  expect_bad(q, bias, {c, 0, 3}, "batch");
  expect_bad(p, Up(Vec(4, 2.0), DType::kF32), {c, 0, 3}, "bias has 4 elements, expected n=3");
  expect_bad(p, bias, {c, 0, 4}, "ld=4");
  auto inside = c.View(0, DType::kF32, Shape{3});
  ASSERT_TRUE(inside.ok());
  expect_bad(p, *inside, {c, 0, 3}, "bias overlaps C");
  expect_bad(p, Tensor(), {c, 0, 3}, "bias");
  // A bad A or B: C keeps what it held (the two-op form must not have
  // written the bias into it first).
  Status s = GemmBias(ctx(), p, {Up(Vec(8, 1.0), DType::kBF16), 0, 4}, {b, 0, 3}, bias, {c, 0, 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("A is bf16 but B is f32"), std::string::npos) << s.ToString();
  s = GemmBias(ctx(), p, {a, 0, 4}, {Up(Vec(11, 1.0), DType::kF32), 0, 3}, bias, {c, 0, 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("B"), std::string::npos) << s.ToString();
  for (double v : Down(c)) ASSERT_EQ(v, -1.0) << "C was written";
}

// GemmBiasResidual: the linear layer plus the residual, summed in f32 and
// rounded once into a 16-bit C, whether the backend runs GemmBias, Axpy and
// Cast (cpu) or one GEMM with the residual as its beta = 1 term (cuda with a
// bias and residual of C's dtype), for every float dtype, C, bias and
// residual in f32 or A's dtype, every transposition and alpha != 1; C held
// NaN beforehand (not read), and the rows around it are not written.
TEST_P(Conformance, GemmBiasResidualIsTheProductPlusTheBiasPlusTheResidual) {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{1, 1, 1}, {7, 13, 17}, {96, 256, 64}, {5, 6, 0}, {0, 3, 4}};
  for (DType t : kFloats) {
    for (DType ct : {DType::kF32, t}) {
      for (DType bt : {DType::kF32, t}) {
        for (DType rt : {DType::kF32, t}) {
          for (const Case& cs : cases) {
            for (int tr = 0; tr < 4; ++tr) {
              GemmParams p;
              p.trans_a = tr & 1;
              p.trans_b = tr & 2;
              p.m = cs.m, p.n = cs.n, p.k = cs.k;
              p.alpha = tr == 3 ? -0.75f : 1.0f;
              const int64_t lda = (p.trans_a ? p.m : p.k) + 3, ldb = (p.trans_b ? p.k : p.n) + 1;
              const int64_t ar = p.trans_a ? p.k : p.m, br = p.trans_b ? p.n : p.k;
              Vec a = R(Random(static_cast<size_t>(ar * lda + 4), 21), t);
              Vec b = R(Random(static_cast<size_t>(br * ldb + 3), 22), t);
              Vec bias = R(Random(static_cast<size_t>(p.n), 23), bt);
              Vec res = R(Random(static_cast<size_t>(p.m * p.n), 24, -2.0, 2.0), rt);
              Tensor fused = Up(Vec(static_cast<size_t>(p.m * p.n + 3), std::nan("")), ct);
              const std::string what =
                  "gemm+bias+residual " + std::string(DTypeName(t)) + " bias " +
                  std::string(DTypeName(bt)) + " residual " + std::string(DTypeName(rt)) + " -> " +
                  std::string(DTypeName(ct)) + " m=" + std::to_string(p.m) + " n=" +
                  std::to_string(p.n) + " k=" + std::to_string(p.k) + " tr=" + std::to_string(tr);
              Status s = GemmBiasResidual(ctx(), p, {Up(a, t), 4, lda}, {Up(b, t), 3, ldb},
                                          Up(bias, bt), Up(res, rt), {fused, 2, p.n});
              ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
              const Vec got = Down(fused);
              for (size_t i : {size_t{0}, size_t{1}, got.size() - 1}) {
                ASSERT_TRUE(std::isnan(got[i])) << what << ": element " << i << " was written";
              }
              // An f32 sum of k products, the bias and the residual in any
              // order (k + 3) u32 of the sum of magnitudes (Higham's gamma
              // bound), then one rounding of a 16-bit C.
              for (int64_t i = 0; i < p.m; ++i) {
                for (int64_t j = 0; j < p.n; ++j) {
                  const auto [acc, mag] = RefGemmAt(a, 4, lda, b, 3, ldb, p, i, j);
                  const double r = res[i * p.n + j];
                  const double exact = p.alpha * acc + bias[j] + r;
                  const double bound =
                      (p.k + 3) * std::ldexp(1.0, -24) *
                          (std::fabs(p.alpha) * mag + std::fabs(bias[j]) + std::fabs(r)) +
                      (ct == DType::kF32 ? 0.0 : Ulp(ct) * std::fabs(exact) * 1.01);
                  ASSERT_NEAR(got[2 + i * p.n + j], exact, bound)
                      << what << " [" << i << "," << j << "]; the product rounded to C's dtype "
                      << "before the bias and residual are added would give "
                      << R(R(p.alpha * acc, ct) + bias[j] + r, ct);
                }
              }
            }
          }
        }
      }
      if (t == DType::kF32) break;
    }
  }
}

double GeluRef(double x);  // the tanh form, with the Gelu case below

// GELU's derivative (the tanh form GeluRef computes), analytically.
double GeluSlopeRef(double x) {
  const double c = 0.7978845608028654, u = c * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * c * (1 + 3 * 0.044715 * x * x);
}

// The largest |GELU'| (near x = 1.5): how far GELU moves its input's error.
constexpr double kGeluMaxSlope = 1.13;

// Cases of the GELU GEMMs: the first reach a fusing backend's fallback
// (n not a multiple of 8), the others its fused epilogue.
struct GeluGemmCase {
  int64_t m, n, k;
};
const GeluGemmCase kGeluGemmCases[] = {{1, 1, 1},   {7, 13, 17}, {0, 3, 4},
                                       {1, 8, 1},   {16, 64, 32}, {96, 256, 64}};

TEST_P(Conformance, GemmBiasGeluIsTheLinearLayerThenGelu) {
  for (DType t : kFloats) {
    for (const GeluGemmCase& cs : kGeluGemmCases) {
      for (int tr = 0; tr < 4; ++tr) {
        GemmParams p;
        p.trans_a = tr & 1;
        p.trans_b = tr & 2;
        p.m = cs.m, p.n = cs.n, p.k = cs.k;
        p.alpha = tr == 3 ? -0.75f : 1.0f;
        const int64_t lda = std::max<int64_t>(1, p.trans_a ? p.m : p.k);
        const int64_t ldb = std::max<int64_t>(1, p.trans_b ? p.k : p.n);
        const int64_t ar = p.trans_a ? p.k : p.m, br = p.trans_b ? p.n : p.k;
        Vec a = R(Random(static_cast<size_t>(ar * lda), 31, -1.5, 1.5), t);
        Vec b = R(Random(static_cast<size_t>(br * ldb), 32, -1.5, 1.5), t);
        Vec bias = R(Random(static_cast<size_t>(p.n), 33), t);
        const Vec nans(static_cast<size_t>(p.m * p.n), std::nan(""));
        Tensor pre = Up(nans, t), out = Up(nans, t);
        const std::string what = "gemm+bias+gelu " + std::string(DTypeName(t)) + " m=" +
                                 std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" +
                                 std::to_string(p.k) + " tr=" + std::to_string(tr);
        Status s = GemmBiasGelu(ctx(), p, {Up(a, t), 0, lda}, {Up(b, t), 0, ldb}, Up(bias, t), pre, out);
        ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
        const Vec got_pre = Down(pre), got_out = Down(out);
        // pre: GemmBias's bound. out: GELU of the exact pre-activation, off
        // by GELU's slope times pre's error (its rounding included: the
        // composed op applies GELU to the rounded pre), one rounding of a
        // 16-bit out, and the GELU kernel's own error (the Gelu case's).
        for (int64_t i = 0; i < p.m; ++i) {
          for (int64_t j = 0; j < p.n; ++j) {
            const auto [acc, mag] = RefGemmAt(a, 0, lda, b, 0, ldb, p, i, j);
            const double exact = p.alpha * acc + bias[static_cast<size_t>(j)];
            const double round16 = t == DType::kF32 ? 0.0 : Ulp(t) * 1.01;
            const double pre_bound = (p.k + 2) * std::ldexp(1.0, -24) *
                                         (std::fabs(p.alpha) * mag + std::fabs(bias[static_cast<size_t>(j)])) +
                                     round16 * std::fabs(exact);
            const size_t at = static_cast<size_t>(i * p.n + j);
            ASSERT_NEAR(got_pre[at], exact, pre_bound) << what << " pre [" << i << "," << j << "]";
            const double g = GeluRef(exact);
            const double out_bound = kGeluMaxSlope * pre_bound + round16 * std::fabs(g) +
                                     1e-5 * std::fabs(g) + 1e-6;
            ASSERT_NEAR(got_out[at], g, out_bound) << what << " out [" << i << "," << j << "]";
          }
        }
      }
    }
  }
}

TEST_P(Conformance, GemmGeluBackwardIsTheProductTimesGelusSlope) {
  for (DType t : kFloats) {
    for (DType ct : {DType::kF32, t}) {
      for (const GeluGemmCase& cs : kGeluGemmCases) {
        for (int tr = 0; tr < 4; ++tr) {
          GemmParams p;
          p.trans_a = tr & 1;
          p.trans_b = tr & 2;
          p.m = cs.m, p.n = cs.n, p.k = cs.k;
          p.alpha = tr == 3 ? -0.75f : 1.0f;
          const int64_t lda = std::max<int64_t>(1, p.trans_a ? p.m : p.k);
          const int64_t ldb = std::max<int64_t>(1, p.trans_b ? p.k : p.n);
          const int64_t ar = p.trans_a ? p.k : p.m, br = p.trans_b ? p.n : p.k;
          Vec a = R(Random(static_cast<size_t>(ar * lda), 41), t);
          Vec b = R(Random(static_cast<size_t>(br * ldb), 42), t);
          Vec pre = R(Random(static_cast<size_t>(p.m * p.n), 43, -3, 3), ct);
          Tensor c = Up(Vec(static_cast<size_t>(p.m * p.n), std::nan("")), ct);
          const std::string what = "gemm*gelu' " + std::string(DTypeName(t)) + " -> " +
                                   std::string(DTypeName(ct)) + " m=" + std::to_string(p.m) +
                                   " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
                                   " tr=" + std::to_string(tr);
          Status s = GemmGeluBackward(ctx(), p, {Up(a, t), 0, lda}, {Up(b, t), 0, ldb}, Up(pre, ct),
                                      {c, 0, p.n});
          ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
          const Vec got = Down(c);
          // The product's f32 error (Higham), a 16-bit C's rounding of the
          // product (the composed op rounds it before GELU's slope scales
          // it) and of the result, and the GELU kernel's error (the Gelu
          // case's).
          for (int64_t i = 0; i < p.m; ++i) {
            for (int64_t j = 0; j < p.n; ++j) {
              const auto [acc, mag] = RefGemmAt(a, 0, lda, b, 0, ldb, p, i, j);
              const size_t at = static_cast<size_t>(i * p.n + j);
              const double slope = GeluSlopeRef(pre[at]);
              const double exact = p.alpha * acc * slope;
              const double round16 = ct == DType::kF32 ? 0.0 : Ulp(ct) * 1.01;
              const double bound =
                  ((p.k + 1) * std::ldexp(1.0, -24) * std::fabs(p.alpha) * mag +
                   round16 * std::fabs(p.alpha * acc)) * std::fabs(slope) +
                  round16 * std::fabs(exact) + 1e-4 * std::fabs(exact) + 1e-6;
              ASSERT_NEAR(got[at], exact, bound) << what << " [" << i << "," << j << "]";
            }
          }
        }
      }
      if (t == DType::kF32) break;
    }
  }
}

TEST_P(Conformance, GeluGemmsRejectWhatTheyCannotWriteAndWriteNothing) {
  GemmParams p;
  p.m = 2, p.n = 3, p.k = 4;
  Tensor a = Up(Vec(8, 1.0), DType::kF32), b = Up(Vec(12, 1.0), DType::kF32);
  Tensor bias = Up(Vec(3, 2.0), DType::kF32), out = Up(Vec(6, -1.0), DType::kF32);
  Tensor pre = Up(Vec(6, -1.0), DType::kF32);
  auto untouched = [&](const char* names) {
    for (double v : Down(out)) ASSERT_EQ(v, -1.0) << names << ": out/C was written";
    for (double v : Down(pre)) ASSERT_EQ(v, -1.0) << names << ": pre was written";
  };
  auto expect_bad = [&](const Status& s, const char* names) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << names << ": " << s.ToString();
    EXPECT_NE(s.message().find(names), std::string::npos) << s.ToString();
    untouched(names);
  };
  expect_bad(GemmBiasGelu(ctx(), p, {a, 0, 4}, {b, 0, 3}, bias, Up(Vec(5, 0.0), DType::kF32), out), "pre");
  expect_bad(GemmBiasGelu(ctx(), p, {a, 0, 4}, {b, 0, 3}, bias, out, out), "pre overlaps out");
  expect_bad(GemmBiasGelu(ctx(), p, {a, 0, 4}, {b, 0, 3}, Up(Vec(2, 0.0), DType::kF32), pre, out), "bias");
  GemmParams q = p;
  q.beta = 1.0f;
  expect_bad(GemmGeluBackward(ctx(), q, {a, 0, 4}, {b, 0, 3}, pre, {out, 0, 3}), "beta");
  expect_bad(GemmGeluBackward(ctx(), p, {a, 0, 4}, {b, 0, 3}, out, {out, 0, 3}), "pre overlaps C");
  expect_bad(GemmGeluBackward(ctx(), p, {a, 0, 4}, {b, 0, 3}, Up(Vec(7, 0.0), DType::kF32), {out, 0, 3}),
             "pre");
}

TEST_P(Conformance, GemmBiasResidualRejectsAMisfitResidualAndWritesNothing) {
  GemmParams p;
  p.m = 2, p.n = 3, p.k = 4;
  Tensor a = Up(Vec(8, 1.0), DType::kF32), b = Up(Vec(12, 1.0), DType::kF32);
  Tensor bias = Up(Vec(3, 2.0), DType::kF32), c = Up(Vec(6, -1.0), DType::kF32);
  auto expect_bad = [&](const Tensor& residual, const char* names) {
    Status s = GemmBiasResidual(ctx(), p, {a, 0, 4}, {b, 0, 3}, bias, residual, {c, 0, 3});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << names << ": " << s.ToString();
    EXPECT_NE(s.message().find(names), std::string::npos) << s.ToString();
    for (double v : Down(c)) ASSERT_EQ(v, -1.0) << names << ": C was written";
  };
  expect_bad(Up(Vec(5, 1.0), DType::kF32), "residual");
  expect_bad(c, "residual overlaps C");
  expect_bad(Tensor(), "residual");
}

// ---- Data movement ------------------------------------------------------------

TEST_P(Conformance, CopyWholeAndAtOffsets) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (int64_t n : kSizes) {
      Vec v = Random(static_cast<size_t>(n), 5, -100, 100);
      if (t == DType::kI32) {
        for (double& x : v) x = std::round(x);
      }
      v = t == DType::kI32 ? v : R(v, t);
      Tensor src = Up(v, t), dst = Up(Vec(static_cast<size_t>(n), 0.0), t);
      ASSERT_TRUE(Copy(ctx(), src, dst).ok());
      EXPECT_EQ(Down(dst), v) << DTypeName(t) << " n=" << n;
    }
    // Into and out of a flat buffer at element offsets.
    Vec flat(20, 0.0);
    Tensor buf = Up(flat, t);
    Tensor piece = Up(Vec{1, 2, 3}, t);
    auto view = buf.View(7 * DTypeSize(t), t, Shape{3});
    ASSERT_TRUE(view.ok());
    ASSERT_TRUE(Copy(ctx(), piece, *view).ok());
    Vec got = Down(buf);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(got[i], (i >= 7 && i < 10) ? i - 6 : 0) << i;
    Tensor back = Up(Vec(2, 0.0), t);
    ASSERT_TRUE(Copy(ctx(), *buf.View(8 * DTypeSize(t), t, Shape{2}), back).ok());
    EXPECT_EQ(Down(back), (Vec{2, 3}));
  }
}

TEST_P(Conformance, CastAllPairsRoundsToNearestEven) {
  // Values that exercise rounding: ties, subnormals of f16, f16 overflow.
  Vec v = Random(33, 6, -3, 3);
  v.push_back(1.0 + 1.0 / 256);          // bf16 tie: rounds to even (1.0)
  v.push_back(1.0 + 3.0 / 256);          // bf16 tie: rounds up to even
  v.push_back(70000.0);                  // f16 overflow -> inf
  v.push_back(3e-6);                     // f16 subnormal
  v.push_back(-0.0);
  for (DType from : kFloats) {
    for (DType to : kFloats) {
      Vec in = R(v, from);
      Tensor src = Up(in, from), dst = Up(Vec(in.size(), 0.0), to);
      ASSERT_TRUE(Cast(ctx(), src, dst).ok());
      Vec got = Down(dst);
      for (size_t i = 0; i < in.size(); ++i) {
        // Cast is a single rounding of the exact input: bit-exact.
        EXPECT_EQ(got[i], R(in[i], to)) << DTypeName(from) << "->" << DTypeName(to) << " " << in[i];
      }
    }
  }
  Tensor e1 = Up(Vec{}, DType::kF32), e2 = Up(Vec{}, DType::kBF16);
  EXPECT_TRUE(Cast(ctx(), e1, e2).ok());
  // Longer casts with a tail (CUDA: eight elements per thread, 16-byte
  // loads when both ends are 16-byte aligned), and views starting one
  // element in (unaligned: element by element). The same bits either way.
  Vec w = Random(1003, 7, -300, 300);
  for (DType from : kFloats) {
    for (DType to : kFloats) {
      Vec in = R(w, from);
      Tensor src = Up(in, from), dst = Up(Vec(in.size(), 0.0), to);
      ASSERT_TRUE(Cast(ctx(), src, dst).ok());
      EXPECT_EQ(Down(dst), R(in, to)) << DTypeName(from) << "->" << DTypeName(to) << " n=1003";
      const int64_t n = static_cast<int64_t>(in.size()) - 2;
      auto sv = src.View(DTypeSize(from), from, Shape{n});
      Tensor dbuf = Up(Vec(in.size(), 0.0), to);
      auto dv = dbuf.View(DTypeSize(to), to, Shape{n});
      ASSERT_TRUE(sv.ok() && dv.ok());
      ASSERT_TRUE(Cast(ctx(), *sv, *dv).ok());
      Vec got = Down(dbuf);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i + 1], R(in[i + 1], to)) << DTypeName(from) << "->" << DTypeName(to)
                                                << " at offset 1, element " << i;
      }
      EXPECT_EQ(got[0], 0.0);
      EXPECT_EQ(got[in.size() - 1], 0.0);
    }
  }
}

TEST_P(Conformance, RoundToDType) {
  for (DType t : kFloats) {
    for (int64_t n : kSizes) {
      Vec v = Random(static_cast<size_t>(n), 7, -5, 5);
      Tensor x = Up(v, DType::kF32);
      ASSERT_TRUE(RoundToDType(ctx(), x, t).ok());
      EXPECT_EQ(Down(x), R(R(v, DType::kF32), t)) << DTypeName(t);
    }
  }
}

TEST_P(Conformance, ScaleAxpyFill) {
  for (DType t : kFloats) {
    for (int64_t n : kSizes) {
      Vec x = R(Random(static_cast<size_t>(n), 8), t);
      Tensor tx = Up(x, t);
      ASSERT_TRUE(Scale(ctx(), tx, -0.3f).ok());
      Vec want(x.size());
      for (size_t i = 0; i < x.size(); ++i) want[i] = R(x[i] * static_cast<double>(-0.3f), t);
      ExpectNear("scale", Down(tx), want, Ulp(t));

      ASSERT_TRUE(Fill(ctx(), tx, 0.1f).ok());
      for (double v : Down(tx)) EXPECT_EQ(v, R(0.1, t));
      // Zero (CUDA: a memset) and negative zero (a kernel) keep their signs.
      ASSERT_TRUE(Fill(ctx(), tx, 0.0f).ok());
      for (double v : Down(tx)) EXPECT_TRUE(v == 0.0 && !std::signbit(v)) << DTypeName(t) << " " << v;
      ASSERT_TRUE(Fill(ctx(), tx, -0.0f).ok());
      for (double v : Down(tx)) EXPECT_TRUE(v == 0.0 && std::signbit(v)) << DTypeName(t) << " " << v;
    }
  }
  // Fills of many pages (the CPU backend copies its first 4 KiB forward):
  // every element, including a ragged tail, and nothing past the end.
  for (DType t : kFloats) {
    for (int64_t n : {int64_t{2047}, int64_t{2048}, int64_t{4096 * 3 + 5}}) {
      Tensor whole = Up(Vec(static_cast<size_t>(n) + 1, 2.0), t);
      StatusOr<Tensor> x = whole.View(0, t, Shape{n});
      ASSERT_TRUE(x.ok());
      for (float value : {-1.5f, 0.0f, -0.0f, 3.0f}) {
        ASSERT_TRUE(Fill(ctx(), *x, value).ok());
        Vec got = Down(whole);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(got[i] == value && std::signbit(got[i]) == std::signbit(value))
              << DTypeName(t) << " n=" << n << " value=" << value << " element " << i << " is " << got[i];
        }
        EXPECT_EQ(got[n], 2.0) << DTypeName(t) << " n=" << n << ": the element past the end changed";
      }
    }
  }
  // Axpy across every dtype pair (accumulating f32 gradients into 16-bit).
  for (DType xt : kFloats) {
    for (DType yt : kFloats) {
      for (float alpha : {1.0f, 0.25f}) {
        for (int64_t n : kSizes) {
          Vec x = R(Random(static_cast<size_t>(n), 9), xt), y = R(Random(static_cast<size_t>(n), 10), yt);
          Tensor tx = Up(x, xt), ty = Up(y, yt);
          ASSERT_TRUE(Axpy(ctx(), alpha, tx, ty).ok());
          Vec want(y.size());
          for (size_t i = 0; i < y.size(); ++i) want[i] = R(y[i] + alpha * x[i], yt);
          ExpectNear("axpy", Down(ty), want, Ulp(yt), 1e-7);
        }
      }
    }
  }
}

TEST_P(Conformance, InitPhiloxSlicesMatchTheFullParameter) {
  const Initializer inits[] = {Initializer::Normal(0.0f, 0.02f), Initializer::Uniform(-1.0f, 2.0f),
                               Initializer::Ones(), Initializer::Zeros()};
  for (const Initializer& init : inits) {
    for (DType t : kFloats) {
      const int64_t total = 37;
      Tensor full = Up(Vec(total, 5.0), t);
      ASSERT_TRUE(InitPhilox(ctx(), init, 1234, 99, 0, full).ok());
      Vec f = Down(full);
      for (int64_t i = 0; i < total; ++i) {
        EXPECT_EQ(f[i], R(InitValue(init, 1234, 99, static_cast<uint64_t>(i)), t)) << i;
      }
      // A shard [13, 30) alone.
      Tensor shard = Up(Vec(17, 0.0), t);
      ASSERT_TRUE(InitPhilox(ctx(), init, 1234, 99, 13, shard).ok());
      Vec s = Down(shard);
      for (int64_t i = 0; i < 17; ++i) EXPECT_EQ(s[i], f[13 + i]) << i;
    }
  }
  Tensor x = Up(Vec(3, 0.0), DType::kF32);
  EXPECT_EQ(InitPhilox(ctx(), Initializer::Normal(0, -1), 1, 1, 0, x).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(InitPhilox(ctx(), Initializer::Ones(), 1, 1, -1, x).code(), StatusCode::kInvalidArgument);
}

// ---- Bias -------------------------------------------------------------------------

TEST_P(Conformance, BiasOps) {
  // 300 rows: three row chunks, the last partial; 130 columns: two column
  // tiles; 64 columns: the CUDA broadcast's 16-byte vector path (columns a
  // multiple of 8).
  for (auto [rows, cols] : RowShapes({1, 7, 33}, {{300, 130}, {129, 1}, {37, 64}})) {
    {
      Vec bias = R(Random(static_cast<size_t>(cols), 11), DType::kF32);
      Vec y = R(Random(static_cast<size_t>(rows * cols), 12), DType::kF32);
      Tensor tb = Up(bias, DType::kF32), ty = Up(y, DType::kF32);
      ASSERT_TRUE(BiasAdd(ctx(), tb, ty).ok());
      Vec want = y;
      for (int64_t i = 0; i < rows * cols; ++i) want[i] += bias[i % cols];
      ExpectNear("bias_add", Down(ty), want, 1e-6, 1e-7);

      ASSERT_TRUE(BroadcastRows(ctx(), tb, ty).ok());
      for (int64_t i = 0; i < rows * cols; ++i) want[i] = bias[i % cols];
      EXPECT_EQ(Down(ty), want);

      Vec dy = R(Random(static_cast<size_t>(rows * cols), 13), DType::kF32);
      Tensor tdy = Up(dy, DType::kF32);
      ASSERT_TRUE(BiasGrad(ctx(), tdy, tb).ok());  // accumulates into the bias
      Vec wg = bias;
      for (int64_t i = 0; i < rows * cols; ++i) wg[i % cols] += dy[i];
      ExpectNear("bias_grad", Down(tb), wg, SumTol(rows), 1e-6);
    }
  }
}

// ---- Activations and normalisation --------------------------------------------------

double GeluRef(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

TEST_P(Conformance, Gelu) {
  for (int64_t n : kSizes) {
    Vec x = R(Random(static_cast<size_t>(n), 14, -6, 6), DType::kF32);
    Vec dy = R(Random(static_cast<size_t>(n), 15), DType::kF32);
    Tensor tx = Up(x, DType::kF32), ty = Up(Vec(x.size(), 0.0), DType::kF32);
    ASSERT_TRUE(GeluForward(ctx(), tx, ty).ok());
    Vec want(x.size()), wantd(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      want[i] = GeluRef(x[i]);
      const double h = 1e-5;
      wantd[i] = dy[i] * (GeluRef(x[i] + h) - GeluRef(x[i] - h)) / (2 * h);
    }
    ExpectNear("gelu_fwd", Down(ty), want, 1e-5, 1e-6);
    Tensor tdy = Up(dy, DType::kF32);
    ASSERT_TRUE(GeluBackward(ctx(), tx, tdy, tdy).ok());  // in place
    ExpectNear("gelu_bwd", Down(tdy), wantd, 1e-4, 1e-6);
  }
}

TEST_P(Conformance, LayerNorm) {
  // 1100 columns: a block per row (1030 rows: more than the grid); 8200 x 7:
  // more warp rows than the grid; 300 x 130: chunked parameter gradients.
  for (auto [rows, cols] : RowShapes({1, 7, 33}, {{300, 130}, {3, 1100}, {1030, 1100}, {8200, 7}})) {
    {
      const size_t e = static_cast<size_t>(rows * cols);
      Vec x = R(Random(e, 16, -2, 3), DType::kF32), g = R(Random(cols, 17), DType::kF32),
          b = R(Random(cols, 18), DType::kF32), dy = R(Random(e, 19), DType::kF32);
      Vec dx0 = R(Random(e, 20), DType::kF32), dg0 = R(Random(cols, 21), DType::kF32),
          db0 = R(Random(cols, 22), DType::kF32);
      Tensor tx = Up(x, DType::kF32), tg = Up(g, DType::kF32), tb = Up(b, DType::kF32);
      Tensor ty = Up(Vec(e, 0.0), DType::kF32), tm = Up(Vec(rows, 0.0), DType::kF32),
             tr = Up(Vec(rows, 0.0), DType::kF32);
      ASSERT_TRUE(LayerNormForward(ctx(), tx, tg, tb, ty, tm, tr).ok());
      Vec y(e), dx = dx0, dg = dg0, db = db0, mean(rows), rstd(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const double* xr = &x[r * cols];
        double mu = 0, var = 0;
        for (int64_t j = 0; j < cols; ++j) mu += xr[j];
        mu /= cols;
        for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mu) * (xr[j] - mu);
        var /= cols;
        const double rs = 1 / std::sqrt(var + 1e-5);
        mean[r] = mu, rstd[r] = rs;
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < cols; ++j) {
          const double xh = (xr[j] - mu) * rs;
          y[r * cols + j] = xh * g[j] + b[j];
          const double gj = dy[r * cols + j] * g[j];
          sg += gj, sgx += gj * xh;
          dg[j] += dy[r * cols + j] * xh;
          db[j] += dy[r * cols + j];
        }
        for (int64_t j = 0; j < cols; ++j) {
          const double xh = (xr[j] - mu) * rs;
          dx[r * cols + j] += rs * (dy[r * cols + j] * g[j] - sg / cols - xh * sgx / cols);
        }
      }
      ExpectNear("layer_norm y", Down(ty), y, 1e-5, 1e-5);
      ExpectNear("layer_norm mean", Down(tm), mean, 1e-5, 1e-6);
      ExpectNear("layer_norm rstd", Down(tr), rstd, 1e-5, 1e-6);
      Tensor tdy = Up(dy, DType::kF32), tdx = Up(dx0, DType::kF32), tdg = Up(dg0, DType::kF32),
             tdb = Up(db0, DType::kF32);
      ASSERT_TRUE(LayerNormBackward(ctx(), tx, tg, tdy, tm, tr, tdx, tdg, tdb).ok());
      ExpectNear("layer_norm dx", Down(tdx), dx, 1e-4, 1e-5);
      ExpectNear("layer_norm dgamma", Down(tdg), dg, 1e-4, 1e-5);
      ExpectNear("layer_norm dbeta", Down(tdb), db, 1e-4, 1e-5);
    }
  }
}

// ---- Llama-family ops: RMSNorm, RoPE, SwiGLU -------------------------------------

// RMSNorm in every dtype for x, y and dx (gamma and dgamma f32), against
// f64 from the rounded inputs; 16-bit outputs within one rounding.
TEST_P(Conformance, RmsNorm) {
  for (DType t : kFloats) {
    const double u = t == DType::kF32 ? 0.0 : 2 * Ulp(t);
    for (auto [rows, cols] : RowShapes({1, 7, 33}, {{300, 130}, {3, 1100}, {1030, 1100}})) {
      const size_t e = static_cast<size_t>(rows * cols);
      const float eps = 1e-6f;
      Vec x = R(Random(e, 116, -2, 3), t), g = R(Random(cols, 117), DType::kF32),
          dy = R(Random(e, 119), t), dx0 = R(Random(e, 120), t),
          dg0 = R(Random(cols, 121), DType::kF32);
      Tensor tx = Up(x, t), tg = Up(g, DType::kF32), ty = Up(Vec(e, 0.0), t),
             tr = Up(Vec(rows, 0.0), DType::kF32);
      Status st = RmsNormForward(ctx(), tx, tg, eps, ty, tr);
      ASSERT_TRUE(st.ok()) << st.ToString();
      Vec y(e), dx = dx0, dg = dg0, rstd(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const double* xr = &x[r * cols];
        double sq = 0;
        for (int64_t j = 0; j < cols; ++j) sq += xr[j] * xr[j];
        const double rs = 1 / std::sqrt(sq / cols + eps);
        rstd[r] = rs;
        double sgx = 0;
        for (int64_t j = 0; j < cols; ++j) {
          const double xh = xr[j] * rs;
          y[r * cols + j] = xh * g[j];
          sgx += dy[r * cols + j] * g[j] * xh;
          dg[j] += dy[r * cols + j] * xh;
        }
        for (int64_t j = 0; j < cols; ++j) {
          dx[r * cols + j] += rs * (dy[r * cols + j] * g[j] - xr[j] * rs * sgx / cols);
        }
      }
      const std::string name = "rms_norm " + std::string(DTypeName(t)) + " " +
                               std::to_string(rows) + "x" + std::to_string(cols);
      ExpectNear((name + " y").c_str(), Down(ty), y, 1e-5 + u, 1e-5);
      ExpectNear((name + " rstd").c_str(), Down(tr), rstd, 1e-5, 1e-6);
      Tensor tdy = Up(dy, t), tdx = Up(dx0, t), tdg = Up(dg0, DType::kF32);
      st = RmsNormBackward(ctx(), tx, tg, tdy, tr, tdx, tdg);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectNear((name + " dx").c_str(), Down(tdx), dx, 1e-4 + u, 1e-5);
      ExpectNear((name + " dgamma").c_str(), Down(tdg), dg, 1e-4, 1e-5);
    }
  }
  Tensor x = Up(Vec(6, 1.0), DType::kF32), g = Up(Vec(3, 1.0), DType::kF32);
  Tensor y = Up(Vec(6, 0.0), DType::kF32), r = Up(Vec(2, 0.0), DType::kF32);
  EXPECT_EQ(RmsNormForward(ctx(), x, g, 0.0f, y, r).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormForward(ctx(), x, Up(Vec(4, 1.0), DType::kF32), 1e-5f, y, r).code(),
            StatusCode::kInvalidArgument);
}

// The angle as transformers computes it (inv_freq, then pos * inv_freq, in
// f32), its cosine and sine in f64. Scaled frequencies follow the rules of
// rope_scaling.h in f64, written out again here.
double RopeAngleRef(int64_t pos, int64_t i, int64_t hd, float theta, const RopeScaling& s) {
  float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hd));
  if (s.type == RopeScalingType::kLinear) inv_freq /= s.factor;
  if (s.type == RopeScalingType::kLlama3) {
    const double f = inv_freq, pi = 3.14159265358979323846;
    const double wavelen = 2 * pi / f, old = static_cast<double>(s.original_max_positions);
    double scaled = f;
    if (wavelen > old / s.low_freq_factor) {
      scaled = f / s.factor;
    } else if (wavelen >= old / s.high_freq_factor) {
      const double smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      scaled = (1 - smooth) * f / s.factor + smooth * f;
    }
    inv_freq = static_cast<float>(scaled);
  }
  return static_cast<double>(static_cast<float>(pos) * inv_freq);
}

RopeScaling Linear(float factor) {
  RopeScaling s;
  s.type = RopeScalingType::kLinear;
  s.factor = factor;
  return s;
}

RopeScaling Llama3(float factor, float low, float high, int64_t original) {
  RopeScaling s;
  s.type = RopeScalingType::kLlama3;
  s.factor = factor;
  s.low_freq_factor = low;
  s.high_freq_factor = high;
  s.original_max_positions = original;
  return s;
}

// RoPE forward against the rotate-half formula, backward as its exact
// inverse (and transpose), in place and not, every dtype; unscaled, linear
// and llama3 frequencies (Llama 3.1's settings over head_dim 64 put
// frequencies in all three of llama3's bands: kept, smoothed and divided).
TEST_P(Conformance, Rope) {
  struct Case {
    int64_t batch, seq, heads, hd;
    float theta;
    RopeScaling scaling;
  };
  const Case cases[] = {{1, 1, 1, 2, 10000.0f, {}},
                        {2, 7, 3, 8, 10000.0f, {}},
                        {1, 130, 2, 64, 500000.0f, {}},
                        {3, 5, 1, 6, 1e6f, {}},
                        {2, 7, 3, 8, 10000.0f, Linear(4.0f)},
                        {1, 130, 2, 64, 500000.0f, Llama3(8.0f, 1.0f, 4.0f, 8192)},
                        {2, 40, 1, 16, 10000.0f, Llama3(32.0f, 1.0f, 4.0f, 64)}};
  for (DType t : kFloats) {
    const double u = t == DType::kF32 ? 0.0 : 2 * Ulp(t);
    for (const Case& c : cases) {
      const int64_t rows = c.batch * c.seq, width = c.heads * c.hd, half = c.hd / 2;
      const size_t e = static_cast<size_t>(rows * width);
      Vec x = R(Random(e, 130), t);
      Vec want(e), inv(e);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < c.heads; ++h) {
          for (int64_t i = 0; i < half; ++i) {
            const int64_t o = r * width + h * c.hd + i;
            const double a = RopeAngleRef(r % c.seq, i, c.hd, c.theta, c.scaling);
            const double x1 = x[o], x2 = x[o + half];
            want[o] = x1 * std::cos(a) - x2 * std::sin(a);
            want[o + half] = x2 * std::cos(a) + x1 * std::sin(a);
            inv[o] = x1 * std::cos(a) + x2 * std::sin(a);
            inv[o + half] = x2 * std::cos(a) - x1 * std::sin(a);
          }
        }
      }
      const std::string name = "rope " + std::string(DTypeName(t)) + " seq " +
                               std::to_string(c.seq) + " hd " + std::to_string(c.hd) + " " +
                               RopeScalingTypeName(c.scaling.type);
      Tensor tx = Up(x, t), ty = Up(Vec(e, 0.0), t);
      Status st = RopeForward(ctx(), tx, c.seq, c.heads, c.hd, c.theta, c.scaling, ty);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectNear((name + " fwd").c_str(), Down(ty), want, 1e-5 + u, 1e-5 + u);
      st = RopeBackward(ctx(), tx, c.seq, c.heads, c.hd, c.theta, c.scaling, tx);  // in place
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectNear((name + " bwd").c_str(), Down(tx), inv, 1e-5 + u, 1e-5 + u);

      // At given positions (packed documents: one i32 per row), here out of
      // row order and past seq_len: each row turns by its own position.
      Vec pos(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<double>((5 * r + 3) % (2 * c.seq + 1));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < c.heads; ++h) {
          for (int64_t i = 0; i < half; ++i) {
            const int64_t o = r * width + h * c.hd + i;
            const double a = RopeAngleRef(static_cast<int64_t>(pos[r]), i, c.hd, c.theta, c.scaling);
            const double x1 = x[o], x2 = x[o + half];
            want[o] = x1 * std::cos(a) - x2 * std::sin(a);
            want[o + half] = x2 * std::cos(a) + x1 * std::sin(a);
            inv[o] = x1 * std::cos(a) + x2 * std::sin(a);
            inv[o + half] = x2 * std::cos(a) - x1 * std::sin(a);
          }
        }
      }
      Tensor tp = Up(pos, DType::kI32);
      tx = Up(x, t);
      st = RopeForward(ctx(), tx, c.seq, c.heads, c.hd, c.theta, c.scaling, ty, tp);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectNear((name + " fwd at positions").c_str(), Down(ty), want, 1e-5 + u, 1e-5 + u);
      st = RopeBackward(ctx(), tx, c.seq, c.heads, c.hd, c.theta, c.scaling, tx, tp);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ExpectNear((name + " bwd at positions").c_str(), Down(tx), inv, 1e-5 + u, 1e-5 + u);
    }
  }
  Tensor x = Up(Vec(12, 1.0), DType::kF32), y = Up(Vec(12, 0.0), DType::kF32);
  EXPECT_EQ(RopeForward(ctx(), x, 2, 2, 3, 10000.0f, {}, y).code(), StatusCode::kInvalidArgument)
      << "odd head_dim";
  EXPECT_EQ(RopeForward(ctx(), x, 5, 1, 4, 10000.0f, {}, y).code(), StatusCode::kInvalidArgument)
      << "3 rows are not a multiple of seq_len 5";
  EXPECT_EQ(RopeForward(ctx(), x, 3, 1, 4, -1.0f, {}, y).code(), StatusCode::kInvalidArgument)
      << "theta";
  EXPECT_EQ(RopeForward(ctx(), x, 3, 1, 4, 10000.0f, Linear(0.0f), y).code(),
            StatusCode::kInvalidArgument)
      << "linear factor 0";
  Status st = RopeForward(ctx(), x, 3, 1, 4, 10000.0f, Llama3(8.0f, 4.0f, 4.0f, 8192), y);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "high_freq_factor not above low";
  EXPECT_NE(st.message().find("high_freq_factor"), std::string::npos) << st.ToString();
  EXPECT_EQ(RopeForward(ctx(), x, 3, 1, 4, 10000.0f, Llama3(8.0f, 1.0f, 4.0f, 0), y).code(),
            StatusCode::kInvalidArgument)
      << "original_max_positions 0";
  RopeScaling unknown;
  unknown.type = static_cast<RopeScalingType>(7);
  EXPECT_EQ(RopeForward(ctx(), x, 3, 1, 4, 10000.0f, unknown, y).code(),
            StatusCode::kInvalidArgument)
      << "unknown type";
}

// The CPU's RoPE reads cos/sin from a cached table per (head_dim, theta,
// scaling) that grows with the positions asked for; every entry must be the
// bits math.h's direct computation gives (RopeHeadRow: powf, then cosf and
// sinf of the f32 angle), for all three scalings, f32 and bf16, forward and
// backward, positions from the sequence and given per row (packed
// documents: restarts, a negative position and one far past any table,
// which are computed directly), and a table grown between calls.
TEST_P(Conformance, RopeFromCachedTablesIsTheDirectComputationBitForBit) {
  if (GetParam() != DeviceKind::kCpu) GTEST_SKIP() << "the tables are the CPU's (cuda: cosf on the GPU)";
  struct Case {
    int64_t seq, heads, hd;
    float theta;
    RopeScaling scaling;
    bool packed;
  };
  const Case cases[] = {{300, 2, 64, 10000.0f, {}, false},
                        {40, 3, 8, 10000.0f, Linear(4.0f), false},
                        {520, 2, 64, 500000.0f, Llama3(8.0f, 1.0f, 4.0f, 8192), false},
                        {600, 1, 64, 500000.0f, Llama3(32.0f, 1.0f, 4.0f, 64), true},
                        {64, 2, 64, 10000.0f, {}, true},
                        {1000, 1, 64, 10000.0f, {}, false}};  // the table grown above, read again
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : cases) {
      const int64_t rows = 2 * c.seq, width = c.heads * c.hd;
      const size_t e = static_cast<size_t>(rows * width);
      const Vec x = R(Random(e, 131), t);
      Vec pos;
      std::vector<int32_t> p32(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        // Documents of 37 tokens, then positions far into a long context.
        p32[r] = c.packed ? static_cast<int32_t>(r < c.seq ? r % 37 : 9000 + 3 * r)
                          : static_cast<int32_t>(r % c.seq);
      }
      if (c.packed) {
        p32[1] = -5;
        p32[2] = 1 << 24;  // past kMaxRopeTableBytes' table
        pos.assign(p32.begin(), p32.end());
      }
      const std::string name = "rope " + std::string(DTypeName(t)) + " seq " +
                               std::to_string(c.seq) + " " + RopeScalingTypeName(c.scaling.type) +
                               (c.packed ? " packed" : "");
      for (bool inverse : {false, true}) {
        std::vector<float> want(e);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t h = 0; h < c.heads; ++h) {
            const int64_t o = r * width + h * c.hd;
            std::vector<float> xr(x.begin() + o, x.begin() + o + c.hd);
            math::RopeHeadRow(xr.data(), p32[r], c.hd, c.theta, c.scaling,
                                 inverse ? -1.0f : 1.0f, want.data() + o);
          }
        }
        Tensor tx = Up(x, t), ty = Up(Vec(e, 0.0), t);
        Tensor tp = c.packed ? Up(pos, DType::kI32) : Tensor();
        const Status st =
            inverse ? RopeBackward(ctx(), tx, c.seq, c.heads, c.hd, c.theta, c.scaling, ty, tp)
                    : RopeForward(ctx(), tx, c.seq, c.heads, c.hd, c.theta, c.scaling, ty, tp);
        ASSERT_TRUE(st.ok()) << st.ToString();
        const Vec got = Down(ty);
        for (size_t i = 0; i < e; ++i) {
          const float w = R(Vec{want[i]}, t)[0];
          const float g = static_cast<float>(got[i]);
          ASSERT_EQ(std::memcmp(&g, &w, sizeof g), 0)
              << name << (inverse ? " bwd" : " fwd") << " [" << i << "]: " << g << " vs " << w;
        }
      }
    }
  }
}

TEST_P(Conformance, SwiGlu) {
  for (DType t : kFloats) {
    const double u = t == DType::kF32 ? 0.0 : 2 * Ulp(t);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{5000}}) {
      const size_t e = static_cast<size_t>(n);
      Vec g = R(Random(e, 140, -6, 6), t), up = R(Random(e, 141), t), dy = R(Random(e, 142), t);
      Vec y(e), dg(e), du(e);
      for (size_t i = 0; i < e; ++i) {
        const double sig = 1 / (1 + std::exp(-g[i]));
        y[i] = g[i] * sig * up[i];
        dg[i] = dy[i] * up[i] * sig * (1 + g[i] * (1 - sig));
        du[i] = dy[i] * g[i] * sig;
      }
      Tensor tg = Up(g, t), tu = Up(up, t), ty = Up(Vec(e, 0.0), t);
      ASSERT_TRUE(SwiGluForward(ctx(), tg, tu, ty).ok());
      const std::string name = "swiglu " + std::string(DTypeName(t)) + " n=" + std::to_string(n);
      ExpectNear((name + " y").c_str(), Down(ty), y, 1e-5 + u, 1e-6);
      Tensor tdy = Up(dy, t), tdg = Up(Vec(e, 0.0), t), tdu = Up(Vec(e, 0.0), t);
      ASSERT_TRUE(SwiGluBackward(ctx(), tg, tu, tdy, tdg, tdu).ok());
      ExpectNear((name + " dgate").c_str(), Down(tdg), dg, 1e-5 + u, 1e-6);
      ExpectNear((name + " dup").c_str(), Down(tdu), du, 1e-5 + u, 1e-6);
    }
  }
  Tensor a = Up(Vec(4, 1.0), DType::kF32), b = Up(Vec(5, 1.0), DType::kF32);
  EXPECT_EQ(SwiGluForward(ctx(), a, b, Up(Vec(4, 0.0), DType::kF32)).code(),
            StatusCode::kInvalidArgument);
}

// ---- Attention ---------------------------------------------------------------------

struct AttnRef {
  Vec probs, out, dq, dk, dv;
  // Bounds on what rounding the 16-bit GEMM operands P and dS adds to each
  // element (zero when `u` and `eta` are): out, dv: sum over the terms of
  // (u P + eta) |V| or |dO|; dq, dk: (u |dS| + eta) |K| or |Q|.
  Vec out_err, dq_err, dk_err, dv_err;
};

// q/k/v/dout are dense [rows, heads*hd] here. `u`: the unit roundoff of a
// 16-bit type that P and dS are rounded to before they meet V, dO, K and Q
// (relative error <= u for normal values); `eta`: its absolute error below
// the normal range (half the smallest subnormal). `starts` (packed
// documents, causal): query i of sequence b attends keys [starts[b q_len +
// i], i] only.
AttnRef AttentionReference(const AttentionShape& s, const Vec& q, const Vec& k, const Vec& v,
                           const Vec& dout, double u = 0, double eta = 0,
                           const std::vector<int32_t>* starts = nullptr) {
  const int64_t c = s.heads * s.head_dim;
  AttnRef r;
  r.probs.assign(static_cast<size_t>(s.batch * s.heads * s.q_len * s.kv_len), 0.0);
  r.out.assign(static_cast<size_t>(s.batch * s.q_len * c), 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.dk.assign(static_cast<size_t>(s.batch * s.kv_len * c), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  r.out_err.assign(r.out.size(), 0.0);
  r.dq_err.assign(r.out.size(), 0.0);
  r.dk_err.assign(r.dk.size(), 0.0);
  r.dv_err.assign(r.dk.size(), 0.0);
  const double scale = 1 / std::sqrt(static_cast<double>(s.head_dim));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      auto Q = [&](int64_t i, int64_t d) { return q[(b * s.q_len + i) * c + h * s.head_dim + d]; };
      auto K = [&](int64_t j, int64_t d) { return k[(b * s.kv_len + j) * c + h * s.head_dim + d]; };
      auto V = [&](int64_t j, int64_t d) { return v[(b * s.kv_len + j) * c + h * s.head_dim + d]; };
      auto DO = [&](int64_t i, int64_t d) { return dout[(b * s.q_len + i) * c + h * s.head_dim + d]; };
      auto QRow = [&](int64_t i, int64_t d) { return (b * s.q_len + i) * c + h * s.head_dim + d; };
      auto KRow = [&](int64_t j, int64_t d) { return (b * s.kv_len + j) * c + h * s.head_dim + d; };
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t valid = s.causal ? i + 1 : s.kv_len;
        const int64_t first = starts != nullptr ? (*starts)[b * s.q_len + i] : 0;
        Vec p(static_cast<size_t>(s.kv_len), 0.0);
        double m = -1e300, sum = 0;
        for (int64_t j = first; j < valid; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.head_dim; ++d) dot += Q(i, d) * K(j, d);
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = first; j < valid; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = first; j < valid; ++j) p[j] /= sum;
        double* prow = &r.probs[((b * s.heads + h) * s.q_len + i) * s.kv_len];
        for (int64_t j = 0; j < s.kv_len; ++j) prow[j] = p[j];
        // out = P V; dP = dO V^T; dV += P^T dO; dS = P (dP - <P, dP>).
        Vec dp(static_cast<size_t>(s.kv_len), 0.0);
        double pdp = 0;
        for (int64_t j = 0; j < s.kv_len; ++j) {
          const double pe = j >= first && j < valid ? u * p[j] + eta : 0.0;  // masked P is an exact 0
          for (int64_t d = 0; d < s.head_dim; ++d) {
            r.out[QRow(i, d)] += p[j] * V(j, d);
            r.out_err[QRow(i, d)] += pe * std::fabs(V(j, d));
            dp[j] += DO(i, d) * V(j, d);
            r.dv[KRow(j, d)] += p[j] * DO(i, d);
            r.dv_err[KRow(j, d)] += pe * std::fabs(DO(i, d));
          }
          pdp += p[j] * dp[j];
        }
        for (int64_t j = 0; j < s.kv_len; ++j) {
          const double ds = scale * p[j] * (dp[j] - pdp);
          const double dse = j >= first && j < valid ? u * std::fabs(ds) + eta : 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            r.dq[QRow(i, d)] += ds * K(j, d);
            r.dq_err[QRow(i, d)] += dse * std::fabs(K(j, d));
            r.dk[KRow(j, d)] += ds * Q(i, d);
            r.dk_err[KRow(j, d)] += dse * std::fabs(Q(i, d));
          }
        }
      }
    }
  }
  return r;
}

// got against want where each element may also carry a 16-bit operand's
// rounding `err[i]` and, stored in a 16-bit type of unit roundoff u, its own
// rounding once: |round(x) - want| <= u |x| + |x - want| <= u |want| +
// (1 + u) E, with E = err[i] plus the f32 tolerance of ExpectNear (rel
// against max(|want|, 1e-3 of the largest), plus abs).
void ExpectWithin(const char* what, const Vec& got, const Vec& want, const Vec& err, double u,
                  double rel, double abs) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = err[i] + rel * std::max(std::fabs(want[i]), 1e-3 * scale) + abs;
    const double tol = u * std::fabs(want[i]) + (1 + u) * e;
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i << " of " << got.size();
  }
}

// Places dense [rows, c] data at column `col` of a [rows, ld] buffer.
Vec Embed(const Vec& dense, int64_t rows, int64_t c, int64_t ld, int64_t col) {
  Vec out(static_cast<size_t>(rows * ld), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < c; ++j) out[r * ld + col + j] = dense[r * c + j];
  }
  return out;
}
Vec Extract(const Vec& buf, int64_t rows, int64_t c, int64_t ld, int64_t col) {
  Vec out(static_cast<size_t>(rows * c));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < c; ++j) out[r * c + j] = buf[r * ld + col + j];
  }
  return out;
}

// Every dtype: f32, and q, k, v, out, dout, dq, dk, dv all bf16 or all f16
// (probs f32). A backend may run 16-bit attention on 16-bit GEMM operands
// (CUDA: tensor cores), rounding P before P V and P^T dO and dS before dS K
// and dS^T Q (runtime/ops/cuda/cuda_backend.h); the reference bounds what
// that rounding can add per element (AttnRef's *_err), on top of the f32
// tolerances, and each 16-bit output's own rounding (ExpectWithin). The CPU
// rounds P (not dS) in bf16 on AVX512-BF16 (its bf16 dot-product kernels,
// which need an even head_dim: the shapes here have both); in f16, and in
// bf16 without that hardware, it stages attention through f32, which adds
// nothing; both meet the same bound.
TEST_P(Conformance, Attention) {
  const AttentionShape shapes[] = {
      {1, 1, 1, 1, 1, true},   {2, 3, 7, 7, 5, true},  {2, 2, 13, 13, 3, false},
      {3, 1, 5, 17, 4, false}, {1, 2, 17, 1, 2, false}, {2, 2, 0, 3, 2, false},
      {0, 2, 4, 4, 2, true},
      // The CUDA softmax kernels' other branches: 8400 rows of 12 (more warp
      // rows than the grid; masked and not), rows of 1030 and 1100 columns (a
      // block per row; causal: masked tails longer than the block; 1100 rows:
      // more than the grid).
      {1, 700, 12, 12, 2, true}, {2, 350, 12, 9, 2, false}, {2, 1, 3, 1030, 2, false},
      {1, 1, 1100, 1100, 2, true},
      // head_dim 8 and lengths that are multiples of 4 (out's row stride
      // padded by 8 below): every matrix of every (sequence, head) starts
      // 16-byte aligned, so the CUDA backend batches all sequences in one
      // pointer-array GEMM; the other shapes take its strided paths.
      {3, 2, 8, 8, 8, true}, {2, 3, 4, 12, 8, false},
  };
  for (DType t : kFloats) {
   // Unit roundoff of t and half its smallest subnormal (P and dS below
   // f16's normal range round with an absolute error of at most that).
   const double u = t == DType::kF32 ? 0.0 : Ulp(t);
   const double eta = t == DType::kF16 ? std::ldexp(1.0, -25) : 0.0;
   for (const AttentionShape& s : shapes) {
    const int64_t c = s.heads * s.head_dim;
    const int64_t nq = s.batch * s.q_len, nk = s.batch * s.kv_len;
    Vec q = R(Random(nq * c, 30), t), k = R(Random(nk * c, 31), t),
        v = R(Random(nk * c, 32), t), dout = R(Random(nq * c, 33), t);
    AttnRef want = AttentionReference(s, q, k, v, dout, u, eta);
    // q in a fused [nq, 3c] buffer (self-attention style); k and v fused in [nk, 2c].
    Tensor qb = Up(Embed(q, nq, c, 3 * c, c), t);
    Vec kvv = Embed(k, nk, c, 2 * c, 0);
    Vec vv = Embed(v, nk, c, 2 * c, c);
    for (size_t i = 0; i < kvv.size(); ++i) kvv[i] += vv[i];
    Tensor kvb = Up(kvv, t);
    Tensor probs = Up(Vec(want.probs.size(), -1.0), DType::kF32);
    const int64_t ldo = c + (s.head_dim % 8 == 0 ? 8 : 1);  // a padded row stride
    Tensor out = Up(Vec(static_cast<size_t>(nq * ldo), 0.0), t);
    MatrixRef mq{qb, c, 3 * c}, mk{kvb, 0, 2 * c}, mv{kvb, c, 2 * c}, mo{out, 0, ldo};
    Status st = AttentionForward(ctx(), s, mq, mk, mv, probs, mo);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const std::string name = "attention " + std::string(DTypeName(t)) + " b=" +
                             std::to_string(s.batch) + " q=" + std::to_string(s.q_len) +
                             " kv=" + std::to_string(s.kv_len);
    ExpectNear((name + " probs").c_str(), Down(probs), want.probs, 1e-5, 1e-6);
    ExpectWithin((name + " out").c_str(), Extract(Down(out), nq, c, ldo, 0), want.out,
                 want.out_err, u, 1e-5, 1e-6);

    Tensor dob = Up(dout, t);
    Tensor dqb = Up(Vec(static_cast<size_t>(nq * 3 * c), 0.0), t);
    Tensor dkvb = Up(Vec(static_cast<size_t>(nk * 2 * c), 7.0), t);
    st = AttentionBackward(ctx(), s, mq, mk, mv, probs, {dob, 0, c}, {dqb, 0, 3 * c},
                           {dkvb, 0, 2 * c}, {dkvb, c, 2 * c});
    ASSERT_TRUE(st.ok()) << st.ToString();
    Vec dq = Down(dqb), dkv = Down(dkvb);
    ExpectWithin((name + " dq").c_str(), Extract(dq, nq, c, 3 * c, 0), want.dq, want.dq_err, u,
                 1e-4, 1e-6);
    ExpectWithin((name + " dk").c_str(), Extract(dkv, nk, c, 2 * c, 0), want.dk, want.dk_err, u,
                 1e-4, 1e-6);
    ExpectWithin((name + " dv").c_str(), Extract(dkv, nk, c, 2 * c, c), want.dv, want.dv_err, u,
                 1e-4, 1e-6);
   }
  }
}

// ---- Attention in linear memory ------------------------------------------------------

// lse[b, h, i] = log sum_j exp(scale q_i . k_j) over the keys query i
// attends (from starts[b q_len + i] on with packed documents).
Vec LseReference(const AttentionShape& s, const Vec& q, const Vec& k,
                 const std::vector<int32_t>* starts = nullptr) {
  const int64_t c = s.heads * s.head_dim;
  const double scale = 1 / std::sqrt(static_cast<double>(s.head_dim));
  Vec lse(static_cast<size_t>(s.batch * s.heads * s.q_len));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t valid = s.causal ? i + 1 : s.kv_len;
        const int64_t first = starts != nullptr ? (*starts)[b * s.q_len + i] : 0;
        Vec sc(static_cast<size_t>(valid));
        double m = -1e300, sum = 0;
        for (int64_t j = first; j < valid; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            dot += q[(b * s.q_len + i) * c + h * s.head_dim + d] *
                   k[(b * s.kv_len + j) * c + h * s.head_dim + d];
          }
          m = std::max(m, sc[j] = dot * scale);
        }
        for (int64_t j = first; j < valid; ++j) sum += std::exp(sc[j] - m);
        lse[(b * s.heads + h) * s.q_len + i] = m + std::log(sum);
      }
    }
  }
  return lse;
}

// The linear-memory op against the same f64 reference as Attention, plus
// lse. In one 16-bit dtype a backend may round P and dS for its GEMMs as
// Attention does (cuDNN's fused SDPA on CUDA) and, recomputing, compute
// delta = rowsum(dO o O) from the 16-bit out: each dS then moves by P
// times delta's error, at most u sum_d |dO| |O| per row, which the bounds
// below add to dq and dk. P, dS and delta are bounded at 2u for the
// exp2-based softmax of fused kernels (a few f32 ulps on top of u). The
// CPU stages 16-bit operands through f32, which meets the bound with room.
// Shapes: the Attention test's (odd head dims, cross lengths, empty ones),
// plus head dims 64 and 128 with lengths past one key block (64), causal
// and not: the shapes a model hands cuDNN.
TEST_P(Conformance, FlashAttention) {
  const AttentionShape shapes[] = {
      {1, 1, 1, 1, 1, true},    {2, 3, 7, 7, 5, true},   {2, 2, 13, 13, 3, false},
      {3, 1, 5, 17, 4, false},  {1, 2, 17, 1, 2, false}, {2, 2, 0, 3, 2, false},
      {0, 2, 4, 4, 2, true},    {3, 2, 8, 8, 8, true},   {2, 3, 4, 12, 8, false},
      {2, 2, 130, 130, 64, true}, {1, 2, 96, 150, 64, false}, {2, 1, 200, 200, 128, true},
      {1, 2, 64, 64, 128, false},
  };
  for (DType t : kFloats) {
    const double u = t == DType::kF32 ? 0.0 : 2 * Ulp(t);
    const double eta = t == DType::kF16 ? std::ldexp(1.0, -24) : 0.0;
    for (const AttentionShape& s : shapes) {
      const int64_t c = s.heads * s.head_dim;
      const int64_t nq = s.batch * s.q_len, nk = s.batch * s.kv_len;
      Vec q = R(Random(nq * c, 60), t), k = R(Random(nk * c, 61), t),
          v = R(Random(nk * c, 62), t), dout = R(Random(nq * c, 63), t);
      AttnRef want = AttentionReference(s, q, k, v, dout, u, eta);
      const Vec lse_want = LseReference(s, q, k);
      // delta's error from a 16-bit out, carried into dq and dk.
      const double scale = 1 / std::sqrt(static_cast<double>(s.head_dim));
      for (int64_t b = 0; b < s.batch && u > 0; ++b) {
        for (int64_t h = 0; h < s.heads; ++h) {
          for (int64_t i = 0; i < s.q_len; ++i) {
            const int64_t qi = (b * s.q_len + i) * c + h * s.head_dim;
            double de = 0;
            for (int64_t d = 0; d < s.head_dim; ++d) {
              de += std::fabs(dout[qi + d]) * std::fabs(want.out[qi + d]);
            }
            de *= u;
            for (int64_t j = 0; j < s.kv_len; ++j) {
              const double p =
                  want.probs[((b * s.heads + h) * s.q_len + i) * s.kv_len + j] * scale * de;
              const int64_t kj = (b * s.kv_len + j) * c + h * s.head_dim;
              for (int64_t d = 0; d < s.head_dim; ++d) {
                want.dq_err[qi + d] += p * std::fabs(k[kj + d]);
                want.dk_err[kj + d] += p * std::fabs(q[qi + d]);
              }
            }
          }
        }
      }
      // q, k, v as one fused [rows, 3c] buffer when the lengths agree (a
      // model's qkv), else q alone and k, v fused in [nk, 2c].
      const bool fused = s.q_len == s.kv_len;
      Tensor qb, kvb;
      MatrixRef mq, mk, mv;
      if (fused) {
        Vec all = Embed(q, nq, c, 3 * c, 0), kk = Embed(k, nk, c, 3 * c, c),
            vv = Embed(v, nk, c, 3 * c, 2 * c);
        for (size_t i = 0; i < all.size(); ++i) all[i] += kk[i] + vv[i];
        qb = Up(all, t);
        mq = {qb, 0, 3 * c}, mk = {qb, c, 3 * c}, mv = {qb, 2 * c, 3 * c};
      } else {
        qb = Up(q, t);
        Vec kk = Embed(k, nk, c, 2 * c, 0), vv = Embed(v, nk, c, 2 * c, c);
        for (size_t i = 0; i < kk.size(); ++i) kk[i] += vv[i];
        kvb = Up(kk, t);
        mq = {qb, 0, c}, mk = {kvb, 0, 2 * c}, mv = {kvb, c, 2 * c};
      }
      Tensor out = Up(Vec(static_cast<size_t>(nq * c), 0.0), t);
      Tensor lse = Up(Vec(lse_want.size(), -1.0), DType::kF32);
      Status st = FlashAttentionForward(ctx(), s, mq, mk, mv, {out, 0, c}, lse);
      ASSERT_TRUE(st.ok()) << st.ToString();
      const std::string name = "flash attention " + std::string(DTypeName(t)) + " b=" +
                               std::to_string(s.batch) + " h=" + std::to_string(s.heads) +
                               " q=" + std::to_string(s.q_len) + " kv=" +
                               std::to_string(s.kv_len) + " d=" + std::to_string(s.head_dim) +
                               (s.causal ? " causal" : "");
      ExpectNear((name + " lse").c_str(), Down(lse), lse_want, 1e-5 + u, 1e-5);
      ExpectWithin((name + " out").c_str(), Down(out), want.out, want.out_err, u, 1e-5, 1e-6);

      // Backward from the out it wrote (a 16-bit out is what a model keeps).
      Tensor dob = Up(dout, t);
      Tensor dqb = Up(Vec(static_cast<size_t>(nq * c), 0.0), t);
      Tensor dkvb = Up(Vec(static_cast<size_t>(nk * 2 * c), 7.0), t);
      st = FlashAttentionBackward(ctx(), s, mq, mk, mv, {out, 0, c}, {dob, 0, c}, lse,
                                  {dqb, 0, c}, {dkvb, 0, 2 * c}, {dkvb, c, 2 * c});
      ASSERT_TRUE(st.ok()) << st.ToString();
      Vec dkv = Down(dkvb);
      ExpectWithin((name + " dq").c_str(), Down(dqb), want.dq, want.dq_err, u, 1e-4, 1e-6);
      ExpectWithin((name + " dk").c_str(), Extract(dkv, nk, c, 2 * c, 0), want.dk, want.dk_err,
                   u, 1e-4, 1e-6);
      ExpectWithin((name + " dv").c_str(), Extract(dkv, nk, c, 2 * c, c), want.dv, want.dv_err,
                   u, 1e-4, 1e-6);
    }
  }
}

// Grouped-query attention: kv_heads key/value heads, each shared by
// heads / kv_heads query heads. The reference is multi-head attention on k
// and v repeated per query head; dk and dv are the sums of the repeated
// heads' gradients over each group. 16-bit: the f64 reference of the
// rounded inputs within a few units of the output type.
TEST_P(Conformance, FlashAttentionGroupedQueryHeads) {
  std::vector<AttentionShape> shapes;
  for (auto [b, h, kvh, q, kv, d, causal] :
       std::initializer_list<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>>{
           {2, 4, 2, 7, 7, 4, true}, {1, 6, 2, 70, 70, 8, true}, {2, 4, 1, 5, 9, 8, false},
           {1, 8, 2, 130, 130, 64, true}, {2, 3, 3, 6, 6, 2, true}}) {
    AttentionShape s;
    s.batch = b, s.heads = h, s.kv_heads = kvh, s.q_len = q, s.kv_len = kv, s.head_dim = d;
    s.causal = causal;
    shapes.push_back(s);
  }
  for (DType t : kFloats) {
    const double u = t == DType::kF32 ? 0.0 : 8 * Ulp(t);
    for (const AttentionShape& s : shapes) {
      const int64_t hd = s.head_dim, group = s.heads / s.KvHeads();
      const int64_t c = s.heads * hd, kc = s.KvHeads() * hd;
      const int64_t nq = s.batch * s.q_len, nk = s.batch * s.kv_len;
      Vec q = R(Random(nq * c, 160), t), k = R(Random(nk * kc, 161), t),
          v = R(Random(nk * kc, 162), t), dout = R(Random(nq * c, 163), t);
      Vec kf(static_cast<size_t>(nk * c)), vf(kf.size());
      for (int64_t r = 0; r < nk; ++r) {
        for (int64_t h = 0; h < s.heads; ++h) {
          for (int64_t d = 0; d < hd; ++d) {
            kf[r * c + h * hd + d] = k[r * kc + (h / group) * hd + d];
            vf[r * c + h * hd + d] = v[r * kc + (h / group) * hd + d];
          }
        }
      }
      AttentionShape mha = s;
      mha.kv_heads = 0;
      const AttnRef full = AttentionReference(mha, q, kf, vf, dout, 0.0, 0.0);
      Vec dk(static_cast<size_t>(nk * kc), 0.0), dv(dk.size(), 0.0);
      for (int64_t r = 0; r < nk; ++r) {
        for (int64_t h = 0; h < s.heads; ++h) {
          for (int64_t d = 0; d < hd; ++d) {
            dk[r * kc + (h / group) * hd + d] += full.dk[r * c + h * hd + d];
            dv[r * kc + (h / group) * hd + d] += full.dv[r * c + h * hd + d];
          }
        }
      }
      // k and v fused in one [nk, 2 kc] buffer, as a model may hold them.
      Vec kv = Embed(k, nk, kc, 2 * kc, 0), vv = Embed(v, nk, kc, 2 * kc, kc);
      for (size_t i = 0; i < kv.size(); ++i) kv[i] += vv[i];
      Tensor qb = Up(q, t), kvb = Up(kv, t);
      const MatrixRef mq{qb, 0, c}, mk{kvb, 0, 2 * kc}, mv{kvb, kc, 2 * kc};
      Tensor out = Up(Vec(static_cast<size_t>(nq * c), 0.0), t);
      Tensor lse = Up(Vec(static_cast<size_t>(s.batch * s.heads * s.q_len), 0.0), DType::kF32);
      Status st = FlashAttentionForward(ctx(), s, mq, mk, mv, {out, 0, c}, lse);
      ASSERT_TRUE(st.ok()) << st.ToString();
      const std::string name = "gqa " + std::string(DTypeName(t)) + " h=" +
                               std::to_string(s.heads) + " kv_heads=" +
                               std::to_string(s.kv_heads) + " q=" + std::to_string(s.q_len) +
                               " kv=" + std::to_string(s.kv_len) + (s.causal ? " causal" : "");
      ExpectNear((name + " lse").c_str(), Down(lse), LseReference(mha, q, kf), 1e-5 + u, 1e-5);
      ExpectNear((name + " out").c_str(), Down(out), full.out, 1e-5 + u, 1e-6 + u);
      Tensor dob = Up(dout, t), dqb = Up(Vec(static_cast<size_t>(nq * c), 0.0), t);
      Tensor dkvb = Up(Vec(static_cast<size_t>(nk * 2 * kc), 7.0), t);
      st = FlashAttentionBackward(ctx(), s, mq, mk, mv, {out, 0, c}, {dob, 0, c}, lse,
                                  {dqb, 0, c}, {dkvb, 0, 2 * kc}, {dkvb, kc, 2 * kc});
      ASSERT_TRUE(st.ok()) << st.ToString();
      const Vec got_kv = Down(dkvb);
      ExpectNear((name + " dq").c_str(), Down(dqb), full.dq, 1e-4 + u, 1e-5 + u);
      ExpectNear((name + " dk").c_str(), Extract(got_kv, nk, kc, 2 * kc, 0), dk, 1e-4 + u,
                 1e-5 + u);
      ExpectNear((name + " dv").c_str(), Extract(got_kv, nk, kc, 2 * kc, kc), dv, 1e-4 + u,
                 1e-5 + u);
    }
  }
}

// Packed documents (AttentionShape::key_start: block-diagonal causal
// attention), composed and in linear memory (multi-head and grouped-query),
// forward and backward, every dtype, against the f64 reference restricted
// to each query's document, with the bounds of Attention (composed) and
// FlashAttention (linear memory; the CUDA backend runs it composed, the
// mask in its softmax kernels). Shapes: documents of one token, documents
// that fill a row, rows of 12 keys (a warp per row on CUDA) and of 1030 (a
// block per row, documents past the block's 256 threads). On CUDA, f32
// also against the CPU backend's own results for the same operands.
TEST_P(Conformance, PackedDocumentsAttendOnlyWithinTheirDocument) {
  struct Packed {
    std::vector<std::vector<int>> docs;  // per row, lengths summing to the row
    int64_t heads, kv_heads, head_dim;
  };
  const Packed cases[] = {
      {{{5, 1, 6}, {12}, {3, 3, 3, 2, 1}}, 2, 0, 8},
      {{{5, 1, 6}, {1, 11}}, 4, 2, 4},
      {{{300, 1, 729}}, 1, 0, 8},
  };
  for (DType t : kFloats) {
    for (const Packed& pc : cases) {
      for (bool flash : {false, true}) {
        if (!flash && pc.kv_heads != 0) continue;  // composed attention is multi-head only
        AttentionShape s;
        s.batch = static_cast<int64_t>(pc.docs.size());
        s.heads = pc.heads;
        s.kv_heads = pc.kv_heads;
        s.head_dim = pc.head_dim;
        s.causal = true;
        std::vector<int32_t> starts;
        for (const auto& row : pc.docs) {
          int32_t at = 0;
          for (int len : row) {
            for (int i = 0; i < len; ++i) {
              starts.push_back(at);
              s.masked_pairs += i + 1;
            }
            at += len;
          }
          s.q_len = s.kv_len = at;
        }
        const int64_t hd = s.head_dim, group = s.Group();
        const int64_t c = s.heads * hd, kc = s.KvHeads() * hd;
        const int64_t nq = s.batch * s.q_len, nk = nq;
        Vec q = R(Random(nq * c, 170), t), k = R(Random(nk * kc, 171), t),
            v = R(Random(nk * kc, 172), t), dout = R(Random(nq * c, 173), t);
        // The reference: multi-head attention on k and v repeated per query
        // head, key and value gradients (and their error bounds) summed per group.
        Vec kf(static_cast<size_t>(nk * c)), vf(kf.size());
        for (int64_t r = 0; r < nk; ++r) {
          for (int64_t h = 0; h < s.heads; ++h) {
            for (int64_t d = 0; d < hd; ++d) {
              kf[r * c + h * hd + d] = k[r * kc + (h / group) * hd + d];
              vf[r * c + h * hd + d] = v[r * kc + (h / group) * hd + d];
            }
          }
        }
        AttentionShape mha = s;
        mha.kv_heads = 0;
        const double u = t == DType::kF32 ? 0.0 : (flash ? 2 : 1) * Ulp(t);
        const double eta = t == DType::kF16 ? std::ldexp(1.0, flash ? -24 : -25) : 0.0;
        AttnRef full = AttentionReference(mha, q, kf, vf, dout, u, eta, &starts);
        if (flash && u > 0) {
          // delta = rowsum(dO o O) from the 16-bit out, as FlashAttention bounds it.
          const double scale = 1 / std::sqrt(static_cast<double>(hd));
          for (int64_t b = 0; b < s.batch; ++b) {
            for (int64_t h = 0; h < s.heads; ++h) {
              for (int64_t i = 0; i < s.q_len; ++i) {
                const int64_t qi = (b * s.q_len + i) * c + h * hd;
                double de = 0;
                for (int64_t d = 0; d < hd; ++d) de += std::fabs(dout[qi + d] * full.out[qi + d]);
                de *= u;
                for (int64_t j = 0; j < s.kv_len; ++j) {
                  const double p =
                      full.probs[((b * s.heads + h) * s.q_len + i) * s.kv_len + j] * scale * de;
                  const int64_t kj = (b * s.kv_len + j) * c + h * hd;
                  for (int64_t d = 0; d < hd; ++d) {
                    full.dq_err[qi + d] += p * std::fabs(kf[kj + d]);
                    full.dk_err[kj + d] += p * std::fabs(q[qi + d]);
                  }
                }
              }
            }
          }
        }
        Vec dk(static_cast<size_t>(nk * kc), 0.0), dv(dk.size(), 0.0);
        Vec dk_err(dk.size(), 0.0), dv_err(dk.size(), 0.0);
        for (int64_t r = 0; r < nk; ++r) {
          for (int64_t h = 0; h < s.heads; ++h) {
            for (int64_t d = 0; d < hd; ++d) {
              const int64_t to = r * kc + (h / group) * hd + d, from = r * c + h * hd + d;
              dk[to] += full.dk[from];
              dv[to] += full.dv[from];
              dk_err[to] += full.dk_err[from];
              dv_err[to] += full.dv_err[from];
            }
          }
        }
        // k and v fused in one [nk, 2 kc] buffer, as a model may hold them.
        Vec kvv = Embed(k, nk, kc, 2 * kc, 0), vv = Embed(v, nk, kc, 2 * kc, kc);
        for (size_t i = 0; i < kvv.size(); ++i) kvv[i] += vv[i];
        Tensor qb = Up(q, t), kvb = Up(kvv, t), dob = Up(dout, t);
        s.key_start = Up(Vec(starts.begin(), starts.end()), DType::kI32);
        const MatrixRef mq{qb, 0, c}, mk{kvb, 0, 2 * kc}, mv{kvb, kc, 2 * kc};
        Tensor out = Up(Vec(static_cast<size_t>(nq * c), 0.0), t);
        Tensor probs, lse;
        Status st;
        if (flash) {
          lse = Up(Vec(static_cast<size_t>(s.batch * s.heads * s.q_len), 0.0), DType::kF32);
          st = FlashAttentionForward(ctx(), s, mq, mk, mv, {out, 0, c}, lse);
        } else {
          probs = Up(Vec(full.probs.size(), -1.0), DType::kF32);
          st = AttentionForward(ctx(), s, mq, mk, mv, probs, {out, 0, c});
        }
        ASSERT_TRUE(st.ok()) << st.ToString();
        const std::string name = std::string(flash ? "packed flash attention " : "packed attention ") +
                                 std::string(DTypeName(t)) + " h=" + std::to_string(s.heads) + " kv_heads=" +
                                 std::to_string(s.kv_heads) + " T=" + std::to_string(s.q_len);
        if (flash) {
          ExpectNear((name + " lse").c_str(), Down(lse), LseReference(mha, q, kf, &starts),
                     1e-5 + u, 1e-5);
        } else {
          ExpectNear((name + " probs").c_str(), Down(probs), full.probs, 1e-5, 1e-6);
        }
        ExpectWithin((name + " out").c_str(), Down(out), full.out, full.out_err, u, 1e-5, 1e-6);
        Tensor dqb = Up(Vec(static_cast<size_t>(nq * c), 0.0), t);
        Tensor dkvb = Up(Vec(static_cast<size_t>(nk * 2 * kc), 7.0), t);
        if (flash) {
          st = FlashAttentionBackward(ctx(), s, mq, mk, mv, {out, 0, c}, {dob, 0, c}, lse,
                                      {dqb, 0, c}, {dkvb, 0, 2 * kc}, {dkvb, kc, 2 * kc});
        } else {
          st = AttentionBackward(ctx(), s, mq, mk, mv, probs, {dob, 0, c}, {dqb, 0, c},
                                 {dkvb, 0, 2 * kc}, {dkvb, kc, 2 * kc});
        }
        ASSERT_TRUE(st.ok()) << st.ToString();
        const Vec got_dq = Down(dqb), got_kv = Down(dkvb);
        const Vec got_dk = Extract(got_kv, nk, kc, 2 * kc, 0);
        const Vec got_dv = Extract(got_kv, nk, kc, 2 * kc, kc);
        ExpectWithin((name + " dq").c_str(), got_dq, full.dq, full.dq_err, u, 1e-4, 1e-6);
        ExpectWithin((name + " dk").c_str(), got_dk, dk, dk_err, u, 1e-4, 1e-6);
        ExpectWithin((name + " dv").c_str(), got_dv, dv, dv_err, u, 1e-4, 1e-6);
        if (GetParam() == DeviceKind::kCpu || t != DType::kF32) continue;
        // The CPU backend on the same operands (host tensors, dense layouts).
        auto host = [](const Vec& x, DType dt) {
          Tensor h = *HostAllocator::Default().Empty(dt, Shape{static_cast<int64_t>(x.size())});
          for (size_t i = 0; i < x.size(); ++i) {
            if (dt == DType::kI32) {
              h.data_as<int32_t>()[i] = static_cast<int32_t>(x[i]);
            } else {
              h.data_as<float>()[i] = static_cast<float>(x[i]);
            }
          }
          return h;
        };
        auto values = [](const Tensor& h) {
          return Vec(h.data_as<float>(), h.data_as<float>() + h.numel());
        };
        AttentionShape hs = s;
        hs.key_start = host(Vec(starts.begin(), starts.end()), DType::kI32);
        Tensor hq = host(q, t), hk = host(k, t), hv = host(v, t), hdo = host(dout, t);
        Tensor hout = host(Vec(static_cast<size_t>(nq * c), 0.0), t);
        Tensor hdq = host(Vec(static_cast<size_t>(nq * c), 0.0), t);
        Tensor hdk = host(Vec(static_cast<size_t>(nk * kc), 0.0), t), hdv = host(Vec(dk.size(), 0.0), t);
        const MatrixRef cq{hq, 0, c}, ck{hk, 0, kc}, cv{hv, 0, kc};
        if (flash) {
          Tensor hlse = host(Vec(static_cast<size_t>(s.batch * s.heads * s.q_len), 0.0), t);
          ASSERT_TRUE(FlashAttentionForward(HostContext(), hs, cq, ck, cv, {hout, 0, c}, hlse).ok());
          ASSERT_TRUE(FlashAttentionBackward(HostContext(), hs, cq, ck, cv, {hout, 0, c},
                                             {hdo, 0, c}, hlse, {hdq, 0, c}, {hdk, 0, kc},
                                             {hdv, 0, kc})
                          .ok());
          ExpectNear((name + " lse vs the cpu").c_str(), Down(lse), values(hlse), 1e-5, 1e-6);
        } else {
          Tensor hprobs = host(Vec(full.probs.size(), 0.0), t);
          ASSERT_TRUE(AttentionForward(HostContext(), hs, cq, ck, cv, hprobs, {hout, 0, c}).ok());
          ASSERT_TRUE(AttentionBackward(HostContext(), hs, cq, ck, cv, hprobs, {hdo, 0, c},
                                        {hdq, 0, c}, {hdk, 0, kc}, {hdv, 0, kc})
                          .ok());
          ExpectNear((name + " probs vs the cpu").c_str(), Down(probs), values(hprobs), 1e-5, 1e-6);
        }
        ExpectNear((name + " out vs the cpu").c_str(), Down(out), values(hout), 1e-5, 1e-6);
        ExpectNear((name + " dq vs the cpu").c_str(), got_dq, values(hdq), 1e-4, 1e-6);
        ExpectNear((name + " dk vs the cpu").c_str(), got_dk, values(hdk), 1e-4, 1e-6);
        ExpectNear((name + " dv vs the cpu").c_str(), got_dv, values(hdv), 1e-4, 1e-6);
      }
    }
  }
}

// kv_heads must divide heads, and only the linear-memory attention takes a
// grouped shape (the composed one keeps per-head probabilities of its own k).
TEST_P(Conformance, GroupedQueryShapesAreCheckedAndComposedAttentionRefusesThem) {
  AttentionShape s;
  s.batch = 1, s.heads = 4, s.q_len = 3, s.kv_len = 3, s.head_dim = 2, s.causal = true;
  s.kv_heads = 3;
  Tensor q = Up(Random(3 * 8, 1), DType::kF32), kv = Up(Random(3 * 8, 2), DType::kF32);
  Tensor out = Up(Vec(24, 0.0), DType::kF32), lse = Up(Vec(12, 0.0), DType::kF32);
  Status st = FlashAttentionForward(ctx(), s, {q, 0, 8}, {kv, 0, 8}, {kv, 4, 8}, {out, 0, 8}, lse);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kv_heads=3 does not divide heads=4"), std::string::npos) << st;
  s.kv_heads = 2;
  ASSERT_TRUE(
      FlashAttentionForward(ctx(), s, {q, 0, 8}, {kv, 0, 8}, {kv, 4, 8}, {out, 0, 8}, lse).ok());
  Tensor probs = Up(Vec(36, 0.0), DType::kF32);
  st = AttentionForward(ctx(), s, {q, 0, 8}, {kv, 0, 8}, {kv, 4, 8}, probs, {out, 0, 8});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("grouped-query"), std::string::npos) << st;
}

// The op allocates nothing of size q_len x kv_len: forward takes no memory
// from ctx.alloc beyond its outputs, backward exactly its declared
// workspace (so the simulator, which allocates the same, counts it).
// Counts the bytes requested through it.
class RequestCounter final : public Allocator {
 public:
  explicit RequestCounter(Allocator* base) : base_(base) {}
  DeviceId device() const override { return base_->device(); }
  StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) override {
    requested_ += static_cast<int64_t>(nbytes);
    return base_->AllocateBytes(nbytes);
  }
  int64_t requested_bytes() const { return requested_; }

 private:
  Allocator* base_;
  int64_t requested_ = 0;
};

TEST_P(Conformance, FlashAttentionMemoryIsLinearInTheSequence) {
  if (GetParam() != DeviceKind::kCpu) GTEST_SKIP() << "counts the CPU backend's allocations";
  const AttentionShape s{1, 2, 256, 256, 16, true};
  const int64_t c = s.heads * s.head_dim, n = s.batch * s.q_len;
  RequestCounter counting(&HostAllocator::Default());
  OpContext cx = ctx();
  cx.alloc = &counting;
  Tensor qkv = Up(Random(n * 3 * c, 70), DType::kF32);
  Tensor out = Up(Vec(static_cast<size_t>(n * c), 0.0), DType::kF32);
  Tensor lse = Up(Vec(static_cast<size_t>(s.batch * s.heads * s.q_len), 0.0), DType::kF32);
  Tensor dout = Up(Random(n * c, 71), DType::kF32);
  Tensor dqkv = Up(Vec(static_cast<size_t>(n * 3 * c), 0.0), DType::kF32);
  ASSERT_TRUE(FlashAttentionForward(cx, s, {qkv, 0, 3 * c}, {qkv, c, 3 * c}, {qkv, 2 * c, 3 * c},
                                    {out, 0, c}, lse)
                  .ok());
  EXPECT_EQ(counting.requested_bytes(), 0);
  ASSERT_TRUE(FlashAttentionBackward(cx, s, {qkv, 0, 3 * c}, {qkv, c, 3 * c},
                                     {qkv, 2 * c, 3 * c}, {out, 0, c}, {dout, 0, c}, lse,
                                     {dqkv, 0, 3 * c}, {dqkv, c, 3 * c}, {dqkv, 2 * c, 3 * c})
                  .ok());
  EXPECT_EQ(counting.requested_bytes(), 4 * FlashAttentionBackwardWorkspaceElements(s));
  EXPECT_LT(counting.requested_bytes(), 4 * s.q_len * s.kv_len);
}

// ---- Embedding and loss ---------------------------------------------------------------

TEST_P(Conformance, Embedding) {
  // 1000 ids over a vocab of 11: long runs of one id; 300 columns: two
  // column tiles of the CUDA kernel.
  for (auto [count, dim] : RowShapes({1, 5, 33, 300}, {{1000, 300}, {1000, 1}})) {
    {
      const int64_t vocab = 11;
      Vec table = R(Random(vocab * dim, 40), DType::kF32);
      Vec ids(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) ids[i] = (i * 7 + 3) % vocab;  // repeats
      if (count > 2) ids[1] = ids[2];
      Tensor tt = Up(table, DType::kF32, Shape{vocab, dim}), ti = Up(ids, DType::kI32);
      Tensor to = Up(Vec(static_cast<size_t>(count * dim), 0.0), DType::kF32);
      ASSERT_TRUE(EmbeddingForward(ctx(), tt, ti, to).ok());
      Vec want(static_cast<size_t>(count * dim));
      for (int64_t i = 0; i < count; ++i) {
        for (int64_t j = 0; j < dim; ++j) want[i * dim + j] = table[ids[i] * dim + j];
      }
      EXPECT_EQ(Down(to), want);
      Vec dout = R(Random(static_cast<size_t>(count * dim), 41), DType::kF32);
      ASSERT_TRUE(EmbeddingBackward(ctx(), ti, Up(dout, DType::kF32), tt).ok());
      Vec wd = table;
      for (int64_t i = 0; i < count; ++i) {
        for (int64_t j = 0; j < dim; ++j) wd[ids[i] * dim + j] += dout[i * dim + j];
      }
      // f32 rounding grows with the number of tokens added into one row.
      std::vector<int64_t> per_id(vocab, 0);
      int64_t most = 0;
      for (double id : ids) most = std::max(most, ++per_id[static_cast<size_t>(id)]);
      ExpectNear("embedding_bwd", Down(tt), wd, 1e-6, 2e-7 * static_cast<double>(most + 1));
    }
  }
}

TEST_P(Conformance, CrossEntropy) {
  // Vocab 1100: a block per row (1030 rows: more than the grid); 8200 x 7:
  // more warp rows than the grid; the mean over more rows than its 256 threads.
  for (auto [rows, vocab] : RowShapes({1, 7, 33}, {{3, 1100}, {1030, 1100}, {8200, 7}})) {
    {
      for (int ignore_mode = 0; ignore_mode < 3; ++ignore_mode) {  // none, some, all
        Vec logits = R(Random(static_cast<size_t>(rows * vocab), 50, -4, 4), DType::kF32);
        Vec targets(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          targets[r] = (r * 5 + 1) % vocab;
          if (ignore_mode == 2 || (ignore_mode == 1 && r % 3 == 1)) targets[r] = kIgnoreTarget;
        }
        double sum = 0;
        int64_t count = 0;
        Vec dl(logits.size(), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          if (targets[r] == kIgnoreTarget) continue;
          ++count;
        }
        for (int64_t r = 0; r < rows; ++r) {
          if (targets[r] == kIgnoreTarget) continue;
          const double* lr = &logits[r * vocab];
          double m = -1e300, se = 0;
          for (int64_t j = 0; j < vocab; ++j) m = std::max(m, lr[j]);
          for (int64_t j = 0; j < vocab; ++j) se += std::exp(lr[j] - m);
          sum += std::log(se) + m - lr[static_cast<int64_t>(targets[r])];
          for (int64_t j = 0; j < vocab; ++j) {
            dl[r * vocab + j] = (std::exp(lr[j] - m) / se - (j == targets[r] ? 1 : 0)) / count;
          }
        }
        Tensor tl = Up(logits, DType::kF32), tt = Up(targets, DType::kI32);
        Tensor loss = Up(Vec{-1.0}, DType::kF32, Shape{1});
        ASSERT_TRUE(CrossEntropyForward(ctx(), tl, tt, loss).ok());
        auto got = ReadScalar(ctx(), loss);
        ASSERT_TRUE(got.ok());
        EXPECT_NEAR(*got, count == 0 ? 0.0 : sum / count, 1e-5 * std::max(1.0, sum / std::max<int64_t>(count, 1)))
            << rows << "x" << vocab << " mode " << ignore_mode;
        ASSERT_TRUE(CrossEntropyBackward(ctx(), tl, tt, tl).ok());  // in place
        ExpectNear("cross_entropy_bwd", Down(tl), dl, 1e-5, 1e-7);
      }
    }
  }
}

TEST_P(Conformance, CrossEntropyRowLossesAndMeanAreTheForwardBitForBit) {
  for (auto [rows, vocab] : RowShapes({1, 7, 33}, {{3, 1100}, {1030, 1100}, {8200, 7}})) {
    for (DType t : kFloats) {
      for (int ignore_mode = 0; ignore_mode < 3; ++ignore_mode) {
        const Vec logits = R(Random(static_cast<size_t>(rows * vocab), 51, -4, 4), t);
        Vec targets(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          targets[r] = (r * 3 + 2) % vocab;
          if (ignore_mode == 2 || (ignore_mode == 1 && r % 4 == 1)) targets[r] = kIgnoreTarget;
        }
        Tensor tl = Up(logits, t), tt = Up(targets, DType::kI32);
        Tensor whole = Up(Vec{-1.0}, DType::kF32, Shape{1}), parts = Up(Vec{-1.0}, DType::kF32, Shape{1});
        Tensor row_loss = Up(Vec(static_cast<size_t>(rows), -1.0), DType::kF32);
        ASSERT_TRUE(CrossEntropyForward(ctx(), tl, tt, whole).ok());
        ASSERT_TRUE(CrossEntropyRowLosses(ctx(), tl, tt, row_loss).ok());
        ASSERT_TRUE(CrossEntropyMean(ctx(), row_loss, tt, parts).ok());
        EXPECT_EQ(Down(parts), Down(whole)) << rows << "x" << vocab << " " << DTypeName(t) << " mode " << ignore_mode;
        const Vec rl = Down(row_loss);
        for (int64_t r = 0; r < rows; ++r) {
          if (targets[r] == kIgnoreTarget) {
            ASSERT_EQ(rl[r], 0.0) << "ignored row " << r;
          }
        }
      }
    }
  }
  Tensor tl = Up(Vec(6, 0.0), DType::kF32), tt = Up(Vec{0, 1}, DType::kI32);
  Tensor short_rows = Up(Vec{0.0}, DType::kF32);
  EXPECT_EQ(CrossEntropyRowLosses(ctx(), tl, tt, short_rows).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CrossEntropyMean(ctx(), short_rows, tt, Up(Vec{0.0}, DType::kF32, Shape{1})).code(),
            StatusCode::kInvalidArgument);
}

// The fused classifier (ops/classifier.h) against the unfused head it
// replaces, run on the same backend: the logits of every row, one
// CrossEntropyForward, the gradient in place, then dx = dlogits w^T and
// dw += the weight's gradient in one GEMM each. The loss is the same bits
// (the same row losses summed in the same order); dx's rows come from
// GEMMs over fewer rows, which GEMM libraries may block differently along k
// (oneDNN's f32 path does: the f32 rounding of a sum of vocab terms, or one
// unit of a 16-bit dx), and dw sums its rows in chunks (the f32 rounding of
// a split sum). One chunk of every row is the unfused head bit for bit. On
// CUDA the fused results are also held against the CPU backend's (the
// reference): the loss to 1e-5, dx and dw to two units of their dtype.
TEST_P(Conformance, ClassifierInChunksIsTheUnfusedHead) {
  struct Case {
    int64_t rows, d_model, vocab;
  };
#if defined(__SANITIZE_THREAD__)
  // These GEMMs are large enough for oneDNN to split over its OpenMP team,
  // whose hand-over TSan cannot see (libgomp is not instrumented): a worker
  // zeroing a buffer allocated after the team started reads as a race. One
  // GEMM thread under TSan; the arithmetic is the same.
  ASSERT_TRUE(SetCpuGemmThreads(1).ok());
#endif
  auto cpu_device = Device::Get(DeviceId{DeviceKind::kCpu, 0});
  ASSERT_TRUE(cpu_device.ok());
  HostAllocator host;
  const OpContext cpu{*cpu_device, nullptr, &host};
  for (Case k : {Case{7, 5, 37}, Case{33, 16, 300}, Case{130, 8, 1100}, Case{1, 4, 9}, Case{40, 32, 20}}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (bool tied : {false, true}) {
        for (int ignore_mode = 0; ignore_mode < 3; ++ignore_mode) {
          const int64_t rows = k.rows, c = k.d_model, v = k.vocab;
          const std::string what = std::to_string(rows) + "x" + std::to_string(c) + "x" + std::to_string(v) +
                                   " " + std::string(DTypeName(t)) + (tied ? " tied" : "") + " mode " +
                                   std::to_string(ignore_mode);
          const Vec x = R(Random(static_cast<size_t>(rows * c), 60, -2, 2), t);
          const Vec w = R(Random(static_cast<size_t>(c * v), 61, -0.5, 0.5), t);
          const Vec dw0 = R(Random(static_cast<size_t>(c * v), 62, -0.1, 0.1), DType::kF32);
          Vec targets(static_cast<size_t>(rows));
          int64_t count = 0;
          for (int64_t r = 0; r < rows; ++r) {
            targets[r] = (r * 7 + 3) % v;
            if (ignore_mode == 2 || (ignore_mode == 1 && r % 3 == 0)) targets[r] = kIgnoreTarget;
            count += targets[r] != kIgnoreTarget;
          }
          const float scale = count == 0 ? 1.0f : 1.0f / static_cast<float>(count);
          const Shape wshape = tied ? Shape{v, c} : Shape{c, v};
          Tensor tx = Up(x, t), tw = Up(w, t, wshape), tt = Up(targets, DType::kI32);

          // The unfused head.
          Tensor logits = Up(Vec(static_cast<size_t>(rows * v), 0.0), t);
          GemmParams f;
          f.trans_b = tied;
          f.m = rows, f.n = v, f.k = c;
          ASSERT_TRUE(Gemm(ctx(), f, MatrixRef{tx, 0, c}, MatrixRef{tw, 0, tied ? c : v}, MatrixRef{logits, 0, v}).ok());
          Tensor loss_ref = Up(Vec{-1.0}, DType::kF32, Shape{1});
          ASSERT_TRUE(CrossEntropyForward(ctx(), logits, tt, loss_ref).ok());
          ASSERT_TRUE(CrossEntropyBackward(ctx(), logits, tt, logits, count == 0 ? 0.0f : scale).ok());
          Tensor dx_ref = Up(Vec(static_cast<size_t>(rows * c), 9.0), t);
          Tensor dw_ref = Up(dw0, DType::kF32, wshape);
          GemmParams b;
          b.trans_b = !tied;
          b.m = rows, b.n = c, b.k = v;
          ASSERT_TRUE(Gemm(ctx(), b, MatrixRef{logits, 0, v}, MatrixRef{tw, 0, tied ? c : v}, MatrixRef{dx_ref, 0, c}).ok());
          GemmParams g;
          g.trans_a = true;
          g.k = rows;
          g.beta = 1.0f;
          if (tied) {
            g.m = v, g.n = c;
            ASSERT_TRUE(Gemm(ctx(), g, MatrixRef{logits, 0, v}, MatrixRef{tx, 0, c}, MatrixRef{dw_ref, 0, c}).ok());
          } else {
            g.m = c, g.n = v;
            ASSERT_TRUE(Gemm(ctx(), g, MatrixRef{tx, 0, c}, MatrixRef{logits, 0, v}, MatrixRef{dw_ref, 0, v}).ok());
          }
          const Vec want_dx = Down(dx_ref), want_dw = Down(dw_ref);
          const double want_loss = Down(loss_ref)[0];

          for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{3}, rows}) {
            SCOPED_TRACE(what + " chunk " + std::to_string(chunk));
            ClassifierShape cs{rows, c, v, tied, chunk};
            Tensor loss = Up(Vec{-1.0}, DType::kF32, Shape{1});
            Tensor only_loss = Up(Vec{-1.0}, DType::kF32, Shape{1});
            Tensor dx = Up(Vec(static_cast<size_t>(rows * c), 9.0), t);
            Tensor dw = Up(dw0, DType::kF32, wshape);
            ASSERT_TRUE(Classifier(ctx(), cs, tx, tw, tt, only_loss).ok());
            ASSERT_TRUE(Classifier(ctx(), cs, tx, tw, tt, loss, dx, dw, scale).ok());
            EXPECT_EQ(Down(only_loss)[0], want_loss);
            EXPECT_EQ(Down(loss)[0], want_loss);
            if (chunk == rows) {
              EXPECT_EQ(Down(dx), want_dx);
            } else {
              // In 16 bits each side rounds its own f32 sum once (the
              // chunks' GEMMs may sum in another order: the CPU's widened
              // bf16 GEMM does): the two roundings may differ by one whole
              // ulp of the value, twice Ulp()'s half-ulp bound.
              ExpectNear("dx", Down(dx), want_dx, t == DType::kF32 ? SumTol(v) : 2 * Ulp(t), 1e-7);
            }
            const Vec got_dw = Down(dw);
            const int64_t rows_per_sum = chunk == rows ? 1 : rows;
            ExpectNear("dw", got_dw, want_dw, 0, SumTol(rows_per_sum));
            if (GetParam() == DeviceKind::kCuda) {
              // Against the CPU backend's classifier.
              auto CpuUp = [&](const Vec& vals, DType dt, Shape shape) {
                auto h = host.Empty(dt, shape);
                EXPECT_TRUE(h.ok());
                for (size_t i = 0; i < vals.size(); ++i) {
                  if (dt == DType::kI32) {
                    h->data_as<int32_t>()[i] = static_cast<int32_t>(vals[i]);
                  } else {
                    StoreFromFloat(h->data(), dt, i, static_cast<float>(vals[i]));
                  }
                }
                return *h;
              };
              auto CpuDown = [](const Tensor& h) {
                Vec out(static_cast<size_t>(h.numel()));
                for (size_t i = 0; i < out.size(); ++i) out[i] = LoadAsFloat(h.data(), h.dtype(), i);
                return out;
              };
              Tensor cl = CpuUp({-1.0}, DType::kF32, Shape{1});
              Tensor cdx = CpuUp(Vec(static_cast<size_t>(rows * c), 9.0), t, Shape{rows * c});
              Tensor cdw = CpuUp(dw0, DType::kF32, wshape);
              ASSERT_TRUE(Classifier(cpu, cs, CpuUp(x, t, Shape{rows * c}), CpuUp(w, t, wshape),
                                     CpuUp(targets, DType::kI32, Shape{rows}), cl, cdx, cdw, scale)
                              .ok());
              EXPECT_NEAR(Down(loss)[0], CpuDown(cl)[0], 1e-5 * std::max(1.0, std::fabs(CpuDown(cl)[0])));
              ExpectNear("dx against the CPU", Down(dx), CpuDown(cdx), 2 * Ulp(t), 1e-6);
              ExpectNear("dw against the CPU", got_dw, CpuDown(cdw), 2 * Ulp(t), SumTol(rows));
            }
          }
        }
      }
    }
  }
  // Bad shapes and scales name what is wrong and write nothing.
  Tensor x = Up(Vec(6, 1.0), DType::kF32), w = Up(Vec(12, 1.0), DType::kF32), tt = Up(Vec{0, 1}, DType::kI32);
  Tensor loss = Up(Vec{-1.0}, DType::kF32, Shape{1}), dx = Up(Vec(6, 0.0), DType::kF32), dw = Up(Vec(12, 0.0), DType::kF32);
  Status st = Classifier(ctx(), ClassifierShape{2, 3, 5}, x, w, tt, loss);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("w has 12 elements"), std::string::npos) << st;
  st = Classifier(ctx(), ClassifierShape{2, 3, 4}, x, w, tt, loss, dx, dw, 0.0f);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("grad_scale"), std::string::npos) << st;
  st = Classifier(ctx(), ClassifierShape{2, 3, 4}, x, w, tt, loss, dx, Tensor(), 1.0f);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Down(loss)[0], -1.0);
  EXPECT_EQ(Down(dx), Vec(6, 0.0));
}

// ---- Reductions --------------------------------------------------------------------

TEST_P(Conformance, SumOfSquaresAndMaxAbs) {
  for (DType t : kFloats) {
    double want_sq = 0.5, want_max = 0.25;  // starting accumulator values
    Tensor sq = Up(Vec{0.5}, DType::kF64, Shape{1}), mx = Up(Vec{0.25}, DType::kF64, Shape{1});
    for (int64_t n : kSizes) {
      Vec x = R(Random(static_cast<size_t>(n), 60 + static_cast<uint32_t>(n), -3, 3), t);
      Tensor tx = Up(x, t);
      ASSERT_TRUE(SumOfSquares(ctx(), tx, sq).ok());
      ASSERT_TRUE(MaxAbs(ctx(), tx, mx).ok());
      for (double v : x) want_sq += v * v, want_max = std::max(want_max, std::fabs(v));
    }
    auto s = ReadScalar(ctx(), sq), m = ReadScalar(ctx(), mx);
    ASSERT_TRUE(s.ok() && m.ok());
    EXPECT_NEAR(*s, want_sq, 1e-12 * want_sq) << DTypeName(t);  // f64 accumulation
    EXPECT_EQ(*m, want_max) << DTypeName(t);
  }
}

// ---- Optimizer updates ---------------------------------------------------------------

TEST_P(Conformance, SgdUpdate) {
  struct H {
    float momentum, dampening, wd;
    bool nesterov, first;
  };
  for (H h : {H{0, 0, 0, false, false}, H{0.9f, 0, 0.01f, false, true}, H{0.9f, 0.1f, 0, false, false},
              H{0.8f, 0, 0.1f, true, false}}) {
    for (int64_t n : kSizes) {
      Vec p = R(Random(n, 70), DType::kF32), g = R(Random(n, 71), DType::kF32),
          buf = R(Random(n, 72), DType::kF32);
      SgdHyper hy{0.05f, h.momentum, h.dampening, h.wd, h.nesterov, h.first};
      Tensor tp = Up(p, DType::kF32), tg = Up(g, DType::kF32), tb = Up(buf, DType::kF32);
      ASSERT_TRUE(SgdUpdate(ctx(), hy, tp, tg, h.momentum == 0 ? Tensor() : tb).ok());
      Vec wp = p, wb = buf;
      for (int64_t i = 0; i < n; ++i) {
        double gi = g[i] + h.wd * p[i];
        if (h.momentum != 0) {
          wb[i] = h.first ? gi : h.momentum * buf[i] + (1 - h.dampening) * gi;
          gi = h.nesterov ? gi + h.momentum * wb[i] : wb[i];
        }
        wp[i] = p[i] - 0.05 * gi;
      }
      ExpectNear("sgd param", Down(tp), wp, 1e-5, 1e-7);
      if (h.momentum != 0) ExpectNear("sgd momentum", Down(tb), wb, 1e-5, 1e-7);
    }
  }
}

TEST_P(Conformance, AdamAndAdamWUpdate) {
  for (bool decoupled : {false, true}) {
    for (int64_t n : kSizes) {
      Vec p = R(Random(n, 80), DType::kF32), g = R(Random(n, 81), DType::kF32),
          m = R(Random(n, 82), DType::kF32), v = R(Random(n, 83, 0, 1), DType::kF32);
      const double b1 = 0.9, b2 = 0.999, lr = 1e-2, eps = 1e-8, wd = 0.1;
      const double bc1 = 1 - std::pow(b1, 3), bc2s = std::sqrt(1 - std::pow(b2, 3));
      AdamHyper h{static_cast<float>(lr), static_cast<float>(b1), static_cast<float>(b2),
                  static_cast<float>(eps), static_cast<float>(wd), decoupled,
                  static_cast<float>(bc1), static_cast<float>(bc2s)};
      Tensor tp = Up(p, DType::kF32), tg = Up(g, DType::kF32), tm = Up(m, DType::kF32),
             tv = Up(v, DType::kF32);
      ASSERT_TRUE(AdamUpdate(ctx(), h, tp, tg, tm, tv).ok());
      Vec wp = p, wm = m, wv = v;
      for (int64_t i = 0; i < n; ++i) {
        double gi = g[i];
        if (decoupled) {
          wp[i] *= 1 - lr * wd;
        } else {
          gi += wd * p[i];
        }
        wm[i] = b1 * m[i] + (1 - b1) * gi;
        wv[i] = b2 * v[i] + (1 - b2) * gi * gi;
        wp[i] -= (lr / bc1) * wm[i] / (std::sqrt(wv[i]) / bc2s + eps);
      }
      ExpectNear("adam param", Down(tp), wp, 1e-5, 1e-7);
      ExpectNear("adam exp_avg", Down(tm), wm, 1e-5, 1e-7);
      ExpectNear("adam exp_avg_sq", Down(tv), wv, 1e-5, 1e-7);
    }
  }
}

// ---- ReadScalar and argument checking -------------------------------------------------

TEST_P(Conformance, ReadScalarEveryDType) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32}) {
    auto v = ReadScalar(ctx(), Up(Vec{-3.0}, t, Shape{1}));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, -3.0) << DTypeName(t);
  }
  EXPECT_EQ(ReadScalar(ctx(), Up(Vec{1, 2}, DType::kF32)).status().code(),
            StatusCode::kInvalidArgument);
}

// ReadValues: every element of every ReadScalar dtype, in order, in one call;
// a one-element tensor reads as ReadScalar does; numel 0 is InvalidArgument.
TEST_P(Conformance, ReadValuesEveryDTypeInOrder) {
  const Vec want = {-3.0, 0.5, 7.0, 0.0, 1024.0, -0.25, 2.0};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32}) {
    Vec w = want;
    if (t == DType::kI32) {
      for (double& x : w) x = std::trunc(x);
    }
    auto v = ReadValues(ctx(), Up(w, t, Shape{static_cast<int64_t>(w.size())}));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_EQ(v->size(), w.size()) << DTypeName(t);
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ((*v)[i], w[i]) << DTypeName(t) << " element " << i;
    auto one = ReadValues(ctx(), Up(Vec{-3.0}, t, Shape{1}));
    ASSERT_TRUE(one.ok()) << one.status().ToString();
    EXPECT_EQ(*one, std::vector<double>{-3.0}) << DTypeName(t);
  }
  auto empty = ReadValues(ctx(), Up(Vec{}, DType::kF32, Shape{0}));
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
}

// ---- Compute-dtype operands -------------------------------------------------------------

// Every model op on bf16/f16 activation operands gives exactly what the same
// op gives on f32 tensors holding the same (16-bit) values, with each 16-bit
// output rounded once: the op contract's "computes in f32, rounds once".
// f32-only operands (statistics, probs, loss, dtable) are compared as they are.
// Three shapes: 13 x 33; 300 x 130 (column sums over three row chunks and
// two column tiles on CUDA); 3 x 1100 (a block per row on CUDA), so a
// backend's native 16-bit kernels are checked on each of its launch paths.
// Attention is exact this way only on a backend that stages it through f32;
// one that runs it on 16-bit GEMM operands (Native16Bit("attention_fwd"))
// rounds P and dS as its header says, which the Attention test bounds.
TEST_P(Conformance, ModelOpsOn16BitOperandsAreTheF32OpRoundedOnce) {
  const bool native_attention = BackendFor(GetParam())->Native16Bit("attention_fwd");
  // {5, 64}: columns a multiple of 8 (the CUDA kernels' 16-byte vector
  // paths for every element, as the model's shapes take them).
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{13, 33}, {300, 130}, {3, 1100}, {5, 64}}) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    const std::string dt =
        std::string(DTypeName(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
    // The 16-bit result, and the f32 result rounded to t.
    auto Same = [&](const char* what, const Tensor& got16, const Tensor& got32) {
      EXPECT_EQ(Down(got16), R(Down(got32), got16.dtype())) << what << " " << dt;
    };
    const size_t e = rows * cols;
    const Vec x = R(Random(e, 40, -3, 3), t), dy = R(Random(e, 41), t), y0 = R(Random(e, 42), t);
    const Vec bias = R(Random(cols, 43), t), gamma = R(Random(cols, 44), t);

    {  // bias_add, broadcast_rows, bias_grad (dbias f32)
      Tensor y16 = Up(y0, t), y32 = Up(y0, DType::kF32);
      ASSERT_TRUE(BiasAdd(ctx(), Up(bias, t), y16).ok());
      ASSERT_TRUE(BiasAdd(ctx(), Up(bias, DType::kF32), y32).ok());
      Same("bias_add", y16, y32);
      ASSERT_TRUE(BroadcastRows(ctx(), Up(bias, t), y16).ok());
      const Vec bc = Down(y16);
      for (size_t i = 0; i < e; ++i) ASSERT_EQ(bc[i], bias[i % cols]) << "broadcast_rows " << dt;
      Tensor g16 = Up(bias, DType::kF32), g32 = Up(bias, DType::kF32);
      ASSERT_TRUE(BiasGrad(ctx(), Up(dy, t), g16).ok());
      ASSERT_TRUE(BiasGrad(ctx(), Up(dy, DType::kF32), g32).ok());
      EXPECT_EQ(Down(g16), Down(g32)) << "bias_grad " << dt;
    }
    {  // gelu forward and backward (in place)
      Tensor y16 = Up(Vec(e, 0), t), y32 = Up(Vec(e, 0), DType::kF32);
      ASSERT_TRUE(GeluForward(ctx(), Up(x, t), y16).ok());
      ASSERT_TRUE(GeluForward(ctx(), Up(x, DType::kF32), y32).ok());
      Same("gelu_fwd", y16, y32);
      Tensor d16 = Up(dy, t), d32 = Up(dy, DType::kF32);
      ASSERT_TRUE(GeluBackward(ctx(), Up(x, t), d16, d16).ok());
      ASSERT_TRUE(GeluBackward(ctx(), Up(x, DType::kF32), d32, d32).ok());
      Same("gelu_bwd", d16, d32);
    }
    {  // layer norm forward and backward (dx accumulated; statistics f32)
      Tensor y16 = Up(Vec(e, 0), t), y32 = Up(Vec(e, 0), DType::kF32);
      Tensor m16 = Up(Vec(rows, 0), DType::kF32), r16 = Up(Vec(rows, 0), DType::kF32);
      Tensor m32 = Up(Vec(rows, 0), DType::kF32), r32 = Up(Vec(rows, 0), DType::kF32);
      ASSERT_TRUE(LayerNormForward(ctx(), Up(x, t), Up(gamma, t), Up(bias, t), y16, m16, r16).ok());
      ASSERT_TRUE(LayerNormForward(ctx(), Up(x, DType::kF32), Up(gamma, DType::kF32),
                                   Up(bias, DType::kF32), y32, m32, r32)
                      .ok());
      Same("layer_norm_fwd y", y16, y32);
      EXPECT_EQ(Down(m16), Down(m32));
      EXPECT_EQ(Down(r16), Down(r32));
      Tensor dx16 = Up(y0, t), dx32 = Up(y0, DType::kF32);
      Tensor dg16 = Up(bias, DType::kF32), dg32 = Up(bias, DType::kF32);
      Tensor db16 = Up(gamma, DType::kF32), db32 = Up(gamma, DType::kF32);
      ASSERT_TRUE(LayerNormBackward(ctx(), Up(x, t), Up(gamma, t), Up(dy, t), m16, r16, dx16,
                                    dg16, db16)
                      .ok());
      ASSERT_TRUE(LayerNormBackward(ctx(), Up(x, DType::kF32), Up(gamma, DType::kF32),
                                    Up(dy, DType::kF32), m32, r32, dx32, dg32, db32)
                      .ok());
      Same("layer_norm_bwd dx", dx16, dx32);
      EXPECT_EQ(Down(dg16), Down(dg32)) << "layer_norm_bwd dgamma " << dt;
      EXPECT_EQ(Down(db16), Down(db32)) << "layer_norm_bwd dbeta " << dt;
    }
    if (!native_attention) {  // attention over fused q/k/v views of one 16-bit buffer
      const AttentionShape as{2, 3, 5, 5, 4, true};
      const int64_t c = as.heads * as.head_dim, n = as.batch * as.q_len;
      const Vec qkv = R(Random(n * 3 * c, 45), t), dout = R(Random(n * c, 46), t);
      Tensor b16 = Up(qkv, t), b32 = Up(qkv, DType::kF32);
      const int64_t np = as.batch * as.heads * as.q_len * as.kv_len;
      Tensor p16 = Up(Vec(np, 0), DType::kF32), p32 = Up(Vec(np, 0), DType::kF32);
      Tensor o16 = Up(Vec(n * c, 0), t), o32 = Up(Vec(n * c, 0), DType::kF32);
      ASSERT_TRUE(AttentionForward(ctx(), as, {b16, 0, 3 * c}, {b16, c, 3 * c}, {b16, 2 * c, 3 * c},
                                   p16, {o16, 0, c})
                      .ok());
      ASSERT_TRUE(AttentionForward(ctx(), as, {b32, 0, 3 * c}, {b32, c, 3 * c}, {b32, 2 * c, 3 * c},
                                   p32, {o32, 0, c})
                      .ok());
      Same("attention_fwd out", o16, o32);
      EXPECT_EQ(Down(p16), Down(p32)) << "attention_fwd probs " << dt;
      Tensor d16 = Up(Vec(n * 3 * c, 0), t), d32 = Up(Vec(n * 3 * c, 0), DType::kF32);
      ASSERT_TRUE(AttentionBackward(ctx(), as, {b16, 0, 3 * c}, {b16, c, 3 * c},
                                    {b16, 2 * c, 3 * c}, p16, {Up(dout, t), 0, c}, {d16, 0, 3 * c},
                                    {d16, c, 3 * c}, {d16, 2 * c, 3 * c})
                      .ok());
      ASSERT_TRUE(AttentionBackward(ctx(), as, {b32, 0, 3 * c}, {b32, c, 3 * c},
                                    {b32, 2 * c, 3 * c}, p32, {Up(dout, DType::kF32), 0, c},
                                    {d32, 0, 3 * c}, {d32, c, 3 * c}, {d32, 2 * c, 3 * c})
                      .ok());
      Same("attention_bwd dqkv", d16, d32);
    }
    {  // embedding: a 16-bit table into a 16-bit out; dout 16-bit into an f32 dtable
      const int64_t vocab = 7, dim = cols;
      const Vec table = R(Random(vocab * dim, 47), t), ids{3, 0, 6, 3};
      Tensor tab16 = Up(table, t, Shape{vocab, dim}), tab32 = Up(table, DType::kF32, Shape{vocab, dim});
      Tensor ti = Up(ids, DType::kI32);
      Tensor o16 = Up(Vec(4 * dim, 0), t), o32 = Up(Vec(4 * dim, 0), DType::kF32);
      ASSERT_TRUE(EmbeddingForward(ctx(), tab16, ti, o16).ok());
      ASSERT_TRUE(EmbeddingForward(ctx(), tab32, ti, o32).ok());
      Same("embedding_fwd", o16, o32);
      const Vec dout = R(Random(4 * dim, 48), t);
      Tensor g16 = Up(table, DType::kF32, Shape{vocab, dim}), g32 = Up(table, DType::kF32, Shape{vocab, dim});
      ASSERT_TRUE(EmbeddingBackward(ctx(), ti, Up(dout, t), g16).ok());
      ASSERT_TRUE(EmbeddingBackward(ctx(), ti, Up(dout, DType::kF32), g32).ok());
      EXPECT_EQ(Down(g16), Down(g32)) << "embedding_bwd " << dt;
    }
    {  // cross-entropy: 16-bit logits, f32 loss; backward in place, rounded once
      const int64_t vocab = cols;
      const Vec logits = R(Random(rows * vocab, 49, -4, 4), t);
      Vec targets(rows);
      for (int64_t i = 0; i < rows; ++i) targets[i] = i % 4 == 0 ? kIgnoreTarget : (i * 5) % vocab;
      Tensor tt = Up(targets, DType::kI32);
      Tensor l16 = Up(logits, t), l32 = Up(logits, DType::kF32);
      Tensor s16 = Up(Vec{0}, DType::kF32), s32 = Up(Vec{0}, DType::kF32);
      ASSERT_TRUE(CrossEntropyForward(ctx(), l16, tt, s16).ok());
      ASSERT_TRUE(CrossEntropyForward(ctx(), l32, tt, s32).ok());
      EXPECT_EQ(Down(s16), Down(s32)) << "cross_entropy_fwd " << dt;
      ASSERT_TRUE(CrossEntropyBackward(ctx(), l16, tt, l16).ok());
      ASSERT_TRUE(CrossEntropyBackward(ctx(), l32, tt, l32).ok());
      Same("cross_entropy_bwd", l16, l32);
    }
    {  // mixed dtypes: an f32 operand beside 16-bit ones, and 16-bit in, f32 out
      Tensor y16 = Up(y0, t), y32 = Up(y0, DType::kF32);
      ASSERT_TRUE(BiasAdd(ctx(), Up(bias, DType::kF32), y16).ok());
      ASSERT_TRUE(BiasAdd(ctx(), Up(bias, DType::kF32), y32).ok());
      Same("bias_add f32 bias", y16, y32);
      Tensor g16 = Up(bias, t), g32 = Up(bias, DType::kF32);  // a 16-bit dbias
      ASSERT_TRUE(BiasGrad(ctx(), Up(dy, t), g16).ok());
      ASSERT_TRUE(BiasGrad(ctx(), Up(dy, DType::kF32), g32).ok());
      Same("bias_grad 16-bit dbias", g16, g32);
      Tensor gy = Up(Vec(e, 0), DType::kF32), gy32 = Up(Vec(e, 0), DType::kF32);
      ASSERT_TRUE(GeluForward(ctx(), Up(x, t), gy).ok());
      ASSERT_TRUE(GeluForward(ctx(), Up(x, DType::kF32), gy32).ok());
      EXPECT_EQ(Down(gy), Down(gy32)) << "gelu_fwd 16-bit x, f32 y " << dt;
      Tensor gd = Up(Vec(e, 0), t), gd32 = Up(Vec(e, 0), DType::kF32);
      ASSERT_TRUE(GeluBackward(ctx(), Up(x, DType::kF32), Up(dy, t), gd).ok());
      ASSERT_TRUE(GeluBackward(ctx(), Up(x, DType::kF32), Up(dy, DType::kF32), gd32).ok());
      Same("gelu_bwd f32 x", gd, gd32);
      Tensor ly = Up(Vec(e, 0), DType::kF32), ly32 = Up(Vec(e, 0), DType::kF32);
      Tensor m1 = Up(Vec(rows, 0), DType::kF32), r1 = Up(Vec(rows, 0), DType::kF32);
      Tensor m2 = Up(Vec(rows, 0), DType::kF32), r2 = Up(Vec(rows, 0), DType::kF32);
      ASSERT_TRUE(LayerNormForward(ctx(), Up(x, t), Up(gamma, DType::kF32), Up(bias, DType::kF32),
                                   ly, m1, r1)
                      .ok());
      ASSERT_TRUE(LayerNormForward(ctx(), Up(x, DType::kF32), Up(gamma, DType::kF32),
                                   Up(bias, DType::kF32), ly32, m2, r2)
                      .ok());
      EXPECT_EQ(Down(ly), Down(ly32)) << "layer_norm_fwd 16-bit x, f32 y " << dt;
      const int64_t vocab = cols;
      const Vec logits = R(Random(rows * vocab, 50, -4, 4), t);
      Vec targets(rows);
      for (int64_t i = 0; i < rows; ++i) targets[i] = (i * 3) % vocab;
      Tensor tt = Up(targets, DType::kI32);
      Tensor d32 = Up(Vec(rows * vocab, 0), DType::kF32), l32 = Up(logits, DType::kF32);
      ASSERT_TRUE(CrossEntropyBackward(ctx(), Up(logits, t), tt, d32).ok());
      ASSERT_TRUE(CrossEntropyBackward(ctx(), l32, tt, l32).ok());
      EXPECT_EQ(Down(d32), Down(l32)) << "cross_entropy_bwd 16-bit logits, f32 dlogits " << dt;
    }
  }
  }
}

// The same contract for bf16 operands mixed with f32 ones, rows and
// vectors longer than the CPU backend's f32 chunks (2048 elements) and bf16
// views starting at odd element offsets, with every tail length 1..31 of a
// 16-lane vector: each 16-bit output is the f32 op's result on the widened
// values, rounded once (bit for bit).
TEST_P(Conformance, Bf16MixesLongRowsAndOddViewsAreTheF32OpRoundedOnce) {
  const DType b16 = DType::kBF16, f32 = DType::kF32;
  // A [n] view of dtype t starting `off` elements into a fresh tensor.
  auto ViewOf = [&](const Vec& v, DType t, int64_t off) {
    Vec padded(static_cast<size_t>(off), 0.0);
    padded.insert(padded.end(), v.begin(), v.end());
    padded.push_back(0.0);
    Tensor base = Up(padded, t);
    auto view = base.View(static_cast<size_t>(off) * DTypeSize(t), t,
                          Shape{static_cast<int64_t>(v.size())});
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    return *view;
  };
  auto Same = [&](const std::string& what, const Tensor& got, const Vec& f32_result) {
    const Vec g = Down(got);
    const Vec want = R(f32_result, got.dtype());
    ASSERT_EQ(g.size(), want.size()) << what;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], want[i]) << what << " element " << i;
  };
  std::vector<int64_t> lengths;
  for (int64_t n = 1; n <= 31; ++n) lengths.push_back(n);
  lengths.push_back(2 * 2048 + 16 + 5);
  for (int64_t n : lengths) {
    const std::string ns = " n=" + std::to_string(n);
    const size_t e = static_cast<size_t>(n);
    const Vec x = R(Random(e, 60 + n, -4, 4), b16), dy = R(Random(e, 61 + n), b16);
    const Vec yf = Random(e, 62 + n);  // f32 values, not bf16-representable
    {  // gelu: bf16 view -> f32, f32 -> bf16 view, in place on a bf16 view
      Tensor y32 = Up(Vec(e, 0), f32), ref = Up(Vec(e, 0), f32);
      ASSERT_TRUE(GeluForward(ctx(), ViewOf(x, b16, 1), y32).ok());
      ASSERT_TRUE(GeluForward(ctx(), Up(x, f32), ref).ok());
      Same("gelu_fwd bf16->f32" + ns, y32, Down(ref));
      Tensor y16 = ViewOf(Vec(e, 0), b16, 3), ref2 = Up(Vec(e, 0), f32);
      ASSERT_TRUE(GeluForward(ctx(), Up(yf, f32), y16).ok());
      ASSERT_TRUE(GeluForward(ctx(), Up(yf, f32), ref2).ok());
      Same("gelu_fwd f32->bf16" + ns, y16, Down(ref2));
      Tensor d16 = ViewOf(dy, b16, 1), d32 = Up(dy, f32);
      ASSERT_TRUE(GeluBackward(ctx(), ViewOf(x, b16, 2), d16, d16).ok());
      ASSERT_TRUE(GeluBackward(ctx(), Up(x, f32), d32, d32).ok());
      Same("gelu_bwd in place" + ns, d16, Down(d32));
    }
    for (float alpha : {1.0f, -0.37f}) {  // axpy in every f32/bf16 mix; scale
      const std::string as = ns + " alpha=" + std::to_string(alpha);
      for (DType xt : {f32, b16}) {
        for (DType yt : {f32, b16}) {
          if (xt == f32 && yt == f32) continue;
          const Vec xv = R(yf, xt), yv = R(dy, yt);
          Tensor y = ViewOf(yv, yt, 1), ref = Up(yv, f32);
          ASSERT_TRUE(Axpy(ctx(), alpha, ViewOf(xv, xt, 3), y).ok());
          ASSERT_TRUE(Axpy(ctx(), alpha, Up(xv, f32), ref).ok());
          Same("axpy " + std::string(DTypeName(xt)) + "->" + std::string(DTypeName(yt)) + as, y,
               Down(ref));
        }
      }
      Tensor s16 = ViewOf(x, b16, 1), s32 = Up(x, f32);
      ASSERT_TRUE(Scale(ctx(), s16, alpha).ok());
      ASSERT_TRUE(Scale(ctx(), s32, alpha).ok());
      Same("scale" + as, s16, Down(s32));
    }
    {  // cast both ways
      Tensor c16 = ViewOf(Vec(e, 0), b16, 1), back = Up(Vec(e, 0), f32);
      ASSERT_TRUE(Cast(ctx(), Up(yf, f32), c16).ok());
      Same("cast f32->bf16" + ns, c16, yf);
      ASSERT_TRUE(Cast(ctx(), c16, back).ok());
      Same("cast bf16->f32" + ns, back, R(yf, b16));
    }
    {  // rows of n columns: bias ops, LayerNorm (bf16 and f32 parameters mixed)
      const int64_t rows = 3;
      const size_t m = rows * e;
      const Vec xm = R(Random(m, 63 + n, -3, 3), b16), dym = R(Random(m, 64 + n), b16);
      const Vec g = R(Random(e, 65 + n), b16), b = R(Random(e, 66 + n), b16);
      Tensor y16 = ViewOf(dym, b16, 1), y32 = Up(dym, f32);
      ASSERT_TRUE(BiasAdd(ctx(), Up(yf, f32), y16).ok());
      ASSERT_TRUE(BiasAdd(ctx(), Up(yf, f32), y32).ok());
      Same("bias_add f32 bias, bf16 y" + ns, y16, Down(y32));
      Tensor bc16 = ViewOf(Vec(m, 0), b16, 1);
      ASSERT_TRUE(BroadcastRows(ctx(), Up(yf, f32), bc16).ok());
      Vec rep;
      for (int64_t r = 0; r < rows; ++r) rep.insert(rep.end(), yf.begin(), yf.end());
      Same("broadcast_rows f32->bf16" + ns, bc16, rep);
      Tensor db16 = ViewOf(b, b16, 1), db32 = Up(b, f32);
      ASSERT_TRUE(BiasGrad(ctx(), ViewOf(dym, b16, 2), db16).ok());
      ASSERT_TRUE(BiasGrad(ctx(), Up(dym, f32), db32).ok());
      Same("bias_grad into bf16 dbias (rounded once)" + ns, db16, Down(db32));

      Tensor ly16 = ViewOf(Vec(m, 0), b16, 1), ly32 = Up(Vec(m, 0), f32);
      Tensor mean16 = Up(Vec(rows, 0), f32), rstd16 = Up(Vec(rows, 0), f32);
      Tensor mean32 = Up(Vec(rows, 0), f32), rstd32 = Up(Vec(rows, 0), f32);
      ASSERT_TRUE(LayerNormForward(ctx(), ViewOf(xm, b16, 3), Up(g, f32), ViewOf(b, b16, 1), ly16,
                                   mean16, rstd16)
                      .ok());
      ASSERT_TRUE(
          LayerNormForward(ctx(), Up(xm, f32), Up(g, f32), Up(b, f32), ly32, mean32, rstd32).ok());
      Same("layer_norm_fwd y" + ns, ly16, Down(ly32));
      Same("layer_norm_fwd mean" + ns, mean16, Down(mean32));
      Same("layer_norm_fwd rstd" + ns, rstd16, Down(rstd32));
      Tensor dx16 = ViewOf(xm, b16, 1), dx32 = Up(xm, f32);
      Tensor dg16 = ViewOf(g, b16, 1), dg32 = Up(g, f32);  // a bf16 dgamma: rounded once
      Tensor dbt = Up(b, f32), dbt32 = Up(b, f32);
      ASSERT_TRUE(LayerNormBackward(ctx(), ViewOf(xm, b16, 1), ViewOf(g, b16, 2),
                                    ViewOf(dym, b16, 3), mean16, rstd16, dx16, dg16, dbt)
                      .ok());
      ASSERT_TRUE(LayerNormBackward(ctx(), Up(xm, f32), Up(g, f32), Up(dym, f32), mean32, rstd32,
                                    dx32, dg32, dbt32)
                      .ok());
      Same("layer_norm_bwd dx" + ns, dx16, Down(dx32));
      Same("layer_norm_bwd dgamma" + ns, dg16, Down(dg32));
      Same("layer_norm_bwd dbeta" + ns, dbt, Down(dbt32));

      // cross-entropy over a vocabulary of n: bf16 logits into f32 dlogits
      const Vec tg{0, static_cast<double>(n - 1), static_cast<double>(kIgnoreTarget)};
      Tensor tt = Up(tg, DType::kI32);
      Tensor l16 = ViewOf(xm, b16, 1), dl32 = Up(Vec(m, 0), f32), dlr = Up(Vec(m, 0), f32);
      ASSERT_TRUE(CrossEntropyBackward(ctx(), l16, tt, dl32).ok());
      ASSERT_TRUE(CrossEntropyBackward(ctx(), Up(xm, f32), tt, dlr).ok());
      Same("cross_entropy_bwd bf16 logits, f32 dlogits" + ns, dl32, Down(dlr));
    }
  }
  if (GetParam() != DeviceKind::kCpu) return;
  // A bf16 C larger than the CPU backend's f32 block of 2^20 elements (two
  // blocks of rows), accumulated onto (beta = 1): the bf16 GEMM into an f32
  // C, rounded once. k = 3 keeps each element's sum order fixed.
  GemmParams p;
  p.m = 520, p.n = 2100, p.k = 3, p.beta = 1.0f;
  const Vec a = R(Random(p.m * p.k, 70), b16), b = R(Random(p.k * p.n, 71), b16);
  const Vec c = R(Random(p.m * p.n, 72), b16);
  Tensor c16 = Up(c, b16), c32 = Up(c, f32);
  ASSERT_TRUE(Gemm(ctx(), p, {Up(a, b16), 0, p.k}, {Up(b, b16), 0, p.n}, {c16, 0, p.n}).ok());
  ASSERT_TRUE(Gemm(ctx(), p, {Up(a, b16), 0, p.k}, {Up(b, b16), 0, p.n}, {c32, 0, p.n}).ok());
  Same("gemm bf16 C in blocks", c16, Down(c32));
}

TEST_P(Conformance, BadArgumentsAreInvalidArgumentAndWriteNothing) {
  Tensor x = Up(Vec{1, 2, 3, 4, 5, 6}, DType::kF32), g = Up(Vec{1, 1, 1, 1}, DType::kF32);
  Tensor y = Up(Vec(6, 9.0), DType::kF32), m = Up(Vec(2, 9.0), DType::kF32),
         r = Up(Vec(2, 9.0), DType::kF32);
  Status s = LayerNormForward(ctx(), x, g, g, y, m, r);  // 6 is not a multiple of 4
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer_norm_fwd"), std::string::npos) << s.ToString();
  EXPECT_EQ(Down(y), Vec(6, 9.0));

  GemmParams p;
  p.m = 2, p.n = 3, p.k = 4;
  s = Gemm(ctx(), p, {x, 0, 4}, {x, 0, 3}, {y, 0, 3});  // A needs 8 elements
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not fit"), std::string::npos) << s.ToString();
  s = Gemm(ctx(), p, {Up(Vec(8, 1), DType::kBF16), 0, 4}, {Up(Vec(12, 1), DType::kF32), 0, 3},
           {y, 0, 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);  // mixed A/B dtypes
  s = Gemm(ctx(), p, {Up(Vec(8, 1), DType::kF32), 0, 4}, {Up(Vec(12, 1), DType::kF32), 0, 3},
           {Up(Vec(6, 1), DType::kBF16), 0, 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);  // C must be f32 or A's dtype
  EXPECT_EQ(Down(y), Vec(6, 9.0));

  EXPECT_EQ(Copy(ctx(), x, m).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Copy(ctx(), x, Up(Vec(6, 0), DType::kBF16)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Axpy(ctx(), 1.0f, x, m).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Scale(ctx(), Tensor(), 2.0f).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingForward(ctx(), x, Up(Vec{0}, DType::kF32), y).code(),
            StatusCode::kInvalidArgument);  // table rank 1, ids not i32
  EXPECT_EQ(SumOfSquares(ctx(), x, m).code(), StatusCode::kInvalidArgument);  // acc not f64
  EXPECT_EQ(GeluForward(ctx(), x, m).code(), StatusCode::kInvalidArgument);
  AttentionShape as{1, 1, 2, 3, 2, true};  // causal needs q_len == kv_len
  EXPECT_EQ(AttentionForward(ctx(), as, {x, 0, 2}, {x, 0, 2}, {x, 0, 2}, y, {y, 0, 2}).code(),
            StatusCode::kInvalidArgument);
  // Overlapping output and input.
  EXPECT_EQ(Gemm(ctx(), GemmParams{false, false, 1, 1, 1, 1, 1.0f, 0.0f}, {x, 0, 1}, {x, 1, 1},
                 {x, 0, 1})
                .code(),
            StatusCode::kInvalidArgument);

  OpContext none = ctx();
  none.device = nullptr;
  EXPECT_EQ(Fill(none, x, 0.0f).code(), StatusCode::kInvalidArgument);
  none = ctx();
  none.alloc = nullptr;
  EXPECT_EQ(Fill(none, x, 0.0f).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Down(x), (Vec{1, 2, 3, 4, 5, 6}));
}

INSTANTIATE_TEST_SUITE_P(Kinds, Conformance,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const auto& info) { return KindName(info.param); });

// The CPU backend splits large optimizer updates across its intra-op
// threads (FSDP's CPU offload runs AdamW over whole models on the host).
// Elementwise: every split must give one thread's bits, including the
// masked vector tail and a length no split divides.
TEST(CpuBackend, LargeOptimizerUpdatesOnSeveralThreadsKeepOneThreadsBits) {
  auto dev = Device::Get(DeviceId::Cpu(0));
  ASSERT_TRUE(dev.ok());
  HostAllocator alloc;
  OpContext ctx{*dev, nullptr, &alloc};
  const int64_t n = (int64_t{3} << 20) + 1021;  // four parts of >= 2^20 would not fit: three do
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> p0(n), g(n), m0(n), v0(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = normal(rng);
    g[i] = normal(rng);
    m0[i] = 0.1f * normal(rng);
    v0[i] = std::fabs(0.01f * normal(rng));
  }
  auto tensor = [&](const std::vector<float>& v) {
    auto t = alloc.Empty(DType::kF32, Shape{n});
    EXPECT_TRUE(t.ok());
    std::memcpy(t->data(), v.data(), n * sizeof(float));
    return *t;
  };
  const AdamHyper adam{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true, 1.f - 0.9f * 0.9f,
                       std::sqrt(1.f - 0.999f * 0.999f)};
  const SgdHyper sgd{1e-2f, 0.9f, 0.f, 1e-4f, true, false};
  std::vector<std::vector<float>> results[2];
  for (int threads : {1, 4}) {
    ASSERT_TRUE(SetCpuGemmThreads(threads).ok());
    Tensor p = tensor(p0), grad = tensor(g), m = tensor(m0), v = tensor(v0);
    ASSERT_TRUE(AdamUpdate(ctx, adam, p, grad, m, v).ok());
    Tensor q = tensor(p0), mom = tensor(m0);
    ASSERT_TRUE(SgdUpdate(ctx, sgd, q, grad, mom).ok());
    auto& r = results[threads == 1 ? 0 : 1];
    for (const Tensor* t : {&p, &m, &v, &q, &mom}) {
      r.emplace_back(t->data_as<float>(), t->data_as<float>() + n);
    }
  }
  ASSERT_TRUE(SetCpuGemmThreads(1).ok());
  const char* names[] = {"adam param", "adam exp_avg", "adam exp_avg_sq", "sgd param", "sgd momentum"};
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(std::memcmp(results[0][k].data(), results[1][k].data(), n * sizeof(float)), 0) << names[k];
  }
  EXPECT_NE(std::memcmp(results[0][0].data(), p0.data(), n * sizeof(float)), 0);  // it did update
}

// The per-element and per-row passes split over the CPU backend's intra-op
// threads (GELU, LayerNorm forward, a bias broadcast, the bias gradient by
// columns): any cut must give one thread's bits. Lengths no vector or part
// divides.
TEST(CpuBackend, ModelPassesOnSeveralThreadsKeepOneThreadsBits) {
  auto dev = Device::Get(DeviceId::Cpu(0));
  ASSERT_TRUE(dev.ok());
  HostAllocator alloc;
  OpContext ctx{*dev, nullptr, &alloc};
  const int64_t rows = 1031, cols = 389;  // 401,059 elements: 3 and 6 parts of >= 2^16
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto filled = [&](int64_t n) {
    auto t = alloc.Empty(DType::kF32, Shape{n});
    EXPECT_TRUE(t.ok());
    for (int64_t i = 0; i < n; ++i) t->data_as<float>()[i] = normal(rng);
    return *t;
  };
  Tensor x = filled(rows * cols), dy = filled(rows * cols), gamma = filled(cols),
         beta = filled(cols), bias = filled(cols), dbias0 = filled(cols);
  auto bytes = [](const Tensor& t) {
    const char* b = static_cast<const char*>(t.data());
    return std::vector<char>(b, b + t.numel() * DTypeSize(t.dtype()));
  };
  std::vector<std::vector<char>> want;
  for (int threads : {1, 3, 6}) {
    ASSERT_TRUE(SetCpuGemmThreads(threads).ok());
    Tensor y = filled(rows * cols), dx = filled(rows * cols), ln = filled(rows * cols),
           mean = filled(rows), rstd = filled(rows), wide = filled(rows * cols),
           dbias = filled(cols);
    std::memcpy(dbias.data(), dbias0.data(), cols * sizeof(float));
    ASSERT_TRUE(GeluForward(ctx, x, y).ok());
    ASSERT_TRUE(GeluBackward(ctx, x, dy, dx).ok());
    ASSERT_TRUE(LayerNormForward(ctx, x, gamma, beta, ln,
                                 mean, rstd).ok());
    ASSERT_TRUE(BroadcastRows(ctx, bias, wide).ok());
    ASSERT_TRUE(BiasGrad(ctx, dy, dbias).ok());
    std::vector<std::vector<char>> got;
    for (const Tensor* t : {&y, &dx, &ln, &mean, &rstd, &wide, &dbias}) got.push_back(bytes(*t));
    if (threads == 1) {
      want = std::move(got);
      continue;
    }
    const char* names[] = {"gelu", "gelu_bwd", "layer_norm y", "mean", "rstd", "broadcast_rows",
                           "bias_grad"};
    for (int i = 0; i < 7; ++i) {
      EXPECT_TRUE(got[i] == want[i]) << names[i] << " on " << threads << " threads";
    }
  }
  ASSERT_TRUE(SetCpuGemmThreads(1).ok());
}

// Attention spreads over the CPU backend's intra-op threads: ranges of
// sequences, or one sequence's heads cut into ranges when there are fewer
// sequences than threads. Each unit runs the kernel as the whole call does,
// so every split must give one thread's bits, forward and backward, for f32
// and for 16-bit operands (bf16 on bf16 dot products splits as f32 does;
// operands widened to f32 split by sequence only).
TEST(CpuBackend, AttentionOnSeveralThreadsKeepsOneThreadsBits) {
  auto dev = Device::Get(DeviceId::Cpu(0));
  ASSERT_TRUE(dev.ok());
  HostAllocator alloc;
  OpContext ctx{*dev, nullptr, &alloc};
  struct Case {
    AttentionShape s;
    DType t;
  };
  // Work per part is at least 2^22 multiply-adds: the shapes are large
  // enough for 3 and 8 parts.
  const Case cases[] = {
      {{1, 5, 256, 256, 32, true}, DType::kF32},    // one sequence: heads in ranges
      {{2, 5, 256, 256, 32, true}, DType::kF32},    // 8 threads: 4 ranges of <= 2 heads per sequence
      {{5, 4, 128, 128, 64, true}, DType::kF32},    // sequences in ranges (5 over 3 parts)
      {{3, 3, 96, 160, 48, false}, DType::kF32},    // cross attention, ragged lengths
      {{5, 4, 128, 128, 64, true}, DType::kBF16},   // 16-bit: sequence ranges
      {{1, 6, 256, 256, 64, true}, DType::kBF16},   // one sequence: heads (widened: one part)
  };
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Case& c : cases) {
    const AttentionShape& s = c.s;
    const int64_t cols = s.heads * s.head_dim, qn = s.batch * s.q_len * cols,
                  kn = s.batch * s.kv_len * cols;
    auto filled = [&](int64_t n) {
      auto t = alloc.Empty(c.t, Shape{n});
      EXPECT_TRUE(t.ok());
      for (int64_t i = 0; i < n; ++i) StoreFromFloat(t->data(), c.t, i, normal(rng));
      return *t;
    };
    Tensor q = filled(qn), k = filled(kn), v = filled(kn), dout = filled(qn);
    std::vector<std::vector<char>> results[2];
    for (int threads : {1, 3, 8}) {
      ASSERT_TRUE(SetCpuGemmThreads(threads).ok());
      Tensor probs = *alloc.Empty(DType::kF32, Shape{s.batch * s.heads * s.q_len * s.kv_len});
      Tensor out = filled(qn), dq = filled(qn), dk = filled(kn), dv = filled(kn);
      ASSERT_TRUE(AttentionForward(ctx, s, {q, 0, cols}, {k, 0, cols}, {v, 0, cols}, probs,
                                   {out, 0, cols}).ok());
      ASSERT_TRUE(AttentionBackward(ctx, s, {q, 0, cols}, {k, 0, cols}, {v, 0, cols}, probs,
                                    {dout, 0, cols}, {dq, 0, cols}, {dk, 0, cols}, {dv, 0, cols})
                      .ok());
      std::vector<std::vector<char>> r;
      for (const Tensor* t : {&probs, &out, &dq, &dk, &dv}) {
        const char* b = static_cast<const char*>(t->data());
        r.emplace_back(b, b + t->numel() * DTypeSize(t->dtype()));
      }
      if (threads == 1) {
        results[0] = std::move(r);
      } else {
        const char* names[] = {"probs", "out", "dq", "dk", "dv"};
        for (int i = 0; i < 5; ++i) {
          EXPECT_TRUE(r[i] == results[0][i])
              << names[i] << " on " << threads << " threads differs from one thread's: batch "
              << s.batch << " heads " << s.heads << " q_len " << s.q_len << " kv_len " << s.kv_len
              << " dtype " << DTypeName(c.t);
        }
      }
    }
    ASSERT_TRUE(SetCpuGemmThreads(1).ok());
  }
}

// The linear-memory attention spreads its units (a sequence and a key/value
// head with its query heads) over the intra-op threads; every split gives
// one thread's bits, forward and backward, with and without grouping.
TEST(CpuBackend, FlashAttentionOnSeveralThreadsKeepsOneThreadsBits) {
  auto dev = Device::Get(DeviceId::Cpu(0));
  ASSERT_TRUE(dev.ok());
  HostAllocator alloc;
  OpContext ctx{*dev, nullptr, &alloc};
  AttentionShape mha{1, 5, 200, 200, 32, true};
  AttentionShape gqa{3, 4, 130, 130, 16, true};
  gqa.kv_heads = 2;
  AttentionShape cross{2, 3, 70, 150, 8, false};
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const AttentionShape& s : {mha, gqa, cross}) {
    const int64_t cols = s.heads * s.head_dim, kcols = s.KvHeads() * s.head_dim;
    const int64_t qn = s.batch * s.q_len * cols, kn = s.batch * s.kv_len * kcols;
    auto filled = [&](int64_t n) {
      Tensor t = *alloc.Empty(DType::kF32, Shape{n});
      for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = normal(rng);
      return t;
    };
    Tensor q = filled(qn), k = filled(kn), v = filled(kn), dout = filled(qn);
    std::vector<std::vector<float>> first;
    for (int threads : {1, 2, 5}) {
      ASSERT_TRUE(SetCpuGemmThreads(threads).ok());
      Tensor lse = filled(s.batch * s.heads * s.q_len);
      Tensor out = filled(qn), dq = filled(qn), dk = filled(kn), dv = filled(kn);
      ASSERT_TRUE(FlashAttentionForward(ctx, s, {q, 0, cols}, {k, 0, kcols}, {v, 0, kcols},
                                        {out, 0, cols}, lse).ok());
      ASSERT_TRUE(FlashAttentionBackward(ctx, s, {q, 0, cols}, {k, 0, kcols}, {v, 0, kcols},
                                         {out, 0, cols}, {dout, 0, cols}, lse, {dq, 0, cols},
                                         {dk, 0, kcols}, {dv, 0, kcols}).ok());
      std::vector<std::vector<float>> r;
      for (const Tensor* t : {&lse, &out, &dq, &dk, &dv}) {
        r.emplace_back(t->data_as<float>(), t->data_as<float>() + t->numel());
      }
      if (threads == 1) {
        first = std::move(r);
        continue;
      }
      const char* names[] = {"lse", "out", "dq", "dk", "dv"};
      for (int i = 0; i < 5; ++i) {
        EXPECT_TRUE(r[i] == first[i]) << names[i] << " on " << threads
                                      << " threads differs from one thread's: heads " << s.heads
                                      << " kv_heads " << s.KvHeads();
      }
    }
  }
  ASSERT_TRUE(SetCpuGemmThreads(1).ok());
}

}  // namespace
}  // namespace sk::ops
