#include "runtime/nn/t5.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/nn/gradient_check.h"

namespace sk {
namespace {

T5Config Tiny() {
  T5Config c;
  c.name = "t5-test";
  c.vocab_size = 24;
  c.max_source_len = 8;
  c.max_target_len = 8;
  c.n_encoder_layers = 2;
  c.n_decoder_layers = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.d_ff = 32;
  return c;
}

// A reversal task: target = reversed source; decoder input = BOS (0) then
// the target shifted right. Source tokens are drawn from [1, vocab).
TokenBatch ReverseBatch(int64_t b, int64_t len, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(vocab) - 1);
  TokenBatch batch;
  batch.batch_size = b;
  batch.seq_len = len;
  batch.source_len = len;
  for (int64_t i = 0; i < b; ++i) {
    std::vector<int32_t> src(len);
    for (auto& x : src) x = tok(gen);
    std::vector<int32_t> tgt(src.rbegin(), src.rend());
    batch.source.insert(batch.source.end(), src.begin(), src.end());
    batch.targets.insert(batch.targets.end(), tgt.begin(), tgt.end());
    batch.inputs.push_back(0);
    batch.inputs.insert(batch.inputs.end(), tgt.begin(), tgt.end() - 1);
  }
  return batch;
}

std::unique_ptr<T5Model> MakeModel(const T5Config& c, ModelOptions o = {}) {
  auto m = T5Model::Create(c, o);
  CHECK(m.ok()) << m.status();
  return std::move(m).value();
}

TEST(T5, UnitsAreEmbedEncoderBlocksNormDecoderBlocksAndHead) {
  auto m = MakeModel(Tiny());
  std::vector<std::string> names;
  for (const auto& u : m->units()) names.push_back(u.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "enc.0", "enc.1", "enc_norm", "dec.0",
                                             "dec.1", "head"}));
  EXPECT_EQ(m->units()[4].params.size(), 20u);  // self 6 + cross 8 + mlp 6
  EXPECT_EQ(m->units()[4].params[10].name, "cross.kv.w");
}

TEST(T5, HooksRunForwardInUnitOrderAndBackwardInReverse) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 1);
  ASSERT_TRUE(m->ForwardBackward(ReverseBatch(2, 5, 24, 1), *p, HostAllocator::Default()).ok());
  std::vector<std::string> want;
  for (int u = 0; u < 7; ++u) {
    want.push_back("PreForward(" + std::to_string(u) + ")");
    want.push_back("PostForward(" + std::to_string(u) + ")");
  }
  for (int u = 6; u >= 0; --u) {
    want.push_back("PreBackward(" + std::to_string(u) + ")");
    want.push_back("PostBackward(" + std::to_string(u) + ")");
  }
  EXPECT_EQ(p->call_log(), want);
}

TEST(T5, ParameterGradientsMatchFiniteDifferencesOfTheLoss) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 5);
  SpreadParams(*p, 2.0f, 0.31f);
  TokenBatch batch = ReverseBatch(2, 4, 24, 9);
  batch.source_len = 4;
  ASSERT_TRUE(m->ForwardBackward(batch, *p, HostAllocator::Default()).ok());
  ExpectGradientsMatchCentralDifferences(*m, *p, batch, "t5");
}


TEST(T5, TinyModelMemorisesAReversalBatch) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 11);
  TokenBatch batch = ReverseBatch(4, 6, 24, 12);
  float first = *m->Forward(batch, *p, HostAllocator::Default());
  float last = TrainWithAdam(*m, *p, batch, 150, 1e-2f);
  EXPECT_GT(first, 3.0f);
  EXPECT_LT(last, 0.05f);
}

TEST(T5, SameSeedGivesBitIdenticalTraining) {
  auto m = MakeModel(Tiny());
  TokenBatch batch = ReverseBatch(2, 6, 24, 13);
  auto pa = MakeParams(*m, 21), pb = MakeParams(*m, 21);
  EXPECT_EQ(TrainWithAdam(*m, *pa, batch, 5, 1e-2f), TrainWithAdam(*m, *pb, batch, 5, 1e-2f));
  EXPECT_EQ(Flatten(pa->all_params()), Flatten(pb->all_params()));
}

TEST(T5, ActivationCheckpointingGivesIdenticalLossAndGradients) {
  TokenBatch batch = ReverseBatch(2, 6, 24, 14);
  auto plain = MakeModel(Tiny());
  auto ckpt = MakeModel(Tiny(), ModelOptions{DType::kF32, true});
  auto pa = MakeParams(*plain, 3), pb = MakeParams(*ckpt, 3);
  auto la = plain->ForwardBackward(batch, *pa, HostAllocator::Default());
  auto lb = ckpt->ForwardBackward(batch, *pb, HostAllocator::Default());
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
  EXPECT_EQ(Flatten(pa->all_grads()), Flatten(pb->all_grads()));
}

// Same documented tolerance as the GPT: 2% on the loss, 5% relative L2 on gradients.
TEST(T5, Bf16ComputeStaysWithinToleranceOfF32) {
  TokenBatch batch = ReverseBatch(4, 6, 24, 15);
  auto f32 = MakeModel(Tiny());
  auto bf16 = MakeModel(Tiny(), ModelOptions{DType::kBF16, false});
  auto pa = MakeParams(*f32, 4), pb = MakeParams(*bf16, 4, DType::kBF16);
  auto la = f32->ForwardBackward(batch, *pa, HostAllocator::Default());
  auto lb = bf16->ForwardBackward(batch, *pb, HostAllocator::Default());
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_NEAR(*lb, *la, 0.02f * *la);
  std::vector<float> ga = Flatten(pa->all_grads()), gb = Flatten(pb->all_grads());
  double num = 0, den = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    num += (ga[i] - gb[i]) * (ga[i] - gb[i]);
    den += ga[i] * ga[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
}

// The decoder is causal, the encoder and cross-attention are not: the loss
// at decoder position 1 ignores later decoder inputs but sees every source
// token, including the last one.
TEST(T5, DecoderIsCausalButSeesTheWholeSource) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 2);
  TokenBatch b = ReverseBatch(1, 6, 24, 19);
  for (int t = 0; t < 6; ++t) b.targets[t] = t == 1 ? b.targets[t] : kIgnoreTarget;
  const float base = *m->Forward(b, *p, HostAllocator::Default());
  TokenBatch later = b;
  later.inputs[4] = (later.inputs[4] + 1) % 24;
  EXPECT_EQ(*m->Forward(later, *p, HostAllocator::Default()), base);
  TokenBatch source = b;
  source.source[5] = (source.source[5] + 1) % 24;
  EXPECT_NE(*m->Forward(source, *p, HostAllocator::Default()), base);
}

TEST(T5, BatchesWithoutValidSourceAreInvalidArgument) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 1);
  TokenBatch b = ReverseBatch(1, 4, 24, 1);
  b.source_len = 0;
  b.source.clear();
  auto r = m->Forward(b, *p, HostAllocator::Default());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("source_len"), std::string::npos);
  b = ReverseBatch(1, 4, 24, 1);
  b.source[2] = 99;
  r = m->Forward(b, *p, HostAllocator::Default());
  EXPECT_NE(r.status().message().find("source[2]"), std::string::npos) << r.status();
  T5Config c = Tiny();
  c.d_ff = 0;
  EXPECT_EQ(T5Model::Create(c).status().code(), StatusCode::kInvalidArgument);
}

TEST(T5, SourceAndTargetLengthsMayDiffer) {
  auto m = MakeModel(Tiny());
  auto p = MakeParams(*m, 1);
  TokenBatch b = ReverseBatch(2, 3, 24, 1);
  b.source_len = 7;
  b.source.assign(14, 5);
  EXPECT_TRUE(m->ForwardBackward(b, *p, HostAllocator::Default()).ok());
  EXPECT_GT(m->Flops(2, 3, 7).model_flops, m->Flops(2, 3, 3).model_flops);
}

}  // namespace
}  // namespace sk
