#include "runtime/nn/configs.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace sk
