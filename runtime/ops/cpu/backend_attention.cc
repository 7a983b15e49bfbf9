// The CPU backend's attention (backend_common.h): the composed attention
// (probabilities kept) and attention in linear memory (flash_attention.h), each
// spread over the intra-op threads in units whose bits do not depend on the split.

#include <algorithm>
#include <initializer_list>

#include "runtime/ops/cpu/backend_common.h"
#include "runtime/ops/cpu/flash_attention.h"

namespace sk::ops {

namespace {

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


bool AllBF16(std::initializer_list<const MatrixRef*> ms) {
  return std::all_of(ms.begin(), ms.end(),
                     [](const MatrixRef* m) { return m->t.dtype() == DType::kBF16; });
}
// Unit a's block of a bf16 attention operand, as UnitAt.
BF16* UnitBF16(const MatrixRef& m, const AttentionUnit& a, int64_t len) {
  return m.t.data_as<BF16>() + m.offset + a.b0 * len * m.ld + a.h0 * a.shape.head_dim;
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

}  // namespace

Status CpuBackend::AttentionForward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                                    const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                                    const MatrixRef& out) {
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

Status CpuBackend::AttentionBackward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                                     const MatrixRef& k, const MatrixRef& v, const Tensor& probs,
                                     const MatrixRef& dout, const MatrixRef& dq, const MatrixRef& dk,
                                     const MatrixRef& dv, const Tensor& scratch) {
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

Status CpuBackend::FlashAttentionForward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                                         const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                         const Tensor& lse) {
  SplitFlashUnits(s, [&](int64_t b, int64_t e) {
    sk::FlashAttentionForward(s, At(q), q.ld, At(k), k.ld, At(v), v.ld, At(out), out.ld, F(lse),
                              b, e, KeyStarts(s, 0));
  });
  return OkStatus();
}

Status CpuBackend::FlashAttentionBackward(const OpContext&, const AttentionShape& s, const MatrixRef& q,
                                          const MatrixRef& k, const MatrixRef& v, const MatrixRef& out,
                                          const MatrixRef& dout, const Tensor& lse, const MatrixRef& dq,
                                          const MatrixRef& dk, const MatrixRef& dv,
                                          const Tensor& workspace) {
  SplitFlashUnits(s, [&](int64_t b, int64_t e) {
    sk::FlashAttentionBackward(s, At(q), q.ld, At(k), k.ld, At(v), v.ld, At(out), out.ld,
                               At(dout), dout.ld, F(lse), At(dq), dq.ld, At(dk), dk.ld, At(dv),
                               dv.ld, workspace.defined() ? F(workspace) : nullptr, b, e,
                               KeyStarts(s, 0));
  });
  return OkStatus();
}

}  // namespace sk::ops
