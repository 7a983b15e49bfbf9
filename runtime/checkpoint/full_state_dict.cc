#include "runtime/checkpoint/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>


#include "runtime/core/allocator.h"
#include "runtime/core/file_io.h"
#include "runtime/device/device.h"
#include "runtime/checkpoint/checkpoint_internal.h"
#include "runtime/checkpoint/hf_checkpoint.h"
#include "runtime/checkpoint/rank_agreement.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/ops/ops.h"

// Full state dicts: SaveFullStateDict and LoadFullStateDict (see
// checkpoint.h).

namespace sk {

namespace {

using checkpoint_internal::Commit;
using checkpoint_internal::CopyToHost;
using checkpoint_internal::HostZeros;
using checkpoint_internal::Slice;
using checkpoint_internal::JoinNames;
using checkpoint_internal::LoadedShards;
using checkpoint_internal::ValidateState;

constexpr char kFullStateDictKind[] = "full_state_dict";


// The tensor `name` as a host f32 tensor, widened exactly from bf16/f16.
// `shown` is how errors name it (with its name in the file's layout).
StatusOr<Tensor> WidenToF32(const SafeTensorsFile& sf, const std::string& name, const Shape& want,
                            const std::string& path, const std::string& what, const std::string& shown) {
  SK_ASSIGN_OR_RETURN(SafeTensorsFile::Info info, sf.info(name));
  if (info.shape != want) {
    return InvalidArgumentError(what + " " + shown + " has shape " + info.shape.ToString() + " in '" + path +
                                "' but " + want.ToString() + " in the model");
  }
  if (info.dtype != DType::kF32 && info.dtype != DType::kBF16 && info.dtype != DType::kF16) {
    return InvalidArgumentError(what + " " + shown + " in '" + path + "' has an invalid dtype");
  }
  SK_ASSIGN_OR_RETURN(Tensor src, sf.HostView(name));
  SK_ASSIGN_OR_RETURN(Tensor out, HostAllocator::Default().Empty(DType::kF32, want));
  SK_RETURN_IF_ERROR(ops::Cast(ops::HostContext(), src, out));
  return out;
}

Status ValidateLayout(WeightLayout layout) {
  if (ParseWeightLayout(WeightLayoutName(layout)).ok()) return OkStatus();
  return InvalidArgumentError("invalid weight layout " + std::to_string(static_cast<int>(layout)) +
                              " (shardkit, torch, hf-gpt2, hf-llama)");
}

std::string FullOptimName(const std::string& state_name, const std::string& param) {
  return "optimizer." + state_name + "." + param;
}

// "'<name>'", and in another layout also the name the file holds it under.
std::string Shown(const std::string& name, WeightLayout layout) {
  std::string s = "'" + name + "'";
  if (layout == WeightLayout::kShardkit) return s;
  StatusOr<std::string> theirs = LayoutName(name, layout);
  if (theirs.ok() && *theirs != name) s += " (" + std::string(WeightLayoutName(layout)) + " '" + *theirs + "')";
  if (layout == WeightLayout::kTorch && name.size() > 2 && name.compare(name.size() - 2, 2, ".w") == 0) {
    s += " (torch layout: stored [out, in])";
  }
  return s;
}

// Conversion options for the model `units` describe: a head tied to the
// embedding (GPT-2, a tied Llama) is stored once both ways; a head of its
// own (an untied Llama or GPT) must be in the file, and is always written:
// a file without lm_head.weight is InvalidArgument, never read as the
// embedding's transpose (issue 47 item 1). Models without an LM head leave
// it to the file.
ConvertOptions ConvertOptionsForUnits(const std::vector<UnitSpec>& units) {
  ConvertOptions o;
  for (const UnitSpec& u : units) {
    for (const TiedParamSpec& t : u.tied) {
      if (u.name + "." + t.name == "head.lm_head.w") o.tie_word_embeddings = true;
    }
    for (const ParamSpec& p : u.params) {
      if (u.name + "." + p.name == "head.lm_head.w") o.tie_word_embeddings = false;
    }
  }
  return o;
}

// Where a shardkit parameter's tensor is in a Hugging Face file, and
// whether the file holds its transpose.
struct HfSource {
  size_t file;
  std::string name;
  bool transposed;
};

// How `layout` converts the file's tensor `name` on its own: into which
// shardkit parameter, transposed or not (a 2 x 3 probe through
// ConvertWeights, the converter's own table); nullopt for a tensor it skips
// (inv_freq and attention-mask buffers). An error for a tensor it cannot
// convert alone (split q/k/v projections): the caller reads the file whole.
StatusOr<std::optional<std::pair<std::string, bool>>> ProbeConversion(const std::string& name, WeightLayout layout) {
  const float data[6] = {0, 1, 2, 3, 4, 5};
  SK_ASSIGN_OR_RETURN(SafeTensorsFile probe,
                      SafeTensorsFile::FromEntries({{name, DType::kF32, Shape{2, 3}, data}}, {{"format", "pt"}}));
  // As a tied model's file (so the embedding does not also make a head),
  // and for the head itself as an untied model's.
  ConvertOptions tied, untied;
  tied.tie_word_embeddings = true;
  untied.tie_word_embeddings = false;
  StatusOr<SafeTensorsFile> as_tied = ConvertWeights(probe, layout, WeightLayout::kShardkit, tied);
  SK_ASSIGN_OR_RETURN(SafeTensorsFile converted,
                      as_tied.ok() ? std::move(as_tied) : ConvertWeights(probe, layout, WeightLayout::kShardkit, untied));
  if (converted.names().empty()) return std::optional<std::pair<std::string, bool>>();
  if (converted.names().size() != 1) return InvalidArgumentError("'" + name + "' converts to several tensors");
  const std::string& to = converted.names()[0];
  const bool transposed = converted.info(to)->shape == Shape{3, 2};
  return std::optional<std::pair<std::string, bool>>(std::make_pair(to, transposed));
}

// Bounded-memory read of a Hugging Face file or directory (issue 43 item
// 5): only headers are read whole; each parameter's tensor is read with
// pread one at a time, only the byte ranges of this rank's slices when the
// layouts agree (one tensor whole when the file holds its transpose), and
// widened and transposed straight into the rank's staged shard. Returns
// false, having changed nothing, for anything the whole-file path must
// decide or name (a tensor missing, extra or of another shape, a tied
// model's lm_head.weight to compare with the embedding, split q/k/v
// projections): that path then reads it, with its errors.
StatusOr<bool> ReadHfRanged(const std::string& path, WeightLayout layout, const TrainingState& state,
                            LoadedShards* out) {
  FullyShardedModel& f = *state.fsdp;
  const auto& units = *state.units;
  SK_ASSIGN_OR_RETURN(HfWeightReaders files, OpenHfWeights(path));
  const ConvertOptions options = ConvertOptionsForUnits(units);
  std::map<std::string, HfSource> sources;
  bool has_lm_head = false;
  for (const auto& [name, file] : files.where) {
    StatusOr<std::optional<std::pair<std::string, bool>>> to = ProbeConversion(name, layout);
    if (!to.ok()) return false;
    if (!to->has_value()) continue;
    if ((*to)->first == "head.lm_head.w") has_lm_head = true;
    if (!sources.emplace((*to)->first, HfSource{file, name, (*to)->second}).second) return false;
  }
  // A tied model compares a file's head with the embedding; an untied one
  // without its head is an error the converter names.
  if (options.tie_word_embeddings.has_value() && *options.tie_word_embeddings == has_lm_head) return false;
  size_t wanted = 0;
  for (int u = 0; u < f.num_units(); ++u) {
    const FlatParamLayout& l = f.layout(u);
    for (size_t p = 0; p < l.params().size(); ++p) {
      auto it = sources.find(FullParamName(units[u], units[u].params[p]));
      if (it == sources.end()) return false;
      ++wanted;
      const SafeTensorsFile::Info info = *files.files[it->second.file].info(it->second.name);
      const Shape& want = l.params()[p].shape;
      const bool same = it->second.transposed
                            ? want.rank() == 2 && info.shape == Shape{want.dim(1), want.dim(0)}
                            : info.shape == want;
      if (!same) return false;
    }
  }
  if (wanted != sources.size()) return false;  // a tensor the model does not have

  out->step = 0;
  out->has_optimizer = false;
  const int shard_rank = f.shard_group().rank();
  out->master.assign(f.num_units(), {});
  out->optim.assign(f.num_units(), {});
  out->optimizer_step.assign(f.num_units(), 0);
  std::vector<char> buffer;  // one tensor at most
  auto widen = [](DType dtype, const char* src, int64_t i) -> float {
    switch (dtype) {
      case DType::kBF16: {
        BF16 h;
        std::memcpy(&h.bits, src + 2 * i, 2);
        return BF16ToFloat(h);
      }
      case DType::kF16: {
        F16 h;
        std::memcpy(&h.bits, src + 2 * i, 2);
        return F16ToFloat(h);
      }
      default: {
        float x;
        std::memcpy(&x, src + 4 * i, 4);
        return x;
      }
    }
  };
  for (int u = 0; u < f.num_units(); ++u) {
    const FlatParamLayout& l = f.layout(u);
    SK_ASSIGN_OR_RETURN(out->master[u], HostZeros(l.shard_numel()));
    float* master = out->master[u].data_as<float>();
    for (const auto& s : l.ShardSlices(shard_rank)) {
      const std::string name = FullParamName(units[u], units[u].params[s.param]);
      const HfSource& src = sources.at(name);
      const SafeTensorsReader& reader = files.files[src.file];
      const SafeTensorsFile::Info info = *reader.info(src.name);
      const int64_t esize = static_cast<int64_t>(DTypeSize(info.dtype));
      const int64_t n = s.param_end - s.param_begin;
      float* dst = master + s.shard_offset;
      const std::string what = "parameter " + Shown(name, layout) + " from '" + reader.path() + "'";
      if (!src.transposed) {
        // The slice's own bytes, straight into the shard when f32.
        if (info.dtype == DType::kF32) {
          SK_RETURN_IF_ERROR(reader.ReadRange(src.name, static_cast<uint64_t>(s.param_begin) * 4,
                                              static_cast<uint64_t>(n) * 4, dst)
                                 .WithContext(what));
          continue;
        }
        buffer.resize(static_cast<size_t>(n * esize));
        SK_RETURN_IF_ERROR(reader.ReadRange(src.name, static_cast<uint64_t>(s.param_begin * esize),
                                            static_cast<uint64_t>(n * esize), buffer.data())
                               .WithContext(what));
        for (int64_t i = 0; i < n; ++i) dst[i] = widen(info.dtype, buffer.data(), i);
        continue;
      }
      // shardkit's [rows, cols] element (r, c) is the file's (c, r).
      buffer.resize(static_cast<size_t>(info.nbytes));
      SK_RETURN_IF_ERROR(reader.Read(src.name, buffer.data()).WithContext(what));
      const int64_t rows = l.params()[s.param].shape.dim(0), cols = l.params()[s.param].shape.dim(1);
      for (int64_t i = s.param_begin; i < s.param_end; ++i) {
        dst[i - s.param_begin] = widen(info.dtype, buffer.data(), (i % cols) * rows + i / cols);
      }
    }
  }
  return true;
}

// Builds this rank's shards from a full state dict file in `layout`.
Status ReadFullStateDict(const std::string& path, WeightLayout layout, const TrainingState& state,
                         LoadedShards* out) {
  FullyShardedModel& f = *state.fsdp;
  const auto& units = *state.units;
  // In another tool's layout, a directory is a Hugging Face model directory
  // (its config.json is the caller's business: the model is given).
  const bool hf_dir = layout != WeightLayout::kShardkit && IsDirectory(path);
  if (layout == WeightLayout::kHfGpt2 || layout == WeightLayout::kHfLlama) {
    SK_ASSIGN_OR_RETURN(bool done, ReadHfRanged(path, layout, state, out));
    if (done) return OkStatus();
  }
  SK_ASSIGN_OR_RETURN(SafeTensorsFile file, hf_dir ? ReadHfWeights(path) : SafeTensorsFile::Read(path));
  if (layout != WeightLayout::kShardkit) {
    StatusOr<SafeTensorsFile> converted =
        ConvertWeights(file, layout, WeightLayout::kShardkit, ConvertOptionsForUnits(units));
    if (!converted.ok()) {
      return converted.status().WithContext("reading '" + path + "' as " + WeightLayoutName(layout));
    }
    file = std::move(*converted);
  }
  const SafeTensorsFile& sf = file;
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
    SK_ASSIGN_OR_RETURN(out->master[u], HostZeros(l.shard_numel()));
    int64_t ostep = 0;
    if (file_has_optim) SK_RETURN_IF_ERROR(parse_int("shardkit.optimizer.step." + std::to_string(u), &ostep));
    out->optimizer_step[u] = ostep;
    if (out->has_optimizer) {
      for (size_t i = 0; i < file_states.size(); ++i) {
        SK_ASSIGN_OR_RETURN(Tensor t, HostZeros(l.shard_numel()));
        out->optim[u].push_back(std::move(t));
      }
    }
    // Reads `name` (the full tensor of parameter p) into this rank's slices of `dst`.
    auto take = [&](const std::string& name, int p, const std::string& what, const Tensor& dst) -> Status {
      if (!sf.contains(name)) {
        return InvalidArgumentError(what + " " + Shown(name, layout) + " is missing from '" + path + "'");
      }
      SK_ASSIGN_OR_RETURN(Tensor full, WidenToF32(sf, name, l.params()[p].shape, path, what, Shown(name, layout)));
      for (const auto& s : slices) {
        if (s.param != p) continue;
        SK_ASSIGN_OR_RETURN(Tensor from, Slice(full, s.param_begin, s.param_end - s.param_begin));
        SK_ASSIGN_OR_RETURN(Tensor to, Slice(dst, s.shard_offset, s.param_end - s.param_begin));
        SK_RETURN_IF_ERROR(ops::Copy(ops::HostContext(), from, to));
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
      return InvalidArgumentError("tensor " + Shown(name, layout) + " in '" + path +
                                  "' is not a parameter of this model");
    }
  }
  return OkStatus();
}

// All-gathers a flat shard of `f`'s unit `unit` (f32, shard_numel elements,
// on the model's device or the host) into a full flat host buffer.
StatusOr<Tensor> GatherFlat(FullyShardedModel& f, Stream& stream, int unit, const Tensor& shard) {
  const FlatParamLayout& l = f.layout(unit);
  Allocator& host = HostAllocator::Default();
  SK_ASSIGN_OR_RETURN(Tensor in, host.Empty(DType::kF32, Shape{l.shard_numel()}));
  SK_ASSIGN_OR_RETURN(Tensor out, host.Empty(DType::kF32, Shape{l.padded_numel()}));
  SK_RETURN_IF_ERROR(CopyToHost(f, shard, in));
  comm::CollectiveOptions co;
  co.timeout = f.options().timeout;
  SK_ASSIGN_OR_RETURN(auto work, f.shard_group().all_gather(out, in, stream, co));
  SK_RETURN_IF_ERROR(work->wait(f.options().timeout).WithContext("gathering unit " + std::to_string(unit)));
  return out;
}

// A Hugging Face directory written one unit at a time (issue 43 item 5):
// every rank gathers unit after unit as for a full state dict, and rank 0
// converts each unit's weights to the model's Hugging Face layout and writes
// them as one file of their own, model-0000k-of-0000n.safetensors, before
// the next gather, then the index (model.safetensors.index.json, as
// transformers' save_pretrained writes it), config.json,
// generation_config.json and the tokenizer files of the directory the
// model came from (WriteHfModelDir's). Rank 0 holds one gathered unit and
// its conversion at a time; no optimizer state is gathered. A failure on
// rank 0 is carried to the agreement after the gathers, which every rank
// makes alike.
Status SaveHfDirectoryStreaming(const std::string& dir, const TrainingState& state, RankAgreement& sync,
                                Stream& stream) {
  FullyShardedModel& f = *state.fsdp;
  const auto& units = *state.units;
  const bool root = f.rank() == 0;
  Status local;
  int files = 0;
  for (int u = 0; u < f.num_units(); ++u) files += f.layout(u).params().empty() ? 0 : 1;
  WeightLayout layout = WeightLayout::kShardkit;
  std::map<std::string, std::string> weight_map;
  int64_t total = 0;
  std::set<std::string> written;
  if (root) {
    local = [&]() -> Status {
      StatusOr<NamedModelConfig> config = FindModelConfig(state.model_name);
      if (!config.ok()) {
        return config.status().WithContext("writing a Hugging Face directory needs the model's configuration");
      }
      SK_ASSIGN_OR_RETURN(layout, HfWeightLayout(*config));
      return WriteHfDirectoryFiles(dir, *config, HfWriteOptions{});
    }();
  }
  const ConvertOptions convert = ConvertOptionsForUnits(units);
  int k = 0;
  for (int u = 0; u < f.num_units(); ++u) {
    if (f.layout(u).params().empty()) continue;
    ++k;
    SK_ASSIGN_OR_RETURN(Tensor flat, GatherFlat(f, stream, u, f.master_shard(u)));
    if (!root || !local.ok()) continue;
    local = [&]() -> Status {
      std::vector<SafeTensorsEntry> entries;
      for (size_t p = 0; p < units[u].params.size(); ++p) {
        const auto& lp = f.layout(u).params()[p];
        entries.push_back({FullParamName(units[u], units[u].params[p]), DType::kF32, lp.shape,
                           flat.data_as<float>() + lp.offset});
      }
      SK_ASSIGN_OR_RETURN(SafeTensorsFile mine, SafeTensorsFile::FromEntries(entries));
      flat = Tensor();  // the unit is held once at a time
      SK_ASSIGN_OR_RETURN(SafeTensorsFile theirs, ConvertWeights(mine, WeightLayout::kShardkit, layout, convert));
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", k, files);
      SK_RETURN_IF_ERROR(WriteSafeTensors(dir + "/" + name, theirs.Entries(), {{"format", "pt"}}));
      written.insert(name);
      for (const SafeTensorsEntry& e : theirs.Entries()) {
        weight_map[e.name] = name;
        total += e.shape.numel() * static_cast<int64_t>(DTypeSize(e.dtype));
      }
      return OkStatus();
    }();
  }
  if (root && local.ok()) local = WriteHfIndex(dir, weight_map, total, written);
  return sync.Agree(local);
}

}  // namespace

Status SaveFullStateDict(const std::string& path, const TrainingState& given, int64_t step,
                         const FullStateDictOptions& options) {
  SK_RETURN_IF_ERROR(ValidateState(given, "SaveFullStateDict"));
  SK_RETURN_IF_ERROR(ValidateLayout(options.layout));
  const bool native = options.layout == WeightLayout::kShardkit;
  // Other layouts hold weights only.
  TrainingState state = given;
  if (!native) state.optimizer = nullptr;
  if (step < 0) return InvalidArgumentError("SaveFullStateDict: negative step " + std::to_string(step));
  if (!native && (IsDirectory(path) || (!path.empty() && path.back() == '/'))) {
    SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(*state.fsdp));
    SK_ASSIGN_OR_RETURN(Device * device, Device::Get(state.fsdp->activation_allocator().device()));
    SK_ASSIGN_OR_RETURN(auto stream,
                        device->CreateStream("full state dict (rank " + std::to_string(state.fsdp->rank()) + ")"));
    return SaveHfDirectoryStreaming(path, state, *sync, *stream)
        .WithContext("saving Hugging Face directory '" + path + "'");
  }
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
    SK_ASSIGN_OR_RETURN(Tensor flat, GatherFlat(f, *stream, u, f.master_shard(u)));
    if (root) {
      add(flat, u, "");
      flats.push_back(std::move(flat));
    }
    if (state.optimizer == nullptr) continue;
    const int64_t ostep = state.optimizer->step_count(u);
    meta["shardkit.optimizer.step." + std::to_string(u)] = std::to_string(ostep);
    if (ostep == 0) continue;
    for (const std::string& name : state_names) {
      Tensor shard;
      StatusOr<Tensor> t = state.optimizer->State(u, name);
      if (t.ok() && t->dtype() == DType::kF32 && t->numel() == f.layout(u).shard_numel()) {
        shard = *t;
      } else {
        if (local.ok()) {
          local = t.ok() ? InternalError("optimizer state '" + name + "' has the wrong size") : t.status();
        }
        SK_ASSIGN_OR_RETURN(shard, HostZeros(f.layout(u).shard_numel()));
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
    meta["shardkit.optimizer.kind"] = state.optimizer->Name();
    meta["shardkit.optimizer.state_names"] = joined;
  }
  SK_RETURN_IF_ERROR(sync->Agree(local));
  auto write = [&]() -> Status {
    if (native) return WriteSafeTensors(path, entries, meta);
    SK_ASSIGN_OR_RETURN(SafeTensorsFile mine, SafeTensorsFile::FromEntries(entries, meta));
    if (IsDirectory(path) || path.back() == '/') {
      // A Hugging Face model directory: config.json needs the model's shape.
      StatusOr<NamedModelConfig> config = FindModelConfig(state.model_name);
      if (!config.ok()) {
        return config.status().WithContext("writing a Hugging Face directory needs the model's configuration");
      }
      return WriteHfModelDir(path, *config, mine);
    }
    SK_ASSIGN_OR_RETURN(SafeTensorsFile theirs, ConvertWeights(mine, WeightLayout::kShardkit, options.layout,
                                                               ConvertOptionsForUnits(*state.units)));
    return theirs.Write(path);
  };
  return sync->Agree(root ? write() : OkStatus()).WithContext("saving full state dict '" + path + "'");
}

StatusOr<int64_t> LoadFullStateDict(const std::string& path, const TrainingState& state,
                                    const FullStateDictOptions& options) {
  SK_RETURN_IF_ERROR(ValidateState(state, "LoadFullStateDict"));
  SK_RETURN_IF_ERROR(ValidateLayout(options.layout));
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(*state.fsdp));
  LoadedShards loaded;
  SK_RETURN_IF_ERROR(sync->Agree(ReadFullStateDict(path, options.layout, state, &loaded))
                         .WithContext("loading full state dict '" + path + "' (nothing was changed)"));
  SK_RETURN_IF_ERROR(sync->Agree(Commit(state, loaded)));
  return loaded.step;
}

}  // namespace sk
