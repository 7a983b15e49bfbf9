// Packed documents on a GPU: gpt-tiny, llama-tiny and qwen2-tiny trained
// for three steps through Trainer::StepOnBatches on cuda:0, on the caller's
// packed batches (several documents per row, position ids restarting per
// document, segment ids, ignored targets, two micro-batches of different
// lengths), end with the losses and parameters of the same run on the CPU.
// The CPU honours the documents (//tests/nn:packed_documents_test: each
// document gets the loss and gradients it has alone); a GPU that ignored
// the segment ids (every case), or GPT's position ids, would differ by
// percent (checked on the CPU by dropping them from one run: every such
// case fails these bounds). Llama's RoPE positions cannot show here: a
// document's positions shifted by its offset turn its q and k alike, and
// under the mask only same-document dot products count; the conformance
// suite's Rope case checks RoPE at given positions on the device.
//
// What runs on the GPU: GPT's learned positions gathered by the position
// ids (embedding forward and backward), Llama's RoPE at the given positions
// (rope with a positions operand), and attention under the block-diagonal
// causal mask (runtime/ops/cuda/cuda_backend.h: the composed attention's
// masked softmax, which the linear-memory op runs for packed rows), f32
// and bf16, multi-head (GPT) and grouped-query (Llama: 2 query heads per
// key/value head; Qwen2: 4 and q/k/v biases), FSDP at world 1 and 2 (ranks
// as threads on one GPU).
//
// Bounds: fsdp_equivalence_cuda_test's, for the same reasons (its header):
// f32 losses 1e-4 relative and parameters 1e-5 absolute + 1e-4 relative
// (SGD); bf16 losses 2% and each parameter's three-step update within 25%
// of the CPU's as a vector (L2).
//
// Skips (GTEST_SKIP with the reason) in a build without --config=cuda and
// when no GPU is visible; tools/gpu/package.sh packs it for the GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/ops/ops.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

struct Case {
  const char* model;
  int64_t seq_len;  // the model's longest row
  int world;
  bool bf16 = false;
};

constexpr int kSteps = 3;
constexpr int kMicro = 2;

// Rank `rank`'s micro-batch m of step `step`: 2 rows of documents 1..9
// tokens long packed end to end (the last cut at the row's end), position
// ids from 0 in each document, segment ids counting the documents of the
// row; about one target in five ignored (a prompt's). Micro-batch 1 is
// three tokens shorter than the model's longest row.
TokenBatch PackedBatch(const Case& c, int rank, int step, int m) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * step + 10 * rank + m + 1));
  std::uniform_int_distribution<int32_t> token(0, 63), length(1, 9), ignore(0, 4);
  TokenBatch b;
  b.batch_size = 2;
  b.seq_len = m == 0 ? c.seq_len : c.seq_len - 3;
  for (int64_t row = 0; row < b.batch_size; ++row) {
    int32_t segment = 0, position = 0, left = length(gen);
    for (int64_t i = 0; i < b.seq_len; ++i) {
      if (left == 0) {
        ++segment;
        position = 0;
        left = length(gen);
      }
      b.inputs.push_back(token(gen));
      b.targets.push_back(ignore(gen) == 0 ? kIgnoreTarget : token(gen));
      b.positions.push_back(position++);
      b.segment_ids.push_back(segment);
      --left;
    }
  }
  return b;
}

TrainerOptions OptionsFor(const Case& c, DeviceKind kind) {
  TrainerOptions o;
  o.model = c.model;
  o.batch_size = 2;
  o.seq_len = c.seq_len;
  o.grad_accum_steps = kMicro;
  o.data_tokens = 256;
  o.parallelism = Parallelism::kFsdp;
  o.fsdp.strategy = ShardingStrategy::kFullShard;
  o.fsdp.seed = 1234;
  o.fsdp.timeout = Duration(120'000);
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = 0.1f;
  if (c.bf16) {
    o.fsdp.mixed_precision.param_dtype = DType::kBF16;
    o.fsdp.mixed_precision.reduce_dtype = DType::kF32;
  }
  o.device.kind = kind;
  o.device.index = kind == DeviceKind::kCuda ? 0 : -1;
  return o;
}

struct RunResult {
  std::vector<std::vector<float>> losses;                // [rank][step]
  std::vector<std::vector<float>> params;   // [unit * param][element], rank 0's, after the run
  std::vector<std::vector<float>> initial;  // the same before step 1
};

// The f32 values of `t` (host memory: FSDP's gathered parameters) or of a
// device tensor, on the host.
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
  std::mutex mu;
  Status s = comm::RunLocalRanks(c.world, [&](int rank, comm::ProcessGroup* world) -> Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(OptionsFor(c, kind), world));
    auto read_params = [&]() -> StatusOr<std::vector<std::vector<float>>> {
      std::vector<std::vector<float>> params;
      const auto& units = t->model().units();
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        for (int p = 0; p < static_cast<int>(units[u].params.size()); ++p) {
          // Collective over the shard group; returns host memory.
          SK_ASSIGN_OR_RETURN(Tensor value, t->fsdp()->GatherFullParam(u, p));
          SK_ASSIGN_OR_RETURN(std::vector<float> host, ToHost(*t, value));
          params.push_back(std::move(host));
        }
      }
      return params;
    };
    SK_ASSIGN_OR_RETURN(auto initial, read_params());
    std::vector<float> losses;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<TokenBatch> mine;
      for (int m = 0; m < kMicro; ++m) mine.push_back(PackedBatch(c, rank, step, m));
      SK_ASSIGN_OR_RETURN(StepMetrics metrics, t->StepOnBatches(mine));
      losses.push_back(metrics.global_loss);
    }
    SK_ASSIGN_OR_RETURN(auto params, read_params());
    std::lock_guard<std::mutex> lock(mu);
    res.losses[rank] = std::move(losses);
    if (rank == 0) {
      res.params = std::move(params);
      res.initial = std::move(initial);
    }
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << DeviceKindName(kind) << " run: " << s;
  return res;
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.model;
  for (char& ch : s) {
    if (ch == '-') ch = '_';
  }
  s += "_world" + std::to_string(info.param.world);
  if (info.param.bf16) s += "_bf16";
  return s;
}

class PackedDocumentsCudaTest : public ::testing::TestWithParam<Case> {};

TEST_P(PackedDocumentsCudaTest, LossesAndParametersMatchTheCpuRun) {
  StatusOr<Device*> gpu = Device::Get(DeviceId::Cuda(0));
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status().message();
  if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  const RunResult cpu = Train(c, DeviceKind::kCpu);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const RunResult cuda = Train(c, DeviceKind::kCuda);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const double loss_rel = c.bf16 ? 2e-2 : 1e-4;
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(cuda.losses[r].size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      const float want = cpu.losses[r][s], got = cuda.losses[r][s];
      ASSERT_TRUE(std::isfinite(got)) << "rank " << r << " step " << s + 1 << " loss " << got;
      EXPECT_LE(std::fabs(got - want), loss_rel * std::fabs(want))
          << "rank " << r << " loss at step " << s + 1 << ": cuda " << got << ", cpu " << want;
    }
  }
  ASSERT_EQ(cuda.params.size(), cpu.params.size());
  for (size_t p = 0; p < cpu.params.size(); ++p) {
    const std::vector<float>& want = cpu.params[p];
    const std::vector<float>& got = cuda.params[p];
    ASSERT_EQ(got.size(), want.size()) << "parameter " << p;
    if (!c.bf16) {
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_LE(std::fabs(got[i] - want[i]), 1e-5 + 1e-4 * std::fabs(want[i]))
            << "parameter " << p << " [" << i << "]: cuda " << got[i] << ", cpu " << want[i];
      }
      continue;
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "parameter " << p << " [" << i << "]";
      const double d_cpu = double(want[i]) - cpu.initial[p][i];
      const double d_cuda = double(got[i]) - cuda.initial[p][i];
      diff += (d_cuda - d_cpu) * (d_cuda - d_cpu);
      norm += d_cpu * d_cpu;
    }
    EXPECT_LE(std::sqrt(diff), 0.25 * std::sqrt(norm) + 1e-7)
        << "parameter " << p << ": the update's L2 difference " << std::sqrt(diff)
        << " vs its norm " << std::sqrt(norm);
  }
}

std::vector<Case> AllCases() {
  return {
      {"gpt-tiny", 16, 1},         {"gpt-tiny", 16, 2},         {"llama-tiny", 32, 1},
      {"llama-tiny", 32, 2},       {"qwen2-tiny", 32, 1},       {"gpt-tiny", 16, 1, true},
      {"llama-tiny", 32, 1, true}, {"qwen2-tiny", 32, 2, true},
  };
}

INSTANTIATE_TEST_SUITE_P(PackedOnOneGpu, PackedDocumentsCudaTest, ::testing::ValuesIn(AllCases()),
                         Name);

}  // namespace
}  // namespace sk
