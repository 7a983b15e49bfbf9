// Memory is exact: the simulator runs the same Trainer, FSDP/DDP and
// CachingAllocator code over the same sizes as a real CPU run, so its peak
// allocated and reserved bytes per step equal the real run's, byte for byte
// (issue 11). Real runs: local backend, world 1, 2 and 4; the sim runs one
// simulated rank of a world of the same size and is compared with rank 0.
//
// Both run launch blocking (DeviceOptions::launch_blocking, CUDA_LAUNCH_
// BLOCKING's analogue): the caching allocator hands a freed block to another
// stream only once that stream's recorded event has passed, and frees what a
// queued closure or collective still holds only when it has run, so with
// overlap the peaks depend on how far each stream's work has got at each
// allocation. On CPU threads that is the OS scheduler's choice (track.py saw
// rank 0's allocated peak move 3.3% between runs of one binary); on the sim
// it is the profile's timing. Launch blocking makes the schedule program
// order on both sides, so what remains to compare is exactly the claim: the
// same allocator asked for the same sizes in the same order.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/ops/backend.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

constexpr int kSteps = 2;

struct Peaks {
  int64_t allocated = 0;
  int64_t reserved = 0;
  bool operator==(const Peaks& o) const { return allocated == o.allocated && reserved == o.reserved; }
};

std::ostream& operator<<(std::ostream& os, const Peaks& p) {
  return os << "{allocated " << p.allocated << ", reserved " << p.reserved << "}";
}

struct Config {
  std::string model;
  Parallelism parallelism;
  ShardingStrategy strategy;
  bool offload = false;  // FSDP cpu_offload
  bool bf16 = false;     // param_dtype bf16
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  bool recompute_attention = false;
  int64_t seq_len = 0;  // 0: 32 (unit tables: their default)
};

std::string Name(const Config& c) {
  return c.model + " " +
         (c.parallelism == Parallelism::kDdp ? "DDP" : ShardingStrategyName(c.strategy)) +
         (c.offload ? " offload" : "");
}

TrainerOptions Options(const Config& c, int world) {
  TrainerOptions o;
  o.model = c.model;
  o.parallelism = c.parallelism;
  o.fsdp.strategy = c.strategy;
  o.fsdp.shard_group_size = world >= 2 ? world / 2 : 1;
  o.fsdp.timeout = Duration(120'000);
  o.fsdp.cpu_offload = c.offload;
  if (c.bf16) o.fsdp.mixed_precision.param_dtype = DType::kBF16;
  o.checkpointing = c.checkpointing;
  o.recompute_attention = c.recompute_attention;
  o.batch_size = 1;
  // Unit tables (images) take one position per batch entry: their default.
  const bool images = c.model.find("regnet") == 0 || c.model.find("deepvit") == 0;
  o.seq_len = images ? 0 : (c.seq_len > 0 ? c.seq_len : 32);
  o.source_len = c.model.rfind("t5", 0) == 0 ? 32 : 0;
  o.gemm_threads = 1;
  // Both sides launch blocking: the schedule is program order alone (see
  // the file comment).
  o.device.launch_blocking = true;
  return o;
}

// Rank 0's peaks per step of a real CPU run.
std::vector<Peaks> RealPeaks(const Config& c, int world) {
  std::vector<Peaks> out;
  std::mutex mu;
  Status s = comm::RunLocalRanks(world, [&](int rank, comm::ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(Options(c, world), g));
    for (int step = 0; step < kSteps; ++step) {
      SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        out.push_back({m.peak_allocated_bytes, m.peak_reserved_bytes});
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<Peaks> SimPeaks(const Config& c, int world) {
  TrainerOptions o = Options(c, world);
  o.device.kind = DeviceKind::kSim;
  o.device.sim_profile = "a100-80g";  // memory does not depend on the profile below its capacity
  o.device.sim_world_size = world;
  o.device.sim_gpus_per_node = world;
  std::vector<Peaks> out;
  auto t = Trainer::Create(o, nullptr);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return out;
  for (int step = 0; step < kSteps; ++step) {
    StatusOr<StepMetrics> m = (*t)->Step();
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) break;
    out.push_back({m->peak_allocated_bytes, m->peak_reserved_bytes});
  }
  return out;
}

// Every strategy and DDP, or (subset) FULL_SHARD, HYBRID_SHARD and DDP.
std::vector<Config> Configs(const std::string& model, bool subset = false) {
  std::vector<Config> v;
  for (ShardingStrategy s :
       {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kShardOptim,
        ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard,
        ShardingStrategy::kHybridShardGradOp}) {
    if (subset && s != ShardingStrategy::kFullShard && s != ShardingStrategy::kHybridShard) continue;
    v.push_back({model, Parallelism::kFsdp, s});
  }
  v.push_back({model, Parallelism::kDdp, ShardingStrategy::kFullShard});
  return v;
}

// Sanitizers slow the real runs 5-20x: under them the test keeps gpt-1m at
// world 1 and 2 (the code paths are the same).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

void ExpectExact(const std::string& model, const std::vector<int>& worlds, bool subset = false) {
  for (int world : worlds) {
    if (kSanitized && world > 2) continue;
    for (const Config& c : Configs(model, subset)) {
      SCOPED_TRACE(Name(c) + " at world " + std::to_string(world));
      std::vector<Peaks> real = RealPeaks(c, world);
      std::vector<Peaks> sim = SimPeaks(c, world);
      ASSERT_EQ(real.size(), static_cast<size_t>(kSteps));
      EXPECT_EQ(sim, real);
    }
  }
}

TEST(MemoryExactTest, Gpt1m) { ExpectExact("gpt-1m", {1, 2, 4}); }
// A tied head (GPT-2's, from a Hugging Face directory): the simulator runs
// the same gathers of the borrowed embedding and keeps its full gradient as
// long, so its peaks are the real run's under every strategy and DDP.
TEST(MemoryExactTest, TiedGpt2FromAHuggingFaceDirectory) {
  ExpectExact("tests/fsdp/testdata/hf/gpt2-tiny", {1, 2});
}
// Linear-memory attention at long sequences: a GPT at
// kCpuFlashAttentionMinKeys positions runs FlashAttention-2 (lse and the
// backward's workspace, no probabilities) on the CPU and on the simulator
// alike (ops::CpuPrefersFlashAttention), so the peaks stay exact, and they
// are below one layer's [heads, T, T] f32 probabilities, which the composed
// attention would keep for each of the two layers.
TEST(MemoryExactTest, GptAtLongSequencesInLinearMemory) {
  const int64_t seq = ops::kCpuFlashAttentionMinKeys, heads = 2;
  const std::string model = "decoder:name=gpt-long,ffn=gelu,layers=2,d_model=32,heads=" +
                            std::to_string(heads) + ",vocab=64,seq=" + std::to_string(seq);
  for (Parallelism par : {Parallelism::kFsdp, Parallelism::kDdp}) {
    for (int world : {1, 2}) {
      Config c{model, par, ShardingStrategy::kFullShard};
      c.seq_len = seq;
      SCOPED_TRACE(Name(c) + " at world " + std::to_string(world));
      std::vector<Peaks> real = RealPeaks(c, world);
      std::vector<Peaks> sim = SimPeaks(c, world);
      ASSERT_EQ(real.size(), static_cast<size_t>(kSteps));
      EXPECT_EQ(sim, real);
      EXPECT_LT(sim.back().allocated, heads * seq * seq * 4);
    }
  }
}
// CPU offload: master and gradient shards, the gradient staging buffer and
// the optimizer state leave the device allocator on both sides (host memory
// on cpu, the simulated host on sim); what stays on the device (gathered
// parameters, the f32 staging of host->device copies under bf16, gradients,
// activations) is still exact, with bf16 compute (the staged copy + cast)
// and with f32. On cpu the "host" is the same memory as the "device" but not
// the same allocator: the device allocator's peaks are what both compare.
TEST(MemoryExactTest, Gpt1mCpuOffload) {
  for (bool bf16 : {false, true}) {
    for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                               ShardingStrategy::kNoShard}) {
      for (int world : {1, 2}) {
        Config c{"gpt-1m", Parallelism::kFsdp, s, /*offload=*/true};
        c.bf16 = bf16;
        SCOPED_TRACE(Name(c) + (bf16 ? " bf16" : "") + " at world " + std::to_string(world));
        std::vector<Peaks> real = RealPeaks(c, world);
        std::vector<Peaks> sim = SimPeaks(c, world);
        ASSERT_EQ(real.size(), static_cast<size_t>(kSteps));
        EXPECT_EQ(sim, real);
        // Offload lowers the device peak below the same run without it.
        Config on_device = c;
        on_device.offload = false;
        std::vector<Peaks> without = SimPeaks(on_device, world);
        ASSERT_EQ(without.size(), static_cast<size_t>(kSteps));
        EXPECT_LT(sim.back().allocated, without.back().allocated);
      }
    }
  }
}
// A tied Llama head (llama-tiny's shape with tie_word_embeddings, as Llama 3.2
// and Qwen2-0.5B): the head gathers embed.embed_tokens.w for its use and
// adds into its gradient, on the simulator as in the real run.
TEST(MemoryExactTest, TiedLlama) {
  ExpectExact("decoder:name=llama-tiny-tied,layers=2,d_model=32,heads=4,kv_heads=2,d_ff=64,vocab=64,seq=32,"
              "tied=true",
              {1, 2}, /*subset=*/true);
}
// Unit-table models (convolutions as gathers and grouped GEMMs, ViT blocks).
TEST(MemoryExactTest, UnitTables) {
  ExpectExact("regnet-tiny", {1, 2});
  ExpectExact("deepvit-tiny", {1, 2});
}
// Selective checkpointing (each block's norms and GELU / SwiGLU products
// recomputed just before its backward): the simulator allocates and frees
// the recomputed tensors where the real run does, so the peaks stay exact;
// they are below the same run without checkpointing.
TEST(MemoryExactTest, SelectiveCheckpointing) {
  for (const char* model : {"gpt-1m", "llama-tiny"}) {
    for (Parallelism par : {Parallelism::kFsdp, Parallelism::kDdp}) {
      for (int world : {1, 2}) {
        Config c{model, par, ShardingStrategy::kFullShard};
        c.checkpointing = ActivationCheckpointing::kSelective;
        SCOPED_TRACE(Name(c) + " selective at world " + std::to_string(world));
        std::vector<Peaks> real = RealPeaks(c, world);
        std::vector<Peaks> sim = SimPeaks(c, world);
        ASSERT_EQ(real.size(), static_cast<size_t>(kSteps));
        EXPECT_EQ(sim, real);
        Config plain = c;
        plain.checkpointing = ActivationCheckpointing::kNone;
        std::vector<Peaks> without = SimPeaks(plain, world);
        ASSERT_EQ(without.size(), static_cast<size_t>(kSteps));
        EXPECT_LT(sim.back().allocated, without.back().allocated);
      }
    }
    // Attention recomputed too: still exact, and lower again. (gpt-1m at
    // its full 128 positions: at 32 its one rank's peak is the end of
    // backward, where every gradient shard exists and the attention no
    // longer does, so recomputing it cannot lower that peak.)
    Config c{model, Parallelism::kFsdp, ShardingStrategy::kFullShard};
    c.checkpointing = ActivationCheckpointing::kSelective;
    if (std::string(model) == "gpt-1m") c.seq_len = 128;
    SCOPED_TRACE(Name(c) + " selective, attention recomputed");
    std::vector<Peaks> kept = SimPeaks(c, 1);
    c.recompute_attention = true;
    std::vector<Peaks> real = RealPeaks(c, 1);
    std::vector<Peaks> sim = SimPeaks(c, 1);
    ASSERT_EQ(real.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(sim, real);
    ASSERT_EQ(kept.size(), static_cast<size_t>(kSteps));
    EXPECT_LT(sim.back().allocated, kept.back().allocated);
  }
  // Every other matmul recomputed too (Llama): exact, and below selective.
  for (int world : {1, 2}) {
    Config c{"llama-tiny", Parallelism::kFsdp, ShardingStrategy::kFullShard};
    c.checkpointing = ActivationCheckpointing::kSelective;
    std::vector<Peaks> selective = SimPeaks(c, world);
    c.checkpointing = ActivationCheckpointing::kSelectiveMatmuls;
    SCOPED_TRACE(Name(c) + " selective_matmuls at world " + std::to_string(world));
    std::vector<Peaks> real = RealPeaks(c, world);
    std::vector<Peaks> sim = SimPeaks(c, world);
    ASSERT_EQ(real.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(sim, real);
    ASSERT_EQ(selective.size(), static_cast<size_t>(kSteps));
    EXPECT_LT(sim.back().allocated, selective.back().allocated);
  }
}
// Llama-family decoders (RMSNorm, RoPE, grouped-query linear-memory
// attention, SwiGLU; qwen2-tiny: q/k/v biases, one key/value head): every
// strategy and DDP, and FULL_SHARD / SHARD_GRAD_OP with bf16 parameters.
TEST(MemoryExactTest, LlamaFamily) {
  ExpectExact("llama-tiny", {1, 2});
  ExpectExact("qwen2-tiny", {1, 2}, /*subset=*/true);
  for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    for (int world : {1, 2}) {
      Config c{"llama-tiny", Parallelism::kFsdp, s};
      c.bf16 = true;
      SCOPED_TRACE(Name(c) + " bf16 at world " + std::to_string(world));
      std::vector<Peaks> real = RealPeaks(c, world);
      std::vector<Peaks> sim = SimPeaks(c, world);
      ASSERT_EQ(real.size(), static_cast<size_t>(kSteps));
      EXPECT_EQ(sim, real);
    }
  }
}
TEST(MemoryExactTest, T5_10m) {
  if (kSanitized) GTEST_SKIP() << "t5-10m's real runs are too slow under sanitizers";
  ExpectExact("t5-10m", {1, 2, 4});
}
// gpt-10m: every configuration at world 1 and 2; at world 4 FULL_SHARD,
// HYBRID_SHARD and DDP (the full set at world 4 passed too, in one run of
// 2026-11-23 with batch 2 x 64 tokens, but takes minutes on 2 shared cores).
TEST(MemoryExactTest, Gpt10m) {
  if (kSanitized) GTEST_SKIP() << "gpt-10m's real runs are too slow under sanitizers";
  ExpectExact("gpt-10m", {1, 2});
  ExpectExact("gpt-10m", {4}, /*subset=*/true);
}

}  // namespace
}  // namespace sk
