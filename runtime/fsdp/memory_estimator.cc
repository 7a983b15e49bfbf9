#include "runtime/fsdp/memory_estimator.h"

#include <algorithm>
#include <cstdio>

namespace sk {

namespace {

// The caching allocator's block granularity.
constexpr int64_t kBlock = 512;
int64_t Blocks(int64_t bytes) { return (bytes + kBlock - 1) / kBlock * kBlock; }
int64_t F32(int64_t elems) { return Blocks(elems * 4); }

// Bytes of optimizer state per parameter element.
int64_t StateBytesPerElement(const OptimizerOptions& opt) {
  return opt.kind == OptimizerKind::kSgd ? (opt.momentum != 0 ? 4 : 0) : 8;
}

std::string MiB(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
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
  if (r.grad_accum_steps < 1) return InvalidArgumentError("grad_accum_steps must be >= 1");
  if (r.seq_len < 0 || r.source_len < 0) return InvalidArgumentError("sequence lengths must be >= 0");
  SK_RETURN_IF_ERROR(ValidateFsdpOptions(r.fsdp, r.world_size));
  const OptimizerOptions& opt = r.optimizer;
  SK_RETURN_IF_ERROR(ValidateOptimizerOptions(opt));
  ModelOptions mo;
  mo.compute_dtype = r.fsdp.mixed_precision.param_dtype;
  mo.activation_checkpointing = r.activation_checkpointing;
  mo.checkpointing = r.checkpointing;
  mo.recompute_attention = r.recompute_attention;
  SK_RETURN_IF_ERROR(CheckStepSizeFits(r.model, r.batch_size, r.seq_len, r.source_len));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModel(r.model, mo));
  const int64_t t = r.seq_len > 0 ? r.seq_len : r.model.seq_len;
  const int64_t te = r.source_len > 0 ? r.source_len : r.model.source_len;
  // Packed documents: one attention call's temporaries beyond the model's
  // counts (on CUDA, the linear-memory op's composed fallback), at either
  // activation peak (an attention backward runs at both).
  const int64_t packed =
      r.packed_documents ? model->PackedAttentionTemporaryBytes(r.batch_size, t, r.device) : 0;

  if (r.ddp) {
    // Full f32 replicas of parameters and gradients in buckets, full optimizer
    // state, a compute-dtype copy when it is not f32, and the activations.
    MemoryEstimate e;
    e.parameters = model->num_parameters();
    e.master_bytes = F32(e.parameters);
    e.grad_shard_bytes = F32(e.parameters);
    e.optimizer_bytes = (StateBytesPerElement(opt) / 4) * F32(e.parameters);
    const int64_t cd = static_cast<int64_t>(DTypeSize(r.fsdp.mixed_precision.param_dtype));
    e.persistent_bytes = cd == 4 ? 0 : Blocks(e.parameters * cd);
    e.activation_bytes = model->PeakActivationBytes(r.batch_size, t, te, r.device) + packed;
    e.peak_bytes = e.master_bytes + e.grad_shard_bytes + e.optimizer_bytes + e.persistent_bytes +
                   e.activation_bytes;
    return e;
  }
  // The same mesh and reshard policy FSDP builds its groups and shards from.
  SK_ASSIGN_OR_RETURN(const ShardingPlan sharding,
                      ResolveSharding(r.fsdp.strategy, r.fsdp.shard_group_size, r.world_size,
                                      r.fsdp.ranks_per_node));
  const int f = sharding.shard_size();
  const bool persistent = sharding.policy.keep_unsharded;
  const bool keep_after_forward = !sharding.policy.reshard_after_forward;
  const int64_t pd = static_cast<int64_t>(DTypeSize(r.fsdp.mixed_precision.param_dtype));
  // The reduction's dtype (FullyShardedModel::ReduceGradients: reduce_dtype,
  // else the gradients' dtype, which is param_dtype).
  const int64_t rd = static_cast<int64_t>(
      DTypeSize(r.fsdp.mixed_precision.ReduceDType()));
  const int64_t state_per_elem = StateBytesPerElement(opt);

  MemoryEstimate e;
  std::vector<int64_t> padded;
  // Units owning a parameter another unit uses (counted once, with them).
  SK_ASSIGN_OR_RETURN(std::vector<std::vector<ParamRef>> tied, ResolveTiedParams(model->units()));
  std::vector<bool> tied_owner(model->units().size(), false);
  for (const auto& refs : tied) {
    for (const ParamRef& t : refs) tied_owner[t.unit] = true;
  }
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
  // The reducing unit's buffers on the device (FSDP keeps at most one
  // reduction in flight; FullyShardedModel::ReduceGradients): its full
  // gradient in the reduce dtype (a cast when that differs from param_dtype:
  // the param_dtype original is released once the cast has read it), and
  // the reduce-scatter's output shard; NO_SHARD's "shard" is the whole
  // gradient, and it reduces a copy of its persistent full gradient when no
  // cast made one. With offload the reduced shard goes from there to host
  // memory, not to a device buffer.
  int64_t reducing = 0;
  if (f > 1) reducing += Blocks(largest / f * rd);
  if (persistent) {
    if (rd != pd || f == 1) reducing += Blocks(largest * rd);
  }
  if (!persistent) {
    int64_t params_alive = 0;
    int64_t smallest_counted = 0;  // the smallest unit counted in params_alive
    int prefetched = 0;  // gathers issued and not yet waited for at the peak
    if (keep_after_forward) {
      for (int64_t p : padded) params_alive += Blocks(p * pd);
    } else {
      const RateLimit rate = r.fsdp.all_gather_limit;
      int limit = rate.off() ? units : rate.max_in_flight();
      bool prefetch = r.fsdp.backward_prefetch != BackwardPrefetch::kNone;
      int alive = prefetch ? std::min(limit, units) : 1;
      prefetched = alive - 1;
      std::vector<int64_t> sorted(padded);
      std::sort(sorted.rbegin(), sorted.rend());
      for (int i = 0; i < alive; ++i) params_alive += Blocks(sorted[i] * pd);
      smallest_counted = sorted[alive - 1];
    }
    // Two full gradients (the unit computing, in f32 for any param_dtype: the
    // Trainer sets FsdpOptions::f32_unsharded_gradients, whatever the
    // request's options say; and the one reducing, in the reduce
    // dtype, which PostBackward rounds the f32 one into after the previous
    // reduction has finished) and the reduction's shard.
    e.unsharded_bytes = params_alive + F32(largest) + Blocks(largest * rd) + reducing;
    // CPU offload with a 16-bit param_dtype: an all-gather copies the host's
    // f32 master shard into a device buffer of the shard's size, then casts
    // it into the gathered buffer (FullyShardedModel::CopyMasterIn); that
    // buffer lives until the cast has run on the all-gather stream, so every
    // prefetched unit's may still be alive while the head unit computes.
    // (SHARD_GRAD_OP gathers only in forward; the persistent strategies at
    // set-up and after the optimizer step; f32 copies straight into place.)
    if (r.fsdp.cpu_offload && pd != 4) e.unsharded_bytes += prefetched * F32(largest / f);
    // A tied parameter's owner (GPT-2's embedding) is gathered again while
    // the unit that borrows it (the head) computes (counted already when it
    // is among the largest units above), and its full gradient (f32, as
    // every unit's here) is made then and lives until the owner's own
    // backward reduces it (FullyShardedModel, "Tied parameters").
    for (size_t u = 0; u < padded.size(); ++u) {
      if (!tied_owner[u]) continue;
      if (!keep_after_forward && padded[u] < smallest_counted) e.unsharded_bytes += Blocks(padded[u] * pd);
      e.unsharded_bytes += F32(padded[u]);
    }
  } else {
    e.unsharded_bytes = reducing;
  }
  // A 16-bit (persistent) full gradient is accumulated by the model through
  // f32 sinks of the unit's size (runtime/nn UnitGrads), alive during that
  // unit's backward.
  if (persistent && pd != 4) e.unsharded_bytes += F32(largest);
  // The model counts its own activations and temporaries (runtime/nn).
  e.activation_bytes = model->PeakActivationBytes(r.batch_size, t, te, r.device) + packed;

  // Gradient shards exist from each unit's first reduction of a step to
  // ZeroGrad (FsdpParamGroup), so the step has two peaks, and the estimate
  // is the larger with the buffers alive at it:
  //  - the activations' peak at the start of backward (the head's backward,
  //    or the last block's, after the head's reduction): with at most the
  //    shard of the unit that runs last in forward;
  //  - the end of backward, from the first block's backward on: every
  //    shard (the first unit's and the first block's are not made yet, but
  //    an upper bound), the same unsharded buffers in flight (the first
  //    block's, the input unit's prefetched, a reduction's), and the model's
  //    activations then (Model::BackwardEndActivationBytes). Activations
  //    fall and shards grow block by block, each by the same amount, so
  //    between the two ends nothing is higher. With checkpointing, or
  //    shards larger than a block's activations (few ranks), this one is.
  // The optimizer step that follows holds the shards and less besides.
  const int64_t all_shards = e.grad_shard_bytes;
  int64_t last_shard = r.fsdp.cpu_offload ? 0 : F32(model->units().size() > 1 ? padded.back() / f : 0);
  // Accumulation over micro-batches (the Trainer's): sharded, the later
  // micro-batches start their backward with every shard made; unsharded
  // (no_sync, where the strategy frees full gradients), every unit's full
  // gradient is kept in param_dtype from the first micro-batch's backward,
  // reduced and dropped unit by unit in the last.
  if (r.grad_accum_steps > 1) {
    if (ReducesEveryMicroBatch(r.fsdp)) {
      last_shard = all_shards;
    } else if (!persistent) {
      // Kept in param_dtype, the computing and the reducing unit's among
      // them: what remains of the two full gradients counted above is the
      // f32 sinks of a 16-bit unit's backward (UnitGrads) and a cast to a
      // different reduce dtype.
      e.unsharded_bytes -= F32(largest) + Blocks(largest * rd);
      for (int64_t p : padded) e.unsharded_bytes += Blocks(p * pd);
      if (pd != 4) e.unsharded_bytes += F32(largest);
      if (rd != pd) e.unsharded_bytes += Blocks(largest * rd);
    }
  }
  const int64_t states = e.master_bytes + e.optimizer_bytes + e.persistent_bytes + e.unsharded_bytes;
  const int64_t start = states + e.activation_bytes + last_shard;
  const int64_t end_activations = model->BackwardEndActivationBytes(r.batch_size, t, te, r.device) + packed;
  const int64_t end = states + all_shards + end_activations;
  if (end > start) {
    e.activation_bytes = end_activations;
  } else {
    e.grad_shard_bytes = last_shard;
  }
  e.peak_bytes = e.master_bytes + e.grad_shard_bytes + e.optimizer_bytes + e.persistent_bytes +
                 e.unsharded_bytes + e.activation_bytes;
  return e;
}

}  // namespace sk
