// The Llama family (llama.h): Hugging Face's LlamaForCausalLM and, with
// q/k/v biases, Qwen2ForCausalLM (hf_config.h describes their keys;
// runtime/checkpoint/weight_layout.h their tensor names, layout "hf-llama").
#include <nlohmann/json.hpp>

#include "runtime/nn/builtin_families.h"
#include "runtime/nn/decoder_spec.h"
#include "runtime/nn/hf_config_keys.h"
#include "runtime/ops/ops.h"

namespace sk {
namespace {

using nlohmann::json;

// Rotary embeddings as transformers 5 reads them: the scaling object is
// rope_scaling when that is not null (transformers 4's key, which 5 still
// prefers), else rope_parameters (5's, which also holds theta); theta is the
// object's rope_theta, else the top-level rope_theta, else 10000. Types
// "default", "linear" (factor) and "llama3" (factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings: absent, the top-level
// key of that name, else max_position_embeddings) are read; any other type
// is InvalidArgument naming it.
Status ReadRope(const json& j, const HfConfigKeys& k, const std::string& file, int64_t max_positions,
                float* theta, RopeScaling* scaling) {
  SK_RETURN_IF_ERROR(k.Float("rope_theta", theta));
  SK_RETURN_IF_ERROR(k.Expect("partial_rotary_factor", {1.0}, "rotary embeddings over the whole head"));
  const char* key = "rope_scaling";
  auto rope = j.find(key);
  if (rope == j.end() || rope->is_null()) {
    key = "rope_parameters";
    rope = j.find(key);
    if (rope == j.end() || rope->is_null()) return OkStatus();
  }
  if (!rope->is_object()) return k.Bad(key, "must be an object or null, not " + rope->dump());
  const std::string where = std::string("in '") + key + "'";
  HfConfigKeys r(*rope, file);
  SK_RETURN_IF_ERROR(r.Float("rope_theta", theta).WithContext(where));
  SK_RETURN_IF_ERROR(r.Expect("partial_rotary_factor", {1.0}, "rotary embeddings over the whole head")
                         .WithContext(where));
  // transformers 4.x before 4.43 spelled rope_type "type".
  auto type = rope->find("rope_type");
  if (type == rope->end()) type = rope->find("type");
  const json type_name = type == rope->end() ? json("default") : *type;
  RopeScaling s;
  if (type_name == "default") {
    *scaling = s;
    return OkStatus();
  }
  if (type_name == "linear") {
    s.type = RopeScalingType::kLinear;
  } else if (type_name == "llama3") {
    s.type = RopeScalingType::kLlama3;
  } else {
    return k.Bad(key, "has rope_type " + type_name.dump() +
                          ", but shardkit's model computes rotary embeddings of rope_type \"default\", "
                          "\"linear\" or \"llama3\" only");
  }
  auto required_float = [&](const char* name, float* out) -> Status {
    if (rope->find(name) == rope->end()) {
      return k.Bad(key, std::string("has rope_type ") + type_name.dump() + " but no '" + name + "'");
    }
    return r.Float(name, out).WithContext(where);
  };
  SK_RETURN_IF_ERROR(required_float("factor", &s.factor));
  if (s.type == RopeScalingType::kLlama3) {
    SK_RETURN_IF_ERROR(required_float("low_freq_factor", &s.low_freq_factor));
    SK_RETURN_IF_ERROR(required_float("high_freq_factor", &s.high_freq_factor));
    s.original_max_positions = max_positions;
    SK_RETURN_IF_ERROR(k.OptionalInt("original_max_position_embeddings", &s.original_max_positions));
    SK_RETURN_IF_ERROR(
        r.OptionalInt("original_max_position_embeddings", &s.original_max_positions).WithContext(where));
  }
  SK_RETURN_IF_ERROR(ops::ValidateRopeScaling(s).WithContext("'" + file + "': key '" + key + "'"));
  *scaling = s;
  return OkStatus();
}

// The keys LlamaForCausalLM and Qwen2ForCausalLM share. qkv_bias is the
// architecture's: Qwen2 always has q/k/v biases; Llama's attention_bias
// would also put one on o_proj, which shardkit's Llama does not have.
StatusOr<NamedModelConfig> LlamaFamilyFromConfig(const json& j, const std::string& file, bool qwen2) {
  HfConfigKeys k(j, file);
  NamedModelConfig c;
  c.family = ModelFamily::kLlama;
  LlamaConfig& l = c.llama;
  l.qkv_bias = qwen2;
  l.tie_word_embeddings = qwen2;  // the configs' defaults: Qwen2Config ties, LlamaConfig does not
  SK_RETURN_IF_ERROR(k.Int("vocab_size", &l.vocab_size));
  SK_RETURN_IF_ERROR(k.Int("hidden_size", &l.d_model));
  SK_RETURN_IF_ERROR(k.Int("intermediate_size", &l.d_ff));
  SK_RETURN_IF_ERROR(k.Int("num_hidden_layers", &l.n_layer));
  SK_RETURN_IF_ERROR(k.Int("num_attention_heads", &l.n_head));
  SK_RETURN_IF_ERROR(k.Int("max_position_embeddings", &l.max_seq_len));
  l.n_kv_head = l.n_head;
  SK_RETURN_IF_ERROR(k.OptionalInt("num_key_value_heads", &l.n_kv_head));
  SK_RETURN_IF_ERROR(k.Float("rms_norm_eps", &l.rms_norm_eps));
  SK_RETURN_IF_ERROR(k.Bool("tie_word_embeddings", &l.tie_word_embeddings));
  if (l.n_head > 0 && l.d_model % l.n_head == 0) {
    SK_RETURN_IF_ERROR(k.Expect("head_dim", {json(nullptr), json(l.d_model / l.n_head)},
                                "head_dim = hidden_size / num_attention_heads"));
  }
  SK_RETURN_IF_ERROR(k.Expect("hidden_act", {"silu"}, "a SwiGLU MLP (hidden_act silu)"));
  SK_RETURN_IF_ERROR(k.Expect("mlp_bias", {false}, "an MLP without biases"));
  if (!qwen2) {
    SK_RETURN_IF_ERROR(k.Expect("attention_bias", {false},
                                "attention without biases (Qwen2ForCausalLM has q/k/v biases)"));
  } else {
    SK_RETURN_IF_ERROR(k.Expect("use_sliding_window", {false}, "full causal attention"));
  }
  SK_RETURN_IF_ERROR(ReadRope(j, k, file, l.max_seq_len, &l.rope_theta, &l.rope_scaling));
  c.seq_len = l.max_seq_len;
  return c;
}

StatusOr<NamedModelConfig> LlamaFromConfig(const json& j, const std::string& file) {
  return LlamaFamilyFromConfig(j, file, /*qwen2=*/false);
}

StatusOr<NamedModelConfig> Qwen2FromConfig(const json& j, const std::string& file) {
  return LlamaFamilyFromConfig(j, file, /*qwen2=*/true);
}

// transformers' rope_scaling object for `s` (null when unscaled).
json RopeScalingJson(const RopeScaling& s) {
  if (s.type == RopeScalingType::kNone) return nullptr;
  json j = {{"rope_type", RopeScalingTypeName(s.type)}, {"factor", ShortestDecimal(s.factor)}};
  if (s.type == RopeScalingType::kLlama3) {
    j["low_freq_factor"] = ShortestDecimal(s.low_freq_factor);
    j["high_freq_factor"] = ShortestDecimal(s.high_freq_factor);
    j["original_max_position_embeddings"] = s.original_max_positions;
  }
  return j;
}

json LlamaFamilyToConfig(const NamedModelConfig& c) {
  const LlamaConfig& l = c.llama;
  json j;
  j["vocab_size"] = l.vocab_size;
  j["hidden_size"] = l.d_model;
  j["intermediate_size"] = l.d_ff;
  j["num_hidden_layers"] = l.n_layer;
  j["num_attention_heads"] = l.n_head;
  j["num_key_value_heads"] = l.kv_heads();
  j["head_dim"] = l.head_dim();
  j["max_position_embeddings"] = l.max_seq_len;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = ShortestDecimal(l.rms_norm_eps);
  // Both spellings of theta and scaling, so transformers 4 and 5 read the
  // same model.
  j["rope_theta"] = ShortestDecimal(l.rope_theta);
  j["rope_scaling"] = RopeScalingJson(l.rope_scaling);
  j["rope_parameters"] = j["rope_scaling"].is_null() ? json{{"rope_type", "default"}} : j["rope_scaling"];
  j["rope_parameters"]["rope_theta"] = ShortestDecimal(l.rope_theta);
  if (l.qkv_bias) {
    j["use_sliding_window"] = false;
  } else {
    j["attention_bias"] = false;
  }
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = l.tie_word_embeddings;
  j["torch_dtype"] = "float32";
  return j;
}

bool IsQwen2(const NamedModelConfig& c) { return c.llama.qkv_bias; }
bool IsLlama(const NamedModelConfig& c) { return !c.llama.qkv_bias; }

ModelTableRow LlamaTableRow(const NamedModelConfig& c) {
  const LlamaConfig& l = c.llama;
  // Query heads / key-value heads (grouped-query attention).
  return {std::to_string(l.n_layer), std::to_string(l.d_model),
          std::to_string(l.n_head) + "/" + std::to_string(l.kv_heads()), std::to_string(l.d_ff),
          std::to_string(l.vocab_size), std::to_string(c.seq_len)};
}

}  // namespace

ModelFamilyDescription LlamaFamily() {
  ModelFamilyDescription f;
  f.id = ModelFamily::kLlama;
  f.name = "llama";
  f.batches = FamilyBatches::kDecoder;
  f.create = [](const NamedModelConfig& c, const ModelOptions& o) -> StatusOr<std::unique_ptr<Model>> {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> m, LlamaModel::Create(c.llama, o));
    return std::unique_ptr<Model>(std::move(m));
  };
  f.validate = [](const NamedModelConfig& c) { return c.llama.Validate(); };
  f.batch_id_space = [](const NamedModelConfig& c) { return c.llama.vocab_size; };
  f.check_step_size = [](const NamedModelConfig& c, int64_t batch, int64_t seq, int64_t source) {
    const LlamaConfig& l = c.llama;
    return CheckTransformerStepSize(c, l.n_layer, l.n_head, l.d_model, l.d_ff, l.vocab_size, batch, seq, source);
  };
  f.set_name = [](NamedModelConfig& c, const std::string& name) { c.name = c.llama.name = name; };
  f.first_unit_backward_without_parameters = true;  // the input embeddings
  f.table_row = LlamaTableRow;
  f.tie_word_embeddings = [](const NamedModelConfig& c) -> std::optional<bool> { return c.llama.tie_word_embeddings; };
  f.decoder_spec = [](const NamedModelConfig& c) -> StatusOr<std::string> { return LlamaDecoderSpec(c.llama); };
  f.hf_architectures = {
      {"LlamaForCausalLM", "llama", "hf-llama", IsLlama, LlamaFromConfig, LlamaFamilyToConfig},
      {"Qwen2ForCausalLM", "qwen2", "hf-llama", IsQwen2, Qwen2FromConfig, LlamaFamilyToConfig},
  };
  return f;
}

}  // namespace sk
