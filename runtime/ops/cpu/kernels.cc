// The CPU kernels of kernels.h other than the GEMMs (gemm.cc) and the
// composed attention (attention.cc): LayerNorm, GELU, softmax, embedding,
// cross-entropy and the conversions, over cpu/simd.h's loops.
#include "runtime/ops/cpu/kernels.h"

#include <cstring>

#include <glog/logging.h>

#include "runtime/ops/cpu/simd.h"

namespace sk {

void LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                      int64_t cols, float* y, float* mean, float* rstd) {
  simd::LayerNormForward(x, gamma, beta, rows, cols, y, mean, rstd);
}

void LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                       const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                       float* dbeta) {
  simd::LayerNormBackward(x, gamma, dy, mean, rstd, rows, cols, dx, dgamma, dbeta);
}

void GeluForward(const float* x, int64_t n, float* y) {
  simd::GeluForward(x, n, y);
}

void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  simd::GeluBackward(x, dy, n, dx);
}

void SoftmaxForward(const float* x, int64_t rows, int64_t cols, float* y) {
  if (y != x) std::memcpy(y, x, sizeof(float) * rows * cols);
  for (int64_t r = 0; r < rows; ++r) simd::SoftmaxRowInPlace(y + r * cols, cols, cols);
}

void SoftmaxBackward(const float* y, const float* dy, int64_t rows, int64_t cols, float* dx) {
  if (dx != dy) std::memcpy(dx, dy, sizeof(float) * rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    simd::SoftmaxRowBackwardInPlace(y + r * cols, dx + r * cols, cols, 1.0f);
  }
}

void EmbeddingForward(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                      float* out) {
  for (int64_t n = 0; n < count; ++n) {
    std::memcpy(out + n * dim, table + static_cast<int64_t>(ids[n]) * dim, sizeof(float) * dim);
  }
}

void EmbeddingBackward(const int32_t* ids, const float* dout, int64_t count, int64_t dim,
                       float* dtable) {
  for (int64_t n = 0; n < count; ++n) {
    simd::AddInPlace(dtable + static_cast<int64_t>(ids[n]) * dim, dout + n * dim, dim);
  }
}

float CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab, int64_t* count) {
  double sum = 0.0;
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == kIgnoreTarget) continue;
    sum += simd::CrossEntropyRow(logits + r * vocab, vocab, targets[r]);
    ++counted;
  }
  *count = counted;
  return counted == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(counted));
}

void CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab, float scale, float* dlogits) {
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == kIgnoreTarget) {
      std::memset(dlogits + r * vocab, 0, sizeof(float) * vocab);
      continue;
    }
    simd::CrossEntropyRowBackward(logits + r * vocab, vocab, targets[r], scale,
                                  dlogits + r * vocab);
  }
}

void AddInPlace(float* x, const float* y, int64_t n) { simd::AddInPlace(x, y, n); }

void RoundToBF16InPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = BF16ToFloat(FloatToBF16(x[i]));
}

void RoundToDTypeInPlace(float* x, int64_t n, DType t) {
  switch (t) {
    case DType::kF32: return;
    case DType::kBF16: RoundToBF16InPlace(x, n); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) x[i] = F16ToFloat(FloatToF16(x[i]));
      return;
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  LOG(FATAL) << "RoundToDTypeInPlace: invalid dtype";
}

void WidenToF32(const void* src, DType t, int64_t n, float* dst) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(static_cast<const BF16*>(src)[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(static_cast<const F16*>(src)[i]);
      return;
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  LOG(FATAL) << "WidenToF32: invalid dtype";
}

void AccumulateFromF32(const float* src, int64_t n, void* dst, DType t) {
  switch (t) {
    case DType::kF32:
      AddInPlace(static_cast<float*>(dst), src, n);
      return;
    case DType::kBF16:
      simd::AccumulateBf16(src, n, static_cast<BF16*>(dst));
      return;
    case DType::kF16: {
      F16* d = static_cast<F16*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToF16(F16ToFloat(d[i]) + src[i]);
      return;
    }
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  LOG(FATAL) << "AccumulateFromF32: invalid dtype";
}

}  // namespace sk
