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
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/store.h"
#include "runtime/train/trainer.h"
#include "tools/cli_flags.h"

DEFINE_int64(steps, 10000, "training steps");
DEFINE_int64(every, 100, "sample RSS every this many steps");
DEFINE_int64(warmup, 1000, "steps before the slope is measured (allocator caches, first-touch)");
DEFINE_double(max_slope, 64, "largest acceptable RSS slope in bytes per step");

namespace sk {
namespace {

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

int Main() {
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
      "long gloo training run reporting RSS growth per step: soak --steps=10000 --every=100",
      __FILE__, &argc, &argv);
  return sk::Main();
}
