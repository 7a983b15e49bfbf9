#include "runtime/ops/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>

#include "runtime/core/env.h"
#include "runtime/ops/cuda/cudnn_attention.h"
#include "runtime/ops/cuda/handle_pool.h"
#include "runtime/ops/cuda/kernels.h"
#include "runtime/ops/cuda/sdpa_plan.h"

namespace sk::ops {

namespace {

Status CudaStatus(int err, const char* op) {
  if (err == 0) return OkStatus();
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  auto e = static_cast<cudaError_t>(err);
  std::string msg = std::string(op) + " on CUDA: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  return InternalError(msg);
}

#define SK_CUDA_OP(op, expr) SK_RETURN_IF_ERROR(CudaStatus((expr), op))

void* S(const OpContext& ctx) { return ctx.stream->native_handle(); }

// Pointer to element `offset` of `t`.
template <typename T = void>
T* Ptr(const Tensor& t, int64_t offset = 0) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data()) + offset * DTypeSize(t.dtype()));
}
float* F(const Tensor& t) { return Ptr<float>(t); }
// A tensor as a kernel operand of its own dtype.
cuda::Buf B(const Tensor& t) { return cuda::Buf{t.data(), t.dtype()}; }
cuda::CBuf C(const Tensor& t) { return cuda::CBuf{t.data(), t.dtype()}; }

cudaDataType CudaType(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The key starts of packed documents (AttentionShape::key_start: device
// i32 [batch * q_len]), or nullptr without them: the composed attention's
// softmax and log-sum-exp kernels mask each query's keys to its own
// document (nn_math::AttentionRowKeys).
const int32_t* KeyStarts(const AttentionShape& s) {
  return s.key_start.defined() ? s.key_start.data_as<int32_t>() : nullptr;
}

// Makes ctx's GPU current for the calling thread (kernels launch there).
Status Enter(const OpContext& ctx, const char* op) {
  if (ctx.stream == nullptr || ctx.stream->native_handle() == nullptr) {
    return InvalidArgumentError(std::string(op) + ": a CUDA op needs a CUDA stream in its context");
  }
  SK_CUDA_OP(op, cudaSetDevice(ctx.device->id().index));
  return OkStatus();
}

// SK_CUBLAS_REDUCED_PRECISION_REDUCTION=1 (read once): see NewHandle().
bool AllowReducedPrecisionReduction() {
  static const bool allow = [] {
    const char* v = GetEnv(EnvVar::kCublasReducedPrecisionReduction);
    return v != nullptr && std::string_view(v) == "1";
  }();
  return allow;
}

// SK_CUDA_FUSED_EPILOGUES (read once): "1" runs GemmBias and
// GemmBiasResidual with 16-bit operands as one cuBLASLt GEMM whose epilogue
// adds the bias (and whose beta = 1 term is the residual); unset or
// anything else runs the ops they are defined by (BroadcastRows then a GEMM
// with beta = 1; GemmBias, Axpy and Cast). Off by default: on the H200 (27
// Nov) the fused bf16 results missed the conformance bound of one rounding
// (1.1x and 1.6x of it; docs/cuda.md).
bool FusedEpilogues() {
  static const bool on = [] {
    const char* v = GetEnv(EnvVar::kCudaFusedEpilogues);
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

// A pooled cuBLAS handle and what keeps its workspace to one stream at a
// time. cuBLAS keeps one default workspace per handle; a handle lent to a
// thread may still have kernels running from the thread that had it before
// (a step that failed before waiting for its stream), on another stream.
// `used` is recorded on the stream after every call through the handle,
// and a thread that takes the handle over, or binds it to another stream,
// first makes its stream wait for `used` (BindCublas). Never destroyed.
struct CublasSlot {
  cublasHandle_t handle = nullptr;
  cudaEvent_t used = nullptr;
  cudaStream_t stream = nullptr;  // the stream of the last call
  std::thread::id thread;         // the thread of the last call
  bool recorded = false;          // `used` has been recorded
};

// A cuBLAS handle with our math mode (below) and its event, made with
// `device` current.
StatusOr<CublasSlot*> NewHandle(int device) {
  SK_CUDA_OP("cublasCreate", cudaSetDevice(device));
  cublasHandle_t h = nullptr;
  cublasStatus_t st = cublasCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return UnavailableError(std::string("cublasCreate failed: ") + cublasGetStatusString(st));
  }
  // By default cuBLAS may reduce split-K partial sums in the output type
  // when C is f16/bf16 (a rounding per partial sum, and alpha AB rounded
  // before beta C is added): results 3 f16 ulps off at k = 384 on an H200
  // (conformance_test). Our contract is f32 accumulation and one rounding,
  // so reductions stay in the compute type, unless
  // SK_CUBLAS_REDUCED_PRECISION_REDUCTION=1 allows them (PyTorch's
  // allow_bf16_reduced_precision_reduction; for measuring what it buys).
  st = cublasSetMathMode(h, AllowReducedPrecisionReduction() ? CUBLAS_DEFAULT_MATH
                                          : CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    return UnavailableError(std::string("cublasSetMathMode failed: ") + cublasGetStatusString(st));
  }
  cudaEvent_t used = nullptr;
  if (cudaEventCreateWithFlags(&used, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    cublasDestroy(h);
    return UnavailableError("cublasCreate: cudaEventCreate failed for the handle's event");
  }
  auto* slot = new CublasSlot;
  slot->handle = h;
  slot->used = used;
  return slot;
}

// The process's cuBLAS and cuBLASLt handles, lent to the threads that run
// ops (handle_pool.h: a thread keeps its handle while it lives and gives it
// back when it exits; never destroyed).
cuda::ThreadHandlePool<CublasSlot*>& CublasHandles() {
  static auto* pool = new cuda::ThreadHandlePool<CublasSlot*>(NewHandle);
  return *pool;
}
cuda::ThreadHandlePool<cublasLtHandle_t>& CublasLtHandles() {
  static auto* pool = new cuda::ThreadHandlePool<cublasLtHandle_t>(
      [](int device) -> StatusOr<cublasLtHandle_t> {
        SK_CUDA_OP("cublasLtCreate", cudaSetDevice(device));
        cublasLtHandle_t h = nullptr;
        cublasStatus_t st = cublasLtCreate(&h);
        if (st != CUBLAS_STATUS_SUCCESS) {
          return UnavailableError(std::string("cublasLtCreate failed: ") + cublasGetStatusString(st));
        }
        return h;
      });
  return *pool;
}

// This thread's cuBLAS handle for ctx's device, bound to ctx's stream, which
// waits first for the handle's earlier calls when they came from another
// thread or stream (CublasSlot). The caller enqueues one call and then
// UsedCublas.
StatusOr<CublasSlot*> BindCublas(const OpContext& ctx) {
  SK_ASSIGN_OR_RETURN(CublasSlot * slot, CublasHandles().Get(ctx.device->id().index));
  const auto stream = static_cast<cudaStream_t>(S(ctx));
  const std::thread::id me = std::this_thread::get_id();
  if (slot->stream != stream || slot->thread != me) {
    if (slot->recorded) SK_CUDA_OP("gemm", cudaStreamWaitEvent(stream, slot->used, 0));
    const cublasStatus_t st = cublasSetStream(slot->handle, stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
      return InternalError(std::string("gemm: cublasSetStream: ") + cublasGetStatusString(st));
    }
    slot->stream = stream;
    slot->thread = me;
  }
  return slot;
}
Status UsedCublas(CublasSlot* slot) {
  SK_CUDA_OP("gemm", cudaEventRecord(slot->used, slot->stream));
  slot->recorded = true;
  return OkStatus();
}

// Row-major C = alpha op(A) op(B) + beta C for `batch` matrices at the given
// strides, as column-major C^T = op(B)^T op(A)^T: operands and sizes swap,
// the transposition flags stay.
Status GemmStrided(const OpContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                   float alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                   int64_t ldb, int64_t stride_b, DType ab, float beta, void* c_ptr, DType ct,
                   int64_t ldc, int64_t stride_c, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return OkStatus();
  if (k == 0) {  // C = beta C (cuBLAS leaves empty products to the caller)
    CHECK(ct == DType::kF32) << "gemm: a 16-bit C with k = 0 is staged by the dispatcher";
    float* c = static_cast<float*>(c_ptr);
    for (int64_t i = 0; i < batch; ++i) {
      float* ci = c + i * stride_c;
      if (beta == 0.0f) {
        SK_CUDA_OP("gemm", cuda::FillMatrix(cuda::Buf{ci, DType::kF32}, m, n, ldc, 0.0f, S(ctx)));
      } else if (beta != 1.0f) {
        for (int64_t r = 0; r < m; ++r) {
          SK_CUDA_OP("gemm", cuda::Scale(ci + r * ldc, DType::kF32, n, beta, S(ctx)));
        }
      }
    }
    return OkStatus();
  }
  SK_ASSIGN_OR_RETURN(CublasSlot * slot, BindCublas(ctx));
  const cublasStatus_t st = cublasGemmStridedBatchedEx_64(
      slot->handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
      b, CudaType(ab), ldb, stride_b, a, CudaType(ab), lda, stride_a, &beta, c_ptr, CudaType(ct),
      ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return InternalError("gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                         std::to_string(k) + " (" + std::string(DTypeName(ab)) +
                         "): cublasGemmStridedBatchedEx: " + cublasGetStatusString(st));
  }
  SK_RETURN_IF_ERROR(UsedCublas(slot));
  return OkStatus();
}

// This thread's cuBLASLt handle for `device`.
StatusOr<cublasLtHandle_t> LtHandle(int device) { return CublasLtHandles().Get(device); }

// cuBLASLt's workspace per fused GEMM, from ctx.alloc (cuBLAS's own default
// on Hopper is 32 MiB; the heuristic ranks algorithms that fit this).
constexpr size_t kLtWorkspaceBytes = size_t{8} << 20;

// The largest power of two (at most 256) that divides p's address: what
// cuBLASLt's heuristic must be told, so it does not pick an algorithm that
// assumes more.
uint32_t Alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// One fused GEMM's device, shape, dtypes and alignments: the key of the
// process's cache of cuBLASLt's chosen algorithm.
using LtKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                         bool, uint32_t, uint32_t, uint32_t, uint32_t, int>;

// cuBLASLt's answer per LtKey: whether it offered an algorithm, and which.
// Asked once per process (the heuristic costs more host time than the
// launch; its answer depends on the device and the key, not the handle),
// so threads that come and go (a local session's steps) do not ask again.
class LtAlgoCache {
 public:
  static LtAlgoCache& Get() {
    static auto* cache = new LtAlgoCache;  // ops may run at exit
    return *cache;
  }
  bool Find(const LtKey& key, std::pair<bool, cublasLtMatmulAlgo_t>* out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = algos_.find(key);
    if (it == algos_.end()) return false;
    *out = it->second;
    return true;
  }
  void Put(const LtKey& key, std::pair<bool, cublasLtMatmulAlgo_t> value) {
    std::lock_guard<std::mutex> lock(mu_);
    algos_[key] = value;
  }

 private:
  std::mutex mu_;
  std::map<LtKey, std::pair<bool, cublasLtMatmulAlgo_t>> algos_;
};

// Row-major D = alpha op(A) op(B) + bias [n] in every row (+ residual R,
// D's shape and dtype, when r is not null) as one cuBLASLt matmul with the
// BIAS epilogue: column-major D^T = op(B)^T op(A)^T + R^T, as GemmStrided,
// so the bias runs along the column-major rows. bias has D's dtype (what
// the epilogue reads). f32 accumulation, the bias and R added in f32, D
// rounded once; split-K reductions in f32 unless
// SK_CUBLAS_REDUCED_PRECISION_REDUCTION=1 (NewHandle()). Stores false in *ran
// and enqueues nothing when cuBLASLt offers no algorithm for it (or the
// bias is not 16-byte aligned). k > 0.
//
// LtGemmEpilogue is the same with another epilogue: GELU_AUX_BIAS (bias as
// above; aux, D's shape and dtype, receives GELU's input, D its output) or
// DGELU (no bias; aux is GELU's input, read: D = the product times GELU's
// derivative there). aux's leading dimension is n (cuBLASLt wants a multiple
// of 8: other widths, or an aux not 16-byte aligned, are declined).
Status LtGemmEpilogue(const OpContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, DType ab,
                      cublasLtEpilogue_t epi, const void* bias, const void* aux, const void* r,
                      void* d, DType dt, bool* ran) {
  *ran = false;
  // cuBLASLt reads the bias vector with vector loads; parameters' views are
  // 16-byte aligned (flat parameters align each one), anything else is not
  // handed to it.
  if (bias != nullptr && reinterpret_cast<uintptr_t>(bias) % 16 != 0) return OkStatus();
  if (aux != nullptr && (n % 8 != 0 || reinterpret_cast<uintptr_t>(aux) % 16 != 0)) return OkStatus();
  SK_ASSIGN_OR_RETURN(cublasLtHandle_t h, LtHandle(ctx.device->id().index));
  const cudaDataType abt = CudaType(ab), ct = CudaType(dt);
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto release = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  };
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // column-major A is our B
  const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint32_t reduction = AllowReducedPrecisionReduction()
                                 ? CUBLASLT_REDUCTION_SCHEME_MASK
                                 : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const uint64_t ws_bytes = kLtWorkspaceBytes;
  const uint32_t al_a = Alignment(b), al_b = Alignment(a), al_c = Alignment(r ? r : d),
                 al_d = Alignment(d);
  cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t size) {
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, attr, v, size);
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
  if (bias != nullptr) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  if (aux != nullptr) {
    const int64_t aux_ld = n;  // column-major aux^T: n rows, as D^T's
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatrixLayoutCreate(&la, abt, tb ? k : n, tb ? n : k, ldb);
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatrixLayoutCreate(&lb, abt, ta ? m : k, ta ? k : m, lda);
  }
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lc, ct, n, m, n);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceCreate(&pref);
  auto pset = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t size) {
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, v, size);
  };
  pset(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  pset(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction));
  pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
  pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
  pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
  pset(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
  // The heuristic's answer per device, shape, dtypes and alignments, asked
  // once per process (LtAlgoCache).
  const LtKey key{ctx.device->id().index, ta, tb, m, n, k, lda, ldb, static_cast<int>(ab),
                  static_cast<int>(dt), r != nullptr, al_a, al_b, al_c, al_d, static_cast<int>(epi)};
  std::pair<bool, cublasLtMatmulAlgo_t> found{false, {}};
  if (st == CUBLAS_STATUS_SUCCESS && !LtAlgoCache::Get().Find(key, &found)) {
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &result, &count);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) st = CUBLAS_STATUS_SUCCESS, count = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      found = {count > 0, result.algo};
      LtAlgoCache::Get().Put(key, found);
    }
  }
  if (st == CUBLAS_STATUS_SUCCESS && found.first) {
    auto ws = ctx.alloc->Empty(DType::kF32, Shape{static_cast<int64_t>(kLtWorkspaceBytes / 4)});
    if (!ws.ok()) {
      release();
      return ws.status();
    }
    const float beta = r != nullptr ? 1.0f : 0.0f;
    st = cublasLtMatmul(h, op, &alpha, b, la, a, lb, &beta, r != nullptr ? r : d, lc, d, lc,
                        &found.second, ws->data(), kLtWorkspaceBytes,
                        static_cast<cudaStream_t>(S(ctx)));
    if (st == CUBLAS_STATUS_SUCCESS) *ran = true;
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // the caller runs the unfused ops
      LtAlgoCache::Get().Put(key, {false, found.second});
      st = CUBLAS_STATUS_SUCCESS;
    }
  }
  release();
  if (st != CUBLAS_STATUS_SUCCESS) {
    return InternalError("gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                         std::to_string(k) + " (" + std::string(DTypeName(ab)) + ", epilogue " +
                         std::to_string(static_cast<int>(epi)) + "): cuBLASLt: " + cublasGetStatusString(st));
  }
  return OkStatus();
}

Status LtGemmBias(const OpContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                  float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, DType ab,
                  const void* bias, const void* r, void* d, DType dt, bool* ran) {
  return LtGemmEpilogue(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, ab, CUBLASLT_EPILOGUE_BIAS,
                        bias, nullptr, r, d, dt, ran);
}

// Row-major C = alpha op(A) op(B) for the seqs x heads matrices (s, h) at
// X + s * x_seq + h * x_head elements (X = A, B, C; beta = 0): attention's
// per-(sequence, head) GEMMs. When each operand's sequence stride is heads
// times its head stride (or seqs == 1) that is one strided batched GEMM.
// Otherwise, when every matrix starts 16-byte aligned (cuBLAS may assume
// that of the matrices a pointer array names, as its batched GEMMs with
// tensor-core math do: it cannot check them), the addresses go into device
// pointer arrays (cuda::BatchPointers, scratch from ctx.alloc, freed in
// stream order after the GEMM) for one cublasGemmBatchedEx; else one
// strided batched GEMM per sequence (which cuBLAS checks itself). k > 0.
Status GemmSeqHeads(const OpContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const void* a, int64_t lda, int64_t a_seq, int64_t a_head,
                    const void* b, int64_t ldb, int64_t b_seq, int64_t b_head, DType ab, void* c,
                    DType ct, int64_t ldc, int64_t c_seq, int64_t c_head, int64_t seqs,
                    int64_t heads) {
  if (m == 0 || n == 0 || seqs == 0 || heads == 0) return OkStatus();
  CHECK_GT(k, 0) << "attention GEMMs have k > 0";
  if (seqs == 1 ||
      (a_seq == heads * a_head && b_seq == heads * b_head && c_seq == heads * c_head)) {
    return GemmStrided(ctx, ta, tb, m, n, k, alpha, a, lda, a_head, b, ldb, b_head, ab, 0.0f, c,
                       ct, ldc, c_head, seqs * heads);
  }
  const int64_t ea = static_cast<int64_t>(DTypeSize(ab)), ec = static_cast<int64_t>(DTypeSize(ct));
  auto aligned = [](const void* base, int64_t seq_bytes, int64_t head_bytes) {
    return reinterpret_cast<uintptr_t>(base) % 16 == 0 && seq_bytes % 16 == 0 &&
           head_bytes % 16 == 0;
  };
  if (!aligned(a, a_seq * ea, a_head * ea) || !aligned(b, b_seq * ea, b_head * ea) ||
      !aligned(c, c_seq * ec, c_head * ec)) {
    for (int64_t i = 0; i < seqs; ++i) {
      SK_RETURN_IF_ERROR(GemmStrided(ctx, ta, tb, m, n, k, alpha,
                                     static_cast<const char*>(a) + i * a_seq * ea, lda, a_head,
                                     static_cast<const char*>(b) + i * b_seq * ea, ldb, b_head, ab,
                                     0.0f, static_cast<char*>(c) + i * c_seq * ec, ct, ldc, c_head,
                                     heads));
    }
    return OkStatus();
  }
  const int64_t count = seqs * heads;
  // 3 * count pointers in 8-byte slots: A's, B's, C's.
  SK_ASSIGN_OR_RETURN(Tensor ptrs, ctx.alloc->Empty(DType::kF64, Shape{3 * count}));
  const void** p = static_cast<const void**>(ptrs.data());
  SK_CUDA_OP("gemm", cuda::BatchPointers(a, a_seq * ea, a_head * ea, b, b_seq * ea, b_head * ea, c,
                                         c_seq * ec, c_head * ec, seqs, heads, p, S(ctx)));
  SK_ASSIGN_OR_RETURN(CublasSlot * slot, BindCublas(ctx));
  const float beta = 0.0f;
  // Column-major C^T = op(B)^T op(A)^T, as GemmStrided: B's pointers first.
  const cublasStatus_t st = cublasGemmBatchedEx_64(
      slot->handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
      p + count, CudaType(ab), ldb, p, CudaType(ab), lda, &beta,
      const_cast<void* const*>(p + 2 * count), CudaType(ct), ldc, count, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return InternalError("gemm " + std::to_string(seqs) + "x" + std::to_string(heads) + " x " +
                         std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                         " (" + std::string(DTypeName(ab)) + "): cublasGemmBatchedEx: " +
                         cublasGetStatusString(st));
  }
  return UsedCublas(slot);
}

// Sequences per batched GEMM in attention backward: as many as keep the
// group's f32 score gradients within 2^26 elements (256 MiB; with 16-bit
// operands, as much again for their rounded dS and P), at least one.
// ops::ComposedAttentionBackwardGroup (ops.h, which this library sits
// below) is the same rule for the memory counts: change both.
int64_t BackwardGroup(const AttentionShape& s) {
  const int64_t per_seq = s.heads * s.q_len * s.kv_len;
  return std::clamp<int64_t>((int64_t{1} << 26) / per_seq, 1, s.batch);
}

// A view as sdpa_plan.h's checks see it: row stride, start alignment.
cuda::SdpaOperand Operand(const MatrixRef& m) {
  return cuda::SdpaOperand{
      m.ld, static_cast<int64_t>(reinterpret_cast<uintptr_t>(Ptr(m.t, m.offset)) %
                                 cuda::kSdpaAlignmentBytes)};
}

// Logs, once per op and reason, that a linear-memory attention call runs
// composed (its probabilities in a temporary) and why.
void LogComposedFallback(const char* op, const AttentionShape& s, DType t, const Status& why) {
  static std::mutex mu;
  static std::set<std::string>* seen = new std::set<std::string>;
  const std::string key = std::string(op) + ": " + why.ToString();
  std::lock_guard<std::mutex> lock(mu);
  if (!seen->insert(key).second) return;
  LOG(WARNING) << op << " on CUDA runs the composed attention (probabilities in a temporary of "
               << s.batch * s.heads * s.q_len * s.kv_len * 4 << " bytes), not cuDNN's fused SDPA: "
               << why.ToString() << " [first call: batch " << s.batch << ", heads " << s.heads
               << ", q_len " << s.q_len << ", kv_len " << s.kv_len << ", head_dim " << s.head_dim
               << ", " << DTypeName(t) << (s.causal ? ", causal" : "") << "; logged once per reason]";
}

class CudaBackend final : public OpBackend {
 public:
  const char* name() const override { return "cuda"; }
  bool executes() const override { return true; }

  // cuBLAS stores a bf16/f16 C itself (CUBLAS_COMPUTE_32F and no
  // reduced-precision reduction, NewHandle(): f32 accumulation, one rounding); only the empty product (k = 0) goes through f32 staging.
  bool GemmStores16Bit(const GemmParams& p) const override { return p.k > 0; }

  // Every model op reads and writes its 16-bit operands itself (kernels.h:
  // Buf); attention runs its GEMMs on 16-bit operands (tensor cores) and
  // rounds where cuda_backend.h says.
  // The linear-memory attention too: cuDNN's SDPA takes one 16-bit dtype.
  bool Native16Bit(std::string_view op) const override {
    return IsStagedModelOp(op) || op == "flash_attention_fwd" || op == "flash_attention_bwd";
  }

  Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
              const MatrixRef& c) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gemm"));
    return GemmStrided(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, Ptr(a.t, a.offset), a.ld,
                       a.batch_stride, Ptr(b.t, b.offset), b.ld, b.batch_stride, a.t.dtype(),
                       p.beta, Ptr(c.t, c.offset), c.t.dtype(), c.ld, c.batch_stride, p.batch);
  }

  // GemmBias and GemmBiasResidual with 16-bit operands, a bias (and
  // residual) of C's dtype: one cuBLASLt GEMM (LtGemmBias) unless
  // SK_CUDA_FUSED_EPILOGUES=0. Where cuBLASLt offers no algorithm the same
  // ops run as the dispatcher would compose them.
  bool GemmAddsBias(const GemmParams& p, DType ab, DType bias, DType c) const override {
    return FusedEpilogues() && ab != DType::kF32 && bias == c && p.k > 0;
  }
  bool GemmAddsResidual(const GemmParams& p, DType ab, DType bias, DType residual,
                        DType c) const override {
    return GemmAddsBias(p, ab, bias, c) && residual == c;
  }

  Status GemmBias(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                  const Tensor& bias, const MatrixRef& c) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gemm"));
    bool ran = false;
    SK_RETURN_IF_ERROR(LtGemmBias(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha,
                                  Ptr(a.t, a.offset), a.ld, Ptr(b.t, b.offset), b.ld, a.t.dtype(),
                                  bias.data(), nullptr, Ptr(c.t, c.offset), c.t.dtype(), &ran));
    if (ran) return OkStatus();
    cuda::Buf rows{Ptr(c.t, c.offset), c.t.dtype()};
    SK_CUDA_OP("gemm", cuda::BroadcastRows(C(bias), p.n, rows, p.m, S(ctx)));
    return GemmStrided(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, Ptr(a.t, a.offset), a.ld,
                       0, Ptr(b.t, b.offset), b.ld, 0, a.t.dtype(), 1.0f, rows.data, c.t.dtype(),
                       c.ld, 0, 1);
  }

  Status GemmBiasResidual(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                          const MatrixRef& b, const Tensor& bias, const Tensor& residual,
                          const MatrixRef& c) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gemm"));
    bool ran = false;
    SK_RETURN_IF_ERROR(LtGemmBias(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha,
                                  Ptr(a.t, a.offset), a.ld, Ptr(b.t, b.offset), b.ld, a.t.dtype(),
                                  bias.data(), residual.data(), Ptr(c.t, c.offset), c.t.dtype(),
                                  &ran));
    if (ran) return OkStatus();
    // The composition: the linear layer into f32, the residual added, one
    // rounding into C.
    const int64_t mn = p.m * p.n;
    SK_ASSIGN_OR_RETURN(Tensor sum, ctx.alloc->Empty(DType::kF32, Shape{mn}));
    SK_CUDA_OP("gemm", cuda::BroadcastRows(C(bias), p.n, B(sum), p.m, S(ctx)));
    SK_RETURN_IF_ERROR(GemmStrided(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha,
                                   Ptr(a.t, a.offset), a.ld, 0, Ptr(b.t, b.offset), b.ld, 0,
                                   a.t.dtype(), 1.0f, sum.data(), DType::kF32, p.n, 0, 1));
    SK_CUDA_OP("gemm", cuda::Axpy(1.0f, residual.data(), residual.dtype(), sum.data(), DType::kF32,
                                  mn, S(ctx)));
    SK_CUDA_OP("gemm", cuda::Cast(sum.data(), DType::kF32, Ptr(c.t, c.offset), c.t.dtype(), mn,
                                  S(ctx)));
    return OkStatus();
  }

  // GemmBiasGelu and GemmGeluBackward with 16-bit operands and bias, pre
  // and C of their dtype: one cuBLASLt GEMM each (GELU_AUX_BIAS, DGELU)
  // under SK_CUDA_FUSED_EPILOGUES=1, as GemmAddsBias. Where cuBLASLt
  // declines, the ops they are defined by run here.
  bool GemmFusesGelu(const GemmParams& p, DType ab, DType bias, DType pre, DType c) const override {
    return GemmAddsBias(p, ab, bias, c) && c == ab && pre == c;
  }

  Status GemmBiasGelu(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                      const MatrixRef& b, const Tensor& bias, const Tensor& pre,
                      const Tensor& out) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gemm"));
    bool ran = false;
    SK_RETURN_IF_ERROR(LtGemmEpilogue(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha,
                                      Ptr(a.t, a.offset), a.ld, Ptr(b.t, b.offset), b.ld,
                                      a.t.dtype(), CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias.data(),
                                      pre.data(), nullptr, out.data(), out.dtype(), &ran));
    if (ran) return OkStatus();
    SK_RETURN_IF_ERROR(GemmBias(ctx, p, a, b, bias, MatrixRef{pre, 0, p.n}));
    SK_CUDA_OP("gemm", cuda::GeluForward(C(pre), pre.numel(), B(out), S(ctx)));
    return OkStatus();
  }

  Status GemmGeluBackward(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                          const MatrixRef& b, const Tensor& pre, const MatrixRef& c) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gemm"));
    bool ran = false;
    void* d = Ptr(c.t, c.offset);
    SK_RETURN_IF_ERROR(LtGemmEpilogue(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha,
                                      Ptr(a.t, a.offset), a.ld, Ptr(b.t, b.offset), b.ld,
                                      a.t.dtype(), CUBLASLT_EPILOGUE_DGELU, nullptr, pre.data(),
                                      nullptr, d, c.t.dtype(), &ran));
    if (ran) return OkStatus();
    SK_RETURN_IF_ERROR(Gemm(ctx, p, a, b, c));
    const cuda::Buf rows{d, c.t.dtype()};
    SK_CUDA_OP("gemm", cuda::GeluBackward(C(pre), cuda::CBuf{d, c.t.dtype()}, pre.numel(), rows, S(ctx)));
    return OkStatus();
  }

  Status Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "copy"));
    if (src.nbytes() == 0) return OkStatus();
    SK_CUDA_OP("copy", cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault,
                                       static_cast<cudaStream_t>(S(ctx))));
    return OkStatus();
  }

  Status Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "cast"));
    SK_CUDA_OP("cast", cuda::Cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(),
                                  S(ctx)));
    return OkStatus();
  }

  Status RoundToDType(const OpContext& ctx, const Tensor& x, DType t) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "round_to_dtype"));
    SK_CUDA_OP("round_to_dtype", cuda::RoundToDType(F(x), x.numel(), t, S(ctx)));
    return OkStatus();
  }

  Status Scale(const OpContext& ctx, const Tensor& x, float alpha) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "scale"));
    SK_CUDA_OP("scale", cuda::Scale(x.data(), x.dtype(), x.numel(), alpha, S(ctx)));
    return OkStatus();
  }

  Status Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "axpy"));
    SK_CUDA_OP("axpy",
               cuda::Axpy(alpha, x.data(), x.dtype(), y.data(), y.dtype(), x.numel(), S(ctx)));
    return OkStatus();
  }

  Status Fill(const OpContext& ctx, const Tensor& x, float value) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "fill"));
    if (value == 0.0f && !std::signbit(value)) {  // +0 is all-zero bits in f32, bf16 and f16
      if (x.nbytes() == 0) return OkStatus();
      SK_CUDA_OP("fill", cudaMemsetAsync(x.data(), 0, x.nbytes(), static_cast<cudaStream_t>(S(ctx))));
      return OkStatus();
    }
    SK_CUDA_OP("fill", cuda::Fill(x.data(), x.dtype(), x.numel(), value, S(ctx)));
    return OkStatus();
  }

  Status InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed, uint64_t param_id,
                    int64_t begin, const Tensor& out) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "init_philox"));
    SK_CUDA_OP("init_philox", cuda::InitPhilox(init, seed, param_id, begin, out.data(),
                                               out.dtype(), out.numel(), S(ctx)));
    return OkStatus();
  }

  Status BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "broadcast_rows"));
    const int64_t cols = src.numel();
    if (cols == 0) return OkStatus();
    SK_CUDA_OP("broadcast_rows", cuda::BroadcastRows(C(src), cols, B(dst), dst.numel() / cols, S(ctx)));
    return OkStatus();
  }

  Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "bias_add"));
    const int64_t cols = bias.numel();
    if (cols == 0) return OkStatus();
    SK_CUDA_OP("bias_add", cuda::BiasAdd(C(bias), cols, B(y), y.numel() / cols, S(ctx)));
    return OkStatus();
  }

  Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "bias_grad"));
    const int64_t cols = dbias.numel();
    if (cols == 0 || dy.numel() == 0) return OkStatus();
    const int64_t rows = dy.numel() / cols;
    SK_ASSIGN_OR_RETURN(Tensor partials,
                        ctx.alloc->Empty(DType::kF32, Shape{cuda::ColumnChunks(rows) * cols}));
    SK_CUDA_OP("bias_grad", cuda::BiasGrad(C(dy), rows, cols, B(dbias), F(partials), S(ctx)));
    return OkStatus();
  }

  Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gelu_fwd"));
    SK_CUDA_OP("gelu_fwd", cuda::GeluForward(C(x), x.numel(), B(y), S(ctx)));
    return OkStatus();
  }

  Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gelu_bwd"));
    SK_CUDA_OP("gelu_bwd", cuda::GeluBackward(C(x), C(dy), x.numel(), B(dx), S(ctx)));
    return OkStatus();
  }

  Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                          const Tensor& beta, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "layer_norm_fwd"));
    const int64_t cols = gamma.numel();
    if (cols == 0) return OkStatus();
    SK_CUDA_OP("layer_norm_fwd", cuda::LayerNormForward(C(x), C(gamma), C(beta), x.numel() / cols,
                                                        cols, B(y), F(mean), F(rstd), S(ctx)));
    return OkStatus();
  }

  Status LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                           const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "layer_norm_bwd"));
    const int64_t cols = gamma.numel();
    if (cols == 0 || x.numel() == 0) return OkStatus();
    const int64_t rows = x.numel() / cols;
    SK_ASSIGN_OR_RETURN(Tensor partials, ctx.alloc->Empty(DType::kF32,
                                                          Shape{2 * cuda::ColumnChunks(rows) * cols}));
    SK_CUDA_OP("layer_norm_bwd",
               cuda::LayerNormBackward(C(x), C(gamma), C(dy), F(mean), F(rstd), rows, cols, B(dx),
                                       B(dgamma), B(dbeta), F(partials), S(ctx)));
    return OkStatus();
  }

  Status RmsNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, float eps,
                        const Tensor& y, const Tensor& rstd) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "rms_norm_fwd"));
    const int64_t cols = gamma.numel();
    if (cols == 0 || x.numel() == 0) return OkStatus();
    SK_CUDA_OP("rms_norm_fwd", cuda::RmsNormForward(C(x), C(gamma), x.numel() / cols, cols, eps,
                                                    B(y), F(rstd), S(ctx)));
    return OkStatus();
  }

  Status RmsNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                         const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                         const Tensor& dgamma) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "rms_norm_bwd"));
    const int64_t cols = gamma.numel();
    if (cols == 0 || x.numel() == 0) return OkStatus();
    const int64_t rows = x.numel() / cols;
    SK_ASSIGN_OR_RETURN(Tensor partials, ctx.alloc->Empty(DType::kF32,
                                                          Shape{2 * cuda::ColumnChunks(rows) * cols}));
    SK_CUDA_OP("rms_norm_bwd", cuda::RmsNormBackward(C(x), C(gamma), C(dy), F(rstd), rows, cols,
                                                     B(dx), B(dgamma), F(partials), S(ctx)));
    return OkStatus();
  }

  Status Rope(const OpContext& ctx, const Tensor& x, int64_t seq_len, int64_t heads,
              int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
              const Tensor& y, const Tensor& positions) override {
    const char* op = inverse ? "rope_bwd" : "rope_fwd";
    SK_RETURN_IF_ERROR(Enter(ctx, op));
    const int32_t* pos = positions.defined() ? positions.data_as<int32_t>() : nullptr;
    SK_CUDA_OP(op, cuda::Rope(C(x), x.numel(), seq_len, heads, head_dim, theta, scaling,
                              inverse, B(y), pos, S(ctx)));
    return OkStatus();
  }

  Status SwiGluForward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                       const Tensor& y) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "swiglu_fwd"));
    SK_CUDA_OP("swiglu_fwd", cuda::SwiGluForward(C(gate), C(up), gate.numel(), B(y), S(ctx)));
    return OkStatus();
  }

  Status SwiGluBackward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                        const Tensor& dy, const Tensor& dgate, const Tensor& dup) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "swiglu_bwd"));
    SK_CUDA_OP("swiglu_bwd", cuda::SwiGluBackward(C(gate), C(up), C(dy), gate.numel(), B(dgate),
                                                  B(dup), S(ctx)));
    return OkStatus();
  }

  Status AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& out) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "attention_fwd"));
    return ComposedForward(ctx, s, q, k, v, probs, out, nullptr);
  }

  // In the dtype t of every operand but probs (as forward), for groups of
  // BackwardGroup(s) sequences, each step one batched GEMM over the group's
  // (sequence, head) pairs: dP = dO V^T (f32); dS = scale P (dP -
  // rowdot(P, dP)) from the f32 P and dP (masked entries have P = 0);
  // dV = P^T dO, dQ = dS K, dK = dS^T Q. f32 t: dS overwrites dP and the
  // GEMMs read the f32 P and dS. 16-bit t: the softmax backward stores dS
  // and P rounded to t in two temporaries, and the three GEMMs run on them
  // on tensor cores (f32 accumulation, outputs rounded once). dP lives in
  // the op's scratch for a group of one sequence, else in a temporary of the
  // group's size; temporaries are reused by the next group in stream order.
  Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                           const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                           const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                           const MatrixRef& dv, const Tensor& scratch) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "attention_bwd"));
    return ComposedBackward(ctx, s, q, k, v, probs, dout, dq, dk, dv, scratch);
  }

  // cuDNN's fused SDPA takes the shape and dtype and libcudnn.so.9 loads
  // (sdpa_plan.h, cudnn_attention.h); a graph that then fails to build or
  // run still falls back, logged. Decided without the packed documents
  // (key_start): a packed batch keeps the linear-memory op its unpacked
  // shape gets, whose calls then run composed with the probabilities in a
  // temporary of that call only (FlashAttentionForward), rather than
  // keeping every layer's probabilities from forward to backward; the
  // memory estimate, which sees no batch, counts the same choice.
  bool PrefersFlashAttention(const AttentionShape& s, DType t) const override {
    AttentionShape unpacked = s;
    unpacked.key_start = Tensor();
    unpacked.masked_pairs = 0;
    const int64_t ld = s.heads * s.head_dim;
    return cuda::SdpaSupports(unpacked, t, {{ld, 0}}).ok() && cuda::CudnnAvailable().ok();
  }

  // Linear-memory attention: cuDNN's fused SDPA (cudnn_attention.h) where
  // SdpaSupports accepts the call and cuDNN builds and runs its graph;
  // otherwise the composed attention above with the probabilities in a
  // temporary of the call (memory quadratic in the sequence for that call
  // only), logged once per reason. The log-sum-exp comes from the scores
  // before the softmax (RowLogSumExp). Packed documents (key_start) always
  // take the composed path: its softmax masks each query to its document.
  Status FlashAttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                               const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                               const Tensor& lse) override {
    const char* op = "flash_attention_fwd";
    SK_RETURN_IF_ERROR(Enter(ctx, op));
    if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return OkStatus();
    const DType t = q.t.dtype();
    Status fused = cuda::SdpaSupports(s, t, {Operand(q), Operand(k), Operand(v), Operand(out)});
    if (fused.ok()) {
      fused = cuda::CudnnSdpaForward(ctx, cuda::MakeSdpaForwardPlan(s, t, {q.ld, k.ld, v.ld, out.ld}),
                                     Ptr(q.t, q.offset), Ptr(k.t, k.offset), Ptr(v.t, v.offset),
                                     Ptr(out.t, out.offset), F(lse));
      if (fused.ok()) return OkStatus();
    }
    LogComposedFallback(op, s, t, fused);
    SK_ASSIGN_OR_RETURN(Tensor probs,
                        ctx.alloc->Empty(DType::kF32, Shape{s.batch * s.heads * s.q_len * s.kv_len}));
    if (s.Group() == 1) return ComposedForward(ctx, s, q, k, v, probs, out, F(lse));
    // Grouped-query attention composed: k and v repeated per query head.
    SK_ASSIGN_OR_RETURN(MatrixRef k_full, RepeatKv(ctx, s, k, op));
    SK_ASSIGN_OR_RETURN(MatrixRef v_full, RepeatKv(ctx, s, v, op));
    return ComposedForward(ctx, Ungrouped(s), q, k_full, v_full, probs, out, F(lse));
  }

  // The multi-head shape of a grouped one (every query head its own k and v).
  static AttentionShape Ungrouped(AttentionShape s) {
    s.kv_heads = 0;
    return s;
  }

  // A temporary [batch * kv_len, heads * head_dim] of m's dtype holding m's
  // key/value heads repeated for their query heads (uninitialised when
  // !fill: a gradient the composed backward writes).
  StatusOr<MatrixRef> RepeatKv(const OpContext& ctx, const AttentionShape& s, const MatrixRef& m,
                               const char* op, bool fill = true) {
    const int64_t rows = s.batch * s.kv_len, cols = s.heads * s.head_dim;
    SK_ASSIGN_OR_RETURN(Tensor full, ctx.alloc->Empty(m.t.dtype(), Shape{rows * cols}));
    if (fill) {
      SK_CUDA_OP(op, cuda::RepeatKvHeads(cuda::CBuf{Ptr(m.t, m.offset), m.t.dtype()}, m.ld, rows,
                                         s.KvHeads(), s.Group(), s.head_dim, B(full), S(ctx)));
    }
    return MatrixRef{full, 0, cols};
  }

  // dst (a k-shaped gradient) = the sums over each group of full's heads.
  Status SumKvGroups(const OpContext& ctx, const AttentionShape& s, const MatrixRef& full,
                     const MatrixRef& dst, const char* op) {
    SK_CUDA_OP(op, cuda::SumKvHeadGroups(C(full.t), s.batch * s.kv_len, s.KvHeads(), s.Group(),
                                         s.head_dim, cuda::Buf{Ptr(dst.t, dst.offset), dst.t.dtype()},
                                         dst.ld, S(ctx)));
    return OkStatus();
  }

  // As forward: cuDNN's SDPA backward (the op's declared workspace is its
  // dQ accumulator and delta), else the composed backward on probabilities
  // recomputed into a temporary (the scores GEMM and softmax of forward).
  Status FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                                const MatrixRef& dk, const MatrixRef& dv,
                                const Tensor& workspace) override {
    const char* op = "flash_attention_bwd";
    SK_RETURN_IF_ERROR(Enter(ctx, op));
    if (s.batch == 0 || s.heads == 0) return OkStatus();
    const DType t = q.t.dtype();
    Status fused = cuda::SdpaSupports(s, t, {Operand(q), Operand(k), Operand(v), Operand(out),
                                             Operand(dout), Operand(dq), Operand(dk), Operand(dv)});
    if (fused.ok()) {
      fused = cuda::CudnnSdpaBackward(
          ctx,
          cuda::MakeSdpaBackwardPlan(s, t, {q.ld, k.ld, v.ld, out.ld, dout.ld, dq.ld, dk.ld, dv.ld}),
          Ptr(q.t, q.offset), Ptr(k.t, k.offset), Ptr(v.t, v.offset), Ptr(out.t, out.offset),
          Ptr(dout.t, dout.offset), F(lse), Ptr(dq.t, dq.offset), Ptr(dk.t, dk.offset),
          Ptr(dv.t, dv.offset), workspace);
      if (fused.ok()) return OkStatus();
    }
    LogComposedFallback(op, s, t, fused);
    // Grouped-query attention composed: k and v repeated per query head, and
    // the repeated heads' gradients summed per group afterwards.
    const bool grouped = s.Group() > 1;
    MatrixRef kf = k, vf = v, dkf = dk, dvf = dv;
    if (grouped) {
      SK_ASSIGN_OR_RETURN(kf, RepeatKv(ctx, s, k, op));
      SK_ASSIGN_OR_RETURN(vf, RepeatKv(ctx, s, v, op));
      SK_ASSIGN_OR_RETURN(dkf, RepeatKv(ctx, s, dk, op, /*fill=*/false));
      SK_ASSIGN_OR_RETURN(dvf, RepeatKv(ctx, s, dv, op, /*fill=*/false));
    }
    const AttentionShape full = Ungrouped(s);
    Tensor probs, scratch;
    if (s.q_len > 0) {
      SK_ASSIGN_OR_RETURN(probs, ctx.alloc->Empty(DType::kF32,
                                                  Shape{s.batch * s.heads * s.q_len * s.kv_len}));
      SK_RETURN_IF_ERROR(Probabilities(ctx, full, q, kf, probs));
      SK_ASSIGN_OR_RETURN(scratch,
                          ctx.alloc->Empty(DType::kF32, Shape{s.heads * s.q_len * s.kv_len}));
    }
    SK_RETURN_IF_ERROR(ComposedBackward(ctx, full, q, kf, vf, probs, dout, dq, dkf, dvf, scratch));
    if (!grouped) return OkStatus();
    SK_RETURN_IF_ERROR(SumKvGroups(ctx, s, dkf, dk, op));
    return SumKvGroups(ctx, s, dvf, dv, op);
  }

  Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                          const Tensor& out) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "embedding_fwd"));
    SK_CUDA_OP("embedding_fwd", cuda::EmbeddingForward(C(table), Ptr<int32_t>(ids), ids.numel(),
                                                       table.shape().dim(1), B(out), S(ctx)));
    return OkStatus();
  }

  Status EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout,
                           const Tensor& dtable) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "embedding_bwd"));
    const int64_t count = ids.numel(), dim = dtable.shape().dim(1);
    if (count == 0 || dim == 0) return OkStatus();
    if (count > cuda::kMaxEmbeddingBackwardIds) {
      return InvalidArgumentError("embedding_bwd on CUDA: " + std::to_string(count) +
                                  " ids, more than the " +
                                  std::to_string(cuda::kMaxEmbeddingBackwardIds) + " it supports");
    }
    size_t bytes = 0;
    SK_CUDA_OP("embedding_bwd", cuda::EmbeddingBackwardScratchBytes(count, &bytes));
    // Sorted ids and positions plus CUB's temporaries, as f64 for 8-byte units.
    SK_ASSIGN_OR_RETURN(Tensor scratch, ctx.alloc->Empty(DType::kF64,
                                                         Shape{static_cast<int64_t>((bytes + 7) / 8)}));
    SK_CUDA_OP("embedding_bwd",
               cuda::EmbeddingBackward(Ptr<int32_t>(ids), C(dout), count, dim,
                                       dtable.shape().dim(0), F(dtable), scratch.data(),
                                       scratch.nbytes(), S(ctx)));
    return OkStatus();
  }

  Status CrossEntropyForward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                             const Tensor& loss) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_fwd"));
    const int64_t rows = targets.numel();
    const int64_t vocab = rows == 0 ? 0 : logits.numel() / rows;
    SK_ASSIGN_OR_RETURN(Tensor row_loss, ctx.alloc->Empty(DType::kF32, Shape{rows}));
    SK_CUDA_OP("cross_entropy_fwd",
               cuda::CrossEntropyForward(C(logits), Ptr<int32_t>(targets), rows, vocab,
                                         F(row_loss), F(loss), S(ctx)));
    return OkStatus();
  }

  Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                              const Tensor& dlogits, float scale) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_bwd"));
    const int64_t rows = targets.numel();
    if (rows == 0) return OkStatus();
    SK_ASSIGN_OR_RETURN(Tensor count, ctx.alloc->Empty(DType::kF64, Shape{1}));
    SK_CUDA_OP("cross_entropy_bwd",
               cuda::CrossEntropyBackward(C(logits), Ptr<int32_t>(targets), rows,
                                          logits.numel() / rows, B(dlogits),
                                          Ptr<int64_t>(count), scale, S(ctx)));
    return OkStatus();
  }

  Status CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                               const Tensor& row_loss) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_rows"));
    const int64_t rows = targets.numel();
    const int64_t vocab = rows == 0 ? 0 : logits.numel() / rows;
    SK_CUDA_OP("cross_entropy_rows", cuda::CrossEntropyRowLosses(C(logits), Ptr<int32_t>(targets), rows,
                                                                 vocab, F(row_loss), S(ctx)));
    return OkStatus();
  }

  Status CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss, const Tensor& targets,
                          const Tensor& loss) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_mean"));
    SK_CUDA_OP("cross_entropy_mean", cuda::CrossEntropyMean(F(row_loss), Ptr<int32_t>(targets),
                                                            targets.numel(), F(loss), S(ctx)));
    return OkStatus();
  }

  Status SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "sum_of_squares"));
    if (x.numel() == 0) return OkStatus();
    SK_ASSIGN_OR_RETURN(Tensor partials,
                        ctx.alloc->Empty(DType::kF64, Shape{cuda::kReduceBlocks}));
    SK_CUDA_OP("sum_of_squares", cuda::SumOfSquares(x.data(), x.dtype(), x.numel(),
                                                    Ptr<double>(partials), Ptr<double>(acc), S(ctx)));
    return OkStatus();
  }

  Status MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "max_abs"));
    if (x.numel() == 0) return OkStatus();
    SK_ASSIGN_OR_RETURN(Tensor partials,
                        ctx.alloc->Empty(DType::kF64, Shape{cuda::kReduceBlocks}));
    SK_CUDA_OP("max_abs", cuda::MaxAbs(x.data(), x.dtype(), x.numel(), Ptr<double>(partials),
                                       Ptr<double>(acc), S(ctx)));
    return OkStatus();
  }

  Status SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "sgd_update"));
    SK_CUDA_OP("sgd_update", cuda::SgdUpdate(h, F(param), F(grad),
                                             h.momentum != 0.0f ? F(momentum) : nullptr,
                                             param.numel(), S(ctx)));
    return OkStatus();
  }

  Status AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param,
                    const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) override {
    const char* op = h.decoupled ? "adamw_update" : "adam_update";
    SK_RETURN_IF_ERROR(Enter(ctx, op));
    SK_CUDA_OP(op, cuda::AdamUpdate(h, F(param), F(grad), F(exp_avg), F(exp_avg_sq),
                                    param.numel(), S(ctx)));
    return OkStatus();
  }

  StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t) override {
    double v = 0;
    SK_RETURN_IF_ERROR(CopyToHost(ctx, t, &v, "read_scalar"));
    return v;
  }

  Status ReadValues(const OpContext& ctx, const Tensor& t, double* out) override {
    return CopyToHost(ctx, t, out, "read_values");
  }

 private:
  // Composed, in the dtype t of q, k, v and out (f32, or one 16-bit dtype:
  // the dispatcher stages every other mix to f32). S = scale Q K^T for
  // every (sequence, head) as one batched GEMM (GemmSeqHeads; head h's
  // columns start at h * head_dim) into probs (f32 accumulation and
  // output); the masked row softmax in place (f32), which for 16-bit t also
  // stores P rounded to t in a temporary of the whole batch; then out = P V
  // as one batched GEMM, with P in t (tensor cores for 16-bit t, f32
  // accumulation, out rounded once).
  // With lse (f32 [batch * heads * q_len]) also the log-sum-exp of each
  // row's scores, taken before the softmax overwrites them.
  Status ComposedForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                         const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                         const MatrixRef& out, float* lse) {
    if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return OkStatus();
    const DType t = q.t.dtype();
    CHECK(k.t.dtype() == t && v.t.dtype() == t && out.t.dtype() == t)
        << "attention_fwd: the dispatcher hands the CUDA backend one dtype for q, k, v and out";
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const int64_t pq = s.q_len * s.kv_len;  // one head's probabilities
    Tensor p16;                             // P rounded to t (16-bit t only)
    if (t != DType::kF32) {
      SK_ASSIGN_OR_RETURN(p16, ctx.alloc->Empty(t, Shape{s.batch * s.heads * pq}));
    }
    const int64_t hpq = s.heads * pq;  // one sequence's probabilities
    SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, true, s.q_len, s.kv_len, s.head_dim, scale,
                                    Ptr(q.t, q.offset), q.ld, s.q_len * q.ld, s.head_dim,
                                    Ptr(k.t, k.offset), k.ld, s.kv_len * k.ld, s.head_dim, t,
                                    probs.data(), DType::kF32, s.kv_len, hpq, pq, s.batch,
                                    s.heads));
    if (lse != nullptr) {
      SK_CUDA_OP("flash_attention_fwd",
                 cuda::RowLogSumExp(F(probs), s.batch * s.heads * s.q_len, s.kv_len, s.causal,
                                    s.q_len, s.heads, KeyStarts(s), lse, S(ctx)));
    }
    SK_CUDA_OP("attention_fwd",
               cuda::SoftmaxRows(F(probs), s.batch * s.heads * s.q_len, s.kv_len, s.causal, s.q_len,
                                 s.heads, KeyStarts(s), p16.defined() ? B(p16) : cuda::Buf{},
                                 S(ctx)));
    const Tensor& p = p16.defined() ? p16 : probs;  // in t
    return GemmSeqHeads(ctx, false, false, s.q_len, s.head_dim, s.kv_len, 1.0f, p.data(),
                        s.kv_len, hpq, pq, Ptr(v.t, v.offset), v.ld, s.kv_len * v.ld, s.head_dim,
                        t, Ptr(out.t, out.offset), t, out.ld, s.q_len * out.ld, s.head_dim,
                        s.batch, s.heads);
  }

  Status ComposedBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                          const MatrixRef& dv, const Tensor& scratch) {
    if (s.batch == 0 || s.heads == 0) return OkStatus();
    const DType t = q.t.dtype();
    for (const MatrixRef* m : {&k, &v, &dout, &dq, &dk, &dv}) {
      CHECK(m->t.dtype() == t) << "attention_bwd: the dispatcher hands the CUDA backend one dtype "
                                  "for q, k, v, dout, dq, dk and dv";
    }
    const int64_t width = s.heads * s.head_dim;
    if (s.q_len == 0) {  // no query attends: the key and value gradients are zero
      SK_CUDA_OP("attention_bwd", cuda::FillMatrix(cuda::Buf{Ptr(dk.t, dk.offset), t},
                                                   s.batch * s.kv_len, width, dk.ld, 0.0f, S(ctx)));
      SK_CUDA_OP("attention_bwd", cuda::FillMatrix(cuda::Buf{Ptr(dv.t, dv.offset), t},
                                                   s.batch * s.kv_len, width, dv.ld, 0.0f, S(ctx)));
      return OkStatus();
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const int64_t pq = s.q_len * s.kv_len, hpq = s.heads * pq;
    const int64_t group = BackwardGroup(s);
    Tensor dp = scratch;  // heads * pq: AttentionBackwardScratchElements
    if (group > 1) {
      SK_ASSIGN_OR_RETURN(dp, ctx.alloc->Empty(DType::kF32, Shape{group * hpq}));
    }
    const bool half = t != DType::kF32;
    Tensor ds16, p16;  // the group's dS and P rounded to t (16-bit t only)
    if (half) {
      SK_ASSIGN_OR_RETURN(ds16, ctx.alloc->Empty(t, Shape{group * hpq}));
      SK_ASSIGN_OR_RETURN(p16, ctx.alloc->Empty(t, Shape{group * hpq}));
    }
    for (int64_t b = 0; b < s.batch; b += group) {
      const int64_t g = std::min(group, s.batch - b);  // sequences b .. b + g - 1
      const float* pb = F(probs) + b * hpq;
      const void* qb = Ptr(q.t, q.offset + b * s.q_len * q.ld);
      const void* kb = Ptr(k.t, k.offset + b * s.kv_len * k.ld);
      const void* vb = Ptr(v.t, v.offset + b * s.kv_len * v.ld);
      const void* dob = Ptr(dout.t, dout.offset + b * s.q_len * dout.ld);
      void* dqb = Ptr(dq.t, dq.offset + b * s.q_len * dq.ld);
      void* dkb = Ptr(dk.t, dk.offset + b * s.kv_len * dk.ld);
      void* dvb = Ptr(dv.t, dv.offset + b * s.kv_len * dv.ld);
      SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, true, s.q_len, s.kv_len, s.head_dim, 1.0f, dob,
                                      dout.ld, s.q_len * dout.ld, s.head_dim, vb, v.ld,
                                      s.kv_len * v.ld, s.head_dim, t, F(dp), DType::kF32,
                                      s.kv_len, hpq, pq, g, s.heads));
      // P and dS as the GEMMs read them (dtype t).
      const void* p_t = pb;
      const void* ds_t = F(dp);
      if (half) {
        SK_CUDA_OP("attention_bwd",
                   cuda::SoftmaxBackwardRows(pb, F(dp), g * s.heads * s.q_len, s.kv_len, scale,
                                             B(ds16), p16.data(), S(ctx)));
        p_t = p16.data();
        ds_t = ds16.data();
      } else {
        SK_CUDA_OP("attention_bwd",
                   cuda::SoftmaxBackwardRows(pb, F(dp), g * s.heads * s.q_len, s.kv_len, scale,
                                             cuda::Buf{}, nullptr, S(ctx)));
      }
      SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, true, false, s.kv_len, s.head_dim, s.q_len, 1.0f, p_t,
                                      s.kv_len, hpq, pq, dob, dout.ld, s.q_len * dout.ld,
                                      s.head_dim, t, dvb, t, dv.ld, s.kv_len * dv.ld, s.head_dim,
                                      g, s.heads));
      SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, false, s.q_len, s.head_dim, s.kv_len, 1.0f, ds_t,
                                      s.kv_len, hpq, pq, kb, k.ld, s.kv_len * k.ld, s.head_dim, t,
                                      dqb, t, dq.ld, s.q_len * dq.ld, s.head_dim, g, s.heads));
      SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, true, false, s.kv_len, s.head_dim, s.q_len, 1.0f, ds_t,
                                      s.kv_len, hpq, pq, qb, q.ld, s.q_len * q.ld, s.head_dim, t,
                                      dkb, t, dk.ld, s.kv_len * dk.ld, s.head_dim, g, s.heads));
    }
    return OkStatus();
  }

  // probs = softmax(scale Q K^T), masked: forward's first two steps.
  Status Probabilities(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                       const MatrixRef& k, const Tensor& probs) {
    const DType t = q.t.dtype();
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const int64_t pq = s.q_len * s.kv_len, hpq = s.heads * pq;
    SK_RETURN_IF_ERROR(GemmSeqHeads(ctx, false, true, s.q_len, s.kv_len, s.head_dim, scale,
                                    Ptr(q.t, q.offset), q.ld, s.q_len * q.ld, s.head_dim,
                                    Ptr(k.t, k.offset), k.ld, s.kv_len * k.ld, s.head_dim, t,
                                    probs.data(), DType::kF32, s.kv_len, hpq, pq, s.batch,
                                    s.heads));
    SK_CUDA_OP("flash_attention_bwd",
               cuda::SoftmaxRows(F(probs), s.batch * s.heads * s.q_len, s.kv_len, s.causal,
                                 s.q_len, s.heads, KeyStarts(s), cuda::Buf{}, S(ctx)));
    return OkStatus();
  }

  // Synchronises ctx.stream (the values must have been computed), then
  // copies all of t in one cudaMemcpy and widens each element into out.
  Status CopyToHost(const OpContext& ctx, const Tensor& t, double* out, const char* op) {
    SK_RETURN_IF_ERROR(Enter(ctx, op));
    SK_RETURN_IF_ERROR(ctx.stream->Synchronize());
    const size_t n = static_cast<size_t>(t.numel());
    std::vector<double> staging(n);  // 8-byte aligned, large enough for any dtype
    SK_CUDA_OP(op, cudaMemcpy(staging.data(), t.data(), n * DTypeSize(t.dtype()), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) out[i] = LoadAsDouble(staging.data(), t.dtype(), i);
    return OkStatus();
  }
};

}  // namespace

namespace cuda {
int LibraryHandlesCreated(int device) {
  return CublasHandles().created(device) + CublasLtHandles().created(device) +
         CudnnHandlesCreated(device);
}
}  // namespace cuda

OpBackend* CudaOpBackend() {
  static CudaBackend* backend = new CudaBackend();
  return backend;
}

namespace {

// The backend registers itself for DeviceKind::kCuda when this library is
// loaded (//runtime/ops:cuda is alwayslink; built under --config=cuda only),
// so the dispatcher includes no backend. Nothing here touches the GPU: a
// machine without one has the backend registered and no cuda device.
[[maybe_unused]] const bool kRegistered = (RegisterOpBackend(DeviceKind::kCuda, CudaOpBackend()), true);

}  // namespace

}  // namespace sk::ops
