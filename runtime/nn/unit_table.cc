#include "runtime/nn/unit_table.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace sk {

using nn_internal::BlockDims;
using nn_internal::BlockSaved;
using nn_internal::NewAct;
using nn_internal::NewF32;
using nn_internal::Positive;
using nn_internal::Prefix;
using nn_internal::SublayerKind;
using nn_internal::UnitGrads;
using nn_internal::UnitParams;
using nn_internal::UnitScope;
using ops::GemmParams;
using ops::MatrixRef;
using ops::OpContext;

namespace {

// One convolution at one batch size: the implicit GEMM's dimensions.
struct ConvGeom {
  int64_t batch = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t cin = 0, cout = 0, k = 1, s = 1, p = 0, g = 1;

  int64_t taps() const { return k * k; }
  int64_t in_rows() const { return batch * in_h * in_w; }
  int64_t m() const { return batch * out_h * out_w; }
  int64_t kg() const { return taps() * cin / g; }
  int64_t ng() const { return cout / g; }
  // Multiplies its input directly: no patches to gather.
  bool direct() const { return k == 1 && s == 1 && p == 0 && g == 1; }
  auto key() const { return std::make_tuple(batch, in_h, in_w, cin, k, s, p, g); }
};

int64_t OutSize(int64_t in, int64_t k, int64_t s, int64_t p) { return (in + 2 * p - k) / s + 1; }

ConvGeom Geom(const ConvLayerSpec& c, int64_t batch, int64_t in_h, int64_t in_w) {
  ConvGeom g;
  g.batch = batch;
  g.in_h = in_h;
  g.in_w = in_w;
  g.cin = c.in_channels;
  g.cout = c.out_channels;
  g.k = c.kernel;
  g.s = c.stride;
  g.p = c.pad();
  g.g = c.groups;
  g.out_h = OutSize(in_h, g.k, g.s, g.p);
  g.out_w = OutSize(in_w, g.k, g.s, g.p);
  return g;
}

// A view of `numel` elements of t starting at element `offset`, shaped
// `shape` (CHECKed: the callers' sizes come from validated geometry).
Tensor ViewAt(const Tensor& t, int64_t offset, Shape shape) {
  auto v = t.View(static_cast<size_t>(offset) * DTypeSize(t.dtype()), t.dtype(), std::move(shape));
  CHECK(v.ok()) << v.status().ToString();
  return *v;
}

// An activation of `rows` rows of `cols` in dtype t, plus (padded) one
// zeroed row that padding taps gather from.
StatusOr<Tensor> NewRows(const OpContext& ctx, DType t, int64_t rows, int64_t cols, bool padded) {
  SK_ASSIGN_OR_RETURN(Tensor x, NewAct(ctx, t, (rows + (padded ? 1 : 0)) * cols));
  if (padded) SK_RETURN_IF_ERROR(ops::Fill(ctx, ViewAt(x, rows * cols, Shape{cols}), 0.0f));
  return x;
}

// w itself when it has dtype t; otherwise a copy cast to t (a GEMM takes A
// and B of one dtype; parameters may come in another than the activations').
StatusOr<Tensor> InDType(const OpContext& ctx, const Tensor& w, DType t) {
  if (w.dtype() == t) return w;
  SK_ASSIGN_OR_RETURN(Tensor c, ctx.alloc->Empty(t, w.shape()));
  SK_RETURN_IF_ERROR(ops::Cast(ctx, w, c));
  return c;
}

// The im2col indices of a convolution, on the device: for group q, output
// pixel i and tap t, the row of the input viewed as [rows * g (+ g), cin / g]
// that the tap reads (q-th channel chunk of the input pixel), or the zero
// row past the input for padding taps. Built once per geometry per step.
class GatherIndices {
 public:
  StatusOr<Tensor> Get(const OpContext& ctx, const ConvGeom& c) {
    auto it = cache_.find(c.key());
    if (it != cache_.end()) return it->second;
    std::vector<int32_t> ids(static_cast<size_t>(c.g * c.m() * c.taps()));
    const int64_t zero_row = c.in_rows() * c.g;
    size_t at = 0;
    for (int64_t q = 0; q < c.g; ++q) {
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t oy = 0; oy < c.out_h; ++oy) {
          for (int64_t ox = 0; ox < c.out_w; ++ox) {
            for (int64_t ky = 0; ky < c.k; ++ky) {
              for (int64_t kx = 0; kx < c.k; ++kx) {
                const int64_t iy = oy * c.s - c.p + ky, ix = ox * c.s - c.p + kx;
                const bool inside = iy >= 0 && iy < c.in_h && ix >= 0 && ix < c.in_w;
                ids[at++] = static_cast<int32_t>(
                    inside ? ((b * c.in_h + iy) * c.in_w + ix) * c.g + q : zero_row);
              }
            }
          }
        }
      }
    }
    SK_ASSIGN_OR_RETURN(Tensor t, nn_internal::TokensToDevice(ctx, ids));
    cache_.emplace(c.key(), t);
    return t;
  }

 private:
  std::map<decltype(ConvGeom().key()), Tensor> cache_;
};

// The patch matrix [g, M, K] of input x (rows plus `padded` zero row).
StatusOr<Tensor> Gather(const OpContext& ctx, GatherIndices& gi, const ConvGeom& c,
                        const Tensor& x, bool padded) {
  SK_ASSIGN_OR_RETURN(Tensor ids, gi.Get(ctx, c));
  const int64_t table_rows = (c.in_rows() + (padded ? 1 : 0)) * c.g;
  SK_ASSIGN_OR_RETURN(Tensor patches, NewAct(ctx, x.dtype(), c.g * c.m() * c.kg()));
  SK_RETURN_IF_ERROR(ops::EmbeddingForward(ctx, ViewAt(x, 0, Shape{table_rows, c.cin / c.g}), ids,
                                           patches));
  return patches;
}

// y [M, cout] (a view without padding) = conv(x) + bias, or += with
// accumulate. bias has cout or (position bias) out_h * out_w * cout elements.
Status ConvForward(const OpContext& ctx, GatherIndices& gi, const ConvGeom& c, const Tensor& x,
                   bool padded, const Tensor& w_in, const Tensor& bias, const Tensor& y,
                   bool accumulate) {
  SK_RETURN_IF_ERROR(accumulate ? ops::BiasAdd(ctx, bias, y) : ops::BroadcastRows(ctx, bias, y));
  SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, x.dtype()));
  GemmParams p;
  p.beta = 1.0f;
  if (c.direct()) {
    p.m = c.m(), p.n = c.cout, p.k = c.cin;
    return ops::Gemm(ctx, p, MatrixRef{x, 0, c.cin}, MatrixRef{w, 0, c.cout}, MatrixRef{y, 0, c.cout});
  }
  SK_ASSIGN_OR_RETURN(Tensor patches, Gather(ctx, gi, c, x, padded));
  p.m = c.m(), p.n = c.ng(), p.k = c.kg(), p.batch = c.g;
  return ops::Gemm(ctx, p, MatrixRef{patches, 0, c.kg(), c.m() * c.kg()},
                   MatrixRef{w, 0, c.ng(), c.kg() * c.ng()}, MatrixRef{y, 0, c.cout, c.ng()});
}

// Given dy [M, cout]: dw += patches^T dy, dbias += column sums of dy, and
// (dx defined: the input's shape, with its padding row if padded) dx =, or
// += with accumulate_dx, the input gradient.
Status ConvBackward(const OpContext& ctx, GatherIndices& gi, const ConvGeom& c, const Tensor& x,
                    bool padded, const Tensor& w_in, const Tensor& dy, const Tensor& dw,
                    const Tensor& dbias, const Tensor& dx, bool accumulate_dx) {
  SK_RETURN_IF_ERROR(ops::BiasGrad(ctx, dy, dbias));
  const DType t = dy.dtype();
  if (c.direct()) {
    GemmParams p;
    p.trans_a = true;
    p.m = c.cin, p.n = c.cout, p.k = c.m();
    p.beta = 1.0f;
    SK_RETURN_IF_ERROR(
        ops::Gemm(ctx, p, MatrixRef{x, 0, c.cin}, MatrixRef{dy, 0, c.cout}, MatrixRef{dw, 0, c.cout}));
    if (!dx.defined()) return OkStatus();
    SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, t));
    GemmParams q;
    q.trans_b = true;
    q.m = c.m(), q.n = c.cin, q.k = c.cout;
    q.beta = accumulate_dx ? 1.0f : 0.0f;
    return ops::Gemm(ctx, q, MatrixRef{dy, 0, c.cout}, MatrixRef{w, 0, c.cout}, MatrixRef{dx, 0, c.cin});
  }
  {
    SK_ASSIGN_OR_RETURN(Tensor patches, Gather(ctx, gi, c, x, padded));
    GemmParams p;
    p.trans_a = true;
    p.m = c.kg(), p.n = c.ng(), p.k = c.m(), p.batch = c.g;
    p.beta = 1.0f;
    SK_RETURN_IF_ERROR(ops::Gemm(ctx, p, MatrixRef{patches, 0, c.kg(), c.m() * c.kg()},
                                 MatrixRef{dy, 0, c.cout, c.ng()},
                                 MatrixRef{dw, 0, c.ng(), c.kg() * c.ng()}));
  }
  if (!dx.defined()) return OkStatus();
  SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, t));
  SK_ASSIGN_OR_RETURN(Tensor dpatches, NewAct(ctx, t, c.g * c.m() * c.kg()));
  GemmParams q;
  q.trans_b = true;
  q.m = c.m(), q.n = c.kg(), q.k = c.ng(), q.batch = c.g;
  SK_RETURN_IF_ERROR(ops::Gemm(ctx, q, MatrixRef{dy, 0, c.cout, c.ng()},
                               MatrixRef{w, 0, c.ng(), c.kg() * c.ng()},
                               MatrixRef{dpatches, 0, c.kg(), c.m() * c.kg()}));
  SK_ASSIGN_OR_RETURN(Tensor ids, gi.Get(ctx, c));
  const int64_t rows = c.in_rows() + (padded ? 1 : 0);
  const Shape table{rows * c.g, c.cin / c.g};
  // col2im: the embedding op's backward adds each patch row's gradient into
  // the input row it was read from (an f32 table).
  if (t == DType::kF32) {
    if (!accumulate_dx) SK_RETURN_IF_ERROR(ops::Fill(ctx, dx, 0.0f));
    return ops::EmbeddingBackward(ctx, ids, dpatches, ViewAt(dx, 0, table));
  }
  SK_ASSIGN_OR_RETURN(Tensor sum, nn_internal::ZerosF32(ctx, rows * c.cin));
  SK_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx, ids, dpatches, ViewAt(sum, 0, table)));
  return accumulate_dx ? ops::Axpy(ctx, 1.0f, sum, dx) : ops::Cast(ctx, sum, dx);
}

// What a kConv unit keeps for its backward.
struct ConvUnitSaved {
  std::vector<Tensor> pre;  // per layer: the pre-GELU output [M, cout] (GELU layers)
  std::vector<Tensor> out;  // per layer: its output, with a zero row when the next layer pads
  Tensor sum;               // residual: the pre-GELU sum
};

// What a kClassifier unit keeps.
struct ClassifierSaved {
  Tensor ln, ln_mean, ln_rstd;  // LayerNorm (when the unit has one)
  Tensor average;               // [positions] of 1 / positions: the pooling row
  Tensor pooled;                // [B, C]
  Tensor dlogits;               // [B, classes]
};

// Every kind's saved state; one is used per unit.
struct UnitSaved {
  ConvUnitSaved conv;
  BlockSaved block;
  ClassifierSaved head;
};

struct Shapes {
  int64_t h = 0, w = 0, c = 0;  // output spatial size and channels
};

// Output shape of every unit, in order, for one image (batch independent).
std::vector<Shapes> UnitOutputs(const UnitTableConfig& cfg) {
  std::vector<Shapes> v;
  int64_t h = cfg.image_size, w = cfg.image_size, c = cfg.image_channels;
  for (const TableUnit& u : cfg.units) {
    switch (u.kind) {
      case TableUnitKind::kConv:
        for (const ConvLayerSpec& l : u.convs) {
          h = OutSize(h, l.kernel, l.stride, l.pad());
          w = OutSize(w, l.kernel, l.stride, l.pad());
          c = l.out_channels;
        }
        break;
      case TableUnitKind::kTransformer:
        c = u.width;
        break;
      case TableUnitKind::kClassifier:
        h = w = 1;
        c = cfg.num_classes;
        break;
    }
    v.push_back({h, w, c});
  }
  return v;
}

std::string UnitField(const TableUnit& u, const std::string& what) {
  return "unit '" + u.name + "': " + what;
}

Status CheckConv(const std::string& model, const TableUnit& u, const ConvLayerSpec& l, int64_t h,
                 int64_t w, int64_t c) {
  const std::string where = "config '" + model + "': " + UnitField(u, "conv '" + l.name + "' ");
  if (l.in_channels != c) {
    return InvalidArgumentError(where + "has " + std::to_string(l.in_channels) +
                                " input channels, its input has " + std::to_string(c));
  }
  if (l.out_channels <= 0 || l.kernel <= 0 || l.stride <= 0 || l.groups <= 0) {
    return InvalidArgumentError(where + "needs positive out_channels, kernel, stride and groups");
  }
  if (l.in_channels % l.groups != 0 || l.out_channels % l.groups != 0) {
    return InvalidArgumentError(where + "groups " + std::to_string(l.groups) +
                                " do not divide its channels");
  }
  if (OutSize(h, l.kernel, l.stride, l.pad()) <= 0 || OutSize(w, l.kernel, l.stride, l.pad()) <= 0) {
    return InvalidArgumentError(where + "leaves no output pixels of a " + std::to_string(h) + "x" +
                                std::to_string(w) + " input");
  }
  return OkStatus();
}

}  // namespace

Status UnitTableConfig::Validate() const {
  SK_RETURN_IF_ERROR(Positive(image_size, name, "image_size"));
  SK_RETURN_IF_ERROR(Positive(image_channels, name, "image_channels"));
  SK_RETURN_IF_ERROR(Positive(num_classes, name, "num_classes"));
  if (num_classes > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError("config '" + name + "': num_classes does not fit int32 ids");
  }
  if (units.size() < 2 || units.back().kind != TableUnitKind::kClassifier) {
    return InvalidArgumentError("config '" + name + "': the last unit must be the classifier, "
                                "after at least one other unit");
  }
  int64_t h = image_size, w = image_size, c = image_channels;
  for (size_t i = 0; i < units.size(); ++i) {
    const TableUnit& u = units[i];
    const std::string where = "config '" + name + "': ";
    if (u.kind == TableUnitKind::kClassifier && i + 1 != units.size()) {
      return InvalidArgumentError(where + UnitField(u, "only the last unit may be the classifier"));
    }
    if (u.in_h != h || u.in_w != w) {
      return InvalidArgumentError(where + UnitField(u, "declares a " + std::to_string(u.in_h) + "x" +
                                                           std::to_string(u.in_w) + " input, the previous unit gives " +
                                                           std::to_string(h) + "x" + std::to_string(w)));
    }
    switch (u.kind) {
      case TableUnitKind::kConv: {
        if (u.convs.empty()) return InvalidArgumentError(where + UnitField(u, "has no convolutions"));
        if (i > 0 && (u.convs[0].pad() > 0 ||
                      (u.residual == Residual::kProjection && u.projection.pad() > 0))) {
          return InvalidArgumentError(
              where + UnitField(u, "a padded convolution may only read the image (first unit)"));
        }
        const int64_t h0 = h, w0 = w, c0 = c;
        for (const ConvLayerSpec& l : u.convs) {
          SK_RETURN_IF_ERROR(CheckConv(name, u, l, h, w, c));
          h = OutSize(h, l.kernel, l.stride, l.pad());
          w = OutSize(w, l.kernel, l.stride, l.pad());
          c = l.out_channels;
        }
        if (u.residual == Residual::kIdentity && (h != h0 || w != w0 || c != c0)) {
          return InvalidArgumentError(where + UnitField(u, "an identity residual needs the output shape "
                                                           "of the input"));
        }
        if (u.residual == Residual::kProjection) {
          SK_RETURN_IF_ERROR(CheckConv(name, u, u.projection, h0, w0, c0));
          const ConvLayerSpec& pr = u.projection;
          if (OutSize(h0, pr.kernel, pr.stride, pr.pad()) != h ||
              OutSize(w0, pr.kernel, pr.stride, pr.pad()) != w || pr.out_channels != c) {
            return InvalidArgumentError(where + UnitField(u, "the projection's output shape differs "
                                                             "from the chain's"));
          }
        }
        break;
      }
      case TableUnitKind::kTransformer:
        SK_RETURN_IF_ERROR(Positive(u.width, name, "width"));
        SK_RETURN_IF_ERROR(Positive(u.heads, name, "heads"));
        SK_RETURN_IF_ERROR(Positive(u.d_ff, name, "d_ff"));
        if (u.width != c || u.width % u.heads != 0) {
          return InvalidArgumentError(where + UnitField(u, "width " + std::to_string(u.width) +
                                                           " must equal its input's channels (" +
                                                           std::to_string(c) + ") and be a multiple of heads"));
        }
        break;
      case TableUnitKind::kClassifier:
        if (u.width != c) {
          return InvalidArgumentError(where + UnitField(u, "width " + std::to_string(u.width) +
                                                           " differs from its input's channels " +
                                                           std::to_string(c)));
        }
        break;
    }
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<UnitTableModel>> UnitTableModel::Create(const UnitTableConfig& config,
                                                                 const ModelOptions& options) {
  SK_RETURN_IF_ERROR(ValidateCreate(config, options, /*supports_selective=*/false));
  return std::unique_ptr<UnitTableModel>(new UnitTableModel(config, options));
}

UnitTableModel::UnitTableModel(const UnitTableConfig& config, const ModelOptions& options)
    : ConfiguredModel(config, options),
      vit_block_({SublayerKind::kSelfAttention, SublayerKind::kMlp}) {
  int64_t residual_units = 0, blocks = 0;
  for (const TableUnit& u : config.units) {
    residual_units += u.kind == TableUnitKind::kConv && u.residual != Residual::kNone;
    blocks += u.kind == TableUnitKind::kTransformer;
  }
  const std::vector<Shapes> outs = UnitOutputs(config);
  for (size_t i = 0; i < config.units.size(); ++i) {
    const TableUnit& t = config.units[i];
    UnitSpec u{t.name, {}};
    auto conv_specs = [&](const ConvLayerSpec& l, float scale, int64_t bias_rows) {
      const int64_t kg = l.kernel * l.kernel * l.in_channels / l.groups;
      // He initialisation (fan-in kg), scaled down on a residual branch's
      // last layer so that deep stacks without BatchNorm keep their scale.
      const float std = scale * std::sqrt(2.0f / static_cast<float>(kg));
      u.params.push_back({l.name + ".w", Shape{l.groups, kg, l.out_channels / l.groups},
                          Initializer::Normal(0.0f, std)});
      u.params.push_back({l.name + ".b", Shape{bias_rows * l.out_channels}, Initializer::Zeros()});
    };
    switch (t.kind) {
      case TableUnitKind::kConv:
        for (size_t j = 0; j < t.convs.size(); ++j) {
          const bool last = j + 1 == t.convs.size();
          const float scale = last && t.residual != Residual::kNone
                                  ? 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(residual_units, 1)))
                                  : 1.0f;
          conv_specs(t.convs[j], scale, last && t.position_bias ? outs[i].h * outs[i].w : 1);
        }
        if (t.residual == Residual::kProjection) conv_specs(t.projection, 1.0f, 1);
        break;
      case TableUnitKind::kTransformer: {
        const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(blocks));
        vit_block_.AppendSpecs(t.width, t.d_ff, 0.02f, proj_std, &u.params);
        break;
      }
      case TableUnitKind::kClassifier:
        if (t.layer_norm) {
          u.params.push_back({"ln.g", Shape{t.width}, Initializer::Ones()});
          u.params.push_back({"ln.b", Shape{t.width}, Initializer::Zeros()});
        }
        u.params.push_back({"fc.w", Shape{t.width, config.num_classes}, Initializer::Normal(0.0f, 0.01f)});
        u.params.push_back({"fc.b", Shape{config.num_classes}, Initializer::Zeros()});
        break;
    }
    units_.push_back(std::move(u));
  }
}

Status UnitTableModel::ValidateBatch(const TokenBatch& batch) const {
  if (batch.batch_size <= 0) return InvalidArgumentError("batch.batch_size must be positive");
  if (batch.seq_len != 1) {
    return InvalidArgumentError("batch.seq_len is " + std::to_string(batch.seq_len) + ", but '" +
                                config_.name + "' takes one image per sequence (seq_len 1)");
  }
  if (batch.source_len != 0 || !batch.source.empty()) {
    return InvalidArgumentError("batch.source is set, but '" + config_.name + "' has no encoder");
  }
  if (!batch.positions.empty() || !batch.segment_ids.empty()) {
    return InvalidArgumentError("batch.positions and batch.segment_ids are for decoder-only models, not '" +
                                config_.name + "'");
  }
  SK_RETURN_IF_ERROR(nn_internal::ValidateLossDenominator(batch));
  SK_RETURN_IF_ERROR(
      nn_internal::ValidateTokens(batch.inputs, batch.batch_size, config_.num_classes, false, "inputs"));
  return nn_internal::ValidateTokens(batch.targets, batch.batch_size, config_.num_classes, true,
                                     "targets");
}

namespace {

// One model call's state shared by the unit functions.
struct Step {
  OpContext ctx;
  DType act = DType::kF32;
  int64_t batch = 0;
  float grad_scale = 0;  // the loss gradient's factor per counted target (GradScale)
  GatherIndices gather;
};

BlockDims VitDims(const Step& s, const TableUnit& u) {
  BlockDims d;
  d.batch = s.batch;
  d.seq = u.in_h * u.in_w;
  d.d_model = u.width;
  d.heads = u.heads;
  d.d_ff = u.d_ff;
  d.storage = s.act;
  return d;
}

// kConv forward: x is the unit input (padded: it has the zero row, the
// image). Parameters in spec order: per conv w, b; then the projection's.
Status ConvUnitForward(Step& s, const TableUnit& u, const UnitParams& p, const Tensor& x,
                       bool padded, ConvUnitSaved* saved) {
  const size_t n = u.convs.size();
  saved->pre.assign(n, Tensor());
  saved->out.assign(n, Tensor());
  Tensor in = x;
  bool in_padded = padded;
  int64_t h = u.in_h, w = u.in_w;
  for (size_t i = 0; i < n; ++i) {
    const ConvLayerSpec& l = u.convs[i];
    const ConvGeom c = Geom(l, s.batch, h, w);
    const Tensor& weight = p[2 * i];
    const Tensor& bias = p[2 * i + 1];
    const bool last = i + 1 == n;
    if (last && u.residual != Residual::kNone) {
      SK_ASSIGN_OR_RETURN(Tensor sum, NewAct(s.ctx, s.act, c.m() * c.cout));
      if (u.residual == Residual::kProjection) {
        const ConvGeom pc = Geom(u.projection, s.batch, u.in_h, u.in_w);
        SK_RETURN_IF_ERROR(ConvForward(s.ctx, s.gather, pc, x, padded, p[2 * n], p[2 * n + 1], sum, false));
      } else {
        SK_RETURN_IF_ERROR(ops::Copy(s.ctx, Prefix(x, c.m() * c.cout), sum));
      }
      SK_RETURN_IF_ERROR(ConvForward(s.ctx, s.gather, c, in, in_padded, weight, bias, sum, true));
      if (u.gelu_after_sum) {
        SK_ASSIGN_OR_RETURN(saved->out[i], NewAct(s.ctx, s.act, c.m() * c.cout));
        SK_RETURN_IF_ERROR(ops::GeluForward(s.ctx, sum, saved->out[i]));
        saved->sum = std::move(sum);
      } else {
        saved->out[i] = std::move(sum);
      }
      break;
    }
    const bool next_pads = !last && u.convs[i + 1].pad() > 0;
    SK_ASSIGN_OR_RETURN(Tensor y, NewRows(s.ctx, s.act, c.m(), c.cout, next_pads));
    SK_RETURN_IF_ERROR(
        ConvForward(s.ctx, s.gather, c, in, in_padded, weight, bias, Prefix(y, c.m() * c.cout), false));
    if (l.gelu) {
      SK_ASSIGN_OR_RETURN(Tensor g, NewRows(s.ctx, s.act, c.m(), c.cout, next_pads));
      SK_RETURN_IF_ERROR(ops::GeluForward(s.ctx, Prefix(y, c.m() * c.cout), Prefix(g, c.m() * c.cout)));
      saved->pre[i] = std::move(y);
      saved->out[i] = std::move(g);
    } else {
      saved->out[i] = std::move(y);
    }
    in = saved->out[i];
    in_padded = next_pads;
    h = c.out_h;
    w = c.out_w;
  }
  return OkStatus();
}

// kConv backward: dout [M, C] of the unit output; dx (undefined for the
// first unit: the image needs no gradient) is overwritten.
Status ConvUnitBackward(Step& s, const TableUnit& u, const UnitParams& p, const UnitGrads& g,
                        const Tensor& x, bool padded, const ConvUnitSaved& saved, const Tensor& dout,
                        const Tensor& dx) {
  const size_t n = u.convs.size();
  std::vector<ConvGeom> geoms;
  int64_t h = u.in_h, w = u.in_w;
  for (const ConvLayerSpec& l : u.convs) {
    geoms.push_back(Geom(l, s.batch, h, w));
    h = geoms.back().out_h;
    w = geoms.back().out_w;
  }
  const ConvGeom& lc = geoms.back();
  // The gradient of the last layer's output (the residual sum's, with one).
  Tensor d;
  if (u.residual != Residual::kNone && u.gelu_after_sum) {
    SK_ASSIGN_OR_RETURN(d, NewAct(s.ctx, s.act, lc.m() * lc.cout));
    SK_RETURN_IF_ERROR(ops::GeluBackward(s.ctx, saved.sum, dout, d));
  } else if (u.residual == Residual::kNone && u.convs.back().gelu) {
    SK_ASSIGN_OR_RETURN(d, NewAct(s.ctx, s.act, lc.m() * lc.cout));
    SK_RETURN_IF_ERROR(ops::GeluBackward(s.ctx, Prefix(saved.pre[n - 1], lc.m() * lc.cout), dout, d));
  } else {
    d = dout;
  }
  const Tensor dsum = d;
  for (size_t i = n; i-- > 0;) {
    const ConvGeom& c = geoms[i];
    const bool in_padded = i == 0 ? padded : u.convs[i].pad() > 0;
    const Tensor& in = i == 0 ? x : saved.out[i - 1];
    Tensor din;
    if (i > 0) {
      const ConvGeom& pc = geoms[i - 1];
      SK_ASSIGN_OR_RETURN(din, NewAct(s.ctx, s.act, (pc.m() + (in_padded ? 1 : 0)) * pc.cout));
    } else {
      din = dx;
    }
    SK_RETURN_IF_ERROR(ConvBackward(s.ctx, s.gather, c, in, in_padded, p[2 * i], d, g[2 * i], g[2 * i + 1],
                                    din, false));
    if (i > 0) {
      const ConvGeom& pc = geoms[i - 1];
      const Tensor dmain = Prefix(din, pc.m() * pc.cout);
      if (u.convs[i - 1].gelu) {
        SK_RETURN_IF_ERROR(
            ops::GeluBackward(s.ctx, Prefix(saved.pre[i - 1], pc.m() * pc.cout), dmain, dmain));
      }
      d = dmain;
    }
  }
  if (!dx.defined()) return OkStatus();
  if (u.residual == Residual::kProjection) {
    const ConvGeom pc = Geom(u.projection, s.batch, u.in_h, u.in_w);
    return ConvBackward(s.ctx, s.gather, pc, x, padded, p[2 * n], dsum, g[2 * n], g[2 * n + 1], dx, true);
  }
  if (u.residual == Residual::kIdentity) {
    return ops::Axpy(s.ctx, 1.0f, dsum, Prefix(dx, lc.m() * lc.cout));
  }
  return OkStatus();
}

// y [rows, out] = x [rows, in] w [in, out] + bias.
Status Linear(const OpContext& ctx, const Tensor& x, const Tensor& w_in, const Tensor& bias,
              int64_t rows, int64_t in, int64_t out, const Tensor& y) {
  SK_ASSIGN_OR_RETURN(Tensor w, InDType(ctx, w_in, x.dtype()));
  GemmParams p;
  p.m = rows, p.n = out, p.k = in;
  return ops::GemmBias(ctx, p, MatrixRef{x, 0, in}, MatrixRef{w, 0, out}, bias,
                       MatrixRef{y, 0, out});
}

StatusOr<float> ClassifierForward(Step& s, const TableUnit& u, int64_t classes, const UnitParams& p,
                                  const Tensor& x, const Tensor& targets, bool want_grad,
                                  ClassifierSaved* saved) {
  const int64_t pos = u.in_h * u.in_w, c = u.width, rows = s.batch * pos;
  size_t at = 0;
  Tensor feats = Prefix(x, rows * c);
  if (u.layer_norm) {
    SK_ASSIGN_OR_RETURN(saved->ln, NewAct(s.ctx, s.act, rows * c));
    SK_ASSIGN_OR_RETURN(saved->ln_mean, NewF32(s.ctx, rows));
    SK_ASSIGN_OR_RETURN(saved->ln_rstd, NewF32(s.ctx, rows));
    SK_RETURN_IF_ERROR(
        ops::LayerNormForward(s.ctx, feats, p[0], p[1], saved->ln, saved->ln_mean, saved->ln_rstd));
    feats = saved->ln;
    at = 2;
  }
  // Average pooling as a batched GEMM: per image, [1, pos] x [pos, C].
  SK_ASSIGN_OR_RETURN(saved->average, NewAct(s.ctx, s.act, pos));
  SK_RETURN_IF_ERROR(ops::Fill(s.ctx, saved->average, 1.0f / static_cast<float>(pos)));
  SK_ASSIGN_OR_RETURN(saved->pooled, NewAct(s.ctx, s.act, s.batch * c));
  GemmParams pool;
  pool.m = 1, pool.n = c, pool.k = pos, pool.batch = s.batch;
  SK_RETURN_IF_ERROR(ops::Gemm(s.ctx, pool, MatrixRef{saved->average, 0, pos, 0},
                               MatrixRef{feats, 0, c, pos * c}, MatrixRef{saved->pooled, 0, c, c}));
  SK_ASSIGN_OR_RETURN(Tensor logits, NewAct(s.ctx, s.act, s.batch * classes));
  SK_RETURN_IF_ERROR(Linear(s.ctx, saved->pooled, p[at], p[at + 1], s.batch, c, classes, logits));
  SK_ASSIGN_OR_RETURN(Tensor loss, s.ctx.alloc->Empty(DType::kF32, Shape{1}));
  SK_RETURN_IF_ERROR(ops::CrossEntropyForward(s.ctx, logits, targets, loss));
  if (want_grad) {
    SK_RETURN_IF_ERROR(ops::CrossEntropyBackward(s.ctx, logits, targets, logits, s.grad_scale));
    saved->dlogits = std::move(logits);
  }
  SK_ASSIGN_OR_RETURN(double value, ops::ReadScalar(s.ctx, loss));
  return static_cast<float>(value);
}

Status ClassifierBackward(Step& s, const TableUnit& u, int64_t classes, const UnitParams& p,
                          const UnitGrads& g, const Tensor& x, const ClassifierSaved& saved,
                          const Tensor& dx) {
  const int64_t pos = u.in_h * u.in_w, c = u.width, rows = s.batch * pos;
  const size_t at = u.layer_norm ? 2 : 0;
  SK_ASSIGN_OR_RETURN(Tensor w, InDType(s.ctx, p[at], s.act));
  // fc: dw += pooled^T dlogits, db += sums, dpooled = dlogits w^T.
  GemmParams pw;
  pw.trans_a = true;
  pw.m = c, pw.n = classes, pw.k = s.batch;
  pw.beta = 1.0f;
  SK_RETURN_IF_ERROR(ops::Gemm(s.ctx, pw, MatrixRef{saved.pooled, 0, c}, MatrixRef{saved.dlogits, 0, classes},
                               MatrixRef{g[at], 0, classes}));
  SK_RETURN_IF_ERROR(ops::BiasGrad(s.ctx, saved.dlogits, g[at + 1]));
  SK_ASSIGN_OR_RETURN(Tensor dpooled, NewAct(s.ctx, s.act, s.batch * c));
  GemmParams px;
  px.trans_b = true;
  px.m = s.batch, px.n = c, px.k = classes;
  SK_RETURN_IF_ERROR(ops::Gemm(s.ctx, px, MatrixRef{saved.dlogits, 0, classes}, MatrixRef{w, 0, classes},
                               MatrixRef{dpooled, 0, c}));
  // Pooling: each position gets 1/pos of its image's pooled gradient.
  const Tensor dfeats = u.layer_norm ? Tensor() : Prefix(dx, rows * c);
  Tensor dpool_out = dfeats;
  if (u.layer_norm) {
    SK_ASSIGN_OR_RETURN(dpool_out, NewAct(s.ctx, s.act, rows * c));
  }
  GemmParams pb;
  pb.trans_a = true;
  pb.m = pos, pb.n = c, pb.k = 1, pb.batch = s.batch;
  SK_RETURN_IF_ERROR(ops::Gemm(s.ctx, pb, MatrixRef{saved.average, 0, pos, 0}, MatrixRef{dpooled, 0, c, c},
                               MatrixRef{dpool_out, 0, c, pos * c}));
  if (!u.layer_norm) return OkStatus();
  SK_RETURN_IF_ERROR(ops::Fill(s.ctx, Prefix(dx, rows * c), 0.0f));
  return ops::LayerNormBackward(s.ctx, Prefix(x, rows * c), p[0], dpool_out, saved.ln_mean, saved.ln_rstd,
                                Prefix(dx, rows * c), g[0], g[1]);
}

}  // namespace

StatusOr<float> UnitTableModel::Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                                    bool backward) const {
  Step s;
  SK_ASSIGN_OR_RETURN(s.ctx, nn_internal::MakeContext(hooks, alloc));
  s.act = options_.compute_dtype;
  s.batch = batch.batch_size;
  s.grad_scale = nn_internal::GradScale(batch);
  const bool ckpt = options_.full_checkpointing();
  const int U = static_cast<int>(config_.units.size());
  const int head = U - 1;
  const int64_t pixels = config_.image_size * config_.image_size;
  const int64_t chans = config_.image_channels;

  SK_ASSIGN_OR_RETURN(Tensor targets, nn_internal::TokensToDevice(s.ctx, batch.targets));
  // xs[u]: unit u's input; xs[0] the images (with the zero row).
  std::vector<Tensor> xs(static_cast<size_t>(U));
  SK_ASSIGN_OR_RETURN(xs[0], NewRows(s.ctx, s.act, s.batch * pixels, chans, true));
  for (int64_t b = 0; b < s.batch; ++b) {
    SK_RETURN_IF_ERROR(ops::InitPhilox(s.ctx, Initializer::Normal(0.0f, 1.0f), kUnitTableImageSeed,
                                       static_cast<uint64_t>(batch.inputs[static_cast<size_t>(b)]), 0,
                                       ViewAt(xs[0], b * pixels * chans, Shape{pixels * chans})));
  }
  std::vector<UnitSaved> saved(static_cast<size_t>(U));
  UnitScope scope(hooks, units_, s.ctx);

  auto forward_unit = [&](int u, const UnitParams& p, UnitSaved* out) -> Status {
    const TableUnit& t = config_.units[u];
    if (t.kind == TableUnitKind::kConv) return ConvUnitForward(s, t, p, xs[u], u == 0, &out->conv);
    const BlockDims d = VitDims(s, t);
    return vit_block_.Forward(s.ctx, d, p, Prefix(xs[u], d.batch * d.seq * d.d_model), Tensor(), &out->block);
  };
  auto unit_output = [&](int u, const UnitSaved& v) -> Tensor {
    return config_.units[u].kind == TableUnitKind::kConv ? v.conv.out.back() : v.block.subs.back().out;
  };

  for (int u = 0; u < head; ++u) {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(u));
    UnitSaved v;
    SK_RETURN_IF_ERROR(forward_unit(u, p, &v));
    xs[u + 1] = unit_output(u, v);
    if (!ckpt && backward) saved[u] = std::move(v);
    SK_RETURN_IF_ERROR(scope.PostForward(u));
    if (!backward && u > 0) xs[u] = Tensor();
  }
  const TableUnit& cls = config_.units[head];
  ClassifierSaved hs;
  float loss = 0.0f;
  {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(head));
    SK_ASSIGN_OR_RETURN(loss, ClassifierForward(s, cls, config_.num_classes, p, xs[head], targets, backward, &hs));
    SK_RETURN_IF_ERROR(scope.PostForward(head));
  }
  if (!backward) return loss;

  const std::vector<Shapes> outs = UnitOutputs(config_);
  auto input_numel = [&](int u) {
    const Shapes& o = outs[static_cast<size_t>(u - 1)];
    return s.batch * o.h * o.w * o.c;
  };
  Tensor dy;  // the gradient of unit u's output
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(head));
    SK_ASSIGN_OR_RETURN(dy, NewAct(s.ctx, s.act, input_numel(head)));
    SK_RETURN_IF_ERROR(ClassifierBackward(s, cls, config_.num_classes, b.p, b.g, xs[head], hs, dy));
    hs = ClassifierSaved();
    xs[head] = Tensor();
    SK_RETURN_IF_ERROR(scope.PostBackward(head, &b));
  }
  for (int u = head - 1; u >= 0; --u) {
    const TableUnit& t = config_.units[u];
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(u));
    if (ckpt) SK_RETURN_IF_ERROR(forward_unit(u, b.p, &saved[u]));
    Tensor dx;
    if (u > 0) {
      SK_ASSIGN_OR_RETURN(dx, NewAct(s.ctx, s.act, input_numel(u)));
    }
    if (t.kind == TableUnitKind::kConv) {
      SK_RETURN_IF_ERROR(ConvUnitBackward(s, t, b.p, b.g, xs[u], u == 0, saved[u].conv, dy, dx));
    } else {
      const BlockDims d = VitDims(s, t);
      SK_RETURN_IF_ERROR(vit_block_.Backward(s.ctx, d, b.p, b.g, Prefix(xs[u], d.batch * d.seq * d.d_model),
                                             Tensor(), saved[u].block, dy, dx, Tensor()));
    }
    saved[u] = UnitSaved();
    xs[u + 1] = Tensor();
    if (u > 0) xs[u] = Tensor();
    dy = dx;
    SK_RETURN_IF_ERROR(scope.PostBackward(u, &b));
  }
  return loss;
}

double UnitTableModel::UnitForwardFlops(int u, int64_t batch_size) const {
  const TableUnit& t = config_.units[static_cast<size_t>(u)];
  switch (t.kind) {
    case TableUnitKind::kConv: {
      double f = 0.0;
      int64_t h = t.in_h, w = t.in_w;
      for (const ConvLayerSpec& l : t.convs) {
        const ConvGeom c = Geom(l, batch_size, h, w);
        f += 2.0 * static_cast<double>(c.m()) * static_cast<double>(c.kg()) * static_cast<double>(c.cout);
        h = c.out_h;
        w = c.out_w;
      }
      if (t.residual == Residual::kProjection) {
        const ConvGeom c = Geom(t.projection, batch_size, t.in_h, t.in_w);
        f += 2.0 * static_cast<double>(c.m()) * static_cast<double>(c.kg()) * static_cast<double>(c.cout);
      }
      return f;
    }
    case TableUnitKind::kTransformer:
      return vit_block_.ForwardMatmulFlops(batch_size, t.in_h * t.in_w, 0, t.width, t.d_ff);
    case TableUnitKind::kClassifier:
      return 2.0 * static_cast<double>(batch_size) * static_cast<double>(t.width) *
             static_cast<double>(config_.num_classes);
  }
  return 0.0;
}

StepFlops UnitTableModel::Flops(int64_t batch_size, int64_t /*seq_len*/, int64_t /*source_len*/) const {
  double fwd = 0.0, recompute = 0.0;
  const int U = static_cast<int>(config_.units.size());
  for (int u = 0; u < U; ++u) {
    const double f = UnitForwardFlops(u, batch_size);
    fwd += f;
    if (u + 1 < U) recompute += f;
  }
  StepFlops out;
  out.model_flops = 3.0 * fwd;
  out.hardware_flops = out.model_flops + (options_.full_checkpointing() ? recompute : 0.0);
  return out;
}

}  // namespace sk

namespace sk {

// An analytic count of what Run allocates (the sizes above, without the
// allocator's rounding): per unit what forward keeps for backward, the
// im2col indices (kept for the whole step), and the largest transient of a
// unit's forward or backward on top of what is kept at that point.
int64_t UnitTableModel::PeakActivationBytes(int64_t batch_size, int64_t /*seq_len*/,
                                            int64_t /*source_len*/,
                                            DeviceKind device) const {
  const int64_t a = static_cast<int64_t>(DTypeSize(options_.compute_dtype));
  const bool ckpt = options_.full_checkpointing();
  const int64_t B = batch_size;
  const int U = static_cast<int>(config_.units.size());
  const std::vector<Shapes> outs = UnitOutputs(config_);
  std::map<decltype(ConvGeom().key()), int64_t> ids;
  std::vector<int64_t> saved(static_cast<size_t>(U), 0), fwd_temp(saved), bwd_temp(saved), out(saved);
  for (int u = 0; u < U; ++u) {
    const TableUnit& t = config_.units[static_cast<size_t>(u)];
    const Shapes& o = outs[static_cast<size_t>(u)];
    out[u] = a * B * o.h * o.w * o.c;
    if (t.kind == TableUnitKind::kTransformer) {
      BlockDims d;
      d.batch = B;
      d.seq = t.in_h * t.in_w;
      d.d_model = t.width;
      d.heads = t.heads;
      d.d_ff = t.d_ff;
      d.storage = options_.compute_dtype;
      saved[u] = vit_block_.SavedBytes(d, device);
      bwd_temp[u] = vit_block_.BackwardTempBytes(d, device);
      continue;
    }
    if (t.kind == TableUnitKind::kClassifier) {
      const int64_t rows = B * t.in_h * t.in_w;
      saved[u] = (t.layer_norm ? a * rows * t.width + 8 * rows : 0) + a * t.in_h * t.in_w +
                 a * B * t.width + a * B * config_.num_classes + 4;
      bwd_temp[u] = a * B * t.width + (t.layer_norm ? a * rows * t.width : 0);
      continue;
    }
    // Walk the convolutions in Run's allocation order. Forward: each
    // layer's output (and GELU output), with its patch matrix alive during
    // the GEMM. Backward (on top of everything saved, the unit's output
    // gradient dy and input gradient dx): the residual sum's gradient, then
    // per layer (last first) the gradient of its output (the previous
    // iteration's input gradient), its input gradient, and its patch
    // matrix (or patch gradient, the same size, with an f32 col2im sum for
    // 16-bit activations).
    const size_t n = t.convs.size();
    std::vector<ConvGeom> geoms;
    std::vector<bool> padded;
    int64_t h = t.in_h, w = t.in_w;
    for (size_t i = 0; i < n; ++i) {
      geoms.push_back(Geom(t.convs[i], B, h, w));
      padded.push_back(i == 0 ? u == 0 : t.convs[i].pad() > 0);
      h = geoms.back().out_h;
      w = geoms.back().out_w;
    }
    auto patches = [&](const ConvGeom& c) { return c.direct() ? 0 : a * c.g * c.m() * c.kg(); };
    auto in_bytes = [&](size_t i) {
      const ConvGeom& c = geoms[i];
      return a * (c.in_rows() + (padded[i] ? 1 : 0)) * c.cin;
    };
    auto scratch = [&](size_t i) {
      const ConvGeom& c = geoms[i];
      return c.direct() || a == 4 ? 0 : 4 * (c.in_rows() + (padded[i] ? 1 : 0)) * c.cin;
    };
    for (const ConvGeom& c : geoms) {
      if (!c.direct()) ids.emplace(c.key(), 4 * c.g * c.m() * c.taps());
    }
    const bool proj = t.residual == Residual::kProjection;
    const ConvGeom pg = proj ? Geom(t.projection, B, t.in_h, t.in_w) : ConvGeom();
    if (proj && !pg.direct()) ids.emplace(pg.key(), 4 * pg.g * pg.m() * pg.taps());
    int64_t acc = 0;
    for (size_t i = 0; i < n; ++i) {
      const ConvGeom& c = geoms[i];
      const bool last = i + 1 == n;
      if (last && t.residual != Residual::kNone) {
        const int64_t sum = a * c.m() * c.cout;
        fwd_temp[u] = std::max({fwd_temp[u], acc + sum + (proj ? patches(pg) : 0), acc + sum + patches(c)});
        acc += sum * (t.gelu_after_sum ? 2 : 1);
        break;
      }
      const bool next_pads = !last && t.convs[i + 1].pad() > 0;
      const int64_t y = a * (c.m() + (next_pads ? 1 : 0)) * c.cout;
      fwd_temp[u] = std::max(fwd_temp[u], acc + y + patches(c));
      acc += y * (t.convs[i].gelu ? 2 : 1);
    }
    saved[u] = acc;
    fwd_temp[u] -= saved[u];  // the part on top of what the unit keeps
    const bool makes_dsum =
        (t.residual != Residual::kNone && t.gelu_after_sum) || (t.residual == Residual::kNone && t.convs.back().gelu);
    const int64_t dsum = makes_dsum ? out[u] : 0;
    int64_t dout = 0;  // the gradient of layer i's output beyond dy and dsum
    for (size_t i = n; i-- > 0;) {
      const ConvGeom& c = geoms[i];
      const bool input_grad = i > 0 || u > 0;
      const int64_t din = i > 0 ? in_bytes(i) : 0;  // dx (i == 0) is counted outside
      const int64_t work = input_grad ? patches(c) + scratch(i) : patches(c);
      bwd_temp[u] = std::max(bwd_temp[u], dsum + dout + din + work);
      dout = din;
    }
    if (proj && u > 0) bwd_temp[u] = std::max(bwd_temp[u], dsum + dout + patches(pg) + scratch(0));
  }
  int64_t id_bytes = 0;
  for (const auto& kv : ids) id_bytes += kv.second;
  const int64_t pixels = config_.image_size * config_.image_size;
  // Kept from the start: targets, the images, the indices.
  int64_t kept = 4 * B + a * (B * pixels + 1) * config_.image_channels + id_bytes;
  int64_t peak = kept;
  // Forward: unit u's transient on top of everything kept so far.
  for (int u = 0; u < U; ++u) {
    const bool keeps_all = !ckpt || u + 1 == U;
    peak = std::max(peak, kept + saved[u] + fwd_temp[u]);
    kept += keeps_all ? saved[u] : out[u];
  }
  // Backward, from the head down: the unit's saved state (recomputed with
  // checkpointing), its output gradient dy, its input gradient dx and its
  // temporaries; then its state and output go.
  for (int u = U - 1; u >= 0; --u) {
    const bool kept_all = !ckpt || u + 1 == U;
    const int64_t dy = u + 1 < U ? out[u] : 0;
    const int64_t dx = u > 0 ? out[u - 1] : 0;
    const int64_t here = kept + (kept_all ? 0 : saved[u]) + dy + dx + bwd_temp[u];
    peak = std::max(peak, here);
    kept -= kept_all ? saved[u] : out[u];
  }
  return peak;
}

}  // namespace sk
