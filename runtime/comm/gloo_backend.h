// The `gloo` backend: ranks as processes (or threads) on one or many hosts,
// connected by Gloo's TCP transport, rendezvous through a Store (store.h).
//
// Facts of Debian 12's libgloo-dev that shape this backend:
//   - Its new-style API has allgather, alltoall, broadcast, barrier (and
//     allreduce), but no reduce-scatter. Our reduce_scatter posts the
//     shard exchange with every peer at once on Gloo's pairs (alltoall's
//     traffic: each rank sends and receives (N-1)/N of the buffer, the
//     optimum) and sums the shards locally in rank order (reduce.h).
//     all_reduce is that reduce-scatter plus an all_gather (2(N-1)/N), so
//     every CPU backend reduces in the same order and f32 results are
//     bit-identical to the local backend's.
//   - Its gloo::allgather took 2-10 ms for any message up to 1 MiB on our
//     development machine (measured standalone, outside shardkit), against
//     ~0.1 ms for the same transfers posted at once on the pairs; they are
//     equal from 16 MiB. all_gather therefore uses that direct exchange.
//     broadcast and barrier are Gloo's.
//   - Old-style algorithms shrink the TCP send buffer of the pairs they touch
//     to 4 KiB, after which bulk collectives on that context run ~1000x
//     slower: only new-style calls are ever made on a context.
//   - Destroying a context without a final barrier can abort the peer with
//     "Connection closed by peer": the destructor drains this rank's
//     collectives and runs a barrier (bounded by the group timeout).
//   - It has no TCP store: TcpStore (store.h) is ours.
//
// Memory: reduce_scatter and all_reduce keep their receive buffers (up to
// the size of the largest input seen) until the group is destroyed.
//
// Ordering: collectives may be issued on several streams; they execute on
// the context strictly in sequence-number order (a collective waits, within
// its timeout, for its predecessors), which every rank shares, so ranks never
// disagree about which collective a message belongs to.
//
// Faults: a peer that is gone or silent makes the collective fail with
// Unavailable or DeadlineExceeded within its timeout, naming the peer: of
// the peers that did not arrive, those found dead or stopped are the ones
// named, and live peers that had not arrived either (held up by it
// elsewhere) are counted, not named. A peer on this machine is judged from
// its process in /proc, at once ("rank 5 did not arrive: it is dead or hung
// (its process has exited)"); a peer on another machine that exited or was
// killed, from its liveness link (peer_links.h: an idle connection between
// the two processes, closed by the dying process's kernel), at once too
// ("... (its process has exited: its connection to this rank closed)").
// Others (stopped or hung on another machine) by their heartbeat
// (heartbeat.h: every process beats in the store, the world and its
// sub-groups share one beat): "rank 5 did not arrive: it is dead or hung
// (no heartbeat for 1500 ms)", which takes the silence (1.5 s) after the
// failure. A store that cannot be read names rank 0, whose process serves
// it. A context whose
// collective failed that way is broken for good (Gloo cannot resynchronise it): later collectives fail at
// once with Unavailable naming the first failure; destroy the group and form
// a new one. It closes its connections at once (as Gloo does after a
// timeout), so a peer still waiting on this rank fails too, finding that this
// rank failed first (published beside its beat) and whom it blamed. While a
// collective waits on peers, a watcher abandons the wait once a peer it waits
// for is gone (process or link) or failed first: Gloo can lose the wake-up of
// such a wait (a send it queued on a connection the peer had reset is never
// failed). Desync detection is always on: before its payload, every
// collective exchanges each rank's call fingerprint (kind, sequence number,
// dtypes, sizes, op, root: 160 bytes, one small exchange) and fails with
// InvalidArgument naming both calls on a mismatch. Gloo enforces message
// sizes on its own I/O thread, where a mismatch is an uncaught exception that
// kills the process, so no payload may move before sizes are known to agree.
// Every exception gloo throws on the calling thread is caught here and
// returned as a Status.
//
// Failing one step (FailPeers, ResumeAt; the Trainer's out-of-memory on one
// rank): the failing rank takes the next sequence number of its own and
// posts, as its call fingerprint for it, a failure marker, without waiting
// (the culprit's text goes to the group's store). Every peer that reaches
// that collective exchanges fingerprints with the marker like any other
// call, so no transfer is left half done, and fails it and every later
// collective at once with the culprit (naming the failing rank and its
// code) instead of waiting for its timeout. Nothing else changes: the
// context is not broken, and after the ranks agree on the step's outcome
// ResumeAt lets collectives run again from a common sequence number. A
// marker no peer reached stays posted on a sequence number no rank uses
// again (tags are unique for 2^25 collectives per group).
#ifndef SHARDKIT_RUNTIME_COMM_GLOO_BACKEND_H_
#define SHARDKIT_RUNTIME_COMM_GLOO_BACKEND_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/launch_env.h"  // DistributedEnv
#include "runtime/comm/process_group.h"
#include "runtime/comm/store.h"

namespace sk::comm {

struct GlooOptions {
  // Address this rank's transport listens on and advertises to its peers.
  // Empty: 127.0.0.1 for Create(); for CreateFromEnvironment(), 127.0.0.1
  // when MASTER_ADDR is a loopback name, else this host's name.
  std::string hostname;
  // Rendezvous timeout, and the default for Gloo's own operations.
  Duration timeout = kDefaultTimeout;
  // Kept for source compatibility: fingerprints are now always exchanged and
  // compared before a collective runs (see above), whatever this says.
  bool check_desync = false;
  // Which machine this rank runs on, as far as naming dead peers goes (see
  // "Faults"): "" (the default) is this machine's boot id and PID namespace.
  // Ranks given different values judge each other as if on different
  // machines (by liveness links and beats, not /proc): tests of that path
  // run on one host this way.
  std::string machine;
};

class GlooState;
class Heartbeat;

class GlooProcessGroup final : public ProcessGroup {
 public:
  // Forms rank `rank` of a group of `size` through `store` (every rank must
  // use the same store and `prefix`). Blocks until all ranks have connected
  // or options.timeout passes (DeadlineExceeded).
  static StatusOr<std::unique_ptr<GlooProcessGroup>> Create(std::shared_ptr<Store> store,
                                                          std::string prefix, int rank, int size,
                                                          GlooOptions options = {});
  // The world group from the launcher's variables (DistributedEnv, in
  // launch_env.h: torchrun, launch, Slurm, mpirun, a PyTorchJob) through
  // ConnectWorldStore: a client of torchrun's agent store or our launcher's,
  // or rank 0 serves a TcpStore on MASTER_PORT (started by hand), served as
  // long as rank 0's group or any of its sub-groups lives.
  static StatusOr<std::unique_ptr<GlooProcessGroup>> CreateFromEnvironment(
      GlooOptions options = {});

  // Drains this rank's collectives and runs a final barrier (each bounded by
  // the group timeout) before closing the connections.
  ~GlooProcessGroup() override;

  std::string backend_name() const override { return "gloo"; }
  StatusOr<std::unique_ptr<ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                   Duration timeout = kDefaultTimeout) override;

  // See "Failing one step" above.
  Status FailPeers(const Status& culprit) override;
  bool publishes_failures() const override { return true; }
  // False once a collective failed for a peer (see "Faults").
  bool usable() const override;

 protected:
  StatusOr<std::shared_ptr<Work>> Launch(Collective c, Stream& stream) override;
  void OnResume(uint64_t next_seq) override;

 private:
  GlooProcessGroup(int rank, int size, std::shared_ptr<GlooState> state,
                   std::shared_ptr<Store> store, std::string prefix, GlooOptions options,
                   std::vector<int> global_ranks);
  // Create, for a group whose rank r is world rank global_ranks[r].
  // `heartbeat`: the world's (null for a world: Make starts one).
  static StatusOr<std::unique_ptr<GlooProcessGroup>> Make(std::shared_ptr<Store> store, std::string prefix,
                                                          int rank, int size, GlooOptions options,
                                                          std::vector<int> global_ranks,
                                                          std::shared_ptr<Heartbeat> heartbeat);

  std::shared_ptr<GlooState> state_;
  std::shared_ptr<Store> store_;
  const std::string prefix_;
  const GlooOptions options_;
  const std::vector<int> global_ranks_;  // of this group's ranks
  SubGroupNames sub_groups_;  // NewGroup's names
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_GLOO_BACKEND_H_
