// A trainer reading a dataset (runtime/data): the global order is a function
// of the sample index, so resuming from a checkpoint continues it exactly, at
// the same world size bit for bit, at another with the same samples.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/train/local_session.h"
#include "tests/data/data_files.h"

namespace sk {
namespace {

using testing::DataTempPath;
using testing::JsonlRecord;
using testing::WriteText;

// `n` records of 3..17 tokens (gpt-tiny: vocabulary 64, 16 positions), the
// first few tokens of each masked as a prompt would be.
std::string WriteRecords(const std::string& name, int n, int salt) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    const int len = 3 + (i * 7 + salt) % 15;
    std::vector<int> ids, labels;
    for (int t = 0; t < len; ++t) {
      ids.push_back((i * 13 + t * 5 + salt) % 64);
      labels.push_back(t < len / 3 ? -100 : ids.back());
    }
    text += JsonlRecord(ids, labels);
  }
  const std::string path = DataTempPath(name);
  WriteText(path, text);
  return path;
}

TrainerOptions Options(const std::string& train, int batch, int accum) {
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = batch;
  o.grad_accum_steps = accum;
  o.optimizer.lr = 3e-3f;
  o.fsdp.timeout = Duration(60'000);
  o.dataset.paths = {train};
  o.dataset.format = data::DatasetFormat::kJsonl;
  o.dataset.eos_id = 1;
  o.dataset.seed = 5;
  return o;
}

std::unique_ptr<LocalSession> MakeSession(const TrainerOptions& o, int n) {
  auto groups = comm::LocalProcessGroup::Create(n);
  EXPECT_TRUE(groups.ok()) << groups.status();
  if (!groups.ok()) return nullptr;
  auto s = LocalSession::Create(o, LocalSession::Share(std::move(*groups)));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// The step's global sample ids: rank 0's rows, then rank 1's, ...
std::vector<int64_t> GlobalIds(LocalSession& s) {
  std::vector<int64_t> ids;
  for (int r = 0; r < s.world_size(); ++r) {
    const std::vector<int64_t>& mine = s.trainer(r).last_sample_ids();
    ids.insert(ids.end(), mine.begin(), mine.end());
  }
  return ids;
}

struct RunRecord {
  std::vector<float> losses;  // global, per step
  std::vector<std::vector<int64_t>> ids;
};

void StepInto(LocalSession& s, int steps, RunRecord& run) {
  for (int i = 0; i < steps; ++i) {
    StatusOr<std::vector<StepMetrics>> m = s.Step();
    ASSERT_TRUE(m.ok()) << m.status();
    run.losses.push_back((*m)[0].global_loss);
    run.ids.push_back(GlobalIds(s));
  }
}

std::string FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(DatasetTrainerTest, StepsTakeConsecutiveSamplesOfEachEpochsOrder) {
  const std::string train = WriteRecords("order.jsonl", 12, 0);
  std::unique_ptr<LocalSession> s = MakeSession(Options(train, 2, 1), 2);
  ASSERT_NE(s, nullptr);
  RunRecord run;
  StepInto(*s, 6, run);  // 24 samples: two epochs of 12
  std::vector<int64_t> all;
  for (const auto& ids : run.ids) {
    ASSERT_EQ(ids.size(), 4u);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen(all.begin() + 12 * epoch, all.begin() + 12 * (epoch + 1));
    EXPECT_EQ(seen.size(), 12u) << "epoch " << epoch << " repeated or skipped a record";
  }
  EXPECT_NE(std::vector<int64_t>(all.begin(), all.begin() + 12), std::vector<int64_t>(all.begin() + 12, all.end()));
  EXPECT_EQ(s->trainer(1).samples_consumed(), 24);
}

// llm.c's headed token files (two shards) read in fixed windows: each row is
// a window of the files, so the step's rows are the ids' windows.
TEST(DatasetTrainerTest, LlmcTokenShardsTrainInWindows) {
  std::vector<uint32_t> a(16 * 5 + 1), b(16 * 3 + 1);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint32_t>(i % 64);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint32_t>((i * 7) % 64);
  const std::string pa = DataTempPath("llmc-a.bin"), pb = DataTempPath("llmc-b.bin");
  testing::WriteTokens(pa, a, 2, data::kLlmcMagicUint16, 1);
  testing::WriteTokens(pb, b, 2, data::kLlmcMagicUint16, 1);
  TrainerOptions o = Options(pa, 2, 1);
  o.dataset.paths = {pa, pb};
  o.dataset.format = data::DatasetFormat::kTokens;
  o.dataset.eos_id = -1;
  std::unique_ptr<LocalSession> s = MakeSession(o, 2);
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->trainer(0).dataset()->num_samples(), 8);  // gpt-tiny: 16 positions
  RunRecord run;
  StepInto(*s, 2, run);
  std::set<int64_t> seen;
  for (const auto& ids : run.ids) seen.insert(ids.begin(), ids.end());
  EXPECT_EQ(seen.size(), 8u);
  for (float loss : run.losses) EXPECT_TRUE(std::isfinite(loss) && loss > 0);
  // A row is its window of the files.
  std::vector<int64_t> ids;
  auto rows = s->trainer(0).dataset()->Rows(0, 1, &ids);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::vector<uint32_t>& file = ids[0] < 5 ? a : b;
  const int64_t start = 16 * (ids[0] < 5 ? ids[0] : ids[0] - 5);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(rows->inputs[j], static_cast<int32_t>(file[start + j]));
    EXPECT_EQ(rows->targets[j], static_cast<int32_t>(file[start + j + 1]));
  }
}

TEST(DatasetTrainerTest, ResumeAtTheSameWorldSizeIsBitIdentical) {
  const std::string train = WriteRecords("resume.jsonl", 20, 3);
  const std::string dir = DataTempPath("resume-ckpt"), full_a = DataTempPath("a.safetensors"),
                    full_b = DataTempPath("b.safetensors");
  std::filesystem::remove_all(dir);
  const TrainerOptions o = Options(train, 2, 2);
  RunRecord whole, resumed;
  {
    std::unique_ptr<LocalSession> s = MakeSession(o, 2);
    ASSERT_NE(s, nullptr);
    StepInto(*s, 6, whole);  // crosses into the second epoch (8 samples a step)
    ASSERT_TRUE(s->SaveFullStateDict(full_a, WeightLayout::kShardkit).ok());
  }
  {
    std::unique_ptr<LocalSession> s = MakeSession(o, 2);
    ASSERT_NE(s, nullptr);
    StepInto(*s, 3, resumed);
    ASSERT_TRUE(s->SaveCheckpoint(dir).ok());
  }
  StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
  ASSERT_TRUE(ix.ok()) << ix.status();
  ASSERT_TRUE(ix->data.has_value());
  EXPECT_EQ(ix->data->samples_consumed, 24);
  EXPECT_EQ(ix->data->seed, 5u);
  EXPECT_EQ(ix->data->samples_per_epoch, 20);
  EXPECT_EQ(ix->data->global_batch, 8);
  {
    std::unique_ptr<LocalSession> s = MakeSession(o, 2);
    ASSERT_NE(s, nullptr);
    Status loaded = s->LoadCheckpoint(dir);
    ASSERT_TRUE(loaded.ok()) << loaded;
    StepInto(*s, 3, resumed);
    ASSERT_TRUE(s->SaveFullStateDict(full_b, WeightLayout::kShardkit).ok());
  }
  EXPECT_EQ(resumed.ids, whole.ids);
  ASSERT_EQ(resumed.losses.size(), whole.losses.size());
  for (size_t i = 0; i < whole.losses.size(); ++i) EXPECT_EQ(resumed.losses[i], whole.losses[i]) << "step " << i + 1;
  EXPECT_EQ(FileBytes(full_a), FileBytes(full_b)) << "final weights and optimizer state differ";
}

TEST(DatasetTrainerTest, ResumeAtAnotherWorldSizeSeesTheSameSamplesInOrder) {
  const std::string train = WriteRecords("reshard.jsonl", 18, 1);
  const std::string dir = DataTempPath("reshard-ckpt");
  std::filesystem::remove_all(dir);
  // Global batch 4 both ways: 2 ranks x 2 rows, then 1 rank x 2 rows x 2 micro-batches.
  const TrainerOptions two = Options(train, 2, 1), one = Options(train, 2, 2);
  RunRecord whole, resumed;
  {
    std::unique_ptr<LocalSession> s = MakeSession(two, 2);
    ASSERT_NE(s, nullptr);
    StepInto(*s, 7, whole);
  }
  {
    std::unique_ptr<LocalSession> s = MakeSession(two, 2);
    ASSERT_NE(s, nullptr);
    StepInto(*s, 3, resumed);
    ASSERT_TRUE(s->SaveCheckpoint(dir).ok());
  }
  {
    std::unique_ptr<LocalSession> s = MakeSession(one, 1);
    ASSERT_NE(s, nullptr);
    Status loaded = s->LoadCheckpoint(dir);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ(s->trainer(0).samples_consumed(), 12);
    StepInto(*s, 4, resumed);
  }
  EXPECT_EQ(resumed.ids, whole.ids);
  std::set<int64_t> first_epoch;
  for (int step = 0; step < 4; ++step) first_epoch.insert(whole.ids[step].begin(), whole.ids[step].end());
  EXPECT_EQ(first_epoch.size(), 16u);
  // Each step's loss: the mean of the same micro-batches' means, summed in
  // another order (ranks, then micro-batches).
  for (size_t i = 0; i < whole.losses.size(); ++i) {
    EXPECT_NEAR(resumed.losses[i], whole.losses[i], 1e-5 * std::abs(whole.losses[i])) << "step " << i + 1;
  }
}

TEST(DatasetTrainerTest, EvaluateIsTheTokenMeanOverTheHeldOutSetAtAnyWorldSize) {
  const std::string train = WriteRecords("eval-train.jsonl", 8, 2);
  const std::string held_out = WriteRecords("eval-held.jsonl", 7, 9);
  TrainerOptions o = Options(train, 2, 1);
  o.eval_dataset_paths = {held_out};
  float at[3] = {0, 0, 0};
  for (int world : {1, 2}) {
    std::unique_ptr<LocalSession> s = MakeSession(o, world);
    ASSERT_NE(s, nullptr);
    StatusOr<float> whole = s->Evaluate(100);  // one pass: 4 batches at world 1, 2 at world 2
    ASSERT_TRUE(whole.ok()) << whole.status();
    at[world] = *whole;
    if (world == 1) {
      StatusOr<float> first = s->Evaluate(1);
      ASSERT_TRUE(first.ok());
      EXPECT_NE(*first, *whole) << "one batch should cover only its two records";
    }
  }
  EXPECT_TRUE(std::isfinite(at[1]) && at[1] > 0);
  EXPECT_NEAR(at[1], at[2], 1e-5 * at[1]);

  std::unique_ptr<LocalSession> s = MakeSession(Options(train, 2, 1), 1);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->Evaluate(1).status().code(), StatusCode::kFailedPrecondition);
}

TEST(DatasetTrainerTest, BadDatasetOptionsAndForeignCheckpointsAreRefused) {
  const std::string train = WriteRecords("bad.jsonl", 6, 0);
  TrainerOptions o = Options(train, 2, 1);
  o.data_path = train;
  EXPECT_EQ(ValidateTrainerOptions(o).code(), StatusCode::kInvalidArgument);
  o = Options(train, 2, 1);
  o.model = "t5-tiny";
  EXPECT_NE(std::string(ValidateTrainerOptions(o).message()).find("decoder-only"), std::string::npos);
  o = Options(train, 2, 1);
  o.dataset.paths.clear();
  o.eval_dataset_paths = {train};
  EXPECT_EQ(ValidateTrainerOptions(o).code(), StatusCode::kInvalidArgument);
  o = Options(train, 2, 1);
  o.dataset.token_bytes = 3;
  EXPECT_NE(std::string(ValidateTrainerOptions(o).message()).find("token_bytes"), std::string::npos);
  o = Options(DataTempPath("missing.jsonl"), 2, 1);
  auto groups = comm::LocalProcessGroup::Create(1);
  ASSERT_TRUE(groups.ok());
  auto missing = LocalSession::Create(o, LocalSession::Share(std::move(*groups)));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  // A checkpoint of another order (seed) is refused before anything changes.
  const std::string dir = DataTempPath("foreign-ckpt");
  std::filesystem::remove_all(dir);
  std::unique_ptr<LocalSession> a = MakeSession(Options(train, 2, 1), 1);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->Step().ok());
  ASSERT_TRUE(a->SaveCheckpoint(dir).ok());
  TrainerOptions other = Options(train, 2, 1);
  other.dataset.seed = 6;
  std::unique_ptr<LocalSession> b = MakeSession(other, 1);
  ASSERT_NE(b, nullptr);
  Status refused = b->LoadCheckpoint(dir);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.message()).find("seed 5"), std::string::npos) << refused;
  EXPECT_EQ(b->steps(), 0);
  EXPECT_EQ(b->trainer(0).samples_consumed(), 0);
}

}  // namespace
}  // namespace sk
