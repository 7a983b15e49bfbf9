// Packed documents (TokenBatch::positions and segment_ids) in the
// decoder-only models: a packed row gives each document the loss and the
// gradients it gets alone (GPT's learned positions, Llama's RoPE plain and
// scaled, Qwen2's biases; the composed attention and, at long sequences,
// the linear-memory one), gradients match finite differences, and bad
// fields are refused naming them.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/gpt.h"
#include "runtime/nn/llama.h"
#include "runtime/nn/t5.h"
#include "tests/nn/gpt_test_model.h"
#include "tests/nn/gradient_check.h"

namespace sk {
namespace {

// A document: its tokens (inputs are all but the last, targets all but the first).
using Doc = std::vector<int32_t>;

Doc RandomDoc(int len, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab) - 1);
  Doc d(len + 1);
  for (auto& x : d) x = tok(gen);
  return d;
}

// Rows of documents packed end to end, each row padded to seq_len with
// token 0 in a segment of its own whose targets are ignored. Positions
// restart at 0 per document (and per padding run). Targets of documents
// other than `only` (when >= 0, an index in the order documents appear)
// are ignored too.
TokenBatch Pack(const std::vector<std::vector<Doc>>& rows, int64_t seq_len, int only = -1) {
  TokenBatch b;
  b.batch_size = static_cast<int64_t>(rows.size());
  b.seq_len = seq_len;
  int index = 0;
  for (const auto& row : rows) {
    int32_t segment = 0;
    int64_t used = 0;
    for (const Doc& d : row) {
      const bool counts = only < 0 || only == index++;
      for (size_t i = 0; i + 1 < d.size(); ++i) {
        b.inputs.push_back(d[i]);
        b.targets.push_back(counts ? d[i + 1] : kIgnoreTarget);
        b.positions.push_back(static_cast<int32_t>(i));
        b.segment_ids.push_back(segment);
      }
      used += static_cast<int64_t>(d.size()) - 1;
      ++segment;
    }
    for (int64_t i = 0; used + i < seq_len; ++i) {
      b.inputs.push_back(0);
      b.targets.push_back(kIgnoreTarget);
      b.positions.push_back(static_cast<int32_t>(i));
      b.segment_ids.push_back(segment);
    }
  }
  return b;
}

// One document alone: a row of exactly its length, no packing fields.
TokenBatch Alone(const Doc& d) {
  TokenBatch b;
  b.batch_size = 1;
  b.seq_len = static_cast<int64_t>(d.size()) - 1;
  b.inputs.assign(d.begin(), d.end() - 1);
  b.targets.assign(d.begin() + 1, d.end());
  return b;
}

struct LossAndGrads {
  float loss = 0;
  std::vector<float> grads;
};

LossAndGrads Run(const Model& m, const TokenBatch& b, uint64_t seed) {
  auto p = MakeParams(m, seed);
  SpreadParams(*p);
  auto l = m.ForwardBackward(b, *p, HostAllocator::Default());
  EXPECT_TRUE(l.ok()) << l.status();
  return {l.ok() ? *l : NAN, Flatten(p->all_grads())};
}

// Every document of `rows` packed, with only its targets counting, has the
// loss and gradients it has alone (to f32 rounding: the sums run in
// another order).
void ExpectPackedEqualsAlone(const Model& m, const std::vector<std::vector<Doc>>& rows,
                             int64_t seq_len, float tol = 2e-5f) {
  std::vector<Doc> docs;
  for (const auto& r : rows) docs.insert(docs.end(), r.begin(), r.end());
  for (size_t i = 0; i < docs.size(); ++i) {
    const LossAndGrads packed = Run(m, Pack(rows, seq_len, static_cast<int>(i)), 5);
    const LossAndGrads alone = Run(m, Alone(docs[i]), 5);
    EXPECT_NEAR(packed.loss, alone.loss, 1e-5f * std::fabs(alone.loss)) << m.name() << " doc " << i;
    ASSERT_EQ(packed.grads.size(), alone.grads.size());
    float scale = 0;
    for (float g : alone.grads) scale = std::max(scale, std::fabs(g));
    ASSERT_GT(scale, 0.0f);
    for (size_t k = 0; k < alone.grads.size(); ++k) {
      ASSERT_NEAR(packed.grads[k], alone.grads[k], tol * scale) << m.name() << " doc " << i
                                                                << " grad " << k;
    }
  }
  // All documents together: the loss is the mean over every counted token,
  // the documents' losses weighted by their token counts.
  double sum = 0;
  int64_t tokens = 0;
  for (const Doc& d : docs) {
    const int64_t n = static_cast<int64_t>(d.size()) - 1;
    sum += static_cast<double>(Run(m, Alone(d), 5).loss) * n;
    tokens += n;
  }
  EXPECT_NEAR(Run(m, Pack(rows, seq_len), 5).loss, sum / tokens, 1e-5 * sum / tokens) << m.name();
}

LlamaConfig TinyLlama() {
  LlamaConfig c;
  c.name = "llama-test";
  c.vocab_size = 32;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 16;
  c.d_ff = 24;
  return c;
}

std::vector<std::unique_ptr<Model>> Models() {
  std::vector<std::unique_ptr<Model>> ms;
  ms.push_back(std::move(GptModel::Create(Tiny())).value());
  GptConfig tied = Tiny();
  tied.name = "gpt-test-tied";
  tied.tie_word_embeddings = true;
  ms.push_back(std::move(GptModel::Create(tied)).value());
  ms.push_back(std::move(LlamaModel::Create(TinyLlama())).value());
  LlamaConfig qwen = TinyLlama();
  qwen.name = "qwen2-test";
  qwen.n_kv_head = 1;
  qwen.qkv_bias = true;
  qwen.rope_theta = 1e6f;
  ms.push_back(std::move(LlamaModel::Create(qwen)).value());
  LlamaConfig scaled = TinyLlama();  // Llama 3.1's frequency-band scaling
  scaled.name = "llama3-scaled-test";
  scaled.rope_scaling.type = RopeScalingType::kLlama3;
  scaled.rope_scaling.factor = 8.0f;
  scaled.rope_scaling.low_freq_factor = 1.0f;
  scaled.rope_scaling.high_freq_factor = 4.0f;
  scaled.rope_scaling.original_max_positions = 4;
  ms.push_back(std::move(LlamaModel::Create(scaled)).value());
  LlamaConfig linear = TinyLlama();
  linear.name = "llama-linear-scaled-test";
  linear.rope_scaling.type = RopeScalingType::kLinear;
  linear.rope_scaling.factor = 2.0f;
  ms.push_back(std::move(LlamaModel::Create(linear)).value());
  return ms;
}

// Row 0: documents of 3 and 5 tokens; row 1: one of 6 and 2 of padding.
std::vector<std::vector<Doc>> SmallRows() {
  return {{RandomDoc(3, 32, 1), RandomDoc(5, 32, 2)}, {RandomDoc(6, 32, 3)}};
}

TEST(PackedDocuments, EachDocumentGetsItsOwnLossAndGradients) {
  for (const auto& m : Models()) ExpectPackedEqualsAlone(*m, SmallRows(), 8);
}

TEST(PackedDocuments, WithCheckpointingToo) {
  ModelOptions full;
  full.checkpointing = ActivationCheckpointing::kFull;
  ModelOptions selective;
  selective.checkpointing = ActivationCheckpointing::kSelective;
  selective.recompute_attention = true;
  for (const ModelOptions& o : {full, selective}) {
    ExpectPackedEqualsAlone(*std::move(GptModel::Create(Tiny(), o)).value(), SmallRows(), 8);
    ExpectPackedEqualsAlone(*std::move(LlamaModel::Create(TinyLlama(), o)).value(), SmallRows(), 8);
  }
  // selective_matmuls recomputes k (rotated by each token's position) too.
  ModelOptions every_other_matmul;
  every_other_matmul.checkpointing = ActivationCheckpointing::kSelectiveMatmuls;
  ExpectPackedEqualsAlone(*std::move(LlamaModel::Create(TinyLlama(), every_other_matmul)).value(),
                          SmallRows(), 8);
}

// From kCpuFlashAttentionMinKeys keys GPT's attention runs in linear memory
// on the CPU: the packed row of 1024 does, the documents alone do not.
TEST(PackedDocuments, GptAtLongSequencesInLinearMemory) {
  GptConfig c = Tiny();
  c.max_seq_len = 1024;
  c.n_layer = 1;
  auto m = std::move(GptModel::Create(c)).value();
  ExpectPackedEqualsAlone(*m, {{RandomDoc(300, 32, 4), RandomDoc(700, 32, 5)}}, 1024, 5e-5f);
}

TEST(PackedDocuments, GradientsMatchFiniteDifferences) {
  std::vector<std::unique_ptr<Model>> ms = Models();
  ms.erase(ms.begin() + 5);  // GPT, tied GPT, Llama, Qwen2, Llama 3 scaling
  for (const auto& m : ms) {
    auto p = MakeParams(*m, 7);
    SpreadParams(*p);
    const TokenBatch b = Pack(SmallRows(), 8);
    ASSERT_TRUE(m->ForwardBackward(b, *p, HostAllocator::Default()).ok());
    EXPECT_GT(ExpectGradientsMatchCentralDifferences(*m, *p, b, m->name()), 0);
  }
}

// A later document cannot see an earlier one: changing the first
// document's tokens leaves the second's loss bit-identical.
TEST(PackedDocuments, ADocumentDoesNotSeeTheOneBeforeIt) {
  for (const auto& m : Models()) {
    auto rows = SmallRows();
    auto p = MakeParams(*m, 3);
    const float base = *m->Forward(Pack(rows, 8, 1), *p, HostAllocator::Default());
    rows[0][0] = RandomDoc(3, 32, 99);
    EXPECT_EQ(*m->Forward(Pack(rows, 8, 1), *p, HostAllocator::Default()), base) << m->name();
    // Without segment ids it would.
    TokenBatch open = Pack(rows, 8, 1);
    open.segment_ids.clear();
    EXPECT_NE(*m->Forward(open, *p, HostAllocator::Default()), base) << m->name();
  }
}

TEST(PackedDocuments, BadFieldsAreInvalidArgumentNamingThem) {
  for (const auto& m : Models()) {
    auto p = MakeParams(*m, 1);
    Allocator& a = HostAllocator::Default();
    auto expect = [&](const TokenBatch& b, const std::string& what) {
      auto r = m->Forward(b, *p, a);
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << m->name() << " " << what;
      EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
    };
    TokenBatch b = Pack(SmallRows(), 8);
    b.positions.pop_back();
    expect(b, "batch.positions has 15");
    b = Pack(SmallRows(), 8);
    b.positions[4] = 8;  // max_seq_len
    expect(b, "batch.positions[4] = 8");
    b.positions[4] = -1;
    expect(b, "batch.positions[4] = -1");
    b = Pack(SmallRows(), 8);
    b.segment_ids.push_back(9);
    expect(b, "batch.segment_ids has 17");
    b = Pack(SmallRows(), 8);
    b.segment_ids[9] = 1;
    b.segment_ids[10] = 0;
    expect(b, "row 1 at position 2");
    // Either field alone is fine.
    b = Pack(SmallRows(), 8);
    b.segment_ids.clear();
    EXPECT_TRUE(m->Forward(b, *p, a).ok());
    b = Pack(SmallRows(), 8);
    b.positions.clear();
    EXPECT_TRUE(m->Forward(b, *p, a).ok());
  }
}

TEST(PackedDocuments, TheEncoderDecoderRefusesThem) {
  T5Config c;
  c.name = "t5-test";
  c.vocab_size = 24;
  c.max_source_len = c.max_target_len = 8;
  c.n_encoder_layers = c.n_decoder_layers = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.d_ff = 32;
  auto m = std::move(T5Model::Create(c)).value();
  TokenBatch b;
  b.batch_size = 1;
  b.seq_len = 2;
  b.source_len = 2;
  b.inputs = b.targets = b.source = {1, 2};
  b.segment_ids = {0, 1};
  EXPECT_EQ(m->ValidateBatch(b).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sk
