// sk_plan as a caller sees it: through libshardkit.so and shardkit.h only.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "shardkit/shardkit.h"

namespace {

std::string LastError() { return sk_last_error_message(); }

#define ASSERT_OK(call)                                                                      \
  do {                                                                                       \
    sk_status_t st_ = (call);                                                                \
    ASSERT_EQ(st_, SK_STATUS_OK) << #call << ": " << sk_status_name(st_) << ": " << LastError(); \
  } while (0)

// gpt-1m on 8 simulated A100s, bf16, no checkpointing or offload: DDP and
// FULL_SHARD's prefetch/rate-limit variants (22 candidates, fast).
sk_plan_request SmallRequest() {
  sk_plan_request r = SK_PLAN_REQUEST_INIT;
  r.model = "gpt-1m";
  r.profile = "a100-80g";
  r.gpus = 8;
  r.gpus_per_node = 8;
  r.batch_size = 4;
  r.strategies = "DDP,FULL_SHARD";
  r.dtypes = "bf16";
  r.activation_checkpointing = 1;
  r.cpu_offload = 1;
  return r;
}

TEST(CapiPlanTest, RanksCandidatesAndRecommendsTheFastestThatFits) {
  sk_plan_request r = SmallRequest();
  sk_plan_result* plan = nullptr;
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_NE(plan, nullptr);
  EXPECT_GE(plan->struct_size, sizeof(sk_plan_result));
  EXPECT_STREQ(plan->profile, "a100-80g");
  EXPECT_EQ(plan->device_memory_bytes, int64_t{80} << 30);
  ASSERT_EQ(plan->num_candidates, 22);
  EXPECT_EQ(plan->recommended, 0);
  EXPECT_NE(std::string(plan->table).find("simulated, profile a100-80g"), std::string::npos) << plan->table;
  EXPECT_NE(std::string(plan->table).find("recommended: "), std::string::npos);
  EXPECT_EQ(std::string(plan->json).rfind("{", 0), 0u);
  double previous = 0;
  int ddp = 0;
  for (int i = 0; i < plan->num_candidates; ++i) {
    sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
    ASSERT_OK(sk_plan_result_candidate(plan, i, &c));
    ASSERT_NE(c.label, nullptr);
    EXPECT_EQ(c.error, nullptr) << c.label;
    EXPECT_EQ(c.fits, 1) << c.label;
    EXPECT_GT(c.step_seconds, 0) << c.label;
    EXPECT_GE(c.step_seconds, previous) << c.label;
    previous = c.step_seconds;
    EXPECT_GT(c.peak_reserved_bytes, 0);
    EXPECT_GE(c.peak_reserved_bytes, c.peak_allocated_bytes);
    EXPECT_EQ(c.param_dtype, SK_DTYPE_BF16);
    if (c.parallelism == SK_PARALLELISM_DDP) {
      ++ddp;
      EXPECT_STREQ(c.label, "DDP bf16");
    } else {
      EXPECT_EQ(c.parallelism, SK_PARALLELISM_FSDP);
      EXPECT_EQ(c.strategy, SK_SHARDING_FULL_SHARD);
    }
    if (i == 0) {
      EXPECT_NE(std::string(plan->recommendation).find(c.label), std::string::npos);
    }
  }
  EXPECT_EQ(ddp, 1);
  // The same request again: the same bytes.
  sk_plan_result* again = nullptr;
  ASSERT_OK(sk_plan(&r, &again));
  EXPECT_STREQ(plan->table, again->table);
  EXPECT_STREQ(plan->json, again->json);
  sk_plan_result_free(again);
  sk_plan_result_free(plan);
}

// peak_host_bytes: CPU offload's state in the simulated host memory per
// GPU, the same for every offloaded candidate of one model and sharding
// (prefetch does not move it), 0 without offload; in the JSON too. A caller
// built before the field was appended (struct_size 136) still gets the
// fields it knows and nothing past them.
TEST(CapiPlanTest, OffloadedCandidatesReportTheirHostMemory) {
  sk_plan_request r = SmallRequest();
  r.strategies = "FULL_SHARD";
  r.cpu_offload = 0;  // both
  sk_plan_result* plan = nullptr;
  ASSERT_OK(sk_plan(&r, &plan));
  int64_t host = -1;
  int offloaded = 0, on_device = 0;
  for (int i = 0; i < plan->num_candidates; ++i) {
    sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
    ASSERT_OK(sk_plan_result_candidate(plan, i, &c));
    ASSERT_EQ(c.fits, 1) << c.label;
    if (c.cpu_offload) {
      ++offloaded;
      EXPECT_GT(c.peak_host_bytes, 0) << c.label;
      if (host < 0) host = c.peak_host_bytes;
      EXPECT_EQ(c.peak_host_bytes, host) << c.label;
    } else {
      ++on_device;
      EXPECT_EQ(c.peak_host_bytes, 0) << c.label;
    }
  }
  EXPECT_GT(offloaded, 0);
  EXPECT_GT(on_device, 0);
  EXPECT_NE(std::string(plan->json).find("\"peak_host_bytes\": " + std::to_string(host)), std::string::npos);
  EXPECT_NE(std::string(plan->table).find("host GiB"), std::string::npos) << plan->table;

  struct {
    sk_plan_candidate c;
    unsigned char after[16];
  } old;
  std::memset(&old, 0xAB, sizeof(old));
  old.c.struct_size = offsetof(sk_plan_candidate, peak_host_bytes);
  ASSERT_EQ(old.c.struct_size, 136u);
  ASSERT_OK(sk_plan_result_candidate(plan, 0, &old.c));
  EXPECT_GT(old.c.step_seconds, 0);
  const auto* tail = reinterpret_cast<const unsigned char*>(&old.c) + old.c.struct_size;
  for (size_t i = 0; i < sizeof(sk_plan_candidate) - 136 + sizeof(old.after); ++i) {
    EXPECT_EQ(tail[i], 0xAB) << "byte " << 136 + i << " written past the caller's struct_size";
  }
  sk_plan_result_free(plan);
}

TEST(CapiPlanTest, NothingFitsIsAResult) {
  sk_plan_request r = SK_PLAN_REQUEST_INIT;
  r.model = "gpt-175b";
  r.gpus = 8;
  r.strategies = "DDP";
  r.dtypes = "bf16";
  r.activation_checkpointing = 2;
  sk_plan_result* plan = nullptr;
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_EQ(plan->num_candidates, 1);
  EXPECT_EQ(plan->recommended, -1);
  EXPECT_EQ(std::string(plan->recommendation).rfind("nothing fits in 80.00 GiB per GPU", 0), 0u)
      << plan->recommendation;
  sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
  ASSERT_OK(sk_plan_result_candidate(plan, 0, &c));
  EXPECT_EQ(c.fits, 0);
  EXPECT_EQ(c.out_of_memory, 1);
  // GPT-175B's f32 master copy alone is 700 GB.
  EXPECT_GT(c.required_bytes, int64_t{700} << 30);
  EXPECT_NE(std::string(plan->table).find("OOM"), std::string::npos);
  sk_plan_result_free(plan);
}

TEST(CapiPlanTest, WritesATraceOfTheRecommendation) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/plan_trace.json";
  std::filesystem::remove(path);
  sk_plan_request r = SmallRequest();
  r.strategies = "FULL_SHARD";
  r.trace_path = path.c_str();
  sk_plan_result* plan = nullptr;
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_GT(std::filesystem::file_size(path), 100u);
  sk_plan_result_free(plan);
}

// sk_plan_request.checkpointing searches the selective policies; each
// candidate reports its policy as an sk_activation_checkpointing_t, and
// recomputing the attention too keeps less than selective alone.
TEST(CapiPlanTest, SearchesSelectiveCheckpointingAndReportsEachPolicy) {
  sk_plan_request r = SmallRequest();
  r.strategies = "DDP";
  r.activation_checkpointing = 0;
  r.checkpointing = "off,full,selective,selective_attention";
  sk_plan_result* plan = nullptr;
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_EQ(plan->num_candidates, 4);
  int64_t peak[4] = {0, 0, 0, 0};
  std::string labels[4];
  for (int i = 0; i < plan->num_candidates; ++i) {
    sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
    ASSERT_OK(sk_plan_result_candidate(plan, i, &c));
    ASSERT_GE(c.activation_checkpointing, SK_CHECKPOINTING_OFF) << c.label;
    ASSERT_LE(c.activation_checkpointing, SK_CHECKPOINTING_SELECTIVE_ATTENTION) << c.label;
    EXPECT_EQ(c.fits, 1) << c.label << ": " << (c.error != nullptr ? c.error : "");
    EXPECT_EQ(peak[c.activation_checkpointing], 0) << "two candidates with policy " << c.activation_checkpointing;
    peak[c.activation_checkpointing] = c.peak_allocated_bytes;
    labels[c.activation_checkpointing] = c.label;
  }
  EXPECT_EQ(labels[SK_CHECKPOINTING_SELECTIVE], "DDP sel-ckpt bf16");
  EXPECT_EQ(labels[SK_CHECKPOINTING_SELECTIVE_ATTENTION], "DDP sel-ckpt+attn bf16");
  EXPECT_LT(peak[SK_CHECKPOINTING_SELECTIVE], peak[SK_CHECKPOINTING_OFF]);
  EXPECT_LT(peak[SK_CHECKPOINTING_SELECTIVE_ATTENTION], peak[SK_CHECKPOINTING_SELECTIVE]);
  EXPECT_GT(peak[SK_CHECKPOINTING_SELECTIVE_ATTENTION], peak[SK_CHECKPOINTING_FULL]);
  EXPECT_NE(std::string(plan->json).find("\"recompute_attention\": true"), std::string::npos);
  sk_plan_result_free(plan);

  // One policy alone, and the older fields' way to ask for none.
  r.checkpointing = "selective_attention";
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_EQ(plan->num_candidates, 1);
  sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
  ASSERT_OK(sk_plan_result_candidate(plan, 0, &c));
  EXPECT_EQ(c.activation_checkpointing, SK_CHECKPOINTING_SELECTIVE_ATTENTION);
  sk_plan_result_free(plan);
}

// selective_matmuls (0.8.0) on a Llama-family model: reported as
// SK_CHECKPOINTING_SELECTIVE_MATMULS, labelled, flagged in the JSON, and
// keeping less than selective and more than whole-block checkpointing.
TEST(CapiPlanTest, SearchesSelectiveMatmulCheckpointingOnLlama) {
  sk_plan_request r = SmallRequest();
  r.model = "llama-tiny";
  r.strategies = "DDP";
  r.activation_checkpointing = 0;
  r.checkpointing = "full,selective,selective_matmuls";
  sk_plan_result* plan = nullptr;
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_EQ(plan->num_candidates, 3);
  int64_t peak[5] = {0, 0, 0, 0, 0};
  std::string labels[5];
  for (int i = 0; i < plan->num_candidates; ++i) {
    sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
    ASSERT_OK(sk_plan_result_candidate(plan, i, &c));
    ASSERT_GE(c.activation_checkpointing, SK_CHECKPOINTING_OFF) << c.label;
    ASSERT_LE(c.activation_checkpointing, SK_CHECKPOINTING_SELECTIVE_MATMULS) << c.label;
    EXPECT_EQ(c.fits, 1) << c.label << ": " << (c.error != nullptr ? c.error : "");
    peak[c.activation_checkpointing] = c.peak_allocated_bytes;
    labels[c.activation_checkpointing] = c.label;
  }
  EXPECT_EQ(labels[SK_CHECKPOINTING_SELECTIVE_MATMULS], "DDP sel-ckpt+mm bf16");
  EXPECT_LT(peak[SK_CHECKPOINTING_SELECTIVE_MATMULS], peak[SK_CHECKPOINTING_SELECTIVE]);
  EXPECT_GT(peak[SK_CHECKPOINTING_SELECTIVE_MATMULS], peak[SK_CHECKPOINTING_FULL]);
  EXPECT_NE(std::string(plan->json).find("\"selective_matmuls\": true"), std::string::npos);
  sk_plan_result_free(plan);
  // GPT has no such policy: the candidate fails, naming it.
  r.model = "gpt-1m";
  r.checkpointing = "selective_matmuls";
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_EQ(plan->num_candidates, 1);
  sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
  ASSERT_OK(sk_plan_result_candidate(plan, 0, &c));
  EXPECT_EQ(c.activation_checkpointing, SK_CHECKPOINTING_SELECTIVE_MATMULS);
  ASSERT_NE(c.error, nullptr);
  EXPECT_NE(std::string(c.error).find("selective_matmuls"), std::string::npos) << c.error;
  sk_plan_result_free(plan);
}

// A caller built against the 0.6.1 header passes the struct without
// `checkpointing` (struct_size 88): accepted, as before.
TEST(CapiPlanTest, TheStructWithoutCheckpointingIsStillAccepted) {
  sk_plan_request r = SmallRequest();
  r.strategies = "DDP";
  r.activation_checkpointing = 2;  // whole block only
  r.checkpointing = "selective";   // beyond the old struct: not read
  r.struct_size = offsetof(sk_plan_request, checkpointing);
  sk_plan_result* plan = nullptr;
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_EQ(plan->num_candidates, 1);
  sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
  ASSERT_OK(sk_plan_result_candidate(plan, 0, &c));
  EXPECT_EQ(c.activation_checkpointing, SK_CHECKPOINTING_FULL);
  EXPECT_STREQ(c.label, "DDP ckpt bf16");
  sk_plan_result_free(plan);
}

TEST(CapiPlanTest, BadCheckpointingIsAnErrorNamingIt) {
  sk_plan_result* plan = nullptr;
  sk_plan_request r = SmallRequest();
  r.checkpointing = "off,sometimes";
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  r.activation_checkpointing = 0;
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("sk_plan_request.checkpointing: 'sometimes'"), std::string::npos) << LastError();
  r.checkpointing = "selective";
  r.activation_checkpointing = 1;
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("both set"), std::string::npos) << LastError();
  EXPECT_EQ(plan, nullptr);
  // A model without selective checkpointing: those candidates fail, named.
  r = SmallRequest();
  r.model = "t5-tiny";
  r.strategies = "DDP";
  r.activation_checkpointing = 0;
  r.checkpointing = "off,selective";
  ASSERT_OK(sk_plan(&r, &plan));
  ASSERT_EQ(plan->num_candidates, 2);
  sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
  ASSERT_OK(sk_plan_result_candidate(plan, 1, &c));
  EXPECT_EQ(c.activation_checkpointing, SK_CHECKPOINTING_SELECTIVE);
  ASSERT_NE(c.error, nullptr);
  EXPECT_NE(std::string(c.error).find("t5-tiny"), std::string::npos) << c.error;
  sk_plan_result_free(plan);
}

TEST(CapiPlanTest, BadInputIsAnErrorNamingIt) {
  sk_plan_result* plan = nullptr;
  sk_plan_request r = SmallRequest();
  EXPECT_EQ(sk_plan(nullptr, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(sk_plan(&r, nullptr), SK_STATUS_INVALID_ARGUMENT);
  r.model = nullptr;
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("model"), std::string::npos) << LastError();
  r = SmallRequest();
  r.model = "gpt-2t";
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_NOT_FOUND);
  EXPECT_NE(LastError().find("gpt-2t"), std::string::npos) << LastError();
  r = SmallRequest();
  r.profile = "tpu-v9";
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_NOT_FOUND);
  r = SmallRequest();
  r.strategies = "FULL_SHARD,ZERO4";
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("ZERO4"), std::string::npos) << LastError();
  r = SmallRequest();
  r.dtypes = "bf16/fp8";
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  r = SmallRequest();
  r.activation_checkpointing = 3;
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("activation_checkpointing"), std::string::npos) << LastError();
  r = SmallRequest();
  r.gpus = 12;
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("gpus_per_node"), std::string::npos) << LastError();
  r = SmallRequest();
  r.batch_size = -1;
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  r = SmallRequest();
  r.struct_size = 8;
  EXPECT_EQ(sk_plan(&r, &plan), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(plan, nullptr);  // untouched on every failure

  r = SmallRequest();
  r.strategies = "DDP";
  ASSERT_OK(sk_plan(&r, &plan));
  sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
  EXPECT_EQ(sk_plan_result_candidate(plan, plan->num_candidates, &c), SK_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(sk_plan_result_candidate(plan, -1, &c), SK_STATUS_OUT_OF_RANGE);
  EXPECT_EQ(sk_plan_result_candidate(plan, 0, nullptr), SK_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(sk_plan_result_candidate(nullptr, 0, &c), SK_STATUS_INVALID_ARGUMENT);
  // A struct_size no version of the struct has.
  c.struct_size = 16;
  EXPECT_EQ(sk_plan_result_candidate(plan, 0, &c), SK_STATUS_INVALID_ARGUMENT);
  c.struct_size = sizeof(c);
  sk_plan_result_free(plan);
  EXPECT_EQ(sk_plan_result_candidate(plan, 0, &c), SK_STATUS_INVALID_ARGUMENT);  // freed
  sk_plan_result_free(plan);     // twice: ignored
  sk_plan_result_free(nullptr);  // accepted
}

}  // namespace
