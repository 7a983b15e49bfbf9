// The planner's production path: every candidate through SimulateTraining.
#include <cstdio>

#include <gtest/gtest.h>

#include "runtime/nn/configs.h"
#include "runtime/plan/plan.h"

namespace sk::plan {
namespace {

PlanRequest Small() {
  PlanRequest r;
  r.model = "gpt-1m";
  r.gpus = 16;
  r.gpus_per_node = 8;
  r.batch_size = 4;
  r.space.strategies = {"DDP", "FULL_SHARD", "HYBRID_SHARD", "SHARD_OPTIM"};
  MixedPrecisionPolicy bf16;
  bf16.param_dtype = DType::kBF16;
  r.space.dtypes = {bf16};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone};
  r.space.cpu_offload = {false};
  r.space.forward_prefetch = {false};
  r.space.rate_limits = {RateLimit::InFlight(2)};
  return r;
}

TEST(PlanSimTest, SimulatesEveryCandidateAndIsByteIdenticalTwice) {
  auto a = Plan(Small());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->profile_name, "a100-80g");
  EXPECT_EQ(a->kernels, "shardkit");  // the default kernels
  // DDP, SHARD_OPTIM, FULL_SHARD x {PRE, POST, NONE}, HYBRID_SHARD F in {2, 4, 8} x 3.
  ASSERT_EQ(a->results.size(), 14u);
  ASSERT_EQ(a->recommended, 0);
  for (const CandidateResult& c : a->results) {
    EXPECT_TRUE(c.fits()) << c.candidate.Label() << ": " << c.status;
    EXPECT_GT(c.metrics.step_seconds, 0) << c.candidate.Label();
    EXPECT_GT(c.metrics.peak_allocated_bytes, 0) << c.candidate.Label();
  }
  // One simulated rank: DDP holds the full model's states, FULL_SHARD 1/16.
  const CandidateResult* ddp = nullptr;
  const CandidateResult* full = nullptr;
  for (const CandidateResult& c : a->results) {
    if (c.candidate.Label() == "DDP bf16") ddp = &c;
    if (c.candidate.Label() == "FULL_SHARD bwd=PRE limit=2 bf16") full = &c;
  }
  ASSERT_TRUE(ddp != nullptr && full != nullptr);
  EXPECT_GT(ddp->metrics.peak_allocated_bytes, full->metrics.peak_allocated_bytes);
  auto b = Plan(Small());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(FormatTable(*a), FormatTable(*b));
  EXPECT_EQ(FormatJson(*a), FormatJson(*b));
}

// Asked for, selective checkpointing is simulated like the other two: its
// peak lies between whole-block checkpointing's and none's, and its step
// costs more than none (the recomputed norms and GELUs) but less than full.
TEST(PlanSimTest, SelectiveCheckpointingSitsBetweenNoneAndFull) {
  PlanRequest r = Small();
  r.space.strategies = {"FULL_SHARD"};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone,
                                      ActivationCheckpointing::kFull,
                                      ActivationCheckpointing::kSelective};
  auto p = Plan(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->results.size(), 3u);
  const CandidateMetrics* by[3] = {nullptr, nullptr, nullptr};
  for (const CandidateResult& c : p->results) {
    ASSERT_TRUE(c.fits()) << c.candidate.Label() << ": " << c.status;
    by[static_cast<int>(c.candidate.checkpointing())] = &c.metrics;
  }
  ASSERT_TRUE(by[0] && by[1] && by[2]);
  EXPECT_LT(by[2]->peak_allocated_bytes, by[0]->peak_allocated_bytes);
  EXPECT_GT(by[2]->peak_allocated_bytes, by[1]->peak_allocated_bytes);
  EXPECT_GT(by[2]->step_seconds, by[0]->step_seconds);
  EXPECT_LT(by[2]->step_seconds, by[1]->step_seconds);
  EXPECT_NE(FormatJson(*p).find("\"selective_checkpointing\": true"), std::string::npos);
}

TEST(PlanSimTest, OutOfMemoryIsAResultWithTheEstimatedNeed) {
  PlanRequest r;
  r.model = "gpt-175b";
  r.gpus = 8;
  r.space.strategies = {"DDP", "NO_SHARD"};
  MixedPrecisionPolicy bf16;
  bf16.param_dtype = DType::kBF16;
  r.space.dtypes = {bf16};
  r.space.activation_checkpointing = {ActivationCheckpointing::kFull};
  r.space.cpu_offload = {false};
  auto p = Plan(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->results.size(), 2u);
  EXPECT_EQ(p->recommended, -1);
  for (const CandidateResult& c : p->results) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    EXPECT_TRUE(c.metrics.out_of_memory) << c.candidate.Label();
    EXPECT_FALSE(c.metrics.oom_detail.empty());
    // 175e9 f32 master parameters alone are 700 GB.
    EXPECT_GT(c.metrics.required_bytes, int64_t{600} << 30) << c.candidate.Label();
  }
  EXPECT_EQ(p->recommendation.rfind("nothing fits in 80.00 GiB per GPU; the smallest peak is ", 0), 0u)
      << p->recommendation;
}

// Today's decoders by shape (issue 33's check): Llama 3 8B at sequence 8192,
// batch 1, on 64 H100-80G (8 nodes) fits without whole-block activation
// checkpointing: attention keeps a log-sum-exp per row, not the T x T
// probabilities (32 layers x 32 heads x 8192^2 f32 would be 275 GB), and
// the 128256-token head's logits are counted. The same shape by name and by
// spec plans identically.
TEST(PlanSimTest, Llama3_8bAtSequence8192FitsWithoutCheckpointing) {
  PlanRequest r;
  r.model = "decoder:name=llama3-8b,layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,"
            "vocab=128256,seq=8192,rope_theta=500000";
  r.gpus = 64;
  r.gpus_per_node = 8;
  r.profile = "h100-80g";
  r.batch_size = 1;
  r.seq_len = 8192;
  r.space.strategies = {"FULL_SHARD", "DDP"};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.forward_prefetch = {false};
  r.space.rate_limits = {RateLimit::InFlight(2)};
  MixedPrecisionPolicy bf16;
  bf16.param_dtype = DType::kBF16;
  bf16.reduce_dtype = DType::kF32;
  r.space.dtypes = {bf16};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone};
  r.space.cpu_offload = {false};
  auto p = Plan(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->results.size(), 2u);
  const CandidateResult* full = nullptr;
  const CandidateResult* ddp = nullptr;
  for (const CandidateResult& c : p->results) {
    ASSERT_TRUE(c.status.ok()) << c.candidate.Label() << ": " << c.status;
    (c.candidate.parallelism == Parallelism::kDdp ? ddp : full) = &c;
  }
  ASSERT_TRUE(full != nullptr && ddp != nullptr);
  EXPECT_TRUE(full->fits()) << full->metrics.oom_detail;
  EXPECT_FALSE(full->candidate.activation_checkpointing);
  // 16 bytes per parameter of DDP's model states alone are 128 GB.
  EXPECT_TRUE(ddp->metrics.out_of_memory);
  EXPECT_EQ(p->recommended, 0);
  EXPECT_EQ(p->results[0].candidate.parallelism, Parallelism::kFsdp);
  // The activations of a step, not model states, dominate FULL_SHARD's peak:
  // above the 2 GB of 1/64 of the states, below the card.
  EXPECT_GT(full->metrics.peak_allocated_bytes, int64_t{8} << 30);
  EXPECT_LT(full->metrics.peak_reserved_bytes, int64_t{80} << 30);
  // The named model plans the same.
  PlanRequest named = r;
  named.model = "llama3-8b";
  auto q = Plan(named);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->results.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(q->results[i].metrics.step_seconds, p->results[i].metrics.step_seconds);
    EXPECT_EQ(q->results[i].metrics.peak_allocated_bytes, p->results[i].metrics.peak_allocated_bytes);
  }
}

// Gradient accumulation: M micro-batches of B take about M times one
// micro-batch's compute at one micro-batch's activation memory, where one
// batch of M x B needs more memory.
TEST(PlanSimTest, GradientAccumulationTradesTimeForMemory) {
  PlanRequest r = Small();
  r.space.strategies = {"FULL_SHARD"};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  auto one = Plan(r);
  r.grad_accum_steps = 4;
  auto four = Plan(r);
  r.grad_accum_steps = 1;
  r.batch_size *= 4;
  auto big = Plan(r);
  ASSERT_TRUE(one.ok() && four.ok() && big.ok());
  const CandidateMetrics& m1 = one->results[0].metrics;
  const CandidateMetrics& m4 = four->results[0].metrics;
  const CandidateMetrics& mb = big->results[0].metrics;
  EXPECT_GT(m4.step_seconds, 2.5 * m1.step_seconds);
  EXPECT_LT(m4.peak_allocated_bytes, mb.peak_allocated_bytes);
  EXPECT_NE(FormatTable(*four).find("batch 4 per GPU x 4 micro-batches"), std::string::npos)
      << FormatTable(*four);
  EXPECT_NE(FormatJson(*four).find("\"grad_accum_steps\": 4"), std::string::npos);
}

// The paper's vision models are unit tables (runtime/nn/unit_table.h): they
// plan like any named model. On 8 A100-80G DDP's full model states (16
// bytes per parameter: ~140 GB) cannot fit; FULL_SHARD does.
TEST(PlanSimTest, PaperVisionModelsPlanAsUnitTables) {
  for (const char* model : {"regnet-9b", "deepvit-8b"}) {
    PlanRequest r;
    r.model = model;
    r.gpus = 8;
    r.batch_size = 8;
    r.space.strategies = {"DDP", "FULL_SHARD"};
    MixedPrecisionPolicy bf16;
    bf16.param_dtype = DType::kBF16;
    r.space.dtypes = {bf16};
    r.space.activation_checkpointing = {ActivationCheckpointing::kNone};
    r.space.cpu_offload = {false};
    r.space.forward_prefetch = {false};
    r.space.rate_limits = {RateLimit::InFlight(2)};
    auto p = Plan(r);
    ASSERT_TRUE(p.ok()) << model << ": " << p.status();
    ASSERT_EQ(p->results.size(), 4u) << model;  // DDP, FULL_SHARD x {PRE, POST, NONE}
    ASSERT_GE(p->recommended, 0) << model;
    for (const CandidateResult& c : p->results) {
      ASSERT_TRUE(c.status.ok()) << model << " " << c.candidate.Label() << ": " << c.status;
      if (c.candidate.Label() == "DDP bf16") {
        EXPECT_TRUE(c.metrics.out_of_memory) << model;
        EXPECT_GT(c.metrics.required_bytes, int64_t{128} << 30) << model;
      } else {
        EXPECT_TRUE(c.fits()) << model << " " << c.candidate.Label();
        EXPECT_GT(c.metrics.tflops_per_gpu, 0) << model;
      }
    }
    EXPECT_NE(p->results[static_cast<size_t>(p->recommended)].candidate.Label().find("FULL_SHARD"),
              std::string::npos);
  }
}

// CPU offload is a real candidate dimension: t5-11b's model states on 2
// A100-80G (16 bytes per parameter over 2 GPUs: ~90 GB each) do not fit on
// the device, and with offload (the states in the host's 256 GiB per GPU)
// they do, at a longer step than an on-device run would take.
TEST(PlanSimTest, CpuOffloadFitsWhatTheDeviceCannotHold) {
  PlanRequest r;
  r.model = "t5-11b";
  r.gpus = 2;
  r.batch_size = 1;
  r.space.strategies = {"FULL_SHARD"};
  MixedPrecisionPolicy bf16;
  bf16.param_dtype = DType::kBF16;
  r.space.dtypes = {bf16};
  r.space.activation_checkpointing = {ActivationCheckpointing::kFull};
  r.space.cpu_offload = {false, true};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.forward_prefetch = {false};
  r.space.rate_limits = {RateLimit::InFlight(2)};
  auto p = Plan(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->results.size(), 2u);
  const CandidateResult* on_device = nullptr;
  const CandidateResult* offload = nullptr;
  for (const CandidateResult& c : p->results) {
    ASSERT_TRUE(c.status.ok()) << c.candidate.Label() << ": " << c.status;
    (c.candidate.fsdp.cpu_offload ? offload : on_device) = &c;
  }
  ASSERT_TRUE(on_device != nullptr && offload != nullptr);
  EXPECT_TRUE(on_device->metrics.out_of_memory);
  EXPECT_TRUE(offload->fits()) << offload->metrics.oom_detail;
  EXPECT_GT(offload->metrics.step_seconds, 0);
  ASSERT_GE(p->recommended, 0);
  EXPECT_TRUE(p->results[static_cast<size_t>(p->recommended)].candidate.fsdp.cpu_offload);
  EXPECT_NE(p->results[static_cast<size_t>(p->recommended)].candidate.Label().find("offload"),
            std::string::npos);
  // Where the states went: the host holds the f32 master and gradient
  // shards and AdamW's two moments, 16 bytes per parameter over 2 GPUs, in
  // the profile's 256 GiB per GPU; the on-device run put nothing there.
  const double params = static_cast<double>((*CreateModel("t5-11b", ModelOptions{}))->num_parameters());
  EXPECT_GT(static_cast<double>(offload->metrics.peak_host_bytes), 0.95 * 16 * params / 2);
  EXPECT_LT(offload->metrics.peak_host_bytes, int64_t{256} << 30);
  EXPECT_EQ(on_device->metrics.peak_host_bytes, 0);
  EXPECT_NE(p->recommendation.find(", host "), std::string::npos) << p->recommendation;
}

// cpu-local has no host section: by default the search leaves CPU offload
// out and says so; asked for explicitly, offload fails naming the profile.
TEST(PlanSimTest, AProfileWithoutAHostSectionSkipsOffloadUnlessAsked) {
  PlanRequest r = Small();
  r.profile = "cpu-local";
  r.gpus = 2;
  r.gpus_per_node = 2;
  r.space.strategies = {"FULL_SHARD"};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.cpu_offload.clear();  // the default: off and on
  auto p = Plan(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->results.size(), 1u);
  EXPECT_TRUE(p->results[0].fits()) << p->results[0].status;
  EXPECT_FALSE(p->results[0].candidate.fsdp.cpu_offload);
  ASSERT_EQ(p->notes.size(), 1u);
  EXPECT_NE(p->notes[0].find("CPU offload not searched"), std::string::npos) << p->notes[0];
  EXPECT_NE(p->notes[0].find("cpu-local"), std::string::npos) << p->notes[0];
  EXPECT_NE(FormatTable(*p).find("CPU offload not searched"), std::string::npos);
  EXPECT_NE(FormatJson(*p).find("\"notes\": [\"CPU offload not searched"), std::string::npos);

  r.space.cpu_offload = {false, true};
  auto asked = Plan(r);
  ASSERT_TRUE(asked.ok()) << asked.status();
  ASSERT_EQ(asked->results.size(), 2u);
  EXPECT_TRUE(asked->notes.empty());
  for (const CandidateResult& c : asked->results) {
    if (!c.candidate.fsdp.cpu_offload) continue;
    EXPECT_EQ(c.status.code(), StatusCode::kFailedPrecondition) << c.status;
    EXPECT_NE(c.status.message().find("no host section"), std::string::npos) << c.status;
  }

  // A profile with a host section searches offload by default, no note.
  r.profile = "a100-80g";
  r.space.cpu_offload.clear();
  auto a100 = Plan(r);
  ASSERT_TRUE(a100.ok()) << a100.status();
  EXPECT_EQ(a100->results.size(), 2u);
  EXPECT_TRUE(a100->notes.empty());
}

TEST(PlanSimTest, UnknownProfileIsNotFound) {
  PlanRequest r = Small();
  r.profile = "tpu-v9";
  auto p = Plan(r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
}

// The plan says how far its step times have landed from published runs on
// the profile's hardware (the profile's validation spread), in the table and
// the JSON; a profile nobody checked says so.
TEST(PlanSimTest, PlanPrintsTheValidationSpreadOfItsHardware) {
  PlanRequest r = Small();
  r.space.strategies = {"FULL_SHARD"};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  auto p = Plan(r);  // a100-80g
  ASSERT_TRUE(p.ok()) << p.status();
  StatusOr<sim::SimProfile> a100 = sim::LoadProfile("a100-80g");
  ASSERT_TRUE(a100.ok() && a100->validation.has_value());
  char spread[64];
  std::snprintf(spread, sizeof(spread), "%.2f-%.2fx", a100->validation->ratio_low, a100->validation->ratio_high);
  EXPECT_NE(p->uncertainty.find(spread), std::string::npos) << p->uncertainty;
  EXPECT_NE(p->uncertainty.find(std::to_string(a100->validation->runs) + " published runs"), std::string::npos)
      << p->uncertainty;
  EXPECT_NE(FormatTable(*p).find("uncertainty: " + p->uncertainty), std::string::npos);
  EXPECT_NE(FormatJson(*p).find("\"uncertainty\": "), std::string::npos);
  // It says whose kernels priced the step (shardkit's by default), and a
  // profile name can ask for the kernel libraries' rates instead: faster.
  EXPECT_NE(p->uncertainty.find("(a100-80g with shardkit kernels)"), std::string::npos) << p->uncertainty;
  EXPECT_NE(FormatTable(*p).find("profile a100-80g with shardkit kernels ("), std::string::npos) << FormatTable(*p);
  EXPECT_NE(FormatJson(*p).find("\"kernels\": \"shardkit\""), std::string::npos);
  PlanRequest lib = r;
  lib.profile = "a100-80g:reference";
  auto q = Plan(lib);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->profile_name, "a100-80g");
  EXPECT_EQ(q->kernels, "reference");
  EXPECT_NE(q->uncertainty.find("(a100-80g with reference kernels)"), std::string::npos) << q->uncertainty;
  ASSERT_TRUE(p->results[0].fits() && q->results[0].fits());
  EXPECT_LT(q->results[0].metrics.step_seconds, p->results[0].metrics.step_seconds);

  r.profile = "cpu-local";
  r.gpus = 2;
  r.gpus_per_node = 2;
  auto cpu = Plan(r);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_NE(cpu->uncertainty.find("no published training run was checked"), std::string::npos)
      << cpu->uncertainty;
}

}  // namespace
}  // namespace sk::plan
