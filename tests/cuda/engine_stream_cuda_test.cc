// Stream-ordered engine hooks with a real cudaStream_t of the caller (issue
// 31, item 4): 2 ranks as threads on one GPU (local backend), each with its
// own cudaStream_t wrapped by Device::WrapNativeStream and set as the
// engine's caller stream. The caller's "kernels" are cudaMemcpyAsync on that
// stream, each behind a host function that sleeps on the stream (so the
// stream is late on purpose): forward copies the gathered parameter into a
// buffer of its own, backward copies that buffer into the gradient. The
// engine must order its frees and reductions after them; the parameters
// after two SGD steps equal, bit for bit, those of the synchronous protocol
// (cudaStreamSynchronize after each kernel, no caller stream).
//
// Skips (GTEST_SKIP with the reason) in a build without --config=cuda and
// when no GPU is visible; tools/gpu/package.sh packs it for the GPU machine.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/device/device.h"
#include "runtime/train/engine.h"
#include "tests/util/vector_units.h"

#if defined(SHARDKIT_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace sk {
namespace {

#if defined(SHARDKIT_WITH_CUDA)

constexpr int kUnits = 3;
constexpr int64_t kWidth = 1 << 16;
constexpr int kSteps = 2;

#define CUDA_OK(expr)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess) return InternalError(std::string(#expr) + ": " + cudaGetErrorString(e_)); \
  } while (0)

void CUDART_CB SleepOnStream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }


// Rank 0's parameters after kSteps steps.
StatusOr<std::vector<std::vector<float>>> Train(bool caller_stream) {
  std::vector<std::vector<float>> result;
  Status s = comm::RunLocalRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t native = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&native, cudaStreamNonBlocking));
    FsdpEngineOptions options;
    options.device.kind = DeviceKind::kCuda;
    options.device.index = 0;
    options.fsdp.timeout = Duration(60'000);
    options.optimizer.kind = OptimizerKind::kSgd;
    options.optimizer.lr = 0.25f;
    if (caller_stream) {
      SK_ASSIGN_OR_RETURN(Device * gpu, Device::Get(DeviceId::Cuda(0)));
      SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> wrapped, gpu->WrapNativeStream(native, "caller"));
      options.stream = std::move(wrapped);
    }
    std::vector<float*> saved(kUnits, nullptr);
    for (float*& p : saved) CUDA_OK(cudaMalloc(&p, kWidth * sizeof(float)));
    const size_t bytes = kWidth * sizeof(float);
    {
      SK_ASSIGN_OR_RETURN(std::unique_ptr<FsdpEngine> engine,
                          FsdpEngine::Create(VectorUnits(kUnits, kWidth), world, options));
      // A caller kernel: late on purpose on the caller's stream, or
      // completed before the next hook (the synchronous protocol).
      auto copy = [&](void* dst, const void* src) -> Status {
        if (caller_stream) CUDA_OK(cudaLaunchHostFunc(native, SleepOnStream, nullptr));
        CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, native));
        if (!caller_stream) CUDA_OK(cudaStreamSynchronize(native));
        return OkStatus();
      };
      for (int step = 0; step < kSteps; ++step) {
        SK_RETURN_IF_ERROR(engine->ZeroGrad());
        for (int u = 0; u < kUnits; ++u) {
          SK_RETURN_IF_ERROR(engine->PreForward(u));
          SK_ASSIGN_OR_RETURN(const Tensor* w, engine->Param(u, 0));
          SK_RETURN_IF_ERROR(copy(saved[u], w->data()));
          SK_RETURN_IF_ERROR(engine->PostForward(u));
        }
        for (int u = kUnits - 1; u >= 0; --u) {
          SK_RETURN_IF_ERROR(engine->PreBackward(u));
          SK_ASSIGN_OR_RETURN(const Tensor* g, engine->Grad(u, 0));
          SK_RETURN_IF_ERROR(copy(g->data(), saved[u]));
          SK_RETURN_IF_ERROR(engine->PostBackward(u));
        }
        SK_RETURN_IF_ERROR(engine->FinishBackward());
        SK_RETURN_IF_ERROR(engine->OptimizerStep());
      }
      std::vector<std::vector<float>> params(kUnits, std::vector<float>(kWidth));
      for (int u = 0; u < kUnits; ++u) {
        SK_RETURN_IF_ERROR(engine->ReadParam(u, 0, params[u].data(), kWidth));
      }
      if (rank == 0) result = std::move(params);
    }
    CUDA_OK(cudaStreamSynchronize(native));
    for (float* p : saved) CUDA_OK(cudaFree(p));
    CUDA_OK(cudaStreamDestroy(native));
    return OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

TEST(EngineCallerStreamCuda, DelayedCopiesOnTheCallersCudaStreamGiveTheSynchronousResult) {
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  StatusOr<std::vector<std::vector<float>>> sync = Train(false);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  StatusOr<std::vector<std::vector<float>>> streamed = Train(true);
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  for (int u = 0; u < kUnits; ++u) {
    EXPECT_EQ(std::memcmp((*sync)[u].data(), (*streamed)[u].data(), kWidth * sizeof(float)), 0)
        << "unit " << u << " differs from the synchronous protocol";
    // SGD on gradient w (both ranks): w * (1 - lr) per step, never unchanged.
    EXPECT_NE((*sync)[u][0], 0.0f);
  }
}

TEST(EngineCallerStreamCuda, ANullOrForeignCudaStreamIsAnInvalidArgument) {
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  StatusOr<Device*> gpu = Device::Get(DeviceId::Cuda(0));
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  StatusOr<std::unique_ptr<Stream>> null_stream = (*gpu)->WrapNativeStream(nullptr, "caller");
  EXPECT_EQ(null_stream.status().code(), StatusCode::kInvalidArgument);
  StatusOr<Device*> cpu = Device::Get(DeviceId::Cpu(0));
  ASSERT_TRUE(cpu.ok());
  cudaStream_t native = nullptr;
  ASSERT_EQ(cudaStreamCreate(&native), cudaSuccess);
  StatusOr<std::unique_ptr<Stream>> on_cpu = (*cpu)->WrapNativeStream(native, "caller");
  EXPECT_EQ(on_cpu.status().code(), StatusCode::kInvalidArgument);
  cudaStreamDestroy(native);
}

#else

TEST(EngineCallerStreamCuda, DelayedCopiesOnTheCallersCudaStreamGiveTheSynchronousResult) {
  GTEST_SKIP() << "built without CUDA (--config=cuda)";
}

#endif

}  // namespace
}  // namespace sk
