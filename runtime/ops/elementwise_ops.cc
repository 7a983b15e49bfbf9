// The elementwise model ops of ops.h: bias (BroadcastRows, BiasAdd,
// BiasGrad), GELU, rotary embeddings (RoPE, ValidateRopeScaling) and
// SwiGLU, forward and backward. The shared dispatch: dispatch.h.
#include "runtime/ops/ops.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "runtime/ops/dispatch.h"

namespace sk::ops {

// ---- Bias ---------------------------------------------------------------------

Status BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst) {
  const char* op = "broadcast_rows";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "src", src, "dst", dst));
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, "dst", dst.numel(), src.numel(), &rows));
  if (Overlap(src, dst)) return Bad(op, "src and dst overlap");
  const OpCost cost = BroadcastRowsCost(rows, src.numel(), dst.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor s, st.In(src));
    SK_ASSIGN_OR_RETURN(Tensor d, st.Out(dst));
    return be->BroadcastRows(ctx, s, d);
  });
}

Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y) {
  const char* op = "bias_add";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "bias", bias, "y", y));
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, "y", y.numel(), bias.numel(), &rows));
  if (Overlap(bias, y)) return Bad(op, "bias and y overlap");
  const OpCost cost = BiasAddCost(rows, bias.numel(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor b, st.In(bias));
    SK_ASSIGN_OR_RETURN(Tensor w, st.InOut(y));
    return be->BiasAdd(ctx, b, w);
  });
}

Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias) {
  const char* op = "bias_grad";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "dy", dy, "dbias", dbias));
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, "dy", dy.numel(), dbias.numel(), &rows));
  if (Overlap(dy, dbias)) return Bad(op, "dy and dbias overlap");
  const OpCost cost = BiasGradCost(rows, dbias.numel(), dy.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor d, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor g, st.InOut(dbias));
    return be->BiasGrad(ctx, d, g);
  });
}

// ---- GELU ---------------------------------------------------------------------

Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y) {
  const char* op = "gelu_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "y", y));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, x.numel()));
  if (Same(x, y) ? x.dtype() != y.dtype() : Overlap(x, y)) return Bad(op, "x and y overlap");
  const OpCost cost = GeluForwardCost(x.numel(), x.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->GeluForward(ctx, wx, wy);
  });
}

Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const char* op = "gelu_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "x", x, "dy", dy, "dx", dx));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dy", dy, x.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "dx", dx, x.numel()));
  if (Overlap(dx, x) || (Same(dx, dy) ? dx.dtype() != dy.dtype() : Overlap(dx, dy))) {
    return Bad(op, "dx overlaps an input");
  }
  const OpCost cost = GeluBackwardCost(x.numel(), x.dtype(), dx.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdx, st.Out(dx));
    return be->GeluBackward(ctx, wx, wdy, wdx);
  });
}

// ---- Rotary position embeddings (RoPE) -----------------------------------------

namespace {

// RopeForward and RopeBackward: x -> y rotated by plus or minus the angle.
Status Rope(const char* op, const OpContext& ctx, const Tensor& x, int64_t seq_len,
            int64_t heads, int64_t head_dim, float theta, const RopeScaling& scaling,
            bool inverse, const Tensor& y, const Tensor& positions) {
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  const char* in = inverse ? "dy" : "x";
  SK_RETURN_IF_ERROR(CheckTensor(op, in, ctx, x));
  SK_RETURN_IF_ERROR(CheckTensor(op, inverse ? "dx" : "y", ctx, y));
  if (seq_len <= 0) return Bad(op, "seq_len must be positive, got " + N(seq_len));
  if (heads <= 0) return Bad(op, "heads must be positive, got " + N(heads));
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return Bad(op, "head_dim must be positive and even, got " + N(head_dim));
  }
  if (!(theta > 0.0f)) return Bad(op, "theta must be positive, got " + std::to_string(theta));
  SK_RETURN_IF_ERROR(ValidateRopeScaling(scaling).WithContext(op));
  if (heads > std::numeric_limits<int64_t>::max() / head_dim) {
    return Bad(op, "heads=" + N(heads) + " x head_dim=" + N(head_dim) + " overflows int64");
  }
  int64_t rows = 0;
  SK_RETURN_IF_ERROR(RowsOf(op, in, x.numel(), heads * head_dim, &rows));
  if (rows % seq_len != 0) {
    return Bad(op, std::string(in) + " has " + N(rows) + " rows, not a multiple of seq_len " +
                       N(seq_len));
  }
  SK_RETURN_IF_ERROR(CheckNumel(op, inverse ? "dx" : "y", y, x.numel()));
  if (Same(x, y) ? x.dtype() != y.dtype() : Overlap(x, y)) return Bad(op, "input and output overlap");
  if (positions.defined()) {
    SK_RETURN_IF_ERROR(CheckTensor(op, "positions", ctx, positions, {DType::kI32}));
    SK_RETURN_IF_ERROR(CheckNumel(op, "positions", positions, rows));
    if (Overlap(positions, y)) return Bad(op, "positions overlap the output");
  }
  const OpCost cost = RopeCost(x.numel(), x.dtype(), y.dtype(), inverse);
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wx, st.In(x));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->Rope(ctx, wx, seq_len, heads, head_dim, theta, scaling, inverse, wy, positions);
  });
}

}  // namespace

Status RopeForward(const OpContext& ctx, const Tensor& x, int64_t seq_len, int64_t heads,
                   int64_t head_dim, float theta, const RopeScaling& scaling, const Tensor& y,
                   const Tensor& positions) {
  return Rope("rope_fwd", ctx, x, seq_len, heads, head_dim, theta, scaling, false, y, positions);
}

Status RopeBackward(const OpContext& ctx, const Tensor& dy, int64_t seq_len, int64_t heads,
                    int64_t head_dim, float theta, const RopeScaling& scaling, const Tensor& dx,
                    const Tensor& positions) {
  return Rope("rope_bwd", ctx, dy, seq_len, heads, head_dim, theta, scaling, true, dx, positions);
}

Status ValidateRopeScaling(const RopeScaling& s) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(std::string("rope scaling '") + RopeScalingTypeName(s.type) + "': " + why);
  };
  auto positive = [](float v) { return v > 0.0f && std::isfinite(v); };
  switch (s.type) {
    case RopeScalingType::kNone: return OkStatus();
    case RopeScalingType::kLinear:
      if (!positive(s.factor)) return bad("factor must be a positive number, got " + std::to_string(s.factor));
      return OkStatus();
    case RopeScalingType::kLlama3:
      if (!positive(s.factor)) return bad("factor must be a positive number, got " + std::to_string(s.factor));
      if (!positive(s.low_freq_factor)) {
        return bad("low_freq_factor must be a positive number, got " + std::to_string(s.low_freq_factor));
      }
      if (!(positive(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor)) {
        return bad("high_freq_factor must be a number above low_freq_factor " +
                   std::to_string(s.low_freq_factor) + ", got " + std::to_string(s.high_freq_factor));
      }
      if (s.original_max_positions <= 0) {
        return bad("original_max_positions must be positive, got " +
                   std::to_string(s.original_max_positions));
      }
      return OkStatus();
  }
  return InvalidArgumentError("rope scaling type " + std::to_string(static_cast<int32_t>(s.type)) +
                              " is not one of default (0), linear (1), llama3 (2)");
}

// ---- SwiGLU -------------------------------------------------------------------

Status SwiGluForward(const OpContext& ctx, const Tensor& gate, const Tensor& up, const Tensor& y) {
  const char* op = "swiglu_fwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  SK_RETURN_IF_ERROR(CheckTensors(op, ctx, "gate", gate, "up", up, "y", y));
  SK_RETURN_IF_ERROR(CheckNumel(op, "up", up, gate.numel()));
  SK_RETURN_IF_ERROR(CheckNumel(op, "y", y, gate.numel()));
  if (Overlap(y, gate) || Overlap(y, up)) return Bad(op, "y overlaps an input");
  const OpCost cost = SwiGluForwardCost(gate.numel(), gate.dtype(), y.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gate));
    SK_ASSIGN_OR_RETURN(Tensor wu, st.In(up));
    SK_ASSIGN_OR_RETURN(Tensor wy, st.Out(y));
    return be->SwiGluForward(ctx, wg, wu, wy);
  });
}

Status SwiGluBackward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                      const Tensor& dy, const Tensor& dgate, const Tensor& dup) {
  const char* op = "swiglu_bwd";
  SK_ASSIGN_OR_RETURN(OpBackend * be, Resolve(op, ctx));
  for (auto [what, t] : {std::pair<const char*, const Tensor*>{"gate", &gate}, {"up", &up},
                         {"dy", &dy}, {"dgate", &dgate}, {"dup", &dup}}) {
    SK_RETURN_IF_ERROR(CheckTensor(op, what, ctx, *t));
    SK_RETURN_IF_ERROR(CheckNumel(op, what, *t, gate.numel()));
  }
  if (AnyOverlap({&dgate, &dup}, {&gate, &up, &dy})) return Bad(op, "an output overlaps an input");
  if (Overlap(dgate, dup)) return Bad(op, "dgate overlaps dup");
  const OpCost cost = SwiGluBackwardCost(gate.numel(), gate.dtype(), dgate.dtype());
  return DispatchStaged(be, ctx, op, cost, [&](F32Staging& st) -> Status {
    SK_ASSIGN_OR_RETURN(Tensor wg, st.In(gate));
    SK_ASSIGN_OR_RETURN(Tensor wu, st.In(up));
    SK_ASSIGN_OR_RETURN(Tensor wdy, st.In(dy));
    SK_ASSIGN_OR_RETURN(Tensor wdg, st.Out(dgate));
    SK_ASSIGN_OR_RETURN(Tensor wdu, st.Out(dup));
    return be->SwiGluBackward(ctx, wg, wu, wdy, wdg, wdu);
  });
}

}  // namespace sk::ops
