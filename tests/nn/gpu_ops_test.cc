// The CUDA ops against the CPU kernels they mirror. Skips (GTEST_SKIP) when
// no CUDA device is usable: built without --config=cuda, no driver, or no GPU.
#include "runtime/nn/cuda/gpu_ops.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/kernels.h"

namespace sk {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Device copy of a host vector, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    auto p = gpu::Malloc(sizeof(T) * n_);
    CHECK(p.ok()) << p.status();
    ptr_ = static_cast<T*>(*p);
    CHECK(gpu::CopyToDevice(ptr_, host.data(), sizeof(T) * n_).ok());
  }
  ~DeviceBuffer() { gpu::Free(ptr_); }
  T* get() const { return ptr_; }
  std::vector<T> ToHost() const {
    std::vector<T> h(n_);
    CHECK(gpu::Synchronize().ok());
    CHECK(gpu::CopyToHost(h.data(), ptr_, sizeof(T) * n_).ok());
    return h;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float tol,
                const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0f, std::fabs(want[i]))) << what << "[" << i << "]";
  }
}

class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (gpu::CudaDeviceCount(&reason) == 0) GTEST_SKIP() << "no CUDA device: " << reason;
  }
};

TEST(GpuOpsWithoutDevice, AllocationFailsCleanlyWhenNoDeviceIsUsable) {
  std::string reason;
  if (gpu::CudaDeviceCount(&reason) > 0) GTEST_SKIP() << "a device is present";
  EXPECT_FALSE(reason.empty());
  EXPECT_FALSE(gpu::Malloc(1024).ok());
}

TEST_F(GpuOps, CublasGemmMatchesCpuGemmForEveryTransposition) {
  const int64_t m = 33, n = 17, k = 65;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Random(m * k, 1), b = Random(k * n, 2), c = Random(m * n, 3);
      const int64_t lda = ta ? m : k, ldb = tb ? k : n;
      std::vector<float> want = c;
      Gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, want.data(), n);
      DeviceBuffer<float> da(a), db(b), dc(c);
      ASSERT_TRUE(gpu::Gemm(ta, tb, m, n, k, 0.5f, da.get(), lda, db.get(), ldb, 2.0f, dc.get(), n).ok());
      ExpectNear(dc.ToHost(), want, 1e-4f, "gemm");
    }
  }
}

TEST_F(GpuOps, GeluForwardAndBackwardMatchCpu) {
  auto x = Random(1000, 4), dy = Random(1000, 5);
  std::vector<float> y(1000), dx(1000);
  GeluForward(x.data(), 1000, y.data());
  GeluBackward(x.data(), dy.data(), 1000, dx.data());
  DeviceBuffer<float> dxb(x), ddy(dy), dyb(y), ddx(dx);
  ASSERT_TRUE(gpu::GeluForward(dxb.get(), 1000, dyb.get()).ok());
  ASSERT_TRUE(gpu::GeluBackward(dxb.get(), ddy.get(), 1000, ddx.get()).ok());
  ExpectNear(dyb.ToHost(), y, 1e-5f, "y");
  ExpectNear(ddx.ToHost(), dx, 1e-5f, "dx");
}

TEST_F(GpuOps, LayerNormForwardAndBackwardMatchCpu) {
  const int64_t rows = 37, cols = 64;
  auto x = Random(rows * cols, 6), g = Random(cols, 7), b = Random(cols, 8), dy = Random(rows * cols, 9);
  std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols, 0.0f), dg(cols, 0.0f),
      dbeta(cols, 0.0f);
  LayerNormForward(x.data(), g.data(), b.data(), rows, cols, y.data(), mean.data(), rstd.data());
  LayerNormBackward(x.data(), g.data(), dy.data(), mean.data(), rstd.data(), rows, cols, dx.data(),
                    dg.data(), dbeta.data());
  DeviceBuffer<float> dX(x), dG(g), dB(b), dDY(dy), dYo(y), dM(mean), dR(rstd),
      dDX(std::vector<float>(rows * cols, 0.0f)), dDG(std::vector<float>(cols, 0.0f)),
      dDB(std::vector<float>(cols, 0.0f));
  ASSERT_TRUE(gpu::LayerNormForward(dX.get(), dG.get(), dB.get(), rows, cols, dYo.get(), dM.get(), dR.get()).ok());
  ASSERT_TRUE(gpu::LayerNormBackward(dX.get(), dG.get(), dDY.get(), dM.get(), dR.get(), rows, cols,
                                     dDX.get(), dDG.get(), dDB.get()).ok());
  ExpectNear(dYo.ToHost(), y, 1e-5f, "y");
  ExpectNear(dDX.ToHost(), dx, 1e-4f, "dx");
  ExpectNear(dDG.ToHost(), dg, 1e-4f, "dgamma");
  ExpectNear(dDB.ToHost(), dbeta, 1e-4f, "dbeta");
}

TEST_F(GpuOps, SoftmaxAndCrossEntropyMatchCpu) {
  const int64_t rows = 20, vocab = 50;
  auto logits = Random(rows * vocab, 10);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 3 == 0 ? kIgnoreTarget : static_cast<int32_t>(r * 7 % vocab);
  std::vector<float> soft(rows * vocab), dlogits(rows * vocab);
  SoftmaxForward(logits.data(), rows, vocab, soft.data());
  int64_t count = 0;
  float loss = CrossEntropyForward(logits.data(), targets.data(), rows, vocab, &count);
  CrossEntropyBackward(logits.data(), targets.data(), rows, vocab, 1.0f / count, dlogits.data());
  DeviceBuffer<float> dL(logits), dS(logits), dD(dlogits), dRow(std::vector<float>(rows, 0.0f));
  DeviceBuffer<int32_t> dT(targets);
  ASSERT_TRUE(gpu::SoftmaxRowsInPlace(dS.get(), rows, vocab).ok());
  ASSERT_TRUE(gpu::CrossEntropyForward(dL.get(), dT.get(), rows, vocab, dRow.get()).ok());
  ASSERT_TRUE(gpu::CrossEntropyBackward(dL.get(), dT.get(), rows, vocab, 1.0f / count, dD.get()).ok());
  ExpectNear(dS.ToHost(), soft, 1e-5f, "softmax");
  ExpectNear(dD.ToHost(), dlogits, 1e-5f, "dlogits");
  double sum = 0;
  for (float l : dRow.ToHost()) sum += l;
  EXPECT_NEAR(sum / count, loss, 1e-4);
}

}  // namespace
}  // namespace sk
