#include "runtime/nn/t5.h"

#include <algorithm>
#include <cmath>

namespace sk {

using nn_internal::BlockDims;
using nn_internal::BlockSaved;
using nn_internal::HeadSaved;
using nn_internal::NewAct;
using nn_internal::NewF32;
using nn_internal::Prefix;
using nn_internal::Positive;
using nn_internal::ValidateWidthAndVocab;
using nn_internal::SublayerKind;
using nn_internal::UnitGrads;
using nn_internal::UnitParams;
using nn_internal::UnitScope;

namespace {

// The embedding unit's tensors (or their gradients) by name, in spec order.
struct EmbedTensors {
  Tensor enc_tok;  // enc_wte [V, C]
  Tensor dec_tok;  // dec_wte [V, C]
  Tensor enc_pos;  // enc_wpe [max_source_len, C]
  Tensor dec_pos;  // dec_wpe [max_target_len, C]
};

template <typename Src>
EmbedTensors BindEmbed(const Src& src) {
  return EmbedTensors{src[0], src[1], src[2], src[3]};
}

}  // namespace

Status T5Config::Validate() const {
  SK_RETURN_IF_ERROR(Positive(vocab_size, name, "vocab_size"));
  SK_RETURN_IF_ERROR(Positive(max_source_len, name, "max_source_len"));
  SK_RETURN_IF_ERROR(Positive(max_target_len, name, "max_target_len"));
  SK_RETURN_IF_ERROR(Positive(n_encoder_layers, name, "n_encoder_layers"));
  SK_RETURN_IF_ERROR(Positive(n_decoder_layers, name, "n_decoder_layers"));
  SK_RETURN_IF_ERROR(Positive(n_head, name, "n_head"));
  SK_RETURN_IF_ERROR(Positive(d_model, name, "d_model"));
  SK_RETURN_IF_ERROR(Positive(d_ff, name, "d_ff"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_encoder_layers, nn_internal::kMaxLayers, name, "n_encoder_layers"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_decoder_layers, nn_internal::kMaxLayers, name, "n_decoder_layers"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(d_model, nn_internal::kMaxWidth, name, "d_model"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(d_ff, nn_internal::kMaxWidth, name, "d_ff"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_head, nn_internal::kMaxWidth, name, "n_head"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(max_source_len, nn_internal::kMaxWidth, name, "max_source_len"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(max_target_len, nn_internal::kMaxWidth, name, "max_target_len"));
  SK_RETURN_IF_ERROR(ValidateWidthAndVocab(name, d_model, n_head, vocab_size));
  // Every factor is bounded above, so 128 bits hold each term (generously:
  // every block counted with cross-attention).
  using W = __int128;
  const W d = d_model, layer = 8 * d * d + 2 * d * W{d_ff} + 16 * d + d_ff;
  return nn_internal::CheckParameterCount(
      name, 3 * W{vocab_size} * d + (W{max_source_len} + max_target_len) * d +
                (W{n_encoder_layers} + n_decoder_layers) * layer + 4 * d);
}

StatusOr<std::unique_ptr<T5Model>> T5Model::Create(const T5Config& config,
                                                   const ModelOptions& options) {
  SK_RETURN_IF_ERROR(ValidateCreate(config, options, /*supports_selective=*/false));
  return std::unique_ptr<T5Model>(new T5Model(config, options));
}

T5Model::T5Model(const T5Config& config, const ModelOptions& options)
    : ConfiguredModel(config, options),
      encoder_block_({SublayerKind::kSelfAttention, SublayerKind::kMlp}),
      decoder_block_({SublayerKind::kCausalSelfAttention, SublayerKind::kCrossAttention,
                      SublayerKind::kMlp}) {
  const int64_t d = config.d_model;
  const float std = 0.02f;
  const float proj_std =
      0.02f / std::sqrt(2.0f * static_cast<float>(config.n_encoder_layers + config.n_decoder_layers));
  UnitSpec embed{"embed", {}};
  embed.params.push_back({"enc_wte", Shape{config.vocab_size, d}, Initializer::Normal(0.0f, std)});
  embed.params.push_back({"dec_wte", Shape{config.vocab_size, d}, Initializer::Normal(0.0f, std)});
  embed.params.push_back({"enc_wpe", Shape{config.max_source_len, d}, Initializer::Normal(0.0f, std)});
  embed.params.push_back({"dec_wpe", Shape{config.max_target_len, d}, Initializer::Normal(0.0f, std)});
  units_.push_back(std::move(embed));
  for (int64_t l = 0; l < config.n_encoder_layers; ++l) {
    UnitSpec u{"enc." + std::to_string(l), {}};
    encoder_block_.AppendSpecs(d, config.d_ff, std, proj_std, &u.params);
    units_.push_back(std::move(u));
  }
  units_.push_back(UnitSpec{"enc_norm",
                            {ParamSpec{"ln.g", Shape{d}, Initializer::Ones()},
                             ParamSpec{"ln.b", Shape{d}, Initializer::Zeros()}}});
  for (int64_t l = 0; l < config.n_decoder_layers; ++l) {
    UnitSpec u{"dec." + std::to_string(l), {}};
    decoder_block_.AppendSpecs(d, config.d_ff, std, proj_std, &u.params);
    units_.push_back(std::move(u));
  }
  UnitSpec head{"head", {}};
  nn_internal::AppendHeadSpecs(d, config.vocab_size, std, "", &head);
  units_.push_back(std::move(head));
}

Status T5Model::ValidateBatch(const TokenBatch& batch) const {
  if (batch.batch_size <= 0) return InvalidArgumentError("batch.batch_size must be positive");
  if (batch.seq_len <= 0 || batch.seq_len > config_.max_target_len) {
    return InvalidArgumentError("batch.seq_len " + std::to_string(batch.seq_len) +
                                " is outside [1, " + std::to_string(config_.max_target_len) +
                                "] of model '" + config_.name + "'");
  }
  if (batch.source_len <= 0 || batch.source_len > config_.max_source_len) {
    return InvalidArgumentError("batch.source_len " + std::to_string(batch.source_len) +
                                " is outside [1, " + std::to_string(config_.max_source_len) +
                                "] of model '" + config_.name + "'");
  }
  if (!batch.positions.empty() || !batch.segment_ids.empty()) {
    return InvalidArgumentError("batch.positions and batch.segment_ids are for decoder-only models, not '" +
                                config_.name + "'");
  }
  const int64_t v = config_.vocab_size;
  SK_RETURN_IF_ERROR(nn_internal::ValidateLossDenominator(batch));
  SK_RETURN_IF_ERROR(nn_internal::CheckProduct(batch.batch_size, batch.seq_len, "batch tokens"));
  SK_RETURN_IF_ERROR(nn_internal::CheckProduct(batch.batch_size, batch.source_len, "batch source"));
  SK_RETURN_IF_ERROR(nn_internal::ValidateTokens(batch.source, batch.batch_size * batch.source_len,
                                                 v, false, "source"));
  const int64_t n = batch.batch_size * batch.seq_len;
  SK_RETURN_IF_ERROR(nn_internal::ValidateTokens(batch.inputs, n, v, false, "inputs"));
  return nn_internal::ValidateTokens(batch.targets, n, v, true, "targets");
}

StatusOr<float> T5Model::Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                             bool backward) const {
  const int64_t E = config_.n_encoder_layers;
  const int64_t D = config_.n_decoder_layers;
  const int64_t B = batch.batch_size;
  const int64_t S = batch.source_len;
  const int64_t T = batch.seq_len;
  const int64_t c = config_.d_model;
  const int64_t ne = B * S;
  const int64_t nd = B * T;
  const DType act = options_.compute_dtype;
  const bool ckpt = options_.full_checkpointing();
  const int enc_norm_unit = static_cast<int>(E + 1);
  const int head_unit = static_cast<int>(E + D + 2);
  auto enc_unit = [&](int64_t l) { return static_cast<int>(1 + l); };
  auto dec_unit = [&](int64_t l) { return static_cast<int>(E + 2 + l); };
  const Dims dims = DimsFor(B, T, S);
  const BlockDims& ed = dims.encoder;
  const BlockDims& dd = dims.decoder;

  SK_ASSIGN_OR_RETURN(const ops::OpContext ctx, nn_internal::MakeContext(hooks, alloc));
  SK_ASSIGN_OR_RETURN(Tensor source, nn_internal::TokensToDevice(ctx, batch.source));
  SK_ASSIGN_OR_RETURN(Tensor inputs, nn_internal::TokensToDevice(ctx, batch.inputs));
  SK_ASSIGN_OR_RETURN(Tensor targets, nn_internal::TokensToDevice(ctx, batch.targets));
  UnitScope scope(hooks, units_, ctx);
  std::vector<Tensor> xe(static_cast<size_t>(E + 1));  // encoder block inputs; xe[E] -> enc_norm
  std::vector<Tensor> xd(static_cast<size_t>(D + 1));  // decoder block inputs; xd[D] -> head
  std::vector<BlockSaved> es(static_cast<size_t>(E)), ds(static_cast<size_t>(D));
  Tensor enc_out, enc_mean, enc_rstd;

  {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(0));
    const EmbedTensors e = BindEmbed(p);
    SK_ASSIGN_OR_RETURN(xe[0], NewAct(ctx, act, ne * c));
    SK_ASSIGN_OR_RETURN(xd[0], NewAct(ctx, act, nd * c));
    SK_RETURN_IF_ERROR(ops::EmbeddingForward(ctx, e.enc_tok, source, xe[0]));
    SK_RETURN_IF_ERROR(ops::EmbeddingForward(ctx, e.dec_tok, inputs, xd[0]));
    SK_RETURN_IF_ERROR(ops::BiasAdd(ctx, Prefix(e.enc_pos, S * c), xe[0]));
    SK_RETURN_IF_ERROR(ops::BiasAdd(ctx, Prefix(e.dec_pos, T * c), xd[0]));
    SK_RETURN_IF_ERROR(scope.PostForward(0));
  }
  for (int64_t l = 0; l < E; ++l) {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(enc_unit(l)));
    BlockSaved s;
    SK_RETURN_IF_ERROR(encoder_block_.Forward(ctx, ed, p, xe[l], Tensor(), &s));
    xe[l + 1] = s.subs.back().out;
    if (!ckpt && backward) es[l] = std::move(s);
    SK_RETURN_IF_ERROR(scope.PostForward(enc_unit(l)));
  }
  {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(enc_norm_unit));
    const Tensor& ln_g = p[0];  // [C]
    const Tensor& ln_b = p[1];  // [C]
    SK_ASSIGN_OR_RETURN(enc_out, NewAct(ctx, act, ne * c));
    SK_ASSIGN_OR_RETURN(enc_mean, NewF32(ctx, ne));
    SK_ASSIGN_OR_RETURN(enc_rstd, NewF32(ctx, ne));
    SK_RETURN_IF_ERROR(ops::LayerNormForward(ctx, xe[E], ln_g, ln_b, enc_out, enc_mean, enc_rstd));
    SK_RETURN_IF_ERROR(scope.PostForward(enc_norm_unit));
  }
  for (int64_t l = 0; l < D; ++l) {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(dec_unit(l)));
    BlockSaved s;
    SK_RETURN_IF_ERROR(decoder_block_.Forward(ctx, dd, p, xd[l], enc_out, &s));
    xd[l + 1] = s.subs.back().out;
    if (!ckpt && backward) ds[l] = std::move(s);
    SK_RETURN_IF_ERROR(scope.PostForward(dec_unit(l)));
  }
  HeadSaved head;
  float loss = 0.0f;
  {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(head_unit));
    SK_ASSIGN_OR_RETURN(loss, nn_internal::HeadForward(ctx, p, xd[D], targets, nd, c,
                                                       config_.vocab_size, act, backward, &head,
                                                       /*tied=*/false));
    SK_RETURN_IF_ERROR(scope.PostForward(head_unit));
  }
  if (!backward) return loss;

  Tensor dx;  // the head allocates it
  SK_ASSIGN_OR_RETURN(Tensor dnext, NewAct(ctx, act, nd * c));
  SK_ASSIGN_OR_RETURN(Tensor denc, nn_internal::ZerosF32(ctx, ne * c));
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(head_unit));
    SK_ASSIGN_OR_RETURN(loss, nn_internal::HeadBackward(ctx, b.p, b.g, xd[D], head, targets, nd, c,
                                                       config_.vocab_size, act, &dx, /*tied=*/false,
                                                       nn_internal::ClassifierGradScale(batch)));
    head = HeadSaved();
    xd[D] = Tensor();
    SK_RETURN_IF_ERROR(scope.PostBackward(head_unit, &b));
  }
  for (int64_t l = D - 1; l >= 0; --l) {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(dec_unit(l)));
    if (ckpt) {
      SK_RETURN_IF_ERROR(decoder_block_.Forward(ctx, dd, b.p, xd[l], enc_out, &ds[l]));
    }
    SK_RETURN_IF_ERROR(
        decoder_block_.Backward(ctx, dd, b.p, b.g, xd[l], enc_out, ds[l], dx, dnext, denc));
    ds[l] = BlockSaved();
    xd[l] = Tensor();
    std::swap(dx, dnext);
    SK_RETURN_IF_ERROR(scope.PostBackward(dec_unit(l), &b));
  }
  Tensor ddec_embed = dx;  // gradient of the decoder's input embedding
  SK_ASSIGN_OR_RETURN(Tensor ex, NewAct(ctx, act, ne * c));
  SK_ASSIGN_OR_RETURN(Tensor enext, NewAct(ctx, act, ne * c));
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(enc_norm_unit));
    SK_RETURN_IF_ERROR(ops::RoundToDType(ctx, denc, act));
    SK_RETURN_IF_ERROR(ops::Fill(ctx, ex, 0.0f));
    SK_RETURN_IF_ERROR(ops::LayerNormBackward(ctx, xe[E], b.p[0], denc, enc_mean, enc_rstd, ex,
                                              b.g[0], b.g[1]));
    enc_out = Tensor();
    denc = Tensor();
    dnext = Tensor();
    xe[E] = Tensor();
    SK_RETURN_IF_ERROR(scope.PostBackward(enc_norm_unit, &b));
  }
  for (int64_t l = E - 1; l >= 0; --l) {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(enc_unit(l)));
    if (ckpt) SK_RETURN_IF_ERROR(encoder_block_.Forward(ctx, ed, b.p, xe[l], Tensor(), &es[l]));
    SK_RETURN_IF_ERROR(
        encoder_block_.Backward(ctx, ed, b.p, b.g, xe[l], Tensor(), es[l], ex, enext, Tensor()));
    es[l] = BlockSaved();
    xe[l] = Tensor();
    std::swap(ex, enext);
    SK_RETURN_IF_ERROR(scope.PostBackward(enc_unit(l), &b));
  }
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackwardGradientsOnly(0));
    const EmbedTensors g = BindEmbed(b.g);
    SK_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx, source, ex, g.enc_tok));
    SK_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx, inputs, ddec_embed, g.dec_tok));
    SK_RETURN_IF_ERROR(ops::BiasGrad(ctx, ex, Prefix(g.enc_pos, S * c)));
    SK_RETURN_IF_ERROR(ops::BiasGrad(ctx, ddec_embed, Prefix(g.dec_pos, T * c)));
    SK_RETURN_IF_ERROR(scope.PostBackward(0, &b));
  }
  return loss;
}

StepFlops T5Model::Flops(int64_t batch_size, int64_t seq_len, int64_t source_len) const {
  const double dec_tokens = static_cast<double>(batch_size) * seq_len;
  const double enc_fwd = encoder_block_.ForwardMatmulFlops(batch_size, source_len, 0,
                                                           config_.d_model, config_.d_ff);
  const double dec_fwd = decoder_block_.ForwardMatmulFlops(batch_size, seq_len, source_len,
                                                           config_.d_model, config_.d_ff);
  const double head_fwd = 2.0 * dec_tokens * config_.d_model * config_.vocab_size;
  const double blocks = enc_fwd * config_.n_encoder_layers + dec_fwd * config_.n_decoder_layers;
  StepFlops f;
  f.model_flops = 3.0 * (blocks + head_fwd);
  f.hardware_flops = f.model_flops + (options_.full_checkpointing() ? blocks : 0.0);
  return f;
}

}  // namespace sk

namespace sk {

T5Model::Dims T5Model::DimsFor(int64_t batch_size, int64_t seq_len, int64_t source_len) const {
  Dims d;
  d.encoder.batch = batch_size;
  d.encoder.seq = source_len;
  d.encoder.d_model = config_.d_model;
  d.encoder.heads = config_.n_head;
  d.encoder.d_ff = config_.d_ff;
  d.encoder.storage = options_.compute_dtype;
  d.decoder = d.encoder;
  d.decoder.seq = seq_len;
  d.decoder.enc_seq = source_len;
  return d;
}

T5Model::ActivationTerms T5Model::TermsFor(const Dims& dims, DeviceKind device) const {
  const BlockDims& ed = dims.encoder;
  const int64_t ne = ed.batch * ed.seq, nd = dims.decoder.batch * dims.decoder.seq, c = config_.d_model;
  const int64_t E = config_.n_encoder_layers;
  const bool ckpt = options_.full_checkpointing();
  ActivationTerms t;
  // Activations and their gradients in the compute dtype (a bytes); ids,
  // the loss, LayerNorm statistics and the encoder-output gradient f32.
  t.a = static_cast<int64_t>(DTypeSize(ed.storage));
  const int64_t a = t.a;
  const int64_t enc_saved = encoder_block_.SavedBytes(ed, device);
  // (Parameters are used in place: no copies. 16-bit gradient buffers get
  // f32 sinks of a unit's size during its backward (UnitGrads); whoever hands
  // out such buffers counts them: FSDP's memory estimator does.)
  t.dec_saved = decoder_block_.SavedBytes(dims.decoder, device);
  // Kept through the forward: the token ids (source, inputs, targets) and
  // the loss, embeddings, block activations (or outputs), the encoder output
  // with its LayerNorm statistics.
  t.enc_kept = 4 * (ne + 2 * nd + 1) + a * ne * c + E * (ckpt ? a * ne * c : enc_saved) + a * ne * c + 4 * 2 * ne;
  // Backward buffers: dx (the head's, after its classifier), dnext and
  // denc (f32, both before the head).
  t.grads = 2 * a * nd * c + 4 * ne * c;
  // Encoder backward: the decoder is gone except the decoder-embedding
  // gradient; ex and enext; the last encoder block's temporaries.
  t.enc = (t.enc_kept - a * ne * c - (ckpt ? a * ne * c : 0)) + a * nd * c + 2 * a * ne * c +
          encoder_block_.BackwardTempBytes(ed, device) + (ckpt ? enc_saved : 0);
  return t;
}

int64_t T5Model::PeakActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                                     DeviceKind device) const {
  const Dims dims = DimsFor(batch_size, seq_len, source_len);
  const ActivationTerms t = TermsFor(dims, device);
  const int64_t nd = batch_size * seq_len, c = config_.d_model, a = t.a;
  const int64_t D = config_.n_decoder_layers;
  const bool ckpt = options_.full_checkpointing();
  const int64_t dec_kept = a * nd * c + D * (ckpt ? a * nd * c : t.dec_saved);
  // The head's backward: dnext and denc besides what HeadBackwardPeakBytes
  // counts (its saved LayerNorm, dln and the fused classifier's chunk, or
  // after it dx).
  const int64_t head = t.enc_kept + dec_kept + t.grads - a * nd * c +
                       nn_internal::HeadBackwardPeakBytes(nd, c, config_.vocab_size, dims.encoder.storage, 2);
  const int64_t dec = t.enc_kept + dec_kept - (ckpt ? a * nd * c : 0) + t.grads +
                      decoder_block_.BackwardTempBytes(dims.decoder, device) + (ckpt ? t.dec_saved : 0);
  return std::max({head, dec, t.enc});
}

// From the first decoder block's backward on (BackwardEndActivationBytes):
// that block with everything the encoder keeps, or later the encoder's
// backward from its last block (the most it holds), whichever is more.
int64_t T5Model::BackwardEndActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                                            DeviceKind device) const {
  const Dims dims = DimsFor(batch_size, seq_len, source_len);
  const ActivationTerms t = TermsFor(dims, device);
  const int64_t nd = batch_size * seq_len, c = config_.d_model;
  const int64_t first_dec = t.enc_kept + t.a * nd * c + t.dec_saved + t.grads +
                            decoder_block_.BackwardTempBytes(dims.decoder, device);
  return std::max(first_dec, t.enc);
}

}  // namespace sk
