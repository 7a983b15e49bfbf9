// The planner's candidate space, ranking, recommendation and formats, with
// the simulator replaced by a function of the candidate (PlanWith's
// parameter). The production path (Plan, plan_sim_test) calls the simulator.
#include "runtime/plan/plan.h"

#include <iterator>
#include <map>
#include <sstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace sk::plan {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlanRequest Request(int gpus = 8) {
  PlanRequest r;
  r.model = "t5-611m";
  r.gpus = gpus;
  r.gpus_per_node = 8;
  r.batch_size = 8;
  return r;
}

// A stand-in whose numbers depend on the configuration in known ways: DDP
// needs 100 GiB, checkpointing halves memory and costs 30% time, offload
// costs 50% time, bf16 halves time; prefetch PRE is fastest.
StatusOr<CandidateMetrics> Model(const PlanRequest&, const Candidate& c, const std::string&) {
  CandidateMetrics m;
  double t = 1.0;
  int64_t mem = 40 * kGiB;
  if (c.parallelism == Parallelism::kDdp) mem = 100 * kGiB;
  if (c.fsdp.strategy == ShardingStrategy::kNoShard) mem = 90 * kGiB;
  if (c.activation_checkpointing) {
    mem /= 2;
    t *= 1.3;
  }
  if (c.fsdp.cpu_offload) t *= 1.5;
  if (c.fsdp.mixed_precision.param_dtype == DType::kBF16) t *= 0.5;
  if (c.fsdp.backward_prefetch == BackwardPrefetch::kNone) t *= 1.2;
  if (c.fsdp.backward_prefetch == BackwardPrefetch::kBackwardPost) t *= 1.1;
  m.peak_allocated_bytes = mem;
  m.peak_reserved_bytes = mem + kGiB;
  if (mem > 80 * kGiB) {
    m.out_of_memory = true;
    m.required_bytes = mem;
    m.oom_detail = "cap";
  }
  m.step_seconds = t;
  m.tflops_per_gpu = 100 / t;
  m.mfu = m.tflops_per_gpu / 312;
  return m;
}

TEST(PlanTest, EnumerationPrunesCombinationsThatCannotDiffer) {
  auto cands = EnumerateCandidates(Request());
  ASSERT_TRUE(cands.ok()) << cands.status();
  std::set<std::string> labels;
  std::map<std::string, int> per_strategy;
  for (size_t i = 0; i < cands->size(); ++i) {
    const Candidate& c = (*cands)[i];
    EXPECT_EQ(c.index, static_cast<int>(i));
    EXPECT_TRUE(labels.insert(c.Label()).second) << "duplicate " << c.Label();
    per_strategy[c.StrategyName()]++;
    EXPECT_TRUE(ValidateFsdpOptions(c.fsdp, 8).ok()) << c.Label();
    const ShardingStrategy s = c.fsdp.strategy;
    if (c.parallelism == Parallelism::kDdp) {
      EXPECT_FALSE(c.fsdp.cpu_offload);
      continue;
    }
    // Only the strategies that gather in backward vary the backward prefetch.
    if (s != ShardingStrategy::kFullShard && s != ShardingStrategy::kHybridShard) {
      EXPECT_EQ(c.fsdp.backward_prefetch, BackwardPrefetch::kBackwardPre) << c.Label();
    }
    if (s == ShardingStrategy::kShardOptim || s == ShardingStrategy::kNoShard) {
      EXPECT_FALSE(c.fsdp.forward_prefetch) << c.Label();
      EXPECT_EQ(c.fsdp.all_gather_limit, RateLimit::InFlight(2)) << c.Label();
    }
    if (s == ShardingStrategy::kHybridShard || s == ShardingStrategy::kHybridShardGradOp) {
      // 8 GPUs on one node: F in {2, 4}.
      EXPECT_TRUE(c.fsdp.shard_group_size == 2 || c.fsdp.shard_group_size == 4) << c.Label();
    } else {
      EXPECT_EQ(c.fsdp.shard_group_size, 0);
    }
  }
  // DDP: 2 dtypes (bf16 and bf16/f32 are one DDP run) x 2 checkpointing.
  EXPECT_EQ(per_strategy["DDP"], 4);
  // FULL_SHARD per (dtype, ckpt, offload): PRE/POST x fwd on/off x 4 limits
  // + NONE with forward prefetch x 4 limits + NONE without = 21.
  EXPECT_EQ(per_strategy["FULL_SHARD"], 3 * 2 * 2 * 21);
  // SHARD_GRAD_OP: forward prefetch off (1) or on x 4 limits = 5.
  EXPECT_EQ(per_strategy["SHARD_GRAD_OP"], 3 * 2 * 2 * 5);
  EXPECT_EQ(per_strategy["SHARD_OPTIM"], 3 * 2 * 2);
  EXPECT_EQ(per_strategy["NO_SHARD"], 3 * 2 * 2);
  EXPECT_EQ(per_strategy["HYBRID_SHARD"], 2 * 3 * 2 * 2 * 21);
  EXPECT_EQ(per_strategy["HYBRID_SHARD_GRAD_OP"], 2 * 3 * 2 * 2 * 5);
}

// The planner describes each candidate by the same ShardingPlan FSDP builds
// its groups from (runtime/parallel/sharding_plan.h): a hybrid's F is its
// shard group, and backward prefetch is varied exactly where the policy
// gathers again in backward.
TEST(PlanTest, CandidatesAreLabelledByTheShardingPlanFsdpResolves) {
  PlanRequest r = Request();
  r.gpus_per_node = 4;
  auto cands = EnumerateCandidates(r);
  ASSERT_TRUE(cands.ok()) << cands.status();
  for (const Candidate& c : *cands) {
    if (c.parallelism == Parallelism::kDdp) continue;
    StatusOr<ShardingPlan> p =
        ResolveSharding(c.fsdp.strategy, c.fsdp.shard_group_size, r.gpus, r.gpus_per_node);
    ASSERT_TRUE(p.ok()) << c.Label() << ": " << p.status();
    const std::string label = c.Label();
    if (IsHybrid(c.fsdp.strategy)) {
      EXPECT_NE(label.find(" F=" + std::to_string(p->shard_size()) + " "), std::string::npos) << label;
      EXPECT_GT(p->replicate_size(), 1) << label;
      EXPECT_GT(p->shard_size(), 1) << label;
    } else {
      EXPECT_EQ(p->shard_size(), c.fsdp.strategy == ShardingStrategy::kNoShard ? 1 : r.gpus) << label;
    }
    EXPECT_EQ(label.find(" bwd=") != std::string::npos, p->policy.gathers_in_backward()) << label;
    if (!p->policy.gathers_in_forward()) {
      EXPECT_EQ(label.find(" limit="), std::string::npos) << label;
    }
  }
}

TEST(PlanTest, HybridFactorsArePowersOfTwoOrTheNodeSize) {
  PlanRequest r = Request(24);
  r.gpus_per_node = 6;
  r.space.strategies = {"HYBRID_SHARD"};
  r.space.dtypes = {MixedPrecisionPolicy{}};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone};
  r.space.cpu_offload = {false};
  r.space.backward_prefetch = {BackwardPrefetch::kNone};
  r.space.forward_prefetch = {false};
  auto cands = EnumerateCandidates(r);
  ASSERT_TRUE(cands.ok()) << cands.status();
  std::vector<int> fs;
  for (const Candidate& c : *cands) fs.push_back(c.fsdp.shard_group_size);
  EXPECT_EQ(fs, (std::vector<int>{2, 4, 6, 8}));
  // One GPU: no hybrid factor exists, so no hybrid candidate.
  r = Request(1);
  r.space.strategies = {"HYBRID_SHARD", "HYBRID_SHARD_GRAD_OP"};
  cands = EnumerateCandidates(r);
  ASSERT_TRUE(cands.ok());
  EXPECT_TRUE(cands->empty());
}

TEST(PlanTest, RestrictionsNarrowTheSpace) {
  PlanRequest r = Request();
  auto strategies = ParseStrategyList("ddp, full_shard");
  ASSERT_TRUE(strategies.ok());
  r.space.strategies = *strategies;
  auto dtypes = ParseDTypeList("bf16/f32");
  ASSERT_TRUE(dtypes.ok());
  r.space.dtypes = *dtypes;
  r.space.activation_checkpointing = {ActivationCheckpointing::kFull};
  r.space.cpu_offload = {false};
  r.space.rate_limits = {RateLimit::Off()};
  auto cands = EnumerateCandidates(r);
  ASSERT_TRUE(cands.ok()) << cands.status();
  // DDP bf16 ckpt; FULL_SHARD: PRE/POST x fwd on/off + NONE fwd + NONE = 6.
  ASSERT_EQ(cands->size(), 7u);
  EXPECT_EQ((*cands)[0].Label(), "DDP ckpt bf16");
  EXPECT_EQ((*cands)[1].Label(), "FULL_SHARD bwd=PRE limit=off ckpt bf16/f32");
}

// Selective checkpointing is a third value of the checkpointing dimension,
// searched only where the space lists it: the default space is unchanged.
TEST(PlanTest, SelectiveCheckpointingIsSearchedOnlyWhenAsked) {
  PlanRequest r = Request();
  auto all = EnumerateCandidates(r);
  ASSERT_TRUE(all.ok()) << all.status();
  for (const Candidate& c : *all) {
    EXPECT_FALSE(c.selective_checkpointing) << c.Label();
    EXPECT_EQ(c.Label().find("sel-ckpt"), std::string::npos) << c.Label();
  }
  r.space.strategies = {"DDP", "FULL_SHARD"};
  r.space.dtypes = {MixedPrecisionPolicy{DType::kBF16, DType::kF32}};
  r.space.cpu_offload = {false};
  r.space.rate_limits = {RateLimit::Off()};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.forward_prefetch = {false};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone,
                                      ActivationCheckpointing::kFull,
                                      ActivationCheckpointing::kSelective};
  auto cands = EnumerateCandidates(r);
  ASSERT_TRUE(cands.ok()) << cands.status();
  std::vector<std::string> labels;
  for (const Candidate& c : *cands) {
    labels.push_back(c.Label());
    EXPECT_FALSE(c.activation_checkpointing && c.selective_checkpointing) << c.Label();
  }
  EXPECT_EQ(labels, (std::vector<std::string>{
                        "DDP bf16", "DDP ckpt bf16", "DDP sel-ckpt bf16",
                        "FULL_SHARD bwd=PRE limit=off bf16/f32",
                        "FULL_SHARD bwd=PRE limit=off ckpt bf16/f32",
                        "FULL_SHARD bwd=PRE limit=off sel-ckpt bf16/f32"}));
  EXPECT_EQ((*cands)[2].checkpointing(), ActivationCheckpointing::kSelective);
  EXPECT_EQ((*cands)[1].checkpointing(), ActivationCheckpointing::kFull);
}

// Gradient accumulation (issue 45, item 2): with micro-batches, the
// strategies that free unsharded gradients are searched both sharded and
// unsharded ("no_sync"); SHARD_OPTIM, NO_SHARD and DDP keep theirs, and one
// micro-batch has nothing to choose.
TEST(PlanTest, AccumulationIsSearchedBothWaysWhereItCanDiffer) {
  PlanRequest r = Request();
  r.space.strategies = {"DDP", "FULL_SHARD", "NO_SHARD"};
  r.space.dtypes = {MixedPrecisionPolicy{DType::kBF16, std::nullopt}};
  r.space.cpu_offload = {false};
  r.space.rate_limits = {RateLimit::InFlight(2)};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.forward_prefetch = {false};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone};
  auto one = EnumerateCandidates(r);
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<std::string> labels;
  for (const Candidate& c : *one) labels.push_back(c.Label());
  EXPECT_EQ(labels, (std::vector<std::string>{"DDP bf16", "FULL_SHARD bwd=PRE limit=2 bf16", "NO_SHARD bf16"}));
  r.grad_accum_steps = 4;
  auto four = EnumerateCandidates(r);
  ASSERT_TRUE(four.ok()) << four.status();
  labels.clear();
  for (const Candidate& c : *four) labels.push_back(c.Label());
  EXPECT_EQ(labels, (std::vector<std::string>{"DDP bf16", "FULL_SHARD bwd=PRE limit=2 bf16",
                                              "FULL_SHARD bwd=PRE limit=2 no_sync bf16", "NO_SHARD bf16"}));
  EXPECT_EQ((*four)[1].fsdp.grad_accumulation, GradAccumulation::kSharded);
  EXPECT_EQ((*four)[2].fsdp.grad_accumulation, GradAccumulation::kUnsharded);
  r.space.grad_accumulation = {GradAccumulation::kUnsharded};
  auto restricted = EnumerateCandidates(r);
  ASSERT_TRUE(restricted.ok()) << restricted.status();
  ASSERT_EQ(restricted->size(), 3u);
  EXPECT_EQ((*restricted)[1].Label(), "FULL_SHARD bwd=PRE limit=2 no_sync bf16");
}

// Every other matmul recomputed (torchtitan's op-level policy) is a policy
// of the model's own: parsed from its name, labelled sel-ckpt+mm, run by the
// trainer as ActivationCheckpointing::kSelectiveMatmuls.
TEST(PlanTest, SelectiveMatmulsIsAPolicyOfItsOwn) {
  auto list = ParseCheckpointingList("selective_matmuls,selective,selective_matmuls", "--checkpointing");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (std::vector<CheckpointingChoice>{ActivationCheckpointing::kSelectiveMatmuls,
                                                     ActivationCheckpointing::kSelective}));
  PlanRequest r;
  r.model = "llama-tiny";
  r.space.strategies = {"FULL_SHARD"};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.forward_prefetch = {false};
  r.space.rate_limits = {RateLimit::InFlight(2)};
  r.space.cpu_offload = {false};
  r.space.dtypes = {MixedPrecisionPolicy{DType::kBF16}};
  r.space.activation_checkpointing = *list;
  auto cands = EnumerateCandidates(r);
  ASSERT_TRUE(cands.ok()) << cands.status();
  ASSERT_EQ(cands->size(), 2u);
  EXPECT_EQ((*cands)[0].Label(), "FULL_SHARD bwd=PRE limit=2 sel-ckpt+mm bf16");
  EXPECT_EQ((*cands)[0].checkpointing(), ActivationCheckpointing::kSelectiveMatmuls);
  EXPECT_FALSE((*cands)[0].selective_checkpointing);
  EXPECT_EQ((*cands)[1].checkpointing(), ActivationCheckpointing::kSelective);
  EXPECT_FALSE((*cands)[1].selective_matmuls);
  r.space.activation_checkpointing = {CheckpointingChoice(ActivationCheckpointing::kSelectiveMatmuls, true)};
  auto attention = EnumerateCandidates(r);
  ASSERT_FALSE(attention.ok());
  EXPECT_NE(attention.status().message().find("recompute_attention"), std::string::npos)
      << attention.status();
}

// Selective checkpointing with the attention recomputed is a fourth policy:
// labelled, parsed from its name and refused with any other policy.
TEST(PlanTest, SelectiveWithAttentionIsAPolicyOfItsOwn) {
  auto list = ParseCheckpointingList("off, selective,selective_attention,full,selective", "--checkpointing");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (std::vector<CheckpointingChoice>{
                       ActivationCheckpointing::kNone, ActivationCheckpointing::kSelective,
                       CheckpointingChoice(ActivationCheckpointing::kSelective, true),
                       ActivationCheckpointing::kFull}));
  auto bad = ParseCheckpointingList("off,partly", "--checkpointing");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--checkpointing: 'partly'"), std::string::npos) << bad.status();

  PlanRequest r;
  r.model = "gpt-1m";
  r.space.strategies = {"DDP"};
  r.space.dtypes = {MixedPrecisionPolicy{DType::kBF16}};
  r.space.activation_checkpointing = *list;
  auto cands = EnumerateCandidates(r);
  ASSERT_TRUE(cands.ok()) << cands.status();
  std::vector<std::string> labels;
  for (const Candidate& c : *cands) labels.push_back(c.Label());
  EXPECT_EQ(labels, (std::vector<std::string>{"DDP bf16", "DDP sel-ckpt bf16", "DDP sel-ckpt+attn bf16",
                                              "DDP ckpt bf16"}));
  EXPECT_TRUE((*cands)[2].recompute_attention);
  EXPECT_EQ((*cands)[2].checkpointing_choice(), CheckpointingChoice(ActivationCheckpointing::kSelective, true));
  EXPECT_FALSE((*cands)[1].recompute_attention);

  r.space.activation_checkpointing = {CheckpointingChoice(ActivationCheckpointing::kFull, true)};
  auto refused = EnumerateCandidates(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("recompute_attention with 'on'"), std::string::npos)
      << refused.status();
}

TEST(PlanTest, BadRequestsNameTheField) {
  auto expect_error = [](PlanRequest r, const std::string& needle,
                         StatusCode code = StatusCode::kInvalidArgument) {
    auto c = EnumerateCandidates(r);
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_EQ(c.status().code(), code);
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status();
  };
  PlanRequest r = Request();
  r.model = "t5-12b";
  expect_error(r, "t5-12b", StatusCode::kNotFound);
  r = Request(12);
  r.gpus_per_node = 8;
  expect_error(r, "gpus_per_node");
  r = Request(0);
  expect_error(r, "gpus");
  // Above the simulator's largest world (2^20): refused at once, where a
  // billion GPUs ran out of memory placing groups rank by rank.
  r = Request(1 << 21);
  expect_error(r, "gpus must be at most 1048576");
  r = Request();
  r.batch_size = 0;
  expect_error(r, "batch_size");
  r = Request();
  r.space.strategies = {"ZERO4"};
  expect_error(r, "ZERO4");
  r = Request();
  r.space.shard_group_sizes = {3};
  expect_error(r, "shard_group_sizes");
  r = Request();
  r.space.rate_limits = {RateLimit::InFlight(0)};
  expect_error(r, "rate_limits");
  r = Request();
  r.grad_accum_steps = 0;
  expect_error(r, "grad_accum_steps must be in [1, 1000]");
  r = Request();
  r.model = "decoder:layers=2,d_model=30,heads=4,d_ff=64,vocab=64,seq=32";
  expect_error(r, "model");
  r = Request();
  r.steps = 0;
  expect_error(r, "steps");
  // 2^31 - 1 steps overflowed warm-up + steps in the simulator: 0 s/step.
  r = Request();
  r.steps = 2147483647;
  expect_error(r, "steps must be in [1, 1000]");
  r = Request();
  r.warmup_steps = 2147483647;
  expect_error(r, "warmup_steps must be in [0, 1000]");
  EXPECT_FALSE(ParseStrategyList("FULL_SHARD,ZERO9").ok());
  EXPECT_FALSE(ParseDTypeList("bf16/f8").ok());
  EXPECT_FALSE(ParseDTypeList("").ok());
}

// The progress callback sees every candidate once, in order, with the
// total (tools/plan prints from it while a long plan runs).
TEST(PlanTest, ProgressIsReportedAfterEachCandidate) {
  PlanRequest r = Request();
  std::vector<std::pair<size_t, size_t>> calls;
  r.progress = [&](size_t done, size_t total) { calls.emplace_back(done, total); };
  auto plan = PlanWith(r, "a100-80g", 80 * kGiB, Model);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(calls.size(), plan->results.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, i + 1);
    EXPECT_EQ(calls[i].second, plan->results.size());
  }
}

TEST(PlanTest, RanksFitsByTimeThenOutOfMemoryByNeed) {
  PlanRequest r = Request();
  auto plan = PlanWith(r, "a100-80g", 80 * kGiB, Model);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& res = plan->results;
  ASSERT_FALSE(res.empty());
  ASSERT_EQ(plan->recommended, 0);
  // The fastest that fits under the stand-in: bf16, no checkpointing, no
  // offload, prefetch not NONE/POST: 0.5 s.
  EXPECT_DOUBLE_EQ(res[0].metrics.step_seconds, 0.5);
  EXPECT_EQ(res[0].candidate.fsdp.mixed_precision.param_dtype, DType::kBF16);
  bool seen_oom = false;
  for (size_t i = 1; i < res.size(); ++i) {
    const auto& a = res[i - 1];
    const auto& b = res[i];
    if (b.fits()) {
      ASSERT_TRUE(a.fits());
      ASSERT_LE(a.metrics.step_seconds, b.metrics.step_seconds);
      if (a.metrics.step_seconds == b.metrics.step_seconds &&
          a.metrics.peak_reserved_bytes == b.metrics.peak_reserved_bytes) {
        ASSERT_LT(a.candidate.index, b.candidate.index);  // enumeration order breaks ties
      }
    } else {
      seen_oom = true;
      ASSERT_TRUE(b.metrics.out_of_memory);
      if (!a.fits()) {
        ASSERT_LE(a.metrics.required_bytes, b.metrics.required_bytes);
      }
    }
  }
  EXPECT_TRUE(seen_oom);
  // DDP without checkpointing (100 GiB) is out of memory, so it ranks after
  // NO_SHARD (90 GiB) and after everything that fits.
  EXPECT_EQ(res.back().candidate.StrategyName(), "DDP");
  EXPECT_TRUE(res.back().metrics.out_of_memory);
  EXPECT_NE(plan->recommendation.find(res[0].candidate.Label()), std::string::npos);
}

TEST(PlanTest, NothingFitsNamesTheSmallestPeak) {
  PlanRequest r = Request();
  r.space.strategies = {"DDP", "NO_SHARD"};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone};
  auto plan = PlanWith(r, "a100-80g", 80 * kGiB, Model);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->recommended, -1);
  EXPECT_EQ(plan->recommendation.find("nothing fits in 80.00 GiB per GPU; the smallest peak is NO_SHARD"), 0u)
      << plan->recommendation;
  const std::string table = FormatTable(*plan);
  EXPECT_EQ(table.find("recommended:"), std::string::npos);
  EXPECT_NE(table.find("OOM"), std::string::npos);
}

TEST(PlanTest, FailuresAreRecordedAndRankLast) {
  PlanRequest r = Request();
  r.space.strategies = {"FULL_SHARD"};
  auto failing = [](const PlanRequest& q, const Candidate& c, const std::string& t) -> StatusOr<CandidateMetrics> {
    if (c.fsdp.cpu_offload) return UnimplementedError("offload is not simulated");
    return Model(q, c, t);
  };
  auto plan = PlanWith(r, "a100-80g", 80 * kGiB, failing);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->recommended, 0);
  EXPECT_FALSE(plan->results.back().status.ok());
  EXPECT_TRUE(plan->results.back().candidate.fsdp.cpu_offload);
  EXPECT_NE(FormatTable(*plan).find("offload is not simulated"), std::string::npos);
}

TEST(PlanTest, TraceSimulatesTheRecommendationOnceMore) {
  PlanRequest r = Request();
  r.space.strategies = {"FULL_SHARD"};
  r.trace_path = "/tmp/x.json";
  std::vector<std::string> traced;
  auto sim = [&](const PlanRequest& q, const Candidate& c, const std::string& t) {
    if (!t.empty()) traced.push_back(c.Label() + "|" + t);
    return Model(q, c, t);
  };
  auto plan = PlanWith(r, "a100-80g", 80 * kGiB, sim);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(traced.size(), 1u);
  EXPECT_EQ(traced[0], plan->results[0].candidate.Label() + "|/tmp/x.json");
}

TEST(PlanTest, TableShowsTheBestOfEveryStrategyAndJsonParses) {
  PlanRequest r = Request();
  auto plan = PlanWith(r, "a100-80g", 80 * kGiB, Model);
  ASSERT_TRUE(plan.ok());
  const std::string table = FormatTable(*plan, 5);
  EXPECT_NE(table.find("simulated, profile a100-80g"), std::string::npos) << table;
  EXPECT_NE(table.find("t5-611m on 8 GPUs (1 node x 8), batch 8 per GPU"), std::string::npos) << table;
  for (const char* s : {"DDP", "SHARD_GRAD_OP", "SHARD_OPTIM", "NO_SHARD", "HYBRID_SHARD ",
                        "HYBRID_SHARD_GRAD_OP"}) {
    EXPECT_NE(table.find(s), std::string::npos) << s << "\n" << table;
  }
  EXPECT_NE(table.find("recommended: "), std::string::npos);
  // The per-strategy summary: DDP fits only with checkpointing (50 GiB under
  // the stand-in), out of memory without (100 GiB); its fastest is bf16 ckpt.
  std::istringstream lines(table);
  std::string line;
  bool found = false;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
    if (f.size() == 5 && f[0] == "DDP") {
      EXPECT_EQ(f, (std::vector<std::string>{"DDP", "2", "2", "0", "0.650"})) << line;
      found = true;
    }
  }
  EXPECT_TRUE(found) << table;
  auto j = nlohmann::json::parse(FormatJson(*plan));
  EXPECT_EQ(j["profile"], "a100-80g");
  EXPECT_TRUE(j["simulated"].get<bool>());
  ASSERT_EQ(j["candidates"].size(), plan->results.size());
  EXPECT_EQ(j["candidates"][0]["label"], plan->results[0].candidate.Label());
  EXPECT_EQ(j["recommended"], 0);
}

TEST(PlanTest, SamePlanTwiceIsByteIdentical) {
  PlanRequest r = Request();
  auto a = PlanWith(r, "a100-80g", 80 * kGiB, Model);
  auto b = PlanWith(r, "a100-80g", 80 * kGiB, Model);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(FormatTable(*a), FormatTable(*b));
  EXPECT_EQ(FormatJson(*a), FormatJson(*b));
}

// Issue 47 item 2: a width of 2^62 made the planner recommend a
// configuration that "fit" and the first step abort; a layer count of 10^9
// ran until memory ran out. Both are InvalidArgument naming the field.
TEST(PlanTest, ShapesBeyondTheBoundsAreRefusedNamingTheField) {
  for (const auto& [model, want] : std::vector<std::pair<std::string, std::string>>{
           {"decoder:layers=2,d_model=4611686018427387904,heads=4,vocab=64,seq=32,d_ff=64", "d_model"},
           {"decoder:layers=1000000000,d_model=64,heads=4,vocab=64,seq=32,d_ff=64", "n_layer"}}) {
    PlanRequest r = Request();
    r.model = model;
    StatusOr<PlanResult> p = Plan(r);
    ASSERT_FALSE(p.ok()) << model;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << p.status();
    EXPECT_NE(std::string(p.status().message()).find(want), std::string::npos) << p.status();
  }
}

}  // namespace
}  // namespace sk::plan
