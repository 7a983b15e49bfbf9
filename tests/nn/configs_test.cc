#include "runtime/nn/configs.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "runtime/nn/hf_config.h"

namespace sk {
namespace {

TEST(Configs, EveryNamedConfigBuildsAModel) {
  for (const NamedModelConfig& c : ModelConfigs()) {
    auto m = CreateModel(c);
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
    EXPECT_EQ((*m)->name(), c.name);
    EXPECT_GT((*m)->num_parameters(), 0);
  }
}

TEST(Configs, PaperSizedConfigsHaveThePapersParameterCounts) {
  auto near = [](const std::string& name, double billions) {
    auto m = CreateModel(name);
    ASSERT_TRUE(m.ok()) << m.status();
    double got = static_cast<double>((*m)->num_parameters()) / 1e9;
    EXPECT_NEAR(got, billions, 0.02 * billions) << name;
  };
  near("t5-611m", 0.611);
  near("t5-2.28b", 2.28);
  near("t5-11b", 11.0);
  near("gpt-175b", 175.0);
}

// GPT-2's four sizes tie the head to the token embedding, so their counts are
// Hugging Face's exactly (GPT2LMHeadModel.num_parameters()).
TEST(Configs, Gpt2ConfigsAreTiedWithHuggingFacesParameterCounts) {
  for (const auto& [name, count] : std::vector<std::pair<std::string, int64_t>>{
           {"gpt2-small", 124439808}, {"gpt2-medium", 354823168},
           {"gpt2-large", 774030080}, {"gpt2-xl", 1557611200}}) {
    StatusOr<NamedModelConfig> c = FindModelConfig(name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->gpt.tie_word_embeddings) << name;
    auto m = CreateModel(*c);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->num_parameters(), count) << name;
  }
}

TEST(Configs, Gpt175bFlopsPerTokenAreSixPsiPlusAttention) {
  auto m = CreateModel("gpt-175b");
  ASSERT_TRUE(m.ok());
  const double T = 2048, L = 96, d = 12288;
  // Dense (matmul) parameters: everything except embeddings, norms and biases.
  const double psi = L * 12 * d * d + d * 50257;
  StepFlops f = (*m)->Flops(1, 2048, 0);
  EXPECT_NEAR(f.model_flops / T, 6 * psi + 12 * L * T * d, 1e-9 * f.model_flops / T);
}

TEST(Configs, UnknownNameIsNotFoundListingKnownNames) {
  auto m = CreateModel("gpt-7");
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("gpt-10m"), std::string::npos);
}

// Issue 47 item 2: sizes that would overflow the runtime's arithmetic are
// InvalidArgument naming the field and its bound, from every way a shape is
// given (decoder specs, config.json, configs built in code), before anything
// multiplies or allocates: a width of 2^62 made the parameter count 10400
// (Llama) or negative (GPT-2) and the first step abort; 10^9 layers ran for
// minutes until memory ran out.
TEST(Configs, ShapesBeyondTheBoundsAreInvalidArgumentNamingTheField) {
  struct Case {
    std::string spec, want;
  };
  const std::string huge = "4611686018427387904";  // 2^62
  const std::vector<Case> specs = {
      {"decoder:layers=2,d_model=" + huge + ",heads=4,vocab=64,seq=32,d_ff=64", "d_model is " + huge},
      {"decoder:ffn=gelu,layers=2,d_model=" + huge + ",heads=4,vocab=64,seq=32", "d_model is " + huge},
      {"decoder:layers=1000000000,d_model=32,heads=4,vocab=64,seq=32,d_ff=64", "n_layer is 1000000000"},
      {"decoder:ffn=gelu,layers=1000000000,d_model=32,heads=4,vocab=64,seq=32", "n_layer is 1000000000"},
      {"decoder:layers=2,d_model=32,heads=4,vocab=64,seq=32,d_ff=" + huge, "d_ff is " + huge},
      {"decoder:layers=2,d_model=32,heads=4,vocab=64,seq=" + huge + ",d_ff=64", "max_seq_len is " + huge},
      {"decoder:layers=2,d_model=32,heads=4,kv_heads=" + huge + ",vocab=64,seq=32,d_ff=64", "n_kv_head"},
      // Every dimension within its bound, the product beyond 2^48.
      {"decoder:layers=65536,d_model=16777216,heads=4,vocab=64,seq=32,d_ff=64", "more than the bound 2^48"},
      {"decoder:ffn=gelu,layers=4096,d_model=1048576,heads=4,vocab=64,seq=32", "more than the bound 2^48"},
  };
  for (const Case& c : specs) {
    StatusOr<NamedModelConfig> m = FindModelConfig(c.spec);
    ASSERT_FALSE(m.ok()) << c.spec;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status();
    EXPECT_NE(m.status().message().find(c.want), std::string::npos) << c.spec << ": " << m.status();
  }
  // config.json as transformers writes it.
  const std::string llama = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": HIDDEN,
      "intermediate_size": 64, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
      "max_position_embeddings": 32})";
  const std::string gpt2 = R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 64, "n_positions": 32,
      "n_layer": LAYERS, "n_head": 4, "n_embd": HIDDEN})";
  auto with = [](std::string t, const std::string& hidden, const std::string& layers) {
    t.replace(t.find("HIDDEN"), 6, hidden);
    t.replace(t.find("LAYERS"), 6, layers);
    return t;
  };
  for (const std::string& text : {llama, gpt2}) {
    for (const auto& [hidden, layers, want] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {huge, "2", "d_model is " + huge}, {"32", "1000000000", "n_layer is 1000000000"}}) {
      StatusOr<NamedModelConfig> m = ParseHfConfig(with(text, hidden, layers), "config.json");
      ASSERT_FALSE(m.ok()) << text;
      EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status();
      EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status();
    }
    EXPECT_TRUE(ParseHfConfig(with(text, "32", "2"), "config.json").ok());
  }
  // Configs built in code: CreateModel refuses them before building a unit.
  NamedModelConfig t5 = *FindModelConfig("t5-60m");
  t5.t5.n_encoder_layers = 1000000000;
  StatusOr<std::unique_ptr<Model>> m = CreateModel(t5);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("n_encoder_layers is 1000000000"), std::string::npos) << m.status();
  // The largest named configurations are well inside the bounds.
  for (const char* name : {"gpt-175b", "t5-11b"}) EXPECT_TRUE(CreateModel(name).ok()) << name;
}

}  // namespace
}  // namespace sk
