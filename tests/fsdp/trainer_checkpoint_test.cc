// Trainer::SaveCheckpoint / LoadCheckpoint: a run stopped at step 3 on four
// ranks and resumed on two or one continues with the uninterrupted run's
// losses (same global batches: rank r of W reads rows r*b.. of W*b).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
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

TEST(TrainerCheckpointTest, FullStateDictResumesWithTheSavingRunsLosses) {
  const std::vector<float> uninterrupted = Train(2, 7, 0, kTotalSteps, {}, {});
  const std::string path = TempDir("full") + "/model.safetensors";
  Train(2, 7, 0, kSaveStep, {}, [&](Trainer& t) {
    // A step leaves blocks cached that no tensor holds; the export gives
    // them back to the system before it adds its own buffers (a 1.2B model
    // at the edge of a host's memory was killed in the export without it).
    const MemoryStats before = t.allocator().stats();
    ASSERT_GT(before.reserved_bytes.current, before.allocated_bytes.current);
    Status s = t.SaveFullStateDict(path);
    ASSERT_TRUE(s.ok()) << s;
    const MemoryStats after = t.allocator().stats();
    EXPECT_LT(after.reserved_bytes.current, before.reserved_bytes.current);
  });
  std::vector<float> got = Train(1, 8, kSaveStep, kTotalSteps,
                                 [&](Trainer& t) {
                                   Status s = t.LoadFullStateDict(path);
                                   ASSERT_TRUE(s.ok()) << s;
                                 },
                                 {});
  ASSERT_EQ(got.size(), static_cast<size_t>(kTotalSteps - kSaveStep));
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = uninterrupted[kSaveStep + i];
    EXPECT_LE(std::fabs(got[i] - want), 1e-5 * std::max(1.f, std::fabs(want)))
        << "step " << kSaveStep + i << ": got " << got[i] << ", want " << want;
  }
}

TEST(TrainerCheckpointTest, BadFullStateDictsAreClearErrorsAndChangeNothing) {
  const std::string dir = TempDir("bad-full");
  const std::string good = dir + "/good.safetensors";
  Train(2, 7, 0, 1, {}, [&](Trainer& t) { ASSERT_TRUE(t.SaveFullStateDict(good).ok()); });
  // A flipped byte in the last tensor's data.
  const std::string corrupt = dir + "/corrupt.safetensors";
  std::filesystem::copy_file(good, corrupt);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  Train(2, 9, 0, 1, {}, [&](Trainer& t) {
    const float before = *t.Evaluate(1);
    Status s = t.LoadFullStateDict(dir + "/missing.safetensors");
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
    s = t.LoadFullStateDict(corrupt);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("checksum"), std::string::npos) << s;
    s = t.LoadFullStateDict(good, static_cast<WeightLayout>(7));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(*t.Evaluate(1), before);
    EXPECT_EQ(t.steps(), 1);
  });
  // Another model's file: named parameter, both shapes.
  std::mutex mu;
  Status other;
  RunRanks(1, [&](int, comm::ProcessGroup* g) {
    TrainerOptions o = Options(1, 7);
    o.model = "gpt-1m";
    o.data_tokens = 0;
    auto t = Trainer::Create(o, g);
    ASSERT_TRUE(t.ok()) << t.status();
    std::lock_guard<std::mutex> lock(mu);
    other = (*t)->LoadFullStateDict(good);
  });
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument) << other;
  EXPECT_NE(other.message().find("embed.wte"), std::string::npos) << other;
  EXPECT_NE(other.message().find("[64, 32]"), std::string::npos) << other;
  EXPECT_NE(other.message().find("[256, 128]"), std::string::npos) << other;
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
