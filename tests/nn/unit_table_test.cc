#include "runtime/nn/unit_table.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/configs.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "tests/nn/gradient_check.h"

namespace sk {
namespace {

std::unique_ptr<Model> Make(const std::string& name, ModelOptions o = {}) {
  auto m = CreateModel(name, o);
  CHECK(m.ok()) << m.status();
  return std::move(m).value();
}

std::unique_ptr<OwnedParameters> Params(const Model& m, uint64_t seed, DType dt = DType::kF32) {
  auto p = OwnedParameters::Create(m.units(), seed, dt);
  CHECK(p.ok()) << p.status();
  return std::move(p).value();
}

TokenBatch Images(std::vector<int32_t> ids, std::vector<int32_t> labels) {
  TokenBatch b;
  b.batch_size = static_cast<int64_t>(ids.size());
  b.seq_len = 1;
  b.inputs = std::move(ids);
  b.targets = std::move(labels);
  return b;
}

TEST(UnitTable, RegnetTinyHasTheTableUnitsAndHandCountedParameters) {
  auto m = Make("regnet-tiny");
  const auto& u = m->units();
  ASSERT_EQ(u.size(), 5u);
  EXPECT_EQ(u[0].name, "stem");
  EXPECT_EQ(u[1].name, "s1.b0");
  EXPECT_EQ(u[4].name, "head");
  // s1.b0's 3x3 group conv: 16 channels in groups of 8 -> weight [2, 9*8, 8].
  EXPECT_EQ(u[1].params[2].name, "b.w");
  EXPECT_EQ(u[1].params[2].shape, Shape({2, 72, 8}));
  const int64_t stem = 27 * 8 + 8;
  const int64_t s1b0 = (8 * 16 + 16) + (2 * 72 * 8 + 16) + (16 * 16 + 16) + (8 * 16 + 16);
  const int64_t s2b0 = (16 * 32 + 32) + (4 * 72 * 8 + 32) + (32 * 32 + 32) + (16 * 32 + 32);
  const int64_t s2b1 = (32 * 32 + 32) + (4 * 72 * 8 + 32) + (32 * 32 + 32);
  const int64_t head = 32 * 10 + 10;
  EXPECT_EQ(m->num_parameters(), stem + s1b0 + s2b0 + s2b1 + head);
}

// Model FLOPs against a hand count of every GEMM, 2 M K N per
// convolution (M output pixels, K = k*k*C_in/groups, N = C_out), per image.
TEST(UnitTable, ModelFlopsMatchAHandCount) {
  const double stem = 2.0 * 64 * 27 * 8;  // 16x16 -> 8x8
  const double s1b0 = 2.0 * 64 * 8 * 16 + 2.0 * 16 * 72 * 16 + 2.0 * 16 * 16 * 16 + 2.0 * 16 * 8 * 16;
  const double s2b0 = 2.0 * 16 * 16 * 32 + 2.0 * 4 * 72 * 32 + 2.0 * 4 * 32 * 32 + 2.0 * 4 * 16 * 32;
  const double s2b1 = 2.0 * 4 * 32 * 32 + 2.0 * 4 * 72 * 32 + 2.0 * 4 * 32 * 32;
  const double regnet = stem + s1b0 + s2b0 + s2b1 + 2.0 * 32 * 10;
  EXPECT_DOUBLE_EQ(Make("regnet-tiny")->Flops(3, 1, 0).model_flops, 3 * 3 * regnet);
  // deepvit-tiny: 4x4 patches of 16x16x3 -> 16 tokens of 32; per block qkv
  // and output projections (8 d^2 per token), QK^T and PV (4 T d per
  // token), the MLP (4 d d_ff per token).
  const double T = 16, d = 32, ff = 64;
  const double block = T * (8 * d * d + 4 * T * d + 4 * d * ff);
  const double vit = 2.0 * 16 * 48 * 32 + 2 * block + 2.0 * 32 * 10;
  EXPECT_DOUBLE_EQ(Make("deepvit-tiny")->Flops(2, 1, 0).model_flops, 3 * 2 * vit);
  ModelOptions ckpt;
  ckpt.activation_checkpointing = true;
  EXPECT_DOUBLE_EQ(Make("regnet-tiny", ckpt)->Flops(1, 1, 0).hardware_flops,
                   3 * regnet + regnet - 2.0 * 32 * 10);
}

TEST(UnitTable, PaperModelsLandNearTheirNamedSizes) {
  EXPECT_NEAR(Make("regnet-9b")->num_parameters() / 1e9, 9.0, 0.2);
  EXPECT_NEAR(Make("deepvit-8b")->num_parameters() / 1e9, 8.0, 0.2);
}

TEST(UnitTable, HooksRunForwardInUnitOrderAndBackwardInReverse) {
  for (const char* name : {"regnet-tiny", "deepvit-tiny"}) {
    auto m = Make(name);
    auto p = Params(*m, 1);
    ASSERT_TRUE(m->ForwardBackward(Images({1, 2}, {3, 4}), *p, HostAllocator::Default()).ok());
    std::vector<std::string> want;
    const int U = static_cast<int>(m->units().size());
    for (int u = 0; u < U; ++u) {
      want.push_back("PreForward(" + std::to_string(u) + ")");
      want.push_back("PostForward(" + std::to_string(u) + ")");
    }
    for (int u = U - 1; u >= 0; --u) {
      want.push_back("PreBackward(" + std::to_string(u) + ")");
      want.push_back("PostBackward(" + std::to_string(u) + ")");
    }
    EXPECT_EQ(p->call_log(), want) << name;
  }
}

TEST(UnitTable, ParameterGradientsMatchFiniteDifferencesOfTheLoss) {
  for (const char* name : {"regnet-tiny", "deepvit-tiny"}) {
    SCOPED_TRACE(name);
    auto m = Make(name);
    auto p = Params(*m, 5);
    for (const Tensor& t : p->all_params()) {
      float* d = t.data_as<float>();
      for (int64_t i = 0; i < t.numel(); ++i) d[i] += 0.05f * std::sin(1.0f + 0.37f * i);
    }
    const TokenBatch batch = Images({1, 7}, {2, 9});
    ASSERT_TRUE(m->ForwardBackward(batch, *p, HostAllocator::Default()).ok());
    ExpectGradientsMatchCentralDifferences(*m, *p, batch, m->units()[0].name);
  }
}

// A single grouped, strided, padded convolution and the classifier against
// a direct (nested-loop) convolution on the host: the im2col lowering
// computes the convolution it claims to.
TEST(UnitTable, ConvolutionLoweringMatchesADirectConvolution) {
  UnitTableConfig c;
  c.name = "one-conv";
  c.image_size = 5;
  c.num_classes = 4;
  TableUnit conv;
  conv.name = "conv";
  conv.in_h = conv.in_w = 5;
  ConvLayerSpec l;
  l.name = "k";
  l.in_channels = 3;
  l.out_channels = 6;
  l.kernel = 3;
  l.stride = 2;
  l.groups = 3;
  conv.convs = {l};
  TableUnit head;
  head.name = "head";
  head.kind = TableUnitKind::kClassifier;
  head.in_h = head.in_w = 3;
  head.width = 6;
  c.units = {conv, head};
  auto m = UnitTableModel::Create(c);
  ASSERT_TRUE(m.ok()) << m.status();
  auto p = Params(**m, 3);
  for (const Tensor& t : p->all_params()) {  // nonzero biases too
    float* d = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] += 0.1f * std::cos(0.7f * i);
  }
  const TokenBatch batch = Images({2, 3}, {1, 0});
  auto loss = (*m)->Forward(batch, *p, HostAllocator::Default());
  ASSERT_TRUE(loss.ok()) << loss.status();

  const float* w = p->param(0, 0).data_as<float>();   // [3 groups, 9 taps * 1 channel, 2]
  const float* bias = p->param(0, 1).data_as<float>();
  const float* fc = p->param(1, 0).data_as<float>();  // [6, 4]
  const float* fcb = p->param(1, 1).data_as<float>();
  double want = 0;
  for (int b = 0; b < 2; ++b) {
    auto img = HostAllocator::Default().Empty(DType::kF32, Shape{5 * 5 * 3});
    ASSERT_TRUE(img.ok());
    ASSERT_TRUE(ops::InitPhilox(ops::HostContext(), Initializer::Normal(0.0f, 1.0f), kUnitTableImageSeed,
                                static_cast<uint64_t>(batch.inputs[b]), 0, *img)
                    .ok());
    const float* x = img->data_as<float>();
    std::vector<double> pooled(6, 0.0);
    for (int oy = 0; oy < 3; ++oy) {
      for (int ox = 0; ox < 3; ++ox) {
        for (int co = 0; co < 6; ++co) {
          const int g = co / 2, n = co % 2;  // group g reads input channel g
          double y = bias[co];
          for (int ky = 0; ky < 3; ++ky) {
            for (int kx = 0; kx < 3; ++kx) {
              const int iy = oy * 2 - 1 + ky, ix = ox * 2 - 1 + kx;
              if (iy < 0 || iy >= 5 || ix < 0 || ix >= 5) continue;
              y += x[(iy * 5 + ix) * 3 + g] * w[(g * 9 + ky * 3 + kx) * 2 + n];
            }
          }
          pooled[co] += y / 9.0;
        }
      }
    }
    std::vector<double> logits(4);
    double mx = -1e30;
    for (int k = 0; k < 4; ++k) {
      logits[k] = fcb[k];
      for (int co = 0; co < 6; ++co) logits[k] += pooled[co] * fc[co * 4 + k];
      mx = std::max(mx, logits[k]);
    }
    double z = 0;
    for (double v : logits) z += std::exp(v - mx);
    want += (std::log(z) + mx - logits[batch.targets[b]]) / 2.0;
  }
  EXPECT_NEAR(*loss, want, 1e-5 * std::max(1.0, std::fabs(want)));
}

TEST(UnitTable, ActivationCheckpointingGivesIdenticalLossAndGradients) {
  for (const char* name : {"regnet-tiny", "deepvit-tiny"}) {
    ModelOptions ckpt;
    ckpt.activation_checkpointing = true;
    auto plain = Make(name), re = Make(name, ckpt);
    auto pa = Params(*plain, 3), pb = Params(*re, 3);
    const TokenBatch batch = Images({4, 5, 6}, {1, 2, kIgnoreTarget});
    auto la = plain->ForwardBackward(batch, *pa, HostAllocator::Default());
    auto lb = re->ForwardBackward(batch, *pb, HostAllocator::Default());
    ASSERT_TRUE(la.ok() && lb.ok()) << name;
    EXPECT_EQ(*la, *lb) << name;
    EXPECT_EQ(Flatten(pa->all_grads()), Flatten(pb->all_grads())) << name;
  }
}

// bf16 compute against f32: the loss within 2% and the gradient within 5%
// relative L2, the tolerances the GPT and T5 tests use.
TEST(UnitTable, Bf16ComputeStaysWithinToleranceOfF32) {
  for (const char* name : {"regnet-tiny", "deepvit-tiny"}) {
    ModelOptions bf;
    bf.compute_dtype = DType::kBF16;
    auto f32 = Make(name), b16 = Make(name, bf);
    auto pa = Params(*f32, 8), pb = Params(*b16, 8, DType::kBF16);
    const TokenBatch batch = Images({1, 2, 3, 4}, {5, 6, 7, 8});
    auto la = f32->ForwardBackward(batch, *pa, HostAllocator::Default());
    auto lb = b16->ForwardBackward(batch, *pb, HostAllocator::Default());
    ASSERT_TRUE(la.ok() && lb.ok()) << name << " " << lb.status();
    EXPECT_NEAR(*lb, *la, 0.02 * std::fabs(*la)) << name;
    const std::vector<float> ga = Flatten(pa->all_grads()), gb = Flatten(pb->all_grads());
    double err = 0, norm = 0;
    for (size_t i = 0; i < ga.size(); ++i) {
      err += (ga[i] - gb[i]) * double(ga[i] - gb[i]);
      norm += ga[i] * double(ga[i]);
    }
    EXPECT_LT(std::sqrt(err / norm), 0.05) << name;
  }
}

TEST(UnitTable, BadBatchesAreInvalidArgumentNamingTheField) {
  auto m = Make("regnet-tiny");
  auto p = Params(*m, 1);
  TokenBatch two = Images({1}, {1});
  two.seq_len = 2;
  auto r = m->ForwardBackward(two, *p, HostAllocator::Default());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("seq_len"), std::string::npos) << r.status();
  r = m->ForwardBackward(Images({10}, {1}), *p, HostAllocator::Default());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("inputs"), std::string::npos) << r.status();
  r = m->ForwardBackward(Images({1}, {-3}), *p, HostAllocator::Default());
  EXPECT_NE(r.status().message().find("targets"), std::string::npos) << r.status();
}

TEST(UnitTable, BadTablesAreInvalidArgumentNamingTheUnit) {
  auto c = FindModelConfig("regnet-tiny");
  ASSERT_TRUE(c.ok());
  UnitTableConfig groups = c->table;
  groups.units[1].convs[1].groups = 3;  // does not divide 16
  auto m = UnitTableModel::Create(groups);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("s1.b0"), std::string::npos) << m.status();
  UnitTableConfig chain = c->table;
  chain.units[2].convs[0].in_channels = 17;
  m = UnitTableModel::Create(chain);
  EXPECT_NE(m.status().message().find("input channels"), std::string::npos) << m.status();
  UnitTableConfig padded = c->table;
  padded.units[2].convs[0].kernel = 3;
  m = UnitTableModel::Create(padded);
  EXPECT_NE(m.status().message().find("padded"), std::string::npos) << m.status();
  UnitTableConfig no_head = c->table;
  no_head.units.pop_back();
  m = UnitTableModel::Create(no_head);
  EXPECT_NE(m.status().message().find("classifier"), std::string::npos) << m.status();
}

TEST(UnitTable, TinyRegnetLearnsAFixedBatch) {
  auto m = Make("regnet-tiny");
  auto p = Params(*m, 2);
  const TokenBatch batch = Images({0, 1, 2, 3}, {3, 1, 4, 1});
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    p->ZeroGrad();
    auto l = m->ForwardBackward(batch, *p, HostAllocator::Default());
    ASSERT_TRUE(l.ok());
    if (step == 0) first = *l;
    last = *l;
    auto params = p->all_params();
    auto grads = p->all_grads();
    for (size_t t = 0; t < params.size(); ++t) {
      ASSERT_TRUE(ops::Axpy(ops::HostContext(), -0.1f, grads[t], params[t]).ok());
    }
  }
  EXPECT_GT(first, 1.5f);
  EXPECT_LT(last, 0.5f * first);
}

}  // namespace
}  // namespace sk
