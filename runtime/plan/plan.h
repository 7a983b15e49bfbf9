// The planner: which data-parallel configuration to train a model with on N
// GPUs, answered by simulating one training step of every candidate on the
// sim device (runtime/sim, docs/simulator.md) and ranking them.
//
// The candidate space (EnumerateCandidates) is the product of
//   strategy            DDP and FSDP's six (FULL_SHARD, SHARD_GRAD_OP,
//                       SHARD_OPTIM, NO_SHARD, HYBRID_SHARD,
//                       HYBRID_SHARD_GRAD_OP)
//   sharding factor     hybrid only: the shard-group sizes F with 1 < F < N
//                       that divide N and are a power of two or the GPUs per
//                       node
//   backward prefetch   NONE / BACKWARD_PRE / BACKWARD_POST, for the strategies
//                       that gather parameters again in backward (FULL_SHARD,
//                       HYBRID_SHARD)
//   forward prefetch    off / on, for the strategies that gather in forward
//                       (the two above and the two *_GRAD_OP)
//   rate limit          all_gather_limit 1 / 2 / 4 / off, for those same four
//                       when some prefetch is on (without prefetch only the
//                       unit being computed is ever gathered, so the limit
//                       cannot change anything and is not varied)
//   checkpointing       activation checkpointing off / on (whole block); selective,
//                       and selective with attention recomputed, when listed
//   CPU offload         off / on, FSDP strategies only (DDP has no shards to
//                       offload)
//   dtypes              param/reduce: f32/f32, bf16/bf16, bf16/f32; DDP takes
//                       the param dtype only (its buckets reduce in f32)
// with the combinations that cannot differ pruned as noted, so no two
// candidates describe the same run. A request may restrict every dimension.
//
// Ranking (RankResults): candidates that ran and fit in the device's memory
// first, by simulated step time; then those that ran out of memory, by the
// memory they needed (smallest first); then those that failed otherwise. Ties
// go to the smaller peak reserved memory, then to enumeration order, so the
// order is a total, deterministic function of the results. The recommendation
// is the first candidate when it fits; otherwise the plan says that nothing
// fits and names the candidate with the smallest peak.
//
// Determinism: candidates are enumerated in a fixed order and every number in
// the output comes from the simulation, which runs on virtual time, so the
// same request gives byte-identical table and JSON (a test).
//
// Thread safety: the functions are pure apart from the simulate callback they
// call (sequentially, from the calling thread).
#ifndef SHARDKIT_RUNTIME_PLAN_PLAN_H_
#define SHARDKIT_RUNTIME_PLAN_PLAN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/optim/optimizer.h"
#include "runtime/sim/profile.h"
#include "runtime/train/trainer.h"

namespace sk::plan {

// One activation-checkpointing policy the planner searches: the model's
// policy (kSelectiveMatmuls too) and, with kSelective only, whether the attention is recomputed too
// (ModelOptions::recompute_attention). Implicit from a policy, so that a
// list of policies ({kNone, kSelective}) is a list of choices.
struct CheckpointingChoice {
  ActivationCheckpointing policy = ActivationCheckpointing::kNone;
  bool recompute_attention = false;

  CheckpointingChoice() = default;
  CheckpointingChoice(ActivationCheckpointing p, bool attention = false)  // NOLINT: implicit
      : policy(p), recompute_attention(attention) {}
  bool operator==(const CheckpointingChoice&) const = default;
};

// "off", "on" (whole block; also "full", "true", "1"), "selective",
// "selective_attention" (selective with attention recomputed) or
// "selective_matmuls" (selective with every other matmul recomputed), as a
// comma-separated list; InvalidArgument naming `what` and the bad entry.
StatusOr<std::vector<CheckpointingChoice>> ParseCheckpointingList(const std::string& list,
                                                                  const std::string& what);

// One data-parallel configuration. For DDP only parallelism,
// fsdp.mixed_precision.param_dtype and the checkpointing fields matter.
struct Candidate {
  Parallelism parallelism = Parallelism::kFsdp;
  FsdpOptions fsdp;
  // Whole-block checkpointing ("ckpt" in the label), or selective
  // ("sel-ckpt"; runtime/nn/model.h: ActivationCheckpointing::kSelective).
  // At most one is set. recompute_attention only with selective
  // ("sel-ckpt+attn": the attention recomputed from the kept q/k/v too).
  // selective_matmuls: ActivationCheckpointing::kSelectiveMatmuls
  // ("sel-ckpt+mm"), exclusive with the other three.
  bool activation_checkpointing = false;
  bool selective_checkpointing = false;
  bool recompute_attention = false;
  bool selective_matmuls = false;
  // The position in EnumerateCandidates' order (the last tie-breaker).
  int index = 0;

  // "DDP" or the FSDP strategy's name ("FULL_SHARD", ...).
  std::string StrategyName() const;
  // A compact, unique description, e.g.
  // "HYBRID_SHARD F=8 bwd=PRE fwd limit=2 ckpt offload bf16/f32".
  std::string Label() const;
  // The policy the checkpointing fields stand for.
  ActivationCheckpointing checkpointing() const;
  // The policy with recompute_attention.
  CheckpointingChoice checkpointing_choice() const {
    return CheckpointingChoice(checkpointing(), recompute_attention);
  }
};

// What one simulated training step says about a candidate. Per GPU: one
// simulated rank stands for all (data parallelism is symmetric).
struct CandidateMetrics {
  double step_seconds = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  // Peak simulated host memory per GPU (SimStepReport::peak_host_bytes):
  // CPU offload's master and gradient shards, optimizer state and
  // temporaries; 0 without offload.
  int64_t peak_host_bytes = 0;
  int64_t alloc_retries = 0;
  bool out_of_memory = false;
  // What did not fit (the allocator's message) when out_of_memory.
  std::string oom_detail;
  // The bytes the step needed when out_of_memory and the simulator could tell
  // (0: unknown); the ranking of configurations that do not fit uses it.
  int64_t required_bytes = 0;
  double tflops_per_gpu = 0;   // model FLOPs (no recomputation) / step time
  double mfu = 0;              // tflops_per_gpu / the profile's dense peak
  double exposed_comm_seconds = 0;  // communication not hidden behind compute
};

struct CandidateResult {
  Candidate candidate;
  // Not OK when the simulation failed for another reason than memory (an
  // out-of-memory step is a result: metrics.out_of_memory).
  Status status;
  CandidateMetrics metrics;

  bool fits() const { return status.ok() && !metrics.out_of_memory; }
};

// Restrictions of the candidate space; an empty list means the whole
// dimension (the defaults in the header comment).
struct PlanSpace {
  // "DDP", "FULL_SHARD", ... (ParseStrategyList's names).
  std::vector<std::string> strategies;
  std::vector<int> shard_group_sizes;
  std::vector<BackwardPrefetch> backward_prefetch;
  std::vector<bool> forward_prefetch;
  // all_gather_limit values (RateLimit::InFlight(N), RateLimit::Off()).
  std::vector<RateLimit> rate_limits;
  // Empty: {kNone, kFull}. Selective checkpointing (with or without the
  // attention recomputed) is searched only where listed, so the default
  // space (and its plans) stay as they were.
  std::vector<CheckpointingChoice> activation_checkpointing;
  std::vector<bool> cpu_offload;
  // Param/reduce dtype pairs (reduce unset: the param dtype).
  std::vector<MixedPrecisionPolicy> dtypes;
  // Gradient accumulation (FsdpOptions::grad_accumulation), searched only
  // with grad_accum_steps > 1 and only for the strategies that free
  // unsharded gradients (SHARD_OPTIM and NO_SHARD keep theirs: unsharded).
  // Empty: both kSharded and kUnsharded ("no_sync" in the label).
  std::vector<GradAccumulation> grad_accumulation;
};

// The most simulated steps (warm-up, and measured) a plan runs per candidate:
// the planner's time grows with steps x candidates.
constexpr int kMaxPlanSteps = 1000;

struct PlanRequest {
  // A name from ModelConfigs() ("t5-11b", "gpt-175b", ...), a decoder by
  // its shape ("decoder:layers=32,...", runtime/nn/decoder_spec.h) or a
  // .json model file (FindModelConfig).
  std::string model;
  // The simulated cluster: GPUs in all, GPUs per node, and the hardware
  // profile (runtime/sim/profiles: "a100-80g", "h100-80g", "h200-141g", "cpu-local", or a
  // path ending in .json).
  int gpus = 8;
  int gpus_per_node = 8;
  std::string profile = "a100-80g";
  // Sequences per GPU per micro-batch; 0 sequence lengths = the model's
  // defaults.
  int64_t batch_size = 1;
  // Micro-batches per step (gradient accumulation, TrainerOptions): a step
  // runs this many forward/backward passes, synchronising gradients after
  // the last; peak memory is one micro-batch's, step time all of them.
  int grad_accum_steps = 1;
  int64_t seq_len = 0;
  int64_t source_len = 0;
  OptimizerOptions optimizer;
  PlanSpace space;
  // Steps simulated before the measured ones (caches warm, the execution
  // order recorded) and measured steps (their mean is reported).
  int warmup_steps = 1;
  int steps = 1;
  // When not empty, the recommended candidate is simulated once more with a
  // Chrome trace of its measured step written to this path.
  std::string trace_path;
  // Called after each simulated candidate with (done, total), from the
  // planning thread; empty: none. tools/plan reports progress on stderr with
  // it when a plan runs long (2^20 GPUs: about two minutes).
  std::function<void(size_t done, size_t total)> progress;
};

// NotFound for an unknown model (listing the known names); InvalidArgument
// naming the field: an unknown strategy name, gpus < 1 or above
// sim::SimProcessGroup::kMaxWorldSize (2^20),
// gpus_per_node < 1 or not dividing gpus, batch_size < 1, grad_accum_steps
// outside [1, 1000], negative lengths,
// steps < 1, warmup_steps < 0, a restriction value that is not valid
// (recompute_attention with a policy other than kSelective, say).
Status ValidatePlanRequest(const PlanRequest& request);

// "DDP,FULL_SHARD,hybrid_shard" -> the canonical names; InvalidArgument
// naming an unknown entry and listing the known ones.
StatusOr<std::vector<std::string>> ParseStrategyList(const std::string& list);
// "f32,bf16,bf16/f32" (param[/reduce]) -> policies; InvalidArgument otherwise.
StatusOr<std::vector<MixedPrecisionPolicy>> ParseDTypeList(const std::string& list);

// Every candidate of the request's space, in a fixed order, pruned as the
// header comment says. InvalidArgument as ValidatePlanRequest.
StatusOr<std::vector<Candidate>> EnumerateCandidates(const PlanRequest& request);

// The simulator's answer for one candidate: metrics, or an error (which the
// planner records against the candidate and goes on). `trace_path` empty:
// no trace.
using SimulateFn = std::function<StatusOr<CandidateMetrics>(
    const PlanRequest& request, const Candidate& candidate, const std::string& trace_path)>;

struct PlanResult {
  PlanRequest request;
  // The profile's name as loaded (the header says "simulated, profile X").
  std::string profile_name;
  // The profile's kernel implementation the step times were priced with
  // (sim::KernelImplementation: "shardkit" unless the request's profile
  // named another, "a100-80g:reference"); "" for a profile without any.
  std::string kernels;
  // Ranked (RankResults' order).
  std::vector<CandidateResult> results;
  // Index into results of the recommendation (0), or -1 when nothing fits.
  int recommended = -1;
  // One sentence: "FULL_SHARD ... : 1.234 s/step, 61.2 GiB peak reserved of
  // 80 GiB" or "nothing fits in 80 GiB per GPU; the smallest peak is ...".
  std::string recommendation;
  // Memory per GPU of the profile, bytes.
  int64_t device_memory_bytes = 0;
  // How far to trust the step times, one sentence: the validation table's
  // spread for the profile's hardware (sim::ValidationSpread), or that no
  // published run was checked on it. Plan fills it; FormatTable prints it
  // under the recommendation and FormatJson as "uncertainty".
  std::string uncertainty;
  // What the plan left out of its search by default, one sentence each
  // (Plan: CPU offload when the profile has no host section to price it).
  std::vector<std::string> notes;
};

// Sorts results into the planner's ranking (see the header comment).
void RankResults(std::vector<CandidateResult>* results);

// Enumerates, simulates each candidate with `simulate`, ranks, recommends,
// and (request.trace_path) simulates the recommended candidate once more
// with a trace. `profile_name` and `device_memory_bytes` label the output.
// Errors: InvalidArgument for the request; a candidate's failure is part of
// the result, not an error of the plan.
StatusOr<PlanResult> PlanWith(const PlanRequest& request, const std::string& profile_name,
                              int64_t device_memory_bytes, const SimulateFn& simulate);

// The production simulator of one candidate: SimulateTraining
// (runtime/train/sim_run.h) of the request's model on a simulated world of
// request.gpus ranks (request.gpus_per_node per node) with the request's
// profile, warmup and measured steps. For an out-of-memory candidate,
// required_bytes is the memory estimator's peak (runtime/fsdp/
// memory_estimator.h) when it exceeds what the simulation reached, so that
// configurations that do not fit rank by how far off they are. Errors: the
// simulator's (Unimplemented for CPU offload on sim, say).
StatusOr<CandidateMetrics> SimulateCandidate(const PlanRequest& request, const Candidate& candidate,
                                             const std::string& trace_path);

// PlanResult::uncertainty for a profile: its validation spread as one
// sentence, or that none was checked.
std::string UncertaintyText(const sim::SimProfile& profile);

// The plan: PlanWith(request, the profile's name and memory, SimulateCandidate).
// A profile without a "host" section cannot price CPU offload: unless the
// request names cpu_offload values itself, the search keeps it off and
// says so in notes (asking for offload there fails each such candidate
// with FailedPrecondition naming the profile).
// Errors: InvalidArgument/NotFound for the request or the profile.
StatusOr<PlanResult> Plan(const PlanRequest& request);

// The ranked table: a header naming the model, cluster, batch and "simulated,
// profile <name>", the counts (and each distinct failure), the first `top`
// rows (0: all), the best candidate of every strategy not among them, a
// per-strategy summary (fit / out of memory / failed, fastest step), and the
// recommendation.
std::string FormatTable(const PlanResult& result, int top = 0);
// The whole result as JSON (every candidate, ranked), with stable key order
// and fixed number formatting.
std::string FormatJson(const PlanResult& result);

}  // namespace sk::plan

#endif  // SHARDKIT_RUNTIME_PLAN_PLAN_H_
