#include "runtime/nn/hf_config.h"


#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"
#include "runtime/nn/model_family.h"

namespace sk {
namespace {

using nlohmann::json;

constexpr int64_t kMaxConfigBytes = 4 << 20;

// The architecture a config is written as: the first of its family's that
// writes it, or nullptr.
const HfArchitecture* WrittenAs(const NamedModelConfig& c) {
  const ModelFamilyDescription* f = FindModelFamily(c.family);
  if (f == nullptr) return nullptr;
  for (const HfArchitecture& a : f->hf_architectures) {
    if (a.writes == nullptr || a.writes(c)) return &a;
  }
  return nullptr;
}

std::string KnownNames() {
  std::string s;
  for (const ModelFamilyDescription* f : ModelFamilies()) {
    for (const HfArchitecture& a : f->hf_architectures) s += (s.empty() ? "" : ", ") + a.architecture;
  }
  return s;
}

}  // namespace

bool IsHfModelDirectory(const std::string& path) {
  return IsDirectory(path) && IsRegularFile(path + "/config.json");
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
  for (const ModelFamilyDescription* f : ModelFamilies()) {
    for (const HfArchitecture& a : f->hf_architectures) {
      // "architectures" decides; without it, "model_type".
      if (arch.empty() ? type == a.model_type : arch == a.architecture) {
        SK_ASSIGN_OR_RETURN(NamedModelConfig c, a.from_config(j, file));
        SK_RETURN_IF_ERROR(f->validate(c).WithContext("'" + file + "'"));
        return c;
      }
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
  SK_ASSIGN_OR_RETURN(const ModelFamilyDescription* family, ModelFamilyOf(c));
  family->set_name(c, dir);
  c.description = "Hugging Face model directory " + dir;
  return c;
}

StatusOr<std::string> HfArchitectureOf(const NamedModelConfig& config) {
  if (const HfArchitecture* a = WrittenAs(config)) return a->architecture;
  return InvalidArgumentError("model '" + config.name + "' has no Hugging Face architecture (known: " +
                              KnownNames() + ")");
}

StatusOr<std::string> HfWeightLayoutOf(const NamedModelConfig& config) {
  if (const HfArchitecture* a = WrittenAs(config)) return a->weight_layout;
  return HfArchitectureOf(config).status();
}

StatusOr<std::string> HfConfigJson(const NamedModelConfig& config) {
  if (const HfArchitecture* a = WrittenAs(config)) {
    nlohmann::json j = a->to_config(config);
    j["architectures"] = {a->architecture};
    j["model_type"] = a->model_type;
    return j.dump(2) + "\n";
  }
  return HfArchitectureOf(config).status();
}

}  // namespace sk
