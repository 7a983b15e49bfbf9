// Does the simulator predict this machine? The CPU validation of issue 11
// (docs/planner.md, "How far to trust it"): with the cpu-local profile that
// //benchmarks:calibrate measured here from microbenchmarks only, the sim
// predicts the step time of real CPU training runs, which this program then
// measures:
//
//   ./bazelw run -c opt //benchmarks:sim_validate [-- --steps=5 --profile=cpu-local]
//   sim_validate --profile=/path/cpu-local.json --report=validate.md --csv=validate.csv
//
// --profile takes a built-in name or a .json path: on another machine, run
// //benchmarks:calibrate --out=PATH there first and validate with that file
// (the GPU package's run.sh does both). --report writes the table as
// markdown with the machine, the profile's source and the load averages;
// --csv one row per configuration.
//
// Configurations: gpt-1m, gpt-10m, t5-10m x world 1 and 2 (local backend,
// one rank per thread, one GEMM thread per rank) x DDP and FULL_SHARD. Every
// configuration's trainers are built first; then the measured steps
// alternate between configurations (round r runs one step of each), so
// that a change in the machine's load spreads over all of them. Reported per
// configuration: the median over --steps of the step's wall time (the
// slowest rank's), the median process CPU seconds per rank, the predicted
// (simulated, virtual) step time, and predicted / measured. The load average
// is printed before and after: on a shared machine wall time includes other
// people's work, CPU time does not (but misses waits).
//
// Nothing here feeds back into the profile: the profile is an input, the
// measured step times are the held-out check.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>

#include "benchmarks/util/host_info.h"
#include "benchmarks/util/stats.h"
#include "runtime/comm/local_backend.h"
#include "runtime/core/status.h"
#include "runtime/sim/profile.h"
#include "runtime/train/local_session.h"
#include "runtime/train/sim_run.h"
#include "tools/cli_flags.h"

DEFINE_int32(steps, 5, "measured steps per configuration (medians); >= 1");
DEFINE_string(profile, "cpu-local", "the simulator's profile (calibrated on this machine)");
DEFINE_string(models, "gpt-1m,gpt-10m,t5-10m", "comma-separated model configs");
DEFINE_string(worlds, "1,2", "comma-separated world sizes (local ranks)");
DEFINE_string(report, "", "also write the results as markdown here");
DEFINE_string(csv, "", "also write the results as CSV here");

namespace sk {
namespace {

using bench::CpuModel;
using bench::LoadAverage;
using bench::Median;

struct Config {
  std::string model;
  int world = 1;
  Parallelism parallelism = Parallelism::kFsdp;
  std::unique_ptr<LocalSession> session;  // after Build
  std::vector<double> wall, cpu;
  double predicted = 0;
  std::string error;

  std::string Name() const {
    return model + " world " + std::to_string(world) + " " +
           (parallelism == Parallelism::kDdp ? "DDP" : "FULL_SHARD");
  }
  TrainerOptions Options() const {
    TrainerOptions o;
    o.model = model;
    o.parallelism = parallelism;
    o.fsdp.strategy = ShardingStrategy::kFullShard;
    o.gemm_threads = 1;  // the calibration's: one GEMM thread per rank
    return o;
  }
};

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

Status Predict(Config& c) {
  SimRunOptions s;
  s.trainer = c.Options();
  s.trainer.device.kind = DeviceKind::kSim;
  s.trainer.device.sim_profile = FLAGS_profile;
  s.trainer.device.sim_world_size = c.world;
  s.trainer.device.sim_gpus_per_node = c.world;
  s.warmup_steps = 1;
  s.steps = 1;
  SK_ASSIGN_OR_RETURN(SimStepReport r, SimulateTraining(s));
  if (r.out_of_memory) return ResourceExhaustedError("simulated out of memory: " + r.oom_detail);
  c.predicted = r.step_seconds;
  return OkStatus();
}

Status Build(Config& c) {
  SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(c.world));
  SK_ASSIGN_OR_RETURN(c.session, LocalSession::Create(c.Options(), LocalSession::Share(std::move(groups))));
  return c.session->Step().status();  // warm-up: caches, optimizer state
}

Status Measure(Config& c) {
  std::vector<double> seconds(c.world);
  const double cpu0 = ProcessCpuSeconds();
  SK_RETURN_IF_ERROR(c.session->OnEveryRank([&](int r, Trainer& t) -> Status {
    SK_ASSIGN_OR_RETURN(StepMetrics m, t.Step());
    seconds[r] = m.step_seconds;
    return OkStatus();
  }));
  c.cpu.push_back((ProcessCpuSeconds() - cpu0) / c.world);
  c.wall.push_back(*std::max_element(seconds.begin(), seconds.end()));
  return OkStatus();
}

int Main() {
  if (FLAGS_steps < 1) {
    std::fprintf(stderr, "--steps must be >= 1\n");
    return 2;
  }
  // Worlds are local ranks (threads of this process). atoi read "abc" as 0
  // (every configuration failed, exit 0) and 4294967297 as 1.
  constexpr int kMaxWorld = 1024;
  std::vector<int> worlds;
  for (const std::string& w : cli::SplitList(FLAGS_worlds)) {
    if (w.size() > 4 || w.find_first_not_of("0123456789") != std::string::npos || std::atoi(w.c_str()) < 1 ||
        std::atoi(w.c_str()) > kMaxWorld) {
      std::fprintf(stderr, "--worlds: '%s' is not a world size in [1, %d]\n", w.c_str(), kMaxWorld);
      return 2;
    }
    worlds.push_back(std::atoi(w.c_str()));
  }
  std::vector<Config> configs;
  for (const std::string& m : cli::SplitList(FLAGS_models)) {
    for (int w : worlds) {
      for (Parallelism p : {Parallelism::kDdp, Parallelism::kFsdp}) {
        Config c;
        c.model = m;
        c.world = w;
        c.parallelism = p;
        configs.push_back(std::move(c));
      }
    }
  }
  std::printf("sim_validate: profile %s, %d measured steps per configuration (medians), alternating\n",
              FLAGS_profile.c_str(), FLAGS_steps);
  const std::string load_before = LoadAverage();
  std::printf("load average before: %s\n", load_before.c_str());
  std::string profile_source = "(the profile did not load)";
  if (StatusOr<sim::SimProfile> p = sim::LoadProfile(FLAGS_profile); p.ok()) {
    profile_source = p->description;
  }
  for (Config& c : configs) {
    Status s = Predict(c);
    if (s.ok()) s = Build(c);
    if (!s.ok()) c.error = s.ToString();
  }
  for (int step = 0; step < FLAGS_steps; ++step) {
    for (Config& c : configs) {
      if (!c.error.empty()) continue;
      Status s = Measure(c);
      if (!s.ok()) c.error = s.ToString();
    }
  }
  const std::string load_after = LoadAverage();
  std::printf("load average after:  %s\n\n", load_after.c_str());
  std::ostringstream md, csv;
  md << "| configuration | measured wall s | CPU s per rank | predicted s | predicted / wall | "
        "predicted / CPU |\n|---|---|---|---|---|---|\n";
  csv << "model,world,parallelism,measured_wall_s,cpu_s_per_rank,predicted_s,pred_over_wall,pred_over_cpu,"
         "error\n";
  std::printf("%-28s %12s %12s %12s %10s %10s\n", "configuration", "measured s", "cpu s/rank", "predicted s",
              "pred/meas", "pred/cpu");
  int within = 0, within_cpu = 0, rows = 0;
  for (Config& c : configs) {
    const char* par = c.parallelism == Parallelism::kDdp ? "DDP" : "FULL_SHARD";
    if (!c.error.empty()) {
      std::printf("%-28s error: %s\n", c.Name().c_str(), c.error.c_str());
      md << "| " << c.Name() << " | error: " << c.error << " | | | | |\n";
      std::string e = c.error;
      for (char& ch : e) {
        if (ch == ',' || ch == '\n') ch = ' ';
      }
      csv << c.model << "," << c.world << "," << par << ",,,,,," << e << "\n";
      continue;
    }
    const double wall = Median(c.wall), cpu = Median(c.cpu);
    const double ratio = c.predicted / wall;
    ++rows;
    if (ratio >= 0.85 && ratio <= 1.15) ++within;
    const double ratio_cpu = c.predicted / cpu;
    if (ratio_cpu >= 0.85 && ratio_cpu <= 1.15) ++within_cpu;
    std::printf("%-28s %12.4f %12.4f %12.4f %10.3f %10.3f\n", c.Name().c_str(), wall, cpu, c.predicted, ratio,
                c.predicted / cpu);
    char row[512];
    std::snprintf(row, sizeof(row), "| %s | %.4f | %.4f | %.4f | %.3f | %.3f |\n", c.Name().c_str(), wall, cpu,
                  c.predicted, ratio, ratio_cpu);
    md << row;
    std::snprintf(row, sizeof(row), "%s,%d,%s,%.6f,%.6f,%.6f,%.4f,%.4f,\n", c.model.c_str(), c.world, par, wall, cpu,
                  c.predicted, ratio, ratio_cpu);
    csv << row;
  }
  std::printf("\n%d of %d configurations within +-15%% of the measured wall time, %d of the CPU time per rank\n",
              within, rows, within_cpu);
  bool write_failed = false;  // a requested --report or --csv that cannot be written fails the run
  if (!FLAGS_report.empty()) {
    std::ofstream out(FLAGS_report);
    out << "# Simulator validation on this machine's CPU\n\n"
        << "Each configuration ran for real (local backend, one thread per rank, one GEMM thread per rank; "
        << FLAGS_steps << " measured steps after a warm-up step, medians, configurations alternating step "
           "by step) and on the simulator with the profile `" << FLAGS_profile << "` (" << profile_source
        << "). Measured wall s: the slowest rank's step; CPU s per rank: the process's CPU time over the "
           "step divided by the ranks (excludes time not scheduled, and waits). The issue's target is "
           "predicted / wall within 0.85-1.15 on the machine the profile was measured on, when it is "
           "otherwise idle.\n\n"
        << "Host: " << CpuModel() << ", " << std::thread::hardware_concurrency()
        << " hardware threads; load average " << load_before << " before, " << load_after << " after.\n\n"
        << md.str() << "\n" << within << " of " << rows << " configurations within +-15% of the measured wall "
        << "time, " << within_cpu << " of the CPU time per rank.\n";
    if (!out) {
      std::fprintf(stderr, "sim_validate: cannot write --report=%s\n", FLAGS_report.c_str());
      write_failed = true;
    }
  }
  if (!FLAGS_csv.empty()) {
    std::ofstream out(FLAGS_csv);
    out << csv.str();
    if (!out) {
      std::fprintf(stderr, "sim_validate: cannot write --csv=%s\n", FLAGS_csv.c_str());
      write_failed = true;
    }
  }
  return write_failed ? 1 : 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  sk::cli::ParseFlags(
      "does the simulator predict this machine? sim_validate [--steps=5 --profile=cpu-local]",
      __FILE__, &argc, &argv);
  return sk::Main();
}
