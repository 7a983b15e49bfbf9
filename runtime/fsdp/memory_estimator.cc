#include "runtime/fsdp/memory_estimator.h"

#include <algorithm>
#include <cstdio>

namespace sk {

namespace {

// The caching allocator's block granularity.
constexpr int64_t kBlock = 512;
int64_t Blocks(int64_t bytes) { return (bytes + kBlock - 1) / kBlock * kBlock; }
int64_t F32(int64_t elems) { return Blocks(elems * 4); }

std::string MiB(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

// Saved activations and backward temporaries of one transformer sublayer, as
// runtime/nn/transformer.cc allocates them.
struct Sublayer {
  int64_t saved = 0;
  int64_t backward_temp = 0;
};

Sublayer SelfAttention(int64_t b, int64_t t, int64_t c, int64_t h) {
  const int64_t n = b * t;
  // ln, mean, rstd, out, att, qkv, probs
  Sublayer s;
  s.saved = F32(n * c) + 2 * F32(n) + F32(n * c) + F32(n * c) + F32(3 * n * c) + F32(b * h * t * t);
  // dln, datt, dqkv, scratch
  s.backward_temp = F32(n * c) + F32(n * c) + F32(3 * n * c) + F32(t * t);
  return s;
}

Sublayer CrossAttention(int64_t b, int64_t t, int64_t te, int64_t c, int64_t h) {
  const int64_t n = b * t, ne = b * te;
  Sublayer s;
  // ln, mean, rstd, out, att, q, kv, probs
  s.saved = F32(n * c) + 2 * F32(n) + F32(n * c) + F32(n * c) + F32(n * c) + F32(2 * ne * c) +
            F32(b * h * t * te);
  // dln, datt, dq, dkv, scratch
  s.backward_temp = F32(n * c) + F32(n * c) + F32(n * c) + F32(2 * ne * c) + F32(t * te);
  return s;
}

Sublayer Mlp(int64_t b, int64_t t, int64_t c, int64_t f) {
  const int64_t n = b * t;
  Sublayer s;
  s.saved = F32(n * c) + 2 * F32(n) + F32(n * c) + 2 * F32(n * f);  // ln, mean, rstd, out, a, b
  s.backward_temp = F32(n * c) + F32(n * f);                        // dln, dh
  return s;
}

struct Stack {
  int64_t saved = 0;         // saved activations of one block
  int64_t block_input = 0;   // what checkpointing keeps per block
  int64_t backward_peak = 0; // block backward temporaries at their peak (incl. dcur)
};

Stack Block(const std::vector<Sublayer>& subs, int64_t n, int64_t c) {
  Stack s;
  for (const Sublayer& x : subs) s.saved += x.saved;
  s.block_input = F32(n * c);
  int64_t worst = 0;
  for (const Sublayer& x : subs) worst = std::max(worst, x.backward_temp);
  s.backward_peak = F32(n * c) + worst;  // dcur + the largest sublayer's temporaries
  return s;
}

// Activation bytes at the peak (the start of backward) for a decoder-only or
// encoder-decoder transformer.
int64_t ActivationPeak(const NamedModelConfig& m, int64_t b, int64_t t, int64_t te, bool ckpt) {
  if (m.family == ModelFamily::kGpt) {
    const GptConfig& g = m.gpt;
    const int64_t n = b * t, c = g.d_model;
    Stack blk = Block({SelfAttention(b, t, c, g.n_head), Mlp(b, t, c, g.ff())}, n, c);
    const int64_t L = g.n_layer;
    const int64_t embed = F32(n * c);
    const int64_t head_saved = F32(n * c) + 2 * F32(n) + F32(n * g.vocab_size);  // ln, mean, rstd, dlogits
    const int64_t per_block = ckpt ? blk.block_input : blk.saved;
    const int64_t stack = embed + L * per_block;
    // Head backward: dx and dln on top of everything saved.
    const int64_t head_bwd = stack + head_saved + 2 * F32(n * c);
    // Last block's backward: dx, dnext, (recomputed saved state), temporaries.
    const int64_t block_bwd = stack + 2 * F32(n * c) + (ckpt ? blk.saved : 0) + blk.backward_peak;
    return std::max(head_bwd, block_bwd);
  }
  const T5Config& g = m.t5;
  const int64_t n = b * t, ne = b * te, c = g.d_model;
  Stack enc = Block({SelfAttention(b, te, c, g.n_head), Mlp(b, te, c, g.d_ff)}, ne, c);
  Stack dec = Block({SelfAttention(b, t, c, g.n_head), CrossAttention(b, t, te, c, g.n_head),
                     Mlp(b, t, c, g.d_ff)}, n, c);
  const int64_t enc_stack = F32(ne * c) + g.n_encoder_layers * (ckpt ? enc.block_input : enc.saved) +
                            F32(ne * c) + 2 * F32(ne) + F32(ne * c);  // final norm: ln, mean, rstd, out
  const int64_t dec_stack = F32(n * c) + g.n_decoder_layers * (ckpt ? dec.block_input : dec.saved);
  const int64_t head_saved = F32(n * c) + 2 * F32(n) + F32(n * g.vocab_size);
  const int64_t base = enc_stack + dec_stack;
  const int64_t head_bwd = base + head_saved + 2 * F32(n * c);
  // Decoder backward also holds the encoder output's gradient.
  const int64_t block_bwd = base + 3 * F32(n * c) + F32(ne * c) + (ckpt ? dec.saved : 0) + dec.backward_peak;
  return std::max(head_bwd, block_bwd);
}

}  // namespace

std::string MemoryEstimate::ToString() const {
  return "master " + MiB(master_bytes) + " + grad shards " + MiB(grad_shard_bytes) +
         " + optimizer " + MiB(optimizer_bytes) + " + persistent " + MiB(persistent_bytes) +
         " + unsharded " + MiB(unsharded_bytes) + " + activations " + MiB(activation_bytes) +
         " = peak " + MiB(peak_bytes);
}

StatusOr<MemoryEstimate> EstimatePeakMemory(const MemoryEstimateRequest& r) {
  if (r.world_size < 1) return InvalidArgumentError("world_size must be >= 1");
  if (r.batch_size < 1) return InvalidArgumentError("batch_size must be >= 1");
  if (r.seq_len < 0 || r.source_len < 0) return InvalidArgumentError("sequence lengths must be >= 0");
  SK_RETURN_IF_ERROR(ValidateFsdpOptions(r.fsdp, r.world_size));
  OptimizerOptions opt = r.optimizer;
  if (opt.kind == OptimizerKind::kDefault) opt.kind = OptimizerKind::kAdamW;
  SK_RETURN_IF_ERROR(ValidateOptimizerOptions(opt));
  ModelOptions mo;
  mo.compute_dtype = r.fsdp.mixed_precision.param_dtype;
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModel(r.model, mo));
  const int64_t t = r.seq_len > 0 ? r.seq_len : r.model.seq_len;
  const int64_t te = r.source_len > 0 ? r.source_len : r.model.source_len;

  ShardingStrategy st = r.fsdp.strategy == ShardingStrategy::kDefault ? ShardingStrategy::kFullShard
                                                                        : r.fsdp.strategy;
  int f = r.world_size;
  if (st == ShardingStrategy::kNoShard) f = 1;
  if ((st == ShardingStrategy::kHybridShard || st == ShardingStrategy::kHybridShardGradOp) &&
      r.fsdp.shard_group_size > 0) {
    f = r.fsdp.shard_group_size;
  }
  const bool persistent = st == ShardingStrategy::kShardOptim || st == ShardingStrategy::kNoShard;
  const bool keep_after_forward = st == ShardingStrategy::kShardGradOp ||
                                  st == ShardingStrategy::kHybridShardGradOp;
  const int64_t pd = static_cast<int64_t>(DTypeSize(r.fsdp.mixed_precision.param_dtype));
  const int64_t state_per_elem = opt.kind == OptimizerKind::kSgd ? (opt.momentum != 0 ? 4 : 0) : 8;

  MemoryEstimate e;
  std::vector<int64_t> padded;
  for (const UnitSpec& u : model->units()) {
    std::vector<std::pair<std::string, Shape>> ps;
    for (const ParamSpec& p : u.params) ps.emplace_back(p.name, p.shape);
    SK_ASSIGN_OR_RETURN(FlatParamLayout layout, FlatParamLayout::Make(ps, f));
    e.parameters += layout.unpadded_numel();
    padded.push_back(layout.padded_numel());
    if (!r.fsdp.cpu_offload) {
      e.master_bytes += F32(layout.shard_numel());
      e.grad_shard_bytes += F32(layout.shard_numel());
      e.optimizer_bytes += state_per_elem > 0 ? (state_per_elem / 4) * F32(layout.shard_numel()) : 0;
    }
    if (persistent) e.persistent_bytes += 2 * Blocks(layout.padded_numel() * pd);
  }
  // In flight at the peak (the start of backward: the head unit computing its
  // gradients, the next unit prefetched, the previous gradient reducing).
  const int units = static_cast<int>(padded.size());
  const int64_t largest = *std::max_element(padded.begin(), padded.end());
  if (!persistent) {
    int64_t params_alive = 0;
    if (keep_after_forward) {
      for (int64_t p : padded) params_alive += Blocks(p * pd);
    } else {
      int limit = r.fsdp.all_gather_limit == 0 ? units : r.fsdp.all_gather_limit;
      bool prefetch = r.fsdp.backward_prefetch != BackwardPrefetch::kNone;
      int alive = prefetch ? std::min(limit, units) : 1;
      std::vector<int64_t> sorted(padded);
      std::sort(sorted.rbegin(), sorted.rend());
      for (int i = 0; i < alive; ++i) params_alive += Blocks(sorted[i] * pd);
    }
    // The unit's full gradient, and the reduction buffer of its shard.
    e.unsharded_bytes = params_alive + Blocks(largest * pd) + Blocks(largest / f * pd);
  }
  e.activation_bytes = ActivationPeak(r.model, r.batch_size, t, te, r.activation_checkpointing);
  if (pd != 4) {
    // bf16 compute: the computing unit's parameters widened to f32, and f32
    // gradient scratch, beside its bf16 buffers.
    e.activation_bytes += 2 * F32(largest);
  }
  e.peak_bytes = e.master_bytes + e.grad_shard_bytes + e.optimizer_bytes + e.persistent_bytes +
                 e.unsharded_bytes + e.activation_bytes;
  return e;
}

}  // namespace sk
