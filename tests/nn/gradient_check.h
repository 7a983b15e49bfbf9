// What the model tests share: parameters from a seed (and spread out),
// gradients flattened, a few Adam steps on one batch, the gradient check
// against central differences, and the checkpointing
// policies' exactness (gpt_test, llama_test, t5_test, unit_table_test and
// sharded_hooks_test each had their own copy).
#ifndef SHARDKIT_TESTS_NN_GRADIENT_CHECK_H_
#define SHARDKIT_TESTS_NN_GRADIENT_CHECK_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/nn/model.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/nn/gpt_test_model.h"

namespace sk {

// Parameters for `m`'s units, initialised from `seed`, in `dt`.
inline std::unique_ptr<OwnedParameters> MakeParams(const Model& m, uint64_t seed,
                                                   DType dt = DType::kF32) {
  auto p = OwnedParameters::Create(m.units(), seed, dt);
  CHECK(p.ok()) << p.status();
  return std::move(p).value();
}

// The f32 tensors `ts` end to end.
inline std::vector<float> Flatten(const std::vector<Tensor>& ts) {
  std::vector<float> out;
  for (const Tensor& t : ts) out.insert(out.end(), t.data_as<float>(), t.data_as<float>() + t.numel());
  return out;
}

// Adds 0.1 sin(phase + freq i) to element i of every parameter: a larger,
// varied init, so that every parameter gets a gradient well above f32
// noise before a gradient check.
inline void SpreadParams(OwnedParameters& p, float phase = 1.0f, float freq = 0.37f) {
  for (const Tensor& t : p.all_params()) {
    float* d = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] += 0.1f * std::sin(phase + freq * i);
  }
}

// `steps` Adam steps (learning rate `lr`) of `m` on one fixed batch; the
// last step's loss, every loss appended to `losses` when given.
inline float TrainWithAdam(const Model& m, OwnedParameters& p, const TokenBatch& batch, int steps,
                           float lr, std::vector<float>* losses = nullptr) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.lr = lr;
  auto adam = *Optimizer::Create(o, &HostAllocator::Default());
  auto refs = *ShardRefsFor(p.all_params(), p.all_grads());
  float loss = 0;
  for (int s = 0; s < steps; ++s) {
    p.ZeroGrad();
    auto l = m.ForwardBackward(batch, p, HostAllocator::Default());
    CHECK(l.ok()) << l.status();
    loss = *l;
    if (losses != nullptr) losses->push_back(loss);
    CHECK(adam->Step(ops::HostContext(), refs).ok());
  }
  return loss;
}

// `p` holds the gradients ForwardBackward(batch) just accumulated. At the
// first, middle and last element of every parameter tensor, compares that
// gradient with the central difference of Forward(batch) (eps 1e-2):
// |g - fd| <= 2e-3 + 0.03 |fd|, failures naming `label`, the tensor and the
// element. Parameters are restored. Returns the number of elements checked.
inline int ExpectGradientsMatchCentralDifferences(const Model& m, OwnedParameters& p,
                                                  const TokenBatch& batch, const std::string& label) {
  const std::vector<Tensor> params = p.all_params();
  const std::vector<Tensor> grads = p.all_grads();
  int checked = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    float* d = params[t].data_as<float>();
    for (int64_t i : {int64_t{0}, params[t].numel() / 2, params[t].numel() - 1}) {
      const float saved = d[i];
      const float eps = 1e-2f;
      d[i] = saved + eps;
      const double lp = *m.Forward(batch, p, HostAllocator::Default());
      d[i] = saved - eps;
      const double lm = *m.Forward(batch, p, HostAllocator::Default());
      d[i] = saved;
      const double fd = (lp - lm) / (2.0 * eps);
      EXPECT_NEAR(grads[t].data_as<float>()[i], fd, 2e-3 + 0.03 * std::fabs(fd))
          << label << " tensor " << t << " element " << i;
      ++checked;
    }
  }
  return checked;
}

// A model of one architecture built with the given options.
using ModelFactory = std::function<std::unique_ptr<Model>(const ModelOptions&)>;

// Whole-block checkpointing changes neither the loss nor a gradient bit, and
// its recomputation shows as hardware FLOPs beyond the model's.
inline void ExpectWholeBlockCheckpointingIsExact(const ModelFactory& make) {
  TokenBatch batch = RandomBatch(2, 8, 32, 14);
  auto plain = make(ModelOptions{});
  auto ckpt = make(ModelOptions{DType::kF32, true});
  auto pa = MakeParams(*plain, 3), pb = MakeParams(*ckpt, 3);
  auto la = plain->ForwardBackward(batch, *pa, HostAllocator::Default());
  auto lb = ckpt->ForwardBackward(batch, *pb, HostAllocator::Default());
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
  EXPECT_EQ(Flatten(pa->all_grads()), Flatten(pb->all_grads()));
  EXPECT_GT(ckpt->Flops(2, 8, 0).hardware_flops, ckpt->Flops(2, 8, 0).model_flops);
  EXPECT_EQ(plain->Flops(2, 8, 0).hardware_flops, plain->Flops(2, 8, 0).model_flops);
}

// Selective checkpointing (the block's cheap ops recomputed; attention kept,
// or recomputed too) changes neither the loss nor a gradient bit. It
// recomputes more than nothing and far less than a block; attention
// recomputed adds its products (in these tiny models, whose sequence is not
// much shorter than their width, a fair share of a block): more than the
// cheap ops alone, less than a block. It keeps less than no checkpointing and
// more than whole-block checkpointing.
inline void ExpectSelectiveCheckpointingIsExact(const ModelFactory& make) {
  TokenBatch batch = RandomBatch(2, 8, 32, 14);
  double cheap_only = 0;  // the recomputed FLOPs with attention kept
  for (bool attention : {false, true}) {
    SCOPED_TRACE(attention ? "recompute_attention" : "attention kept");
    ModelOptions o;
    o.checkpointing = ActivationCheckpointing::kSelective;
    o.recompute_attention = attention;
    auto plain = make(ModelOptions{});
    auto sel = make(o);
    auto full = make(ModelOptions{DType::kF32, true});
    auto pa = MakeParams(*plain, 3), pb = MakeParams(*sel, 3);
    auto la = plain->ForwardBackward(batch, *pa, HostAllocator::Default());
    auto lb = sel->ForwardBackward(batch, *pb, HostAllocator::Default());
    ASSERT_TRUE(la.ok() && lb.ok()) << lb.status();
    EXPECT_EQ(*la, *lb);
    EXPECT_EQ(Flatten(pa->all_grads()), Flatten(pb->all_grads()));
    const StepFlops fs = sel->Flops(2, 8, 0), ff = full->Flops(2, 8, 0);
    const double recomputed = fs.hardware_flops - fs.model_flops;
    const double block = ff.hardware_flops - ff.model_flops;
    EXPECT_GT(recomputed, 0);
    if (!attention) {
      EXPECT_LT(recomputed, 0.2 * block);
      cheap_only = recomputed;
    } else {
      EXPECT_GT(recomputed, cheap_only);
      EXPECT_LT(recomputed, block);
    }
    EXPECT_LT(sel->PeakActivationBytes(2, 8, 0, DeviceKind::kCpu), plain->PeakActivationBytes(2, 8, 0, DeviceKind::kCpu));
    EXPECT_GT(sel->PeakActivationBytes(2, 8, 0, DeviceKind::kCpu), full->PeakActivationBytes(2, 8, 0, DeviceKind::kCpu));
  }
}

}  // namespace sk

#endif  // SHARDKIT_TESTS_NN_GRADIENT_CHECK_H_
