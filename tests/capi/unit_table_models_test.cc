// The unit-table models through the C ABI. A binary of its own: these runs
// leave threads in the process (gpt-tiny's do not; most likely oneDNN's
// OpenMP pool, started by larger GEMMs), and under tsan capi_test's fork
// test dies forking a process that has them (seen on 2026-11-23).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "shardkit/shardkit.h"
#include "tests/capi/capi_test_util.h"

namespace {

using sk_capi_test::LastError;
using sk_capi_test::TinyTrainer;

// The unit-table models (the paper's RegNet and DeepViT shapes at test
// size) train through the ABI by name like GPT: images per batch entry,
// seq_len 1 (the default); another seq_len is refused naming it.
TEST(CapiUnitTableModels, TrainByName) {
  for (const char* model : {"regnet-tiny", "deepvit-tiny"}) {
    sk_process_group* g = nullptr;
    ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
    sk_trainer_options o = TinyTrainer();
    o.model = model;
    o.batch_size = 2;
    sk_trainer* t = nullptr;
    ASSERT_OK(sk_trainer_create(&o, g, &t));
    int64_t n = 0, want = 0;
    ASSERT_OK(sk_trainer_num_parameters(t, &n));
    ASSERT_OK(sk_model_num_parameters(model, &want));
    EXPECT_EQ(n, want) << model;
    for (int s = 0; s < 2; ++s) {
      sk_step_metrics m = SK_STEP_METRICS_INIT;
      ASSERT_OK(sk_trainer_step(t, &m));
      EXPECT_TRUE(std::isfinite(m.loss)) << model;
      EXPECT_GT(m.peak_allocated_bytes, 0) << model;
    }
    sk_trainer_destroy(t);
    o.seq_len = 4;
    EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_trainer_create(&o, g, &t));
    EXPECT_ERROR_MENTIONS("seq_len");
    sk_process_group_destroy(g);
  }
}

// A network of one's own, described as a unit-table JSON file, trains
// through the ABI where a model name goes; a malformed file is
// INVALID_ARGUMENT naming the file and the field, and nothing is created.
TEST(CapiUnitTableModels, TrainFromAJsonFile) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  const std::string good = dir + "/small-cnn.json", bad = dir + "/bad-cnn.json";
  const std::string text = R"({"name": "small-cnn", "image_size": 8, "num_classes": 4,
    "units": [
      {"name": "stem", "kind": "conv", "in_h": 8, "in_w": 8,
       "convs": [{"name": "stem.conv", "in_channels": 3, "out_channels": 8, "kernel": 3, "stride": 2,
                  "gelu": true}]},
      {"name": "block", "kind": "conv", "in_h": 4, "in_w": 4, "residual": "identity",
       "convs": [{"name": "block.a", "in_channels": 8, "out_channels": 8, "kernel": 1, "gelu": true},
                 {"name": "block.b", "in_channels": 8, "out_channels": 8, "kernel": 3}]},
      {"name": "head", "kind": "classifier", "in_h": 4, "in_w": 4, "width": 8}]})";
  std::ofstream(good) << text;
  std::string broken = text;
  broken.replace(broken.find("\"kernel\": 3}"), 12, "\"kernal\": 3}");
  std::ofstream(bad) << broken;

  // stem 3*3*3*8 + 8, block 8*8 + 8 + 3*3*8*8 + 8, head 8*4 + 4.
  int64_t n = 0;
  ASSERT_OK(sk_model_num_parameters(good.c_str(), &n));
  EXPECT_EQ(n, 216 + 8 + 64 + 8 + 576 + 8 + 32 + 4);

  sk_process_group* g = nullptr;
  ASSERT_OK(sk_process_group_create_local(1, nullptr, &g));
  sk_trainer_options o = TinyTrainer();
  o.model = good.c_str();
  o.batch_size = 2;
  sk_trainer* t = nullptr;
  ASSERT_OK(sk_trainer_create(&o, g, &t));
  sk_step_metrics m = SK_STEP_METRICS_INIT;
  ASSERT_OK(sk_trainer_step(t, &m));
  EXPECT_TRUE(std::isfinite(m.loss));
  sk_trainer_destroy(t);

  o.model = bad.c_str();
  t = nullptr;
  EXPECT_STATUS(SK_STATUS_INVALID_ARGUMENT, sk_trainer_create(&o, g, &t));
  EXPECT_EQ(t, nullptr);
  EXPECT_ERROR_MENTIONS("bad-cnn.json");
  EXPECT_ERROR_MENTIONS("kernal");
  sk_process_group_destroy(g);
}

}  // namespace
