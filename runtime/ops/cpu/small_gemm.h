// LIBXSMM's small GEMMs and transposes as the CPU attention kernels use
// them (attention.cc: the composed attention; flash_attention.cc: the
// linear-memory one). Internal to runtime/ops/cpu.
#ifndef SHARDKIT_RUNTIME_OPS_CPU_SMALL_GEMM_H_
#define SHARDKIT_RUNTIME_OPS_CPU_SMALL_GEMM_H_

#include <libxsmm.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "runtime/ops/cpu/kernels.h"

namespace sk {

// A row-major C[m, n] = op(A)[m, k] B[k, n], overwritten or accumulated, on
// the small shapes of attention: LIBXSMM's JIT kernel for the column-major
// product C^T = B^T op(A)^T (a row-major matrix read column-major is its
// transpose), so op(A) = A^T is LIBXSMM's TRANS_B; LIBXSMM 1.17 has no
// TRANS_A kernels, so op(B) is never transposed here (callers transpose
// such an operand into scratch). LIBXSMM caches the generated code per shape
// for the life of the process and dispatch is thread-safe; a shape it
// declines (dispatch returns null) runs Gemm instead. The kernels run on the
// calling thread only, so the results do not depend on the thread count.
// LIBXSMM's kernel (from `dispatch`: libxsmm_smmdispatch or
// libxsmm_bsmmdispatch, which take the same arguments) for the row-major
// C[m, n] = op(A) B (+ C when accumulate): the column-major C^T = B^T
// op(A)^T, so LIBXSMM's m, n, lda, ldb are our n, m, ldb, lda. Null where a
// size is out of LIBXSMM's range or it declines the shape.
template <typename Dispatch>
auto DispatchRowMajor(Dispatch dispatch, int64_t m, int64_t n, int64_t k, int64_t lda,
                      int64_t ldb, int64_t ldc, bool accumulate, int flags)
    -> decltype(dispatch(0, 0, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                         nullptr)) {
  constexpr int64_t kMaxInt = std::numeric_limits<libxsmm_blasint>::max();
  if (m <= 0 || n <= 0 || k <= 0 || std::max({m, n, k, lda, ldb, ldc}) > kMaxInt) return nullptr;
  const libxsmm_blasint xm = static_cast<libxsmm_blasint>(n);
  const libxsmm_blasint xn = static_cast<libxsmm_blasint>(m);
  const libxsmm_blasint xk = static_cast<libxsmm_blasint>(k);
  const libxsmm_blasint xlda = static_cast<libxsmm_blasint>(ldb);
  const libxsmm_blasint xldb = static_cast<libxsmm_blasint>(lda);
  const libxsmm_blasint xldc = static_cast<libxsmm_blasint>(ldc);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  return dispatch(xm, xn, xk, &xlda, &xldb, &xldc, &alpha, &beta, &flags, &prefetch);
}

class SmallGemm {
 public:
  SmallGemm(bool trans_a, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
            bool accumulate)
      : trans_a_(trans_a), m_(m), n_(n), k_(k), lda_(lda), ldb_(ldb), ldc_(ldc),
        accumulate_(accumulate),
        fn_(DispatchRowMajor(libxsmm_smmdispatch, m, n, k, lda, ldb, ldc, accumulate,
                             trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE)) {}

  void operator()(const float* a, const float* b, float* c) const {
    if (fn_ != nullptr) {
      fn_(b, a, c);
    } else {
      Gemm(trans_a_, false, m_, n_, k_, 1.0f, a, lda_, b, ldb_, accumulate_ ? 1.0f : 0.0f, c,
           ldc_);
    }
  }

 private:
  bool trans_a_;
  int64_t m_, n_, k_, lda_, ldb_, ldc_;
  bool accumulate_;
  libxsmm_smmfunction fn_;
};

// dst[cols, rows] (row stride ld_dst >= rows) = src[rows, cols]^T (row
// stride ld): LIBXSMM's transpose (column-major: a cols x rows matrix into
// rows x cols).
inline void TransposeInto(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst,
                          int64_t ld_dst) {
  libxsmm_otrans(dst, src, sizeof(float), static_cast<libxsmm_blasint>(cols),
                 static_cast<libxsmm_blasint>(rows), static_cast<libxsmm_blasint>(ld),
                 static_cast<libxsmm_blasint>(ld_dst));
}
inline void TransposeInto(const float* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  TransposeInto(src, rows, cols, ld, dst, rows);
}

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_CPU_SMALL_GEMM_H_
