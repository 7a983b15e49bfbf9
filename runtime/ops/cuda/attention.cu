// The composed attention's kernels of the CUDA backend (kernels.h): the
// batched GEMMs' pointer arrays, grouped-query repeats and sums, row softmax
// (causal, packed documents), its gradient and the rows' log-sum-exp; the
// GEMMs are cuBLAS's (cublas.cc). Shared helpers: kernels_common.cuh.
#include "runtime/ops/cuda/kernels_common.cuh"

namespace sk::ops::cuda {
namespace {

__global__ void BatchPointersKernel(const char* a, int64_t a_seq, int64_t a_head, const char* b,
                                    int64_t b_seq, int64_t b_head, const char* c, int64_t c_seq,
                                    int64_t c_head, int64_t seqs, int64_t heads,
                                    const void** out) {
  const int64_t n = seqs * heads;
  const int64_t i = Index();
  if (i >= n) return;
  const int64_t s = i / heads, h = i % heads;
  out[i] = a + s * a_seq + h * a_head;
  out[n + i] = b + s * b_seq + h * b_head;
  out[2 * n + i] = c + s * c_seq + h * c_head;
}

// Grouped-query attention's fallback: dst [rows, kv_heads * group * head_dim]
// (dense) = each key/value head of src (row stride ld) repeated for its group
// of query heads.
__global__ void RepeatKvHeadsKernel(const void* src, DType st, int64_t ld, int64_t rows,
                                    int64_t kv_heads, int64_t group, int64_t head_dim, void* dst,
                                    DType dt) {
  const int64_t cols = kv_heads * group * head_dim;
  int64_t i = Index();
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const int64_t h = c / head_dim, d = c % head_dim;
  StoreF(dst, dt, i, LoadF(src, st, r * ld + (h / group) * head_dim + d));
}

// dst (row stride ld) = for each key/value head, the f32 sum over its group
// of src's query-head columns (dense [rows, kv_heads * group * head_dim]) in
// head order, rounded once.
__global__ void SumKvHeadGroupsKernel(const void* src, DType st, int64_t rows, int64_t kv_heads,
                                      int64_t group, int64_t head_dim, void* dst, DType dt,
                                      int64_t ld) {
  const int64_t cols = kv_heads * head_dim;
  int64_t i = Index();
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const int64_t kh = c / head_dim, d = c % head_dim;
  const int64_t src_cols = cols * group;
  float acc = 0.0f;
  for (int64_t g = 0; g < group; ++g) {
    acc += LoadF(src, st, r * src_cols + (kh * group + g) * head_dim + d);
  }
  StoreF(dst, dt, r * ld + c, acc);
}

// Row r softmaxed over the keys math::AttentionRowKeys gives it (all;
// causal: the first (r % q_len) + 1; packed documents: from the row's key
// start on), every other entry 0, as math::MaskedSoftmaxRowInPlace. x is
// f32 (attention's scores, then probabilities); with p16 (not null) each
// final probability is also stored rounded to p16's dtype pt at the same
// index (the operand of a 16-bit tensor-core GEMM).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    SoftmaxKernel(float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len, int64_t heads,
                  const int32_t* key_start, void* p16, DType pt) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    float* row = x + r * cols;
    const math::AttentionKeys keys =
        math::AttentionRowKeys(r, heads, q_len, cols, causal, key_start);
    const float m = GroupRowMax<G>(x, DType::kF32, r * cols + keys.first, keys.end - keys.first,
                                   shared);
    // Each thread visits the columns j = Rank() mod kSize here and below, so
    // every entry is read back by the thread that wrote it (a warp's
    // shuffles order no memory); those before the document are skipped.
    float s = 0.0f;
    for (int64_t j = G::Rank(); j < keys.end; j += G::kSize) {
      if (j < keys.first) continue;
      const float e = expf(row[j] - m);
      row[j] = e;
      s += e;
    }
    const float inv = 1.0f / G::Reduce(s, AddOp(), shared);
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      const float p = j >= keys.first && j < keys.end ? row[j] * inv : 0.0f;
      row[j] = p;
      if (p16 != nullptr) StoreF(p16, pt, r * cols + j, p);
    }
  }
}

// Softmax's backward per row from the f32 probabilities p and their f32
// gradient dp: ds = scale p (dp - <p, dp>). Without ds16: ds overwrites dp
// (f32). With ds16 (not null): dp is only read; ds is stored rounded to
// ds16's dtype t, and p rounded to t into p16, both at the same index (the
// 16-bit operands of attention backward's tensor-core GEMMs).
template <typename G>
__global__ void __launch_bounds__(kThreads)
    SoftmaxGradKernel(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                      void* ds16, void* p16, DType t) {
  __shared__ float shared[kWarpsPerBlock];
  for (int64_t r = G::FirstRow(); r < rows; r += G::RowStride()) {
    const float* pr = p + r * cols;
    float* dr = dp + r * cols;
    float d = 0.0f;
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) d += pr[j] * dr[j];
    const float dot = G::Reduce(d, AddOp(), shared);
    for (int64_t j = G::Rank(); j < cols; j += G::kSize) {
      const float ds = math::SoftmaxGradElement(pr[j], dr[j], dot, scale);
      if (ds16 == nullptr) {
        dr[j] = ds;
      } else {
        StoreF(ds16, t, r * cols + j, ds);
        StoreF(p16, t, r * cols + j, pr[j]);
      }
    }
  }
}

// lse[r] = the log-sum-exp of row r's unmasked scores (math::
// AttentionRowKeys; thread per row).
__global__ void RowLogSumExpKernel(const float* x, int64_t rows, int64_t cols, bool causal,
                                   int64_t q_len, int64_t heads, const int32_t* key_start,
                                   float* lse) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const math::AttentionKeys keys =
      math::AttentionRowKeys(r, heads, q_len, cols, causal, key_start);
  lse[r] = math::RowLogSumExp(x + r * cols + keys.first, keys.end - keys.first);
}

}  // namespace

int BatchPointers(const void* a, int64_t a_seq, int64_t a_head, const void* b, int64_t b_seq,
                  int64_t b_head, const void* c, int64_t c_seq, int64_t c_head, int64_t seqs,
                  int64_t heads, const void** out, void* stream) {
  SK_LAUNCH(seqs * heads, BatchPointersKernel, static_cast<const char*>(a), a_seq, a_head,
            static_cast<const char*>(b), b_seq, b_head, static_cast<const char*>(c), c_seq,
            c_head, seqs, heads, out);
}

int RepeatKvHeads(CBuf src, int64_t ld, int64_t rows, int64_t kv_heads, int64_t group,
                  int64_t head_dim, Buf dst, void* stream) {
  SK_LAUNCH(rows * kv_heads * group * head_dim, RepeatKvHeadsKernel, src.data, src.dtype, ld, rows,
            kv_heads, group, head_dim, dst.data, dst.dtype);
}
int SumKvHeadGroups(CBuf src, int64_t rows, int64_t kv_heads, int64_t group, int64_t head_dim,
                    Buf dst, int64_t ld, void* stream) {
  SK_LAUNCH(rows * kv_heads * head_dim, SumKvHeadGroupsKernel, src.data, src.dtype, rows, kv_heads,
            group, head_dim, dst.data, dst.dtype, ld);
}

int SoftmaxRows(float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len, int64_t heads,
                const int32_t* key_start, Buf p16, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, SoftmaxKernel, x, rows, cols, causal, q_len > 0 ? q_len : 1,
                  heads > 0 ? heads : 1, key_start, p16.data, p16.dtype);
  return Launched();
}
int SoftmaxBackwardRows(const float* p, float* dp, int64_t rows, int64_t cols, float scale,
                        Buf ds16, void* p16, void* stream) {
  if (rows <= 0 || cols <= 0) return 0;
  SK_ENQUEUE_ROWS(rows, cols, SoftmaxGradKernel, p, dp, rows, cols, scale, ds16.data, p16,
                  ds16.dtype);
  return Launched();
}

int RowLogSumExp(const float* x, int64_t rows, int64_t cols, bool causal, int64_t q_len,
                 int64_t heads, const int32_t* key_start, float* lse, void* stream) {
  if (cols <= 0) return 0;
  SK_LAUNCH(rows, RowLogSumExpKernel, x, rows, cols, causal, q_len > 0 ? q_len : 1,
            heads > 0 ? heads : 1, key_start, lse);
}

}  // namespace sk::ops::cuda
