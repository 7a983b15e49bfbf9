// Batches from the caller through the C ABI (0.8.0, issue 43):
// sk_trainer_step_batches and sk_local_session_step_batches take token ids,
// targets with SK_IGNORE_INDEX, an optional loss mask, position ids and
// segment ids; every bad input is INVALID_ARGUMENT naming it, with nothing
// changed.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "shardkit/shardkit.h"
#include "tests/capi/capi_test_util.h"

namespace {

using sk_capi_test::TinyTrainer;

// A micro-batch of `rows` x `len` tokens of gpt-tiny (vocabulary 64): a
// repeating pattern, targets the inputs shifted, the first `ignored`
// targets of each row SK_IGNORE_INDEX.
struct Batch {
  std::vector<int32_t> ids, targets, positions, segments;
  std::vector<uint8_t> mask;
  sk_batch b = SK_BATCH_INIT;
  Batch(int64_t rows, int64_t len, int ignored) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < len; ++i) {
        ids.push_back(static_cast<int32_t>((r * 7 + i * 3) % 64));
        targets.push_back(i < ignored ? SK_IGNORE_INDEX : static_cast<int32_t>((r * 7 + (i + 1) * 3) % 64));
      }
    }
    b.batch_size = rows;
    b.seq_len = len;
    b.input_ids = ids.data();
    b.targets = targets.data();
  }
  // Two documents per row, split at `at`.
  void Pack(int64_t at) {
    for (int64_t r = 0; r < b.batch_size; ++r) {
      for (int64_t i = 0; i < b.seq_len; ++i) {
        positions.push_back(static_cast<int32_t>(i < at ? i : i - at));
        segments.push_back(i < at ? 0 : 1);
      }
    }
    b.position_ids = positions.data();
    b.segment_ids = segments.data();
  }
};

sk_trainer* MakeTrainer() {
  sk_process_group* g = nullptr;
  EXPECT_EQ(sk_process_group_create_local(1, nullptr, &g), SK_STATUS_OK);
  sk_trainer_options o = TinyTrainer();
  o.batch_size = 2;
  o.seq_len = 16;
  sk_trainer* t = nullptr;
  EXPECT_EQ(sk_trainer_create(&o, g, &t), SK_STATUS_OK) << sk_last_error_message();
  sk_process_group_destroy(g);
  return t;
}

TEST(CapiBatches, TheTrainerStepsOnTheCallersMaskedAndPackedBatches) {
  sk_trainer* t = MakeTrainer();
  ASSERT_NE(t, nullptr);
  Batch plain(2, 16, 3), shorter(1, 9, 0), packed(2, 16, 0);
  packed.Pack(6);
  packed.targets[5] = SK_IGNORE_INDEX;  // a document's last token predicts nothing
  std::vector<uint8_t> mask(9, 1);
  mask[0] = 0;
  shorter.b.loss_mask = mask.data();
  int64_t step = 0;
  // Counted targets (0.8.0's sk_step_metrics.target_tokens): 2 x (16 - 3),
  // 9 less the masked one, 2 x 16 less the ignored one.
  const int64_t counted[] = {26, 8, 31};
  for (Batch* b : {&plain, &shorter, &packed}) {
    const sk_batch* one[] = {&b->b};
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    ASSERT_EQ(sk_trainer_step_batches(t, one, 1, &m), SK_STATUS_OK) << sk_last_error_message();
    EXPECT_EQ(m.step, ++step);
    EXPECT_TRUE(std::isfinite(m.loss));
    EXPECT_EQ(m.loss, m.global_loss);  // one rank
    EXPECT_EQ(m.target_tokens, counted[step - 1]);
    EXPECT_EQ(m.global_target_tokens, counted[step - 1]);
  }
  // A caller's 136-byte struct (0.6.0's, or one ending at skipped) gets
  // nothing past it.
  sk_step_metrics old;
  std::memset(&old, 0x5a, sizeof old);
  old.struct_size = offsetof(sk_step_metrics, target_tokens);
  const sk_batch* again[] = {&plain.b};
  ASSERT_EQ(sk_trainer_step_batches(t, again, 1, &old), SK_STATUS_OK) << sk_last_error_message();
  EXPECT_EQ(old.step, ++step);
  EXPECT_EQ(old.struct_size, offsetof(sk_step_metrics, target_tokens));
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&old.target_tokens);
  for (size_t i = 0; i < 2 * sizeof(int64_t); ++i) EXPECT_EQ(tail[i], 0x5a) << i;
  // NULL metrics are fine.
  const sk_batch* one[] = {&plain.b};
  ASSERT_EQ(sk_trainer_step_batches(t, one, 1, nullptr), SK_STATUS_OK) << sk_last_error_message();
  sk_trainer_destroy(t);
}

TEST(CapiBatches, BadTrainerBatchesAreInvalidArgumentAndChangeNothing) {
  sk_trainer* t = MakeTrainer();
  ASSERT_NE(t, nullptr);
  auto refused = [&](const sk_batch* b, const char* what, int32_t count = 1) {
    const sk_batch* one[] = {b, b};
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    EXPECT_EQ(sk_trainer_step_batches(t, one, count, &m), SK_STATUS_INVALID_ARGUMENT) << what;
    EXPECT_NE(std::string(sk_last_error_message()).find(what), std::string::npos)
        << "message: " << sk_last_error_message();
  };
  Batch good(2, 16, 0);
  sk_step_metrics m = SK_STEP_METRICS_INIT;
  const sk_batch* one[] = {&good.b};
  EXPECT_EQ(sk_trainer_step_batches(nullptr, one, 1, &m), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(sk_trainer_step_batches(t, nullptr, 1, &m), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sk_last_error_message()).find("micro_batches is NULL"), std::string::npos);
  refused(&good.b, "grad_accum_steps = 1", 2);
  refused(&good.b, "grad_accum_steps = 1", 0);
  refused(nullptr, "micro_batches[0] is NULL");
  sk_batch bad = good.b;
  bad.struct_size = 0;
  refused(&bad, "struct_size");
  bad = good.b;
  bad.batch_size = 0;
  refused(&bad, "must both be positive");
  bad = good.b;
  bad.seq_len = 17;  // the trainer's seq_len is 16
  refused(&bad, "seq_len 17 is outside [1, 16]");
  Batch three(3, 16, 0);
  refused(&three.b, "batch_size 3 is outside [1, 2]");
  bad = good.b;
  bad.input_ids = nullptr;
  refused(&bad, "input_ids is NULL");
  bad = good.b;
  bad.targets = nullptr;
  refused(&bad, "targets is NULL");
  Batch ids(2, 16, 0);
  ids.ids[5] = 64;
  refused(&ids.b, "inputs[5] = 64");
  Batch targets(2, 16, 0);
  targets.targets[4] = -1;
  refused(&targets.b, "targets[4] = -1 is neither a token id nor SK_IGNORE_INDEX");
  targets.targets[4] = 64;
  refused(&targets.b, "targets[4] = 64");
  Batch mask(2, 16, 0);
  std::vector<uint8_t> two(32, 1);
  two[7] = 2;
  mask.b.loss_mask = two.data();
  refused(&mask.b, "loss_mask[7] = 2");
  Batch packed(2, 16, 0);
  packed.Pack(4);
  packed.segments[22] = 0;  // row 1 goes 0 0 0 0 1 1 0
  refused(&packed.b, "segment_ids decrease in row 1 at position 6");
  Batch positions(2, 16, 0);
  positions.Pack(4);
  positions.positions[3] = 16;  // gpt-tiny's max_seq_len is 16
  refused(&positions.b, "positions[3] = 16");
  // Nothing changed: the next good step is the first.
  ASSERT_EQ(sk_trainer_step_batches(t, one, 1, &m), SK_STATUS_OK) << sk_last_error_message();
  EXPECT_EQ(m.step, 1);
  sk_trainer_destroy(t);
}

TEST(CapiBatches, TheLocalSessionTakesEveryRanksBatchesAndChecksThemAllFirst) {
  sk_trainer_options o = TinyTrainer();
  o.batch_size = 2;
  o.seq_len = 16;
  o.grad_accum_steps = 2;
  sk_local_session* s = nullptr;
  ASSERT_EQ(sk_local_session_create(&o, 2, nullptr, &s), SK_STATUS_OK) << sk_last_error_message();
  // Rank 0 counts few targets, rank 1 many: the global loss is the mean over all.
  Batch a(1, 8, 6), b(2, 16, 0), c(2, 16, 10), d(1, 5, 0);
  const sk_batch* all[] = {&a.b, &b.b, &c.b, &d.b};
  sk_step_metrics m0 = SK_STEP_METRICS_INIT, m1 = SK_STEP_METRICS_INIT;
  EXPECT_EQ(sk_local_session_step_batches(s, all, 3, &m0), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sk_last_error_message()).find("2 ranks x grad_accum_steps 2 = 4"), std::string::npos)
      << sk_last_error_message();
  EXPECT_EQ(sk_local_session_step_batches(s, nullptr, 4, &m0), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(sk_local_session_step_batches(nullptr, all, 4, &m0), SK_STATUS_INVALID_ARGUMENT);
  Batch bad(2, 16, 0);
  bad.ids[0] = 99;
  const sk_batch* with_bad[] = {&a.b, &b.b, &c.b, &bad.b};
  EXPECT_EQ(sk_local_session_step_batches(s, with_bad, 4, &m0), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sk_last_error_message()).find("rank 1 micro-batch 1"), std::string::npos)
      << sk_last_error_message();
  EXPECT_EQ(sk_local_session_metrics(s, 0, &m0), SK_STATUS_FAILED_PRECONDITION);  // no step ran
  ASSERT_EQ(sk_local_session_step_batches(s, all, 4, &m0), SK_STATUS_OK) << sk_last_error_message();
  ASSERT_EQ(sk_local_session_metrics(s, 1, &m1), SK_STATUS_OK);
  EXPECT_EQ(m0.step, 1);
  EXPECT_EQ(m0.global_loss, m1.global_loss);
  EXPECT_NE(m0.loss, m1.loss);
  // The global loss weighs each rank by its counted targets (2 + 32 on
  // rank 0, 12 + 5 on rank 1), not the ranks equally.
  const double want = (m0.loss * 34.0 + m1.loss * 17.0) / 51.0;
  // 0.8.0: the metrics carry those counts.
  EXPECT_EQ(m0.target_tokens, 34);
  EXPECT_EQ(m1.target_tokens, 17);
  EXPECT_EQ(m0.global_target_tokens, 51);
  EXPECT_EQ(m1.global_target_tokens, 51);
  EXPECT_NEAR(m0.global_loss, want, 1e-5 * want);
  sk_local_session_destroy(s);
}

}  // namespace
