#include "benchmarks/paper/experiments.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "benchmarks/paper/host_network.h"
#include "benchmarks/paper/progress.h"
#include "benchmarks/paper/run_config.h"
#include "benchmarks/paper/verdict.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/model_family.h"

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
  const ModelFamilyDescription* family = config.ok() ? FindModelFamily(config->family) : nullptr;
  if (family != nullptr && family->batches == FamilyBatches::kEncoderDecoder) t.source_len = o.seq_len;
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

// Runs every spec `reps` times in AlternatingOrder (verdict.h), so a drift in
// the machine's load hits every variant alike. A variant that failed (out of
// memory) is not run again. runs[v] holds variant v's runs in round order;
// a spec's trace is written by its first run only. Progress counts runs.
std::vector<std::vector<RunResult>> RunAlternating(std::vector<RunSpec> specs, int reps,
                                                   Progress& progress) {
  std::vector<std::vector<RunResult>> runs(specs.size());
  const std::vector<int> order = AlternatingOrder(static_cast<int>(specs.size()), reps);
  int done = 0;
  for (int v : order) {
    ++done;
    if (!runs[v].empty() && !runs[v].back().ok) continue;
    runs[v].push_back(RunConfig(specs[v], nullptr));
    specs[v].trace_path.clear();
    progress.StepDone(done, static_cast<int>(order.size()));
  }
  return runs;
}

// One row's measurements from a variant's repetitions: status ok only when
// every run was; step time = the median of the runs' medians, min/max = the
// smallest and largest run median; peaks, retries and OOMs the largest over
// the runs; counters from the first run. The runs' medians in round order go
// to `rep_ms` (ms; claims.cc pairs the rounds of compared variants).
RunResult Merge(const std::vector<RunResult>& runs, std::vector<double>* rep_ms) {
  if (runs.empty()) return RunResult();
  for (const RunResult& r : runs) {
    if (!r.ok) return r;
  }
  RunResult m = runs.front();
  std::vector<double> medians, tflops, tokens;
  for (const RunResult& r : runs) {
    medians.push_back(r.median_seconds);
    tflops.push_back(r.model_tflops_per_rank);
    tokens.push_back(r.tokens_per_second);
    rep_ms->push_back(r.median_seconds * 1e3);
    m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, r.peak_allocated_bytes);
    m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, r.peak_reserved_bytes);
    m.alloc_retries = std::max(m.alloc_retries, r.alloc_retries);
    m.ooms = std::max(m.ooms, r.ooms);
    if (!r.error.empty() && m.error.empty()) m.error = r.error;  // a trace that failed
  }
  const Spread s = SpreadOf(medians);
  m.median_seconds = s.median;
  m.min_seconds = s.lo;
  m.max_seconds = s.hi;
  m.model_tflops_per_rank = SpreadOf(tflops).median;
  m.tokens_per_second = SpreadOf(tokens).median;
  return m;
}

// AddResult for a compared variant: also how it was repeated.
void AddRepeated(Row& row, const std::vector<RunResult>& runs, int steps) {
  std::vector<double> rep_ms;
  const RunResult m = Merge(runs, &rep_ms);
  AddResult(row, m);
  std::string list;
  for (double v : rep_ms) list += (list.empty() ? "" : ";") + Fixed(v, 2);
  row.Set("reps", static_cast<int64_t>(rep_ms.size()));
  row.Set("steps", static_cast<int64_t>(steps));
  row.Set("rep_ms", list);
}

std::string RepeatedOutcome(const std::vector<std::string>& names,
                            const std::vector<std::vector<RunResult>>& runs) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<double> rep_ms;
    const RunResult m = Merge(runs[i], &rep_ms);
    out += (out.empty() ? "" : "; ") + names[i] + " " +
           (m.ok ? Fixed(m.median_seconds * 1e3, 1) + " ms [" + Fixed(m.min_seconds * 1e3, 1) + ".." +
                       Fixed(m.max_seconds * 1e3, 1) + "]"
                 : Outcome(m));
  }
  return out;
}


}  // namespace

ExperimentOptions DefaultExperimentOptions(bool quick) {
  ExperimentOptions o;
  o.quick = quick;
  o.world = 4;
  o.warmup_steps = 1;
  o.steps = quick ? 2 : 3;
  // Timed comparisons (verdict.h): 5 steps x 3 alternating repetitions,
  // also with --quick (its models are cheap).
  o.comparison_steps = 5;
  o.reps = 3;
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
    o.limits = {RateLimit::Off(), RateLimit::InFlight(2)};
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
    o.limits = {RateLimit::Off(), RateLimit::InFlight(1), RateLimit::InFlight(2), RateLimit::InFlight(4)};
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
  auto trainer_for = [o](const std::string& model, const std::string& strategy, const std::string& dtype) {
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
    return t;
  };
  auto row_for = [o](const std::string& model, const std::string& strategy, const std::string& dtype,
                     int64_t parameters) {
    Row row;
    row.Set("model", model);
    row.Set("params_m", (parameters != 0 ? parameters : ParamsOf(model)) / 1e6, 2);
    row.Set("strategy", strategy);
    row.Set("dtype", dtype);
    row.Set("memory_cap_mib", o.memory_cap_mib);
    return row;
  };
  auto has = [&](const std::string& strategy) {
    return std::find(o.strategies.begin(), o.strategies.end(), strategy) != o.strategies.end();
  };
  // The speed claim compares FULL_SHARD with DDP in f32: those two run
  // alternately, o.reps times each; the rest of the sweep (memory, and the
  // other strategies' step times for the tables) runs once.
  const bool compare = has("DDP") && has("FULL_SHARD") && o.reps > 0;
  if (compare) {
    e.notes->push_back("DDP and FULL_SHARD in f32 ran alternately, " + std::to_string(o.reps) + " x " +
                       std::to_string(o.comparison_steps) +
                       " timed steps each (step_ms: median of the repetitions' medians; min/max: "
                       "theirs); the other rows one run of " + std::to_string(o.steps) + " steps");
  }
  for (const std::string& model : o.models) {
    for (const std::string& dtype : o.dtypes) {
      const bool pair = compare && dtype == "f32";
      if (pair) {
        Config c;
        c.label = "ddp_vs_fsdp " + model + " DDP vs FULL_SHARD f32, " + std::to_string(o.reps) +
                  " alternating repetitions";
        c.weight = WeightOf(o, model) * 2 * o.reps * (o.comparison_steps + 2) / (o.steps + 2);
        auto table = e.table;
        c.run = [o, model, trainer_for, row_for, table](Progress& progress) {
          const std::vector<std::string> names = {"DDP", "FULL_SHARD"};
          std::vector<RunSpec> specs;
          for (const std::string& strategy : names) {
            RunSpec spec = BaseSpec(o, trainer_for(model, strategy, "f32"));
            spec.steps = o.comparison_steps;
            specs.push_back(spec);
          }
          auto runs = RunAlternating(specs, o.reps, progress);
          for (size_t i = 0; i < names.size(); ++i) {
            Row row = row_for(model, names[i], "f32", runs[i].empty() ? 0 : runs[i].front().parameters);
            AddRepeated(row, runs[i], o.comparison_steps);
            table->Add(row);
          }
          progress.EndConfig(RepeatedOutcome(names, runs));
        };
        e.configs.push_back(std::move(c));
      }
      for (const std::string& strategy : o.strategies) {
        if (pair && (strategy == "DDP" || strategy == "FULL_SHARD")) continue;
        Config c;
        c.label = "ddp_vs_fsdp " + model + " " + strategy + " " + dtype;
        c.weight = WeightOf(o, model);
        auto table = e.table;
        c.run = [o, model, dtype, strategy, trainer_for, row_for, table](Progress& progress) {
          RunResult r = RunConfig(BaseSpec(o, trainer_for(model, strategy, dtype)), &progress);
          Row row = row_for(model, strategy, dtype, r.parameters);
          AddResult(row, r);
          row.Set("reps", static_cast<int64_t>(r.ok ? 1 : 0));
          row.Set("steps", static_cast<int64_t>(o.steps));
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
  // The modes alternately behind the calibrated link, then the null control:
  // none vs BACKWARD_PRE with no network model, where there is nothing to
  // hide and prefetch can only add its overhead.
  for (const bool null_control : {false, true}) {
    std::vector<Mode> modes;
    for (const Mode& m : kModes) {
      if (!null_control || m.prefetch == BackwardPrefetch::kNone ||
          (m.prefetch == BackwardPrefetch::kBackwardPre && !m.forward)) {
        modes.push_back(m);
      }
    }
    Config c;
    c.label = "prefetch " + model + (null_control ? " null control (no network model): none vs BACKWARD_PRE"
                                                  : " every mode behind the calibrated link") +
              ", " + std::to_string(o.reps) + " alternating repetitions";
    c.weight = WeightOf(o, model) * modes.size() * o.reps * (o.comparison_steps + 2) / (o.steps + 2);
    c.run = [o, model, modes, null_control, link, table](Progress& progress) {
      std::vector<RunSpec> specs;
      std::vector<std::string> names, traces;
      for (const Mode& mode : modes) {
        TrainerOptions t = BaseTrainer(o, model);
        t.fsdp.backward_prefetch = mode.prefetch;
        t.fsdp.forward_prefetch = mode.forward;
        RunSpec spec = BaseSpec(o, t);
        spec.steps = o.comparison_steps;
        std::string trace;
        if (!null_control) {
          spec.link = *link;
          trace = std::string("trace_prefetch_") + mode.name + ".json";
          for (char& ch : trace) {
            if (ch == '+') ch = '_';
          }
          if (!o.out_dir.empty()) spec.trace_path = o.out_dir + "/" + trace;
        }
        specs.push_back(spec);
        names.push_back(mode.name);
        traces.push_back(o.out_dir.empty() ? "" : trace);
      }
      auto runs = RunAlternating(specs, o.reps, progress);
      for (size_t i = 0; i < modes.size(); ++i) {
        Row row;
        row.Set("model", model);
        row.Set("params_m", ParamsOf(model) / 1e6, 2);
        row.Set("mode", modes[i].name);
        row.Set("network_model", null_control ? "off" : "calibrated");
        row.Set("comm_ratio", null_control ? 0.0 : o.comm_ratio, 2);
        AddRepeated(row, runs[i], o.comparison_steps);
        row.Set("prefetches_per_step", runs[i].empty() ? 0 : runs[i].front().prefetches_per_step);
        row.Set("trace", traces[i]);
        table->Add(row);
      }
      progress.EndConfig(RepeatedOutcome(names, runs));
    };
    e.configs.push_back(std::move(c));
  }
  return e;
}

// The rate_limiter table's "limit" column (and its labels) write off as 0:
// what the published tables, claims.cc and plot.py read.
namespace {
int64_t LimitColumn(RateLimit limit) { return limit.off() ? 0 : limit.max_in_flight(); }
}  // namespace

Experiment PlanRateLimiter(const ExperimentOptions& o) {
  Experiment e;
  e.name = "rate_limiter";
  e.table = std::make_shared<Table>(e.name);
  e.notes = std::make_shared<std::vector<std::string>>();
  e.notes->push_back(
      "FULL_SHARD with BACKWARD_PRE and forward prefetch; limit 0 = off (every remaining unit is "
      "prefetched at once: the CPU-runs-ahead over-allocation), K = most unsharded units alive; "
      "local backend (no network model); the limits of one model and setting ran alternately, " +
      std::to_string(o.reps) + " x " + std::to_string(o.comparison_steps) + " timed steps each");
  auto table = e.table;
  // Limit 2 first: the near-cap cap is derived from it.
  const RateLimit two = RateLimit::InFlight(2);
  std::vector<RateLimit> limits = {two};
  for (RateLimit limit : o.limits) {
    if (limit != two) limits.push_back(limit);
  }
  if (std::find(o.limits.begin(), o.limits.end(), two) == o.limits.end()) limits.erase(limits.begin());
  // The limits of one model and setting, alternately. With `cap_out`, the
  // uncapped runs of the near-cap model raise the cap to just above what
  // each needs live (peak allocated) and what the limited run holds (peak
  // reserved): every setting fits its live tensors, and the one that caches
  // more than the cap allows is pushed into retries. Between live and cached
  // for the unlimited run: at its live peak it stalls on frees still
  // awaiting streams (pending_free_timeout) and then fails, which measures
  // the stall, not the retries.
  auto add = [&](const std::string& model, bool near_cap, std::shared_ptr<int64_t> cap) {
    Config c;
    c.label = "rate_limiter " + model + (near_cap ? " near cap" : " uncapped") + ", limits " +
              [&] {
                std::string l;
                for (RateLimit v : limits) l += (l.empty() ? "" : ",") + std::to_string(LimitColumn(v));
                return l;
              }() +
              ", " + std::to_string(o.reps) + " alternating repetitions";
    c.weight = WeightOf(o, model) * limits.size() * o.reps * (o.comparison_steps + 2) / (o.steps + 2);
    c.run = [o, model, limits, near_cap, cap, table](Progress& progress) {
      std::vector<RunSpec> specs;
      std::vector<std::string> names;
      for (RateLimit limit : limits) {
        TrainerOptions t = BaseTrainer(o, model);
        t.fsdp.forward_prefetch = true;
        t.fsdp.all_gather_limit = limit;
        if (near_cap) t.memory_cap_bytes = static_cast<size_t>(*cap);
        RunSpec spec = BaseSpec(o, t);
        spec.steps = o.comparison_steps;
        specs.push_back(spec);
        names.push_back("limit " + std::to_string(LimitColumn(limit)));
      }
      auto runs = RunAlternating(specs, o.reps, progress);
      for (size_t i = 0; i < limits.size(); ++i) {
        if (!near_cap && cap != nullptr) {
          for (const RunResult& r : runs[i]) {
            if (!r.ok) continue;
            const int64_t need = limits[i] == RateLimit::InFlight(2)
                                     ? static_cast<int64_t>(r.peak_reserved_bytes * o.near_cap_headroom)
                                     : (r.peak_allocated_bytes + r.peak_reserved_bytes) / 2;
            *cap = std::max(*cap, need);
          }
        }
      }
      std::string retries;
      for (size_t i = 0; i < limits.size(); ++i) {
        Row row;
        row.Set("model", model);
        row.Set("params_m", ParamsOf(model) / 1e6, 2);
        row.Set("limit", LimitColumn(limits[i]));
        row.Set("setting", near_cap ? "near cap" : "uncapped");
        row.Set("memory_cap_mib", near_cap ? *cap / kMiB : 0.0, 1);
        AddRepeated(row, runs[i], o.comparison_steps);
        const RunResult& first = runs[i].empty() ? RunResult() : runs[i].front();
        row.Set("prefetches_deferred_per_step", first.prefetches_deferred_per_step);
        row.Set("max_unsharded_alive", static_cast<int64_t>(first.max_unsharded_alive));
        table->Add(row);
        retries += (retries.empty() ? "" : ", ") + row.Text("alloc_retries");
      }
      progress.EndConfig(RepeatedOutcome(names, runs) + "; retries " + retries);
    };
    e.configs.push_back(std::move(c));
  };
  auto cap = std::make_shared<int64_t>(0);
  add(o.near_cap_model, false, cap);
  add(o.near_cap_model, true, cap);
  for (const std::string& model : o.limiter_models) add(model, false, nullptr);
  e.notes->push_back("near cap: memory cap = the largest of " + Fixed(o.near_cap_headroom, 2) +
                     " x limit 2's peak reserved and, for every other limit, the midpoint of its "
                     "peak allocated and peak reserved, over every uncapped repetition on " +
                     o.near_cap_model +
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
  const std::vector<std::string> strategies = {"FULL_SHARD", "HYBRID_SHARD", "NO_SHARD"};
  Config c;
  c.label = "hybrid " + model + " FULL_SHARD, HYBRID_SHARD, NO_SHARD, " + std::to_string(o.reps) +
            " alternating repetitions";
  c.weight = WeightOf(o, model) * strategies.size() * o.reps * (o.comparison_steps + 2) / (o.steps + 2);
  c.run = [o, model, strategies, per_host, inter, table](Progress& progress) {
    std::vector<RunSpec> specs;
    for (const std::string& strategy : strategies) {
      TrainerOptions t = BaseTrainer(o, model);
      auto s = ParseShardingStrategy(strategy);
      if (s.ok()) t.fsdp.strategy = *s;
      t.fsdp.shard_group_size = per_host;
      RunSpec spec = BaseSpec(o, t);
      spec.steps = o.comparison_steps;
      spec.link = o.intra_host_link;
      spec.ranks_per_host = per_host;
      spec.inter_host_link = *inter;
      specs.push_back(spec);
    }
    auto runs = RunAlternating(specs, o.reps, progress);
    std::string cross;
    for (size_t i = 0; i < strategies.size(); ++i) {
      const std::string& strategy = strategies[i];
      const RunResult first = runs[i].empty() ? RunResult() : runs[i].front();
      Row row;
      row.Set("model", model);
      row.Set("params_m", ParamsOf(model) / 1e6, 2);
      row.Set("strategy", strategy);
      row.Set("shard_group_size",
              static_cast<int64_t>(strategy == "HYBRID_SHARD" ? per_host : (strategy == "NO_SHARD" ? 1 : o.world)));
      AddRepeated(row, runs[i], o.comparison_steps);
      row.Set("cross_host_mib_per_step", first.cross_host_bytes_per_step / kMiB, 2);
      row.Set("replica_mib_per_step", first.replica_bytes_per_step / kMiB, 2);
      table->Add(row);
      cross += (cross.empty() ? "" : ", ") + Fixed(first.cross_host_bytes_per_step / kMiB, 1);
    }
    progress.EndConfig(RepeatedOutcome(strategies, runs) + "; cross-host MiB " + cross);
  };
  e.configs.push_back(std::move(c));
  return e;
}

}  // namespace sk::bench
