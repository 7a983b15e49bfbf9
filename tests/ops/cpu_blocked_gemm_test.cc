// The CPU backend's GEMM with 16-bit operands widened to the f32 GEMM (the
// path on CPUs without a faster bf16 matmul: cpu/kernels.h, NativeBf16Gemm)
// runs in bounded blocks: column panels of op(B) and C with all of k, row
// blocks of op(A) and C (cpu/backend_gemm.cc, GemmBlocks). Cutting never splits
// k, so a GEMM of many blocks must give, bit for bit, what one f32 GEMM of
// the whole widened matrices gives (rounded once into a 16-bit C): the
// numbers of the path before it was blocked, when B was widened whole.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/core/dtype.h"
#include "runtime/ops/cpu/cpu_backend.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/ops.h"

namespace sk::ops {
namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  DType ab, c;  // A and B's dtype, C's
  int64_t pad = 0;        // extra elements per stored row of A, B and C (views)
  int64_t batch = 1;
};

std::string Describe(const Case& c) {
  return std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + " " + std::to_string(c.m) + "x" +
         std::to_string(c.n) + "x" + std::to_string(c.k) + " " + std::string(DTypeName(c.ab)) + "->" +
         std::string(DTypeName(c.c)) + " alpha " + std::to_string(c.alpha) + " beta " +
         std::to_string(c.beta) + " pad " + std::to_string(c.pad) + " batch " + std::to_string(c.batch);
}

class CpuBlockedGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = Device::Get(DeviceId::Cpu(0));
    ASSERT_TRUE(dev.ok());
    ctx_ = OpContext{*dev, nullptr, &alloc_};
    native_before_ = SetNativeBf16Gemm(false);  // the widened path, whatever the CPU
    block_before_ = SetCpuGemmBlockElementsForTest(int64_t{1} << 20);
  }
  void TearDown() override {
    SetNativeBf16Gemm(native_before_);
    SetCpuGemmBlockElementsForTest(block_before_);
  }

  // A tensor of `n` values of dtype t drawn from N(0, 1) (rounded to t).
  Tensor Random(DType t, int64_t n) {
    auto x = alloc_.Empty(t, Shape{n});
    EXPECT_TRUE(x.ok());
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int64_t i = 0; i < n; ++i) StoreFromFloat(x->data(), t, static_cast<size_t>(i), normal(rng_));
    return *x;
  }

  // Runs case c through the op layer and through one f32 GEMM of the whole
  // widened matrices per batch entry; expects C's bytes to be identical.
  void Check(const Case& c) {
    SCOPED_TRACE(Describe(c));
    const int64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k;
    const int64_t br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
    const int64_t lda = ac + c.pad, ldb = bc + c.pad, ldc = c.n + c.pad;
    const int64_t sa = ar * lda, sb = br * ldb, sc = c.m * ldc;  // batch strides
    const int64_t off = c.pad;  // every matrix starts `pad` elements in
    Tensor a = Random(c.ab, off + c.batch * sa), b = Random(c.ab, off + c.batch * sb);
    Tensor c0 = Random(c.c, off + c.batch * sc);
    auto out = alloc_.Empty(c.c, Shape{c0.numel()});
    ASSERT_TRUE(out.ok());
    const size_t c_bytes = static_cast<size_t>(c0.numel()) * DTypeSize(c.c);
    std::memcpy(out->data(), c0.data(), c_bytes);

    GemmParams p;
    p.trans_a = c.ta, p.trans_b = c.tb, p.m = c.m, p.n = c.n, p.k = c.k;
    p.alpha = c.alpha, p.beta = c.beta, p.batch = c.batch;
    Status s = Gemm(ctx_, p, MatrixRef{a, off, lda, sa}, MatrixRef{b, off, ldb, sb},
                    MatrixRef{*out, off, ldc, sc});
    ASSERT_TRUE(s.ok()) << s.ToString();

    // The reference: every operand widened whole, one f32 GEMM per matrix,
    // each element of a 16-bit C rounded once.
    std::vector<char> want(static_cast<const char*>(c0.data()),
                           static_cast<const char*>(c0.data()) + c_bytes);
    for (int64_t i = 0; i < c.batch; ++i) {
      std::vector<float> af(ar * ac), bf(br * bc), cf(c.m * c.n);
      for (int64_t r = 0; r < ar; ++r) {
        for (int64_t j = 0; j < ac; ++j) af[r * ac + j] = LoadAsFloat(a.data(), c.ab, off + i * sa + r * lda + j);
      }
      for (int64_t r = 0; r < br; ++r) {
        for (int64_t j = 0; j < bc; ++j) bf[r * bc + j] = LoadAsFloat(b.data(), c.ab, off + i * sb + r * ldb + j);
      }
      for (int64_t r = 0; r < c.m; ++r) {
        for (int64_t j = 0; j < c.n; ++j) cf[r * c.n + j] = LoadAsFloat(c0.data(), c.c, off + i * sc + r * ldc + j);
      }
      sk::Gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, af.data(), ac, bf.data(), bc, c.beta, cf.data(), c.n);
      for (int64_t r = 0; r < c.m; ++r) {
        for (int64_t j = 0; j < c.n; ++j) StoreFromFloat(want.data(), c.c, off + i * sc + r * ldc + j, cf[r * c.n + j]);
      }
    }
    int64_t differing = 0, first = -1;
    for (int64_t e = 0; e < c0.numel(); ++e) {
      const size_t w = DTypeSize(c.c);
      if (std::memcmp(want.data() + e * w, static_cast<const char*>(out->data()) + e * w, w) != 0) {
        if (first < 0) first = e;
        ++differing;
      }
    }
    EXPECT_EQ(differing, 0) << "elements of C differ from one GEMM of the whole; the first at " << first
                            << ": " << LoadAsFloat(out->data(), c.c, first) << " against "
                            << LoadAsFloat(want.data(), c.c, first);
  }

  HostAllocator alloc_;
  OpContext ctx_;
  std::mt19937 rng_{11};
  bool native_before_ = false;
  int64_t block_before_ = 0;
};

// Small blocks (C blocks of 2,000 elements, widened blocks of 8,000; the
// blocks' floor of 64 rows or columns then cuts) over every transpose, the
// 16-bit dtypes, f32 and 16-bit C, beta 0, 1 and other, alpha != 1, views
// with padded rows and offsets, edge panels and blocks no size divides,
// remainders that fixed-size blocks would leave thin (one column; 1-15 rows,
// where oneDNN sums NT products in another order), a batch; on one GEMM
// thread and on two.
TEST_F(CpuBlockedGemm, SmallBlocksAreOneGemmOfTheWholeBitForBit) {
  SetCpuGemmBlockElementsForTest(2000);
  const int threads_before = GemmThreads();
  for (int threads : {1, 2}) {
    ASSERT_TRUE(SetCpuGemmThreads(threads).ok());
    SCOPED_TRACE(std::to_string(threads) + " GEMM threads");
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Check({ta, tb, 197, 301, 83, 1.0f, 0.0f, DType::kBF16, DType::kBF16});
        Check({ta, tb, 197, 301, 83, 1.0f, 1.0f, DType::kBF16, DType::kF32, 3});
        Check({ta, tb, 130, 259, 421, 0.5f, 1.0f, DType::kBF16, DType::kBF16, 5});
        Check({ta, tb, 70, 150, 129, 1.0f, -0.25f, DType::kF16, DType::kF16});
        Check({ta, tb, 150, 70, 1000, 1.0f, 0.0f, DType::kF16, DType::kF32, 0, 3});
        Check({ta, tb, 197, 97, 83, 1.0f, 1.0f, DType::kBF16, DType::kF32});
        Check({ta, tb, 101, 193, 83, 1.0f, 1.0f, DType::kBF16, DType::kF32});
      }
    }
  }
  ASSERT_TRUE(SetCpuGemmThreads(threads_before).ok());
}

// The default blocks on the shapes of the Llama LM head at a 768-wide model
// and a 16384-token vocabulary (llama-100m of benchmarks/torch_compare), 96
// rows: the logits (B = the 768 x 16384 weight, 12.6M elements: 3 panels),
// the input gradient (k = 16384: 3 panels of op(B)) and the weight gradient
// into f32 (B = the logits' gradient, 8.4M elements); and a GEMM large in m
// and n whose whole runs oneDNN's copy-based kernels and its blocks the
// no-copy ones.
TEST_F(CpuBlockedGemm, DefaultBlocksOnLmHeadShapesAreOneGemmOfTheWholeBitForBit) {
  Check({false, false, 96, 16384, 768, 1.0f, 0.0f, DType::kBF16, DType::kBF16});
  Check({false, true, 96, 768, 16384, 1.0f, 1.0f, DType::kBF16, DType::kBF16});
  Check({true, false, 96, 16384, 512, 1.0f, 1.0f, DType::kBF16, DType::kF32});
  Check({false, false, 1024, 4096, 768, 1.0f, 1.0f, DType::kBF16, DType::kBF16});
}

}  // namespace
}  // namespace sk::ops
