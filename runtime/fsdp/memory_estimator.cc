#include "runtime/fsdp/memory_estimator.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/nn/model_family.h"

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

// One unit as the walk sees it.
struct WalkUnit {
  int64_t padded = 0;  // elements of its flat parameter
  int64_t shard = 0;   // elements of one rank's shard
  // The f32 sinks a 16-bit gradient gets in the unit's backward (runtime/nn
  // UnitGrads: one per tensor the hooks hand it), for its own parameters,
  // and for the tied ones it borrows with their owner unit.
  std::vector<int64_t> sink_bytes;
  std::vector<std::pair<int, int64_t>> tied_sinks;
  std::vector<int> owners;  // the distinct owners of its tied parameters
  bool holds_params = true;  // BackwardHoldsParameters
};

struct WalkOptions {
  int64_t pd = 4;  // param_dtype's bytes
  int64_t rd = 4;  // the reduction's
  int shard_size = 1;
  bool persistent = false;  // SHARD_OPTIM, NO_SHARD: full params and grads kept (counted apart)
  bool keep_after_forward = false;  // SHARD_GRAD_OP: gathered from forward to the unit's backward
  bool offload = false;
  BackwardPrefetch prefetch = BackwardPrefetch::kBackwardPre;
  int limit = 2;  // the rate limiter's N (INT_MAX: off)
  // The device runs FSDP's stream ops in closures that keep the buffers
  // they captured until they have run (the CPU: fsdp_internal::OnStream):
  // a reduction's buffers stay allocated until the next unit waits for it,
  // an offloaded gather's staging until it is waited for. Elsewhere (cuda,
  // sim) ops are enqueued from the host, which drops the buffers at once:
  // they leave the allocator's allocated bytes when the hook that made them
  // returns (record_stream defers only their reuse, and the allocator waits
  // for those events before it reports running out).
  bool closures_hold = true;
};

// The device bytes of one moment of the backward: the transient buffers
// (gathered parameters, full gradients, sinks, reductions, staging; not the
// persistent strategies' full parameters and gradients), the gradient
// shards made by then, and where it is.
struct Moment {
  int64_t transient = 0;
  int64_t shards = 0;
  bool end = false;             // from the first block's backward on
  // While a unit's backward computes (its full gradient and sinks made);
  // otherwise between two units' backwards (a PreBackward's gathers, a
  // PostBackward, a reduction issued), when the model holds less
  // (Model::BetweenBackwardsActivationBytes).
  bool computing = false;
  bool no_activations = false;  // outside forward and backward
};

// Walks one micro-batch's backward as FullyShardedModel runs it (fsdp.cc,
// fsdp_gather_reduce.cc, fsdp_collectives.cc, fsdp_tied.cc), unit by unit in reverse execution
// order, and appends the moments where allocations peak:
//  - PreBackward: the unit's all-gather, its tied owners' (gathered again
//    where the strategy reshards after forward), BACKWARD_PRE's prefetch of
//    the next units while the rate limiter admits one more (in flight: a
//    unit gathered and not finished computing); with offload under a
//    16-bit param_dtype each issued gather's f32 staging of its shard,
//    freed by the time it is waited for (without closures, by the time the
//    next is issued);
//  - the computation: the unit's full gradient (f32 under a 16-bit
//    param_dtype when it is reduced right after: the Trainer's
//    f32_unsharded_gradients; param_dtype otherwise) and its owners' (made
//    now, kept until the owner reduces), f32 sinks for 16-bit gradients,
//    and (closures_hold) the previous unit's reduction still in flight;
//  - PostBackward, after BACKWARD_POST's prefetch: the unit's parameters
//    freed by FSDP but still held by the model's views
//    (BackwardHoldsParameters) until its backward scope ends;
//  - the reduction issued, after the previous one was waited for: the f32
//    gradient (held by the model's views) narrowed into a copy in a 16-bit
//    reduce dtype, a cast into the reduce dtype, the reduce-scatter's output
//    shard (NO_SHARD's copy of a kept full gradient), and the unit's
//    gradient shard, made by its first reduction of the step.
// With `sync` off (no_sync micro-batches) nothing is reduced and full
// gradients are kept; `grads_kept` starts with every unit's full gradient
// in param_dtype (the last no_sync micro-batch); `shards_made` with every
// gradient shard (sharded accumulation's later micro-batches).
void WalkBackward(const std::vector<WalkUnit>& units, const WalkOptions& o, bool sync, bool grads_kept,
                  bool shards_made, std::vector<Moment>* out) {
  const int n = static_cast<int>(units.size());
  std::vector<bool> gathered(n, o.persistent || o.keep_after_forward);
  std::vector<bool> in_flight(n, false), staged(n, false), shard_made(n, shards_made);
  // Each unit's full gradient: its bytes per element (0: none).
  std::vector<int64_t> grad(n, grads_kept ? o.pd : 0);
  int64_t pending = 0;  // what the reduction in flight holds
  int64_t shards = 0;
  if (!o.offload) {
    for (int u = 0; u < n; ++u) shards += shards_made ? F32(units[u].shard) : 0;
  }
  auto param_bytes = [&](int u) { return Blocks(units[u].padded * o.pd); };
  auto moment = [&](int64_t extra, bool end, bool computing = false) {
    Moment m;
    m.computing = computing;
    m.transient = pending + extra;
    for (int u = 0; u < n; ++u) {
      if (!o.persistent) {
        if (gathered[u]) m.transient += param_bytes(u);
        if (grad[u] > 0) m.transient += Blocks(units[u].padded * grad[u]);
      }
      if (staged[u]) m.transient += F32(units[u].shard);
    }
    m.shards = shards;
    m.end = end;
    out->push_back(m);
  };
  // Without closures, the largest staging allocated in the current hook
  // (each freed before the next gather allocates its own).
  int64_t momentary = 0;
  auto gather = [&](int u) {
    if (!gathered[u]) {
      gathered[u] = true;
      if (o.offload && o.pd != 4) {
        if (o.closures_hold) {
          staged[u] = true;
        } else {
          momentary = std::max(momentary, F32(units[u].shard));
        }
      }
    }
    in_flight[u] = true;
  };
  auto in_flight_count = [&] {
    int alive = 0;
    for (int u = 0; u < n; ++u) alive += !o.persistent && gathered[u] && in_flight[u] ? 1 : 0;
    return alive;
  };
  auto prefetch = [&](int from) {
    for (int c = from; c >= 0; --c) {
      if (gathered[c]) continue;
      if (in_flight_count() >= o.limit) return;
      gather(c);
    }
  };
  const int64_t full_grad_dtype = o.pd != 4 && sync && !o.persistent ? 4 : o.pd;
  for (int u = n - 1; u >= 0; --u) {
    const WalkUnit& unit = units[u];
    const bool end = u <= 1;
    // PreBackward.
    momentary = 0;
    gather(u);
    for (int owner : unit.owners) gather(owner);
    if (o.prefetch == BackwardPrefetch::kBackwardPre) prefetch(u - 1);
    moment(momentary, end);
    staged[u] = false;  // waited for: the cast has read the staging
    for (int owner : unit.owners) staged[owner] = false;
    if (grad[u] == 0) grad[u] = full_grad_dtype;
    for (int owner : unit.owners) {
      if (grad[owner] == 0) grad[owner] = full_grad_dtype;
    }
    int64_t sinks = 0;
    if (grad[u] != 4) {
      for (int64_t b : unit.sink_bytes) sinks += b;
    }
    for (const auto& [owner, b] : unit.tied_sinks) sinks += grad[owner] != 4 ? b : 0;
    moment(sinks, end, /*computing=*/true);
    // PostBackward: FSDP frees the parameters (and its owners' where it
    // reshards after forward); the model's views may hold them a while.
    int64_t scoped = 0;
    in_flight[u] = false;
    if (!o.persistent) {
      gathered[u] = false;
      if (unit.holds_params) scoped += param_bytes(u);
    }
    for (int owner : unit.owners) {
      in_flight[owner] = false;
      if (!o.persistent && !o.keep_after_forward) {
        gathered[owner] = false;
        if (unit.holds_params) scoped += param_bytes(owner);
      }
    }
    momentary = 0;
    if (o.prefetch == BackwardPrefetch::kBackwardPost) prefetch(u - 1);
    moment(sinks + scoped + momentary, end);
    if (!sync) continue;
    pending = 0;  // the previous reduction, waited for
    int64_t issued = 0;
    int64_t gdt = grad[u];
    if (!o.persistent && gdt == 4 && o.rd != 4) {
      // NarrowFullGradient: the f32 gradient stays referenced by the
      // model's views until the unit's backward scope ends.
      scoped += Blocks(unit.padded * 4);
      gdt = grad[u] = o.rd;
    }
    if (o.rd != gdt) issued += Blocks(unit.padded * o.rd);  // the cast it reduces
    if (o.shard_size > 1) {
      issued += Blocks(unit.shard * o.rd);
    } else if (o.persistent && o.rd == gdt) {
      issued += Blocks(unit.padded * o.rd);  // NO_SHARD reduces a copy of its kept gradient
    }
    if (!shard_made[u]) {
      shard_made[u] = true;
      if (!o.offload) shards += F32(unit.shard);
    }
    moment(sinks + scoped + issued, end);
    // The reduction holds its buffers (and, where the strategy frees it,
    // the full gradient) until the next unit's PostBackward waits for it;
    // without closures the host has dropped them already.
    pending = 0;
    if (o.closures_hold) {
      pending = issued;
      if (!o.persistent) pending += Blocks(unit.padded * grad[u]);
    }
    if (!o.persistent) grad[u] = 0;
  }
}

// Whether the backward of `unit` keeps the parameter views the hooks gave
// it (its own and the tied ones it borrows) until its PostBackward has
// returned: the views live in the unit's backward scope (runtime/nn
// UnitScope::PreBackward), so FSDP's freeing of the gathered parameters in
// PostBackward takes effect only after the reduction has been issued. A
// family whose description says so (ModelFamilyDescription::
// first_unit_backward_without_parameters: GPT, Llama and T5, whose input
// embeddings' backward uses UnitScope::PreBackwardGradientsOnly) runs unit
// 0's backward without them; any other unit, and every unit of a family
// that does not say so, is assumed to hold them (an upper bound).
// tests/fsdp/memory_estimator_test's tied-embedding cases measure it.
bool BackwardHoldsParameters(const NamedModelConfig& config, int unit) {
  const ModelFamilyDescription* family = FindModelFamily(config.family);
  const bool first_without = family != nullptr && family->first_unit_backward_without_parameters;
  return !(first_without && unit == 0);
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
  SK_ASSIGN_OR_RETURN(std::vector<std::vector<ParamRef>> tied, ResolveTiedParams(model->units()));
  std::vector<WalkUnit> units;
  for (size_t i = 0; i < model->units().size(); ++i) {
    const UnitSpec& u = model->units()[i];
    std::vector<std::pair<std::string, Shape>> ps;
    WalkUnit w;
    for (const ParamSpec& p : u.params) {
      ps.emplace_back(p.name, p.shape);
      w.sink_bytes.push_back(F32(p.shape.numel()));
    }
    SK_ASSIGN_OR_RETURN(FlatParamLayout layout, FlatParamLayout::Make(ps, f));
    e.parameters += layout.unpadded_numel();
    w.padded = layout.padded_numel();
    w.shard = layout.shard_numel();
    for (size_t k = 0; k < u.tied.size(); ++k) {
      const int o = tied[i][k].unit;
      w.tied_sinks.emplace_back(o, F32(u.tied[k].shape.numel()));
      if (std::find(w.owners.begin(), w.owners.end(), o) == w.owners.end()) w.owners.push_back(o);
    }
    w.holds_params = BackwardHoldsParameters(r.model, static_cast<int>(i));
    units.push_back(std::move(w));
    if (!r.fsdp.cpu_offload) {
      e.master_bytes += F32(layout.shard_numel());
      e.grad_shard_bytes += F32(layout.shard_numel());
      e.optimizer_bytes += state_per_elem > 0 ? (state_per_elem / 4) * F32(layout.shard_numel()) : 0;
    }
    if (persistent) e.persistent_bytes += 2 * Blocks(layout.padded_numel() * pd);
  }
  const int64_t all_shards = e.grad_shard_bytes;

  // The buffers in flight, moment by moment: the backward walked as
  // FullyShardedModel runs it (WalkBackward), once per kind of
  // micro-batch the step has.
  WalkOptions walk;
  walk.pd = pd;
  walk.rd = rd;
  walk.shard_size = f;
  walk.persistent = persistent;
  walk.keep_after_forward = keep_after_forward;
  walk.offload = r.fsdp.cpu_offload;
  walk.prefetch = r.fsdp.backward_prefetch;
  walk.closures_hold = KindCapabilities(r.device).ops_run_when_issued;
  walk.limit = r.fsdp.all_gather_limit.off() ? std::numeric_limits<int>::max()
                                          : r.fsdp.all_gather_limit.max_in_flight();
  std::vector<Moment> moments;
  const bool accumulates = r.grad_accum_steps > 1;
  const bool sharded_accumulation = ReducesEveryMicroBatch(r.fsdp);
  if (accumulates && !sharded_accumulation) {
    // no_sync: the micro-batches before the last keep every unit's full
    // gradient (param_dtype) and reduce nothing, no shard exists yet; the
    // last starts with all of them and reduces them unit by unit.
    WalkBackward(units, walk, /*sync=*/false, /*grads_kept=*/false, /*shards_made=*/false, &moments);
    WalkBackward(units, walk, /*sync=*/true, /*grads_kept=*/true, /*shards_made=*/false, &moments);
  } else {
    // Sharded accumulation: from the second micro-batch on every gradient
    // shard exists (made by the first's reductions).
    WalkBackward(units, walk, /*sync=*/true, /*grads_kept=*/false, /*shards_made=*/accumulates, &moments);
  }
  // The persistent strategies regather every unit after the optimizer step
  // (FullyShardedModel::EndMasterUpdate: all issued, then waited); with
  // CPU offload under a 16-bit param_dtype each gather stages its f32
  // master shard on the device until its cast has run.
  if (persistent && r.fsdp.cpu_offload && pd != 4) {
    Moment m;
    for (const WalkUnit& u : units) m.transient += F32(u.shard);
    m.no_activations = true;
    moments.push_back(m);
  }

  // The model counts its own activations and temporaries (runtime/nn), in
  // its tensors' bytes; the caching allocator rounds each tensor up to a
  // 512-byte block. Tensors of whole blocks lose nothing (a step of a
  // multiple of 128 rows: every [rows] f32 statistic is), but the small
  // ones (per-row norm statistics and log-sum-exps, token ids, the loss)
  // take up to a block more each: allowed for as up to 8 such tensors alive
  // per unit and 8 more for the step (tests/fsdp/memory_estimator_test's
  // 32-row cases fell 1.5-7 KB short of the measured peaks without it).
  const int64_t rounding = 8 * kBlock * (static_cast<int64_t>(units.size()) + 1);
  const int64_t peak_activations =
      model->PeakActivationBytes(r.batch_size, t, te, r.device) + packed + rounding;
  const int64_t end_activations =
      model->BackwardEndActivationBytes(r.batch_size, t, te, r.device) + packed + rounding;
  // Between two units' backwards (before the end). No attention runs
  // then, but the packed attention's temporaries stay counted (an upper
  // bound; 0 but on CUDA): a model without its own count (the default,
  // PeakActivationBytes) keeps exactly its estimate.
  const int64_t between_activations =
      std::min(model->BetweenBackwardsActivationBytes(r.batch_size, t, te, r.device) + packed + rounding,
               peak_activations);
  // Gradient shards exist from each unit's first reduction of a step to
  // ZeroGrad (FsdpParamGroup), and activations fall through the backward
  // while the shards grow. A moment's shards are the walk's; its
  // activations are bounded by the model's counts:
  //  - from the first block's backward on (an end moment), by
  //    Model::BackwardEndActivationBytes;
  //  - before it, by the activations' peak (the head's backward, or the
  //    last block's) while a unit's backward computes, and between two
  //    units' backwards (gathers issued, a unit's PostBackward, its
  //    reduction) by Model::BetweenBackwardsActivationBytes: the finished
  //    unit's saved activations and temporaries are gone by then (a GPT
  //    block's reduction no longer meets that block's activations); the
  //    shards and activations together by the
  //    larger of the two ends of that stretch: at its start the shard of
  //    the unit that runs last in forward beside the activations' peak, at
  //    its end every shard beside the end's activations. Activations fall
  //    and shards grow block by block, each by about the same amount, so
  //    between the two ends nothing is higher. (Accumulated sharded, every
  //    shard exists from the start.)
  // The optimizer step that follows holds the shards and less besides.
  const int64_t last_shard = accumulates && sharded_accumulation
                                 ? all_shards
                                 : (r.fsdp.cpu_offload ? 0 : F32(units.size() > 1 ? units.back().shard : 0));
  const int64_t start_bound = last_shard + peak_activations;
  const int64_t end_bound = all_shards + end_activations;
  int64_t best = -1;
  for (const Moment& m : moments) {
    int64_t shards = m.shards, activations = 0;
    if (m.no_activations) {
      activations = 0;
    } else if (m.end) {
      activations = end_activations;
    } else if (m.shards + (m.computing ? peak_activations : between_activations) <=
               std::max(start_bound, end_bound)) {
      activations = m.computing ? peak_activations : between_activations;
    } else if (start_bound >= end_bound) {
      shards = last_shard;
      activations = peak_activations;
    } else {
      shards = all_shards;
      activations = end_activations;
    }
    const int64_t total = m.transient + shards + activations;
    if (total > best) {
      best = total;
      e.unsharded_bytes = m.transient;
      e.grad_shard_bytes = shards;
      e.activation_bytes = activations;
    }
  }
  e.peak_bytes = e.master_bytes + e.grad_shard_bytes + e.optimizer_bytes + e.persistent_bytes +
                 e.unsharded_bytes + e.activation_bytes;
  return e;
}

}  // namespace sk
