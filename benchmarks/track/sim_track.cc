// The simulator's predicted step time and peak memory for a fixed set of
// configurations, as Google Benchmark JSON for benchmarks/track.py's "sim"
// family (measure_sim; gated at SIM_THRESHOLD):
//
//   ./bazelw run -c opt //benchmarks:sim_track -- --benchmark_format=json
//
// Each benchmark runs SimulateTraining (the real Trainer, FSDP or DDP and
// CachingAllocator on the sim device; runtime/train/sim_run.h) once, with one
// warm-up and one measured step, and reports the counters
// predicted_step_seconds, predicted_peak_bytes (the allocator's peak
// reserved), predicted_peak_allocated_bytes, alloc_retries and
// exposed_comm_seconds. The figures are virtual time and simulated memory:
// they repeat exactly from run to run and under any machine load, and move
// only when the code (FSDP's schedule, prefetch, the limiter, the allocator,
// the cost model) or a profile changes. The wall time Google Benchmark
// prints beside them is the host's cost of simulating and is not gated.
//
// Names: <model>/<strategy>[/<variant>]/<profile>/<world>, variants
// no_prefetch (backward prefetch NONE), backward_post, forward_prefetch,
// no_limit (the rate limiter off).
//
// SK_BENCH_INJECT=fsdp_step:N (benchmarks/util/inject.h) runs every FSDP step's
// forward and backward N times (N micro-batches of the same size: each
// all-gathers, computes and reduce-scatters again), so the predicted step
// time of the FSDP configurations grows ~N-fold while DDP's stays put; the
// self-test (track.py --self_test) shows that the gate catches it.
#include <cstdio>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "benchmarks/util/inject.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/train/sim_run.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

struct SimConfig {
  std::string model;
  Parallelism parallelism = Parallelism::kFsdp;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  std::string variant;  // "", "no_prefetch", "backward_post", "forward_prefetch", "no_limit"
  int world = 8;
  int gpus_per_node = 8;
  int shard_group_size = 0;  // hybrid: ranks per shard group
  int64_t batch_size = 2;
  bool activation_checkpointing = false;
  std::string profile = "a100-80g";

  std::string Name() const {
    std::string s = model + "/" +
                    (parallelism == Parallelism::kDdp ? std::string("DDP") : ShardingStrategyName(strategy));
    if (!variant.empty()) s += "/" + variant;
    return s + "/" + profile + "/" + std::to_string(world);
  }
};

void BM_Sim(benchmark::State& state, const SimConfig& c) {
  SimRunOptions o;
  TrainerOptions& t = o.trainer;
  t.model = c.model;
  t.parallelism = c.parallelism;
  t.fsdp.strategy = c.strategy;
  t.fsdp.shard_group_size = c.shard_group_size;
  if (c.variant == "no_prefetch") t.fsdp.backward_prefetch = BackwardPrefetch::kNone;
  if (c.variant == "backward_post") t.fsdp.backward_prefetch = BackwardPrefetch::kBackwardPost;
  if (c.variant == "forward_prefetch") t.fsdp.forward_prefetch = true;
  if (c.variant == "no_limit") t.fsdp.all_gather_limit = RateLimit::Off();
  t.optimizer.kind = OptimizerKind::kAdamW;
  t.batch_size = c.batch_size;
  t.activation_checkpointing = c.activation_checkpointing;
  t.grad_accum_steps = c.parallelism == Parallelism::kFsdp ? bench::InjectedRepeats("fsdp_step") : 1;
  t.device.kind = DeviceKind::kSim;
  t.device.sim_profile = c.profile;
  t.device.sim_world_size = c.world;
  t.device.sim_gpus_per_node = c.gpus_per_node;
  o.warmup_steps = 1;
  o.steps = 1;
  StatusOr<SimStepReport> r = InvalidArgumentError("not run");
  for (auto _ : state) r = SimulateTraining(o);
  if (!r.ok()) {
    state.SkipWithError(r.status().ToString().c_str());
    return;
  }
  if (r->out_of_memory) {
    state.SkipWithError(("simulated out of memory: " + r->oom_detail).c_str());
    return;
  }
  state.counters["predicted_step_seconds"] = r->step_seconds;
  state.counters["predicted_peak_bytes"] = static_cast<double>(r->peak_reserved_bytes);
  state.counters["predicted_peak_allocated_bytes"] = static_cast<double>(r->peak_allocated_bytes);
  state.counters["alloc_retries"] = static_cast<double>(r->alloc_retries);
  state.counters["exposed_comm_seconds"] = r->exposed_comm_seconds;
}

std::vector<SimConfig> Configs() {
  std::vector<SimConfig> v;
  auto add = [&](SimConfig c) { v.push_back(c); };
  for (const char* model : {"gpt-10m", "t5-10m", "gpt-1m"}) {
    SimConfig c;
    c.model = model;
    for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
      c.strategy = s;
      add(c);
    }
    SimConfig ddp = c;
    ddp.parallelism = Parallelism::kDdp;
    ddp.strategy = ShardingStrategy::kFullShard;
    add(ddp);
    SimConfig hybrid = c;
    hybrid.strategy = ShardingStrategy::kHybridShard;
    hybrid.world = 16;
    hybrid.shard_group_size = 8;
    add(hybrid);
    SimConfig full16 = hybrid;
    full16.strategy = ShardingStrategy::kFullShard;
    full16.shard_group_size = 0;
    add(full16);
  }
  for (const char* variant : {"no_prefetch", "backward_post", "forward_prefetch", "no_limit"}) {
    SimConfig c;
    c.model = "gpt-10m";
    c.variant = variant;
    add(c);
  }
  SimConfig t5 = {};
  t5.model = "t5-611m";
  add(t5);
  t5.model = "t5-11b";
  add(t5);
  SimConfig gpt = {};
  gpt.model = "gpt-175b";
  gpt.world = 128;
  gpt.batch_size = 1;
  gpt.activation_checkpointing = true;
  add(gpt);
  gpt.variant = "no_prefetch";
  add(gpt);
  // The unit-table vision models (convolutions as gathers and grouped
  // GEMMs; ViT blocks), with and without the rate limiter, at the claims
  // table's setting (8 GPUs, 8 images per GPU).
  for (const char* model : {"regnet-9b", "deepvit-8b"}) {
    SimConfig c;
    c.model = model;
    c.batch_size = 8;
    add(c);
    c.variant = "no_limit";
    add(c);
  }
  return v;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  for (const sk::SimConfig& c : sk::Configs()) {
    benchmark::RegisterBenchmark(c.Name().c_str(), sk::BM_Sim, c)->Iterations(1)->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
