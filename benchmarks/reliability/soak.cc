// soak: a long gpt-tiny training run over gloo (world 2: two rank threads of
// this process, connected through loopback TCP like two processes) that
// samples the process's resident set size every --every steps and reports
// the slope of RSS over steps after a warm-up (least squares over the
// samples past --warmup), so a leak of a few bytes per step shows.
//
//   ./bazelw run -c opt //benchmarks:soak -- --steps=10000 --every=100
//
// Output: one "rss STEP BYTES" line per sample, then a summary:
//   slope B/step, growth over the measured window, and the verdict against
//   --max_slope (bytes per step; default 64: the FSDP log that leaked grew
//   by 32 bytes per step per rank). Exit code 1 when the slope exceeds it.
//
// Fault injection (issue 35): --oom_trials=N runs, instead, N trials on a
// local group of --oom_world ranks: each makes one randomly chosen rank run
// out of memory at a randomly chosen allocation of a step
// (CachingAllocator::InjectOutOfMemoryAfter, anywhere: FSDP's hooks, the
// model's compute, clipping), then steps again. It counts the trials where
// every rank's step failed with ResourceExhausted naming the rank that ran
// out ("rank R failed step S"), errors naming another rank, stuck trainers
// (a rank whose next step failed) and hangs (a failed step that took longer
// than --oom_timeout_ms, the collectives' timeout). Exit code 1 unless all
// trials were clean.
//
// Peer faults (issue 35): --fault_trials=N kills or stops one gloo rank
// process per trial and counts which ranks the survivors' errors name; see
// benchmarks/reliability/peer_faults.h.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "benchmarks/reliability/peer_faults.h"
#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/store.h"
#include "runtime/train/trainer.h"
#include "tools/cli_flags.h"

DEFINE_int64(steps, 10000, "training steps");
DEFINE_int64(every, 100, "sample RSS every this many steps");
DEFINE_int64(warmup, 1000, "steps before the slope is measured (allocator caches, first-touch)");
DEFINE_double(max_slope, 64, "largest acceptable RSS slope in bytes per step");
DEFINE_int64(oom_trials, 0, "fault injection instead of the RSS run: this many out-of-memory trials (1..100000)");
DEFINE_int32(oom_world, 2, "ranks of the local group the out-of-memory trials run on (2..8)");
DEFINE_uint64(oom_seed, 1, "seed choosing each trial's rank and allocation");
DEFINE_int64(oom_timeout_ms, 10000, "the collectives' timeout in the trials; a failed step taking longer is a hang");

namespace sk {
namespace {

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// One rank's view of one out-of-memory trial.
struct TrialResult {
  bool failed = false;       // the step failed
  bool right_error = false;  // ResourceExhausted naming the rank that ran out
  bool stuck = false;        // the next step failed
  double seconds = 0;        // the failed step's duration
  std::string message;
};

int OomTrials() {
  if (FLAGS_oom_trials < 1 || FLAGS_oom_trials > 100000 || FLAGS_oom_world < 2 || FLAGS_oom_world > 8 ||
      FLAGS_oom_timeout_ms < 100 || FLAGS_oom_timeout_ms > 600000) {
    std::fprintf(stderr, "soak: need 1 <= --oom_trials <= 100000, 2 <= --oom_world <= 8, "
                         "100 <= --oom_timeout_ms <= 600000\n");
    return 2;
  }
  const int world = FLAGS_oom_world;
  const int64_t trials = FLAGS_oom_trials;
  // Drawn up front so every rank knows the plan: the rank that runs out, and
  // where in its step (a fraction of its allocations per step).
  std::mt19937_64 rng(FLAGS_oom_seed);
  std::vector<int> target(trials);
  std::vector<double> where(trials);
  for (int64_t i = 0; i < trials; ++i) {
    target[i] = static_cast<int>(rng() % static_cast<uint64_t>(world));
    where[i] = std::uniform_real_distribution<double>(0, 1)(rng);
  }
  std::vector<std::vector<TrialResult>> results(trials, std::vector<TrialResult>(world));
  Status s = comm::RunLocalRanks(world, [&](int rank, comm::ProcessGroup* group) -> Status {
    TrainerOptions o;
    o.model = "gpt-tiny";
    o.batch_size = 2;
    o.gemm_threads = 1;
    o.optimizer.lr = 1e-3f;
    o.fsdp.timeout = Duration(FLAGS_oom_timeout_ms);
    SK_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(o, group));
    SK_RETURN_IF_ERROR(trainer->Step().status());
    const int64_t before = trainer->allocator().stats().num_allocs;
    SK_RETURN_IF_ERROR(trainer->Step().status());
    const int64_t per_step = trainer->allocator().stats().num_allocs - before;
    for (int64_t i = 0; i < trials; ++i) {
      TrialResult& r = results[i][rank];
      if (rank == target[i]) {
        trainer->allocator().InjectOutOfMemoryAfter(static_cast<int64_t>(where[i] * static_cast<double>(per_step)));
      }
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<StepMetrics> step = trainer->Step();
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      trainer->allocator().InjectOutOfMemoryAfter(-1);
      r.failed = !step.ok();
      if (r.failed) {
        r.message = std::string(step.status().message());
        r.right_error = step.status().code() == StatusCode::kResourceExhausted &&
                        r.message.find("rank " + std::to_string(target[i]) + " failed step") == 0;
      }
      r.stuck = !trainer->Step().ok();
    }
    return OkStatus();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "soak: %s\n", s.ToString().c_str());
    return 1;
  }
  int64_t clean = 0, not_failed = 0, wrong = 0, stuck = 0, hangs = 0;
  double longest = 0;
  for (int64_t i = 0; i < trials; ++i) {
    bool all_right = true;
    for (int r = 0; r < world; ++r) {
      const TrialResult& t = results[i][r];
      longest = std::max(longest, t.seconds);
      if (!t.failed) ++not_failed;
      if (t.failed && !t.right_error) {
        ++wrong;
        if (wrong <= 3) std::printf("trial %lld rank %d: %s\n", static_cast<long long>(i), r, t.message.c_str());
      }
      if (t.stuck) ++stuck;
      if (t.seconds * 1000 >= static_cast<double>(FLAGS_oom_timeout_ms)) ++hangs;
      all_right = all_right && t.right_error && !t.stuck;
    }
    if (all_right) ++clean;
  }
  std::printf(
      "oom: %lld trials, local group of %d, seed %llu: %lld clean (every rank's step failed with the "
      "out-of-memory rank's ResourceExhausted naming it, and the next step worked on every rank); rank-steps "
      "that did not fail: %lld; errors not naming the rank that ran out: %lld; stuck trainers: %lld; hangs: "
      "%lld; longest failed step %.3f s (timeout %.1f s)\n",
      static_cast<long long>(trials), world, static_cast<unsigned long long>(FLAGS_oom_seed),
      static_cast<long long>(clean), static_cast<long long>(not_failed), static_cast<long long>(wrong),
      static_cast<long long>(stuck), static_cast<long long>(hangs), longest, FLAGS_oom_timeout_ms / 1000.0);
  return clean == trials ? 0 : 1;
}

int Main() {
  if (FLAGS_oom_trials != 0) return OomTrials();
  // FLAGS_every is compared by division: 2 * every overflowed for a huge
  // --every, which then trained every step before failing.
  if (FLAGS_every < 1 || FLAGS_steps / 2 < FLAGS_every || FLAGS_warmup < 0 || FLAGS_warmup >= FLAGS_steps) {
    std::fprintf(stderr, "soak: need steps >= 2 * every, every >= 1, 0 <= warmup < steps\n");
    return 2;
  }
  // Samples are taken at multiples of --every; the slope needs two past the
  // warm-up. Known now, not after training all the steps.
  const int64_t samples_past_warmup = FLAGS_steps / FLAGS_every - FLAGS_warmup / FLAGS_every;
  if (samples_past_warmup < 2) {
    std::fprintf(stderr,
                 "soak: --steps=%lld --every=%lld --warmup=%lld leave %lld RSS sample(s) past the warm-up; the "
                 "slope needs two (lower --warmup or --every)\n",
                 static_cast<long long>(FLAGS_steps), static_cast<long long>(FLAGS_every),
                 static_cast<long long>(FLAGS_warmup), static_cast<long long>(samples_past_warmup));
    return 2;
  }
  // A negative bound would call every run GROWING (and printed as a
  // 300-digit number for -1e300).
  if (!std::isfinite(FLAGS_max_slope) || FLAGS_max_slope < 0) {
    std::fprintf(stderr, "soak: --max_slope must be a finite number of bytes per step >= 0, got %g\n",
                 FLAGS_max_slope);
    return 2;
  }
  constexpr int kWorld = 2;
  auto server = comm::TcpStore::Create("127.0.0.1", 0, /*serve=*/true, std::chrono::seconds(30));
  if (!server.ok()) {
    std::fprintf(stderr, "soak: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->port();
  std::vector<std::pair<int64_t, int64_t>> samples;  // step, rss (rank 0 samples)
  std::vector<Status> errors;
  Status s = comm::RunRankThreads(kWorld, [&](int rank) -> Status {
    SK_ASSIGN_OR_RETURN(auto store, comm::TcpStore::Create("127.0.0.1", port, false, std::chrono::seconds(30)));
    SK_ASSIGN_OR_RETURN(auto world, comm::GlooProcessGroup::Create(std::shared_ptr<comm::Store>(std::move(store)),
                                                                   "soak", rank, kWorld));
    TrainerOptions o;
    o.model = "gpt-tiny";
    o.batch_size = 2;
    o.gemm_threads = 1;
    o.optimizer.lr = 1e-3f;
    SK_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(o, world.get()));
    for (int64_t step = 1; step <= FLAGS_steps; ++step) {
      SK_ASSIGN_OR_RETURN(StepMetrics m, trainer->Step());
      if (rank == 0 && step % FLAGS_every == 0) {
        const int64_t rss = RssBytes();
        samples.emplace_back(step, rss);
        std::printf("rss %lld %lld loss %.4f\n", static_cast<long long>(step), static_cast<long long>(rss),
                    m.global_loss);
        std::fflush(stdout);
      }
    }
    return OkStatus();
  }, &errors);
  if (!s.ok()) {
    std::fprintf(stderr, "soak: %s\n", s.ToString().c_str());
    return 1;
  }
  // Least-squares slope of RSS over steps, past the warm-up.
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  int64_t first = -1, last = -1, lo = INT64_MAX, hi = 0;
  for (const auto& [step, rss] : samples) {
    if (step <= FLAGS_warmup) continue;
    if (first < 0) first = rss;
    last = rss;
    lo = std::min(lo, rss);
    hi = std::max(hi, rss);
    n += 1;
    sx += step;
    sy += rss;
    sxx += static_cast<double>(step) * step;
    sxy += static_cast<double>(step) * rss;
  }
  if (n < 2) {
    std::fprintf(stderr, "soak: fewer than two samples past the warm-up\n");
    return 2;
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  std::printf(
      "soak: %lld steps of gpt-tiny, world 2 over gloo; RSS sampled every %lld steps; past step %lld: "
      "first %.2f MiB, last %.2f MiB, min %.2f MiB, max %.2f MiB; slope %.3f B/step (bound %.0f): %s\n",
      static_cast<long long>(FLAGS_steps), static_cast<long long>(FLAGS_every),
      static_cast<long long>(FLAGS_warmup), first / 1048576.0, last / 1048576.0, lo / 1048576.0,
      hi / 1048576.0, slope, FLAGS_max_slope, slope <= FLAGS_max_slope ? "FLAT" : "GROWING");
  return slope <= FLAGS_max_slope ? 0 : 1;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  sk::cli::ParseFlags(
      "long gloo training run reporting RSS growth per step: soak --steps=10000 --every=100; "
      "or out-of-memory fault injection: soak --oom_trials=200; "
      "or peer faults: soak --fault_trials=20 --fault_world=3 --fault_signal=kill|stop --fault_phase=step|load",
      __FILE__, &argc, &argv);
  if (sk::bench::PeerFaultsRequested()) return sk::bench::RunPeerFaults("/proc/self/exe");
  return sk::Main();
}
