// The op backend of sim devices: prices every op from its declared cost
// (runtime/ops/cost.h) with the device's profile, on ctx.stream's virtual
// clock, and executes nothing.
//
// Each op becomes one launched span (SimDevice::EnqueueSpan) named after the
// op ("gemm", "layer_norm_fwd", ...) on the compute track of its stream:
// the host pays the profile's launch overhead, the stream runs the op for
// OpSeconds(profile, cost). ops::ReadScalar is a device-to-host read: the
// host waits for the stream to reach it (as loss.item() synchronises on a
// GPU) and the value is NaN, which callers label "simulated".
//
// Ops on a host stream (SimDevice::CreateHostStream: FSDP's offloaded state)
// are priced with the profile's host rates (SimProfile::host) instead, as
// unlaunched spans on the "host" track; FailedPrecondition when the profile
// has no host section.
//
// Setup: SetUpSimDevice(index, profile) configures sim:index (memory,
// launch and raw allocation costs) and its compute pricing, and registers
// this backend for DeviceKind::kSim. Ops on a sim device that was never set
// up fail with FailedPrecondition naming the device.
//
// Thread safety: all functions may be called from any thread.
#ifndef SHARDKIT_RUNTIME_SIM_SIM_OPS_H_
#define SHARDKIT_RUNTIME_SIM_SIM_OPS_H_

#include <functional>

#include "runtime/core/status.h"
#include "runtime/ops/cost.h"
#include "runtime/sim/profile.h"
#include "runtime/sim/sim_device.h"

namespace sk::sim {

// Configures sim:index from `profile` (SimDevice::Configure, then
// ResetClocks) and sets its compute pricing; registers the sim op backend.
// Errors as SimDevice::Get and SimDevice::Configure.
StatusOr<SimDevice*> SetUpSimDevice(int index, const SimProfile& profile);

// Seconds `cost` takes under `p` (profile.h's formulas): GEMMs by their
// shape, attention as tensor-core math at the GEMM efficiency (no shape
// quantisation), everything else bandwidth- or flop-bound. Pure.
double OpSeconds(const ComputeProfile& p, const ops::OpCost& cost);

// Lets the network model slow compute while collectives run (the profile's
// comm-slows-compute factor): `adjust(start_s, seconds)` returns the
// duration a compute op starting at start_s takes instead of `seconds`. It
// runs under sim:index's device mutex and must not call that device.
// nullptr removes it. The adjustment is also cleared by SetUpSimDevice.
void SetComputeAdjustment(int index, std::function<double(double start_s, double seconds)> adjust);

}  // namespace sk::sim

#endif  // SHARDKIT_RUNTIME_SIM_SIM_OPS_H_
