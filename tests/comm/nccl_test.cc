// The nccl backend on real GPUs. Built under --config=cuda only; skips when
// no GPU is present (the development machines have none).
#include <chrono>
#include <cstring>

#include "runtime/comm/nccl_backend.h"
#include "tests/comm/comm_test_util.h"

namespace sk::comm {
namespace {

using namespace std::chrono_literals;

// A CUDA tensor of `values`, copied in and synchronised.
Tensor ToDevice(Device& gpu, Stream& stream, DType dtype, const std::vector<float>& values) {
  size_t bytes = values.size() * DTypeSize(dtype);
  std::vector<char> host(bytes);
  for (size_t i = 0; i < values.size(); ++i) StoreFromFloat(host.data(), dtype, i, values[i]);
  auto raw = gpu.RawAllocate(std::max<size_t>(bytes, 1));
  CHECK(raw.ok()) << raw.status();
  auto storage = Storage::Wrap(*raw, bytes, gpu.id());  // freed at process exit: a test
  CHECK(gpu.CopyAsync(*raw, host.data(), bytes, stream).ok());
  CHECK(stream.Synchronize(30s).ok());
  return Tensor(storage, dtype, Shape({static_cast<int64_t>(values.size())}));
}

std::vector<float> ToHost(Device& gpu, Stream& stream, const Tensor& t) {
  std::vector<char> host(t.nbytes());
  CHECK(gpu.CopyAsync(host.data(), t.data(), t.nbytes(), stream).ok());
  CHECK(stream.Synchronize(30s).ok());
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = LoadAsFloat(host.data(), t.dtype(), i);
  return v;
}

TEST(NcclProcessGroup, SingleRankCollectivesOnTheGpuStream) {
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto store = TcpStore::Create("127.0.0.1", 0, true, 10s);
  ASSERT_TRUE(store.ok());
  auto pg = NcclProcessGroup::Create(std::shared_ptr<Store>(std::move(store).value()), "t", 0, 1, 0);
  ASSERT_TRUE(pg.ok()) << pg.status();
  auto gpu = Device::Get(DeviceId::Cuda(0));
  ASSERT_TRUE(gpu.ok());
  auto stream = (*gpu)->CreateStream("comm");
  ASSERT_TRUE(stream.ok());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor in = ToDevice(**gpu, **stream, dt, {1, 2, 3});
    Tensor out = ToDevice(**gpu, **stream, dt, {0, 0, 0});
    auto ag = (*pg)->all_gather(out, in, **stream);
    ASSERT_TRUE(ag.ok()) << ag.status();
    ASSERT_TRUE((*ag)->wait(30s).ok());
    EXPECT_EQ(ToHost(**gpu, **stream, out), (std::vector<float>{1, 2, 3}));
    ReduceOptions scaled;
    scaled.pre_scale = 2.0f;
    scaled.post_scale = 0.5f;
    scaled.op = ReduceOp::kAvg;
    auto ar = (*pg)->all_reduce(in, **stream, scaled);
    ASSERT_TRUE(ar.ok()) << ar.status();
    ASSERT_TRUE((*ar)->wait(30s).ok());
    EXPECT_EQ(ToHost(**gpu, **stream, in), (std::vector<float>{1, 2, 3}));
    auto b = (*pg)->barrier(**stream);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE((*b)->wait(30s).ok());
  }
  // A CPU stream is the wrong device for an nccl group.
  auto cpu_stream = testing::MakeStream(0, "cpu");
  Tensor host = testing::MakeTensor(0, DType::kF32, 1);
  EXPECT_EQ((*pg)->all_reduce(host, *cpu_stream).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk::comm
