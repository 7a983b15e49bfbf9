#include "runtime/train/sim_run.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "runtime/core/trace.h"
#include "runtime/sim/profile.h"
#include "runtime/sim/sim_device.h"
#include "runtime/sim/sim_process_group.h"

namespace sk {
namespace {

using Interval = std::pair<double, double>;

// Sorted, disjoint union of `v`.
std::vector<Interval> Union(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

double Length(const std::vector<Interval>& u) {
  double total = 0;
  for (const Interval& i : u) total += i.second - i.first;
  return total;
}

// Total length of the intersection of two sorted disjoint unions.
double Overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first);
    const double hi = std::min(a[i].second, b[j].second);
    if (hi > lo) total += hi - lo;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

struct StepTimes {
  double compute_busy = 0;
  double exposed_comm = 0;
};

// The measured step's spans are read in place (SimDevice::VisitSpans): a
// copy of GPT-175B's tens of thousands of named spans was 1.7% of a plan.
StepTimes Analyse(const sim::SimDevice& device, int64_t compute_stream_id) {
  std::vector<Interval> compute, comm;
  device.VisitSpans([&](const sim::SpanRecord& s) {
    if (s.stream_id == compute_stream_id) compute.emplace_back(s.start_s, s.end_s);
    if (s.category == "comm") comm.emplace_back(s.start_s, s.end_s);
  });
  const std::vector<Interval> cu = Union(std::move(compute));
  const std::vector<Interval> co = Union(std::move(comm));
  return StepTimes{Length(cu), Length(co) - Overlap(co, cu)};
}

void FillMemory(const MemoryStats& m, SimStepReport& r) {
  r.peak_allocated_bytes = std::max(r.peak_allocated_bytes, static_cast<size_t>(m.allocated_bytes.peak));
  r.peak_reserved_bytes = std::max(r.peak_reserved_bytes, static_cast<size_t>(m.reserved_bytes.peak));
}

}  // namespace

StatusOr<SimStepReport> SimulateTraining(const SimRunOptions& options) {
  const TrainerOptions& to = options.trainer;
  if (!KindCapabilities(to.device.kind).virtual_time) {
    return InvalidArgumentError("SimulateTraining needs trainer.device.kind = sim");
  }
  if (options.steps < 1) {
    return InvalidArgumentError("steps must be >= 1, got " + std::to_string(options.steps));
  }
  if (options.warmup_steps < 0) {
    return InvalidArgumentError("warmup_steps must be >= 0, got " +
                                std::to_string(options.warmup_steps));
  }
  // warmup_steps + steps counts the loop below: an int overflow (steps
  // 2^31 - 1) ran no step and reported 0 s/step as a result.
  if (options.warmup_steps > std::numeric_limits<int>::max() - options.steps) {
    return InvalidArgumentError("warmup_steps " + std::to_string(options.warmup_steps) + " + steps " +
                                std::to_string(options.steps) + " exceeds " +
                                std::to_string(std::numeric_limits<int>::max()));
  }
  SK_RETURN_IF_ERROR(ValidateTrainerOptions(to));
  SK_ASSIGN_OR_RETURN(sim::SimProfile profile, sim::LoadProfile(to.device.sim_profile));

  SimStepReport report;
  report.profile_name = profile.name;

  MemoryStats at_failure;
  StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(to, nullptr, &at_failure);
  if (!created.ok()) {
    if (created.status().code() != StatusCode::kResourceExhausted) return created.status();
    report.out_of_memory = true;
    report.oom_detail = "during set-up: " + std::string(created.status().message());
    FillMemory(at_failure, report);
    return report;
  }
  std::unique_ptr<Trainer> trainer = std::move(created).value();
  sim::SimDevice* device = trainer->sim_device();
  if (device == nullptr) return InternalError("a sim trainer without a sim device");
  const Stream* compute = trainer->data_parallel().compute_stream();
  const int64_t compute_id = compute != nullptr ? compute->id() : -1;

  const StepFlops flops = trainer->model().Flops(to.batch_size, trainer->options().seq_len,
                                                 trainer->options().source_len);
  report.model_flops_per_step = flops.model_flops * to.grad_accum_steps;

  // The simulated host memory of cpu_offload (null without it).
  sim::SimHostAllocator* host = nullptr;
  if (OffloadHost* offload = trainer->offload_host()) {
    host = dynamic_cast<sim::SimHostAllocator*>(offload->owned_allocator.get());
    if (host == nullptr) return InternalError("cpu_offload on sim without simulated host memory");
  }
  auto fill_host = [&] {
    if (host != nullptr) report.peak_host_bytes = std::max(report.peak_host_bytes, host->peak_bytes());
  };

  const int total = options.warmup_steps + options.steps;
  double seconds = 0, busy = 0, exposed = 0, cross_node = 0;
  auto* sim_world = dynamic_cast<sim::SimProcessGroup*>(&trainer->world());
  auto network_bytes = [&] { return sim_world != nullptr ? sim_world->links().network_bus_bytes() : 0.0; };
  for (int step = 0; step < total; ++step) {
    const double network_before = network_bytes();
    const bool measured = step >= options.warmup_steps;
    const bool traced = !options.trace_path.empty() && step + 1 == total;
    const int64_t retries_before = trainer->allocator().stats().num_alloc_retries;
    if (host != nullptr) host->ResetPeak();
    device->set_record_spans(measured);
    if (traced) {
      TraceRecorder::Global().Start();
      device->NameTraceTracks();
      TraceRecorder::Global().NameProcess(device->id().index, "simulated GPU (" + profile.name + ")");
    }
    StatusOr<StepMetrics> m = trainer->Step();
    if (traced) TraceRecorder::Global().Stop();
    const MemoryStats mem = trainer->allocator().stats();
    if (!m.ok()) {
      device->set_record_spans(false);
      if (m.status().code() != StatusCode::kResourceExhausted) return m.status();
      report.out_of_memory = true;
      report.oom_detail = "in step " + std::to_string(step + 1) + ": " +
                          std::string(m.status().message());
      FillMemory(mem, report);
      fill_host();
      report.alloc_retries += mem.num_alloc_retries - retries_before;
      return report;
    }
    if (!measured) continue;
    FillMemory(mem, report);
    fill_host();
    report.alloc_retries += mem.num_alloc_retries - retries_before;
    seconds += m->step_seconds;
    cross_node += network_bytes() - network_before;
    const StepTimes t = Analyse(*device, compute_id);
    busy += t.compute_busy;
    exposed += t.exposed_comm;
    if (traced) SK_RETURN_IF_ERROR(TraceRecorder::Global().WriteJson(options.trace_path));
  }
  device->set_record_spans(false);

  report.step_seconds = seconds / options.steps;
  report.compute_busy_seconds = busy / options.steps;
  report.exposed_comm_seconds = exposed / options.steps;
  report.cross_node_bytes = cross_node / options.steps;
  if (report.step_seconds > 0) {
    report.tflops_per_gpu = report.model_flops_per_step / report.step_seconds / 1e12;
  }
  const DType dtype = to.fsdp.mixed_precision.param_dtype;
  auto peak = profile.compute.gemm_peak_flops.find(dtype);
  if (peak == profile.compute.gemm_peak_flops.end()) {
    peak = profile.compute.gemm_peak_flops.find(DType::kF32);
  }
  if (peak != profile.compute.gemm_peak_flops.end() && peak->second > 0) {
    report.mfu = report.tflops_per_gpu * 1e12 / peak->second;
  }
  return report;
}

}  // namespace sk
