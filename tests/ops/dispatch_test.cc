// The dispatcher: costs computed once per call and handed to Account() before
// the op, backends registered per device kind, a backend that only prices
// (the simulator's shape) never asked to execute, and the exact cost formulas.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/ops/op_timing.h"
#include "runtime/ops/ops.h"

namespace sk::ops {
namespace {

// A device kind nobody else uses, standing in for the simulator.
constexpr DeviceKind kFakeKind = static_cast<DeviceKind>(9);

class FakeDevice final : public Device {
 public:
  DeviceId id() const override { return DeviceId{kFakeKind, 0}; }
  StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view) override {
    return UnimplementedError("fake");
  }
  StatusOr<std::unique_ptr<Event>> CreateEvent(bool) override { return UnimplementedError("fake"); }
  StatusOr<void*> RawAllocate(size_t) override { return UnimplementedError("fake"); }
  void RawFree(void*, size_t) override {}
  Status CopyAsync(void*, const void*, size_t, Stream&) override { return UnimplementedError("fake"); }
};

// Hands out storages without memory on the fake device: the simulator's tensors.
class NoDataAllocator final : public Allocator {
 public:
  DeviceId device() const override { return DeviceId{kFakeKind, 0}; }
  StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) override {
    return std::make_shared<Storage>(nullptr, nbytes, device(), nullptr, nullptr, nullptr);
  }
};

// A stream that is never run; the op layer only passes it to Account().
class NullStream final : public Stream {
 public:
  DeviceId device() const override { return DeviceId{kFakeKind, 0}; }
  int64_t id() const override { return 1; }
  const std::string& name() const override { return name_; }
  Status Enqueue(std::function<Status()>) override { return UnimplementedError("fake"); }
  Status WaitEvent(const Event&) override { return OkStatus(); }
  Status Synchronize(Duration) override { return OkStatus(); }
  bool Query() const override { return true; }
  Status error() const override { return OkStatus(); }
  void ClearError() override {}

 private:
  std::string name_ = "null";
};

class PricingBackend final : public OpBackend {
 public:
  const char* name() const override { return "pricing"; }
  bool executes() const override { return false; }
  Status Account(const OpContext& ctx, const OpCost& cost) override {
    costs.push_back(cost);
    streams.push_back(ctx.stream);
    return fail_next ? InternalError("refused") : OkStatus();
  }
  bool GemmAddsResidual(const GemmParams&, DType, DType, DType, DType) const override {
    return fuses_residual;
  }
  std::vector<OpCost> costs;
  std::vector<Stream*> streams;
  bool fail_next = false;
  bool fuses_residual = false;
};

class DispatchTest : public ::testing::Test {
 protected:
  void SetUp() override { RegisterOpBackend(kFakeKind, &backend_); }
  void TearDown() override { RegisterOpBackend(kFakeKind, nullptr); }

  Tensor T(DType t, Shape s) { return *alloc_.Empty(t, std::move(s)); }
  OpContext ctx() { return OpContext{&device_, &stream_, &alloc_}; }

  FakeDevice device_;
  NullStream stream_;
  NoDataAllocator alloc_;
  PricingBackend backend_;
};

TEST_F(DispatchTest, NonExecutingBackendIsAccountedOnceAndNeverExecuted) {
  // The tensors have no memory: executing any op would crash.
  Tensor x = T(DType::kF32, Shape{64, 32}), g = T(DType::kF32, Shape{32}),
         mean = T(DType::kF32, Shape{64}), w = T(DType::kBF16, Shape{32, 48}),
         y = T(DType::kF32, Shape{64, 48});
  GemmParams p;
  p.m = 64, p.n = 48, p.k = 32;
  ASSERT_TRUE(Gemm(ctx(), p, {T(DType::kBF16, Shape{64, 32}), 0, 32}, {w, 0, 48}, {y, 0, 48}).ok());
  ASSERT_TRUE(LayerNormForward(ctx(), x, g, g, T(DType::kF32, Shape{64, 32}), mean, mean).ok());
  ASSERT_TRUE(GeluForward(ctx(), y, y).ok());
  auto loss = ReadScalar(ctx(), T(DType::kF32, Shape{1}));
  ASSERT_TRUE(loss.ok());
  EXPECT_TRUE(std::isnan(*loss));  // simulated values read back as NaN

  ASSERT_EQ(backend_.costs.size(), 4u);
  EXPECT_STREQ(backend_.costs[0].name, "gemm");
  EXPECT_EQ(backend_.costs[0].dtype, DType::kBF16);
  EXPECT_EQ(backend_.costs[0].m, 64);
  EXPECT_EQ(backend_.costs[0].n, 48);
  EXPECT_EQ(backend_.costs[0].k, 32);
  EXPECT_STREQ(backend_.costs[1].name, "layer_norm_fwd");
  EXPECT_STREQ(backend_.costs[2].name, "gelu_fwd");
  EXPECT_STREQ(backend_.costs[3].name, "read_scalar");
  for (Stream* s : backend_.streams) EXPECT_EQ(s, &stream_);
}

// A backend that does not add a bias inside its GEMM (the simulator, CUDA)
// is asked for the two ops GemmBias means, priced as they always were: the
// bias written into C, then a GEMM that reads C.
TEST_F(DispatchTest, GemmBiasIsTwoOpsOnABackendWithoutAFusedBias) {
  Tensor x = T(DType::kBF16, Shape{64, 32}), w = T(DType::kBF16, Shape{32, 48}),
         bias = T(DType::kBF16, Shape{48}), y = T(DType::kBF16, Shape{64, 48});
  GemmParams p;
  p.m = 64, p.n = 48, p.k = 32;
  ASSERT_TRUE(GemmBias(ctx(), p, {x, 0, 32}, {w, 0, 48}, bias, {y, 0, 48}).ok());
  ASSERT_EQ(backend_.costs.size(), 2u);
  EXPECT_STREQ(backend_.costs[0].name, "broadcast_rows");
  EXPECT_STREQ(backend_.costs[1].name, "gemm");
  EXPECT_EQ(backend_.costs[1].bytes_read,
            GemmCost(64, 48, 32, 1, DType::kBF16, /*reads_c=*/true, DType::kBF16).bytes_read);
}

// Without a fused residual (the simulator, cpu) GemmBiasResidual is the ops
// that define it, each priced as always: the linear layer into an f32
// temporary, the residual added, the cast into a 16-bit C; into an f32 C
// the linear layer and the add.
TEST_F(DispatchTest, GemmBiasResidualIsItsOpsOnABackendWithoutAFusedResidual) {
  Tensor x = T(DType::kBF16, Shape{64, 32}), w = T(DType::kBF16, Shape{32, 48}),
         bias = T(DType::kBF16, Shape{48}), res = T(DType::kBF16, Shape{64, 48});
  GemmParams p;
  p.m = 64, p.n = 48, p.k = 32;
  ASSERT_TRUE(GemmBiasResidual(ctx(), p, {x, 0, 32}, {w, 0, 48}, bias, res,
                               {T(DType::kBF16, Shape{64, 48}), 0, 48})
                  .ok());
  ASSERT_EQ(backend_.costs.size(), 4u);
  EXPECT_STREQ(backend_.costs[0].name, "broadcast_rows");
  EXPECT_STREQ(backend_.costs[1].name, "gemm");
  EXPECT_STREQ(backend_.costs[2].name, "axpy");
  EXPECT_STREQ(backend_.costs[3].name, "cast");
  backend_.costs.clear();
  ASSERT_TRUE(GemmBiasResidual(ctx(), p, {x, 0, 32}, {w, 0, 48}, bias, res,
                               {T(DType::kF32, Shape{64, 48}), 0, 48})
                  .ok());
  ASSERT_EQ(backend_.costs.size(), 3u);
  EXPECT_STREQ(backend_.costs[2].name, "axpy");
}

// A backend that fuses it (cuda) is asked for one GEMM that reads the
// residual as its C and the bias, and writes C once.
TEST_F(DispatchTest, GemmBiasResidualIsOneGemmOnABackendThatFusesIt) {
  backend_.fuses_residual = true;
  Tensor x = T(DType::kBF16, Shape{64, 32}), w = T(DType::kBF16, Shape{32, 48}),
         bias = T(DType::kBF16, Shape{48}), res = T(DType::kBF16, Shape{64, 48});
  GemmParams p;
  p.m = 64, p.n = 48, p.k = 32;
  ASSERT_TRUE(GemmBiasResidual(ctx(), p, {x, 0, 32}, {w, 0, 48}, bias, res,
                               {T(DType::kBF16, Shape{64, 48}), 0, 48})
                  .ok());
  ASSERT_EQ(backend_.costs.size(), 1u);
  const OpCost& c = backend_.costs[0];
  EXPECT_STREQ(c.name, "gemm_bias_residual");
  EXPECT_EQ(c.cls, OpClass::kGemm);
  const OpCost gemm = GemmCost(64, 48, 32, 1, DType::kBF16, /*reads_c=*/true, DType::kBF16);
  EXPECT_EQ(c.flops, gemm.flops);
  EXPECT_EQ(c.bytes_read, gemm.bytes_read + 48 * 2);
  EXPECT_EQ(c.bytes_written, gemm.bytes_written);
}

TEST_F(DispatchTest, AccountErrorIsTheOpsResult) {
  backend_.fail_next = true;
  EXPECT_EQ(Fill(ctx(), T(DType::kF32, Shape{4}), 0.0f).code(), StatusCode::kInternal);
}

TEST_F(DispatchTest, InvalidArgumentsAreRejectedBeforeAccounting) {
  EXPECT_EQ(Axpy(ctx(), 1.0f, T(DType::kF32, Shape{4}), T(DType::kF32, Shape{5})).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend_.costs.empty());
}

TEST_F(DispatchTest, NonCpuKindsNeedAStream) {
  OpContext c = ctx();
  c.stream = nullptr;
  EXPECT_EQ(Fill(c, T(DType::kF32, Shape{4}), 0.0f).code(), StatusCode::kInvalidArgument);
}

TEST_F(DispatchTest, TensorsOnAnotherKindAreRejected) {
  auto host = HostAllocator::Default().Empty(DType::kF32, Shape{4});
  ASSERT_TRUE(host.ok());
  Status s = Fill(ctx(), *host, 0.0f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not on the context's device"), std::string::npos) << s.ToString();
  // Copy accepts a host side: token ids travel to the device this way.
  EXPECT_TRUE(Copy(ctx(), *host, T(DType::kF32, Shape{4})).ok());
}

TEST_F(DispatchTest, UnregisteredKindIsUnavailable) {
  RegisterOpBackend(kFakeKind, nullptr);
  EXPECT_EQ(Fill(ctx(), T(DType::kF32, Shape{4}), 0.0f).code(), StatusCode::kUnavailable);
  EXPECT_NE(BackendFor(DeviceKind::kCpu), nullptr);
}

TEST_F(DispatchTest, DefaultBackendMethodsAreUnimplemented) {
  class OnlyAccounts final : public OpBackend {
   public:
    const char* name() const override { return "partial"; }
    bool executes() const override { return true; }
  } partial;
  RegisterOpBackend(kFakeKind, &partial);
  Status s = Fill(ctx(), T(DType::kF32, Shape{4}), 0.0f);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("fill is not implemented by the partial op backend"),
            std::string::npos)
      << s.ToString();
}

// Records what the timing observer reports (op_timing.h).
class Recorder final : public OpTimingObserver {
 public:
  void OnOp(const OpCost& cost, double seconds) override {
    names.push_back(cost.name);
    bytes.push_back(cost.bytes_read + cost.bytes_written);
    times.push_back(seconds);
  }
  std::vector<std::string> names;
  std::vector<double> bytes, times;
};

TEST_F(DispatchTest, TimingObserverSeesExecutedCpuOpsOnly) {
  const OpContext host = HostContext();
  Tensor x = *HostAllocator::Default().Empty(DType::kF32, Shape{1000});
  Tensor y = *HostAllocator::Default().Zeros(DType::kF32, Shape{1000});
  Recorder rec;
  SetOpTimingObserver(&rec);
  ASSERT_TRUE(Fill(host, x, 1.0f).ok());
  ASSERT_TRUE(Axpy(host, 2.0f, x, y).ok());
  // Rejected before it runs: not reported.
  EXPECT_FALSE(Axpy(host, 1.0f, x, *HostAllocator::Default().Empty(DType::kF32, Shape{5})).ok());
  // A non-executing backend's op is priced, never run: not reported.
  ASSERT_TRUE(Fill(ctx(), T(DType::kF32, Shape{4}), 0.0f).ok());
  SetOpTimingObserver(nullptr);
  ASSERT_TRUE(Fill(host, x, 3.0f).ok());  // removed: not reported

  ASSERT_EQ(rec.names.size(), 2u);
  EXPECT_EQ(rec.names[0], "fill");
  EXPECT_EQ(rec.names[1], "axpy");
  EXPECT_DOUBLE_EQ(rec.bytes[1], AxpyCost(1000, DType::kF32, DType::kF32).bytes_read +
                                     AxpyCost(1000, DType::kF32, DType::kF32).bytes_written);
  for (double t : rec.times) EXPECT_GE(t, 0.0);
  // Timing does not change what runs.
  EXPECT_EQ(static_cast<const float*>(y.data())[999], 2.0f);
  EXPECT_EQ(static_cast<const float*>(x.data())[999], 3.0f);
}

// ---- Cost formulas ------------------------------------------------------------

TEST(Cost, GemmCountsTwoFlopsPerMultiplyAdd) {
  OpCost c = GemmCost(7, 13, 17, 3, DType::kBF16, /*reads_c=*/false);
  EXPECT_STREQ(c.name, "gemm");
  EXPECT_EQ(c.cls, OpClass::kGemm);
  EXPECT_EQ(c.flops, 2.0 * 7 * 13 * 17 * 3);
  EXPECT_EQ(c.bytes_read, 3.0 * (7 * 17 + 17 * 13) * 2);
  EXPECT_EQ(c.bytes_written, 3.0 * 7 * 13 * 4);
  EXPECT_EQ(c.m, 7);
  EXPECT_EQ(c.n, 13);
  EXPECT_EQ(c.k, 17);
  EXPECT_EQ(c.batch, 3);
  EXPECT_EQ(c.dtype, DType::kBF16);
  OpCost acc = GemmCost(7, 13, 17, 1, DType::kF32, /*reads_c=*/true);
  EXPECT_EQ(acc.bytes_read, (7.0 * 17 + 17 * 13) * 4 + 7.0 * 13 * 4);
}

TEST(Cost, DispatcherUsesBetaToDecideWhetherCIsRead) {
  // beta = 0 overwrites C; beta != 0 reads it: the cost says so.
  EXPECT_LT(GemmCost(4, 4, 4, 1, DType::kF32, false).bytes_read,
            GemmCost(4, 4, 4, 1, DType::kF32, true).bytes_read);
}

TEST(Cost, ElementwiseAndCopies) {
  OpCost cast = CastCost(100, DType::kF32, DType::kBF16);
  EXPECT_EQ(cast.bytes_read, 400);
  EXPECT_EQ(cast.bytes_written, 200);
  EXPECT_EQ(cast.flops, 0);
  OpCost axpy = AxpyCost(10, DType::kF32, DType::kBF16);
  EXPECT_EQ(axpy.flops, 20);
  EXPECT_EQ(axpy.bytes_read, 10 * (4 + 2));
  EXPECT_EQ(axpy.bytes_written, 20);
  EXPECT_EQ(GeluForwardCost(10).flops, 10 * kGeluForwardFlops);
  EXPECT_EQ(CopyCost(5, DType::kI32).bytes_written, 20);
  EXPECT_EQ(FillCost(8, DType::kF16).bytes_written, 16);
  EXPECT_EQ(FillCost(8, DType::kF16).bytes_read, 0);
}

TEST(Cost, LayerNormAttentionLossOptimizer) {
  OpCost ln = LayerNormForwardCost(8, 32);
  EXPECT_EQ(ln.flops, kLayerNormForwardFlops * 8 * 32);
  EXPECT_EQ(ln.bytes_read, (8.0 * 32 + 2 * 32) * 4);
  EXPECT_EQ(ln.bytes_written, (8.0 * 32 + 2 * 8) * 4);
  OpCost att = AttentionForwardCost(2, 3, 5, 7, 4);
  EXPECT_EQ(att.flops, 2 * 3 * (2.0 * 2 * 5 * 7 * 4 + kSoftmaxFlops * 5 * 7));
  EXPECT_EQ(att.bytes_written, (2.0 * 3 * 5 * 7 + 2.0 * 3 * 5 * 4) * 4);
  OpCost attb = AttentionBackwardCost(2, 3, 5, 7, 4);
  EXPECT_EQ(attb.flops, 2 * 3 * (4 * 2.0 * 5 * 7 * 4 + kSoftmaxBackwardFlops * 5 * 7));
  OpCost ce = CrossEntropyForwardCost(6, 50);
  EXPECT_EQ(ce.bytes_read, 6.0 * 50 * 4 + 6 * 4);
  EXPECT_EQ(ce.bytes_written, 4);
  EXPECT_STREQ(AdamUpdateCost(10, true).name, "adamw_update");
  EXPECT_STREQ(AdamUpdateCost(10, false).name, "adam_update");
  EXPECT_EQ(AdamUpdateCost(10, true).bytes_read, 160);
  EXPECT_EQ(AdamUpdateCost(10, true).bytes_written, 120);
  EXPECT_EQ(SgdUpdateCost(10, false).bytes_read, 80);
  EXPECT_EQ(SgdUpdateCost(10, true).bytes_written, 80);
  EXPECT_EQ(SumOfSquaresCost(10, DType::kBF16).bytes_read, 20 + 8);
  EXPECT_EQ(OpClassName(OpClass::kAttention), "attention");
}

}  // namespace
}  // namespace sk::ops
