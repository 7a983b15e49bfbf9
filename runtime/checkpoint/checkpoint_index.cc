#include "runtime/checkpoint/checkpoint_index.h"

#include <cerrno>
#include <cstdlib>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"
#include "runtime/checkpoint/checkpoint_internal.h"
#include "runtime/checkpoint/safetensors.h"

namespace sk {

namespace {

namespace fs = std::filesystem;
using checkpoint_internal::StripTrailingSlashes;
using nlohmann::json;

constexpr char kIndexFormat[] = "shardkit.sharded_checkpoint";
// CRC-32 of the index's compact JSON without this key: a flipped digit in a
// step or size would otherwise still parse.
constexpr char kIndexCrcKey[] = "index_crc32";
// Bounds on what is read from disk: an index of a 10^4-unit model with 100
// parameters each is ~100 MB of JSON below this; our format nests 5 deep.
constexpr int64_t kMaxIndexBytes = int64_t{256} << 20;
constexpr int kMaxIndexNesting = 16;

std::string RankFileName(int shard_rank) { return CheckpointRankFileName(shard_rank); }

json IndexToJson(const CheckpointIndex& ix, const OptimizerOptions* opt) {
  json j;
  j["format"] = kIndexFormat;
  j["format_version"] = ix.format_version;
  j["checkpoint_id"] = ix.checkpoint_id;
  j["model"] = ix.model;
  j["world_size"] = ix.world_size;
  j["shard_group_size"] = ix.shard_group_size;
  j["strategy"] = ix.strategy;
  j["step"] = ix.step;
  if (ix.has_optimizer) {
    json o;
    o["kind"] = ix.optimizer_kind;
    o["state_names"] = ix.optimizer_state_names;
    if (opt != nullptr) {
      o["lr"] = opt->lr;
      o["momentum"] = opt->momentum;
      o["dampening"] = opt->dampening;
      o["nesterov"] = opt->nesterov;
      o["beta1"] = opt->beta1;
      o["beta2"] = opt->beta2;
      o["eps"] = opt->eps;
      o["weight_decay"] = opt->weight_decay;
    }
    j["optimizer"] = o;
  } else {
    j["optimizer"] = nullptr;
  }
  json units = json::array();
  for (const auto& u : ix.units) {
    json ju;
    ju["name"] = u.name;
    ju["unpadded_numel"] = u.unpadded_numel;
    ju["padded_numel"] = u.padded_numel;
    ju["shard_numel"] = u.shard_numel;
    ju["optimizer_step"] = u.optimizer_step;
    json params = json::array();
    for (const auto& p : u.params) {
      params.push_back(
          {{"name", p.name}, {"shape", p.shape.ToVector()}, {"offset", p.offset}, {"numel", p.numel}});
    }
    ju["params"] = params;
    units.push_back(ju);
  }
  j["units"] = units;
  json files = json::array();
  for (const auto& f : ix.files) {
    json jf = {{"name", f.name}, {"shard_rank", f.shard_rank}, {"bytes", f.bytes}};
    if (f.header_crc32 >= 0) jf["header_crc32"] = f.header_crc32;  // absent, as older indexes, when unknown
    files.push_back(jf);
  }
  j["files"] = files;
  if (ix.data) {
    j["data"] = {{"samples_consumed", ix.data->samples_consumed},
                 {"epoch", ix.data->samples_per_epoch > 0 ? ix.data->samples_consumed / ix.data->samples_per_epoch : 0},
                 {"seed", std::to_string(ix.data->seed)},
                 {"samples_per_epoch", ix.data->samples_per_epoch},
                 {"global_batch", ix.data->global_batch}};
  }
  return j;
}

int64_t IndexCrc(json j) {
  j.erase(kIndexCrcKey);
  const std::string text = j.dump();
  return Crc32(text.data(), text.size());
}

// Field access that turns every malformation into DataLoss naming the field.
class JsonReader {
 public:
  explicit JsonReader(std::string where) : where_(std::move(where)) {}
  Status Error(const std::string& what) const { return DataLossError(where_ + ": " + what); }

  StatusOr<const json*> Field(const json& obj, const char* key, const std::string& ctx) const {
    if (!obj.is_object()) return Error(ctx + " is not an object");
    auto it = obj.find(key);
    if (it == obj.end()) return Error(ctx + " has no \"" + key + "\"");
    return &*it;
  }
  StatusOr<int64_t> Int(const json& obj, const char* key, const std::string& ctx, int64_t min = 0) const {
    SK_ASSIGN_OR_RETURN(const json* v, Field(obj, key, ctx));
    if (!v->is_number_integer()) return Error(ctx + "." + key + " is not an integer");
    int64_t x = v->get<int64_t>();
    if (x < min) {
      return Error(ctx + "." + key + " is " + std::to_string(x) + ", below " + std::to_string(min));
    }
    return x;
  }
  StatusOr<std::string> Str(const json& obj, const char* key, const std::string& ctx) const {
    SK_ASSIGN_OR_RETURN(const json* v, Field(obj, key, ctx));
    if (!v->is_string()) return Error(ctx + "." + key + " is not a string");
    return v->get<std::string>();
  }
  StatusOr<const json*> Array(const json& obj, const char* key, const std::string& ctx) const {
    SK_ASSIGN_OR_RETURN(const json* v, Field(obj, key, ctx));
    if (!v->is_array()) return Error(ctx + "." + key + " is not an array");
    return v;
  }

 private:
  std::string where_;
};

StatusOr<CheckpointIndex> ParseIndex(const std::string& path, const std::string& text) {
  JsonReader r("'" + path + "'");
  SK_RETURN_IF_ERROR(CheckJsonNesting(text, kMaxIndexNesting, "'" + path + "'"));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return r.Error("not valid JSON (corrupt or truncated)");
  SK_ASSIGN_OR_RETURN(int64_t crc, r.Int(j, kIndexCrcKey, "index"));
  if (crc != IndexCrc(j)) {
    return r.Error("checksum mismatch (stored " + std::to_string(crc) + ", computed " +
                   std::to_string(IndexCrc(j)) + "): the index is corrupt");
  }
  CheckpointIndex ix;
  SK_ASSIGN_OR_RETURN(std::string format, r.Str(j, "format", "index"));
  if (format != kIndexFormat) return r.Error("format is '" + format + "', expected '" + kIndexFormat + "'");
  SK_ASSIGN_OR_RETURN(int64_t version, r.Int(j, "format_version", "index", 1));
  if (version != kCheckpointFormatVersion) {
    return r.Error("format_version " + std::to_string(version) + " is not supported (this build reads " +
                   std::to_string(kCheckpointFormatVersion) + ")");
  }
  ix.format_version = static_cast<int>(version);
  SK_ASSIGN_OR_RETURN(ix.checkpoint_id, r.Str(j, "checkpoint_id", "index"));
  SK_ASSIGN_OR_RETURN(ix.model, r.Str(j, "model", "index"));
  SK_ASSIGN_OR_RETURN(int64_t world, r.Int(j, "world_size", "index", 1));
  SK_ASSIGN_OR_RETURN(int64_t group, r.Int(j, "shard_group_size", "index", 1));
  if (world > (1 << 20) || group > world || world % group != 0) {
    return r.Error("shard_group_size " + std::to_string(group) + " does not divide world_size " +
                   std::to_string(world));
  }
  ix.world_size = static_cast<int>(world);
  ix.shard_group_size = static_cast<int>(group);
  SK_ASSIGN_OR_RETURN(ix.strategy, r.Str(j, "strategy", "index"));
  SK_ASSIGN_OR_RETURN(ix.step, r.Int(j, "step", "index"));
  SK_ASSIGN_OR_RETURN(const json* opt, r.Field(j, "optimizer", "index"));
  ix.has_optimizer = !opt->is_null();
  if (ix.has_optimizer) {
    SK_ASSIGN_OR_RETURN(ix.optimizer_kind, r.Str(*opt, "kind", "optimizer"));
    SK_ASSIGN_OR_RETURN(const json* names, r.Array(*opt, "state_names", "optimizer"));
    for (const json& n : *names) {
      if (!n.is_string()) return r.Error("optimizer.state_names holds a non-string");
      ix.optimizer_state_names.push_back(n.get<std::string>());
    }
  }
  SK_ASSIGN_OR_RETURN(const json* units, r.Array(j, "units", "index"));
  for (size_t u = 0; u < units->size(); ++u) {
    const json& ju = (*units)[u];
    const std::string ctx = "units[" + std::to_string(u) + "]";
    CheckpointIndex::Unit unit;
    SK_ASSIGN_OR_RETURN(unit.name, r.Str(ju, "name", ctx));
    SK_ASSIGN_OR_RETURN(unit.unpadded_numel, r.Int(ju, "unpadded_numel", ctx));
    SK_ASSIGN_OR_RETURN(unit.padded_numel, r.Int(ju, "padded_numel", ctx));
    SK_ASSIGN_OR_RETURN(unit.shard_numel, r.Int(ju, "shard_numel", ctx));
    SK_ASSIGN_OR_RETURN(unit.optimizer_step, r.Int(ju, "optimizer_step", ctx));
    if (unit.shard_numel > (int64_t{1} << 40) || unit.shard_numel * group != unit.padded_numel ||
        unit.unpadded_numel > unit.padded_numel) {
      return r.Error(ctx + " ('" + unit.name + "'): sizes are inconsistent (shard " +
                     std::to_string(unit.shard_numel) + " x " + std::to_string(group) + " ranks vs padded " +
                     std::to_string(unit.padded_numel) + ")");
    }
    SK_ASSIGN_OR_RETURN(const json* params, r.Array(ju, "params", ctx));
    for (size_t i = 0; i < params->size(); ++i) {
      const json& jp = (*params)[i];
      const std::string pctx = ctx + ".params[" + std::to_string(i) + "]";
      CheckpointIndex::Param p;
      SK_ASSIGN_OR_RETURN(p.name, r.Str(jp, "name", pctx));
      SK_ASSIGN_OR_RETURN(const json* shape, r.Array(jp, "shape", pctx));
      std::vector<int64_t> dims;
      for (const json& d : *shape) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) {
          return r.Error(pctx + ".shape is not non-negative integers");
        }
        dims.push_back(d.get<int64_t>());
      }
      StatusOr<Shape> s = Shape::Make(dims);
      if (!s.ok()) return r.Error(pctx + ".shape: " + std::string(s.status().message()));
      p.shape = *s;
      SK_ASSIGN_OR_RETURN(p.offset, r.Int(jp, "offset", pctx));
      SK_ASSIGN_OR_RETURN(p.numel, r.Int(jp, "numel", pctx));
      if (p.numel != p.shape.numel() || p.offset > unit.padded_numel ||
          p.numel > unit.padded_numel - p.offset) {
        return r.Error(pctx + " ('" + p.name + "') lies outside its flat parameter");
      }
      unit.params.push_back(std::move(p));
    }
    ix.units.push_back(std::move(unit));
  }
  SK_ASSIGN_OR_RETURN(const json* files, r.Array(j, "files", "index"));
  if (static_cast<int64_t>(files->size()) != group) {
    return r.Error("lists " + std::to_string(files->size()) + " files for a shard group of " +
                   std::to_string(group));
  }
  for (size_t k = 0; k < files->size(); ++k) {
    const std::string ctx = "files[" + std::to_string(k) + "]";
    CheckpointIndex::File f;
    SK_ASSIGN_OR_RETURN(f.name, r.Str((*files)[k], "name", ctx));
    SK_ASSIGN_OR_RETURN(int64_t shard_rank, r.Int((*files)[k], "shard_rank", ctx));
    SK_ASSIGN_OR_RETURN(f.bytes, r.Int((*files)[k], "bytes", ctx));
    if ((*files)[k].is_object() && (*files)[k].contains("header_crc32")) {
      SK_ASSIGN_OR_RETURN(f.header_crc32, r.Int((*files)[k], "header_crc32", ctx));
      if (f.header_crc32 > 0xffffffffll) return r.Error(ctx + ".header_crc32 is not a CRC-32");
    }
    // Only our own names: an index can never point outside its directory.
    if (shard_rank != static_cast<int64_t>(k) || f.name != RankFileName(static_cast<int>(k))) {
      return r.Error(ctx + " is '" + f.name + "' for shard rank " + std::to_string(shard_rank) +
                     ", expected '" + RankFileName(static_cast<int>(k)) + "'");
    }
    f.shard_rank = static_cast<int>(shard_rank);
    ix.files.push_back(std::move(f));
  }
  if (j.contains("data") && !j["data"].is_null()) {
    const json& jd = j["data"];
    CheckpointIndex::DataPosition d;
    SK_ASSIGN_OR_RETURN(d.samples_consumed, r.Int(jd, "samples_consumed", "data"));
    SK_ASSIGN_OR_RETURN(d.samples_per_epoch, r.Int(jd, "samples_per_epoch", "data", 1));
    SK_ASSIGN_OR_RETURN(d.global_batch, r.Int(jd, "global_batch", "data", 1));
    SK_ASSIGN_OR_RETURN(std::string seed, r.Str(jd, "seed", "data"));
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(seed.c_str(), &end, 10);
    if (seed.empty() || seed[0] < '0' || seed[0] > '9' || *end != '\0' || errno == ERANGE) {
      return r.Error("data.seed '" + seed + "' is not an unsigned 64-bit decimal");
    }
    d.seed = v;
    ix.data = d;
  }
  return ix;
}


}  // namespace

std::string CheckpointRankFileName(int shard_rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", shard_rank);
  return buf;
}

StatusOr<CheckpointIndex> ParseCheckpointIndex(const std::string& path, const std::string& text) {
  return ParseIndex(path, text);
}

std::string SerializeCheckpointIndex(const CheckpointIndex& ix, const OptimizerOptions* opt) {
  json j = IndexToJson(ix, opt);
  j[kIndexCrcKey] = IndexCrc(j);
  return j.dump(1) + "\n";
}


StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& dir_in) {
  const std::string path = StripTrailingSlashes(dir_in) + "/" + kCheckpointIndexName;
  SK_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(path, kMaxIndexBytes, "checkpoint index"));
  return ParseIndex(path, text);
}

}  // namespace sk
