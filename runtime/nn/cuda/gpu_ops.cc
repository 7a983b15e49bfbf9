#include "runtime/nn/cuda/gpu_ops.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "runtime/nn/cuda/kernels_cuda.h"

namespace sk {
namespace gpu {
namespace {

Status FromCuda(int err, const char* what) {
  if (err == 0) return OkStatus();
  return InternalError(std::string(what) + ": " +
                       cudaGetErrorString(static_cast<cudaError_t>(err)));
}

StatusOr<cublasHandle_t> Handle() {
  thread_local cublasHandle_t handle = nullptr;
  if (handle == nullptr) {
    cublasStatus_t st = cublasCreate(&handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
      handle = nullptr;
      return UnavailableError(std::string("cublasCreate failed: ") + cublasGetStatusString(st));
    }
  }
  return handle;
}

}  // namespace

int CudaDeviceCount(std::string* reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (reason) *reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && reason) *reason = "no CUDA device is visible";
  return count;
}

Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc, void* stream) {
  SK_ASSIGN_OR_RETURN(cublasHandle_t h, Handle());
  cublasSetStream(h, static_cast<cudaStream_t>(stream));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the
  // operands and their sizes, keep the transposition flags.
  cublasStatus_t st = cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                                  static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                  static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                                  static_cast<int>(ldc));
  if (st != CUBLAS_STATUS_SUCCESS) {
    return InternalError(std::string("cublasSgemm: ") + cublasGetStatusString(st));
  }
  return OkStatus();
}

Status GeluForward(const float* x, int64_t n, float* y, void* stream) {
  return FromCuda(cuda_kernels::GeluForward(x, n, y, stream), "GeluForward");
}

Status GeluBackward(const float* x, const float* dy, int64_t n, float* dx, void* stream) {
  return FromCuda(cuda_kernels::GeluBackward(x, dy, n, dx, stream), "GeluBackward");
}

Status LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                        int64_t cols, float* y, float* mean, float* rstd, void* stream) {
  return FromCuda(cuda_kernels::LayerNormForward(x, gamma, beta, rows, cols, y, mean, rstd, stream),
                  "LayerNormForward");
}

Status LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                         const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                         float* dbeta, void* stream) {
  return FromCuda(cuda_kernels::LayerNormBackward(x, gamma, dy, mean, rstd, rows, cols, dx, dgamma,
                                                  dbeta, stream),
                  "LayerNormBackward");
}

Status SoftmaxRowsInPlace(float* x, int64_t rows, int64_t cols, void* stream) {
  return FromCuda(cuda_kernels::SoftmaxRowsInPlace(x, rows, cols, false, 1, stream), "Softmax");
}

Status CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                           int64_t vocab, float* row_loss, void* stream) {
  return FromCuda(cuda_kernels::CrossEntropyForward(logits, targets, rows, vocab, row_loss, stream),
                  "CrossEntropyForward");
}

Status CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows,
                            int64_t vocab, float scale, float* dlogits, void* stream) {
  return FromCuda(
      cuda_kernels::CrossEntropyBackward(logits, targets, rows, vocab, scale, dlogits, stream),
      "CrossEntropyBackward");
}

Status AddBiasRows(float* y, const float* bias, int64_t rows, int64_t cols, void* stream) {
  return FromCuda(cuda_kernels::AddBiasRows(y, bias, rows, cols, stream), "AddBiasRows");
}

StatusOr<void*> Malloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    return ResourceExhaustedError("cudaMalloc of " + std::to_string(bytes) +
                                  " bytes: " + cudaGetErrorString(err));
  }
  return p;
}

void Free(void* p) { cudaFree(p); }

Status CopyToDevice(void* dst, const void* src, size_t bytes) {
  return FromCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

Status CopyToHost(void* dst, const void* src, size_t bytes) {
  return FromCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

Status Synchronize() { return FromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace gpu
}  // namespace sk
