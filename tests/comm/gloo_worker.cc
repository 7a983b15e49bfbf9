// A rank program for the launcher tests: forms the world gloo group from
// torchrun's variables and runs one scenario. Exit code 0 means the scenario
// behaved as specified; every rank prints what it saw.
//
//   gloo_worker collectives          every op x {f32, bf16} x sizes {0, 1, 1001}
//   gloo_worker exit_mid_collective  the last rank exits (code 0) in the middle
//                                    of an all_gather; the others must fail
//                                    with Unavailable/DeadlineExceeded in time
//   gloo_worker exit_mid_collective_sigpipe
//                                    the same with SIGPIPE's default action (a rank
//                                    not started by our launcher, e.g. by torchrun):
//                                    no survivor may die of SIGPIPE
//   gloo_worker crash                rank 1 exits with code 3; the others sleep
//                                    (no communication) until the launcher stops them
//   gloo_worker hang                 the last rank stops itself (SIGSTOP); the
//                                    others time out in an all_gather and exit 1
//   gloo_worker held_up_stop|held_up_kill
//                                    the last rank stops (kills) itself while the
//                                    others wait for it, ranks 1..N-2 in a
//                                    sub-group; each prints its error and exits 1
//   gloo_worker disagree <kind>      rank 0 and rank 1 make calls that differ in
//                                    <kind> (see Disagree); both must return an
//                                    error (never crash) and the group must still
//                                    be destroyable
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "runtime/comm/gloo_backend.h"
#include "tests/comm/conformance.h"

namespace sk::comm {
namespace {

using namespace std::chrono_literals;

int Fail(int rank, const std::string& what) {
  std::printf("rank %d FAILED: %s\n", rank, what.c_str());
  return 1;
}

float Expected(CollectiveKind kind, DType dt, int rank, int world, int64_t n, int64_t i) {
  std::vector<float> per_rank(world);
  switch (kind) {
    case CollectiveKind::kAllGather:
      return testing::InputValue(dt, static_cast<int>(i / n), i % n);
    case CollectiveKind::kReduceScatter:
      for (int j = 0; j < world; ++j) per_rank[j] = testing::InputValue(dt, j, rank * n + i);
      return testing::ReferenceReduce(per_rank, dt, ReduceOp::kSum, 1, 1);
    case CollectiveKind::kAllReduce:
      for (int j = 0; j < world; ++j) per_rank[j] = testing::InputValue(dt, j, i);
      return testing::ReferenceReduce(per_rank, dt, ReduceOp::kSum, 1, 1);
    default:
      return testing::InputValue(dt, 0, i);  // broadcast from root 0
  }
}

int Collectives(ProcessGroup& pg) {
  const int rank = pg.rank(), world = pg.size();
  auto stream = testing::MakeStream(0, "comm");
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllReduce, CollectiveKind::kBroadcast}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (int64_t n : {0, 1, 1001}) {
        int64_t in_n = kind == CollectiveKind::kReduceScatter ? n * world : n;
        int64_t out_n = kind == CollectiveKind::kAllGather ? n * world : n;
        Tensor in = testing::MakeTensor(0, dt, in_n);
        Tensor out = testing::MakeTensor(0, dt, out_n);
        bool in_place = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kBroadcast;
        Tensor& src = in_place ? out : in;
        for (int64_t i = 0; i < in_n; ++i) StoreFromFloat(src.data(), dt, i, testing::InputValue(dt, rank, i));
        StatusOr<std::shared_ptr<Work>> w = InternalError("unset");
        if (kind == CollectiveKind::kAllGather) w = pg.all_gather(out, in, *stream);
        if (kind == CollectiveKind::kReduceScatter) w = pg.reduce_scatter(out, in, *stream);
        if (kind == CollectiveKind::kAllReduce) w = pg.all_reduce(out, *stream);
        if (kind == CollectiveKind::kBroadcast) w = pg.broadcast(out, *stream);
        if (!w.ok()) return Fail(rank, w.status().ToString());
        Status s = (*w)->wait(60s);
        if (!s.ok()) return Fail(rank, s.ToString());
        std::vector<float> got = testing::Values(out);
        for (int64_t i = 0; i < out_n; ++i) {
          float want = Expected(kind, dt, rank, world, n, i);
          if (FloatBits(got[i]) != FloatBits(want)) {
            return Fail(rank, std::string(CollectiveName(kind)) + " " + std::string(DTypeName(dt)) +
                                  " n=" + std::to_string(n) + " element " + std::to_string(i) +
                                  ": got " + std::to_string(got[i]) + " want " + std::to_string(want));
          }
        }
      }
    }
  }
  std::printf("rank %d of %d: all collectives match the reference\n", rank, world);
  return 0;
}

int ExitMidCollective(ProcessGroup& pg) {
  const int rank = pg.rank(), world = pg.size();
  auto stream = testing::MakeStream(0, "comm");
  auto b = pg.barrier(*stream, CollectiveOptions{30s});
  if (!b.ok() || !(*b)->wait(30s).ok()) return Fail(rank, "first barrier");
  // A long train of all_gathers: the last rank leaves as soon as the first
  // has completed, so it leaves with the rest in flight on its stream, and
  // the others cannot complete them all.
  constexpr int kTrain = 100;
  const int64_t n = 1 << 20;  // 4 MiB per rank per collective
  Tensor in = testing::MakeTensor(0, DType::kF32, n);
  Tensor out = testing::MakeTensor(0, DType::kF32, n * world);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < kTrain; ++k) {
    auto w = pg.all_gather(out, in, *stream, CollectiveOptions{10s});
    if (!w.ok()) return Fail(rank, w.status().ToString());
    works.push_back(*w);
  }
  if (rank == world - 1) {
    if (!works[0]->wait(30s).ok()) return Fail(rank, "first all_gather");
    std::printf("rank %d leaving mid-collective (%s)\n", rank,
                works.back()->is_completed() ? "all done?!" : "the rest in flight");
    std::fflush(stdout);
    std::_Exit(0);
  }
  Status s;
  for (auto& w : works) {
    s = w->wait(60s);
    if (!s.ok()) break;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kDeadlineExceeded) {
    return Fail(rank, "expected Unavailable or DeadlineExceeded, got " + s.ToString());
  }
  if (secs > 15) return Fail(rank, "failure took " + std::to_string(secs) + " s");
  std::printf("rank %d failed as expected after %.1f s: %s\n", rank, secs, s.ToString().c_str());
  std::fflush(stdout);
  // The broken group must still be destroyable without hanging.
  return 0;
}

int Crash(ProcessGroup& pg) {
  auto stream = testing::MakeStream(0, "comm");
  auto b = pg.barrier(*stream, CollectiveOptions{30s});
  if (!b.ok() || !(*b)->wait(30s).ok()) return Fail(pg.rank(), "first barrier");
  if (pg.rank() == 1) {
    std::printf("rank 1 crashing\n");
    std::fflush(stdout);
    std::_Exit(3);
  }
  // Busy with something other than communication, which would notice the
  // dead peer by itself: only the launcher can stop this rank in time.
  std::this_thread::sleep_for(120s);
  std::printf("rank %d was not stopped by the launcher\n", pg.rank());
  std::fflush(stdout);
  std::_Exit(0);  // skip the final barrier: this line must never be reached in the test
}

// The last rank stops itself (SIGSTOP: a hung peer) after the first
// barrier; the others' next all_gather times out, they print the error and
// exit 1. Issue 14, item 9: the launcher then blamed rank 0 (the first to
// exit), a healthy rank; it must name the stopped one.
int Hang(ProcessGroup& pg) {
  auto stream = testing::MakeStream(0, "comm");
  auto b = pg.barrier(*stream, CollectiveOptions{30s});
  if (!b.ok() || !(*b)->wait(30s).ok()) return Fail(pg.rank(), "first barrier");
  if (pg.rank() == pg.size() - 1) {
    std::printf("rank %d stopping itself\n", pg.rank());
    std::fflush(stdout);
    ::raise(SIGSTOP);
    std::_Exit(0);  // SIGCONT: leave without the final barrier
  }
  // Rank 0 fails first (a shorter timeout), as the first healthy rank to
  // time out would.
  const auto timeout = pg.rank() == 0 ? 1500ms : 4000ms;
  Tensor in = testing::MakeTensor(0, DType::kF32, 4);
  Tensor out = testing::MakeTensor(0, DType::kF32, 4 * pg.size());
  auto w = pg.all_gather(out, in, *stream, CollectiveOptions{timeout});
  Status s = w.ok() ? (*w)->wait(30s) : w.status();
  std::printf("rank %d: %s\n", pg.rank(), s.ToString().c_str());
  std::fflush(stdout);
  std::_Exit(s.ok() ? 0 : 1);
}

// The last rank stops (SIGSTOP) or kills itself while ranks 1..N-2 wait for
// it in a sub-group of ranks 1..N-1, and rank 0 waits in a world all_gather
// for everyone: ranks 1..N-2 are alive but held up, so they do not arrive
// in rank 0's collective either. Issue 35: every error named them too.
int HeldUp(ProcessGroup& pg, bool kill) {
  auto stream = testing::MakeStream(0, "comm");
  const int victim = pg.size() - 1;
  std::unique_ptr<ProcessGroup> rest;
  if (pg.rank() > 0) {
    std::vector<int> ranks;
    for (int r = 1; r < pg.size(); ++r) ranks.push_back(r);
    auto g = pg.NewGroup(ranks, 30s);
    if (!g.ok()) return Fail(pg.rank(), "forming ranks 1..N-1");
    rest = std::move(g).value();
  }
  auto b = pg.barrier(*stream, CollectiveOptions{30s});
  if (!b.ok() || !(*b)->wait(30s).ok()) return Fail(pg.rank(), "first barrier");
  if (pg.rank() == victim) {
    std::printf("rank %d %s itself\n", pg.rank(), kill ? "killing" : "stopping");
    std::fflush(stdout);
    if (!kill && ::fork() == 0) {
      // Resumes the stopped rank once the others have reported, so that a
      // launcher that lets every rank finish (--on_failure=wait) ends.
      std::this_thread::sleep_for(8s);
      ::kill(::getppid(), SIGCONT);
      std::_Exit(0);
    }
    ::raise(kill ? SIGKILL : SIGSTOP);
    std::_Exit(0);  // SIGCONT: leave without the final barrier
  }
  ProcessGroup& g = pg.rank() == 0 ? pg : *rest;
  Tensor in = testing::MakeTensor(0, DType::kF32, 4);
  Tensor out = testing::MakeTensor(0, DType::kF32, 4 * g.size());
  auto w = g.all_gather(out, in, *stream, CollectiveOptions{3000ms});
  Status s = w.ok() ? (*w)->wait(30s) : w.status();
  std::printf("rank %d: %s\n", pg.rank(), s.ToString().c_str());
  std::fflush(stdout);
  // Rank 0 serves the store the others read heartbeats from: it stays until
  // they have reported, as it would under a launcher that had not stopped it.
  if (pg.rank() == 0) std::this_thread::sleep_for(5s);
  std::_Exit(s.ok() ? 0 : 1);
}

// Rank 0 and rank 1 call collectives that disagree in one way. Issue 14,
// item 1: gloo's I/O thread enforced message sizes with an exception nobody
// could catch, killing the receiving rank (SIGABRT) in 9 of 19 such kinds.
int Disagree(ProcessGroup& pg, const std::string& kind) {
  const int rank = pg.rank();
  auto stream = testing::MakeStream(0, "comm");
  const CollectiveOptions co{std::chrono::seconds(5)};
  ReduceOptions ro;
  ro.timeout = co.timeout;
  BroadcastOptions bo;
  bo.timeout = co.timeout;
  const bool odd = rank % 2 == 1;
  auto tensor = [&](DType dt, int64_t n) { return testing::MakeTensor(0, dt, n); };
  const int world = pg.size();
  StatusOr<std::shared_ptr<Work>> w = InternalError("unknown kind '" + kind + "'");
  if (kind == "all_gather_size") {
    const int64_t n = odd ? 4096 : 100;
    w = pg.all_gather(tensor(DType::kF32, n * world), tensor(DType::kF32, n), *stream, co);
  } else if (kind == "all_gather_dtype") {
    const DType dt = odd ? DType::kF32 : DType::kBF16;
    w = pg.all_gather(tensor(dt, 1000 * world), tensor(dt, 1000), *stream, co);
  } else if (kind == "reduce_scatter_size") {
    const int64_t n = odd ? 5000 : 50;
    w = pg.reduce_scatter(tensor(DType::kF32, n), tensor(DType::kF32, n * world), *stream, ro);
  } else if (kind == "all_reduce_size") {
    w = pg.all_reduce(tensor(DType::kF32, odd ? 10000 : 10), *stream, ro);
  } else if (kind == "broadcast_size") {
    w = pg.broadcast(tensor(DType::kF32, odd ? 10000 : 10), *stream, bo);
  } else if (kind == "broadcast_root") {
    bo.root = odd ? 1 : 0;
    w = pg.broadcast(tensor(DType::kF32, 100), *stream, bo);
  } else if (kind == "kind") {  // one rank steps (all_gather) while the other evaluates (all_reduce)
    w = odd ? pg.all_reduce(tensor(DType::kF32, 3000), *stream, ro)
            : pg.all_gather(tensor(DType::kF32, 100 * world), tensor(DType::kF32, 100), *stream, co);
  } else if (kind == "coalesced_count") {
    std::vector<Tensor> outs = {tensor(DType::kF32, 64 * world)}, ins = {tensor(DType::kF32, 64)};
    if (odd) {
      outs.push_back(tensor(DType::kF32, 4096 * world));
      ins.push_back(tensor(DType::kF32, 4096));
    }
    w = pg.all_gather_coalesced(outs, ins, *stream, co);
  }
  Status s = w.ok() ? (*w)->wait(std::chrono::seconds(30)) : w.status();
  if (s.ok()) return Fail(rank, "the disagreeing call '" + kind + "' succeeded");
  if (s.code() != StatusCode::kInvalidArgument && s.code() != StatusCode::kDeadlineExceeded &&
      s.code() != StatusCode::kUnavailable) {
    return Fail(rank, "unexpected error for '" + kind + "': " + s.ToString());
  }
  std::printf("rank %d: disagreement reported: %s\n", rank, s.ToString().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace sk::comm

int main(int argc, char** argv) {
  if (argc < 2 || (std::string(argv[1]) == "disagree") != (argc == 3) || argc > 3) {
    std::fprintf(stderr, "usage: gloo_worker collectives|exit_mid_collective|crash|hang|held_up_stop|held_up_kill|disagree <kind>\n");
    return 2;
  }
  std::string mode = argv[1];
  // Our launcher ignores SIGPIPE for its ranks; torchrun does not.
  if (mode == "exit_mid_collective_sigpipe") ::signal(SIGPIPE, SIG_DFL);
  sk::comm::GlooOptions options;
  options.timeout = std::chrono::seconds(30);
  auto pg = sk::comm::GlooProcessGroup::CreateFromEnvironment(options);
  if (!pg.ok()) {
    std::fprintf(stderr, "cannot form the group: %s\n", pg.status().ToString().c_str());
    return 1;
  }
  int rc = 2;
  if (mode == "collectives") rc = sk::comm::Collectives(**pg);
  if (mode == "exit_mid_collective" || mode == "exit_mid_collective_sigpipe") {
    rc = sk::comm::ExitMidCollective(**pg);
  }
  if (mode == "crash") rc = sk::comm::Crash(**pg);
  if (mode == "hang") rc = sk::comm::Hang(**pg);
  if (mode == "held_up_stop" || mode == "held_up_kill") rc = sk::comm::HeldUp(**pg, mode == "held_up_kill");
  if (mode == "disagree") rc = sk::comm::Disagree(**pg, argv[2]);
  std::fflush(stdout);
  return rc;
}
