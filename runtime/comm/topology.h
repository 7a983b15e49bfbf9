// Topology: how long a collective takes on a cluster of nodes, as NCCL's
// ring and tree algorithms would run it.
//
// One model serves two users: the network-model wrapper of a real process
// group (network_model.h, a single link: every rank its own node) and the
// simulator's process group (runtime/sim, a cluster of nodes x GPUs).
//
// The cluster. `gpus_per_node` GPUs per node. Inside a node every GPU reaches
// every other through NVLink/NVSwitch at the same rate (NVSwitch is
// non-blocking), so the intra-node bandwidth of a GPU is its NVLink links x
// the rate of one link. Across nodes a node has `nics_per_node` NICs of one
// rate; data parallelism is symmetric, so when a group of k GPUs per node
// runs a collective, the node's other GPUs run the same collective in their
// own sibling groups (FSDP: every shard index has its replica group) and the
// node's NIC bandwidth is shared among gpus_per_node / k groups.
//
// The time of one collective (bytes as nccl-tests count them: all_gather
// output, reduce_scatter input, all_reduce and broadcast buffer), for a group
// of n ranks on N nodes, k ranks on the least-populated of them:
//
//   T = base + s_intra * lat_intra + s_inter * lat_inter  +  f * bytes / bw
//
//   ring   steps s = n-1 (all_gather, reduce_scatter, broadcast), 2(n-1)
//          (all_reduce); of them s_inter = N-1 (2(N-1) for all_reduce) cross
//          nodes, the rest stay inside (NCCL's tuning model, which charges
//          each step the latency of the hop it takes).
//          f = (n-1)/n, 2(n-1)/n for all_reduce, 1 for broadcast (pipelined).
//   tree   a chain inside each node and a binary tree across nodes:
//          s_intra = k-1, s_inter = ceil(log2 N) per pass (two passes for
//          all_reduce, as NCCL's tree); f as the ring's (the bandwidth-optimal
//          count; NCCL's tuner uses 2 for its double binary tree's all_reduce,
//          within n/(n-1) of it), except broadcast, which is a binomial tree
//          of s unpipelined steps: f = s.
//   barrier  an all_reduce of no bytes (PyTorch's barrier is a one-element
//          all_reduce).
//
//   bw, the bus bandwidth, is the slowest link the group crosses times the
//   protocol's fraction: NVLink (when k >= 2) and, when N > 1, the group's
//   share of its node's NICs, k * nics * nic_rate * nic_efficiency /
//   gpus_per_node.
//
// NCCL's protocols (Simple, LL, LL128) trade latency for bandwidth; each
// (algorithm, protocol) has its own base latency, per-step latencies and
// bandwidth fraction in the profile (numbers from NCCL's tuning model,
// src/graph/tuning.cc). PlanCollective chooses as NCCL's tuner does: the
// enabled pair with the least predicted time. NCCL runs all_gather,
// reduce_scatter and broadcast with the ring only; the tree is considered for
// all_reduce and barrier. Not modelled: NVLS/CollNet, NCCL's per-channel
// bandwidth caps and its tree correction factors for medium sizes.
//
// Where NCCL was measured, the measurement replaces the model. A profile may
// carry published nccl-tests curves (MeasuredBusBandwidth: bus bandwidth by
// message size for one collective on one placement, e.g. all_reduce over the
// 8 GPUs of a DGX A100). A collective whose kind and placement match a curve
// (same ranks, nodes and ranks per node) takes the curve's time:
// bus_bytes / busbw(bytes), busbw interpolated linearly in log2(bytes)
// between the published sizes; below the smallest size the collective takes
// the smallest size's time (latency-bound), above the largest the largest
// size's bus bandwidth. The curve's time includes NCCL's own latency and its
// algorithm choice (NVLS where NCCL used it), so the plan of a measured
// collective has no separate latency; it keeps the tuner's (algorithm,
// protocol) only as a label. Groups no curve matches keep the tuning model.
//
// Thread safety: plain values and pure functions.
#ifndef SHARDKIT_RUNTIME_COMM_TOPOLOGY_H_
#define SHARDKIT_RUNTIME_COMM_TOPOLOGY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"

namespace sk::comm {

enum class LinkAlgorithm : uint8_t {
  kRing = 1,
  kTree = 2,
};

// NCCL's protocols: Simple (large chunks, full bandwidth, the most latency),
// LL (8-byte flag+data stores: the least latency, a fraction of the
// bandwidth), LL128 (128-byte lines, between the two).
enum class LinkProtocol : uint8_t {
  kSimple = 1,
  kLL = 2,
  kLL128 = 3,
};

inline constexpr int kNumLinkAlgorithms = 2;
inline constexpr int kNumLinkProtocols = 3;

// "ring", "tree"; "simple", "ll", "ll128".
const char* LinkAlgorithmName(LinkAlgorithm a);
const char* LinkProtocolName(LinkProtocol p);

// The latencies and bandwidth fraction of one (algorithm, protocol) pair.
struct AlgorithmCost {
  // A disabled pair is never chosen (NCCL enables LL128 only on some systems).
  bool enabled = true;
  double base_latency_us = 0;      // once per collective
  double intra_step_latency_us = 0;  // per step over NVLink inside a node
  double inter_step_latency_us = 0;  // per step over the network
  double bandwidth_fraction = 1.0;   // of the slowest link's rate, in (0, 1]
};

// A published nccl-tests curve: the bus bandwidth NCCL achieved for
// `kinds` among `ranks` GPUs on `nodes` nodes (ranks / nodes on each), at
// message sizes `bytes` (nccl-tests' size, increasing) of `busbw_gbps` GB/s.
struct MeasuredBusBandwidth {
  std::vector<CollectiveKind> kinds;
  int ranks = 0;
  int nodes = 1;
  std::vector<double> bytes;
  std::vector<double> busbw_gbps;
  std::string source;

  bool Covers(CollectiveKind kind, int group_ranks, int group_nodes, int min_ranks_per_node) const;
  // Bus bandwidth at `bytes` (GB/s), as the file comment says; and the
  // largest of the curve (its peak).
  double BusBandwidthGbpsAt(double message_bytes) const;
  double PeakGbps() const;
};

// A cluster's network, as the "network" section of a simulator profile
// describes it (runtime/sim/topology.h parses it; every number there carries
// its source, kept in `sources`).
struct NetworkProfile {
  std::string name;  // "a100-80g"
  int gpus_per_node = 1;
  // Intra-node: NVLink links per GPU and the achievable rate of one link per
  // direction, GB/s (10^9 bytes/s).
  int nvlink_links_per_gpu = 0;
  double nvlink_link_gbps = 0;
  // Inter-node: NICs per node, each NIC's line rate per direction in GB/s,
  // and the fraction of it a collective achieves.
  int nics_per_node = 1;
  double nic_gbps = 0;
  double nic_efficiency = 1.0;
  // [algorithm - 1][protocol - 1].
  AlgorithmCost costs[kNumLinkAlgorithms][kNumLinkProtocols];
  // Compute kernels take this many times longer while communication kernels
  // run on the same GPU (they hold SMs and memory bandwidth); >= 1.
  double compute_slowdown_while_communicating = 1.0;
  // Published nccl-tests curves that replace the model where they apply
  // (file comment); may be empty.
  std::vector<MeasuredBusBandwidth> measured;
  // Field path ("nic.bandwidth_gbps") -> where the number comes from.
  std::map<std::string, std::string> sources;

  AlgorithmCost& cost(LinkAlgorithm a, LinkProtocol p) {
    return costs[static_cast<int>(a) - 1][static_cast<int>(p) - 1];
  }
  const AlgorithmCost& cost(LinkAlgorithm a, LinkProtocol p) const {
    return costs[static_cast<int>(a) - 1][static_cast<int>(p) - 1];
  }
  // GB/s one GPU reaches inside its node (links x link rate).
  double intra_node_gbps() const { return nvlink_links_per_gpu * nvlink_link_gbps; }
  // GB/s a node's NICs carry together (count x rate x efficiency).
  double node_network_gbps() const { return nics_per_node * nic_gbps * nic_efficiency; }

  // InvalidArgument naming the first field out of range: gpus_per_node,
  // nics_per_node >= 1; nvlink_links_per_gpu >= 0 and >= 1 when
  // gpus_per_node > 1; rates > 0 where used; efficiency and fractions in
  // (0, 1]; latencies >= 0 and finite; slowdown >= 1; some pair enabled for
  // each algorithm; each measured curve with a kind, 2 <= ranks, nodes >= 1
  // dividing ranks, at least two sizes, increasing and positive, each with a
  // positive finite bus bandwidth. (A curve whose ranks per node exceed
  // gpus_per_node, e.g. a simulation told of smaller nodes, never applies.)
  Status Validate() const;

  // A single link: one rank per node, one NIC of `bandwidth_gbps`, `latency_us`
  // per step for both algorithms, Simple protocol only, no base latency. The
  // alpha-beta model of network_model.h.
  static NetworkProfile SingleLink(double latency_us, double bandwidth_gbps);
};

// Where a group's ranks sit in the cluster.
struct GroupPlacement {
  int ranks = 1;           // n
  int nodes = 1;           // N: nodes holding at least one of its ranks
  int min_ranks_per_node = 1;  // k: ranks on the least-populated of them

  // Of a group whose ranks are the cluster positions `positions` (GPU i is
  // on node i / gpus_per_node). InvalidArgument if `positions` is empty,
  // holds a negative or repeated position, or gpus_per_node < 1.
  static StatusOr<GroupPlacement> Of(const std::vector<int>& positions, int gpus_per_node);
  // n ranks packed onto nodes from position 0 (ranks(), then nodes of
  // gpus_per_node). InvalidArgument unless n >= 1 and gpus_per_node >= 1.
  static StatusOr<GroupPlacement> Packed(int n, int gpus_per_node);
  // "64 ranks on 8 nodes (8 per node)".
  std::string ToString() const;
};

// One collective as the topology prices it.
struct CollectivePlan {
  CollectiveKind kind = CollectiveKind::kBarrier;
  size_t bytes = 0;
  LinkAlgorithm algorithm = LinkAlgorithm::kRing;
  LinkProtocol protocol = LinkProtocol::kSimple;
  double latency_s = 0;         // base + per-step latencies
  double bus_bytes = 0;         // f * bytes: what crosses the slowest link
  double bus_bytes_per_s = 0;   // the transfer's rate when nothing else runs
  // Priced by a published nccl-tests curve (file comment), not the model.
  bool measured = false;
  // Which of a GPU's links the transfer occupies (for link sharing between
  // collectives): the fraction of each that one byte/s of bus rate takes,
  // the protocol's overhead included, so that the busier link is full at
  // bus_bytes_per_s. NVLink: 1 / (fraction * intra rate), 0 when the group
  // has one rank per node. The network, as the GPU's equal share of its
  // node's NICs: 1 / (fraction * k * node rate / gpus_per_node), 0 inside
  // one node.
  double nvlink_use_per_byte_s = 0;
  double network_use_per_byte_s = 0;

  // latency_s + bus_bytes / bus_bytes_per_s (0 for a group of one rank).
  double seconds() const;
  // "all_reduce 1048576 B: ring/simple, 23.1 us (8.4 us latency, 229 GB/s bus)".
  std::string ToString() const;
};

// The plan for `kind` moving `bytes` among `group`: the enabled
// (algorithm, protocol) with the least time, as NCCL's tuner chooses (ring
// only for all_gather, reduce_scatter, broadcast), then priced by the
// profile's measured curve where one covers the kind and placement (file
// comment). A group of one rank costs nothing. InvalidArgument if the profile is invalid, the placement
// inconsistent, or the group spans more GPUs per node than the profile has.
StatusOr<CollectivePlan> PlanCollective(const NetworkProfile& profile, CollectiveKind kind,
                                        size_t bytes, const GroupPlacement& group);
// The same with the algorithm and protocol forced (any algorithm for any
// kind: the tree's all_gather is recursive doubling). InvalidArgument as
// above, or if the pair is disabled in the profile.
StatusOr<CollectivePlan> PlanCollective(const NetworkProfile& profile, CollectiveKind kind,
                                        size_t bytes, const GroupPlacement& group,
                                        LinkAlgorithm algorithm, LinkProtocol protocol);

// nccl-tests' bus bandwidth factor: busbw = algbw * factor, with factor
// (n-1)/n for all_gather and reduce_scatter, 2(n-1)/n for all_reduce, 1
// otherwise.
double BusBandwidthFactor(CollectiveKind kind, int ranks);

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_TOPOLOGY_H_
