#include "runtime/nn/model_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "runtime/ops/classifier.h"
#include "runtime/ops/cost.h"

namespace sk {
namespace nn_internal {

using ops::GemmParams;
using ops::MatrixRef;
using ops::OpContext;

StatusOr<ops::OpContext> MakeContext(UnitHooks& hooks, Allocator& alloc) {
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(alloc.device()));
  return ops::OpContext{device, hooks.compute_stream(), &alloc};
}

StatusOr<Tensor> NewF32(const ops::OpContext& ctx, int64_t numel) {
  return ctx.alloc->Empty(DType::kF32, Shape{numel});
}

StatusOr<Tensor> NewAct(const ops::OpContext& ctx, DType t, int64_t numel) {
  return ctx.alloc->Empty(t, Shape{numel});
}

StatusOr<Tensor> ZerosF32(const ops::OpContext& ctx, int64_t numel) {
  SK_ASSIGN_OR_RETURN(Tensor t, NewF32(ctx, numel));
  SK_RETURN_IF_ERROR(ops::Fill(ctx, t, 0.0f));
  return t;
}

Tensor Prefix(const Tensor& t, int64_t numel) {
  auto v = t.View(0, t.dtype(), Shape{numel});
  CHECK(v.ok()) << v.status().ToString();
  return *v;
}

StatusOr<Tensor> TokensToDevice(const ops::OpContext& ctx, const std::vector<int32_t>& ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  SK_ASSIGN_OR_RETURN(Tensor host, Tensor::Wrap(const_cast<int32_t*>(ids.data()), DType::kI32,
                                                Shape{n}, DeviceId::Cpu()));
  SK_ASSIGN_OR_RETURN(Tensor dev, ctx.alloc->Empty(DType::kI32, Shape{n}));
  SK_RETURN_IF_ERROR(ops::Copy(ctx, host, dev));
  return dev;
}

std::vector<int32_t> DocumentKeyStarts(const TokenBatch& batch, int64_t* pairs) {
  std::vector<int32_t> start(batch.segment_ids.size());
  for (int64_t b = 0; b < batch.batch_size; ++b) {
    const int64_t row = b * batch.seq_len;
    int32_t first = 0;
    for (int64_t i = 0; i < batch.seq_len; ++i) {
      if (i > 0 && batch.segment_ids[row + i] != batch.segment_ids[row + i - 1]) {
        first = static_cast<int32_t>(i);
      }
      start[row + i] = first;
      *pairs += i - first + 1;
    }
  }
  return start;
}

StatusOr<DocumentTensors> DocumentsToDevice(const ops::OpContext& ctx, const TokenBatch& batch) {
  DocumentTensors d;
  if (!batch.positions.empty()) {
    SK_ASSIGN_OR_RETURN(d.positions, TokensToDevice(ctx, batch.positions));
  }
  if (!batch.segment_ids.empty()) {
    SK_ASSIGN_OR_RETURN(d.key_start,
                        TokensToDevice(ctx, DocumentKeyStarts(batch, &d.masked_pairs)));
  }
  return d;
}

Status ValidateUnitTensors(const UnitSpec& unit, const std::vector<Tensor>& tensors,
                           const char* what, DeviceKind kind) {
  if (tensors.size() != unit.num_tensors()) {
    return InvalidArgumentError(std::string(what) + " of unit '" + unit.name + "' has " +
                                std::to_string(tensors.size()) + " tensors, the unit has " +
                                std::to_string(unit.params.size()) + " parameters" +
                                (unit.tied.empty() ? std::string()
                                                   : " and " + std::to_string(unit.tied.size()) + " tied"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const Shape& shape = UnitTensorShape(unit, i);
    // Named only on an error: this runs for every tensor of every unit in
    // every step.
    auto where = [&] { return std::string(what) + " tensor for '" + UnitTensorName(unit, i) + "'"; };
    if (!t.defined()) return InvalidArgumentError(where() + " is undefined");
    if (t.device().kind != kind) {
      return InvalidArgumentError(where() + " is on " + t.device().ToString() +
                                  ", not on the model's device");
    }
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
      return InvalidArgumentError(where() + " has dtype " + std::string(DTypeName(t.dtype())) +
                                  ", expected f32, bf16 or f16");
    }
    if (t.shape() != shape) {
      return InvalidArgumentError(where() + " has shape " + t.shape().ToString() + ", expected " +
                                  shape.ToString());
    }
  }
  return OkStatus();
}

StatusOr<UnitParams> UnitParams::Make(const ops::OpContext& ctx, const UnitSpec& unit,
                                      const std::vector<Tensor>& tensors) {
  SK_RETURN_IF_ERROR(ValidateUnitTensors(unit, tensors, "parameter", ctx.device->id().kind));
  UnitParams p;
  p.tensors_ = tensors;
  return p;
}

StatusOr<UnitGrads> UnitGrads::Make(const ops::OpContext& ctx, const UnitSpec& unit,
                                    const std::vector<Tensor>& tensors) {
  SK_RETURN_IF_ERROR(ValidateUnitTensors(unit, tensors, "gradient", ctx.device->id().kind));
  UnitGrads g;
  for (const Tensor& t : tensors) {
    g.targets_.push_back(t);
    if (t.dtype() == DType::kF32) {
      g.sinks_.push_back(t);
      continue;
    }
    SK_ASSIGN_OR_RETURN(Tensor s, ctx.alloc->Empty(DType::kF32, t.shape()));
    SK_RETURN_IF_ERROR(ops::Fill(ctx, s, 0.0f));
    g.sinks_.push_back(std::move(s));
  }
  return g;
}

Status UnitGrads::Flush(const ops::OpContext& ctx) {
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (targets_[i].dtype() == DType::kF32) continue;
    SK_RETURN_IF_ERROR(ops::Axpy(ctx, 1.0f, sinks_[i], targets_[i]));
  }
  return OkStatus();
}

Status UnitScope::Named(const Status& s, int u, const char* phase) const {
  if (s.ok()) return s;  // the context is built only for an error (every hook passes here)
  return s.WithContext(std::string(phase) + " of unit '" + units_[u].name + "'");
}

StatusOr<UnitParams> UnitScope::PreForward(int u) {
  auto pt = hooks_.PreForward(u);
  if (!pt.ok()) return Named(pt.status(), u, "PreForward");
  return UnitParams::Make(ctx_, units_[u], *pt);
}

Status UnitScope::PostForward(int u) { return Named(hooks_.PostForward(u), u, "PostForward"); }

StatusOr<UnitScope::Backward> UnitScope::PreBackward(int u) {
  auto bufs = hooks_.PreBackward(u);
  if (!bufs.ok()) return Named(bufs.status(), u, "PreBackward");
  SK_ASSIGN_OR_RETURN(UnitParams p, UnitParams::Make(ctx_, units_[u], bufs->params));
  SK_ASSIGN_OR_RETURN(UnitGrads g, UnitGrads::Make(ctx_, units_[u], bufs->grads));
  return Backward{std::move(p), std::move(g)};
}

StatusOr<UnitScope::Backward> UnitScope::PreBackwardGradientsOnly(int u) {
  auto bufs = hooks_.PreBackward(u);
  if (!bufs.ok()) return Named(bufs.status(), u, "PreBackward");
  SK_RETURN_IF_ERROR(
      ValidateUnitTensors(units_[u], bufs->params, "parameter", ctx_.device->id().kind));
  SK_ASSIGN_OR_RETURN(UnitGrads g, UnitGrads::Make(ctx_, units_[u], bufs->grads));
  return Backward{UnitParams(), std::move(g)};
}

Status UnitScope::PostBackward(int u, Backward* b) {
  SK_RETURN_IF_ERROR(Named(b->g.Flush(ctx_), u, "PostBackward"));
  return Named(hooks_.PostBackward(u), u, "PostBackward");
}

// w itself when it has dtype t; otherwise a copy cast to t from ctx.alloc
// (weights whose dtype differs from the activations', e.g. f32 parameters
// under a 16-bit compute dtype: a GEMM takes A and B of one dtype).
StatusOr<Tensor> InDType(const OpContext& ctx, const Tensor& w, DType t) {
  if (w.dtype() == t) return w;
  SK_ASSIGN_OR_RETURN(Tensor c, ctx.alloc->Empty(t, w.shape()));
  SK_RETURN_IF_ERROR(ops::Cast(ctx, w, c));
  return c;
}

// y[rows, out] = x[rows, in] w[in, out] (+ bias[out]): the bias is added to
// the product's f32 accumulation and rounded once with it when y is 16-bit
// (ops::GemmBias: writing the bias into y and accumulating, up to f32
// summation order).
Status Linear(const OpContext& ctx, const Tensor& x, const Tensor& w_in, const Tensor& bias,
              int64_t rows, int64_t in, int64_t out, const Tensor& y) {
  SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, x.dtype()));
  GemmParams p;
  p.m = rows, p.n = out, p.k = in;
  if (bias.defined()) {
    return ops::GemmBias(ctx, p, MatrixRef{x, 0, in}, MatrixRef{w, 0, out}, bias,
                         MatrixRef{y, 0, out});
  }
  return ops::Gemm(ctx, p, MatrixRef{x, 0, in}, MatrixRef{w, 0, out}, MatrixRef{y, 0, out});
}

// y[rows, out] = x[rows, in] w[in, out] + bias[out] + residual[rows, out]:
// a sublayer's output projection and its residual connection, summed in f32
// and rounded once into a 16-bit y (ops::GemmBiasResidual: one GEMM where the
// backend fuses the residual as its beta = 1 term; else GemmBias, Axpy and
// Cast through an f32 temporary).
Status LinearResidual(const OpContext& ctx, const Tensor& x, const Tensor& w_in,
                      const Tensor& bias, const Tensor& residual, int64_t rows, int64_t in,
                      int64_t out, const Tensor& y) {
  SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, x.dtype()));
  GemmParams p;
  p.m = rows, p.n = out, p.k = in;
  return ops::GemmBiasResidual(ctx, p, MatrixRef{x, 0, in}, MatrixRef{w, 0, out}, bias, residual,
                               MatrixRef{y, 0, out});
}

// Given dy[rows, out]: dw += x^T dy, dbias += column sums of dy (if defined),
// and dx = dy w^T, overwritten or (accumulate_dx) added (if defined).
Status LinearBackward(const OpContext& ctx, const Tensor& x, const Tensor& w_in, const Tensor& dy,
                      int64_t rows, int64_t in, int64_t out, const Tensor& dx, bool accumulate_dx,
                      const Tensor& dw, const Tensor& dbias) {
  if (dx.defined()) {
    SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, dy.dtype()));
    GemmParams p;
    p.trans_b = true;
    p.m = rows, p.n = in, p.k = out;
    p.beta = accumulate_dx ? 1.0f : 0.0f;
    SK_RETURN_IF_ERROR(
        ops::Gemm(ctx, p, MatrixRef{dy, 0, out}, MatrixRef{w, 0, out}, MatrixRef{dx, 0, in}));
  }
  GemmParams p;
  p.trans_a = true;
  p.m = in, p.n = out, p.k = rows;
  p.beta = 1.0f;
  SK_RETURN_IF_ERROR(
      ops::Gemm(ctx, p, MatrixRef{x, 0, in}, MatrixRef{dy, 0, out}, MatrixRef{dw, 0, out}));
  if (dbias.defined()) SK_RETURN_IF_ERROR(ops::BiasGrad(ctx, dy, dbias));
  return OkStatus();
}

int64_t HeadBackwardPeakBytes(int64_t rows, int64_t d_model, int64_t vocab, DType storage,
                              int stats) {
  const int64_t a = static_cast<int64_t>(DTypeSize(storage));
  const ops::ClassifierShape cs{rows, d_model, vocab};
  // The saved output and its statistics, dL/dln, then the classifier's
  // workspace or, after it, dx.
  return 2 * a * rows * d_model + 4 * stats * rows +
         std::max(ops::ClassifierWorkspaceBytes(cs, storage, storage), a * rows * d_model);
}

float GradScale(const TokenBatch& batch) {
  return batch.loss_denominator > 0 ? static_cast<float>(1.0 / batch.loss_denominator) : 0.0f;
}

float ClassifierGradScale(const TokenBatch& batch) {
  if (const float s = GradScale(batch); s > 0.0f) return s;
  int64_t count = 0;
  for (int32_t t : batch.targets) count += t != kIgnoreTarget;
  return count == 0 ? 1.0f : 1.0f / static_cast<float>(count);
}

Status ValidateLossDenominator(const TokenBatch& batch) {
  if (!(batch.loss_denominator >= 0) || !std::isfinite(batch.loss_denominator) ||
      (batch.loss_denominator > 0 && !std::isfinite(1.0f / static_cast<float>(batch.loss_denominator)))) {
    return InvalidArgumentError("batch.loss_denominator must be finite and >= 0 (0: the batch's own "
                                "count of targets), got " + std::to_string(batch.loss_denominator));
  }
  return OkStatus();
}

Status CheckProduct(int64_t rows, int64_t cols, const char* what) {
  if (rows > std::numeric_limits<int64_t>::max() / cols) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " overflows int64");
  }
  return OkStatus();
}

Status Positive(int64_t v, const std::string& model, const char* field) {
  if (v <= 0) {
    return InvalidArgumentError("config '" + model + "': " + field + " must be positive, got " +
                                std::to_string(v));
  }
  return OkStatus();
}

Status AtMost(int64_t v, int64_t max, const std::string& model, const char* field) {
  if (v > max) {
    return InvalidArgumentError("config '" + model + "': " + field + " is " + std::to_string(v) +
                                ", more than the bound " + std::to_string(max) +
                                " (shardkit's limit on a model's shape, far beyond any trained model's)");
  }
  return OkStatus();
}

Status CheckParameterCount(const std::string& model, __int128 count) {
  if (count > kMaxParameters) {
    const double approx = static_cast<double>(count);
    char text[32];
    std::snprintf(text, sizeof(text), "%.3g", approx);
    return InvalidArgumentError("config '" + model + "': the shape has about " + text +
                                " parameters, more than the bound 2^48 (" + std::to_string(kMaxParameters) + ")");
  }
  return OkStatus();
}

Status ValidateWidthAndVocab(const std::string& model, int64_t d_model, int64_t n_head,
                             int64_t vocab_size) {
  if (d_model % n_head != 0) {
    return InvalidArgumentError("config '" + model + "': d_model " + std::to_string(d_model) +
                                " is not a multiple of n_head " + std::to_string(n_head));
  }
  if (vocab_size > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError("config '" + model + "': vocab_size does not fit int32 token ids");
  }
  return OkStatus();
}

Status ValidateComputeDType(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return InvalidArgumentError("compute_dtype must be f32, bf16 or f16, got " +
                                std::string(DTypeName(dtype)));
  }
  return OkStatus();
}

Status ValidateTokens(const std::vector<int32_t>& ids, int64_t expected_count, int64_t vocab,
                      bool allow_ignore, const char* field) {
  if (static_cast<int64_t>(ids.size()) != expected_count) {
    return InvalidArgumentError(std::string("batch.") + field + " has " +
                                std::to_string(ids.size()) + " ids, expected " +
                                std::to_string(expected_count));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (allow_ignore && ids[i] == kIgnoreTarget) continue;
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgumentError(std::string("batch.") + field + "[" + std::to_string(i) +
                                  "] = " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
    }
  }
  return OkStatus();
}

Status ValidateDecoderBatch(const TokenBatch& batch, const std::string& model, int64_t max_seq_len,
                            int64_t vocab_size) {
  if (batch.batch_size <= 0) return InvalidArgumentError("batch.batch_size must be positive");
  if (batch.seq_len <= 0 || batch.seq_len > max_seq_len) {
    return InvalidArgumentError("batch.seq_len " + std::to_string(batch.seq_len) + " is outside [1, " +
                                std::to_string(max_seq_len) + "] of model '" + model + "'");
  }
  if (batch.source_len != 0 || !batch.source.empty()) {
    return InvalidArgumentError("batch.source is set, but '" + model + "' is a decoder-only model");
  }
  SK_RETURN_IF_ERROR(CheckProduct(batch.batch_size, batch.seq_len, "batch tokens"));
  SK_RETURN_IF_ERROR(ValidateLossDenominator(batch));
  const int64_t n = batch.batch_size * batch.seq_len;
  SK_RETURN_IF_ERROR(ValidateTokens(batch.inputs, n, vocab_size, false, "inputs"));
  SK_RETURN_IF_ERROR(ValidateTokens(batch.targets, n, vocab_size, true, "targets"));
  if (!batch.positions.empty()) {
    // (Position ids index the learned table or turn RoPE: the configured
    // maximum bounds both.)
    if (static_cast<int64_t>(batch.positions.size()) != n) {
      return InvalidArgumentError("batch.positions has " + std::to_string(batch.positions.size()) +
                                  " ids, expected " + std::to_string(n));
    }
    for (size_t i = 0; i < batch.positions.size(); ++i) {
      if (batch.positions[i] < 0 || batch.positions[i] >= max_seq_len) {
        return InvalidArgumentError("batch.positions[" + std::to_string(i) + "] = " +
                                    std::to_string(batch.positions[i]) + " is outside [0, " +
                                    std::to_string(max_seq_len) + ") (max_seq_len of '" + model +
                                    "')");
      }
    }
  }
  if (!batch.segment_ids.empty()) {
    if (static_cast<int64_t>(batch.segment_ids.size()) != n) {
      return InvalidArgumentError("batch.segment_ids has " + std::to_string(batch.segment_ids.size()) +
                                  " ids, expected " + std::to_string(n));
    }
    for (int64_t b = 0; b < batch.batch_size; ++b) {
      for (int64_t i = 1; i < batch.seq_len; ++i) {
        const int64_t at = b * batch.seq_len + i;
        if (batch.segment_ids[at] < batch.segment_ids[at - 1]) {
          return InvalidArgumentError(
              "batch.segment_ids decrease in row " + std::to_string(b) + " at position " +
              std::to_string(i) + " (" + std::to_string(batch.segment_ids[at - 1]) + " then " +
              std::to_string(batch.segment_ids[at]) +
              "): a row's documents must be contiguous runs of non-decreasing ids");
        }
      }
    }
  }
  return OkStatus();
}

}  // namespace nn_internal
}  // namespace sk
