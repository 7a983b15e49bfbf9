// One rank of gloo_oom_test: the world gloo group from torchrun's variables,
// two gpt-tiny Trainers on it (one as the reference for a step that never
// failed), and trials in which rank 1 alone gets a memory cap below its
// step's peak, so it runs out partway through a step.
//
//   gloo_oom_worker TIMEOUT_MS
//
// Prints, for each trial K, "trial K: CODE: MESSAGE in S s" (or "trial K:
// the step went through") and "trial K: state unchanged" (or "... state
// CHANGED"); then "next step: OK, loss equals the reference's" (or what
// differed). Exits 3 on an error outside the trials.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/comm/gloo_backend.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const Status& s) {
  std::printf("error: %s\n", s.ToString().c_str());
  std::fflush(stdout);
  std::_Exit(3);  // the group's destructor would wait for peers that may be gone
}

// Master shards, optimizer state and step counts: what a step may change.
std::vector<std::vector<float>> ModelState(Trainer& t) {
  std::vector<std::vector<float>> out;
  FullyShardedModel& f = *t.fsdp();
  for (int u = 0; u < f.num_units(); ++u) {
    const Tensor& m = f.master_shard(u);
    out.emplace_back(m.data_as<float>(), m.data_as<float>() + m.numel());
    for (const std::string& name : t.optimizer().StateNames()) {
      StatusOr<Tensor> st = t.optimizer().State(u, name);
      if (st.ok()) out.emplace_back(st->data_as<float>(), st->data_as<float>() + st->numel());
    }
    out.push_back({static_cast<float>(t.optimizer().step_count(u))});
  }
  return out;
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gloo_oom_worker TIMEOUT_MS\n");
    return 2;
  }
  const Duration timeout(std::atoll(argv[1]));
  comm::GlooOptions go;
  go.timeout = timeout;
  StatusOr<std::unique_ptr<comm::GlooProcessGroup>> world = comm::GlooProcessGroup::CreateFromEnvironment(go);
  if (!world.ok()) return Fail(world.status());
  const int rank = (*world)->rank();

  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 2;
  o.data_tokens = 4096;
  o.optimizer.lr = 3e-3f;
  o.fsdp.timeout = timeout;
  o.gemm_threads = 1;
  StatusOr<std::unique_ptr<Trainer>> reference = Trainer::Create(o, world->get());
  if (!reference.ok()) return Fail(reference.status());
  StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o, world->get());
  if (!t.ok()) return Fail(t.status());
  for (Trainer* tr : {reference->get(), t->get()}) {
    if (StatusOr<StepMetrics> m = tr->Step(); !m.ok()) return Fail(m.status());
  }
  StatusOr<StepMetrics> want = (*reference)->Step();
  if (!want.ok()) return Fail(want.status());
  // The memory a step reaches above what it starts with: the cap goes a
  // fraction of the way up (none, half), so rank 1 runs out partway through.
  const MemoryStats ref = (*reference)->allocator().stats();
  const std::vector<double> fractions = {0.0, 0.5};
  for (size_t k = 0; k < fractions.size(); ++k) {
    const auto state = ModelState(**t);
    if (rank == 1) {
      // The cap bounds the memory obtained from the device (segments, less
      // the pages of free blocks the CPU hands back): from an emptied cache,
      // the step must grow by its allocated peak, which the cap cuts short.
      (*t)->allocator().EmptyCache();
      const int64_t in_use = (*t)->allocator().stats().reserved_bytes.current;
      const int64_t peak = ref.allocated_bytes.peak;
      const auto cap = static_cast<size_t>(in_use + fractions[k] * static_cast<double>(peak - in_use));
      if (Status s = (*t)->allocator().SetCapacity(cap); !s.ok()) return Fail(s);
    }
    const auto start = Clock::now();
    StatusOr<StepMetrics> m = (*t)->Step();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (rank == 1) {
      if (Status s = (*t)->allocator().SetCapacity(0); !s.ok()) return Fail(s);
    }
    if (m.ok()) {
      std::printf("trial %zu: the step went through\n", k);
    } else {
      std::printf("trial %zu: %s in %.3f s\n", k, m.status().ToString().c_str(), seconds);
    }
    std::printf("trial %zu: state %s\n", k, ModelState(**t) == state ? "unchanged" : "CHANGED");
    std::fflush(stdout);
  }
  StatusOr<StepMetrics> next = (*t)->Step();
  if (!next.ok()) {
    std::printf("next step: %s\n", next.status().ToString().c_str());
  } else if (next->step != want->step || next->loss != want->loss || next->global_loss != want->global_loss) {
    std::printf("next step: OK, but step %lld loss %a (global %a) where the reference had step %lld loss %a (global %a)\n",
                static_cast<long long>(next->step), next->loss, next->global_loss,
                static_cast<long long>(want->step), want->loss, want->global_loss);
  } else {
    std::printf("next step: OK, loss equals the reference's\n");
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) { return sk::Main(argc, argv); }
