// The estimator against the caching allocator's measured peak, per strategy,
// dtype and CPU offload: never below it (the planner reads the estimate as
// what a configuration needs), and within 10% above it (15% with offload).
#include "runtime/fsdp/memory_estimator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "runtime/comm/local_backend.h"
#include "runtime/ops/ops.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

struct Case {
  const char* model;
  bool ddp;
  ShardingStrategy strategy;
  DType dtype;
  bool ckpt;
  int64_t batch;
  int64_t seq;
  bool offload = false;  // FSDP cpu_offload
  // reduce_dtype f32 under a 16-bit param_dtype (the paper's bf16/f32).
  bool f32_reduce = false;
  // Selective checkpointing (ckpt false), attention kept or recomputed too.
  bool selective = false;
  bool recompute_attention = false;
  // Micro-batches per step, accumulated unsharded (no_sync) or sharded.
  int accum = 1;
  bool no_sync = false;
  BackwardPrefetch prefetch = BackwardPrefetch::kBackwardPre;
  RateLimit limit = kDefaultRateLimit;
  // checkpointing = selective_matmuls (selective false; Llama family).
  bool selective_matmuls = false;
};

// A Llama-family decoder whose tied embedding (8192 x 64) is 10.6x one
// block (Llama 3.2 1B's is 4.3x).
constexpr char kDominant[] =
    "decoder:name=dominant,layers=3,d_model=64,heads=4,kv_heads=2,d_ff=192,vocab=8192,seq=16,tied=true";

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const std::string model = info.param.model == std::string(kDominant) ? "tied_dominant" : info.param.model;
  std::string s = model + "_" +
                  (info.param.ddp ? "DDP" : ShardingStrategyName(info.param.strategy)) + "_" +
                  std::string(DTypeName(info.param.dtype)) + (info.param.f32_reduce ? "_f32reduce" : "") +
                  (info.param.ckpt ? "_ckpt" : "") + (info.param.selective ? "_selckpt" : "") +
                  (info.param.recompute_attention ? "_attention" : "") +
                  (info.param.selective_matmuls ? "_selmm" : "") +
                  (info.param.offload ? "_offload" : "") +
                  (info.param.accum > 1 ? std::string("_accum") + std::to_string(info.param.accum) : "") +
                  (info.param.no_sync ? "_nosync" : "") +
                  (info.param.prefetch != BackwardPrefetch::kBackwardPre
                       ? std::string("_") + BackwardPrefetchName(info.param.prefetch)
                       : "") +
                  (info.param.limit != kDefaultRateLimit ? "_limit" + info.param.limit.ToString() : "");
  for (char& ch : s) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

class MemoryEstimatorTest : public ::testing::TestWithParam<Case> {};

constexpr int kWorld = 4;

// The estimate for what `o` trains at world kWorld (on the local backend:
// the node size the Trainer reads, as the C ABI's estimate does).
StatusOr<MemoryEstimate> EstimateFor(const TrainerOptions& o) {
  MemoryEstimateRequest req;
  req.model = *FindModelConfig(o.model);
  req.fsdp = o.fsdp;
  if (req.fsdp.ranks_per_node == 0) req.fsdp.ranks_per_node = LocalWorldSizeFromEnvironment();
  req.optimizer = o.optimizer;
  req.world_size = kWorld;
  req.batch_size = o.batch_size;
  req.grad_accum_steps = o.parallelism == Parallelism::kFsdp ? o.grad_accum_steps : 1;
  req.seq_len = o.seq_len;
  req.activation_checkpointing = o.activation_checkpointing;
  req.checkpointing = o.checkpointing;
  req.recompute_attention = o.recompute_attention;
  req.ddp = o.parallelism == Parallelism::kDdp;
  return EstimatePeakMemory(req);
}

// A process group whose reduce stream stays busy after each reduce-scatter:
// the collective's Work completes, then the stream sleeps before the work
// FSDP queued behind it (accumulating the reduced shard) can run. This is
// what a loaded machine does to the reduce stream's thread now and then.
class SlowReduceStreamGroup final : public comm::ProcessGroup {
 public:
  SlowReduceStreamGroup(comm::ProcessGroup* inner, std::unique_ptr<comm::ProcessGroup> owned = nullptr)
      : ProcessGroup(inner->rank(), inner->size()), inner_(inner), owned_(std::move(owned)) {}
  std::string backend_name() const override { return inner_->backend_name(); }
  StatusOr<std::unique_ptr<comm::ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                         Duration timeout) override {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> g, inner_->NewGroup(ranks, timeout));
    comm::ProcessGroup* raw = g.get();
    return std::unique_ptr<comm::ProcessGroup>(new SlowReduceStreamGroup(raw, std::move(g)));
  }

 protected:
  StatusOr<std::shared_ptr<comm::Work>> Launch(comm::Collective c, Stream& stream) override {
    switch (c.kind) {
      case comm::CollectiveKind::kAllGather:
        return inner_->all_gather_coalesced(c.outputs, c.inputs, stream, {c.timeout});
      case comm::CollectiveKind::kAllReduce:
        return inner_->all_reduce_coalesced(c.outputs, stream, {c.op, c.pre_scale, c.post_scale, c.timeout});
      case comm::CollectiveKind::kBroadcast:
        return inner_->broadcast_coalesced(c.outputs, stream, {c.root, c.timeout});
      case comm::CollectiveKind::kBarrier:
        return inner_->barrier(stream, {c.timeout});
      case comm::CollectiveKind::kReduceScatter:
        break;
    }
    SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w,
                        inner_->reduce_scatter_coalesced(c.outputs, c.inputs, stream,
                                                         {c.op, c.pre_scale, c.post_scale, c.timeout}));
    SK_RETURN_IF_ERROR(stream.Enqueue([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(15));
      return OkStatus();
    }));
    return w;
  }

 private:
  comm::ProcessGroup* inner_;
  std::unique_ptr<comm::ProcessGroup> owned_;
};

// Steps measured after the first (which creates the optimizer state). A
// step's peak depends on how the streams' work happened to interleave (an
// all-gather still in flight or already consumed when a reduction starts),
// so one step can come out a buffer short of what the configuration reaches
// (seen once under tsan in CI: 0.841 of the estimate against 0.875 in every
// rerun). The steady-state peak is the largest over these steps.
constexpr int kMeasuredSteps = 3;

// The largest rank's steady-state peak allocated bytes for `o` at world
// kWorld, each rank's group behind a SlowReduceStreamGroup when
// `slow_reduce`.
StatusOr<int64_t> MeasuredPeak(const TrainerOptions& o, bool slow_reduce) {
  std::vector<int64_t> peaks(kWorld);
  SK_RETURN_IF_ERROR(comm::RunLocalRanks(kWorld, [&](int r, comm::ProcessGroup* g) -> Status {
    SlowReduceStreamGroup slow(g);
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t,
                        Trainer::Create(o, slow_reduce ? &slow : g));
    SK_RETURN_IF_ERROR(t->Step().status());
    for (int s = 0; s < kMeasuredSteps; ++s) {
      SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
      peaks[r] = std::max(peaks[r], m.peak_allocated_bytes);
    }
    return OkStatus();
  }));
  return *std::max_element(peaks.begin(), peaks.end());
}

TEST_P(MemoryEstimatorTest, EstimateCoversTheMeasuredPeakWithinTenPercent) {
  const Case c = GetParam();
  TrainerOptions o;
  o.model = c.model;
  o.batch_size = c.batch;
  o.seq_len = c.seq;
  o.activation_checkpointing = c.ckpt;
  if (c.selective) o.checkpointing = ActivationCheckpointing::kSelective;
  if (c.selective_matmuls) o.checkpointing = ActivationCheckpointing::kSelectiveMatmuls;
  o.recompute_attention = c.recompute_attention;
  o.fsdp.strategy = c.strategy;
  o.parallelism = c.ddp ? Parallelism::kDdp : Parallelism::kFsdp;
  o.fsdp.mixed_precision.param_dtype = c.dtype;
  if (c.f32_reduce) o.fsdp.mixed_precision.reduce_dtype = DType::kF32;
  o.fsdp.cpu_offload = c.offload;
  o.grad_accum_steps = c.accum;
  if (c.no_sync) o.fsdp.grad_accumulation = GradAccumulation::kUnsharded;
  if (c.strategy == ShardingStrategy::kHybridShard) o.fsdp.shard_group_size = 2;
  o.fsdp.backward_prefetch = c.prefetch;
  o.fsdp.all_gather_limit = c.limit;
  o.fsdp.timeout = Duration(120'000);

  StatusOr<MemoryEstimate> est = EstimateFor(o);
  ASSERT_TRUE(est.ok()) << est.status();
  StatusOr<int64_t> peak = MeasuredPeak(o, /*slow_reduce=*/false);
  ASSERT_TRUE(peak.ok()) << peak.status();
  const int64_t measured = *peak;
  const double ratio = static_cast<double>(measured) / static_cast<double>(est->peak_bytes);
  // Never short: the estimate counts every buffer that can be alive at the
  // peak, whichever way the streams' work interleaves.
  EXPECT_LE(measured, est->peak_bytes) << est->ToString() << "; measured " << measured;
  // With offload the model states leave the device, so the in-flight
  // buffers the estimate assumes all alive at once (a second full gradient
  // reducing, a prefetched unit) are a larger share of what remains.
  EXPECT_GT(ratio, c.offload ? 0.85 : 0.9) << est->ToString() << "; measured " << measured;
  std::printf("%s: estimate %lld, measured %lld (ratio %.3f): %s\n", Name({c, 0}).c_str(),
              static_cast<long long>(est->peak_bytes), static_cast<long long>(measured), ratio,
              est->ToString().c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, MemoryEstimatorTest,
    ::testing::Values(Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 64},
                      Case{"gpt-1m", false, ShardingStrategy::kShardGradOp, DType::kF32, false, 2, 64},
                      Case{"gpt-1m", false, ShardingStrategy::kShardOptim, DType::kF32, false, 2, 64},
                      Case{"gpt-1m", false, ShardingStrategy::kNoShard, DType::kF32, false, 2, 64},
                      Case{"gpt-1m", false, ShardingStrategy::kHybridShard, DType::kF32, false, 2, 64},
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64},
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kF32, true, 2, 64},
                      Case{"t5-tiny", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16},
                      // Selective checkpointing: what the block keeps, and
                      // the norms (and attention) it recomputes in backward.
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 64, false,
                           false, true},
                      Case{"gpt-1m", true, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64, false,
                           false, true, true},
                      Case{"llama-tiny", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16,
                           false, false, true},
                      // Every other matmul recomputed too (torchtitan's op-level policy).
                      Case{"llama-tiny", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16,
                           false, false, false, false, 1, false, BackwardPrefetch::kBackwardPre,
                           kDefaultRateLimit, true},
                      // (4 x 32 tokens: at 2 x 16 the bf16 activations are so
                      // small that the allocator-rounding allowance is 12% of the peak.)
                      Case{"llama-tiny", false, ShardingStrategy::kFullShard, DType::kBF16, false, 4, 32,
                           false, false, false, false, 1, false, BackwardPrefetch::kBackwardPre,
                           kDefaultRateLimit, true},
                      Case{"gpt-1m", true, ShardingStrategy::kFullShard, DType::kF32, false, 2, 64},
                      Case{"gpt-1m", true, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64},
                      // bf16 with an f32 reduction (the paper's mixed precision).
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64, false, true},
                      Case{"gpt-1m", false, ShardingStrategy::kShardOptim, DType::kBF16, false, 2, 64, false, true},
                      Case{"gpt-1m", false, ShardingStrategy::kNoShard, DType::kBF16, false, 2, 64, false, true},
                      // CPU offload: the model states on the host.
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 64, true},
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64, true},
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64, true, true},
                      Case{"gpt-1m", false, ShardingStrategy::kShardGradOp, DType::kBF16, false, 2, 64, true},
                      Case{"gpt-1m", false, ShardingStrategy::kNoShard, DType::kBF16, false, 2, 64, true},
                      Case{"gpt-1m", false, ShardingStrategy::kNoShard, DType::kF32, false, 2, 64, true},
                      // A tied head (GPT-2's, from a Hugging Face directory):
                      // the embedding counted once, plus its gathered copy and
                      // full gradient while the head borrows it.
                      Case{"tests/fsdp/testdata/hf/gpt2-tiny", false, ShardingStrategy::kFullShard, DType::kF32,
                           false, 4, 32},
                      Case{"tests/fsdp/testdata/hf/gpt2-tiny", false, ShardingStrategy::kShardGradOp, DType::kBF16,
                           false, 2, 32},
                      // Gradient accumulation (issue 45, item 2): sharded
                      // keeps every gradient shard through the later
                      // micro-batches, no_sync every full gradient.
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 64, false, false,
                           false, false, 3, false},
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 64, false, false,
                           false, false, 3, true},
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64, false, false,
                           false, false, 2, false},
                      Case{"gpt-1m", false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 64, false, false,
                           false, false, 2, true},
                      Case{"gpt-1m", false, ShardingStrategy::kShardGradOp, DType::kF32, false, 2, 64, false, false,
                           false, false, 2, true},
                      // One unit most of the transient memory (issue 43 item 5:
                      // Llama 3.2 1B's tied 128256 x 2048 embedding is 0.98 GiB
                      // of f32 beside 0.23 GiB blocks): a small decoder whose
                      // tied embedding is 10.6x a block. The estimate walks the
                      // backward (the head borrowing the embedding, its
                      // gradient kept until the embedding's own backward)
                      // instead of counting the largest unit in every role.
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 16},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 16, false, true},
                      Case{kDominant, false, ShardingStrategy::kShardGradOp, DType::kBF16, false, 2, 16},
                      Case{kDominant, false, ShardingStrategy::kShardOptim, DType::kF32, false, 2, 16},
                      Case{kDominant, false, ShardingStrategy::kNoShard, DType::kBF16, false, 2, 16},
                      Case{kDominant, false, ShardingStrategy::kHybridShard, DType::kF32, false, 2, 16},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 16, true},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16, false, false,
                           false, false, 2, false},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kBF16, false, 2, 16, false, false,
                           false, false, 2, true},
                      // BACKWARD_POST prefetches the embedding in the first
                      // block's PostBackward, before the previous reduction is
                      // waited for: counted with the activations' peak there
                      // (the model's counts say no more): 0.900 of the
                      // estimate at a batch of 2, where the head's activations
                      // are as large as the embedding; 0.914 at 4.
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kF32, false, 4, 16, false, false,
                           false, false, 1, false, BackwardPrefetch::kBackwardPost},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16, false, false,
                           false, false, 1, false, BackwardPrefetch::kNone},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16, false, false,
                           false, false, 1, false, BackwardPrefetch::kBackwardPre, RateLimit::InFlight(1)},
                      Case{kDominant, false, ShardingStrategy::kFullShard, DType::kF32, false, 2, 16, false, false,
                           false, false, 1, false, BackwardPrefetch::kBackwardPre, RateLimit::Off()}),
    Name);

// FSDP keeps one unit's reduction in flight: before a unit reduces, the
// previous reduction is finished on the reduce stream, its shard accumulated
// and its buffers released, not only its collective completed. With a reduce
// stream that lags behind its collectives the estimate still covers the
// peak (before this was enforced, the previous unit's reduced shard outlived
// its Work and the measured peak passed the estimate under load in CI).
TEST(MemoryEstimatorSlowReduceTest, EstimateCoversThePeakWhenTheReduceStreamLags) {
  for (bool ckpt : {false, true}) {
    TrainerOptions o;
    o.model = "gpt-1m";
    o.batch_size = 2;
    o.seq_len = 64;
    o.activation_checkpointing = ckpt;
    o.fsdp.strategy = ShardingStrategy::kFullShard;
    o.fsdp.timeout = Duration(120'000);
    StatusOr<MemoryEstimate> est = EstimateFor(o);
    ASSERT_TRUE(est.ok()) << est.status();
    StatusOr<int64_t> peak = MeasuredPeak(o, /*slow_reduce=*/true);
    ASSERT_TRUE(peak.ok()) << peak.status();
    const int64_t measured = *peak;
    EXPECT_LE(measured, est->peak_bytes) << (ckpt ? "ckpt: " : "") << est->ToString() << "; measured " << measured;
  }
}

// Sets an environment variable for the scope, restoring the previous state.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

int64_t Blocks512(int64_t bytes) { return (bytes + 511) / 512 * 512; }

// Issue 36, item 1: HYBRID_SHARD without shard_group_size shards within a
// node (LOCAL_WORLD_SIZE ranks), but the estimator assumed the world size:
// at world 4 with 2 ranks per node it counted quarter shards where FSDP
// allocated halves, and estimated below the measured peak. Both now resolve
// the one ShardingPlan.
TEST(MemoryEstimatorHybridTest, HybridWithoutShardGroupSizeShardsWithinTheNodeAsFsdpDoes) {
  ScopedEnv node("LOCAL_WORLD_SIZE", "2");
  TrainerOptions o;
  o.model = "gpt-1m";
  o.batch_size = 2;
  o.seq_len = 64;
  o.fsdp.strategy = ShardingStrategy::kHybridShard;
  o.fsdp.shard_group_size = 0;
  o.fsdp.timeout = Duration(120'000);
  StatusOr<MemoryEstimate> est = EstimateFor(o);
  ASSERT_TRUE(est.ok()) << est.status();

  std::vector<int> shard_group_sizes(kWorld);
  std::vector<int64_t> master_bytes(kWorld), peaks(kWorld);
  Status run = comm::RunLocalRanks(kWorld, [&](int r, comm::ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, g));
    shard_group_sizes[r] = t->fsdp()->shard_group_size();
    for (int u = 0; u < t->fsdp()->num_units(); ++u) {
      master_bytes[r] += Blocks512(static_cast<int64_t>(t->fsdp()->master_shard(u).nbytes()));
    }
    SK_RETURN_IF_ERROR(t->Step().status());
    for (int s = 0; s < kMeasuredSteps; ++s) {
      SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
      peaks[r] = std::max(peaks[r], m.peak_allocated_bytes);
    }
    return OkStatus();
  });
  ASSERT_TRUE(run.ok()) << run;
  const int64_t measured = *std::max_element(peaks.begin(), peaks.end());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(shard_group_sizes[r], 2) << "rank " << r;
    // The model states are exact: the estimator's shards are FSDP's.
    EXPECT_EQ(est->master_bytes, master_bytes[r]) << "rank " << r << ": " << est->ToString();
  }
  EXPECT_LE(measured, est->peak_bytes) << est->ToString() << "; measured " << measured;
  EXPECT_GT(static_cast<double>(measured) / static_cast<double>(est->peak_bytes), 0.9)
      << est->ToString() << "; measured " << measured;
}

// Packed documents on CUDA: Llama runs the linear-memory attention, whose
// CUDA path runs packed rows composed, holding every pair's probabilities
// for the call (ops::ComposedAttentionTemporaryBytes); the estimate adds
// that at its activation peaks, on CUDA only (the CPU and the simulator
// skip what the documents mask, in the ops the model counts).
TEST(MemoryEstimatorPackedTest, PackedDocumentsOnCudaAddTheComposedAttentionsTemporaries) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    MemoryEstimateRequest req;
    req.model = *FindModelConfig("llama-tiny");
    req.world_size = 2;
    req.batch_size = 3;
    req.seq_len = 32;
    req.fsdp.mixed_precision.param_dtype = dt;
    for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kSim, DeviceKind::kCuda}) {
      req.device = kind;
      req.packed_documents = false;
      StatusOr<MemoryEstimate> plain = EstimatePeakMemory(req);
      ASSERT_TRUE(plain.ok()) << plain.status();
      req.packed_documents = true;
      StatusOr<MemoryEstimate> packed = EstimatePeakMemory(req);
      ASSERT_TRUE(packed.ok()) << packed.status();
      ops::AttentionShape s;
      s.batch = 3;
      s.heads = req.model.llama.n_head;
      s.kv_heads = req.model.llama.kv_heads();
      s.q_len = s.kv_len = 32;
      s.head_dim = req.model.llama.d_model / req.model.llama.n_head;
      s.causal = true;
      const int64_t temp = kind == DeviceKind::kCuda ? ops::ComposedAttentionTemporaryBytes(s, dt).peak() : 0;
      EXPECT_EQ(packed->activation_bytes - plain->activation_bytes, temp) << static_cast<int>(kind);
      EXPECT_EQ(packed->peak_bytes - plain->peak_bytes, temp) << static_cast<int>(kind);
      if (kind == DeviceKind::kCuda) {
        EXPECT_GT(temp, 4 * 3 * s.heads * 32 * 32);
      }
    }
  }
}

TEST(MemoryEstimatorBadInputTest, RejectsBadRequests) {
  MemoryEstimateRequest req;
  req.model = *FindModelConfig("gpt-tiny");
  req.world_size = 0;
  EXPECT_EQ(EstimatePeakMemory(req).status().code(), StatusCode::kInvalidArgument);
  req.world_size = 4;
  req.batch_size = 0;
  EXPECT_EQ(EstimatePeakMemory(req).status().code(), StatusCode::kInvalidArgument);
  req.batch_size = 1;
  req.fsdp.shard_group_size = 3;
  EXPECT_EQ(EstimatePeakMemory(req).status().code(), StatusCode::kInvalidArgument);
}

// Issue 14, item 8: a huge batch x seq wrapped around int64 and came back as
// a few hundred KB; now it is InvalidArgument naming batch_size. Just below
// the bound the estimate is large and grows with the batch.
TEST(MemoryEstimatorBadInputTest, HugeBatchTimesSeqIsInvalidArgumentNotAWrappedEstimate) {
  MemoryEstimateRequest req;
  req.model = *FindModelConfig("gpt-1m");
  req.world_size = 2;
  req.seq_len = 256;
  req.batch_size = int64_t{1} << 40;
  StatusOr<MemoryEstimate> e = EstimatePeakMemory(req);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << (e.ok() ? e->ToString() : "");
  EXPECT_NE(std::string(e.status().message()).find("batch_size"), std::string::npos) << e.status();
  req.batch_size = int64_t{1} << 24;
  StatusOr<MemoryEstimate> big = EstimatePeakMemory(req);
  ASSERT_TRUE(big.ok()) << big.status();
  req.batch_size = int64_t{1} << 20;
  StatusOr<MemoryEstimate> smaller = EstimatePeakMemory(req);
  ASSERT_TRUE(smaller.ok()) << smaller.status();
  EXPECT_GT(big->activation_bytes, 8 * smaller->activation_bytes);
  EXPECT_GT(big->peak_bytes, int64_t{1} << 40);
}

// Issue 47 item 2: a width of 2^62 overflowed the parameter count and the
// estimator said 0.27 MB; a shape beyond the bounds is InvalidArgument
// naming the field, also when the config was built in code. At the bound
// the estimate is exact arithmetic: a huge positive number of bytes.
TEST(MemoryEstimatorBadInputTest, HugeShapesAreInvalidArgumentNotAWrappedEstimate) {
  MemoryEstimateRequest req;
  req.world_size = 2;
  req.model = *FindModelConfig("llama-tiny");
  req.model.llama.d_model = int64_t{1} << 62;
  StatusOr<MemoryEstimate> e = EstimatePeakMemory(req);
  ASSERT_FALSE(e.ok()) << e->ToString();
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(e.status().message()).find("d_model is 4611686018427387904"), std::string::npos)
      << e.status();
  req.model = *FindModelConfig("gpt-tiny");
  req.model.gpt.d_model = int64_t{1} << 62;
  EXPECT_EQ(EstimatePeakMemory(req).status().code(), StatusCode::kInvalidArgument);
  req.model = *FindModelConfig("gpt-tiny");
  req.model.gpt.n_layer = 1000000000;
  e = EstimatePeakMemory(req);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(std::string(e.status().message()).find("n_layer is 1000000000"), std::string::npos) << e.status();
  // A decoder of 2^44 parameters (16 x 2^40 bytes of model state at world 1).
  StatusOr<NamedModelConfig> big =
      FindModelConfig("decoder:layers=1024,d_model=65536,heads=512,vocab=32000,seq=4096,d_ff=262144");
  ASSERT_TRUE(big.ok()) << big.status();
  req.model = *big;
  req.world_size = 1;
  StatusOr<MemoryEstimate> ok = EstimatePeakMemory(req);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_GT(ok->parameters, int64_t{1} << 43);
  EXPECT_GT(ok->peak_bytes, 16 * ok->parameters - 1);
}

TEST(MemoryEstimatorPaperScaleTest, ShardingDividesModelStatesByTheWorldSize) {
  MemoryEstimateRequest req;
  req.model = *FindModelConfig("t5-11b");
  req.world_size = 8;
  req.fsdp.strategy = ShardingStrategy::kNoShard;
  MemoryEstimate none = *EstimatePeakMemory(req);
  req.fsdp.strategy = ShardingStrategy::kFullShard;
  MemoryEstimate full = *EstimatePeakMemory(req);
  // 12 bytes per parameter of persistent model state (f32 Adam: master,
  // two moments), divided by N when sharded. (The 4 of the gradient shard
  // are only counted where they are alive at the peak.)
  int64_t states_none = none.master_bytes + none.optimizer_bytes;
  int64_t states_full = full.master_bytes + full.optimizer_bytes;
  EXPECT_NEAR(static_cast<double>(states_none) / none.parameters, 12.0, 0.1);
  EXPECT_NEAR(static_cast<double>(states_none) / states_full, 8.0, 0.1);
}

}  // namespace
}  // namespace sk
