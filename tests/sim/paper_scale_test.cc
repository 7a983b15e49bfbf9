// The paper's models at the paper's scale on the simulator: a GPT-175B step
// on 512 simulated A100s and a T5-11B step on 8 run the real Trainer, FSDP,
// CachingAllocator and optimizer without allocating real memory (deferred
// initialisation never materialises a parameter; sim tensors have no data),
// DDP of GPT-175B is reported out of memory at the profile's 80 GiB, and the
// Chrome trace of a GPT-175B step on 128 GPUs shows compute, all-gather,
// reduce-scatter, host and allocator tracks with communication overlapping
// compute.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include "runtime/train/sim_run.h"
#include "tests/sim/trace_spans.h"

namespace sk {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// The process's peak resident set (VmHWM), bytes.
size_t PeakRss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream in(line.substr(6));
      size_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

SimRunOptions Paper(const std::string& model, int gpus, int batch) {
  SimRunOptions r;
  r.trainer.model = model;
  r.trainer.batch_size = batch;
  r.trainer.device.kind = DeviceKind::kSim;
  r.trainer.device.sim_profile = "a100-80g";
  r.trainer.device.sim_world_size = gpus;
  r.trainer.device.sim_gpus_per_node = 8;
  r.trainer.fsdp.mixed_precision.param_dtype = DType::kBF16;
  r.trainer.fsdp.mixed_precision.reduce_dtype = DType::kBF16;
  r.warmup_steps = 1;
  r.steps = 1;
  return r;
}

TEST(PaperScaleTest, Gpt175bOn512GpusWithoutRealMemory) {
  const size_t rss_before = PeakRss();
  SimRunOptions r = Paper("gpt-175b", 512, 1);
  r.trainer.activation_checkpointing = true;
  StatusOr<SimStepReport> rep = SimulateTraining(r);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_FALSE(rep->out_of_memory) << rep->oom_detail;
  // Model states alone are 175e9 x 16 bytes / 512 = 5.5 GB per GPU.
  EXPECT_GT(rep->peak_reserved_bytes, 5 * kGiB);
  EXPECT_LE(rep->peak_reserved_bytes, 80 * kGiB);
  EXPECT_GT(rep->step_seconds, 0);
  EXPECT_GT(rep->mfu, 0);
  EXPECT_LT(rep->mfu, 1);
  // Gigabytes simulated, not allocated: the process grew by far less.
  const size_t grown = PeakRss() - rss_before;
  EXPECT_LT(grown, 512u << 20) << "peak RSS grew by " << grown << " bytes";
  std::printf("gpt-175b 512 x a100-80g FULL_SHARD bf16 ckpt b=1: step %.3f s, peak reserved %.2f GiB, "
              "%.1f TFLOPS/GPU, MFU %.3f, exposed comm %.3f s (RSS grew %.1f MiB)\n",
              rep->step_seconds, rep->peak_reserved_bytes / double(kGiB), rep->tflops_per_gpu,
              rep->mfu, rep->exposed_comm_seconds, grown / double(1 << 20));
}

TEST(PaperScaleTest, T5_11bOn8Gpus) {
  const size_t rss_before = PeakRss();
  StatusOr<SimStepReport> rep = SimulateTraining(Paper("t5-11b", 8, 2));
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_FALSE(rep->out_of_memory) << rep->oom_detail;
  // 11e9 x 16 bytes / 8 GPUs of model states.
  EXPECT_GT(rep->peak_reserved_bytes, 20 * kGiB);
  EXPECT_GT(rep->step_seconds, 0);
  const size_t grown = PeakRss() - rss_before;
  EXPECT_LT(grown, 512u << 20) << "peak RSS grew by " << grown << " bytes";
  std::printf("t5-11b 8 x a100-80g FULL_SHARD bf16 b=2: step %.3f s, peak reserved %.2f GiB, "
              "%.1f TFLOPS/GPU, MFU %.3f, exposed comm %.3f s\n",
              rep->step_seconds, rep->peak_reserved_bytes / double(kGiB), rep->tflops_per_gpu,
              rep->mfu, rep->exposed_comm_seconds);
}

// DDP keeps a full replica: 175e9 parameters do not fit in 80 GiB. The
// allocator's own out-of-memory, at the profile's capacity, is the result.
TEST(PaperScaleTest, Gpt175bDdpIsOutOfMemory) {
  SimRunOptions r = Paper("gpt-175b", 512, 1);
  r.trainer.parallelism = Parallelism::kDdp;
  StatusOr<SimStepReport> rep = SimulateTraining(r);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->out_of_memory);
  EXPECT_NE(rep->oom_detail.find("out of memory on sim:0"), std::string::npos) << rep->oom_detail;
  EXPECT_GT(rep->peak_reserved_bytes, 40 * kGiB);
  EXPECT_LE(rep->peak_reserved_bytes, 80 * kGiB);
}

// The trace of a GPT-175B step on 128 GPUs: valid JSON, a track per stream
// and host thread, and all-gathers running while the compute stream computes.
TEST(PaperScaleTest, TraceShowsTracksAndOverlap) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                           "/gpt175b_128.json";
  SimRunOptions r = Paper("gpt-175b", 128, 1);
  r.trainer.activation_checkpointing = true;
  r.trace_path = path;
  StatusOr<SimStepReport> rep = SimulateTraining(r);
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_FALSE(rep->out_of_memory) << rep->oom_detail;

  std::optional<sim_trace::Trace> trace = sim_trace::ReadTrace(path);
  ASSERT_TRUE(trace.has_value()) << path << " is missing or not a JSON trace";
  const std::vector<sim_trace::TraceSpan> compute_spans = trace->Track("compute");
  const std::vector<sim_trace::TraceSpan> gather_spans = trace->Track("all-gather");
  const std::vector<sim_trace::TraceSpan> reduce_spans = trace->Track("reduce");
  const std::vector<sim_trace::TraceSpan> host_spans = trace->Track("host thread");
  const std::set<std::string> categories(trace->categories.begin(), trace->categories.end());
  ASSERT_FALSE(compute_spans.empty());
  ASSERT_FALSE(gather_spans.empty());
  ASSERT_FALSE(reduce_spans.empty());
  ASSERT_FALSE(host_spans.empty());
  EXPECT_TRUE(categories.count("comm")) ;
  EXPECT_TRUE(categories.count("compute"));
  // Overlap: some all-gather span intersects some compute span.
  bool overlap = false;
  for (const auto& g : gather_spans) {
    for (const auto& c : compute_spans) {
      if (g.start_us < c.end_us && c.start_us < g.end_us) {
        overlap = true;
        break;
      }
    }
    if (overlap) break;
  }
  EXPECT_TRUE(overlap) << "no all-gather overlaps compute in the trace";
  std::printf("trace: %zu compute, %zu all-gather, %zu reduce spans; %s\n", compute_spans.size(),
              gather_spans.size(), reduce_spans.size(), path.c_str());
}

}  // namespace
}  // namespace sk
