#include "runtime/plan/plan.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "runtime/nn/configs.h"
#include "runtime/sim/sim_process_group.h"

namespace sk::plan {
namespace {

constexpr const char* kDdpName = "DDP";

// The strategies in enumeration (and table) order.
const std::vector<std::string>& AllStrategies() {
  static const std::vector<std::string>* names = new std::vector<std::string>{
      kDdpName,      "FULL_SHARD",   "SHARD_GRAD_OP",       "SHARD_OPTIM",
      "NO_SHARD",    "HYBRID_SHARD", "HYBRID_SHARD_GRAD_OP"};
  return *names;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = Trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// What a strategy gathers, from the policy FSDP itself runs
// (runtime/parallel/sharding_plan.h).
bool GathersInBackward(ShardingStrategy s) { return ReshardPolicyFor(s).gathers_in_backward(); }
bool GathersInForward(ShardingStrategy s) { return ReshardPolicyFor(s).gathers_in_forward(); }

std::string DTypePairName(const MixedPrecisionPolicy& mp) {
  std::string s(DTypeName(mp.param_dtype));
  if (mp.ReduceDType() != mp.param_dtype) s += "/" + std::string(DTypeName(mp.ReduceDType()));
  return s;
}

std::vector<MixedPrecisionPolicy> DefaultDTypes() {
  MixedPrecisionPolicy f32, bf16, bf16_f32;
  bf16.param_dtype = DType::kBF16;
  bf16_f32.param_dtype = DType::kBF16;
  bf16_f32.reduce_dtype = DType::kF32;
  return {f32, bf16, bf16_f32};
}

std::vector<int> DefaultShardGroupSizes(int gpus, int gpus_per_node) {
  std::vector<int> v;
  for (int f = 2; f < gpus; ++f) {
    if (gpus % f != 0) continue;
    if ((f & (f - 1)) == 0 || f == gpus_per_node) v.push_back(f);
  }
  return v;
}

template <typename T>
std::vector<T> OrDefault(const std::vector<T>& v, std::vector<T> d) {
  return v.empty() ? d : v;
}

std::string Gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  if (!std::isfinite(v)) return "null";
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

// What ranks a result: 0 fits, 1 out of memory, 2 failed.
int Class(const CandidateResult& r) {
  if (!r.status.ok()) return 2;
  return r.metrics.out_of_memory ? 1 : 0;
}

// The memory a configuration that did not fit needed, as well as known.
int64_t NeededBytes(const CandidateResult& r) {
  return std::max({r.metrics.required_bytes, r.metrics.peak_allocated_bytes,
                   r.metrics.peak_reserved_bytes});
}

// A candidate's checkpointing fields from the policy searched.
void SetCheckpointing(const CheckpointingChoice& ck, Candidate* c) {
  c->activation_checkpointing = ck.policy == ActivationCheckpointing::kFull;
  c->selective_checkpointing = ck.policy == ActivationCheckpointing::kSelective;
  c->recompute_attention = c->selective_checkpointing && ck.recompute_attention;
  c->selective_matmuls = ck.policy == ActivationCheckpointing::kSelectiveMatmuls;
}

}  // namespace

std::string Candidate::StrategyName() const {
  if (parallelism == Parallelism::kDdp) return kDdpName;
  return ShardingStrategyName(fsdp.strategy);
}

std::string Candidate::Label() const {
  std::string s = StrategyName();
  const char* ckpt = activation_checkpointing                        ? " ckpt"
                     : selective_checkpointing && recompute_attention ? " sel-ckpt+attn"
                     : selective_checkpointing                        ? " sel-ckpt"
                     : selective_matmuls                              ? " sel-ckpt+mm"
                                                                      : "";
  if (parallelism == Parallelism::kDdp) {
    s += ckpt;
    return s + " " + std::string(DTypeName(fsdp.mixed_precision.param_dtype));
  }
  const ShardingStrategy st = fsdp.strategy;
  if (IsHybrid(st)) s += " F=" + std::to_string(fsdp.shard_group_size);
  if (GathersInBackward(st)) {
    switch (fsdp.backward_prefetch) {
      case BackwardPrefetch::kNone: s += " bwd=none"; break;
      case BackwardPrefetch::kBackwardPost: s += " bwd=POST"; break;
      default: s += " bwd=PRE"; break;
    }
  }
  if (GathersInForward(st)) {
    if (fsdp.forward_prefetch) s += " fwd";
    const bool prefetching = fsdp.forward_prefetch ||
                             (GathersInBackward(st) && fsdp.backward_prefetch != BackwardPrefetch::kNone);
    if (prefetching) {
      s += " limit=" + fsdp.all_gather_limit.ToString();
    }
  }
  s += ckpt;
  if (fsdp.cpu_offload) s += " offload";
  if (fsdp.grad_accumulation == GradAccumulation::kUnsharded) s += " no_sync";
  return s + " " + DTypePairName(fsdp.mixed_precision);
}

ActivationCheckpointing Candidate::checkpointing() const {
  if (activation_checkpointing) return ActivationCheckpointing::kFull;
  if (selective_checkpointing) return ActivationCheckpointing::kSelective;
  if (selective_matmuls) return ActivationCheckpointing::kSelectiveMatmuls;
  return ActivationCheckpointing::kNone;
}

StatusOr<std::vector<CheckpointingChoice>> ParseCheckpointingList(const std::string& list,
                                                                  const std::string& what) {
  std::vector<CheckpointingChoice> out;
  for (const std::string& item : SplitList(list)) {
    CheckpointingChoice c;
    if (item == "selective_attention") {
      c = CheckpointingChoice(ActivationCheckpointing::kSelective, true);
    } else {
      StatusOr<ActivationCheckpointing> p = ParseActivationCheckpointing(item, what);
      if (!p.ok()) {
        return InvalidArgumentError(what + ": '" + item +
                                    "' is not off, on, selective, selective_attention or "
                                    "selective_matmuls (on: the whole block recomputed)");
      }
      c = CheckpointingChoice(*p);
    }
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

StatusOr<std::vector<std::string>> ParseStrategyList(const std::string& list) {
  std::vector<std::string> out;
  for (const std::string& item : SplitList(list)) {
    const std::string u = Upper(item);
    const auto& all = AllStrategies();
    if (std::find(all.begin(), all.end(), u) == all.end()) {
      std::string known;
      for (const std::string& n : all) known += (known.empty() ? "" : ", ") + n;
      return InvalidArgumentError("unknown strategy '" + item + "' (known: " + known + ")");
    }
    if (std::find(out.begin(), out.end(), u) == out.end()) out.push_back(u);
  }
  if (out.empty()) return InvalidArgumentError("empty strategy list");
  return out;
}

StatusOr<std::vector<MixedPrecisionPolicy>> ParseDTypeList(const std::string& list) {
  std::vector<MixedPrecisionPolicy> out;
  for (const std::string& item : SplitList(list)) {
    MixedPrecisionPolicy mp;
    const size_t slash = item.find('/');
    auto param = ParseDType(item.substr(0, slash));
    if (!param.ok()) return InvalidArgumentError("dtype list entry '" + item + "': " + std::string(param.status().message()));
    mp.param_dtype = *param;
    if (slash != std::string::npos) {
      auto reduce = ParseDType(item.substr(slash + 1));
      if (!reduce.ok()) return InvalidArgumentError("dtype list entry '" + item + "': " + std::string(reduce.status().message()));
      if (*reduce != mp.param_dtype) mp.reduce_dtype = *reduce;
    }
    out.push_back(mp);
  }
  if (out.empty()) return InvalidArgumentError("empty dtype list");
  return out;
}

Status ValidatePlanRequest(const PlanRequest& r) {
  SK_RETURN_IF_ERROR(FindModelConfig(r.model).status().WithContext("model"));
  if (r.gpus < 1) return InvalidArgumentError("gpus must be >= 1, not " + std::to_string(r.gpus));
  if (r.gpus > sim::SimProcessGroup::kMaxWorldSize) {
    return InvalidArgumentError("gpus must be at most " + std::to_string(sim::SimProcessGroup::kMaxWorldSize) +
                                " (the simulator's largest world), not " + std::to_string(r.gpus));
  }
  if (r.gpus_per_node < 1) {
    return InvalidArgumentError("gpus_per_node must be >= 1, not " + std::to_string(r.gpus_per_node));
  }
  if (r.gpus > r.gpus_per_node && r.gpus % r.gpus_per_node != 0) {
    return InvalidArgumentError("gpus_per_node " + std::to_string(r.gpus_per_node) +
                                " does not divide gpus " + std::to_string(r.gpus));
  }
  if (r.profile.empty()) return InvalidArgumentError("profile is empty");
  if (r.batch_size < 1) return InvalidArgumentError("batch_size must be >= 1");
  if (r.grad_accum_steps < 1 || r.grad_accum_steps > kMaxPlanSteps) {
    return InvalidArgumentError("grad_accum_steps must be in [1, " + std::to_string(kMaxPlanSteps) + "], not " +
                                std::to_string(r.grad_accum_steps));
  }
  if (r.seq_len < 0 || r.source_len < 0) return InvalidArgumentError("sequence lengths must be >= 0");
  // Every candidate simulates warmup_steps + steps steps: 2^31 - 1 overflowed
  // their sum (0 s/step recommended), 10^6 took over a minute a candidate.
  if (r.steps < 1 || r.steps > kMaxPlanSteps) {
    return InvalidArgumentError("steps must be in [1, " + std::to_string(kMaxPlanSteps) + "], not " +
                                std::to_string(r.steps));
  }
  if (r.warmup_steps < 0 || r.warmup_steps > kMaxPlanSteps) {
    return InvalidArgumentError("warmup_steps must be in [0, " + std::to_string(kMaxPlanSteps) + "], not " +
                                std::to_string(r.warmup_steps));
  }
  SK_RETURN_IF_ERROR(ValidateOptimizerOptions(r.optimizer).WithContext("optimizer"));
  const auto& all = AllStrategies();
  for (const std::string& s : r.space.strategies) {
    if (std::find(all.begin(), all.end(), s) == all.end()) {
      return InvalidArgumentError("space.strategies: unknown strategy '" + s + "'");
    }
  }
  for (int f : r.space.shard_group_sizes) {
    if (f < 1 || r.gpus % f != 0) {
      return InvalidArgumentError("space.shard_group_sizes: " + std::to_string(f) +
                                  " does not divide gpus " + std::to_string(r.gpus));
    }
  }
  for (BackwardPrefetch p : r.space.backward_prefetch) {
    if (p != BackwardPrefetch::kNone && p != BackwardPrefetch::kBackwardPre &&
        p != BackwardPrefetch::kBackwardPost) {
      return InvalidArgumentError("space.backward_prefetch: value " + std::to_string(static_cast<int>(p)) +
                                  " is not NONE, BACKWARD_PRE or BACKWARD_POST");
    }
  }
  for (RateLimit l : r.space.rate_limits) SK_RETURN_IF_ERROR(ValidateRateLimit(l, "space.rate_limits"));
  for (const CheckpointingChoice& c : r.space.activation_checkpointing) {
    const int v = static_cast<int>(c.policy);
    if (v < 0 || v > static_cast<int>(ActivationCheckpointing::kSelectiveMatmuls)) {
      return InvalidArgumentError("space.activation_checkpointing: value " + std::to_string(v) +
                                  " is not off (0), full (1), selective (2) or selective_matmuls (3)");
    }
    if (c.recompute_attention && c.policy != ActivationCheckpointing::kSelective) {
      return InvalidArgumentError(std::string("space.activation_checkpointing: recompute_attention with '") +
                                  ActivationCheckpointingName(c.policy) +
                                  "' (it applies to selective checkpointing only)");
    }
  }
  for (const MixedPrecisionPolicy& mp : r.space.dtypes) {
    SK_RETURN_IF_ERROR(ValidateDType(mp.param_dtype).WithContext("space.dtypes"));
    if (mp.reduce_dtype) SK_RETURN_IF_ERROR(ValidateDType(*mp.reduce_dtype).WithContext("space.dtypes"));
  }
  return OkStatus();
}

StatusOr<std::vector<Candidate>> EnumerateCandidates(const PlanRequest& r) {
  SK_RETURN_IF_ERROR(ValidatePlanRequest(r));
  const PlanSpace& sp = r.space;
  const std::vector<std::string> strategies = OrDefault(sp.strategies, AllStrategies());
  const std::vector<int> factors =
      OrDefault(sp.shard_group_sizes, DefaultShardGroupSizes(r.gpus, r.gpus_per_node));
  const std::vector<BackwardPrefetch> bwd = OrDefault(
      sp.backward_prefetch,
      {BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost, BackwardPrefetch::kNone});
  const std::vector<bool> fwd = OrDefault(sp.forward_prefetch, {false, true});
  const std::vector<RateLimit> limits = OrDefault(
      sp.rate_limits, {RateLimit::InFlight(2), RateLimit::InFlight(1), RateLimit::InFlight(4), RateLimit::Off()});
  const std::vector<CheckpointingChoice> ckpt = OrDefault(
      sp.activation_checkpointing,
      {CheckpointingChoice(ActivationCheckpointing::kNone), CheckpointingChoice(ActivationCheckpointing::kFull)});
  const std::vector<bool> offload = OrDefault(sp.cpu_offload, {false, true});
  const std::vector<MixedPrecisionPolicy> dtypes = OrDefault(sp.dtypes, DefaultDTypes());
  const std::vector<GradAccumulation> accumulation =
      OrDefault(sp.grad_accumulation, {GradAccumulation::kSharded, GradAccumulation::kUnsharded});

  std::vector<Candidate> out;
  std::set<std::string> seen;  // labels: no two candidates describe the same run
  auto add = [&](Candidate c) {
    if (!seen.insert(c.Label()).second) return;
    c.index = static_cast<int>(out.size());
    out.push_back(std::move(c));
  };
  for (const std::string& name : AllStrategies()) {
    if (std::find(strategies.begin(), strategies.end(), name) == strategies.end()) continue;
    if (name == kDdpName) {
      for (const MixedPrecisionPolicy& mp : dtypes) {
        for (const CheckpointingChoice& ck : ckpt) {
          Candidate c;
          c.parallelism = Parallelism::kDdp;
          c.fsdp.mixed_precision.param_dtype = mp.param_dtype;
          SetCheckpointing(ck, &c);
          add(c);
        }
      }
      continue;
    }
    SK_ASSIGN_OR_RETURN(ShardingStrategy st, ParseShardingStrategy(name));
    std::vector<int> fs = {0};
    if (IsHybrid(st)) {
      fs.clear();
      for (int f : factors) {
        if (f > 1 && f < r.gpus) fs.push_back(f);  // F = 1 or N is another strategy
      }
    }
    const std::vector<BackwardPrefetch> bwd_here =
        GathersInBackward(st) ? bwd : std::vector<BackwardPrefetch>{BackwardPrefetch::kBackwardPre};
    const std::vector<bool> fwd_here = GathersInForward(st) ? fwd : std::vector<bool>{false};
    // Only where a step has micro-batches and the strategy frees unsharded
    // gradients (the others keep them: there is nothing to choose).
    const bool frees_gradients = st != ShardingStrategy::kShardOptim && st != ShardingStrategy::kNoShard;
    const std::vector<GradAccumulation> accumulation_here =
        r.grad_accum_steps > 1 && frees_gradients ? accumulation
                                                  : std::vector<GradAccumulation>{GradAccumulation::kDefault};
    for (const MixedPrecisionPolicy& mp : dtypes) {
      for (const CheckpointingChoice& ck : ckpt) {
        for (bool off : offload) {
          for (int f : fs) {
            for (BackwardPrefetch b : bwd_here) {
              for (bool fw : fwd_here) {
                const bool prefetching =
                    fw || (GathersInBackward(st) && b != BackwardPrefetch::kNone);
                const std::vector<RateLimit> limits_here =
                    prefetching ? limits : std::vector<RateLimit>{kDefaultRateLimit};
                for (RateLimit l : limits_here) {
                  for (GradAccumulation ga : accumulation_here) {
                    Candidate c;
                    c.parallelism = Parallelism::kFsdp;
                    c.fsdp.strategy = st;
                    c.fsdp.shard_group_size = f;
                    c.fsdp.backward_prefetch = b;
                    c.fsdp.forward_prefetch = fw;
                    c.fsdp.all_gather_limit = l;
                    c.fsdp.cpu_offload = off;
                    c.fsdp.mixed_precision = mp;
                    c.fsdp.grad_accumulation = ga;
                    SetCheckpointing(ck, &c);
                    add(c);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

void RankResults(std::vector<CandidateResult>* results) {
  std::stable_sort(results->begin(), results->end(),
                   [](const CandidateResult& a, const CandidateResult& b) {
                     const int ca = Class(a), cb = Class(b);
                     if (ca != cb) return ca < cb;
                     if (ca == 0 && a.metrics.step_seconds != b.metrics.step_seconds) {
                       return a.metrics.step_seconds < b.metrics.step_seconds;
                     }
                     if (ca == 1 && NeededBytes(a) != NeededBytes(b)) {
                       return NeededBytes(a) < NeededBytes(b);
                     }
                     if (ca != 2 && a.metrics.peak_reserved_bytes != b.metrics.peak_reserved_bytes) {
                       return a.metrics.peak_reserved_bytes < b.metrics.peak_reserved_bytes;
                     }
                     return a.candidate.index < b.candidate.index;
                   });
}

StatusOr<PlanResult> PlanWith(const PlanRequest& request, const std::string& profile_name,
                              int64_t device_memory_bytes, const SimulateFn& simulate) {
  SK_ASSIGN_OR_RETURN(std::vector<Candidate> candidates, EnumerateCandidates(request));
  PlanResult result;
  result.request = request;
  result.profile_name = profile_name;
  result.device_memory_bytes = device_memory_bytes;
  for (const Candidate& c : candidates) {
    CandidateResult cr;
    cr.candidate = c;
    StatusOr<CandidateMetrics> m = simulate(request, c, "");
    if (m.ok()) {
      cr.metrics = *m;
    } else {
      cr.status = m.status();
    }
    result.results.push_back(std::move(cr));
    if (request.progress) request.progress(result.results.size(), candidates.size());
  }
  RankResults(&result.results);
  const std::string gib = Gib(device_memory_bytes) + " GiB";
  if (!result.results.empty() && result.results[0].fits()) {
    result.recommended = 0;
    const CandidateResult& best = result.results[0];
    result.recommendation = best.candidate.Label() + ": " + Fixed(best.metrics.step_seconds, 3) +
                            " s/step, " + Fixed(best.metrics.tflops_per_gpu, 1) + " TFLOPS/GPU (MFU " +
                            Fixed(100 * best.metrics.mfu, 1) + "%), peak reserved " +
                            Gib(best.metrics.peak_reserved_bytes) + " of " + gib;
    if (best.candidate.fsdp.cpu_offload) {
      result.recommendation += ", host " + Gib(best.metrics.peak_host_bytes) + " GiB per GPU";
    }
    if (!request.trace_path.empty()) {
      StatusOr<CandidateMetrics> traced = simulate(request, best.candidate, request.trace_path);
      if (!traced.ok()) {
        return traced.status().WithContext("tracing the recommended configuration to " +
                                           request.trace_path);
      }
    }
  } else {
    const CandidateResult* smallest = nullptr;
    for (const CandidateResult& r : result.results) {
      if (Class(r) == 1) {
        smallest = &r;
        break;
      }
    }
    result.recommendation = "nothing fits in " + gib + " per GPU";
    if (smallest != nullptr) {
      result.recommendation += "; the smallest peak is " + smallest->candidate.Label() + " (needs " +
                               Gib(NeededBytes(*smallest)) + " GiB)";
    } else if (!result.results.empty()) {
      result.recommendation += "; every candidate failed (first: " +
                               result.results[0].status.ToString() + ")";
    }
  }
  return result;
}

std::string FormatTable(const PlanResult& result, int top) {
  const PlanRequest& r = result.request;
  std::string out;
  char line[512];
  const int nodes = std::max(1, r.gpus / r.gpus_per_node);
  std::snprintf(line, sizeof(line),
                "shardkit plan: %s on %d GPUs (%d node%s x %d), batch %" PRId64
                " per GPU%s; simulated, profile %s%s (%s GiB per GPU)\n",
                r.model.c_str(), r.gpus, nodes, nodes == 1 ? "" : "s", std::min(r.gpus, r.gpus_per_node),
                r.batch_size,
                r.grad_accum_steps > 1
                    ? (" x " + std::to_string(r.grad_accum_steps) + " micro-batches").c_str()
                    : "",
                result.profile_name.c_str(),
                result.kernels.empty() ? "" : (" with " + result.kernels + " kernels").c_str(),
                Gib(result.device_memory_bytes).c_str());
  out += line;
  int fits = 0, ooms = 0, failed = 0;
  for (const CandidateResult& c : result.results) {
    (c.fits() ? fits : Class(c) == 1 ? ooms : failed)++;
  }
  std::snprintf(line, sizeof(line), "%zu candidates: %d fit, %d out of memory, %d failed\n",
                result.results.size(), fits, ooms, failed);
  out += line;
  // Why candidates failed: each distinct error once, with how many it hit.
  std::vector<std::pair<std::string, int>> reasons;
  for (const CandidateResult& c : result.results) {
    if (c.status.ok()) continue;
    const std::string why = c.status.ToString();
    auto it = std::find_if(reasons.begin(), reasons.end(), [&](const auto& r) { return r.first == why; });
    if (it == reasons.end()) {
      reasons.emplace_back(why, 1);
    } else {
      it->second++;
    }
  }
  for (const auto& [why, n] : reasons) {
    std::snprintf(line, sizeof(line), "  failed (%d): %s\n", n, why.c_str());
    out += line;
  }
  for (const std::string& note : result.notes) out += "  " + note + "\n";
  out += "\n";
  std::snprintf(line, sizeof(line), "%4s  %-56s %-4s %9s %9s %8s %7s %9s %8s %6s %9s\n", "rank",
                "configuration", "fits", "alloc GiB", "rsrvd GiB", "host GiB", "retries", "step s", "TFLOPS",
                "MFU %", "exposed s");
  out += line;
  auto row = [&](size_t i) {
    const CandidateResult& c = result.results[i];
    const CandidateMetrics& m = c.metrics;
    // Host memory per GPU: what CPU offload keeps there; "-" without offload.
    const std::string host = c.candidate.fsdp.cpu_offload ? Gib(m.peak_host_bytes) : "-";
    if (!c.status.ok()) {
      std::snprintf(line, sizeof(line), "%4zu  %-56s %-4s %s\n", i + 1, c.candidate.Label().c_str(), "err",
                    c.status.ToString().c_str());
    } else if (m.out_of_memory) {
      std::string needed = m.required_bytes > 0 ? "needs " + Gib(m.required_bytes) + " GiB" : "";
      std::snprintf(line, sizeof(line), "%4zu  %-56s %-4s %9s %9s %8s %7" PRId64 " %9s %8s %6s %9s  %s\n",
                    i + 1, c.candidate.Label().c_str(), "OOM", Gib(m.peak_allocated_bytes).c_str(),
                    Gib(m.peak_reserved_bytes).c_str(), host.c_str(), m.alloc_retries, "-", "-", "-", "-",
                    needed.c_str());
    } else {
      std::snprintf(line, sizeof(line), "%4zu  %-56s %-4s %9s %9s %8s %7" PRId64 " %9s %8s %6s %9s\n", i + 1,
                    c.candidate.Label().c_str(), "yes", Gib(m.peak_allocated_bytes).c_str(),
                    Gib(m.peak_reserved_bytes).c_str(), host.c_str(), m.alloc_retries,
                    Fixed(m.step_seconds, 3).c_str(),
                    Fixed(m.tflops_per_gpu, 1).c_str(), Fixed(100 * m.mfu, 1).c_str(),
                    Fixed(m.exposed_comm_seconds, 3).c_str());
    }
    out += line;
  };
  const size_t shown = top <= 0 ? result.results.size()
                                 : std::min(result.results.size(), static_cast<size_t>(top));
  for (size_t i = 0; i < shown; ++i) row(i);
  // The best of every strategy that the first rows did not show, so that
  // every strategy's verdict (DDP out of memory, ...) is visible.
  std::set<std::string> strategies_shown;
  for (size_t i = 0; i < shown; ++i) strategies_shown.insert(result.results[i].candidate.StrategyName());
  bool header = false;
  for (size_t i = shown; i < result.results.size(); ++i) {
    const std::string s = result.results[i].candidate.StrategyName();
    if (!strategies_shown.insert(s).second) continue;
    if (!header) {
      out += "  ... the best of each other strategy:\n";
      header = true;
    }
    row(i);
  }
  // Every strategy's verdict: how many of its candidates fit, ran out of
  // memory or failed, and its fastest step.
  out += "\n";
  std::snprintf(line, sizeof(line), "%-22s %5s %5s %7s %12s\n", "strategy", "fit", "OOM", "failed",
                "best step s");
  out += line;
  for (const std::string& name : AllStrategies()) {
    int f = 0, o = 0, e = 0;
    double best = -1;
    for (const CandidateResult& c : result.results) {
      if (c.candidate.StrategyName() != name) continue;
      const int k = Class(c);
      (k == 0 ? f : k == 1 ? o : e)++;
      if (k == 0 && (best < 0 || c.metrics.step_seconds < best)) best = c.metrics.step_seconds;
    }
    if (f + o + e == 0) continue;
    std::snprintf(line, sizeof(line), "%-22s %5d %5d %7d %12s\n", name.c_str(), f, o, e,
                  best < 0 ? "-" : Fixed(best, 3).c_str());
    out += line;
  }
  out += "\n";
  out += result.recommended >= 0 ? "recommended: " : "";
  out += result.recommendation + "\n";
  if (!result.uncertainty.empty()) out += "uncertainty: " + result.uncertainty + "\n";
  return out;
}

std::string FormatJson(const PlanResult& result) {
  const PlanRequest& r = result.request;
  std::string o = "{\n";
  o += "  \"simulated\": true,\n";
  o += "  \"profile\": " + JsonString(result.profile_name) + ",\n";
  if (!result.kernels.empty()) o += "  \"kernels\": " + JsonString(result.kernels) + ",\n";
  o += "  \"device_memory_bytes\": " + std::to_string(result.device_memory_bytes) + ",\n";
  o += "  \"model\": " + JsonString(r.model) + ",\n";
  o += "  \"gpus\": " + std::to_string(r.gpus) + ",\n";
  o += "  \"gpus_per_node\": " + std::to_string(r.gpus_per_node) + ",\n";
  o += "  \"batch_size\": " + std::to_string(r.batch_size) + ",\n";
  o += "  \"grad_accum_steps\": " + std::to_string(r.grad_accum_steps) + ",\n";
  o += "  \"seq_len\": " + std::to_string(r.seq_len) + ",\n";
  o += "  \"source_len\": " + std::to_string(r.source_len) + ",\n";
  o += "  \"recommended\": " + std::to_string(result.recommended) + ",\n";
  o += "  \"recommendation\": " + JsonString(result.recommendation) + ",\n";
  o += "  \"uncertainty\": " + JsonString(result.uncertainty) + ",\n";
  o += "  \"notes\": [";
  for (size_t i = 0; i < result.notes.size(); ++i) o += (i ? ", " : "") + JsonString(result.notes[i]);
  o += "],\n";
  o += "  \"candidates\": [";
  for (size_t i = 0; i < result.results.size(); ++i) {
    const CandidateResult& c = result.results[i];
    const Candidate& k = c.candidate;
    const CandidateMetrics& m = c.metrics;
    o += i == 0 ? "\n" : ",\n";
    o += "    {\"rank\": " + std::to_string(i + 1);
    o += ", \"label\": " + JsonString(k.Label());
    o += ", \"strategy\": " + JsonString(k.StrategyName());
    o += ", \"shard_group_size\": " + std::to_string(k.fsdp.shard_group_size);
    o += ", \"backward_prefetch\": " + JsonString(BackwardPrefetchName(k.fsdp.backward_prefetch));
    o += ", \"forward_prefetch\": " + std::string(k.fsdp.forward_prefetch ? "true" : "false");
    // The JSON keeps the C ABI's encoding (sk_plan_candidate.rate_limit: -1 = off).
    const RateLimit limit = k.fsdp.all_gather_limit;
    o += ", \"rate_limit\": " + std::to_string(limit.off() ? -1 : limit.max_in_flight());
    o += ", \"activation_checkpointing\": " + std::string(k.activation_checkpointing ? "true" : "false");
    // Only on selective candidates: plans without them print as before.
    if (k.selective_checkpointing) o += ", \"selective_checkpointing\": true";
    if (k.recompute_attention) o += ", \"recompute_attention\": true";
    if (k.selective_matmuls) o += ", \"selective_matmuls\": true";
    o += ", \"cpu_offload\": " + std::string(k.fsdp.cpu_offload ? "true" : "false");
    // Only where it was chosen (micro-batches): other plans print as before.
    if (k.fsdp.grad_accumulation != GradAccumulation::kDefault) {
      o += ", \"grad_accumulation\": " + JsonString(GradAccumulationName(k.fsdp.grad_accumulation));
    }
    o += ", \"param_dtype\": " + JsonString(std::string(DTypeName(k.fsdp.mixed_precision.param_dtype)));
    o += ", \"reduce_dtype\": " + JsonString(std::string(DTypeName(k.fsdp.mixed_precision.ReduceDType())));
    o += ", \"ok\": " + std::string(c.status.ok() ? "true" : "false");
    if (!c.status.ok()) o += ", \"error\": " + JsonString(c.status.ToString());
    o += ", \"fits\": " + std::string(c.fits() ? "true" : "false");
    o += ", \"out_of_memory\": " + std::string(m.out_of_memory ? "true" : "false");
    if (m.out_of_memory) o += ", \"oom_detail\": " + JsonString(m.oom_detail);
    o += ", \"required_bytes\": " + std::to_string(m.required_bytes);
    o += ", \"peak_allocated_bytes\": " + std::to_string(m.peak_allocated_bytes);
    o += ", \"peak_reserved_bytes\": " + std::to_string(m.peak_reserved_bytes);
    o += ", \"peak_host_bytes\": " + std::to_string(m.peak_host_bytes);
    o += ", \"alloc_retries\": " + std::to_string(m.alloc_retries);
    o += ", \"step_seconds\": " + Fixed(m.step_seconds, 9);
    o += ", \"tflops_per_gpu\": " + Fixed(m.tflops_per_gpu, 6);
    o += ", \"mfu\": " + Fixed(m.mfu, 6);
    o += ", \"exposed_comm_seconds\": " + Fixed(m.exposed_comm_seconds, 9);
    o += "}";
  }
  o += "\n  ]\n}\n";
  return o;
}

}  // namespace sk::plan
