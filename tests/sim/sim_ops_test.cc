// The sim op backend (runtime/sim/sim_ops.h): ops dispatched on sim tensors
// execute nothing and land on the stream's virtual clock at their price.
#include "runtime/sim/sim_ops.h"

#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/memory/caching_allocator.h"
#include "runtime/ops/ops.h"

namespace sk::sim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class SimOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<SimProfile> p = LoadProfile("a100-80g");
    ASSERT_TRUE(p.ok()) << p.status();
    profile_ = *p;
    StatusOr<SimDevice*> d = SetUpSimDevice(40, profile_);
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = *d;
    stream_ = std::move(device_->CreateStream("compute")).value();
    caching_ = std::make_unique<CachingAllocator>(device_);
    alloc_ = std::make_unique<StreamAllocator>(caching_.get(), stream_.get());
    ctx_ = ops::OpContext{device_, stream_.get(), alloc_.get()};
  }
  void TearDown() override {
    alloc_.reset();
    caching_.reset();
  }
  Tensor Empty(DType t, Shape s) { return alloc_->Empty(t, std::move(s)).value(); }

  SimProfile profile_;
  SimDevice* device_ = nullptr;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<CachingAllocator> caching_;
  std::unique_ptr<StreamAllocator> alloc_;
  ops::OpContext ctx_;
};

TEST_F(SimOpsTest, GemmLandsOnTheStreamAtItsPrice) {
  const int64_t m = 4096, n = 4096, k = 4096;
  Tensor a = Empty(DType::kBF16, Shape({m, k}));
  Tensor b = Empty(DType::kBF16, Shape({k, n}));
  Tensor c = Empty(DType::kF32, Shape({m, n}));
  EXPECT_TRUE(SimDevice::IsSimAddress(a.data()));
  // Allocating the operands cost the host raw allocations (cudaMalloc).
  EXPECT_NEAR(device_->HostClock(), 3 * profile_.device.raw_alloc_s, 1e-12);
  device_->set_record_spans(true);
  ops::GemmParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  const double host0 = device_->HostClock();
  ASSERT_TRUE(ops::Gemm(ctx_, p, {a, 0, k, 0}, {b, 0, n, 0}, {c, 0, n, 0}).ok());
  const double expected = OpSeconds(profile_.compute, ops::GemmCost(m, n, k, 1, DType::kBF16, false));
  const double launch = profile_.device.launch_overhead_s;
  EXPECT_NEAR(device_->StreamClock(*stream_), host0 + launch + expected, 1e-12);
  EXPECT_NEAR(device_->HostClock(), host0 + launch, 1e-12);  // the host ran ahead
  ASSERT_EQ(device_->spans().size(), 1u);
  EXPECT_EQ(device_->spans()[0].name, "gemm");
  // Roughly what this bf16 GEMM takes inside shardkit's step on an A100 (the
  // default kernels): 2*4096^3 flops at ~170 TFLOP/s, 0.70 of cuBLAS's
  // isolated ~230.
  EXPECT_GT(expected, 0.65e-3);
  EXPECT_LT(expected, 0.95e-3);
}

// Fused attention is priced by its shape (cost.h: m queries, n keys per
// query, k head_dim, batch sequences x heads) at the profile's attention
// efficiency, not at the GEMM rate; longer sequences run closer to it.
TEST(SimOpPricingTest, FusedAttentionIsPricedByItsShape) {
  StatusOr<SimProfile> p = LoadProfile("a100-80g");
  ASSERT_TRUE(p.ok()) << p.status();
  const ComputeProfile& c = p->compute;
  ASSERT_TRUE(c.attention.has_value());
  const ops::OpCost fwd = ops::FlashAttentionForwardCost(2, 32, 4096, 4096, 128, /*causal=*/true, DType::kBF16);
  EXPECT_EQ(fwd.m, 4096);
  EXPECT_EQ(fwd.n, 2049);  // (4096 + 1) / 2 keys per query on average, rounded up
  EXPECT_EQ(fwd.k, 128);
  EXPECT_EQ(fwd.batch, 64);
  const double eff = AttentionEfficiency(c, false, fwd.m, fwd.n, fwd.batch, fwd.k, /*causal=*/true);
  EXPECT_NEAR(OpSeconds(c, fwd), fwd.flops / (c.gemm_peak_flops.at(DType::kBF16) * eff) + c.kernel_overhead_s,
              1e-12);
  const ops::OpCost bwd = ops::FlashAttentionBackwardCost(2, 32, 4096, 4096, 128, true, DType::kBF16);
  EXPECT_LT(AttentionEfficiency(c, true, bwd.m, bwd.n, bwd.batch, bwd.k, true), eff);  // backward runs slower
  const ops::OpCost longer = ops::FlashAttentionForwardCost(1, 32, 16384, 16384, 128, true, DType::kBF16);
  EXPECT_GT(longer.flops / OpSeconds(c, longer), fwd.flops / OpSeconds(c, fwd));
}

// The GPU profiles price a published benchmark call at the published rate:
// FlashAttention-2 on the H100, causal, head dim 128, 4 x 4096 tokens of 16
// heads (the FlashAttention-3 paper's call; bar: 319 TFLOP/s). The op's
// declared flops add the softmax's (5 per pair) to the paper's count (4 per
// pair and head dimension), so the rate over them is that much higher.
TEST(SimOpPricingTest, PublishedAttentionCallRunsAtThePublishedRate) {
  StatusOr<SimProfile> p = LoadProfile("h100-80g");
  ASSERT_TRUE(p.ok()) << p.status();
  const ops::OpCost fwd = ops::FlashAttentionForwardCost(4, 16, 4096, 4096, 128, true, DType::kBF16);
  const double seconds = OpSeconds(p->compute, fwd) - p->compute.kernel_overhead_s;
  const double paper_flops = 4.0 * 4 * 16 * 4096.0 * 4096 / 2 * 128;
  // The same wave as the published call, and 4096 (4097 / 2) pairs per row.
  EXPECT_NEAR(paper_flops / seconds / 1e12, 319.0 * (4096.0 * 128 * 4) / (4097.0 * (4 * 128 + 5)), 0.5);
  // Without the mask: the other panel's bar (368), every pair counted.
  const ops::OpCost open = ops::FlashAttentionForwardCost(4, 16, 4096, 4096, 128, false, DType::kBF16);
  const double open_seconds = OpSeconds(p->compute, open) - p->compute.kernel_overhead_s;
  EXPECT_NEAR(2 * paper_flops / open_seconds / 1e12, 368.0 * (4.0 * 128) / (4 * 128 + 5), 0.5);
}

// Packed documents: a CUDA GPU's profile prices the composed attention the
// CUDA backend runs for them (every score pair through cuBLAS, the f32
// probabilities through memory), so ten documents of 409 tokens cost no
// less than one causal row of 4096, and more than the fused kernel on
// it; the CPU's profile keeps the masked pairs (its kernels skip the
// blocks across documents).
TEST(SimOpPricingTest, PackedAttentionOnACudaProfileIsPricedAsTheComposedPathRunsIt) {
  const int64_t b = 2, h = 32, t = 4096, d = 128;
  // Ten documents per row (the last one longer): sum over queries of
  // (position in its document + 1).
  int64_t pairs = 0;
  for (int64_t i = 0; i < t; ++i) pairs += i - std::min<int64_t>(i / 409, 9) * 409 + 1;
  pairs *= b;
  for (const char* name : {"a100-80g", "h100-80g", "h200-141g"}) {
    SCOPED_TRACE(name);
    StatusOr<SimProfile> p = LoadProfile(name);
    ASSERT_TRUE(p.ok()) << p.status();
    const ComputeProfile& c = p->compute;
    ASSERT_TRUE(c.attention.has_value());
    for (bool backward : {false, true}) {
      const ops::OpCost causal =
          backward ? ops::FlashAttentionBackwardCost(b, h, t, t, d, true, DType::kBF16)
                   : ops::FlashAttentionForwardCost(b, h, t, t, d, true, DType::kBF16);
      const ops::OpCost packed =
          backward ? ops::FlashAttentionBackwardCost(b, h, t, t, d, true, DType::kBF16, 0, pairs)
                   : ops::FlashAttentionForwardCost(b, h, t, t, d, true, DType::kBF16, 0, pairs);
      EXPECT_LT(packed.flops, causal.flops / 5) << "the op still declares the masked pairs";
      EXPECT_EQ(causal.composed_kernels, 0);
      EXPECT_EQ(packed.composed_kernels, backward ? 7 : 4);
      // The composed path's GEMMs compute all b h t t pairs.
      EXPECT_NEAR(packed.composed_flops,
                  (backward ? 5.0 : 2.0) * 2.0 * b * h * t * t * d +
                      (backward ? ops::kSoftmaxFlops + ops::kSoftmaxBackwardFlops : ops::kSoftmaxFlops + 3.0) *
                          b * h * t * t,
                  1.0);
      EXPECT_GE(OpSeconds(c, packed), OpSeconds(c, causal)) << (backward ? "backward" : "forward");
      const double rate = c.gemm_peak_flops.at(DType::kBF16) *
                          (c.gemm_efficiency_by_dtype.count(DType::kBF16) ? c.gemm_efficiency_by_dtype.at(DType::kBF16)
                                                                          : c.gemm_efficiency);
      EXPECT_NEAR(OpSeconds(c, packed),
                  std::max(packed.composed_flops / rate, packed.composed_bytes / c.memory_bandwidth) +
                      packed.composed_kernels * c.kernel_overhead_s,
                  1e-12);
    }
  }
  StatusOr<SimProfile> cpu = LoadProfile("cpu-local");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_FALSE(cpu->compute.attention.has_value());
  const ops::OpCost causal = ops::FlashAttentionForwardCost(b, h, t, t, d, true, DType::kF32);
  const ops::OpCost packed = ops::FlashAttentionForwardCost(b, h, t, t, d, true, DType::kF32, 0, pairs);
  EXPECT_LT(OpSeconds(cpu->compute, packed), OpSeconds(cpu->compute, causal) / 5);
  // The CPU's linear-memory attention is priced from its own measured rates
  // (calibrate: flash_attention_fwd/bwd by flops), not the GEMM table's.
  ASSERT_EQ(cpu->compute.op_rates.count("flash_attention_fwd"), 1u);
  EXPECT_DOUBLE_EQ(OpSeconds(cpu->compute, causal),
                   KernelSeconds(cpu->compute, "flash_attention_fwd", causal.flops,
                                 causal.bytes_read + causal.bytes_written));
}

TEST_F(SimOpsTest, ReadScalarIsNaNAndSynchronisesTheHost) {
  Tensor x = Empty(DType::kF32, Shape({1 << 20}));
  Tensor acc = Empty(DType::kF64, Shape({1}));
  ASSERT_TRUE(ops::SumOfSquares(ctx_, x, acc).ok());
  EXPECT_LT(device_->HostClock(), device_->StreamClock(*stream_));
  StatusOr<double> v = ops::ReadScalar(ctx_, acc);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(std::isnan(*v));
  EXPECT_DOUBLE_EQ(device_->HostClock(), device_->StreamClock(*stream_));
}

// One read of many values is one host synchronisation and one span, timed
// by its bytes (FSDP's grad-norm partials of a shard group: it was one
// read_scalar per rank).
TEST_F(SimOpsTest, ReadValuesIsNaNsInOneSpanAndSynchronisesTheHost) {
  Tensor x = Empty(DType::kF32, Shape({1 << 20}));
  Tensor acc = Empty(DType::kF64, Shape({1}));
  ASSERT_TRUE(ops::SumOfSquares(ctx_, x, acc).ok());
  Tensor partials = Empty(DType::kF32, Shape({4096}));
  const size_t spans = device_->spans().size();
  StatusOr<std::vector<double>> v = ops::ReadValues(ctx_, partials);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), 4096u);
  for (double d : *v) EXPECT_TRUE(std::isnan(d));
  EXPECT_DOUBLE_EQ(device_->HostClock(), device_->StreamClock(*stream_));
  ASSERT_EQ(device_->spans().size(), spans + 1);
  EXPECT_EQ(device_->spans().back().name, "read_values");
}

TEST_F(SimOpsTest, ElementwiseOpsAreBandwidthBound) {
  const int64_t n = 64 << 20;
  Tensor x = Empty(DType::kF32, Shape({n}));
  Tensor y = Empty(DType::kF32, Shape({n}));
  // The stream is idle, so the op starts when its launch ends.
  const double before = device_->HostClock();
  ASSERT_TRUE(ops::Axpy(ctx_, 2.0f, x, y).ok());
  const double took = device_->StreamClock(*stream_) - before;
  // Reads x and y, writes y: 3 * 256 MiB at the axpy kernel's measured
  // fraction of the A100's 2039 GB/s (profile: op_memory_efficiency).
  const ComputeProfile& c = profile_.compute;
  ASSERT_EQ(c.op_memory_efficiency.count("axpy"), 1u);
  const double bandwidth = c.memory_bandwidth_peak * c.op_memory_efficiency.at("axpy");
  EXPECT_NEAR(took - profile_.device.launch_overhead_s, 3.0 * n * 4 / bandwidth + c.kernel_overhead_s, 1e-9);

}

TEST_F(SimOpsTest, AnUnconfiguredSimDeviceIsRefused) {
  SimDevice* bare = SimDevice::Get(41).value();
  auto s = std::move(bare->CreateStream("s")).value();
  CachingAllocator caching(bare);
  StreamAllocator alloc(&caching, s.get());
  Tensor x = alloc.Empty(DType::kF32, Shape({16})).value();
  ASSERT_EQ(SetUpSimDevice(40, profile_).status().code(), StatusCode::kOk);  // registers the backend
  Status st = ops::Fill({bare, s.get(), &alloc}, x, 1.0f);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("sim:41"), std::string::npos) << st;
}

TEST_F(SimOpsTest, ComputeAdjustmentStretchesOps) {
  Tensor x = Empty(DType::kF32, Shape({1 << 20}));
  SetComputeAdjustment(40, [](double, double seconds) { return 2 * seconds; });
  const double before = device_->HostClock();
  ASSERT_TRUE(ops::Scale(ctx_, x, 0.5f).ok());
  const double took = device_->StreamClock(*stream_) - before - profile_.device.launch_overhead_s;
  SetComputeAdjustment(40, nullptr);
  EXPECT_NEAR(took, 2 * OpSeconds(profile_.compute, ops::ScaleCost(1 << 20, DType::kF32)), 1e-12);
}

// Ops on a host stream (CPU offload's host work) are priced with the
// profile's host rates, as unlaunched spans: the host pays no launch, the
// span starts at the host clock, and the device's comm slowdown does not
// apply. A profile without a host section refuses them, naming it.
TEST_F(SimOpsTest, HostStreamOpsUseTheHostRates) {
  ASSERT_TRUE(profile_.host.has_value());
  auto host_stream = std::move(device_->CreateHostStream("host")).value();
  SimHostAllocator host_memory(device_->id(), 0);
  ops::OpContext host{device_, host_stream.get(), &host_memory};
  const int64_t n = 16 << 20;
  Tensor x = host_memory.Empty(DType::kF32, Shape({n})).value();
  Tensor y = host_memory.Empty(DType::kF32, Shape({n})).value();
  SetComputeAdjustment(40, [](double, double seconds) { return 3 * seconds; });
  const double before = device_->HostClock();
  ASSERT_TRUE(ops::Axpy(host, 2.0f, x, y).ok());
  SetComputeAdjustment(40, nullptr);
  EXPECT_EQ(device_->HostClock(), before);  // not launched: the host did not pay
  const double took = device_->StreamClock(*host_stream) - before;
  EXPECT_NEAR(took, 3.0 * n * 4 / profile_.host->memory_bandwidth + profile_.host->kernel_overhead_s, 1e-12);
  EXPECT_GT(took, 10 * OpSeconds(profile_.compute, ops::AxpyCost(n, DType::kF32, DType::kF32)));

  SimProfile no_host = profile_;
  no_host.host.reset();
  ASSERT_TRUE(SetUpSimDevice(40, no_host).ok());
  Status st = ops::Fill(host, x, 0.f);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("no host section"), std::string::npos) << st;
  ASSERT_TRUE(SetUpSimDevice(40, profile_).ok());
}

// Packed documents (AttentionShape::key_start): the linear-memory attention
// is priced by the cost the op declares from the pairs the block-diagonal
// mask leaves (the device holds the key starts; the model states their
// count): on this CUDA profile, the composed path those pairs run on.
TEST_F(SimOpsTest, PackedDocumentsArePricedAsTheDeclaredCostSays) {
  const int64_t t = 4096, heads = 16, d = 64, c = heads * d;
  Tensor q = Empty(DType::kBF16, Shape({t, c}));
  Tensor k = Empty(DType::kBF16, Shape({t, c}));
  Tensor v = Empty(DType::kBF16, Shape({t, c}));
  Tensor out = Empty(DType::kBF16, Shape({t, c}));
  Tensor lse = Empty(DType::kF32, Shape({heads * t}));
  ops::AttentionShape s;
  s.batch = 1;
  s.heads = heads;
  s.q_len = s.kv_len = t;
  s.head_dim = d;
  s.causal = true;
  auto priced = [&](const ops::AttentionShape& shape) {
    const double before = device_->StreamClock(*stream_);
    EXPECT_TRUE(ops::FlashAttentionForward(ctx_, shape, {q, 0, c}, {k, 0, c}, {v, 0, c},
                                           {out, 0, c}, lse)
                    .ok());
    return device_->StreamClock(*stream_) - before;
  };
  const double causal = priced(s);
  ops::AttentionShape packed = s;
  packed.key_start = Empty(DType::kI32, Shape({t}));
  packed.masked_pairs = 16 * (256 * 257 / 2);  // sixteen documents of 256
  const double masked = priced(packed);
  // (The host launched it while the stream still ran the first: the
  // stream's clock moved by the op's price alone.)
  EXPECT_NEAR(masked,
              OpSeconds(profile_.compute,
                        ops::FlashAttentionForwardCost(1, heads, t, t, d, true, DType::kBF16, 0,
                                                       packed.masked_pairs)),
              1e-12);
  // a100-80g is a CUDA GPU's profile: packed rows run the composed
  // attention there (every pair, the f32 probabilities through memory), so
  // sixteen documents cost more than the fused causal kernel on the whole
  // row, not a sixteenth of it (PackedAttentionOnACudaProfileIsPriced...).
  EXPECT_GT(masked, causal);
}

}  // namespace
}  // namespace sk::sim
