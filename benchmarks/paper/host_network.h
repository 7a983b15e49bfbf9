// HostNetworkGroup: a two-level network model for one machine pretending to
// be several hosts. Ranks are packed onto hosts of `ranks_per_host` (world
// rank r lives on host r / ranks_per_host). A collective on a group whose
// ranks all live on one host completes per the `intra` link model; one whose
// ranks span hosts per the slower `inter` link (a ring across hosts is
// limited by its slowest hop). Built on NetworkModelProcessGroup: the data
// still moves for real, only completion is delayed.
//
// NetworkModelProcessGroup alone wraps every sub-group with one model, so it
// cannot show hybrid sharding's point (shard within a host over the fast link,
// replicate across hosts over the slow one); this wrapper chooses per
// sub-group, which is all the hybrid harness needs, so it lives here.
//
// It also counts, per rank, the bytes this rank moves over groups that span
// hosts ("cross-host bytes"), as a ring moves them: (n-1)/n of nccl-tests'
// bytes for all_gather and reduce_scatter, 2(n-1)/n for all_reduce, shared by
// the group and all its sub-groups.
//
// Thread safety: as ProcessGroup.
#ifndef SHARDKIT_BENCHMARKS_PAPER_HOST_NETWORK_H_
#define SHARDKIT_BENCHMARKS_PAPER_HOST_NETWORK_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/network_model.h"
#include "runtime/comm/process_group.h"

namespace sk::bench {

class HostNetworkGroup final : public comm::ProcessGroup {
 public:
  // Wraps `world` (a whole world: rank i is world rank i). InvalidArgument
  // unless ranks_per_host >= 1 divides the world size and both links are valid.
  static StatusOr<std::unique_ptr<HostNetworkGroup>> Wrap(std::unique_ptr<comm::ProcessGroup> world,
                                                          int ranks_per_host, comm::LinkModel intra,
                                                          comm::LinkModel inter);

  std::string backend_name() const override { return modelled_->backend_name(); }
  // "local + two-level network model (2 ranks per host; intra: ...; inter: ...)".
  std::string label() const override;
  bool spans_hosts() const { return spans_hosts_; }
  // Cross-host bytes this rank moved, over this group and its sub-groups.
  int64_t cross_host_bytes() const { return counter_->load(); }

  StatusOr<std::unique_ptr<comm::ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                         Duration timeout = kDefaultTimeout) override;

 protected:
  StatusOr<std::shared_ptr<comm::Work>> Launch(comm::Collective c, Stream& stream) override;

 private:
  HostNetworkGroup(std::unique_ptr<comm::NetworkModelProcessGroup> modelled,
                   std::vector<int> world_ranks, int ranks_per_host, comm::LinkModel intra,
                   comm::LinkModel inter, std::shared_ptr<std::atomic<int64_t>> counter);

  std::unique_ptr<comm::NetworkModelProcessGroup> modelled_;
  std::vector<int> world_ranks_;
  int ranks_per_host_;
  comm::LinkModel intra_, inter_;
  bool spans_hosts_;
  std::shared_ptr<std::atomic<int64_t>> counter_;
};

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_HOST_NETWORK_H_
