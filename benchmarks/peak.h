// The machine's measured f32 FMA peak: the denominator of every "of peak"
// figure in the CPU benchmarks (//benchmarks:kernels, :step_breakdown).
// Register-only FMA chains, AVX-512 where the CPU has it, else AVX2 + FMA;
// measured, not a datasheet figure.
#ifndef SHARDKIT_BENCHMARKS_PEAK_H_
#define SHARDKIT_BENCHMARKS_PEAK_H_

#include <ctime>

namespace sk::bench {

struct PeakResult {
  double wall = 0.0;        // FLOP/s of all threads together, wall clock
  double per_thread = 0.0;  // FLOP per CPU-second of one thread (robust under load)
  const char* isa = "";     // "avx512 fma" or "avx2 fma"
};

// `threads` threads each run the FMA loop; the best of 5 repetitions for each
// figure. Takes about 0.1 s per repetition on an idle core.
PeakResult MeasureFmaPeak(int threads);

// The CPU seconds of `clock` (CLOCK_THREAD_CPUTIME_ID, CLOCK_PROCESS_CPUTIME_ID).
double CpuSeconds(clockid_t clock);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PEAK_H_
