// The FSDP equivalence proof on a GPU: gpt-tiny and t5-tiny trained for five
// steps through Trainer with TrainerOptions::device = cuda:0, every sharding
// strategy and the DDP baseline at world 1, 2 and 4 (hybrid at 4 = 2x2), the
// ranks being threads on ONE GPU over the local backend's stream-ordered
// mode, end with the losses and parameters of the same run on the CPU.
//
// Tolerance (f32 everywhere): cuBLAS sums a GEMM's k products in another
// order (and blocking) than the CPU GEMM, and the device's expf/logf/tanhf
// differ from glibc's in the last place; each op's result then differs by a
// few ulps (~1e-6 relative for these k <= 128), and five steps carry that
// through forward, backward and the update. The optimizer is SGD so the
// parameter difference stays lr times the gradient difference (Adam's first
// steps move every element by ~lr whatever its gradient's size, so a ulp
// change in a near-zero gradient could flip a whole lr step). Bounds:
// losses 1e-4 relative, parameters 1e-5 absolute + 1e-4 relative: about 100x
// the expected drift, far below any real bug (a missing reduction or a stale
// shard changes values by percent).
//
// bf16 mixed-precision cases (FULL_SHARD at world 1 and 2, SHARD_GRAD_OP and
// DDP at 2) compare the losses within 2% and each parameter's five-step
// update as a vector within 25% (see the check), and run the GPU training
// twice: the two GPU runs must give the same bits.
//
// CPU offload cases (FULL_SHARD and SHARD_GRAD_OP at world 1 and 2, f32 and
// bf16 FULL_SHARD at 2, both models) run both devices with cpu_offload: on
// the GPU the master and gradient shards are pinned host memory, copied
// host->device on the all-gather stream and device->host on the reduce
// stream, and the optimizer steps on the CPU; on the CPU offload is
// bit-identical to no offload (//tests/fsdp:fsdp_test), so the reference is
// the same and the bounds above apply unchanged.
//
// Skips (GTEST_SKIP with the reason) in a build without --config=cuda and
// when no GPU is visible; tools/gpu/package.sh packs it for the GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/ops/ops.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

struct Case {
  const char* model;
  bool ddp;
  ShardingStrategy strategy;  // FSDP only
  int world;
  int shard_group;  // hybrid only
  bool bf16 = false;  // bf16 mixed precision (param_dtype bf16, reduce f32)
  bool offload = false;  // FSDP cpu_offload (on both devices)
};

constexpr int kSteps = 5;

struct RunResult {
  std::vector<std::vector<float>> losses;  // [rank][step], global loss
  // [rank][unit][param] -> f32 values on the host, after the last step and
  // (bf16 cases) before the first
  std::vector<std::vector<std::vector<std::vector<float>>>> params, initial;
};

TrainerOptions OptionsFor(const Case& c, DeviceKind kind) {
  TrainerOptions o;
  o.model = c.model;
  o.batch_size = 2;
  o.data_tokens = 256;
  o.parallelism = c.ddp ? Parallelism::kDdp : Parallelism::kFsdp;
  o.fsdp.strategy = c.strategy;
  o.fsdp.shard_group_size = c.shard_group;
  o.fsdp.seed = 1234;
  o.fsdp.timeout = Duration(120'000);
  o.fsdp.cpu_offload = c.offload;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = 0.1f;
  if (c.bf16) {
    o.fsdp.mixed_precision.param_dtype = DType::kBF16;
    o.fsdp.mixed_precision.reduce_dtype = DType::kF32;
  }
  o.device.kind = kind;
  // Every rank on the first GPU (ranks as threads on one device), whatever
  // the number of GPUs visible; CPU ranks on cpu:rank.
  o.device.index = kind == DeviceKind::kCuda ? 0 : -1;
  return o;
}

// The f32 values of `t` (host or device memory) on the host.
StatusOr<std::vector<float>> ToHost(Trainer& trainer, const Tensor& t) {
  std::vector<float> out(t.numel());
  if (t.numel() == 0) return out;
  SK_ASSIGN_OR_RETURN(Tensor host, HostAllocator::Default().Empty(DType::kF32, Shape{t.numel()}));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, trainer.device().CreateStream("test readback"));
  StreamAllocator alloc(&trainer.allocator(), stream.get());
  ops::OpContext ctx{&trainer.device(), stream.get(), &alloc};
  SK_ASSIGN_OR_RETURN(Tensor src, t.View(0, DType::kF32, Shape{t.numel()}));
  SK_RETURN_IF_ERROR(ops::Copy(ctx, src, host));
  SK_RETURN_IF_ERROR(stream->Synchronize(Duration(60'000)));
  const float* p = host.data_as<float>();
  out.assign(p, p + t.numel());
  return out;
}

RunResult Train(const Case& c, DeviceKind kind) {
  RunResult res;
  res.losses.resize(c.world);
  res.params.resize(c.world);
  res.initial.resize(c.world);
  std::mutex mu;
  Status s = comm::RunLocalRanks(c.world, [&](int rank, comm::ProcessGroup* world) -> Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(OptionsFor(c, kind), world));
    if (c.offload) {
      // Offloaded: the shards are host memory and the optimizer steps there.
      const Tensor& master = t->fsdp()->master_shard(0);
      if (!master.device().is_cpu() || !t->fsdp()->shard_context().device->id().is_cpu()) {
        return InternalError("cpu_offload: master shard " + master.ToString() + " is not in host memory");
      }
    }
    auto read_params = [&]() -> StatusOr<std::vector<std::vector<std::vector<float>>>> {
      std::vector<std::vector<std::vector<float>>> params;
      const auto& units = t->model().units();
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        params.emplace_back();
        for (int p = 0; p < static_cast<int>(units[u].params.size()); ++p) {
          Tensor value;
          if (t->fsdp() != nullptr) {
            // Collective over the shard group; returns host memory.
            SK_ASSIGN_OR_RETURN(value, t->fsdp()->GatherFullParam(u, p));
          } else {
            // The rank's device, written asynchronously on DDP's streams
            // (its initialisation too: a fresh trainer's params race
            // without this wait, which NCCL's timing exposed).
            SK_RETURN_IF_ERROR(t->ddp()->Synchronize(Duration(60'000)));
            value = t->ddp()->param(u, p);
          }
          SK_ASSIGN_OR_RETURN(std::vector<float> host, ToHost(*t, value));
          params.back().push_back(std::move(host));
        }
      }
      return params;
    };
    std::vector<std::vector<std::vector<float>>> initial;
    if (c.bf16) {
      SK_ASSIGN_OR_RETURN(initial, read_params());
    }
    std::vector<float> losses;
    for (int step = 0; step < kSteps; ++step) {
      SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
      losses.push_back(m.global_loss);
    }
    SK_ASSIGN_OR_RETURN(auto params, read_params());
    std::lock_guard<std::mutex> lock(mu);
    res.losses[rank] = std::move(losses);
    res.params[rank] = std::move(params);
    res.initial[rank] = std::move(initial);
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << DeviceKindName(kind) << " run: " << s;
  return res;
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = c.model;
  for (char& ch : s) {
    if (ch == '-') ch = '_';
  }
  s += "_";
  s += c.ddp ? "DDP" : ShardingStrategyName(c.strategy);
  s += "_world" + std::to_string(c.world);
  if (c.shard_group) s += "_group" + std::to_string(c.shard_group);
  if (c.bf16) s += "_bf16";
  if (c.offload) s += "_offload";
  return s;
}

class FsdpEquivalenceCudaTest : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpEquivalenceCudaTest, LossesAndParametersMatchTheCpuRun) {
  StatusOr<Device*> gpu = Device::Get(DeviceId::Cuda(0));
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status().message();
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  RunResult cpu = Train(c, DeviceKind::kCpu);
  ASSERT_FALSE(::testing::Test::HasFailure());
  RunResult cuda = Train(c, DeviceKind::kCuda);
  ASSERT_FALSE(::testing::Test::HasFailure());
  if (c.bf16) {
    // Run to run, the GPU must repeat itself: every op and collective here
    // has a fixed order, so a difference is a race, not rounding.
    RunResult again = Train(c, DeviceKind::kCuda);
    ASSERT_FALSE(::testing::Test::HasFailure());
    for (int r = 0; r < c.world; ++r) {
      for (size_t u = 0; u < cuda.params[r].size(); ++u) {
        for (size_t p = 0; p < cuda.params[r][u].size(); ++p) {
          const std::vector<float>& a = cuda.params[r][u][p];
          const std::vector<float>& b = again.params[r][u][p];
          ASSERT_EQ(a.size(), b.size());
          double diff = 0, norm = 0;
          size_t differ = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            const double d1 = double(a[i]) - cuda.initial[r][u][p][i];
            const double d2 = double(b[i]) - again.initial[r][u][p][i];
            diff += (d1 - d2) * (d1 - d2);
            norm += d1 * d1;
            differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
          }
          EXPECT_EQ(differ, 0u) << "rank " << r << " unit " << u << " param " << p
                                << ": two GPU runs differ in " << differ << " of " << a.size()
                                << " elements; update difference " << std::sqrt(diff)
                                << " vs its norm " << std::sqrt(norm);
        }
      }
    }
  }
  // f32: ~100x the expected drift (see the top), element by element.
  // bf16: both devices round every activation and gradient to bf16 (8 bits
  // of mantissa), and a one-ulp difference in an f32 GEMM result can round
  // to the neighbouring bf16 value; a gradient summed over tokens with
  // cancellation then differs by more than its own size in a few elements,
  // so elementwise bounds would be set by the worst element. Instead each
  // parameter's *update* over the five steps (final minus initial) is
  // compared as a vector: |d_cuda - d_cpu| <= 25% |d_cpu| (L2). Where 25%
  // comes from: on the H100, with a deterministic CPU reference, the
  // largest legitimate difference was 12.0% (t5-tiny FULL_SHARD and
  // SHARD_GRAD_OP at world 2; gpt-tiny <= 0.6%), the same on two runs; on
  // the CPU alone a few-ulp change of f32 arithmetic (scalar vs vector
  // loops) moves bf16 updates by up to 2%. A doubled reduction moves them
  // by 93%, half of one (a missing peer's share at world 2) by 52-78%, a
  // stale shard (no update) by 100% (//tests/train:bf16_determinism_test
  // measures these and checks them against this bound). 25% is about the
  // geometric mean of 12% and 52%: 2x from each.
  const double update_rel = 0.25;
  double worst_update = 0;  // bf16: the largest |d_cuda - d_cpu| / |d_cpu|
  const double loss_rel = c.bf16 ? 2e-2 : 1e-4;
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(cuda.losses[r].size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      const float want = cpu.losses[r][s], got = cuda.losses[r][s];
      ASSERT_TRUE(std::isfinite(got)) << "rank " << r << " step " << s + 1 << " loss " << got;
      EXPECT_LE(std::fabs(got - want), loss_rel * std::fabs(want))
          << "rank " << r << " loss at step " << s + 1 << ": cuda " << got << ", cpu " << want;
    }
    ASSERT_EQ(cuda.params[r].size(), cpu.params[r].size());
    for (size_t u = 0; u < cpu.params[r].size(); ++u) {
      ASSERT_EQ(cuda.params[r][u].size(), cpu.params[r][u].size());
      for (size_t p = 0; p < cpu.params[r][u].size(); ++p) {
        const std::vector<float>& want = cpu.params[r][u][p];
        const std::vector<float>& got = cuda.params[r][u][p];
        ASSERT_EQ(got.size(), want.size()) << "unit " << u << " param " << p;
        if (!c.bf16) {
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_LE(std::fabs(got[i] - want[i]), 1e-5 + 1e-4 * std::fabs(want[i]))
                << "rank " << r << " unit " << u << " param " << p << " [" << i << "]: cuda " << got[i]
                << ", cpu " << want[i];
          }
          continue;
        }
        const std::vector<float>& init_cpu = cpu.initial[r][u][p];
        const std::vector<float>& init_cuda = cuda.initial[r][u][p];
        ASSERT_EQ(init_cpu.size(), want.size());
        ASSERT_EQ(init_cuda.size(), want.size());
        double diff = 0, norm = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_TRUE(std::isfinite(got[i])) << "rank " << r << " unit " << u << " param " << p << " [" << i << "]";
          // Same initialisation on both devices (Philox counters).
          ASSERT_LE(std::fabs(init_cuda[i] - init_cpu[i]), 1e-6 + 1e-6 * std::fabs(init_cpu[i]));
          const double d_cpu = double(want[i]) - init_cpu[i], d_cuda = double(got[i]) - init_cuda[i];
          diff += (d_cuda - d_cpu) * (d_cuda - d_cpu);
          norm += d_cpu * d_cpu;
        }
        if (norm > 0) worst_update = std::max(worst_update, std::sqrt(diff / norm));
        EXPECT_LE(std::sqrt(diff), update_rel * std::sqrt(norm) + 1e-7)
            << "rank " << r << " unit " << u << " param " << p << ": the update's L2 difference "
            << std::sqrt(diff) << " vs its norm " << std::sqrt(norm);
      }
    }
  }
  if (c.bf16) std::printf("bf16 worst update difference vs the cpu: %.4g\n", worst_update);
}

std::vector<Case> AllCases() {
  std::vector<Case> v;
  for (const char* model : {"gpt-tiny", "t5-tiny"}) {
    for (int world : {1, 2, 4}) {
      for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                 ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard}) {
        v.push_back(Case{model, false, s, world, 0});
      }
      v.push_back(Case{model, true, ShardingStrategy::kFullShard, world, 0});
    }
    v.push_back(Case{model, false, ShardingStrategy::kHybridShard, 4, 2});
    v.push_back(Case{model, false, ShardingStrategy::kHybridShardGradOp, 4, 2});
    // bf16 mixed precision: the cast, bf16 GEMM and f32-reduce paths.
    v.push_back(Case{model, false, ShardingStrategy::kFullShard, 1, 0, true});
    v.push_back(Case{model, false, ShardingStrategy::kFullShard, 2, 0, true});
    v.push_back(Case{model, false, ShardingStrategy::kShardGradOp, 2, 0, true});
    v.push_back(Case{model, true, ShardingStrategy::kFullShard, 2, 0, true});
    // CPU offload: pinned host shards, H2D/D2H copies, the optimizer on the host.
    for (int world : {1, 2}) {
      for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
        v.push_back(Case{model, false, s, world, 0, false, true});
      }
    }
    v.push_back(Case{model, false, ShardingStrategy::kFullShard, 2, 0, true, true});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(StrategiesOnOneGpu, FsdpEquivalenceCudaTest, ::testing::ValuesIn(AllCases()), Name);

}  // namespace
}  // namespace sk
