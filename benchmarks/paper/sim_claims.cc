#include "benchmarks/paper/sim_claims.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/fsdp/fsdp.h"
#include "runtime/sim/profile.h"
#include "runtime/train/sim_run.h"
#include "runtime/train/trainer.h"

namespace sk::bench {
namespace {

struct Setup {
  std::string model;
  Parallelism parallelism = Parallelism::kFsdp;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int world = 8;
  int gpus_per_node = 8;
  int shard_group_size = 0;
  int64_t batch_size = 2;
  bool checkpointing = false;
  BackwardPrefetch prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  RateLimit all_gather_limit = kDefaultRateLimit;
};

StatusOr<SimStepReport> Run(const std::string& profile, const Setup& s) {
  SimRunOptions o;
  TrainerOptions& t = o.trainer;
  t.model = s.model;
  t.parallelism = s.parallelism;
  t.fsdp.strategy = s.strategy;
  t.fsdp.shard_group_size = s.shard_group_size;
  t.fsdp.backward_prefetch = s.prefetch;
  t.fsdp.forward_prefetch = s.forward_prefetch;
  t.fsdp.all_gather_limit = s.all_gather_limit;
  t.optimizer.kind = OptimizerKind::kAdamW;
  // The paper trains in bf16 mixed precision (f32 master shards, bf16 compute
  // and gradient reduction; docs/benchmarks.md), so every row does too.
  t.fsdp.mixed_precision.param_dtype = DType::kBF16;
  t.batch_size = s.batch_size;
  t.activation_checkpointing = s.checkpointing;
  t.device.kind = DeviceKind::kSim;
  t.device.sim_profile = profile;
  t.device.sim_world_size = s.world;
  t.device.sim_gpus_per_node = s.gpus_per_node;
  o.warmup_steps = 1;
  o.steps = 1;
  return SimulateTraining(o);
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Signed(double fraction) { return (fraction >= 0 ? "+" : "") + Fixed(fraction * 100, 1) + "%"; }

std::string Gib(size_t bytes) { return Fixed(bytes / double(1ull << 30), 1) + " GiB"; }

// "12.3 TFLOPS/GPU, 1.23 s/step, peak reserved 45.6 GiB" or "OOM (...)".
std::string Describe(const SimStepReport& r) {
  if (r.out_of_memory) return "out of memory (peak reserved " + Gib(r.peak_reserved_bytes) + ")";
  return Fixed(r.tflops_per_gpu, 1) + " TFLOPS/GPU (MFU " + Fixed(r.mfu * 100, 1) + "%), " +
         Fixed(r.step_seconds, 3) + " s/step, peak reserved " + Gib(r.peak_reserved_bytes) + ", " +
         std::to_string(r.alloc_retries) + " alloc retries";
}

Row Claim(const std::string& id, const std::string& evidence, const std::string& paper, const std::string& ours,
          const std::string& rel_error, const std::string& verdict, const std::string& rule) {
  Row r;
  r.Set("claim", id);
  r.Set("evidence", evidence);
  // Every simulated row is decided by the simulation (nothing is capped or
  // calibrated toward the paper's figure): its verdict can come out either way.
  r.Set("can_differ", "yes");
  r.Set("paper", paper);
  r.Set("ours", ours);
  r.Set("rel_error", rel_error);
  r.Set("verdict", verdict);
  r.Set("judged_by", rule);
  return r;
}

// One plotted value of a paper figure: `paper` is the paper's value at the
// same point (NaN where the paper gives none).
void Point(Table* points, const std::string& figure, const std::string& series, const std::string& x,
           double value, double paper = std::nan("")) {
  if (points == nullptr) return;
  Row r;
  r.Set("figure", figure);
  r.Set("series", series);
  r.Set("x", x);
  r.Set("value", value, 4);
  if (std::isfinite(paper)) {
    r.Set("paper", paper, 4);
  } else {
    r.Set("paper", "");
  }
  points->Add(std::move(r));
}

double GibOf(size_t bytes) { return bytes / double(1ull << 30); }

std::string Band(double error, double agree, double partly) {
  const double e = std::fabs(error);
  return e <= agree ? "agrees" : (e <= partly ? "partly" : "disagrees");
}

// FSDP vs DDP speed on the T5 models DDP fits (paper: parity).
Status AddFsdpDdpParity(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  for (const char* model : {"t5-611m", "t5-2.28b"}) {
    Setup s;
    s.model = model;
    s.batch_size = 4;
    SK_ASSIGN_OR_RETURN(SimStepReport fsdp, Run(profile, s));
    s.parallelism = Parallelism::kDdp;
    SK_ASSIGN_OR_RETURN(SimStepReport ddp, Run(profile, s));
    const std::string rule = "8 GPUs, batch 4/GPU: FULL_SHARD/DDP TFLOPS/GPU; agrees within 10% of 1, partly 25%";
    if (fsdp.out_of_memory || ddp.out_of_memory) {
      t.Add(Claim(std::string("fsdp_ddp_parity_") + model, ev, "FSDP as fast as DDP (ratio 1.00)",
                  "FULL_SHARD " + Describe(fsdp) + "; DDP " + Describe(ddp), "-", "disagrees", rule));
      continue;
    }
    const double ratio = fsdp.tflops_per_gpu / ddp.tflops_per_gpu;
    Point(points, "parity", "FULL_SHARD/DDP TFLOPS per GPU", model, ratio, 1.0);
    t.Add(Claim(std::string("fsdp_ddp_parity_") + model, ev, "FSDP as fast as DDP (ratio 1.00)",
                "FULL_SHARD/DDP " + Fixed(ratio, 3) + "x: FULL_SHARD " + Describe(fsdp) + "; DDP " + Describe(ddp),
                Signed(ratio - 1), Band(ratio - 1, 0.10, 0.25), rule));
  }
  return OkStatus();
}

// DDP out of memory above 2.28B while FSDP trains T5-11B (the allocator at
// the profile's capacity; no chosen cap).
Status AddDdpOutOfMemory(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  Setup s;
  s.model = "t5-2.28b";
  s.parallelism = Parallelism::kDdp;
  SK_ASSIGN_OR_RETURN(SimStepReport ddp_228, Run(profile, s));
  s.model = "t5-11b";
  SK_ASSIGN_OR_RETURN(SimStepReport ddp_11, Run(profile, s));
  s.parallelism = Parallelism::kFsdp;
  SK_ASSIGN_OR_RETURN(SimStepReport fsdp_11, Run(profile, s));
  const bool agrees = !ddp_228.out_of_memory && ddp_11.out_of_memory && !fsdp_11.out_of_memory;
  t.Add(Claim("ddp_oom_above_2.28b", ev, "DDP out of memory above 2.28B; FSDP trains T5-11B",
              "8 GPUs, batch 2/GPU: DDP t5-2.28b " + Describe(ddp_228) + "; DDP t5-11b " + Describe(ddp_11) +
                  "; FULL_SHARD t5-11b " + Describe(fsdp_11),
              "-", agrees ? "agrees" : "disagrees",
              "agrees when DDP fits 2.28B, runs out of memory on 11B and FULL_SHARD trains 11B, "
              "all at the profile's device capacity"));
  return OkStatus();
}

// Backward prefetch on GPT-175B (paper ~18%), BACKWARD_POST, forward prefetch.
Status AddBackwardPrefetch(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  Setup s;
  s.model = "gpt-175b";
  s.world = 128;
  s.batch_size = 1;
  s.checkpointing = true;
  s.prefetch = BackwardPrefetch::kNone;
  SK_ASSIGN_OR_RETURN(SimStepReport none, Run(profile, s));
  s.prefetch = BackwardPrefetch::kBackwardPre;
  SK_ASSIGN_OR_RETURN(SimStepReport pre, Run(profile, s));
  s.prefetch = BackwardPrefetch::kBackwardPost;
  SK_ASSIGN_OR_RETURN(SimStepReport post, Run(profile, s));
  s.prefetch = BackwardPrefetch::kBackwardPre;
  s.forward_prefetch = true;
  SK_ASSIGN_OR_RETURN(SimStepReport fwd, Run(profile, s));
  const std::string rule =
      "128 GPUs, batch 1/GPU, activation checkpointing: step-time speedup of BACKWARD_PRE over no "
      "prefetch; agrees 9%..36% (half to twice 18%), partly > 2%, disagrees otherwise";
  if (none.out_of_memory || pre.out_of_memory) {
    t.Add(Claim("backward_prefetch_gpt175b", ev, "+18% (BACKWARD_PRE over none)",
                "none " + Describe(none) + "; BACKWARD_PRE " + Describe(pre), "-", "disagrees", rule));
  } else {
    const double sp = none.step_seconds / pre.step_seconds - 1;
    auto speedup = [&](const SimStepReport& r) {
      return r.out_of_memory ? std::string("out of memory") : Signed(none.step_seconds / r.step_seconds - 1);
    };
    const std::string v = sp >= 0.09 && sp <= 0.36 ? "agrees" : (sp > 0.02 ? "partly" : "disagrees");
    Point(points, "prefetch", "speedup over no prefetch (%)", "BACKWARD_PRE", sp * 100, 18);
    if (!post.out_of_memory) {
      Point(points, "prefetch", "speedup over no prefetch (%)", "BACKWARD_POST",
            (none.step_seconds / post.step_seconds - 1) * 100);
    }
    if (!fwd.out_of_memory) {
      Point(points, "prefetch", "speedup over no prefetch (%)", "BACKWARD_PRE + forward",
            (none.step_seconds / fwd.step_seconds - 1) * 100);
    }
    t.Add(Claim("backward_prefetch_gpt175b", ev, "+18% (BACKWARD_PRE over none)",
                "speedup over none: BACKWARD_PRE " + Signed(sp) + ", BACKWARD_POST " + speedup(post) +
                    ", BACKWARD_PRE + forward prefetch " + speedup(fwd) + "; exposed comm none " +
                    Fixed(none.exposed_comm_seconds, 3) + " s, BACKWARD_PRE " + Fixed(pre.exposed_comm_seconds, 3) +
                    " s of a " + Fixed(none.step_seconds, 2) + " s step",
                Signed((sp - 0.18) / 0.18), v, rule));
  }
  return OkStatus();
}

// Rate limiter on T5-11B (paper: up to 5x).
Status AddRateLimiterT5(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  Setup s;
  s.model = "t5-11b";
  SK_ASSIGN_OR_RETURN(SimStepReport on, Run(profile, s));
  s.all_gather_limit = RateLimit::Off();
  SK_ASSIGN_OR_RETURN(SimStepReport off, Run(profile, s));
  std::string verdict, ours, err = "-";
  if (!on.out_of_memory && off.out_of_memory) {
    verdict = "partly";
    ours = "limiter off runs out of memory; limit 2 trains: " + Describe(on);
  } else if (!on.out_of_memory && !off.out_of_memory) {
    const double speedup = off.step_seconds / on.step_seconds;
    Point(points, "limiter", "off/limit-2 step time", "t5-11b", speedup, 5.0);
    verdict = speedup >= 2.5 ? "agrees" : (speedup > 1.1 ? "partly" : "disagrees");
    ours = "limit 2 " + Fixed(speedup, 2) + "x faster than off: limit 2 " + Describe(on) + "; off " + Describe(off);
    err = Signed((speedup - 5) / 5);
  } else {
    verdict = "disagrees";
    ours = "limit 2 " + Describe(on) + "; off " + Describe(off);
  }
  Point(points, "limiter_memory", "peak reserved GiB, limit 2", "t5-11b", GibOf(on.peak_reserved_bytes));
  Point(points, "limiter_memory", "peak reserved GiB, off", "t5-11b", GibOf(off.peak_reserved_bytes));
  t.Add(Claim("rate_limiter_t5_11b", ev, "up to 5x faster with the limiter (retries without it)", ours, err, verdict,
              "8 GPUs, batch 2/GPU, all_gather_limit 2 vs off: agrees >= 2.5x, partly > 1.1x or when off runs "
              "out of memory (the paper saw retries, not a failure)"));
  return OkStatus();
}

// Rate limiter on the paper's vision models (paper: RegNet-9B ~0,
// DeepViT-8B about -5%), unit-table models (runtime/nn/unit_table.h). The
// paper gives neither GPU count nor batch for these rows: one node of 8
// GPUs as the T5-11B row, and 8 images of 224x224 per GPU, an
// ImageNet-style per-GPU batch chosen before looking at the result.
Status AddRateLimiterVision(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  struct Effect {
    std::string text;  // what we saw
    double speedup = 0;  // off/limit-2 step time - 1: > 0 when the limiter helps
    bool ok = false;     // both ran without running out of memory
  };
  auto measure = [&](const char* model) -> StatusOr<Effect> {
    Setup s;
    s.model = model;
    s.batch_size = 8;
    SK_ASSIGN_OR_RETURN(SimStepReport on, Run(profile, s));
    s.all_gather_limit = RateLimit::Off();
    SK_ASSIGN_OR_RETURN(SimStepReport off, Run(profile, s));
    Effect e;
    e.ok = !on.out_of_memory && !off.out_of_memory;
    if (e.ok) {
      e.speedup = off.step_seconds / on.step_seconds - 1;
      Point(points, "limiter", "off/limit-2 step time", model, e.speedup + 1,
            std::string(model) == "regnet-9b" ? 1.0 : 0.95);
    }
    Point(points, "limiter_memory", "peak reserved GiB, limit 2", model, GibOf(on.peak_reserved_bytes));
    Point(points, "limiter_memory", "peak reserved GiB, off", model, GibOf(off.peak_reserved_bytes));
    e.text = std::string(model) + ": limiter " + (e.ok ? Signed(e.speedup) : std::string("n/a")) +
             " (limit 2 " + Describe(on) + "; off " + Describe(off) + ")";
    return e;
  };
  SK_ASSIGN_OR_RETURN(Effect regnet, measure("regnet-9b"));
  SK_ASSIGN_OR_RETURN(Effect deepvit, measure("deepvit-8b"));
  // RegNet: agrees within 5 points of 0, partly within 15. DeepViT: agrees
  // when the limiter costs 0..10% (up to twice the paper's 5%, no gain),
  // partly within 15 points either way.
  auto regnet_band = [](const Effect& e) {
    if (!e.ok) return std::string("disagrees");
    const double m = std::fabs(e.speedup);
    return std::string(m <= 0.05 ? "agrees" : (m <= 0.15 ? "partly" : "disagrees"));
  };
  auto deepvit_band = [](const Effect& e) {
    if (!e.ok) return std::string("disagrees");
    if (e.speedup <= 0 && e.speedup >= -0.10) return std::string("agrees");
    return std::string(std::fabs(e.speedup) <= 0.15 ? "partly" : "disagrees");
  };
  const std::string vr = regnet_band(regnet), vd = deepvit_band(deepvit);
  const std::string verdict =
      vr == "disagrees" || vd == "disagrees" ? "disagrees" : (vr == "agrees" && vd == "agrees" ? "agrees" : "partly");
  const std::string err =
      (regnet.ok ? "RegNet " + Fixed(regnet.speedup * 100, 1) + " points from 0" : std::string("RegNet -")) +
      "; " + (deepvit.ok ? "DeepViT " + Signed((deepvit.speedup + 0.05) / 0.05) : std::string("DeepViT -"));
  t.Add(Claim("rate_limiter_regnet_deepvit", ev, "RegNet-9B ~0, DeepViT-8B about -5%",
              regnet.text + "; " + deepvit.text, err, verdict,
              "8 GPUs, 8 images/GPU, all_gather_limit 2 vs off (unit-table models); limiter effect = "
              "off/limit-2 step time - 1. RegNet agrees within 5 points of 0, partly 15; DeepViT agrees "
              "at -10%..0%, partly within 15 points; the row agrees when both agree, disagrees when either "
              "does (or runs out of memory)"));
  return OkStatus();
}

// GPT-175B TFLOPS/GPU at 128..512 GPUs and its scaling.
Status AddGpt175bScaling(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  double first = 0, last = 0;
  std::string ours;
  bool oom = false;
  for (int world : {128, 256, 512}) {
    Setup s;
    s.model = "gpt-175b";
    s.world = world;
    s.batch_size = 1;
    s.checkpointing = true;
    SK_ASSIGN_OR_RETURN(SimStepReport r, Run(profile, s));
    oom = oom || r.out_of_memory;
    ours += (ours.empty() ? "" : "; ") + std::to_string(world) + " GPUs " + Describe(r);
    if (world == 128) first = r.tflops_per_gpu;
    // The paper: 173-186 TFLOPS/GPU over 128-512 GPUs; its midpoint.
    if (!r.out_of_memory) {
      Point(points, "gpt175b_scaling", "TFLOPS per GPU", std::to_string(world), r.tflops_per_gpu, 179.5);
    }
    last = r.tflops_per_gpu;
  }
  const double err = (last - 179.5) / 179.5;
  t.Add(Claim("gpt175b_tflops", ev, "173-186 TFLOPS/GPU (55-60% of peak)", ours, oom ? "-" : Signed(err),
              oom ? "disagrees" : Band(err, 0.10, 0.30),
              "batch 1/GPU, activation checkpointing, error against 179.5 at 512 GPUs: agrees within 10%, "
              "partly 30%. bf16 mixed precision; MFU is against the profile's bf16 GEMM peak"));
  const double scale = first > 0 ? last / first - 1 : 0;
  t.Add(Claim("gpt175b_scaling", ev, "linear 128->512 GPUs (TFLOPS/GPU flat)",
              "TFLOPS/GPU 512 vs 128 GPUs " + Signed(scale), oom ? "-" : Signed(scale),
              oom ? "disagrees" : Band(scale, 0.05, 0.15), "agrees within 5% of flat, partly 15%"));
  return OkStatus();
}

// T5-11B TFLOPS/GPU from 8 to 512 GPUs (paper -7%).
Status AddT5Scaling(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  Setup s;
  s.model = "t5-11b";
  SK_ASSIGN_OR_RETURN(SimStepReport r8, Run(profile, s));
  s.world = 512;
  SK_ASSIGN_OR_RETURN(SimStepReport r512, Run(profile, s));
  std::string err = "-", verdict = "disagrees";
  std::string ours = "8 GPUs " + Describe(r8) + "; 512 GPUs " + Describe(r512);
  if (!r8.out_of_memory && !r512.out_of_memory) {
    const double change = r512.tflops_per_gpu / r8.tflops_per_gpu - 1;
    Point(points, "t5_11b_scaling", "TFLOPS per GPU relative to 8 GPUs", "8", 1.0, 1.0);
    Point(points, "t5_11b_scaling", "TFLOPS per GPU relative to 8 GPUs", "512", 1 + change, 0.93);
    ours = "TFLOPS/GPU 8->512 " + Signed(change) + ": " + ours;
    err = Signed((change + 0.07) / 0.07);
    verdict = T5ScalingVerdict(change);
  }
  t.Add(Claim("t5_11b_scaling", ev, "-7% TFLOPS/GPU from 8 to 512 GPUs", ours, err, verdict,
              "batch 2/GPU: the paper gives -7% without error bars; agrees for a loss of 3.5-10.5% "
              "(half to 1.5x the paper's), partly for a loss up to 14% (twice), disagrees otherwise"));
  return OkStatus();
}

// Hybrid vs full sharding on the paper's topology (8 GPUs per node).
Status AddHybridVsFull(const std::string& profile, const std::string& ev, Table& t, Table* points) {
  Setup s;
  s.model = "t5-11b";
  s.world = 64;
  SK_ASSIGN_OR_RETURN(SimStepReport full, Run(profile, s));
  s.strategy = ShardingStrategy::kHybridShard;
  s.shard_group_size = 8;
  SK_ASSIGN_OR_RETURN(SimStepReport hybrid, Run(profile, s));
  std::string ours = "FULL_SHARD " + Describe(full) + "; HYBRID_SHARD (8 per group) " + Describe(hybrid);
  std::string verdict = "disagrees", err = "-";
  if (!full.out_of_memory && !hybrid.out_of_memory) {
    const double speed = full.step_seconds / hybrid.step_seconds;
    Point(points, "hybrid", "speed relative to FULL_SHARD", "HYBRID_SHARD (8 per group)", speed);
    Point(points, "hybrid_memory", "peak reserved GiB", "FULL_SHARD", GibOf(full.peak_reserved_bytes));
    Point(points, "hybrid_memory", "peak reserved GiB", "HYBRID_SHARD (8 per group)",
          GibOf(hybrid.peak_reserved_bytes));
    Point(points, "hybrid_traffic", "cross-node GiB per GPU per step", "FULL_SHARD", GibOf(full.cross_node_bytes));
    Point(points, "hybrid_traffic", "cross-node GiB per GPU per step", "HYBRID_SHARD (8 per group)",
          GibOf(hybrid.cross_node_bytes));
    const bool more_memory = hybrid.peak_reserved_bytes > full.peak_reserved_bytes;
    const bool less_traffic = hybrid.cross_node_bytes < full.cross_node_bytes;
    ours = "HYBRID_SHARD " + Fixed(speed, 3) + "x FULL_SHARD's speed, cross-node " +
           Fixed(GibOf(hybrid.cross_node_bytes), 2) + " vs " + Fixed(GibOf(full.cross_node_bytes), 2) +
           " GiB per GPU per step: " + ours;
    const int holds = (speed > 1.01) + more_memory + less_traffic;
    verdict = holds == 3 ? "agrees" : (holds > 0 ? "partly" : "disagrees");
  }
  t.Add(Claim("hybrid_vs_full_t5_11b", ev, "hybrid trades memory for speed across nodes", ours, err, verdict,
              "64 GPUs = 8 nodes of 8, batch 2/GPU: agrees if HYBRID_SHARD moves fewer cross-node bytes "
              "(bus bytes of collectives whose group spans nodes), holds more memory and is > 1% faster; "
              "partly if some of the three hold"));
  return OkStatus();
}

}  // namespace

std::string T5ScalingVerdict(double change) {
  // The paper gives one number (-7%) and no error bars, so the band is
  // tightened around it instead of argued from them: agrees within half the
  // paper's loss either side, partly for any loss up to twice it. (It used to
  // accept any loss of 2-20%, so a 17% loss agreed with 7%.)
  const double loss = -change;
  return loss >= 0.035 && loss <= 0.105 ? "agrees" : (loss > 0 && loss <= 0.14 ? "partly" : "disagrees");
}

StatusOr<Table> SimulatedClaims(const std::string& profile, Table* points) {
  Table t("claims_simulated");
  const std::string ev = "simulated (" + profile + ")";
  if (points != nullptr) {
    *points = Table("claims_simulated_points");
    // The device capacity the memory panels are drawn against.
    SK_ASSIGN_OR_RETURN(sim::SimProfile p, sim::LoadProfile(profile));
    Point(points, "capacity", "device memory GiB", p.name, GibOf(p.device.memory_bytes));
  }

  SK_RETURN_IF_ERROR(AddFsdpDdpParity(profile, ev, t, points));
  SK_RETURN_IF_ERROR(AddDdpOutOfMemory(profile, ev, t, points));
  SK_RETURN_IF_ERROR(AddBackwardPrefetch(profile, ev, t, points));
  SK_RETURN_IF_ERROR(AddRateLimiterT5(profile, ev, t, points));
  SK_RETURN_IF_ERROR(AddRateLimiterVision(profile, ev, t, points));
  SK_RETURN_IF_ERROR(AddGpt175bScaling(profile, ev, t, points));
  SK_RETURN_IF_ERROR(AddT5Scaling(profile, ev, t, points));
  SK_RETURN_IF_ERROR(AddHybridVsFull(profile, ev, t, points));
  return t;
}

}  // namespace sk::bench
