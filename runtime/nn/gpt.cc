#include "runtime/nn/gpt.h"

#include <cmath>

namespace sk {

using nn_internal::BlockDims;
using nn_internal::BlockSaved;
using nn_internal::HeadSaved;
using nn_internal::Prefix;
using nn_internal::Positive;
using nn_internal::ValidateWidthAndVocab;
using nn_internal::SublayerKind;
using nn_internal::UnitGrads;
using nn_internal::UnitParams;
using nn_internal::UnitScope;

Status GptConfig::Validate() const {
  SK_RETURN_IF_ERROR(Positive(vocab_size, name, "vocab_size"));
  SK_RETURN_IF_ERROR(Positive(max_seq_len, name, "max_seq_len"));
  SK_RETURN_IF_ERROR(Positive(n_layer, name, "n_layer"));
  SK_RETURN_IF_ERROR(Positive(n_head, name, "n_head"));
  SK_RETURN_IF_ERROR(Positive(d_model, name, "d_model"));
  if (d_ff < 0) return InvalidArgumentError("config '" + name + "': d_ff must be >= 0");
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_layer, nn_internal::kMaxLayers, name, "n_layer"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(d_model, nn_internal::kMaxWidth, name, "d_model"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(d_ff, nn_internal::kMaxWidth, name, "d_ff"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(n_head, nn_internal::kMaxWidth, name, "n_head"));
  SK_RETURN_IF_ERROR(nn_internal::AtMost(max_seq_len, nn_internal::kMaxWidth, name, "max_seq_len"));
  SK_RETURN_IF_ERROR(ValidateWidthAndVocab(name, d_model, n_head, vocab_size));
  // Every factor is bounded above, so 128 bits hold each term.
  using W = __int128;
  const W d = d_model, f = ff(), layer = 4 * d * d + 2 * d * f + 9 * d + f;
  return nn_internal::CheckParameterCount(
      name, (W{vocab_size} + max_seq_len) * d + W{n_layer} * layer + 2 * d +
                (tie_word_embeddings ? W{0} : d * vocab_size));
}

StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config,
                                                     const ModelOptions& options) {
  SK_RETURN_IF_ERROR(ValidateCreate(config, options, /*supports_selective=*/true));
  return std::unique_ptr<GptModel>(new GptModel(config, options));
}

GptModel::GptModel(const GptConfig& config, const ModelOptions& options)
    : ConfiguredModel(config, options),
      block_({SublayerKind::kCausalSelfAttention, SublayerKind::kMlp}) {
  const int64_t d = config.d_model;
  const float std = 0.02f;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config.n_layer));
  UnitSpec embed{"embed", {}};
  embed.params.push_back({"wte", Shape{config.vocab_size, d}, Initializer::Normal(0.0f, std)});
  embed.params.push_back({"wpe", Shape{config.max_seq_len, d}, Initializer::Normal(0.0f, std)});
  units_.push_back(std::move(embed));
  for (int64_t l = 0; l < config.n_layer; ++l) {
    UnitSpec u{"h." + std::to_string(l), {}};
    block_.AppendSpecs(d, config.ff(), std, proj_std, &u.params);
    units_.push_back(std::move(u));
  }
  UnitSpec head{"head", {}};
  nn_internal::AppendHeadSpecs(d, config.vocab_size, std,
                               config.tie_word_embeddings ? "embed.wte" : "", &head);
  units_.push_back(std::move(head));
}

Status GptModel::ValidateBatch(const TokenBatch& batch) const {
  return nn_internal::ValidateDecoderBatch(batch, config_.name, config_.max_seq_len, config_.vocab_size);
}

StatusOr<float> GptModel::Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                              bool backward) const {
  SK_ASSIGN_OR_RETURN(const ops::OpContext ctx, nn_internal::MakeContext(hooks, alloc));
  const int64_t L = config_.n_layer;
  const int64_t T = batch.seq_len;
  const int64_t n = batch.batch_size * T;
  const int64_t c = config_.d_model;
  const DType act = options_.compute_dtype;
  const bool ckpt = options_.full_checkpointing();
  const bool selective = options_.selective_checkpointing();
  const int head_unit = static_cast<int>(L + 1);
  BlockDims dims;
  dims.batch = batch.batch_size;
  dims.seq = T;
  dims.d_model = c;
  dims.heads = config_.n_head;
  dims.d_ff = config_.ff();
  dims.storage = act;

  SK_ASSIGN_OR_RETURN(Tensor inputs, nn_internal::TokensToDevice(ctx, batch.inputs));
  SK_ASSIGN_OR_RETURN(Tensor targets, nn_internal::TokensToDevice(ctx, batch.targets));
  // Packed documents: position ids pick wpe's rows; segment ids mask the attention.
  SK_ASSIGN_OR_RETURN(const nn_internal::DocumentTensors docs,
                      nn_internal::DocumentsToDevice(ctx, batch));
  dims.key_start = docs.key_start;
  dims.masked_pairs = docs.masked_pairs;
  // xs[l] is block l's input; xs[L] feeds the head.
  std::vector<Tensor> xs(static_cast<size_t>(L + 1));
  std::vector<BlockSaved> saved(static_cast<size_t>(L));
  UnitScope scope(hooks, units_, ctx);

  {  // Embedding: token rows plus the first T positions, per sequence (or
     // the rows the position ids name, gathered in f32 and added with one
     // rounding, as BiasAdd adds).
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(0));
    const Tensor& wte = p[0];  // [V, C]
    const Tensor& wpe = p[1];  // [max_seq, C]
    SK_ASSIGN_OR_RETURN(xs[0], nn_internal::NewAct(ctx, act, n * c));
    SK_RETURN_IF_ERROR(ops::EmbeddingForward(ctx, wte, inputs, xs[0]));
    if (docs.positions.defined()) {
      SK_ASSIGN_OR_RETURN(Tensor pos, nn_internal::NewF32(ctx, n * c));
      SK_RETURN_IF_ERROR(ops::EmbeddingForward(ctx, wpe, docs.positions, pos));
      SK_RETURN_IF_ERROR(ops::Axpy(ctx, 1.0f, pos, xs[0]));
    } else {
      SK_RETURN_IF_ERROR(ops::BiasAdd(ctx, Prefix(wpe, T * c), xs[0]));
    }
    SK_RETURN_IF_ERROR(scope.PostForward(0));
  }
  for (int64_t l = 0; l < L; ++l) {
    const int u = static_cast<int>(l + 1);
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(u));
    BlockSaved s;
    SK_RETURN_IF_ERROR(block_.Forward(ctx, dims, p, xs[l], Tensor(), &s));
    xs[l + 1] = s.subs.back().out;
    if (selective) block_.ReleaseRecomputable(options_.recompute_attention, &s);
    if (!ckpt && backward) saved[l] = std::move(s);
    SK_RETURN_IF_ERROR(scope.PostForward(u));
    if (!backward && l > 0) xs[l] = Tensor();
  }
  HeadSaved head;
  float loss = 0.0f;
  {
    SK_ASSIGN_OR_RETURN(UnitParams p, scope.PreForward(head_unit));
    SK_ASSIGN_OR_RETURN(loss, nn_internal::HeadForward(ctx, p, xs[L], targets, n, c,
                                                       config_.vocab_size, act, backward, &head,
                                                       config_.tie_word_embeddings));
    SK_RETURN_IF_ERROR(scope.PostForward(head_unit));
  }
  if (!backward) return loss;

  // The running gradient: the head allocates it, each block's backward
  // works in it in place.
  Tensor dx;
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(head_unit));
    SK_ASSIGN_OR_RETURN(loss, nn_internal::HeadBackward(ctx, b.p, b.g, xs[L], head, targets, n, c,
                                                       config_.vocab_size, act, &dx,
                                                       config_.tie_word_embeddings,
                                                       nn_internal::ClassifierGradScale(batch)));
    head = HeadSaved();
    // The head's input, the last block's output, goes before the head's
    // gradient is reduced (both references; with checkpointing there is
    // no saved one).
    xs[L] = Tensor();
    if (!saved[L - 1].subs.empty()) saved[L - 1].subs.back().out = Tensor();
    SK_RETURN_IF_ERROR(scope.PostBackward(head_unit, &b));
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    const int u = static_cast<int>(l + 1);
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackward(u));
    if (ckpt) SK_RETURN_IF_ERROR(block_.Forward(ctx, dims, b.p, xs[l], Tensor(), &saved[l]));
    if (selective) {
      SK_RETURN_IF_ERROR(block_.RecomputeCheap(ctx, dims, b.p, xs[l], options_.recompute_attention,
                                               &saved[l]));
    }
    // The block output (xs[l + 1]) was the next block's input, done with:
    // its own backward does not read it.
    saved[l].subs.back().out = Tensor();
    SK_RETURN_IF_ERROR(
        block_.Backward(ctx, dims, b.p, b.g, xs[l], Tensor(), saved[l], dx, dx, Tensor()));
    saved[l] = BlockSaved();
    if (l > 0) xs[l] = Tensor();
    SK_RETURN_IF_ERROR(scope.PostBackward(u, &b));
  }
  {
    SK_ASSIGN_OR_RETURN(auto b, scope.PreBackwardGradientsOnly(0));
    const Tensor& dwte = b.g[0];  // [V, C]
    const Tensor& dwpe = b.g[1];  // [max_seq, C]
    SK_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx, inputs, dx, dwte));
    if (docs.positions.defined()) {
      SK_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx, docs.positions, dx, dwpe));
    } else {
      SK_RETURN_IF_ERROR(ops::BiasGrad(ctx, dx, Prefix(dwpe, T * c)));
    }
    SK_RETURN_IF_ERROR(scope.PostBackward(0, &b));
  }
  return loss;
}

namespace {

// One block's dimensions for a batch (Flops and PeakActivationBytes).
BlockDims GptBlockDims(const GptConfig& config, int64_t batch, int64_t seq, DType storage) {
  BlockDims d;
  d.batch = batch;
  d.seq = seq;
  d.d_model = config.d_model;
  d.heads = config.n_head;
  d.d_ff = config.ff();
  d.storage = storage;
  return d;
}

}  // namespace

StepFlops GptModel::Flops(int64_t batch_size, int64_t seq_len, int64_t /*source_len*/) const {
  const double tokens = static_cast<double>(batch_size) * seq_len;
  const double block_fwd = block_.ForwardMatmulFlops(batch_size, seq_len, 0, config_.d_model,
                                                     config_.ff());
  const double head_fwd = 2.0 * tokens * config_.d_model * config_.vocab_size;
  const double fwd = block_fwd * config_.n_layer + head_fwd;
  const BlockDims d = GptBlockDims(config_, batch_size, seq_len, options_.compute_dtype);
  double recompute = 0.0;  // per block
  if (options_.full_checkpointing()) recompute = block_fwd;
  if (options_.selective_checkpointing()) {
    recompute = block_.RecomputeCheapFlops(d, options_.recompute_attention);
  }
  StepFlops f;
  f.model_flops = 3.0 * fwd;
  f.hardware_flops = f.model_flops + recompute * config_.n_layer;
  return f;
}

}  // namespace sk

namespace sk {

// Kept through the forward: the token ids and targets on the device and
// the loss, the embedding output and, per block, either everything
// backward needs (less, with selective checkpointing, what RecomputeCheap
// rebuilds in the block's backward) or (full checkpointing) only the block
// output. (Parameters are used in place: no copies. 16-bit gradient
// buffers get f32 sinks of a unit's size during its backward (UnitGrads);
// whoever hands out such buffers counts them: FSDP's memory estimator
// does.)
int64_t GptModel::KeptActivationBytes(const BlockDims& d, DeviceKind device) const {
  const int64_t n = d.batch * d.seq, c = config_.d_model, L = config_.n_layer;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  return 4 * 2 * n + nn_internal::kLossBytes + a * n * c +
         L * (options_.full_checkpointing() ? a * n * c : SavedPerBlockBytes(d, device));
}

int64_t GptModel::SavedPerBlockBytes(const BlockDims& d, DeviceKind device) const {
  const int64_t recomputed = options_.selective_checkpointing()
                                 ? block_.RecomputableBytes(d, options_.recompute_attention, device)
                                 : 0;
  return block_.SavedBytes(d, device) - recomputed;
}

int64_t GptModel::PeakActivationBytes(int64_t batch_size, int64_t seq_len,
                                      int64_t /*source_len*/, DeviceKind device) const {
  const BlockDims d = GptBlockDims(config_, batch_size, seq_len, options_.compute_dtype);
  const int64_t n = batch_size * seq_len, c = config_.d_model;
  // Activations and their gradients are in the compute dtype (a bytes per
  // element); ids, targets and LayerNorm statistics are 4 bytes, the loss
  // one allocator block (kLossBytes).
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  const bool ckpt = options_.full_checkpointing();
  const int64_t recomputed = options_.selective_checkpointing()
                                 ? block_.RecomputableBytes(d, options_.recompute_attention, device)
                                 : 0;
  const int64_t saved = SavedPerBlockBytes(d, device);
  const int64_t kept = KeptActivationBytes(d, device);
  // Head backward: its saved LayerNorm (+ mean, rstd), dln and the fused
  // classifier's row losses and chunk of logits, or after them dx.
  const int64_t head = kept + nn_internal::HeadBackwardPeakBytes(n, c, config_.vocab_size, d.storage, 2);
  // Last block's backward: dx (the gradient runs in place), its
  // temporaries, and the recomputed activations of that block: all of it
  // with full checkpointing, the cheap ops' outputs with selective. dx
  // takes the place of the block's output (the head's input), released
  // before the backward; with checkpointing the kept output went with the
  // head and the recomputed one is released.
  const int64_t block = kept + block_.BackwardTempBytes(d, device) +
                        (ckpt ? saved - a * n * c : recomputed);
  return std::max(head, block);
}

// The first block's backward: the token ids, targets and loss, the
// embedding output (its input), dx, its temporaries and all it saved (or,
// checkpointed, recomputed) but its output (released: dx counts in its
// place).
int64_t GptModel::BackwardEndActivationBytes(int64_t batch_size, int64_t seq_len,
                                             int64_t /*source_len*/, DeviceKind device) const {
  const BlockDims d = GptBlockDims(config_, batch_size, seq_len, options_.compute_dtype);
  const int64_t n = batch_size * seq_len, c = config_.d_model;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  return 4 * 2 * n + nn_internal::kLossBytes + a * n * c + block_.BackwardTempBytes(d, device) +
         block_.SavedBytes(d, device);
}

// Before the head's backward: what the forward kept and the head's saved
// LayerNorm output and statistics. Every later moment between two units'
// backwards holds less: the head's backward releases its saved tensors and
// the last block's output and makes dx in its place, and each block's
// backward releases what the block saved (its output before it runs).
int64_t GptModel::BetweenBackwardsActivationBytes(int64_t batch_size, int64_t seq_len,
                                                  int64_t /*source_len*/, DeviceKind device) const {
  const BlockDims d = GptBlockDims(config_, batch_size, seq_len, options_.compute_dtype);
  const int64_t n = batch_size * seq_len;
  const int64_t a = static_cast<int64_t>(DTypeSize(d.storage));
  return KeptActivationBytes(d, device) + a * n * config_.d_model + 4 * 2 * n;
}

int64_t GptModel::PackedAttentionTemporaryBytes(int64_t batch_size, int64_t seq_len,
                                                DeviceKind device) const {
  return block_.PackedAttentionTemporaryBytes(
      GptBlockDims(config_, batch_size, seq_len, options_.compute_dtype), device);
}

}  // namespace sk
