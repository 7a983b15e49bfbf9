#include "benchmarks/paper/host_network.h"

namespace sk::bench {

namespace {

bool SpansHosts(const std::vector<int>& world_ranks, int ranks_per_host) {
  for (int r : world_ranks) {
    if (r / ranks_per_host != world_ranks.front() / ranks_per_host) return true;
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<HostNetworkGroup>> HostNetworkGroup::Wrap(
    std::unique_ptr<comm::ProcessGroup> world, int ranks_per_host, comm::LinkModel intra,
    comm::LinkModel inter) {
  if (world == nullptr) return InvalidArgumentError("HostNetworkGroup wraps a null group");
  if (ranks_per_host < 1 || world->size() % ranks_per_host != 0) {
    return InvalidArgumentError("HostNetworkGroup: ranks_per_host " + std::to_string(ranks_per_host) +
                                " must divide the world size " + std::to_string(world->size()));
  }
  std::vector<int> ranks(world->size());
  for (int i = 0; i < world->size(); ++i) ranks[i] = i;
  if (intra.latency_us < 0 || !(intra.bandwidth_gbps > 0)) {
    return InvalidArgumentError("HostNetworkGroup: invalid intra-host link " + intra.ToString());
  }
  const bool spans = SpansHosts(ranks, ranks_per_host);
  SK_ASSIGN_OR_RETURN(auto modelled,
                      comm::NetworkModelProcessGroup::Wrap(std::move(world), spans ? inter : intra));
  return std::unique_ptr<HostNetworkGroup>(
      new HostNetworkGroup(std::move(modelled), std::move(ranks), ranks_per_host, intra, inter,
                           std::make_shared<std::atomic<int64_t>>(0)));
}

HostNetworkGroup::HostNetworkGroup(std::unique_ptr<comm::NetworkModelProcessGroup> modelled,
                                   std::vector<int> world_ranks, int ranks_per_host,
                                   comm::LinkModel intra, comm::LinkModel inter,
                                   std::shared_ptr<std::atomic<int64_t>> counter)
    : ProcessGroup(modelled->rank(), modelled->size()), modelled_(std::move(modelled)),
      world_ranks_(std::move(world_ranks)), ranks_per_host_(ranks_per_host), intra_(intra),
      inter_(inter), spans_hosts_(SpansHosts(world_ranks_, ranks_per_host)),
      counter_(std::move(counter)) {}

std::string HostNetworkGroup::label() const {
  return modelled_->inner().label() + " + two-level network model (" +
         std::to_string(ranks_per_host_) + " ranks per host; intra-host: " + intra_.ToString() +
         "; inter-host: " + inter_.ToString() + ")";
}

StatusOr<std::unique_ptr<comm::ProcessGroup>> HostNetworkGroup::NewGroup(
    const std::vector<int>& ranks, Duration timeout) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> sub,
                      modelled_->inner().NewGroup(ranks, timeout));
  std::vector<int> world_ranks;
  for (int r : ranks) world_ranks.push_back(world_ranks_[r]);
  const bool spans = SpansHosts(world_ranks, ranks_per_host_);
  SK_ASSIGN_OR_RETURN(auto modelled,
                      comm::NetworkModelProcessGroup::Wrap(std::move(sub), spans ? inter_ : intra_));
  return std::unique_ptr<comm::ProcessGroup>(new HostNetworkGroup(
      std::move(modelled), std::move(world_ranks), ranks_per_host_, intra_, inter_, counter_));
}

StatusOr<std::shared_ptr<comm::Work>> HostNetworkGroup::Launch(comm::Collective c, Stream& stream) {
  if (spans_hosts_ && size() > 1) {
    const double n = size();
    double factor = 0;
    switch (c.kind) {
      case comm::CollectiveKind::kAllGather:
      case comm::CollectiveKind::kReduceScatter:
        factor = (n - 1) / n;
        break;
      case comm::CollectiveKind::kAllReduce:
        factor = 2 * (n - 1) / n;
        break;
      case comm::CollectiveKind::kBroadcast:
        factor = 1;
        break;
      case comm::CollectiveKind::kBarrier:
        break;
    }
    counter_->fetch_add(static_cast<int64_t>(factor * static_cast<double>(c.nccl_bytes())));
  }
  comm::ProcessGroup& g = *modelled_;
  switch (c.kind) {
    case comm::CollectiveKind::kAllGather:
      return g.all_gather_coalesced(c.outputs, c.inputs, stream, {c.timeout});
    case comm::CollectiveKind::kReduceScatter:
      return g.reduce_scatter_coalesced(c.outputs, c.inputs, stream,
                                        {c.op, c.pre_scale, c.post_scale, c.timeout});
    case comm::CollectiveKind::kAllReduce:
      return g.all_reduce_coalesced(c.outputs, stream, {c.op, c.pre_scale, c.post_scale, c.timeout});
    case comm::CollectiveKind::kBroadcast:
      return g.broadcast_coalesced(c.outputs, stream, {c.root, c.timeout});
    case comm::CollectiveKind::kBarrier:
      return g.barrier(stream, {c.timeout});
  }
  return InternalError("unknown collective " + c.Describe());
}

}  // namespace sk::bench
