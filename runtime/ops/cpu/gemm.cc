// The CPU GEMMs (kernels.h): oneDNN's f32 GEMM or OpenBLAS's, oneDNN's bf16
// matmul (with its bias epilogue) and the choice between it and widening,
// the GEMM thread count, and the linear layer over them.

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <glog/logging.h>

#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/cpu/simd.h"

namespace sk {

std::string_view GemmBackendName(GemmBackend b) {
  switch (b) {
    case GemmBackend::kDefault: return "default";
    case GemmBackend::kOpenBlas: return "openblas";
    case GemmBackend::kOneDnn: return "onednn";
  }
  return "unknown";
}

// oneDNN's dnnl_sgemm runs its AVX-512 kernels regardless of
// OPENBLAS_CORETYPE, which pins OpenBLAS to its Haswell (AVX2) kernels on our
// machines; RESULTS.md has the measurement behind this choice.
GemmBackend DefaultGemmBackend() { return GemmBackend::kOneDnn; }

extern "C" {
// libgomp, the OpenMP runtime oneDNN is built on (omp.h needs -fopenmp).
void omp_set_num_threads(int n);
int omp_get_max_threads(void);
}

Status SetGemmThreads(int n) {
  // libgomp allocates its team up front: 2^31 threads asked it for 481 GB
  // and exited the process from inside omp_set_num_threads' first region.
  constexpr int kMaxGemmThreads = 1024;
  if (n < 1 || n > kMaxGemmThreads) {
    return InvalidArgumentError("GEMM thread count must be in [1, " + std::to_string(kMaxGemmThreads) + "], got " +
                                std::to_string(n));
  }
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return OkStatus();
}

int GemmThreads() { return omp_get_max_threads(); }

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, GemmBackend backend) {
  if (m == 0 || n == 0) return;
  if (backend == GemmBackend::kDefault) backend = DefaultGemmBackend();
  if (backend == GemmBackend::kOneDnn) {
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                  lda, b, ldb, beta, c, ldc);
    CHECK_EQ(st, dnnl_success) << "dnnl_sgemm failed for m=" << m << " n=" << n << " k=" << k;
    return;
  }
  constexpr int64_t kMaxBlasInt = std::numeric_limits<blasint>::max();
  CHECK(m <= kMaxBlasInt && n <= kMaxBlasInt && k <= kMaxBlasInt && lda <= kMaxBlasInt &&
        ldb <= kMaxBlasInt && ldc <= kMaxBlasInt);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

namespace {

#define SK_DNNL_CHECK(expr)                                          \
  do {                                                               \
    dnnl_status_t sk_dnnl_status_ = (expr);                          \
    CHECK_EQ(sk_dnnl_status_, dnnl_success) << "oneDNN call " #expr; \
  } while (0)

dnnl_engine_t CpuEngine() {
  static dnnl_engine_t engine = [] {
    dnnl_engine_t e = nullptr;
    SK_DNNL_CHECK(dnnl_engine_create(&e, dnnl_cpu, 0));
    return e;
  }();
  return engine;
}

// One oneDNN stream per calling thread (streams are not thread-safe),
// destroyed when the thread exits (ranks run as threads that come and go).
dnnl_stream_t ThreadStream() {
  struct Holder {
    dnnl_stream_t stream = nullptr;
    Holder() { SK_DNNL_CHECK(dnnl_stream_create(&stream, CpuEngine(), dnnl_stream_default_flags)); }
    ~Holder() { dnnl_stream_destroy(stream); }
  };
  thread_local Holder holder;
  return holder.stream;
}

// Row-major strides of the logical [rows, cols] matrix stored with leading
// dimension ld, transposed in memory or not.
void Strides(bool trans, int64_t ld, dnnl_dims_t strides) {
  strides[0] = trans ? 1 : ld;
  strides[1] = trans ? ld : 1;
}

// trans_a, trans_b, m, n, k, lda, ldb, ldc, accumulate, C in bf16 (else f32),
// a bf16 bias row added.
using MatmulKey =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool>;

struct MatmulPrimitive {
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_desc_t a, b, c, bias;
  dnnl_memory_desc_t scratchpad;  // what one execution needs (may be empty)
  size_t scratchpad_bytes = 0;
};

// Builds (once per shape) the bf16 x bf16 -> f32 (or -> bf16: f32
// accumulation, C widened into it when accumulating, one rounding) matmul
// primitive. Cached
// for the life of the process: models use a handful of shapes. The cache is
// shared by every thread (ranks run as threads), so the primitive takes its
// scratchpad from the caller at each execution (user scratchpad mode). In
// oneDNN's default library mode every primitive shares one scratchpad and a
// primitive must run on the thread that created it: two ranks' GEMMs at once
// then write each other's packed operands and partial sums (found on an H100
// host, whose CPU has AMX: the CPU reference of the bf16 equivalence test
// changed from run to run).
const MatmulPrimitive& GetMatmul(const MatmulKey& key) {
  static std::mutex mu;
  static auto* cache = new std::map<MatmulKey, MatmulPrimitive>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  auto [ta, tb, m, n, k, lda, ldb, ldc, accumulate, c_bf16, with_bias] = key;
  MatmulPrimitive mp;
  dnnl_dims_t a_dims = {m, k}, b_dims = {k, n}, c_dims = {m, n};
  dnnl_dims_t a_strides, b_strides, c_strides = {ldc, 1};
  Strides(ta, lda, a_strides);
  Strides(tb, ldb, b_strides);
  SK_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&mp.a, 2, a_dims, dnnl_bf16, a_strides));
  SK_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&mp.b, 2, b_dims, dnnl_bf16, b_strides));
  SK_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&mp.c, 2, c_dims, c_bf16 ? dnnl_bf16 : dnnl_f32,
                                                c_strides));
  dnnl_dims_t bias_dims = {1, n};
  if (with_bias) SK_DNNL_CHECK(dnnl_memory_desc_init_by_tag(&mp.bias, 2, bias_dims, dnnl_bf16, dnnl_ab));
  dnnl_matmul_desc_t desc;
  SK_DNNL_CHECK(dnnl_matmul_desc_init(&desc, &mp.a, &mp.b, with_bias ? &mp.bias : nullptr, &mp.c));
  dnnl_primitive_attr_t attr = nullptr;
  SK_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
  SK_DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  if (accumulate) {
    dnnl_post_ops_t post_ops = nullptr;
    SK_DNNL_CHECK(dnnl_post_ops_create(&post_ops));
    SK_DNNL_CHECK(dnnl_post_ops_append_sum(post_ops, 1.0f));
    SK_DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, post_ops));
    SK_DNNL_CHECK(dnnl_post_ops_destroy(post_ops));
  }
  dnnl_primitive_desc_t pd = nullptr;
  SK_DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, CpuEngine(), nullptr));
  const dnnl_memory_desc_t* scratch = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (scratch != nullptr) {
    mp.scratchpad = *scratch;
    mp.scratchpad_bytes = dnnl_memory_desc_get_size(scratch);
  }
  SK_DNNL_CHECK(dnnl_primitive_create(&mp.primitive, pd));
  SK_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  SK_DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  return cache->emplace(key, mp).first->second;
}

// Runs the cached primitive of `key` on a, b and c (f32 or bf16 as the key
// says), and bias where the key has one.
void ExecuteMatmul(const MatmulKey& key, const BF16* a, const BF16* b, void* c,
                   const BF16* bias = nullptr) {
  const MatmulPrimitive& mp = GetMatmul(key);
  dnnl_memory_t am = nullptr, bm = nullptr, cm = nullptr, sm = nullptr, biasm = nullptr;
  SK_DNNL_CHECK(dnnl_memory_create(&am, &mp.a, CpuEngine(), const_cast<BF16*>(a)));
  SK_DNNL_CHECK(dnnl_memory_create(&bm, &mp.b, CpuEngine(), const_cast<BF16*>(b)));
  SK_DNNL_CHECK(dnnl_memory_create(&cm, &mp.c, CpuEngine(), c));
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {}, {}};
  int nargs = 3;
  if (std::get<10>(key)) {
    SK_DNNL_CHECK(dnnl_memory_create(&biasm, &mp.bias, CpuEngine(), const_cast<BF16*>(bias)));
    args[nargs++] = {DNNL_ARG_BIAS, biasm};
  }
  if (mp.scratchpad_bytes > 0) {
    // The calling thread's scratchpad, grown to the largest need seen and
    // page-aligned as oneDNN's own is; one execution at a time per thread
    // (the stream is waited for below).
    constexpr size_t kAlign = 4096;
    thread_local std::vector<char> scratch;
    if (scratch.size() < mp.scratchpad_bytes + kAlign) scratch.resize(mp.scratchpad_bytes + kAlign);
    const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
    void* aligned = reinterpret_cast<void*>((base + kAlign - 1) / kAlign * kAlign);
    SK_DNNL_CHECK(dnnl_memory_create(&sm, &mp.scratchpad, CpuEngine(), aligned));
    args[nargs++] = {DNNL_ARG_SCRATCHPAD, sm};
  }
  SK_DNNL_CHECK(dnnl_primitive_execute(mp.primitive, ThreadStream(), nargs, args));
  SK_DNNL_CHECK(dnnl_stream_wait(ThreadStream()));
  SK_DNNL_CHECK(dnnl_memory_destroy(am));
  SK_DNNL_CHECK(dnnl_memory_destroy(bm));
  SK_DNNL_CHECK(dnnl_memory_destroy(cm));
  if (sm != nullptr) SK_DNNL_CHECK(dnnl_memory_destroy(sm));
  if (biasm != nullptr) SK_DNNL_CHECK(dnnl_memory_destroy(biasm));
}

// Without bf16 dot-product hardware oneDNN has no bf16 matmul (on an
// AVX2-only CPU primitive creation fails "unimplemented"): the operands are
// widened to f32 (exact), multiplied by the f32 GEMM, the bias row added in
// f32, and C rounded once, the arithmetic the native path does up to
// summation order.
template <typename Out>
void WidenedBf16Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
                     int64_t lda, const BF16* b, int64_t ldb, const BF16* bias, bool accumulate, Out* c,
                     int64_t ldc) {
  const int64_t a_rows = trans_a ? k : m, b_rows = trans_b ? n : k;
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  std::vector<float> af(static_cast<size_t>(a_rows * a_cols)), bf(static_cast<size_t>(b_rows * b_cols));
  for (int64_t r = 0; r < a_rows; ++r) {
    for (int64_t j = 0; j < a_cols; ++j) af[r * a_cols + j] = BF16ToFloat(a[r * lda + j]);
  }
  for (int64_t r = 0; r < b_rows; ++r) {
    for (int64_t j = 0; j < b_cols; ++j) bf[r * b_cols + j] = BF16ToFloat(b[r * ldb + j]);
  }
  std::vector<float> cf(static_cast<size_t>(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float init = 0.0f;
      if (accumulate) {
        if constexpr (std::is_same_v<Out, BF16>) {
          init = BF16ToFloat(c[i * ldc + j]);
        } else {
          init = c[i * ldc + j];
        }
      }
      if (bias != nullptr) init += BF16ToFloat(bias[j]);
      cf[i * n + j] = init;
    }
  }
  Gemm(trans_a, trans_b, m, n, k, 1.0f, af.data(), a_cols, bf.data(), b_cols, 1.0f, cf.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (std::is_same_v<Out, BF16>) {
        c[i * ldc + j] = FloatToBF16(cf[i * n + j]);
      } else {
        c[i * ldc + j] = cf[i * n + j];
      }
    }
  }
}

// Both GemmBF16s: C of element type Out (f32 or bf16).
template <typename Out>
void GemmBF16Into(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
                  int64_t lda, const BF16* b, int64_t ldb, bool accumulate, Out* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(Out) * n);
    }
    return;
  }
  if (!Bf16GemmHardware()) {
    WidenedBf16Gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, nullptr, accumulate, c, ldc);
    return;
  }
  const bool c_bf16 = std::is_same_v<Out, BF16>;
  ExecuteMatmul(MatmulKey{trans_a, trans_b, m, n, k, lda, ldb, ldc, accumulate, c_bf16, false}, a, b,
                c);
}

}  // namespace

void GemmBF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
              int64_t lda, const BF16* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  GemmBF16Into(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

void GemmBF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
              int64_t lda, const BF16* b, int64_t ldb, bool accumulate, BF16* c, int64_t ldc) {
  GemmBF16Into(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

namespace {

template <typename Out>
void GemmBF16BiasInto(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
                      int64_t lda, const BF16* b, int64_t ldb, const BF16* bias, Out* c,
                      int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if constexpr (std::is_same_v<Out, BF16>) {
          c[i * ldc + j] = bias[j];
        } else {
          c[i * ldc + j] = BF16ToFloat(bias[j]);
        }
      }
    }
    return;
  }
  if (!Bf16GemmHardware()) {
    WidenedBf16Gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, false, c, ldc);
    return;
  }
  ExecuteMatmul(MatmulKey{trans_a, trans_b, m, n, k, lda, ldb, ldc, false,
                          std::is_same_v<Out, BF16>, true},
                a, b, c, bias);
}

}  // namespace

void GemmBF16Bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
                  int64_t lda, const BF16* b, int64_t ldb, const BF16* bias, BF16* c, int64_t ldc) {
  GemmBF16BiasInto(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c, ldc);
}

void GemmBF16Bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BF16* a,
                  int64_t lda, const BF16* b, int64_t ldb, const BF16* bias, float* c,
                  int64_t ldc) {
  GemmBF16BiasInto(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c, ldc);
}

namespace {

// oneDNN's effective ISA includes every bit of `level`.
bool DnnlIsaHas(dnnl_cpu_isa_t level) {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned want = static_cast<unsigned>(level);
  return (isa & want) == want;
}

// Whether oneDNN's bf16 matmul is the faster of the two bf16 GEMMs where
// the hardware has one (kernels.h: NativeBf16Gemm). Decided from the CPU's
// identity, never from a timing, so every run and rank takes the same path.
bool Bf16MatmulFasterThanWidened() {
  if (DnnlIsaHas(dnnl_cpu_isa_avx512_core_amx)) return true;
  __builtin_cpu_init();
  return !__builtin_cpu_is("intel");
}

// SetNativeBf16Gemm's choice: -1 = none (the CPU's default), 0 off, 1 on.
std::atomic<int> g_bf16_gemm_choice{-1};

}  // namespace

bool Bf16GemmHardware() {
  static const bool hardware = DnnlIsaHas(dnnl_cpu_isa_avx512_core_bf16);
  return hardware;
}

bool NativeBf16Gemm() {
  static const bool preferred = Bf16GemmHardware() && Bf16MatmulFasterThanWidened();
  const int choice = g_bf16_gemm_choice.load();
  return choice < 0 ? preferred : (choice == 1 && Bf16GemmHardware());
}

bool SetNativeBf16Gemm(bool on) {
  const bool before = NativeBf16Gemm();
  g_bf16_gemm_choice.store(on ? 1 : 0);
  return before;
}

void LinearForward(const float* x, const float* w, const float* bias, int64_t rows, int64_t in,
                   int64_t out, float* y) {
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * out, bias, sizeof(float) * out);
    beta = 1.0f;
  }
  Gemm(false, false, rows, out, in, 1.0f, x, in, w, out, beta, y, out);
}

void LinearBackward(const float* x, const float* w, const float* dy, int64_t rows, int64_t in,
                    int64_t out, float* dx, bool accumulate_dx, float* dw, float* dbias) {
  if (dx != nullptr) {
    Gemm(false, true, rows, in, out, 1.0f, dy, out, w, out, accumulate_dx ? 1.0f : 0.0f, dx, in);
  }
  Gemm(true, false, in, out, rows, 1.0f, x, in, dy, out, 1.0f, dw, out);
  if (dbias != nullptr) {
    for (int64_t r = 0; r < rows; ++r) simd::AddInPlace(dbias, dy + r * out, out);
  }
}
}  // namespace sk
