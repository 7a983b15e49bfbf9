// cuBLAS and cuBLASLt for the CUDA backend (backend_common.h): the pooled
// handles with their math mode, and the GEMM calls the op families make.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "runtime/core/env.h"
#include "runtime/ops/cuda/backend_common.h"
#include "runtime/ops/cuda/cuda_backend.h"
#include "runtime/ops/cuda/cudnn_attention.h"
#include "runtime/ops/cuda/handle_pool.h"

namespace sk::ops {

namespace {

// SK_CUBLAS_REDUCED_PRECISION_REDUCTION=1 (read once): see NewHandle().
bool AllowReducedPrecisionReduction() {
  static const bool allow = [] {
    const char* v = GetEnv(EnvVar::kCublasReducedPrecisionReduction);
    return v != nullptr && std::string_view(v) == "1";
  }();
  return allow;
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

}  // namespace

bool FusedEpilogues() {
  static const bool on = [] {
    const char* v = GetEnv(EnvVar::kCudaFusedEpilogues);
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

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

namespace cuda {
int LibraryHandlesCreated(int device) {
  return CublasHandles().created(device) + CublasLtHandles().created(device) +
         CudnnHandlesCreated(device);
}
}  // namespace cuda

}  // namespace sk::ops
