#include "benchmarks/micro/peak.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace sk::bench {
namespace {

constexpr int kChains = 16;  // independent FMA chains: enough to cover FMA latency x ports

// Keeps the sums observable (the loops would otherwise be dead code).
template <typename V>
void Keep(const V& v) {
  asm volatile("" : : "r"(&v) : "memory");
}

__attribute__((target("avx512f"))) double FmaLoopAvx512(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    // Unrolled so that the chains live in registers, not in the acc[] array.
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  Keep(s);
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx2,fma"))) double FmaLoopAvx2(int64_t iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  Keep(s);
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}

// vdpbf16ps: per 32-bit lane, two bf16 products added to the f32 lane (32
// multiply-adds per 512-bit instruction, twice an f32 FMA's 16).
__attribute__((target("avx512f,avx512bf16"))) double Bf16DotLoopAvx512(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  Keep(s);
  return 2.0 * 32 * kChains * static_cast<double>(iters);
}

bool HasAvx512() { return __builtin_cpu_supports("avx512f"); }
bool HasAvx512Bf16() { return HasAvx512() && __builtin_cpu_supports("avx512bf16"); }

// The best of 5 repetitions of `threads` threads running `loop`.
template <typename Loop>
PeakResult MeasurePeak(int threads, const char* isa, Loop loop) {
  const int64_t iters = 20'000'000;
  PeakResult best;
  best.isa = isa;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> flops(threads), cpu(threads);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        double c0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
        flops[t] = loop(iters);
        cpu[t] = CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - c0;
      });
    }
    for (auto& th : pool) th.join();
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double total = 0;
    for (int t = 0; t < threads; ++t) {
      total += flops[t];
      best.per_thread = std::max(best.per_thread, flops[t] / cpu[t]);
    }
    best.wall = std::max(best.wall, total / sec);
  }
  return best;
}

}  // namespace

double CpuSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

PeakResult MeasureFmaPeak(int threads) {
  if (HasAvx512()) return MeasurePeak(threads, "avx512 fma", FmaLoopAvx512);
  return MeasurePeak(threads, "avx2 fma", FmaLoopAvx2);
}

bool HasAmxBf16() { return __builtin_cpu_supports("amx-bf16"); }

PeakResult MeasureBf16DotPeak(int threads) {
  if (!HasAvx512Bf16()) return PeakResult{0.0, 0.0, "none (no avx512_bf16)"};
  return MeasurePeak(threads, "avx512_bf16 vdpbf16ps", Bf16DotLoopAvx512);
}

}  // namespace sk::bench
