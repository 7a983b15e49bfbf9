// //benchmarks:calibrate — measures this machine through the CPU op backend and
// writes the cpu-local simulator profile (runtime/sim/profile.h's format,
// every number's source "measured by //benchmarks:calibrate on <cpu>, <date>").
//
//   ./bazelw run -c opt //benchmarks:calibrate --
//       --out=$PWD/runtime/sim/profiles/cpu-local.json [--threads=1]
//
// What it measures, all through ops:: on cpu:0 (the code a CPU run executes):
//   - GEMM rate on a grid of shapes (m, k in 16..1024, n in 16..4096) for f32
//     and bf16 inputs: the cpu-local gemm_table;
//   - every other op's rate at four sizes (cache-resident to DRAM-sized), by
//     bytes (by flops for attention): the op_rates table;
//   - the fixed cost of an op call (a one-element fill): kernel_overhead;
//   - the copy rate at the largest size: memory bandwidth and host link;
//   - RawAllocate/RawFree of a 20 MiB segment: raw alloc/free costs;
//   - the local backend's all_gather between two ranks (threads) at 4 KiB and
//     64 MiB: the latency and bandwidth of the "network" section, so that a
//     world of local ranks on this machine can be simulated (the ring model
//     of runtime/comm/topology.h with these two numbers; wall time, the
//     fastest of several runs, since a collective waits for its peer).
// Then it prices held-out shapes (off the grid) with the new profile and
// prints predicted / measured for each: a check of the interpolation.
// Each number is the median of several timed batches, each batch >= 2 ms of
// process CPU time (not wall time, so that other work on a shared machine
// does not inflate it; with one compute thread the two agree on an idle
// machine). The profile therefore predicts CPU seconds of one rank's thread.
#include <sys/utsname.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <nlohmann/json.hpp>

#include "runtime/comm/local_backend.h"
#include "runtime/core/allocator.h"
#include "runtime/device/device.h"
#include "runtime/ops/cost.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/ops.h"
#include "runtime/sim/profile.h"
#include "runtime/sim/sim_ops.h"

DEFINE_string(out, "", "where to write the profile (default: print it)");
DEFINE_string(name, "cpu-local", "the profile's name");
DEFINE_int32(threads, 1, "GEMM/OpenMP threads per rank the profile describes");
DEFINE_double(budget_ms, 60, "measuring time per shape, milliseconds");

namespace sk {
namespace {

// CPU seconds of this process: on a machine shared with other work, the time
// the measured code actually ran (equal to wall time on an idle machine when
// one thread computes, which is what the profile describes).
double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Median CPU seconds of one call of `fn`, from batches of >= 2 ms within the budget.
double Measure(const std::function<void()>& fn) {
  fn();  // warm-up: caches, oneDNN primitive creation, page faults
  int per_batch = 1;
  for (;;) {
    const double t0 = CpuNow();
    for (int i = 0; i < per_batch; ++i) fn();
    if (CpuNow() - t0 >= 2e-3 || per_batch >= (1 << 20)) break;
    per_batch *= 4;
  }
  std::vector<double> samples;
  const double deadline = CpuNow() + FLAGS_budget_ms * 1e-3;
  while (samples.size() < 3 || (CpuNow() < deadline && samples.size() < 50)) {
    const double t0 = CpuNow();
    for (int i = 0; i < per_batch; ++i) fn();
    samples.push_back((CpuNow() - t0) / per_batch);
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

void Must(const Status& s, const char* what) {
  CHECK(s.ok()) << what << ": " << s;
}

Tensor Make(DType t, Shape shape, float fill = 0.5f) {
  StatusOr<Tensor> x = HostAllocator::Default().Empty(t, std::move(shape));
  CHECK(x.ok()) << x.status();
  if (t == DType::kF32 || t == DType::kBF16 || t == DType::kF16) {
    Must(ops::Fill(ops::HostContext(), *x, fill), "fill");
  }
  return *x;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  struct utsname u;
  return uname(&u) == 0 ? std::string(u.machine) : "unknown CPU";
}

double MemTotalBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  return 0;
}

nlohmann::json Sourced(nlohmann::json value, const std::string& source) {
  return {{"value", std::move(value)}, {"source", source}};
}

// One op's rate table: `run(n)` performs the op at size class n and returns
// its cost; the rate is the cost's bytes (or flops) over the measured time.
struct OpTable {
  std::string name;
  bool per_flop = false;
  std::vector<std::pair<double, double>> points;
};

void AddPoint(std::vector<OpTable>& tables, const ops::OpCost& cost, double seconds,
              bool per_flop) {
  const double work = per_flop ? cost.flops : cost.bytes_read + cost.bytes_written;
  auto it = std::find_if(tables.begin(), tables.end(),
                         [&](const OpTable& t) { return t.name == cost.name; });
  if (it == tables.end()) {
    tables.push_back(OpTable{cost.name, per_flop, {}});
    it = std::prev(tables.end());
  }
  if (work <= 0 || seconds <= 0) return;
  if (!it->points.empty() && work <= it->points.back().first) return;  // keep increasing
  it->points.emplace_back(work, work / seconds);
}

// Wall seconds of one 2-rank all_gather of `bytes` (output) on the local
// backend: the fastest of `iters` runs, issued for both ranks from this
// thread (the local backend is stream-ordered) and waited for.
double LocalAllGatherSeconds(int64_t bytes, int iters) {
  auto groups = comm::LocalProcessGroup::Create(2);
  Must(groups.status(), "local group");
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<Tensor> out(2);
  const int64_t total = bytes / 4 / 2 * 2;
  for (int r = 0; r < 2; ++r) {
    Device* device = Device::Get(DeviceId::Cpu(r)).value();
    streams.push_back(device->CreateStream("comm").value());
    HostAllocator alloc(DeviceId::Cpu(r));
    out[r] = alloc.Zeros(DType::kF32, Shape({total})).value();
  }
  double best = 1e30;
  for (int it = 0; it < iters + 1; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<comm::Work>> works;
    for (int r = 0; r < 2; ++r) {
      Tensor mine = out[r].View(r * (total / 2) * 4, DType::kF32, Shape({total / 2})).value();
      auto w = (*groups)[r]->all_gather(out[r], mine, *streams[r]);
      Must(w.status(), "all_gather");
      works.push_back(*w);
    }
    for (auto& w : works) Must(w->wait(std::chrono::minutes(1)), "all_gather wait");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it > 0) best = std::min(best, s);  // the first run is the warm-up
  }
  return best;
}

int Main() {
  Must(SetGemmThreads(FLAGS_threads), "threads");
  const ops::OpContext ctx = ops::HostContext();
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  const std::string source = "measured by //benchmarks:calibrate on " + CpuModel() + " (" +
                             std::to_string(FLAGS_threads) + " GEMM thread(s)), " + date;
  std::fprintf(stderr, "calibrating: %s\n", source.c_str());

  // ---- GEMM grid.
  nlohmann::json gemm_table = nlohmann::json::array();
  double peak[2] = {0, 0};
  const DType dtypes[2] = {DType::kF32, DType::kBF16};
  const int64_t mk_axis[] = {16, 64, 256, 1024};
  const int64_t n_axis[] = {16, 64, 256, 1024, 4096};
  for (int d = 0; d < 2; ++d) {
    for (int64_t m : mk_axis) {
      for (int64_t n : n_axis) {
        for (int64_t k : mk_axis) {
          Tensor a = Make(dtypes[d], Shape({m, k}));
          Tensor b = Make(dtypes[d], Shape({k, n}));
          Tensor c = Make(DType::kF32, Shape({m, n}));
          ops::GemmParams p;
          p.m = m;
          p.n = n;
          p.k = k;
          const double s = Measure([&] {
            Must(ops::Gemm(ctx, p, {a, 0, k, 0}, {b, 0, n, 0}, {c, 0, n, 0}), "gemm");
          });
          const double flops = 2.0 * m * n * k;
          peak[d] = std::max(peak[d], flops / s);
          gemm_table.push_back({{"m", m}, {"n", n}, {"k", k},
                                {"dtype", std::string(DTypeName(dtypes[d]))},
                                {"gflops", flops / s / 1e9}});
        }
      }
      std::fprintf(stderr, "  gemm %s m=%lld done\n", std::string(DTypeName(dtypes[d])).c_str(),
                   static_cast<long long>(m));
    }
  }

  // ---- Per-op rates by size.
  std::vector<OpTable> tables;
  const int64_t sizes[] = {4096, 65536, 1 << 20, 16 << 20};  // elements
  const int64_t cols = 256;
  for (int64_t n : sizes) {
    const int64_t rows = n / cols;
    Tensor x = Make(DType::kF32, Shape({n}));
    Tensor y = Make(DType::kF32, Shape({n}));
    Tensor z = Make(DType::kF32, Shape({n}));
    Tensor h = Make(DType::kBF16, Shape({n}));
    Tensor x2 = Make(DType::kF32, Shape({rows, cols}));
    Tensor y2 = Make(DType::kF32, Shape({rows, cols}));
    Tensor z2 = Make(DType::kF32, Shape({rows, cols}));
    Tensor bias = Make(DType::kF32, Shape({cols}));
    Tensor dbias = Make(DType::kF32, Shape({cols}));
    Tensor gamma = Make(DType::kF32, Shape({cols}), 1.0f);
    Tensor mean = Make(DType::kF32, Shape({rows}));
    Tensor rstd = Make(DType::kF32, Shape({rows}), 1.0f);
    Tensor acc = Make(DType::kF64, Shape({1}));
    Tensor m1 = Make(DType::kF32, Shape({n}), 0.0f);
    Tensor m2 = Make(DType::kF32, Shape({n}), 0.0f);
    auto time = [&](const ops::OpCost& cost, const std::function<Status()>& fn,
                    bool per_flop = false) {
      AddPoint(tables, cost, Measure([&] { Must(fn(), cost.name); }), per_flop);
    };
    time(ops::CopyCost(n, DType::kF32), [&] { return ops::Copy(ctx, x, y); });
    time(ops::CastCost(n, DType::kF32, DType::kBF16), [&] { return ops::Cast(ctx, x, h); });
    time(ops::RoundToDTypeCost(n), [&] { return ops::RoundToDType(ctx, y, DType::kBF16); });
    time(ops::ScaleCost(n, DType::kF32), [&] { return ops::Scale(ctx, y, 1.0f); });
    time(ops::AxpyCost(n, DType::kF32, DType::kF32), [&] { return ops::Axpy(ctx, 0.0f, x, y); });
    time(ops::FillCost(n, DType::kF32), [&] { return ops::Fill(ctx, z, 0.5f); });
    time(ops::InitCost(n, DType::kF32), [&] {
      return ops::InitPhilox(ctx, Initializer::Normal(0, 0.02f), 1, 2, 0, z);
    });
    time(ops::BroadcastRowsCost(rows, cols), [&] { return ops::BroadcastRows(ctx, bias, y2); });
    time(ops::BiasAddCost(rows, cols), [&] { return ops::BiasAdd(ctx, bias, y2); });
    time(ops::BiasGradCost(rows, cols), [&] { return ops::BiasGrad(ctx, x2, dbias); });
    time(ops::GeluForwardCost(n), [&] { return ops::GeluForward(ctx, x, y); });
    time(ops::GeluBackwardCost(n), [&] { return ops::GeluBackward(ctx, x, y, z); });
    time(ops::LayerNormForwardCost(rows, cols),
         [&] { return ops::LayerNormForward(ctx, x2, gamma, bias, y2, mean, rstd); });
    time(ops::LayerNormBackwardCost(rows, cols), [&] {
      return ops::LayerNormBackward(ctx, x2, gamma, y2, mean, rstd, z2, dbias, bias);
    });
    time(ops::SumOfSquaresCost(n, DType::kF32), [&] { return ops::SumOfSquares(ctx, x, acc); });
    time(ops::MaxAbsCost(n, DType::kF32), [&] { return ops::MaxAbs(ctx, x, acc); });
    AdamHyper adam{1e-9f, 0.9f, 0.999f, 1e-8f, 0.0f, true, 0.1f, 0.03f};
    time(ops::AdamUpdateCost(n, true), [&] { return ops::AdamUpdate(ctx, adam, z, x, m1, m2); });
    adam.decoupled = false;
    time(ops::AdamUpdateCost(n, false), [&] { return ops::AdamUpdate(ctx, adam, z, x, m1, m2); });
    SgdHyper sgd{1e-9f, 0.0f, 0.0f, 0.0f, false, false};
    time(ops::SgdUpdateCost(n, false), [&] { return ops::SgdUpdate(ctx, sgd, z, x, Tensor()); });
    // Embedding: `rows` ids into a table of 4096 rows of `cols`.
    {
      Tensor table = Make(DType::kF32, Shape({4096, cols}));
      Tensor dtable = Make(DType::kF32, Shape({4096, cols}));
      Tensor ids = HostAllocator::Default().Zeros(DType::kI32, Shape({rows})).value();
      time(ops::EmbeddingForwardCost(rows, cols),
           [&] { return ops::EmbeddingForward(ctx, table, ids, y2); });
      time(ops::EmbeddingBackwardCost(rows, cols),
           [&] { return ops::EmbeddingBackward(ctx, ids, x2, dtable); });
      // Cross-entropy over a vocabulary of `cols`.
      Tensor loss = Make(DType::kF32, Shape({1}));
      time(ops::CrossEntropyForwardCost(rows, cols),
           [&] { return ops::CrossEntropyForward(ctx, x2, ids, loss); });
      time(ops::CrossEntropyBackwardCost(rows, cols),
           [&] { return ops::CrossEntropyBackward(ctx, x2, ids, z2); });
    }
    std::fprintf(stderr, "  ops at %lld elements done\n", static_cast<long long>(n));
  }
  // Attention, by flops: 4 heads of 64, causal, sequences of 32..256.
  for (int64_t seq : {32, 64, 128, 256}) {
    ops::AttentionShape s{2, 4, seq, seq, 64, true};
    const int64_t rows = s.batch * seq, width = s.heads * s.head_dim;
    Tensor qkv = Make(DType::kF32, Shape({rows, 3 * width}), 0.01f);
    Tensor dqkv = Make(DType::kF32, Shape({rows, 3 * width}));
    Tensor probs = Make(DType::kF32, Shape({s.batch * s.heads * seq * seq}));
    Tensor out = Make(DType::kF32, Shape({rows, width}));
    Tensor dout = Make(DType::kF32, Shape({rows, width}), 0.01f);
    const int64_t ld = 3 * width;
    ops::MatrixRef q{qkv, 0, ld, 0}, k{qkv, width, ld, 0}, v{qkv, 2 * width, ld, 0};
    ops::MatrixRef dq{dqkv, 0, ld, 0}, dk{dqkv, width, ld, 0}, dv{dqkv, 2 * width, ld, 0};
    AddPoint(tables, ops::AttentionForwardCost(s.batch, s.heads, seq, seq, s.head_dim),
             Measure([&] {
               Must(ops::AttentionForward(ctx, s, q, k, v, probs, {out, 0, width, 0}), "attn");
             }),
             true);
    AddPoint(tables, ops::AttentionBackwardCost(s.batch, s.heads, seq, seq, s.head_dim),
             Measure([&] {
               Must(ops::AttentionBackward(ctx, s, q, k, v, probs, {dout, 0, width, 0}, dq, dk,
                                           dv),
                    "attn bwd");
             }),
             true);
  }

  // ---- Fixed costs.
  Tensor one = Make(DType::kF32, Shape({1}));
  const double overhead = Measure([&] { Must(ops::Fill(ctx, one, 1.0f), "fill"); });
  Device* cpu = Device::Get(DeviceId::Cpu()).value();
  const size_t seg = size_t{20} << 20;
  std::vector<void*> held;
  const double alloc_s = Measure([&] {
    held.push_back(cpu->RawAllocate(seg).value());
    if (held.size() >= 64) {
      for (void* p : held) cpu->RawFree(p, seg);
      held.clear();
    }
  });
  for (void* p : held) cpu->RawFree(p, seg);
  held.clear();
  const double free_s = Measure([&] { cpu->RawFree(cpu->RawAllocate(seg).value(), seg); }) -
                        alloc_s;
  double copy_rate = 0;
  for (const OpTable& t : tables) {
    if (t.name == "copy" && !t.points.empty()) copy_rate = t.points.back().second;
  }
  double vector_flops = 0;
  for (const OpTable& t : tables) {
    if (t.name == "gelu_fwd" && !t.points.empty()) {
      // bytes/s -> flops/s of the same runs (14 flops per 8 bytes).
      vector_flops = t.points.back().second / 8.0 * ops::kGeluForwardFlops;
    }
  }

  // ---- The local backend between two ranks: the ring model's latency and
  // bandwidth (all_gather of 2 ranks: one step, half the output crosses).
  const int64_t small_bytes = 4 << 10, large_bytes = 64 << 20;
  const double small_s = LocalAllGatherSeconds(small_bytes, 50);
  const double large_s = LocalAllGatherSeconds(large_bytes, 5);
  const double latency_s = small_s;
  const double comm_rate = 0.5 * large_bytes / std::max(1e-9, large_s - latency_s);  // bytes/s
  std::fprintf(stderr, "local all_gather, 2 ranks: %.1f us at 4 KiB, %.2f GB/s at 64 MiB\n",
               small_s * 1e6, comm_rate / 1e9);
  const std::string net_source = source + " (local backend all_gather between 2 rank threads, fastest of several runs)";
  auto disabled = [](const std::string& why) {
    return nlohmann::json{{"enabled", false}, {"source", why}};
  };
  const std::string only_ring =
      "the local backend has one algorithm: each rank copies its peers' chunks through shared memory, "
      "described by the simple protocol's measured latency and bandwidth (the same numbers for ring and "
      "tree: with one node the tree is a chain, which moves the same bytes)";
  const nlohmann::json measured_pair = {
      {"base_latency_us", Sourced(latency_s * 1e6, net_source + ", 4 KiB output")},
      {"intra_step_latency_us", Sourced(0.0, "included in base_latency_us (2 ranks: one step)")},
      {"inter_step_latency_us", Sourced(0.0, "not used: one node")},
      {"bandwidth_fraction", Sourced(1.0, "the measured rate already is the achieved rate")}};
  nlohmann::json network = {
      {"note", "This machine's local backend (threads of one process, shared memory) as a one-node "
               "network: ranks are threads, the 'NVLink' is the shared-memory copy path measured by "
               "//benchmarks:calibrate; there are no NICs (several nodes cannot be simulated)."},
      {"gpus_per_node", Sourced(2, "the local ranks of one process on this machine (the calibration's 2)")},
      {"nvlink",
       {{"links_per_gpu", Sourced(1, "one shared-memory copy path per rank")},
        {"link_bandwidth_gbps", Sourced(comm_rate / 1e9, net_source + ", 64 MiB output, after the 4 KiB latency")}}},
      {"nic",
       {{"per_node", Sourced(1, "not used: one node")},
        {"bandwidth_gbps", Sourced(comm_rate / 1e9, "not used: one node (set to the local copy rate)")},
        {"efficiency", Sourced(1.0, "not used: one node")}}},
      {"algorithms",
       {{"ring",
         {{"simple", measured_pair},
          {"ll", disabled(only_ring)},
          {"ll128", disabled(only_ring)}}},
        {"tree",
         {{"simple", measured_pair}, {"ll", disabled(only_ring)}, {"ll128", disabled(only_ring)}}}}},
      {"compute_slowdown_while_communicating",
       Sourced(1.0, "assumption: not measured (a collective's copies run on its stream's thread; whether they "
                    "slow the compute threads depends on free cores)")}};

  nlohmann::json rates = nlohmann::json::object();
  for (const OpTable& t : tables) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& [work, rate] : t.points) pts.push_back({work, rate});
    rates[t.name] = {{"per", t.per_flop ? "flop" : "byte"}, {"points", pts}};
  }
  const std::string no_launch =
      "CPU ops run synchronously on the calling thread: there is no separate launch (the call's "
      "whole cost is in kernel_overhead_us and the measured rates)";
  nlohmann::json doc = {
      {"name", FLAGS_name},
      {"description", "This machine's CPU as a simulated device (" + source +
                          "). Regenerate with ./bazelw run -c opt //benchmarks:calibrate -- "
                          "--out=$PWD/runtime/sim/profiles/" + FLAGS_name + ".json"},
      {"device",
       {{"memory_bytes", Sourced(MemTotalBytes(), source + " (/proc/meminfo MemTotal)")},
        {"launch_overhead_us", Sourced(0.0, no_launch)},
        {"raw_alloc_us", Sourced(std::max(0.0, alloc_s) * 1e6, source + " (RawAllocate of 20 MiB)")},
        {"raw_free_us", Sourced(std::max(0.0, free_s) * 1e6, source + " (RawFree of 20 MiB)")},
        {"host_link_gbps", Sourced(copy_rate / 2 / 1e9, source + " (copy op, 64 MiB: host memory is the device memory)")}}},
      {"compute",
       {{"sm_count", Sourced(1, "not used: GEMMs are priced from the measured gemm_table")},
        {"gemm_peak_tflops",
         {{"f32", Sourced(peak[0] / 1e12, source + " (best of the gemm_table)")},
          {"bf16", Sourced(peak[1] / 1e12, source + " (best of the gemm_table)")}}},
        {"gemm_efficiency", Sourced(1.0, "the measured table already is the achieved rate")},
        {"gemm_table", Sourced(gemm_table, source)},
        {"vector_tflops", Sourced(vector_flops / 1e12, source + " (gelu_fwd at 16M elements)")},
        {"memory_bandwidth_gbps",
         Sourced(copy_rate / 1e9, source + " (copy op at 16M f32: bytes read + written per second)")},
        {"memory_efficiency", Sourced(1.0, "the measured rate already is the achieved rate")},
        {"kernel_overhead_us", Sourced(overhead * 1e6, source + " (a one-element fill through ops::)")},
        {"op_rates", Sourced(rates, source)}}},
      {"network", network}};
  // Held-out check: shapes and sizes off the measured grid, predicted by the
  // new profile (sim::OpSeconds) against a fresh measurement.
  StatusOr<sim::SimProfile> parsed = sim::ParseProfile(doc, FLAGS_name);
  CHECK(parsed.ok()) << parsed.status();
  std::fprintf(stderr, "held-out check (predicted / measured CPU seconds):\n");
  double worst = 1;
  auto check = [&](const ops::OpCost& cost, const std::function<Status()>& fn) {
    const double measured = Measure([&] { Must(fn(), cost.name); });
    const double predicted = sim::OpSeconds(parsed->compute, cost);
    const double ratio = predicted / measured;
    worst = std::max(worst, std::max(ratio, 1 / ratio));
    std::fprintf(stderr, "  %-16s %10.1f us predicted %10.1f us measured  ratio %.2f\n", cost.name,
                 predicted * 1e6, measured * 1e6, ratio);
  };
  for (auto [m, n, k] : {std::array<int64_t, 3>{100, 300, 700}, {512, 2048, 128},
                         {48, 768, 192}, {2000, 96, 500}}) {
    Tensor a = Make(DType::kF32, Shape({m, k}));
    Tensor b = Make(DType::kF32, Shape({k, n}));
    Tensor c = Make(DType::kF32, Shape({m, n}));
    ops::GemmParams p;
    p.m = m;
    p.n = n;
    p.k = k;
    check(ops::GemmCost(m, n, k, 1, DType::kF32, false),
          [&] { return ops::Gemm(ctx, p, {a, 0, k, 0}, {b, 0, n, 0}, {c, 0, n, 0}); });
  }
  for (int64_t n : {int64_t{3} << 18, int64_t{5} << 20}) {
    Tensor x = Make(DType::kF32, Shape({n}));
    Tensor y = Make(DType::kF32, Shape({n}));
    check(ops::GeluForwardCost(n), [&] { return ops::GeluForward(ctx, x, y); });
    check(ops::AxpyCost(n, DType::kF32, DType::kF32), [&] { return ops::Axpy(ctx, 0.0f, x, y); });
    Tensor x2 = Make(DType::kF32, Shape({n / 256, 256}));
    Tensor y2 = Make(DType::kF32, Shape({n / 256, 256}));
    Tensor gamma = Make(DType::kF32, Shape({256}), 1.0f);
    Tensor beta = Make(DType::kF32, Shape({256}));
    Tensor mean = Make(DType::kF32, Shape({n / 256}));
    Tensor rstd = Make(DType::kF32, Shape({n / 256}));
    check(ops::LayerNormForwardCost(n / 256, 256),
          [&] { return ops::LayerNormForward(ctx, x2, gamma, beta, y2, mean, rstd); });
  }
  std::fprintf(stderr, "worst held-out ratio: %.2f\n", worst);

  const std::string text = doc.dump(1) + "\n";
  if (FLAGS_out.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  std::ofstream out(FLAGS_out);
  out << text;
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", FLAGS_out.c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s\n", FLAGS_out.c_str());
  return 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return sk::Main();
}
