// The unit-table models through the C ABI. A binary of its own: these runs
// leave threads in the process (gpt-tiny's do not; most likely oneDNN's
// OpenMP pool, started by larger GEMMs), and under tsan capi_test's fork
// test dies forking a process that has them (seen on 2026-11-23).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

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

}  // namespace
