#include "runtime/core/tensor.h"

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/core/shape.h"

namespace sk {
namespace {

TEST(ShapeTest, NumelStridesAndString) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.ContiguousStrides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(s.ToString(), "[2, 3, 4]");
  EXPECT_EQ(Shape().numel(), 1);  // scalar
  EXPECT_EQ((Shape{5, 0, 7}).numel(), 0);
}

TEST(ShapeTest, MakeRejectsNegativeDimsAndOverflow) {
  EXPECT_EQ(Shape::Make({2, -1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(Shape::Make({2, -1}).status().message().find("dimension 1"), std::string::npos);
  EXPECT_EQ(Shape::Make({int64_t{1} << 40, int64_t{1} << 40}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(Shape::Make({0, int64_t{1} << 62, int64_t{1} << 62}).ok());  // zero elements
}

TEST(TensorTest, EmptyFromAllocatorHasRequestedDtypeShapeAndAlignedData) {
  HostAllocator alloc;
  StatusOr<Tensor> t = alloc.Empty(DType::kBF16, Shape{3, 5});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype(), DType::kBF16);
  EXPECT_EQ(t->nbytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % kHostAlignment, 0u);
  EXPECT_TRUE(t->device().is_cpu());
}

TEST(TensorTest, ZerosAreZero) {
  StatusOr<Tensor> t = HostAllocator::Default().Zeros(DType::kF32, Shape{100});
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(t->data_as<float>()[i], 0.0f);
}

TEST(TensorTest, ViewsShareStorageAndAreBoundsChecked) {
  StatusOr<Tensor> t = HostAllocator::Default().Zeros(DType::kF32, Shape{8});
  ASSERT_TRUE(t.ok());
  StatusOr<Tensor> v = t->View(16, DType::kF32, Shape{2, 2});
  ASSERT_TRUE(v.ok());
  v->data_as<float>()[0] = 7.0f;
  EXPECT_EQ(t->data_as<float>()[4], 7.0f);
  EXPECT_EQ(v->storage().get(), t->storage().get());
  EXPECT_EQ(t->View(20, DType::kF32, Shape{4}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t->View(64, DType::kF32, Shape{0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(t->View(32, DType::kF32, Shape{0}).ok());
  EXPECT_EQ(Tensor().View(0, DType::kF32, Shape{1}).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(TensorTest, ReshapeKeepsBytesAndRejectsOtherCounts) {
  StatusOr<Tensor> t = HostAllocator::Default().Empty(DType::kF16, Shape{6});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Reshape(Shape{2, 3})->shape(), (Shape{2, 3}));
  EXPECT_EQ(t->Reshape(Shape{4}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TensorTest, WrapUsesCallerMemoryWithoutFreeingIt) {
  float buf[4] = {1, 2, 3, 4};
  {
    StatusOr<Tensor> t = Tensor::Wrap(buf, DType::kF32, Shape{4});
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->data(), buf);
  }
  EXPECT_EQ(buf[3], 4.0f);  // still ours
  EXPECT_EQ(Tensor::Wrap(nullptr, DType::kF32, Shape{1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(Tensor::Wrap(nullptr, DType::kF32, Shape{0}).ok());
  EXPECT_EQ(Tensor::Wrap(buf, DType::kInvalid, Shape{1}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TensorTest, StorageReleaseRunsOnceWhenLastViewDies) {
  static int releases = 0;
  releases = 0;
  float buf[2];
  auto release = [](void*, void*) noexcept { ++releases; };
  {
    auto storage = std::make_shared<Storage>(buf, sizeof(buf), DeviceId::Cpu(), nullptr, nullptr,
                                             +release);
    Tensor a(storage, DType::kF32, Shape{2});
    Tensor b = *a.View(4, DType::kF32, Shape{1});
    storage.reset();
    a = Tensor();
    EXPECT_EQ(releases, 0);
  }
  EXPECT_EQ(releases, 1);
}

}  // namespace
}  // namespace sk
