#include "benchmarks/experiments.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "benchmarks/host_network.h"
#include "benchmarks/progress.h"
#include "benchmarks/run_config.h"
#include "runtime/nn/configs.h"

namespace sk::bench {

namespace {

constexpr double kMiB = 1 << 20;

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

int64_t ParamsOf(const std::string& model) {
  auto m = CreateModel(model);
  return m.ok() ? (*m)->num_parameters() : 0;
}

double WeightOf(const ExperimentOptions& o, const std::string& model) {
  // Step cost grows with parameters (optimizer, communication) and creation
  // (initialisation) too; the constant is the per-configuration overhead.
  return static_cast<double>(ParamsOf(model)) / 1e6 * (o.warmup_steps + o.steps + 1) + 5;
}

TrainerOptions BaseTrainer(const ExperimentOptions& o, const std::string& model) {
  TrainerOptions t;
  t.model = model;
  t.batch_size = o.batch_size;
  t.seq_len = o.seq_len;
  auto config = FindModelConfig(model);
  if (config.ok() && config->family == ModelFamily::kT5) t.source_len = o.seq_len;
  t.optimizer.kind = OptimizerKind::kAdamW;
  // A rank that fails (out of memory) must not keep its peers waiting for
  // the default five minutes (slowest step seen under load: 7.5 s).
  t.fsdp.timeout = Duration(20'000);
  return t;
}

RunSpec BaseSpec(const ExperimentOptions& o, TrainerOptions t) {
  RunSpec s;
  s.trainer = std::move(t);
  s.world = o.world;
  s.warmup_steps = o.warmup_steps;
  s.steps = o.steps;
  return s;
}

std::string Outcome(const RunResult& r) {
  if (r.ok) return "median " + Fixed(r.median_seconds * 1e3, 1) + " ms";
  return r.oom ? "OOM" : "error: " + r.error;
}

// The measurements every table shares.
void AddResult(Row& row, const RunResult& r) {
  row.Set("status", r.ok ? "ok" : (r.oom ? "OOM" : "error"));
  if (r.ok) {
    row.Set("step_ms", r.median_seconds * 1e3, 1);
    row.Set("step_ms_min", r.min_seconds * 1e3, 1);
    row.Set("step_ms_max", r.max_seconds * 1e3, 1);
    row.Set("model_tflops_per_rank", r.model_tflops_per_rank, 5);
    row.Set("tokens_per_s", r.tokens_per_second, 1);
    row.Set("peak_alloc_mib", r.peak_allocated_bytes / kMiB, 1);
    row.Set("peak_reserved_mib", r.peak_reserved_bytes / kMiB, 1);
    row.Set("comm_mib_per_step", r.bytes_per_step / kMiB, 2);
  }
  row.Set("alloc_retries", r.alloc_retries);
  row.Set("ooms", r.ooms);
  row.Set("network", r.network);
  if (!r.ok && !r.oom) row.Set("error", r.error);
}

bool IsHybrid(ShardingStrategy s) {
  return s == ShardingStrategy::kHybridShard || s == ShardingStrategy::kHybridShardGradOp;
}


}  // namespace

ExperimentOptions DefaultExperimentOptions(bool quick) {
  ExperimentOptions o;
  o.quick = quick;
  o.world = 4;
  o.warmup_steps = 1;
  o.steps = quick ? 2 : 3;
  o.comparison_steps = quick ? 3 : 10;
  o.seq_len = 32;
  o.batch_size = 1;
  o.strategies = {"DDP", "NO_SHARD", "SHARD_OPTIM", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD"};
  if (quick) {
    o.models = {"gpt-1m", "gpt-10m"};
    o.strategies = {"DDP", "FULL_SHARD"};
    o.dtypes = {"f32"};
    // Between DDP's and FULL_SHARD's measured peaks on gpt-10m at seq 32.
    o.memory_cap_mib = 160;
    o.prefetch_model = "gpt-1m";
    o.limits = {0, 2};
    o.limiter_models = {};
    o.near_cap_model = "gpt-1m";
    o.hybrid_model = "gpt-1m";
  } else {
    o.models = {"t5-10m", "gpt-10m", "t5-60m"};
    o.dtypes = {"f32", "bf16"};
    // Between DDP's and FULL_SHARD's peaks: DDP (16 bytes per parameter
    // with AdamW) fits the 8-12M-parameter models and not the 57M one.
    // (gpt-50m behaves as t5-60m; --models adds it, at 4 more minutes.)
    o.memory_cap_mib = 640;
    o.prefetch_model = "gpt-10m";
    o.limits = {0, 1, 2, 4};
    o.limiter_models = {"t5-10m"};
    o.near_cap_model = "gpt-10m";
    o.hybrid_model = "gpt-10m";
  }
  o.intra_host_link.latency_us = 2;
  o.intra_host_link.bandwidth_gbps = 50;
  return o;
}

Experiment PlanDdpVsFsdp(const ExperimentOptions& o) {
  Experiment e;
  e.name = "ddp_vs_fsdp";
  e.table = std::make_shared<Table>(e.name);
  e.notes = std::make_shared<std::vector<std::string>>();
  e.notes->push_back("world " + std::to_string(o.world) + " (local ranks as threads), AdamW, batch " +
                     std::to_string(o.batch_size) + " x " + std::to_string(o.seq_len) +
                     " tokens per rank, memory cap " + std::to_string(o.memory_cap_mib) +
                     " MiB per rank (plays the paper's 80 GB A100), local backend (no network model)");
  for (const std::string& model : o.models) {
    for (const std::string& dtype : o.dtypes) {
      for (const std::string& strategy : o.strategies) {
        Config c;
        c.label = "ddp_vs_fsdp " + model + " " + strategy + " " + dtype;
        c.weight = WeightOf(o, model);
        auto table = e.table;
        c.run = [o, model, dtype, strategy, table](Progress& progress) {
          TrainerOptions t = BaseTrainer(o, model);
          t.memory_cap_bytes = static_cast<size_t>(o.memory_cap_mib) << 20;
          if (strategy == "DDP") {
            t.parallelism = Parallelism::kDdp;
          } else {
            t.parallelism = Parallelism::kFsdp;
            auto s = ParseShardingStrategy(strategy);
            if (s.ok()) t.fsdp.strategy = *s;
            if (s.ok() && IsHybrid(*s)) t.fsdp.shard_group_size = o.world / 2;
          }
          if (dtype == "bf16") t.fsdp.mixed_precision.param_dtype = DType::kBF16;
          RunResult r = RunConfig(BaseSpec(o, t), &progress);
          Row row;
          row.Set("model", model);
          row.Set("params_m", r.parameters / 1e6, 2);
          if (r.parameters == 0) row.Set("params_m", ParamsOf(model) / 1e6, 2);
          row.Set("strategy", strategy);
          row.Set("dtype", dtype);
          row.Set("memory_cap_mib", o.memory_cap_mib);
          AddResult(row, r);
          table->Add(row);
          progress.EndConfig(Outcome(r));
        };
        e.configs.push_back(std::move(c));
      }
    }
  }
  return e;
}

Experiment PlanPrefetch(const ExperimentOptions& o) {
  Experiment e;
  e.name = "prefetch";
  e.table = std::make_shared<Table>(e.name);
  e.notes = std::make_shared<std::vector<std::string>>();
  const std::string model = o.prefetch_model;
  auto link = std::make_shared<comm::LinkModel>();
  auto table = e.table;
  auto notes = e.notes;
  Config cal;
  cal.label = "prefetch: calibrate the link on " + model + " (FULL_SHARD, no prefetch, no network model)";
  cal.weight = WeightOf(o, model);
  cal.run = [o, model, link, notes](Progress& progress) {
    TrainerOptions t = BaseTrainer(o, model);
    t.fsdp.backward_prefetch = BackwardPrefetch::kNone;
    RunResult r = RunConfig(BaseSpec(o, t), &progress);
    // FULL_SHARD moves its parameters three times a step (all-gather in
    // forward and backward, reduce-scatter); one pass's all-gather is a third.
    const double pass_bytes = r.ok ? r.bytes_per_step / 3.0 : 0;
    const double n = o.world;
    link->latency_us = 5;
    link->bandwidth_gbps = 12.5;
    if (r.ok && r.median_seconds > 0 && pass_bytes > 0) {
      link->bandwidth_gbps = (n - 1) / n * pass_bytes / (o.comm_ratio * r.median_seconds) / 1e9;
    }
    notes->push_back("network model calibrated so one pass's all-gathers take " +
                     Fixed(o.comm_ratio, 2) + " x the step time measured without it (" +
                     Fixed(r.median_seconds * 1e3, 1) + " ms, " + Fixed(pass_bytes / kMiB, 1) +
                     " MiB per pass): " + link->ToString());
    progress.EndConfig(r.ok ? Outcome(r) + "; link " + link->ToString() : Outcome(r));
  };
  e.configs.push_back(std::move(cal));
  struct Mode {
    const char* name;
    BackwardPrefetch prefetch;
    bool forward;
  };
  static const Mode kModes[] = {{"none", BackwardPrefetch::kNone, false},
                                {"BACKWARD_POST", BackwardPrefetch::kBackwardPost, false},
                                {"BACKWARD_PRE", BackwardPrefetch::kBackwardPre, false},
                                {"BACKWARD_PRE+forward", BackwardPrefetch::kBackwardPre, true}};
  for (const Mode& mode : kModes) {
    Config c;
    c.label = std::string("prefetch ") + model + " " + mode.name;
    c.weight = WeightOf(o, model);
    c.run = [o, model, mode, link, table](Progress& progress) {
      TrainerOptions t = BaseTrainer(o, model);
      t.fsdp.backward_prefetch = mode.prefetch;
      t.fsdp.forward_prefetch = mode.forward;
      RunSpec spec = BaseSpec(o, t);
      spec.steps = o.comparison_steps;
      spec.link = *link;
      std::string trace = std::string("trace_prefetch_") + mode.name + ".json";
      for (char& ch : trace) {
        if (ch == '+') ch = '_';
      }
      if (!o.out_dir.empty()) spec.trace_path = o.out_dir + "/" + trace;
      RunResult r = RunConfig(spec, &progress);
      Row row;
      row.Set("model", model);
      row.Set("params_m", ParamsOf(model) / 1e6, 2);
      row.Set("mode", mode.name);
      row.Set("comm_ratio", o.comm_ratio, 2);
      AddResult(row, r);
      row.Set("prefetches_per_step", r.prefetches_per_step);
      row.Set("trace", o.out_dir.empty() ? "" : trace);
      table->Add(row);
      progress.EndConfig(Outcome(r));
    };
    e.configs.push_back(std::move(c));
  }
  return e;
}

Experiment PlanRateLimiter(const ExperimentOptions& o) {
  Experiment e;
  e.name = "rate_limiter";
  e.table = std::make_shared<Table>(e.name);
  e.notes = std::make_shared<std::vector<std::string>>();
  e.notes->push_back(
      "FULL_SHARD with BACKWARD_PRE and forward prefetch; limit 0 = off (every remaining unit is "
      "prefetched at once: the CPU-runs-ahead over-allocation), K = most unsharded units alive; "
      "local backend (no network model)");
  auto table = e.table;
  auto add = [&](const std::string& model, int limit, bool near_cap,
                 std::shared_ptr<int64_t> cap_bytes) {
    Config c;
    c.label = "rate_limiter " + model + " limit " + std::to_string(limit) + (near_cap ? " near cap" : "");
    c.weight = WeightOf(o, model);
    c.run = [o, model, limit, near_cap, cap_bytes, table](Progress& progress) {
      TrainerOptions t = BaseTrainer(o, model);
      t.fsdp.forward_prefetch = true;
      t.fsdp.all_gather_limit = limit == 0 ? kNoAllGatherLimit : limit;  // the harness's 0 = off
      if (near_cap) t.memory_cap_bytes = static_cast<size_t>(*cap_bytes);
      RunResult r = RunConfig(BaseSpec(o, t), &progress);
      if (!near_cap && cap_bytes != nullptr && r.ok) {
        // Uncapped runs of the near-cap model raise the cap to just above
        // what each needs live (peak allocated) and what the limited run
        // holds (peak reserved): every setting fits its live tensors, and the
        // one that caches more than the cap allows is pushed into retries.
        // Between live and cached for the unlimited run: at its live peak
        // it stalls on frees still awaiting streams (pending_free_timeout)
        // and then fails, which measures the stall, not the retries.
        const int64_t need = limit == 2 ? static_cast<int64_t>(r.peak_reserved_bytes * o.near_cap_headroom)
                                        : (r.peak_allocated_bytes + r.peak_reserved_bytes) / 2;
        *cap_bytes = std::max(*cap_bytes, need);
      }
      Row row;
      row.Set("model", model);
      row.Set("params_m", ParamsOf(model) / 1e6, 2);
      row.Set("limit", static_cast<int64_t>(limit));
      row.Set("setting", near_cap ? "near cap" : "uncapped");
      row.Set("memory_cap_mib", near_cap ? *cap_bytes / kMiB : 0.0, 1);
      AddResult(row, r);
      row.Set("prefetches_deferred_per_step", r.prefetches_deferred_per_step);
      row.Set("max_unsharded_alive", static_cast<int64_t>(r.max_unsharded_alive));
      table->Add(row);
      progress.EndConfig(Outcome(r) + ", retries " + std::to_string(r.alloc_retries));
    };
    e.configs.push_back(std::move(c));
  };
  // The near-cap model first: its limit-2 run (uncapped) sets the cap.
  auto cap = std::make_shared<int64_t>(0);
  std::vector<int> limits = o.limits;
  add(o.near_cap_model, 2, false, cap);
  for (int limit : limits) {
    if (limit != 2) add(o.near_cap_model, limit, false, cap);
  }
  for (int limit : limits) add(o.near_cap_model, limit, true, cap);
  for (const std::string& model : o.limiter_models) {
    for (int limit : limits) add(model, limit, false, nullptr);
  }
  e.notes->push_back("near cap: memory cap = the largest of " + Fixed(o.near_cap_headroom, 2) +
                     " x limit 2's peak reserved and, for every other limit, the midpoint of its "
                     "peak allocated and peak reserved, all measured uncapped on " + o.near_cap_model +
                     " (every setting fits its live tensors; caching beyond the cap costs retries)");
  return e;
}

Experiment PlanHybrid(const ExperimentOptions& o) {
  Experiment e;
  e.name = "hybrid";
  e.table = std::make_shared<Table>(e.name);
  e.notes = std::make_shared<std::vector<std::string>>();
  const std::string model = o.hybrid_model;
  const int per_host = o.world / 2;
  auto inter = std::make_shared<comm::LinkModel>(o.intra_host_link);
  auto table = e.table;
  auto notes = e.notes;
  Config cal;
  cal.label = "hybrid: calibrate the inter-host link on " + model + " (FULL_SHARD, fast links)";
  cal.weight = WeightOf(o, model);
  cal.run = [o, model, per_host, inter, notes](Progress& progress) {
    TrainerOptions t = BaseTrainer(o, model);
    RunSpec spec = BaseSpec(o, t);
    spec.link = o.intra_host_link;
    spec.ranks_per_host = per_host;
    spec.inter_host_link = o.intra_host_link;
    RunResult r = RunConfig(spec, &progress);
    inter->latency_us = 20;
    if (r.ok && r.median_seconds > 0 && r.cross_host_bytes_per_step > 0) {
      inter->bandwidth_gbps =
          r.cross_host_bytes_per_step / (o.inter_host_ratio * r.median_seconds) / 1e9;
    }
    notes->push_back("2 hosts x " + std::to_string(per_host) + " ranks; intra-host link " +
                     o.intra_host_link.ToString() + "; inter-host link calibrated so FULL_SHARD's " +
                     "cross-host traffic (" + Fixed(r.cross_host_bytes_per_step / kMiB, 1) +
                     " MiB per rank per step) takes " + Fixed(o.inter_host_ratio, 2) +
                     " x its step time over fast links (" + Fixed(r.median_seconds * 1e3, 1) +
                     " ms): " + inter->ToString());
    progress.EndConfig(Outcome(r) + "; inter-host link " + inter->ToString());
  };
  e.configs.push_back(std::move(cal));
  for (const char* strategy : {"FULL_SHARD", "HYBRID_SHARD", "NO_SHARD"}) {
    Config c;
    c.label = std::string("hybrid ") + model + " " + strategy;
    c.weight = WeightOf(o, model);
    c.run = [o, model, strategy, per_host, inter, table](Progress& progress) {
      TrainerOptions t = BaseTrainer(o, model);
      auto s = ParseShardingStrategy(strategy);
      if (s.ok()) t.fsdp.strategy = *s;
      t.fsdp.shard_group_size = per_host;
      RunSpec spec = BaseSpec(o, t);
      spec.steps = o.comparison_steps;
      spec.link = o.intra_host_link;
      spec.ranks_per_host = per_host;
      spec.inter_host_link = *inter;
      RunResult r = RunConfig(spec, &progress);
      Row row;
      row.Set("model", model);
      row.Set("params_m", ParamsOf(model) / 1e6, 2);
      row.Set("strategy", strategy);
      row.Set("shard_group_size", static_cast<int64_t>(std::string(strategy) == "HYBRID_SHARD"
                                                           ? per_host
                                                           : (std::string(strategy) == "NO_SHARD" ? 1 : o.world)));
      AddResult(row, r);
      row.Set("cross_host_mib_per_step", r.cross_host_bytes_per_step / kMiB, 2);
      row.Set("replica_mib_per_step", r.replica_bytes_per_step / kMiB, 2);
      table->Add(row);
      progress.EndConfig(Outcome(r) + ", cross-host " + Fixed(r.cross_host_bytes_per_step / kMiB, 1) +
                         " MiB");
    };
    e.configs.push_back(std::move(c));
  }
  return e;
}

}  // namespace sk::bench
