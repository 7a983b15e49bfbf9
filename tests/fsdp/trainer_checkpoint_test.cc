// Trainer::SaveCheckpoint / LoadCheckpoint: a run stopped at step 3 on four
// ranks and resumed on two or one continues with the uninterrupted run's
// losses (same global batches: rank r of W reads rows r*b.. of W*b).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <thread>

#include "runtime/comm/local_backend.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

constexpr int kGlobalBatch = 4;
constexpr int kSaveStep = 3;
constexpr int kTotalSteps = 6;

void RunRanks(int world, const std::function<void(int, comm::ProcessGroup*)>& body) {
  Status s = comm::RunLocalRanks(world, [&](int r, comm::ProcessGroup* g) {
    body(r, g);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TrainerOptions Options(int world, uint64_t seed) {
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = kGlobalBatch / world;
  o.data_tokens = 96;
  // SGD with momentum: Adam turns the rounding noise of mathematically zero
  // gradients into lr-sized steps (see tests/fsdp/fsdp_test_util.h).
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = 0.05f;
  o.optimizer.momentum = 0.9f;
  o.fsdp.seed = seed;
  o.fsdp.timeout = Duration(60'000);
  return o;
}

// Global losses (mean over ranks) of steps [first, last) at `world`, after
// `prepare` and before `finish`.
std::vector<float> Train(int world, uint64_t seed, int first, int last,
                         const std::function<void(Trainer&)>& prepare,
                         const std::function<void(Trainer&)>& finish) {
  std::mutex mu;
  std::vector<double> sum(last - first, 0.0);
  RunRanks(world, [&](int, comm::ProcessGroup* g) {
    auto t = Trainer::Create(Options(world, seed), g);
    ASSERT_TRUE(t.ok()) << t.status();
    if (prepare) prepare(**t);
    EXPECT_EQ((*t)->steps(), first);
    for (int s = first; s < last; ++s) {
      StatusOr<StepMetrics> m = (*t)->Step();
      ASSERT_TRUE(m.ok()) << m.status();
      std::lock_guard<std::mutex> lock(mu);
      sum[s - first] += m->loss;
    }
    if (finish) finish(**t);
  });
  std::vector<float> mean;
  for (double x : sum) mean.push_back(static_cast<float>(x / world));
  return mean;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir =
      std::string(base ? base : "/tmp") + "/trainer-ckpt-" + std::to_string(::getpid()) + "-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(TrainerCheckpointTest, ResumedAtWorld2And1ContinuesTheUninterruptedLosses) {
  const std::vector<float> uninterrupted = Train(4, 7, 0, kTotalSteps, {}, {});
  const std::string dir = TempDir("resume") + "/ckpt";
  Train(4, 7, 0, kSaveStep, {}, [&](Trainer& t) {
    Status s = t.SaveCheckpoint(dir);
    ASSERT_TRUE(s.ok()) << s;
  });
  for (int world : {2, 1}) {
    // Another seed: the resumed run only matches if the load restored everything.
    std::vector<float> got = Train(world, 8, kSaveStep, kTotalSteps,
                                   [&](Trainer& t) {
                                     Status s = t.LoadCheckpoint(dir);
                                     ASSERT_TRUE(s.ok()) << s;
                                   },
                                   {});
    ASSERT_EQ(got.size(), static_cast<size_t>(kTotalSteps - kSaveStep));
    for (size_t i = 0; i < got.size(); ++i) {
      const float want = uninterrupted[kSaveStep + i];
      EXPECT_LE(std::fabs(got[i] - want), 1e-5 * std::max(1.f, std::fabs(want)))
          << "world " << world << ", step " << kSaveStep + i << ": got " << got[i] << ", want " << want;
    }
  }
}

TEST(TrainerCheckpointTest, LoadingAMissingCheckpointIsNotFoundAndKeepsTheStep) {
  const std::string dir = TempDir("missing") + "/nothing-here";
  Train(2, 7, 0, 1, {}, [&](Trainer& t) {
    Status s = t.LoadCheckpoint(dir);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
    EXPECT_EQ(t.steps(), 1);
  });
}

}  // namespace
}  // namespace sk
