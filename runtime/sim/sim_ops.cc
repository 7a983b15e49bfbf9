#include "runtime/sim/sim_ops.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/ops/backend.h"

namespace sk::sim {

namespace {

// Ops whose value the host reads (ops::ReadScalar, ops::ReadValues): the host
// waits for them, as a device-to-host copy that the caller uses waits.
bool ReadsToHost(const ops::OpCost& cost) {
  return std::strcmp(cost.name, "read_scalar") == 0 || std::strcmp(cost.name, "read_values") == 0;
}

// Whether a fused attention call is causal self-attention: its cost
// (cost.cc, WithAttentionShape) carries the keys per query rounded up,
// (q_len + 1) / 2 for a causal call of q_len queries, kv_len otherwise (a
// non-causal call matches only with kv_len = (q_len + 1) / 2 keys exactly).
bool CausalAttention(const ops::OpCost& cost) {
  return cost.m > 1 && cost.n == (cost.m + 2) / 2;
}

struct DeviceState {
  std::shared_ptr<const ComputeProfile> compute;
  std::shared_ptr<const std::function<double(double, double)>> adjust;
  // The profile's host rates (null: the profile has no host section).
  std::shared_ptr<const ComputeProfile> host;
};

class SimOpBackend final : public ops::OpBackend {
 public:
  const char* name() const override { return "sim"; }
  bool executes() const override { return false; }
  // The CPU's choice, so that a simulated run allocates what a CPU run does
  // (tests/sim/memory_exact_test.cc).
  bool PrefersFlashAttention(const ops::AttentionShape& s, DType) const override {
    return ops::CpuPrefersFlashAttention(s);
  }

  Status Account(const ops::OpContext& ctx, const ops::OpCost& cost) override {
    if (ctx.stream == nullptr) {
      return InvalidArgumentError(std::string(cost.name) + " on a sim device needs a stream");
    }
    SK_ASSIGN_OR_RETURN(SimDevice * device, SimDevice::For(*ctx.stream));
    const std::shared_ptr<const DeviceState> held = Get(device->id().index);
    const DeviceState& state = *held;
    if (state.compute == nullptr) {
      return FailedPreconditionError(std::string(cost.name) + " on " + device->id().ToString() +
                                     ": the device has no profile (sim::SetUpSimDevice)");
    }
    if (static_cast<const SimStream*>(ctx.stream)->host()) {
      // Host CPU work (offloaded state): host rates, not launched, and not
      // slowed by collectives (they hold GPU SMs, not host cores).
      if (state.host == nullptr) {
        return FailedPreconditionError(std::string(cost.name) + " on the host of " + device->id().ToString() +
                                       ": the profile '" + device->spec().name + "' has no host section");
      }
      SK_ASSIGN_OR_RETURN(SimSpan span, device->EnqueueSpan(*ctx.stream, cost.name, OpSeconds(*state.host, cost),
                                                            {.launch = false, .category = "host"}));
      if (ReadsToHost(cost)) device->WaitHostUntil(span.end_s);
      return OkStatus();
    }
    const double seconds = OpSeconds(*state.compute, cost);
    auto price = [&](double start) {
      return state.adjust != nullptr ? (*state.adjust)(start, seconds) : seconds;
    };
    SK_ASSIGN_OR_RETURN(SimSpan span, device->EnqueueSpan(*ctx.stream, cost.name, price,
                                                          {.launch = true, .category = "compute"}));
    if (ReadsToHost(cost)) device->WaitHostUntil(span.end_s);
    return OkStatus();
  }

  void Set(int index, DeviceState state) {
    std::lock_guard<std::mutex> lock(mu_);
    states_[index] = std::make_shared<const DeviceState>(std::move(state));
  }
  void SetAdjust(int index, std::function<double(double, double)> adjust) {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<const DeviceState>& slot = states_[index];
    DeviceState state = slot != nullptr ? *slot : DeviceState{};
    state.adjust =
        adjust ? std::make_shared<const std::function<double(double, double)>>(std::move(adjust))
               : nullptr;
    slot = std::make_shared<const DeviceState>(std::move(state));
  }
  // The device's state as of now (an empty one for a device never set up).
  // One shared pointer per op, not a copy of the state's three: every
  // simulated op asks (the planner's hot path).
  std::shared_ptr<const DeviceState> Get(int index) {
    static const std::shared_ptr<const DeviceState> kNone = std::make_shared<const DeviceState>();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(index);
    return it == states_.end() || it->second == nullptr ? kNone : it->second;
  }

 private:
  std::mutex mu_;
  // Replaced whole, never changed in place: an op that holds one prices with
  // a consistent state while another thread sets the device up again.
  std::map<int, std::shared_ptr<const DeviceState>> states_;
};

SimOpBackend& Backend() {
  static SimOpBackend* backend = [] {
    auto* b = new SimOpBackend;  // lives for the process: op calls may come at exit
    ops::RegisterOpBackend(DeviceKind::kSim, b);
    return b;
  }();
  return *backend;
}

}  // namespace

double OpSeconds(const ComputeProfile& p, const ops::OpCost& cost) {
  const double bytes = cost.bytes_read + cost.bytes_written;
  switch (cost.cls) {
    case ops::OpClass::kGemm:
      return GemmSeconds(p, cost.m, cost.n, cost.k, cost.batch, cost.dtype, cost.flops, bytes);
    case ops::OpClass::kAttention: {
      auto peak = p.gemm_peak_flops.find(cost.dtype);
      const double peak_rate =
          peak != p.gemm_peak_flops.end() ? peak->second : p.gemm_peak_flops.at(DType::kF32);
      const bool fused = std::strncmp(cost.name, "flash_attention", 15) == 0;
      if (fused && p.attention && cost.composed_kernels > 0) {
        // A CUDA GPU's profile (it measured cuDNN's fused attention): packed
        // documents run the composed attention there, every score pair
        // through cuBLAS at the GEMM fraction and the f32 probabilities
        // through memory between its kernels (cost.h), not the masked
        // pairs, and not the fused kernel's measured rate.
        auto by_dtype = p.gemm_efficiency_by_dtype.find(cost.dtype);
        const double rate =
            peak_rate * (by_dtype != p.gemm_efficiency_by_dtype.end() ? by_dtype->second : p.gemm_efficiency);
        const double memory = p.memory_bandwidth > 0 ? cost.composed_bytes / p.memory_bandwidth : 0;
        return std::max(cost.composed_flops / rate, memory) + cost.composed_kernels * p.kernel_overhead_s;
      }
      if (p.op_rates.count(std::string_view(cost.name)) != 0) {
        return KernelSeconds(p, cost.name, cost.flops, bytes);
      }
      // A fused kernel with a measured efficiency (profile.h); otherwise
      // tensor-core math at the GEMM fraction.
      const double efficiency =
          fused && p.attention
              ? AttentionEfficiency(p, std::strcmp(cost.name, "flash_attention_bwd") == 0,
                                    cost.m, cost.n, cost.batch, cost.k, CausalAttention(cost))
              : p.gemm_efficiency;
      const double rate = peak_rate * efficiency;
      const double memory = p.memory_bandwidth > 0 ? bytes / p.memory_bandwidth : 0;
      return std::max(cost.flops / rate, memory) + p.kernel_overhead_s;
    }
    default:
      return KernelSeconds(p, cost.name, cost.flops, bytes);
  }
}

StatusOr<SimDevice*> SetUpSimDevice(int index, const SimProfile& profile) {
  SimOpBackend& backend = Backend();
  SK_ASSIGN_OR_RETURN(SimDevice * device, SimDevice::Get(index));
  SK_RETURN_IF_ERROR(device->Configure(profile.device));
  device->ResetClocks();
  backend.Set(index, DeviceState{std::make_shared<const ComputeProfile>(profile.compute), nullptr,
                                 profile.host ? std::make_shared<const ComputeProfile>(*profile.host)
                                              : nullptr});
  return device;
}

void SetComputeAdjustment(int index, std::function<double(double, double)> adjust) {
  Backend().SetAdjust(index, std::move(adjust));
}

}  // namespace sk::sim
