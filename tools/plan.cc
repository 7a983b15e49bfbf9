// The planner's command line (docs/planner.md):
//
//   bazel run //tools:plan -- --model=t5-11b --gpus=512 --gpus_per_node=8
//       --profile=a100-80g --batch=8 [--json] [--trace=FILE] [--top=N]
//
// simulates one training step of every candidate configuration on the sim
// device and prints the ranked table (or JSON) and the recommendation on
// stdout; how long planning took goes to stderr, so that stdout is the same
// bytes for the same request. Flags restrict the candidate space (each a
// comma-separated list; empty = the whole dimension).
#include <chrono>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "runtime/plan/plan.h"
#include "tools/cli_flags.h"

DEFINE_string(model, "",
              "model config name (t5-11b, gpt-175b, llama3-8b, ...), a decoder by its shape "
              "(decoder:layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256,seq=8192) "
              "or a .json model file");
DEFINE_int32(gpus, 8, "GPUs in the simulated cluster");
DEFINE_int32(gpus_per_node, 8, "GPUs per node");
DEFINE_string(profile, "a100-80g",
              "hardware profile: a100-80g, h100-80g, h200-141g, cpu-local, or a .json path");
DEFINE_int64(batch, 1, "sequences per GPU per micro-batch");
DEFINE_int32(grad_accum, 1, "micro-batches per step (gradient accumulation)");
DEFINE_int64(seq_len, 0, "decoder sequence length (0 = the model's)");
DEFINE_int64(source_len, 0, "encoder sequence length (0 = the model's)");
DEFINE_bool(json, false, "print JSON instead of the table");
DEFINE_string(trace, "", "write a Chrome trace of the recommended configuration's step here");
DEFINE_int32(top, 20, "table rows (0 = all); the best of every other strategy is shown too");
DEFINE_int32(warmup_steps, 1, "simulated steps before the measured ones (at most 1000)");
DEFINE_int32(steps, 1, "measured simulated steps (1 to 1000; time grows with steps x candidates)");
DEFINE_string(strategies, "", "restrict: DDP,FULL_SHARD,SHARD_GRAD_OP,SHARD_OPTIM,NO_SHARD,HYBRID_SHARD,HYBRID_SHARD_GRAD_OP");
DEFINE_string(shard_group_sizes, "", "restrict the hybrid strategies' shard-group sizes, e.g. 8,16");
DEFINE_string(backward_prefetch, "", "restrict: NONE,BACKWARD_PRE,BACKWARD_POST");
DEFINE_string(forward_prefetch, "", "restrict: off, on, or off,on");
DEFINE_string(rate_limits, "", "restrict all_gather_limit: e.g. 1,2,4,off");
DEFINE_string(checkpointing, "",
              "activation checkpointing to search: off, on (whole block), selective (norms and "
              "activations recomputed), selective_attention (selective, attention recomputed too), "
              "selective_matmuls (selective, every other matmul recomputed too: Llama family), "
              "as a list; default off,on (the selective ones only when listed)");
DEFINE_string(offload, "", "restrict CPU offload: off, on, or off,on");
DEFINE_string(dtypes, "", "restrict param[/reduce] dtypes: e.g. f32,bf16,bf16/f32");

namespace {

sk::StatusOr<std::vector<bool>> Bools(const std::string& s, const char* flag) {
  std::vector<bool> out;
  for (const std::string& v : sk::cli::SplitList(s)) {
    if (v == "on" || v == "true" || v == "1") {
      out.push_back(true);
    } else if (v == "off" || v == "false" || v == "0") {
      out.push_back(false);
    } else {
      return sk::InvalidArgumentError(std::string("--") + flag + ": '" + v + "' is not on or off");
    }
  }
  return out;
}

sk::StatusOr<std::vector<int>> Ints(const std::string& s, const char* flag) {
  std::vector<int> out;
  for (const std::string& v : sk::cli::SplitList(s)) {
    try {
      size_t used = 0;
      int n = std::stoi(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      out.push_back(n);
    } catch (const std::out_of_range&) {
      return sk::InvalidArgumentError(std::string("--") + flag + ": '" + v + "' is out of range (at most " +
                                      std::to_string(std::numeric_limits<int>::max()) + ")");
    } catch (const std::exception&) {
      return sk::InvalidArgumentError(std::string("--") + flag + ": '" + v + "' is not a number");
    }
  }
  return out;
}

// "1,2,off": N in flight, or off (the planner validates N >= 1).
sk::StatusOr<std::vector<sk::RateLimit>> RateLimits(const std::string& s) {
  std::vector<sk::RateLimit> out;
  for (const std::string& v : sk::cli::SplitList(s)) {
    if (v == "off") {
      out.push_back(sk::RateLimit::Off());
      continue;
    }
    SK_ASSIGN_OR_RETURN(std::vector<int> n, Ints(v, "rate_limits"));
    for (int l : n) out.push_back(sk::RateLimit::InFlight(l));
  }
  return out;
}

sk::Status Run() {
  if (FLAGS_model.empty()) return sk::InvalidArgumentError("--model is required (e.g. --model=t5-11b)");
  sk::plan::PlanRequest r;
  r.model = FLAGS_model;
  r.gpus = FLAGS_gpus;
  r.gpus_per_node = FLAGS_gpus_per_node;
  r.profile = FLAGS_profile;
  r.batch_size = FLAGS_batch;
  r.grad_accum_steps = FLAGS_grad_accum;
  r.seq_len = FLAGS_seq_len;
  r.source_len = FLAGS_source_len;
  r.warmup_steps = FLAGS_warmup_steps;
  r.steps = FLAGS_steps;
  r.trace_path = FLAGS_trace;
  sk::plan::PlanSpace& sp = r.space;
  if (!FLAGS_strategies.empty()) {
    SK_ASSIGN_OR_RETURN(sp.strategies, sk::plan::ParseStrategyList(FLAGS_strategies));
  }
  SK_ASSIGN_OR_RETURN(sp.shard_group_sizes, Ints(FLAGS_shard_group_sizes, "shard_group_sizes"));
  for (const std::string& v : sk::cli::SplitList(FLAGS_backward_prefetch)) {
    SK_ASSIGN_OR_RETURN(sk::BackwardPrefetch p, sk::ParseBackwardPrefetch(v));
    sp.backward_prefetch.push_back(p);
  }
  SK_ASSIGN_OR_RETURN(sp.forward_prefetch, Bools(FLAGS_forward_prefetch, "forward_prefetch"));
  SK_ASSIGN_OR_RETURN(sp.rate_limits, RateLimits(FLAGS_rate_limits));
  SK_ASSIGN_OR_RETURN(sp.activation_checkpointing,
                      sk::plan::ParseCheckpointingList(FLAGS_checkpointing, "--checkpointing"));
  SK_ASSIGN_OR_RETURN(sp.cpu_offload, Bools(FLAGS_offload, "offload"));
  if (!FLAGS_dtypes.empty()) {
    SK_ASSIGN_OR_RETURN(sp.dtypes, sk::plan::ParseDTypeList(FLAGS_dtypes));
  }
  const auto start = std::chrono::steady_clock::now();
  // A line on stderr every 10 s once a plan runs that long (a million GPUs'
  // default space takes about two minutes), so a long plan is not mistaken
  // for a hang.
  auto next_report = start + std::chrono::seconds(10);
  r.progress = [&](size_t done, size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_report) return;
    next_report = now + std::chrono::seconds(10);
    std::fprintf(stderr, "plan: simulated %zu of %zu candidates in %.0f s\n", done, total,
                 std::chrono::duration<double>(now - start).count());
  };
  SK_ASSIGN_OR_RETURN(sk::plan::PlanResult plan, sk::plan::Plan(r));
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string out = FLAGS_json ? sk::plan::FormatJson(plan) : sk::plan::FormatTable(plan, FLAGS_top);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "planned %zu candidates in %.2f s (wall clock)%s%s\n", plan.results.size(), wall,
               r.trace_path.empty() ? "" : "; trace of the recommendation: ", r.trace_path.c_str());
  return sk::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  sk::cli::ParseFlags("plan --model=NAME --gpus=N --gpus_per_node=G --profile=P --batch=B", __FILE__, &argc, &argv);
  sk::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "plan: %s\n", s.ToString().c_str());
    return 2;
  }
  return 0;
}
