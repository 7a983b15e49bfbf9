#include "runtime/comm/local_backend.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/comm/reduce.h"
#include "runtime/core/trace.h"
#if defined(SHARDKIT_WITH_CUDA)
#include "runtime/comm/cuda_reduce.h"
#endif

namespace sk::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Balanced split of `count` elements into `parts` chunks: chunk i is
// [ChunkBegin(i), ChunkBegin(i + 1)).
size_t ChunkBegin(size_t count, int parts, int i) {
  return count / parts * i + std::min<size_t>(count % parts, i);
}


// Stream-ordered mode: a new event recorded on `stream` now.
Status RecordNewEvent(Device& device, Stream& stream, std::shared_ptr<Event>* out) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device.CreateEvent(false));
  SK_RETURN_IF_ERROR(event->Record(stream));
  *out = std::move(event);
  return OkStatus();
}

// Stream-ordered mode: work enqueued on `stream` from now on waits for every
// other rank's event.
Status WaitForPeers(Stream& stream, const std::vector<std::shared_ptr<Event>>& events, int rank) {
  for (size_t j = 0; j < events.size(); ++j) {
    if (static_cast<int>(j) == rank || events[j] == nullptr) continue;
    SK_RETURN_IF_ERROR(stream.WaitEvent(*events[j]));
  }
  return OkStatus();
}

// Stream-ordered mode: enqueues ReduceInRankOrder on `stream`, on the host
// (a CPU stream's worker) or as a kernel (CUDA).
Status EnqueueReduce(Stream& stream, std::vector<const void*> srcs, DType dtype, size_t count,
                     float pre, float divisor, float post, void* dst) {
  if (count == 0) return OkStatus();
  const DeviceCapabilities can = KindCapabilities(stream.device().kind);
  if (can.host_memory) {
    return stream.Enqueue([srcs = std::move(srcs), dtype, count, pre, divisor, post, dst]() {
      ReduceInRankOrder(srcs.data(), static_cast<int>(srcs.size()), dtype, count, pre, divisor,
                        post, dst);
      return OkStatus();
    });
  }
#if defined(SHARDKIT_WITH_CUDA)
  if (can.native_streams) {
    if (srcs.size() > static_cast<size_t>(cuda::kMaxReduceSources)) {
      return InvalidArgumentError("the local backend reduces over at most " +
                                  std::to_string(cuda::kMaxReduceSources) +
                                  " ranks on a GPU, not " + std::to_string(srcs.size()));
    }
    int err = cuda::ReduceInRankOrderAsync(srcs.data(), static_cast<int>(srcs.size()), dtype,
                                           count, pre, divisor, post, dst,
                                           stream.native_handle());
    if (err != 0) {
      return InternalError("local backend reduction kernel launch failed on " +
                           stream.device().ToString() + " (cudaError " + std::to_string(err) + ")");
    }
    return OkStatus();
  }
#endif
  return UnimplementedError("the local backend cannot reduce on " + stream.device().ToString());
}

}  // namespace

// Keeps all_reduce's scratch chunks between the collectives of one rank: a
// fresh chunk per call costs page faults comparable to the reduction itself.
// Several streams may run collectives of one rank at once, hence a free list.
class ScratchPool {
 public:
  explicit ScratchPool(Allocator& allocator) : allocator_(allocator) {}

  StatusOr<std::shared_ptr<Storage>> Acquire(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if ((*it)->nbytes() >= bytes) {
          std::shared_ptr<Storage> s = std::move(*it);
          free_.erase(it);
          return s;
        }
      }
    }
    return allocator_.AllocateBytes(bytes);
  }

  void Release(std::shared_ptr<Storage> s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kMaxCached) free_.push_back(std::move(s));
  }

 private:
  static constexpr size_t kMaxCached = 4;  // a few entries of a coalesced call
  Allocator& allocator_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Storage>> free_;
};

// What one rank publishes in a slot. Copied in, so a rank's call may end (and
// its closure die) while others still look at the slot.
struct RankCall {
  CallFingerprint fingerprint;
  std::string description;
  std::vector<void*> in;
  std::vector<void*> out;
  std::vector<void*> scratch;  // all_reduce: this rank's reduced chunk per entry

  // This rank's call `c`: its fingerprint, description and buffers (no
  // scratch).
  static RankCall Of(const Collective& c) {
    RankCall call;
    call.fingerprint = CallFingerprint::Of(c);
    call.description = c.Describe();
    for (size_t e = 0; e < c.outputs.size(); ++e) {
      call.in.push_back(c.inputs[e].data());
      call.out.push_back(c.outputs[e].data());
    }
    return call;
  }
};

// How a rank's share of a collective's data movement is carried out: at once
// on the host (LocalRendezvous::Run) or enqueued on its stream (RunOrdered).
// Both modes move the same bytes through the same two helpers below.
struct Mover {
  std::function<Status(void* dst, const void* src, size_t bytes)> copy;
  // ReduceInRankOrder of `srcs` (count elements of dtype each) into `dst`.
  std::function<Status(std::vector<const void*> srcs, DType dtype, size_t count, void* dst)> reduce;
};

// Rank `rank`'s share of collective `c` among `calls` (every rank's buffers),
// before all_reduce's gather: all_gather's copies into this rank's output,
// reduce_scatter's reduction of this rank's chunk, all_reduce's reduction of
// chunk `rank` into all_reduce_dst(e, begin), broadcast's copy from the root.
Status MoveShare(int rank, const Collective& c, const std::vector<RankCall>& calls,
                 const std::function<void*(size_t e, size_t begin)>& all_reduce_dst,
                 const Mover& m) {
  const int n = static_cast<int>(calls.size());
  Status s;
  for (size_t e = 0; e < c.outputs.size() && s.ok(); ++e) {
    // Empty tensors may have no memory at all: nothing to move.
    if (c.outputs[e].nbytes() == 0) continue;
    const DType dtype = c.outputs[e].dtype();
    const size_t esize = DTypeSize(dtype);
    const size_t count = static_cast<size_t>(c.outputs[e].numel());
    char* out = static_cast<char*>(calls[rank].out[e]);
    switch (c.kind) {
      case CollectiveKind::kAllGather: {
        const size_t bytes = c.inputs[e].nbytes();
        for (int j = 0; j < n && s.ok(); ++j) {
          if (calls[j].in[e] != out + j * bytes) s = m.copy(out + j * bytes, calls[j].in[e], bytes);
        }
        break;
      }
      case CollectiveKind::kReduceScatter: {
        std::vector<const void*> srcs(n);
        for (int j = 0; j < n; ++j) {
          srcs[j] = static_cast<const char*>(calls[j].in[e]) + rank * count * esize;
        }
        s = m.reduce(std::move(srcs), dtype, count, out);
        break;
      }
      case CollectiveKind::kAllReduce: {
        const size_t begin = ChunkBegin(count, n, rank);
        const size_t len = ChunkBegin(count, n, rank + 1) - begin;
        std::vector<const void*> srcs(n);
        for (int j = 0; j < n; ++j) srcs[j] = static_cast<const char*>(calls[j].in[e]) + begin * esize;
        s = m.reduce(std::move(srcs), dtype, len, all_reduce_dst(e, begin));
        break;
      }
      case CollectiveKind::kBroadcast:
        if (rank != c.root) s = m.copy(out, calls[c.root].in[e], c.outputs[e].nbytes());
        break;
      case CollectiveKind::kBarrier:
        break;
    }
  }
  return s;
}

// all_reduce's gather, once every chunk is reduced: chunk j of this rank's
// output from reduced_chunk(j, e, begin) for every rank j (a chunk already in
// place is not copied).
Status GatherReducedChunks(int rank, const Collective& c, const std::vector<RankCall>& calls,
                           const std::function<const void*(int j, size_t e, size_t begin)>& reduced_chunk,
                           const Mover& m) {
  const int n = static_cast<int>(calls.size());
  Status s;
  for (size_t e = 0; e < c.outputs.size() && s.ok(); ++e) {
    if (c.outputs[e].nbytes() == 0) continue;
    const size_t esize = DTypeSize(c.outputs[e].dtype());
    const size_t count = static_cast<size_t>(c.outputs[e].numel());
    char* out = static_cast<char*>(calls[rank].out[e]);
    for (int j = 0; j < n && s.ok(); ++j) {
      const size_t begin = ChunkBegin(count, n, j);
      const size_t len = ChunkBegin(count, n, j + 1) - begin;
      const void* src = reduced_chunk(j, e, begin);
      if (len > 0 && src != out + begin * esize) s = m.copy(out + begin * esize, src, len * esize);
    }
  }
  return s;
}

class LocalRendezvous {
 public:
  explicit LocalRendezvous(int size) : size_(size) {}
  int size() const { return size_; }

  // Runs rank `rank`'s part of collective `c`.
  Status Run(int rank, const Collective& c, ScratchPool& scratch_pool);
  // Stream-ordered mode (local_backend.h): enqueues rank `rank`'s part of `c`
  // on `stream` of `device` after the host rendezvous; the Work completes on
  // `stream`.
  Status RunOrdered(int rank, const Collective& c, Stream& stream, Device& device);

  // FailPeers: marks the group failed with `culprit` and fails every slot
  // now waiting; OK, or the culprit published first. `resumes` is how many
  // failed steps the failing rank has resumed from: a failure of an earlier
  // step that a slow peer has not resumed from yet is replaced, not kept.
  Status Fail(const Status& culprit, uint64_t resumes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ && failed_resumes_ >= resumes) return failure_;
    failed_ = true;
    failed_resumes_ = resumes;
    failure_ = culprit;
    for (auto& [seq, slot] : slots_) Abort(slot, culprit);
    cv_.notify_all();
    return OkStatus();
  }
  // ResumeAt by a rank that had resumed `resumes` times before: collectives
  // work again from `next_seq`; the slots before it that not every rank
  // reached are dropped (every rank has drained its streams before the
  // ranks agreed to resume, so nobody waits in them). A failure published
  // after a faster peer resumed (the next step's) stays: clearing it let
  // this rank wait in that step's collective for the failed peer until the
  // timeout.
  void Resume(uint64_t next_seq, uint64_t resumes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ && failed_resumes_ <= resumes) {
      failed_ = false;
      failure_ = OkStatus();
    }
    slots_.erase(slots_.begin(), slots_.lower_bound(next_seq));
  }

  std::shared_ptr<LocalRendezvous> Child(const std::string& key, int size) {
    std::lock_guard<std::mutex> lock(mu_);
    Child_& child = children_[key];
    if (child.rendezvous == nullptr) child.rendezvous = std::make_shared<LocalRendezvous>(size);
    std::shared_ptr<LocalRendezvous> result = child.rendezvous;
    if (++child.taken == size) children_.erase(key);
    return result;
  }

 private:
  // Stream-ordered mode: the events every rank records, one set per phase.
  enum Phase { kReady = 0, kReduced = 1, kDone = 2, kPhases = 3 };
  struct Slot {
    explicit Slot(int n) : calls(n), arrived_flags(n, false) {
      for (auto& e : events) e.resize(n);
    }
    std::vector<RankCall> calls;
    std::vector<bool> arrived_flags;
    int arrived = 0;
    int reduced = 0;   // all_reduce: ranks whose scratch chunk is ready
    int finished = 0;  // ranks done reading other ranks' buffers
    int left = 0;      // ranks gone from the slot for good
    // Host mode: ranks reading other ranks' buffers right now. A rank that
    // leaves an aborted slot early waits for it to reach 0: otherwise a
    // peer still copying out of (or reducing from) its buffers races with
    // the writes of its next step (a failed step's gradient buffer zeroed
    // while a peer's reduce-scatter still summed it).
    int reading = 0;
    bool aborted = false;
    Status failure;
    std::vector<std::shared_ptr<Event>> events[kPhases];
    int phase_count[kPhases] = {};
  };
  struct Child_ {
    std::shared_ptr<LocalRendezvous> rendezvous;
    int taken = 0;
  };

  // Waits on `cv_` until pred() or the deadline; false on timeout.
  template <typename Pred>
  bool WaitUntil(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Pred pred) {
    return cv_.wait_until(lock, deadline, pred);
  }
  // Marks the slot aborted with `s` (if it is not already) and wakes everyone.
  void Abort(Slot& slot, Status s) {
    if (!slot.aborted) {
      slot.aborted = true;
      slot.failure = std::move(s);
    }
    cv_.notify_all();
  }
  // After this rank arrived (lock held): waits for every rank until `deadline`,
  // then compares their call fingerprints. On any failure (a peer's abort, the
  // ranks that did not arrive named, a desync) this rank leaves the slot and the
  // status is returned; OK means every rank is here with the same call, and the
  // slot's calls are immutable from then on. Every rank reaches the same verdict
  // and nobody has touched anyone's buffers.
  Status AwaitArrivals(std::unique_lock<std::mutex>& lock, const Collective& c, Slot& slot, int n,
                       Clock::time_point deadline) {
    bool all_here = WaitUntil(lock, deadline, [&] { return slot.arrived == n || slot.aborted; });
    if (!slot.aborted && !all_here) {
      std::vector<int> missing;
      for (int r = 0; r < n; ++r) {
        if (!slot.arrived_flags[r]) missing.push_back(r);
      }
      Abort(slot, DeadlineExceededError(Who(c) + ": " + NameRanks(missing) +
                                        " did not arrive within " +
                                        std::to_string(c.timeout.count()) + " ms"));
    }
    if (slot.aborted) {
      // Every rank may have arrived, and a faster one be reading this
      // rank's buffers already, before the abort.
      return LeaveAborted(lock, c, slot);
    }
    std::vector<CallFingerprint> prints;
    for (const RankCall& call : slot.calls) prints.push_back(call.fingerprint);
    Status desync = CompareFingerprints(prints, "local group of " + std::to_string(n));
    if (!desync.ok()) Leave(c.seq, slot);
    return desync;
  }

  // A rank's arrival at collective `c` (`lock` holds mu_): unless the group
  // has failed (FailPeers) or the collective already has, registers `mine`
  // (and, stream-ordered, this rank's `ready` event) in c's slot, aborts
  // the slot with `local_failure` when this rank could not take part, and
  // waits for the others (AwaitArrivals). OK with *out the slot, every rank
  // here with the same call and the lock still held; otherwise this rank
  // has left the slot.
  Status Arrive(std::unique_lock<std::mutex>& lock, int rank, const Collective& c, RankCall mine,
                std::shared_ptr<Event> ready, const Status& local_failure, Clock::time_point deadline,
                Slot** out) {
    if (failed_) return failure_;
    Slot& slot = slots_.try_emplace(c.seq, size_).first->second;
    if (slot.aborted) {
      Status s = slot.failure;
      Leave(c.seq, slot);
      return AbortedError("rank " + std::to_string(rank) + " arrived after the collective failed: " +
                          std::string(s.message()));
    }
    slot.calls[rank] = std::move(mine);
    slot.arrived_flags[rank] = true;
    slot.events[kReady][rank] = std::move(ready);
    ++slot.arrived;
    if (!local_failure.ok()) Abort(slot, local_failure);
    cv_.notify_all();
    SK_RETURN_IF_ERROR(AwaitArrivals(lock, c, slot, size_, deadline));
    *out = &slot;
    return OkStatus();
  }

  void Leave(uint64_t seq, Slot& slot) {
    if (++slot.left == size_) slots_.erase(seq);
  }
  // Host mode, a rank leaving slot `c` after it was aborted, before every
  // rank finished: returns the slot's failure once no rank reads the
  // ranks' buffers any more (the caller reuses its own, and its scratch goes
  // back to the pool). Those readers are host copies and reductions already
  // under way, which finish without waiting on anyone, so this wait is
  // bounded by their work, not by a peer.
  Status LeaveAborted(std::unique_lock<std::mutex>& lock, const Collective& c, Slot& slot) {
    cv_.wait(lock, [&] { return slot.reading == 0; });
    Status s = slot.failure;
    Leave(c.seq, slot);
    return s;
  }
  // Stream-ordered mode, phases after arrival: records this rank's event of
  // `phase` on `stream` (unless `local` already failed, which aborts the
  // slot), waits on the host until every rank has, then makes `stream` wait
  // for all of them. The caller Leaves the slot afterwards, whatever this
  // returns.
  Status OrderedBarrier(int rank, const Collective& c, Slot& slot, Phase phase, Status local,
                        Stream& stream, Device& device, Clock::time_point deadline);
  std::string Who(const Collective& c) const {
    return "local group of " + std::to_string(size_) + ": " + c.Describe();
  }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Slot> slots_;
  std::map<std::string, Child_> children_;
  bool failed_ = false;  // FailPeers until Resume
  uint64_t failed_resumes_ = 0;  // the failing rank's resumes when it failed
  Status failure_;
};

Status LocalRendezvous::Run(int rank, const Collective& c, ScratchPool& scratch_pool) {
  const Clock::time_point deadline = Clock::now() + c.timeout;
  const int n = size_;
  const size_t entries = c.outputs.size();

  RankCall mine = RankCall::Of(c);
  std::vector<std::shared_ptr<Storage>> scratch_storage;
  struct ReturnScratch {
    ScratchPool& pool;
    std::vector<std::shared_ptr<Storage>>& storage;
    ~ReturnScratch() {
      for (auto& s : storage) pool.Release(std::move(s));
    }
  } return_scratch{scratch_pool, scratch_storage};
  Status local_failure;
  for (size_t e = 0; e < entries; ++e) {
    if (c.kind == CollectiveKind::kAllReduce) {
      size_t count = static_cast<size_t>(c.outputs[e].numel());
      size_t chunk = ChunkBegin(count, n, rank + 1) - ChunkBegin(count, n, rank);
      StatusOr<std::shared_ptr<Storage>> s =
          scratch_pool.Acquire(chunk * DTypeSize(c.outputs[e].dtype()));
      if (!s.ok()) {
        local_failure = s.status().WithContext("rank " + std::to_string(rank) + " scratch");
        break;
      }
      mine.scratch.push_back(s.value()->data());
      scratch_storage.push_back(std::move(s).value());
    }
  }

  // -- Arrival --------------------------------------------------------------
  std::unique_lock<std::mutex> lock(mu_);
  Slot* arrived = nullptr;
  SK_RETURN_IF_ERROR(Arrive(lock, rank, c, std::move(mine), nullptr, local_failure, deadline, &arrived));
  Slot& slot = *arrived;
  const std::vector<RankCall>& calls = slot.calls;
  ++slot.reading;  // under the lock, and only while the slot is not aborted
  lock.unlock();

  // -- Data movement: this rank's share, concurrently with the others --------
  const float divisor = c.op == ReduceOp::kAvg ? static_cast<float>(n) : 1.0f;
  const Mover host{[](void* dst, const void* src, size_t bytes) {
                     std::memcpy(dst, src, bytes);
                     return OkStatus();
                   },
                   [&](std::vector<const void*> srcs, DType dtype, size_t count, void* dst) {
                     ReduceInRankOrder(srcs.data(), n, dtype, count, c.pre_scale, divisor,
                                       c.post_scale, dst);
                     return OkStatus();
                   }};
  // Host copies and reductions cannot fail.
  (void)MoveShare(rank, c, calls, [&](size_t e, size_t) { return calls[rank].scratch[e]; }, host);

  lock.lock();
  --slot.reading;
  if (c.kind == CollectiveKind::kAllReduce) {
    // Everyone's reduced chunk must be ready (and every read of the inputs
    // done: the gather below overwrites them) before anyone gathers.
    ++slot.reduced;
    cv_.notify_all();
    if (!WaitUntil(lock, deadline, [&] { return slot.reduced == n || slot.aborted; }) &&
        !slot.aborted) {
      Abort(slot, DeadlineExceededError(Who(c) + ": ranks did not finish reducing within " +
                                        std::to_string(c.timeout.count()) + " ms"));
    }
    if (slot.aborted) return LeaveAborted(lock, c, slot);
    ++slot.reading;
    lock.unlock();
    (void)GatherReducedChunks(
        rank, c, calls, [&](int j, size_t e, size_t) -> const void* { return calls[j].scratch[e]; },
        host);
    lock.lock();
    --slot.reading;
  }

  // -- Departure: nobody leaves while another rank may still read its buffers.
  ++slot.finished;
  cv_.notify_all();
  if (!WaitUntil(lock, deadline, [&] { return slot.finished == n || slot.aborted; }) &&
      !slot.aborted) {
    Abort(slot, DeadlineExceededError(Who(c) + ": ranks did not finish copying within " +
                                      std::to_string(c.timeout.count()) + " ms"));
  }
  if (slot.finished != n) return LeaveAborted(lock, c, slot);
  Leave(c.seq, slot);
  return OkStatus();
}

Status LocalRendezvous::OrderedBarrier(int rank, const Collective& c, Slot& slot, Phase phase,
                                       Status local, Stream& stream, Device& device,
                                       Clock::time_point deadline) {
  static constexpr const char* kPhaseName[kPhases] = {"arrive", "finish reducing",
                                                      "finish copying"};
  std::shared_ptr<Event> event;
  if (local.ok()) local = RecordNewEvent(device, stream, &event);
  std::unique_lock<std::mutex> lock(mu_);
  slot.events[phase][rank] = std::move(event);
  ++slot.phase_count[phase];
  if (!local.ok()) Abort(slot, local.WithContext("rank " + std::to_string(rank)));
  cv_.notify_all();
  const int n = size_;
  if (!WaitUntil(lock, deadline, [&] { return slot.phase_count[phase] == n || slot.aborted; }) &&
      !slot.aborted) {
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      if (slot.events[phase][r] == nullptr) missing.push_back(r);
    }
    Abort(slot, DeadlineExceededError(Who(c) + ": " + NameRanks(missing) + " did not " +
                                      kPhaseName[phase] + " within " +
                                      std::to_string(c.timeout.count()) + " ms"));
  }
  if (slot.aborted) return slot.failure;
  std::vector<std::shared_ptr<Event>> events = slot.events[phase];
  lock.unlock();
  return WaitForPeers(stream, events, rank);
}

Status LocalRendezvous::RunOrdered(int rank, const Collective& c, Stream& stream,
                                   Device& device) {
  const Clock::time_point deadline = Clock::now() + c.timeout;
  const int n = size_;

  RankCall mine = RankCall::Of(c);
  std::shared_ptr<Event> ready;
  Status local_failure = RecordNewEvent(device, stream, &ready);

  // -- Arrival (on the host): as Run, plus this rank's ready event ----------
  if (!local_failure.ok()) local_failure = local_failure.WithContext("rank " + std::to_string(rank));
  std::unique_lock<std::mutex> lock(mu_);
  Slot* arrived = nullptr;
  SK_RETURN_IF_ERROR(
      Arrive(lock, rank, c, std::move(mine), std::move(ready), local_failure, deadline, &arrived));
  Slot& slot = *arrived;
  const std::vector<RankCall>& calls = slot.calls;  // immutable from here on
  std::vector<std::shared_ptr<Event>> readies = slot.events[kReady];
  lock.unlock();

  // -- Data movement, enqueued on this rank's stream after every input is ready
  const float divisor = c.op == ReduceOp::kAvg ? static_cast<float>(n) : 1.0f;
  const Mover enqueued{
      [&](void* dst, const void* src, size_t bytes) { return device.CopyAsync(dst, src, bytes, stream); },
      [&](std::vector<const void*> srcs, DType dtype, size_t count, void* dst) {
        return EnqueueReduce(stream, std::move(srcs), dtype, count, c.pre_scale, divisor,
                             c.post_scale, dst);
      }};
  Status s = WaitForPeers(stream, readies, rank);
  // all_reduce in place: chunk `rank` of every rank's buffer into chunk
  // `rank` of ours; nobody else reads or writes that chunk of our buffer now.
  if (s.ok()) {
    s = MoveShare(
        rank, c, calls,
        [&](size_t e, size_t begin) -> void* {
          return static_cast<char*>(calls[rank].out[e]) + begin * DTypeSize(c.outputs[e].dtype());
        },
        enqueued);
  }
  if (c.kind == CollectiveKind::kAllReduce) {
    // Every chunk is reduced before anyone gathers the chunks of the others.
    s = OrderedBarrier(rank, c, slot, kReduced, s, stream, device, deadline);
    if (s.ok()) {
      s = GatherReducedChunks(
          rank, c, calls,
          [&](int j, size_t e, size_t begin) -> const void* {
            return static_cast<const char*>(calls[j].out[e]) + begin * DTypeSize(c.outputs[e].dtype());
          },
          enqueued);
    }
  }
  // -- Departure: later work on any rank's stream waits for every rank's copies.
  s = OrderedBarrier(rank, c, slot, kDone, s, stream, device, deadline);
  lock.lock();
  Leave(c.seq, slot);
  return s;
}

StatusOr<std::vector<std::unique_ptr<ProcessGroup>>> LocalProcessGroup::Create(
    int world_size, LocalOptions options) {
  if (world_size < 1) {
    return InvalidArgumentError("local group world size must be >= 1, got " +
                                std::to_string(world_size));
  }
  auto rendezvous = std::make_shared<LocalRendezvous>(world_size);
  std::vector<std::unique_ptr<ProcessGroup>> ranks;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(std::make_unique<LocalProcessGroup>(r, rendezvous, options));
  }
  return ranks;
}

LocalProcessGroup::LocalProcessGroup(int rank, std::shared_ptr<LocalRendezvous> rendezvous,
                                     LocalOptions options)
    : ProcessGroup(rank, rendezvous->size()), rendezvous_(std::move(rendezvous)),
      options_(options),
      scratch_pool_(std::make_shared<ScratchPool>(options.scratch_allocator != nullptr
                                                      ? *options.scratch_allocator
                                                      : HostAllocator::Default())) {}

LocalProcessGroup::~LocalProcessGroup() = default;

StatusOr<std::unique_ptr<ProcessGroup>> LocalProcessGroup::NewGroup(const std::vector<int>& ranks,
                                                                    Duration /*timeout*/) {
  SK_ASSIGN_OR_RETURN(SubGroupNames::Entry sub, sub_groups_.Next(ranks, size(), rank()));
  std::shared_ptr<LocalRendezvous> child = rendezvous_->Child(
      sub.ranks + "#" + std::to_string(sub.occurrence), static_cast<int>(ranks.size()));
  return std::unique_ptr<ProcessGroup>(new LocalProcessGroup(sub.sub_rank, child, options_));
}

Status LocalProcessGroup::FailPeers(const Status& culprit) { return rendezvous_->Fail(culprit, resumes_.load()); }

void LocalProcessGroup::OnResume(uint64_t next_seq) { rendezvous_->Resume(next_seq, resumes_.fetch_add(1)); }

StatusOr<std::shared_ptr<Work>> LocalProcessGroup::Launch(Collective c, Stream& stream) {
  std::string description = "local rank " + std::to_string(rank()) + ": " + c.Describe();
  if (options_.stream_ordered || !KindCapabilities(stream.device().kind).host_memory) {
    SK_ASSIGN_OR_RETURN(Device * device, Device::Get(stream.device()));
    TraceSpan span(CollectiveName(c.kind), "comm", rank(), stream.id());
    Status s = rendezvous_->RunOrdered(rank(), c, stream, *device);
    if (!s.ok()) {
      // As in the host-closure mode, the call is made (its sequence number
      // is used) and its Work and the stream carry the failure.
      return EnqueueOnStream(std::move(description), stream, [s]() { return s; });
    }
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, device->CreateEvent(false));
    auto work = std::make_shared<Work>(std::move(description), std::move(done));
    SK_RETURN_IF_ERROR(work->mutable_event().Record(stream));
    return work;
  }
  const int rank = this->rank();
  const int64_t track = stream.id();
  return EnqueueOnStream(
      std::move(description), stream,
      [rendezvous = rendezvous_, pool = scratch_pool_, c = std::move(c), rank, track]() -> Status {
        TraceSpan span(CollectiveName(c.kind), "comm", rank, track);
        return rendezvous->Run(rank, c, *pool);
      });
}

Status RunRankThreads(int world_size, const std::function<Status(int rank)>& body,
                      std::vector<Status>* per_rank,
                      const std::function<void(int rank, const Status& error)>& on_failure) {
  if (world_size < 1) {
    return InvalidArgumentError("RunRankThreads: world_size must be >= 1, not " +
                                std::to_string(world_size));
  }
  std::vector<Status> results(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(results.size());
  // No rank starts its body until every rank's thread exists: a rank that
  // ran while another could not be created would wait for it in its first
  // collective until the timeout.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool decided = false, go = false;
  Status start_failure;
  for (int r = 0; r < world_size; ++r) {
    try {
      threads.emplace_back([&, r] {
        {
          std::unique_lock<std::mutex> lock(gate_mu);
          gate_cv.wait(lock, [&] { return decided; });
          if (!go) {
            results[r] = AbortedError("not run: another rank's thread could not be created");
            return;
          }
        }
        try {
          results[r] = body(r);
        } catch (const std::bad_alloc&) {
          results[r] = ResourceExhaustedError("out of host memory (std::bad_alloc)");
        } catch (const std::exception& e) {
          results[r] = InternalError(std::string("unexpected C++ exception: ") + e.what());
        } catch (...) {
          results[r] = InternalError("unexpected C++ exception");
        }
        if (!results[r].ok() && on_failure) on_failure(r, results[r]);
      });
    } catch (const std::exception& e) {  // std::system_error (EAGAIN), std::bad_alloc
      start_failure = ResourceExhaustedError("could not create the thread of rank " + std::to_string(r) +
                                             " of " + std::to_string(world_size) + " (" + e.what() +
                                             "); none of the " + std::to_string(threads.size()) +
                                             " ranks started ran");
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(gate_mu);
    decided = true;
    go = start_failure.ok();
  }
  gate_cv.notify_all();
  for (auto& t : threads) t.join();
  if (!start_failure.ok()) {
    if (per_rank != nullptr) {
      for (int r = static_cast<int>(threads.size()); r < world_size; ++r) results[r] = start_failure;
      *per_rank = std::move(results);
    }
    return start_failure;
  }
  Status first = OkStatus();
  for (int r = 0; r < world_size; ++r) {
    if (!results[r].ok()) {
      first = results[r].WithContext("rank " + std::to_string(r));
      break;
    }
  }
  if (per_rank != nullptr) *per_rank = std::move(results);
  return first;
}

void FailPeersOnExit(ProcessGroup& group, int rank, const Status& error) {
  if (!group.publishes_failures()) return;
  (void)group.FailPeers(Status(error.code(), "rank " + std::to_string(rank) +
                                                 " stopped with an error, so it will not join this "
                                                 "collective: " + std::string(error.message())));
}

Status RunLocalRanks(int world_size,
                     const std::function<Status(int rank, ProcessGroup* group)>& body) {
  SK_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<ProcessGroup>> groups,
                      LocalProcessGroup::Create(world_size));
  return RunRankThreads(
      world_size, [&](int r) { return body(r, groups[r].get()); }, nullptr,
      [&](int r, const Status& error) { FailPeersOnExit(*groups[r], r, error); });
}

}  // namespace sk::comm
