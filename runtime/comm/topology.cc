#include "runtime/comm/topology.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include <sstream>

namespace sk::comm {

namespace {

constexpr LinkAlgorithm kAlgorithms[] = {LinkAlgorithm::kRing, LinkAlgorithm::kTree};
constexpr LinkProtocol kProtocols[] = {LinkProtocol::kSimple, LinkProtocol::kLL,
                                       LinkProtocol::kLL128};

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

bool Finite(double v) { return std::isfinite(v); }

Status Bad(const NetworkProfile& p, const std::string& what) {
  return InvalidArgumentError("network profile '" + p.name + "': " + what);
}

std::string PairName(LinkAlgorithm a, LinkProtocol p) {
  return std::string(LinkAlgorithmName(a)) + "/" + LinkProtocolName(p);
}

}  // namespace

const char* LinkAlgorithmName(LinkAlgorithm a) {
  switch (a) {
    case LinkAlgorithm::kRing: return "ring";
    case LinkAlgorithm::kTree: return "tree";
  }
  return "unknown_algorithm";
}

const char* LinkProtocolName(LinkProtocol p) {
  switch (p) {
    case LinkProtocol::kSimple: return "simple";
    case LinkProtocol::kLL: return "ll";
    case LinkProtocol::kLL128: return "ll128";
  }
  return "unknown_protocol";
}

Status NetworkProfile::Validate() const {
  if (gpus_per_node < 1) return Bad(*this, "gpus_per_node must be >= 1");
  if (nics_per_node < 1) return Bad(*this, "nics_per_node must be >= 1");
  if (nvlink_links_per_gpu < 0) return Bad(*this, "nvlink_links_per_gpu must be >= 0");
  if (gpus_per_node > 1) {
    if (nvlink_links_per_gpu < 1) {
      return Bad(*this, "nvlink_links_per_gpu must be >= 1 with several GPUs per node");
    }
    if (!(nvlink_link_gbps > 0) || !Finite(nvlink_link_gbps)) {
      return Bad(*this, "nvlink_link_gbps must be > 0 with several GPUs per node");
    }
  }
  if (!(nic_gbps > 0) || !Finite(nic_gbps)) return Bad(*this, "nic_gbps must be > 0");
  if (!(nic_efficiency > 0 && nic_efficiency <= 1)) {
    return Bad(*this, "nic_efficiency must be in (0, 1]");
  }
  if (!(compute_slowdown_while_communicating >= 1) ||
      !Finite(compute_slowdown_while_communicating)) {
    return Bad(*this, "compute_slowdown_while_communicating must be >= 1");
  }
  for (LinkAlgorithm a : kAlgorithms) {
    bool any = false;
    for (LinkProtocol p : kProtocols) {
      const AlgorithmCost& c = cost(a, p);
      if (!c.enabled) continue;
      any = true;
      for (double lat : {c.base_latency_us, c.intra_step_latency_us, c.inter_step_latency_us}) {
        if (!(lat >= 0) || !Finite(lat)) {
          return Bad(*this, PairName(a, p) + " latencies must be >= 0 and finite");
        }
      }
      if (!(c.bandwidth_fraction > 0 && c.bandwidth_fraction <= 1)) {
        return Bad(*this, PairName(a, p) + " bandwidth_fraction must be in (0, 1]");
      }
    }
    if (!any) return Bad(*this, std::string("no protocol enabled for ") + LinkAlgorithmName(a));
  }
  for (size_t i = 0; i < measured.size(); ++i) {
    const MeasuredBusBandwidth& m = measured[i];
    const std::string what = "measured curve " + std::to_string(i) + ": ";
    if (m.kinds.empty()) return Bad(*this, what + "names no collective");
    if (m.ranks < 2) return Bad(*this, what + "ranks must be >= 2");
    if (m.nodes < 1 || m.ranks % m.nodes != 0) {
      return Bad(*this, what + "nodes must be >= 1 and divide ranks");
    }
    if (m.bytes.size() < 2 || m.bytes.size() != m.busbw_gbps.size()) {
      return Bad(*this, what + "needs at least two (bytes, busbw) points");
    }
    for (size_t j = 0; j < m.bytes.size(); ++j) {
      if (!(m.bytes[j] > 0) || !Finite(m.bytes[j]) || (j > 0 && !(m.bytes[j] > m.bytes[j - 1]))) {
        return Bad(*this, what + "sizes must be positive and increasing");
      }
      if (!(m.busbw_gbps[j] > 0) || !Finite(m.busbw_gbps[j])) {
        return Bad(*this, what + "bus bandwidths must be positive and finite");
      }
    }
  }
  return OkStatus();
}

bool MeasuredBusBandwidth::Covers(CollectiveKind kind, int group_ranks, int group_nodes,
                                  int min_ranks_per_node) const {
  if (group_ranks != ranks || group_nodes != nodes || min_ranks_per_node * nodes != ranks) {
    return false;
  }
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

double MeasuredBusBandwidth::BusBandwidthGbpsAt(double message_bytes) const {
  if (message_bytes >= bytes.back()) return busbw_gbps.back();
  if (message_bytes <= bytes.front()) {
    // Latency-bound: the smallest size's time, so the rate scales with size.
    return busbw_gbps.front() * message_bytes / bytes.front();
  }
  const size_t j = static_cast<size_t>(
      std::upper_bound(bytes.begin(), bytes.end(), message_bytes) - bytes.begin());
  const double x0 = std::log2(bytes[j - 1]);
  const double x1 = std::log2(bytes[j]);
  const double t = (std::log2(message_bytes) - x0) / (x1 - x0);
  return busbw_gbps[j - 1] + t * (busbw_gbps[j] - busbw_gbps[j - 1]);
}

double MeasuredBusBandwidth::PeakGbps() const {
  return *std::max_element(busbw_gbps.begin(), busbw_gbps.end());
}

NetworkProfile NetworkProfile::SingleLink(double latency_us, double bandwidth_gbps) {
  NetworkProfile p;
  p.name = "single link";
  p.gpus_per_node = 1;
  p.nics_per_node = 1;
  p.nic_gbps = bandwidth_gbps;
  for (LinkAlgorithm a : kAlgorithms) {
    for (LinkProtocol proto : kProtocols) p.cost(a, proto).enabled = false;
    AlgorithmCost& c = p.cost(a, LinkProtocol::kSimple);
    c.enabled = true;
    c.intra_step_latency_us = latency_us;
    c.inter_step_latency_us = latency_us;
  }
  return p;
}

StatusOr<GroupPlacement> GroupPlacement::Of(const std::vector<int>& positions, int gpus_per_node) {
  if (gpus_per_node < 1) {
    return InvalidArgumentError("group placement: gpus_per_node must be >= 1, got " +
                                std::to_string(gpus_per_node));
  }
  if (positions.empty()) return InvalidArgumentError("group placement of no ranks");
  // Sorted, so that repeats are neighbours and each node's ranks a run: a
  // simulated world of a million GPUs places its groups in milliseconds
  // (a std::set and std::map took seconds per candidate in the planner).
  std::vector<int> sorted = positions;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0) {
    return InvalidArgumentError("group placement: negative position " + std::to_string(sorted.front()));
  }
  GroupPlacement g;
  g.ranks = static_cast<int>(sorted.size());
  g.nodes = 0;
  g.min_ranks_per_node = std::numeric_limits<int>::max();
  for (size_t i = 0; i < sorted.size();) {
    const int node = sorted[i] / gpus_per_node;
    size_t j = i;
    for (; j < sorted.size() && sorted[j] / gpus_per_node == node; ++j) {
      if (j > i && sorted[j] == sorted[j - 1]) {
        return InvalidArgumentError("group placement: position " + std::to_string(sorted[j]) + " repeated");
      }
    }
    ++g.nodes;
    g.min_ranks_per_node = std::min(g.min_ranks_per_node, static_cast<int>(j - i));
    i = j;
  }
  return g;
}

StatusOr<GroupPlacement> GroupPlacement::Packed(int n, int gpus_per_node) {
  if (n < 1) return InvalidArgumentError("group placement of " + std::to_string(n) + " ranks");
  std::vector<int> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = i;
  return Of(positions, gpus_per_node);
}

std::string GroupPlacement::ToString() const {
  std::ostringstream os;
  os << ranks << (ranks == 1 ? " rank" : " ranks") << " on " << nodes
     << (nodes == 1 ? " node" : " nodes") << " (" << min_ranks_per_node
     << (nodes == 1 ? "" : " or more") << " per node)";
  return os.str();
}

double CollectivePlan::seconds() const {
  if (bus_bytes_per_s <= 0) return latency_s;
  return latency_s + bus_bytes / bus_bytes_per_s;
}

std::string CollectivePlan::ToString() const {
  std::ostringstream os;
  os.precision(3);
  os << CollectiveName(kind) << " " << bytes << " B: "
     << (measured ? std::string("nccl-tests curve") : PairName(algorithm, protocol)) << ", "
     << seconds() * 1e6 << " us (" << latency_s * 1e6 << " us latency, " << bus_bytes_per_s / 1e9
     << " GB/s bus)";
  return os.str();
}

double BusBandwidthFactor(CollectiveKind kind, int ranks) {
  const double n = ranks;
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      return (n - 1) / n;
    case CollectiveKind::kAllReduce:
      return 2 * (n - 1) / n;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kBarrier:
      return 1.0;
  }
  return 1.0;
}

namespace {

// PlanCollective with the algorithm and protocol forced, for a profile
// already validated (the tuner's loop validates once, not once per pair).
StatusOr<CollectivePlan> PlanValidated(const NetworkProfile& profile, CollectiveKind kind,
                                       size_t bytes, const GroupPlacement& group,
                                       LinkAlgorithm algorithm, LinkProtocol protocol) {
  if (group.ranks < 1 || group.nodes < 1 || group.min_ranks_per_node < 1 ||
      group.nodes > group.ranks || group.min_ranks_per_node * group.nodes > group.ranks) {
    return InvalidArgumentError("inconsistent group placement: " + group.ToString());
  }
  if (group.min_ranks_per_node > profile.gpus_per_node) {
    return InvalidArgumentError("group of " + group.ToString() + " does not fit nodes of " +
                                std::to_string(profile.gpus_per_node) + " GPUs (profile '" +
                                profile.name + "')");
  }
  const AlgorithmCost& cost = profile.cost(algorithm, protocol);
  if (!cost.enabled) {
    return InvalidArgumentError("network profile '" + profile.name + "' has " +
                                PairName(algorithm, protocol) + " disabled");
  }
  CollectivePlan plan;
  plan.kind = kind;
  plan.bytes = kind == CollectiveKind::kBarrier ? 0 : bytes;
  plan.algorithm = algorithm;
  plan.protocol = protocol;
  const int n = group.ranks;
  const int nodes = group.nodes;
  const int k = group.min_ranks_per_node;
  if (n == 1) return plan;

  // Steps, split into those inside nodes and those across them.
  const bool all_reduce = kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kBarrier;
  const int passes = all_reduce ? 2 : 1;
  double intra_steps = 0;
  double inter_steps = 0;
  double factor = BusBandwidthFactor(kind == CollectiveKind::kBarrier ? CollectiveKind::kAllReduce : kind, n);
  if (algorithm == LinkAlgorithm::kRing) {
    inter_steps = passes * (nodes - 1);
    intra_steps = passes * (n - 1) - inter_steps;
  } else {
    intra_steps = passes * (k - 1);
    inter_steps = passes * CeilLog2(nodes);
    // A binomial broadcast forwards the whole buffer at every level.
    if (kind == CollectiveKind::kBroadcast) factor = intra_steps + inter_steps;
  }
  plan.latency_s = (cost.base_latency_us + intra_steps * cost.intra_step_latency_us +
                    inter_steps * cost.inter_step_latency_us) *
                   1e-6;
  plan.bus_bytes = factor * static_cast<double>(plan.bytes);

  // The slowest link the group crosses, in bytes/s.
  const double f = cost.bandwidth_fraction;
  double rate = std::numeric_limits<double>::infinity();
  if (k >= 2) {
    const double nvlink = profile.intra_node_gbps() * 1e9;
    rate = std::min(rate, nvlink);
    plan.nvlink_use_per_byte_s = 1.0 / (f * nvlink);
  }
  if (nodes > 1) {
    const double network = k * profile.node_network_gbps() * 1e9 / profile.gpus_per_node;
    rate = std::min(rate, network);
    plan.network_use_per_byte_s = 1.0 / (f * network);
  }
  plan.bus_bytes_per_s = f * rate;
  return plan;
}

}  // namespace

StatusOr<CollectivePlan> PlanCollective(const NetworkProfile& profile, CollectiveKind kind,
                                        size_t bytes, const GroupPlacement& group,
                                        LinkAlgorithm algorithm, LinkProtocol protocol) {
  SK_RETURN_IF_ERROR(profile.Validate());
  return PlanValidated(profile, kind, bytes, group, algorithm, protocol);
}

StatusOr<CollectivePlan> PlanCollective(const NetworkProfile& profile, CollectiveKind kind,
                                        size_t bytes, const GroupPlacement& group) {
  SK_RETURN_IF_ERROR(profile.Validate());
  StatusOr<CollectivePlan> best = InternalError("no algorithm enabled");
  for (LinkAlgorithm a : kAlgorithms) {
    // NCCL's tree serves all_reduce only (barrier is one).
    if (a == LinkAlgorithm::kTree && kind != CollectiveKind::kAllReduce &&
        kind != CollectiveKind::kBarrier) {
      continue;
    }
    for (LinkProtocol p : kProtocols) {
      if (!profile.cost(a, p).enabled) continue;
      StatusOr<CollectivePlan> plan = PlanValidated(profile, kind, bytes, group, a, p);
      SK_RETURN_IF_ERROR(plan.status());
      // Strictly less: ties keep the earlier pair (ring before tree, Simple first).
      if (!best.ok() || plan->seconds() < best->seconds()) best = std::move(plan);
    }
  }
  if (!best.ok() || group.ranks == 1 || best->bus_bytes <= 0) return best;
  for (const MeasuredBusBandwidth& m : profile.measured) {
    if (!m.Covers(kind, group.ranks, group.nodes, group.min_ranks_per_node)) continue;
    // The curve's time is NCCL's whole time, latency included: no separate
    // latency, the bus bytes at the measured rate. Each link it crosses is
    // full at the curve's peak.
    CollectivePlan& plan = *best;
    plan.measured = true;
    plan.latency_s = 0;
    plan.bus_bytes_per_s = m.BusBandwidthGbpsAt(static_cast<double>(plan.bytes)) * 1e9;
    const double peak = m.PeakGbps() * 1e9;
    if (plan.nvlink_use_per_byte_s > 0) plan.nvlink_use_per_byte_s = 1.0 / peak;
    if (plan.network_use_per_byte_s > 0) plan.network_use_per_byte_s = 1.0 / peak;
    break;
  }
  return best;
}

}  // namespace sk::comm
