#include "tests/nn/example_family/example_family.h"

#include <any>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/nn/hf_config_keys.h"

namespace sk {
namespace example {
namespace {

constexpr int64_t kHeadWidth = 16;
constexpr int64_t kMlpRatio = 2;

const ExampleDecoderConfig& Of(const NamedModelConfig& c) {
  return *std::any_cast<ExampleDecoderConfig>(&c.custom);
}

// config.json: the architecture's own keys (HfConfigJson adds
// "architectures" and "model_type" from the description).
nlohmann::json ToConfig(const NamedModelConfig& c) {
  const ExampleDecoderConfig& e = Of(c);
  return {{"vocab_size", e.vocab},
          {"max_position_embeddings", e.seq},
          {"num_hidden_layers", e.layers},
          {"hidden_size", e.width},
          {"tie_word_embeddings", true}};
}

StatusOr<NamedModelConfig> FromConfig(const nlohmann::json& j, const std::string& file) {
  HfConfigKeys k(j, file);
  ExampleDecoderConfig e;
  SK_RETURN_IF_ERROR(k.Int("vocab_size", &e.vocab));
  SK_RETURN_IF_ERROR(k.Int("max_position_embeddings", &e.seq));
  SK_RETURN_IF_ERROR(k.Int("num_hidden_layers", &e.layers));
  SK_RETURN_IF_ERROR(k.Int("hidden_size", &e.width));
  SK_RETURN_IF_ERROR(k.Expect("tie_word_embeddings", {true}, "an LM head tied to the token embedding"));
  return ExampleDecoderNamed("", e);
}

Status Validate(const NamedModelConfig& c) {
  if (Of(c).width % kHeadWidth != 0) {
    return InvalidArgumentError("example decoder '" + c.name + "': width " + std::to_string(Of(c).width) +
                                " is not a multiple of the head width 16");
  }
  return AsGpt(Of(c)).Validate();
}

}  // namespace

GptConfig AsGpt(const ExampleDecoderConfig& e) {
  GptConfig g;
  g.name = e.name;
  g.vocab_size = e.vocab;
  g.max_seq_len = e.seq;
  g.n_layer = e.layers;
  g.d_model = e.width;
  g.n_head = e.width / kHeadWidth;
  g.d_ff = kMlpRatio * e.width;
  g.tie_word_embeddings = true;
  return g;
}

NamedModelConfig ExampleDecoderNamed(const std::string& name, const ExampleDecoderConfig& config) {
  NamedModelConfig c;
  c.name = name;
  c.family = kExampleDecoder;
  c.custom = config;
  std::any_cast<ExampleDecoderConfig>(&c.custom)->name = name;
  c.seq_len = config.seq;
  c.description = "the example family (tests/nn/example_family)";
  return c;
}

ModelFamilyDescription ExampleDecoderFamily() {
  ModelFamilyDescription f;
  f.id = kExampleDecoder;
  f.name = "example decoder";
  f.batches = FamilyBatches::kDecoder;
  // The config, and the builder, which refuses what the config refuses.
  f.validate = Validate;
  f.create = [](const NamedModelConfig& c, const ModelOptions& o) -> StatusOr<std::unique_ptr<Model>> {
    SK_RETURN_IF_ERROR(Validate(c));
    SK_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> m, GptModel::Create(AsGpt(Of(c)), o));
    return std::unique_ptr<Model>(std::move(m));
  };
  f.set_name = [](NamedModelConfig& c, const std::string& name) {
    c.name = name;
    std::any_cast<ExampleDecoderConfig>(&c.custom)->name = name;
  };
  f.batch_id_space = [](const NamedModelConfig& c) { return Of(c).vocab; };
  f.tie_word_embeddings = [](const NamedModelConfig&) -> std::optional<bool> { return true; };
  // The cost and memory description: the transformer bound on a step's
  // size, and GPT's input embeddings, whose backward reads no parameter.
  f.check_step_size = [](const NamedModelConfig& c, int64_t batch, int64_t seq, int64_t source) {
    const GptConfig g = AsGpt(Of(c));
    return CheckTransformerStepSize(c, g.n_layer, g.n_head, g.d_model, g.ff(), g.vocab_size, batch, seq, source);
  };
  f.first_unit_backward_without_parameters = true;
  f.table_row = [](const NamedModelConfig& c) {
    const GptConfig g = AsGpt(Of(c));
    return ModelTableRow{std::to_string(g.n_layer), std::to_string(g.d_model), std::to_string(g.n_head),
                         std::to_string(g.ff()),    std::to_string(g.vocab_size), std::to_string(c.seq_len)};
  };
  // The Hugging Face architecture and its tensor layout.
  f.hf_architectures = {{"ExampleDecoderForCausalLM", "example_decoder", "hf-gpt2", nullptr, FromConfig, ToConfig}};
  f.configs = {ExampleDecoderNamed("example-decoder-2", {"", 64, 16, 2, 32}),
               ExampleDecoderNamed("example-decoder-4", {"", 64, 16, 4, 32})};
  return f;
}

}  // namespace example
}  // namespace sk
