// FSDP step time and peak memory per strategy, at world 4 on the local
// backend (ranks as threads), on a scaled GPT.
//
//   ./bazelw run -c opt //benchmarks:fsdp_step -- --benchmark_repetitions=3
//
// Each benchmark iteration is one optimizer step on every rank; its time is
// the slowest rank's. Two model setups:
//   compute  gpt-1m, batch 4 x 128: a model that fits, so step time compares
//            FSDP's communication overhead with the baseline's;
//   states   gpt-deep-20m (24 narrow blocks), batch 1 x 16 with Adam: memory
//            dominated by model states (16 bytes per parameter unsharded), where
//            sharding shows.
// After the runs a summary prints each strategy's median step time and peak
// allocated memory as ratios to DDP measured in the same run, which is what
// CI tracks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "benchmarks/util/stats.h"
#include "benchmarks/util/inject.h"
#include "runtime/comm/local_backend.h"
#include "runtime/train/local_session.h"

namespace sk {
namespace {

using bench::UpperMedian;

constexpr int kWorld = 4;

struct Setup {
  const char* name;
  const char* model;
  int64_t batch;
  int64_t seq;
};
constexpr Setup kSetups[] = {{"compute", "gpt-1m", 4, 128}, {"states", "gpt-deep-20m", 1, 16}};

struct Result {
  std::vector<double> step_seconds;
  int64_t peak_allocated = 0;
};
std::mutex g_mu;
std::map<std::string, Result> g_results;  // "setup/strategy"

void BM_Step(benchmark::State& state, Setup setup, Parallelism parallelism, ShardingStrategy strategy) {
  TrainerOptions o;
  o.model = setup.model;
  o.batch_size = setup.batch;
  o.seq_len = setup.seq;
  o.optimizer.kind = OptimizerKind::kAdamW;
  o.parallelism = parallelism;
  o.fsdp.strategy = strategy;
  if (strategy == ShardingStrategy::kHybridShard || strategy == ShardingStrategy::kHybridShardGradOp) {
    o.fsdp.shard_group_size = 2;
  }
  auto session = [&]() -> StatusOr<std::unique_ptr<LocalSession>> {
    SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(kWorld));
    SK_ASSIGN_OR_RETURN(auto s, LocalSession::Create(o, LocalSession::Share(std::move(groups))));
    SK_RETURN_IF_ERROR(s->Step().status());  // warm-up: caches and optimizer state
    return s;
  }();
  if (!session.ok()) {
    state.SkipWithError(session.status().ToString().c_str());
    return;
  }
  LocalSession& ranks = **session;
  Result result;
  std::vector<double> seconds(kWorld);
  std::vector<int64_t> peak(kWorld);
  // SK_BENCH_INJECT=fsdp_step:N (track.py --self_test): N FSDP steps per iteration.
  const int repeats = parallelism == Parallelism::kFsdp ? bench::InjectedRepeats("fsdp_step") : 1;
  for (auto _ : state) {
    Status s = ranks.OnEveryRank([&](int r, Trainer& t) -> Status {
      seconds[r] = 0;
      peak[r] = 0;
      for (int i = 0; i < repeats; ++i) {
        SK_ASSIGN_OR_RETURN(StepMetrics m, t.Step());
        seconds[r] += m.step_seconds;
        peak[r] = std::max(peak[r], m.peak_allocated_bytes);
      }
      return OkStatus();
    });
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    double slowest = *std::max_element(seconds.begin(), seconds.end());
    state.SetIterationTime(slowest);
    result.step_seconds.push_back(slowest);
    result.peak_allocated = std::max(result.peak_allocated, *std::max_element(peak.begin(), peak.end()));
  }
  state.counters["peak_alloc_MiB"] = static_cast<double>(result.peak_allocated) / (1 << 20);
  state.counters["params_M"] = static_cast<double>(ranks.trainer(0).model().num_parameters()) / 1e6;
  session->reset();
  std::lock_guard<std::mutex> lock(g_mu);
  Result& acc = g_results[std::string(setup.name) + "/" +
                          (parallelism == Parallelism::kDdp ? "DDP" : ShardingStrategyName(strategy))];
  acc.step_seconds.insert(acc.step_seconds.end(), result.step_seconds.begin(), result.step_seconds.end());
  acc.peak_allocated = std::max(acc.peak_allocated, result.peak_allocated);
}

void PrintSummary() {
  std::printf("\nworld %d, local backend; ratios against DDP measured in this run\n", kWorld);
  std::printf("%-8s %-22s %12s %10s %14s %10s\n", "setup", "strategy", "median ms", "time/base",
              "peak MiB", "mem/base");
  for (const Setup& setup : kSetups) {
    auto base = g_results.find(std::string(setup.name) + "/DDP");
    for (const auto& [key, r] : g_results) {
      if (key.rfind(std::string(setup.name) + "/", 0) != 0) continue;
      double t = UpperMedian(r.step_seconds);
      double tb = base == g_results.end() ? 0 : UpperMedian(base->second.step_seconds);
      double mb = base == g_results.end() ? 0 : static_cast<double>(base->second.peak_allocated);
      std::printf("%-8s %-22s %12.2f %10.3f %14.2f %10.3f\n", setup.name,
                  key.substr(key.find('/') + 1).c_str(), t * 1e3, tb > 0 ? t / tb : 0,
                  static_cast<double>(r.peak_allocated) / (1 << 20),
                  mb > 0 ? static_cast<double>(r.peak_allocated) / mb : 0);
    }
  }
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  using sk::Parallelism;
  using sk::ShardingStrategy;
  for (const sk::Setup& setup : sk::kSetups) {
    std::string ddp = std::string("BM_Step/") + setup.name + "/DDP";
    benchmark::RegisterBenchmark(ddp.c_str(), sk::BM_Step, setup, Parallelism::kDdp, ShardingStrategy::kFullShard)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(5);
    for (ShardingStrategy s : {ShardingStrategy::kNoShard, ShardingStrategy::kFullShard,
                               ShardingStrategy::kShardGradOp, ShardingStrategy::kShardOptim,
                               ShardingStrategy::kHybridShard}) {
      std::string name = std::string("BM_Step/") + setup.name + "/" + sk::ShardingStrategyName(s);
      benchmark::RegisterBenchmark(name.c_str(), sk::BM_Step, setup, Parallelism::kFsdp, s)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->Iterations(5);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  sk::PrintSummary();
  return 0;
}
