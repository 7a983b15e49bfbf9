// A model family registered here, and nowhere else, is built, sized,
// estimated and planned like the built-in ones: the registry
// (runtime/nn/model_family.h) is the only place that knows a family.
#include <gtest/gtest.h>

#include <any>
#include <string>

#include "runtime/fsdp/memory_estimator.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/model_family.h"
#include "runtime/plan/plan.h"

namespace sk {
namespace {

// The family's own config, carried in NamedModelConfig::custom. Its model
// is a one-head GELU decoder of `width` (built as shardkit's GPT: the family
// describes itself, the model code is reused).
struct TinyDecoderConfig {
  std::string name;
  int64_t vocab = 0, seq = 0, layers = 0, width = 0;
};

constexpr ModelFamily kTinyFamily = static_cast<ModelFamily>(200);
constexpr int64_t kMaxTinyBatch = 64;

const TinyDecoderConfig& Tiny(const NamedModelConfig& c) { return *std::any_cast<TinyDecoderConfig>(&c.custom); }

GptConfig AsGpt(const TinyDecoderConfig& t) {
  GptConfig g;
  g.name = t.name;
  g.vocab_size = t.vocab;
  g.max_seq_len = t.seq;
  g.n_layer = t.layers;
  g.n_head = 1;
  g.d_model = t.width;
  return g;
}

NamedModelConfig TinyConfig(const std::string& name, int64_t layers) {
  NamedModelConfig c;
  c.name = name;
  c.family = kTinyFamily;
  c.custom = TinyDecoderConfig{name, 32, 8, layers, 16};
  c.seq_len = 8;
  c.description = "registered by model_family_test";
  return c;
}

ModelFamilyDescription TinyFamily() {
  ModelFamilyDescription f;
  f.id = kTinyFamily;
  f.name = "tiny decoder";
  f.batches = FamilyBatches::kDecoder;
  f.create = [](const NamedModelConfig& c, const ModelOptions& o) -> StatusOr<std::unique_ptr<Model>> {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> m, GptModel::Create(AsGpt(Tiny(c)), o));
    return std::unique_ptr<Model>(std::move(m));
  };
  f.validate = [](const NamedModelConfig& c) { return AsGpt(Tiny(c)).Validate(); };
  f.batch_id_space = [](const NamedModelConfig& c) { return Tiny(c).vocab; };
  // Its own bound, so that the test sees the family's hook asked.
  f.check_step_size = [](const NamedModelConfig& c, int64_t batch, int64_t, int64_t) {
    if (batch > kMaxTinyBatch) return InvalidArgumentError("tiny decoder '" + c.name + "': batch above 64");
    return OkStatus();
  };
  f.set_name = [](NamedModelConfig& c, const std::string& name) {
    c.name = name;
    std::any_cast<TinyDecoderConfig>(&c.custom)->name = name;
  };
  f.table_row = [](const NamedModelConfig& c) {
    const TinyDecoderConfig& t = Tiny(c);
    return ModelTableRow{std::to_string(t.layers), std::to_string(t.width), "1", "-", std::to_string(t.vocab),
                         std::to_string(t.seq)};
  };
  f.configs = {TinyConfig("tiny-decoder-2", 2), TinyConfig("tiny-decoder-4", 4)};
  return f;
}

// Registered once per process (gtest may repeat tests).
const ModelFamilyDescription* Registered() {
  static const Status registered = RegisterModelFamily(TinyFamily());
  EXPECT_TRUE(registered.ok()) << registered;
  return FindModelFamily(kTinyFamily);
}

TEST(ModelFamilyTest, ARegisteredFamilyIsFoundBuiltAndSized) {
  ASSERT_NE(Registered(), nullptr);
  EXPECT_STREQ(ModelFamilyName(kTinyFamily), "tiny decoder");
  auto c = FindModelConfig("tiny-decoder-4");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, kTinyFamily);
  EXPECT_EQ(BatchIdSpace(*c), 32);
  auto m = CreateModel("tiny-decoder-4");
  ASSERT_TRUE(m.ok()) << m.status();
  // embed + 4 blocks + head.
  EXPECT_EQ((*m)->units().size(), 6u);
  auto gpt = GptModel::Create(AsGpt(Tiny(*c)));
  ASSERT_TRUE(gpt.ok());
  EXPECT_EQ((*m)->num_parameters(), (*gpt)->num_parameters());
  EXPECT_TRUE(CheckStepSizeFits(*c, kMaxTinyBatch, 0, 0).ok());
  Status too_big = CheckStepSizeFits(*c, kMaxTinyBatch + 1, 0, 0);
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.ToString().find("tiny decoder 'tiny-decoder-4'"), std::string::npos) << too_big;
  // The unknown-name message lists the family's configurations too.
  auto missing = FindModelConfig("tiny-decoder-3");
  ASSERT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().ToString().find("tiny-decoder-2, tiny-decoder-4"), std::string::npos);
}

TEST(ModelFamilyTest, ARegisteredFamilyIsEstimated) {
  ASSERT_NE(Registered(), nullptr);
  MemoryEstimateRequest r;
  r.model = *FindModelConfig("tiny-decoder-2");
  r.world_size = 2;
  r.batch_size = 2;
  auto e = EstimatePeakMemory(r);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->parameters, (*CreateModel(r.model))->num_parameters());
  EXPECT_GT(e->activation_bytes, 0);
  EXPECT_GT(e->peak_bytes, e->activation_bytes);
  r.batch_size = kMaxTinyBatch + 1;  // the family's own bound
  EXPECT_EQ(EstimatePeakMemory(r).status().code(), StatusCode::kInvalidArgument);
}

TEST(ModelFamilyTest, ARegisteredFamilyIsPlanned) {
  ASSERT_NE(Registered(), nullptr);
  plan::PlanRequest r;
  r.model = "tiny-decoder-2";
  r.gpus = 4;
  r.gpus_per_node = 4;
  r.batch_size = 2;
  r.space.strategies = {"DDP", "FULL_SHARD"};
  r.space.backward_prefetch = {BackwardPrefetch::kBackwardPre};
  r.space.activation_checkpointing = {ActivationCheckpointing::kNone};
  r.space.cpu_offload = {false};
  r.space.forward_prefetch = {false};
  r.space.rate_limits = {RateLimit::InFlight(2)};
  auto p = plan::Plan(r);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_GE(p->results.size(), 2u);  // DDP and FULL_SHARD, in each default dtype
  ASSERT_EQ(p->recommended, 0);
  for (const plan::CandidateResult& c : p->results) {
    EXPECT_TRUE(c.fits()) << c.candidate.Label() << ": " << c.status;
    EXPECT_GT(c.metrics.step_seconds, 0) << c.candidate.Label();
    EXPECT_GT(c.metrics.peak_allocated_bytes, 0) << c.candidate.Label();
  }
}

TEST(ModelFamilyTest, AnUnregisteredFamilyIsAnErrorNotAnotherFamily) {
  NamedModelConfig c = TinyConfig("orphan", 2);
  c.family = static_cast<ModelFamily>(201);
  auto m = CreateModel(c);
  ASSERT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().ToString().find("model family id 201, which is not registered"), std::string::npos)
      << m.status();
  EXPECT_EQ(CheckStepSizeFits(c, 1, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchIdSpace(c), 0);
  EXPECT_STREQ(ModelFamilyName(c.family), "unknown");
}

TEST(ModelFamilyTest, RegistrationRefusesClashesAndMissingHooks) {
  ASSERT_NE(Registered(), nullptr);
  auto refused = [](ModelFamilyDescription f, const std::string& why) {
    Status s = RegisterModelFamily(std::move(f));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(s.ToString().find(why), std::string::npos) << s;
  };
  ModelFamilyDescription f = TinyFamily();
  f.configs.clear();
  refused(f, "id taken by family 'tiny decoder'");
  f.id = static_cast<ModelFamily>(202);
  refused(f, "the name is taken");
  f.name = "another";
  f.create = nullptr;
  refused(f, "has no 'create'");
  f = TinyFamily();
  f.id = static_cast<ModelFamily>(202);
  f.name = "another";
  f.configs = {TinyConfig("gpt-tiny", 2)};
  f.configs[0].family = f.id;
  refused(f, "configuration name 'gpt-tiny' is empty or taken");
  f.configs = {TinyConfig("x", 2)};
  refused(f, "configuration 'x' is of family id 200");
  f.configs.clear();
  f.id = ModelFamily{};
  refused(f, "id 0 is no family");
  EXPECT_EQ(FindModelFamily(static_cast<ModelFamily>(202)), nullptr);
}

}  // namespace
}  // namespace sk
