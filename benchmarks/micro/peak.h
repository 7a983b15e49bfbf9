// The machine's measured f32 FMA peak: the denominator of every "of peak"
// figure in the CPU benchmarks (//benchmarks:kernels, :step_breakdown); and
// its bf16 dot-product peak, which bf16 runs also report against.
// Register-only FMA chains, AVX-512 where the CPU has it, else AVX2 + FMA;
// measured, not a datasheet figure.
#ifndef SHARDKIT_BENCHMARKS_MICRO_PEAK_H_
#define SHARDKIT_BENCHMARKS_MICRO_PEAK_H_

#include <ctime>

namespace sk::bench {

struct PeakResult {
  double wall = 0.0;        // FLOP/s of all threads together, wall clock
  double per_thread = 0.0;  // FLOP per CPU-second of one thread (robust under load)
  const char* isa = "";     // "avx512 fma", "avx2 fma", "avx512_bf16 vdpbf16ps"
};

// `threads` threads each run the FMA loop; the best of 5 repetitions for each
// figure. Takes about 0.1 s per repetition on an idle core.
PeakResult MeasureFmaPeak(int threads);

// The bf16 dot-product peak, in f32-equivalent FLOPs (a bf16 product and its
// addition count 2, as in an f32 FMA): register-only vdpbf16ps chains, the
// instruction oneDNN's and LIBXSMM's bf16 kernels run on CPUs with
// avx512_bf16 but no AMX. Zeros (isa "none ...") without avx512_bf16. On
// AMX CPUs oneDNN's bf16 GEMMs run on the tiles instead and can exceed it.
PeakResult MeasureBf16DotPeak(int threads);

// Whether this CPU has AMX with bf16 tiles (Sapphire Rapids and later), on
// which oneDNN's bf16 GEMMs exceed MeasureBf16DotPeak: reports that quote
// that peak say so next to it.
bool HasAmxBf16();

// The CPU seconds of `clock` (CLOCK_THREAD_CPUTIME_ID, CLOCK_PROCESS_CPUTIME_ID).
double CpuSeconds(clockid_t clock);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_MICRO_PEAK_H_
