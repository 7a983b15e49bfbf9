// Network model: a ProcessGroup wrapper that makes collectives take as long
// as a modelled link would.
//
// The wrapped group still moves the data for real; the wrapper only delays
// completion: each collective's Work completes no earlier than
//   start + T_model(kind, bytes, N)
// where start is when the collective began on its stream and T_model is an
// alpha-beta model (latency alpha per message step, bandwidth beta per rank
// link) of the chosen algorithm, with bytes counted as nccl-tests count them.
// It is the topology model of topology.h (shared with the simulator) on a
// single link: every rank its own node, one step latency, the Simple
// protocol, no base latency:
//
//                       ring                              tree
//   all_gather,         (N-1) a + (N-1)/N B/b             ceil(log2 N) a + (N-1)/N B/b
//   reduce_scatter
//   all_reduce          2(N-1) a + 2(N-1)/N B/b           2 ceil(log2 N) a + 2(N-1)/N B/b
//   broadcast           (N-1) a + B/b  (pipelined)        ceil(log2 N) (a + B/b)
//   barrier             2(N-1) a                          2 ceil(log2 N) a
//
// (tree: recursive doubling/halving for the bandwidth-optimal ops, a binomial
// tree for broadcast). Anything that reports numbers measured through the
// wrapper must print label(), which names the model.
//
// One group is one communicator, and NCCL runs a communicator's collectives
// one after another in issue order, whatever streams they were issued on
// (the simulator does the same: docs/simulator.md, "One communicator, one
// collective at a time"). So the modelled link of a group is a queue: a
// collective's modelled time starts no earlier than the previous collective
// issued on the same group has ended, and FSDP's all-gather issued behind a
// reduce-scatter of the same group waits for it. Sub-groups (NewGroup) are
// other communicators with their own queues. The wait for the previous
// collective is bounded by the collective's timeout (DeadlineExceeded naming
// both).
//
// Thread safety: as ProcessGroup.
#ifndef SHARDKIT_RUNTIME_COMM_NETWORK_MODEL_H_
#define SHARDKIT_RUNTIME_COMM_NETWORK_MODEL_H_

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "runtime/comm/process_group.h"
#include "runtime/comm/topology.h"

namespace sk::comm {

struct LinkModel {
  double latency_us = 5.0;       // alpha
  double bandwidth_gbps = 12.5;  // beta, in GB/s (10^9 bytes/s): 100 Gb/s Ethernet
  LinkAlgorithm algorithm = LinkAlgorithm::kRing;

  // Parses "ring:latency_us=5,bandwidth_gbps=12.5" (either key may be left
  // out; "tree" for the tree algorithm). InvalidArgument naming the bad part.
  static StatusOr<LinkModel> Parse(std::string_view spec);
  // Seconds the modelled link needs for a collective of `kind` moving
  // `bytes` (nccl-tests' count) among `world` ranks: PlanCollective on
  // profile() with this algorithm forced. 0 for world <= 1; +infinity for a
  // model Parse would refuse.
  double Seconds(CollectiveKind kind, size_t bytes, int world) const;
  // "ring, alpha=5 us, beta=12.5 GB/s".
  std::string ToString() const;
  // The link as a topology profile (NetworkProfile::SingleLink).
  NetworkProfile profile() const;
};

class NetworkModelProcessGroup final : public ProcessGroup {
 public:
  // InvalidArgument if `inner` is null or the model has a non-positive
  // bandwidth or a negative latency.
  static StatusOr<std::unique_ptr<NetworkModelProcessGroup>> Wrap(
      std::unique_ptr<ProcessGroup> inner, LinkModel model);

  std::string backend_name() const override { return inner_->backend_name(); }
  // "local + network model (ring, alpha=5 us, beta=12.5 GB/s)".
  std::string label() const override;
  const LinkModel& model() const { return model_; }
  ProcessGroup& inner() const { return *inner_; }

  // When a collective issued on this group ends on the modelled link (set
  // once its start is known); network_model.cc.
  struct LinkTurn;

  // Sub-groups are wrapped with the same model.
  StatusOr<std::unique_ptr<ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                   Duration timeout = kDefaultTimeout) override;

 protected:
  StatusOr<std::shared_ptr<Work>> Launch(Collective c, Stream& stream) override;

 private:
  NetworkModelProcessGroup(std::unique_ptr<ProcessGroup> inner, LinkModel model);

  std::unique_ptr<ProcessGroup> inner_;
  const LinkModel model_;
  std::mutex mu_;
  std::shared_ptr<LinkTurn> last_turn_;  // guarded by mu_
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_NETWORK_MODEL_H_
