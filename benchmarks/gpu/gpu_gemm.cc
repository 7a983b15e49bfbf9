// GEMM throughput on a GPU through the op layer (ops::Gemm, which the CUDA
// backend runs as cuBLAS): TFLOP/s per input dtype and shape, timed with CUDA
// events around `kInner` back-to-back GEMMs on one stream. One benchmark
// iteration is those kInner GEMMs and its manual time is theirs: reporting
// one GEMM's time per iteration instead made the library run kInner times
// the work its MinTime asks for (about 20 s per shape, 15 shapes: the
// "hang" in the 9th benchmark that the GPU suite's timeout killed). The GPU suite
// (tools/gpu/run.sh) runs it and its report divides by the device's datasheet
// dense peak. Without a GPU every benchmark reports "no CUDA device".
//
//   ./bazelw run --config=cuda -c opt //benchmarks:gpu_gemm
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include "runtime/memory/caching_allocator.h"
#include "runtime/ops/ops.h"

namespace sk {
namespace {

constexpr int kInner = 20;  // GEMMs per timed iteration

struct Gpu {
  Device* device = nullptr;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<StreamAllocator> alloc;
  std::string error;
};

Gpu& TheGpu() {
  static Gpu* gpu = [] {
    auto* g = new Gpu();
    if (Device::CudaDeviceCount() == 0) {
      g->error = "no CUDA device";
      return g;
    }
    auto d = Device::Get(DeviceId::Cuda(0));
    auto cache = CachingAllocator::ForDevice(DeviceId::Cuda(0));
    if (!d.ok() || !cache.ok()) {
      g->error = (!d.ok() ? d.status() : cache.status()).ToString();
      return g;
    }
    g->device = *d;
    auto s = g->device->CreateStream("gemm");
    if (!s.ok()) {
      g->error = s.status().ToString();
      return g;
    }
    g->stream = std::move(s).value();
    g->alloc = std::make_unique<StreamAllocator>(*cache, g->stream.get());
    return g;
  }();
  return *gpu;
}

// C[m, n] (f32) = A[m, k] B[k, n] with A and B in `dtype`.
void BM_Gemm(benchmark::State& state, DType dtype) {
  Gpu& gpu = TheGpu();
  if (!gpu.error.empty()) {
    state.SkipWithError(gpu.error.c_str());
    return;
  }
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  ops::OpContext ctx{gpu.device, gpu.stream.get(), gpu.alloc.get()};
  auto a = gpu.alloc->Empty(dtype, Shape{m, k});
  auto b = gpu.alloc->Empty(dtype, Shape{k, n});
  auto c = gpu.alloc->Empty(DType::kF32, Shape{m, n});
  if (!a.ok() || !b.ok() || !c.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  Status s = ops::Fill(ctx, *a, 0.01f);
  if (s.ok()) s = ops::Fill(ctx, *b, 0.02f);
  ops::GemmParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  ops::MatrixRef ra{*a, 0, k, 0}, rb{*b, 0, n, 0}, rc{*c, 0, n, 0};
  auto start = gpu.device->CreateEvent(true);
  auto stop = gpu.device->CreateEvent(true);
  if (!s.ok() || !start.ok() || !stop.ok()) {
    state.SkipWithError(!s.ok() ? s.ToString().c_str() : "event creation failed");
    return;
  }
  if (Status warm = ops::Gemm(ctx, p, ra, rb, rc); !warm.ok()) {  // cuBLAS picks its kernel
    state.SkipWithError(warm.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    Status st = (*start)->Record(*gpu.stream);
    for (int i = 0; i < kInner && st.ok(); ++i) st = ops::Gemm(ctx, p, ra, rb, rc);
    if (st.ok()) st = (*stop)->Record(*gpu.stream);
    if (st.ok()) st = (*stop)->Synchronize();
    auto ms = (*start)->ElapsedMillis(**stop);
    if (!st.ok() || !ms.ok()) {
      state.SkipWithError(!st.ok() ? st.ToString().c_str() : ms.status().ToString().c_str());
      return;
    }
    state.SetIterationTime(*ms / 1e3);  // the kInner GEMMs this iteration ran
  }
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * m * n * k * kInner * 1e-12,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GEMMs/iter"] = kInner;
  state.SetLabel(std::string(DTypeName(dtype)));
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->Args({4096, 4096, 4096})->Args({8192, 8192, 8192});
  // gpt-1.3b-like projections at 8 x 2048 tokens: qkv, mlp up, mlp down.
  b->Args({16384, 6144, 2048})->Args({16384, 8192, 2048})->Args({16384, 2048, 8192});
  b->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

BENCHMARK_CAPTURE(BM_Gemm, f32, DType::kF32)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Gemm, bf16, DType::kBF16)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Gemm, f16, DType::kF16)->Apply(Shapes);

}  // namespace
}  // namespace sk

BENCHMARK_MAIN();
