#include "runtime/nn/hf_config.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"
#include "runtime/ops/ops.h"

namespace sk {
namespace {

using nlohmann::json;

constexpr int64_t kMaxConfigBytes = 4 << 20;

// The keys of one config.json, every error naming the file and the key.
class Keys {
 public:
  Keys(const json& j, std::string file) : j_(j), file_(std::move(file)) {}

  Status Bad(const std::string& key, const std::string& why) const {
    return InvalidArgumentError("'" + file_ + "': key '" + key + "' " + why);
  }
  // A required positive integer.
  Status Int(const char* key, int64_t* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Bad(key, "is missing");
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return Bad(key, "must be a positive integer, not " + it->dump());
    }
    *out = it->get<int64_t>();
    return OkStatus();
  }
  // An optional positive integer; null or absent leaves *out.
  Status OptionalInt(const char* key, int64_t* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return OkStatus();
    return Int(key, out);
  }
  Status Bool(const char* key, bool* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return OkStatus();
    if (!it->is_boolean()) return Bad(key, "must be true or false, not " + it->dump());
    *out = it->get<bool>();
    return OkStatus();
  }
  // An optional positive number; absent leaves *out.
  Status Float(const char* key, float* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return OkStatus();
    if (!it->is_number() || !(it->get<double>() > 0.0) || !std::isfinite(it->get<double>())) {
      return Bad(key, "must be a positive number, not " + it->dump());
    }
    *out = static_cast<float>(it->get<double>());
    return OkStatus();
  }
  // When present, the key must have one of `allowed` (what shardkit computes).
  Status Expect(const char* key, const std::vector<json>& allowed, const char* meaning) const {
    auto it = j_.find(key);
    if (it == j_.end()) return OkStatus();
    for (const json& a : allowed) {
      if (*it == a || (it->is_number() && a.is_number() &&
                       std::fabs(it->get<double>() - a.get<double>()) <= 1e-12 * std::fabs(a.get<double>()))) {
        return OkStatus();
      }
    }
    return Bad(key, "is " + it->dump() + ", but shardkit's model computes " + meaning);
  }

 private:
  const json& j_;
  std::string file_;
};

StatusOr<NamedModelConfig> Gpt2FromConfig(const json& j, const std::string& file) {
  Keys k(j, file);
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
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
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

// Rotary embeddings as transformers 5 reads them: the scaling object is
// rope_scaling when that is not null (transformers 4's key, which 5 still
// prefers), else rope_parameters (5's, which also holds theta); theta is the
// object's rope_theta, else the top-level rope_theta, else 10000. Types
// "default", "linear" (factor) and "llama3" (factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings: absent, the top-level
// key of that name, else max_position_embeddings) are read; any other type
// is InvalidArgument naming it.
Status ReadRope(const json& j, const Keys& k, const std::string& file, int64_t max_positions,
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
  Keys r(*rope, file);
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
  Keys k(j, file);
  NamedModelConfig c;
  c.family = ModelFamily::kLlama;
  LlamaConfig& l = c.llama;
  l.qkv_bias = qwen2;
  l.tie_embeddings = qwen2;  // the configs' defaults: Qwen2Config ties, LlamaConfig does not
  SK_RETURN_IF_ERROR(k.Int("vocab_size", &l.vocab_size));
  SK_RETURN_IF_ERROR(k.Int("hidden_size", &l.d_model));
  SK_RETURN_IF_ERROR(k.Int("intermediate_size", &l.d_ff));
  SK_RETURN_IF_ERROR(k.Int("num_hidden_layers", &l.n_layer));
  SK_RETURN_IF_ERROR(k.Int("num_attention_heads", &l.n_head));
  SK_RETURN_IF_ERROR(k.Int("max_position_embeddings", &l.max_seq_len));
  l.n_kv_head = l.n_head;
  SK_RETURN_IF_ERROR(k.OptionalInt("num_key_value_heads", &l.n_kv_head));
  SK_RETURN_IF_ERROR(k.Float("rms_norm_eps", &l.rms_norm_eps));
  SK_RETURN_IF_ERROR(k.Bool("tie_word_embeddings", &l.tie_embeddings));
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

// The shortest decimal that reads back as `f` (1e-5f as 1e-05, not
// 9.99999974737875e-06), as config.json files write their floats.
double ShortestDecimal(float f) {
  for (int digits = 1; digits < 9; ++digits) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(f));
    const double d = std::strtod(buf, nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return static_cast<double>(f);
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
  j["architectures"] = {l.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = l.qkv_bias ? "qwen2" : "llama";
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
  j["tie_word_embeddings"] = l.tie_embeddings;
  j["torch_dtype"] = "float32";
  return j;
}

// One architecture: its names in config.json, its family, its key mapping.
struct HfArchitecture {
  const char* architecture;
  const char* model_type;
  ModelFamily family;
  // Which configs of the family it writes (null: all).
  bool (*writes)(const NamedModelConfig&);
  StatusOr<NamedModelConfig> (*from_config)(const json&, const std::string& file);
  json (*to_config)(const NamedModelConfig&);
};

bool IsQwen2(const NamedModelConfig& c) { return c.llama.qkv_bias; }
bool IsLlama(const NamedModelConfig& c) { return !c.llama.qkv_bias; }

// The table (tensor names per architecture: runtime/checkpoint/weight_layout.h).
const HfArchitecture kArchitectures[] = {
    {"GPT2LMHeadModel", "gpt2", ModelFamily::kGpt, nullptr, Gpt2FromConfig, Gpt2ToConfig},
    {"LlamaForCausalLM", "llama", ModelFamily::kLlama, IsLlama, LlamaFromConfig, LlamaFamilyToConfig},
    {"Qwen2ForCausalLM", "qwen2", ModelFamily::kLlama, IsQwen2, Qwen2FromConfig, LlamaFamilyToConfig},
};

bool Writes(const HfArchitecture& a, const NamedModelConfig& c) {
  return a.family == c.family && (a.writes == nullptr || a.writes(c));
}

Status ValidateFamily(const NamedModelConfig& c) {
  if (c.family == ModelFamily::kLlama) return c.llama.Validate();
  return c.gpt.Validate();
}

std::string KnownNames() {
  std::string s;
  for (const HfArchitecture& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.architecture);
  return s;
}

}  // namespace

bool IsHfModelDirectory(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  return ::stat((path + "/config.json").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

StatusOr<NamedModelConfig> ParseHfConfig(const std::string& text, const std::string& file) {
  SK_RETURN_IF_ERROR(CheckJsonNesting(text, 32, file));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLossError("'" + file + "' is not a JSON object");
  std::string arch, type;
  auto archs = j.find("architectures");
  if (archs != j.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
    arch = (*archs)[0].get<std::string>();
  }
  auto mt = j.find("model_type");
  if (mt != j.end() && mt->is_string()) type = mt->get<std::string>();
  for (const HfArchitecture& a : kArchitectures) {
    // "architectures" decides; without it, "model_type".
    if (arch.empty() ? type == a.model_type : arch == a.architecture) {
      SK_ASSIGN_OR_RETURN(NamedModelConfig c, a.from_config(j, file));
      SK_RETURN_IF_ERROR(ValidateFamily(c).WithContext("'" + file + "'"));
      return c;
    }
  }
  return InvalidArgumentError("'" + file + "': architecture '" + (arch.empty() ? type : arch) +
                              "' (key '" + (arch.empty() ? "model_type" : "architectures") +
                              "') is not one shardkit reads; known: " + KnownNames());
}

StatusOr<NamedModelConfig> ReadHfConfig(const std::string& dir) {
  const std::string file = dir + "/config.json";
  SK_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(file, kMaxConfigBytes, "Hugging Face config.json"));
  SK_ASSIGN_OR_RETURN(NamedModelConfig c, ParseHfConfig(text, file));
  c.name = dir;
  c.gpt.name = dir;
  c.llama.name = dir;
  c.description = "Hugging Face model directory " + dir;
  return c;
}

StatusOr<std::string> HfArchitectureOf(const NamedModelConfig& config) {
  for (const HfArchitecture& a : kArchitectures) {
    if (Writes(a, config)) return std::string(a.architecture);
  }
  return InvalidArgumentError("model '" + config.name + "' has no Hugging Face architecture (known: " +
                              KnownNames() + ")");
}

StatusOr<std::string> HfConfigJson(const NamedModelConfig& config) {
  for (const HfArchitecture& a : kArchitectures) {
    if (Writes(a, config)) return a.to_config(config).dump(2) + "\n";
  }
  return HfArchitectureOf(config).status();
}

}  // namespace sk
