// The cross-entropy kernels of the CUDA backend (kernels.h): row losses,
// their mean and the target count (one block, fixed trees), and the
// gradient. Shared helpers: kernels_common.cuh.
#include "runtime/ops/cuda/kernels_common.cuh"

namespace sk::ops::cuda {
namespace {

// row_loss[r]: 0 on ignored rows; NaN for a target outside [0, vocab) (the
// op's contract excludes it; nothing is read out of bounds).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyRowsKernel(const void* logits, DType lt, const int32_t* targets, int64_t rows,
                           int64_t vocab, float* row_loss) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int32_t t = targets[r];
    if (t == kIgnoreTarget || t < 0 || t >= vocab) {  // the same branch for the whole group
      if (G::Rank() == 0) row_loss[r] = t == kIgnoreTarget ? 0.0f : NAN;
      continue;
    }
    const int64_t o = r * vocab;
    const float m = GroupRowMax<G>(logits, lt, o, vocab, shared);
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) s += expf(LoadF(logits, lt, o + j) - m);
    s = G::Reduce(s, AddOp(), shared);
    if (G::Rank() == 0) row_loss[r] = math::CrossEntropyFromStats(m, s, LoadF(logits, lt, o + t));
  }
}

// dlogits (may be logits, of one dtype then) per row: scale (softmax -
// onehot), scale = 1 / *count; zeros on ignored rows, NaN on rows whose
// target is outside [0, vocab). The sum pass writes nothing; the last pass
// recomputes each e = expf(logit - m) (the same bits) from the logit the
// thread itself reads before overwriting it, so a 16-bit dlogits is rounded
// once and the in-place form is safe.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyGradKernel(const void* logits, DType lt, const int32_t* targets, int64_t rows,
                           int64_t vocab, const int64_t* count, float given_scale, void* dlogits,
                           DType dt) {
  __shared__ float shared[kWarpsPerBlock];
  const float scale = given_scale > 0.0f ? given_scale
                      : *count == 0      ? 0.0f
                                         : 1.0f / static_cast<float>(*count);
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const int32_t t = targets[r];
    const int64_t o = r * vocab;
    if (t == kIgnoreTarget || t < 0 || t >= vocab) {  // the same branch for the whole group
      const float fill = t == kIgnoreTarget ? 0.0f : NAN;
      for (int64_t j = G::Rank(); j < vocab; j += G::kSize) StoreF(dlogits, dt, o + j, fill);
      continue;
    }
    const float m = GroupRowMax<G>(logits, lt, o, vocab, shared);
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) s += expf(LoadF(logits, lt, o + j) - m);
    const float inv = scale / G::Reduce(s, AddOp(), shared);
    for (int64_t j = G::Rank(); j < vocab; j += G::kSize) {
      const float e = expf(LoadF(logits, lt, o + j) - m);
      StoreF(dlogits, dt, o + j, math::CrossEntropyGradElement(e, inv, j == t, scale));
    }
  }
}

// ---- Loss mean and target count: one block, a fixed tree in f64 ------------

// Thread i sums rows i, i + kThreads, ... in order; then a halving tree over
// the threads (i takes i + s for s = kThreads/2, ..., 1). Launched <<<1, kThreads>>>.
__global__ void __launch_bounds__(kThreads)
    CrossEntropyMeanKernel(const float* row_loss, const int32_t* targets, int64_t rows,
                           float* loss) {
  __shared__ double sums[kThreads];
  __shared__ int64_t counts[kThreads];
  double s = 0.0;
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    if (targets[r] == kIgnoreTarget) continue;
    s += row_loss[r];
    ++c;
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sums[threadIdx.x] += sums[threadIdx.x + w];
      counts[threadIdx.x] += counts[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = counts[0] == 0 ? 0.0f : static_cast<float>(sums[0] / static_cast<double>(counts[0]));
  }
}

__global__ void __launch_bounds__(kThreads)
    CountTargetsKernel(const int32_t* targets, int64_t rows, int64_t* count) {
  __shared__ int64_t counts[kThreads];
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) c += targets[r] != kIgnoreTarget;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) counts[threadIdx.x] += counts[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = counts[0];
}

}  // namespace

int CrossEntropyRowLosses(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                          float* row_loss, void* stream) {
  if (rows <= 0) return 0;  // vocab 0 (rejected by the dispatcher) writes NaN row losses
  SK_ENQUEUE_ROWS(rows, vocab, CrossEntropyRowsKernel, logits.data, logits.dtype, targets, rows,
                  vocab, row_loss);
  return Launched();
}
int CrossEntropyMean(const float* row_loss, const int32_t* targets, int64_t rows, float* loss,
                     void* stream) {
  CrossEntropyMeanKernel<<<1, kThreads, 0, S(stream)>>>(row_loss, targets, rows, loss);
  return Launched();
}
int CrossEntropyForward(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, float* loss, void* stream) {
  const int err = CrossEntropyRowLosses(logits, targets, rows, vocab, row_loss, stream);
  if (err != 0) return err;
  return CrossEntropyMean(row_loss, targets, rows, loss, stream);
}
int CrossEntropyBackward(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         Buf dlogits, int64_t* count_scratch, float scale, void* stream) {
  if (rows <= 0 || vocab <= 0) return 0;
  CountTargetsKernel<<<1, kThreads, 0, S(stream)>>>(targets, rows, count_scratch);
  const int err = Launched();
  if (err != 0) return err;
  SK_ENQUEUE_ROWS(rows, vocab, CrossEntropyGradKernel, logits.data, logits.dtype, targets, rows,
                  vocab, count_scratch, scale, dlogits.data, dlogits.dtype);
  return Launched();
}

}  // namespace sk::ops::cuda
