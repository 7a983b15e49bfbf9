// The Llama MLP's f32 GEMMs on one thread, as the model runs them and as a
// fused gate+up GEMM would (issue 45 item 4): does fusing pay on the CPU?
//
//   ./bazelw run -c opt //benchmarks:llama_mlp_gemms -- [--rows=512]
//       [--d_model=384] [--d_ff=1024] [--vocab=1024]
//
// Weights are stored [in, out] (runtime/nn/llama.cc), so with N rows, C =
// d_model, F = d_ff each projection is
//   forward  y  = x W          N x F x C  NN (B's leading dimension F)
//   dx       dx += dy W^T      N x C x F  NT
//   dW       dW += x^T dy      C x F x N  TN
// A fused gate+up GEMM (weights [C, 2F]) runs each once with F doubled in
// the output (forward, dW) or in the reduction (dx). Printed per row: GFLOP
// per CPU-second of the process (best of 5 repetitions of 20 calls, warm
// caches: an upper bound on what the step's cold calls reach) for the two
// separate GEMMs and the fused one. Then, for the forward, the same GEMM with
// B copied into a leading dimension padded by 16 floats (the copy timed in
// each call), whether the padded product is bit-identical, and the LM head's
// forward (N x vocab x C NN) likewise: with B's rows a multiple of 4 KiB
// apart oneDNN's f32 GEMM can run far below its rate on other strides.
// Results: benchmarks/results/llama_f32_profile_20261207.md.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/micro/peak.h"
#include "runtime/ops/cpu/kernels.h"
#include "tools/cli_flags.h"

namespace sk {
namespace {

struct Shape {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
};

std::vector<float> Filled(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(seed >> 8)) / 8388608.0f - 1.0f;
  }
  return v;
}

size_t Elements(bool trans, int64_t rows, int64_t cols, int64_t ld) {
  // Rows x cols as op() sees it; stored transposed when trans.
  return static_cast<size_t>(trans ? cols * ld : rows * ld);
}

// GFLOP per CPU-second, best of 5 repetitions of 20 calls; `before`, if
// set, runs before each call and is timed with it.
template <typename F>
double Rate(const Shape& s, float beta, F before) {
  std::vector<float> a = Filled(Elements(s.ta, s.m, s.k, s.lda), 1);
  std::vector<float> b = Filled(Elements(s.tb, s.k, s.n, s.ldb), 2);
  std::vector<float> c = Filled(static_cast<size_t>(s.m * s.ldc), 3);
  auto call = [&] {
    const float* bp = before(b.data());
    Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), s.lda, bp, s.ldb, beta, c.data(), s.ldc);
  };
  for (int i = 0; i < 3; ++i) call();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const double t0 = bench::CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < 20; ++i) call();
    best = std::min(best, (bench::CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - t0) / 20);
  }
  return 2.0 * static_cast<double>(s.m * s.n * s.k) / best / 1e9;
}

double Rate(const Shape& s, float beta) {
  return Rate(s, beta, [](const float* b) { return b; });
}

void SeparateAgainstFused(const char* pass, const Shape& one, const Shape& fused, float beta) {
  std::printf("%-8s separate %5ldx%5ldx%5ld %-2s: %6.1f   fused %5ldx%5ldx%5ld: %6.1f GFLOP/CPU-s\n",
              pass, static_cast<long>(one.m), static_cast<long>(one.n), static_cast<long>(one.k),
              one.ta ? (one.tb ? "TT" : "TN") : (one.tb ? "NT" : "NN"), Rate(one, beta),
              static_cast<long>(fused.m), static_cast<long>(fused.n), static_cast<long>(fused.k),
              Rate(fused, beta));
}

// NN forward y = x W (W [k, n]) with W as stored and with W copied into a
// leading dimension n + 16 on every call.
void PaddedB(const char* what, int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kPad = 16;
  const Shape plain{false, false, m, n, k, k, n, n};
  const Shape padded{false, false, m, n, k, k, n + kPad, n};
  std::vector<float> scratch(static_cast<size_t>(k * (n + kPad)));
  auto copy = [&](const float* b) {
    for (int64_t i = 0; i < k; ++i) std::memcpy(&scratch[i * (n + kPad)], b + i * n, n * sizeof(float));
    return static_cast<const float*>(scratch.data());
  };
  // Bit identity of the padded product.
  std::vector<float> a = Filled(static_cast<size_t>(m * k), 4), b = Filled(static_cast<size_t>(k * n), 5);
  std::vector<float> c1(static_cast<size_t>(m * n)), c2(c1.size());
  Gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c1.data(), n);
  Gemm(false, false, m, n, k, 1.0f, a.data(), k, copy(b.data()), n + kPad, 0.0f, c2.data(), n);
  const bool same = std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0;
  std::printf("%-8s NN %5ldx%5ldx%5ld ldb %5ld: %6.1f   ldb %5ld with the copy: %6.1f GFLOP/CPU-s (%s)\n",
              what, static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
              static_cast<long>(n), Rate(plain, 0.0f), static_cast<long>(n + kPad),
              Rate(padded, 0.0f, copy), same ? "bit-identical" : "DIFFERENT BITS");
}

int Main(int argc, char** argv) {
  int64_t rows = 512, d_model = 384, d_ff = 1024, vocab = 1024;
  struct Flag {
    const char* key;
    int64_t* value;
  } const known[] = {{"--rows=", &rows}, {"--d_model=", &d_model}, {"--d_ff=", &d_ff}, {"--vocab=", &vocab}};
  for (int i = 1; i < argc; ++i) {
    bool parsed = false;
    for (const Flag& fl : known) {
      const size_t len = std::strlen(fl.key);
      uint64_t x = 0;
      if (std::strncmp(argv[i], fl.key, len) != 0) continue;
      if (!cli::ParseCount(argv[i] + len, 1, 1 << 20, &x)) {
        std::fprintf(stderr, "llama_mlp_gemms: %s is not a whole number in [1, 1048576]\n", argv[i]);
        return 1;
      }
      *fl.value = static_cast<int64_t>(x);
      parsed = true;
    }
    if (!parsed) {
      std::fprintf(stderr, "llama_mlp_gemms: unknown flag '%s' (--rows= --d_model= --d_ff= --vocab=)\n", argv[i]);
      return 1;
    }
  }
  if (!SetGemmThreads(1).ok()) return 1;
  const int64_t n = rows, c = d_model, f = d_ff;
  std::printf("one GEMM thread; N %ld, C %ld, F %ld, vocab %ld\n", static_cast<long>(n),
              static_cast<long>(c), static_cast<long>(f), static_cast<long>(vocab));
  SeparateAgainstFused("forward", Shape{false, false, n, f, c, c, f, f},
                       Shape{false, false, n, 2 * f, c, c, 2 * f, 2 * f}, 0.0f);
  SeparateAgainstFused("dx", Shape{false, true, n, c, f, f, f, c},
                       Shape{false, true, n, c, 2 * f, 2 * f, 2 * f, c}, 1.0f);
  SeparateAgainstFused("dW", Shape{true, false, c, f, n, c, f, f},
                       Shape{true, false, c, 2 * f, n, c, 2 * f, 2 * f}, 1.0f);
  PaddedB("gate/up", n, f, c);
  PaddedB("head", n, vocab, c);
  return 0;
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) { return sk::Main(argc, argv); }
