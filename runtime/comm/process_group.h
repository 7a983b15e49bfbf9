// ProcessGroup: the collectives FSDP speaks, over any backend.
//
// A ProcessGroup is one rank's handle on a group of `size()` ranks. Every
// collective is asynchronous: it is validated on the calling thread (bad
// arguments return InvalidArgument at once, naming what was wrong), enqueued
// on the caller's `stream` after the work already there, and returns a Work
// (work.h) that completes through an event on that stream. Ranks must issue
// the same collectives in the same order; each call gets the next sequence
// number of this handle, and backends match calls across ranks by it, so a
// rank may spread its collectives over several streams (FSDP: all-gathers on
// one, reduce-scatters on another) without deadlocking.
//
// Shapes (FSDP's): all_gather takes equal-sized inputs and fills one
// contiguous output, rank i's input at element offset i * input.numel();
// reduce_scatter takes one contiguous input of size() equal shards and leaves
// in each rank's output the reduction of that rank's shard across ranks.
// Reductions run in f32 whatever the storage type (bf16 and f16 are widened,
// summed in rank order 0..N-1, scaled, and rounded once), so an f32 result is
// the same bits on every rank and every run; backends document where they
// differ (NCCL: its own order).
//
// Reduction arithmetic, per element, with x_j rank j's value:
//   acc = x_0 * pre_scale; acc += x_j * pre_scale for j = 1..N-1;
//   if AVG: acc /= N;  acc *= post_scale;  rounded to the dtype.
// (Multiplications by 1 are skipped; they are exact anyway.)
//
// Timeouts: every collective carries a timeout (default kDefaultTimeout)
// within which its peers must arrive; past it the Work fails with
// DeadlineExceeded naming the collective and the ranks that did not arrive.
//
// Thread safety: collectives may be called from several threads; calls are
// numbered in the order they are made.
#ifndef SHARDKIT_RUNTIME_COMM_PROCESS_GROUP_H_
#define SHARDKIT_RUNTIME_COMM_PROCESS_GROUP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/comm/flight_recorder.h"
#include "runtime/comm/work.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/device/device.h"

namespace sk::comm {

// Values appear in flight-recorder dumps and call fingerprints exchanged
// between ranks (which may run different builds): never renumbered; 0 is
// "unset".
enum class CollectiveKind : uint8_t {
  kAllGather = 1,
  kReduceScatter = 2,
  kAllReduce = 3,
  kBroadcast = 4,
  kBarrier = 5,
};
enum class ReduceOp : uint8_t {
  kSum = 1,
  kAvg = 2,
};

// "all_gather", "reduce_scatter", ...
const char* CollectiveName(CollectiveKind kind);
const char* ReduceOpName(ReduceOp op);

struct CollectiveOptions {
  // How long the collective waits for its peers before failing.
  Duration timeout = kDefaultTimeout;
  // The caller's words for what this collective is for ("unit 'h.3'
  // forward"): shown in errors and the flight recorder. Optional.
  std::string label;
};

struct ReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  // Multiplies every rank's contribution before the sum (FSDP's gradient
  // pre-divide, ~1/sqrt(N), keeps low-precision sums from overflowing).
  float pre_scale = 1.0f;
  // Multiplies the result after the sum (and after AVG's division).
  float post_scale = 1.0f;
  Duration timeout = kDefaultTimeout;
  std::string label;  // as CollectiveOptions::label
};

struct BroadcastOptions {
  int root = 0;
  Duration timeout = kDefaultTimeout;
  std::string label;  // as CollectiveOptions::label
};

// One validated collective call as a backend receives it. For all_reduce and
// broadcast (in place) `inputs` and `outputs` hold the same tensors.
struct Collective {
  CollectiveKind kind = CollectiveKind::kBarrier;
  uint64_t seq = 0;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  ReduceOp op = ReduceOp::kSum;
  float pre_scale = 1.0f;
  float post_scale = 1.0f;
  int root = 0;
  Duration timeout = kDefaultTimeout;
  std::string label;  // the caller's, from the options

  // "reduce_scatter #4 (bf16[4096] -> bf16[1024]) [label]" — for errors and traces.
  std::string Describe() const;
  // Bytes this rank sends or receives as nccl-tests count them (the all_gather
  // output, the reduce_scatter input, the all_reduce/broadcast buffer).
  size_t nccl_bytes() const;
};

// What a rank says about its call when calls are compared across ranks
// (desync detection). Fixed size so backends can exchange it as bytes.
struct CallFingerprint {
  static constexpr int kMaxEntries = 8;  // entries beyond this are folded into a hash
  uint64_t seq = 0;
  uint8_t kind = 0;
  uint8_t op = 0;
  int16_t root = 0;
  int32_t entries = 0;
  uint64_t entry_hash = 0;  // dtype and sizes of every entry
  uint8_t dtype[kMaxEntries] = {};
  int64_t in_numel[kMaxEntries] = {};
  int64_t out_numel[kMaxEntries] = {};

  static CallFingerprint Of(const Collective& c);
  bool Matches(const CallFingerprint& other) const;
  // "reduce_scatter #4 (bf16, 4096 -> 1024)".
  std::string ToString() const;
};

// "2" or "0,1,3": ranks in messages (and the key of a group's rank list).
std::string RankList(const std::vector<int>& ranks);
// "rank 2" or "ranks 0,1,3".
std::string NameRanks(const std::vector<int>& ranks);

// InvalidArgument naming both ranks' calls for the first rank whose
// fingerprint differs from rank 0's (or from the lowest rank that differs),
// OK if all agree. `who` labels the group in the message.
Status CompareFingerprints(const std::vector<CallFingerprint>& per_rank, const std::string& who);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "local", "gloo", "nccl".
  virtual std::string backend_name() const = 0;
  // What produced the numbers (shown by benchmarks): the backend name, plus
  // any wrapper such as the network model.
  virtual std::string label() const { return backend_name(); }
  // The one device whose memory and streams this group's collectives use,
  // for backends bound to one (nccl: its cuda:N); none for backends that
  // run on any device of the right kind (local, gloo, sim).
  virtual std::optional<DeviceId> bound_device() const { return std::nullopt; }

  // output[i*n : (i+1)*n] = rank i's input, n = input.numel(). `input` may be
  // exactly this rank's chunk of `output` (in place); any other overlap is
  // InvalidArgument.
  StatusOr<std::shared_ptr<Work>> all_gather(const Tensor& output, const Tensor& input,
                                             Stream& stream, const CollectiveOptions& opts = {});
  // Several all_gathers as one collective (one Work, one match across ranks).
  StatusOr<std::shared_ptr<Work>> all_gather_coalesced(const std::vector<Tensor>& outputs,
                                                       const std::vector<Tensor>& inputs,
                                                       Stream& stream,
                                                       const CollectiveOptions& opts = {});
  // output = reduction over ranks of input[rank*n : (rank+1)*n], n =
  // output.numel(). Input and output must not overlap.
  StatusOr<std::shared_ptr<Work>> reduce_scatter(const Tensor& output, const Tensor& input,
                                                 Stream& stream, const ReduceOptions& opts = {});
  StatusOr<std::shared_ptr<Work>> reduce_scatter_coalesced(const std::vector<Tensor>& outputs,
                                                           const std::vector<Tensor>& inputs,
                                                           Stream& stream,
                                                           const ReduceOptions& opts = {});
  // In place: every rank's tensor becomes the reduction of all ranks' tensors.
  StatusOr<std::shared_ptr<Work>> all_reduce(const Tensor& tensor, Stream& stream,
                                             const ReduceOptions& opts = {});
  StatusOr<std::shared_ptr<Work>> all_reduce_coalesced(const std::vector<Tensor>& tensors,
                                                       Stream& stream,
                                                       const ReduceOptions& opts = {});
  // In place: every rank's tensor becomes the root's.
  StatusOr<std::shared_ptr<Work>> broadcast(const Tensor& tensor, Stream& stream,
                                            const BroadcastOptions& opts = {});
  StatusOr<std::shared_ptr<Work>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                      Stream& stream,
                                                      const BroadcastOptions& opts = {});
  // Completes once every rank has reached it on its stream.
  StatusOr<std::shared_ptr<Work>> barrier(Stream& stream, const CollectiveOptions& opts = {});

  // A new group of the given ranks of this group (sorted, distinct, including
  // this rank), numbered 0.. in that order. Collective over the members: each
  // member calls it with the same list, in the same order relative to other
  // NewGroup calls with the same list. Blocks until the group is formed or
  // `timeout` passes.
  virtual StatusOr<std::unique_ptr<ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                           Duration timeout = kDefaultTimeout) = 0;

  // This rank's record of its recent collectives (flight_recorder.h), or
  // null for a backend that keeps none. Valid while the group lives.
  FlightRecorder* flight_recorder() const { return flight_recorder_.get(); }

  // Failing one step on every rank at once (the Trainer: one rank ran out of
  // memory and will not issue the rest of the step's collectives).
  //
  // FailPeers publishes `culprit` (this rank's error, naming it) to the
  // group: every collective of any rank that waits in the group, or is
  // issued later, fails at once with `culprit` instead of waiting for this
  // rank until its timeout, until ResumeAt. Returns OK when this rank's
  // failure is now the group's (or the backend cannot publish: nccl without
  // its call check, whose peers then fail at their timeout), or the culprit
  // another rank published first (this rank's own failure is then a
  // consequence).
  // Thread-safe.
  virtual Status FailPeers(const Status& culprit);
  // Whether FailPeers reaches the peers (local, gloo, nccl with its call
  // check). Where it does not, a healthy rank learns of a peer's failure
  // only at its collective's timeout.
  virtual bool publishes_failures() const { return false; }
  // False once a failure broke the group for good (gloo: a collective
  // failed for a peer that died, hung or timed out): failing steps then
  // cannot be agreed on over it, and each rank reports its own error.
  virtual bool usable() const { return true; }
  // The sequence number the next collective of this handle will get.
  uint64_t next_sequence();
  // Ends a failed step: collectives work again, numbered from `next_seq` on
  // this handle. Every rank calls it, after the ranks have agreed on the
  // step's outcome, with the same value (the largest next_sequence() among
  // them), so ranks that issued different numbers of collectives in the
  // failed step match again. Not below next_sequence() (ignored then).
  void ResumeAt(uint64_t next_seq);

 protected:
  // ResumeAt's part for backends that keep per-sequence state (the local
  // rendezvous drops its abandoned slots). Called with the launch lock held.
  virtual void OnResume(uint64_t next_seq) {}
  // Takes the next sequence number for the backend's own use (gloo's
  // FailPeers marks its failure with it): no collective of this handle gets it.
  uint64_t ReserveSequence();

  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

  // Runs `c` (validated, numbered) asynchronously on `stream`. Called under
  // the group's launch lock, so calls arrive in sequence order.
  virtual StatusOr<std::shared_ptr<Work>> Launch(Collective c, Stream& stream) = 0;

  // For backends whose collectives run as host closures on the stream:
  // enqueues `body` and a completion event after it; the Work takes body's
  // status (which also becomes the stream's error when not OK).
  static StatusOr<std::shared_ptr<Work>> EnqueueOnStream(std::string description, Stream& stream,
                                                         std::function<Status()> body);

  // InvalidArgument naming the group ("local group rank 1 of 4: ...").
  Status Invalid(const std::string& what) const;

  // Backends that record their collectives set this once, in their
  // constructor; Submit then records every launch in it.
  std::shared_ptr<FlightRecorder> flight_recorder_;

 private:
  StatusOr<std::shared_ptr<Work>> Submit(Collective c, Stream& stream);
  // Host tensors on a GPU stream (checkpoints, rank agreement, the trainer's
  // option check: small or rare calls that read the result on the host at
  // once): the tensors are copied to device memory, the collective runs
  // there, the outputs are copied back, and the call returns completed.
  StatusOr<std::shared_ptr<Work>> SubmitStagedFromHost(Collective c, Stream& stream);
  Status ValidateTensor(const Tensor& t, const char* role, size_t index, const Stream& stream) const;

  const int rank_;
  const int size_;
  std::mutex launch_mu_;  // sequence numbers are given in launch order
  uint64_t next_seq_ = 0;
};

// InvalidArgument unless `ranks` is sorted, distinct, within [0, world) and
// contains `self`.
Status ValidateGroupRanks(const std::vector<int>& ranks, int world, int self);

// How a backend's NewGroup names the sub-group it is asked for. Members call
// NewGroup with the same list in the same order, so (the list, how many
// times this rank has asked for it) names the same group on every member.
// Thread-safe; one per process group.
class SubGroupNames {
 public:
  struct Entry {
    std::string ranks;  // RankList(ranks): "0,1,3"
    int occurrence;     // 0 the first time this rank asks for that list
    int sub_rank;       // this rank's index in the list
    // The sub-group's store prefix under its parent's: "<parent>/sub[0,1,3]#k".
    std::string Prefix(const std::string& parent) const {
      return parent + "/sub[" + ranks + "]#" + std::to_string(occurrence);
    }
  };
  // ValidateGroupRanks(ranks, world, self), then the next entry for `ranks`.
  StatusOr<Entry> Next(const std::vector<int>& ranks, int world, int self);
  // The sub-group members' ranks in the whole world: `global_ranks` (the
  // parent's members, by parent rank) at each of `ranks`.
  static std::vector<int> GlobalRanks(const std::vector<int>& ranks, const std::vector<int>& global_ranks);

 private:
  std::mutex mu_;
  std::map<std::string, int> counts_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_PROCESS_GROUP_H_
