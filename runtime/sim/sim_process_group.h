// SimProcessGroup: a comm::ProcessGroup of any world size whose collectives
// move no data and complete on virtual time.
//
// Data parallelism is symmetric: every rank issues the same collectives on
// the same sizes at the same moments, so one simulated rank stands for all.
// A SimProcessGroup is that rank's handle on a world of `world_size` ranks
// packed onto nodes of the profile's gpus_per_node (world rank r is GPU r of
// the cluster, on node r / gpus_per_node). Its peers never need to arrive:
// they are itself. Each collective
//   - is validated as on every backend (process_group.h),
//   - is priced by the topology (comm::PlanCollective: NCCL's algorithm
//     choice for this group's placement on the cluster), and booked on the
//     simulated GPU's links (LinkSchedule), so collectives in flight at once
//     share NVLink and the NICs,
//   - becomes one launched span of virtual time on the caller's sim stream
//     (SimDevice::EnqueueSpan, category "comm"), starting when the stream,
//     the host launch and the events the stream waits for allow, and not
//     before the group's previous collective has ended: a group is one NCCL
//     communicator, and NCCL runs a communicator's operations one after
//     another in the order issued, whichever streams they were issued on
//     (it orders them on the communicator's own internal stream; NCCL's
//     user guide, "Using multiple NCCL communicators concurrently", and
//     ProcessGroupNCCL, which gives each group one NCCL stream per device).
//     So an all-gather issued behind a reduce-scatter on the same group
//     waits for it even on another stream (why the order in which FSDP
//     issues prefetches matters on real hardware),
//   - returns a Work whose event is recorded on the stream right after the
//     span: Work::wait moves the host clock to the span's end, other streams
//     can WaitEvent on it, is_completed compares with the host clock.
// Tensors keep their (absent) data: a sim tensor has none.
//
// Sub-groups (NewGroup, and so DeviceMesh's shard and replicate groups) are
// SimProcessGroups over the named ranks' cluster positions (each its own
// communicator, whose collectives may overlap the parent's), sharing the
// parent's LinkSchedule: FSDP's shard group inside a node is priced on
// NVLink, its replica group across nodes on the NICs, and the two compete
// only for the links they both use.
//
// Timeouts: peers always arrive, so a collective never times out; its options
// are validated and otherwise unused.
//
// Thread safety: as ProcessGroup. The LinkSchedule is shared by a group and
// its sub-groups and locks itself.
#ifndef SHARDKIT_RUNTIME_SIM_SIM_PROCESS_GROUP_H_
#define SHARDKIT_RUNTIME_SIM_SIM_PROCESS_GROUP_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/comm/topology.h"
#include "runtime/sim/topology.h"

namespace sk::sim {

class SimProcessGroup final : public comm::ProcessGroup {
 public:
  // The most ranks a simulated world has: 2^20, beyond the largest clusters
  // built. Groups list their ranks' positions, so memory and set-up time
  // grow with the world; 2^20 ranks take ~20 ms per planned candidate.
  static constexpr int kMaxWorldSize = 1 << 20;

  // The world's handle for `rank` (default 0; by symmetry any rank prices
  // the same) among `world_size` ranks on `profile`'s cluster.
  // InvalidArgument if the profile is invalid, world_size is outside
  // [1, kMaxWorldSize] or rank is outside [0, world_size).
  static StatusOr<std::unique_ptr<SimProcessGroup>> Create(const comm::NetworkProfile& profile,
                                                           int world_size, int rank = 0);

  std::string backend_name() const override { return "sim"; }
  // "sim (a100-80g: 16 ranks on 2 nodes (8 or more per node))".
  std::string label() const override;

  const comm::NetworkProfile& profile() const { return *profile_; }
  // Where this group's ranks sit on the cluster.
  const comm::GroupPlacement& placement() const { return placement_; }
  // Cluster positions of this group's ranks, in group-rank order.
  const std::vector<int>& positions() const { return positions_; }
  // The simulated GPU's links, shared with the parent and sub-groups. Reset
  // (Clear) it together with the device's clocks when a new simulation starts.
  LinkSchedule& links() const { return *links_; }

  // What `kind` moving `bytes` would cost on this group, alone on the links.
  StatusOr<comm::CollectivePlan> Plan(comm::CollectiveKind kind, size_t bytes) const;

  // Immediate (no peer to wait for). InvalidArgument as ValidateGroupRanks.
  StatusOr<std::unique_ptr<comm::ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                         Duration timeout = kDefaultTimeout) override;

 protected:
  // InvalidArgument unless `stream` is a sim stream.
  StatusOr<std::shared_ptr<comm::Work>> Launch(comm::Collective c, Stream& stream) override;

 private:
  SimProcessGroup(std::shared_ptr<const comm::NetworkProfile> profile, std::vector<int> positions,
                  comm::GroupPlacement placement, int rank, std::shared_ptr<LinkSchedule> links);

  const std::shared_ptr<const comm::NetworkProfile> profile_;
  const std::vector<int> positions_;
  const comm::GroupPlacement placement_;
  const std::shared_ptr<LinkSchedule> links_;
  // This group's communicator in links_ (SetCommunicatorFreeAt).
  const uint64_t communicator_id_;
  // Held from reading the communicator's free time to booking the next
  // collective, so calls from several threads queue in the order issued.
  std::mutex issue_mu_;
};

}  // namespace sk::sim

#endif  // SHARDKIT_RUNTIME_SIM_SIM_PROCESS_GROUP_H_
