#include "runtime/ops/classifier.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace sk::ops {
namespace {

Status Bad(const std::string& what) { return InvalidArgumentError("classifier: " + what); }

// Elements [first, first + count) of t as a tensor of their own.
StatusOr<Tensor> Rows(const Tensor& t, int64_t first, int64_t count, int64_t width) {
  return t.View(static_cast<size_t>(first * width) * DTypeSize(t.dtype()), t.dtype(),
                Shape{count * width});
}

// The rows of one chunk as Classifier runs `s` (its chunk_rows, else
// ClassifierChunkRows), for the op and its workspace count alike.
int64_t ChunkRowsOf(const ClassifierShape& s) {
  return s.chunk_rows > 0 ? std::min(s.chunk_rows, s.rows) : ClassifierChunkRows(s.rows, s.d_model, s.vocab);
}

}  // namespace

int64_t ClassifierChunkRows(int64_t rows, int64_t d_model, int64_t vocab) {
  if (rows <= kMinClassifierChunkRows || d_model <= 0 || vocab <= d_model) {
    return std::max<int64_t>(rows, 1);
  }
  const int64_t parts = (vocab + d_model - 1) / d_model;
  const int64_t per_part = (rows + parts - 1) / parts;
  int64_t chunk = kMinClassifierChunkRows;
  while (chunk < per_part) chunk *= 2;
  return std::min(chunk, rows);
}

int64_t ClassifierWorkspaceBytes(const ClassifierShape& s, DType x, DType weight) {
  const int64_t chunk = ChunkRowsOf(s);
  int64_t bytes = 4 * s.rows + chunk * s.vocab * static_cast<int64_t>(DTypeSize(x));
  if (weight != x) bytes += s.d_model * s.vocab * static_cast<int64_t>(DTypeSize(x));
  return bytes;
}

Status Classifier(const OpContext& ctx, const ClassifierShape& s, const Tensor& x,
                  const Tensor& w_in, const Tensor& targets, const Tensor& loss, const Tensor& dx,
                  const Tensor& dw, float grad_scale) {
  const int64_t rows = s.rows, c = s.d_model, v = s.vocab;
  if (rows < 0 || c <= 0 || v <= 0 || s.chunk_rows < 0) {
    return Bad("shape rows " + std::to_string(rows) + ", d_model " + std::to_string(c) + ", vocab " +
               std::to_string(v) + ", chunk_rows " + std::to_string(s.chunk_rows) +
               " (rows >= 0, d_model and vocab > 0, chunk_rows >= 0)");
  }
  if (x.numel() != rows * c) return Bad("x has " + std::to_string(x.numel()) + " elements, not rows x d_model");
  if (w_in.numel() != c * v) return Bad("w has " + std::to_string(w_in.numel()) + " elements, not d_model x vocab");
  if (targets.numel() != rows) return Bad("targets have " + std::to_string(targets.numel()) + " elements, not rows");
  const bool grad = dx.defined();
  if (grad != dw.defined()) return Bad("dx and dw go together (both defined for gradients, or neither)");
  if (grad) {
    if (dx.numel() != rows * c || dx.dtype() != x.dtype()) return Bad("dx must be x's shape and dtype");
    if (dw.numel() != c * v) return Bad("dw must be w's shape");
    if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale)) {
      return Bad("grad_scale must be finite and > 0 (the factor per counted row), got " +
                 std::to_string(grad_scale));
    }
  }
  // The weight in the compute dtype, once for every chunk (free where the
  // gathered weight already is: the mixed-precision rule).
  Tensor w = w_in;
  if (w_in.dtype() != x.dtype()) {
    SK_ASSIGN_OR_RETURN(w, ctx.alloc->Empty(x.dtype(), w_in.shape()));
    SK_RETURN_IF_ERROR(Cast(ctx, w_in, w));
  }
  SK_ASSIGN_OR_RETURN(Tensor row_loss, ctx.alloc->Empty(DType::kF32, Shape{rows}));
  const int64_t chunk = ChunkRowsOf(s);  // rows > 0: at least 1
  Tensor logits_buffer;
  if (rows > 0) {
    SK_ASSIGN_OR_RETURN(logits_buffer, ctx.alloc->Empty(x.dtype(), Shape{chunk * v}));
  }
  // The weight as the GEMMs read it: [c, v] (ld v) or, transposed, [v, c] (ld c).
  const MatrixRef wm{w, 0, s.transposed_weight ? c : v};
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    SK_ASSIGN_OR_RETURN(Tensor logits, Rows(logits_buffer, 0, n, v));
    SK_ASSIGN_OR_RETURN(Tensor t, Rows(targets, r0, n, 1));
    SK_ASSIGN_OR_RETURN(Tensor l, Rows(row_loss, r0, n, 1));
    const MatrixRef xm{x, r0 * c, c};
    const MatrixRef lm{logits, 0, v};
    // logits = x w (or x w^T), in x's dtype.
    GemmParams fwd;
    fwd.trans_b = s.transposed_weight;
    fwd.m = n, fwd.n = v, fwd.k = c;
    SK_RETURN_IF_ERROR(Gemm(ctx, fwd, xm, wm, lm));
    SK_RETURN_IF_ERROR(CrossEntropyRowLosses(ctx, logits, t, l));
    if (!grad) continue;
    // The gradient overwrites the chunk's logits: read by the GEMMs below.
    SK_RETURN_IF_ERROR(CrossEntropyBackward(ctx, logits, t, logits, grad_scale));
    // dx rows = dlogits w^T (or dlogits w).
    GemmParams dxp;
    dxp.trans_b = !s.transposed_weight;
    dxp.m = n, dxp.n = c, dxp.k = v;
    SK_RETURN_IF_ERROR(Gemm(ctx, dxp, lm, wm, MatrixRef{dx, r0 * c, c}));
    // dw += x^T dlogits [c, v], or dlogits^T x [v, c] for a transposed weight.
    GemmParams dwp;
    dwp.trans_a = true;
    dwp.k = n;
    dwp.beta = 1.0f;
    if (s.transposed_weight) {
      dwp.m = v, dwp.n = c;
      SK_RETURN_IF_ERROR(Gemm(ctx, dwp, lm, xm, MatrixRef{dw, 0, c}));
    } else {
      dwp.m = c, dwp.n = v;
      SK_RETURN_IF_ERROR(Gemm(ctx, dwp, xm, lm, MatrixRef{dw, 0, v}));
    }
  }
  return CrossEntropyMean(ctx, row_loss, targets, loss);
}

}  // namespace sk::ops
