// The Linear layer's bias and the gradient zeroing around the CPU GEMMs:
// what removing the extra passes could gain, measured on one thread
// (docs/benchmarks.md, "The passes around the GEMMs"). An experiment tool,
// not a tracked benchmark:
//   ./bazelw run -c opt //benchmarks:linear_epilogue -- [--reps=4]
//
// An f32 Linear forward today (runtime/nn/transformer.cc: Linear, through
// ops::GemmBias's two-op form) writes the bias into every row of y
// (BroadcastRows) and then runs sgemm with beta = 1; a bf16 one on bf16
// hardware adds the bias inside oneDNN's bf16 matmul instead (docs/ops.md:
// GemmBias; its A/B is step_breakdown --unfused_bias). Per
// forward shape of gpt-10m and gpt-deep-20m this times, on thread CPU time:
//   bcast+sgemm   what shardkit does: BroadcastRows' row copies, then
//                 sk::Gemm (dnnl_sgemm) with beta = 1 (the reference);
//   sgemm b=0     the product alone, no bias: the floor any fused bias
//                 epilogue built on this GEMM could reach;
//   sgemm+add     sgemm with beta = 0, then the bias added to each row
//                 (the bias added after the products: another order);
//   matmul+bias   oneDNN's matmul primitive with its bias argument (created
//                 once per shape, user scratchpad), the fused form oneDNN
//                 offers;
// and for the weight-gradient GEMMs (TN, k = rows) whether writing the first
// gradient with beta = 0 beats zeroing it and accumulating (beta = 1):
//   fill+sgemm    the gradient zeroed (as FSDP's PreBackward does), then
//                 beta = 1 (the reference);
//   sgemm b=0     the first gradient written with beta = 0.
// Each variant runs over `kBuffers` distinct outputs and inputs per round
// (more than the last-level cache holds), so outputs are cold as the
// activations of a training step are; rounds alternate the variants, the
// first is a warm-up. Last, BroadcastRows' row copies into one reused
// (cache-hot) output against distinct (cold) ones: what a cold output costs.
// "bits" says whether every output equals the
// reference's bit for bit. Ratios are time / reference time: < 1 is faster.
#include <oneapi/dnnl/dnnl.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/util/host_info.h"
#include "runtime/ops/cpu/kernels.h"

namespace {

double ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

#define CHECK_DNNL(expr)                                                  \
  do {                                                                    \
    if ((expr) != dnnl_success) {                                         \
      std::fprintf(stderr, "linear_epilogue: oneDNN call failed: %s\n", #expr); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)

constexpr int kBuffers = 16;

// y[m, n] = x[m, k] w[k, n] + bias through oneDNN's matmul primitive.
class MatmulBias {
 public:
  MatmulBias(dnnl_engine_t engine, int64_t m, int64_t n, int64_t k) : engine_(engine) {
    dnnl_dims_t xd = {m, k}, wd = {k, n}, yd = {m, n}, bd = {1, n};
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&x_, 2, xd, dnnl_f32, dnnl_ab));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&w_, 2, wd, dnnl_f32, dnnl_ab));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&y_, 2, yd, dnnl_f32, dnnl_ab));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&b_, 2, bd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t desc;
    CHECK_DNNL(dnnl_matmul_desc_init(&desc, &x_, &w_, &b_, &y_));
    dnnl_primitive_attr_t attr;
    CHECK_DNNL(dnnl_primitive_attr_create(&attr));
    CHECK_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    dnnl_primitive_desc_t pd;
    CHECK_DNNL(dnnl_primitive_desc_create(&pd, &desc, attr, engine, nullptr));
    const char* impl = nullptr;
    CHECK_DNNL(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    impl_ = impl != nullptr ? impl : "?";
    s_ = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    scratch_.resize(dnnl_memory_desc_get_size(&s_) + 64);
    CHECK_DNNL(dnnl_primitive_create(&prim_, pd));
    CHECK_DNNL(dnnl_primitive_desc_destroy(pd));
    CHECK_DNNL(dnnl_primitive_attr_destroy(attr));
    CHECK_DNNL(dnnl_stream_create(&stream_, engine, dnnl_stream_default_flags));
  }
  ~MatmulBias() {
    dnnl_primitive_destroy(prim_);
    dnnl_stream_destroy(stream_);
  }
  const std::string& impl() const { return impl_; }

  void Run(const float* x, const float* w, const float* bias, float* y) {
    dnnl_memory_t xm, wm, bm, ym, sm;
    CHECK_DNNL(dnnl_memory_create(&xm, &x_, engine_, const_cast<float*>(x)));
    CHECK_DNNL(dnnl_memory_create(&wm, &w_, engine_, const_cast<float*>(w)));
    CHECK_DNNL(dnnl_memory_create(&bm, &b_, engine_, const_cast<float*>(bias)));
    CHECK_DNNL(dnnl_memory_create(&ym, &y_, engine_, y));
    CHECK_DNNL(dnnl_memory_create(&sm, &s_, engine_, scratch_.data()));
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm},
                               {DNNL_ARG_DST, ym}, {DNNL_ARG_SCRATCHPAD, sm}};
    CHECK_DNNL(dnnl_primitive_execute(prim_, stream_, 5, args));
    CHECK_DNNL(dnnl_stream_wait(stream_));
    for (dnnl_memory_t m : {xm, wm, bm, ym, sm}) dnnl_memory_destroy(m);
  }

 private:
  dnnl_engine_t engine_;
  dnnl_memory_desc_t x_, w_, y_, b_, s_;
  std::vector<char> scratch_;
  dnnl_primitive_t prim_ = nullptr;
  dnnl_stream_t stream_ = nullptr;
  std::string impl_;
};

std::vector<float> Random(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng) * scale;
  return v;
}

bool SameBits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(a[i].data(), b[i].data(), sizeof(float) * a[i].size()) != 0) return false;
  }
  return true;
}

struct Shape {
  const char* role;
  int64_t m, n, k;
};

void Forward(dnnl_engine_t engine, const Shape& s, int reps, std::mt19937& rng) {
  const int64_t m = s.m, n = s.n, k = s.k;
  std::vector<std::vector<float>> x(kBuffers), y(kBuffers);
  for (auto& v : x) v = Random(rng, m * k, 1.0f);
  const std::vector<float> w = Random(rng, k * n, 0.05f), bias = Random(rng, n, 1.0f);
  std::vector<std::vector<float>> out[4];
  for (auto& o : out) o.assign(kBuffers, std::vector<float>(static_cast<size_t>(m * n)));
  MatmulBias mm(engine, m, n, k);
  double t[4] = {0, 0, 0, 0};
  for (int rep = 0; rep <= reps; ++rep) {
    for (int v = 0; v < 4; ++v) {
      for (int i = 0; i < kBuffers; ++i) {
        float* c = out[v][i].data();
        const double t0 = ThreadCpu();
        switch (v) {
          case 0:
            for (int64_t r = 0; r < m; ++r) std::memcpy(c + r * n, bias.data(), sizeof(float) * n);
            sk::Gemm(false, false, m, n, k, 1.0f, x[i].data(), k, w.data(), n, 1.0f, c, n);
            break;
          case 1:
            sk::Gemm(false, false, m, n, k, 1.0f, x[i].data(), k, w.data(), n, 0.0f, c, n);
            break;
          case 2:
            sk::Gemm(false, false, m, n, k, 1.0f, x[i].data(), k, w.data(), n, 0.0f, c, n);
            for (int64_t r = 0; r < m; ++r) sk::AddInPlace(c + r * n, bias.data(), n);
            break;
          case 3: mm.Run(x[i].data(), w.data(), bias.data(), c); break;
        }
        if (rep > 0) t[v] += ThreadCpu() - t0;
      }
    }
  }
  const double flops = 2.0 * m * n * k * kBuffers * reps;
  std::printf("| %s | %lldx%lldx%lld | %.1f | %.3f | %.3f (%s) | %.3f (%s) | %s |\n", s.role,
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
              flops / t[0] * 1e-9, t[1] / t[0], t[2] / t[0],
              SameBits(out[2], out[0]) ? "same bits" : "bits differ", t[3] / t[0],
              SameBits(out[3], out[0]) ? "same bits" : "bits differ", mm.impl().c_str());
}

void WeightGrad(const Shape& s, int reps, std::mt19937& rng) {
  const int64_t m = s.m, n = s.n, k = s.k;  // dW[m = in, n = out] = X^T dY, k = rows
  std::vector<std::vector<float>> x(kBuffers), dy(kBuffers);
  for (auto& v : x) v = Random(rng, k * m, 1.0f);
  for (auto& v : dy) v = Random(rng, k * n, 1.0f);
  std::vector<std::vector<float>> out[2];
  for (auto& o : out) o.assign(kBuffers, std::vector<float>(static_cast<size_t>(m * n)));
  double t[2] = {0, 0};
  for (int rep = 0; rep <= reps; ++rep) {
    for (int v = 0; v < 2; ++v) {
      for (int i = 0; i < kBuffers; ++i) {
        float* c = out[v][i].data();
        const double t0 = ThreadCpu();
        if (v == 0) std::memset(c, 0, sizeof(float) * m * n);
        sk::Gemm(true, false, m, n, k, 1.0f, x[i].data(), m, dy[i].data(), n, v == 0 ? 1.0f : 0.0f,
                 c, n);
        if (rep > 0) t[v] += ThreadCpu() - t0;
      }
    }
  }
  const double flops = 2.0 * m * n * k * kBuffers * reps;
  std::printf("| %s | %lldx%lldx%lld TN | %.1f | %.3f (%s) |\n", s.role, static_cast<long long>(m),
              static_cast<long long>(n), static_cast<long long>(k), flops / t[0] * 1e-9,
              t[1] / t[0], SameBits(out[1], out[0]) ? "same bits" : "bits differ");
}

// BroadcastRows' f32 row copies into one reused output (cache-hot after the
// first call) and into kBuffers distinct ones (cold), per call.
void BroadcastHotCold(int64_t rows, int64_t cols, int reps) {
  const std::vector<float> bias(static_cast<size_t>(cols), 0.5f);
  std::vector<std::vector<float>> y(kBuffers, std::vector<float>(static_cast<size_t>(rows * cols)));
  double t[2] = {0, 0};
  for (int rep = 0; rep <= reps; ++rep) {
    for (int v = 0; v < 2; ++v) {
      for (int i = 0; i < kBuffers; ++i) {
        float* c = y[v == 0 ? 0 : i].data();
        const double t0 = ThreadCpu();
        for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * cols, bias.data(), sizeof(float) * cols);
        if (rep > 0) t[v] += ThreadCpu() - t0;
      }
    }
  }
  const double calls = static_cast<double>(kBuffers) * reps;
  const double mib = static_cast<double>(rows * cols) * sizeof(float) / (1 << 20);
  std::printf("| %lldx%lld (%.0f MiB) | %.3f | %.3f | %.2f |\n", static_cast<long long>(rows),
              static_cast<long long>(cols), mib, t[0] / calls * 1e3, t[1] / calls * 1e3, t[1] / t[0]);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--reps=", 0) == 0) {
      reps = std::atoi(a.c_str() + 7);
    } else {
      std::fprintf(stderr, "usage: linear_epilogue [--reps=4]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "linear_epilogue: --reps must be >= 1\n");
    return 2;
  }
  if (!sk::SetGemmThreads(1).ok()) return 1;
  dnnl_engine_t engine;
  CHECK_DNNL(dnnl_engine_create(&engine, dnnl_cpu, 0));
  std::mt19937 rng(16);
  std::printf("%s; load average %s; one thread, %d cold buffers, %d rounds after a warm-up\n\n",
              sk::bench::CpuModel().c_str(), sk::bench::LoadAverage().c_str(), kBuffers, reps);
  std::printf("| Linear forward | m x n x k | bcast+sgemm GFLOP/s | sgemm b=0 | sgemm+add | "
              "matmul+bias | matmul impl |\n|---|---|---|---|---|---|---|\n");
  const Shape fwd[] = {
      {"gpt-deep-20m qkv", 1024, 768, 256},  {"gpt-deep-20m attn proj", 1024, 256, 256},
      {"gpt-deep-20m fc", 1024, 1024, 256},  {"gpt-deep-20m mlp proj", 1024, 256, 1024},
      {"gpt-10m qkv", 2048, 1152, 384},      {"gpt-10m attn proj", 2048, 384, 384},
      {"gpt-10m fc", 2048, 1536, 384},       {"gpt-10m mlp proj", 2048, 384, 1536},
  };
  for (const Shape& s : fwd) Forward(engine, s, reps, rng);
  std::printf("\n| weight gradient | m x n x k | fill+sgemm GFLOP/s | sgemm b=0 |\n|---|---|---|---|\n");
  const Shape dw[] = {
      {"gpt-deep-20m qkv", 256, 768, 1024},  {"gpt-deep-20m fc", 256, 1024, 1024},
      {"gpt-deep-20m mlp proj", 1024, 256, 1024}, {"gpt-10m fc", 384, 1536, 2048},
      {"gpt-10m mlp proj", 1536, 384, 2048},
  };
  for (const Shape& s : dw) WeightGrad(s, reps, rng);
  std::printf("\n| BroadcastRows (f32) | hot output, ms | cold outputs, ms | cold / hot |\n"
              "|---|---|---|---|\n");
  BroadcastHotCold(1024, 1024, reps);
  BroadcastHotCold(2048, 1536, reps);
  dnnl_engine_destroy(engine);
  return 0;
}
