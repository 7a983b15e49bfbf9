// The CUDA op backend's kernel launchers (kernels.cu, compiled by nvcc only
// under --config=cuda). Internal to runtime/ops/cuda: callers use the op
// layer (runtime/ops/ops.h), whose dispatcher validated every argument.
//
// Each launcher enqueues its kernel(s) on `stream` (a cudaStream_t passed as
// void*, so this header needs no CUDA headers) and returns the launch's
// cudaError_t as an int (0 = enqueued). Pointers are device pointers; dtypes
// are those the op accepts (ops.h). The per-element arithmetic is the
// SK_HOST_DEVICE code the CPU backend runs (runtime/ops/math.h,
// update_rules.h, init.h, core/dtype.h), compiled with -fmad=false so that
// no product and sum are fused where the CPU rounds them apart: elementwise
// results other than transcendental functions (exp, log, tanh, whose device
// versions differ from glibc's in the last place) are the CPU's bits.
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_KERNELS_H_
#define SHARDKIT_RUNTIME_OPS_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "runtime/core/dtype.h"
#include "runtime/ops/init.h"
#include "runtime/ops/update_rules.h"

namespace sk::ops::cuda {

// dst (dt) = src (st) element by element through f32 (same type: a copy).
int Cast(const void* src, DType st, void* dst, DType dt, int64_t n, void* stream);
// x (f32) = x rounded to `t` and widened back.
int RoundToDType(float* x, int64_t n, DType t, void* stream);
// x (dt) *= alpha, in f32.
int Scale(void* x, DType dt, int64_t n, float alpha, void* stream);
// y (yt) += alpha * x (xt), in f32 (alpha == 1: y + x, as the CPU's accumulate).
int Axpy(float alpha, const void* x, DType xt, void* y, DType yt, int64_t n, void* stream);
// x (dt) = value rounded to dt.
int Fill(void* x, DType dt, int64_t n, float value, void* stream);
// Elements rows x cols of a strided f32 matrix = value.
int FillMatrix(float* x, int64_t rows, int64_t cols, int64_t ld, float value, void* stream);
// out (dt) = InitValue(init, seed, param_id, begin + i) rounded to dt.
int InitPhilox(const Initializer& init, uint64_t seed, uint64_t param_id, int64_t begin, void* out,
               DType dt, int64_t n, void* stream);

int BroadcastRows(const float* src, int64_t cols, float* dst, int64_t rows, void* stream);
int BiasAdd(const float* bias, int64_t cols, float* y, int64_t rows, void* stream);

// The column reductions (BiasGrad, LayerNormBackward's dgamma and dbeta) sum
// each column over chunks of kColumnChunkRows rows into f32 partials, then
// the partials in chunk order: deterministic, not the CPU's row order.
inline constexpr int64_t kColumnChunkRows = 128;
constexpr int64_t ColumnChunks(int64_t rows) {
  return (rows + kColumnChunkRows - 1) / kColumnChunkRows;
}

// dbias[j] += (the sum of dy[., j] over rows, chunked as above). `partials`
// is scratch of ColumnChunks(rows) * cols floats, used on `stream`.
int BiasGrad(const float* dy, int64_t rows, int64_t cols, float* dbias, float* partials,
             void* stream);

int GeluForward(const float* x, int64_t n, float* y, void* stream);
int GeluBackward(const float* x, const float* dy, int64_t n, float* dx, void* stream);
// The per-row kernels (LayerNorm, softmax, cross-entropy) give a row of at
// most 1024 columns to one warp and a longer row to one block of 256
// threads; row sums and maxima combine in a fixed tree. y may be x.
int LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows,
                     int64_t cols, float* y, float* mean, float* rstd, void* stream);
// dx, dgamma, dbeta += gradients (dgamma/dbeta: the column reduction above);
// `partials` is scratch of 2 * ColumnChunks(rows) * cols floats.
int LayerNormBackward(const float* x, const float* gamma, const float* dy, const float* mean,
                      const float* rstd, int64_t rows, int64_t cols, float* dx, float* dgamma,
                      float* dbeta, float* partials, void* stream);

// Row softmax in place over `rows` rows of `cols`; with causal, row r keeps
// its first (r % block_rows) + 1 entries and the rest become 0.
int SoftmaxRows(float* x, int64_t rows, int64_t cols, bool causal, int64_t block_rows,
                void* stream);
// dp = scale * p * (dp - <p, dp>) per row, in place.
int SoftmaxBackwardRows(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                        void* stream);

int EmbeddingForward(const float* table, const int32_t* ids, int64_t count, int64_t dim,
                     float* out, void* stream);
// EmbeddingBackward takes at most this many ids (positions are i32).
inline constexpr int64_t kMaxEmbeddingBackwardIds = 2147483647;
// *bytes = the scratch EmbeddingBackward needs for `count` ids (0 for none);
// returns a cudaError_t (cudaErrorInvalidValue above kMaxEmbeddingBackwardIds).
int EmbeddingBackwardScratchBytes(int64_t count, size_t* bytes);
// dtable [vocab, dim] row ids[i] += dout[i] for every i, each element's terms
// added in order of i (the CPU's order and bits): the ids are stably sorted
// (CUB radix sort) and one block per distinct id adds its tokens. Ids outside
// [0, vocab) are skipped (the op's caller validates them). `scratch`: at
// least EmbeddingBackwardScratchBytes(count) bytes, 256-byte aligned.
int EmbeddingBackward(const int32_t* ids, const float* dout, int64_t count, int64_t dim,
                      int64_t vocab, float* dtable, void* scratch, size_t scratch_bytes,
                      void* stream);

// loss[0] = mean over counted rows of the row losses, summed in f64 in a
// fixed order (one block: strided per-thread sums, then a tree); row_loss is
// scratch of `rows` floats. A target outside [0, vocab) other than
// kIgnoreTarget gives a NaN row loss (the dispatcher cannot check device
// targets; nothing is read out of bounds).
int CrossEntropyForward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, float* loss, void* stream);
// dlogits = (softmax - onehot) / count per counted row, 0 on ignored rows
// (NaN on rows with an out-of-range target); count_scratch is one int64 of
// scratch. dlogits may be logits.
int CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t rows,
                         int64_t vocab, float* dlogits, int64_t* count_scratch, void* stream);

// Partial f64 results per block into `partials` (kReduceBlocks doubles), then
// acc[0] += (SumOfSquares) or = max(acc, ·) (MaxAbs) of them in block order.
inline constexpr int kReduceBlocks = 256;
int SumOfSquares(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream);
int MaxAbs(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream);

int SgdUpdate(const SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n,
              void* stream);
int AdamUpdate(const AdamHyper& h, float* param, const float* grad, float* exp_avg,
               float* exp_avg_sq, int64_t n, void* stream);

}  // namespace sk::ops::cuda

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_KERNELS_H_
