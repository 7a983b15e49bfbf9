// The topology model: collective times on a cluster of nodes against their
// closed forms, the algorithm NCCL's tuner would pick, and bad input.
#include "runtime/comm/topology.h"

#include <cmath>

#include <gtest/gtest.h>

namespace sk::comm {
namespace {

constexpr double kGB = 1e9;

// Round numbers so the closed forms are easy to check by hand: 8 GPUs per
// node, NVLink 10 x 20 = 200 GB/s per GPU, 4 NICs x 25 GB/s = 100 GB/s per node.
NetworkProfile TestProfile() {
  NetworkProfile p;
  p.name = "test";
  p.gpus_per_node = 8;
  p.nvlink_links_per_gpu = 10;
  p.nvlink_link_gbps = 20;
  p.nics_per_node = 4;
  p.nic_gbps = 25;
  p.nic_efficiency = 1.0;
  for (auto& row : p.costs) {
    for (auto& c : row) c.enabled = false;
  }
  p.cost(LinkAlgorithm::kRing, LinkProtocol::kSimple) = {true, 8, 2, 10, 1.0};
  p.cost(LinkAlgorithm::kRing, LinkProtocol::kLL) = {true, 5, 0.5, 3, 0.25};
  p.cost(LinkAlgorithm::kTree, LinkProtocol::kSimple) = {true, 0, 2, 20, 0.9};
  return p;
}

GroupPlacement Packed(int n) { return *GroupPlacement::Packed(n, 8); }

CollectivePlan Ring(CollectiveKind kind, size_t bytes, const GroupPlacement& g) {
  auto plan = PlanCollective(TestProfile(), kind, bytes, g, LinkAlgorithm::kRing, LinkProtocol::kSimple);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

TEST(GroupPlacement, CountsNodesAndTheLeastPopulatedNode) {
  auto g = GroupPlacement::Of({0, 1, 2, 8, 9, 17}, 8);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->ranks, 6);
  EXPECT_EQ(g->nodes, 3);
  EXPECT_EQ(g->min_ranks_per_node, 1);
  EXPECT_EQ(Packed(64).nodes, 8);
  EXPECT_EQ(Packed(64).min_ranks_per_node, 8);
  EXPECT_EQ(Packed(4).nodes, 1);
  EXPECT_EQ(Packed(64).ToString(), "64 ranks on 8 nodes (8 or more per node)");
  EXPECT_EQ(GroupPlacement::Of({}, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupPlacement::Of({1, 1}, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupPlacement::Of({-1}, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupPlacement::Of({0}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(Topology, RingAllReduceInsideANodeIsTheClosedFormOverNvlink) {
  const CollectivePlan p = Ring(CollectiveKind::kAllReduce, 1000000000, Packed(8));
  // 2(n-1) = 14 NVLink steps; 2(n-1)/n of the bytes at 200 GB/s.
  EXPECT_DOUBLE_EQ(p.latency_s, (8 + 14 * 2) * 1e-6);
  EXPECT_DOUBLE_EQ(p.bus_bytes_per_s, 200 * kGB);
  EXPECT_DOUBLE_EQ(p.seconds(), 36e-6 + 2.0 * 7 / 8 * 1e9 / (200 * kGB));
  EXPECT_EQ(p.network_use_per_byte_s, 0.0);
  EXPECT_DOUBLE_EQ(p.nvlink_use_per_byte_s, 1 / (200 * kGB));
}

TEST(Topology, RingAcrossNodesPaysNetworkStepsAndTheNodesNics) {
  const CollectivePlan p = Ring(CollectiveKind::kAllReduce, 1000000000, Packed(16));
  // 2(n-1) = 30 steps, of which 2(N-1) = 2 cross nodes.
  EXPECT_DOUBLE_EQ(p.latency_s, (8 + 28 * 2 + 2 * 10) * 1e-6);
  // The node's 100 GB/s of NICs is slower than NVLink's 200.
  EXPECT_DOUBLE_EQ(p.bus_bytes_per_s, 100 * kGB);
  EXPECT_DOUBLE_EQ(p.seconds(), 84e-6 + 2.0 * 15 / 16 * 1e9 / (100 * kGB));
  const CollectivePlan ag = Ring(CollectiveKind::kAllGather, 1000000000, Packed(16));
  EXPECT_DOUBLE_EQ(ag.latency_s, (8 + 14 * 2 + 1 * 10) * 1e-6);
  EXPECT_DOUBLE_EQ(ag.seconds(), 46e-6 + 15.0 / 16 * 1e9 / (100 * kGB));
  // Intra- vs inter-node: the same 8 ranks spread one per node are slower.
  const GroupPlacement spread = *GroupPlacement::Of({0, 8, 16, 24, 32, 40, 48, 56}, 8);
  EXPECT_GT(Ring(CollectiveKind::kAllGather, 1 << 30, spread).seconds(),
            Ring(CollectiveKind::kAllGather, 1 << 30, Packed(8)).seconds());
}

TEST(Topology, HybridShardGroupsUseNvlinkAndReplicaGroupsShareTheNics) {
  // 64 GPUs as 8 replicas x 8 shards: shard groups are nodes, replica group
  // s holds shard index s of every node.
  const CollectivePlan shard = Ring(CollectiveKind::kReduceScatter, 1 << 30, Packed(8));
  EXPECT_DOUBLE_EQ(shard.bus_bytes_per_s, 200 * kGB);
  EXPECT_EQ(shard.network_use_per_byte_s, 0.0);
  std::vector<int> column;
  for (int node = 0; node < 8; ++node) column.push_back(node * 8 + 3);
  const GroupPlacement replica = *GroupPlacement::Of(column, 8);
  EXPECT_EQ(replica.nodes, 8);
  EXPECT_EQ(replica.min_ranks_per_node, 1);
  const CollectivePlan ar = Ring(CollectiveKind::kAllReduce, 1 << 30, replica);
  // Eight sibling replica groups share the node's 100 GB/s: 12.5 each, and
  // no NVLink hop.
  EXPECT_DOUBLE_EQ(ar.bus_bytes_per_s, 12.5 * kGB);
  EXPECT_EQ(ar.nvlink_use_per_byte_s, 0.0);
  EXPECT_DOUBLE_EQ(ar.network_use_per_byte_s, 1 / (12.5 * kGB));
  EXPECT_DOUBLE_EQ(ar.latency_s, (8 + 14 * 10) * 1e-6);
  // Two shard groups of 4 per node share nothing: NVSwitch is non-blocking.
  EXPECT_DOUBLE_EQ(Ring(CollectiveKind::kAllGather, 1 << 30, Packed(4)).bus_bytes_per_s, 200 * kGB);
  // A group of 2 per node across nodes gets 2/8 of the node's NICs.
  const GroupPlacement pairs = *GroupPlacement::Of({0, 1, 8, 9}, 8);
  EXPECT_DOUBLE_EQ(Ring(CollectiveKind::kAllGather, 1 << 30, pairs).bus_bytes_per_s, 25 * kGB);
}

TEST(Topology, ChoosesAsNcclsTunerDoes) {
  const NetworkProfile p = TestProfile();
  // Small all_reduce on 2 nodes: LL's low latency wins.
  auto small = PlanCollective(p, CollectiveKind::kAllReduce, 1024, Packed(16));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->algorithm, LinkAlgorithm::kRing);
  EXPECT_EQ(small->protocol, LinkProtocol::kLL);
  // Large: Simple's full bandwidth wins; the tree's 0.9 fraction loses.
  auto large = PlanCollective(p, CollectiveKind::kAllReduce, 1 << 30, Packed(16));
  EXPECT_EQ(large->algorithm, LinkAlgorithm::kRing);
  EXPECT_EQ(large->protocol, LinkProtocol::kSimple);
  // On 64 nodes a barrier's log-depth tree beats the ring's 1022 steps.
  auto barrier = PlanCollective(p, CollectiveKind::kBarrier, 0, Packed(512));
  EXPECT_EQ(barrier->algorithm, LinkAlgorithm::kTree);
  EXPECT_DOUBLE_EQ(barrier->seconds(), (2 * 7 * 2 + 2 * 6 * 20) * 1e-6);
  // ... but all_gather has no tree in NCCL, however long the ring.
  auto ag = PlanCollective(p, CollectiveKind::kAllGather, 0, Packed(512));
  EXPECT_EQ(ag->algorithm, LinkAlgorithm::kRing);
  // The choice is the minimum over the enabled pairs.
  for (size_t bytes : {size_t{0}, size_t{4096}, size_t{1} << 20, size_t{1} << 28}) {
    auto best = PlanCollective(p, CollectiveKind::kAllReduce, bytes, Packed(128));
    for (auto [a, proto] : {std::pair{LinkAlgorithm::kRing, LinkProtocol::kSimple},
                            std::pair{LinkAlgorithm::kRing, LinkProtocol::kLL},
                            std::pair{LinkAlgorithm::kTree, LinkProtocol::kSimple}}) {
      auto other = PlanCollective(p, CollectiveKind::kAllReduce, bytes, Packed(128), a, proto);
      EXPECT_LE(best->seconds(), other->seconds()) << bytes << " " << other->ToString();
    }
  }
}

TEST(Topology, BusBandwidthOfLargeCollectivesApproachesTheSlowestLink) {
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllReduce}) {
    const size_t bytes = size_t{1} << 34;
    auto plan = PlanCollective(TestProfile(), kind, bytes, Packed(64));
    const double busbw = bytes / plan->seconds() * BusBandwidthFactor(kind, 64);
    EXPECT_LT(busbw, 100 * kGB);
    EXPECT_GT(busbw, 99 * kGB) << CollectiveName(kind);
  }
}

TEST(Topology, OneRankCostsNothingAndBadInputIsNamed) {
  EXPECT_EQ(Ring(CollectiveKind::kAllReduce, 1 << 20, Packed(1)).seconds(), 0.0);
  NetworkProfile p = TestProfile();
  // Nine ranks per node on nodes of eight.
  GroupPlacement g{9, 1, 9};
  auto too_many = PlanCollective(p, CollectiveKind::kAllGather, 64, g);
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("does not fit nodes of 8"), std::string::npos);
  auto disabled = PlanCollective(p, CollectiveKind::kAllReduce, 64, Packed(8), LinkAlgorithm::kTree,
                                 LinkProtocol::kLL128);
  EXPECT_NE(disabled.status().message().find("tree/ll128 disabled"), std::string::npos);
  EXPECT_EQ(PlanCollective(p, CollectiveKind::kAllGather, 64, GroupPlacement{4, 5, 1}).status().code(),
            StatusCode::kInvalidArgument);
  p.nic_efficiency = 1.5;
  EXPECT_NE(p.Validate().message().find("nic_efficiency"), std::string::npos);
  p = TestProfile();
  p.cost(LinkAlgorithm::kRing, LinkProtocol::kLL).inter_step_latency_us = -1;
  EXPECT_NE(p.Validate().message().find("ring/ll latencies"), std::string::npos);
  p = TestProfile();
  p.nvlink_links_per_gpu = 0;
  EXPECT_NE(p.Validate().message().find("nvlink_links_per_gpu"), std::string::npos);
  p = TestProfile();
  p.cost(LinkAlgorithm::kTree, LinkProtocol::kSimple).enabled = false;
  EXPECT_NE(p.Validate().message().find("no protocol enabled for tree"), std::string::npos);
  EXPECT_TRUE(TestProfile().Validate().ok());
}

// A published nccl-tests curve prices the collectives and placements it
// covers: bus bytes over the measured bus bandwidth at that size,
// interpolated in log2(bytes); everything else keeps the tuning model.
TEST(Topology, AMeasuredCurvePricesTheGroupsItCovers) {
  NetworkProfile p = TestProfile();
  MeasuredBusBandwidth m;
  m.kinds = {CollectiveKind::kAllGather};
  m.ranks = 8;
  m.nodes = 1;
  m.bytes = {1 << 20, 1 << 22, 1 << 30};
  m.busbw_gbps = {20, 60, 180};
  m.source = "test";
  p.measured.push_back(m);
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();

  auto at = [&](size_t bytes, const GroupPlacement& g, CollectiveKind kind = CollectiveKind::kAllGather) {
    auto plan = PlanCollective(p, kind, bytes, g);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  };
  // At a published size: exactly its bus bandwidth, no separate latency.
  CollectivePlan big = at(1u << 30, Packed(8));
  EXPECT_TRUE(big.measured);
  EXPECT_EQ(big.latency_s, 0.0);
  EXPECT_DOUBLE_EQ(big.bus_bytes_per_s, 180 * kGB);
  EXPECT_DOUBLE_EQ(big.seconds(), (7.0 / 8.0) * (1u << 30) / (180 * kGB));
  EXPECT_NE(big.ToString().find("nccl-tests curve"), std::string::npos);
  // Between sizes: linear in log2(bytes) (2^21 is halfway from 2^20 to 2^22).
  EXPECT_DOUBLE_EQ(at(1u << 21, Packed(8)).bus_bytes_per_s, 40 * kGB);
  // Beyond the largest: its bus bandwidth; below the smallest: its time.
  EXPECT_DOUBLE_EQ(at(size_t{1} << 33, Packed(8)).bus_bytes_per_s, 180 * kGB);
  EXPECT_DOUBLE_EQ(at(1u << 18, Packed(8)).seconds(), at(1u << 20, Packed(8)).seconds());
  // The link is full at the curve's peak.
  EXPECT_DOUBLE_EQ(big.nvlink_use_per_byte_s, 1 / (180 * kGB));
  EXPECT_EQ(big.network_use_per_byte_s, 0.0);
  // Not covered: another kind, another group size, a group across nodes.
  for (const CollectivePlan& model : {at(1u << 30, Packed(8), CollectiveKind::kReduceScatter),
                                      at(1u << 30, Packed(4)), at(1u << 30, Packed(16))}) {
    EXPECT_FALSE(model.measured);
    EXPECT_GT(model.latency_s, 0.0);
  }
  // The model alone (no curve) is faster here: 200 GB/s of NVLink.
  EXPECT_LT(PlanCollective(TestProfile(), CollectiveKind::kAllGather, 1u << 30, Packed(8))->seconds(),
            big.seconds());

  // Bad curves are named.
  auto bad = [&](auto edit, const std::string& needle) {
    NetworkProfile q = p;
    edit(q.measured[0]);
    const Status s = q.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  };
  bad([](MeasuredBusBandwidth& c) { c.kinds.clear(); }, "measured curve 0: names no collective");
  bad([](MeasuredBusBandwidth& c) { c.ranks = 1; }, "ranks must be >= 2");
  bad([](MeasuredBusBandwidth& c) { c.nodes = 3; }, "nodes must be >= 1 and divide ranks");
  bad([](MeasuredBusBandwidth& c) { c.busbw_gbps.pop_back(); }, "at least two");
  bad([](MeasuredBusBandwidth& c) { c.bytes[1] = c.bytes[0]; }, "positive and increasing");
  bad([](MeasuredBusBandwidth& c) { c.busbw_gbps[2] = std::nan(""); }, "positive and finite");
  // A cluster of smaller nodes than the curve's: the curve never applies.
  NetworkProfile small = p;
  small.gpus_per_node = 4;
  ASSERT_TRUE(small.Validate().ok()) << small.Validate();
  auto two_nodes = PlanCollective(small, CollectiveKind::kAllGather, 1u << 30, *GroupPlacement::Packed(8, 4));
  ASSERT_TRUE(two_nodes.ok()) << two_nodes.status();
  EXPECT_FALSE(two_nodes->measured);
}

TEST(Topology, SingleLinkIsTheAlphaBetaModel) {
  const NetworkProfile link = NetworkProfile::SingleLink(10, 1);
  ASSERT_TRUE(link.Validate().ok()) << link.Validate();
  auto g = *GroupPlacement::Packed(4, 1);
  auto ring = PlanCollective(link, CollectiveKind::kReduceScatter, 1000000000, g);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_DOUBLE_EQ(ring->seconds(), 3 * 10e-6 + 0.75);
}

}  // namespace
}  // namespace sk::comm
