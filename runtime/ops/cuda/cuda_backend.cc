#include "runtime/ops/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <string>

#include "runtime/ops/cuda/kernels.h"

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
float* At(const MatrixRef& m) { return Ptr<float>(m.t, m.offset); }

cudaDataType CudaType(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// Makes ctx's GPU current for the calling thread (kernels launch there).
Status Enter(const OpContext& ctx, const char* op) {
  if (ctx.stream == nullptr || ctx.stream->native_handle() == nullptr) {
    return InvalidArgumentError(std::string(op) + ": a CUDA op needs a CUDA stream in its context");
  }
  SK_CUDA_OP(op, cudaSetDevice(ctx.device->id().index));
  return OkStatus();
}

StatusOr<cublasHandle_t> Handle(int device) {
  thread_local std::map<int, cublasHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  cublasStatus_t st = cublasCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return UnavailableError(std::string("cublasCreate failed: ") + cublasGetStatusString(st));
  }
  handles[device] = h;  // lives as long as the thread; cuBLAS handles are cheap to keep
  return h;
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
        SK_CUDA_OP("gemm", cuda::FillMatrix(ci, m, n, ldc, 0.0f, S(ctx)));
      } else if (beta != 1.0f) {
        for (int64_t r = 0; r < m; ++r) {
          SK_CUDA_OP("gemm", cuda::Scale(ci + r * ldc, DType::kF32, n, beta, S(ctx)));
        }
      }
    }
    return OkStatus();
  }
  SK_ASSIGN_OR_RETURN(cublasHandle_t h, Handle(ctx.device->id().index));
  cublasStatus_t st = cublasSetStream(h, static_cast<cudaStream_t>(S(ctx)));
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasGemmStridedBatchedEx_64(
        h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
        CudaType(ab), ldb, stride_b, a, CudaType(ab), lda, stride_a, &beta, c_ptr, CudaType(ct),
        ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    return InternalError("gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                         std::to_string(k) + " (" + std::string(DTypeName(ab)) +
                         "): cublasGemmStridedBatchedEx: " + cublasGetStatusString(st));
  }
  return OkStatus();
}

class CudaBackend final : public OpBackend {
 public:
  const char* name() const override { return "cuda"; }
  bool executes() const override { return true; }

  // cuBLAS stores a bf16/f16 C itself (CUBLAS_COMPUTE_32F: f32 accumulation,
  // one rounding); only the empty product (k = 0) goes through f32 staging.
  bool GemmStores16Bit(const GemmParams& p) const override { return p.k > 0; }

  Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
              const MatrixRef& c) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gemm"));
    return GemmStrided(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, Ptr(a.t, a.offset), a.ld,
                       a.batch_stride, Ptr(b.t, b.offset), b.ld, b.batch_stride, a.t.dtype(),
                       p.beta, Ptr(c.t, c.offset), c.t.dtype(), c.ld, c.batch_stride, p.batch);
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
    SK_CUDA_OP("broadcast_rows", cuda::BroadcastRows(F(src), cols, F(dst), dst.numel() / cols, S(ctx)));
    return OkStatus();
  }

  Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "bias_add"));
    const int64_t cols = bias.numel();
    if (cols == 0) return OkStatus();
    SK_CUDA_OP("bias_add", cuda::BiasAdd(F(bias), cols, F(y), y.numel() / cols, S(ctx)));
    return OkStatus();
  }

  Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "bias_grad"));
    const int64_t cols = dbias.numel();
    if (cols == 0 || dy.numel() == 0) return OkStatus();
    const int64_t rows = dy.numel() / cols;
    SK_ASSIGN_OR_RETURN(Tensor partials,
                        ctx.alloc->Empty(DType::kF32, Shape{cuda::ColumnChunks(rows) * cols}));
    SK_CUDA_OP("bias_grad", cuda::BiasGrad(F(dy), rows, cols, F(dbias), F(partials), S(ctx)));
    return OkStatus();
  }

  Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gelu_fwd"));
    SK_CUDA_OP("gelu_fwd", cuda::GeluForward(F(x), x.numel(), F(y), S(ctx)));
    return OkStatus();
  }

  Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "gelu_bwd"));
    SK_CUDA_OP("gelu_bwd", cuda::GeluBackward(F(x), F(dy), x.numel(), F(dx), S(ctx)));
    return OkStatus();
  }

  Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                          const Tensor& beta, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "layer_norm_fwd"));
    const int64_t cols = gamma.numel();
    if (cols == 0) return OkStatus();
    SK_CUDA_OP("layer_norm_fwd", cuda::LayerNormForward(F(x), F(gamma), F(beta), x.numel() / cols,
                                                        cols, F(y), F(mean), F(rstd), S(ctx)));
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
               cuda::LayerNormBackward(F(x), F(gamma), F(dy), F(mean), F(rstd), rows, cols, F(dx),
                                       F(dgamma), F(dbeta), F(partials), S(ctx)));
    return OkStatus();
  }

  // Composed: per sequence b, S = scale Q K^T over all heads as one strided
  // batched GEMM (head h's columns start at h * head_dim), the masked row
  // softmax in place, then out = P V.
  Status AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& out) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "attention_fwd"));
    if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return OkStatus();
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const int64_t pq = s.q_len * s.kv_len;  // one head's probabilities
    for (int64_t b = 0; b < s.batch; ++b) {
      float* p = F(probs) + b * s.heads * pq;
      SK_RETURN_IF_ERROR(GemmStrided(ctx, false, true, s.q_len, s.kv_len, s.head_dim, scale,
                                     At(q) + b * s.q_len * q.ld, q.ld, s.head_dim,
                                     At(k) + b * s.kv_len * k.ld, k.ld, s.head_dim, DType::kF32,
                                     0.0f, p, DType::kF32, s.kv_len, pq, s.heads));
    }
    SK_CUDA_OP("attention_fwd", cuda::SoftmaxRows(F(probs), s.batch * s.heads * s.q_len, s.kv_len,
                                                  s.causal, s.q_len, S(ctx)));
    for (int64_t b = 0; b < s.batch; ++b) {
      const float* p = F(probs) + b * s.heads * pq;
      SK_RETURN_IF_ERROR(GemmStrided(ctx, false, false, s.q_len, s.head_dim, s.kv_len, 1.0f, p,
                                     s.kv_len, pq, At(v) + b * s.kv_len * v.ld, v.ld, s.head_dim,
                                     DType::kF32, 0.0f, At(out) + b * s.q_len * out.ld, DType::kF32, out.ld,
                                     s.head_dim, s.heads));
    }
    return OkStatus();
  }

  // dP = dO V^T and dV = P^T dO; dS = scale P (dP - rowdot(P, dP)) in place
  // (masked entries have P = 0); dQ = dS K, dK = dS^T Q. One sequence's
  // score gradients (heads x q_len x kv_len f32) are the op's scratch.
  Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                           const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                           const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                           const MatrixRef& dv, const Tensor& scratch) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "attention_bwd"));
    if (s.batch == 0 || s.heads == 0) return OkStatus();
    const int64_t width = s.heads * s.head_dim;
    if (s.q_len == 0) {  // no query attends: the key and value gradients are zero
      SK_CUDA_OP("attention_bwd", cuda::FillMatrix(At(dk), s.batch * s.kv_len, width, dk.ld, 0.0f, S(ctx)));
      SK_CUDA_OP("attention_bwd", cuda::FillMatrix(At(dv), s.batch * s.kv_len, width, dv.ld, 0.0f, S(ctx)));
      return OkStatus();
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const int64_t pq = s.q_len * s.kv_len;
    float* ds = F(scratch);  // heads * pq: AttentionBackwardScratchElements
    for (int64_t b = 0; b < s.batch; ++b) {
      const float* p = F(probs) + b * s.heads * pq;
      const float* qb = At(q) + b * s.q_len * q.ld;
      const float* kb = At(k) + b * s.kv_len * k.ld;
      const float* vb = At(v) + b * s.kv_len * v.ld;
      const float* dob = At(dout) + b * s.q_len * dout.ld;
      SK_RETURN_IF_ERROR(GemmStrided(ctx, false, true, s.q_len, s.kv_len, s.head_dim, 1.0f, dob,
                                     dout.ld, s.head_dim, vb, v.ld, s.head_dim, DType::kF32, 0.0f,
                                     ds, DType::kF32, s.kv_len, pq, s.heads));
      SK_RETURN_IF_ERROR(GemmStrided(ctx, true, false, s.kv_len, s.head_dim, s.q_len, 1.0f, p,
                                     s.kv_len, pq, dob, dout.ld, s.head_dim, DType::kF32, 0.0f,
                                     At(dv) + b * s.kv_len * dv.ld, DType::kF32, dv.ld, s.head_dim, s.heads));
      SK_CUDA_OP("attention_bwd",
                 cuda::SoftmaxBackwardRows(p, ds, s.heads * s.q_len, s.kv_len, scale, S(ctx)));
      SK_RETURN_IF_ERROR(GemmStrided(ctx, false, false, s.q_len, s.head_dim, s.kv_len, 1.0f, ds,
                                     s.kv_len, pq, kb, k.ld, s.head_dim, DType::kF32, 0.0f,
                                     At(dq) + b * s.q_len * dq.ld, DType::kF32, dq.ld, s.head_dim, s.heads));
      SK_RETURN_IF_ERROR(GemmStrided(ctx, true, false, s.kv_len, s.head_dim, s.q_len, 1.0f, ds,
                                     s.kv_len, pq, qb, q.ld, s.head_dim, DType::kF32, 0.0f,
                                     At(dk) + b * s.kv_len * dk.ld, DType::kF32, dk.ld, s.head_dim, s.heads));
    }
    return OkStatus();
  }

  Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                          const Tensor& out) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "embedding_fwd"));
    SK_CUDA_OP("embedding_fwd", cuda::EmbeddingForward(F(table), Ptr<int32_t>(ids), ids.numel(),
                                                       table.shape().dim(1), F(out), S(ctx)));
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
               cuda::EmbeddingBackward(Ptr<int32_t>(ids), F(dout), count, dim,
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
               cuda::CrossEntropyForward(F(logits), Ptr<int32_t>(targets), rows, vocab,
                                         F(row_loss), F(loss), S(ctx)));
    return OkStatus();
  }

  Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                              const Tensor& dlogits) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "cross_entropy_bwd"));
    const int64_t rows = targets.numel();
    if (rows == 0) return OkStatus();
    SK_ASSIGN_OR_RETURN(Tensor count, ctx.alloc->Empty(DType::kF64, Shape{1}));
    SK_CUDA_OP("cross_entropy_bwd",
               cuda::CrossEntropyBackward(F(logits), Ptr<int32_t>(targets), rows,
                                          logits.numel() / rows, F(dlogits),
                                          Ptr<int64_t>(count), S(ctx)));
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

  // Synchronises ctx.stream (the value must have been computed), then copies.
  StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t) override {
    SK_RETURN_IF_ERROR(Enter(ctx, "read_scalar"));
    SK_RETURN_IF_ERROR(ctx.stream->Synchronize());
    alignas(8) unsigned char bytes[8] = {};
    SK_CUDA_OP("read_scalar", cudaMemcpy(bytes, t.data(), DTypeSize(t.dtype()), cudaMemcpyDeviceToHost));
    switch (t.dtype()) {
      case DType::kF64: return *reinterpret_cast<double*>(bytes);
      case DType::kI32: return static_cast<double>(*reinterpret_cast<int32_t*>(bytes));
      default: return static_cast<double>(LoadAsFloat(bytes, t.dtype(), 0));
    }
  }
};

}  // namespace

OpBackend* CudaOpBackend() {
  static CudaBackend* backend = new CudaBackend();
  return backend;
}

}  // namespace sk::ops
