// Training steps on a GPU through Trainer (the code every frontend runs):
// step time, model TFLOP/s, MFU against the device's dense bf16 peak, peak
// memory, and the simulator's prediction for the same configuration with the
// profile SK_GPU_TRAIN_SIM_PROFILE names (default h100-80g; tools/gpu/run.sh
// picks h200-141g on an H200), as predicted / measured, for
//
//   - gpt-150m and gpt-1.3b (GPT-3 XL's shape) on one GPU, bf16 mixed
//     precision, FULL_SHARD versus DDP (world 1: the same arithmetic, FSDP's
//     machinery against DDP's), plus f32 and activation checkpointing rows,
//     and llama3.2-1b FULL_SHARD bf16 beside them (the Llama-family ops);
//   - gpt-150m with two ranks as threads on the one GPU (the `local`
//     backend's device-to-device collectives): FULL_SHARD with backward
//     prefetch BACKWARD_PRE versus none, and DDP;
//   - FSDP's CPU offload (gpt-150m and gpt-1.3b, FULL_SHARD bf16, one GPU):
//     master/gradient shards pinned on the host, the optimizer on the CPU;
//     compare step time and peak device memory with the rows without it.
//
// Each configuration is one Google Benchmark: its trainers are created, run
// --warmup steps, then every iteration is one optimizer step timed by
// Trainer (Step() waits for the compute stream: device time, as
// torch.cuda.synchronize() in a PyTorch benchmark); the trainers are
// destroyed before the next configuration so each starts with an empty
// device. Without a GPU every benchmark reports "no CUDA device". Environment:
// SK_GPU_TRAIN_STEPS = timed steps (default 10); SK_GPU_TRAIN_OP_BREAKDOWN=1
// runs one more step after the timed ones with every op timed on the device
// by CUDA events (op_timing.h: kDeviceEvents; the host waits for each op, so
// that step is not one of the timed ones) and prints, per op name, its calls,
// device milliseconds and share of the step's op time (the A/B of
// SK_CUDA_FUSED_EPILOGUES=1 against the default is two such runs;
// docs/cuda.md). Part of the GPU suite (tools/gpu); nothing here is a test.
//
//   ./bazelw run --config=cuda -c opt //benchmarks:gpu_train
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "runtime/comm/local_backend.h"
#include "runtime/core/env.h"
#include "runtime/core/status.h"
#include "runtime/ops/op_timing.h"
#include "runtime/train/local_session.h"
#include "runtime/train/sim_run.h"

namespace sk {
namespace {

constexpr int kWarmup = 2;

// Timed steps per configuration: 10, or SK_GPU_TRAIN_STEPS (>= 1; a profiler
// such as ncu replays every kernel, so a profiled run wants 1).
int TimedSteps() {
  const char* env = GetEnv(EnvVar::kGpuTrainSteps);
  const int n = env != nullptr ? std::atoi(env) : 10;
  return n >= 1 ? n : 10;
}
// SK_GPU_TRAIN_OP_BREAKDOWN=1: time one extra step per op (see the top).
bool OpBreakdown() {
  const char* env = GetEnv(EnvVar::kGpuTrainOpBreakdown);
  return env != nullptr && std::string_view(env) == "1";
}

// Device time per op name over one step, from every rank thread.
class OpBreakdownRecorder final : public ops::OpTimingObserver {
 public:
  Clock clock() const override { return Clock::kDeviceEvents; }
  void OnOp(const ops::OpCost& cost, double seconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = ops_[cost.name];
    ++e.calls;
    e.seconds += seconds;
    e.bytes += cost.bytes_read + cost.bytes_written;
  }
  // One line per op, most time first, under a header naming the row.
  void Print(const std::string& row) const {
    std::lock_guard<std::mutex> lock(mu_);
    double total = 0;
    for (const auto& [name, e] : ops_) total += e.seconds;
    std::vector<std::pair<std::string, Entry>> sorted(ops_.begin(), ops_.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& x, const auto& y) { return x.second.seconds > y.second.seconds; });
    std::printf("op breakdown, %s: %.3f ms of op time in one step (device events per op)\n",
                row.c_str(), total * 1e3);
    std::printf("  %-22s %7s %10s %7s %9s\n", "op", "calls", "ms", "share", "GB/s");
    for (const auto& [name, e] : sorted) {
      std::printf("  %-22s %7lld %10.3f %6.1f%% %9.1f\n", name.c_str(),
                  static_cast<long long>(e.calls), e.seconds * 1e3,
                  total > 0 ? 100.0 * e.seconds / total : 0.0,
                  e.seconds > 0 ? e.bytes / e.seconds * 1e-9 : 0.0);
    }
    std::fflush(stdout);
  }

 private:
  struct Entry {
    int64_t calls = 0;
    double seconds = 0;
    double bytes = 0;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> ops_;
};

// NVIDIA H100 SXM datasheet: BF16 tensor core 989 TFLOPS dense (the
// h100-80g profile's figure); an H100 PCIe is 756.
constexpr double kH100DenseBf16Tflops = 989.0;

struct Row {
  const char* model;
  int world;
  Parallelism parallelism;
  bool bf16;
  BackwardPrefetch prefetch;
  bool checkpointing;
  int64_t batch;
  bool offload = false;  // FSDP cpu_offload
};

TrainerOptions OptionsFor(const Row& row) {
  TrainerOptions o;
  o.model = row.model;
  o.parallelism = row.parallelism;
  o.fsdp.strategy = ShardingStrategy::kFullShard;
  o.fsdp.backward_prefetch = row.prefetch;
  if (row.bf16) {
    o.fsdp.mixed_precision.param_dtype = DType::kBF16;
    o.fsdp.mixed_precision.reduce_dtype = DType::kF32;
  }
  o.activation_checkpointing = row.checkpointing;
  o.fsdp.cpu_offload = row.offload;
  o.batch_size = row.batch;
  o.optimizer.kind = OptimizerKind::kAdamW;
  o.device.kind = DeviceKind::kCuda;
  o.device.index = 0;
  return o;
}

// The simulated card: SK_GPU_TRAIN_SIM_PROFILE, default h100-80g.
std::string SimProfileName() {
  const char* env = GetEnv(EnvVar::kGpuTrainSimProfile);
  return env != nullptr && *env != '\0' ? env : "h100-80g";
}

// The simulator's prediction of the same step on SimProfileName() (world 1
// only: the simulator models one GPU per rank, not ranks sharing one).
double Predict(const Row& row, std::string* error) {
  if (row.world != 1) return NAN;
  SimRunOptions s;
  s.trainer = OptionsFor(row);
  s.trainer.device = DeviceOptions{};
  s.trainer.device.kind = DeviceKind::kSim;
  s.trainer.device.sim_profile = SimProfileName();
  s.trainer.device.sim_world_size = 1;
  s.trainer.device.sim_gpus_per_node = 1;
  s.warmup_steps = 1;
  s.steps = 1;
  StatusOr<SimStepReport> r = SimulateTraining(s);
  if (!r.ok()) {
    *error = r.status().ToString();
    return NAN;
  }
  return r->step_seconds;
}

void BM_Train(benchmark::State& state, Row row) {
  if (Device::CudaDeviceCount() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  std::string sim_error;
  const double predicted = Predict(row, &sim_error);

  auto session = [&]() -> StatusOr<std::unique_ptr<LocalSession>> {
    SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(row.world));
    SK_ASSIGN_OR_RETURN(auto created, LocalSession::Create(OptionsFor(row), LocalSession::Share(std::move(groups))));
    for (int i = 0; i < kWarmup; ++i) SK_RETURN_IF_ERROR(created->Step().status());
    return created;
  }();
  if (!session.ok()) {
    state.SkipWithError(session.status().ToString().c_str());
    return;
  }
  LocalSession& ranks = **session;
  Status s;
  double model_tflops = 0, peak_alloc = 0, peak_reserved = 0, loss = 0;
  std::vector<double> times;
  for (auto _ : state) {
    StatusOr<std::vector<StepMetrics>> metrics = ranks.Step();
    if (!metrics.ok()) {
      s = metrics.status();
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    double slowest = 0, tflops = 0;
    for (const StepMetrics& m : *metrics) {
      slowest = std::max(slowest, m.step_seconds);
      tflops += m.model_tflops_per_rank;  // ranks share the one GPU: their sum
      peak_alloc = std::max(peak_alloc, double(m.peak_allocated_bytes));
      peak_reserved = std::max(peak_reserved, double(m.peak_reserved_bytes));
    }
    loss = (*metrics)[0].global_loss;
    times.push_back(slowest);
    model_tflops = tflops;  // the last step's; scaled to the median time below
    state.SetIterationTime(slowest);
  }
  std::unique_ptr<OpBreakdownRecorder> breakdown;
  if (s.ok() && OpBreakdown()) {
    breakdown = std::make_unique<OpBreakdownRecorder>();
    ops::SetOpTimingObserver(breakdown.get());
    s = ranks.Step().status();
    ops::SetOpTimingObserver(nullptr);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  if (s.ok() && !times.empty()) {
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    // Model FLOPs per step are fixed, so TFLOP/s at the median time follows
    // from the last step's rate and time.
    const double tflops_median = model_tflops * times.back() / median;
    state.counters["median_s"] = median;
    state.counters["model_TFLOPs"] = tflops_median;
    state.counters["MFU_pct"] = 100.0 * tflops_median / kH100DenseBf16Tflops;
    state.counters["peak_alloc_GiB"] = peak_alloc / (1 << 30);
    state.counters["peak_reserved_GiB"] = peak_reserved / (1 << 30);
    state.counters["loss"] = loss;
    if (!std::isnan(predicted)) {
      state.counters["sim_s"] = predicted;  // on the label's sim profile
      state.counters["sim_over_meas"] = predicted / median;
    }
  }
  std::string label = std::string(row.model) + " w" + std::to_string(row.world) + " " +
                      (row.parallelism == Parallelism::kDdp ? "DDP" : "FULL_SHARD") +
                      (row.bf16 ? " bf16" : " f32") +
                      (row.parallelism == Parallelism::kFsdp && row.prefetch == BackwardPrefetch::kNone
                           ? " no-prefetch"
                           : "") +
                      (row.checkpointing ? " ckpt" : "") + (row.offload ? " cpu-offload" : "") +
                      " batch " + std::to_string(row.batch);
  if (row.world == 1) label += " sim " + SimProfileName();
  if (!sim_error.empty()) label += " (sim: " + sim_error + ")";
  state.SetLabel(label);
  if (breakdown && s.ok()) breakdown->Print(label);
  session->reset();
}

constexpr auto kFsdp = Parallelism::kFsdp;
constexpr auto kDdp = Parallelism::kDdp;
constexpr auto kPre = BackwardPrefetch::kBackwardPre;
constexpr auto kNone = BackwardPrefetch::kNone;

void Register() {
  const Row rows[] = {
      {"gpt-150m", 1, kFsdp, true, kPre, false, 8},
      {"gpt-150m", 1, kDdp, true, kPre, false, 8},
      {"gpt-150m", 1, kFsdp, false, kPre, false, 8},
      {"gpt-1.3b", 1, kFsdp, true, kPre, false, 8},
      {"gpt-1.3b", 1, kDdp, true, kPre, false, 8},
      {"gpt-1.3b", 1, kFsdp, true, kPre, true, 8},
      // Llama 3.2 1B (GQA, RoPE, SwiGLU, RMSNorm, tied head) at its 4096
      // tokens per sequence: batch 2 is gpt-1.3b's 8192 tokens per step.
      {"llama3.2-1b", 1, kFsdp, true, kPre, false, 2},
      {"gpt-150m", 2, kFsdp, true, kPre, false, 4},
      {"gpt-150m", 2, kFsdp, true, kNone, false, 4},
      {"gpt-150m", 2, kDdp, true, kPre, false, 4},
      {"gpt-150m", 1, kFsdp, true, kPre, false, 8, /*offload=*/true},
      {"gpt-1.3b", 1, kFsdp, true, kPre, false, 8, /*offload=*/true},
  };
  for (const Row& row : rows) {
    std::string name = std::string("BM_Train/") + row.model + "/w" + std::to_string(row.world) + "/" +
                       (row.parallelism == kDdp ? "ddp" : "fsdp") + (row.bf16 ? "/bf16" : "/f32") +
                       (row.parallelism == kFsdp && row.prefetch == kNone ? "/noprefetch" : "") +
                       (row.checkpointing ? "/ckpt" : "") + (row.offload ? "/offload" : "");
    benchmark::RegisterBenchmark(name.c_str(), BM_Train, row)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(TimedSteps());
  }
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  sk::Register();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
