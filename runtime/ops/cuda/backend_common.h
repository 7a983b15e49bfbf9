// The CUDA backend's class and what its op families share; private to
// //runtime/ops:cuda (cuda_backend.h is the public interface). The backend's
// methods live by op family, as the op layer's dispatchers and the kernels
// (kernels.h) do:
//   cuda_backend.cc          the backend object and its registration
//   cublas.cc                cuBLAS and cuBLASLt: the handles, the strided
//                            and per-(sequence, head) GEMMs, the fused
//                            epilogues
//   backend_gemm.cc          Gemm, GemmBias, GemmBiasResidual, GemmBiasGelu,
//                            GemmGeluBackward
//   backend_data.cc          Copy, Cast, RoundToDType, Scale, Axpy, Fill,
//                            InitPhilox, ReadScalar, ReadValues
//   backend_elementwise.cc   bias, GELU, RoPE, SwiGLU
//   backend_norms.cc         LayerNorm, RMSNorm
//   backend_attention.cc     the composed attention, cuDNN's fused SDPA and
//                            the fallbacks between them
//   backend_embedding.cc     embedding
//   backend_loss.cc          cross-entropy
//   backend_optimizer.cc     grad-norm partials, SGD, Adam
//
// The small helpers below have internal linkage (an unnamed namespace, as
// in the one file they came from): each family file inlines its own copies.
// Built under --config=cuda only.
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_BACKEND_COMMON_H_
#define SHARDKIT_RUNTIME_OPS_CUDA_BACKEND_COMMON_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/ops/backend.h"
#include "runtime/ops/cuda/kernels.h"

namespace sk::ops {

namespace {


inline Status CudaStatus(int err, const char* op) {
  if (err == 0) return OkStatus();
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  auto e = static_cast<cudaError_t>(err);
  std::string msg = std::string(op) + " on CUDA: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  return InternalError(msg);
}

#define SK_CUDA_OP(op, expr) SK_RETURN_IF_ERROR(CudaStatus((expr), op))

inline void* S(const OpContext& ctx) { return ctx.stream->native_handle(); }

// Pointer to element `offset` of `t`.
template <typename T = void>
inline T* Ptr(const Tensor& t, int64_t offset = 0) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data()) + offset * DTypeSize(t.dtype()));
}
inline float* F(const Tensor& t) { return Ptr<float>(t); }
// A tensor as a kernel operand of its own dtype.
inline cuda::Buf B(const Tensor& t) { return cuda::Buf{t.data(), t.dtype()}; }
inline cuda::CBuf C(const Tensor& t) { return cuda::CBuf{t.data(), t.dtype()}; }

inline cudaDataType CudaType(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The key starts of packed documents (AttentionShape::key_start: device
// i32 [batch * q_len]), or nullptr without them: the composed attention's
// softmax and log-sum-exp kernels mask each query's keys to its own
// document (math::AttentionRowKeys).
inline const int32_t* KeyStarts(const AttentionShape& s) {
  return s.key_start.defined() ? s.key_start.data_as<int32_t>() : nullptr;
}

// Makes ctx's GPU current for the calling thread (kernels launch there).
inline Status Enter(const OpContext& ctx, const char* op) {
  if (ctx.stream == nullptr || ctx.stream->native_handle() == nullptr) {
    return InvalidArgumentError(std::string(op) + ": a CUDA op needs a CUDA stream in its context");
  }
  SK_CUDA_OP(op, cudaSetDevice(ctx.device->id().index));
  return OkStatus();
}

}  // namespace

// SK_CUDA_FUSED_EPILOGUES (read once): "1" runs GemmBias and
// GemmBiasResidual with 16-bit operands as one cuBLASLt GEMM whose epilogue
// adds the bias (and whose beta = 1 term is the residual); unset or
// anything else runs the ops they are defined by (BroadcastRows then a GEMM
// with beta = 1; GemmBias, Axpy and Cast). Off by default: on the H200 (27
// Nov) the fused bf16 results missed the conformance bound of one rounding
// (1.1x and 1.6x of it; docs/cuda.md).
bool FusedEpilogues();

// Row-major C = alpha op(A) op(B) + beta C for `batch` matrices at the given
// strides, as column-major C^T = op(B)^T op(A)^T: operands and sizes swap,
// the transposition flags stay.
Status GemmStrided(const OpContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                   float alpha, const void* a, int64_t lda, int64_t stride_a, const void* b,
                   int64_t ldb, int64_t stride_b, DType ab, float beta, void* c_ptr, DType ct,
                   int64_t ldc, int64_t stride_c, int64_t batch);

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
                      void* d, DType dt, bool* ran);
Status LtGemmBias(const OpContext& ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                  float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, DType ab,
                  const void* bias, const void* r, void* d, DType dt, bool* ran);

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
                    int64_t heads);

class CudaBackend final : public OpBackend {
 public:
  const char* name() const override { return "cuda"; }
  bool executes() const override { return true; }

  // cuBLAS stores a bf16/f16 C itself (CUBLAS_COMPUTE_32F and no
  // reduced-precision reduction, cublas.cc's NewHandle(): f32
  // accumulation, one rounding); only the empty product (k = 0) goes
  // through f32 staging.
  bool GemmStores16Bit(const GemmParams& p) const override { return p.k > 0; }

  // Every model op reads and writes its 16-bit operands itself (kernels.h:
  // Buf); attention runs its GEMMs on 16-bit operands (tensor cores) and
  // rounds where cuda_backend.h says.
  // The linear-memory attention too: cuDNN's SDPA takes one 16-bit dtype.
  bool Native16Bit(std::string_view op) const override {
    return IsStagedModelOp(op) || op == "flash_attention_fwd" || op == "flash_attention_bwd";
  }

  Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
              const MatrixRef& c) override;

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
                  const Tensor& bias, const MatrixRef& c) override;

  Status GemmBiasResidual(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                          const MatrixRef& b, const Tensor& bias, const Tensor& residual,
                          const MatrixRef& c) override;

  // GemmBiasGelu and GemmGeluBackward with 16-bit operands and bias, pre
  // and C of their dtype: one cuBLASLt GEMM each (GELU_AUX_BIAS, DGELU)
  // under SK_CUDA_FUSED_EPILOGUES=1, as GemmAddsBias. Where cuBLASLt
  // declines, the ops they are defined by run here.
  bool GemmFusesGelu(const GemmParams& p, DType ab, DType bias, DType pre, DType c) const override {
    return GemmAddsBias(p, ab, bias, c) && c == ab && pre == c;
  }

  Status GemmBiasGelu(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                      const MatrixRef& b, const Tensor& bias, const Tensor& pre,
                      const Tensor& out) override;

  Status GemmGeluBackward(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                          const MatrixRef& b, const Tensor& pre, const MatrixRef& c) override;

  Status Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst) override;

  Status Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst) override;

  Status RoundToDType(const OpContext& ctx, const Tensor& x, DType t) override;

  Status Scale(const OpContext& ctx, const Tensor& x, float alpha) override;

  Status Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y) override;

  Status Fill(const OpContext& ctx, const Tensor& x, float value) override;

  Status InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed, uint64_t param_id,
                    int64_t begin, const Tensor& out) override;

  Status BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst) override;

  Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y) override;

  Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias) override;

  Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y) override;

  Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override;

  Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                          const Tensor& beta, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd) override;

  Status LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                           const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override;

  Status RmsNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma, float eps,
                        const Tensor& y, const Tensor& rstd) override;

  Status RmsNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                         const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                         const Tensor& dgamma) override;

  Status Rope(const OpContext& ctx, const Tensor& x, int64_t seq_len, int64_t heads,
              int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
              const Tensor& y, const Tensor& positions) override;

  Status SwiGluForward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                       const Tensor& y) override;

  Status SwiGluBackward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                        const Tensor& dy, const Tensor& dgate, const Tensor& dup) override;

  Status AttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& out) override;

  Status AttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                           const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                           const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                           const MatrixRef& dv, const Tensor& scratch) override;

  bool PrefersFlashAttention(const AttentionShape& s, DType t) const override;

  Status FlashAttentionForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                               const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                               const Tensor& lse) override;

  static AttentionShape Ungrouped(AttentionShape s);

  StatusOr<MatrixRef> RepeatKv(const OpContext& ctx, const AttentionShape& s, const MatrixRef& m,
                               const char* op, bool fill = true);

  Status SumKvGroups(const OpContext& ctx, const AttentionShape& s, const MatrixRef& full,
                     const MatrixRef& dst, const char* op);

  Status FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                                const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                                const MatrixRef& dk, const MatrixRef& dv,
                                const Tensor& workspace) override;

  Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                          const Tensor& out) override;

  Status EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout,
                           const Tensor& dtable) override;

  Status CrossEntropyForward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                             const Tensor& loss) override;

  Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                              const Tensor& dlogits, float scale) override;

  Status CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits, const Tensor& targets,
                               const Tensor& row_loss) override;

  Status CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss, const Tensor& targets,
                          const Tensor& loss) override;

  Status SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc) override;

  Status MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc) override;

  Status SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum) override;

  Status AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param,
                    const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq) override;

  StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t) override;

  Status ReadValues(const OpContext& ctx, const Tensor& t, double* out) override;

 private:
  Status ComposedForward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                         const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                         const MatrixRef& out, float* lse);

  Status ComposedBackward(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                          const MatrixRef& dv, const Tensor& scratch);

  Status Probabilities(const OpContext& ctx, const AttentionShape& s, const MatrixRef& q,
                       const MatrixRef& k, const Tensor& probs);

  Status CopyToHost(const OpContext& ctx, const Tensor& t, double* out, const char* op);
};

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_BACKEND_COMMON_H_
