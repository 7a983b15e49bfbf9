// Fixed workloads whose executed instructions benchmarks/track.py counts
// under `valgrind --tool=callgrind`: the CI performance gate's deterministic
// figures (docs/benchmarks.md, "Performance tracking").
//
//   valgrind --tool=callgrind --instr-atstart=no bazel-bin/benchmarks/track/counted
//       --benchmark_format=json
//
// Each benchmark runs its workload once untimed (warm-up: caches, oneDNN
// primitives, optimizer state, first-touch pages), then once with callgrind's
// instrumentation on, and ends that region with a callgrind dump named after
// the benchmark (CALLGRIND_DUMP_STATS_AT), so each dump holds the instructions
// of exactly one workload, counted over every thread of the process (rank
// threads, stream workers and the main thread). Outside valgrind the client
// requests do nothing and the binary is an ordinary Google Benchmark binary
// (time is meaningless under valgrind; track.py does not read it there).
//
// Workloads (all through the current code's entry points):
//   kernels/...      the CPU backend's kernels (runtime/ops/cpu) on one
//                    thread: GEMM (OpenBLAS and oneDNN), Linear forward and
//                    backward, LayerNorm, GELU, causal attention, and an
//                    AdamW step (runtime/optim);
//   collectives/...  local backend, world 2, one 1 MiB all_gather,
//                    reduce_scatter and all_reduce, 4 rounds each;
//   fsdp_step/...    one optimizer step of a Trainer at world 2 (local
//                    backend, ranks as threads, 1 GEMM thread each):
//                    FULL_SHARD and DDP on gpt-tiny and gpt-1m. Counters
//                    peak_allocated_bytes and peak_reserved_bytes: the
//                    caching allocator's peaks over that step, max over ranks.
// SK_BENCH_INJECT (benchmarks/util/inject.h) repeats the FSDP steps or the
// collectives inside the counted region: the self-test's 2x slowdowns.
#include <valgrind/callgrind.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include <benchmark/benchmark.h>

#include "benchmarks/util/inject.h"
#include "runtime/comm/local_backend.h"
#include "runtime/core/allocator.h"
#include "runtime/device/device.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/local_session.h"

namespace sk {
namespace {

// The name of the running benchmark (this Google Benchmark has no State::name).
thread_local std::string g_name;

// Runs `work` once untimed, then once inside callgrind's instrumented region,
// dumped under the benchmark's name.
void Counted(benchmark::State& state, const std::function<void()>& work) {
  work();
  const std::string name = g_name;
  for (auto _ : state) {
    CALLGRIND_ZERO_STATS;
    CALLGRIND_START_INSTRUMENTATION;
    work();
    CALLGRIND_DUMP_STATS_AT(name.c_str());
    CALLGRIND_STOP_INSTRUMENTATION;
  }
}

// Kernel buffers are 64-byte aligned, so that a change of allocation history
// elsewhere does not move the kernels onto their unaligned paths (which
// execute a different number of instructions).
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const Aligned64<U>&) const { return true; }
};
using Floats = std::vector<float, Aligned64<float>>;

void Fill(Floats& v, int mod, float scale) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % mod) - mod / 2) * scale;
}

// --- kernels ---------------------------------------------------------------

void BM_Gemm(benchmark::State& state, GemmBackend backend) {
  const int64_t m = 128, n = 128, k = 128;
  Floats a(m * k), b(k * n), c(m * n);
  Fill(a, 7, 0.1f);
  Fill(b, 5, 0.1f);
  Counted(state, [&] {
    Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n, backend);
    Gemm(true, false, m, n, k, 1.0f, a.data(), m, b.data(), n, 1.0f, c.data(), n, backend);
    Gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 1.0f, c.data(), n, backend);
    benchmark::DoNotOptimize(c.data());
  });
}

// A GPT MLP-up projection of 128 tokens: forward and backward.
void BM_Linear(benchmark::State& state) {
  const int64_t rows = 128, in = 128, out = 512;
  Floats x(rows * in), w(in * out), bias(out), y(rows * out), dy(rows * out), dx(rows * in),
      dw(in * out), db(out);
  Fill(x, 11, 0.05f);
  Fill(w, 13, 0.02f);
  Fill(bias, 3, 0.1f);
  Fill(dy, 7, 0.01f);
  Counted(state, [&] {
    LinearForward(x.data(), w.data(), bias.data(), rows, in, out, y.data());
    LinearBackward(x.data(), w.data(), dy.data(), rows, in, out, dx.data(), false, dw.data(), db.data());
    benchmark::DoNotOptimize(dx.data());
  });
}

void BM_LayerNorm(benchmark::State& state) {
  const int64_t rows = 256, cols = 256;
  Floats x(rows * cols), gamma(cols, 1.0f), beta(cols), y(rows * cols), mean(rows), rstd(rows),
      dy(rows * cols), dx(rows * cols), dgamma(cols), dbeta(cols);
  Fill(x, 17, 0.1f);
  Fill(dy, 5, 0.01f);
  Counted(state, [&] {
    LayerNormForward(x.data(), gamma.data(), beta.data(), rows, cols, y.data(), mean.data(), rstd.data());
    LayerNormBackward(x.data(), gamma.data(), dy.data(), mean.data(), rstd.data(), rows, cols, dx.data(),
                      dgamma.data(), dbeta.data());
    benchmark::DoNotOptimize(dx.data());
  });
}

void BM_Gelu(benchmark::State& state) {
  const int64_t n = 64 * 1024;
  Floats x(n), y(n), dy(n), dx(n);
  Fill(x, 19, 0.2f);
  Fill(dy, 7, 0.01f);
  Counted(state, [&] {
    GeluForward(x.data(), n, y.data());
    GeluBackward(x.data(), dy.data(), n, dx.data());
    benchmark::DoNotOptimize(dx.data());
  });
}

// Causal self-attention, 2 sequences x 4 heads x 64 tokens x 32 dims.
void BM_Attention(benchmark::State& state) {
  AttentionShape s;
  s.batch = 2;
  s.heads = 4;
  s.q_len = s.kv_len = 64;
  s.head_dim = 32;
  s.causal = true;
  const int64_t rows = s.batch * s.q_len, width = s.heads * s.head_dim;
  Floats q(rows * width), k(rows * width), v(rows * width), probs(s.batch * s.heads * s.q_len * s.kv_len),
      out(rows * width), dout(rows * width), dq(rows * width), dk(rows * width), dv(rows * width),
      scratch(s.q_len * s.kv_len);
  Fill(q, 13, 0.05f);
  Fill(k, 11, 0.05f);
  Fill(v, 7, 0.1f);
  Fill(dout, 5, 0.01f);
  Counted(state, [&] {
    AttentionForward(s, q.data(), width, k.data(), width, v.data(), width, probs.data(), out.data(), width);
    AttentionBackward(s, q.data(), width, k.data(), width, v.data(), width, probs.data(), dout.data(), width,
                      dq.data(), width, dk.data(), width, dv.data(), width, scratch.data());
    benchmark::DoNotOptimize(dq.data());
  });
}

// One AdamW step over two shards (64 Ki + 16 Ki parameters).
void BM_AdamW(benchmark::State& state) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.weight_decay = 0.01f;
  auto opt = Optimizer::Create(o, &HostAllocator::Default());
  if (!opt.ok()) {
    state.SkipWithError(opt.status().ToString().c_str());
    return;
  }
  Floats p0(64 * 1024), g0(p0.size()), p1(16 * 1024), g1(p1.size());
  Fill(p0, 13, 0.01f);
  Fill(g0, 7, 0.001f);
  Fill(p1, 11, 0.01f);
  Fill(g1, 5, 0.001f);
  std::vector<ShardRef> shards;
  for (auto [slot, p, g] : {std::tuple{0, &p0, &g0}, std::tuple{1, &p1, &g1}}) {
    auto param = Tensor::Wrap(p->data(), DType::kF32, Shape({static_cast<int64_t>(p->size())}));
    auto grad = Tensor::Wrap(g->data(), DType::kF32, Shape({static_cast<int64_t>(g->size())}));
    if (!param.ok() || !grad.ok()) {
      state.SkipWithError((!param.ok() ? param.status() : grad.status()).ToString().c_str());
      return;
    }
    shards.push_back({slot, *param, *grad});
  }
  Status status;
  Counted(state, [&] {
    Status s = (*opt)->Step(ops::HostContext(), shards);
    if (status.ok()) status = s;
  });
  if (!status.ok()) state.SkipWithError(status.ToString().c_str());
}

// --- collectives -----------------------------------------------------------

constexpr int kWorld = 2;

void BM_Collective(benchmark::State& state, const std::string& op) {
  auto groups = comm::LocalProcessGroup::Create(kWorld);
  if (!groups.ok()) {
    state.SkipWithError(groups.status().ToString().c_str());
    return;
  }
  const int64_t total = (1 << 20) / 4, chunk = total / kWorld;  // 1 MiB of f32
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<Tensor> big(kWorld), small(kWorld), mine(kWorld);
  Status status;
  for (int r = 0; r < kWorld && status.ok(); ++r) {
    auto device = Device::Get(DeviceId::Cpu(r));
    if (!device.ok()) {
      status = device.status();
      break;
    }
    auto stream = (*device)->CreateStream("comm");
    HostAllocator alloc(DeviceId::Cpu(r));
    auto b = alloc.Zeros(DType::kF32, Shape({total}));
    auto s = alloc.Zeros(DType::kF32, Shape({chunk}));
    if (!stream.ok() || !b.ok() || !s.ok()) {
      status = !stream.ok() ? stream.status() : !b.ok() ? b.status() : s.status();
      break;
    }
    streams.push_back(std::move(*stream));
    big[r] = *b;
    small[r] = *s;
    auto view = big[r].View(r * chunk * 4, DType::kF32, Shape({chunk}));
    if (!view.ok()) {
      status = view.status();
      break;
    }
    mine[r] = *view;
  }
  if (!status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  const int repeats = bench::InjectedRepeats("collectives");
  Counted(state, [&] {
    for (int round = 0; round < 4 * repeats && status.ok(); ++round) {
      std::vector<std::shared_ptr<comm::Work>> works;
      for (int r = 0; r < kWorld && status.ok(); ++r) {
        comm::ProcessGroup& pg = *(*groups)[r];
        StatusOr<std::shared_ptr<comm::Work>> w = op == "all_gather"       ? pg.all_gather(big[r], mine[r], *streams[r])
                                            : op == "reduce_scatter" ? pg.reduce_scatter(small[r], big[r], *streams[r])
                                                                     : pg.all_reduce(big[r], *streams[r]);
        if (w.ok()) {
          works.push_back(*w);
        } else {
          status = w.status();
        }
      }
      for (auto& w : works) {
        Status s = w->wait(std::chrono::minutes(5));
        if (status.ok()) status = s;
      }
    }
  });
  if (!status.ok()) state.SkipWithError((op + ": " + status.ToString()).c_str());
}

// --- one FSDP / DDP step ---------------------------------------------------

void BM_TrainStep(benchmark::State& state, const char* model, int64_t batch, int64_t seq, Parallelism parallelism) {
  TrainerOptions o;
  o.model = model;
  o.batch_size = batch;
  o.seq_len = seq;
  o.optimizer.kind = OptimizerKind::kAdamW;
  o.parallelism = parallelism;
  o.fsdp.strategy = ShardingStrategy::kFullShard;
  o.gemm_threads = 1;
  auto session = [&]() -> StatusOr<std::unique_ptr<LocalSession>> {
    SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(kWorld));
    return LocalSession::Create(o, LocalSession::Share(std::move(groups)));
  }();
  if (!session.ok()) {
    state.SkipWithError(session.status().ToString().c_str());
    return;
  }
  const int repeats = parallelism == Parallelism::kFsdp ? bench::InjectedRepeats("fsdp_step") : 1;
  std::vector<int64_t> peak_allocated(kWorld), peak_reserved(kWorld);
  Status status;
  Counted(state, [&] {
    std::fill(peak_allocated.begin(), peak_allocated.end(), 0);
    std::fill(peak_reserved.begin(), peak_reserved.end(), 0);
    for (int i = 0; i < repeats && status.ok(); ++i) {
      status = (*session)->OnEveryRank([&](int r, Trainer& t) -> Status {
        SK_ASSIGN_OR_RETURN(StepMetrics m, t.Step());
        peak_allocated[r] = std::max(peak_allocated[r], m.peak_allocated_bytes);
        peak_reserved[r] = std::max(peak_reserved[r], m.peak_reserved_bytes);
        return OkStatus();
      });
    }
  });
  session->reset();
  if (!status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  state.counters["peak_allocated_bytes"] =
      static_cast<double>(*std::max_element(peak_allocated.begin(), peak_allocated.end()));
  state.counters["peak_reserved_bytes"] =
      static_cast<double>(*std::max_element(peak_reserved.begin(), peak_reserved.end()));
}

void Register() {
  auto add = [](const std::string& name, auto fn, auto... args) {
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
      g_name = name;
      fn(state, args...);
    })->Iterations(1)->Unit(benchmark::kMillisecond);
  };
  add("kernels/gemm/openblas", BM_Gemm, GemmBackend::kOpenBlas);
  add("kernels/gemm/onednn", BM_Gemm, GemmBackend::kOneDnn);
  add("kernels/linear", BM_Linear);
  add("kernels/layernorm", BM_LayerNorm);
  add("kernels/gelu", BM_Gelu);
  add("kernels/attention", BM_Attention);
  add("kernels/adamw", BM_AdamW);
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
    add(std::string("collectives/local/world:2/") + op, BM_Collective, std::string(op));
  }
  struct Step {
    const char* model;
    int64_t batch, seq;
  };
  for (const Step& s : {Step{"gpt-tiny", 2, 16}, Step{"gpt-1m", 1, 64}}) {
    add(std::string("fsdp_step/") + s.model + "/FULL_SHARD", BM_TrainStep, s.model, s.batch, s.seq,
        Parallelism::kFsdp);
    add(std::string("fsdp_step/") + s.model + "/DDP", BM_TrainStep, s.model, s.batch, s.seq, Parallelism::kDdp);
  }
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  sk::Status threads = sk::SetGemmThreads(1);
  if (!threads.ok()) {
    std::fprintf(stderr, "counted: %s\n", threads.ToString().c_str());
    return 1;
  }
  sk::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
