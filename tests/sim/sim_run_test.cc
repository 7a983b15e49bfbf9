// The real Trainer (models, FSDP, DDP, allocator, optimizer) on the sim
// device, and SimulateTraining's report.
#include "runtime/train/sim_run.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/comm/local_backend.h"
#include "runtime/sim/sim_device.h"
#include "runtime/train/engine.h"
#include "runtime/train/trainer.h"

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
  o = SimOptions("gpt-tiny", 2);
  o.fsdp.cpu_offload = true;
  EXPECT_EQ(Trainer::Create(o, nullptr).status().code(), StatusCode::kUnimplemented);
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

SimRunOptions RunOf(const std::string& model, int world) {
  SimRunOptions r;
  r.trainer = SimOptions(model, world);
  r.warmup_steps = 1;
  r.steps = 2;
  return r;
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

TEST(SimulateTrainingTest, RefusesWhatCannotRun) {
  SimRunOptions r = RunOf("gpt-tiny", 2);
  r.steps = 0;
  EXPECT_EQ(SimulateTraining(r).status().code(), StatusCode::kInvalidArgument);
  r = RunOf("gpt-tiny", 2);
  r.warmup_steps = -1;
  EXPECT_EQ(SimulateTraining(r).status().code(), StatusCode::kInvalidArgument);
  r = RunOf("gpt-tiny", 2);
  r.trainer.device.kind = DeviceKind::kCpu;
  EXPECT_EQ(SimulateTraining(r).status().code(), StatusCode::kInvalidArgument);
  r = RunOf("no-such-model", 2);
  EXPECT_FALSE(SimulateTraining(r).ok());
}

}  // namespace
}  // namespace sk
