#include "runtime/fsdp/hf_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"
#include "runtime/nn/hf_config.h"

namespace sk {
namespace {

using nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr int64_t kMaxIndexBytes = 64 << 20;

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

ConvertOptions ConvertOptionsFor(const NamedModelConfig& config) {
  ConvertOptions o;
  if (config.family == ModelFamily::kGpt) o.tied_lm_head = config.gpt.tie_word_embeddings;
  if (config.family == ModelFamily::kLlama) o.tied_lm_head = config.llama.tie_embeddings;
  return o;
}

// InvalidArgument unless `weights` (shardkit layout) holds exactly the
// parameters of `config`'s model with their shapes; names in `layout` are
// shown beside shardkit's.
Status CheckAgainstModel(const NamedModelConfig& config, const SafeTensorsFile& weights, WeightLayout layout,
                         const std::string& where) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModel(config));
  auto shown = [&](const std::string& name) {
    StatusOr<std::string> theirs = LayoutName(name, layout);
    return "'" + (theirs.ok() ? *theirs : name) + "' (shardkit '" + name + "')";
  };
  std::set<std::string> wanted;
  for (const UnitSpec& u : model->units()) {
    for (const ParamSpec& p : u.params) {
      const std::string name = FullParamName(u, p);
      wanted.insert(name);
      StatusOr<SafeTensorsFile::Info> info = weights.info(name);
      if (!info.ok()) {
        return InvalidArgumentError(where + ": tensor " + shown(name) + " is missing (config.json describes " +
                                    "a model that has it)");
      }
      if (info->shape != p.shape) {
        // Our matmul weights are the transpose of some layouts': show the
        // shape as the file holds it when the names differ.
        return InvalidArgumentError(where + ": tensor " + shown(name) + " has shape " + info->shape.ToString() +
                                    " in shardkit's layout, but config.json implies " + p.shape.ToString());
      }
    }
  }
  for (const std::string& name : weights.names()) {
    if (!wanted.count(name)) {
      return InvalidArgumentError(where + ": tensor " + shown(name) + " is not a parameter of the model " +
                                  "config.json describes");
    }
  }
  return OkStatus();
}

StatusOr<SafeTensorsFile> ReadSharded(const std::string& dir) {
  const std::string index = dir + "/" + kIndexFile;
  SK_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(index, kMaxIndexBytes, "safetensors index"));
  SK_RETURN_IF_ERROR(CheckJsonNesting(text, 16, index));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLossError("'" + index + "' is not a JSON object");
  auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object()) {
    return InvalidArgumentError("'" + index + "' has no \"weight_map\" object (tensor name -> file)");
  }
  std::map<std::string, std::vector<std::string>> by_file;  // file -> tensors, sorted by file name
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it.value().is_string()) {
      return InvalidArgumentError("'" + index + "': weight_map entry '" + it.key() + "' is not a file name");
    }
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return InvalidArgumentError("'" + index + "': weight_map entry '" + it.key() + "' names '" + file +
                                  "', not a file in the directory");
    }
    by_file[file].push_back(it.key());
  }
  if (by_file.empty()) return InvalidArgumentError("'" + index + "': weight_map is empty");
  std::vector<SafeTensorsFile> files;
  files.reserve(by_file.size());
  std::vector<SafeTensorsEntry> entries;
  for (const auto& [file, names] : by_file) {
    const std::string path = dir + "/" + file;
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
    if (!f.ok()) {
      return f.status().WithContext("shard '" + file + "' that '" + index + "' lists for tensor '" + names[0] +
                                    "'");
    }
    for (const std::string& n : names) {
      if (!f->contains(n)) {
        return InvalidArgumentError("'" + path + "': tensor '" + n + "' is missing (listed there by '" + index +
                                    "')");
      }
    }
    files.push_back(std::move(*f));
    std::set<std::string> listed(names.begin(), names.end());
    for (const SafeTensorsEntry& e : files.back().Entries()) {
      if (listed.count(e.name)) entries.push_back(e);
    }
  }
  std::map<std::string, std::string> meta{{"format", "pt"}};
  return SafeTensorsFile::FromEntries(entries, meta);
}

Status MakeDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return OkStatus();
    return InvalidArgumentError("'" + dir + "' exists and is not a directory");
  }
  return UnavailableError("cannot create directory '" + dir + "': " + std::strerror(errno));
}

Status RemoveIfPresent(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return OkStatus();
  return UnavailableError("cannot remove '" + path + "': " + std::strerror(errno));
}

}  // namespace

StatusOr<WeightLayout> HfWeightLayout(const NamedModelConfig& config) {
  SK_ASSIGN_OR_RETURN(std::string arch, HfArchitectureOf(config));
  // One entry per architecture of runtime/nn/hf_config.cc.
  if (arch == "GPT2LMHeadModel") return WeightLayout::kHfGpt2;
  if (arch == "LlamaForCausalLM" || arch == "Qwen2ForCausalLM") return WeightLayout::kHfLlama;
  return InvalidArgumentError("architecture '" + arch + "' has no weight layout");
}

StatusOr<SafeTensorsFile> ReadHfWeights(const std::string& dir) {
  if (IsFile(dir + "/" + kIndexFile)) return ReadSharded(dir);
  const std::string single = dir + "/" + kSingleFile;
  if (IsFile(single)) return SafeTensorsFile::Read(single);
  return NotFoundError("'" + dir + "' holds neither " + kSingleFile + " nor " + kIndexFile +
                       " (a Hugging Face model directory saved with safetensors)");
}

StatusOr<HfModel> ReadHfModelDir(const std::string& dir) {
  SK_ASSIGN_OR_RETURN(NamedModelConfig config, ReadHfConfig(dir));
  SK_ASSIGN_OR_RETURN(SafeTensorsFile file, ReadHfWeights(dir));
  SK_ASSIGN_OR_RETURN(WeightLayout layout, HfWeightLayout(config));
  StatusOr<SafeTensorsFile> converted = ConvertWeights(file, layout, WeightLayout::kShardkit, ConvertOptionsFor(config));
  if (!converted.ok()) return converted.status().WithContext("reading the weights of '" + dir + "'");
  SK_RETURN_IF_ERROR(CheckAgainstModel(config, *converted, layout, "'" + dir + "'"));
  return HfModel{std::move(config), std::move(*converted)};
}

StatusOr<SafeTensorsFile> ToHfWeights(const NamedModelConfig& config, const SafeTensorsFile& weights,
                                      const std::string& where) {
  SK_ASSIGN_OR_RETURN(WeightLayout layout, HfWeightLayout(config));
  ConvertOptions o = ConvertOptionsFor(config);
  o.drop_optimizer_state = true;
  // Weights only: optimizer state and shardkit's bookkeeping stay behind.
  std::vector<SafeTensorsEntry> params;
  for (const SafeTensorsEntry& e : weights.Entries()) {
    if (e.name.rfind("optimizer.", 0) != 0) params.push_back(e);
  }
  SK_ASSIGN_OR_RETURN(SafeTensorsFile mine, SafeTensorsFile::FromEntries(params));
  SK_RETURN_IF_ERROR(CheckAgainstModel(config, mine, layout, where));
  return ConvertWeights(mine, WeightLayout::kShardkit, layout, o);
}

Status WriteHfModelDir(const std::string& dir, const NamedModelConfig& config, const SafeTensorsFile& weights,
                       const HfWriteOptions& options) {
  if (options.max_shard_bytes < 0) return InvalidArgumentError("max_shard_bytes must be >= 0");
  SK_ASSIGN_OR_RETURN(std::string config_json, HfConfigJson(config));
  SK_ASSIGN_OR_RETURN(SafeTensorsFile hf, ToHfWeights(config, weights, "writing '" + dir + "'"));
  SK_RETURN_IF_ERROR(MakeDirectory(dir));
  SK_RETURN_IF_ERROR(WriteFileDurably(dir + "/config.json", config_json));
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  const std::vector<SafeTensorsEntry> entries = hf.Entries();
  if (options.max_shard_bytes == 0) {
    SK_RETURN_IF_ERROR(hf.Write(dir + "/" + kSingleFile));
    return RemoveIfPresent(dir + "/" + kIndexFile);  // from_pretrained would read a stale index first
  }
  std::vector<std::vector<SafeTensorsEntry>> groups(1);
  int64_t in_group = 0, total = 0;
  for (const SafeTensorsEntry& e : entries) {
    const int64_t bytes = e.shape.numel() * static_cast<int64_t>(DTypeSize(e.dtype));
    if (!groups.back().empty() && in_group + bytes > options.max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(e);
    in_group += bytes;
    total += bytes;
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = json::object();
  const int n = static_cast<int>(groups.size());
  for (int k = 0; k < n; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", k + 1, n);
    SK_RETURN_IF_ERROR(WriteSafeTensors(dir + "/" + name, groups[k], meta));
    for (const SafeTensorsEntry& e : groups[k]) index["weight_map"][e.name] = name;
  }
  SK_RETURN_IF_ERROR(WriteFileDurably(dir + "/" + kIndexFile, index.dump(2) + "\n"));
  return RemoveIfPresent(dir + "/" + kSingleFile);
}

}  // namespace sk
