// The simulated cluster's network: its profile, read from the "network"
// section of a hardware profile (runtime/sim/profiles/*.json), and its links
// shared on virtual time by the collectives in flight.
//
// The cost of one collective alone is comm::PlanCollective (topology.h in
// runtime/comm, shared with the network-model wrapper of real groups). What
// the simulator adds is sharing: data parallelism is symmetric, so one
// simulated GPU stands for all, and what it has to share are its own links:
// its NVLink bandwidth and its share of its node's NICs. Every collective the
// simulated rank runs, in any of its groups (the world, FSDP's shard group,
// its replica group), books those links on virtual time in a LinkSchedule.
//
// Sharing rule (work-conserving, in booking order). A collective starting at
// t first waits its latency, then moves its bus bytes at the highest rate its
// links allow: at most its rate alone, and no more than the capacity earlier
// bookings leave free on each link it uses at each instant. So two
// collectives that overlap on a link never move more bytes per second than
// the link carries, and together they end when the link has carried both
// (e.g. FSDP's prefetched all-gather and a reduce-scatter in flight at once);
// which of them finishes first follows booking order, the order the host
// issued them (NCCL's concurrent kernels share in ways not modelled here).
// Collectives on different links (an NVLink shard group and a NIC replica
// group) do not slow each other.
//
// The JSON. Every number is {"value": x, "source": "where it comes from"}:
//   "network": {
//     "gpus_per_node": N,
//     "nvlink": {"links_per_gpu": N, "link_bandwidth_gbps": N},
//     "nic": {"per_node": N, "bandwidth_gbps": N, "efficiency": N},
//     "algorithms": {
//       "ring": {"simple": PAIR, "ll": PAIR, "ll128": PAIR},
//       "tree": {"simple": PAIR, "ll": PAIR, "ll128": PAIR}},
//     "compute_slowdown_while_communicating": N,
//     "measured_bus_bandwidth": [CURVE, ...],   (optional)
//     "note": "free text"}
//   CURVE = {"collectives": ["all_reduce", ...], "ranks": N, "nodes": N,
//            "points": [[bytes, busbw GB/s], ...], "source": "..."}: a
//          published nccl-tests curve (comm::MeasuredBusBandwidth), which
//          prices the collectives it covers instead of the tuning model.
//   PAIR = {"base_latency_us": N, "intra_step_latency_us": N,
//           "inter_step_latency_us": N, "bandwidth_fraction": N}
//          or {"enabled": false, "source": "why"}.
// Unknown keys are errors (a misspelt key must not silently become a default).
#ifndef SHARDKIT_RUNTIME_SIM_TOPOLOGY_H_
#define SHARDKIT_RUNTIME_SIM_TOPOLOGY_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/comm/topology.h"
#include "runtime/core/status.h"

namespace sk::sim {

// The "network" section of a profile (profile.h's SimProfile::network).
// InvalidArgument naming the JSON path
// of the first missing, unknown or malformed entry ("network.nic.per_node:
// ..."), or the field comm::NetworkProfile::Validate refuses. The result's
// `sources` maps each number's path below "network" to its source; its name
// is empty (the caller names the profile).
StatusOr<comm::NetworkProfile> ParseNetworkProfile(const nlohmann::json& network);

// The links of the simulated GPU on virtual time (see the file comment).
//
// Thread safety: all methods may be called from any thread (one mutex).
class LinkSchedule {
 public:
  // Which links a booking used and when it ran.
  struct Booking {
    double start_s = 0;     // when the collective began (its latency first)
    double end_s = 0;       // when its last byte arrived
    double alone_s = 0;     // what it would have taken with the links to itself
  };

  // Books `plan` starting at `start_s` (>= 0, finite) and returns when it
  // ends: start + latency + the bus bytes at the rate the links leave it.
  // A plan that moves no bytes, or uses no link, ends after its latency.
  Booking Book(const comm::CollectivePlan& plan, double start_s);

  // The fraction of [t0, t1) during which some booked collective runs (from
  // its start to its end: its kernel holds SMs while it waits, too), for the
  // compute slow-down while communicating; 0 if t1 <= t0.
  double BusyFraction(double t0, double t1) const;

  // Drops what is booked before `t_s`: later bookings must start at or after
  // it (the simulator's clocks only move forward). Keeps memory bounded.
  void ForgetBefore(double t_s);

  // Bus bytes of every booking whose group spans nodes (its plan uses the
  // network), since the last Clear(): what this GPU's share of its node's
  // NICs carried. ForgetBefore keeps it.
  double network_bus_bytes() const;

  // Forgets everything (a new simulation, clocks back at 0).
  void Clear();

  // When the last collective booked on communicator `id` ends (0 if none
  // since Clear): NCCL runs one communicator's collectives one after
  // another in the order issued, whatever streams they are on, so the next
  // one starts no earlier. ForgetBefore keeps these.
  double CommunicatorFreeAt(uint64_t id) const;
  void SetCommunicatorFreeAt(uint64_t id, double end_s);

 private:
  // Usage of each link over time: a step function, value from each key's
  // time up to the next key's. Link 0 = NVLink, 1 = network.
  using Usage = std::map<double, double>;
  static constexpr int kLinks = 2;

  static double At(const Usage& u, double t);
  // Makes `t` a breakpoint of `u` (keeping the step function unchanged).
  static void Split(Usage& u, double t);

  mutable std::mutex mu_;
  Usage usage_[kLinks];
  double network_bus_bytes_ = 0;
  Usage busy_;  // number of collectives running
  std::map<uint64_t, double> communicator_free_at_;
};

}  // namespace sk::sim

#endif  // SHARDKIT_RUNTIME_SIM_TOPOLOGY_H_
