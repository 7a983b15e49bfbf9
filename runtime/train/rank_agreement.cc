#include "runtime/train/rank_agreement.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "runtime/comm/work.h"
#include "runtime/core/allocator.h"
#include "runtime/device/device.h"

namespace sk {

std::vector<std::pair<std::string, std::string>> SharedFsdpAndOptimizerFields(const FsdpOptions& f,
                                                                              const OptimizerOptions& opt) {
  auto num = [](double v) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  auto i = [](int64_t v) { return std::to_string(v); };
  const MixedPrecisionPolicy& mp = f.mixed_precision;
  std::vector<std::pair<std::string, std::string>> v = {
      {"fsdp.strategy", ShardingStrategyName(f.strategy)},
      {"fsdp.shard_group_size", i(f.shard_group_size)},
      {"fsdp.backward_prefetch", BackwardPrefetchName(f.backward_prefetch)},
      {"fsdp.forward_prefetch", i(f.forward_prefetch)},
      {"fsdp.all_gather_limit", f.all_gather_limit.ToString()},
      {"fsdp.mixed_precision.param_dtype", std::string(DTypeName(mp.param_dtype))},
      {"fsdp.mixed_precision.reduce_dtype", mp.reduce_dtype ? std::string(DTypeName(*mp.reduce_dtype)) : "unset"},
      {"fsdp.cpu_offload", i(f.cpu_offload)},
      {"fsdp.gradient_predivide_factor", num(f.gradient_predivide_factor)},
      {"fsdp.seed", std::to_string(f.seed)},
      {"fsdp.grad_accumulation", GradAccumulationName(f.grad_accumulation)},
      {"optimizer.kind", i(static_cast<int>(opt.kind))},
      {"optimizer.lr", num(opt.lr)},
      {"optimizer.momentum", num(opt.momentum)},
      {"optimizer.dampening", num(opt.dampening)},
      {"optimizer.nesterov", i(opt.nesterov)},
      {"optimizer.beta1", num(opt.beta1)},
      {"optimizer.beta2", num(opt.beta2)},
      {"optimizer.eps", num(opt.eps)},
      {"optimizer.weight_decay", num(opt.weight_decay)},
      {"optimizer.param_groups", i(static_cast<int64_t>(opt.param_groups.size()))},
  };
  std::string custom = opt.custom_name.empty() ? "none" : opt.custom_name + " {";
  for (size_t k = 0; k < opt.custom_state_names.size(); ++k) custom += (k ? ", " : "") + opt.custom_state_names[k];
  if (!opt.custom_name.empty()) custom += "}";
  v.push_back({"optimizer.custom", custom});
  for (size_t g = 0; g < opt.param_groups.size(); ++g) {
    const ParamGroup& pg = opt.param_groups[g];
    const std::string k = "optimizer.param_groups[" + std::to_string(g) + "].";
    v.push_back({k + "pattern", pg.pattern});
    v.push_back({k + "norms_biases_embeddings", i(pg.norms_biases_embeddings)});
    v.push_back({k + "no_decay", NoDecayName(pg.no_decay)});
    v.push_back({k + "weight_decay", num(pg.weight_decay)});
    v.push_back({k + "lr_multiplier", num(pg.lr_multiplier)});
  }
  return v;
}

namespace {

// Each field's value in a fixed slot of kSlot bytes; a longer value keeps its
// head and a hash of the whole, so different values never compare equal by
// truncation (in practice).
constexpr size_t kSlot = 64;
void PutSlot(const std::string& value, char* slot) {
  std::string v = value;
  if (v.size() >= kSlot) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : value) h = (h ^ c) * 1099511628211ull;
    char tail[24];
    std::snprintf(tail, sizeof(tail), "...#%016llx", static_cast<unsigned long long>(h));
    v = value.substr(0, kSlot - 1 - std::strlen(tail)) + tail;
  }
  std::memset(slot, 0, kSlot);
  std::memcpy(slot, v.data(), v.size());
}

}  // namespace

Status AgreeOnFields(const std::vector<std::pair<std::string, std::string>>& fields, const Status& local_validity,
                     comm::ProcessGroup& world, Duration timeout, const std::string& what) {
  const int n = world.size();
  if (n == 1) return local_validity;
  HostAllocator& host = HostAllocator::Default();
  // On the group's own device when it has one (nccl: host tensors on its
  // stream are staged through device memory by the group).
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(world.bound_device().value_or(DeviceId::Cpu(world.rank()))));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream(what + " options"));
  comm::CollectiveOptions co;
  co.timeout = timeout;
  co.label = what + " options";
  const std::string context = "agreeing on the " + what + " options across ranks";
  // Bytes carried in f32 tensors (collectives move f32 and 16-bit floats; an
  // all-gather copies them unchanged).
  auto gather = [&](const Tensor& mine, const Tensor& all) -> Status {
    SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w, world.all_gather(all, mine, *stream, co));
    return w->wait(co.timeout).WithContext(context);
  };
  // The number of fields first: it differs when a list does (a parameter
  // group on one rank only). Every rank then sends the largest number of
  // slots, empty past its own fields; the lists' counts come before their
  // items, so the first difference is named by a field every rank has.
  SK_ASSIGN_OR_RETURN(Tensor count, host.Empty(DType::kF32, Shape{1}));
  SK_ASSIGN_OR_RETURN(Tensor counts, host.Empty(DType::kF32, Shape{n}));
  const uint32_t my_count = static_cast<uint32_t>(fields.size());
  std::memcpy(count.data(), &my_count, sizeof my_count);
  SK_RETURN_IF_ERROR(gather(count, counts));
  size_t slots = 0;
  for (int r = 0; r < n; ++r) {
    uint32_t c;
    std::memcpy(&c, static_cast<const char*>(counts.data()) + 4 * r, sizeof c);
    slots = std::max<size_t>(slots, c);
  }
  // One slot per field, then one for this rank's verdict on its own options.
  const size_t bytes = (slots + 1) * kSlot;
  SK_ASSIGN_OR_RETURN(Tensor mine, host.Empty(DType::kF32, Shape{static_cast<int64_t>(bytes / 4)}));
  SK_ASSIGN_OR_RETURN(Tensor all, host.Empty(DType::kF32, Shape{static_cast<int64_t>(n * bytes / 4)}));
  char* p = static_cast<char*>(mine.data());
  std::memset(p, 0, bytes);
  for (size_t k = 0; k < fields.size(); ++k) PutSlot(fields[k].second, p + k * kSlot);
  PutSlot(local_validity.ok() ? "ok" : "invalid", p + slots * kSlot);
  SK_RETURN_IF_ERROR(gather(mine, all));
  const char* base = static_cast<const char*>(all.data());
  auto slot = [&](int r, size_t k) { return std::string(base + r * bytes + k * kSlot, strnlen(base + r * bytes + k * kSlot, kSlot)); };
  // Every rank reaches the same verdict: the first field (in the order
  // given) where some rank differs from rank 0, naming the lowest such rank.
  for (size_t k = 0; k < slots; ++k) {
    for (int r = 1; r < n; ++r) {
      if (slot(r, k) != slot(0, k)) {
        const std::string field = k < fields.size() ? fields[k].first : "field " + std::to_string(k);
        return InvalidArgumentError(what + " options differ across ranks: " + field + " is " + slot(0, k) +
                                    " on rank 0 but " + slot(r, k) + " on rank " + std::to_string(r) +
                                    " (every rank must create its " + what + " with the same options)");
      }
    }
  }
  if (!local_validity.ok()) return local_validity;
  for (int r = 0; r < n; ++r) {
    if (slot(r, slots) != "ok") {
      return InvalidArgumentError("rank " + std::to_string(r) + " rejected the " + what +
                                  " options (its own error says why)");
    }
  }
  return OkStatus();
}

}  // namespace sk
