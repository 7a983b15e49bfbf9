// One rank out of memory at any allocation of a step, on a GPU (issue 47):
// two trainers as threads on one GPU over the local backend, rank 1's
// caching allocator failing its k-th allocation of a step, for every k.
// Every rank's step must fail with rank 1's error and count nothing, and
// the next step must work on both.
//
// On the CPU the same case is trainer_test's (the loss average's buffer is
// host memory there). On a GPU the loss average (Trainer::GlobalMean) used
// to allocate its one-element device tensor after the ranks had agreed on
// the step and counted it: rank 1 failed alone there, with the step counted,
// while rank 0 waited in the average until its timeout. The buffer is now
// allocated at creation.
//
// Skips (GTEST_SKIP with the reason) in a build without --config=cuda and
// when no GPU is visible; tools/gpu/package.sh packs it for the GPU machine.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

TEST(TrainerOomCudaTest, OneRankOutOfMemoryAtAnyAllocationOfAStepFailsEveryRank) {
  StatusOr<Device*> gpu = Device::Get(DeviceId::Cuda(0));
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status().message();
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::mutex mu;
  std::vector<std::string> problems;
  auto problem = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    problems.push_back(what);
  };
  Status s = comm::RunLocalRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
    TrainerOptions o;
    o.model = "gpt-tiny";
    o.batch_size = 2;
    o.data_tokens = 256;
    o.optimizer.lr = 1e-3f;
    // A rank left waiting shows as a DeadlineExceeded after this, not a hang.
    o.fsdp.timeout = Duration(20'000);
    o.device.kind = DeviceKind::kCuda;
    o.device.index = 0;
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, world));
    SK_RETURN_IF_ERROR(t->Step().status());  // the optimizer's state exists from here on
    const int64_t before = t->allocator().stats().num_allocs;
    SK_RETURN_IF_ERROR(t->Step().status());
    const int64_t per_step = t->allocator().stats().num_allocs - before;
    if (per_step < 10) return InternalError("a step made only " + std::to_string(per_step) + " allocations");
    for (int64_t k = 0; k < per_step; ++k) {
      const std::string at = "rank " + std::to_string(rank) + ", rank 1's allocation " + std::to_string(k) +
                             " of " + std::to_string(per_step) + ": ";
      const int64_t steps = t->steps();
      if (rank == 1) t->allocator().InjectOutOfMemoryAfter(k);
      StatusOr<StepMetrics> m = t->Step();
      t->allocator().InjectOutOfMemoryAfter(-1);
      if (m.ok()) {
        problem(at + "the step succeeded");
        continue;
      }
      const std::string msg(m.status().message());
      if (m.status().code() != StatusCode::kResourceExhausted || msg.find("rank 1 failed step") == std::string::npos) {
        problem(at + "not rank 1's failure: " + m.status().ToString());
      }
      if (t->steps() != steps) problem(at + "the failed step was counted");
    }
    SK_RETURN_IF_ERROR(t->Step().status());
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

}  // namespace
}  // namespace sk
