// Fine-tuning with packed rows gives what the same documents give unpacked
// (issue 43's "done when"): the tiny Llama of examples/data/finetune on a
// JSONL of 8-token documents whose prompt tokens are labelled -100, at 2
// local ranks. Packed, a row of 16 tokens holds two whole documents (segment
// ids keep their attention apart, positions restart at each); unpacked, a row
// holds one, padded. With the same documents on each rank in each step (both
// in file order: packed 2 rows per rank = unpacked 4), every step's loss and
// the final weights agree to f32 rounding. And the recipe's restart ends
// bit-identical (FinetuneResume below).
#include <gtest/gtest.h>

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/checkpoint/safetensors.h"
#include "shardkit/shardkit.h"

namespace {

const char* kModel = "examples/data/finetune/llama";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// 16 documents [bos, 3 prompt tokens, 3 response tokens, eos], the bos and
// prompt labelled -100 (vocabulary 64, bos 1, eos 2).
std::string WriteDocuments() {
  const std::string path = TempPath("packing-train.jsonl");
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) std::abort();
  for (int i = 0; i < 16; ++i) {
    const int a = 3 + (i * 7) % 61, b = 3 + (i * 11 + 5) % 61, c = 3 + (i * 13 + 9) % 61;
    std::fprintf(f, "{\"input_ids\": [1, %d, %d, %d, %d, %d, %d, 2], "
                    "\"labels\": [-100, -100, -100, -100, %d, %d, %d, 2]}\n",
                 a, b, c, c, b, a, c, b, a);
  }
  std::fclose(f);
  return path;
}

struct FineTuneRun {
  std::vector<float> losses;
  std::string exported;
};

FineTuneRun FineTune(bool packing) {
  const std::string train = WriteDocuments();
  const char* paths[1] = {train.c_str()};
  sk_dataset_options data = SK_DATASET_OPTIONS_INIT;
  data.paths = paths;
  data.num_paths = 1;
  data.format = SK_DATASET_FORMAT_JSONL;
  data.sequential = 1;
  data.packing = packing ? 1 : 0;
  sk_optimizer_options optimizer = SK_OPTIMIZER_OPTIONS_INIT;
  optimizer.kind = SK_OPTIMIZER_ADAMW;
  optimizer.lr = 5e-3f;
  optimizer.weight_decay = 0.01f;
  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = kModel;
  options.optimizer = &optimizer;
  options.batch_size = packing ? 2 : 4;  // the same 4 documents per rank per step
  options.seq_len = 16;
  options.clip_grad_norm = 1.0;
  options.dataset = &data;

  FineTuneRun run;
  sk_local_session* s = nullptr;
  EXPECT_EQ(sk_local_session_create(&options, 2, nullptr, &s), SK_STATUS_OK) << sk_last_error_message();
  if (s == nullptr) return run;
  EXPECT_EQ(sk_local_session_load_state_dict(s, kModel, SK_WEIGHT_LAYOUT_HF_LLAMA, nullptr), SK_STATUS_OK)
      << sk_last_error_message();
  for (int step = 0; step < 4; ++step) {  // two epochs
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    EXPECT_EQ(sk_local_session_step(s, &m), SK_STATUS_OK) << sk_last_error_message();
    run.losses.push_back(m.global_loss);
  }
  run.exported = TempPath(packing ? "packed/" : "unpacked/");
  EXPECT_EQ(sk_local_session_save_state_dict(s, run.exported.c_str(), SK_WEIGHT_LAYOUT_HF_LLAMA), SK_STATUS_OK)
      << sk_last_error_message();
  sk_local_session_destroy(s);
  return run;
}

// Every tensor of the directory's *.safetensors files, in one in-memory file.
sk::StatusOr<sk::SafeTensorsFile> ReadAllShards(const std::string& dir) {
  std::vector<sk::SafeTensorsFile> files;
  std::vector<sk::SafeTensorsEntry> entries;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return sk::NotFoundError("cannot open " + dir);
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) names.push_back(n);
  }
  closedir(d);
  files.reserve(names.size());
  for (const std::string& n : names) {
    SK_ASSIGN_OR_RETURN(sk::SafeTensorsFile f, sk::SafeTensorsFile::Read(dir + "/" + n));
    files.push_back(std::move(f));
    for (const sk::SafeTensorsEntry& e : files.back().Entries()) entries.push_back(e);
  }
  return sk::SafeTensorsFile::FromEntries(entries, {{"format", "pt"}});
}

TEST(FinetunePacking, PackedRowsTrainAsTheSameDocumentsUnpacked) {
  const FineTuneRun packed = FineTune(true);
  const FineTuneRun unpacked = FineTune(false);
  ASSERT_EQ(packed.losses.size(), 4u);
  ASSERT_EQ(unpacked.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(packed.losses[i], unpacked.losses[i], 1e-6 * std::fabs(unpacked.losses[i])) << "step " << i + 1;
  }
  EXPECT_LT(packed.losses[3], packed.losses[0]);  // it learns

  // The exports are directories written one unit per file with an index.
  auto a = ReadAllShards(packed.exported);
  auto b = ReadAllShards(unpacked.exported);
  auto initial = sk::SafeTensorsFile::Read(std::string(kModel) + "/model.safetensors");
  ASSERT_TRUE(a.ok() && b.ok() && initial.ok());
  double worst = 0, moved = 0;
  for (const std::string& name : initial->names()) {
    auto pa = a->data(name), pb = b->data(name), p0 = initial->data(name);
    auto info = initial->info(name);
    ASSERT_TRUE(pa.ok() && pb.ok() && p0.ok() && info.ok()) << name;
    const float* x = static_cast<const float*>(*pa);
    const float* y = static_cast<const float*>(*pb);
    const float* z = static_cast<const float*>(*p0);
    for (int64_t i = 0; i < info->shape.numel(); ++i) {
      worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
      moved = std::max(moved, std::fabs(double(y[i]) - z[i]));
    }
  }
  EXPECT_LT(worst, 2e-6);
  EXPECT_GT(moved, 1e-3);  // training moved the weights far more than the tolerance
  std::printf("packed vs unpacked: largest weight difference %.3g; training moved a weight by %.3g\n", worst, moved);
}

// The recipe's restart (docs/finetune.md, "Resuming"): every start loads the
// Hugging Face weights, then sk_local_session_load_checkpoint restores the
// checkpoint saved after step 3 (weights, AdamW moments, schedule step, data
// position). Stopping there and going on in a new session ends bit-identical
// to the uninterrupted run: the same loss bits and the same exported bytes.
std::vector<float> FineTuneFrom(const std::string& ckpt_in, const std::string& ckpt_out, int steps,
                                const std::string& export_dir) {
  const std::string train = "examples/data/finetune/train.jsonl";
  const char* paths[1] = {train.c_str()};
  sk_dataset_options data = SK_DATASET_OPTIONS_INIT;
  data.paths = paths;
  data.num_paths = 1;
  data.format = SK_DATASET_FORMAT_JSONL;
  data.seed = 7;  // shuffled per epoch
  sk_optimizer_options optimizer = SK_OPTIMIZER_OPTIONS_INIT;
  optimizer.kind = SK_OPTIMIZER_ADAMW;
  optimizer.lr = 5e-3f;
  optimizer.weight_decay = 0.01f;
  sk_lr_schedule schedule = SK_LR_SCHEDULE_INIT;
  schedule.kind = SK_LR_SCHEDULE_COSINE;
  schedule.warmup_steps = 2;
  schedule.decay_steps = 4;
  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = kModel;
  options.optimizer = &optimizer;
  options.lr_schedule = &schedule;
  options.batch_size = 2;
  options.seq_len = 16;
  options.clip_grad_norm = 1.0;
  options.dataset = &data;
  std::vector<float> losses;
  sk_local_session* s = nullptr;
  EXPECT_EQ(sk_local_session_create(&options, 2, nullptr, &s), SK_STATUS_OK) << sk_last_error_message();
  if (s == nullptr) return losses;
  EXPECT_EQ(sk_local_session_load_state_dict(s, kModel, SK_WEIGHT_LAYOUT_HF_LLAMA, nullptr), SK_STATUS_OK)
      << sk_last_error_message();
  if (!ckpt_in.empty()) {
    int64_t step = -1;
    EXPECT_EQ(sk_local_session_load_checkpoint(s, ckpt_in.c_str(), &step), SK_STATUS_OK) << sk_last_error_message();
    EXPECT_EQ(step, 3);
  }
  for (int i = 0; i < steps; ++i) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    EXPECT_EQ(sk_local_session_step(s, &m), SK_STATUS_OK) << sk_last_error_message();
    losses.push_back(m.global_loss);
  }
  if (!ckpt_out.empty()) {
    EXPECT_EQ(sk_local_session_save_checkpoint(s, ckpt_out.c_str()), SK_STATUS_OK) << sk_last_error_message();
  }
  if (!export_dir.empty()) {
    EXPECT_EQ(sk_local_session_save_state_dict(s, export_dir.c_str(), SK_WEIGHT_LAYOUT_HF_LLAMA), SK_STATUS_OK)
        << sk_last_error_message();
  }
  sk_local_session_destroy(s);
  return losses;
}

std::vector<char> Bytes(const std::string& path) {
  std::vector<char> out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

// The bytes of a directory's weight files and index, in name order (the
// export writes one file per unit with model.safetensors.index.json).
std::vector<char> DirBytes(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return {};
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.find(".safetensors") != std::string::npos) names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<char> out;
  for (const std::string& n : names) {
    const std::vector<char> b = Bytes(dir + "/" + n);
    out.insert(out.end(), n.begin(), n.end());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

TEST(FinetuneResume, ARunStoppedAndResumedEndsBitIdentical) {
  const std::string whole = TempPath("resume-whole/"), resumed = TempPath("resume-resumed/");
  const std::string ckpt = TempPath("resume-ckpt");
  const std::vector<float> uninterrupted = FineTuneFrom("", "", 6, whole);
  const std::vector<float> first = FineTuneFrom("", ckpt, 3, "");
  const std::vector<float> rest = FineTuneFrom(ckpt, "", 3, resumed);
  ASSERT_EQ(uninterrupted.size(), 6u);
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(rest.size(), 3u);
  for (int i = 0; i < 6; ++i) {
    const float got = i < 3 ? first[i] : rest[i - 3];
    EXPECT_EQ(std::memcmp(&got, &uninterrupted[i], sizeof(float)), 0)
        << "step " << i + 1 << ": " << got << " vs " << uninterrupted[i];
  }
  const std::vector<char> a = DirBytes(whole), b = DirBytes(resumed);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed run exports other weights";
}

}  // namespace
