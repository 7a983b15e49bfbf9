// The planner's production path: every candidate through SimulateTraining.
#include <algorithm>
#include <cstdio>

#include "runtime/fsdp/memory_estimator.h"
#include "runtime/plan/plan.h"
#include "runtime/sim/profile.h"
#include "runtime/train/memory_estimate.h"
#include "runtime/train/sim_run.h"

namespace sk::plan {

StatusOr<CandidateMetrics> SimulateCandidate(const PlanRequest& r, const Candidate& c,
                                             const std::string& trace_path) {
  SimRunOptions o;
  TrainerOptions& t = o.trainer;
  t.model = r.model;
  t.parallelism = c.parallelism;
  t.fsdp = c.fsdp;
  t.optimizer = r.optimizer;
  t.batch_size = r.batch_size;
  t.grad_accum_steps = r.grad_accum_steps;
  t.seq_len = r.seq_len;
  t.source_len = r.source_len;
  t.checkpointing = c.checkpointing();
  t.recompute_attention = c.recompute_attention;
  t.device.kind = DeviceKind::kSim;
  t.device.sim_profile = r.profile;
  t.device.sim_world_size = r.gpus;
  t.device.sim_gpus_per_node = r.gpus_per_node;
  o.warmup_steps = r.warmup_steps;
  o.steps = r.steps;
  o.trace_path = trace_path;
  SK_ASSIGN_OR_RETURN(SimStepReport s, SimulateTraining(o));
  CandidateMetrics m;
  m.step_seconds = s.step_seconds;
  m.peak_allocated_bytes = static_cast<int64_t>(s.peak_allocated_bytes);
  m.peak_reserved_bytes = static_cast<int64_t>(s.peak_reserved_bytes);
  m.peak_host_bytes = static_cast<int64_t>(s.peak_host_bytes);
  m.alloc_retries = s.alloc_retries;
  m.out_of_memory = s.out_of_memory;
  m.oom_detail = s.oom_detail;
  m.tflops_per_gpu = s.tflops_per_gpu;
  m.mfu = s.mfu;
  m.exposed_comm_seconds = s.exposed_comm_seconds;
  if (m.out_of_memory) {
    // The estimate of the Trainer the simulation ran (its sim device gives
    // the node size a hybrid strategy shards within).
    StatusOr<MemoryEstimate> est = EstimateTrainerMemory(t, r.gpus);
    if (est.ok()) {
      m.required_bytes = std::max(est->peak_bytes, std::max(m.peak_allocated_bytes, m.peak_reserved_bytes));
    }
  }
  return m;
}

std::string UncertaintyText(const sim::SimProfile& profile) {
  // Whose kernels the step times are priced with (sim::KernelImplementation).
  std::string kernels;
  if (!profile.implementation.empty()) kernels = " with " + profile.implementation + " kernels";
  if (!profile.validation) {
    return "step times are the profile's (" + profile.name + kernels +
           "); no published training run was checked against it (docs/planner.md, \"How far to trust it\")";
  }
  const sim::ValidationSpread& v = *profile.validation;
  char line[512];
  std::snprintf(line, sizeof(line),
                "; on %d published runs on this hardware, each priced with the kernels its framework ran, the "
                "predicted throughput was %.2f-%.2fx the measured (median %.2fx): read a step time as "
                "%.2f-%.2fx the one shown (benchmarks/results/planner_validation.md)",
                v.runs, v.ratio_low, v.ratio_high, v.ratio_median, v.ratio_low, v.ratio_high);
  return "step times are the profile's (" + profile.name + kernels + ")" + line;
}

StatusOr<PlanResult> Plan(const PlanRequest& request) {
  SK_RETURN_IF_ERROR(ValidatePlanRequest(request));
  SK_ASSIGN_OR_RETURN(sim::SimProfile profile, sim::LoadProfile(request.profile));
  PlanRequest searched = request;
  std::string note;
  if (!profile.host.has_value() && request.space.cpu_offload.empty()) {
    searched.space.cpu_offload = {false};
    note = "CPU offload not searched: the profile '" + profile.name +
           "' has no host section to price the host's memory and rates";
  }
  SK_ASSIGN_OR_RETURN(PlanResult result,
                      PlanWith(searched, profile.name,
                               static_cast<int64_t>(profile.device.memory_bytes), SimulateCandidate));
  if (!note.empty()) result.notes.push_back(note);
  result.uncertainty = UncertaintyText(profile);
  result.kernels = profile.implementation;
  return result;
}

}  // namespace sk::plan
