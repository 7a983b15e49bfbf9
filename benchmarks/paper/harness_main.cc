#include "benchmarks/paper/harness_main.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include <gflags/gflags.h>

#include "benchmarks/paper/claims.h"
#include "benchmarks/paper/experiments.h"
#include "benchmarks/paper/progress.h"
#include "benchmarks/paper/report.h"
#include "benchmarks/paper/sim_claims.h"
#include "runtime/core/env.h"
#include "runtime/sim/profile.h"
#include "tools/cli_flags.h"

DEFINE_string(out, "",
              "output folder; default $BUILD_WORKSPACE_DIRECTORY/bench-out/<harness>-<time> under "
              "bazel run, else ./bench-out/<harness>-<time>");
DEFINE_bool(quick, false, "small models and few configurations (about 2 minutes on 2 cores)");
DEFINE_int32(world, 4, "ranks (threads)");
DEFINE_int32(steps, 0, "timed steps per configuration (0: 3, or 2 with --quick)");
DEFINE_int32(warmup, 1, "untimed warm-up steps per configuration");
DEFINE_int32(comparison_steps, 0,
             "timed steps of each repetition of a compared configuration (DDP vs FULL_SHARD f32, prefetch "
             "modes, limiter limits, hybrid strategies; 0: 5)");
DEFINE_int32(reps, 0,
             "repetitions of each compared configuration, alternating the variants (0: 3; verdicts need 3)");
DEFINE_string(models, "", "ddp_vs_fsdp: comma-separated model names (default per mode)");
DEFINE_string(strategies, "", "ddp_vs_fsdp: DDP and/or FSDP strategies (default all six)");
DEFINE_string(dtypes, "", "ddp_vs_fsdp: f32 and/or bf16 (default both)");
DEFINE_int64(memory_cap_mib, 0, "ddp_vs_fsdp: per-rank memory cap in MiB (default per mode)");
DEFINE_int64(seq_len, 0, "tokens per sequence (default 32)");
DEFINE_int64(batch_size, 0, "sequences per rank (default 1)");
DEFINE_double(comm_ratio, 0,
              "prefetch: modelled all-gather time of one pass / step time without the model "
              "(default 0.22: hiding all backward all-gathers then gives the paper's 18%)");
DEFINE_string(prefetch_model, "", "prefetch: model (default gpt-10m, gpt-1m with --quick)");
DEFINE_string(limits, "", "rate_limiter: all_gather_limit values, N >= 1 or off, as plan's --rate_limits (default off,1,2,4)");
DEFINE_string(limiter_models, "", "rate_limiter: further models without a cap");
DEFINE_string(near_cap_model, "", "rate_limiter: the model run near its memory cap");
DEFINE_double(inter_host_ratio, 0,
              "hybrid: modelled cross-host time of FULL_SHARD / its step time (default 1)");
DEFINE_string(hybrid_model, "", "hybrid: model");
DEFINE_string(sim_profile, "a100-80g",
              "the profile of the paper-scale simulated claims (benchmarks/paper/sim_claims.h); empty: skip them");
DEFINE_bool(measured, true,
            "run the measured experiments; false: only the simulated claims (paper harness; seconds)");
DEFINE_bool(plots, true, "render PNG plots with python3 benchmarks/paper/plot.py (matplotlib)");
DEFINE_bool(publish, false,
            "paper harness under bazel run: after the run, copy its tables and plots into "
            "benchmarks/results/ and rewrite the README's results block "
            "(python3 benchmarks/paper/update_readme.py OUT_DIR, which also runs by hand)");

namespace sk::bench {

namespace {

bool Set(const char* flag) { return !gflags::GetCommandLineFlagInfoOrDie(flag).is_default; }

// The numeric flags, checked before the output folder is made: --world=0
// or -3 ran every configuration into an error row and exited 0; negative
// counts were silently replaced by the defaults; --limits=abc read as 0 (off).
std::string CheckFlags() {
  constexpr int kMaxWorld = 1024;  // ranks are threads of this process
  if (FLAGS_world < 1 || FLAGS_world > kMaxWorld) {
    return "--world must be in [1, " + std::to_string(kMaxWorld) + "], got " + std::to_string(FLAGS_world);
  }
  if (FLAGS_warmup < 0) return "--warmup must be >= 0, got " + std::to_string(FLAGS_warmup);
  const std::pair<const char*, int64_t> counts[] = {
      {"steps", FLAGS_steps},          {"comparison_steps", FLAGS_comparison_steps},
      {"reps", FLAGS_reps},            {"memory_cap_mib", FLAGS_memory_cap_mib},
      {"seq_len", FLAGS_seq_len},      {"batch_size", FLAGS_batch_size}};
  for (const auto& [name, v] : counts) {
    if (v < 0) return std::string("--") + name + " must be >= 0 (0: the default), got " + std::to_string(v);
  }
  const std::pair<const char*, double> ratios[] = {{"comm_ratio", FLAGS_comm_ratio},
                                                   {"inter_host_ratio", FLAGS_inter_host_ratio}};
  for (const auto& [name, v] : ratios) {
    if (!std::isfinite(v) || v < 0) {
      return std::string("--") + name + " must be a finite number >= 0 (0: the default), got " +
             std::to_string(v);
    }
  }
  for (const std::string& l : cli::SplitList(FLAGS_limits)) {
    if (l == "off") continue;
    if (l == "0" || l.find_first_not_of("0") == std::string::npos) {
      // The flag's 0 meant off, where the C ABI's all_gather_limit 0 means
      // the default (2): one spelling, the planner's, for both.
      return "--limits: '" + l + "' is not an all_gather_limit: write off for no limit (the C ABI's 0 means the default, 2)";
    }
    if (l.size() > 9 || l.find_first_not_of("0123456789") != std::string::npos) {
      return "--limits: '" + l + "' is not an all_gather_limit (an integer >= 1, or off)";
    }
  }
  return "";
}

ExperimentOptions OptionsFromFlags() {
  ExperimentOptions o = DefaultExperimentOptions(FLAGS_quick);
  o.world = FLAGS_world;
  if (FLAGS_steps > 0) o.steps = FLAGS_steps;
  o.warmup_steps = FLAGS_warmup;
  if (FLAGS_comparison_steps > 0) o.comparison_steps = FLAGS_comparison_steps;
  if (FLAGS_reps > 0) o.reps = FLAGS_reps;
  if (Set("models")) o.models = cli::SplitList(FLAGS_models);
  if (Set("strategies")) o.strategies = cli::SplitList(FLAGS_strategies);
  if (Set("dtypes")) o.dtypes = cli::SplitList(FLAGS_dtypes);
  if (FLAGS_memory_cap_mib > 0) o.memory_cap_mib = FLAGS_memory_cap_mib;
  if (FLAGS_seq_len > 0) o.seq_len = FLAGS_seq_len;
  if (FLAGS_batch_size > 0) o.batch_size = FLAGS_batch_size;
  if (FLAGS_comm_ratio > 0) o.comm_ratio = FLAGS_comm_ratio;
  if (!FLAGS_prefetch_model.empty()) o.prefetch_model = FLAGS_prefetch_model;
  if (Set("limits")) {
    o.limits.clear();
    for (const std::string& l : cli::SplitList(FLAGS_limits)) {
      // Checked by the flag validation above: off, or 1..999999999.
      o.limits.push_back(l == "off" ? RateLimit::Off() : RateLimit::InFlight(std::stoi(l)));
    }
  }
  if (Set("limiter_models")) o.limiter_models = cli::SplitList(FLAGS_limiter_models);
  if (!FLAGS_near_cap_model.empty()) o.near_cap_model = FLAGS_near_cap_model;
  if (FLAGS_inter_host_ratio > 0) o.inter_host_ratio = FLAGS_inter_host_ratio;
  if (!FLAGS_hybrid_model.empty()) o.hybrid_model = FLAGS_hybrid_model;
  return o;
}

std::string Timestamp() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&now));
  return buf;
}

bool MakeDirs(const std::string& path) {
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// plot.py beside the binary's runfiles (bazel run), or in the source tree.
std::string FindPlotScript(const char* argv0) {
  std::vector<std::string> candidates = {"benchmarks/paper/plot.py"};
  if (const char* rf = GetEnv(EnvVar::kRunfilesDir)) candidates.push_back(std::string(rf) + "/shardkit/benchmarks/paper/plot.py");
  candidates.push_back(std::string(argv0) + ".runfiles/shardkit/benchmarks/paper/plot.py");
  if (const char* ws = GetEnv(EnvVar::kBuildWorkspaceDirectory)) candidates.push_back(std::string(ws) + "/benchmarks/paper/plot.py");
  for (const std::string& c : candidates) {
    if (Exists(c)) return c;
  }
  return "";
}

std::vector<std::string> ConsoleColumns(const std::string& name) {
  if (name == "ddp_vs_fsdp") {
    return {"model", "params_m", "strategy", "dtype", "status", "reps", "step_ms", "step_ms_min", "step_ms_max",
            "model_tflops_per_rank", "peak_alloc_mib", "peak_reserved_mib", "alloc_retries"};
  }
  if (name == "prefetch") {
    return {"model", "mode", "network_model", "status", "step_ms", "step_ms_min", "step_ms_max", "rep_ms",
            "peak_alloc_mib", "prefetches_per_step", "trace"};
  }
  if (name == "rate_limiter") {
    return {"model", "setting", "limit", "memory_cap_mib", "status", "step_ms", "step_ms_min", "step_ms_max",
            "rep_ms", "peak_alloc_mib", "peak_reserved_mib", "alloc_retries", "max_unsharded_alive"};
  }
  if (name == "hybrid") {
    return {"model", "strategy", "shard_group_size", "status", "step_ms", "step_ms_min", "step_ms_max", "rep_ms",
            "peak_alloc_mib", "cross_host_mib_per_step", "replica_mib_per_step"};
  }
  return {};
}

// How far to trust the simulated rows, from current values: each GPU
// profile's validation spread (runtime/sim/profiles/*.json "validation",
// written by //benchmarks/paper:planner_validation from the published runs
// in benchmarks/results/planner_validation.md). Nothing here is a constant
// that could go stale beside the profiles.
std::string ProfileSpread(const std::string& name) {
  StatusOr<sim::SimProfile> p = sim::LoadProfile(name);
  if (!p.ok()) return name + ": " + std::string(p.status().message());
  if (!p->validation) return name + ": not checked against published runs";
  const sim::ValidationSpread& v = *p->validation;
  char text[256];
  std::snprintf(text, sizeof(text), "%s: %.2f-%.2fx (median %.2fx) over %d published runs", name.c_str(),
                v.ratio_low, v.ratio_high, v.ratio_median, v.runs);
  return text;
}

std::string SimTrust() {
  std::string spreads;
  for (const char* name : {"a100-80g", "h100-80g", "h200-141g"}) {
    spreads += (spreads.empty() ? "" : "; ") + ProfileSpread(name);
  }
  return "How far to trust the simulated rows: the planner's predicted / published throughput on published FSDP "
         "training runs that were not used to build its cost model (benchmarks/results/planner_validation.md, "
         "regenerated by ./bazelw run -c opt //benchmarks/paper:planner_validation) was " +
         spreads +
         ". The CPU-side simulator is checked against measured CPU steps by //benchmarks:sim_validate "
         "(docs/planner.md, 'How far to trust it'). The rows run in bf16 mixed precision, as the paper did.";
}

// One short clause for the README: the profile's spread.
std::string SimTrustShort(const std::string& profile) {
  return "predicted / published throughput " + ProfileSpread(profile) +
         " (benchmarks/results/planner_validation.md)";
}

std::string LoadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  char buf[64] = {0};
  const bool ok = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  if (!ok) return "?";
  std::stringstream ss(buf);
  std::string one;
  ss >> one;
  return one;
}

std::string UtcNow() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return buf;
}

std::string Wrapped(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  std::stringstream ss(text);
  std::string word;
  while (ss >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

// A failed write is reported and the run goes on: the other files are still
// worth having.
void ReportIfError(const std::string& harness, const Status& s) {
  if (!s.ok()) std::fprintf(stderr, "%s: %s\n", harness.c_str(), s.ToString().c_str());
}

// --out, or bench-out/<harness>-<time>/ in the workspace (under bazel run).
std::string OutputFolder(const std::string& harness) {
  if (!FLAGS_out.empty()) return FLAGS_out;
  const char* ws = GetEnv(EnvVar::kBuildWorkspaceDirectory);
  return std::string(ws ? ws : ".") + "/bench-out/" + harness + (FLAGS_quick ? "-quick-" : "-") + Timestamp();
}

// Plans the measured experiments among `names` (none under --nomeasured),
// runs every configuration with progress, and writes each table.
std::vector<Experiment> RunExperiments(const std::string& harness, const std::vector<std::string>& names,
                                       const ExperimentOptions& o) {
  std::vector<Experiment> experiments;
  for (const std::string& name : FLAGS_measured ? names : std::vector<std::string>{}) {
    if (name == "ddp_vs_fsdp") experiments.push_back(PlanDdpVsFsdp(o));
    if (name == "prefetch") experiments.push_back(PlanPrefetch(o));
    if (name == "rate_limiter") experiments.push_back(PlanRateLimiter(o));
    if (name == "hybrid") experiments.push_back(PlanHybrid(o));
  }
  std::vector<double> weights;
  for (const Experiment& e : experiments) {
    for (const Config& c : e.configs) weights.push_back(c.weight);
  }
  std::printf("%s%s: %zu configurations at world %d (local ranks as threads on %u cores), "
              "scaled models; output in %s\n",
              harness.c_str(), FLAGS_quick ? " --quick" : "", weights.size(), o.world,
              std::thread::hardware_concurrency(), o.out_dir.c_str());
  std::fflush(stdout);
  Progress progress(harness, weights);
  int index = 0;
  for (Experiment& e : experiments) {
    for (Config& c : e.configs) {
      progress.BeginConfig(index++, c.label);
      c.run(progress);
    }
    ReportIfError(harness, e.table->WriteFiles(o.out_dir));
  }
  return experiments;
}

// Each experiment's notes and table, on stdout and as sections of `md`;
// returns the tables by experiment name (for the claims).
std::map<std::string, const Table*> ReportExperiments(const std::vector<Experiment>& experiments,
                                                      std::ostringstream& md) {
  std::map<std::string, const Table*> by_name;
  for (const Experiment& e : experiments) {
    by_name[e.name] = e.table.get();
    std::printf("\n== %s ==\n", e.name.c_str());
    md << "## " << e.name << "\n\n";
    for (const std::string& note : *e.notes) {
      std::printf("%s", Wrapped(note, 100, "  ").c_str());
      md << "- " << note << "\n";
    }
    md << "\n" << e.table->ToMarkdown(ConsoleColumns(e.name)) << "\n";
    std::printf("%s", e.table->ToText(ConsoleColumns(e.name)).c_str());
  }
  return by_name;
}

const std::vector<std::string>& ClaimColumns() {
  // can_differ: whether the verdict could come out otherwise ("no" where the
  // setup decides it, issue 46).
  static const std::vector<std::string> columns = {"claim",     "evidence", "paper",     "ours",
                                                   "rel_error", "verdict",  "can_differ", "judged_by"};
  return columns;
}

// The paper-scale rows, on the simulator (only in the full paper harness):
// their plot points are written, and `md` gets their section (the rows
// themselves are written only in the one claims table, claims.csv/json/md,
// with the measured rows). Empty when not run or when the simulation failed.
std::optional<Table> SimulateClaims(const std::string& harness, const std::string& out, std::ostringstream& md) {
  std::optional<Table> simulated;
  if (harness == "paper" && !FLAGS_sim_profile.empty()) {
    Table points("claims_simulated_points");
    StatusOr<Table> t = SimulatedClaims(FLAGS_sim_profile, &points);
    if (t.ok()) {
      simulated = std::move(*t);
      ReportIfError(harness, points.WriteFiles(out));  // plot.py draws the paper-scale figures from it
    } else {
      std::fprintf(stderr, "%s: simulated claims: %s\n", harness.c_str(), t.status().ToString().c_str());
    }
  }
  if (simulated) {
    std::ostringstream sim_md;
    sim_md << SimTrust() << "\n\n" << simulated->ToMarkdown(ClaimColumns());
    md << "## claims at the paper's scale (simulated)\n\n" << sim_md.str() << "\n";
  }
  return simulated;
}

// Every paper row in the one claims table (claims.csv/json; claims.md): the
// paper-scale rows from the simulator (GPT-175B's TFLOPS and the 128->512
// scaling have no measured side here), then the measured rows. No other
// claims table is written, so no two can disagree.
Table AllClaims(const std::optional<Table>& simulated, const Table& claims) {
  Table all("claims");
  if (simulated) {
    for (const Row& r : simulated->rows()) all.Add(r);
  }
  for (const Row& r : claims.rows()) all.Add(r);
  return all;
}

// Runs plot.py on `out`; returns the line that says what came of it.
std::string RenderPlots(const char* argv0, const std::string& out) {
  if (!FLAGS_plots) return "plots: skipped (--noplots)";
  std::string script = FindPlotScript(argv0);
  if (script.empty()) return "plots: benchmarks/paper/plot.py not found; CSV and JSON are complete";
  // Debian's interpreter, where python3-matplotlib installs, ahead of
  // any other python3 on PATH.
  const std::string python = Exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  std::string cmd = python + " '" + script + "' '" + out + "'";
  std::fflush(stdout);  // the script writes to the same stdout
  int rc = std::system(cmd.c_str());
  int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return code == 0   ? "plots: PNGs written by " + script
         : code == 3 ? "plots: matplotlib is missing (apt-get install python3-matplotlib); "
                       "CSV and JSON are complete"
                     : "plots: " + script + " failed (exit " + std::to_string(code) +
                           "); CSV and JSON are complete";
}

// The README's results block (benchmarks/paper/update_readme.py puts it between
// the README's markers): a few generated lines and the links.
std::string ReadmeResults(const std::string& run, const std::string& when, const ExperimentOptions& o,
                          const std::optional<Table>& simulated, const Table& all) {
  const size_t n_sim = simulated ? simulated->rows().size() : 0;
  std::vector<const Row*> sim_rows, measured_rows;
  for (size_t i = 0; i < all.rows().size(); ++i) (i < n_sim ? sim_rows : measured_rows).push_back(&all.rows()[i]);
  std::ostringstream readme;
  readme << "Generated from the latest run of " << run << " (" << when
         << ") by `benchmarks/paper/update_readme.py`; not edited by hand. Every paper claim, with its evidence, "
            "our value, the paper's and the error: [benchmarks/results/claims.md](benchmarks/results/claims.md)"
            "; all tables: [benchmarks/results/summary.md](benchmarks/results/summary.md). A claim marked "
            "(by construction) has a verdict the harness's setup decides, (partly by construction) part of it "
            "(claims.md's can_differ column says how).\n\n";
  if (simulated) {
    readme << "- At the paper's scale, simulated (" << SimTrustShort(FLAGS_sim_profile)
           << "): " << VerdictSummary(sim_rows) << ".\n";
  }
  readme << "- Measured here, scaled models on " << std::thread::hardware_concurrency()
         << " shared cores (timed comparisons: " << o.reps << " alternating repetitions x "
         << o.comparison_steps << " steps, inconclusive when the effect is inside their spread): "
         << VerdictSummary(measured_rows) << ".\n";
  return readme.str();
}

// Every claim on stdout: the simulated ones, then the measured ones.
void PrintClaims(const std::optional<Table>& simulated, const Table& claims) {
  if (simulated) {
    std::printf("\n== claims at the paper's scale, simulated (%s) ==\n%s", FLAGS_sim_profile.c_str(),
                Wrapped(SimTrust(), 100, "  ").c_str());
    for (const Row& r : simulated->rows()) {
      std::printf("[%s] %s (%s)\n", r.Text("verdict").c_str(), r.Text("claim").c_str(), r.Text("evidence").c_str());
      std::printf("%s", Wrapped("paper: " + r.Text("paper"), 100, "    ").c_str());
      std::printf("%s", Wrapped("ours:  " + r.Text("ours"), 100, "    ").c_str());
      std::printf("%s", Wrapped("error: " + r.Text("rel_error"), 100, "    ").c_str());
      std::printf("%s", Wrapped("rule:  " + r.Text("judged_by"), 100, "    ").c_str());
    }
  }
  std::printf("\n== claims measured on this machine: the paper (docs/benchmarks.md) beside this run ==\n");
  for (const Row& r : claims.rows()) {
    std::printf("[%s] %s\n", r.Text("verdict").c_str(), r.Text("claim").c_str());
    std::printf("%s", Wrapped("evidence: " + r.Text("evidence"), 100, "    ").c_str());
    if (r.Text("can_differ") != "yes") {
      std::printf("%s", Wrapped("can differ: " + r.Text("can_differ"), 100, "    ").c_str());
    }
    std::printf("%s", Wrapped("paper: " + r.Text("paper"), 100, "    ").c_str());
    std::printf("%s", Wrapped("ours:  " + r.Text("ours"), 100, "    ").c_str());
    std::printf("%s", Wrapped("error: " + r.Text("rel_error"), 100, "    ").c_str());
    std::printf("%s", Wrapped("rule:  " + r.Text("judged_by"), 100, "    ").c_str());
  }
}

// --publish: runs update_readme.py on `out` in the workspace; returns the
// line that says what came of it (empty without --publish).
std::string Publish(const std::string& out) {
  if (!FLAGS_publish) return "";
  const char* ws = GetEnv(EnvVar::kBuildWorkspaceDirectory);
  if (ws == nullptr) {
    return "--publish: not under bazel run (no BUILD_WORKSPACE_DIRECTORY); run "
           "python3 benchmarks/paper/update_readme.py " + out + " in the checkout";
  }
  const std::string python = Exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string cmd = "cd '" + std::string(ws) + "' && " + python + " benchmarks/paper/update_readme.py '" + out + "'";
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  return (WIFEXITED(rc) && WEXITSTATUS(rc) == 0)
             ? "--publish: benchmarks/results/ and the README's results block updated"
             : "--publish: benchmarks/paper/update_readme.py failed (exit " +
                   std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) + ")";
}

}  // namespace

int HarnessMain(const std::string& harness, const std::vector<std::string>& names, int argc,
                char** argv) {
  sk::cli::ParseFlags("reproduces the PyTorch FSDP paper's experiments at a scale one CPU machine runs", __FILE__, &argc, &argv);
  if (const std::string why = CheckFlags(); !why.empty()) {
    std::fprintf(stderr, "%s: %s\n", harness.c_str(), why.c_str());
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string load_start = LoadAverage(), started = UtcNow();
  const std::string out = OutputFolder(harness);
  if (!MakeDirs(out)) {
    std::fprintf(stderr, "%s: cannot create output folder %s\n", harness.c_str(), out.c_str());
    return 1;
  }
  ExperimentOptions o = OptionsFromFlags();
  o.out_dir = out;

  const std::vector<Experiment> experiments = RunExperiments(harness, names, o);
  std::ostringstream md;
  md << "# shardkit paper harness: " << harness << (FLAGS_quick ? " --quick" : "") << "\n\n";
  const Table claims = EvaluateClaims(ReportExperiments(experiments, md), o.world);
  const std::optional<Table> simulated = SimulateClaims(harness, out, md);
  md << "## claims measured on this machine (scaled models)\n\n" << claims.ToMarkdown(ClaimColumns()) << "\n";
  const Table all = AllClaims(simulated, claims);
  ReportIfError(harness, all.WriteFiles(out));
  const std::string plots = RenderPlots(argv[0], out);

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string load_end = LoadAverage();
  const std::string when = started + ", " + FormatDuration(wall) + " on " +
                           std::to_string(std::thread::hardware_concurrency()) + " cores, load average " +
                           load_start + " at the start and " + load_end + " at the end";
  md << "Wall time " << FormatDuration(wall) << " (" << when << ").\n";
  ReportIfError(harness, WriteTextFile(out + "/summary.md", md.str()));
  // The command as run: the flags that change what is measured or written.
  std::string flags;
  if (FLAGS_quick) flags += " --quick";
  if (!FLAGS_measured) flags += " --nomeasured";
  if (!FLAGS_plots) flags += " --noplots";
  if (FLAGS_publish) flags += " --publish";
  const std::string run = "`./bazelw run -c opt //benchmarks:" + harness + (flags.empty() ? "" : " --" + flags) + "`";
  ReportIfError(harness,
                WriteTextFile(out + "/claims.md",
                              "# The paper's claims: every row, simulated at the paper's scale and measured here\n\n"
                              "Generated by " + run + " (" + when + "; claims.md in its output folder); not edited by "
                              "hand. Evidence says what each row rests on; rel_error is ours against the paper's "
                              "number.\n\n" + (simulated ? SimTrust() + "\n\n" : std::string()) +
                              all.ToMarkdown(ClaimColumns())));
  ReportIfError(harness, WriteTextFile(out + "/readme_results.md", ReadmeResults(run, when, o, simulated, all)));

  PrintClaims(simulated, claims);
  const std::string published = Publish(out);
  std::printf("\n%s\n", plots.c_str());
  if (!published.empty()) std::printf("%s\n", published.c_str());
  std::printf("%s finished in %s (load average %s at the start, %s at the end); CSV, JSON, traces, plots, "
              "summary.md, claims.md and readme_results.md in:\n  %s\n",
              harness.c_str(), FormatDuration(wall).c_str(), load_start.c_str(), load_end.c_str(), out.c_str());
  return 0;
}

}  // namespace sk::bench
