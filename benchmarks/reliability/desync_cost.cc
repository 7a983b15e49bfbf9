// desync_cost: what the always-on desync check of the gloo backend costs.
//
// Before its payload, every gloo collective exchanges each rank's call
// fingerprint (sizeof(CallFingerprint) bytes) with every peer: one
// all-gather of that size on the same direct pairwise exchange the payload
// uses. The check cannot be switched off, so its cost is measured through a
// collective made of exactly two such exchanges: an all_gather whose payload
// is also sizeof(CallFingerprint) bytes per rank costs one fingerprint
// exchange plus one payload exchange of the same size, so
//   per-collective cost ~= median(all_gather of that size) / 2.
// Per step it is that times the collectives of a gpt-tiny FULL_SHARD step
// (counted from FSDP's counters plus the loss average), against the median
// step time, all over gloo with world 2 (two rank threads, loopback TCP).
//
//   ./bazelw run -c opt //benchmarks:desync_cost -- [--iterations=2000] [--steps=40]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "benchmarks/util/stats.h"
#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/store.h"
#include "runtime/comm/work.h"
#include "runtime/device/device.h"
#include "runtime/core/allocator.h"
#include "runtime/train/trainer.h"
#include "tools/cli_flags.h"

DEFINE_int32(iterations, 2000, "all_gathers of fingerprint size to time");
DEFINE_int32(steps, 40, "gpt-tiny steps to time (after 5 warm-up steps)");

namespace sk {
namespace {

using bench::UpperMedian;

using Clock = std::chrono::steady_clock;

// Upper bounds of the flags: every timed all_gather and step keeps a sample.
constexpr int kMaxIterations = 10'000'000;
constexpr int kMaxSteps = 1'000'000;

int Main() {
  // --steps=0 divided by zero (SIGFPE); --iterations=2147483647 overflowed
  // the loop bound (+100 warm-up) and printed a median of nothing.
  if (FLAGS_iterations < 1 || FLAGS_iterations > kMaxIterations) {
    std::fprintf(stderr, "desync_cost: --iterations must be in [1, %d], got %d\n", kMaxIterations,
                 FLAGS_iterations);
    return 2;
  }
  if (FLAGS_steps < 1 || FLAGS_steps > kMaxSteps) {
    std::fprintf(stderr, "desync_cost: --steps must be in [1, %d], got %d\n", kMaxSteps, FLAGS_steps);
    return 2;
  }
  constexpr int kWorld = 2;
  auto server = comm::TcpStore::Create("127.0.0.1", 0, /*serve=*/true, std::chrono::seconds(30));
  if (!server.ok()) {
    std::fprintf(stderr, "desync_cost: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->port();
  const size_t fp_bytes = sizeof(comm::CallFingerprint);
  std::vector<double> small_us, step_ms;
  int64_t collectives_per_step = 0;
  Status s = comm::RunRankThreads(kWorld, [&](int rank) -> Status {
    SK_ASSIGN_OR_RETURN(auto store, comm::TcpStore::Create("127.0.0.1", port, false, std::chrono::seconds(30)));
    SK_ASSIGN_OR_RETURN(auto world, comm::GlooProcessGroup::Create(std::shared_ptr<comm::Store>(std::move(store)),
                                                                   "desync_cost", rank, kWorld));
    SK_ASSIGN_OR_RETURN(Device * device, Device::Get(DeviceId::Cpu(rank)));
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream("comm"));
    const int64_t n = static_cast<int64_t>(fp_bytes / sizeof(float));
    SK_ASSIGN_OR_RETURN(Tensor in, HostAllocator::Default().Empty(DType::kF32, Shape{n}));
    SK_ASSIGN_OR_RETURN(Tensor out, HostAllocator::Default().Empty(DType::kF32, Shape{n * kWorld}));
    for (int i = 0; i < FLAGS_iterations + 100; ++i) {
      const auto t0 = Clock::now();
      SK_ASSIGN_OR_RETURN(auto w, world->all_gather(out, in, *stream));
      SK_RETURN_IF_ERROR(w->wait());
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (rank == 0 && i >= 100) small_us.push_back(us);
    }
    TrainerOptions o;
    o.model = "gpt-tiny";
    o.batch_size = 2;
    o.gemm_threads = 1;
    SK_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(o, world.get()));
    for (int i = 0; i < 5; ++i) SK_RETURN_IF_ERROR(trainer->Step().status());
    const FsdpCounters before = trainer->fsdp()->counters();
    for (int i = 0; i < FLAGS_steps; ++i) {
      SK_ASSIGN_OR_RETURN(StepMetrics m, trainer->Step());
      if (rank == 0) step_ms.push_back(m.step_seconds * 1e3);
    }
    const FsdpCounters& after = trainer->fsdp()->counters();
    if (rank == 0) {
      const int64_t total = (after.all_gathers - before.all_gathers) +
                            (after.reduce_scatters - before.reduce_scatters) +
                            (after.all_reduces - before.all_reduces);
      collectives_per_step = total / FLAGS_steps + 1;  // + the loss average over ranks
    }
    return OkStatus();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "desync_cost: %s\n", s.ToString().c_str());
    return 1;
  }
  const double small = UpperMedian(small_us);
  const double per_collective_us = small / 2;
  const double step = UpperMedian(step_ms);
  const double per_step_ms = per_collective_us * collectives_per_step / 1e3;
  std::printf("desync_cost (gloo, world 2, loopback; one run, shared machine):\n");
  std::printf("  all_gather of %zu B per rank (fingerprint + payload exchange): median %.1f us over %d\n",
              fp_bytes, small, FLAGS_iterations);
  std::printf("  => fingerprint exchange per collective ~ %.1f us\n", per_collective_us);
  std::printf("  gpt-tiny FULL_SHARD step: median %.2f ms over %d, %lld collectives per step\n", step,
              FLAGS_steps, static_cast<long long>(collectives_per_step));
  std::printf("  => desync check per step ~ %.3f ms = %.1f%% of the step\n", per_step_ms,
              100.0 * per_step_ms / step);
  return 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  sk::cli::ParseFlags(
      "what the gloo backend's always-on desync check costs per collective",
      __FILE__, &argc, &argv);
  return sk::Main();
}
