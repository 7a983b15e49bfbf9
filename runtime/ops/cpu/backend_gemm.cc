// The CPU backend's GEMMs (backend_common.h): oneDNN's f32 GEMM (or OpenBLAS),
// oneDNN's bf16 matmul, and 16-bit operands widened in bounded blocks.

#include <algorithm>
#include <atomic>

#include "runtime/ops/cpu/backend_common.h"
#include "runtime/ops/cpu/cpu_backend.h"

namespace sk::ops {

namespace {

// How CpuBackend::Gemm cuts a GEMM whose 16-bit operands it widens (or
// whose 16-bit C it computes in f32): column panels of op(B) and C, each
// with all of k, and row blocks of op(A) and C. A 16-bit C block holds at
// most g_gemm_c_block elements, a widened A block or B panel at most 4x that
// (16 MiB at the default), but never fewer than kMinGemmBlock rows or
// columns (or the whole dimension): the thread's f32 scratch is bounded by
// the blocks, not the operands. oneDNN's f32 GEMM sums an element of C in
// the same order whatever the cut, except in the kernels it runs on thin
// calls (one-thread measurements on this repository's AVX-512 Xeon: fewer
// than 16 rows of an NT product, a single row or column otherwise): so the
// rows are cut into equal blocks (each at least half the cap, 32 rows), and
// panels are whole multiples of 48 columns (oneDNN's unroll along our n)
// with a remainder under 48 joined to the panel before it.
std::atomic<int64_t> g_gemm_c_block{int64_t{1} << 20};
constexpr int64_t kMinGemmBlock = 64;
constexpr int64_t kGemmPanelAlign = 48;

struct GemmCuts {
  int64_t row_blocks = 1;  // block i: rows [i m / row_blocks, (i + 1) m / row_blocks)
  int64_t max_rows = 0;    // the largest block's
  int64_t cols = 0;        // panel width (the last panel: the rest, with a remainder < 48)
  int64_t max_cols = 0;    // the widest panel's
};

GemmCuts GemmBlocks(int64_t m, int64_t n, int64_t k, bool a16, bool b16, bool c16) {
  const int64_t c_block = g_gemm_c_block.load(std::memory_order_relaxed);
  const int64_t widened = 4 * c_block;
  GemmCuts cut;
  cut.cols = cut.max_cols = n;
  if (b16 && k * n > widened) {
    const int64_t panels = (k * n + widened - 1) / widened;
    const int64_t cols = std::max((n + panels - 1) / panels, kMinGemmBlock);
    cut.cols = std::min(n, (cols + kGemmPanelAlign - 1) / kGemmPanelAlign * kGemmPanelAlign);
    cut.max_cols = std::min(n, cut.cols + kGemmPanelAlign - 1);
  }
  int64_t cap = m;
  if (c16) cap = std::min(cap, std::max(c_block / cut.max_cols, kMinGemmBlock));
  if (a16) cap = std::min(cap, std::max(widened / k, kMinGemmBlock));
  cut.row_blocks = (m + cap - 1) / cap;
  cut.max_rows = (m + cut.row_blocks - 1) / cut.row_blocks;
  return cut;
}

}  // namespace

Status CpuBackend::GemmBias(const OpContext&, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                            const Tensor& bias, const MatrixRef& c) {
  const BF16* ap = a.t.data_as<BF16>() + a.offset;
  const BF16* bp = b.t.data_as<BF16>() + b.offset;
  if (c.t.dtype() == DType::kF32) {
    GemmBF16Bias(p.trans_a, p.trans_b, p.m, p.n, p.k, ap, a.ld, bp, b.ld, bias.data_as<BF16>(),
                 c.t.data_as<float>() + c.offset, c.ld);
  } else {
    GemmBF16Bias(p.trans_a, p.trans_b, p.m, p.n, p.k, ap, a.ld, bp, b.ld, bias.data_as<BF16>(),
                 c.t.data_as<BF16>() + c.offset, c.ld);
  }
  return OkStatus();
}

Status CpuBackend::Gemm(const OpContext&, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                        const MatrixRef& c) {
  if (p.m == 0 || p.n == 0 || p.batch == 0) return OkStatus();
  if (p.k == 0) {  // C = beta C; the libraries disagree about empty products.
    float* buf = Scratch(0, p.n);
    for (int64_t i = 0; i < p.batch; ++i) {
      for (int64_t r = 0; r < p.m; ++r) {
        const int64_t o = c.offset + i * c.batch_stride + r * c.ld;
        float* row = InF32(c.t, o, p.n, buf);
        for (int64_t j = 0; j < p.n; ++j) row[j] = p.beta == 0.0f ? 0.0f : p.beta * row[j];
        OutDone(c.t, o, p.n, row);
      }
    }
    return OkStatus();
  }
  const DType t = a.t.dtype();
  if (t == DType::kF32 && IsF32(c.t)) {
    for (int64_t i = 0; i < p.batch; ++i) {
      sk::Gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, At(a) + i * a.batch_stride, a.ld,
               At(b) + i * b.batch_stride, b.ld, p.beta, At(c) + i * c.batch_stride, c.ld);
    }
    return OkStatus();
  }
  // bf16 through oneDNN's bf16 matmul only where the CPU has bf16
  // dot-product instructions that beat the f32 FMA (NativeBf16Gemm);
  // otherwise widening and the f32 GEMM is faster and gives the same
  // numbers up to summation order.
  const bool native = t == DType::kBF16 && NativeBf16Gemm() && p.alpha == 1.0f &&
                      (p.beta == 0.0f || p.beta == 1.0f);
  if (native && c.t.dtype() == DType::kBF16) {
    // oneDNN accumulates in f32 and rounds into the bf16 C itself: no f32
    // copy of C through memory (for the forward and input-gradient GEMMs,
    // whose C is an activation, that copy cost more than the packing).
    for (int64_t i = 0; i < p.batch; ++i) {
      GemmBF16(p.trans_a, p.trans_b, p.m, p.n, p.k,
               a.t.data_as<BF16>() + a.offset + i * a.batch_stride, a.ld,
               b.t.data_as<BF16>() + b.offset + i * b.batch_stride, b.ld, p.beta == 1.0f,
               c.t.data_as<BF16>() + c.offset + i * c.batch_stride, c.ld);
    }
    return OkStatus();
  }
  // The f32 GEMM in blocks: column panels of op(B) and C (all of k) and,
  // within each, row blocks of op(A) and C (GemmBlocks). A 16-bit C block
  // is computed in f32 scratch of the calling thread (beta C widened into
  // it first) and rounded once into C; 16-bit A and B (no bf16 matmul
  // chosen) are widened exactly into f32 scratch, B a panel at a time, A
  // a row block at a time (once, when one block holds it). The scratch is
  // bounded by the blocks whatever the shape: before, B was widened whole
  // (the LM head's 768 x 16384 weight: 48 MiB that every thread that ran
  // it kept). k is never split: each element of C is the same sum, in the
  // same order, as in one GEMM of the whole (cpu_blocked_gemm_test checks
  // the bits against one f32 GEMM of the widened matrices).
  const bool c16 = !IsF32(c.t);
  const bool a16 = !native && !IsF32(a.t), b16 = !native && !IsF32(b.t);
  const GemmCuts cut = GemmBlocks(p.m, p.n, p.k, a16, b16, c16);
  float* wc = c16 ? Scratch(0, cut.max_rows * cut.max_cols) : nullptr;
  float* wb = b16 ? Scratch(1, p.k * cut.max_cols) : nullptr;
  float* wa = a16 ? Scratch(2, cut.max_rows * p.k) : nullptr;
  const DType ct = c.t.dtype();
  for (int64_t i = 0; i < p.batch; ++i) {
    const int64_t a0 = a.offset + i * a.batch_stride, b0 = b.offset + i * b.batch_stride;
    const int64_t c0 = c.offset + i * c.batch_stride;
    // Rows [r0, r0 + rows) of op(A) as f32 (rows of A, or columns when
    // transposed), widened into wa when A is 16-bit.
    auto a_rows = [&](int64_t r0, int64_t rows, int64_t* lda) -> const float* {
      const int64_t off = a0 + (p.trans_a ? r0 : r0 * a.ld);
      if (!a16) {
        *lda = a.ld;
        return a.t.data_as<float>() + off;
      }
      const int64_t ar = p.trans_a ? p.k : rows, ac = p.trans_a ? rows : p.k;
      for (int64_t r = 0; r < ar; ++r) ToF32(Elem(a.t, off + r * a.ld), a.t.dtype(), ac, wa + r * ac);
      *lda = ac;
      return wa;
    };
    // One row block: op(A) widened once for every panel.
    const bool a_once = a16 && cut.row_blocks == 1;
    int64_t lda_once = 0;
    const float* a_whole = a_once ? a_rows(0, p.m, &lda_once) : nullptr;
    for (int64_t j0 = 0; j0 < p.n;) {
      int64_t nc = std::min(cut.cols, p.n - j0);
      if (p.n - j0 - nc < kGemmPanelAlign) nc = p.n - j0;  // a thin remainder joins this panel
      // Columns [j0, j0 + nc) of op(B): B's columns, or its rows when
      // transposed.
      const int64_t b_off = b0 + (p.trans_b ? j0 * b.ld : j0);
      int64_t ldb = b.ld;
      const float* bp = nullptr;
      if (b16) {
        const int64_t br = p.trans_b ? nc : p.k, bc = p.trans_b ? p.k : nc;
        for (int64_t r = 0; r < br; ++r) ToF32(Elem(b.t, b_off + r * b.ld), b.t.dtype(), bc, wb + r * bc);
        bp = wb;
        ldb = bc;
      } else if (!native) {
        bp = b.t.data_as<float>() + b_off;
      }
      for (int64_t blk = 0; blk < cut.row_blocks; ++blk) {
        const int64_t r0 = blk * p.m / cut.row_blocks;
        const int64_t rows = (blk + 1) * p.m / cut.row_blocks - r0;
        const int64_t c_off = c0 + r0 * c.ld + j0;
        int64_t ldc = c.ld;
        float* cp = nullptr;
        if (c16) {
          cp = wc;
          ldc = nc;
          if (p.beta != 0.0f) {
            for (int64_t r = 0; r < rows; ++r) ToF32(Elem(c.t, c_off + r * c.ld), ct, nc, wc + r * nc);
          }
        } else {
          cp = c.t.data_as<float>() + c_off;
        }
        if (native) {
          // One panel here: oneDNN's bf16 matmul on A and B as they are.
          const BF16* ab = a.t.data_as<BF16>() + a0 + (p.trans_a ? r0 : r0 * a.ld);
          GemmBF16(p.trans_a, p.trans_b, rows, nc, p.k, ab, a.ld, b.t.data_as<BF16>() + b_off, b.ld,
                   p.beta == 1.0f, cp, ldc);
        } else {
          int64_t lda = lda_once;
          const float* ap = a_once ? a_whole : a_rows(r0, rows, &lda);
          sk::Gemm(p.trans_a, p.trans_b, rows, nc, p.k, p.alpha, ap, lda, bp, ldb, p.beta, cp, ldc);
        }
        if (c16) {
          for (int64_t r = 0; r < rows; ++r) FromF32(wc + r * nc, nc, Elem(c.t, c_off + r * c.ld), ct);
        }
      }
      j0 += nc;
    }
  }
  return OkStatus();
}

int64_t SetCpuGemmBlockElementsForTest(int64_t elements) {
  return g_gemm_c_block.exchange(std::max<int64_t>(1, elements));
}

}  // namespace sk::ops
