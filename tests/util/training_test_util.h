// Helpers for data-parallel tests (FSDP, DDP): a tiny GPT, deterministic batches, a single-rank
// reference run, and a runner that trains on N local ranks (threads).
#ifndef SHARDKIT_TESTS_UTIL_TRAINING_TEST_UTIL_H_
#define SHARDKIT_TESTS_UTIL_TRAINING_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"

namespace sk::testing {

inline GptConfig TinyGpt() {
  GptConfig c;
  c.name = "gpt-test";
  c.vocab_size = 32;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  return c;
}

// The TinyGpt model computing in `compute`.
inline std::unique_ptr<GptModel> TinyGptModel(DType compute = DType::kF32) {
  ModelOptions mo;
  mo.compute_dtype = compute;
  return *GptModel::Create(TinyGpt(), mo);
}

// Rows [first, first + rows) of a deterministic global batch for `step`.
inline TokenBatch MakeBatch(int step, int first, int rows, int seq = 8, int vocab = 32) {
  TokenBatch b;
  b.batch_size = rows;
  b.seq_len = seq;
  for (int r = first; r < first + rows; ++r) {
    for (int t = 0; t < seq; ++t) {
      uint32_t x = static_cast<uint32_t>(step * 7919 + r * 131 + t * 17);
      x = (x ^ (x >> 7)) * 2654435761u;
      b.inputs.push_back(static_cast<int32_t>((x >> 8) % vocab));
      b.targets.push_back(static_cast<int32_t>((x >> 16) % vocab));
    }
  }
  return b;
}

// SGD with momentum: Adam divides by sqrt(v), which turns the rounding noise
// of gradients that are mathematically zero (attention's key bias) into
// lr-sized steps and makes any two reduction orders disagree there.
inline OptimizerOptions TestOptimizer() {
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  o.weight_decay = 0.01f;
  return o;
}

struct ReferenceRun {
  std::vector<float> losses;
  std::vector<std::vector<std::vector<float>>> params;  // [unit][param][elem]
};

// Single rank, unsharded, on the whole global batch.
inline ReferenceRun RunReference(const GptModel& model, int steps, int global_rows, uint64_t seed,
                                 double clip = 0) {
  ReferenceRun out;
  auto owned = *OwnedParameters::Create(model.units(), seed);
  auto opt = *Optimizer::Create(TestOptimizer(), &HostAllocator::Default());
  for (int s = 0; s < steps; ++s) {
    owned->ZeroGrad();
    StatusOr<float> loss = model.ForwardBackward(MakeBatch(s, 0, global_rows), *owned, HostAllocator::Default());
    EXPECT_TRUE(loss.ok()) << loss.status();
    out.losses.push_back(*loss);
    std::vector<Tensor> ps = owned->all_params(), gs = owned->all_grads();
    if (clip > 0) {
      double norm = FinishGradNorm(*LocalGradNormPartial(ops::HostContext(), gs, NormType::kL2), NormType::kL2);
      EXPECT_TRUE(ClipGradientsToNorm(ops::HostContext(), gs, norm, clip).ok());
    }
    EXPECT_TRUE(opt->Step(ops::HostContext(), *ShardRefsFor(ps, gs)).ok());
  }
  for (int u = 0; u < owned->num_units(); ++u) {
    out.params.emplace_back();
    for (size_t p = 0; p < model.units()[u].params.size(); ++p) {
      const Tensor& t = owned->param(u, static_cast<int>(p));
      out.params.back().emplace_back(t.data_as<float>(), t.data_as<float>() + t.numel());
    }
  }
  return out;
}

// Runs `body(rank, world group)` on `world` threads of one local group.
// Failures are the body's gtest assertions.
inline void RunRanks(int world, const std::function<void(int, comm::ProcessGroup*)>& body) {
  Status s = comm::RunLocalRanks(world, [&](int r, comm::ProcessGroup* g) {
    body(r, g);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

inline void ExpectRelClose(float got, float want, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), rel * std::max(1.0, static_cast<double>(std::fabs(want))))
      << what << ": got " << got << ", want " << want;
}

}  // namespace sk::testing

#endif  // SHARDKIT_TESTS_UTIL_TRAINING_TEST_UTIL_H_
