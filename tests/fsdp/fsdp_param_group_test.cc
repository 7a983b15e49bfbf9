// FsdpParamGroup on its own (runtime/fsdp/fsdp_param_group.h): what Create
// allocates and zeroes, and that each transition keeps the header's
// invariants (a pending all-gather and "in flight" only while unsharded, the
// gradient shard only between its allocation and its release).
// FullyShardedModel's use of it is what tests/fsdp/fsdp_test.cc covers.
#include "runtime/fsdp/fsdp_param_group.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/ops/ops.h"

namespace sk::fsdp_internal {
namespace {

// Host memory that counts the bytes of its live storages.
class CountingAllocator final : public Allocator {
 public:
  DeviceId device() const override { return host_.device(); }
  StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) override {
    SK_ASSIGN_OR_RETURN(std::shared_ptr<Storage> inner, host_.AllocateBytes(nbytes));
    live_ += static_cast<int64_t>(nbytes);
    Storage* raw = inner.get();
    return std::shared_ptr<Storage>(raw, [this, nbytes, inner = std::move(inner)](Storage*) mutable {
      live_ -= static_cast<int64_t>(nbytes);
      inner.reset();
    });
  }
  int64_t live() const { return live_; }

 private:
  HostAllocator host_;
  int64_t live_ = 0;
};

class FsdpParamGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = Device::Get(DeviceId{DeviceKind::kCpu, 0});
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = *device;
    // No stream: ops run on the calling thread.
    ctx_ = ops::OpContext{device_, nullptr, &alloc_};
    // Two parameters over a group of 2 ranks.
    auto layout = FlatParamLayout::Make({{"w", Shape{3, 4}}, {"b", Shape{4}}}, 2);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    layout_ = *layout;
  }

  FsdpParamGroup Make() {
    auto group = FsdpParamGroup::Create(layout_, alloc_, ctx_);
    EXPECT_TRUE(group.ok()) << group.status().ToString();
    return std::move(*group);
  }

  // A completed all-gather's work (its event recorded on an idle stream).
  std::shared_ptr<comm::Work> CompletedWork() {
    auto stream = device_->CreateStream("all-gather");
    EXPECT_TRUE(stream.ok()) << stream.status().ToString();
    auto event = device_->CreateEvent();
    EXPECT_TRUE(event.ok()) << event.status().ToString();
    EXPECT_TRUE((*event)->Record(**stream).ok());
    EXPECT_TRUE((*stream)->Synchronize().ok());
    streams_.push_back(std::move(*stream));
    return std::make_shared<comm::Work>("all_gather (test)", std::move(*event));
  }

  Tensor Unsharded() {
    auto t = alloc_.Empty(DType::kF32, Shape{layout_.padded_numel()});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return *t;
  }

  static bool AllZero(const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.data_as<float>()[i] != 0.f) return false;
    }
    return true;
  }

  CountingAllocator alloc_;
  Device* device_ = nullptr;
  ops::OpContext ctx_;
  FlatParamLayout layout_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

TEST_F(FsdpParamGroupTest, CreateAllocatesAZeroedMasterShardAndNoGradientShard) {
  const int64_t before = alloc_.live();
  FsdpParamGroup g = Make();
  EXPECT_EQ(g.layout().shard_numel(), layout_.shard_numel());
  EXPECT_EQ(g.master().dtype(), DType::kF32);
  EXPECT_EQ(g.master().numel(), layout_.shard_numel());
  EXPECT_TRUE(AllZero(g.master()));
  // The gradient shard exists only once a step has a gradient for the unit.
  EXPECT_FALSE(g.has_grad());
  EXPECT_FALSE(g.grad().defined());
  EXPECT_EQ(alloc_.live() - before,
            static_cast<int64_t>(g.master().nbytes()));
  EXPECT_EQ(g.state(), UnitState::kIdle);
  EXPECT_FALSE(g.unsharded());
  EXPECT_FALSE(g.in_flight());
  EXPECT_FALSE(g.all_gather_pending());
  EXPECT_FALSE(g.has_full_grad());
}

TEST_F(FsdpParamGroupTest, GradientShardLivesFromItsAllocationToItsRelease) {
  FsdpParamGroup g = Make();
  const int64_t before = alloc_.live();
  ASSERT_TRUE(g.AllocateGrad(alloc_).ok());
  ASSERT_TRUE(g.has_grad());
  EXPECT_EQ(g.grad().dtype(), DType::kF32);
  EXPECT_EQ(g.grad().numel(), layout_.shard_numel());
  EXPECT_EQ(alloc_.live() - before, static_cast<int64_t>(g.grad().nbytes()));
  g.ReleaseGrad();
  EXPECT_FALSE(g.has_grad());
  EXPECT_EQ(alloc_.live(), before);
  // ZeroGrad makes one of zeros (a unit no reduction reached).
  ASSERT_TRUE(g.ZeroGrad(alloc_, ctx_).ok());
  ASSERT_TRUE(g.has_grad());
  EXPECT_TRUE(AllZero(g.grad()));
  g.ReleaseGrad();
  EXPECT_EQ(alloc_.live(), before);
}

TEST_F(FsdpParamGroupTest, AllGatherIsPendingUntilWaitedForAndReshardDropsEverything) {
  FsdpParamGroup g = Make();
  g.RecordAllGather(Unsharded(), CompletedWork());
  EXPECT_TRUE(g.unsharded());
  EXPECT_TRUE(g.in_flight());
  EXPECT_TRUE(g.all_gather_pending());
  ASSERT_TRUE(g.WaitForAllGather(Duration(1000)).ok());
  EXPECT_FALSE(g.all_gather_pending());
  EXPECT_TRUE(g.unsharded());
  // Waiting again is a no-op.
  EXPECT_TRUE(g.WaitForAllGather(Duration(1000)).ok());

  g.ClearInFlight();  // computed with, kept unsharded
  EXPECT_TRUE(g.unsharded());
  EXPECT_FALSE(g.in_flight());
  g.MarkInFlight();
  EXPECT_TRUE(g.in_flight());

  g.RecordAllGather(Unsharded(), CompletedWork());
  g.Reshard();
  EXPECT_FALSE(g.unsharded());
  EXPECT_FALSE(g.in_flight());
  EXPECT_FALSE(g.all_gather_pending());
}

TEST_F(FsdpParamGroupTest, TakeAllGatherHandsTheWorkOver) {
  FsdpParamGroup g = Make();
  std::shared_ptr<comm::Work> work = CompletedWork();
  g.RecordAllGather(Unsharded(), work);
  EXPECT_EQ(&g.pending_all_gather(), work.get());
  EXPECT_EQ(g.TakeAllGather(), work);
  EXPECT_FALSE(g.all_gather_pending());
  EXPECT_TRUE(g.unsharded());
  EXPECT_EQ(g.TakeAllGather(), nullptr);
}

TEST_F(FsdpParamGroupTest, ViewsPointIntoTheUnshardedParameterAndFullGradient) {
  FsdpParamGroup g = Make();
  Tensor unsharded = Unsharded();
  g.RecordAllGather(unsharded, nullptr);
  auto params = g.ParamViews();
  ASSERT_TRUE(params.ok()) << params.status().ToString();
  ASSERT_EQ(params->size(), 2u);
  ASSERT_TRUE(g.MakeFullGrad(DType::kBF16, ctx_).ok());
  EXPECT_TRUE(g.has_full_grad());
  EXPECT_EQ(g.full_grad().dtype(), DType::kBF16);
  EXPECT_EQ(g.full_grad().numel(), layout_.padded_numel());
  auto grads = g.GradViews();
  ASSERT_TRUE(grads.ok()) << grads.status().ToString();
  ASSERT_EQ(grads->size(), 2u);
  for (int p = 0; p < 2; ++p) {
    const auto& spec = layout_.params()[p];
    EXPECT_EQ((*params)[p].shape(), spec.shape);
    EXPECT_EQ((*params)[p].data_as<float>(), unsharded.data_as<float>() + spec.offset);
    EXPECT_EQ((*grads)[p].dtype(), DType::kBF16);
    EXPECT_EQ((*grads)[p].shape(), spec.shape);
    auto one = g.GradView(p);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(one->data(), (*grads)[p].data());
  }
  g.DropFullGrad();
  EXPECT_FALSE(g.has_full_grad());
}

TEST_F(FsdpParamGroupTest, AbandonReturnsToIdleAndKeepsTheUnshardedParameterOnlyWhenAsked) {
  for (bool keep : {false, true}) {
    FsdpParamGroup g = Make();
    g.RecordAllGather(Unsharded(), nullptr);
    ASSERT_TRUE(g.MakeFullGrad(DType::kF32, ctx_).ok());
    g.set_state(UnitState::kBackward);
    g.Abandon(keep);
    EXPECT_EQ(g.state(), UnitState::kIdle) << keep;
    EXPECT_FALSE(g.in_flight()) << keep;
    EXPECT_FALSE(g.has_full_grad()) << keep;
    EXPECT_EQ(g.unsharded(), keep);
  }
}

}  // namespace
}  // namespace sk::fsdp_internal
