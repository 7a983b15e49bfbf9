#include "runtime/fsdp/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/core/allocator.h"
#include "runtime/device/device.h"
#include "runtime/fsdp/safetensors.h"

namespace sk {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kIndexName[] = "index.json";
constexpr char kIndexFormat[] = "shardkit.sharded_checkpoint";
constexpr char kFullStateDictKind[] = "full_state_dict";
// CRC-32 of the index's compact JSON without this key: a flipped digit in a
// step or size would otherwise still parse.
constexpr char kIndexCrcKey[] = "index_crc32";
// Longest error message carried between ranks; longer ones are cut.
constexpr size_t kMaxMessageBytes = 1024;

std::string ErrnoText() { return std::strerror(errno); }

std::string RankFileName(int shard_rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", shard_rank);
  return buf;
}

std::string MasterName(int unit) { return "units." + std::to_string(unit) + ".master"; }
std::string OptimName(int unit, const std::string& state) {
  return "units." + std::to_string(unit) + ".optim." + state;
}

const char* OptimizerKindName(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSgd: return "SGD";
    case OptimizerKind::kAdam: return "ADAM";
    case OptimizerKind::kDefault:
    case OptimizerKind::kAdamW: return "ADAMW";
  }
  return "UNKNOWN";
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string s = "{";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "}";
}

std::string StripTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string ParentDir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return UnavailableError("cannot open '" + path + "' to fsync: " + ErrnoText());
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return UnavailableError("fsync of '" + path + "' failed: " + ErrnoText());
  return OkStatus();
}

// Writes `text` to `path` through a temporary file, fsync and rename.
Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return UnavailableError("cannot create '" + tmp + "': " + ErrnoText());
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      Status s = UnavailableError("write to '" + tmp + "' failed: " + ErrnoText());
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    Status s = UnavailableError("fsync/close of '" + tmp + "' failed: " + ErrnoText());
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = UnavailableError("rename '" + tmp + "' -> '" + path + "' failed: " + ErrnoText());
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncPath(ParentDir(path));
}

// Puts directory `tmp` at `dir`. An existing `dir` is swapped out in one
// atomic step (RENAME_EXCHANGE) and then removed, so at every instant `dir`
// is either the complete old checkpoint or the complete new one.
Status SwapDirectoryIntoPlace(const std::string& tmp, const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      return UnavailableError("rename '" + tmp + "' -> '" + dir + "' failed: " + ErrnoText());
    }
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now the old checkpoint; a leftover is harmless
  } else if (errno == EINVAL || errno == ENOSYS) {
    // Filesystems without RENAME_EXCHANGE: a short window where only
    // "<dir>.old" holds the previous checkpoint.
    const std::string old = dir + ".old";
    fs::remove_all(old, ec);
    if (::rename(dir.c_str(), old.c_str()) != 0) {
      return UnavailableError("rename '" + dir + "' -> '" + old + "' failed: " + ErrnoText());
    }
    if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      Status s = UnavailableError("rename '" + tmp + "' -> '" + dir + "' failed: " + ErrnoText());
      if (::rename(old.c_str(), dir.c_str()) != 0) {
        return s.WithContext("previous checkpoint left at '" + old + "'");
      }
      return s;
    }
    fs::remove_all(old, ec);
  } else {
    return UnavailableError("exchanging '" + tmp + "' and '" + dir + "' failed: " + ErrnoText());
  }
  return FsyncPath(ParentDir(dir));
}

// Collective agreement over all ranks of a FullyShardedModel: an all-gather
// inside the shard group, then one across replicas, so every rank learns the
// first error anywhere (or rank 0's value) without a world group handle.
// Messages travel as f32 [code, length, bytes...]: every byte is exact in f32.
class RankAgreement {
 public:
  static StatusOr<std::unique_ptr<RankAgreement>> Create(FullyShardedModel& f) {
    const DeviceId id = f.activation_allocator().device();
    SK_ASSIGN_OR_RETURN(Device * device, Device::Get(id));
    std::unique_ptr<RankAgreement> a(new RankAgreement(f));
    SK_ASSIGN_OR_RETURN(a->stream_,
                        device->CreateStream("checkpoint (rank " + std::to_string(f.rank()) + ")"));
    return a;
  }

  // OK on every rank if `mine` is OK on every rank; otherwise every rank gets
  // an error: its own, or the first failing rank's.
  Status Agree(const Status& mine) {
    Message m;
    if (!mine.ok()) {
      m = {static_cast<int>(mine.code()),
           "rank " + std::to_string(f_.rank()) + ": " + std::string(mine.message())};
    }
    StatusOr<Message> all = Combine(m, /*first_error=*/true);
    if (!all.ok()) return all.status().WithContext("checkpoint: agreeing across ranks");
    if (!mine.ok()) return mine;
    return Status(static_cast<StatusCode>(all->code), all->text);
  }

  // World rank 0's `value`, on every rank.
  StatusOr<std::string> FromRankZero(const std::string& value) {
    SK_ASSIGN_OR_RETURN(Message m, Combine(Message{0, value}, /*first_error=*/false));
    return m.text;
  }

 private:
  struct Message {
    int code = 0;
    std::string text;
  };
  static constexpr int64_t kFloats = 2 + kMaxMessageBytes;

  explicit RankAgreement(FullyShardedModel& f) : f_(f) {}

  StatusOr<Message> Combine(Message m, bool first_error) {
    SK_ASSIGN_OR_RETURN(m, GatherAndPick(f_.shard_group(), m, first_error));
    if (f_.replicate_group() != nullptr) {
      SK_ASSIGN_OR_RETURN(m, GatherAndPick(*f_.replicate_group(), m, first_error));
    }
    return m;
  }

  StatusOr<Message> GatherAndPick(comm::ProcessGroup& g, const Message& m, bool first_error) {
    Allocator& host = HostAllocator::Default();
    SK_ASSIGN_OR_RETURN(Tensor in, host.Empty(DType::kF32, Shape{kFloats}));
    SK_ASSIGN_OR_RETURN(Tensor out, host.Empty(DType::kF32, Shape{kFloats * g.size()}));
    float* p = in.data_as<float>();
    const size_t len = std::min(m.text.size(), kMaxMessageBytes);
    std::fill(p, p + kFloats, 0.f);
    p[0] = static_cast<float>(m.code);
    p[1] = static_cast<float>(len);
    for (size_t i = 0; i < len; ++i) p[2 + i] = static_cast<unsigned char>(m.text[i]);
    comm::CollectiveOptions co;
    co.timeout = f_.options().timeout;
    SK_ASSIGN_OR_RETURN(auto work, g.all_gather(out, in, *stream_, co));
    SK_RETURN_IF_ERROR(work->wait(f_.options().timeout));
    int pick = 0;
    if (first_error) {
      for (int r = 0; r < g.size(); ++r) {
        if (out.data_as<float>()[r * kFloats] != 0.f) {
          pick = r;
          break;
        }
      }
    }
    const float* q = out.data_as<float>() + pick * kFloats;
    Message result;
    result.code = static_cast<int>(q[0]);
    const size_t n = std::min(static_cast<size_t>(q[1]), kMaxMessageBytes);
    for (size_t i = 0; i < n; ++i)
      result.text.push_back(static_cast<char>(static_cast<unsigned char>(q[2 + i])));
    return result;
  }

  FullyShardedModel& f_;
  std::unique_ptr<Stream> stream_;
};

Status ValidateState(const TrainingState& state, const char* call) {
  if (state.fsdp == nullptr || state.units == nullptr) {
    return InvalidArgumentError(std::string(call) + ": TrainingState needs units and fsdp");
  }
  const FullyShardedModel& f = *state.fsdp;
  const std::vector<UnitSpec>& units = *state.units;
  if (static_cast<int>(units.size()) != f.num_units()) {
    return InvalidArgumentError(std::string(call) + ": " + std::to_string(units.size()) +
                                " units given, the model has " + std::to_string(f.num_units()));
  }
  for (int u = 0; u < f.num_units(); ++u) {
    const auto& params = f.layout(u).params();
    if (units[u].params.size() != params.size()) {
      return InvalidArgumentError(std::string(call) + ": unit '" + units[u].name +
                                  "' does not match the model's unit " + std::to_string(u));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (units[u].params[i].name != params[i].name || units[u].params[i].shape != params[i].shape) {
        return InvalidArgumentError(std::string(call) + ": parameter '" +
                                    FullParamName(units[u], units[u].params[i]) +
                                    "' does not match the model's '" + params[i].name + "'");
      }
    }
  }
  return OkStatus();
}

bool IsWriter(FullyShardedModel& f) {
  return f.replicate_group() == nullptr || f.replicate_group()->rank() == 0;
}

std::string NewCheckpointId() {
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(t),
                static_cast<unsigned long long>(r & 0xffffffffu));
  return buf;
}

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
          {{"name", p.name}, {"shape", p.shape.dims()}, {"offset", p.offset}, {"numel", p.numel}});
    }
    ju["params"] = params;
    units.push_back(ju);
  }
  j["units"] = units;
  json files = json::array();
  for (const auto& f : ix.files)
    files.push_back({{"name", f.name}, {"shard_rank", f.shard_rank}, {"bytes", f.bytes}});
  j["files"] = files;
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
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  JsonReader r("'" + path + "'");
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
    // Only our own names: an index can never point outside its directory.
    if (shard_rank != static_cast<int64_t>(k) || f.name != RankFileName(static_cast<int>(k))) {
      return r.Error(ctx + " is '" + f.name + "' for shard rank " + std::to_string(shard_rank) +
                     ", expected '" + RankFileName(static_cast<int>(k)) + "'");
    }
    f.shard_rank = static_cast<int>(shard_rank);
    ix.files.push_back(std::move(f));
  }
  return ix;
}

// The model's side of an index: what this rank would write.
CheckpointIndex IndexOf(const TrainingState& state, int64_t step) {
  FullyShardedModel& f = *state.fsdp;
  CheckpointIndex ix;
  ix.model = state.model_name;
  ix.world_size = f.world_size();
  ix.shard_group_size = f.shard_group_size();
  ix.strategy = ShardingStrategyName(f.options().strategy);
  ix.step = step;
  ix.has_optimizer = state.optimizer != nullptr;
  if (ix.has_optimizer) {
    ix.optimizer_kind = OptimizerKindName(state.optimizer->options().kind);
    ix.optimizer_state_names = state.optimizer->StateNames();
  }
  for (int u = 0; u < f.num_units(); ++u) {
    const FlatParamLayout& l = f.layout(u);
    CheckpointIndex::Unit unit;
    unit.name = (*state.units)[u].name;
    unit.unpadded_numel = l.unpadded_numel();
    unit.padded_numel = l.padded_numel();
    unit.shard_numel = l.shard_numel();
    unit.optimizer_step = state.optimizer ? state.optimizer->step_count(u) : 0;
    for (const auto& p : l.params()) unit.params.push_back({p.name, p.shape, p.offset, p.numel});
    ix.units.push_back(std::move(unit));
  }
  return ix;
}

// InvalidArgument naming the first unit or parameter where the checkpoint
// and the model differ.
Status CheckSameModel(const CheckpointIndex& ix, const TrainingState& state) {
  const FullyShardedModel& f = *state.fsdp;
  const auto& units = *state.units;
  const size_t n = std::min(ix.units.size(), units.size());
  for (size_t u = 0; u < n; ++u) {
    const auto& cu = ix.units[u];
    const auto& mp = f.layout(static_cast<int>(u)).params();
    if (cu.name != units[u].name) {
      return InvalidArgumentError("checkpoint unit " + std::to_string(u) + " is '" + cu.name +
                                  "', the model's is '" + units[u].name + "'");
    }
    const size_t np = std::min(cu.params.size(), mp.size());
    for (size_t i = 0; i < np; ++i) {
      const auto& cp = cu.params[i];
      const std::string full = units[u].name + "." + mp[i].name;
      if (cp.name != mp[i].name) {
        return InvalidArgumentError("parameter " + std::to_string(i) + " of unit '" + cu.name + "' is '" +
                                    cp.name + "' in the checkpoint but '" + full + "' in the model");
      }
      if (cp.shape != mp[i].shape) {
        return InvalidArgumentError("parameter '" + full + "' has shape " + cp.shape.ToString() +
                                    " in the checkpoint but " + mp[i].shape.ToString() + " in the model");
      }
      if (cp.offset != mp[i].offset) {
        return InvalidArgumentError("parameter '" + full + "' is at flat offset " +
                                    std::to_string(cp.offset) + " in the checkpoint but " +
                                    std::to_string(mp[i].offset) + " in the model");
      }
    }
    if (cu.params.size() != mp.size()) {
      const std::string extra = cu.params.size() > mp.size()
                                    ? "checkpoint parameter '" + cu.name + "." + cu.params[np].name + "'"
                                    : "model parameter '" + units[u].name + "." + mp[np].name + "'";
      return InvalidArgumentError(extra + " has no counterpart (unit '" + cu.name + "' has " +
                                  std::to_string(cu.params.size()) + " parameters in the checkpoint, " +
                                  std::to_string(mp.size()) + " in the model)");
    }
  }
  if (ix.units.size() != units.size()) {
    return InvalidArgumentError("the checkpoint has " + std::to_string(ix.units.size()) +
                                " units, the model " + std::to_string(units.size()));
  }
  if (state.optimizer != nullptr && ix.has_optimizer &&
      ix.optimizer_state_names != state.optimizer->StateNames()) {
    return InvalidArgumentError("the checkpoint's optimizer (" + ix.optimizer_kind + ") has state " +
                                JoinNames(ix.optimizer_state_names) + ", this optimizer (" +
                                OptimizerKindName(state.optimizer->options().kind) + ") has " +
                                JoinNames(state.optimizer->StateNames()));
  }
  return OkStatus();
}

// Everything a load brings in, in this rank's new shard space, before it
// touches the live model.
struct LoadedShards {
  std::vector<std::vector<float>> master;  // [unit][shard elem]
  bool has_optimizer = false;
  std::vector<std::vector<std::vector<float>>> optim;  // [unit][state][shard elem]
  std::vector<int64_t> optimizer_step;                 // [unit]
  int64_t step = 0;
};

// Applies loaded shards to the live model and optimizer. Sizes were checked
// while reading, so only a collective (persistent strategies re-gather) or an
// allocation can fail here.
Status Commit(const TrainingState& state, LoadedShards& loaded) {
  FullyShardedModel& f = *state.fsdp;
  for (int u = 0; u < f.num_units(); ++u) {
    SK_RETURN_IF_ERROR(
        f.LoadMasterShard(u, loaded.master[u].data(), static_cast<int64_t>(loaded.master[u].size()))
            .WithContext("committing a loaded checkpoint"));
  }
  if (loaded.has_optimizer && state.optimizer != nullptr) {
    for (int u = 0; u < f.num_units(); ++u) {
      const int64_t n = f.layout(u).shard_numel();
      std::vector<Tensor> tensors;
      for (auto& v : loaded.optim[u]) {
        SK_ASSIGN_OR_RETURN(Tensor t, Tensor::Wrap(v.data(), DType::kF32, Shape{n}));
        tensors.push_back(std::move(t));
      }
      SK_RETURN_IF_ERROR(state.optimizer->LoadState(u, n, loaded.optimizer_step[u], tensors)
                             .WithContext("committing a loaded checkpoint (the model is partly restored)"));
    }
  }
  return OkStatus();
}

// Reads this rank's new shards from the files of a sharded checkpoint.
Status ReadShards(const std::string& dir, const CheckpointIndex& ix, const TrainingState& state,
                  LoadedShards* out) {
  FullyShardedModel& f = *state.fsdp;
  const int new_rank = f.shard_group().rank();
  const bool want_optim = state.optimizer != nullptr && ix.has_optimizer;
  const size_t num_states = want_optim ? ix.optimizer_state_names.size() : 0;
  const int num_units = f.num_units();
  out->has_optimizer = want_optim;
  out->step = ix.step;
  out->master.assign(num_units, {});
  out->optim.assign(num_units, {});
  out->optimizer_step.assign(num_units, 0);
  std::vector<int64_t> begin(num_units);
  for (int u = 0; u < num_units; ++u) {
    const int64_t s = f.layout(u).shard_numel();
    begin[u] = new_rank * s;
    out->master[u].assign(static_cast<size_t>(s), 0.f);
    out->optim[u].assign(num_states, std::vector<float>(static_cast<size_t>(s), 0.f));
    out->optimizer_step[u] = ix.units[u].optimizer_step;
  }
  for (const auto& file : ix.files) {
    const int k = file.shard_rank;
    bool needed = false;
    for (int u = 0; u < num_units; ++u) {
      const int64_t old_s = ix.units[u].shard_numel;
      const int64_t lo = std::max(begin[u], k * old_s);
      const int64_t hi = std::min(begin[u] + f.layout(u).shard_numel(), (k + 1) * old_s);
      needed = needed || lo < hi;
    }
    if (!needed) continue;
    const std::string path = dir + "/" + file.name;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return NotFoundError("checkpoint file '" + path + "' is missing (listed in the index)");
    }
    if (static_cast<int64_t>(st.st_size) != file.bytes) {
      return DataLossError("checkpoint file '" + path + "' is " + std::to_string(st.st_size) +
                           " bytes, the index says " + std::to_string(file.bytes) +
                           " (truncated or replaced)");
    }
    SK_ASSIGN_OR_RETURN(SafeTensorsFile sf, SafeTensorsFile::Read(path));
    auto id = sf.metadata().find("checkpoint_id");
    if (id == sf.metadata().end() || id->second != ix.checkpoint_id) {
      return DataLossError("checkpoint file '" + path + "' belongs to another checkpoint (id '" +
                           (id == sf.metadata().end() ? std::string("none") : id->second) + "', index '" +
                           ix.checkpoint_id + "')");
    }
    // Copies flat elements [lo, hi) of tensor `name` (old shard k) into `dst`.
    auto copy = [&](int u, const std::string& name, std::vector<float>& dst) -> Status {
      const int64_t old_s = ix.units[u].shard_numel;
      StatusOr<SafeTensorsFile::Info> info = sf.info(name);
      if (!info.ok()) return DataLossError("checkpoint file '" + path + "' lacks tensor '" + name + "'");
      if (info->dtype != DType::kF32 || info->shape != Shape{old_s}) {
        return DataLossError("tensor '" + name + "' in '" + path + "' is " +
                             std::string(DTypeName(info->dtype)) + info->shape.ToString() +
                             ", the index says f32[" + std::to_string(old_s) + "]");
      }
      const int64_t lo = std::max(begin[u], k * old_s);
      const int64_t hi = std::min(begin[u] + f.layout(u).shard_numel(), (k + 1) * old_s);
      if (lo >= hi) return OkStatus();
      SK_ASSIGN_OR_RETURN(const void* data, sf.data(name));
      std::memcpy(dst.data() + (lo - begin[u]), static_cast<const float*>(data) + (lo - k * old_s),
                  static_cast<size_t>(hi - lo) * sizeof(float));
      return OkStatus();
    };
    for (int u = 0; u < num_units; ++u) {
      SK_RETURN_IF_ERROR(copy(u, MasterName(u), out->master[u]));
      if (want_optim && ix.units[u].optimizer_step > 0) {
        for (size_t i = 0; i < num_states; ++i) {
          SK_RETURN_IF_ERROR(copy(u, OptimName(u, ix.optimizer_state_names[i]), out->optim[u][i]));
        }
      }
    }
  }
  return OkStatus();
}

Status CheckWritableCheckpointDir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return OkStatus();
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgumentError("'" + dir + "' exists and is not a directory; not overwriting it");
  }
  if (!fs::is_empty(dir, ec) && !fs::exists(dir + "/" + kIndexName, ec)) {
    return InvalidArgumentError("'" + dir + "' is a non-empty directory without " + kIndexName +
                                " (not a checkpoint); not overwriting it");
  }
  return OkStatus();
}

// Rank 0's part of a save before anyone writes: check the target and make a
// fresh temporary directory.
Status PrepareTempDir(const std::string& dir, const std::string& tmp) {
  SK_RETURN_IF_ERROR(CheckWritableCheckpointDir(dir));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec) return UnavailableError("cannot remove stale '" + tmp + "': " + ec.message());
  fs::create_directories(tmp, ec);
  if (ec) return UnavailableError("cannot create '" + tmp + "': " + ec.message());
  return OkStatus();
}

Status WriteRankFile(const std::string& tmp, const TrainingState& state, const std::string& id, int64_t step,
                     const CheckpointOptions& options) {
  FullyShardedModel& f = *state.fsdp;
  const int shard_rank = f.shard_group().rank();
  std::vector<SafeTensorsEntry> entries;
  std::vector<Tensor> keep;  // optimizer state tensors stay alive until written
  for (int u = 0; u < f.num_units(); ++u) {
    const int64_t n = f.layout(u).shard_numel();
    entries.push_back({MasterName(u), DType::kF32, Shape{n}, f.master_shard(u).data()});
    if (state.optimizer != nullptr && state.optimizer->step_count(u) > 0) {
      for (const std::string& name : state.optimizer->StateNames()) {
        SK_ASSIGN_OR_RETURN(Tensor t, state.optimizer->State(u, name));
        if (t.dtype() != DType::kF32 || t.numel() != n) {
          return InternalError("optimizer state '" + name + "' of unit " + std::to_string(u) + " is " +
                               t.ToString() + ", expected f32[" + std::to_string(n) + "]");
        }
        entries.push_back({OptimName(u, name), DType::kF32, Shape{n}, t.data()});
        keep.push_back(std::move(t));
      }
    }
  }
  std::map<std::string, std::string> meta = {
      {"checkpoint_id", id},
      {"shard_rank", std::to_string(shard_rank)},
      {"shard_group_size", std::to_string(f.shard_group_size())},
      {"step", std::to_string(step)},
  };
  const std::string path = tmp + "/" + RankFileName(shard_rank);
  SK_RETURN_IF_ERROR(WriteSafeTensors(path, entries, meta));
  if (options.on_file_written) SK_RETURN_IF_ERROR(options.on_file_written(path));
  return OkStatus();
}

Status WriteIndex(const std::string& tmp, const TrainingState& state, const std::string& id, int64_t step) {
  CheckpointIndex ix = IndexOf(state, step);
  ix.checkpoint_id = id;
  for (int k = 0; k < ix.shard_group_size; ++k) {
    CheckpointIndex::File file;
    file.name = RankFileName(k);
    file.shard_rank = k;
    struct stat st;
    const std::string path = tmp + "/" + file.name;
    if (::stat(path.c_str(), &st) != 0) {
      return UnavailableError("'" + path + "' written by shard rank " + std::to_string(k) +
                              " is not visible to rank 0 (is the directory on a shared filesystem?)");
    }
    file.bytes = static_cast<int64_t>(st.st_size);
    ix.files.push_back(std::move(file));
  }
  json j = IndexToJson(ix, state.optimizer ? &state.optimizer->options() : nullptr);
  j[kIndexCrcKey] = IndexCrc(j);
  return WriteFileAtomic(tmp + "/" + kIndexName, j.dump(1) + "\n");
}

StatusOr<std::vector<float>> WidenToF32(const SafeTensorsFile& sf, const std::string& name, const Shape& want,
                                        const std::string& path, const std::string& what) {
  SK_ASSIGN_OR_RETURN(SafeTensorsFile::Info info, sf.info(name));
  if (info.shape != want) {
    return InvalidArgumentError(what + " '" + name + "' has shape " + info.shape.ToString() + " in '" + path +
                                "' but " + want.ToString() + " in the model");
  }
  SK_ASSIGN_OR_RETURN(const void* data, sf.data(name));
  const size_t n = static_cast<size_t>(want.numel());
  std::vector<float> out(n);
  switch (info.dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), data, n * sizeof(float));
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) out[i] = BF16ToFloat(static_cast<const BF16*>(data)[i]);
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = F16ToFloat(static_cast<const F16*>(data)[i]);
      break;
    case DType::kInvalid:
      return InvalidArgumentError(what + " '" + name + "' in '" + path + "' has an invalid dtype");
  }
  return out;
}

std::string FullOptimName(const std::string& state_name, const std::string& param) {
  return "optimizer." + state_name + "." + param;
}

// Builds this rank's shards from a full state dict file.
Status ReadFullStateDict(const std::string& path, const TrainingState& state, LoadedShards* out) {
  FullyShardedModel& f = *state.fsdp;
  const auto& units = *state.units;
  SK_ASSIGN_OR_RETURN(SafeTensorsFile sf, SafeTensorsFile::Read(path));
  const auto& meta = sf.metadata();
  auto get = [&](const std::string& key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  auto parse_int = [&](const std::string& key, int64_t* v) -> Status {
    const std::string s = get(key);
    if (s.empty()) return OkStatus();
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || end == s.c_str() || *end != '\0' || x < 0) {
      return DataLossError("'" + path + "': metadata '" + key + "' is '" + s + "', not a step count");
    }
    *v = x;
    return OkStatus();
  };
  out->step = 0;
  SK_RETURN_IF_ERROR(parse_int("shardkit.step", &out->step));

  // Optimizer state is restored only if the file has it and we have an optimizer.
  std::vector<std::string> file_states;
  const bool file_has_optim = meta.count("shardkit.optimizer.state_names") != 0;
  if (file_has_optim) {
    std::stringstream ss(get("shardkit.optimizer.state_names"));
    for (std::string s; std::getline(ss, s, ',');) {
      if (!s.empty()) file_states.push_back(s);
    }
  }
  out->has_optimizer = file_has_optim && state.optimizer != nullptr;
  if (out->has_optimizer && file_states != state.optimizer->StateNames()) {
    return InvalidArgumentError("'" + path + "': the optimizer state " + JoinNames(file_states) +
                                " does not match this optimizer's " +
                                JoinNames(state.optimizer->StateNames()));
  }

  std::set<std::string> expected;
  const int shard_rank = f.shard_group().rank();
  out->master.assign(f.num_units(), {});
  out->optim.assign(f.num_units(), {});
  out->optimizer_step.assign(f.num_units(), 0);
  for (int u = 0; u < f.num_units(); ++u) {
    const FlatParamLayout& l = f.layout(u);
    const auto slices = l.ShardSlices(shard_rank);
    out->master[u].assign(static_cast<size_t>(l.shard_numel()), 0.f);
    int64_t ostep = 0;
    if (file_has_optim) SK_RETURN_IF_ERROR(parse_int("shardkit.optimizer.step." + std::to_string(u), &ostep));
    out->optimizer_step[u] = ostep;
    if (out->has_optimizer) {
      out->optim[u].assign(file_states.size(), std::vector<float>(static_cast<size_t>(l.shard_numel()), 0.f));
    }
    // Reads `name` (the full tensor of parameter p) into this rank's slices of `dst`.
    auto take = [&](const std::string& name, int p, const std::string& what,
                    std::vector<float>& dst) -> Status {
      if (!sf.contains(name)) {
        return InvalidArgumentError(what + " '" + name + "' is missing from '" + path + "'");
      }
      SK_ASSIGN_OR_RETURN(std::vector<float> full, WidenToF32(sf, name, l.params()[p].shape, path, what));
      for (const auto& s : slices) {
        if (s.param != p) continue;
        std::copy(full.begin() + s.param_begin, full.begin() + s.param_end, dst.begin() + s.shard_offset);
      }
      return OkStatus();
    };
    for (size_t p = 0; p < l.params().size(); ++p) {
      const std::string name = FullParamName(units[u], units[u].params[p]);
      expected.insert(name);
      SK_RETURN_IF_ERROR(take(name, static_cast<int>(p), "parameter", out->master[u]));
      if (file_has_optim && ostep > 0) {
        for (size_t i = 0; i < file_states.size(); ++i) {
          const std::string oname = FullOptimName(file_states[i], name);
          expected.insert(oname);
          if (!out->has_optimizer) continue;
          SK_RETURN_IF_ERROR(take(oname, static_cast<int>(p), "optimizer state", out->optim[u][i]));
        }
      }
    }
  }
  for (const std::string& name : sf.names()) {
    if (expected.count(name) == 0) {
      return InvalidArgumentError("tensor '" + name + "' in '" + path + "' is not a parameter of this model");
    }
  }
  return OkStatus();
}

// All-gathers a flat shard of `f`'s unit `unit` (f32, shard_numel elements)
// into a full flat buffer.
StatusOr<Tensor> GatherFlat(FullyShardedModel& f, Stream& stream, int unit, const float* shard) {
  const FlatParamLayout& l = f.layout(unit);
  Allocator& host = HostAllocator::Default();
  SK_ASSIGN_OR_RETURN(Tensor in, host.Empty(DType::kF32, Shape{l.shard_numel()}));
  SK_ASSIGN_OR_RETURN(Tensor out, host.Empty(DType::kF32, Shape{l.padded_numel()}));
  if (in.nbytes() > 0) std::memcpy(in.data(), shard, in.nbytes());
  comm::CollectiveOptions co;
  co.timeout = f.options().timeout;
  SK_ASSIGN_OR_RETURN(auto work, f.shard_group().all_gather(out, in, stream, co));
  SK_RETURN_IF_ERROR(work->wait(f.options().timeout).WithContext("gathering unit " + std::to_string(unit)));
  return out;
}

}  // namespace

StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& dir_in) {
  const std::string path = StripTrailingSlashes(dir_in) + "/" + kIndexName;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return NotFoundError("checkpoint index '" + path + "' does not exist");
    return UnavailableError("cannot read '" + path + "'");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseIndex(path, ss.str());
}

Status SaveShardedCheckpoint(const std::string& dir_in, const TrainingState& state, int64_t step,
                             const CheckpointOptions& options) {
  SK_RETURN_IF_ERROR(ValidateState(state, "SaveShardedCheckpoint"));
  if (step < 0) return InvalidArgumentError("SaveShardedCheckpoint: negative step " + std::to_string(step));
  if (dir_in.empty()) return InvalidArgumentError("SaveShardedCheckpoint: empty directory name");
  FullyShardedModel& f = *state.fsdp;
  const std::string dir = StripTrailingSlashes(dir_in);
  const std::string tmp = dir + ".tmp";
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(f));
  const bool root = f.rank() == 0;

  SK_RETURN_IF_ERROR(sync->Agree(root ? PrepareTempDir(dir, tmp) : OkStatus()));
  SK_ASSIGN_OR_RETURN(std::string id, sync->FromRankZero(root ? NewCheckpointId() : std::string()));
  Status wrote = IsWriter(f) ? WriteRankFile(tmp, state, id, step, options) : OkStatus();
  Status s = sync->Agree(wrote);
  if (s.ok()) {
    Status committed;
    if (root) {
      committed = WriteIndex(tmp, state, id, step);
      if (committed.ok()) committed = SwapDirectoryIntoPlace(tmp, dir);
    }
    s = sync->Agree(committed);
  }
  if (!s.ok() && root) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  return s.WithContext("saving checkpoint '" + dir + "' (the previous one, if any, is intact)");
}

StatusOr<int64_t> LoadShardedCheckpoint(const std::string& dir_in, const TrainingState& state) {
  SK_RETURN_IF_ERROR(ValidateState(state, "LoadShardedCheckpoint"));
  FullyShardedModel& f = *state.fsdp;
  const std::string dir = StripTrailingSlashes(dir_in);
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(f));
  LoadedShards loaded;
  Status read = [&]() -> Status {
    SK_ASSIGN_OR_RETURN(CheckpointIndex ix, ReadCheckpointIndex(dir));
    SK_RETURN_IF_ERROR(CheckSameModel(ix, state));
    return ReadShards(dir, ix, state, &loaded);
  }();
  SK_RETURN_IF_ERROR(sync->Agree(read).WithContext("loading checkpoint '" + dir + "' (nothing was changed)"));
  SK_RETURN_IF_ERROR(sync->Agree(Commit(state, loaded)));
  return loaded.step;
}

Status SaveFullStateDict(const std::string& path, const TrainingState& state, int64_t step) {
  SK_RETURN_IF_ERROR(ValidateState(state, "SaveFullStateDict"));
  if (step < 0) return InvalidArgumentError("SaveFullStateDict: negative step " + std::to_string(step));
  FullyShardedModel& f = *state.fsdp;
  const auto& units = *state.units;
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(f));
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(f.activation_allocator().device()));
  SK_ASSIGN_OR_RETURN(auto stream,
                      device->CreateStream("full state dict (rank " + std::to_string(f.rank()) + ")"));
  const bool root = f.rank() == 0;
  std::vector<std::string> state_names =
      state.optimizer ? state.optimizer->StateNames() : std::vector<std::string>{};

  // Every rank makes the same sequence of gathers (decided by step counts,
  // which all ranks share); a local failure is carried to the agreement.
  Status local;
  std::vector<Tensor> flats;  // rank 0's, alive until written
  std::vector<SafeTensorsEntry> entries;
  std::map<std::string, std::string> meta = {
      {"shardkit.kind", kFullStateDictKind},
      {"shardkit.format_version", std::to_string(kCheckpointFormatVersion)},
      {"shardkit.model", state.model_name},
      {"shardkit.step", std::to_string(step)}};
  auto add = [&](const Tensor& flat, int u, const std::string& prefix) {
    for (size_t p = 0; p < units[u].params.size(); ++p) {
      const auto& lp = f.layout(u).params()[p];
      entries.push_back({prefix + FullParamName(units[u], units[u].params[p]), DType::kF32, lp.shape,
                         flat.data_as<float>() + lp.offset});
    }
  };
  for (int u = 0; u < f.num_units(); ++u) {
    SK_ASSIGN_OR_RETURN(Tensor flat, GatherFlat(f, *stream, u, f.master_shard(u).data_as<float>()));
    if (root) {
      add(flat, u, "");
      flats.push_back(std::move(flat));
    }
    if (state.optimizer == nullptr) continue;
    const int64_t ostep = state.optimizer->step_count(u);
    meta["shardkit.optimizer.step." + std::to_string(u)] = std::to_string(ostep);
    if (ostep == 0) continue;
    for (const std::string& name : state_names) {
      std::vector<float> zeros;
      const float* shard = nullptr;
      StatusOr<Tensor> t = state.optimizer->State(u, name);
      if (t.ok() && t->numel() == f.layout(u).shard_numel()) {
        shard = t->data_as<float>();
      } else {
        if (local.ok()) {
          local = t.ok() ? InternalError("optimizer state '" + name + "' has the wrong size") : t.status();
        }
        zeros.assign(static_cast<size_t>(f.layout(u).shard_numel()), 0.f);
        shard = zeros.data();
      }
      SK_ASSIGN_OR_RETURN(Tensor oflat, GatherFlat(f, *stream, u, shard));
      if (root) {
        add(oflat, u, "optimizer." + name + ".");
        flats.push_back(std::move(oflat));
      }
    }
  }
  if (state.optimizer != nullptr) {
    std::string joined;
    for (size_t i = 0; i < state_names.size(); ++i) joined += (i ? "," : "") + state_names[i];
    meta["shardkit.optimizer.kind"] = OptimizerKindName(state.optimizer->options().kind);
    meta["shardkit.optimizer.state_names"] = joined;
  }
  SK_RETURN_IF_ERROR(sync->Agree(local));
  return sync->Agree(root ? WriteSafeTensors(path, entries, meta) : OkStatus())
      .WithContext("saving full state dict '" + path + "'");
}

StatusOr<int64_t> LoadFullStateDict(const std::string& path, const TrainingState& state) {
  SK_RETURN_IF_ERROR(ValidateState(state, "LoadFullStateDict"));
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(*state.fsdp));
  LoadedShards loaded;
  SK_RETURN_IF_ERROR(sync->Agree(ReadFullStateDict(path, state, &loaded))
                         .WithContext("loading full state dict '" + path + "' (nothing was changed)"));
  SK_RETURN_IF_ERROR(sync->Agree(Commit(state, loaded)));
  return loaded.step;
}

}  // namespace sk
