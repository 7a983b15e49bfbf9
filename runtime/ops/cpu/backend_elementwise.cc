// The CPU backend's bias, GELU, RoPE and SwiGLU ops (backend_common.h).

#include <cstring>
#include <initializer_list>
#include <vector>

#include "runtime/ops/cpu/backend_common.h"
#include "runtime/ops/cpu/rope_table.h"
#include "runtime/ops/math.h"

namespace sk::ops {

namespace {

bool AllBf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->dtype() != DType::kBF16) return false;
  }
  return true;
}

}  // namespace

Status CpuBackend::BroadcastRows(const OpContext&, const Tensor& src, const Tensor& dst) {
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

Status CpuBackend::BiasAdd(const OpContext&, const Tensor& bias, const Tensor& y) {
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

Status CpuBackend::BiasGrad(const OpContext&, const Tensor& dy, const Tensor& dbias) {
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

Status CpuBackend::GeluForward(const OpContext&, const Tensor& x, const Tensor& y) {
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

Status CpuBackend::GeluBackward(const OpContext&, const Tensor& x, const Tensor& dy,
                                const Tensor& dx) {
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

// RoPE a token row (all its heads) at a time: the row's cos/sin from the
// cached table (rope_table.h: the bits of the direct computation), or
// computed for a position outside it, then simd's rotation.
Status CpuBackend::Rope(const OpContext&, const Tensor& x, int64_t seq_len, int64_t heads,
                        int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
                        const Tensor& y, const Tensor& positions) {
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
      const int64_t p = math::RopePosition(r, seq_len, pos);
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
Status CpuBackend::SwiGluForward(const OpContext&, const Tensor& gate, const Tensor& up,
                                 const Tensor& y) {
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

Status CpuBackend::SwiGluBackward(const OpContext&, const Tensor& gate, const Tensor& up, const Tensor& dy,
                                  const Tensor& dgate, const Tensor& dup) {
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

}  // namespace sk::ops
