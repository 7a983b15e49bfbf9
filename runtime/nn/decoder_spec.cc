#include "runtime/nn/decoder_spec.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/nn/model_family.h"

namespace sk {
namespace {

// What a value was written as: inline text takes any kind (it is all
// text); a JSON value must be of the kind the key takes, so that
// {"layers": "2"} is refused naming the key (issue 47 item 8), as a
// config.json's "num_hidden_layers": "2" is.
enum class Kind { kText, kNumber, kBool, kString };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNumber: return "a number";
    case Kind::kBool: return "a boolean";
    case Kind::kString: return "a string";
    case Kind::kText: break;
  }
  return "text";
}

// Values by key, each taken once; what is left over is an unknown key.
class Keys {
 public:
  explicit Keys(std::string where) : where_(std::move(where)) {}

  Status Add(const std::string& key, std::string value, Kind kind = Kind::kText) {
    if (key.empty()) return Bad("an empty key");
    if (!values_.emplace(key, std::move(value)).second) return Bad("'" + key + "' is given twice");
    kinds_[key] = kind;
    return OkStatus();
  }

  bool Has(const std::string& key) const { return values_.count(key) > 0; }

  // Required when `required`; otherwise *out keeps its default.
  Status Int(const std::string& key, bool required, int64_t* out) {
    const std::string* v = Take(key);
    if (v == nullptr) return required ? Bad("'" + key + "' is required") : OkStatus();
    SK_RETURN_IF_ERROR(ExpectKind(key, Kind::kNumber, "an integer"));
    int64_t x = 0;
    const char* end = v->data() + v->size();
    auto [p, ec] = std::from_chars(v->data(), end, x);
    if (ec != std::errc() || p != end) return Bad("'" + key + "' is '" + *v + "', not an integer");
    if (x <= 0) return Bad("'" + key + "' must be > 0 (is " + *v + ")");
    *out = x;
    return OkStatus();
  }

  Status Float(const std::string& key, float* out) {
    const std::string* v = Take(key);
    if (v == nullptr) return OkStatus();
    SK_RETURN_IF_ERROR(ExpectKind(key, Kind::kNumber, "a number"));
    char* end = nullptr;
    const double x = std::strtod(v->c_str(), &end);
    if (v->empty() || end != v->c_str() + v->size() || !std::isfinite(x)) {
      return Bad("'" + key + "' is '" + *v + "', not a finite number");
    }
    if (x <= 0) return Bad("'" + key + "' must be > 0 (is " + *v + ")");
    *out = static_cast<float>(x);
    return OkStatus();
  }

  Status Bool(const std::string& key, bool* out) {
    const std::string* v = Take(key);
    if (v == nullptr) return OkStatus();
    SK_RETURN_IF_ERROR(ExpectKind(key, Kind::kBool, "true or false"));
    if (*v == "true" || *v == "1") {
      *out = true;
    } else if (*v == "false" || *v == "0") {
      *out = false;
    } else {
      return Bad("'" + key + "' is '" + *v + "'; it takes true/false or 1/0");
    }
    return OkStatus();
  }

  Status String(const std::string& key, std::string* out) {
    const std::string* v = Take(key);
    if (v == nullptr) return OkStatus();
    SK_RETURN_IF_ERROR(ExpectKind(key, Kind::kString, "a string"));
    if (v->empty()) return Bad("'" + key + "' is empty");
    *out = *v;
    return OkStatus();
  }

  Status NoOthers() const {
    for (const auto& [key, value] : values_) {
      if (taken_.count(key) == 0) {
        return Bad("unknown key '" + key +
                   "' (known: layers, d_model, heads, kv_heads, d_ff, ffn, vocab, seq, tied, "
                   "qkv_bias, rope_theta, rope_type, rope_factor, rope_low_freq_factor, "
                   "rope_high_freq_factor, rope_original_max_positions, norm_eps, name)");
      }
    }
    return OkStatus();
  }

  Status Bad(const std::string& what) const {
    return InvalidArgumentError(where_ + ": " + what);
  }

 private:
  Status ExpectKind(const std::string& key, Kind want, const char* takes) const {
    const Kind got = kinds_.at(key);
    if (got == Kind::kText || got == want) return OkStatus();
    const std::string& v = values_.at(key);
    return Bad("'" + key + "' is " + KindName(got) + " (" + (got == Kind::kString ? "\"" + v + "\"" : v) +
               "); it takes " + takes);
  }

  const std::string* Take(const std::string& key) {
    taken_.insert(key);
    auto it = values_.find(key);
    return it == values_.end() ? nullptr : &it->second;
  }

  std::string where_;
  std::map<std::string, std::string> values_;
  std::map<std::string, Kind> kinds_;
  std::set<std::string> taken_;
};

// RoPE scaling's keys (Hugging Face's rope_scaling object, flattened) after
// rope_type, with the types that read each.
struct RopeKey {
  const char* key;
  bool linear, llama3;
};
constexpr RopeKey kRopeKeys[] = {
    {"rope_factor", true, true},
    {"rope_low_freq_factor", false, true},
    {"rope_high_freq_factor", false, true},
    {"rope_original_max_positions", false, true},
};

// rope_type (default, linear or llama3) and the keys its type reads, each
// required there and refused with any other type, so that a scaling is
// never half given. The values' ranges are RopeForward's
// (ops::ValidateRopeScaling, through LlamaConfig::Validate).
Status ReadRopeScaling(Keys& k, RopeScaling* out) {
  std::string type = "default";
  SK_RETURN_IF_ERROR(k.String("rope_type", &type));
  RopeScaling s;
  if (type == "linear") {
    s.type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    s.type = RopeScalingType::kLlama3;
  } else if (type != "default") {
    return k.Bad("'rope_type' is '" + type + "'; it takes default, linear or llama3");
  }
  for (const RopeKey& r : kRopeKeys) {
    const bool reads = (s.type == RopeScalingType::kLinear && r.linear) ||
                       (s.type == RopeScalingType::kLlama3 && r.llama3);
    if (reads && !k.Has(r.key)) {
      return k.Bad(std::string("'") + r.key + "' is required with rope_type=" + type);
    }
    if (!reads && k.Has(r.key)) {
      return k.Bad(std::string("'") + r.key + "' applies to rope_type=" +
                   (r.linear ? "linear or llama3" : "llama3") + " only (rope_type is " + type + ")");
    }
  }
  if (s.type != RopeScalingType::kNone) SK_RETURN_IF_ERROR(k.Float("rope_factor", &s.factor));
  if (s.type == RopeScalingType::kLlama3) {
    SK_RETURN_IF_ERROR(k.Float("rope_low_freq_factor", &s.low_freq_factor));
    SK_RETURN_IF_ERROR(k.Float("rope_high_freq_factor", &s.high_freq_factor));
    SK_RETURN_IF_ERROR(k.Int("rope_original_max_positions", true, &s.original_max_positions));
  }
  *out = s;
  return OkStatus();
}

StatusOr<NamedModelConfig> Build(Keys& k, const std::string& where) {
  std::string name = "decoder", ffn = "swiglu";
  SK_RETURN_IF_ERROR(k.String("name", &name));
  SK_RETURN_IF_ERROR(k.String("ffn", &ffn));
  if (ffn != "swiglu" && ffn != "gelu") {
    return k.Bad("'ffn' is '" + ffn + "'; it takes swiglu (Llama family) or gelu (GPT-2)");
  }
  int64_t layers = 0, d_model = 0, heads = 0, vocab = 0, seq = 0, d_ff = 0, kv_heads = 0;
  SK_RETURN_IF_ERROR(k.Int("layers", true, &layers));
  SK_RETURN_IF_ERROR(k.Int("d_model", true, &d_model));
  SK_RETURN_IF_ERROR(k.Int("heads", true, &heads));
  SK_RETURN_IF_ERROR(k.Int("vocab", true, &vocab));
  SK_RETURN_IF_ERROR(k.Int("seq", true, &seq));
  SK_RETURN_IF_ERROR(k.Int("d_ff", ffn == "swiglu", &d_ff));
  bool tied = false;
  SK_RETURN_IF_ERROR(k.Bool("tied", &tied));
  NamedModelConfig c;
  if (ffn == "gelu") {
    for (const char* swiglu_only : {"kv_heads", "qkv_bias", "rope_theta", "rope_type", "rope_factor",
                                    "rope_low_freq_factor", "rope_high_freq_factor",
                                    "rope_original_max_positions", "norm_eps"}) {
      if (k.Has(swiglu_only)) {
        return k.Bad(std::string("'") + swiglu_only + "' applies to ffn=swiglu only (a GPT-2 block has " +
                     "full multi-head attention, no RoPE, no RMSNorm)");
      }
    }
    SK_RETURN_IF_ERROR(k.NoOthers());
    c = GptDecoderConfig(name, {vocab, seq, layers, heads, d_model, d_ff, tied});
    SK_RETURN_IF_ERROR(c.gpt.Validate().WithContext(where));
  } else {
    SK_RETURN_IF_ERROR(k.Int("kv_heads", false, &kv_heads));
    LlamaShape shape{vocab, seq, layers, heads, kv_heads, d_model, d_ff};
    shape.tie_word_embeddings = tied;
    SK_RETURN_IF_ERROR(k.Bool("qkv_bias", &shape.qkv_bias));
    SK_RETURN_IF_ERROR(k.Float("rope_theta", &shape.rope_theta));
    SK_RETURN_IF_ERROR(ReadRopeScaling(k, &shape.rope_scaling));
    SK_RETURN_IF_ERROR(k.Float("norm_eps", &shape.rms_norm_eps));
    SK_RETURN_IF_ERROR(k.NoOthers());
    c = LlamaDecoderConfig(name, shape);
    SK_RETURN_IF_ERROR(c.llama.Validate().WithContext(where));
  }
  c.gpu_scale = true;  // a shape for the planner; small ones train anywhere
  c.description = "decoder shape from " + where;
  return c;
}

std::string FloatText(float x) {
  std::ostringstream o;
  o.precision(9);
  o << x;
  return o.str();
}

}  // namespace

bool IsDecoderSpec(const std::string& name) { return name.rfind(kDecoderSpecPrefix, 0) == 0; }

StatusOr<NamedModelConfig> ParseDecoderSpec(const std::string& spec) {
  if (!IsDecoderSpec(spec)) {
    return InvalidArgumentError("decoder spec '" + spec + "' does not start with '" +
                                kDecoderSpecPrefix + "'");
  }
  const std::string where = "decoder spec";
  Keys k(where);
  std::stringstream items(spec.substr(sizeof(kDecoderSpecPrefix) - 1));
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return k.Bad("'" + item + "' is not key=value");
    SK_RETURN_IF_ERROR(k.Add(item.substr(0, eq), item.substr(eq + 1)));
  }
  return Build(k, where);
}

StatusOr<NamedModelConfig> DecoderFromJson(const std::string& text, const std::string& where) {
  using nlohmann::json;
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgumentError(where + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("decoder")) {
    return NotFoundError(where + " has no \"decoder\" object");
  }
  const json& d = doc["decoder"];
  if (doc.size() != 1) return InvalidArgumentError(where + ": a decoder file holds only \"decoder\"");
  if (!d.is_object()) return InvalidArgumentError(where + ": \"decoder\" is not a JSON object");
  Keys k(where);
  for (auto it = d.begin(); it != d.end(); ++it) {
    const json& v = it.value();
    std::string text_value;
    Kind kind;
    if (v.is_string()) {
      text_value = v.get<std::string>();
      kind = Kind::kString;
    } else if (v.is_boolean()) {
      text_value = v.get<bool>() ? "true" : "false";
      kind = Kind::kBool;
    } else if (v.is_number()) {
      text_value = v.dump();
      kind = Kind::kNumber;
    } else {
      return k.Bad("'" + it.key() + "' must be a number, a boolean or a string");
    }
    SK_RETURN_IF_ERROR(k.Add(it.key(), std::move(text_value), kind));
  }
  return Build(k, where);
}

namespace {

// Appends key=value pairs to an inline spec.
class SpecText {
 public:
  void Add(const std::string& key, const std::string& value) {
    if (s_.size() > sizeof(kDecoderSpecPrefix) - 1) s_ += ",";
    s_ += key + "=" + value;
  }
  const std::string& text() const { return s_; }

 private:
  std::string s_ = kDecoderSpecPrefix;
};

}  // namespace

std::string GptDecoderSpec(const GptConfig& g) {
  SpecText t;
  auto add = [&t](const std::string& key, const std::string& value) { t.Add(key, value); };
  add("name", g.name);
  add("ffn", "gelu");
  add("layers", std::to_string(g.n_layer));
  add("d_model", std::to_string(g.d_model));
  add("heads", std::to_string(g.n_head));
  add("d_ff", std::to_string(g.ff()));
  add("vocab", std::to_string(g.vocab_size));
  add("seq", std::to_string(g.max_seq_len));
  add("tied", g.tie_word_embeddings ? "true" : "false");
  return t.text();
}

std::string LlamaDecoderSpec(const LlamaConfig& l) {
  SpecText t;
  auto add = [&t](const std::string& key, const std::string& value) { t.Add(key, value); };
  add("name", l.name);
  add("ffn", "swiglu");
  add("layers", std::to_string(l.n_layer));
  add("d_model", std::to_string(l.d_model));
  add("heads", std::to_string(l.n_head));
  add("kv_heads", std::to_string(l.kv_heads()));
  add("d_ff", std::to_string(l.d_ff));
  add("vocab", std::to_string(l.vocab_size));
  add("seq", std::to_string(l.max_seq_len));
  add("tied", l.tie_word_embeddings ? "true" : "false");
  add("qkv_bias", l.qkv_bias ? "true" : "false");
  add("rope_theta", FloatText(l.rope_theta));
  const RopeScaling& r = l.rope_scaling;
  if (r.type != RopeScalingType::kNone) {
    add("rope_type", RopeScalingTypeName(r.type));
    add("rope_factor", FloatText(r.factor));
  }
  if (r.type == RopeScalingType::kLlama3) {
    add("rope_low_freq_factor", FloatText(r.low_freq_factor));
    add("rope_high_freq_factor", FloatText(r.high_freq_factor));
    add("rope_original_max_positions", std::to_string(r.original_max_positions));
  }
  add("norm_eps", FloatText(l.rms_norm_eps));
  return t.text();
}

StatusOr<std::string> DecoderSpecOf(const NamedModelConfig& c) {
  const ModelFamilyDescription* family = FindModelFamily(c.family);
  if (family != nullptr && family->decoder_spec != nullptr) return family->decoder_spec(c);
  return InvalidArgumentError("model '" + c.name + "' is not a decoder of the GPT or Llama family");
}

}  // namespace sk
