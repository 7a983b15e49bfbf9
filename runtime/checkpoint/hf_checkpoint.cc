#include "runtime/checkpoint/hf_checkpoint.h"

#include <dirent.h>
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
#include "runtime/nn/model_family.h"

namespace sk {
namespace {

using nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr int64_t kMaxIndexBytes = 64 << 20;



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

// The index's weight_map, by file (sorted by file name): file -> tensors.
StatusOr<std::map<std::string, std::vector<std::string>>> ReadIndex(const std::string& dir) {
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
  return by_file;
}

StatusOr<SafeTensorsFile> ReadSharded(const std::string& dir) {
  const std::string index = dir + "/" + kIndexFile;
  SK_ASSIGN_OR_RETURN(auto by_file, ReadIndex(dir));
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
    if (IsDirectory(dir)) return OkStatus();
    return InvalidArgumentError("'" + dir + "' exists and is not a directory");
  }
  return UnavailableError("cannot create directory '" + dir + "': " + std::strerror(errno));
}

Status RemoveIfPresent(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return OkStatus();
  return UnavailableError("cannot remove '" + path + "': " + std::strerror(errno));
}

bool SameDirectory(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// The directory whose tokenizer and generation settings go with a written
// model: the caller's, else the one the model came from (a configuration
// read from a Hugging Face directory is named by it). Empty: none.
StatusOr<std::string> SourceDirectory(const NamedModelConfig& config, const HfWriteOptions& options) {
  if (!options.source_dir.empty()) {
    if (!IsDirectory(options.source_dir)) {
      return NotFoundError("source directory '" + options.source_dir + "' (tokenizer files, generation " +
                           "config) is not a directory");
    }
    return options.source_dir;
  }
  if (IsHfModelDirectory(config.name)) return config.name;
  return std::string();
}

// config.json's special token ids, as transformers keeps them: an id (an
// integer >= 0) or null, and for eos_token_id also a list of ids (Llama 3's
// three end tokens). InvalidArgument naming the file and key otherwise.
Status CheckTokenId(const json& v, const std::string& key, const std::string& file) {
  auto id = [](const json& x) { return x.is_number_integer() && x.get<int64_t>() >= 0; };
  bool ok = v.is_null() || id(v);
  if (!ok && key == "eos_token_id" && v.is_array() && !v.empty()) {
    ok = true;
    for (const json& x : v) ok = ok && id(x);
  }
  if (!ok) {
    return InvalidArgumentError("'" + file + "': key '" + key + "' must be a token id (an integer >= 0)" +
                                (key == "eos_token_id" ? ", a list of them" : "") + " or null, not " + v.dump());
  }
  return OkStatus();
}

constexpr const char* kTokenKeys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};

// The tokenizer's files as transformers' tokenizers save them (fast and
// slow: tokenizer.json; SentencePiece's tokenizer.model; BPE's vocab.json
// and merges.txt; WordPiece's vocab.txt), copied when present.
constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "spiece.model",          "vocab.json",              "merges.txt",
    "vocab.txt",       "chat_template.jinja",   "chat_template.json"};
constexpr int64_t kMaxTokenizerFileBytes = int64_t{1} << 30;

// config.json for `config` with the special token ids of the source
// directory's config.json (when it has them), and generation_config.json:
// the source's, copied, else one as transformers' GenerationConfig
// .from_model_config writes it from those ids (empty when there are none).
struct HfTextFiles {
  std::string config_json;
  std::string generation_config_json;
  std::vector<std::string> tokenizer_files;  // present in the source
};

StatusOr<HfTextFiles> HfTextFilesFor(const NamedModelConfig& config, const std::string& source) {
  HfTextFiles out;
  SK_ASSIGN_OR_RETURN(std::string base, HfConfigJson(config));
  json cfg = json::parse(base);
  json ids = json::object();
  if (!source.empty()) {
    const std::string file = source + "/config.json";
    if (IsRegularFile(file)) {
      SK_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(file, 4 << 20, "Hugging Face config.json"));
      SK_RETURN_IF_ERROR(CheckJsonNesting(text, 32, file));
      json src = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (src.is_discarded() || !src.is_object()) return DataLossError("'" + file + "' is not a JSON object");
      for (const char* key : kTokenKeys) {
        auto it = src.find(key);
        if (it == src.end()) continue;
        SK_RETURN_IF_ERROR(CheckTokenId(*it, key, file));
        cfg[key] = *it;
        if (!it->is_null()) ids[key] = *it;
      }
    }
    const std::string gen = source + "/generation_config.json";
    if (IsRegularFile(gen)) {
      SK_ASSIGN_OR_RETURN(out.generation_config_json, ReadFileBounded(gen, 4 << 20, "generation_config.json"));
      SK_RETURN_IF_ERROR(CheckJsonNesting(out.generation_config_json, 32, gen));
      json g = json::parse(out.generation_config_json, nullptr, /*allow_exceptions=*/false);
      if (g.is_discarded() || !g.is_object()) return DataLossError("'" + gen + "' is not a JSON object");
    }
    for (const char* f : kTokenizerFiles) {
      if (IsRegularFile(source + "/" + f)) out.tokenizer_files.push_back(f);
    }
  }
  if (out.generation_config_json.empty() && !ids.empty()) {
    json g = ids;
    g["_from_model_config"] = true;
    out.generation_config_json = g.dump(2) + "\n";
  }
  out.config_json = cfg.dump(2) + "\n";
  return out;
}

// Writes config.json, generation_config.json and the tokenizer files of
// `source` into `dir` (a generation_config.json of an earlier save is
// removed when there is none to write).
Status WriteHfTextFiles(const std::string& dir, const HfTextFiles& files, const std::string& source) {
  SK_RETURN_IF_ERROR(WriteFileDurably(dir + "/config.json", files.config_json));
  if (!source.empty() && SameDirectory(source, dir)) return OkStatus();  // already there
  if (files.generation_config_json.empty()) {
    SK_RETURN_IF_ERROR(RemoveIfPresent(dir + "/generation_config.json"));
  } else {
    SK_RETURN_IF_ERROR(WriteFileDurably(dir + "/generation_config.json", files.generation_config_json));
  }
  for (const std::string& f : files.tokenizer_files) {
    SK_ASSIGN_OR_RETURN(std::string bytes, ReadFileBounded(source + "/" + f, kMaxTokenizerFileBytes, "tokenizer file"));
    SK_RETURN_IF_ERROR(WriteFileDurably(dir + "/" + f, bytes));
  }
  return OkStatus();
}

}  // namespace

ConvertOptions HfConvertOptions(const NamedModelConfig& config) {
  ConvertOptions o;
  const ModelFamilyDescription* family = FindModelFamily(config.family);
  if (family != nullptr && family->tie_word_embeddings != nullptr) {
    o.tie_word_embeddings = family->tie_word_embeddings(config);
  }
  return o;
}

StatusOr<WeightLayout> HfWeightLayout(const NamedModelConfig& config) {
  // The architecture's, from its family's description (runtime/nn/model_family.h).
  SK_ASSIGN_OR_RETURN(std::string layout, HfWeightLayoutOf(config));
  return ParseWeightLayout(layout);
}

StatusOr<SafeTensorsFile> ReadHfWeights(const std::string& dir) {
  if (IsRegularFile(dir + "/" + kIndexFile)) return ReadSharded(dir);
  const std::string single = dir + "/" + kSingleFile;
  if (IsRegularFile(single)) return SafeTensorsFile::Read(single);
  return NotFoundError("'" + dir + "' holds neither " + kSingleFile + " nor " + kIndexFile +
                       " (a Hugging Face model directory saved with safetensors)");
}

StatusOr<HfWeightReaders> OpenHfWeights(const std::string& path) {
  HfWeightReaders out;
  auto add = [&](const std::string& file, const std::vector<std::string>* listed, const std::string& why) -> Status {
    StatusOr<SafeTensorsReader> r = SafeTensorsReader::Open(file);
    if (!r.ok()) return why.empty() ? r.status() : r.status().WithContext(why);
    const size_t k = out.files.size();
    if (listed != nullptr) {
      for (const std::string& n : *listed) {
        if (!r->contains(n)) {
          return InvalidArgumentError("'" + file + "': tensor '" + n + "' is missing (listed there by '" + path +
                                      "/" + kIndexFile + "')");
        }
        out.where[n] = k;
      }
    } else {
      for (const std::string& n : r->names()) out.where[n] = k;
    }
    out.files.push_back(std::move(*r));
    return OkStatus();
  };
  if (!IsDirectory(path)) {
    SK_RETURN_IF_ERROR(add(path, nullptr, ""));
    return out;
  }
  if (IsRegularFile(path + "/" + kIndexFile)) {
    SK_ASSIGN_OR_RETURN(auto by_file, ReadIndex(path));
    for (const auto& [file, names] : by_file) {
      SK_RETURN_IF_ERROR(add(path + "/" + file, &names,
                             "shard '" + file + "' that '" + path + "/" + kIndexFile + "' lists for tensor '" +
                                 names[0] + "'"));
    }
    return out;
  }
  const std::string single = path + "/" + kSingleFile;
  if (IsRegularFile(single)) {
    SK_RETURN_IF_ERROR(add(single, nullptr, ""));
    return out;
  }
  return NotFoundError("'" + path + "' holds neither " + kSingleFile + " nor " + kIndexFile +
                       " (a Hugging Face model directory saved with safetensors)");
}

StatusOr<HfModel> ReadHfModelDir(const std::string& dir) {
  SK_ASSIGN_OR_RETURN(NamedModelConfig config, ReadHfConfig(dir));
  SK_ASSIGN_OR_RETURN(SafeTensorsFile file, ReadHfWeights(dir));
  SK_ASSIGN_OR_RETURN(WeightLayout layout, HfWeightLayout(config));
  StatusOr<SafeTensorsFile> converted = ConvertWeights(file, layout, WeightLayout::kShardkit, HfConvertOptions(config));
  if (!converted.ok()) return converted.status().WithContext("reading the weights of '" + dir + "'");
  SK_RETURN_IF_ERROR(CheckAgainstModel(config, *converted, layout, "'" + dir + "'"));
  return HfModel{std::move(config), std::move(*converted)};
}

StatusOr<SafeTensorsFile> ToHfWeights(const NamedModelConfig& config, const SafeTensorsFile& weights,
                                      const std::string& where) {
  SK_ASSIGN_OR_RETURN(WeightLayout layout, HfWeightLayout(config));
  ConvertOptions o = HfConvertOptions(config);
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

Status WriteHfDirectoryFiles(const std::string& dir, const NamedModelConfig& config, const HfWriteOptions& options) {
  SK_ASSIGN_OR_RETURN(const std::string source, SourceDirectory(config, options));
  SK_ASSIGN_OR_RETURN(HfTextFiles text, HfTextFilesFor(config, source));
  SK_RETURN_IF_ERROR(MakeDirectory(dir));
  return WriteHfTextFiles(dir, text, source);
}

Status WriteHfIndex(const std::string& dir, const std::map<std::string, std::string>& weight_map, int64_t total_size,
                    const std::set<std::string>& files) {
  json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = json::object();
  for (const auto& [tensor, file] : weight_map) index["weight_map"][tensor] = file;
  SK_RETURN_IF_ERROR(WriteFileDurably(dir + "/" + kIndexFile, index.dump(2) + "\n"));
  // from_pretrained would read a single file first; shards of an earlier
  // save with another count are no one's.
  SK_RETURN_IF_ERROR(RemoveIfPresent(dir + "/" + kSingleFile));
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return OkStatus();
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    int k = 0, n = 0;
    char tail[32] = {0};
    if (std::sscanf(name.c_str(), "model-%5d-of-%5d.%31s", &k, &n, tail) == 3 &&
        std::string(tail) == "safetensors" && files.count(name) == 0) {
      stale.push_back(name);
    }
  }
  ::closedir(d);
  for (const std::string& name : stale) SK_RETURN_IF_ERROR(RemoveIfPresent(dir + "/" + name));
  return OkStatus();
}

Status WriteHfModelDir(const std::string& dir, const NamedModelConfig& config, const SafeTensorsFile& weights,
                       const HfWriteOptions& options) {
  if (options.max_shard_bytes < 0) return InvalidArgumentError("max_shard_bytes must be >= 0");
  SK_ASSIGN_OR_RETURN(SafeTensorsFile hf, ToHfWeights(config, weights, "writing '" + dir + "'"));
  SK_RETURN_IF_ERROR(WriteHfDirectoryFiles(dir, config, options));
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
  std::map<std::string, std::string> weight_map;
  std::set<std::string> written;
  const int n = static_cast<int>(groups.size());
  for (int k = 0; k < n; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", k + 1, n);
    SK_RETURN_IF_ERROR(WriteSafeTensors(dir + "/" + name, groups[k], meta));
    written.insert(name);
    for (const SafeTensorsEntry& e : groups[k]) weight_map[e.name] = name;
  }
  return WriteHfIndex(dir, weight_map, total, written);
}

}  // namespace sk
