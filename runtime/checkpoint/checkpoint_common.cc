#include "runtime/checkpoint/checkpoint_internal.h"

#include "runtime/ops/ops.h"

namespace sk::checkpoint_internal {

StatusOr<Tensor> Slice(const Tensor& t, int64_t offset, int64_t n) {
  SK_ASSIGN_OR_RETURN(Tensor flat, t.Reshape(Shape{t.numel()}));
  return flat.View(static_cast<size_t>(offset) * DTypeSize(t.dtype()), t.dtype(), Shape{n});
}

StatusOr<Tensor> HostZeros(int64_t n) {
  SK_ASSIGN_OR_RETURN(Tensor t, HostAllocator::Default().Empty(DType::kF32, Shape{n}));
  SK_RETURN_IF_ERROR(ops::Fill(ops::HostContext(), t, 0.f));
  return t;
}

Status CopyToHost(const FullyShardedModel& f, const Tensor& src, const Tensor& dst) {
  // Master shards and optimizer state live where the shards' context is
  // (the host with cpu_offload; its stream may be null: the calling thread).
  const ops::OpContext& ctx = f.shard_context();
  SK_RETURN_IF_ERROR(ops::Copy(ctx, src, dst));
  if (ctx.stream == nullptr) return OkStatus();
  return ctx.stream->Synchronize(f.options().timeout).WithContext("copying to the host");
}

StatusOr<Tensor> ToHost(const FullyShardedModel& f, const Tensor& src) {
  SK_ASSIGN_OR_RETURN(Tensor t, HostAllocator::Default().Empty(src.dtype(), src.shape()));
  SK_RETURN_IF_ERROR(CopyToHost(f, src, t));
  return t;
}

std::string MasterName(int unit) { return "units." + std::to_string(unit) + ".master"; }
std::string OptimName(int unit, const std::string& state) {
  return "units." + std::to_string(unit) + ".optim." + state;
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

Status Commit(const TrainingState& state, LoadedShards& loaded) {
  FullyShardedModel& f = *state.fsdp;
  for (int u = 0; u < f.num_units(); ++u) {
    SK_RETURN_IF_ERROR(f.LoadMasterShard(u, loaded.master[u]).WithContext("committing a loaded checkpoint"));
  }
  if (loaded.has_optimizer && state.optimizer != nullptr) {
    for (int u = 0; u < f.num_units(); ++u) {
      const int64_t n = f.layout(u).shard_numel();
      SK_RETURN_IF_ERROR(state.optimizer->LoadState(f.shard_context(), u, n, loaded.optimizer_step[u], loaded.optim[u])
                             .WithContext("committing a loaded checkpoint (the model is partly restored)"));
    }
  }
  return OkStatus();
}


}  // namespace sk::checkpoint_internal
