// Kernel, op and model-step micro-benchmarks (runtime/ops, runtime/nn).
//
//   bazel run -c opt //benchmarks:kernels
//
// 1. Peak: the machine's measured f32 FMA throughput (register-only FMA
//    chains on every core, AVX-512 where the CPU has it, else AVX2), the
//    denominator of every "of peak" figure below. Measured, not a datasheet.
// 2. GEMM GFLOP/s for OpenBLAS and oneDNN at square and model-shaped sizes.
// 3. Ops through the op layer (runtime/ops) at gpt-10m shapes: achieved
//    GFLOP/s and GB/s from each op's declared cost (runtime/ops/cost.h).
// 4. A training step (forward + backward + SGD) of gpt-1m, gpt-10m (with and
//    without activation checkpointing) and t5-10m: tokens/s and model-FLOPs
//    utilisation (MFU = model FLOPs / time / peak).
//
// SK_BENCH_THREADS=n runs everything on n threads (both BLAS libraries are
// told so, and "peak" is the n-thread peak); the default is every core.
// Per-thread numbers (n = 1) are the robust ones on a shared machine.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "benchmarks/micro/peak.h"
#include "runtime/core/env.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/model_family.h"
#include "runtime/nn/data.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"

namespace sk {
namespace {

using bench::CpuSeconds;
using bench::PeakResult;

// CPU seconds of the whole process: on a machine shared with other jobs,
// flops per CPU-second is the throughput of the cores we actually got.
double ProcessCpuSeconds() { return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }

PeakResult MeasurePeak(int threads) { return bench::MeasureFmaPeak(threads); }

// SK_BENCH_THREADS, or every core.
int BenchThreads() {
  const char* env = GetEnv(EnvVar::kBenchThreads);
  int n = env ? std::atoi(env) : 0;
  return n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The peak of BenchThreads() threads, measured once.
const PeakResult& Peak() {
  static const PeakResult peak = MeasurePeak(BenchThreads());
  return peak;
}

void BM_PeakFma(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  PeakResult peak;
  for (auto _ : state) peak = MeasurePeak(threads);
  state.counters["GFLOP/s"] = peak.wall / 1e9;
  state.counters["GFLOP/cpu_s"] = peak.per_thread / 1e9;
  state.SetLabel(peak.isa);
}
BENCHMARK(BM_PeakFma)->Arg(1)->Arg(2)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// The bf16 dot-product peak (vdpbf16ps chains; peak.h), in f32-equivalent
// FLOPs: the ceiling of the bf16 GEMMs and attention on CPUs with
// avx512_bf16 and no AMX. Skipped without avx512_bf16.
void BM_PeakBf16Dot(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  PeakResult peak;
  for (auto _ : state) peak = bench::MeasureBf16DotPeak(threads);
  if (peak.per_thread == 0.0) {
    state.SkipWithError("no avx512_bf16 on this CPU");
    return;
  }
  state.counters["GFLOP/s"] = peak.wall / 1e9;
  state.counters["GFLOP/cpu_s"] = peak.per_thread / 1e9;
  state.counters["over_fma_peak"] = peak.per_thread / Peak().per_thread;
  state.SetLabel(std::string(peak.isa) + (bench::HasAmxBf16() ? " (AMX here: not the bf16 GEMMs' ceiling)" : ""));
}
BENCHMARK(BM_PeakBf16Dot)->Arg(1)->Arg(2)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// Sets the rate counters of a benchmark that did `flops` per iteration and
// used `cpu_s` process CPU-seconds in total.
void SetFlopCounters(benchmark::State& state, double flops, double cpu_s) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_frac"] =
      benchmark::Counter(flops / Peak().wall, benchmark::Counter::kIsIterationInvariantRate);
  const double total = flops * static_cast<double>(state.iterations());
  state.counters["GFLOP/cpu_s"] = total / cpu_s / 1e9;
  // Per-thread efficiency: flops per CPU-second against one thread's peak.
  state.counters["cpu_peak_frac"] = total / cpu_s / Peak().per_thread;
}

void BM_Gemm(benchmark::State& state) {
  const GemmBackend backend = static_cast<GemmBackend>(state.range(0));
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.1f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.1f;
  Peak();
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n, backend);
    benchmark::ClobberMemory();
  }
  SetFlopCounters(state, 2.0 * m * n * k, ProcessCpuSeconds() - cpu0);
  state.SetLabel(std::string(GemmBackendName(backend)));
}

void GemmShapes(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][3] = {
      {256, 256, 256},   {512, 512, 512},   {1024, 1024, 1024}, {2048, 2048, 2048},
      // gpt-10m at 8 x 256 tokens: qkv, MLP up, MLP down, LM head (forward).
      {2048, 1152, 384}, {2048, 1536, 384}, {2048, 384, 1536},  {2048, 1024, 384},
      // Attention scores of one head (T x T x head_dim).
      {256, 256, 64}};
  for (int backend : {static_cast<int>(GemmBackend::kOpenBlas), static_cast<int>(GemmBackend::kOneDnn)}) {
    for (const auto& s : shapes) b->Args({backend, s[0], s[1], s[2]});
  }
}
BENCHMARK(BM_Gemm)->Apply(GemmShapes)->ArgNames({"lib", "m", "n", "k"})->UseRealTime()->Unit(benchmark::kMillisecond);

// bf16 operands with f32 accumulation (oneDNN matmul). Rates are f32-equivalent
// FLOPs; AVX512-BF16's dot-product instruction does twice the FLOPs of an f32
// FMA, so the fraction of the f32 peak can exceed 1.
void BM_GemmBF16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  // ta: A stored [k, m] and read transposed (a weight gradient, x^T dy);
  // acc: C += A B (the gradient accumulates).
  const bool ta = state.range(3) != 0, acc = state.range(4) != 0;
  std::vector<BF16> a(m * k), b(k * n);
  std::vector<float> c(m * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = FloatToBF16(static_cast<float>(i % 7) * 0.1f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = FloatToBF16(static_cast<float>(i % 5) * 0.1f);
  const int64_t lda = ta ? m : k;
  Peak();
  GemmBF16(ta, false, m, n, k, a.data(), lda, b.data(), n, acc, c.data(), n);  // builds the primitive
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    GemmBF16(ta, false, m, n, k, a.data(), lda, b.data(), n, acc, c.data(), n);
    benchmark::ClobberMemory();
  }
  SetFlopCounters(state, 2.0 * m * n * k, ProcessCpuSeconds() - cpu0);
  state.SetLabel(Bf16GemmHardware() ? "onednn bf16 (bf16 hardware)" : "onednn bf16 (no bf16 hardware: converted)");
}
BENCHMARK(BM_GemmBF16)
    ->Args({1024, 1024, 1024, 0, 0})
    ->Args({2048, 2048, 2048, 0, 0})
    ->Args({2048, 1536, 384, 0, 0})
    ->Args({2048, 384, 1536, 0, 0})
    // gpt-deep-20m's weight gradients (rows 1024): A transposed, C accumulated.
    ->Args({1024, 256, 1024, 1, 1})
    ->Args({256, 1024, 1024, 1, 1})
    ->Args({1024, 256, 1024, 0, 1})
    ->Args({256, 1024, 1024, 0, 1})
    ->ArgNames({"m", "n", "k", "ta", "acc"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// A linear layer's forward in bf16, y = x w + bias with y in bf16: fused:1
// adds the bias inside oneDNN's matmul (GemmBF16Bias), fused:0 writes the
// bias into y and accumulates the product onto it (two passes over y).
// The same up to f32 summation order (cpu_kernels_test:
// Bf16GemmBiasIsTheProductPlusTheBiasRoundedOnce).
void BM_GemmBF16Bias(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool fused = state.range(3) != 0;
  std::vector<BF16> a(m * k), b(k * n), bias(n), c(m * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = FloatToBF16(static_cast<float>(i % 7) * 0.1f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = FloatToBF16(static_cast<float>(i % 5) * 0.1f);
  for (int64_t j = 0; j < n; ++j) bias[j] = FloatToBF16(static_cast<float>(j % 3));
  auto run = [&] {
    if (fused) {
      GemmBF16Bias(false, false, m, n, k, a.data(), k, b.data(), n, bias.data(), c.data(), n);
    } else {
      for (int64_t i = 0; i < m; ++i) std::memcpy(c.data() + i * n, bias.data(), sizeof(BF16) * n);
      GemmBF16(false, false, m, n, k, a.data(), k, b.data(), n, true, c.data(), n);
    }
  };
  Peak();
  run();  // builds the primitive
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  SetFlopCounters(state, 2.0 * m * n * k, ProcessCpuSeconds() - cpu0);
}
BENCHMARK(BM_GemmBF16Bias)
    ->ArgsProduct({{1024}, {1024}, {256}, {0, 1}})  // gpt-deep-20m's first MLP layer
    ->Args({2048, 1536, 384, 0})                     // gpt-10m's
    ->Args({2048, 1536, 384, 1})
    ->ArgNames({"m", "n", "k", "fused"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- Ops through the op layer ------------------------------------------------
//
// Each op called through runtime/ops (validation, cost, the CPU backend) on
// model-shaped operands; GFLOP/s and GB/s come from the op's declared cost
// (runtime/ops/cost.h), the same numbers the simulator prices.

Tensor HostF32(int64_t n, float v = 0.5f) {
  Tensor t = *HostAllocator::Default().Empty(DType::kF32, Shape{n});
  std::fill(t.data_as<float>(), t.data_as<float>() + n, v);
  return t;
}

// A host tensor of `n` elements of dtype `t`, every element `v` (rounded).
Tensor Host(DType t, int64_t n, float v = 0.5f) {
  if (t == DType::kF32) return HostF32(n, v);
  Tensor t16 = *HostAllocator::Default().Empty(t, Shape{n});
  std::fill(t16.data_as<BF16>(), t16.data_as<BF16>() + n, FloatToBF16(v));
  return t16;
}

void SetCostCounters(benchmark::State& state, const ops::OpCost& cost) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(cost.flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] =
      benchmark::Counter((cost.bytes_read + cost.bytes_written) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(cost.name);
}

template <typename Fn>
void RunOp(benchmark::State& state, const ops::OpCost& cost, Fn op) {
  Status first = op();
  if (!first.ok()) {
    state.SkipWithError(first.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    Status s = op();
    benchmark::DoNotOptimize(s);
  }
  SetCostCounters(state, cost);
}

void BM_OpGemm(benchmark::State& state) {
  const DType t = state.range(0) == 0 ? DType::kF32 : DType::kBF16;
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  const ops::OpContext ctx = ops::HostContext();
  Tensor a = *HostAllocator::Default().Empty(t, Shape{m * k});
  Tensor b = *HostAllocator::Default().Empty(t, Shape{k * n});
  if (!ops::Fill(ctx, a, 0.5f).ok() || !ops::Fill(ctx, b, 0.25f).ok()) return;
  Tensor c = HostF32(m * n);
  ops::GemmParams p;
  p.m = m, p.n = n, p.k = k;
  RunOp(state, ops::GemmCost(m, n, k, 1, t, false),
        [&] { return ops::Gemm(ctx, p, {a, 0, k}, {b, 0, n}, {c, 0, n}); });
}
BENCHMARK(BM_OpGemm)
    ->Args({0, 2048, 1536, 384})
    ->Args({0, 2048, 384, 1536})
    ->Args({1, 2048, 1536, 384})
    ->ArgNames({"bf16", "m", "n", "k"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// gpt-10m shapes: 2048 rows (8 x 256 tokens), d_model 384, d_ff 1536, 6 heads.
constexpr int64_t kRows = 2048, kC = 384, kFf = 1536, kHeads = 6, kBatch = 8, kSeq = 256;

void BM_OpLayerNorm(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  Tensor x = HostF32(kRows * kC), y = HostF32(kRows * kC), g = HostF32(kC), m = HostF32(kRows),
         r = HostF32(kRows), dx = HostF32(kRows * kC), dg = HostF32(kC), db = HostF32(kC);
  if (state.range(0) == 0) {
    RunOp(state, ops::LayerNormForwardCost(kRows, kC),
          [&] { return ops::LayerNormForward(ctx, x, g, g, y, m, r); });
  } else {
    RunOp(state, ops::LayerNormBackwardCost(kRows, kC),
          [&] { return ops::LayerNormBackward(ctx, x, g, y, m, r, dx, dg, db); });
  }
}
BENCHMARK(BM_OpLayerNorm)->Arg(0)->Arg(1)->ArgName("bwd")->UseRealTime()->Unit(benchmark::kMicrosecond);

// bf16 = 1: activations in bf16, as under param_dtype = bf16 (the op widens
// to f32, computes and rounds once).
void BM_OpGelu(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const DType t = state.range(1) ? DType::kBF16 : DType::kF32;
  Tensor x = Host(t, kRows * kFf), y = Host(t, kRows * kFf), dx = Host(t, kRows * kFf);
  if (state.range(0) == 0) {
    RunOp(state, ops::GeluForwardCost(kRows * kFf, t, t), [&] { return ops::GeluForward(ctx, x, y); });
  } else {
    RunOp(state, ops::GeluBackwardCost(kRows * kFf, t, t),
          [&] { return ops::GeluBackward(ctx, x, y, dx); });
  }
}
BENCHMARK(BM_OpGelu)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"bwd", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// dtype: 0 f32; 1 bf16 operands on bf16 dot products (kernels.h:
// AttentionForwardBF16; where NativeBf16Attention() is false it runs the
// widened path as 2 does); 2 bf16 operands widened into f32 blocks (the path
// before the bf16 kernels, and the one without AVX512-BF16).
// model: 0 gpt-10m (6 heads of 64, sequence 256), 1 gpt-deep-20m (8 heads
// of 32, sequence 128); batch 8 for both.
// layers: how many layers' operands the calls rotate through (1: the same
// buffers every call, warm in cache; the model's count: each call's q, k, v
// and probs come from memory, as in a training step, where every layer's
// probs are kept for backward).
void BM_OpAttention(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const DType t = state.range(1) == 0 ? DType::kF32 : DType::kBF16;
  const bool native = SetNativeBf16Attention(state.range(1) != 2);
  const bool deep = state.range(2) != 0;
  const int64_t layers = state.range(3);
  const int64_t heads = deep ? 8 : kHeads, seq = deep ? 128 : kSeq, c = deep ? 256 : kC;
  const int64_t rows = kBatch * seq;
  ops::AttentionShape s{kBatch, heads, seq, seq, c / heads, true};
  std::vector<Tensor> qkv, probs;
  for (int64_t l = 0; l < layers; ++l) {
    qkv.push_back(Host(t, rows * 3 * c, 0.01f));
    probs.push_back(HostF32(kBatch * heads * seq * seq));
  }
  Tensor att = Host(t, rows * c), dqkv = Host(t, rows * 3 * c);
  int64_t next = 0;
  auto forward = [&](int64_t l) {
    return ops::AttentionForward(ctx, s, {qkv[l], 0, 3 * c}, {qkv[l], c, 3 * c}, {qkv[l], 2 * c, 3 * c}, probs[l],
                                 {att, 0, c});
  };
  if (state.range(0) == 0) {
    RunOp(state, ops::AttentionForwardCost(kBatch, heads, seq, seq, c / heads), [&] {
      const int64_t l = next;
      next = (next + 1) % layers;
      return forward(l);
    });
  } else {
    bool ok = true;
    for (int64_t l = 0; l < layers; ++l) ok = ok && forward(l).ok();
    if (ok) {
      RunOp(state, ops::AttentionBackwardCost(kBatch, heads, seq, seq, c / heads), [&] {
        const int64_t l = next;
        next = (next + 1) % layers;
        return ops::AttentionBackward(ctx, s, {qkv[l], 0, 3 * c}, {qkv[l], c, 3 * c}, {qkv[l], 2 * c, 3 * c},
                                      probs[l], {att, 0, c}, {dqkv, 0, 3 * c}, {dqkv, c, 3 * c},
                                      {dqkv, 2 * c, 3 * c});
      });
    }
  }
  SetNativeBf16Attention(native);
}
BENCHMARK(BM_OpAttention)
    ->ArgsProduct({{0, 1}, {0, 1, 2}, {0, 1}, {1}})
    ->Args({0, 1, 1, 24})
    ->Args({1, 1, 1, 24})
    ->Args({0, 1, 0, 6})
    ->Args({1, 1, 0, 6})
    ->ArgNames({"bwd", "dtype", "deep", "layers"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Causal self-attention at long sequences, f32, one sequence: the composed
// attention (probabilities kept, blocked over queries; what GPT models ran
// on the CPU before the linear-memory one matched it) against the
// linear-memory one (FlashAttention-2: blocks of queries and keys, an
// online softmax, backward recomputing P). flash: 0 composed, 1
// linear-memory; bwd: 0 forward, 1 backward (after one forward); heads x
// head_dim: 12 x 64 is GPT-2 small's (and gpt-150m's) head shape, 2 x 16
// gpt-tiny's. Process CPU time is the figure to compare on a shared machine
// (ops::kCpuFlashAttentionMinKeys rests on it; docs/benchmarks.md).
void BM_AttentionLongSequence(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const bool flash = state.range(0) != 0, bwd = state.range(1) != 0;
  const int64_t seq = state.range(2), heads = state.range(3), d = state.range(4), c = heads * d;
  ops::AttentionShape s{1, heads, seq, seq, d, true};
  Tensor qkv = Host(DType::kF32, seq * 3 * c, 0.01f), att = HostF32(seq * c);
  Tensor dout = Host(DType::kF32, seq * c, 0.02f), dqkv = HostF32(seq * 3 * c);
  Tensor probs = flash ? Tensor() : HostF32(heads * seq * seq);
  Tensor lse = HostF32(heads * seq);
  using ops::MatrixRef;
  const MatrixRef q{qkv, 0, 3 * c}, k{qkv, c, 3 * c}, v{qkv, 2 * c, 3 * c}, o{att, 0, c};
  const MatrixRef dq{dqkv, 0, 3 * c}, dk{dqkv, c, 3 * c}, dv{dqkv, 2 * c, 3 * c};
  auto forward = [&] {
    return flash ? ops::FlashAttentionForward(ctx, s, q, k, v, o, lse)
                 : ops::AttentionForward(ctx, s, q, k, v, probs, o);
  };
  const ops::OpCost cost = flash ? (bwd ? ops::FlashAttentionBackwardCost(1, heads, seq, seq, d, true)
                                        : ops::FlashAttentionForwardCost(1, heads, seq, seq, d, true))
                                 : (bwd ? ops::AttentionBackwardCost(1, heads, seq, seq, d)
                                        : ops::AttentionForwardCost(1, heads, seq, seq, d));
  if (!bwd) {
    RunOp(state, cost, forward);
    return;
  }
  if (!forward().ok()) return;
  RunOp(state, cost, [&] {
    return flash ? ops::FlashAttentionBackward(ctx, s, q, k, v, o, {dout, 0, c}, lse, dq, dk, dv)
                 : ops::AttentionBackward(ctx, s, q, k, v, probs, {dout, 0, c}, dq, dk, dv);
  });
}
BENCHMARK(BM_AttentionLongSequence)
    ->ArgsProduct({{0, 1}, {0, 1}, {512, 768, 1024, 2048, 4096}, {12}, {64}})
    ->ArgsProduct({{0, 1}, {0, 1}, {1024, 2048}, {2}, {16}})
    ->ArgNames({"flash", "bwd", "seq", "heads", "d"})
    ->UseRealTime()
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kMillisecond);

void BM_OpCrossEntropy(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const int64_t vocab = 8192;
  Tensor logits = HostF32(kRows * vocab, 0.1f), loss = HostF32(1);
  Tensor targets = *HostAllocator::Default().Empty(DType::kI32, Shape{kRows});
  for (int64_t i = 0; i < kRows; ++i) targets.data_as<int32_t>()[i] = static_cast<int32_t>(i % vocab);
  RunOp(state, ops::CrossEntropyForwardCost(kRows, vocab),
        [&] { return ops::CrossEntropyForward(ctx, logits, targets, loss); });
}
BENCHMARK(BM_OpCrossEntropy)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_OpAdamW(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const int64_t n = int64_t{1} << 22;
  Tensor p = HostF32(n), g = HostF32(n, 0.01f), m = HostF32(n, 0.0f), v = HostF32(n, 0.0f);
  AdamHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, true, 0.1f, 0.03f};
  RunOp(state, ops::AdamUpdateCost(n, true),
        [&] { return ops::AdamUpdate(ctx, h, p, g, m, v); });
}
BENCHMARK(BM_OpAdamW)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_OpCast(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const int64_t n = int64_t{1} << 22;
  Tensor src = HostF32(n, 1.25f);
  Tensor dst = *HostAllocator::Default().Empty(DType::kBF16, Shape{n});
  RunOp(state, ops::CastCost(n, DType::kF32, DType::kBF16), [&] { return ops::Cast(ctx, src, dst); });
}
BENCHMARK(BM_OpCast)->UseRealTime()->Unit(benchmark::kMillisecond);

// y += x with an f32 x into an f32 (0) or bf16 (1) y: the model's flush of
// its f32 gradient sinks into a 16-bit full gradient, 4M elements.
void BM_OpAxpy(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const int64_t n = int64_t{1} << 22;
  const DType yt = state.range(0) ? DType::kBF16 : DType::kF32;
  Tensor x = HostF32(n, 1e-3f);
  Tensor y = *HostAllocator::Default().Empty(yt, Shape{n});
  CHECK(ops::Fill(ctx, y, 1.0f).ok());
  RunOp(state, ops::AxpyCost(n, DType::kF32, yt), [&] { return ops::Axpy(ctx, 1.0f, x, y); });
}
BENCHMARK(BM_OpAxpy)->Arg(0)->Arg(1)->ArgName("bf16")->UseRealTime()->Unit(benchmark::kMillisecond);

// A bias gradient: column sums of dy [kRows, n] (bf16 = 1: a bf16 dy, as
// under param_dtype = bf16) into an f32 dbias; n = d_model or d_ff.
void BM_OpBiasGrad(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const DType t = state.range(0) ? DType::kBF16 : DType::kF32;
  const int64_t n = state.range(1);
  Tensor dy = Host(t, kRows * n, 0.25f);
  Tensor db = HostF32(n);
  RunOp(state, ops::BiasGradCost(kRows, n, t), [&] { return ops::BiasGrad(ctx, dy, db); });
}
BENCHMARK(BM_OpBiasGrad)
    ->ArgsProduct({{0, 1}, {kC, kFf}})
    ->ArgNames({"bf16", "n"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Fill of 4M f32 elements with zero (0: a gradient buffer's clear) or a
// non-zero value (1).
void BM_OpFill(benchmark::State& state) {
  const ops::OpContext ctx = ops::HostContext();
  const int64_t n = int64_t{1} << 22;
  Tensor x = HostF32(n);
  const float v = state.range(0) ? 1.0f : 0.0f;
  RunOp(state, ops::FillCost(n, DType::kF32), [&] { return ops::Fill(ctx, x, v); });
}
BENCHMARK(BM_OpFill)->Arg(0)->Arg(1)->ArgName("nonzero")->UseRealTime()->Unit(benchmark::kMillisecond);

// One training step (forward + backward + SGD) of a named model on a
// synthetic batch: tokens/s and model-FLOPs utilisation. MFU counts model
// FLOPs only; with checkpointing the recomputed forward is not credited.
void BM_TrainStep(benchmark::State& state, const char* name, int64_t batch, int64_t seq,
                  int64_t source, bool checkpointing) {
  auto cfg = FindModelConfig(name);
  if (!cfg.ok()) {
    state.SkipWithError(cfg.status().ToString().c_str());
    return;
  }
  ModelOptions options;
  options.activation_checkpointing = checkpointing;
  auto model = CreateModel(*cfg, options);
  const ModelFamilyDescription* family = FindModelFamily(cfg->family);
  const bool t5 = family != nullptr && family->batches == FamilyBatches::kEncoderDecoder;
  auto params = OwnedParameters::Create((*model)->units(), 1);
  auto stream = SyntheticTokenStream(1, BatchIdSpace(*cfg), 100000);
  if (!model.ok() || !params.ok() || !stream.ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  auto b = t5 ? ReversalBatch(*stream, batch, source, seq, 0, 1, 0)
              : LanguageModelBatch(*stream, batch, seq, 1, 0);
  if (!b.ok()) {
    state.SkipWithError(b.status().ToString().c_str());
    return;
  }
  OptimizerOptions sgd_options;
  sgd_options.kind = OptimizerKind::kSgd;
  sgd_options.lr = 1e-3f;
  auto sgd = *Optimizer::Create(sgd_options, &HostAllocator::Default());
  auto refs = *ShardRefsFor((*params)->all_params(), (*params)->all_grads());
  Peak();
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    (*params)->ZeroGrad();
    auto loss = (*model)->ForwardBackward(*b, **params, HostAllocator::Default());
    if (!loss.ok()) {
      state.SkipWithError(loss.status().ToString().c_str());
      return;
    }
    if (!sgd->Step(ops::HostContext(), refs).ok()) {
      state.SkipWithError("sgd failed");
      return;
    }
  }
  const double cpu_s = ProcessCpuSeconds() - cpu0;
  const double tokens = static_cast<double>(batch * seq);
  const StepFlops flops = (*model)->Flops(batch, seq, source);
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  // MFU = model GFLOP/s over the measured peak (wall clock); cpu_MFU the
  // same per CPU-second against one thread's peak.
  SetFlopCounters(state, flops.model_flops, cpu_s);
  state.counters["MFU"] = state.counters["peak_frac"];
  state.counters["cpu_MFU"] = state.counters["cpu_peak_frac"];
  state.counters.erase("peak_frac");
  state.counters.erase("cpu_peak_frac");
  state.SetLabel(std::string(name) + (checkpointing ? " ckpt" : "") +
                 " gemm=" + std::string(GemmBackendName(DefaultGemmBackend())));
}
BENCHMARK_CAPTURE(BM_TrainStep, gpt_1m, "gpt-1m", 8, 128, 0, false)
    ->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_TrainStep, gpt_10m, "gpt-10m", 8, 256, 0, false)
    ->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(5.0);
BENCHMARK_CAPTURE(BM_TrainStep, gpt_10m_ckpt, "gpt-10m", 8, 256, 0, true)
    ->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(5.0);
BENCHMARK_CAPTURE(BM_TrainStep, t5_10m, "t5-10m", 8, 128, 128, false)
    ->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(5.0);

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  const int threads = sk::BenchThreads();
  if (!sk::SetGemmThreads(threads).ok()) return 1;
  benchmark::AddCustomContext("bench_threads", std::to_string(threads));
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", sk::GetEnv(sk::EnvVar::kOpenblasCoretype)
                                                       ? sk::GetEnv(sk::EnvVar::kOpenblasCoretype)
                                                       : "(unset)");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
