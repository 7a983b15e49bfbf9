// SimulateTraining: one call that runs the real Trainer (model, FSDP or DDP,
// CachingAllocator, optimizer) on the sim device and reports what a step
// would take on the simulated cluster: time, memory, out-of-memory, MFU and
// exposed communication. The planner (//tools:plan, sk_plan) and the paper
// harness are built on it. docs/simulator.md, "Running a model on sim".
//
// What it does: creates a Trainer with options.trainer (device.kind must be
// kSim; the trainer creates the simulated world of device.sim_world_size
// ranks), runs warmup_steps steps, then `steps` measured steps, and reports
// the mean measured step. The sim device's clocks are reset per run, so
// two runs of the same options give identical reports.
//
// Out of memory is a result, not an error: when the allocator refuses a
// request (the profile's capacity, or trainer.memory_cap_bytes), during
// set-up or a step, the report has out_of_memory = true, oom_detail holding
// the allocator's message (request, capacity, peak bytes), and the peaks
// reached so far; step times are then 0.
//
// Thread safety: uses the sim device of trainer.device.index (sim:0 by
// default) exclusively for the duration of the call; concurrent calls must
// use different indices. It also uses the process-wide TraceRecorder when
// trace_path is set, so at most one call at a time may trace.
#ifndef SHARDKIT_RUNTIME_TRAIN_SIM_RUN_H_
#define SHARDKIT_RUNTIME_TRAIN_SIM_RUN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/status.h"
#include "runtime/train/trainer.h"

namespace sk {

struct SimRunOptions {
  // The training configuration; trainer.device.kind must be kSim.
  TrainerOptions trainer;
  // Steps run before measuring (the first step records FSDP's execution
  // order and fills the allocator's cache); >= 0.
  int warmup_steps = 1;
  // Measured steps (>= 1); the report is their mean.
  int steps = 1;
  // Where to write a Chrome trace (JSON, virtual time) of the last measured
  // step; empty = none.
  std::string trace_path;
};

struct SimStepReport {
  // Virtual seconds of one measured step (mean), host start to device end.
  double step_seconds = 0;
  // Peaks over the measured steps (the allocator's, per GPU).
  size_t peak_allocated_bytes = 0;
  size_t peak_reserved_bytes = 0;
  // Peak bytes of the simulated host memory per GPU over the measured steps:
  // with FSDP's cpu_offload, what the code puts there (master and gradient
  // shards in f32, the reduced-gradient staging buffer, the optimizer's
  // state, the host's temporaries such as the grad-norm accumulator); 0
  // without offload (nothing else is placed in simulated host memory). Host
  // memory is not cached (sim::SimHostAllocator), so this is both allocated
  // and reserved. On an out-of-memory result, the peak reached by then (0
  // when set-up failed).
  size_t peak_host_bytes = 0;
  // Alloc retries (free cached segments, synchronise, retry) per measured
  // step, summed over the measured steps.
  int64_t alloc_retries = 0;
  bool out_of_memory = false;
  std::string oom_detail;
  // Model FLOPs of one step on one GPU (no recomputation; Model::Flops times
  // grad_accum_steps), and what they mean per second of step_seconds.
  double model_flops_per_step = 0;
  double tflops_per_gpu = 0;
  // tflops_per_gpu over the profile's dense GEMM peak for the compute dtype.
  double mfu = 0;
  // Mean per step: the compute stream's busy time, and the time some
  // collective ran while the compute stream was idle (the union of the
  // "comm" spans minus its intersection with the compute stream's spans).
  double compute_busy_seconds = 0;
  double exposed_comm_seconds = 0;
  // Mean per step: the bus bytes of the collectives whose group spans nodes
  // (sim::LinkSchedule::network_bus_bytes: what this GPU's share of its
  // node's NICs carries); 0 when every group stays inside a node.
  double cross_node_bytes = 0;
  std::string profile_name;
};

// InvalidArgument for options that cannot run (not kSim, steps < 1,
// warmup_steps < 0, anything ValidateTrainerOptions refuses); errors from
// the trainer other than out-of-memory; Unavailable/Internal when the trace
// cannot be written.
StatusOr<SimStepReport> SimulateTraining(const SimRunOptions& options);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_SIM_RUN_H_
