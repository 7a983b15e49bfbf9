#include "benchmarks/paper/run_config.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchmarks/paper/host_network.h"
#include "benchmarks/paper/report.h"
#include "benchmarks/util/stats.h"
#include "runtime/comm/local_backend.h"
#include "runtime/core/trace.h"
#include "runtime/train/local_session.h"

namespace sk::bench {

namespace {

StatusOr<std::vector<std::unique_ptr<comm::ProcessGroup>>> MakeWorld(const RunSpec& spec) {
  SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(spec.world));
  if (!spec.link.has_value()) return groups;
  std::vector<std::unique_ptr<comm::ProcessGroup>> wrapped;
  for (auto& g : groups) {
    if (spec.ranks_per_host > 0) {
      SK_ASSIGN_OR_RETURN(auto w, HostNetworkGroup::Wrap(std::move(g), spec.ranks_per_host,
                                                         *spec.link, spec.inter_host_link));
      wrapped.push_back(std::move(w));
    } else {
      SK_ASSIGN_OR_RETURN(auto w, comm::NetworkModelProcessGroup::Wrap(std::move(g), *spec.link));
      wrapped.push_back(std::move(w));
    }
  }
  return wrapped;
}

}  // namespace

RunResult RunConfig(const RunSpec& spec, Progress* progress) {
  RunResult result;
  auto world = MakeWorld(spec);
  if (!world.ok()) {
    result.error = world.status().ToString();
    return result;
  }
  const std::vector<std::shared_ptr<comm::ProcessGroup>> groups = LocalSession::Share(std::move(*world));
  result.network = groups[0]->label();
  const int n = spec.world;
  std::vector<Status> errors(n);
  // `memory`: every rank's allocator statistics at the failure.
  auto fail = [&](const Status& s, const std::vector<MemoryStats>& memory) {
    result.ok = false;
    result.oom = s.code() == StatusCode::kResourceExhausted;
    for (const Status& e : errors) result.oom = result.oom || e.code() == StatusCode::kResourceExhausted;
    result.error = s.ToString();
    for (const MemoryStats& st : memory) {
      result.ooms = std::max<int64_t>(result.ooms, st.num_ooms);
      result.alloc_retries = std::max<int64_t>(result.alloc_retries, st.num_alloc_retries);
    }
  };

  // Streams name their trace tracks when they are created, and Start()
  // drops earlier events: record creation too, and keep its names (the
  // metadata events) for the traced step's file.
  const bool tracing = !spec.trace_path.empty();
  if (tracing) TraceRecorder::Global().Start();
  std::vector<MemoryStats> memory_on_error;
  StatusOr<std::unique_ptr<LocalSession>> created =
      LocalSession::Create(spec.trainer, groups, &errors, &memory_on_error);
  nlohmann::json track_names = nlohmann::json::array();
  if (tracing) {
    TraceRecorder::Global().Stop();
    const nlohmann::json created_trace = nlohmann::json::parse(TraceRecorder::Global().ToJson());
    for (const auto& e : created_trace["traceEvents"]) {
      if (e.value("ph", "") == "M") track_names.push_back(e);
    }
  }
  if (!created.ok()) {
    fail(created.status(), memory_on_error);
    return result;
  }
  std::unique_ptr<LocalSession> session = std::move(*created);
  auto memory = [&] {
    std::vector<MemoryStats> stats;
    for (int r = 0; r < n; ++r) stats.push_back(session->trainer(r).allocator().stats());
    return stats;
  };
  std::vector<StepMetrics> metrics(n);
  auto step_all = [&] {
    return session->OnEveryRank(
        [&](int r, Trainer& t) -> Status {
          SK_ASSIGN_OR_RETURN(metrics[r], t.Step());
          return OkStatus();
        },
        &errors);
  };
  result.parameters = session->trainer(0).model().num_parameters();
  Status s;
  const int total_steps = spec.warmup_steps + spec.steps;
  for (int i = 0; i < spec.warmup_steps && s.ok(); ++i) {
    s = step_all();
    if (progress != nullptr) progress->StepDone(i + 1, total_steps);
  }
  auto cross_host = [&]() -> int64_t {
    auto* h = dynamic_cast<HostNetworkGroup*>(groups[0].get());
    return h == nullptr ? 0 : h->cross_host_bytes();
  };
  FullyShardedModel* fsdp0 = session->trainer(0).fsdp();
  const FsdpCounters before = fsdp0 != nullptr ? fsdp0->counters() : FsdpCounters();
  const int64_t cross_before = cross_host();
  double flops_per_rank = 0;
  int64_t bytes = 0;
  for (int i = 0; i < spec.steps && s.ok(); ++i) {
    s = step_all();
    if (!s.ok()) break;
    double slowest = 0;
    for (int r = 0; r < n; ++r) {
      slowest = std::max(slowest, metrics[r].step_seconds);
      result.peak_allocated_bytes = std::max(result.peak_allocated_bytes, metrics[r].peak_allocated_bytes);
      result.peak_reserved_bytes = std::max(result.peak_reserved_bytes, metrics[r].peak_reserved_bytes);
    }
    flops_per_rank = metrics[0].model_tflops_per_rank * metrics[0].step_seconds * 1e12;
    bytes += metrics[0].bytes_communicated;
    result.step_seconds.push_back(slowest);
    if (progress != nullptr) progress->StepDone(spec.warmup_steps + i + 1, total_steps);
  }
  if (!s.ok()) {
    fail(s, memory());
    return result;
  }
  const int steps = std::max(1, spec.steps);
  result.ok = true;
  result.median_seconds = UpperMedian(result.step_seconds);
  result.min_seconds = *std::min_element(result.step_seconds.begin(), result.step_seconds.end());
  result.max_seconds = *std::max_element(result.step_seconds.begin(), result.step_seconds.end());
  result.model_tflops_per_rank = flops_per_rank / result.median_seconds / 1e12;
  const TrainerOptions& o = session->trainer(0).options();
  result.tokens_per_second = static_cast<double>(o.batch_size) * o.seq_len * o.grad_accum_steps * n /
                             result.median_seconds;
  result.bytes_per_step = bytes / steps;
  result.cross_host_bytes_per_step = (cross_host() - cross_before) / steps;
  if (fsdp0 != nullptr) {
    const FsdpCounters& after = fsdp0->counters();
    result.replica_bytes_per_step = (after.replica_bytes - before.replica_bytes) / steps;
    result.prefetches_per_step = (after.prefetches - before.prefetches) / steps;
    result.prefetches_deferred_per_step =
        (after.prefetches_deferred - before.prefetches_deferred) / steps;
    result.max_unsharded_alive = after.max_unsharded_alive;
  }
  for (const MemoryStats& st : memory()) {
    result.alloc_retries = std::max<int64_t>(result.alloc_retries, st.num_alloc_retries);
    result.ooms = std::max<int64_t>(result.ooms, st.num_ooms);
  }
  if (!spec.trace_path.empty()) {
    TraceRecorder::Global().Start();
    Status traced = step_all();
    TraceRecorder::Global().Stop();
    if (traced.ok()) {
      nlohmann::json doc = nlohmann::json::parse(TraceRecorder::Global().ToJson());
      for (const auto& e : track_names) doc["traceEvents"].push_back(e);
      doc["otherData"] = {{"network", result.network},
                          {"note", "one training step of every rank, after the timed steps"}};
      traced = WriteTextFile(spec.trace_path, doc.dump());
    }
    if (!traced.ok()) result.error = "trace: " + traced.ToString();
  }
  return result;
}

}  // namespace sk::bench
