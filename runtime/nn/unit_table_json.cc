#include "runtime/nn/unit_table_json.h"

#include <cstdint>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"

namespace sk {
namespace {

using nlohmann::json;

constexpr int kMaxNesting = 16;  // the format nests 5 deep

// Reads the fields of one JSON object, naming its place ("unit 'stem' conv
// 0") in every error, and refuses keys nobody read.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  Status Object() const {
    if (!obj_.is_object()) return Bad("is not a JSON object");
    return OkStatus();
  }

  Status Int(const char* key, int64_t* out) {
    const json* v = Take(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_number_integer()) return Bad(std::string("'") + key + "' must be an integer");
    *out = v->get<int64_t>();
    return OkStatus();
  }

  Status Bool(const char* key, bool* out) {
    const json* v = Take(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_boolean()) return Bad(std::string("'") + key + "' must be true or false");
    *out = v->get<bool>();
    return OkStatus();
  }

  Status String(const char* key, std::string* out) {
    const json* v = Take(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_string()) return Bad(std::string("'") + key + "' must be a string");
    *out = v->get<std::string>();
    return OkStatus();
  }

  // The value of `key` (nullptr when absent), marked as read.
  const json* Take(const char* key) {
    read_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }

  Status NoOtherKeys() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (read_.count(it.key()) == 0) return Bad("unknown key '" + it.key() + "'");
    }
    return OkStatus();
  }

  Status Bad(const std::string& what) const { return InvalidArgumentError(where_ + ": " + what); }
  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
  std::set<std::string> read_;
};

Status ParseConv(const json& j, const std::string& where, ConvLayerSpec* c) {
  Fields f(j, where);
  SK_RETURN_IF_ERROR(f.Object());
  SK_RETURN_IF_ERROR(f.String("name", &c->name));
  SK_RETURN_IF_ERROR(f.Int("in_channels", &c->in_channels));
  SK_RETURN_IF_ERROR(f.Int("out_channels", &c->out_channels));
  SK_RETURN_IF_ERROR(f.Int("kernel", &c->kernel));
  SK_RETURN_IF_ERROR(f.Int("stride", &c->stride));
  SK_RETURN_IF_ERROR(f.Int("groups", &c->groups));
  SK_RETURN_IF_ERROR(f.Int("padding", &c->padding));
  SK_RETURN_IF_ERROR(f.Bool("gelu", &c->gelu));
  return f.NoOtherKeys();
}

Status ParseUnit(const json& j, int index, TableUnit* u) {
  std::string where = "unit " + std::to_string(index);
  if (j.is_object() && j.contains("name") && j["name"].is_string()) {
    where += " ('" + j["name"].get<std::string>() + "')";
  }
  Fields f(j, where);
  SK_RETURN_IF_ERROR(f.Object());
  SK_RETURN_IF_ERROR(f.String("name", &u->name));
  std::string kind;
  SK_RETURN_IF_ERROR(f.String("kind", &kind));
  if (kind == "conv") {
    u->kind = TableUnitKind::kConv;
  } else if (kind == "transformer") {
    u->kind = TableUnitKind::kTransformer;
  } else if (kind == "classifier") {
    u->kind = TableUnitKind::kClassifier;
  } else {
    return f.Bad("'kind' must be \"conv\", \"transformer\" or \"classifier\", got \"" + kind + "\"");
  }
  SK_RETURN_IF_ERROR(f.Int("in_h", &u->in_h));
  SK_RETURN_IF_ERROR(f.Int("in_w", &u->in_w));
  if (const json* convs = f.Take("convs")) {
    if (!convs->is_array()) return f.Bad("'convs' must be an array of convolutions");
    for (size_t i = 0; i < convs->size(); ++i) {
      ConvLayerSpec c;
      SK_RETURN_IF_ERROR(ParseConv((*convs)[i], where + " conv " + std::to_string(i), &c));
      u->convs.push_back(std::move(c));
    }
  }
  std::string residual = "none";
  SK_RETURN_IF_ERROR(f.String("residual", &residual));
  if (residual == "none") {
    u->residual = Residual::kNone;
  } else if (residual == "identity") {
    u->residual = Residual::kIdentity;
  } else if (residual == "projection") {
    u->residual = Residual::kProjection;
  } else {
    return f.Bad("'residual' must be \"none\", \"identity\" or \"projection\", got \"" + residual + "\"");
  }
  if (const json* p = f.Take("projection")) {
    SK_RETURN_IF_ERROR(ParseConv(*p, where + " projection", &u->projection));
  }
  SK_RETURN_IF_ERROR(f.Bool("gelu_after_sum", &u->gelu_after_sum));
  SK_RETURN_IF_ERROR(f.Bool("position_bias", &u->position_bias));
  SK_RETURN_IF_ERROR(f.Int("width", &u->width));
  SK_RETURN_IF_ERROR(f.Int("heads", &u->heads));
  SK_RETURN_IF_ERROR(f.Int("d_ff", &u->d_ff));
  SK_RETURN_IF_ERROR(f.Bool("layer_norm", &u->layer_norm));
  return f.NoOtherKeys();
}

nlohmann::ordered_json ConvToJson(const ConvLayerSpec& c) {
  return nlohmann::ordered_json{{"name", c.name},         {"in_channels", c.in_channels}, {"out_channels", c.out_channels},
              {"kernel", c.kernel},     {"stride", c.stride},           {"groups", c.groups},
              {"padding", c.padding},   {"gelu", c.gelu}};
}

const char* KindName(TableUnitKind k) {
  switch (k) {
    case TableUnitKind::kConv: return "conv";
    case TableUnitKind::kTransformer: return "transformer";
    case TableUnitKind::kClassifier: return "classifier";
  }
  return "?";
}

const char* ResidualName(Residual r) {
  switch (r) {
    case Residual::kNone: return "none";
    case Residual::kIdentity: return "identity";
    case Residual::kProjection: return "projection";
  }
  return "?";
}

}  // namespace

StatusOr<UnitTableConfig> UnitTableFromJson(std::string_view text, std::string_view origin) {
  const std::string where(origin);
  SK_RETURN_IF_ERROR(CheckJsonNesting(text, kMaxNesting, "unit table " + where)
                         .WithContext("unit table " + where));
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgumentError("unit table " + where + ": not valid JSON");
  UnitTableConfig t;
  Fields f(doc, "unit table " + where);
  SK_RETURN_IF_ERROR(f.Object());
  SK_RETURN_IF_ERROR(f.String("name", &t.name));
  SK_RETURN_IF_ERROR(f.Int("image_size", &t.image_size));
  SK_RETURN_IF_ERROR(f.Int("image_channels", &t.image_channels));
  SK_RETURN_IF_ERROR(f.Int("num_classes", &t.num_classes));
  SK_RETURN_IF_ERROR(f.String("source", &t.source));
  const json* units = f.Take("units");
  if (units == nullptr || !units->is_array() || units->empty()) {
    return f.Bad("'units' must be a non-empty array of units");
  }
  for (size_t i = 0; i < units->size(); ++i) {
    TableUnit u;
    SK_RETURN_IF_ERROR(ParseUnit((*units)[i], static_cast<int>(i), &u).WithContext("unit table " + where));
    t.units.push_back(std::move(u));
  }
  SK_RETURN_IF_ERROR(f.NoOtherKeys());
  if (t.name.empty()) return f.Bad("'name' must be a non-empty string");
  SK_RETURN_IF_ERROR(t.Validate().WithContext("unit table " + where));
  return t;
}

std::string UnitTableToJson(const UnitTableConfig& t) {
  using ojson = nlohmann::ordered_json;
  ojson units = ojson::array();
  for (const TableUnit& u : t.units) {
    ojson j{{"name", u.name}, {"kind", KindName(u.kind)}, {"in_h", u.in_h}, {"in_w", u.in_w}};
    if (u.kind == TableUnitKind::kConv) {
      ojson convs = ojson::array();
      for (const ConvLayerSpec& c : u.convs) convs.push_back(ConvToJson(c));
      j["convs"] = std::move(convs);
      j["residual"] = ResidualName(u.residual);
      if (u.residual == Residual::kProjection) j["projection"] = ConvToJson(u.projection);
      j["gelu_after_sum"] = u.gelu_after_sum;
      j["position_bias"] = u.position_bias;
    } else {
      j["width"] = u.width;
      if (u.kind == TableUnitKind::kTransformer) {
        j["heads"] = u.heads;
        j["d_ff"] = u.d_ff;
      } else {
        j["layer_norm"] = u.layer_norm;
      }
    }
    units.push_back(std::move(j));
  }
  ojson doc{{"name", t.name},
           {"image_size", t.image_size},
           {"image_channels", t.image_channels},
           {"num_classes", t.num_classes},
           {"source", t.source},
           {"units", std::move(units)}};
  return doc.dump(1) + "\n";
}

}  // namespace sk
