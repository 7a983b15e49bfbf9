// The CUDA backend's GEMMs (backend_common.h): cuBLAS, and cuBLASLt's fused
// epilogues where they are asked for (cublas.cc).

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

Status CudaBackend::Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                         const MatrixRef& c) {
  SK_RETURN_IF_ERROR(Enter(ctx, "gemm"));
  return GemmStrided(ctx, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, Ptr(a.t, a.offset), a.ld,
                     a.batch_stride, Ptr(b.t, b.offset), b.ld, b.batch_stride, a.t.dtype(),
                     p.beta, Ptr(c.t, c.offset), c.t.dtype(), c.ld, c.batch_stride, p.batch);
}

Status CudaBackend::GemmBias(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                             const MatrixRef& b, const Tensor& bias, const MatrixRef& c) {
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

Status CudaBackend::GemmBiasResidual(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                                     const MatrixRef& b, const Tensor& bias, const Tensor& residual,
                                     const MatrixRef& c) {
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

Status CudaBackend::GemmBiasGelu(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                                 const MatrixRef& b, const Tensor& bias, const Tensor& pre,
                                 const Tensor& out) {
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

Status CudaBackend::GemmGeluBackward(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                                     const MatrixRef& b, const Tensor& pre, const MatrixRef& c) {
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

}  // namespace sk::ops
