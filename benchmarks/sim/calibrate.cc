// //benchmarks:calibrate — measures this machine through the CPU op backend and
// writes the cpu-local simulator profile (runtime/sim/profile.h's format,
// every number's source "measured by //benchmarks:calibrate on <cpu>, <date>").
//
//   ./bazelw run -c opt //benchmarks:calibrate --
//       --out=$PWD/runtime/sim/profiles/cpu-local.json [--threads=1] [--report=calibrate.md]
//   (or the binary alone, e.g. the GPU package's cpu/calibrate --out=PATH)
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
// Then it prices held-out shapes (off the grid) with the hot-loop tables and
// prints predicted / measured for each: a check of the interpolation.
//
// Hot loops run faster than the same ops inside a training step (caches,
// allocation, the host work between ops), so it then trains calibration
// models for real (--in_step: models and batches that //benchmarks:
// sim_validate does not check; world 1, DDP and FULL_SHARD) with every op
// timed as it runs (ops::SetOpTimingObserver). An op's in-step time is its
// run plus the host work since its thread's previous op ended. Per op class
// (GEMMs by flops, every other op by name and size, bins of 4x) the in-step
// time over the hot-loop price divides the hot-loop rates, so the tables
// keep their shape dependence and take the level a step sees. Nothing is
// fitted to sim_validate's step times. Held-out runs (--held_out) are
// trained and timed the same way and only predicted, with the new profile
// on the simulator; --report writes all of it as markdown.
// --clock=cpu (default) times with thread/process CPU time, robust to
// other work on the machine; on an idle machine it equals wall time for
// one compute thread.
// Each number is the median of several timed batches, each batch >= 2 ms of
// process CPU time (not wall time, so that other work on a shared machine
// does not inflate it; with one compute thread the two agree on an idle
// machine). The profile therefore predicts CPU seconds of one rank's thread.
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gflags/gflags.h>
#include <nlohmann/json.hpp>

#include "benchmarks/util/host_info.h"
#include "benchmarks/util/stats.h"
#include "runtime/comm/local_backend.h"
#include "runtime/core/allocator.h"
#include "runtime/core/file_io.h"
#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"
#include "runtime/nn/configs.h"
#include "runtime/ops/backend.h"
#include "runtime/ops/cost.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/op_timing.h"
#include "runtime/ops/ops.h"
#include "runtime/sim/profile.h"
#include "runtime/sim/sim_ops.h"
#include "runtime/train/local_session.h"
#include "runtime/train/sim_run.h"
#include "tools/cli_flags.h"

DEFINE_string(out, "", "where to write the profile (default: print it)");
DEFINE_string(name, "cpu-local", "the profile's name");
DEFINE_int32(threads, 1, "GEMM/OpenMP threads per rank the profile describes");
DEFINE_double(budget_ms, 60, "measuring time per shape, milliseconds");
DEFINE_string(in_step, "gpt-deep-20m:2,gpt-50m:1,t5-tiny:16",
              "calibration runs inside training steps, model:batch comma list (world 1, DDP and "
              "FULL_SHARD each): their ops' in-step times correct the hot-loop rates. Must not be "
              "the configurations //benchmarks:sim_validate checks. Empty: hot loops only");
DEFINE_string(held_out, "t5-60m:1",
              "training runs measured and predicted with the new profile but not used to build it "
              "(model:batch comma list, world 1, DDP and FULL_SHARD)");
DEFINE_string(clock, "cpu",
              "the in-step runs' clock: cpu (each op's thread CPU time, the step's process CPU time: "
              "robust to other work on the machine, and what the hot loops measure) or wall (steady "
              "clock: only on an otherwise idle machine)");
DEFINE_int32(in_step_steps, 4, "measured steps per in-step run (after 2 warm-up steps)");
DEFINE_string(save_hot, "", "also write the hot-loop profile (before the in-step corrections) here");
DEFINE_string(hot_from, "",
              "take the hot-loop tables from this file (written by --save_hot on this machine) instead "
              "of measuring them again");
DEFINE_string(report, "", "also write a markdown report of the calibration here");
DEFINE_bool(attention_only, false,
            "measure only the linear-memory attention's rates (hot loops) and put them into the "
            "op_rates of the existing profile at --out, leaving every other number as it is");

namespace sk {
namespace {

using bench::CpuModel;
using bench::LoadAverage;
using bench::Median;

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

// ---- Inside training steps -------------------------------------------------

// Collects every op a real run executes (op_timing.h).
class StepRecorder final : public ops::OpTimingObserver {
 public:
  struct Sample {
    ops::OpCost cost;
    double seconds = 0;
    // The thread's time between the end of its previous op and this op's
    // start (host work between ops), on the same clock; < 0 for a thread's
    // first op.
    double gap = -1;
  };
  explicit StepRecorder(Clock clock) : clock_(clock) {}
  Clock clock() const override { return clock_; }
  void OnOp(const ops::OpCost& cost, double seconds) override {
    thread_local double last_end = -1;
    thread_local const StepRecorder* last_recorder = nullptr;
    thread_local uint64_t last_epoch = 0;
    const double now = clock_ == Clock::kThreadCpu ? ThreadCpuNow() : WallNow();
    double gap = -1;
    const uint64_t epoch = epoch_.load();
    if (last_recorder == this && last_epoch == epoch && last_end >= 0) gap = now - seconds - last_end;
    last_end = now;
    last_recorder = this;
    last_epoch = epoch;
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back({cost, seconds, gap});
  }
  // Starts a new step: gaps do not reach across it.
  void NewStep() { epoch_.fetch_add(1); }
  std::vector<Sample> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(samples_, {});
  }

 private:
  static double ThreadCpuNow() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
  }
  static double WallNow() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  const Clock clock_;
  std::atomic<uint64_t> epoch_{0};
  std::mutex mu_;
  std::vector<Sample> samples_;
};

struct RunSpec {
  std::string model;
  int64_t batch = 1;
  Parallelism parallelism = Parallelism::kFsdp;
  bool held_out = false;

  std::string Name() const {
    return model + " batch " + std::to_string(batch) + " world 1 " +
           (parallelism == Parallelism::kDdp ? "DDP" : "FULL_SHARD");
  }
  TrainerOptions Options() const {
    TrainerOptions o;
    o.model = model;
    o.batch_size = batch;
    o.parallelism = parallelism;
    o.fsdp.strategy = ShardingStrategy::kFullShard;
    o.gemm_threads = FLAGS_threads;
    return o;
  }
};

struct RunResult {
  RunSpec spec;
  std::vector<double> step_s;                  // per measured step
  std::vector<StepRecorder::Sample> samples;   // every op of the measured steps
  double op_s = 0;                             // sum of the samples' seconds
  double gap_s = 0;                            // sum of their gaps (host work between ops)
  int64_t ops = 0;
  double predicted_s = 0;                      // the new profile's, on sim
  std::string error;
};

std::vector<RunSpec> ParseRuns(const std::string& list, bool held_out) {
  std::vector<RunSpec> out;
  for (const std::string& item : cli::SplitList(list)) {
    RunSpec r;
    const auto colon = item.find(':');
    r.model = item.substr(0, colon);
    if (colon != std::string::npos) r.batch = std::max<int64_t>(1, std::atoll(item.c_str() + colon + 1));
    r.held_out = held_out;
    for (Parallelism p : {Parallelism::kDdp, Parallelism::kFsdp}) {
      r.parallelism = p;
      out.push_back(r);
    }
  }
  return out;
}

// Trains `r` for real on cpu:0 (a local session of one rank): 2 warm-up
// steps, then FLAGS_in_step_steps measured ones with every op timed. The
// steps run on this thread (the one rank needs no peer running beside it),
// not on a fresh rank thread per step as LocalSession::Step would: every
// step then reuses the same OpenMP team rather than spawning a new one into
// the measured CPU time.
Status RunInStep(RunResult& r, StepRecorder& recorder) {
  SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(1));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<LocalSession> session,
                      LocalSession::Create(r.spec.Options(), LocalSession::Share(std::move(groups))));
  Trainer* trainer = &session->trainer(0);
  for (int i = 0; i < 2; ++i) SK_RETURN_IF_ERROR(trainer->Step().status());
  recorder.Take();
  ops::SetOpTimingObserver(&recorder);
  Status status = OkStatus();
  const bool cpu_clock = recorder.clock() == ops::OpTimingObserver::Clock::kThreadCpu;
  for (int i = 0; i < FLAGS_in_step_steps && status.ok(); ++i) {
    recorder.NewStep();
    const double cpu0 = CpuNow();
    StatusOr<StepMetrics> m = trainer->Step();
    const double cpu1 = CpuNow();
    if (!m.ok()) {
      status = m.status();
      break;
    }
    r.step_s.push_back(cpu_clock ? cpu1 - cpu0 : m->step_seconds);
  }
  ops::SetOpTimingObserver(nullptr);
  SK_RETURN_IF_ERROR(status);
  r.samples = recorder.Take();
  for (const auto& smp : r.samples) {
    r.op_s += smp.seconds;
    r.gap_s += std::max(0.0, smp.gap);
  }
  r.ops = static_cast<int64_t>(r.samples.size());
  return OkStatus();
}

// The in-step time of an op class over its hot-loop price, as a function of
// the op's work (bytes, or flops for GEMMs and per-flop ops): bins of a
// factor of 4 in work, each the ratio of summed times (so long ops weigh
// more), interpolated linearly in log(work) between the bins' mean log work
// and clamped at the ends.
struct Correction {
  struct Bin {
    double sum_log_work = 0, measured = 0, predicted = 0;
    int64_t count = 0;
  };
  std::map<int, Bin> bins;
  std::vector<std::pair<double, double>> curve;  // (log work, factor)

  void Add(double work, double measured, double predicted) {
    Bin& b = bins[static_cast<int>(std::floor(std::log2(std::max(work, 1.0)) / 2))];
    b.sum_log_work += std::log(std::max(work, 1.0));
    b.measured += measured;
    b.predicted += predicted;
    ++b.count;
  }
  void Finish() {
    curve.clear();
    for (const auto& [k, b] : bins) {
      if (b.count < 3 || !(b.predicted > 0)) continue;  // too few to trust
      curve.emplace_back(b.sum_log_work / b.count, b.measured / b.predicted);
    }
  }
  bool empty() const { return curve.empty(); }
  double At(double work) const {
    if (curve.empty()) return 1;
    const double x = std::log(std::max(work, 1.0));
    if (x <= curve.front().first) return curve.front().second;
    if (x >= curve.back().first) return curve.back().second;
    for (size_t i = 1; i < curve.size(); ++i) {
      if (x <= curve[i].first) {
        const double f = (x - curve[i - 1].first) / (curve[i].first - curve[i - 1].first);
        return (1 - f) * curve[i - 1].second + f * curve[i].second;
      }
    }
    return curve.back().second;
  }
};

// The key and work of an op for the correction tables.
std::string ClassOf(const ops::OpCost& c) { return c.cls == ops::OpClass::kGemm ? "gemm" : c.name; }
// Whether the class's work is flops (GEMMs, and the ops the hot loops rate
// per flop: attention) rather than bytes.
bool PerFlop(const ops::OpCost& c, const sim::ComputeProfile& hot) {
  if (c.cls == ops::OpClass::kGemm) return true;
  auto it = hot.op_rates.find(std::string_view(c.name));
  return it != hot.op_rates.end() ? it->second.per_flop : c.cls == ops::OpClass::kAttention;
}
double WorkOf(const ops::OpCost& c, const sim::ComputeProfile& hot) {
  return PerFlop(c, hot) ? c.flops : c.bytes_read + c.bytes_written;
}

// The GEMM grid: the gemm_table entries and the best rate per input dtype.
struct GemmGrid {
  nlohmann::json table = nlohmann::json::array();
  double peak[2] = {0, 0};  // flops/s: f32, bf16
};

GemmGrid MeasureGemmGrid(const ops::OpContext& ctx) {
  GemmGrid grid;
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
          grid.peak[d] = std::max(grid.peak[d], flops / s);
          grid.table.push_back({{"m", m}, {"n", n}, {"k", k},
                                {"dtype", std::string(DTypeName(dtypes[d]))},
                                {"gflops", flops / s / 1e9}});
        }
      }
      std::fprintf(stderr, "  gemm %s m=%lld done\n", std::string(DTypeName(dtypes[d])).c_str(),
                   static_cast<long long>(m));
    }
  }
  return grid;
}

// The linear-memory (flash) attention's rates, by flops: what the CPU runs
// from kCpuFlashAttentionMinKeys keys on (ops::CpuPrefersFlashAttention).
// One sequence of 2 heads of 64, causal, 1024, 2048 and 4096 tokens (the
// CPU stages 16-bit operands to f32, so f32's rate prices every dtype).
void AppendFlashAttentionRates(const ops::OpContext& ctx, std::vector<OpTable>& tables) {
  for (int64_t seq : {ops::kCpuFlashAttentionMinKeys, 2 * ops::kCpuFlashAttentionMinKeys,
                      4 * ops::kCpuFlashAttentionMinKeys}) {
    ops::AttentionShape s{1, 2, seq, seq, 64, true};
    const int64_t rows = s.batch * seq, width = s.heads * s.head_dim, ld = 3 * width;
    Tensor qkv = Make(DType::kF32, Shape({rows, ld}), 0.01f);
    Tensor dqkv = Make(DType::kF32, Shape({rows, ld}));
    Tensor out = Make(DType::kF32, Shape({rows, width}));
    Tensor dout = Make(DType::kF32, Shape({rows, width}), 0.01f);
    Tensor lse = Make(DType::kF32, Shape({s.batch * s.heads * seq}));
    ops::MatrixRef q{qkv, 0, ld, 0}, k{qkv, width, ld, 0}, v{qkv, 2 * width, ld, 0};
    ops::MatrixRef dq{dqkv, 0, ld, 0}, dk{dqkv, width, ld, 0}, dv{dqkv, 2 * width, ld, 0};
    const ops::MatrixRef o{out, 0, width, 0}, dO{dout, 0, width, 0};
    AddPoint(tables, ops::FlashAttentionForwardCost(s.batch, s.heads, seq, seq, s.head_dim, true),
             Measure([&] { Must(ops::FlashAttentionForward(ctx, s, q, k, v, o, lse), "flash attn"); }),
             true);
    AddPoint(tables, ops::FlashAttentionBackwardCost(s.batch, s.heads, seq, seq, s.head_dim, true),
             Measure([&] {
               Must(ops::FlashAttentionBackward(ctx, s, q, k, v, o, dO, lse, dq, dk, dv), "flash attn bwd");
             }),
             true);
    std::fprintf(stderr, "  flash attention at %lld tokens done\n", static_cast<long long>(seq));
  }
}

// Every other op's rate at four sizes, by bytes (attention by flops).
std::vector<OpTable> MeasureOpRates(const ops::OpContext& ctx) {
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
  AppendFlashAttentionRates(ctx, tables);
  return tables;
}

// What an op call and a raw allocation cost whatever their size, and the
// rates the largest copy and GELU give the device's bandwidth figures.
struct FixedCosts {
  double overhead = 0;      // s per op call: a one-element fill
  double alloc_s = 0;       // RawAllocate of 20 MiB
  double free_s = 0;        // RawFree of 20 MiB
  double copy_rate = 0;     // bytes/s: copy at the largest size
  double vector_flops = 0;  // flops/s: gelu_fwd at the largest size
};

FixedCosts MeasureFixedCosts(const ops::OpContext& ctx, const std::vector<OpTable>& tables) {
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
  return FixedCosts{overhead, alloc_s, free_s, copy_rate, vector_flops};
}

// The local backend between two ranks as the profile's one-node network: the
// ring model's latency and bandwidth (all_gather of 2 ranks: one step, half
// the output crosses).
nlohmann::json MeasureLocalNetwork(const std::string& source) {
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
  return network;
}

// The hot-loop measurements (the file comment's list) as a profile document.
nlohmann::json MeasureHotLoops(const ops::OpContext& ctx, const std::string& source) {
  const GemmGrid grid = MeasureGemmGrid(ctx);
  const std::vector<OpTable> tables = MeasureOpRates(ctx);
  const FixedCosts fixed = MeasureFixedCosts(ctx, tables);
  const nlohmann::json network = MeasureLocalNetwork(source);

  nlohmann::json rates = nlohmann::json::object();
  for (const OpTable& t : tables) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& [work, rate] : t.points) pts.push_back({work, rate});
    rates[t.name] = {{"per", t.per_flop ? "flop" : "byte"}, {"points", pts}};
  }
  const std::string no_launch =
      "CPU ops run synchronously on the calling thread: there is no separate launch (the call's "
      "whole cost is in kernel_overhead_us and the measured rates)";
  return {
      {"name", FLAGS_name},
      {"description", "This machine's CPU as a simulated device (" + source +
                          "). Regenerate with ./bazelw run -c opt //benchmarks:calibrate -- "
                          "--out=$PWD/runtime/sim/profiles/" + FLAGS_name + ".json"},
      {"device",
       {{"memory_bytes", Sourced(MemTotalBytes(), source + " (/proc/meminfo MemTotal)")},
        {"launch_overhead_us", Sourced(0.0, no_launch)},
        {"raw_alloc_us", Sourced(std::max(0.0, fixed.alloc_s) * 1e6, source + " (RawAllocate of 20 MiB)")},
        {"raw_free_us", Sourced(std::max(0.0, fixed.free_s) * 1e6, source + " (RawFree of 20 MiB)")},
        {"host_link_gbps", Sourced(fixed.copy_rate / 2 / 1e9, source + " (copy op, 64 MiB: host memory is the device memory)")},
        {"release_page_bytes",
         Sourced(static_cast<double>(CpuDevice::PageBytes()),
                 source + " (the page size, sysconf(_SC_PAGESIZE): the CPU device hands the pages "
                          "of cached free blocks back with madvise(MADV_DONTNEED))")}}},
      {"compute",
       {{"sm_count", Sourced(1, "not used: GEMMs are priced from the measured gemm_table")},
        {"gemm_peak_tflops",
         {{"f32", Sourced(grid.peak[0] / 1e12, source + " (best of the gemm_table)")},
          {"bf16", Sourced(grid.peak[1] / 1e12, source + " (best of the gemm_table)")}}},
        {"gemm_efficiency", Sourced(1.0, "the measured table already is the achieved rate")},
        {"gemm_table", Sourced(grid.table, source)},
        {"vector_tflops", Sourced(fixed.vector_flops / 1e12, source + " (gelu_fwd at 16M elements)")},
        {"memory_bandwidth_gbps",
         Sourced(fixed.copy_rate / 1e9, source + " (copy op at 16M f32: bytes read + written per second)")},
        {"memory_efficiency", Sourced(1.0, "the measured rate already is the achieved rate")},
        {"kernel_overhead_us", Sourced(fixed.overhead * 1e6, source + " (a one-element fill through ops::)")},
        {"op_rates", Sourced(rates, source)}}},
      {"network", network}};
}

// "MODEL[:BATCH],..." as --in_step/--held_out take it: every model named in
// the model table and every batch a positive integer, or a message naming
// the flag. Checked before the minutes of hot-loop measurement: a run that
// fails later is left out of the fit, and a typo gave an uncorrected profile
// and exit 0.
std::string CheckRunList(const std::string& list, const char* flag) {
  for (const std::string& item : cli::SplitList(list)) {
    const auto colon = item.find(':');
    const std::string model = item.substr(0, colon);
    if (StatusOr<NamedModelConfig> c = FindModelConfig(model); !c.ok()) {
      return std::string("--") + flag + ": " + c.status().ToString();
    }
    if (colon != std::string::npos) {
      const std::string batch = item.substr(colon + 1);
      if (batch.empty() || batch.size() > 9 || batch.find_first_not_of("0123456789") != std::string::npos ||
          std::stol(batch) < 1) {
        return std::string("--") + flag + ": batch '" + batch + "' of " + model +
               " is not an integer in [1, 999999999]";
      }
    }
  }
  return "";
}

// Every flag checked before minutes of measurement; false after printing
// what is wrong.
bool FlagsValid() {
  if (FLAGS_clock != "cpu" && FLAGS_clock != "wall") {
    std::fprintf(stderr, "--clock must be cpu or wall\n");
    return false;
  }
  // SetGemmThreads below CHECK-fails (abort) on what it refuses.
  if (FLAGS_threads < 1 || FLAGS_threads > 1024) {
    std::fprintf(stderr, "--threads must be in [1, 1024], got %d\n", FLAGS_threads);
    return false;
  }
  if (FLAGS_in_step_steps < 1) {
    std::fprintf(stderr, "--in_step_steps must be >= 1, got %d\n", FLAGS_in_step_steps);
    return false;
  }
  if (!std::isfinite(FLAGS_budget_ms) || FLAGS_budget_ms < 0) {
    std::fprintf(stderr, "--budget_ms must be a finite number >= 0, got %g\n", FLAGS_budget_ms);
    return false;
  }
  for (const auto& [list, flag] : {std::pair<std::string, const char*>{FLAGS_in_step, "in_step"},
                                   std::pair<std::string, const char*>{FLAGS_held_out, "held_out"}}) {
    const std::string why = CheckRunList(list, flag);
    if (!why.empty()) {
      std::fprintf(stderr, "%s\n", why.c_str());
      return false;
    }
  }
  // The held-out check of issue 11 must stay held out: its configurations
  // cannot calibrate.
  for (const RunSpec& r : ParseRuns(FLAGS_in_step, false)) {
    for (const char* checked : {"gpt-1m", "gpt-10m", "t5-10m"}) {
      if (r.model == checked) {
        std::fprintf(stderr, "--in_step: %s is a model //benchmarks:sim_validate checks; calibrate with "
                             "other models\n", checked);
        return false;
      }
    }
  }
  return true;
}

// The hot-loop profile: measured now (and saved to --save_hot), or read from
// --hot_from. False after printing why when --hot_from is not such a file.
bool HotLoopProfile(const ops::OpContext& ctx, const std::string& source, nlohmann::json* doc) {
  if (FLAGS_hot_from.empty()) {
    *doc = MeasureHotLoops(ctx, source);
    if (!FLAGS_save_hot.empty()) {
      std::ofstream out(FLAGS_save_hot);
      out << doc->dump(1) << "\n";
    }
    return true;
  }
  std::ifstream in(FLAGS_hot_from);
  *doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const bool corrected = !doc->is_discarded() && doc->contains("compute") &&
                         (*doc)["compute"].contains("gemm_table") &&
                         (*doc)["compute"]["gemm_table"].value("source", "").find("in-step") != std::string::npos;
  if (doc->is_discarded() || !doc->contains("compute") || corrected) {
    std::fprintf(stderr, "--hot_from=%s is not a hot-loop profile written by --save_hot\n",
                 FLAGS_hot_from.c_str());
    return false;
  }
  std::fprintf(stderr, "hot-loop tables from %s\n", FLAGS_hot_from.c_str());
  return true;
}

// Held-out check of the hot-loop tables: shapes and sizes off the measured
// grid, predicted by the hot-loop profile (sim::OpSeconds) against a fresh
// measurement. It checks the interpolation, not training.
struct HotLoopCheck {
  double worst = 1;    // the largest of predicted / measured and its inverse
  std::string report;  // markdown table rows
};

HotLoopCheck CheckHotLoopTables(const ops::OpContext& ctx, const sim::ComputeProfile& hot) {
  HotLoopCheck result;
  std::fprintf(stderr, "held-out check of the hot-loop tables (predicted / measured CPU seconds):\n");
  auto check = [&](const ops::OpCost& cost, const std::function<Status()>& fn) {
    const double measured = Measure([&] { Must(fn(), cost.name); });
    const double predicted = sim::OpSeconds(hot, cost);
    const double ratio = predicted / measured;
    result.worst = std::max(result.worst, std::max(ratio, 1 / ratio));
    char line[256];
    std::snprintf(line, sizeof(line), "  %-16s %10.1f us predicted %10.1f us measured  ratio %.2f\n",
                  cost.name, predicted * 1e6, measured * 1e6, ratio);
    std::fputs(line, stderr);
    std::snprintf(line, sizeof(line), "| %s | %.0f | %.1f | %.1f | %.2f |\n", cost.name,
                  cost.cls == ops::OpClass::kGemm ? cost.flops : cost.bytes_read + cost.bytes_written,
                  predicted * 1e6, measured * 1e6, ratio);
    result.report += line;
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
  std::fprintf(stderr, "worst held-out ratio of the hot-loop tables: %.2f\n", result.worst);
  return result;
}

// ---- Inside training steps: the same ops as a step runs them (caches,
// allocator and dispatcher in a step's state), timed one by one
// (op_timing.h) in real training runs of calibration models that are not
// the configurations //benchmarks:sim_validate checks. An op's in-step
// time is its run plus the host work since its thread's previous op ended
// (a synchronous CPU op waits for it). For each op class (GEMM by flops;
// every other op by its name and size), in-step time over the hot-loop
// price divides the hot-loop rates; ops the hot loops did not measure get
// tables of their in-step rates. Held-out runs are measured the same way
// but used only to check the result.

// Trains every --in_step run, then every --held_out run, printing each.
std::vector<RunResult> RunTrainingSteps() {
  std::vector<RunResult> runs;
  for (const RunSpec& spec : ParseRuns(FLAGS_in_step, false)) runs.push_back(RunResult{spec});
  for (const RunSpec& spec : ParseRuns(FLAGS_held_out, true)) runs.push_back(RunResult{spec});
  StepRecorder recorder(FLAGS_clock == "cpu" ? ops::OpTimingObserver::Clock::kThreadCpu
                                             : ops::OpTimingObserver::Clock::kWall);
  for (RunResult& r : runs) {
    Status st = RunInStep(r, recorder);
    if (!st.ok()) r.error = st.ToString();
    std::fprintf(stderr, "  in-step %-36s %s: median step %.4f s, ops %.4f s (%lld ops)%s\n",
                 r.spec.Name().c_str(), r.spec.held_out ? "held out" : "fit", Median(r.step_s),
                 r.op_s / std::max<size_t>(1, r.step_s.size()),
                 static_cast<long long>(r.ops / std::max<int64_t>(1, r.step_s.size())),
                 r.error.empty() ? "" : (" error: " + r.error).c_str());
  }
  return runs;
}

// What the fitting runs (not held out, no error) say about the hot-loop
// tables: per op class, the correction curve and the in-step rates by bin.
struct InStepFit {
  std::map<std::string, Correction> corr;
  std::map<std::string, std::map<int, std::pair<double, double>>> direct;  // class -> bin -> (work, s)
  std::set<std::string> per_flop_keys;  // classes whose work is flops
  double gap_per_op = 0;  // mean host work before an op, s
  double other_s = 0;     // step time outside the timed threads' ops and gaps, s
  std::string fit_names;
};

InStepFit FitInStep(const std::vector<RunResult>& runs, const sim::ComputeProfile& hot) {
  InStepFit fit;
  double gap_s = 0;
  int64_t gap_ops = 0;
  for (const RunResult& r : runs) {
    if (r.spec.held_out || !r.error.empty()) continue;
    fit.fit_names += (fit.fit_names.empty() ? "" : ", ") + r.spec.Name();
    for (const auto& smp : r.samples) {
      const std::string key = ClassOf(smp.cost);
      const double work = WorkOf(smp.cost, hot);
      if (PerFlop(smp.cost, hot)) fit.per_flop_keys.insert(key);
      // The op's time in the step: its run plus the host work since the
      // thread's previous op ended (the dispatcher's checks, allocation,
      // the caller's bookkeeping), which a synchronous CPU op waits for.
      const double in_step = smp.seconds + std::max(0.0, smp.gap);
      fit.corr[key].Add(work, in_step, sim::OpSeconds(hot, smp.cost));
      auto& d = fit.direct[key][static_cast<int>(std::floor(std::log2(std::max(work, 1.0)) / 2))];
      d.first += work;
      d.second += in_step;
      gap_s += std::max(0.0, smp.gap);
      gap_ops += smp.gap >= 0;
    }
    double steps = 0;
    for (double t : r.step_s) steps += t;
    fit.other_s += steps - r.op_s - r.gap_s;
  }
  for (auto& [k, c] : fit.corr) c.Finish();
  fit.gap_per_op = gap_ops > 0 ? gap_s / gap_ops : 0.0;
  return fit;
}

// Divides the hot-loop tables of `doc` by the fit's corrections and adds
// tables for the ops only the steps ran; returns the correction report's
// markdown rows (empty when nothing was fitted).
std::string ApplyInStepFit(const InStepFit& fit, const std::string& source, nlohmann::json& doc) {
  std::string report_corr;
  if (fit.corr.empty()) return report_corr;
  const std::string in_step_source =
      source + ": hot-loop rate divided by the in-step correction (the op class's time inside "
               "training steps over its hot-loop price, by size) measured in " + fit.fit_names;
  auto scale = [&](const std::string& key, double work) {
    auto it = fit.corr.find(key);
    return it == fit.corr.end() ? 1.0 : it->second.At(work);
  };
  nlohmann::json& table = doc["compute"]["gemm_table"];
  for (auto& e : table["value"]) {
    const double flops = 2.0 * e["m"].get<double>() * e["n"].get<double>() * e["k"].get<double>();
    e["gflops"] = e["gflops"].get<double>() / scale("gemm", flops);
  }
  table["source"] = in_step_source + " (f32 steps: bf16 entries take the f32 correction)";
  nlohmann::json& op_rates = doc["compute"]["op_rates"];
  for (auto it = op_rates["value"].begin(); it != op_rates["value"].end(); ++it) {
    if (fit.corr.count(it.key()) == 0 || fit.corr.at(it.key()).empty()) continue;
    for (auto& pt : it.value()["points"]) pt[1] = pt[1].get<double>() / scale(it.key(), pt[0].get<double>());
  }
  for (const auto& [key, bins] : fit.direct) {
    if (key == "gemm" || op_rates["value"].contains(key)) continue;
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& [bin, ws] : bins) {
      if (ws.first > 0 && ws.second > 0) pts.push_back({ws.first, ws.first / ws.second});
    }
    if (pts.empty()) continue;
    // Bins of summed work: the work axis grows with the bin, as the loader requires.
    op_rates["value"][key] = {{"per", fit.per_flop_keys.count(key) ? "flop" : "byte"}, {"points", pts}};
  }
  doc["description"] = doc["description"].get<std::string>() +
                       ". Op rates corrected inside training steps of " + fit.fit_names + ".";
  op_rates["source"] = in_step_source +
                       " (ops the hot loops did not measure: their in-step rates, summed work over "
                       "summed time per size bin; ops the steps did not run: hot-loop rates)";
  for (const auto& [key, c] : fit.corr) {
    for (const auto& [bin, b] : c.bins) {
      char line[256];
      std::snprintf(line, sizeof(line), "| %s | %.3g | %lld | %.1f | %.1f | %.2f |\n", key.c_str(),
                    std::exp(b.sum_log_work / std::max<int64_t>(1, b.count)),
                    static_cast<long long>(b.count), b.measured * 1e6, b.predicted * 1e6,
                    b.predicted > 0 ? b.measured / b.predicted : 0.0);
      report_corr += line;
    }
  }
  std::fprintf(stderr,
               "in-step: %.2f us of host work before each op (included in the op's in-step time); "
               "%.4f s of the fitting runs' steps outside the timed threads' ops and gaps\n",
               fit.gap_per_op * 1e6, fit.other_s);
  return report_corr;
}

// Writes the profile to `path`, and to stdout when --out is not given; false
// after printing why when it cannot be written.
bool WriteProfile(const nlohmann::json& doc, const std::string& path) {
  const std::string text = doc.dump(1) + "\n";
  {
    std::ofstream out(path);
    out << text;
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return false;
    }
  }
  if (FLAGS_out.empty()) std::fputs(text.c_str(), stdout);
  else std::fprintf(stderr, "wrote %s\n", FLAGS_out.c_str());
  return true;
}

// The calibration runs and the held-out runs predicted with the new profile
// at `path` (the simulator, world 1) against their measured median step.
struct Predictions {
  std::string report;  // markdown table rows
  int held_in = 0;     // held-out runs within +-15%
  int held_total = 0;
};

Predictions PredictRuns(std::vector<RunResult>& runs, const std::string& path) {
  Predictions p;
  for (RunResult& r : runs) {
    if (!r.error.empty()) {
      p.report += "| " + r.spec.Name() + " | error: " + r.error + " |\n";
      continue;
    }
    SimRunOptions so;
    so.trainer = r.spec.Options();
    so.trainer.device.kind = DeviceKind::kSim;
    so.trainer.device.sim_profile = path;
    so.trainer.device.sim_world_size = 1;
    so.trainer.device.sim_gpus_per_node = 1;
    so.warmup_steps = 1;
    so.steps = 1;
    StatusOr<SimStepReport> rep = SimulateTraining(so);
    if (!rep.ok()) {
      p.report += "| " + r.spec.Name() + " | simulation error: " + rep.status().ToString() + " |\n";
      continue;
    }
    r.predicted_s = rep->step_seconds;
    const double measured = Median(r.step_s);
    const double ratio = r.predicted_s / measured;
    if (r.spec.held_out) {
      ++p.held_total;
      if (ratio >= 0.85 && ratio <= 1.15) ++p.held_in;
    }
    char line[512];
    std::snprintf(line, sizeof(line), "| %s | %s | %.4f | %.0f%% | %.4f | %.3f |\n", r.spec.Name().c_str(),
                  r.spec.held_out ? "held out" : "fit", measured,
                  100 * (r.op_s + r.gap_s) / std::max(1e-12, measured * r.step_s.size()), r.predicted_s, ratio);
    p.report += line;
    std::fprintf(stderr, "  %-36s %-8s measured %.4f s predicted %.4f s ratio %.3f\n", r.spec.Name().c_str(),
                 r.spec.held_out ? "held out" : "fit", measured, r.predicted_s, ratio);
  }
  return p;
}

// Everything --report writes.
struct CalibrationReport {
  std::string path;    // the profile written
  std::string source;  // who measured it, where, when
  std::string load_before, load_after;
  const InStepFit* fit = nullptr;
  std::string report_corr;
  const Predictions* predictions = nullptr;
  const HotLoopCheck* hot_check = nullptr;
};

// Writes --report; false after printing why when it cannot be written.
bool WriteReport(const CalibrationReport& r) {
  std::ofstream rep(FLAGS_report);
  rep << "# cpu-local calibration\n\n"
      << "Profile: `" << r.path << "` (" << FLAGS_name << "). " << r.source << ".\n"
      << "Host: " << CpuModel() << ", " << std::thread::hardware_concurrency()
      << " hardware threads; load average " << r.load_before << " before the training runs, "
      << r.load_after << " after. Clock of the training runs: " << FLAGS_clock << ".\n\n"
      << "What was measured: hot loops through `ops::` (GEMM grid, every op at four sizes, a "
         "one-element op's fixed cost, raw allocation, the local backend's all_gather); then real "
         "training steps (world 1, DDP and FULL_SHARD, " << FLAGS_in_step_steps
      << " measured steps after 2 warm-up steps each) with every op timed as it ran. Fitting runs: "
      << (r.fit->fit_names.empty() ? "none" : r.fit->fit_names)
      << ". Their ops' in-step time over the hot-loop price, per op class and size, divides the "
         "hot-loop rates. An op's in-step time is its run plus the host work since its thread's "
         "previous op ended (mean " << r.fit->gap_per_op * 1e6 << " us per op in the fitting runs); the "
         "fitting runs spent " << r.fit->other_s << " s in total outside both (other threads' CPU time: "
         "the local backend's collectives, stream threads; on the cpu clock the measured step "
         "includes it). Held-out runs are measured alike and only predicted.\n\n"
      << "## Training runs: measured vs predicted (the new profile on the simulator, world 1)\n\n"
      << "| run | role | measured median step s | in ops and the host work between them | predicted s | predicted / measured |\n"
      << "|---|---|---|---|---|---|\n" << r.predictions->report
      << "\nHeld-out runs within +-15%: " << r.predictions->held_in << " of " << r.predictions->held_total << ".\n\n"
      << "## In-step correction per op class (fitting runs)\n\n"
      << "| class | typical work (bytes; GEMM and attention: flops) | ops | in-step us | hot-loop us | "
         "in-step / hot |\n|---|---|---|---|---|---|\n" << r.report_corr
      << "\n## Hot-loop held-out check (off-grid shapes; checks the interpolation only)\n\n"
      << "| op | work | predicted us | measured us | ratio |\n|---|---|---|---|---|\n" << r.hot_check->report
      << "\nWorst hot-loop held-out ratio: " << r.hot_check->worst << "\n";
  if (!rep) {
    std::fprintf(stderr, "cannot write %s\n", FLAGS_report.c_str());
    return false;
  }
  std::fprintf(stderr, "wrote %s\n", FLAGS_report.c_str());
  return true;
}

// --attention_only: the flash attention rates measured now, written into
// the profile at --out (its other numbers untouched; op_rates' source says
// which entries came from this run and that they are hot-loop rates).
int AttentionOnly(const ops::OpContext& ctx, const std::string& source) {
  if (FLAGS_out.empty()) {
    std::fprintf(stderr, "--attention_only needs --out=PATH, the profile to update\n");
    return 2;
  }
  StatusOr<std::string> text = ReadFileBounded(FLAGS_out, int64_t{16} << 20, "profile");
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", text.status().ToString().c_str());
    return 2;
  }
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("compute") || !doc["compute"].contains("op_rates")) {
    std::fprintf(stderr, "%s: not a measured profile (no compute.op_rates)\n", FLAGS_out.c_str());
    return 2;
  }
  const std::string load_before = LoadAverage();
  std::vector<OpTable> tables;
  AppendFlashAttentionRates(ctx, tables);
  nlohmann::json& rates = doc["compute"]["op_rates"];
  std::string names;
  for (const OpTable& t : tables) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& [work, rate] : t.points) pts.push_back({work, rate});
    rates["value"][t.name] = {{"per", t.per_flop ? "flop" : "byte"}, {"points", pts}};
    names += (names.empty() ? "" : ", ") + t.name;
  }
  rates["source"] = rates["source"].get<std::string>() + "; " + names + ": " + source +
                    " (--attention_only: hot-loop rates, one sequence of 2 causal heads of 64 at 1024, "
                    "2048 and 4096 tokens, not corrected in-step; load average " + load_before + ")";
  StatusOr<sim::SimProfile> parsed = sim::ParseProfile(doc, FLAGS_out);
  CHECK(parsed.ok()) << parsed.status();
  return WriteProfile(doc, FLAGS_out) ? 0 : 1;
}

int Main() {
  if (!FlagsValid()) return 2;
  Must(SetGemmThreads(FLAGS_threads), "threads");
  const ops::OpContext ctx = ops::HostContext();
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  const std::string source = "measured by //benchmarks:calibrate on " + CpuModel() + " (" +
                             std::to_string(FLAGS_threads) + " GEMM thread(s)), " + date;
  std::fprintf(stderr, "calibrating: %s\n", source.c_str());
  if (FLAGS_attention_only) return AttentionOnly(ctx, source);

  nlohmann::json doc;
  if (!HotLoopProfile(ctx, source, &doc)) return 2;
  StatusOr<sim::SimProfile> parsed = sim::ParseProfile(doc, FLAGS_name);
  CHECK(parsed.ok()) << parsed.status();
  const HotLoopCheck hot_check = CheckHotLoopTables(ctx, parsed->compute);

  const std::string load_before = LoadAverage();
  std::vector<RunResult> runs = RunTrainingSteps();
  const InStepFit fit = FitInStep(runs, parsed->compute);
  const std::string report_corr = ApplyInStepFit(fit, source, doc);

  const std::string path = FLAGS_out.empty() ? "/tmp/sk_calibrate_profile.json" : FLAGS_out;
  if (!WriteProfile(doc, path)) return 1;

  const Predictions predictions = PredictRuns(runs, path);
  const std::string load_after = LoadAverage();
  std::fprintf(stderr, "held-out training runs within +-15%%: %d of %d (load average %s before the runs, %s after)\n",
               predictions.held_in, predictions.held_total, load_before.c_str(), load_after.c_str());

  if (!FLAGS_report.empty() &&
      !WriteReport({path, source, load_before, load_after, &fit, report_corr, &predictions, &hot_check})) {
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  sk::cli::ParseFlags(
      "measures this machine and writes the cpu-local simulator profile: calibrate --out=PATH",
      __FILE__, &argc, &argv);
  return sk::Main();
}
