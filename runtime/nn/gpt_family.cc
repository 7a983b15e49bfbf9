// The GPT family (gpt.h): GPT-2's architecture, Hugging Face's
// GPT2LMHeadModel (hf_config.h describes its keys;
// runtime/checkpoint/weight_layout.h its tensor names, layout "hf-gpt2").
#include <nlohmann/json.hpp>

#include "runtime/nn/builtin_families.h"
#include "runtime/nn/decoder_spec.h"
#include "runtime/nn/hf_config_keys.h"

namespace sk {
namespace {

using nlohmann::json;

StatusOr<NamedModelConfig> Gpt2FromConfig(const json& j, const std::string& file) {
  HfConfigKeys k(j, file);
  NamedModelConfig c;
  c.family = ModelFamily::kGpt;
  GptConfig& g = c.gpt;
  g.tie_word_embeddings = true;  // GPT2Config's default
  SK_RETURN_IF_ERROR(k.Int("vocab_size", &g.vocab_size));
  SK_RETURN_IF_ERROR(k.Int("n_positions", &g.max_seq_len));
  SK_RETURN_IF_ERROR(k.Int("n_layer", &g.n_layer));
  SK_RETURN_IF_ERROR(k.Int("n_head", &g.n_head));
  SK_RETURN_IF_ERROR(k.Int("n_embd", &g.d_model));
  SK_RETURN_IF_ERROR(k.OptionalInt("n_inner", &g.d_ff));
  SK_RETURN_IF_ERROR(k.Bool("tie_word_embeddings", &g.tie_word_embeddings));
  SK_RETURN_IF_ERROR(k.Expect("activation_function", {"gelu_new", "gelu_pytorch_tanh"},
                              "GELU's tanh approximation (gelu_new)"));
  SK_RETURN_IF_ERROR(k.Expect("layer_norm_epsilon", {1e-5}, "LayerNorm with eps 1e-5"));
  SK_RETURN_IF_ERROR(k.Expect("scale_attn_weights", {true}, "attention scaled by 1/sqrt(head_dim)"));
  SK_RETURN_IF_ERROR(k.Expect("scale_attn_by_inverse_layer_idx", {false}, "no per-layer attention scale"));
  SK_RETURN_IF_ERROR(k.Expect("reorder_and_upcast_attn", {false}, "plain attention"));
  SK_RETURN_IF_ERROR(k.Expect("add_cross_attention", {false}, "no cross-attention"));
  c.seq_len = g.max_seq_len;
  return c;
}

json Gpt2ToConfig(const NamedModelConfig& c) {
  const GptConfig& g = c.gpt;
  json j;
  j["vocab_size"] = g.vocab_size;
  j["n_positions"] = g.max_seq_len;
  j["n_ctx"] = g.max_seq_len;
  j["n_layer"] = g.n_layer;
  j["n_head"] = g.n_head;
  j["n_embd"] = g.d_model;
  j["n_inner"] = g.d_ff > 0 ? json(g.d_ff) : json(nullptr);
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = g.tie_word_embeddings;
  j["torch_dtype"] = "float32";
  return j;
}

ModelTableRow GptTableRow(const NamedModelConfig& c) {
  const GptConfig& g = c.gpt;
  return {std::to_string(g.n_layer), std::to_string(g.d_model), std::to_string(g.n_head),
          std::to_string(g.ff()),    std::to_string(g.vocab_size), std::to_string(c.seq_len)};
}

}  // namespace

ModelFamilyDescription GptFamily() {
  ModelFamilyDescription f;
  f.id = ModelFamily::kGpt;
  f.name = "gpt";
  f.batches = FamilyBatches::kDecoder;
  f.create = [](const NamedModelConfig& c, const ModelOptions& o) -> StatusOr<std::unique_ptr<Model>> {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> m, GptModel::Create(c.gpt, o));
    return std::unique_ptr<Model>(std::move(m));
  };
  f.validate = [](const NamedModelConfig& c) { return c.gpt.Validate(); };
  f.batch_id_space = [](const NamedModelConfig& c) { return c.gpt.vocab_size; };
  f.check_step_size = [](const NamedModelConfig& c, int64_t batch, int64_t seq, int64_t source) {
    const GptConfig& g = c.gpt;
    return CheckTransformerStepSize(c, g.n_layer, g.n_head, g.d_model, g.ff(), g.vocab_size, batch, seq, source);
  };
  f.set_name = [](NamedModelConfig& c, const std::string& name) { c.name = c.gpt.name = name; };
  f.first_unit_backward_without_parameters = true;  // the input embeddings
  f.table_row = GptTableRow;
  f.tie_word_embeddings = [](const NamedModelConfig& c) -> std::optional<bool> { return c.gpt.tie_word_embeddings; };
  f.decoder_spec = [](const NamedModelConfig& c) -> StatusOr<std::string> { return GptDecoderSpec(c.gpt); };
  f.hf_architectures = {{"GPT2LMHeadModel", "gpt2", "hf-gpt2", nullptr, Gpt2FromConfig, Gpt2ToConfig}};
  return f;
}

}  // namespace sk
