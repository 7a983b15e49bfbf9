// The example family (example_family.h), which lives in this directory
// alone: before its one registration line every site refuses it by name;
// after it, it is built, trains a step on the CPU, is estimated, simulated
// and exported like a built-in family. Its model is GPT's of the same shape,
// so each result must equal that GPT decoder's, bit for bit.
#include "tests/nn/example_family/example_family.h"

#include <gtest/gtest.h>

#include <any>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/hf_checkpoint.h"
#include "runtime/comm/local_backend.h"
#include "runtime/fsdp/memory_estimator.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/hf_config.h"
#include "runtime/train/sim_run.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

using example::ExampleDecoderConfig;
using example::kExampleDecoder;

// example-decoder-2 as a GPT decoder spec (runtime/nn/decoder_spec.h): the
// same model under a built-in family.
constexpr char kSameGpt[] = "decoder:ffn=gelu,layers=2,d_model=32,heads=2,d_ff=64,vocab=64,seq=16,tied=true";

bool Mentions(const Status& s, const std::string& text) { return s.ToString().find(text) != std::string::npos; }

// Before registration: each site that asks about a family refuses this one
// with an error naming it, never building another family's model.
void ExpectRefusedEverywhere() {
  ASSERT_EQ(FindModelFamily(kExampleDecoder), nullptr);
  const NamedModelConfig c = example::ExampleDecoderNamed("example-decoder-2", {"", 64, 16, 2, 32});
  auto model = CreateModel(c);
  ASSERT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(model.status(), "model 'example-decoder-2' is of model family id 100, which is not "
                                       "registered (registered: gpt (1)"))
      << model.status();
  EXPECT_EQ(CheckStepSizeFits(c, 1, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchIdSpace(c), 0);
  MemoryEstimateRequest r;
  r.model = c;
  EXPECT_EQ(EstimatePeakMemory(r).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HfConfigJson(c).status().code(), StatusCode::kInvalidArgument);
  auto parsed = ParseHfConfig(R"({"architectures": ["ExampleDecoderForCausalLM"]})", "config.json");
  EXPECT_TRUE(Mentions(parsed.status(), "architecture 'ExampleDecoderForCausalLM'")) << parsed.status();
  auto named = FindModelConfig("example-decoder-2");
  EXPECT_EQ(named.status().code(), StatusCode::kNotFound);
  SimRunOptions sim;
  sim.trainer.model = "example-decoder-2";
  sim.trainer.device.kind = DeviceKind::kSim;
  EXPECT_EQ(SimulateTraining(sim).status().code(), StatusCode::kNotFound);
}

// The family's one registration line, run once per process (whichever test
// comes first) after checking it was refused before.
void Register() {
  static std::once_flag once;
  std::call_once(once, [] {
    ExpectRefusedEverywhere();
    ASSERT_TRUE(RegisterModelFamily(example::ExampleDecoderFamily()).ok());
  });
  ASSERT_NE(FindModelFamily(kExampleDecoder), nullptr);
}

TEST(ExampleFamilyTest, IsRefusedUntilRegisteredThenBuilt) {
  Register();
  auto c = FindModelConfig("example-decoder-4");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, kExampleDecoder);
  EXPECT_STREQ(ModelFamilyName(c->family), "example decoder");
  EXPECT_EQ(BatchIdSpace(*c), 64);
  auto m = CreateModel(*c);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->units().size(), 6u);  // embed, 4 blocks, head
  auto gpt = GptModel::Create(example::AsGpt(*std::any_cast<ExampleDecoderConfig>(&c->custom)));
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_EQ((*m)->num_parameters(), (*gpt)->num_parameters());
  // The family's validation, not another's.
  NamedModelConfig odd = *c;
  std::any_cast<ExampleDecoderConfig>(&odd.custom)->width = 40;
  auto refused = CreateModel(odd);
  EXPECT_TRUE(Mentions(refused.status(), "width 40 is not a multiple of the head width 16")) << refused.status();
}

// One FSDP step at world 2 on the CPU: the loss and gradient norm are the
// GPT decoder's of the same shape, bit for bit.
TEST(ExampleFamilyTest, TrainsAStepOnTheCpu) {
  Register();
  std::vector<std::vector<float>> seen(2);  // loss, grad norm of each model
  for (int which = 0; which < 2; ++which) {
    Status s = comm::RunLocalRanks(2, [&](int rank, comm::ProcessGroup* world) -> Status {
      TrainerOptions o;
      o.model = which == 0 ? "example-decoder-2" : kSameGpt;
      o.batch_size = 2;
      o.seq_len = 16;
      o.fsdp.timeout = Duration(60'000);
      SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, world));
      SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
      if (rank == 0) seen[which] = {m.loss, static_cast<float>(m.grad_norm)};
      return OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_EQ(seen[0].size(), 2u);
  EXPECT_TRUE(std::isfinite(seen[0][0]) && seen[0][0] > 0) << seen[0][0];
  EXPECT_GT(seen[0][1], 0);
  EXPECT_EQ(seen[0], seen[1]);
}

TEST(ExampleFamilyTest, IsEstimatedAsItsModel) {
  Register();
  MemoryEstimateRequest mine, gpt;
  mine.model = *FindModelConfig("example-decoder-2");
  gpt.model = *FindModelConfig(kSameGpt);
  for (MemoryEstimateRequest* r : {&mine, &gpt}) {
    r->world_size = 2;
    r->batch_size = 2;
  }
  auto a = EstimatePeakMemory(mine);
  auto b = EstimatePeakMemory(gpt);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(a->activation_bytes, 0);
  EXPECT_EQ(a->parameters, b->parameters);
  EXPECT_EQ(a->activation_bytes, b->activation_bytes);
  EXPECT_EQ(a->peak_bytes, b->peak_bytes);
}

TEST(ExampleFamilyTest, IsSimulated) {
  Register();
  SimStepReport reports[2];
  for (int which = 0; which < 2; ++which) {
    SimRunOptions o;
    o.trainer.model = which == 0 ? "example-decoder-2" : kSameGpt;
    o.trainer.batch_size = 2;
    o.trainer.device.kind = DeviceKind::kSim;
    o.trainer.device.sim_profile = "a100-80g";
    o.trainer.device.sim_world_size = 4;
    auto r = SimulateTraining(o);
    ASSERT_TRUE(r.ok()) << r.status();
    reports[which] = *r;
  }
  EXPECT_FALSE(reports[0].out_of_memory);
  EXPECT_GT(reports[0].step_seconds, 0);
  EXPECT_GT(reports[0].peak_allocated_bytes, 0u);
  EXPECT_EQ(reports[0].step_seconds, reports[1].step_seconds);
  EXPECT_EQ(reports[0].peak_allocated_bytes, reports[1].peak_allocated_bytes);
}

// Its Hugging Face architecture: config.json names it and reads back as the
// family; its tensors are GPT-2's.
TEST(ExampleFamilyTest, WritesAndReadsItsHuggingFaceConfig) {
  Register();
  const NamedModelConfig c = *FindModelConfig("example-decoder-4");
  auto text = HfConfigJson(c);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"ExampleDecoderForCausalLM"}));
  EXPECT_EQ(j["model_type"], "example_decoder");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(*HfWeightLayoutOf(c), "hf-gpt2");
  auto back = ParseHfConfig(*text, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->family, kExampleDecoder);
  EXPECT_EQ(std::any_cast<ExampleDecoderConfig>(&back->custom)->layers, 4);
  EXPECT_EQ(HfConvertOptions(c).tie_word_embeddings, std::optional<bool>(true));
}

}  // namespace
}  // namespace sk
