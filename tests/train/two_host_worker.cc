// One rank of the two-host test (two_host_test.sh): the world gloo group from
// torchrun's variables, listening on HOST_ADDR (this "host's" veth address),
// a gpt-tiny Trainer under HYBRID_SHARD with shard groups of
// LOCAL_WORLD_SIZE ranks (inside a host), and a run of steps.
//
//   two_host_worker STEPS TIMEOUT_MS DIR MODE
//     MODE = plain    train steps 1..STEPS
//            save:K   ... and save a checkpoint to DIR/ckpt after step K
//            pause:P  ... before step P, create DIR/paused.RANK and wait for
//                     DIR/go (the test takes the link down meanwhile)
//            resume   load DIR/ckpt first, then train to STEPS
//   (save and pause combine: "save:4,pause:6")
//
// Prints "loss STEP %a" (exact) for every step, and on failure one line
// "error: STATUS" and exits 3.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "runtime/comm/gloo_backend.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

using Clock = std::chrono::steady_clock;

// Prints the error (and how long the failing call took) and leaves at once:
// the group's destructor would wait another timeout for a final barrier
// with peers that are unreachable.
int Fail(const Status& s, Clock::time_point since = Clock::now()) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
  std::printf("error after %lld ms: %s\n", static_cast<long long>(ms), s.ToString().c_str());
  std::fflush(stdout);
  std::_Exit(3);
}

int Main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: two_host_worker STEPS TIMEOUT_MS DIR MODE\n");
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const Duration timeout(std::atoll(argv[2]));
  const std::string dir = argv[3];
  const std::string mode = argv[4];
  int save_at = -1, pause_at = -1;
  const bool resume = mode == "resume";
  if (auto p = mode.find("save:"); p != std::string::npos) save_at = std::atoi(mode.c_str() + p + 5);
  if (auto p = mode.find("pause:"); p != std::string::npos) pause_at = std::atoi(mode.c_str() + p + 6);

  comm::GlooOptions go;
  if (const char* h = std::getenv("HOST_ADDR")) go.hostname = h;
  go.timeout = timeout;
  StatusOr<std::unique_ptr<comm::GlooProcessGroup>> world = comm::GlooProcessGroup::CreateFromEnvironment(go);
  if (!world.ok()) return Fail(world.status());
  const int rank = (*world)->rank();

  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 2;
  o.data_tokens = 4096;
  o.optimizer.lr = 3e-3f;
  o.fsdp.strategy = ShardingStrategy::kHybridShard;  // shard groups: LOCAL_WORLD_SIZE
  o.fsdp.timeout = timeout;
  o.gemm_threads = 1;
  StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o, world->get());
  if (!t.ok()) return Fail(t.status());
  if (resume) {
    Status s = (*t)->LoadCheckpoint(dir + "/ckpt");
    if (!s.ok()) return Fail(s);
  }
  for (int step = static_cast<int>((*t)->steps()) + 1; step <= steps; ++step) {
    if (step == pause_at) {
      std::ofstream(dir + "/paused." + std::to_string(rank)) << "paused\n";
      while (::access((dir + "/go").c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    const auto start = Clock::now();
    StatusOr<StepMetrics> m = (*t)->Step();
    if (!m.ok()) return Fail(m.status(), start);
    std::printf("loss %d %a\n", step, m->global_loss);
    std::fflush(stdout);
    if (step == save_at) {
      Status s = (*t)->SaveCheckpoint(dir + "/ckpt");
      if (!s.ok()) return Fail(s);
    }
  }
  std::printf("done\n");
  return 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) { return sk::Main(argc, argv); }
