// The CPU backend's cross-entropy (backend_common.h).

#include "runtime/ops/cpu/backend_common.h"
#include "runtime/ops/math.h"

namespace sk::ops {

Status CpuBackend::CrossEntropyForward(const OpContext&, const Tensor& logits, const Tensor& targets,
                                       const Tensor& loss) {
  const int64_t rows = targets.numel();
  const int64_t vocab = rows == 0 ? 0 : logits.numel() / rows;
  int64_t count = 0;
  if (IsF32(logits)) {
    *F(loss) = sk::CrossEntropyForward(F(logits), targets.data_as<int32_t>(), rows, vocab, &count);
    return OkStatus();
  }
  // kernels.cc's CrossEntropyForward, a widened row at a time.
  const int32_t* t = targets.data_as<int32_t>();
  float* buf = Scratch(0, vocab);
  double sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == kIgnoreTarget) continue;
    sum += simd::CrossEntropyRow(InF32(logits, r * vocab, vocab, buf), vocab, t[r]);
    ++count;
  }
  *F(loss) = count == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(count));
  return OkStatus();
}

Status CpuBackend::CrossEntropyBackward(const OpContext&, const Tensor& logits, const Tensor& targets,
                                        const Tensor& dlogits, float given_scale) {
  const int64_t rows = targets.numel();
  if (rows == 0) return OkStatus();
  const int64_t vocab = logits.numel() / rows;
  const int32_t* t = targets.data_as<int32_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) count += t[r] != kIgnoreTarget;
  const float scale = given_scale > 0.0f ? given_scale
                      : count == 0       ? 0.0f
                                         : 1.0f / static_cast<float>(count);
  if (IsF32(logits) && IsF32(dlogits)) {
    sk::CrossEntropyBackward(F(logits), t, rows, vocab, scale, F(dlogits));
    return OkStatus();
  }
  // A widened row at a time; the f32 row loop runs in place on it when
  // dlogits is 16-bit (logits may be dlogits).
  float* buf = Scratch(0, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * vocab;
    float* d = OutF32(dlogits, o, buf);
    if (t[r] == kIgnoreTarget) {
      std::memset(d, 0, sizeof(float) * vocab);
    } else {
      simd::CrossEntropyRowBackward(InF32(logits, o, vocab, buf), vocab, t[r], scale, d);
    }
    OutDone(dlogits, o, vocab, d);
  }
  return OkStatus();
}

// CrossEntropyForward's row loop, each row's loss stored: CrossEntropyMean
// then sums them as that loop does.
Status CpuBackend::CrossEntropyRowLosses(const OpContext&, const Tensor& logits, const Tensor& targets,
                                         const Tensor& row_loss) {
  const int64_t rows = targets.numel();
  const int64_t vocab = rows == 0 ? 0 : logits.numel() / rows;
  const int32_t* t = targets.data_as<int32_t>();
  float* out = F(row_loss);
  float* buf = IsF32(logits) ? nullptr : Scratch(0, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == kIgnoreTarget) {
      out[r] = 0.0f;
      continue;
    }
    const float* row = buf == nullptr ? F(logits) + r * vocab : InF32(logits, r * vocab, vocab, buf);
    out[r] = simd::CrossEntropyRow(row, vocab, t[r]);
  }
  return OkStatus();
}

Status CpuBackend::CrossEntropyMean(const OpContext&, const Tensor& row_loss, const Tensor& targets,
                                    const Tensor& loss) {
  const int64_t rows = targets.numel();
  const int32_t* t = targets.data_as<int32_t>();
  const float* l = F(row_loss);
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == kIgnoreTarget) continue;
    sum += l[r];
    ++count;
  }
  *F(loss) = count == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(count));
  return OkStatus();
}

}  // namespace sk::ops
