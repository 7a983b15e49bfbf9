// The `local` backend: N ranks as threads of one process.
//
// Design. The N handles of a group share one LocalRendezvous. A collective
// runs on the worker of the stream it was enqueued on; there it "arrives" at
// the rendezvous slot of its sequence number, publishing pointers to its
// buffers and a fingerprint of its call (kind, sequence number, dtypes,
// sizes, op, root). When all N have arrived, every rank compares the
// fingerprints (desync detection: a mismatch fails every rank with
// InvalidArgument naming both calls, before any byte moves) and then moves
// its own share of the data directly between the ranks' buffers:
//   all_gather      rank r copies every rank's input into its own output;
//   reduce_scatter  rank r reduces chunk r of every rank's input into its
//                   output, in rank order 0..N-1 (reduce.h);
//   all_reduce      reduce-scatter into a per-rank scratch chunk, a barrier,
//                   then every rank gathers all chunks (2(N-1)/N traffic);
//   broadcast       every non-root rank copies the root's buffer.
// All N ranks copy at once on their own workers (N parallel copies, no
// staging except all_reduce's one chunk), then leave through a departure
// barrier so that no rank's buffers are released while another still reads
// them. Slots are keyed by sequence number, so a rank may issue collectives
// on several streams.
//
// Faults. Every wait in a slot is bounded by the collective's timeout. A rank
// that does not arrive in time makes the waiting ranks fail with
// DeadlineExceeded naming the collective and the missing ranks; the slot is
// marked aborted, so the late rank fails at once when it arrives, and the
// next sequence number works normally again. A rank that fails outside any
// collective (FailPeers: the Trainer's out-of-memory in compute) fails every
// waiting and later collective of the group with its error at once, until
// every rank resumes at a common sequence number (ResumeAt), which drops the
// slots that only some ranks reached. Groups are independent: after a
// failure a group can be destroyed and a new one created. One limit: a rank
// whose peers stall *during* the copies (past the timeout, after all arrived)
// leaves with DeadlineExceeded while they may still read its buffers; keep
// those tensors alive until the peers' Works have completed too.
//
// Stream-ordered mode (every non-CPU stream: ranks as threads sharing one
// GPU). A CUDA stream cannot run a closure that blocks for its peers, so the
// rendezvous moves to the calling thread and the data moves as device work:
// at Launch each rank records a "ready" event on its stream and arrives (the
// calling thread blocks, up to the timeout, until every rank has, and the
// fingerprints are compared as above); then it enqueues on its own stream a
// wait for every rank's ready event and its share of the data movement
// (Device::CopyAsync device-to-device copies; reductions as one kernel in
// rank order with reduce.h's arithmetic, so the bits are the CPU's), records
// a "done" event, and, once every rank has recorded one (a second host
// barrier), makes its stream wait for all of them before anything enqueued
// later, so no rank reuses its buffers while a peer still reads them.
// all_reduce works in place, chunk by chunk (rank r reduces chunk r of
// every rank's buffer into its own, a third barrier of "reduced" events,
// then gathers the other chunks), so it needs no scratch memory. The call
// returns after the enqueues; failures (a rank that does not arrive within
// the timeout, a desync) come back as in the other mode: a Work whose
// status and stream carry the error. Since the call blocks for its peers,
// ranks must issue collectives from different threads (one per rank). CPU streams use this mode
// only when LocalOptions::stream_ordered is set (the tests exercise the
// logic a GPU run relies on that way).
//
// Thread safety: each handle may be used from any thread (process_group.h).
#ifndef SHARDKIT_RUNTIME_COMM_LOCAL_BACKEND_H_
#define SHARDKIT_RUNTIME_COMM_LOCAL_BACKEND_H_

#include <functional>
#include <map>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/allocator.h"

namespace sk::comm {

class LocalRendezvous;
class ScratchPool;

struct LocalOptions {
  // Where all_reduce takes its scratch chunk from; HostAllocator::Default()
  // when null. Must outlive the group. Each rank keeps up to 4 chunks for
  // reuse until its handle and queued collectives are gone.
  Allocator* scratch_allocator = nullptr;
  // Stream-ordered mode (above) on CPU streams too. Non-CPU streams always
  // use it.
  bool stream_ordered = false;
};

class LocalProcessGroup final : public ProcessGroup {
 public:
  // The `world_size` rank handles of a new group (index = rank). Rank i is
  // meant to run on device cpu:i's streams, but any CPU stream works; with
  // CUDA, every rank may use streams of one GPU (or of several).
  static StatusOr<std::vector<std::unique_ptr<ProcessGroup>>> Create(int world_size,
                                                                   LocalOptions options = {});

  LocalProcessGroup(int rank, std::shared_ptr<LocalRendezvous> rendezvous, LocalOptions options);
  ~LocalProcessGroup() override;

  std::string backend_name() const override { return "local"; }
  Status FailPeers(const Status& culprit) override;
  bool publishes_failures() const override { return true; }
  StatusOr<std::unique_ptr<ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                   Duration timeout = kDefaultTimeout) override;

 protected:
  StatusOr<std::shared_ptr<Work>> Launch(Collective c, Stream& stream) override;
  void OnResume(uint64_t next_seq) override;

 private:
  std::shared_ptr<LocalRendezvous> rendezvous_;
  // Failed steps this rank has resumed from (ResumeAt calls): a failure is
  // published with its rank's count, and a rank's resume clears only
  // failures of steps it took part in, never a peer's failure of the next
  // step published before this rank resumed.
  std::atomic<uint64_t> resumes_{0};
  LocalOptions options_;
  std::shared_ptr<ScratchPool> scratch_pool_;  // shared with queued collectives
  SubGroupNames sub_groups_;  // NewGroup's names
};

// Runs body(rank) for rank 0..world_size-1, each on a new thread, and
// returns when every one has returned. Bodies start only once every thread
// exists: when one cannot be created (the process or user is out of
// threads), no body runs, the threads already created are joined, and the
// result is ResourceExhausted naming the rank (never std::terminate). A C++
// exception escaping body becomes
// that rank's error (ResourceExhausted for std::bad_alloc, Internal
// otherwise). Returns OK when every rank returned OK, otherwise the lowest
// failing rank's status with "rank R" as context; when `per_rank` is not
// null it receives every rank's status. InvalidArgument if world_size < 1.
// `on_failure` (when set) runs on a rank's thread as soon as its body fails,
// with its rank and error: RunLocalRanks uses it to fail the peers' waiting
// collectives at once (FailPeers) instead of at their timeout.
// Thread-safe; body runs concurrently on world_size threads.
Status RunRankThreads(int world_size, const std::function<Status(int rank)>& body,
                      std::vector<Status>* per_rank = nullptr,
                      const std::function<void(int rank, const Status& error)>& on_failure = nullptr);

// A rank's body ended with `error` while its peers may still wait for it in
// a collective: publishes that to `group` (ProcessGroup::FailPeers), so the
// peers' collectives fail now naming the rank and its error, not after the
// group's timeout with "rank R did not arrive". Nothing where the group does
// not publish failures (ProcessGroup::publishes_failures).
void FailPeersOnExit(ProcessGroup& group, int rank, const Status& error);

// Creates a local group of world_size ranks (LocalProcessGroup::Create) and
// runs body(rank, group) for each on its own thread (RunRankThreads). The
// groups live until every body has returned. A rank whose body fails fails
// its peers' collectives at once (FailPeersOnExit).
Status RunLocalRanks(int world_size,
                     const std::function<Status(int rank, ProcessGroup* group)>& body);

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_LOCAL_BACKEND_H_
