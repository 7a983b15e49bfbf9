// The real Trainer (models, FSDP, DDP, allocator, optimizer) on the sim
// device, and SimulateTraining's report.
#include "runtime/train/sim_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>


#include "runtime/comm/local_backend.h"
#include "runtime/fsdp/flat_param.h"
#include "runtime/fsdp/memory_estimator.h"
#include "runtime/nn/configs.h"
#include "runtime/sim/sim_device.h"
#include "runtime/train/engine.h"
#include "runtime/train/trainer.h"
#include "tests/sim/trace_spans.h"

namespace sk {
namespace {

TrainerOptions SimOptions(const std::string& model, int world) {
  TrainerOptions o;
  o.model = model;
  o.batch_size = 2;
  o.device.kind = DeviceKind::kSim;
  o.device.sim_profile = "a100-80g";
  o.device.sim_world_size = world;
  return o;
}

struct Strategy {
  Parallelism parallelism;
  ShardingStrategy sharding;
};

const Strategy kStrategies[] = {
    {Parallelism::kFsdp, ShardingStrategy::kFullShard},
    {Parallelism::kFsdp, ShardingStrategy::kShardGradOp},
    {Parallelism::kFsdp, ShardingStrategy::kShardOptim},
    {Parallelism::kFsdp, ShardingStrategy::kNoShard},
    {Parallelism::kFsdp, ShardingStrategy::kHybridShard},
    {Parallelism::kFsdp, ShardingStrategy::kHybridShardGradOp},
    {Parallelism::kDdp, ShardingStrategy::kFullShard},
};

std::string Name(const Strategy& s) {
  return s.parallelism == Parallelism::kDdp ? "DDP" : ShardingStrategyName(s.sharding);
}

// Every strategy and DDP steps GPT and T5 on 16 simulated GPUs (2 nodes):
// the loss and the norm are NaN and labelled simulated, time is virtual and
// positive, memory comes from the sim device (nothing on the host).
TEST(SimTrainerTest, EveryStrategyStepsGptAndT5) {
  for (const char* model : {"gpt-1m", "t5-10m"}) {
    for (const Strategy& s : kStrategies) {
      SCOPED_TRACE(std::string(model) + " " + Name(s));
      TrainerOptions o = SimOptions(model, 16);
      o.parallelism = s.parallelism;
      o.fsdp.strategy = s.sharding;
      o.fsdp.shard_group_size = 8;
      o.clip_grad_norm = 1.0;
      auto t = Trainer::Create(o, nullptr);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ((*t)->world_size(), 16);
      EXPECT_EQ((*t)->world().backend_name(), "sim");
      EXPECT_TRUE((*t)->device().id().is_sim());
      for (int step = 0; step < 2; ++step) {
        StatusOr<StepMetrics> m = (*t)->Step();
        ASSERT_TRUE(m.ok()) << m.status();
        EXPECT_TRUE(m->simulated);
        EXPECT_TRUE(std::isnan(m->loss));
        EXPECT_TRUE(std::isnan(m->global_loss));
        EXPECT_TRUE(std::isnan(m->grad_norm));
        EXPECT_GT(m->step_seconds, 0);
        EXPECT_LT(m->step_seconds, 10);  // gpt-1m on an A100: far below a second
        EXPECT_GT(m->peak_allocated_bytes, 0);
        EXPECT_GE(m->peak_reserved_bytes, m->peak_allocated_bytes);
        EXPECT_GT(m->bytes_communicated, 0);
      }
      // Every byte the allocator holds is virtual.
      for (const auto& block : (*t)->allocator().Snapshot()) {
        EXPECT_TRUE(sim::SimDevice::IsSimAddress(reinterpret_cast<void*>(block.address)));
      }
    }
  }
}

// Issue 36, item 1: on a simulated cluster a hybrid without
// shard_group_size shards within a simulated node (the profile's GPUs per
// node, 2 here), and the memory estimate the planner makes for it
// (SimulateCandidate: ranks_per_node = gpus_per_node) counts the same
// shards. FSDP used to read the host's LOCAL_WORLD_SIZE instead (unset:
// shard over all 8).
TEST(SimTrainerTest, HybridWithoutShardGroupSizeShardsWithinASimulatedNode) {
  TrainerOptions o = SimOptions("gpt-1m", 8);
  o.device.sim_gpus_per_node = 2;
  o.fsdp.strategy = ShardingStrategy::kHybridShard;
  o.fsdp.shard_group_size = 0;
  auto t = Trainer::Create(o, nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  FullyShardedModel& fsdp = *(*t)->fsdp();
  EXPECT_EQ(fsdp.shard_group_size(), 2);
  EXPECT_EQ(fsdp.sharding().replicate_size(), 4);
  EXPECT_EQ(fsdp.shard_group().size(), 2);
  ASSERT_NE(fsdp.replicate_group(), nullptr);
  EXPECT_EQ(fsdp.replicate_group()->size(), 4);

  MemoryEstimateRequest req;
  req.model = *FindModelConfig("gpt-1m");
  req.fsdp = o.fsdp;
  req.fsdp.ranks_per_node = 2;
  req.world_size = 8;
  req.batch_size = o.batch_size;
  StatusOr<MemoryEstimate> est = EstimatePeakMemory(req);
  ASSERT_TRUE(est.ok()) << est.status();
  int64_t master = 0;
  for (int u = 0; u < fsdp.num_units(); ++u) {
    master += (static_cast<int64_t>(fsdp.master_shard(u).nbytes()) + 511) / 512 * 512;
  }
  EXPECT_EQ(est->master_bytes, master) << est->ToString();
}

TEST(SimTrainerTest, DeviceAndWorldMustMatch) {
  // A sim device with a real process group: refused (the local backend would
  // copy data the sim tensors do not have).
  Status s = comm::RunLocalRanks(1, [](int, comm::ProcessGroup* g) {
    auto t = Trainer::Create(SimOptions("gpt-tiny", 1), g);
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status();
    EXPECT_NE(t.status().message().find("sim"), std::string::npos) << t.status();
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  // A sim world with the cpu device.
  DeviceOptions d;
  d.kind = DeviceKind::kSim;
  d.sim_world_size = 4;
  auto world = CreateSimWorld(d);
  ASSERT_TRUE(world.ok()) << world.status();
  TrainerOptions o;
  o.model = "gpt-tiny";
  auto t = Trainer::Create(o, world->get());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status();
  // No process group and not sim.
  EXPECT_EQ(Trainer::Create(o, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(SimTrainerTest, BadDeviceOptionsAreNamed) {
  TrainerOptions o = SimOptions("gpt-tiny", 2);
  o.device.sim_profile = "no-such-profile";
  EXPECT_FALSE(Trainer::Create(o, nullptr).ok());
  o = SimOptions("gpt-tiny", 2);
  o.device.sim_world_size = -1;
  Status s = ValidateTrainerOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sim_world_size"), std::string::npos) << s;
  o = SimOptions("gpt-tiny", 2);
  o.device.index = -2;
  EXPECT_EQ(ValidateTrainerOptions(o).code(), StatusCode::kInvalidArgument);
  o.device.index = 0;
  o.device.kind = static_cast<DeviceKind>(9);
  EXPECT_EQ(ValidateTrainerOptions(o).code(), StatusCode::kInvalidArgument);
  // cpu_offload needs a profile with a host section: cpu-local has none.
  o = SimOptions("gpt-tiny", 2);
  o.fsdp.cpu_offload = true;
  o.device.sim_profile = "cpu-local";
  Status refused = Trainer::Create(o, nullptr).status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("host section"), std::string::npos) << refused;
  EXPECT_TRUE(ParseDeviceKind("sim").ok());
  EXPECT_EQ(ParseDeviceKind("tpu").status().code(), StatusCode::kInvalidArgument);
}

// cuda selection goes through Device::Get of a CUDA id: without a GPU (or in
// a build without CUDA) it is a clear Unavailable, never a crash.
TEST(SimTrainerTest, CudaWithoutGpuIsUnavailable) {
  if (Device::CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  DeviceOptions d;
  d.kind = DeviceKind::kCuda;
  StatusOr<Device*> dev = ResolveRankDevice(d, 0);
  EXPECT_EQ(dev.status().code(), StatusCode::kUnavailable) << dev.status();
  d.index = 0;
  EXPECT_EQ(ResolveRankDevice(d, 0).status().code(), StatusCode::kUnavailable);
}

// FSDP's CPU offload on CUDA is implemented (pinned host shards, the
// optimizer on the host): without a GPU the trainer and the engine fail as
// any CUDA run does, Unavailable from the device, not with a refusal of
// offload.
TEST(SimTrainerTest, CpuOffloadOnCudaWithoutGpuIsUnavailableNotRefused) {
  if (Device::CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.device.kind = DeviceKind::kCuda;
  o.fsdp.cpu_offload = true;
  auto groups = comm::LocalProcessGroup::Create(1);
  ASSERT_TRUE(groups.ok()) << groups.status();
  StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o, (*groups)[0].get());
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status();

  FsdpEngineOptions e;
  e.device.kind = DeviceKind::kCuda;
  e.fsdp.cpu_offload = true;
  UnitSpec unit;
  unit.name = "fc";
  unit.params.push_back(ParamSpec{"w", Shape{4, 4}});
  StatusOr<std::unique_ptr<FsdpEngine>> engine = FsdpEngine::Create({unit}, (*groups)[0].get(), e);
  EXPECT_EQ(engine.status().code(), StatusCode::kUnavailable) << engine.status();
}

SimRunOptions RunOf(const std::string& model, int world) {
  SimRunOptions r;
  r.trainer = SimOptions(model, world);
  r.warmup_steps = 1;
  r.steps = 2;
  return r;
}

// From kCpuFlashAttentionMinKeys keys GPT's self-attention runs in linear
// memory on the simulator (as on the CPU): the memory estimate the planner
// makes for it (device kSim) counts that attention, not the B x H x T x T
// probabilities, so it stays an upper bound within 10% of the simulated
// peak (the probabilities of this shape's two layers would double it).
TEST(SimulateTrainingTest, MemoryEstimateCountsTheAttentionTheSimulatorRuns) {
  const std::string model = "decoder:ffn=gelu,layers=2,d_model=64,heads=2,vocab=256,seq=1024";
  for (int64_t seq : {int64_t{512}, int64_t{1024}}) {
    SimRunOptions r = RunOf(model, 1);
    r.trainer.batch_size = 1;
    r.trainer.seq_len = seq;
    r.trainer.parallelism = Parallelism::kDdp;
    StatusOr<SimStepReport> rep = SimulateTraining(r);
    ASSERT_TRUE(rep.ok()) << rep.status();
    MemoryEstimateRequest req;
    req.model = *FindModelConfig(model);
    req.ddp = true;
    req.batch_size = 1;
    req.seq_len = seq;
    req.device = DeviceKind::kSim;
    StatusOr<MemoryEstimate> est = EstimatePeakMemory(req);
    ASSERT_TRUE(est.ok()) << est.status();
    const double peak = static_cast<double>(rep->peak_allocated_bytes);
    EXPECT_GE(static_cast<double>(est->peak_bytes), peak) << "seq " << seq << ": " << est->ToString();
    EXPECT_LE(static_cast<double>(est->peak_bytes), 1.1 * peak) << "seq " << seq << ": " << est->ToString();
  }
}

// Issue 43 item 5, issue 45: Llama 3.2 1B's tied embedding (0.98 GiB of
// f32 beside 0.23 GiB blocks) is most of its transient memory. The estimate
// walks the backward (the head borrowing the embedding, whose gradient lives
// until the embedding's own backward; the prefetch the rate limiter allows)
// instead of counting the largest unit in every role at once (13.85 GiB
// against the simulated 11.24 for AdamW before): at or above the simulated
// allocator's peak, within 3.5% of it (the estimate keeps the previous
// unit's reduction alive until the next unit waits for it, which the
// simulator's reduce stream has often finished by then). World 2 on the
// CPU's profile, f32, 2 x 16 tokens: the fine-tune of
// benchmarks/results/finetune_1b_20261207.txt.
TEST(SimulateTrainingTest, MemoryEstimateOfLlama32With1BTiedEmbeddingIsTheSimulatedPeak) {
  for (bool adamw : {true, false}) {
    for (int limit : {1, 2}) {
      SimRunOptions r = RunOf("llama3.2-1b", 2);
      r.trainer.device.sim_profile = "cpu-local";
      r.trainer.device.sim_gpus_per_node = 2;
      r.trainer.batch_size = 2;
      r.trainer.seq_len = 16;
      r.trainer.fsdp.all_gather_limit = RateLimit::InFlight(limit);
      if (!adamw) {
        r.trainer.optimizer.kind = OptimizerKind::kSgd;
        r.trainer.optimizer.momentum = 0.9f;
      }
      r.steps = 1;
      StatusOr<SimStepReport> rep = SimulateTraining(r);
      ASSERT_TRUE(rep.ok()) << rep.status();
      ASSERT_FALSE(rep->out_of_memory) << rep->oom_detail;
      MemoryEstimateRequest req;
      req.model = *FindModelConfig("llama3.2-1b");
      req.fsdp = r.trainer.fsdp;
      req.fsdp.ranks_per_node = 2;
      req.optimizer = r.trainer.optimizer;
      req.world_size = 2;
      req.batch_size = 2;
      req.seq_len = 16;
      req.device = DeviceKind::kSim;
      StatusOr<MemoryEstimate> est = EstimatePeakMemory(req);
      ASSERT_TRUE(est.ok()) << est.status();
      const double peak = static_cast<double>(rep->peak_allocated_bytes);
      const std::string what = std::string(adamw ? "AdamW" : "SGD") + ", limit " + std::to_string(limit) +
                               ": simulated " + std::to_string(rep->peak_allocated_bytes) + ", " +
                               est->ToString();
      EXPECT_GE(static_cast<double>(est->peak_bytes), peak) << what;
      EXPECT_LE(static_cast<double>(est->peak_bytes), 1.01 * peak) << what;
      std::printf("llama3.2-1b %s\n", what.c_str());
    }
  }
}

// Issue 45's Llama goal: llama3-8b, 2 x 8192 tokens per GPU on 8 x
// h100-80g, FULL_SHARD bf16 with every other matmul recomputed
// (selective_matmuls): the memory estimate the planner makes for it covers
// the simulated allocator's peak and is within 3.5% of it, with either
// backward prefetch (BACKWARD_PRE 1.032, BACKWARD_POST 1.021 today; benchmarks/results/memory_round.md).
// Not yet the 1%: the estimator pairs the head's backward (its
// gathered weight, f32 gradient and prefetched block) with the activations'
// peak, which is the block's backward (kept + 3 GiB), where the head's own
// holds kept + 1.4 GiB.
TEST(SimulateTrainingTest, MemoryEstimateOfLlama3_8bSelectiveMatmulsIsTheSimulatedPeak) {
  for (BackwardPrefetch prefetch : {BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost}) {
    SimRunOptions r = RunOf("llama3-8b", 8);
    r.trainer.device.sim_profile = "h100-80g";
    r.trainer.device.sim_gpus_per_node = 8;
    r.trainer.batch_size = 2;
    r.trainer.seq_len = 8192;
    r.trainer.checkpointing = ActivationCheckpointing::kSelectiveMatmuls;
    r.trainer.fsdp.mixed_precision.param_dtype = DType::kBF16;
    r.trainer.fsdp.backward_prefetch = prefetch;
    r.steps = 1;
    StatusOr<SimStepReport> rep = SimulateTraining(r);
    ASSERT_TRUE(rep.ok()) << rep.status();
    ASSERT_FALSE(rep->out_of_memory) << rep->oom_detail;
    MemoryEstimateRequest req;
    req.model = *FindModelConfig("llama3-8b");
    req.fsdp = r.trainer.fsdp;
    req.fsdp.ranks_per_node = 8;
    req.optimizer = r.trainer.optimizer;
    req.world_size = 8;
    req.batch_size = 2;
    req.seq_len = 8192;
    req.checkpointing = ActivationCheckpointing::kSelectiveMatmuls;
    req.device = DeviceKind::kSim;
    StatusOr<MemoryEstimate> est = EstimatePeakMemory(req);
    ASSERT_TRUE(est.ok()) << est.status();
    const double peak = static_cast<double>(rep->peak_allocated_bytes);
    const std::string what = std::string(BackwardPrefetchName(prefetch)) + ": simulated " +
                             std::to_string(rep->peak_allocated_bytes) + ", " + est->ToString();
    EXPECT_GE(static_cast<double>(est->peak_bytes), peak) << what;
    EXPECT_LE(static_cast<double>(est->peak_bytes), 1.035 * peak) << what;
    std::printf("llama3-8b selective_matmuls %s\n", what.c_str());
  }
}

TEST(SimulateTrainingTest, ReportsTimeMemoryAndComm) {
  SimRunOptions r = RunOf("gpt-10m", 8);
  r.trainer.fsdp.mixed_precision.param_dtype = DType::kBF16;
  StatusOr<SimStepReport> rep = SimulateTraining(r);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->profile_name, "a100-80g");
  EXPECT_FALSE(rep->out_of_memory);
  EXPECT_GT(rep->step_seconds, 0);
  EXPECT_GT(rep->compute_busy_seconds, 0);
  EXPECT_LE(rep->compute_busy_seconds, rep->step_seconds * (1 + 1e-9));
  EXPECT_GE(rep->exposed_comm_seconds, 0);
  EXPECT_LE(rep->exposed_comm_seconds, rep->step_seconds * (1 + 1e-9));
  EXPECT_GT(rep->peak_allocated_bytes, 0);
  EXPECT_GE(rep->peak_reserved_bytes, rep->peak_allocated_bytes);
  EXPECT_GT(rep->model_flops_per_step, 0);
  EXPECT_NEAR(rep->tflops_per_gpu, rep->model_flops_per_step / rep->step_seconds / 1e12, 1e-9);
  // bf16 peak of the A100 profile: 312 TFLOP/s.
  EXPECT_NEAR(rep->mfu, rep->tflops_per_gpu / 312, 1e-9);
  EXPECT_GT(rep->mfu, 0);
  EXPECT_LT(rep->mfu, 1);

  // Deterministic: the same options give the same report.
  StatusOr<SimStepReport> again = SimulateTraining(r);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->step_seconds, rep->step_seconds);
  EXPECT_EQ(again->peak_reserved_bytes, rep->peak_reserved_bytes);
  EXPECT_EQ(again->exposed_comm_seconds, rep->exposed_comm_seconds);
}

// Backward prefetch hides all-gathers behind compute: without it more
// communication is exposed and the step is longer (FSDP paper, 7.2).
TEST(SimulateTrainingTest, PrefetchHidesCommunication) {
  SimRunOptions r = RunOf("gpt-10m", 128);
  r.trainer.fsdp.mixed_precision.param_dtype = DType::kBF16;
  r.trainer.fsdp.backward_prefetch = BackwardPrefetch::kBackwardPre;
  StatusOr<SimStepReport> pre = SimulateTraining(r);
  r.trainer.fsdp.backward_prefetch = BackwardPrefetch::kNone;
  StatusOr<SimStepReport> none = SimulateTraining(r);
  ASSERT_TRUE(pre.ok()) << pre.status();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_GT(none->exposed_comm_seconds, pre->exposed_comm_seconds);
  EXPECT_GT(none->step_seconds, pre->step_seconds);
}

// Stream order as on a GPU: a gradient's reduction waits for the compute that
// produces it (FSDP's reduce stream waits for the compute stream, as PyTorch's
// post-backward stream does), so the step's last reduction cannot start before
// the backward pass's last compute span has ended, however far the host runs
// ahead; and the optimizer, which reads the reduced gradients, starts after
// every reduction. Both for FSDP and for DDP's bucket all-reduces.
TEST(SimulateTrainingTest, ReductionsWaitForTheComputeThatProducesTheirGradients) {
  for (Parallelism p : {Parallelism::kFsdp, Parallelism::kDdp}) {
    const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                             "/order_" + std::to_string(static_cast<int>(p)) + ".json";
    // Compute-bound (GEMMs of milliseconds, launches of microseconds), so
    // the host runs ahead of the compute stream: a reduction issued without
    // waiting for it would start early (gpt-10m is launch-bound: the host
    // never runs ahead there, and the order would hold by accident).
    SimRunOptions r = RunOf("gpt-1.3b", 8);
    r.trainer.parallelism = p;
    r.trainer.fsdp.mixed_precision.param_dtype = DType::kBF16;
    r.trace_path = path;
    StatusOr<SimStepReport> rep = SimulateTraining(r);
    ASSERT_TRUE(rep.ok()) << rep.status();
    std::optional<sim_trace::Trace> trace = sim_trace::ReadTrace(path);
    ASSERT_TRUE(trace.has_value()) << path;
    const std::vector<sim_trace::TraceSpan> compute = trace->Track("compute");
    const std::vector<sim_trace::TraceSpan> reduce = trace->Track("reduce");
    ASSERT_FALSE(compute.empty());
    ASSERT_FALSE(reduce.empty()) << "no reduction in the trace";
    // The optimizer's first update span; everything computed before it is
    // the forward and backward pass.
    double optimizer_start = -1;
    for (const sim_trace::TraceSpan& s : compute) {
      if (s.name.find("_update") != std::string::npos &&
          (optimizer_start < 0 || s.start_us < optimizer_start)) {
        optimizer_start = s.start_us;
      }
    }
    ASSERT_GE(optimizer_start, 0) << "no optimizer span in the trace";
    // The backward pass's last gradient op (the embedding's backward, its
    // bias and norm gradients); the gradient-norm and optimizer spans that
    // follow read reduced gradients and come after the reductions.
    auto is_gradient_op = [](const std::string& n) {
      auto ends = [&](const char* suffix) {
        const size_t k = std::strlen(suffix);
        return n.size() >= k && n.compare(n.size() - k, k, suffix) == 0;
      };
      return ends("_bwd") || ends("_grad");
    };
    double backward_end = 0, last_reduce_start = 0, last_reduce_end = 0;
    for (const sim_trace::TraceSpan& s : compute) {
      if (s.end_us <= optimizer_start && is_gradient_op(s.name)) backward_end = std::max(backward_end, s.end_us);
    }
    ASSERT_GT(backward_end, 0) << "no backward op in the trace";
    for (const sim_trace::TraceSpan& s : reduce) {
      if (s.start_us > optimizer_start) continue;  // the next step's, if any
      last_reduce_start = std::max(last_reduce_start, s.start_us);
      last_reduce_end = std::max(last_reduce_end, s.end_us);
    }
    const char* what = p == Parallelism::kDdp ? "DDP" : "FSDP";
    EXPECT_GE(last_reduce_start, backward_end * (1 - 1e-12))
        << what << ": the last reduction started at " << last_reduce_start << " us, before the backward pass's "
        << "compute ended at " << backward_end << " us";
    EXPECT_GE(optimizer_start, last_reduce_end * (1 - 1e-12)) << what;
  }
}

TEST(SimulateTrainingTest, OutOfMemoryIsAResult) {
  SimRunOptions r = RunOf("gpt-10m", 8);
  r.trainer.memory_cap_bytes = 4 << 20;  // below gpt-10m's 8 shards + activations
  StatusOr<SimStepReport> rep = SimulateTraining(r);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->out_of_memory);
  EXPECT_NE(rep->oom_detail.find("out of memory"), std::string::npos) << rep->oom_detail;
  EXPECT_GT(rep->peak_reserved_bytes, 0);
  EXPECT_LE(rep->peak_reserved_bytes, size_t{4} << 20);
  EXPECT_EQ(rep->step_seconds, 0);
}

// CPU offload on the simulator (the FSDP paper's section 3 trade-off): the
// master and gradient shards and the optimizer state move to the host, so
// the device holds less; each step then copies the shards host->device and
// the reduced gradients back over PCIe and steps the optimizer at host
// memory bandwidth, so it takes longer. The host work is on its own track,
// and the optimizer's update runs there, after the last reduction.
TEST(SimulateTrainingTest, CpuOffloadTradesDeviceMemoryForStepTime) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                           "/offload.json";
  SimRunOptions r = RunOf("gpt-1.3b", 8);
  r.trainer.fsdp.mixed_precision.param_dtype = DType::kBF16;
  StatusOr<SimStepReport> on_device = SimulateTraining(r);
  r.trainer.fsdp.cpu_offload = true;
  r.trace_path = path;
  StatusOr<SimStepReport> offload = SimulateTraining(r);
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  ASSERT_TRUE(offload.ok()) << offload.status();
  ASSERT_FALSE(offload->out_of_memory) << offload->oom_detail;
  // gpt-1.3b over 8 GPUs: ~163M parameters per shard; master, gradient and
  // two Adam moments are 16 bytes each, ~2.6 GB off the device.
  EXPECT_LT(offload->peak_allocated_bytes + (size_t{2} << 30), on_device->peak_allocated_bytes);
  EXPECT_GT(offload->step_seconds, on_device->step_seconds);
  std::optional<sim_trace::Trace> trace = sim_trace::ReadTrace(path);
  ASSERT_TRUE(trace.has_value()) << path;
  const std::vector<sim_trace::TraceSpan> host = trace->Track("host (offload)");
  ASSERT_FALSE(host.empty()) << "no host track in the trace";
  double host_update_start = -1, last_reduce_end = 0;
  for (const sim_trace::TraceSpan& s : host) {
    if (s.name.find("_update") != std::string::npos && host_update_start < 0) host_update_start = s.start_us;
  }
  ASSERT_GE(host_update_start, 0) << "the optimizer did not run on the host";
  for (const sim_trace::TraceSpan& s : trace->Track("compute")) {
    EXPECT_EQ(s.name.find("_update"), std::string::npos) << "an optimizer update on the device";
  }
  for (const sim_trace::TraceSpan& s : trace->Track("reduce")) {
    if (s.start_us < host_update_start) last_reduce_end = std::max(last_reduce_end, s.end_us);
  }
  EXPECT_GE(host_update_start, last_reduce_end * (1 - 1e-12));
  // Deterministic.
  StatusOr<SimStepReport> again = SimulateTraining(r);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->step_seconds, offload->step_seconds);
  EXPECT_EQ(again->peak_allocated_bytes, offload->peak_allocated_bytes);
}

// The report's host peak is what CPU offload puts in the simulated host
// memory, per GPU, to the byte: FSDP's f32 master and gradient shards of
// every unit, its staging buffer for a reduced gradient shard (the largest
// shard, in the reduce dtype), AdamW's two f32 moments per shard, and the
// gradient norm's f64 accumulator (a host temporary of every step, clipping
// or not). Without
// offload nothing is placed there: 0. Device figures do not change with the
// report's new field (the same run twice gives the same peaks).
TEST(SimulateTrainingTest, HostPeakIsWhatOffloadPutsOnTheHost) {
  struct Config {
    ShardingStrategy strategy;
    DType param;
    std::optional<DType> reduce;
    double clip;
  };
  for (const Config& c : {Config{ShardingStrategy::kFullShard, DType::kBF16, std::nullopt, 0},
                          Config{ShardingStrategy::kFullShard, DType::kBF16, DType::kF32, 1.0},
                          Config{ShardingStrategy::kShardGradOp, DType::kF32, std::nullopt, 0},
                          Config{ShardingStrategy::kNoShard, DType::kBF16, std::nullopt, 0}}) {
    SimRunOptions r = RunOf("gpt-1m", 8);
    r.trainer.fsdp.strategy = c.strategy;
    r.trainer.fsdp.mixed_precision.param_dtype = c.param;
    r.trainer.fsdp.mixed_precision.reduce_dtype = c.reduce;
    r.trainer.clip_grad_norm = c.clip;
    const int f = c.strategy == ShardingStrategy::kNoShard ? 1 : 8;
    SCOPED_TRACE(std::string(ShardingStrategyName(c.strategy)) + " " + std::string(DTypeName(c.param)) +
                 (c.reduce ? "/" + std::string(DTypeName(*c.reduce)) : "") + (c.clip > 0 ? " clip" : ""));
    StatusOr<SimStepReport> on_device = SimulateTraining(r);
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    EXPECT_EQ(on_device->peak_host_bytes, 0u);

    r.trainer.fsdp.cpu_offload = true;
    StatusOr<SimStepReport> offload = SimulateTraining(r);
    ASSERT_TRUE(offload.ok()) << offload.status();
    ASSERT_FALSE(offload->out_of_memory) << offload->oom_detail;
    StatusOr<std::unique_ptr<Model>> model = CreateModel(*FindModelConfig("gpt-1m"), ModelOptions{});
    ASSERT_TRUE(model.ok()) << model.status();
    size_t shards = 0, largest = 0;
    for (const UnitSpec& u : (*model)->units()) {
      std::vector<std::pair<std::string, Shape>> ps;
      for (const ParamSpec& p : u.params) ps.emplace_back(p.name, p.shape);
      StatusOr<FlatParamLayout> layout = FlatParamLayout::Make(ps, f);
      ASSERT_TRUE(layout.ok()) << layout.status();
      shards += static_cast<size_t>(layout->shard_numel());
      largest = std::max(largest, static_cast<size_t>(layout->shard_numel()));
    }
    const size_t master = 4 * shards, grad = 4 * shards, adam = 2 * 4 * shards;
    const size_t staging = largest * DTypeSize(c.reduce.value_or(c.param));
    const size_t norm = sizeof(double);  // every step measures the norm (StepMetrics::grad_norm)
    EXPECT_EQ(offload->peak_host_bytes, master + grad + staging + adam + norm);

    StatusOr<SimStepReport> again = SimulateTraining(r);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->peak_host_bytes, offload->peak_host_bytes);
    EXPECT_EQ(again->peak_reserved_bytes, offload->peak_reserved_bytes);
  }
}

TEST(SimulateTrainingTest, RefusesWhatCannotRun) {
  SimRunOptions r = RunOf("gpt-tiny", 2);
  r.steps = 0;
  EXPECT_EQ(SimulateTraining(r).status().code(), StatusCode::kInvalidArgument);
  r = RunOf("gpt-tiny", 2);
  r.warmup_steps = -1;
  EXPECT_EQ(SimulateTraining(r).status().code(), StatusCode::kInvalidArgument);
  // warmup_steps + steps must not overflow: it ran no step and reported 0 s.
  r = RunOf("gpt-tiny", 2);
  r.steps = 2147483647;
  EXPECT_EQ(SimulateTraining(r).status().code(), StatusCode::kInvalidArgument);
  r = RunOf("gpt-tiny", 2);
  r.trainer.device.kind = DeviceKind::kCpu;
  EXPECT_EQ(SimulateTraining(r).status().code(), StatusCode::kInvalidArgument);
  r = RunOf("no-such-model", 2);
  EXPECT_FALSE(SimulateTraining(r).ok());
}

}  // namespace
}  // namespace sk
