#include "runtime/ops/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "runtime/ops/cpu/flash_attention.h"
#include "runtime/ops/cpu/kernels.h"
#include "runtime/ops/cpu/rope_table.h"
#include "runtime/ops/cpu/simd.h"
#include "runtime/ops/math.h"

namespace sk::ops {

namespace {

// The sanitizer builds run parts on std::threads: ThreadSanitizer does not
// see libgomp's synchronisation (libgomp is not instrumented), so OpenMP
// regions would report races that are not there.
#if defined(__SANITIZE_THREAD__)
#define SK_CPU_PARTS_ON_STD_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SK_CPU_PARTS_ON_STD_THREADS 1
#endif
#endif

// Runs fn(p) for every part p in [0, parts) and returns when all have run.
// Part 0 runs on the calling thread. The others run on the calling
// thread's OpenMP team, the threads oneDNN's GEMMs run on: they stay alive
// between calls (their thread-local scratch with them) and, right after a
// GEMM, are still spinning for work. Threads of our own would have to take
// the core from a spinning OpenMP thread: measured on 2 cores after a
// 2-thread GEMM, causal attention on two std::threads per call ran no
// faster than on one (gpt-10m shapes 10.4 against 10.3 ms forward). fn
// must not throw.
template <typename Fn>
void RunParts(int64_t parts, const Fn& fn) {
  if (parts <= 1) {
    fn(int64_t{0});
    return;
  }
#if defined(SK_CPU_PARTS_ON_STD_THREADS)
  std::vector<std::thread> helpers;
  for (int64_t p = 1; p < parts; ++p) {
    try {
      helpers.emplace_back([&fn, p] { fn(p); });
    } catch (const std::system_error&) {
      fn(p);  // a part whose thread cannot be started runs here
    }
  }
  fn(int64_t{0});
  for (std::thread& t : helpers) t.join();
#else
#pragma omp parallel for num_threads(static_cast<int>(parts)) schedule(static, 1)
  for (int64_t p = 0; p < parts; ++p) fn(p);
#endif
}

// Runs fn(begin, end) over [0, n) split across up to GemmThreads() threads
// (the intra-op thread count: cores / local ranks, so one rank per core
// stays on one thread), each part at least min_per_part long and, but for
// the last, a multiple of align. For work whose bits do not depend on where
// [0, n) is cut: elementwise loops (masked vector tails: align keeps the
// cuts on whole vectors) and independent rows or columns.
template <typename Fn>
void SplitRange(int64_t n, int64_t min_per_part, int64_t align, const Fn& fn) {
  const int64_t parts = std::min<int64_t>(GemmThreads(), n / std::max<int64_t>(1, min_per_part));
  if (parts <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = ((n + parts - 1) / parts + align - 1) / align * align;
  RunParts((n + chunk - 1) / chunk,
           [&fn, n, chunk](int64_t p) { fn(p * chunk, std::min(n, (p + 1) * chunk)); });
}

// The optimizer updates over a large flat shard are memory-bound and one
// thread reaches a fraction of the socket's bandwidth (FSDP's CPU offload
// runs AdamW over the whole model on the host): parts of at least 2^20.
template <typename Fn>
void SplitElementwise(int64_t n, const Fn& fn) {
  SplitRange(n, int64_t{1} << 20, 1024, fn);
}

// The model's per-element and per-row passes (GELU, LayerNorm forward, a
// bias broadcast or gradient) in parts of at least 2^16 elements, whole
// vectors: they run a few microseconds per part, well above an OpenMP
// dispatch to a team that is awake.
constexpr int64_t kMinPassPart = int64_t{1} << 16;
constexpr int64_t kVectorAlign = 16;

// How attention spreads over the intra-op threads: into units of one
// sequence range and one head range, each computed by the kernel exactly as
// the whole call computes it (per sequence and head: the same copies, GEMMs
// and softmax), so the bits do not depend on the split. With at least as
// many sequences as parts, a unit is a range of sequences with all their
// heads; otherwise each sequence's heads are cut into head_chunks ranges
// (a unit is then one sequence). Each part gets at least kMinWork
// multiply-adds of the scores and P V (an OpenMP dispatch and the parts'
// scratch are not free), so small calls and one thread per rank (ranks
// filling the cores) run as one part on the calling thread.

// One unit: sequences [b0, b0 + shape.batch) and heads [h0, h0 +
// shape.heads) of the call, shape being the call's shape cut down to them.
struct AttentionUnit {
  AttentionShape shape;
  int64_t b0 = 0, h0 = 0;
};

struct AttentionSplit {
  int64_t parts = 1;
  int64_t units = 1;        // parts take contiguous ranges of units
  int64_t head_chunks = 1;  // > 1: a unit is (sequence, head range)
  int64_t heads_per_chunk = 0;

  // Unit u of a call of shape s.
  AttentionUnit Unit(const AttentionShape& s, int64_t u) const {
    AttentionUnit a{s};
    if (head_chunks > 1) {
      a.b0 = u / head_chunks;
      a.h0 = (u % head_chunks) * heads_per_chunk;
      a.shape.batch = 1;
      a.shape.heads = std::min(heads_per_chunk, s.heads - a.h0);
    } else {
      a.b0 = u * s.batch / units;
      a.shape.batch = (u + 1) * s.batch / units - a.b0;
    }
    return a;
  }
};

AttentionSplit SplitAttention(const AttentionShape& s, bool heads_may_split) {
  constexpr int64_t kMinWork = int64_t{1} << 22;
  AttentionSplit a;
  const int64_t work = 2 * s.batch * s.heads * s.q_len * s.kv_len * s.head_dim;
  const int64_t most = heads_may_split ? s.batch * s.heads : s.batch;
  a.parts = std::max<int64_t>(1, std::min({static_cast<int64_t>(GemmThreads()), most, work / kMinWork}));
  if (a.parts <= s.batch) {
    a.units = a.parts;
    return a;
  }
  const int64_t want = (a.parts + s.batch - 1) / s.batch;  // head ranges per sequence
  a.heads_per_chunk = (s.heads + want - 1) / want;
  a.head_chunks = (s.heads + a.heads_per_chunk - 1) / a.heads_per_chunk;
  a.units = s.batch * a.head_chunks;
  a.parts = std::min(a.parts, a.units);
  return a;
}

// Runs fn(part, unit) for every unit of the split of a call of shape s,
// parts in parallel.
template <typename Fn>
void RunAttentionSplit(const AttentionSplit& a, const AttentionShape& s, const Fn& fn) {
  RunParts(a.parts, [&a, &s, &fn](int64_t p) {
    for (int64_t u = p * a.units / a.parts; u < (p + 1) * a.units / a.parts; ++u) {
      fn(p, a.Unit(s, u));
    }
  });
}

// The linear-memory attention's units (flash_attention.h: a sequence and a
// key/value head with its query heads) in contiguous ranges over the
// intra-op threads; each unit's bits do not depend on the split.
template <typename Fn>
void SplitFlashUnits(const AttentionShape& s, const Fn& fn) {
  SplitRange(FlashAttentionUnits(s), 1, 1, fn);
}

float* F(const Tensor& t) { return t.data_as<float>(); }
float* At(const MatrixRef& m) { return m.t.data_as<float>() + m.offset; }

// Unit a's block of an f32 attention operand of len rows per sequence
// (q_len for q, out and their gradients; kv_len for k, v and theirs).
float* UnitAt(const MatrixRef& m, const AttentionUnit& a, int64_t len) {
  return At(m) + a.b0 * len * m.ld + a.h0 * a.shape.head_dim;
}
// The key starts of packed documents (AttentionShape::key_start) from
// sequence b0 on, or nullptr without them.
const int32_t* KeyStarts(const AttentionShape& s, int64_t b0) {
  return s.key_start.defined() ? s.key_start.data_as<int32_t>() + b0 * s.q_len : nullptr;
}
// Unit a's first probs row: probs is [batch, heads, q_len, kv_len].
float* UnitProbs(const Tensor& probs, const AttentionShape& s, const AttentionUnit& a) {
  return F(probs) + (a.b0 * s.heads + a.h0) * s.q_len * s.kv_len;
}

bool IsF32(const Tensor& t) { return t.dtype() == DType::kF32; }
bool AllBf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->dtype() != DType::kBF16) return false;
  }
  return true;
}
bool AllBF16(std::initializer_list<const MatrixRef*> ms) {
  return std::all_of(ms.begin(), ms.end(),
                     [](const MatrixRef* m) { return m->t.dtype() == DType::kBF16; });
}
// Unit a's block of a bf16 attention operand, as UnitAt.
BF16* UnitBF16(const MatrixRef& m, const AttentionUnit& a, int64_t len) {
  return m.t.data_as<BF16>() + m.offset + a.b0 * len * m.ld + a.h0 * a.shape.head_dim;
}

// Element i of t's buffer, for any dtype.
void* Elem(const Tensor& t, int64_t i) {
  return static_cast<char*>(t.data()) + i * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// n elements of dtype t at src widened exactly into f32 (vectorised for bf16).
void ToF32(const void* src, DType t, int64_t n, float* dst) {
  if (t == DType::kBF16) {
    simd::WidenBf16(static_cast<const BF16*>(src), n, dst);
  } else {
    WidenToF32(src, t, n, dst);
  }
}

// n f32 values stored into dtype t at dst, rounded to nearest even once.
void FromF32(const float* src, int64_t n, void* dst, DType t) {
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, sizeof(float) * n); return;
    case DType::kBF16: simd::NarrowToBf16(src, n, static_cast<BF16*>(dst)); return;
    default:
      for (int64_t i = 0; i < n; ++i) StoreFromFloat(dst, t, i, src[i]);
  }
}

// The calling thread's f32 scratch buffers (one per slot, grown to the
// largest size asked for and kept): the f32 rows and chunks that 16-bit
// operands are widened into and narrowed from, small enough to stay in
// cache, instead of whole-tensor f32 copies.
constexpr int kScratchSlots = 8;
float* Scratch(int slot, int64_t n) {
  thread_local std::vector<float> bufs[kScratchSlots];
  std::vector<float>& b = bufs[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// Elements [i, i + n) of t as f32: t's own memory when f32, otherwise
// widened into `buf` (which then holds them).
float* InF32(const Tensor& t, int64_t i, int64_t n, float* buf) {
  if (IsF32(t)) return F(t) + i;
  ToF32(Elem(t, i), t.dtype(), n, buf);
  return buf;
}
// Where an f32 result for elements [i, i + n) of t goes: t itself when f32,
// otherwise `buf`, narrowed into t by OutDone.
float* OutF32(const Tensor& t, int64_t i, float* buf) { return IsF32(t) ? F(t) + i : buf; }
void OutDone(const Tensor& t, int64_t i, int64_t n, const float* buf) {
  if (!IsF32(t)) FromF32(buf, n, Elem(t, i), t.dtype());
}

// Elementwise ops on 16-bit operands run over chunks of this many elements
// (three f32 chunks fit in L1).
constexpr int64_t kChunk = 2048;

// Runs body(i, c) over [0, n) in chunks of at most kChunk.
template <typename Body>
void ForChunks(int64_t n, Body body) {
  for (int64_t i = 0; i < n; i += kChunk) body(i, std::min(kChunk, n - i));
}

// Rows [row0, row0 + rows) of the cols-wide matrix m (batch index 0) as a
// row-major f32 block: m's memory when f32 (row stride m.ld), otherwise
// widened into buf (row stride cols). Returns the pointer and sets *ld.
const float* MatIn(const MatrixRef& m, int64_t row0, int64_t rows, int64_t cols, float* buf,
                   int64_t* ld) {
  if (IsF32(m.t)) {
    *ld = m.ld;
    return At(m) + row0 * m.ld;
  }
  for (int64_t r = 0; r < rows; ++r) {
    ToF32(Elem(m.t, m.offset + (row0 + r) * m.ld), m.t.dtype(), cols, buf + r * cols);
  }
  *ld = cols;
  return buf;
}
// The f32 destination of rows [row0, row0 + rows) of m, as MatIn (buf not
// read); MatDone narrows buf's rows into m when m is 16-bit.
float* MatOut(const MatrixRef& m, int64_t row0, float* buf, int64_t cols, int64_t* ld) {
  if (IsF32(m.t)) {
    *ld = m.ld;
    return At(m) + row0 * m.ld;
  }
  *ld = cols;
  return buf;
}
void MatDone(const MatrixRef& m, int64_t row0, int64_t rows, int64_t cols, const float* buf) {
  if (IsF32(m.t)) return;
  for (int64_t r = 0; r < rows; ++r) {
    FromF32(buf + r * cols, cols, Elem(m.t, m.offset + (row0 + r) * m.ld), m.t.dtype());
  }
}

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

class CpuBackend final : public OpBackend {
 public:
  const char* name() const override { return "cpu"; }
  bool executes() const override { return true; }

  // A 16-bit C is stored here (f32 accumulation, rounded once): no f32
  // staging of the whole C by the dispatcher. For k = 0 (C = beta C) the
  // dispatcher stages a 16-bit C.
  bool GemmStores16Bit(const GemmParams& p) const override { return p.k > 0; }
  // Every model op takes its 16-bit operands itself (bf16 conversions
  // vectorised, f16 through core/dtype.h's scalar ones), computing exactly
  // what the dispatcher's staging would: see the block comment below.
  bool Native16Bit(std::string_view op) const override { return IsStagedModelOp(op); }

  // A bf16 linear layer on bf16 hardware: the bias inside oneDNN's matmul
  // (kernels.h: GemmBF16Bias; the two-op form up to f32 summation order), so the
  // activation is written once, not broadcast into and read back. Elsewhere
  // the dispatcher's two ops (f32 keeps its GEMM library and its bits).
  bool GemmAddsBias(const GemmParams& p, DType ab, DType bias, DType c) const override {
    return ab == DType::kBF16 && bias == DType::kBF16 && (c == DType::kBF16 || c == DType::kF32) &&
           p.alpha == 1.0f && NativeBf16Gemm();
  }
  Status GemmBias(const OpContext&, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
                  const Tensor& bias, const MatrixRef& c) override {
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

  Status Gemm(const OpContext&, const GemmParams& p, const MatrixRef& a, const MatrixRef& b,
              const MatrixRef& c) override {
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

  Status Copy(const OpContext&, const Tensor& src, const Tensor& dst) override {
    if (src.nbytes() > 0) std::memcpy(dst.data(), src.data(), src.nbytes());
    return OkStatus();
  }

  Status Cast(const OpContext&, const Tensor& src, const Tensor& dst) override {
    const int64_t n = src.numel();
    if (src.dtype() == DType::kBF16 && IsF32(dst)) {
      simd::WidenBf16(src.data_as<BF16>(), n, F(dst));
      return OkStatus();
    }
    if (IsF32(src) && dst.dtype() == DType::kBF16) {
      simd::NarrowToBf16(F(src), n, dst.data_as<BF16>());
      return OkStatus();
    }
    return ConvertElements(src.data(), src.dtype(), dst.data(), dst.dtype(),
                           static_cast<size_t>(src.numel()));
  }

  Status RoundToDType(const OpContext&, const Tensor& x, DType t) override {
    RoundToDTypeInPlace(F(x), x.numel(), t);
    return OkStatus();
  }

  Status Scale(const OpContext&, const Tensor& x, float alpha) override {
    const int64_t n = x.numel();
    if (x.dtype() == DType::kF32) {
      simd::ScaleInPlace(F(x), alpha, n);
      return OkStatus();
    }
    if (x.dtype() == DType::kBF16) {
      alignas(64) float buf[kChunk];
      ForChunks(n, [&](int64_t i, int64_t c) {
        float* v = InF32(x, i, c, buf);
        simd::ScaleInPlace(v, alpha, c);
        OutDone(x, i, c, v);
      });
      return OkStatus();
    }
    for (int64_t i = 0; i < n; ++i) {
      StoreFromFloat(x.data(), x.dtype(), i, LoadAsFloat(x.data(), x.dtype(), i) * alpha);
    }
    return OkStatus();
  }

  Status Axpy(const OpContext&, float alpha, const Tensor& x, const Tensor& y) override {
    const int64_t n = x.numel();
    if (x.dtype() == DType::kF32) {
      const float* xs = F(x);
      if (alpha == 1.0f) {
        // y += x exactly as a plain add (AccumulateFromF32's rounding).
        AccumulateFromF32(xs, n, y.data(), y.dtype());
        return OkStatus();
      }
      if (y.dtype() == DType::kF32) {
        simd::Axpy(alpha, xs, F(y), n);
        return OkStatus();
      }
    }
    if (x.dtype() != DType::kF16 && y.dtype() != DType::kF16) {
      // f32 and bf16 mixes, in f32 chunks: y + alpha x (alpha = 1: y + x),
      // rounded once, as the scalar loop below.
      alignas(64) float bx[kChunk], by[kChunk];
      ForChunks(n, [&](int64_t i, int64_t c) {
        const float* xs = InF32(x, i, c, bx);
        float* ys = InF32(y, i, c, by);
        if (alpha == 1.0f) {
          simd::AddInPlace(ys, xs, c);
        } else {
          simd::Axpy(alpha, xs, ys, c);
        }
        OutDone(y, i, c, ys);
      });
      return OkStatus();
    }
    for (int64_t i = 0; i < n; ++i) {
      float v = LoadAsFloat(y.data(), y.dtype(), i) + alpha * LoadAsFloat(x.data(), x.dtype(), i);
      StoreFromFloat(y.data(), y.dtype(), i, v);
    }
    return OkStatus();
  }

  // Zero (the common case: gradient buffers) is memset, which glibc runs with
  // wide and, for large buffers, non-temporal stores; any other value is
  // written into the first 4 KiB and copied from there. The plain element loop
  // this replaces stayed scalar at -O2 and ran at a sixth of memset's rate
  // (step_breakdown: fill was 2.3% of a gpt-deep-20m FULL_SHARD bf16 step).
  Status Fill(const OpContext&, const Tensor& x, float value) override {
    const size_t n = static_cast<size_t>(x.numel());
    switch (x.dtype()) {
      case DType::kF32: FillPattern(F(x), n, value); break;
      case DType::kBF16: FillPattern(x.data_as<BF16>(), n, FloatToBF16(value)); break;
      case DType::kF16: FillPattern(x.data_as<F16>(), n, FloatToF16(value)); break;
      default: LOG(FATAL) << "fill: dtype not validated";
    }
    return OkStatus();
  }

  template <typename T>
  static void FillPattern(T* p, size_t n, T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    if (std::all_of(bytes, bytes + sizeof(T), [](unsigned char b) { return b == 0; })) {
      std::memset(p, 0, n * sizeof(T));
      return;
    }
    const size_t head = std::min(n, size_t{4096} / sizeof(T));
    std::fill(p, p + head, v);
    for (size_t i = head; i < n; i += head) std::memcpy(p + i, p, sizeof(T) * std::min(head, n - i));
  }

  Status InitPhilox(const OpContext&, const Initializer& init, uint64_t seed, uint64_t param_id,
                    int64_t begin, const Tensor& out) override {
    return InitializeTensorSlice(init, seed, param_id, begin, out);
  }

  // The model ops below take f32, bf16 and f16 operands in any mix
  // (Native16Bit): 16-bit operands are widened a row or a chunk at a time
  // into the calling thread's f32 scratch (vectorised, exact), the f32 loop
  // runs on it, and 16-bit outputs are rounded once when stored back. Per
  // row and per chunk the arithmetic is the f32 path's, so the results are
  // the f32 op's on widened copies, rounded once: what the dispatcher's
  // whole-tensor staging gave, bit for bit.

  Status BroadcastRows(const OpContext&, const Tensor& src, const Tensor& dst) override {
    const int64_t cols = src.numel();
    if (cols == 0) return OkStatus();
    const int64_t rows = dst.numel() / cols;
    if (IsF32(src) && IsF32(dst)) {
      SplitRange(rows, std::max<int64_t>(1, kMinPassPart / cols), 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) std::memcpy(F(dst) + r * cols, F(src), sizeof(float) * cols);
      });
      return OkStatus();
    }
    // src converted once into dst's dtype, then copied into every row.
    const size_t row_bytes = DTypeSize(dst.dtype()) * static_cast<size_t>(cols);
    std::vector<char> row(row_bytes);
    FromF32(InF32(src, 0, cols, Scratch(0, cols)), cols, row.data(), dst.dtype());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(Elem(dst, r * cols), row.data(), row_bytes);
    return OkStatus();
  }

  Status BiasAdd(const OpContext&, const Tensor& bias, const Tensor& y) override {
    const int64_t cols = bias.numel();
    if (cols == 0) return OkStatus();
    const int64_t rows = y.numel() / cols;
    const float* b = InF32(bias, 0, cols, Scratch(0, cols));
    float* buf = Scratch(1, cols);
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = InF32(y, r * cols, cols, buf);
      AddInPlace(yr, b, cols);
      OutDone(y, r * cols, cols, yr);
    }
    return OkStatus();
  }

  Status BiasGrad(const OpContext&, const Tensor& dy, const Tensor& dbias) override {
    const int64_t cols = dbias.numel();
    if (cols == 0) return OkStatus();
    const int64_t rows = dy.numel() / cols;
    if (IsF32(dy) && IsF32(dbias)) {
      // Each column sums its rows in order whatever the cut: ranges of
      // columns in parallel (whole vectors).
      SplitRange(cols, std::max<int64_t>(kVectorAlign, kMinPassPart / std::max<int64_t>(1, rows)),
                 kVectorAlign, [&](int64_t b, int64_t e) {
                   for (int64_t r = 0; r < rows; ++r) AddInPlace(F(dbias) + b, F(dy) + r * cols + b, e - b);
                 });
      return OkStatus();
    }
    // dbias accumulates in f32 over every row and is rounded once; a bf16
    // row is widened in registers as it is added.
    float* acc = InF32(dbias, 0, cols, Scratch(0, cols));
    if (dy.dtype() == DType::kBF16) {
      const BF16* d = dy.data_as<BF16>();
      for (int64_t r = 0; r < rows; ++r) simd::AddWidenedBf16(acc, d + r * cols, cols);
      OutDone(dbias, 0, cols, acc);
      return OkStatus();
    }
    float* buf = Scratch(1, cols);
    for (int64_t r = 0; r < rows; ++r) AddInPlace(acc, InF32(dy, r * cols, cols, buf), cols);
    OutDone(dbias, 0, cols, acc);
    return OkStatus();
  }

  Status GeluForward(const OpContext&, const Tensor& x, const Tensor& y) override {
    if (IsF32(x) && IsF32(y)) {
      SplitRange(x.numel(), kMinPassPart, kVectorAlign,
                 [&](int64_t b, int64_t e) { sk::GeluForward(F(x) + b, e - b, F(y) + b); });
      return OkStatus();
    }
    if (x.dtype() == DType::kBF16 && y.dtype() == DType::kBF16) {
      // Converted in registers: the chunked path's bits without its f32 copies.
      const BF16* xb = x.data_as<BF16>();
      BF16* yb = y.data_as<BF16>();
      SplitRange(x.numel(), kMinPassPart, kVectorAlign,
                 [&](int64_t b, int64_t e) { simd::GeluForwardBf16(xb + b, e - b, yb + b); });
      return OkStatus();
    }
    alignas(64) float bx[kChunk], by[kChunk];
    ForChunks(x.numel(), [&](int64_t i, int64_t c) {
      float* ys = OutF32(y, i, by);
      sk::GeluForward(InF32(x, i, c, bx), c, ys);
      OutDone(y, i, c, ys);
    });
    return OkStatus();
  }

  Status GeluBackward(const OpContext&, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override {
    if (IsF32(x) && IsF32(dy) && IsF32(dx)) {
      SplitRange(x.numel(), kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
        sk::GeluBackward(F(x) + b, F(dy) + b, e - b, F(dx) + b);
      });
      return OkStatus();
    }
    if (x.dtype() == DType::kBF16 && dy.dtype() == DType::kBF16 && dx.dtype() == DType::kBF16) {
      const BF16* xb = x.data_as<BF16>();
      const BF16* dyb = dy.data_as<BF16>();
      BF16* dxb = dx.data_as<BF16>();
      SplitRange(x.numel(), kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
        simd::GeluBackwardBf16(xb + b, dyb + b, e - b, dxb + b);
      });
      return OkStatus();
    }
    alignas(64) float bx[kChunk], bdy[kChunk], bdx[kChunk];
    ForChunks(x.numel(), [&](int64_t i, int64_t c) {
      const float* xs = InF32(x, i, c, bx);
      const float* dys = InF32(dy, i, c, bdy);
      float* dxs = OutF32(dx, i, bdx);
      sk::GeluBackward(xs, dys, c, dxs);
      OutDone(dx, i, c, dxs);
    });
    return OkStatus();
  }

  Status LayerNormForward(const OpContext&, const Tensor& x, const Tensor& gamma,
                          const Tensor& beta, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd) override {
    const int64_t cols = gamma.numel();
    const int64_t rows = x.numel() / cols;
    if (IsF32(x) && IsF32(gamma) && IsF32(beta) && IsF32(y)) {
      // Rows are independent: ranges of them in parallel.
      SplitRange(rows, std::max<int64_t>(1, kMinPassPart / std::max<int64_t>(1, cols)), 1,
                 [&](int64_t b, int64_t e) {
                   sk::LayerNormForward(F(x) + b * cols, F(gamma), F(beta), e - b, cols,
                                        F(y) + b * cols, F(mean) + b, F(rstd) + b);
                 });
      return OkStatus();
    }
    const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
    const float* b = InF32(beta, 0, cols, Scratch(1, cols));
    float* bx = Scratch(2, cols);
    float* by = Scratch(3, cols);
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = OutF32(y, r * cols, by);
      sk::LayerNormForward(InF32(x, r * cols, cols, bx), g, b, 1, cols, yr, F(mean) + r,
                           F(rstd) + r);
      OutDone(y, r * cols, cols, yr);
    }
    return OkStatus();
  }

  Status LayerNormBackward(const OpContext&, const Tensor& x, const Tensor& gamma,
                           const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) override {
    const int64_t cols = gamma.numel();
    const int64_t rows = x.numel() / cols;
    if (IsF32(x) && IsF32(gamma) && IsF32(dy) && IsF32(dx) && IsF32(dgamma) && IsF32(dbeta)) {
      sk::LayerNormBackward(F(x), F(gamma), F(dy), F(mean), F(rstd), rows, cols, F(dx),
                            F(dgamma), F(dbeta));
      return OkStatus();
    }
    const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
    // dgamma and dbeta accumulate in f32 over every row, rounded once.
    float* dg = InF32(dgamma, 0, cols, Scratch(1, cols));
    float* db = InF32(dbeta, 0, cols, Scratch(2, cols));
    float* bx = Scratch(3, cols);
    float* bdy = Scratch(4, cols);
    float* bdx = Scratch(5, cols);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r * cols;
      float* dxr = InF32(dx, o, cols, bdx);
      sk::LayerNormBackward(InF32(x, o, cols, bx), g, InF32(dy, o, cols, bdy), F(mean) + r,
                            F(rstd) + r, 1, cols, dxr, dg, db);
      OutDone(dx, o, cols, dxr);
    }
    OutDone(dgamma, 0, cols, dg);
    OutDone(dbeta, 0, cols, db);
    return OkStatus();
  }

  // The Llama-family ops: rows (or chunks) widened into f32 scratch when
  // 16-bit, the vector loops of simd.h (RMSNorm's row sums in lanes) or
  // math.h's row functions, each 16-bit output rounded once. Rows
  // are independent in forward (ranges of them in parallel); RMSNorm's
  // backward sums dgamma over rows in row order on one thread.
  Status RmsNormForward(const OpContext&, const Tensor& x, const Tensor& gamma, float eps,
                        const Tensor& y, const Tensor& rstd) override {
    const int64_t cols = gamma.numel();
    const int64_t rows = x.numel() / cols;
    SplitRange(rows, std::max<int64_t>(1, kMinPassPart / cols), 1, [&](int64_t b, int64_t e) {
      const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
      float* bx = Scratch(1, cols);
      float* by = Scratch(2, cols);
      for (int64_t r = b; r < e; ++r) {
        float* yr = OutF32(y, r * cols, by);
        simd::RmsNormForward(InF32(x, r * cols, cols, bx), g, 1, cols, eps, yr, F(rstd) + r);
        OutDone(y, r * cols, cols, yr);
      }
    });
    return OkStatus();
  }

  Status RmsNormBackward(const OpContext&, const Tensor& x, const Tensor& gamma, const Tensor& dy,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dgamma) override {
    const int64_t cols = gamma.numel();
    const int64_t rows = x.numel() / cols;
    const float* g = InF32(gamma, 0, cols, Scratch(0, cols));
    float* dg = InF32(dgamma, 0, cols, Scratch(1, cols));  // f32 over every row, rounded once
    float* bx = Scratch(2, cols);
    float* bdy = Scratch(3, cols);
    float* bdx = Scratch(4, cols);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t o = r * cols;
      float* dxr = InF32(dx, o, cols, bdx);
      simd::RmsNormBackward(InF32(x, o, cols, bx), g, InF32(dy, o, cols, bdy), F(rstd) + r, 1,
                            cols, dxr, dg);
      OutDone(dx, o, cols, dxr);
    }
    OutDone(dgamma, 0, cols, dg);
    return OkStatus();
  }

  // RoPE a token row (all its heads) at a time: the row's cos/sin from the
  // cached table (rope_table.h: the bits of the direct computation), or
  // computed for a position outside it, then simd's rotation.
  Status Rope(const OpContext&, const Tensor& x, int64_t seq_len, int64_t heads,
              int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
              const Tensor& y, const Tensor& positions) override {
    const float sign = inverse ? -1.0f : 1.0f;
    const int64_t width = heads * head_dim, half = head_dim / 2;
    const int64_t rows = x.numel() / width;
    const int32_t* pos = positions.defined() ? positions.data_as<int32_t>() : nullptr;
    int64_t covered = std::min(seq_len, rows);  // positions the table must hold
    if (pos != nullptr) {
      int32_t hi = -1;
      for (int64_t r = 0; r < rows; ++r) hi = std::max(hi, pos[r]);
      covered = int64_t{hi} + 1;
    }
    const std::shared_ptr<const RopeTable> table =
        CachedRopeTable(head_dim, theta, scaling, covered);
    const int64_t in_table = table->positions;
    SplitRange(rows, std::max<int64_t>(1, kMinPassPart / width), 1, [&](int64_t b, int64_t e) {
      float* bx = Scratch(0, width);
      float* by = Scratch(1, width);
      float* cs = Scratch(2, head_dim);
      for (int64_t r = b; r < e; ++r) {
        const int64_t p = nn_math::RopePosition(r, seq_len, pos);
        const float* c = cs;
        const float* s = cs + half;
        if (p >= 0 && p < in_table) {
          c = table->cos.data() + p * half;
          s = table->sin.data() + p * half;
        } else {
          RopeCosSinRow(p, head_dim, theta, scaling, cs, cs + half);
        }
        const int64_t o = r * width;
        float* yr = OutF32(y, o, by);
        simd::RopeRotateHeads(InF32(x, o, width, bx), c, s, heads, head_dim, sign, yr);
        OutDone(y, o, width, yr);
      }
    });
    return OkStatus();
  }

  // SwiGLU: f32 and bf16 through simd's loops (bf16 converted in
  // registers); other 16-bit dtypes in f32 chunks.
  Status SwiGluForward(const OpContext&, const Tensor& gate, const Tensor& up,
                       const Tensor& y) override {
    const int64_t n = gate.numel();
    if (IsF32(gate) && IsF32(up) && IsF32(y)) {
      SplitRange(n, kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
        simd::SwiGluForward(F(gate) + b, F(up) + b, e - b, F(y) + b);
      });
      return OkStatus();
    }
    if (AllBf16({&gate, &up, &y})) {
      const BF16* g = gate.data_as<BF16>();
      const BF16* u = up.data_as<BF16>();
      BF16* yo = y.data_as<BF16>();
      SplitRange(n, kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
        simd::SwiGluForwardBf16(g + b, u + b, e - b, yo + b);
      });
      return OkStatus();
    }
    SplitRange(n, kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i += kChunk) {
        const int64_t c = std::min(kChunk, e - i);
        const float* g = InF32(gate, i, c, Scratch(0, c));
        const float* u = InF32(up, i, c, Scratch(1, c));
        float* yo = OutF32(y, i, Scratch(2, c));
        simd::SwiGluForward(g, u, c, yo);
        OutDone(y, i, c, yo);
      }
    });
    return OkStatus();
  }

  Status SwiGluBackward(const OpContext&, const Tensor& gate, const Tensor& up, const Tensor& dy,
                        const Tensor& dgate, const Tensor& dup) override {
    const int64_t n = gate.numel();
    if (IsF32(gate) && IsF32(up) && IsF32(dy) && IsF32(dgate) && IsF32(dup)) {
      SplitRange(n, kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
        simd::SwiGluBackward(F(gate) + b, F(up) + b, F(dy) + b, e - b, F(dgate) + b, F(dup) + b);
      });
      return OkStatus();
    }
    if (AllBf16({&gate, &up, &dy, &dgate, &dup})) {
      const BF16* g = gate.data_as<BF16>();
      const BF16* u = up.data_as<BF16>();
      const BF16* d = dy.data_as<BF16>();
      BF16* dg = dgate.data_as<BF16>();
      BF16* du = dup.data_as<BF16>();
      SplitRange(n, kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
        simd::SwiGluBackwardBf16(g + b, u + b, d + b, e - b, dg + b, du + b);
      });
      return OkStatus();
    }
    SplitRange(n, kMinPassPart, kVectorAlign, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i += kChunk) {
        const int64_t c = std::min(kChunk, e - i);
        const float* g = InF32(gate, i, c, Scratch(0, c));
        const float* u = InF32(up, i, c, Scratch(1, c));
        const float* d = InF32(dy, i, c, Scratch(2, c));
        float* dg = OutF32(dgate, i, Scratch(3, c));
        float* du = OutF32(dup, i, Scratch(4, c));
        simd::SwiGluBackward(g, u, d, c, dg, du);
        OutDone(dgate, i, c, dg);
        OutDone(dup, i, c, du);
      }
    });
    return OkStatus();
  }

  Status AttentionForward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                          const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                          const MatrixRef& out) override {
    if (s.batch == 0 || s.heads == 0 || s.q_len == 0) return OkStatus();
    const int64_t d = s.head_dim, pq = s.q_len * s.kv_len;
    if (IsF32(q.t) && IsF32(k.t) && IsF32(v.t) && IsF32(out.t)) {
      const AttentionSplit split = SplitAttention(s, /*heads_may_split=*/true);
      RunAttentionSplit(split, s, [&](int64_t, const AttentionUnit& a) {
        const int64_t tq = s.q_len, tk = s.kv_len;
        sk::AttentionForward(a.shape, UnitAt(q, a, tq), q.ld, UnitAt(k, a, tk), k.ld,
                             UnitAt(v, a, tk), v.ld, UnitProbs(probs, s, a), UnitAt(out, a, tq),
                             out.ld, KeyStarts(s, a.b0));
      });
      return OkStatus();
    }
    if (AllBF16({&q, &k, &v, &out}) && NativeBf16Attention()) {
      // bf16 GEMM operands (kernels.h: AttentionForwardBF16), split as the
      // f32 kernel; a shape the path declines (every unit alike) falls
      // through to widening.
      std::atomic<bool> declined{false};
      const AttentionSplit split = SplitAttention(s, /*heads_may_split=*/true);
      RunAttentionSplit(split, s, [&](int64_t, const AttentionUnit& a) {
        const int64_t tq = s.q_len, tk = s.kv_len;
        if (!sk::AttentionForwardBF16(a.shape, UnitBF16(q, a, tq), q.ld, UnitBF16(k, a, tk), k.ld,
                                      UnitBF16(v, a, tk), v.ld, UnitProbs(probs, s, a),
                                      UnitBF16(out, a, tq), out.ld, KeyStarts(s, a.b0))) {
          declined = true;
        }
      });
      if (!declined) return OkStatus();
    }
    // One sequence at a time (the f32 kernel's outer loop), its 16-bit
    // operands widened into f32 blocks of the running thread's scratch;
    // ranges of sequences in parallel.
    const int64_t cols = s.heads * d;
    AttentionShape one = s;
    one.batch = 1;
    const AttentionSplit split = SplitAttention(s, /*heads_may_split=*/false);
    RunAttentionSplit(split, s, [&](int64_t, const AttentionUnit& a) {
      float* bq = Scratch(0, s.q_len * cols);
      float* bk = Scratch(1, s.kv_len * cols);
      float* bv = Scratch(2, s.kv_len * cols);
      float* bo = Scratch(3, s.q_len * cols);
      for (int64_t b = a.b0; b < a.b0 + a.shape.batch; ++b) {
        int64_t lq, lk, lv, lo;
        const float* qp = MatIn(q, b * s.q_len, s.q_len, cols, bq, &lq);
        const float* kp = MatIn(k, b * s.kv_len, s.kv_len, cols, bk, &lk);
        const float* vp = MatIn(v, b * s.kv_len, s.kv_len, cols, bv, &lv);
        float* op = MatOut(out, b * s.q_len, bo, cols, &lo);
        sk::AttentionForward(one, qp, lq, kp, lk, vp, lv, F(probs) + b * s.heads * pq, op, lo,
                             KeyStarts(s, b));
        MatDone(out, b * s.q_len, s.q_len, cols, op);
      }
    });
    return OkStatus();
  }

  Status AttentionBackward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                           const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                           const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                           const MatrixRef& dv, const Tensor& scratch) override {
    if (s.batch == 0 || s.heads == 0) return OkStatus();
    const int64_t d = s.head_dim, cols = s.heads * d, pq = s.q_len * s.kv_len;
    const bool all_f32 = IsF32(q.t) && IsF32(k.t) && IsF32(v.t) && IsF32(dout.t) &&
                         IsF32(dq.t) && IsF32(dk.t) && IsF32(dv.t);
    // The kernel's score-gradient scratch: the op's workspace on the calling
    // thread (part 0), a thread's own on the others.
    auto score_scratch = [&](int64_t part) { return part == 0 ? F(scratch) : Scratch(7, pq); };
    if (all_f32) {
      if (s.q_len == 0) {
        // No query attends: the key and value gradients are zero.
        for (const MatrixRef* m : {&dk, &dv}) {
          for (int64_t r = 0; r < s.batch * s.kv_len; ++r) {
            std::memset(At(*m) + r * m->ld, 0, sizeof(float) * cols);
          }
        }
        return OkStatus();
      }
      const AttentionSplit split = SplitAttention(s, /*heads_may_split=*/true);
      RunAttentionSplit(split, s, [&](int64_t p, const AttentionUnit& a) {
        const int64_t tq = s.q_len, tk = s.kv_len;
        sk::AttentionBackward(a.shape, UnitAt(q, a, tq), q.ld, UnitAt(k, a, tk), k.ld,
                              UnitAt(v, a, tk), v.ld, UnitProbs(probs, s, a), UnitAt(dout, a, tq),
                              dout.ld, UnitAt(dq, a, tq), dq.ld, UnitAt(dk, a, tk), dk.ld,
                              UnitAt(dv, a, tk), dv.ld, score_scratch(p));
      });
      return OkStatus();
    }
    if (s.q_len > 0 && AllBF16({&q, &k, &v, &dout, &dq, &dk, &dv}) && NativeBf16Attention()) {
      std::atomic<bool> declined{false};
      const AttentionSplit split = SplitAttention(s, /*heads_may_split=*/true);
      RunAttentionSplit(split, s, [&](int64_t p, const AttentionUnit& a) {
        const int64_t tq = s.q_len, tk = s.kv_len;
        if (!sk::AttentionBackwardBF16(a.shape, UnitBF16(q, a, tq), q.ld, UnitBF16(k, a, tk), k.ld,
                                       UnitBF16(v, a, tk), v.ld, UnitProbs(probs, s, a),
                                       UnitBF16(dout, a, tq), dout.ld, UnitBF16(dq, a, tq), dq.ld,
                                       UnitBF16(dk, a, tk), dk.ld, UnitBF16(dv, a, tk), dv.ld,
                                       score_scratch(p))) {
          declined = true;
        }
      });
      if (!declined) return OkStatus();
    }
    // One sequence at a time, as AttentionForward.
    AttentionShape one = s;
    one.batch = 1;
    const AttentionSplit split = SplitAttention(s, /*heads_may_split=*/false);
    RunAttentionSplit(split, s, [&](int64_t p, const AttentionUnit& a) {
      float* ds = score_scratch(p);
      float* bq = Scratch(0, s.q_len * cols);
      float* bk = Scratch(1, s.kv_len * cols);
      float* bv = Scratch(2, s.kv_len * cols);
      float* bdo = Scratch(3, s.q_len * cols);
      float* bdq = Scratch(4, s.q_len * cols);
      float* bdk = Scratch(5, s.kv_len * cols);
      float* bdv = Scratch(6, s.kv_len * cols);
      for (int64_t b = a.b0; b < a.b0 + a.shape.batch; ++b) {
        const int64_t q0 = b * s.q_len, k0 = b * s.kv_len;
        int64_t lq, lk, lv, ldo, ldq, ldk, ldv;
        float* dkp = MatOut(dk, k0, bdk, cols, &ldk);
        float* dvp = MatOut(dv, k0, bdv, cols, &ldv);
        if (s.q_len == 0) {
          for (int64_t r = 0; r < s.kv_len; ++r) {
            std::memset(dkp + r * ldk, 0, sizeof(float) * cols);
            std::memset(dvp + r * ldv, 0, sizeof(float) * cols);
          }
        } else {
          const float* qp = MatIn(q, q0, s.q_len, cols, bq, &lq);
          const float* kp = MatIn(k, k0, s.kv_len, cols, bk, &lk);
          const float* vp = MatIn(v, k0, s.kv_len, cols, bv, &lv);
          const float* dop = MatIn(dout, q0, s.q_len, cols, bdo, &ldo);
          float* dqp = MatOut(dq, q0, bdq, cols, &ldq);
          sk::AttentionBackward(one, qp, lq, kp, lk, vp, lv, F(probs) + b * s.heads * pq, dop,
                                ldo, dqp, ldq, dkp, ldk, dvp, ldv, ds);
          MatDone(dq, q0, s.q_len, cols, dqp);
        }
        MatDone(dk, k0, s.kv_len, cols, dkp);
        MatDone(dv, k0, s.kv_len, cols, dvp);
      }
    });
    return OkStatus();
  }

  // Linear-memory attention (cpu/flash_attention.h), f32 only: the
  // dispatcher stages 16-bit operands (Native16Bit says false for it).
  bool PrefersFlashAttention(const AttentionShape& s, DType) const override {
    return CpuPrefersFlashAttention(s);
  }
  Status FlashAttentionForward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                               const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                               const Tensor& lse) override {
    SplitFlashUnits(s, [&](int64_t b, int64_t e) {
      sk::FlashAttentionForward(s, At(q), q.ld, At(k), k.ld, At(v), v.ld, At(out), out.ld, F(lse),
                                b, e, KeyStarts(s, 0));
    });
    return OkStatus();
  }

  Status FlashAttentionBackward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                                const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                                const MatrixRef& dk, const MatrixRef& dv,
                                const Tensor& workspace) override {
    SplitFlashUnits(s, [&](int64_t b, int64_t e) {
      sk::FlashAttentionBackward(s, At(q), q.ld, At(k), k.ld, At(v), v.ld, At(out), out.ld,
                                 At(dout), dout.ld, F(lse), At(dq), dq.ld, At(dk), dk.ld, At(dv),
                                 dv.ld, workspace.defined() ? F(workspace) : nullptr, b, e,
                                 KeyStarts(s, 0));
    });
    return OkStatus();
  }

  Status EmbeddingForward(const OpContext&, const Tensor& table, const Tensor& ids,
                          const Tensor& out) override {
    const int64_t dim = table.shape().dim(1);
    if (table.dtype() == out.dtype()) {
      // A row copied as it is: exact in any dtype.
      const size_t row_bytes = DTypeSize(out.dtype()) * static_cast<size_t>(dim);
      const int32_t* id = ids.data_as<int32_t>();
      for (int64_t n = 0; n < ids.numel(); ++n) {
        std::memcpy(Elem(out, n * dim), Elem(table, static_cast<int64_t>(id[n]) * dim), row_bytes);
      }
      return OkStatus();
    }
    float* buf = Scratch(0, dim);
    const int32_t* id = ids.data_as<int32_t>();
    for (int64_t n = 0; n < ids.numel(); ++n) {
      FromF32(InF32(table, static_cast<int64_t>(id[n]) * dim, dim, buf), dim, Elem(out, n * dim),
              out.dtype());
    }
    return OkStatus();
  }

  Status EmbeddingBackward(const OpContext&, const Tensor& ids, const Tensor& dout,
                           const Tensor& dtable) override {
    const int64_t dim = dtable.shape().dim(1);
    if (IsF32(dout)) {
      sk::EmbeddingBackward(ids.data_as<int32_t>(), F(dout), ids.numel(), dim, F(dtable));
      return OkStatus();
    }
    float* buf = Scratch(0, dim);
    const int32_t* id = ids.data_as<int32_t>();
    for (int64_t n = 0; n < ids.numel(); ++n) {
      AddInPlace(F(dtable) + static_cast<int64_t>(id[n]) * dim, InF32(dout, n * dim, dim, buf),
                 dim);
    }
    return OkStatus();
  }

  Status CrossEntropyForward(const OpContext&, const Tensor& logits, const Tensor& targets,
                             const Tensor& loss) override {
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

  Status CrossEntropyBackward(const OpContext&, const Tensor& logits, const Tensor& targets,
                              const Tensor& dlogits, float given_scale) override {
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
  Status CrossEntropyRowLosses(const OpContext&, const Tensor& logits, const Tensor& targets,
                               const Tensor& row_loss) override {
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

  Status CrossEntropyMean(const OpContext&, const Tensor& row_loss, const Tensor& targets,
                          const Tensor& loss) override {
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

  Status SumOfSquares(const OpContext&, const Tensor& x, const Tensor& acc) override {
    double a = *acc.data_as<double>();
    const int64_t n = x.numel();
    if (x.dtype() == DType::kF32) {
      a = simd::SumOfSquares(F(x), n, a);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        double v = LoadAsFloat(x.data(), x.dtype(), i);
        a += v * v;
      }
    }
    *acc.data_as<double>() = a;
    return OkStatus();
  }

  Status MaxAbs(const OpContext&, const Tensor& x, const Tensor& acc) override {
    double a = *acc.data_as<double>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      double v = x.dtype() == DType::kF32 ? static_cast<double>(F(x)[i])
                                          : static_cast<double>(LoadAsFloat(x.data(), x.dtype(), i));
      a = std::max(a, std::fabs(v));
    }
    *acc.data_as<double>() = a;
    return OkStatus();
  }

  Status SgdUpdate(const OpContext&, const SgdHyper& hyper, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum) override {
    float* p = F(param);
    const float* g = F(grad);
    float* m = hyper.momentum == 0.0f ? nullptr : F(momentum);
    SplitElementwise(param.numel(), [&](int64_t b, int64_t e) {
      simd::SgdUpdate(hyper, p + b, g + b, m ? m + b : nullptr, e - b);
    });
    return OkStatus();
  }

  Status AdamUpdate(const OpContext&, const AdamHyper& hyper, const Tensor& param, const Tensor& grad,
                    const Tensor& exp_avg, const Tensor& exp_avg_sq) override {
    float* p = F(param);
    const float* g = F(grad);
    float* m = F(exp_avg);
    float* v = F(exp_avg_sq);
    SplitElementwise(param.numel(), [&](int64_t b, int64_t e) {
      simd::AdamUpdate(hyper, p + b, g + b, m + b, v + b, e - b);
    });
    return OkStatus();
  }

  StatusOr<double> ReadScalar(const OpContext&, const Tensor& t) override {
    return LoadAsDouble(t.data(), t.dtype(), 0);
  }

  Status ReadValues(const OpContext&, const Tensor& t, double* out) override {
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = LoadAsDouble(t.data(), t.dtype(), static_cast<size_t>(i));
    return OkStatus();
  }
};

}  // namespace

Status SetCpuGemmThreads(int n) { return SetGemmThreads(n); }

int64_t SetCpuGemmBlockElementsForTest(int64_t elements) {
  return g_gemm_c_block.exchange(std::max<int64_t>(1, elements));
}


OpBackend* CpuOpBackend() {
  static CpuBackend* backend = new CpuBackend();
  return backend;
}

namespace {

// The backend registers itself for DeviceKind::kCpu when this library is
// loaded (//runtime/ops:cpu is alwayslink): ops run on cpu from main on, and
// the dispatcher includes no backend.
[[maybe_unused]] const bool kRegistered = (RegisterOpBackend(DeviceKind::kCpu, CpuOpBackend()), true);

}  // namespace

}  // namespace sk::ops
