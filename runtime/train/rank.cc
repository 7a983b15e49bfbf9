#include "runtime/train/rank.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

#include "runtime/comm/launch_env.h"
#include "runtime/core/env.h"
#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/memory/pinned_host_allocator.h"
#include "runtime/sim/profile.h"
#include "runtime/sim/sim_device.h"
#include "runtime/sim/sim_ops.h"
#include "runtime/sim/sim_process_group.h"
#include "runtime/sim/topology.h"

namespace sk {

namespace {

// ---- The device kinds a rank can compute on -------------------------------
//
// One entry per kind: its name and what rank set-up needs of it. This table
// is the one place rank set-up knows kinds (a new kind is a new entry here
// and its capabilities in KindCapabilities); everything else in
// runtime/train asks the kind's or the device's capabilities.

Status ValidateCudaOptions(const DeviceOptions& o) {
  if (o.launch_blocking) {
    return InvalidArgumentError("device.launch_blocking on cuda: set CUDA_LAUNCH_BLOCKING=1 in the "
                                "environment instead");
  }
  return OkStatus();
}

Status ValidateSimOptions(const DeviceOptions& o) {
  if (o.sim_profile.empty()) {
    return InvalidArgumentError("device.sim_profile is empty (a built-in profile name such as "
                                "a100-80g, or a .json profile path)");
  }
  if (o.sim_world_size < 0) {
    return InvalidArgumentError("device.sim_world_size must be >= 0 (0 = 1), got " +
                                std::to_string(o.sim_world_size));
  }
  if (o.sim_gpus_per_node < 0) {
    return InvalidArgumentError("device.sim_gpus_per_node must be >= 0 (0 = the profile's), got " +
                                std::to_string(o.sim_gpus_per_node));
  }
  return OkStatus();
}

StatusOr<Device*> ResolveCpuDevice(const DeviceOptions& o, int rank) {
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(DeviceId::Cpu(o.index < 0 ? rank : o.index)));
  static_cast<CpuDevice*>(device)->set_launch_blocking(o.launch_blocking);
  return device;
}

StatusOr<Device*> ResolveCudaDevice(const DeviceOptions& o, int rank) {
  int index = o.index;
  if (index < 0) {
    const int gpus = Device::CudaDeviceCount();
    if (gpus == 0) {
      // Device::Get names a build without CUDA; otherwise say no GPU is visible.
      SK_RETURN_IF_ERROR(Device::Get(DeviceId::Cuda(0)).status());
      return UnavailableError("device kind cuda for rank " + std::to_string(rank) +
                              ": no CUDA device is visible");
    }
    index = rank % gpus;
  }
  return Device::Get(DeviceId::Cuda(index));
}

StatusOr<Device*> ResolveSimDevice(const DeviceOptions& o, int) {
  SK_ASSIGN_OR_RETURN(sim::SimProfile profile, sim::LoadProfile(o.sim_profile));
  SK_ASSIGN_OR_RETURN(sim::SimDevice * device, sim::SetUpSimDevice(o.index < 0 ? 0 : o.index, profile));
  device->set_launch_blocking(o.launch_blocking);
  return device;
}

StatusOr<std::unique_ptr<OffloadHost>> CpuOffloadHost(Device*) {
  auto h = std::make_unique<OffloadHost>();
  h->shards = h->optimizer_state = &HostAllocator::Default();
  return h;
}

StatusOr<std::unique_ptr<OffloadHost>> CudaOffloadHost(Device*) {
  auto h = std::make_unique<OffloadHost>();
  h->owned_allocator = std::make_unique<PinnedHostAllocator>();
  h->shards = h->owned_allocator.get();
  h->optimizer_state = &HostAllocator::Default();
  return h;
}

StatusOr<std::unique_ptr<OffloadHost>> SimOffloadHost(Device* device) {
  SK_ASSIGN_OR_RETURN(sim::SimDevice * sim, sim::SimDevice::Get(device->id().index));
  const sim::SimDeviceSpec spec = sim->spec();
  if (spec.host_memory_bytes == 0) {
    return FailedPreconditionError("cpu_offload on " + device->id().ToString() + ": the profile '" +
                                   spec.name + "' has no host section (host memory and rates "
                                   "for the offloaded state)");
  }
  auto h = std::make_unique<OffloadHost>();
  h->owned_allocator = std::make_unique<sim::SimHostAllocator>(device->id(), spec.host_memory_bytes);
  h->shards = h->optimizer_state = h->owned_allocator.get();
  SK_ASSIGN_OR_RETURN(h->owned_stream, sim->CreateHostStream("host (offload)"));
  h->stream = h->owned_stream.get();
  return h;
}

// The simulated GPU's memory.
StatusOr<size_t> SimMemoryBytes(const Device& device) {
  SK_ASSIGN_OR_RETURN(sim::SimDevice * sim, sim::SimDevice::Get(device.id().index));
  return sim->spec().memory_bytes;
}

struct RankDeviceKind {
  DeviceKind kind;
  const char* name;
  // Checks of the options only this kind reads; null: none.
  Status (*validate)(const DeviceOptions&);
  // The device rank `rank` computes on (ResolveRankDevice).
  StatusOr<Device*> (*resolve)(const DeviceOptions&, int rank);
  // Where the rank's offloaded FSDP state lives (CreateOffloadHost).
  StatusOr<std::unique_ptr<OffloadHost>> (*offload_host)(Device*);
  // The allocator's cap when the caller sets none; null: unlimited.
  StatusOr<size_t> (*default_capacity)(const Device&);
};

constexpr RankDeviceKind kRankDeviceKinds[] = {
    {DeviceKind::kCpu, "cpu", nullptr, ResolveCpuDevice, CpuOffloadHost, nullptr},
    {DeviceKind::kCuda, "cuda", ValidateCudaOptions, ResolveCudaDevice, CudaOffloadHost, nullptr},
    {DeviceKind::kSim, "sim", ValidateSimOptions, ResolveSimDevice, SimOffloadHost, SimMemoryBytes},
};

const RankDeviceKind* FindKind(DeviceKind kind) {
  for (const RankDeviceKind& k : kRankDeviceKinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

// "cpu, cuda or sim".
std::string KindNames() {
  std::string names;
  constexpr size_t n = std::size(kRankDeviceKinds);
  for (size_t i = 0; i < n; ++i) {
    names += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(kRankDeviceKinds[i].name);
  }
  return names;
}

// Whether `kind` is simulated: its tensors hold no data, its ranks are one
// process's stand-ins priced on a simulated network.
bool Simulated(DeviceKind kind) { return KindCapabilities(kind).virtual_time; }

}  // namespace

const char* DeviceKindName(DeviceKind kind) {
  const RankDeviceKind* k = FindKind(kind);
  return k != nullptr ? k->name : "unknown";
}

StatusOr<DeviceKind> ParseDeviceKind(const std::string& name) {
  for (const RankDeviceKind& k : kRankDeviceKinds) {
    if (name == k.name) return k.kind;
  }
  return InvalidArgumentError("unknown device kind '" + name + "' (" + KindNames() + ")");
}

Status ValidateDeviceOptions(const DeviceOptions& o) {
  const RankDeviceKind* k = FindKind(o.kind);
  if (k == nullptr) {
    return InvalidArgumentError("device.kind: unknown device kind " +
                                std::to_string(static_cast<int>(o.kind)) + " (" + KindNames() + ")");
  }
  if (o.index < -1) {
    return InvalidArgumentError("device.index must be >= 0, or -1 for the rank's device (got " +
                                std::to_string(o.index) + ")");
  }
  return k->validate != nullptr ? k->validate(o) : OkStatus();
}

StatusOr<Device*> ResolveRankDevice(const DeviceOptions& given, const comm::ProcessGroup& world) {
  DeviceOptions o = given;
  if (std::optional<DeviceId> bound = world.bound_device(); bound && o.kind == bound->kind && o.index < 0) {
    o.index = bound->index;
  }
  return ResolveRankDevice(o, world.rank());
}

StatusOr<Device*> ResolveRankDevice(const DeviceOptions& o, int rank) {
  SK_RETURN_IF_ERROR(ValidateDeviceOptions(o));
  return FindKind(o.kind)->resolve(o, rank);
}

namespace {

// The network a sim device's world simulates: its profile's network section,
// GPUs per node overridden by sim_gpus_per_node when > 0.
StatusOr<comm::NetworkProfile> SimNetwork(const DeviceOptions& o) {
  SK_RETURN_IF_ERROR(ValidateDeviceOptions(o));
  if (!Simulated(o.kind)) {
    return InvalidArgumentError(std::string("a simulated world needs device kind sim, not ") +
                                DeviceKindName(o.kind));
  }
  SK_ASSIGN_OR_RETURN(sim::SimProfile profile, sim::LoadProfile(o.sim_profile));
  if (profile.network.is_null()) {
    return InvalidArgumentError("sim profile '" + profile.name +
                                "' has no network section: it cannot simulate a process group");
  }
  SK_ASSIGN_OR_RETURN(comm::NetworkProfile network, sim::ParseNetworkProfile(profile.network));
  network.name = profile.name;
  if (o.sim_gpus_per_node > 0) network.gpus_per_node = o.sim_gpus_per_node;
  return network;
}

}  // namespace

StatusOr<std::unique_ptr<comm::ProcessGroup>> CreateSimWorld(const DeviceOptions& o) {
  SK_ASSIGN_OR_RETURN(comm::NetworkProfile network, SimNetwork(o));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<sim::SimProcessGroup> world,
                      sim::SimProcessGroup::Create(network, std::max(1, o.sim_world_size)));
  return std::unique_ptr<comm::ProcessGroup>(std::move(world));
}

int LocalWorldSizeFromEnvironment() { return comm::LocalWorldSizeHint(); }

int RanksPerNode(const comm::ProcessGroup& world) {
  if (auto* sim_world = dynamic_cast<const sim::SimProcessGroup*>(&world); sim_world != nullptr) {
    return sim_world->profile().gpus_per_node;
  }
  return LocalWorldSizeFromEnvironment();
}

StatusOr<int> RanksPerNode(const DeviceOptions& o) {
  if (!Simulated(o.kind)) return LocalWorldSizeFromEnvironment();
  // The network CreateSimWorld would simulate, without building its ranks.
  SK_ASSIGN_OR_RETURN(comm::NetworkProfile network, SimNetwork(o));
  SK_RETURN_IF_ERROR(network.Validate());
  return network.gpus_per_node;
}

Status CheckWorldForDevice(const DeviceOptions& o, const comm::ProcessGroup& world) {
  const bool sim_world = world.backend_name() == "sim";
  if (Simulated(o.kind) && !sim_world) {
    return InvalidArgumentError("device kind sim needs a simulated process group (its tensors hold "
                                "no data), not the '" + world.backend_name() +
                                "' backend: pass none and set device.sim_world_size");
  }
  if (!Simulated(o.kind) && sim_world) {
    return InvalidArgumentError(std::string("a simulated process group needs device kind sim, not ") +
                                DeviceKindName(o.kind));
  }
  if (std::optional<DeviceId> bound = world.bound_device()) {
    if (o.kind != bound->kind) {
      return InvalidArgumentError("the '" + world.backend_name() + "' process group runs on " + bound->ToString() +
                                  ", not on device kind " + DeviceKindName(o.kind) + ": set device kind " +
                                  DeviceKindName(bound->kind) + " (its index defaults to the group's)");
    }
    if (o.index >= 0 && o.index != bound->index) {
      return InvalidArgumentError("device index " + std::to_string(o.index) + " differs from the '" +
                                  world.backend_name() + "' process group's device " + bound->ToString() +
                                  " (leave the index unset to use the group's)");
    }
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<CachingAllocator>> CreateRankAllocator(Device* device,
                                                                size_t capacity_bytes) {
  if (device == nullptr) return InvalidArgumentError("CreateRankAllocator: no device");
  CachingAllocator::Options options;
  options.capacity_bytes = capacity_bytes;
  const RankDeviceKind* kind = FindKind(device->id().kind);
  if (capacity_bytes == 0 && kind != nullptr && kind->default_capacity != nullptr) {
    SK_ASSIGN_OR_RETURN(options.capacity_bytes, kind->default_capacity(*device));
  }
  return std::make_unique<CachingAllocator>(device, options);
}

StatusOr<std::unique_ptr<CachingAllocator>> CreateRankAllocator(int rank, size_t capacity_bytes) {
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(DeviceId::Cpu(rank)));
  return CreateRankAllocator(device, capacity_bytes);
}

StatusOr<std::unique_ptr<OffloadHost>> CreateOffloadHost(Device* device) {
  if (device == nullptr) return InvalidArgumentError("CreateOffloadHost: no device");
  const RankDeviceKind* kind = FindKind(device->id().kind);
  if (kind == nullptr) {
    return InvalidArgumentError("CreateOffloadHost: " + device->id().ToString() +
                                " is not a kind a rank computes on (" + KindNames() + ")");
  }
  return kind->offload_host(device);
}

StatusOr<std::unique_ptr<Optimizer>> CreateEngineOptimizer(const OptimizerOptions& options,
                                                           DataParallelModel& engine,
                                                           Allocator* offload_state) {
  // With CPU offload the optimizer steps on the host, beside the shards.
  Allocator* state = offload_state != nullptr ? offload_state : &engine.activation_allocator();
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, Optimizer::Create(options, state));
  if (options.param_groups.empty()) return optimizer;
  auto* fsdp = dynamic_cast<FullyShardedModel*>(&engine);
  if (fsdp == nullptr) {
    return UnimplementedError("parameter groups need FSDP (the DDP baseline steps whole parameters "
                              "without them)");
  }
  // A group that matches no parameter is a mistake the header promises to
  // name (a misspelt pattern silently stepped everything with the defaults).
  // A group whose parameters an earlier group decides is allowed: the first
  // group that selects a parameter decides, as documented.
  for (size_t k = 0; k < options.param_groups.size(); ++k) {
    bool matches = false;
    for (int u = 0; u < fsdp->num_units() && !matches; ++u) {
      for (const ParamSpec& p : fsdp->unit(u).params) {
        if (SelectParamGroup({options.param_groups[k]}, fsdp->unit(u).name, p.name, p.shape.rank()) == 0) {
          matches = true;
          break;
        }
      }
    }
    if (matches) continue;
    const ParamGroup& g = options.param_groups[k];
    const UnitSpec& first = fsdp->unit(0);
    return InvalidArgumentError("param_groups[" + std::to_string(k) + "]" +
                                (g.pattern.empty() ? std::string() : " (pattern '" + g.pattern + "')") +
                                " selects no parameter of the model (full names are '<unit>.<param>', e.g. '" +
                                first.name + "." + first.params[0].name + "')");
  }
  // Each parameter's slice of this rank's flat shard steps with its group's values.
  for (int u = 0; u < fsdp->num_units(); ++u) {
    const UnitSpec& unit = fsdp->unit(u);
    std::vector<Optimizer::HyperSegment> segments;
    for (const FlatParamLayout::ShardSlice& s : fsdp->layout(u).ShardSlices(fsdp->shard_group().rank())) {
      const ParamSpec& p = unit.params[s.param];
      const int g = SelectParamGroup(options.param_groups, unit.name, p.name, p.shape.rank());
      if (g < 0) continue;
      const ParamGroup& group = options.param_groups[g];
      Optimizer::HyperSegment h;
      h.begin = s.shard_offset;
      h.end = s.shard_offset + (s.param_end - s.param_begin);
      h.weight_decay = group.weight_decay >= 0 ? group.weight_decay : options.weight_decay;
      h.lr_multiplier = group.lr_multiplier;
      if (h.end > h.begin) segments.push_back(h);
    }
    SK_RETURN_IF_ERROR(optimizer->SetSegments(u, std::move(segments)));
  }
  return optimizer;
}

}  // namespace sk
