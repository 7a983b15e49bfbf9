// The CUDA op backend's kernel launchers (the *.cu files of this directory,
// one per op family, compiled by nvcc only under --config=cuda). Internal to runtime/ops/cuda: callers use the op
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
#include "runtime/ops/rope_scaling.h"
#include "runtime/ops/update_rules.h"

namespace sk::ops::cuda {

// A device buffer and the dtype of its elements (f32, bf16 or f16). The
// model ops take each compute-dtype operand (ops.h) this way, in any mix of
// dtypes: each element is read exactly as f32, the arithmetic is f32, and a
// 16-bit output is rounded once (nearest even) when stored -- the bits the
// f32 kernel gives on exact f32 copies of the operands, rounded once.
struct Buf {
  void* data = nullptr;
  DType dtype = DType::kF32;
};
struct CBuf {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

// dst (dt) = src (st) element by element through f32 (same type: a copy).
// Eight elements per thread, as 16-byte loads and stores when both pointers
// are 16-byte aligned (element by element otherwise and for the tail); the
// bits do not depend on the path.
int Cast(const void* src, DType st, void* dst, DType dt, int64_t n, void* stream);
// x (f32) = x rounded to `t` and widened back.
int RoundToDType(float* x, int64_t n, DType t, void* stream);
// x (dt) *= alpha, in f32.
int Scale(void* x, DType dt, int64_t n, float alpha, void* stream);
// y (yt) += alpha * x (xt), in f32 (alpha == 1: y + x, as the CPU's accumulate).
int Axpy(float alpha, const void* x, DType xt, void* y, DType yt, int64_t n, void* stream);
// x (dt) = value rounded to dt.
int Fill(void* x, DType dt, int64_t n, float value, void* stream);
// Elements rows x cols of a strided matrix (x.dtype) = value rounded to it.
int FillMatrix(Buf x, int64_t rows, int64_t cols, int64_t ld, float value, void* stream);
// out (dt) = InitValue(init, seed, param_id, begin + i) rounded to dt.
int InitPhilox(const Initializer& init, uint64_t seed, uint64_t param_id, int64_t begin, void* out,
               DType dt, int64_t n, void* stream);

int BroadcastRows(CBuf src, int64_t cols, Buf dst, int64_t rows, void* stream);
int BiasAdd(CBuf bias, int64_t cols, Buf y, int64_t rows, void* stream);

// The column reductions (BiasGrad, LayerNormBackward's dgamma and dbeta) sum
// each column over chunks of kColumnChunkRows rows into f32 partials, then
// the partials in chunk order: deterministic, not the CPU's row order.
inline constexpr int64_t kColumnChunkRows = 128;
constexpr int64_t ColumnChunks(int64_t rows) {
  return (rows + kColumnChunkRows - 1) / kColumnChunkRows;
}

// dbias[j] += (the sum of dy[., j] over rows, chunked as above, in f32;
// rounded once into a 16-bit dbias). `partials` is scratch of
// ColumnChunks(rows) * cols floats, used on `stream`.
int BiasGrad(CBuf dy, int64_t rows, int64_t cols, Buf dbias, float* partials, void* stream);

// y may be x, dx may be dy (then of one dtype).
int GeluForward(CBuf x, int64_t n, Buf y, void* stream);
int GeluBackward(CBuf x, CBuf dy, int64_t n, Buf dx, void* stream);
// The per-row kernels (LayerNorm, softmax, cross-entropy) give a row of at
// most 1024 columns to one warp and a longer row to one block of 256
// threads; row sums and maxima combine in a fixed tree. y may be x.
int LayerNormForward(CBuf x, CBuf gamma, CBuf beta, int64_t rows, int64_t cols, Buf y,
                     float* mean, float* rstd, void* stream);
// dx, dgamma, dbeta += gradients (dgamma/dbeta: the column reduction above);
// `partials` is scratch of 2 * ColumnChunks(rows) * cols floats.
int LayerNormBackward(CBuf x, CBuf gamma, CBuf dy, const float* mean, const float* rstd,
                      int64_t rows, int64_t cols, Buf dx, Buf dgamma, Buf dbeta, float* partials,
                      void* stream);

// The Llama-family ops (ops.h), in any mix of dtypes as above.
int RmsNormForward(CBuf x, CBuf gamma, int64_t rows, int64_t cols, float eps, Buf y, float* rstd,
                   void* stream);
// dx, dgamma += gradients; `partials` is scratch of 2 * ColumnChunks(rows) *
// cols floats (LayerNorm's column reduction, its second half unused).
int RmsNormBackward(CBuf x, CBuf gamma, CBuf dy, const float* rstd, int64_t rows, int64_t cols,
                    Buf dx, Buf dgamma, float* partials, void* stream);
// y may be x (one dtype then); n elements of [rows, heads, head_dim];
// `scaling` goes to the kernel by value (math.h: RopeInvFreq); positions:
// i32 device memory, one per row, or nullptr (row % seq_len).
int Rope(CBuf x, int64_t n, int64_t seq_len, int64_t heads, int64_t head_dim, float theta,
         const RopeScaling& scaling, bool inverse, Buf y, const int32_t* positions, void* stream);
int SwiGluForward(CBuf gate, CBuf up, int64_t n, Buf y, void* stream);
int SwiGluBackward(CBuf gate, CBuf up, CBuf dy, int64_t n, Buf dgate, Buf dup, void* stream);
// Grouped-query attention on the composed path: dst (dense [rows, kv_heads
// * group * head_dim]) = src's key/value heads (row stride ld) each repeated
// group times; and back, dst (row stride ld) = the f32 sum of each group's
// columns of src, rounded once.
int RepeatKvHeads(CBuf src, int64_t ld, int64_t rows, int64_t kv_heads, int64_t group,
                  int64_t head_dim, Buf dst, void* stream);
int SumKvHeadGroups(CBuf src, int64_t rows, int64_t kv_heads, int64_t group, int64_t head_dim,
                    Buf dst, int64_t ld, void* stream);

// out[i], out[n + i], out[2n + i] (n = seqs * heads, i = s * heads + h) =
// a + s * a_seq + h * a_head, the same for b and c (byte offsets): the
// pointer arrays of a batched GEMM over the (sequence, head) pairs of
// attention, whose operands have one stride between heads and another
// between sequences.
int BatchPointers(const void* a, int64_t a_seq, int64_t a_head, const void* b, int64_t b_seq,
                  int64_t b_head, const void* c, int64_t c_seq, int64_t c_head, int64_t seqs,
                  int64_t heads, const void** out, void* stream);

// Row softmax of f32 x in place over `rows` rows of `cols`: attention's
// scores [batch, heads, q_len, cols], row r keeping the keys
// math::AttentionRowKeys(r, heads, q_len, cols, causal, key_start) gives
// it (every key; causal: the first (r % q_len) + 1; with key_start, packed
// documents: from its query's key start on) and the rest becoming 0.
// key_start: device i32 [batch * q_len] or nullptr. With p16.data (not
// null), each probability is also stored rounded to p16.dtype (16-bit) at
// the same index of p16.
int SoftmaxRows(float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len, int64_t heads,
                const int32_t* key_start, Buf p16, void* stream);
// lse[r] = log sum_j e^(x[r, j]) over row r's unmasked columns (those
// SoftmaxRows keeps, same arguments), x [rows, cols] f32 scores.
int RowLogSumExp(const float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len,
                 int64_t heads, const int32_t* key_start, float* lse, void* stream);
// ds = scale * p * (dp - <p, dp>) per row (p, dp f32). Without ds16.data: ds
// overwrites dp. With it: dp is only read, ds is stored rounded to
// ds16.dtype (16-bit) in ds16 and p rounded to the same dtype in p16 (same
// layout as p).
int SoftmaxBackwardRows(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                        Buf ds16, void* p16, void* stream);

int EmbeddingForward(CBuf table, const int32_t* ids, int64_t count, int64_t dim, Buf out,
                     void* stream);
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
int EmbeddingBackward(const int32_t* ids, CBuf dout, int64_t count, int64_t dim,
                      int64_t vocab, float* dtable, void* scratch, size_t scratch_bytes,
                      void* stream);

// loss[0] = mean over counted rows of the row losses, summed in f64 in a
// fixed order (one block: strided per-thread sums, then a tree); row_loss is
// scratch of `rows` floats. A target outside [0, vocab) other than
// kIgnoreTarget gives a NaN row loss (the dispatcher cannot check device
// targets; nothing is read out of bounds).
int CrossEntropyForward(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                        float* row_loss, float* loss, void* stream);
// CrossEntropyForward's two launches apart (ops.h: CrossEntropyRowLosses,
// CrossEntropyMean): the row losses (0 on ignored rows), then their mean.
int CrossEntropyRowLosses(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                          float* row_loss, void* stream);
int CrossEntropyMean(const float* row_loss, const int32_t* targets, int64_t rows, float* loss,
                     void* stream);
// dlogits = (softmax - onehot) / count per counted row (x scale instead
// when scale > 0), 0 on ignored rows (NaN on rows with an out-of-range
// target); count_scratch is one int64 of scratch. dlogits may be logits (of
// one dtype then).
int CrossEntropyBackward(CBuf logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         Buf dlogits, int64_t* count_scratch, float scale, void* stream);

// Partial f64 results per block into `partials` (kReduceBlocks doubles), then
// acc[0] += (SumOfSquares) or = max(acc, ·) (MaxAbs) of them, combined in a
// fixed order (deterministic for a given n). 1024 blocks of 256 threads fill
// an H100/H200 (132 SMs x 2048 threads) once, so every thread has loads in
// flight: 256 blocks left three quarters of the card idle.
inline constexpr int kReduceBlocks = 1024;
int SumOfSquares(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream);
int MaxAbs(const void* x, DType dt, int64_t n, double* partials, double* acc, void* stream);

int SgdUpdate(const SgdHyper& h, float* param, const float* grad, float* momentum, int64_t n,
              void* stream);
int AdamUpdate(const AdamHyper& h, float* param, const float* grad, float* exp_avg,
               float* exp_avg_sq, int64_t n, void* stream);

}  // namespace sk::ops::cuda

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_KERNELS_H_
