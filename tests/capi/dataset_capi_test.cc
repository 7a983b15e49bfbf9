// The C ABI's datasets (0.8.0): sk_dataset_options on a trainer, its data
// position and sample ids, and bad input refused with nothing created.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "shardkit/shardkit.h"
#include "tests/capi/capi_test_util.h"

namespace {

using sk_capi_test::TinyTrainer;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// `n` JSONL records for gpt-tiny (vocabulary 64), the first token masked.
std::string WriteRecords(const std::string& name, int n) {
  const std::string path = TempPath(name);
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) std::abort();
  for (int i = 0; i < n; ++i) {
    std::fprintf(f, "{\"input_ids\": [%d, %d, %d, %d], \"labels\": [-100, %d, %d, %d]}\n", i % 64, (i * 3) % 64,
                 (i * 5) % 64, (i * 7) % 64, (i * 3) % 64, (i * 5) % 64, (i * 7) % 64);
  }
  std::fclose(f);
  return path;
}

struct Fixture {
  std::string train = WriteRecords("capi-train.jsonl", 10);
  std::string held_out = WriteRecords("capi-eval.jsonl", 3);
  const char* paths[1] = {train.c_str()};
  const char* eval_paths[1] = {held_out.c_str()};
  sk_dataset_options dataset = SK_DATASET_OPTIONS_INIT;
  sk_trainer_options options = TinyTrainer();
  Fixture() {
    dataset.paths = paths;
    dataset.num_paths = 1;
    dataset.format = SK_DATASET_FORMAT_JSONL;
    dataset.has_eos_id = 1;
    dataset.eos_id = 1;
    dataset.eval_paths = eval_paths;
    dataset.num_eval_paths = 1;
    options.data_tokens = 0;
    options.batch_size = 2;
    options.dataset = &dataset;
  }
};

TEST(CapiDataset, ATrainerStepsThroughTheDatasetAndResumesItsPosition) {
  Fixture fx;
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_trainer* t = nullptr;
  ASSERT_OK(sk_trainer_create(&fx.options, g, &t));
  int64_t count = -1;
  ASSERT_OK(sk_trainer_last_sample_ids(t, nullptr, 0, &count));
  EXPECT_EQ(count, 0);
  std::set<int64_t> seen;
  for (int step = 0; step < 5; ++step) {  // one epoch of 10 records
    ASSERT_OK(sk_trainer_step(t, nullptr));
    int64_t ids[2] = {-1, -1};
    ASSERT_OK(sk_trainer_last_sample_ids(t, ids, 2, &count));
    ASSERT_EQ(count, 2);
    seen.insert(ids[0]);
    seen.insert(ids[1]);
  }
  EXPECT_EQ(seen.size(), 10u);
  int64_t consumed = 0, per_epoch = 0;
  ASSERT_OK(sk_trainer_data_position(t, &consumed, &per_epoch));
  EXPECT_EQ(consumed, 10);
  EXPECT_EQ(per_epoch, 10);
  float loss = 0;
  ASSERT_OK(sk_trainer_evaluate(t, 100, &loss));
  EXPECT_GT(loss, 0.f);

  const std::string dir = TempPath("capi-dataset-ckpt");
  std::filesystem::remove_all(dir);
  ASSERT_OK(sk_trainer_save_checkpoint(t, dir.c_str()));
  sk_trainer* u = nullptr;
  ASSERT_OK(sk_trainer_create(&fx.options, g, &u));
  int64_t step = 0;
  ASSERT_OK(sk_trainer_load_checkpoint(u, dir.c_str(), &step));
  EXPECT_EQ(step, 5);
  ASSERT_OK(sk_trainer_data_position(u, &consumed, nullptr));
  EXPECT_EQ(consumed, 10);
  sk_trainer_destroy(u);
  sk_trainer_destroy(t);
  sk_process_group_destroy(g);
}

TEST(CapiDataset, BadDatasetOptionsAreInvalidArgumentAndCreateNothing) {
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  struct Case {
    const char* says;
    void (*spoil)(Fixture&);
  };
  const Case cases[] = {
      {"num_paths must be >= 1", [](Fixture& f) { f.dataset.num_paths = 0; }},
      {"sk_dataset_options.paths: num is 1 with the array NULL", [](Fixture& f) { f.dataset.paths = nullptr; }},
      {"sk_dataset_options.paths[0] is NULL", [](Fixture& f) { f.paths[0] = nullptr; }},
      {"sk_dataset_options.eval_paths[0] is empty", [](Fixture& f) { f.eval_paths[0] = ""; }},
      {"sk_dataset_options.format", [](Fixture& f) { f.dataset.format = static_cast<sk_dataset_format_t>(9); }},
      {"sk_dataset_options.token_file_layout",
       [](Fixture& f) { f.dataset.token_file_layout = static_cast<sk_token_file_layout_t>(-1); }},
      {"token_bytes", [](Fixture& f) { f.dataset.token_bytes = 3; }},
      {"eos_id is -2", [](Fixture& f) { f.dataset.eos_id = -2; }},
      {"sk_dataset_options.struct_size is 8", [](Fixture& f) { f.dataset.struct_size = 8; }},
      {"data_path or dataset", [](Fixture& f) { f.options.data_path = "x.bin"; }},
      {"decoder-only", [](Fixture& f) { f.options.model = "t5-tiny"; }},
      {"packing a token file needs eos_id",
       [](Fixture& f) {
         f.dataset.format = SK_DATASET_FORMAT_TOKENS;
         f.dataset.has_eos_id = 0;
         f.dataset.packing = 1;
       }},
  };
  for (const Case& c : cases) {
    Fixture fx;
    c.spoil(fx);
    sk_trainer* t = nullptr;
    EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_trainer_create(&fx.options, g, &t));
    EXPECT_ERROR_MENTIONS(c.says);
    EXPECT_EQ(t, nullptr);
  }
  Fixture missing;
  const std::string gone = TempPath("capi-missing.jsonl");
  missing.paths[0] = gone.c_str();
  sk_trainer* t = nullptr;
  EXPECT_STATUS(SK_STATUS_NOT_FOUND, sk_trainer_create(&missing.options, g, &t));
  EXPECT_ERROR_MENTIONS("capi-missing.jsonl");
  EXPECT_EQ(t, nullptr);
  sk_process_group_destroy(g);
}

TEST(CapiDataset, PositionAndSampleIdsRefuseBadInputAndLeaveOutputsAlone) {
  Fixture fx;
  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  int64_t consumed = 77, count = 77, ids[1] = {77};
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_trainer_data_position(nullptr, &consumed, nullptr));
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_trainer_last_sample_ids(nullptr, ids, 1, &count));

  sk_trainer_options plain = TinyTrainer();
  sk_trainer* synthetic = nullptr;
  ASSERT_OK(sk_trainer_create(&plain, g, &synthetic));
  EXPECT_STATUS(SK_STATUS_FAILED_PRECONDITION, sk_trainer_data_position(synthetic, &consumed, nullptr));
  EXPECT_ERROR_MENTIONS("reads no dataset");
  EXPECT_EQ(consumed, 77);
  sk_trainer_destroy(synthetic);

  sk_trainer* t = nullptr;
  ASSERT_OK(sk_trainer_create(&fx.options, g, &t));
  ASSERT_OK(sk_trainer_step(t, nullptr));
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_trainer_last_sample_ids(t, ids, 1, nullptr));
  EXPECT_STATUS(SK_STATUS_OUT_OF_RANGE, sk_trainer_last_sample_ids(t, ids, 1, &count));
  EXPECT_ERROR_MENTIONS("capacity 1");
  EXPECT_EQ(count, 77);
  EXPECT_EQ(ids[0], 77);
  sk_trainer_destroy(t);
  sk_process_group_destroy(g);
}

}  // namespace
