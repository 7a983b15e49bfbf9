// Rank set-up: the one place a rank's device, process-group checks,
// caching allocator, offload host and optimizer are built. The Trainer
// (trainer.h) and the caller-driven FsdpEngine (engine.h) both use it.
#ifndef SHARDKIT_RUNTIME_TRAIN_RANK_H_
#define SHARDKIT_RUNTIME_TRAIN_RANK_H_

#include <cstddef>
#include <memory>
#include <string>

#include "runtime/comm/process_group.h"
#include "runtime/core/device_kind.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel.h"

namespace sk {

// Which device a rank computes on. The C ABI's sk_device_options mirror it.
struct DeviceOptions {
  // kCpu (the default), kCuda or kSim.
  DeviceKind kind = DeviceKind::kCpu;
  // The device index; -1 = the rank's: cpu:rank, cuda:(rank modulo the GPUs
  // visible), sim:0 (one simulated rank stands for all).
  int index = -1;
  // Launch blocking (CUDA_LAUNCH_BLOCKING=1's analogue): every launched op,
  // copy and collective completes before the host goes on, so nothing
  // overlaps. cpu: the rank's streams run closures inline
  // (CpuDevice::set_launch_blocking); sim: the host waits for every span.
  // Deterministic memory: a cpu run and its simulation then reserve the same
  // bytes. cuda: InvalidArgument (set CUDA_LAUNCH_BLOCKING=1 instead).
  bool launch_blocking = false;
  // --- kSim only (ignored otherwise) ---
  // A built-in profile name ("a100-80g", "h100-80g", "h200-141g", "cpu-local") or the
  // path of a profile file ending in .json (runtime/sim/profile.h).
  std::string sim_profile = "a100-80g";
  // Ranks of the simulated cluster when the caller passes no process group
  // (the simulated world is then created from the profile); 0 = 1.
  int sim_world_size = 0;
  // GPUs per node of the simulated cluster; 0 = the profile's.
  int sim_gpus_per_node = 0;
};

// "cpu", "cuda", "sim"; and the inverse (InvalidArgument naming the value).
const char* DeviceKindName(DeviceKind kind);
StatusOr<DeviceKind> ParseDeviceKind(const std::string& name);

// InvalidArgument naming the field: an unknown kind, index < -1, negative
// sim sizes, an empty sim_profile for kSim.
Status ValidateDeviceOptions(const DeviceOptions& options);

// The device rank `rank` computes on. cpu: always available. cuda:
// Unavailable when shardkit was built without CUDA or no GPU is visible.
// sim: loads the profile (NotFound / InvalidArgument from the loader), then
// configures sim:index with it and resets its clocks (sim::SetUpSimDevice):
// one Trainer or engine uses a sim device at a time. Sets the device's launch
// blocking mode to options.launch_blocking (cpu, sim): streams created after
// the call get it.
StatusOr<Device*> ResolveRankDevice(const DeviceOptions& options, int rank);
// As above for rank world.rank(); a world bound to one device (nccl:
// world.bound_device()) gives a rank of that kind its device when
// options.index is -1.
StatusOr<Device*> ResolveRankDevice(const DeviceOptions& options, const comm::ProcessGroup& world);

// For kSim: the simulated world, a process group of sim_world_size ranks on
// the profile's cluster (gpus_per_node overridden when > 0) that moves no
// data. InvalidArgument for other kinds; loader errors as above.
StatusOr<std::unique_ptr<comm::ProcessGroup>> CreateSimWorld(const DeviceOptions& options);

// The ranks of this node as the launcher says (LOCAL_WORLD_SIZE, else Open
// MPI's or Slurm's: comm::LocalWorldSizeHint) when it is a positive
// integer, else 0. Read at the launch edge only: the Trainer,
// the engine and the C ABI's estimate pass it on (FsdpOptions::ranks_per_node,
// GEMM threads); the runtime below them reads no environment.
int LocalWorldSizeFromEnvironment();
// The ranks per node of `world` (FsdpOptions::ranks_per_node): a simulated
// world's GPUs per node, else LocalWorldSizeFromEnvironment().
int RanksPerNode(const comm::ProcessGroup& world);
// The same answer before any world exists, from the options a rank's world
// would be made for: a sim device's simulated network (as CreateSimWorld
// reads it, without building the world: the profile's GPUs per node, or
// sim_gpus_per_node), else
// LocalWorldSizeFromEnvironment(). What an estimate made without a Trainer
// (EstimateTrainerMemory) must shard by. Profile errors as CreateSimWorld.
StatusOr<int> RanksPerNode(const DeviceOptions& options);

// InvalidArgument unless `world` suits the device: a sim device needs a sim
// process group ("sim" backend: its collectives move no data), and a sim
// process group needs a sim device; a group bound to a device (nccl) needs
// that device's kind, and that index when options.index is set.
Status CheckWorldForDevice(const DeviceOptions& options, const comm::ProcessGroup& world);

// The caching allocator of `device`, reserving at most `capacity_bytes`
// (0 = unlimited; on a sim device 0 means the profile's memory, the
// simulated GPU's capacity).
StatusOr<std::unique_ptr<CachingAllocator>> CreateRankAllocator(Device* device,
                                                                size_t capacity_bytes);
// The caching allocator of cpu:rank (CreateRankAllocator above).
StatusOr<std::unique_ptr<CachingAllocator>> CreateRankAllocator(int rank, size_t capacity_bytes);

// Where a rank's offloaded FSDP state lives (FsdpOptions::cpu_offload):
// `shards` holds master and gradient shards (FullyShardedModel's offload
// allocator), `optimizer_state` the optimizer's state, and host ops run on
// `stream` (null: the calling thread). Per device kind:
//   cpu:  both HostAllocator::Default(); no stream (host == device).
//   cuda: shards in PinnedHostAllocator (asynchronous copies), optimizer
//         state in HostAllocator::Default() (the host alone reads it).
//   sim:  both in the simulated host memory of the device's profile
//         (sim::SimHostAllocator, its capacity the profile's host memory per
//         GPU) and a host stream on the device (host ops priced at the
//         profile's host rates).
// Must outlive the FSDP model and optimizer that use it.
struct OffloadHost {
  Allocator* shards = nullptr;
  Allocator* optimizer_state = nullptr;
  Stream* stream = nullptr;
  std::unique_ptr<Allocator> owned_allocator;
  std::unique_ptr<Stream> owned_stream;
};
// The offload host of `device` (above). Errors from the sim device.
StatusOr<std::unique_ptr<OffloadHost>> CreateOffloadHost(Device* device);

// An optimizer whose state lives beside the engine's shards: in
// `offload_state` when given (cpu_offload: OffloadHost::optimizer_state),
// else in the engine's device allocator. InvalidArgument from
// ValidateOptimizerOptions. `engine` (and `offload_state`) must outlive the
// optimizer.
StatusOr<std::unique_ptr<Optimizer>> CreateEngineOptimizer(const OptimizerOptions& options,
                                                           DataParallelModel& engine,
                                                           Allocator* offload_state = nullptr);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_RANK_H_
