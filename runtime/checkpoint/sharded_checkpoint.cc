#include "runtime/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "runtime/core/file_io.h"
#include "runtime/checkpoint/checkpoint_internal.h"
#include "runtime/checkpoint/rank_agreement.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/ops/ops.h"

// Sharded checkpoints: SaveShardedCheckpoint and LoadShardedCheckpoint (see
// checkpoint.h for the layout on disk, resharding and atomicity).

namespace sk {

namespace {

namespace fs = std::filesystem;
using checkpoint_internal::Commit;
using checkpoint_internal::HostZeros;
using checkpoint_internal::Slice;
using checkpoint_internal::ToHost;
using checkpoint_internal::IsWriter;
using checkpoint_internal::JoinNames;
using checkpoint_internal::LoadedShards;
using checkpoint_internal::MasterName;
using checkpoint_internal::OptimName;
using checkpoint_internal::StripTrailingSlashes;
using checkpoint_internal::ValidateState;

std::string ErrnoText() { return std::strerror(errno); }
std::string RankFileName(int shard_rank) { return CheckpointRankFileName(shard_rank); }

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
  return FsyncPath(ParentDirectory(dir));
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

// The model's side of an index: what this rank would write.
CheckpointIndex IndexOf(const TrainingState& state, int64_t step) {
  FullyShardedModel& f = *state.fsdp;
  CheckpointIndex ix;
  ix.model = state.model_name;
  ix.world_size = f.world_size();
  ix.shard_group_size = f.shard_group_size();
  ix.strategy = ShardingStrategyName(f.options().strategy);
  ix.step = step;
  if (state.data != nullptr) ix.data = *state.data;
  ix.has_optimizer = state.optimizer != nullptr;
  if (ix.has_optimizer) {
    ix.optimizer_kind = state.optimizer->Name();
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

// Where each of the model's units and parameters is in the checkpoint,
// matched by name (a model whose units or parameters are declared in
// another order loads the same values).
struct NameMatch {
  std::vector<int> unit;                // model unit -> checkpoint unit
  std::vector<std::vector<int>> param;  // model unit, parameter -> checkpoint parameter
};

// Matches the model to the checkpoint by unit and parameter name;
// InvalidArgument naming the first model unit or parameter the checkpoint
// lacks (or holds with another shape), or the first checkpoint unit or
// parameter the model lacks.
StatusOr<NameMatch> MatchByName(const CheckpointIndex& ix, const TrainingState& state) {
  const FullyShardedModel& f = *state.fsdp;
  const auto& units = *state.units;
  NameMatch m;
  std::vector<bool> unit_used(ix.units.size(), false);
  for (size_t u = 0; u < units.size(); ++u) {
    int cu = -1;
    for (size_t k = 0; k < ix.units.size(); ++k) {
      if (!unit_used[k] && ix.units[k].name == units[u].name) {
        cu = static_cast<int>(k);
        break;
      }
    }
    if (cu < 0) {
      return InvalidArgumentError("model unit '" + units[u].name + "' is not in the checkpoint (its " +
                                  std::to_string(ix.units.size()) + " units are matched by name)");
    }
    unit_used[cu] = true;
    m.unit.push_back(cu);
    const auto& cps = ix.units[cu].params;
    const auto& mps = f.layout(static_cast<int>(u)).params();
    std::vector<bool> used(cps.size(), false);
    std::vector<int> map;
    for (const auto& mp : mps) {
      const std::string full = units[u].name + "." + mp.name;
      int cp = -1;
      for (size_t k = 0; k < cps.size(); ++k) {
        if (!used[k] && cps[k].name == mp.name) {
          cp = static_cast<int>(k);
          break;
        }
      }
      if (cp < 0) return InvalidArgumentError("model parameter '" + full + "' is not in the checkpoint");
      if (cps[cp].shape != mp.shape) {
        return InvalidArgumentError("parameter '" + full + "' has shape " + cps[cp].shape.ToString() +
                                    " in the checkpoint but " + mp.shape.ToString() + " in the model");
      }
      used[cp] = true;
      map.push_back(cp);
    }
    for (size_t k = 0; k < cps.size(); ++k) {
      if (!used[k]) {
        return InvalidArgumentError("checkpoint parameter '" + ix.units[cu].name + "." + cps[k].name +
                                    "' is not in the model");
      }
    }
    m.param.push_back(std::move(map));
  }
  for (size_t k = 0; k < ix.units.size(); ++k) {
    if (!unit_used[k]) return InvalidArgumentError("checkpoint unit '" + ix.units[k].name + "' is not in the model");
  }
  if (state.optimizer != nullptr && ix.has_optimizer &&
      ix.optimizer_state_names != state.optimizer->StateNames()) {
    return InvalidArgumentError("the checkpoint's optimizer (" + ix.optimizer_kind + ") has state " +
                                JoinNames(ix.optimizer_state_names) + ", this optimizer (" +
                                state.optimizer->Name() + ") has " + JoinNames(state.optimizer->StateNames()));
  }
  return m;
}

// Reads this rank's new shards from the files of a sharded checkpoint.
Status ReadShards(const std::string& dir, const CheckpointIndex& ix, const TrainingState& state,
                  const NameMatch& match, LoadedShards* out) {
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
    SK_ASSIGN_OR_RETURN(out->master[u], HostZeros(s));
    for (size_t i = 0; i < num_states; ++i) {
      SK_ASSIGN_OR_RETURN(Tensor t, HostZeros(s));
      out->optim[u].push_back(std::move(t));
    }
    out->optimizer_step[u] = ix.units[match.unit[u]].optimizer_step;
  }
  // The elements of model unit u's parameter p that old shard k holds, as
  // [lo, hi) of the new shard and the old shard's first element of them.
  struct Piece {
    int64_t new_begin, old_begin, numel;
  };
  auto pieces = [&](int u, int k) {
    std::vector<Piece> v;
    const auto& cu = ix.units[match.unit[u]];
    const auto& mps = f.layout(u).params();
    const int64_t s = f.layout(u).shard_numel();
    for (size_t p = 0; p < mps.size(); ++p) {
      const auto& cp = cu.params[match.param[u][p]];
      // Element i of the parameter: new flat mps[p].offset + i, old flat cp.offset + i.
      const int64_t lo = std::max({int64_t{0}, begin[u] - mps[p].offset, k * cu.shard_numel - cp.offset});
      const int64_t hi = std::min({mps[p].numel, begin[u] + s - mps[p].offset, (k + 1) * cu.shard_numel - cp.offset});
      if (lo < hi) v.push_back({mps[p].offset + lo - begin[u], cp.offset + lo - k * cu.shard_numel, hi - lo});
    }
    return v;
  };
  for (const auto& file : ix.files) {
    const int k = file.shard_rank;
    bool needed = false;
    for (int u = 0; u < num_units && !needed; ++u) needed = !pieces(u, k).empty();
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
    // Bind the file to its place: two rank files swapped, or one copied over
    // another, have the right size and id but another shard's weights.
    auto shard = sf.metadata().find("shard_rank");
    if (shard == sf.metadata().end() || shard->second != std::to_string(k)) {
      return DataLossError("checkpoint file '" + path + "' holds shard rank " +
                           (shard == sf.metadata().end() ? std::string("(none)") : shard->second) +
                           ", the index lists it as shard rank " + std::to_string(k) +
                           " (files swapped or copied over each other)");
    }
    if (file.header_crc32 >= 0 && sf.header_crc32() != static_cast<uint32_t>(file.header_crc32)) {
      return DataLossError("checkpoint file '" + path + "' does not match the index (header CRC-32 " +
                           std::to_string(sf.header_crc32()) + ", the index says " +
                           std::to_string(file.header_crc32) + "): replaced after the checkpoint was written");
    }
    // Copies this shard's pieces of model unit u from tensor `name` (old shard k) into `dst`.
    auto copy = [&](int u, const std::string& name, const Tensor& dst) -> Status {
      const int64_t old_s = ix.units[match.unit[u]].shard_numel;
      StatusOr<SafeTensorsFile::Info> info = sf.info(name);
      if (!info.ok()) return DataLossError("checkpoint file '" + path + "' lacks tensor '" + name + "'");
      if (info->dtype != DType::kF32 || info->shape != Shape{old_s}) {
        return DataLossError("tensor '" + name + "' in '" + path + "' is " +
                             std::string(DTypeName(info->dtype)) + info->shape.ToString() +
                             ", the index says f32[" + std::to_string(old_s) + "]");
      }
      const std::vector<Piece> v = pieces(u, k);
      if (v.empty()) return OkStatus();
      SK_ASSIGN_OR_RETURN(Tensor file_shard, sf.HostView(name));
      for (const Piece& piece : v) {
        SK_ASSIGN_OR_RETURN(Tensor from, Slice(file_shard, piece.old_begin, piece.numel));
        SK_ASSIGN_OR_RETURN(Tensor to, Slice(dst, piece.new_begin, piece.numel));
        SK_RETURN_IF_ERROR(ops::Copy(ops::HostContext(), from, to));
      }
      return OkStatus();
    };
    for (int u = 0; u < num_units; ++u) {
      const int cu = match.unit[u];
      SK_RETURN_IF_ERROR(copy(u, MasterName(cu), out->master[u]));
      if (want_optim && ix.units[cu].optimizer_step > 0) {
        for (size_t i = 0; i < num_states; ++i) {
          SK_RETURN_IF_ERROR(copy(u, OptimName(cu, ix.optimizer_state_names[i]), out->optim[u][i]));
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
  if (!fs::is_empty(dir, ec) && !fs::exists(dir + "/" + kCheckpointIndexName, ec)) {
    return InvalidArgumentError("'" + dir + "' is a non-empty directory without " + kCheckpointIndexName +
                                " (not a checkpoint); not overwriting it");
  }
  return OkStatus();
}

// Where a save to `dir` writes. A symlink (or a chain of them) to a
// directory means "keep my checkpoints over there": the save goes into the
// target, whose parent then holds the temporary directory and the atomic
// exchange. Swapping the link itself would silently replace it by a directory
// and leave the target holding the old checkpoint. A link to nothing or to
// a non-directory is refused. Anything else is `dir` itself.
StatusOr<std::string> ResolveCheckpointDir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(dir, ec))) return dir;
  const fs::path target = fs::canonical(dir, ec);
  if (ec) {
    return InvalidArgumentError("'" + dir + "' is a symlink whose target cannot be resolved (" + ec.message() +
                                "); not replacing the link: point it at a directory or remove it");
  }
  if (!fs::is_directory(target, ec)) {
    return InvalidArgumentError("'" + dir + "' is a symlink to '" + target.string() +
                                "', which is not a directory; not replacing it");
  }
  return target.string();
}

// What a failed save left at `dir`, for its message: the new checkpoint
// (the exchange happened before something else failed), the previous one,
// or none. Read from the disk, never assumed.
std::string DescribeCheckpointOnDisk(const std::string& dir, const std::string& new_id) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return "no checkpoint is at '" + dir + "'";
  StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
  if (!ix.ok()) return "'" + dir + "' holds no readable checkpoint: " + std::string(ix.status().message());
  if (!new_id.empty() && ix->checkpoint_id == new_id) {
    return "the new checkpoint (step " + std::to_string(ix->step) + ") is complete in '" + dir +
           "' and replaced the previous one";
  }
  return "the previous checkpoint (step " + std::to_string(ix->step) + ") in '" + dir + "' is intact";
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
  std::vector<Tensor> keep;  // host copies, alive until written
  for (int u = 0; u < f.num_units(); ++u) {
    const int64_t n = f.layout(u).shard_numel();
    SK_ASSIGN_OR_RETURN(Tensor master, ToHost(f, f.master_shard(u)));
    entries.push_back({MasterName(u), DType::kF32, Shape{n}, master.data()});
    keep.push_back(std::move(master));
    if (state.optimizer != nullptr && state.optimizer->step_count(u) > 0) {
      for (const std::string& name : state.optimizer->StateNames()) {
        SK_ASSIGN_OR_RETURN(Tensor t, state.optimizer->State(u, name));
        if (t.dtype() != DType::kF32 || t.numel() != n) {
          return InternalError("optimizer state '" + name + "' of unit " + std::to_string(u) + " is " +
                               t.ToString() + ", expected f32[" + std::to_string(n) + "]");
        }
        SK_ASSIGN_OR_RETURN(Tensor host, ToHost(f, t));
        entries.push_back({OptimName(u, name), DType::kF32, Shape{n}, host.data()});
        keep.push_back(std::move(host));
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
    SK_ASSIGN_OR_RETURN(uint32_t crc, SafeTensorsHeaderCrc32(path));
    file.header_crc32 = crc;
    ix.files.push_back(std::move(file));
  }
  return WriteFileDurably(tmp + "/" + kCheckpointIndexName,
                          SerializeCheckpointIndex(ix, state.optimizer ? &state.optimizer->options() : nullptr));
}
}  // namespace

Status SaveShardedCheckpoint(const std::string& dir_in, const TrainingState& state, int64_t step,
                             const CheckpointOptions& options) {
  SK_RETURN_IF_ERROR(ValidateState(state, "SaveShardedCheckpoint"));
  if (step < 0) return InvalidArgumentError("SaveShardedCheckpoint: negative step " + std::to_string(step));
  if (dir_in.empty()) return InvalidArgumentError("SaveShardedCheckpoint: empty directory name");
  FullyShardedModel& f = *state.fsdp;
  const std::string named = StripTrailingSlashes(dir_in);
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(f));
  const bool root = f.rank() == 0;

  // Every rank resolves the path itself: writers put their files into the
  // same temporary directory, so they must see the same filesystem anyway.
  StatusOr<std::string> resolved = ResolveCheckpointDir(named);
  SK_RETURN_IF_ERROR(sync->Agree(resolved.status()).WithContext("saving checkpoint '" + named + "'"));
  const std::string dir = *resolved;
  const std::string tmp = dir + ".tmp";
  const std::string where = dir == named ? "'" + dir + "'" : "'" + named + "' (-> '" + dir + "')";
  SK_RETURN_IF_ERROR(sync->Agree(root ? PrepareTempDir(dir, tmp) : OkStatus())
                         .WithContext("saving checkpoint " + where + " (the previous one, if any, is intact)"));
  SK_ASSIGN_OR_RETURN(std::string id, sync->FromRankZero(root ? NewCheckpointId() : std::string()));
  Status wrote = IsWriter(f) ? WriteRankFile(tmp, state, id, step, options) : OkStatus();
  Status s = sync->Agree(wrote);
  if (s.ok()) {
    Status committed;
    if (root) {
      committed = WriteIndex(tmp, state, id, step);
      if (committed.ok()) committed = SwapDirectoryIntoPlace(tmp, dir);
      if (committed.ok() && options.on_committed) committed = options.on_committed(dir);
    }
    s = sync->Agree(committed);
  }
  if (s.ok()) return s;
  if (root) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  return s.WithContext("saving checkpoint " + where + " failed; " + DescribeCheckpointOnDisk(dir, id));
}

StatusOr<int64_t> LoadShardedCheckpoint(const std::string& dir_in, const TrainingState& state,
                                        std::optional<CheckpointIndex::DataPosition>* data) {
  SK_RETURN_IF_ERROR(ValidateState(state, "LoadShardedCheckpoint"));
  FullyShardedModel& f = *state.fsdp;
  const std::string dir = StripTrailingSlashes(dir_in);
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(f));
  LoadedShards loaded;
  std::optional<CheckpointIndex::DataPosition> position;
  Status read = [&]() -> Status {
    SK_ASSIGN_OR_RETURN(CheckpointIndex ix, ReadCheckpointIndex(dir));
    SK_ASSIGN_OR_RETURN(NameMatch match, MatchByName(ix, state));
    position = ix.data;
    return ReadShards(dir, ix, state, match, &loaded);
  }();
  SK_RETURN_IF_ERROR(sync->Agree(read).WithContext("loading checkpoint '" + dir + "' (nothing was changed)"));
  SK_RETURN_IF_ERROR(sync->Agree(Commit(state, loaded)));
  if (data != nullptr) *data = position;
  return loaded.step;
}

}  // namespace sk
