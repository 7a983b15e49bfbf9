// On a GPU: a local session's steps (each runs its ranks on fresh threads)
// reuse the library handles the first step's threads gave back, so the
// cuBLAS, cuBLASLt and cuDNN handles (and the cuDNN graphs built on them)
// are made once, not on every step (runtime/ops/cuda/handle_pool.h). Before
// the pool, each step leaked a cuBLAS and a cuDNN handle per rank and built
// every attention graph again.
//
// Skips without --config=cuda or a visible GPU; tools/gpu packs it.
#include <gtest/gtest.h>

#include <memory>

#include "runtime/comm/local_backend.h"
#include "runtime/device/device.h"
#include "runtime/train/local_session.h"

#ifdef SHARDKIT_WITH_CUDA
#include "runtime/ops/cuda/cuda_backend.h"
#endif

namespace sk {
namespace {

TEST(CudaHandles, ALocalSessionsLaterStepsMakeNoNewHandles) {
#ifndef SHARDKIT_WITH_CUDA
  GTEST_SKIP() << "built without --config=cuda";
#else
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 2;
  o.parallelism = Parallelism::kFsdp;
  o.fsdp.strategy = ShardingStrategy::kFullShard;
  // bf16: attention runs on cuDNN (its handles and graphs are pooled too).
  o.fsdp.mixed_precision.param_dtype = DType::kBF16;
  o.fsdp.mixed_precision.reduce_dtype = DType::kF32;
  o.optimizer.kind = OptimizerKind::kAdamW;
  o.device.kind = DeviceKind::kCuda;
  o.device.index = 0;
  constexpr int kWorld = 2;
  auto groups = comm::LocalProcessGroup::Create(kWorld);
  ASSERT_TRUE(groups.ok()) << groups.status();
  auto session = LocalSession::Create(o, LocalSession::Share(std::move(*groups)));
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Step().ok());
  const int after_first = ops::cuda::LibraryHandlesCreated(0);
  EXPECT_GE(after_first, kWorld) << "every rank thread ran cuBLAS GEMMs";
  for (int step = 0; step < 3; ++step) {
    StatusOr<std::vector<StepMetrics>> m = (*session)->Step();
    ASSERT_TRUE(m.ok()) << m.status();
  }
  EXPECT_EQ(ops::cuda::LibraryHandlesCreated(0), after_first)
      << "a later step's rank threads made handles of their own";
#endif
}

}  // namespace
}  // namespace sk
