#include "runtime/nn/model_family.h"

#include <algorithm>
#include <mutex>

#include "runtime/nn/builtin_families.h"

namespace sk {
namespace {

// Descriptions are never removed, so the pointers handed out stay valid.
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<const ModelFamilyDescription>> families;
};

Registry& TheRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    // The built-in families: one line each.
    for (ModelFamilyDescription f : {GptFamily(), LlamaFamily(), T5Family(), UnitTableFamily()}) {
      r->families.push_back(std::make_unique<const ModelFamilyDescription>(std::move(f)));
    }
    return r;
  }();
  return *registry;
}

std::string IdText(ModelFamily id) { return std::to_string(static_cast<int>(id)); }

// InvalidArgument naming the family's first missing required hook.
Status CheckHooks(const ModelFamilyDescription& f) {
  const std::pair<const char*, bool> required[] = {
      {"create", f.create != nullptr},
      {"validate", f.validate != nullptr},
      {"batch_id_space", f.batch_id_space != nullptr},
      {"check_step_size", f.check_step_size != nullptr},
      {"set_name", f.set_name != nullptr},
      {"table_row", f.table_row != nullptr},
  };
  for (const auto& [hook, present] : required) {
    if (!present) return InvalidArgumentError(std::string("has no '") + hook + "' (required)");
  }
  for (const HfArchitecture& a : f.hf_architectures) {
    if (a.architecture.empty() || a.model_type.empty() || a.weight_layout.empty() || a.from_config == nullptr ||
        a.to_config == nullptr) {
      return InvalidArgumentError("has a Hugging Face architecture ('" + a.architecture +
                                  "') without its names, weight layout, reader or writer");
    }
  }
  return OkStatus();
}

}  // namespace

Status RegisterModelFamily(ModelFamilyDescription family) {
  const std::string what = "model family '" + family.name + "' (id " + IdText(family.id) + ")";
  if (static_cast<int>(family.id) == 0) return InvalidArgumentError(what + ": id 0 is no family");
  if (family.name.empty()) return InvalidArgumentError(what + ": the name is empty");
  SK_RETURN_IF_ERROR(CheckHooks(family).WithContext(what));
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& f : r.families) {
    if (f->id == family.id) return InvalidArgumentError(what + ": id taken by family '" + f->name + "'");
    if (f->name == family.name) return InvalidArgumentError(what + ": the name is taken");
    for (const HfArchitecture& a : f->hf_architectures) {
      for (const HfArchitecture& b : family.hf_architectures) {
        if (a.architecture == b.architecture || a.model_type == b.model_type) {
          return InvalidArgumentError(what + ": Hugging Face architecture '" + b.architecture + "' (" +
                                      b.model_type + ") is family '" + f->name + "''s");
        }
      }
    }
  }
  for (size_t i = 0; i < family.configs.size(); ++i) {
    const NamedModelConfig& c = family.configs[i];
    if (c.family != family.id) {
      return InvalidArgumentError(what + ": configuration '" + c.name + "' is of family id " + IdText(c.family));
    }
    bool taken = std::any_of(family.configs.begin(), family.configs.begin() + i,
                             [&](const NamedModelConfig& o) { return o.name == c.name; });
    for (const NamedModelConfig& o : ModelConfigs()) taken = taken || o.name == c.name;
    for (const auto& f : r.families) {
      for (const NamedModelConfig& o : f->configs) taken = taken || o.name == c.name;
    }
    if (c.name.empty() || taken) {
      return InvalidArgumentError(what + ": configuration name '" + c.name + "' is empty or taken");
    }
  }
  r.families.push_back(std::make_unique<const ModelFamilyDescription>(std::move(family)));
  return OkStatus();
}

const ModelFamilyDescription* FindModelFamily(ModelFamily id) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& f : r.families) {
    if (f->id == id) return f.get();
  }
  return nullptr;
}

StatusOr<const ModelFamilyDescription*> ModelFamilyOf(const NamedModelConfig& config) {
  const ModelFamilyDescription* f = FindModelFamily(config.family);
  if (f != nullptr) return f;
  std::string known;
  for (const ModelFamilyDescription* k : ModelFamilies()) {
    known += (known.empty() ? "" : ", ") + k->name + " (" + IdText(k->id) + ")";
  }
  return InvalidArgumentError("model '" + config.name + "' is of model family id " + IdText(config.family) +
                              ", which is not registered (registered: " + known + ")");
}

std::vector<const ModelFamilyDescription*> ModelFamilies() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<const ModelFamilyDescription*> out;
  for (const auto& f : r.families) out.push_back(f.get());
  return out;
}

Status CheckTransformerStepSize(const NamedModelConfig& c, int64_t layers, int64_t heads, int64_t d,
                                int64_t ff, int64_t vocab, int64_t batch_size, int64_t seq_len,
                                int64_t source_len) {
  const int64_t s = std::max<int64_t>({seq_len > 0 ? seq_len : c.seq_len,
                                       source_len > 0 ? source_len : c.source_len, 1});
  // Floats per token per layer, generously: every sublayer's saved and
  // temporary tensors (a few d_model and d_ff vectors), its attention
  // scores (heads x s per token), and the head's logits (vocab).
  int64_t per_token = 0, tokens = 0, floats = 0, bytes = 0;
  bool overflow = __builtin_mul_overflow(heads, 4 * s, &per_token);
  overflow |= __builtin_add_overflow(per_token, 64 * d + 8 * ff + 4 * vocab + 16, &per_token);
  overflow |= __builtin_mul_overflow(batch_size, s, &tokens);
  overflow |= __builtin_mul_overflow(tokens, per_token, &floats);
  overflow |= __builtin_mul_overflow(floats, layers + 4, &floats);
  overflow |= __builtin_mul_overflow(floats, int64_t{4}, &bytes);
  if (overflow || bytes > (int64_t{1} << 62)) {
    return InvalidArgumentError("batch_size " + std::to_string(batch_size) + " x sequence length " +
                                std::to_string(s) + " of model '" + c.name +
                                "' is too large: its activation memory does not fit in 64-bit byte counts");
  }
  return OkStatus();
}

}  // namespace sk
