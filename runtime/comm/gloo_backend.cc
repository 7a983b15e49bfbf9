#include "runtime/comm/gloo_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "runtime/comm/heartbeat.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/sigpipe.h"
#include "runtime/core/allocator.h"
#include "runtime/core/env.h"
#include "runtime/core/trace.h"

namespace sk::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Our Store seen through Gloo's interface, for connectFullMesh. Gloo expects
// failures as exceptions; they are caught where the context is formed.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(sk::comm::Store& store, Duration timeout) : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = store_.Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(s.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    StatusOr<std::string> v = store_.Get(key, timeout_);
    if (!v.ok()) throw gloo::IoException(v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      StatusOr<std::string> v = store_.Get(key, timeout);
      if (!v.ok()) throw gloo::IoException(v.status().ToString());
    }
  }

 private:
  sk::comm::Store& store_;
  const Duration timeout_;
};

// Gloo reports a silent peer as an IoException whose text says it timed out.
Status FromGlooException(const std::exception& e, const std::string& what) {
  std::string msg = e.what();
  std::string lower = msg;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos) {
    return DeadlineExceededError(what + ": " + msg);
  }
  return UnavailableError(what + ": " + msg);
}

// Slot prefix of our point-to-point transfers; Gloo's own collectives use
// small prefixes of their own.
constexpr uint8_t kSlotPrefix = 0xa5;

// CallFingerprint::kind of a failure marker (GlooState::Fail): no
// CollectiveKind, and never one (those count up from 1).
constexpr uint8_t kFailureMarkerKind = 0xfe;

uint8_t* Bytes(const void* p) { return static_cast<uint8_t*>(const_cast<void*>(p)); }


// Before Gloo's rendezvous (which asserts on a size mismatch in its own
// words, or waits for ranks that will never come): every rank publishes the
// group size it was created with; rank 0 reads every rank's, the others read
// rank 0's. InvalidArgument naming both ranks and sizes on a mismatch;
// DeadlineExceeded naming the ranks that did not join within `timeout`.
// First, each rank claims its rank: a second process given the same rank
// (a wrong RANK) fails here with InvalidArgument naming the rank, before it
// publishes anything, instead of overwriting the first one's address in
// Gloo's rendezvous ("Connection refused", or a peer waiting its timeout).
Status AgreeOnGroupSize(Store& store, const std::string& group, int rank, int size, Duration timeout) {
  SK_ASSIGN_OR_RETURN(int64_t claims, store.Add("rank_claims/" + std::to_string(rank), 1));
  if (claims != 1) {
    return InvalidArgumentError("gloo group '" + group + "' of size " + std::to_string(size) + ": rank " +
                                std::to_string(rank) + " is claimed by more than one process (" +
                                std::to_string(claims) + " so far): each process needs its own rank");
  }
  auto key = [](int r) { return "group_size/" + std::to_string(r); };
  SK_RETURN_IF_ERROR(store.Set(key(rank), std::to_string(size)));
  const auto deadline = Clock::now() + timeout;
  std::vector<int> peers;
  if (rank == 0) {
    for (int r = 1; r < size; ++r) peers.push_back(r);
  } else {
    peers.push_back(0);
  }
  std::vector<int> missing;
  for (int peer : peers) {
    auto left = std::max(Duration(1), std::chrono::duration_cast<Duration>(deadline - Clock::now()));
    StatusOr<std::string> v = store.Get(key(peer), missing.empty() ? left : Duration(200));
    if (!v.ok()) {
      if (v.status().code() != StatusCode::kDeadlineExceeded) return v.status();
      missing.push_back(peer);
      continue;
    }
    if (*v != std::to_string(size)) {
      return InvalidArgumentError("gloo group '" + group + "': world size mismatch: rank " + std::to_string(rank) +
                                  " (this rank) was created with world size " + std::to_string(size) +
                                  ", rank " + std::to_string(peer) + " with world size " + *v);
    }
  }
  if (!missing.empty()) {
    return DeadlineExceededError("gloo group '" + group + "' of size " + std::to_string(size) + ": " +
                                 NameRanks(missing) + " did not join within " + std::to_string(timeout.count()) + " ms");
  }
  return OkStatus();
}

}  // namespace

// What a rank's collectives share with the closures running them: the
// context and the sequence-order gate. Outlives the ProcessGroup if a
// closure is still queued when it dies.
class GlooState {
 public:
  GlooState(std::shared_ptr<gloo::rendezvous::Context> context, std::shared_ptr<FlightRecorder> recorder,
            std::vector<int> global_ranks, std::shared_ptr<Store> store, std::shared_ptr<Heartbeat> heartbeat)
      : context_(std::move(context)), recorder_(std::move(recorder)), rank_(context_->rank),
        size_(context_->size), global_ranks_(std::move(global_ranks)), store_(std::move(store)),
        heartbeat_(std::move(heartbeat)) {
    if (heartbeat_ != nullptr && size_ > 1) watcher_ = std::thread([this] { WatchWaits(); });
  }
  ~GlooState() {
    {
      std::lock_guard<std::mutex> lock(wait_mu_);
      stop_watching_ = true;
    }
    wait_cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
  }

  const std::shared_ptr<Heartbeat>& heartbeat() const { return heartbeat_; }
  bool usable() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_.ok();
  }

  void NoteLaunched(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    launched_ = std::max(launched_, seq + 1);
  }

  Status Run(const Collective& c) {
    const auto deadline = Clock::now() + c.timeout;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] {
          return executed_ == c.seq || !broken_.ok() || FailedAt(c.seq) || c.seq < executed_;
        })) {
      // The gate would stay shut behind us for good: the context is unusable.
      broken_ = DeadlineExceededError(Who(c) + ": earlier collectives of this rank did not finish within " +
                                      std::to_string(c.timeout.count()) + " ms");
      cv_.notify_all();
      return broken_;
    }
    if (!broken_.ok()) {
      Advance(c.seq);
      return UnavailableError(Who(c) + ": the gloo context failed earlier (" +
                              broken_.ToString() + "); create a new group");
    }
    if (c.seq < executed_ || FailedAt(c.seq)) {
      // Part of a failed step: the ranks skip it together (the one that
      // failed published its error, the others return it), moving nothing.
      Advance(c.seq);
      Status s = c.seq < executed_ ? AbortedError(Who(c) + ": abandoned with a failed step") : failure_;
      recorder_->Ended(c.seq, s);
      return s;
    }
    lock.unlock();
    recorder_->Started(c.seq);
    Status s;
    bool peer_failed = false;
    try {
      ScopedSigpipeBlock no_sigpipe;
      s = Execute(c, &peer_failed);
      if (!s.ok() && !peer_failed) s = s.WithContext(Who(c));
    } catch (const std::exception& e) {
      // Gloo's own broadcast and barrier: its message names an address.
      std::vector<int> peers;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) peers.push_back(r);
      }
      s = FromGlooException(e, Who(c));
      if (std::optional<std::string> blame = StoppedAmong(peers, s.code() == StatusCode::kUnavailable)) {
        s = s.WithContext(*blame);
      }
    } catch (...) {
      s = UnavailableError(Who(c) + ": gloo threw a non-standard exception");
    }
    recorder_->Ended(c.seq, s);
    if (!s.ok() && !peer_failed && s.code() != StatusCode::kInvalidArgument) {
      const std::string dump = recorder_->DumpOnError(s);
      if (!dump.empty()) s = s.WithContext("flight recorder dumped to '" + dump + "'");
    }
    if (!s.ok() && !peer_failed && s.code() != StatusCode::kInvalidArgument && heartbeat_ != nullptr) {
      // Before this rank reports (and perhaps exits): peers that find it
      // gone then know it failed first (a no-op when StoppedAmong already
      // published whom it blamed).
      heartbeat_->PublishFailure("");
    }
    if (!s.ok() && !peer_failed && s.code() != StatusCode::kInvalidArgument) {
      // The context is broken for good: close its connections now, as Gloo
      // itself does after a timeout. A peer still waiting on this rank (held
      // up by it, not by the dead one: it had this collective's data from
      // the dead rank already) then fails at once, finding this rank failed
      // first (published above), instead of at its own timeout.
      try {
        ScopedSigpipeBlock no_sigpipe;
        context_->closeConnections();
      } catch (const std::exception& e) {
        LOG(WARNING) << Who(c) << ": closing the broken context's connections: " << e.what();
      }
    }
    lock.lock();
    if (!s.ok() && !peer_failed && s.code() != StatusCode::kInvalidArgument) broken_ = s;
    Advance(c.seq);
    return s;
  }

  // ProcessGroup::FailPeers at sequence number `seq` (reserved for it, so no
  // collective of this rank uses it). This rank's later collectives fail at
  // once with `culprit`; the peers learn of it in that collective: this rank
  // posts a failure marker as its call fingerprint for `seq` (and takes the
  // peers' fingerprints for it), and leaves the culprit's text in the store.
  // Every peer reaches `seq` unless it fails first (this rank will not issue
  // it), exchanges fingerprints with the marker like any other collective,
  // so nothing is left half-moved, and fails `seq` and everything after it
  // with `culprit` until Resume. Nothing waits here: a peer whose step
  // issues no collective `seq` never takes the marker, and the ranks resume
  // beyond it (the posted buffers live as long as the context).
  Status Fail(uint64_t seq, const Status& culprit) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) return OkStatus();  // nothing reaches the peers any more
      if (!failure_.ok() && failed_at_ <= seq) return failure_;
      failure_ = culprit;
      failed_at_ = seq;
      cv_.notify_all();
    }
    if (size_ == 1) return OkStatus();
    Status stored = store_->Set(FailureKey(seq, rank_), std::to_string(static_cast<int>(culprit.code())) + "\n" +
                                                             std::string(culprit.message()));
    if (!stored.ok()) LOG(WARNING) << "gloo rank " << rank_ << ": publishing a failure: " << stored;
    auto marker = std::make_unique<Marker>();
    marker->fingerprints.resize(size_);
    CallFingerprint& mine = marker->fingerprints[rank_];
    mine.seq = seq;
    mine.kind = kFailureMarkerKind;
    mine.entries = static_cast<int32_t>(culprit.code());
    try {
      ScopedSigpipeBlock no_sigpipe;
      const size_t bytes = sizeof(CallFingerprint);
      marker->buffer = context_->createUnboundBuffer(marker->fingerprints.data(), bytes * size_);
      const gloo::Slot slot = gloo::Slot::build(kSlotPrefix, FingerprintTag(seq));
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        marker->buffer->recv(j, slot, j * bytes, bytes);
        marker->buffer->send(j, slot, rank_ * bytes, bytes);
      }
    } catch (const std::exception& e) {
      // A peer already gone: it fails on its own; the others got the marker.
      LOG(WARNING) << "gloo rank " << rank_ << ": posting a failure marker: " << e.what();
    }
    std::lock_guard<std::mutex> lock(mu_);
    markers_.push_back(std::move(marker));
    return OkStatus();
  }

  // ProcessGroup::ResumeAt: collectives work again from `next_seq`; one
  // still queued below it (none, after the step was drained) is abandoned.
  void Resume(uint64_t next_seq) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = OkStatus();
    failed_at_ = UINT64_MAX;
    executed_ = std::max(executed_, next_seq);
    launched_ = std::max(launched_, next_seq);
    cv_.notify_all();
  }

  // Waits for every launched collective to run, then barriers with the peers
  // so none of them sees this rank's connections close mid-collective.
  void Shutdown(Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout,
                      [&] { return executed_ >= launched_ || !broken_.ok() || !failure_.ok(); })) {
      return;
    }
    // A step that failed and was not resumed: the peers are not at a barrier.
    if (!broken_.ok() || !failure_.ok()) return;
    lock.unlock();
    try {
      ScopedSigpipeBlock no_sigpipe;
      gloo::BarrierOptions opts(context_);
      opts.setTag(0xfffffff0u);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    } catch (const std::exception& e) {
      LOG(WARNING) << "gloo rank " << rank_ << ": final barrier failed: " << e.what();
    } catch (...) {
      LOG(WARNING) << "gloo rank " << rank_ << ": final barrier failed";
    }
  }

 private:
  // Opens the gate for the collective after `seq` if `seq` held it.
  void Advance(uint64_t seq) {
    if (executed_ != seq) return;
    ++executed_;
    cv_.notify_all();
  }
  bool FailedAt(uint64_t seq) const { return !failure_.ok() && seq >= failed_at_; }
  static std::string FailureKey(uint64_t seq, int rank) {
    return "failure/" + std::to_string(seq) + "/" + std::to_string(rank);
  }
  // The culprit that rank `peer` published at `seq` (Fail), read from the
  // store; if it cannot be read, a status naming the rank and its code.
  Status PeerFailure(uint64_t seq, int peer, int32_t code, Duration timeout) {
    const std::string who = global_ranks_.size() == static_cast<size_t>(size_) && global_ranks_[peer] != peer
                                ? "rank " + std::to_string(global_ranks_[peer]) + " (rank " + std::to_string(peer) +
                                      " of this group)"
                                : "rank " + std::to_string(peer);
    const StatusCode fallback =
        code > 0 && code <= static_cast<int32_t>(StatusCode::kDataLoss) ? static_cast<StatusCode>(code)
                                                                                : StatusCode::kUnknown;
    StatusOr<std::string> v = store_->Get(FailureKey(seq, peer), std::min(timeout, Duration(10'000)));
    if (!v.ok()) {
      return Status(fallback, who + " failed (" + StatusCodeName(fallback) + "); its message could not be read: " +
                                  v.status().ToString());
    }
    const size_t nl = v->find('\n');
    return Status(fallback, nl == std::string::npos ? *v : v->substr(nl + 1));
  }
  std::string Who(const Collective& c) const {
    return "gloo rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " + c.Describe();
  }
  static uint32_t Tag(const Collective& c, uint32_t step) { return Tag(c.seq, step); }
  static uint32_t Tag(uint64_t seq, uint32_t step) { return static_cast<uint32_t>(seq * 64 + step) & 0x7fffffffu; }
  // The call fingerprints' exchange, first in every collective.
  static uint32_t FingerprintTag(uint64_t seq) { return Tag(seq, 63); }

  // Every rank's `bytes` into `out` (rank j's at j * bytes). The transfers to
  // and from all peers are posted at once on Gloo's pairs: each rank sends
  // and receives (N-1)/N of the output, as a ring does, in one step instead
  // of N-1. (Debian's gloo::allgather took ~10 ms for any message below
  // 1 MiB on our 2-core machine where this takes ~0.1 ms; equal above 16 MiB.)
  Status AllGatherBytes(void* out, const void* in, size_t bytes, uint32_t tag, Duration timeout) {
    if (bytes == 0) return OkStatus();
    char* mine = static_cast<char*>(out) + rank_ * bytes;
    if (in != mine) std::memcpy(mine, in, bytes);
    if (size_ == 1) return OkStatus();
    const auto deadline = Clock::now() + timeout;
    const gloo::Slot slot = gloo::Slot::build(kSlotPrefix, tag);
    auto buf = context_->createUnboundBuffer(out, bytes * size_);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      buf->recv(j, slot, j * bytes, bytes);
      buf->send(j, slot, rank_ * bytes, bytes);
    }
    SK_RETURN_IF_ERROR(WaitRecvs(*buf, deadline));
    return WaitSends(*buf, deadline);
  }

  // Sends shard j of `in` (size_ shards of `shard_bytes`) to rank j and
  // receives every other rank's shard for this rank into slot j of `recv`,
  // all posted at once: (N-1)/N of the buffer each way, as the issue asks of
  // reduce-scatter. This rank's own shard is not copied.
  Status ExchangeShards(const void* in, void* recv, size_t shard_bytes, uint32_t tag,
                        Duration timeout) {
    if (shard_bytes == 0 || size_ == 1) return OkStatus();
    const auto deadline = Clock::now() + timeout;
    const gloo::Slot slot = gloo::Slot::build(kSlotPrefix, tag);
    auto send_buf = context_->createUnboundBuffer(const_cast<void*>(in), shard_bytes * size_);
    auto recv_buf = context_->createUnboundBuffer(recv, shard_bytes * size_);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      recv_buf->recv(j, slot, j * shard_bytes, shard_bytes);
      send_buf->send(j, slot, j * shard_bytes, shard_bytes);
    }
    SK_RETURN_IF_ERROR(WaitRecvs(*recv_buf, deadline));
    return WaitSends(*send_buf, deadline);
  }

  // Waits, until `deadline`, for the N-1 receives (sends) posted on `buf`,
  // noting which peer each came from, so that a timeout or a closed pair
  // names the ranks that did not arrive (did not take our data).
  Status WaitRecvs(gloo::transport::UnboundBuffer& buf, Clock::time_point deadline) {
    return WaitPeers(buf, deadline, /*recv=*/true);
  }
  Status WaitSends(gloo::transport::UnboundBuffer& buf, Clock::time_point deadline) {
    return WaitPeers(buf, deadline, /*recv=*/false);
  }
  Status WaitPeers(gloo::transport::UnboundBuffer& buf, Clock::time_point deadline, bool recv) {
    std::vector<bool> done(size_, false);
    done[rank_] = true;
    for (int k = 0; k < size_ - 1; ++k) {
      const auto left = std::max<Duration>(
          Duration(1), std::chrono::duration_cast<Duration>(deadline - Clock::now()));
      int peer = -1;
      std::string cause;
      bool aborted = false;
      {
        std::vector<int> waiting_for;
        for (int r = 0; r < size_; ++r) {
          if (!done[r]) waiting_for.push_back(WorldRank(r));
        }
        BeginWait(&buf, recv, std::move(waiting_for));
      }
      try {
        const bool completed = recv ? buf.waitRecv(&peer, left) : buf.waitSend(&peer, left);
        aborted = EndWait();
        if (completed) {
          if (peer >= 0 && peer < size_) done[peer] = true;
          continue;
        }
        cause = aborted ? std::string("a peer it waited for is gone or failed first; the wait was abandoned")
                        : std::string(recv ? "receive aborted" : "send aborted");
      } catch (const std::exception& e) {
        EndWait();
        cause = e.what();
      }
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (!done[r]) missing.push_back(r);
      }
      Status s = FromGlooException(std::runtime_error(cause), "gloo");
      // Name the peers at fault, not live ones held up by them elsewhere
      // (with 8 ranks and one stopped, most errors named healthy ranks too).
      if (std::optional<std::string> blame = StoppedAmong(missing, s.code() == StatusCode::kUnavailable)) {
        return Status(s.code(), *blame + " (" + cause + ")");
      }
      const std::string who = NamePeers(missing);
      const std::string what = recv ? who + " did not arrive"
                                    : "sending to " + who + " did not complete";
      return Status(s.code(), what + " (peer ranks of this group; " + cause + ")");
    }
    return OkStatus();
  }

  int WorldRank(int r) const {
    return global_ranks_.size() == static_cast<size_t>(size_) ? global_ranks_[r] : r;
  }

  // Gloo can lose the wake-up of a wait on a peer that is gone: a send it
  // wrote into a connection the peer had just reset (ECONNRESET, EPIPE)
  // stays queued without an error, and the pair's later failure does not
  // reach it (gloo/transport/tcp/pair.cc signals only old-style buffers in
  // its transmit queue), so the wait lasted until the timeout. A rank whose
  // peer failed first and closed its connections hit that too. So while a
  // collective waits on peers, WatchWaits looks at the ones it waits for
  // every 100 ms (their process or liveness link: no I/O but /proc and a
  // socket peek) and every 500 ms at whether they published a failure (the
  // store), and abandons the wait once one is gone or failed first; the
  // caller then names them as after any failure.
  void BeginWait(gloo::transport::UnboundBuffer* buf, bool recv, std::vector<int> world_peers) {
    std::lock_guard<std::mutex> lock(wait_mu_);
    wait_ = Wait{buf, recv, std::move(world_peers), Clock::now(), ++wait_id_, false};
  }
  // Ends the wait BeginWait registered; whether the watcher abandoned it.
  bool EndWait() {
    std::lock_guard<std::mutex> lock(wait_mu_);
    const bool aborted = wait_.has_value() && wait_->aborted;
    wait_.reset();
    return aborted;
  }
  void WatchWaits() {
    std::unique_lock<std::mutex> lock(wait_mu_);
    auto last_failure_check = Clock::now();
    while (!stop_watching_) {
      wait_cv_.wait_for(lock, Duration(100));
      if (stop_watching_) break;
      const auto now = Clock::now();
      if (!wait_.has_value() || wait_->aborted || now - wait_->since < Duration(100)) continue;
      const std::vector<int> peers = wait_->peers;
      const uint64_t id = wait_->id;
      const bool check_failures = now - last_failure_check >= Duration(500);
      if (check_failures) last_failure_check = now;
      lock.unlock();
      bool ended = false;
      for (int w : peers) {
        const Heartbeat::ProcessState state = heartbeat_->PeerProcess(w);
        ended = state == Heartbeat::ProcessState::kGone || state == Heartbeat::ProcessState::kLinkClosed ||
                (check_failures && heartbeat_->PeerFailed(w).has_value());
        if (ended) break;
      }
      lock.lock();
      if (!ended || !wait_.has_value() || wait_->id != id) continue;
      wait_->aborted = true;
      // Under wait_mu_: EndWait (before the buffer dies) waits for this.
      if (wait_->recv) {
        wait_->buf->abortWaitRecv();
      } else {
        wait_->buf->abortWaitSend();
      }
    }
  }

  // "rank 2", or "rank 1 (world rank 2)" in a sub-group.
  std::string NamePeers(const std::vector<int>& ranks) const {
    std::string who = NameRanks(ranks);
    if (global_ranks_.size() == static_cast<size_t>(size_)) {
      std::vector<int> global;
      for (int r : ranks) global.push_back(global_ranks_[r]);
      if (global != ranks) who += " (world " + NameRanks(global) + ")";
    }
    return who;
  }

  // Of `peers` (group ranks) that failed to take part, the ones that are
  // dead or stopped: "rank 5 did not arrive: it is dead or hung (its process
  // has exited); 2 other ranks, alive or failed first, had not arrived
  // either". A store that cannot be read (its server, rank 0's process, is
  // gone) names rank 0 when it is among them. Nothing when every one of them
  // is alive (then they are the ones to name) or this group has no
  // heartbeat. `connection_lost`: the collective failed because a
  // connection closed, not for time. Blocks for the heartbeat's silence
  // (1.6 s) only when neither their processes (this machine) nor their
  // liveness links (other machines) found one at fault and no peer has been
  // silent that long already.
  std::optional<std::string> StoppedAmong(const std::vector<int>& peers, bool connection_lost) {
    if (heartbeat_ == nullptr || peers.empty()) return std::nullopt;
    std::vector<int> world;
    for (int r : peers) world.push_back(global_ranks_.size() == static_cast<size_t>(size_) ? global_ranks_[r] : r);
    std::vector<int> stopped;
    std::string why;
    // Peers on this machine: their processes say at once whether they exited
    // or were killed, are stopped, or are alive (a rank that is alive but
    // never called, or is held up elsewhere, is named as not arriving; a
    // wait for its beat outlasted Work::wait's grace, so such timeouts named
    // no rank). Peers on other machines: a closed liveness link says at once
    // that the process exited or was killed; an open one says nothing (alive,
    // stopped or hung: the beats decide).
    // Peers that failed first (held up by another rank, or gone after
    // that) are not at fault: the ranks they blamed are.
    std::vector<int> failed_first;
    std::set<int> their_culprits;
    // A peer's published culprits: world ranks, comma-separated.
    auto take_culprits = [&their_culprits](const std::string& text) {
      std::stringstream list(text);
      for (std::string r; std::getline(list, r, ',');) {
        char* end = nullptr;
        const long v = std::strtol(r.c_str(), &end, 10);
        if (!r.empty() && *end == '\0' && v >= 0 && v <= INT32_MAX) their_culprits.insert(static_cast<int>(v));
      }
    };
    // Whether group rank `peer` published that it failed first (and whom it blamed).
    auto failed_before = [&](int peer) {
      std::optional<std::string> culprits = heartbeat_->PeerFailed(WorldRank(peer));
      if (!culprits.has_value()) return false;
      failed_first.push_back(peer);
      take_culprits(*culprits);
      return true;
    };
    std::vector<int> gone, closed, halted, alive, unknown;
    auto classify = [&](int peer) {
      switch (heartbeat_->PeerProcess(WorldRank(peer))) {
        case Heartbeat::ProcessState::kGone:
          gone.push_back(peer);
          break;
        case Heartbeat::ProcessState::kLinkClosed:
          closed.push_back(peer);
          break;
        case Heartbeat::ProcessState::kStopped:
          halted.push_back(peer);
          break;
        case Heartbeat::ProcessState::kRunning:
          alive.push_back(peer);
          break;
        case Heartbeat::ProcessState::kUnknown:
          unknown.push_back(peer);
          break;
      }
    };
    for (int peer : peers) {
      if (!failed_before(peer)) classify(peer);
    }
    if (connection_lost && !unknown.empty() && gone.empty() && closed.empty() && halted.empty()) {
      // A killed peer's kernel closes its gloo connections and its liveness
      // links at once, but this process may have read the one before the
      // other: wait for a link to close (briefly; at once if none is open).
      std::vector<int> unknown_world;
      for (int peer : unknown) unknown_world.push_back(WorldRank(peer));
      heartbeat_->AwaitPeerLinkClosed(unknown_world, heartbeat_->interval());
      std::vector<int> again;
      again.swap(unknown);
      // A live peer that gave up closed its gloo connections too; it has
      // published that it failed by now.
      for (int peer : again) {
        if (!failed_before(peer)) classify(peer);
      }
    }
    // A rank publishes its failure before it exits: one that published
    // between the PeerFailed read above and its process being found gone
    // failed first too (read again now that it is gone; under load ranks
    // held up in a sub-group were named beside the killed one).
    for (std::vector<int>* ended : {&gone, &closed}) {
      ended->erase(std::remove_if(ended->begin(), ended->end(), failed_before), ended->end());
    }
    if (unknown.empty() || !gone.empty() || !closed.empty() || !halted.empty()) {
      std::string blamed;
      for (const std::vector<int>* at_fault : {&gone, &closed, &halted}) {
        for (int r : *at_fault) blamed += (blamed.empty() ? "" : ",") + std::to_string(WorldRank(r));
      }
      heartbeat_->PublishFailure(blamed);
      if (gone.empty() && closed.empty() && halted.empty() && failed_first.empty()) return std::nullopt;
      if (gone.empty() && closed.empty() && halted.empty() && alive.empty()) {
        // Every peer missing here gave up first: name whom they blamed.
        std::string text = "the " + std::string(failed_first.size() == 1 ? "rank" : "ranks") +
                           " it waited for had failed first";
        if (!their_culprits.empty()) {
          text += ", naming world " + NameRanks(std::vector<int>(their_culprits.begin(), their_culprits.end())) +
                  " as dead or hung";
        }
        return text;
      }
      std::string text;
      auto name = [&](const std::vector<int>& ranks, const char* one, const char* many) {
        if (ranks.empty()) return;
        text += (text.empty() ? "" : "; ") + NamePeers(ranks) + " did not arrive: " +
                (ranks.size() == 1 ? "it is" : "they are") + " dead or hung (" + (ranks.size() == 1 ? one : many) + ")";
      };
      name(gone, "its process has exited", "their processes have exited");
      name(closed, "its process has exited: its connection to this rank closed",
           "their processes have exited: their connections to this rank closed");
      name(halted, "its process is stopped", "their processes are stopped");
      const size_t others = alive.size() + failed_first.size() + unknown.size();
      if (others > 0) {
        if (text.empty()) return std::nullopt;  // only live ranks are missing: the caller names them
        // Unknown ones (on other machines, links open) are not judged here.
        text += "; " + std::to_string(others) + " other " + (others == 1 ? "rank" : "ranks") +
                (unknown.empty() ? ", alive or failed first," : "") + " had not arrived either";
      }
      return text;
    }
    // Watched since the group formed: answered at once. Early on, or when
    // none is silent yet (a peer killed a moment ago closed its connections
    // before its beat could stand still), by reading the beats twice over
    // the silence.
    std::optional<StatusOr<std::vector<int>>> silent = heartbeat_->SilentPeers(world);
    const bool answered = silent.has_value() && (!silent->ok() || !(*silent)->empty());
    StatusOr<std::vector<int>> s = answered ? *silent : heartbeat_->StoppedPeers(world);
    if (s.ok()) {
      for (size_t i = 0; i < peers.size(); ++i) {
        if (std::find(s->begin(), s->end(), world[i]) != s->end()) stopped.push_back(peers[i]);
      }
      why = std::string(stopped.size() == 1 ? "it is" : "they are") + " dead or hung (no heartbeat for " +
            std::to_string(heartbeat_->silence().count()) + " ms)";
    } else {
      const auto zero = std::find(world.begin(), world.end(), 0);
      if (zero == world.end()) return std::nullopt;
      stopped.push_back(peers[zero - world.begin()]);
      why = std::string(s.status().message());
    }
    if (stopped.empty()) return std::nullopt;
    std::string text = NamePeers(stopped) + " did not arrive: " + why;
    const size_t others = peers.size() - stopped.size();
    if (others > 0) {
      text += "; " + std::to_string(others) + " other " + (others == 1 ? "rank, alive, had" : "ranks, alive, had") +
              " not arrived either";
    }
    return text;
  }

  // Reduces rank_'s shard: every rank's shard rank_ arrives in `recv`, then
  // the shards are summed in rank order (this rank's straight from `in`).
  Status ReduceScatterShard(const Collective& c, DType dtype, const void* in, void* recv, void* out,
                            size_t count, uint32_t tag) {
    const size_t shard_bytes = count * DTypeSize(dtype);
    SK_RETURN_IF_ERROR(ExchangeShards(in, recv, shard_bytes, tag, c.timeout));
    std::vector<const void*> srcs(size_);
    for (int j = 0; j < size_; ++j) {
      srcs[j] = j == rank_ ? static_cast<const char*>(in) + j * shard_bytes
                           : static_cast<const char*>(recv) + j * shard_bytes;
    }
    ReduceInRankOrder(srcs.data(), size_, dtype, count, c.pre_scale,
                      c.op == ReduceOp::kAvg ? static_cast<float>(size_) : 1.0f, c.post_scale,
                      out);
    return OkStatus();
  }

  // Scratch buffer `slot` of at least `bytes`, kept between collectives:
  // fresh 64 MiB buffers cost more in page faults than the reduction itself.
  // Collectives run one at a time (the sequence gate), so slots are not shared.
  StatusOr<std::shared_ptr<Storage>> Scratch(size_t slot, size_t bytes) {
    if (scratch_.size() <= slot) scratch_.resize(slot + 1);
    if (scratch_[slot] == nullptr || scratch_[slot]->nbytes() < bytes) {
      scratch_[slot] = nullptr;  // release before allocating the larger one
      SK_ASSIGN_OR_RETURN(scratch_[slot], HostAllocator::Default().AllocateBytes(bytes));
    }
    return scratch_[slot];
  }

  // Sets *peer_failed and returns a peer's published failure (Fail) when a
  // peer's fingerprint is its failure marker: this rank then fails `c` and
  // every later collective with it, until Resume.
  Status CheckDesync(const Collective& c, bool* peer_failed) {
    CallFingerprint mine = CallFingerprint::Of(c);
    std::vector<CallFingerprint> all(size_);
    SK_RETURN_IF_ERROR(AllGatherBytes(all.data(), &mine, sizeof(mine), FingerprintTag(c.seq), c.timeout)
                           .WithContext("exchanging call fingerprints"));
    for (int r = 0; r < size_; ++r) {
      if (all[r].kind != kFailureMarkerKind || all[r].seq != c.seq) continue;
      *peer_failed = true;
      Status culprit = PeerFailure(c.seq, r, all[r].entries, c.timeout);
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_.ok() || failed_at_ > c.seq) {
        failure_ = culprit;
        failed_at_ = c.seq;
        cv_.notify_all();
      }
      return culprit;
    }
    return CompareFingerprints(all, "gloo group of " + std::to_string(size_));
  }

  Status Execute(const Collective& c, bool* peer_failed) {
    // Always first: every rank learns every rank's kind, sequence number,
    // dtypes and sizes before any payload moves, so a mismatched call is an
    // InvalidArgument here instead of a message of the wrong size reaching
    // gloo's receive path, which enforces sizes with an exception on its own
    // I/O thread (std::terminate: the rank dies of SIGABRT). A peer that
    // failed its step answers with its failure instead (Fail).
    SK_RETURN_IF_ERROR(CheckDesync(c, peer_failed));
    for (size_t e = 0; e < c.outputs.size(); ++e) {
      const Tensor& in = c.inputs[e];
      const Tensor& out = c.outputs[e];
      // Empty tensors may have no memory at all: nothing to move. (Every
      // rank skips alike: sizes match, or desync detection reports them.)
      if (out.nbytes() == 0) continue;
      const DType dtype = out.dtype();
      const size_t esize = DTypeSize(dtype);
      const uint32_t tag = Tag(c, static_cast<uint32_t>(2 * (e % 30)));
      switch (c.kind) {
        case CollectiveKind::kAllGather:
          SK_RETURN_IF_ERROR(AllGatherBytes(out.data(), in.data(), in.nbytes(), tag, c.timeout));
          break;
        case CollectiveKind::kReduceScatter: {
          SK_ASSIGN_OR_RETURN(auto recv, Scratch(0, in.nbytes()));
          SK_RETURN_IF_ERROR(ReduceScatterShard(c, dtype, in.data(), recv->data(), out.data(),
                                                static_cast<size_t>(out.numel()), tag));
          break;
        }
        case CollectiveKind::kAllReduce: {
          const size_t n = static_cast<size_t>(out.numel());
          const size_t m = (n + size_ - 1) / size_;
          const size_t padded = m * size_ * esize;
          const bool even = n % size_ == 0;
          SK_ASSIGN_OR_RETURN(auto recv, Scratch(0, padded));
          std::shared_ptr<Storage> staging;
          void* buffer = out.data();
          if (!even) {
            SK_ASSIGN_OR_RETURN(staging, Scratch(1, padded));
            std::memcpy(staging->data(), out.data(), n * esize);
            std::memset(static_cast<char*>(staging->data()) + n * esize, 0, padded - n * esize);
            buffer = staging->data();
          }
          // This rank's shard is reduced in place (ReduceInRankOrder reads a
          // block before writing it; the exchange has sent the other shards
          // and never sends this one), so the all-gather sends it from where
          // it lies: no scratch copy of 1/N of the tensor, no memcpy of it.
          void* mine = static_cast<char*>(buffer) + static_cast<size_t>(rank_) * m * esize;
          SK_RETURN_IF_ERROR(ReduceScatterShard(c, dtype, buffer, recv->data(), mine, m, tag));
          SK_RETURN_IF_ERROR(AllGatherBytes(buffer, mine, m * esize, tag + 1, c.timeout));
          if (!even) std::memcpy(out.data(), buffer, n * esize);
          break;
        }
        case CollectiveKind::kBroadcast: {
          gloo::BroadcastOptions opts(context_);
          opts.setOutput(Bytes(out.data()), out.nbytes());
          opts.setRoot(c.root);
          opts.setTag(tag);
          opts.setTimeout(c.timeout);
          gloo::broadcast(opts);
          break;
        }
        case CollectiveKind::kBarrier:
          break;
      }
    }
    if (c.kind == CollectiveKind::kBarrier) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(Tag(c, 0));
      opts.setTimeout(c.timeout);
      gloo::barrier(opts);
    }
    return OkStatus();
  }

  const std::shared_ptr<gloo::rendezvous::Context> context_;
  const std::shared_ptr<FlightRecorder> recorder_;
  const int rank_;
  const int size_;
  // The world rank of each rank of this group (errors name both).
  const std::vector<int> global_ranks_;
  // The group's store, scoped to it: failure texts (Fail).
  const std::shared_ptr<Store> store_;
  // The world's, by world rank; null for a group without one.
  const std::shared_ptr<Heartbeat> heartbeat_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t executed_ = 0;  // sequence number allowed to run next
  uint64_t launched_ = 0;  // past the largest sequence number launched
  Status broken_;
  // A failed step (Fail, or a peer's marker): collectives from failed_at_
  // on fail with failure_ until Resume.
  Status failure_;
  uint64_t failed_at_ = UINT64_MAX;
  // Failure markers posted by Fail, with the memory their transfers use.
  struct Marker {
    std::vector<CallFingerprint> fingerprints;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };
  std::vector<std::unique_ptr<Marker>> markers_;
  std::vector<std::shared_ptr<Storage>> scratch_;  // used only by the running collective
  // The wait on peers in progress (BeginWait .. EndWait), for WatchWaits.
  struct Wait {
    gloo::transport::UnboundBuffer* buf;
    bool recv;
    std::vector<int> peers;  // world ranks not done yet
    Clock::time_point since;
    uint64_t id;
    bool aborted;  // abandoned by WatchWaits
  };
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  std::optional<Wait> wait_;  // under wait_mu_
  uint64_t wait_id_ = 0;  // under wait_mu_
  bool stop_watching_ = false;  // under wait_mu_
  std::thread watcher_;  // WatchWaits; none without a heartbeat
};

StatusOr<std::unique_ptr<GlooProcessGroup>> GlooProcessGroup::Create(std::shared_ptr<Store> store,
                                                                     std::string prefix, int rank,
                                                                     int size, GlooOptions options) {
  std::vector<int> identity;
  for (int r = 0; r < size; ++r) identity.push_back(r);
  return Make(std::move(store), std::move(prefix), rank, size, std::move(options), std::move(identity), nullptr);
}

StatusOr<std::unique_ptr<GlooProcessGroup>> GlooProcessGroup::Make(std::shared_ptr<Store> store,
                                                                   std::string prefix, int rank, int size,
                                                                   GlooOptions options,
                                                                   std::vector<int> global_ranks,
                                                                   std::shared_ptr<Heartbeat> heartbeat) {
  if (store == nullptr) return InvalidArgumentError("gloo group needs a store");
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("gloo group: rank " + std::to_string(rank) +
                                " is not in a group of size " + std::to_string(size));
  }
  if (options.timeout.count() <= 0) return InvalidArgumentError("gloo group: non-positive timeout");
  if (options.timeout > kMaxTimeout) {
    return InvalidArgumentError("gloo group: timeout " + std::to_string(options.timeout.count()) +
                                " ms exceeds the maximum of " + std::to_string(kMaxTimeout.count()) + " ms");
  }
  if (options.hostname.empty()) options.hostname = "127.0.0.1";
  auto scoped = std::make_shared<PrefixStore>(prefix + "/", store);
  SK_RETURN_IF_ERROR(AgreeOnGroupSize(*scoped, prefix, rank, size, options.timeout));
  // After the claim: a second process with this rank must not beat for it.
  // Its own connection where the store has one: a beat must not wait behind
  // this rank's long store waits (a rendezvous), or it would look stopped.
  if (heartbeat == nullptr) {
    std::shared_ptr<Store> beat_store = scoped->NewConnection(options.timeout);
    // Liveness links listen where gloo's pairs do: a peer that can reach
    // this rank's transport can reach its link.
    heartbeat = std::make_shared<Heartbeat>(beat_store != nullptr ? beat_store : scoped, "liveness", rank,
                                            Duration(500), options.hostname, options.machine);
  }
  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    ScopedSigpipeBlock no_sigpipe;  // gloo's I/O thread, created here, inherits it
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    GlooStoreAdapter adapter(*scoped, options.timeout);
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    return FromGlooException(e, "gloo rank " + std::to_string(rank) + " of " +
                                    std::to_string(size) + " forming group '" + prefix + "'");
  } catch (...) {
    return UnavailableError("gloo rank " + std::to_string(rank) + " of " + std::to_string(size) +
                            " forming group '" + prefix + "': gloo threw a non-standard exception");
  }
  auto recorder = std::make_shared<FlightRecorder>("gloo", prefix, rank, size);
  // After the rendezvous: every peer has published its link address.
  heartbeat->Watch(global_ranks, std::min(options.timeout, Duration(10'000)));
  auto state = std::make_shared<GlooState>(std::move(context), recorder, global_ranks, scoped, std::move(heartbeat));
  auto group = std::unique_ptr<GlooProcessGroup>(
      new GlooProcessGroup(rank, size, std::move(state), std::move(store), std::move(prefix),
                           std::move(options), std::move(global_ranks)));
  group->flight_recorder_ = std::move(recorder);
  return group;
}

StatusOr<std::unique_ptr<GlooProcessGroup>> GlooProcessGroup::CreateFromEnvironment(
    GlooOptions options) {
  SK_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnv::FromEnvironment());
  if (options.hostname.empty()) {
    const std::string& m = env.master_addr;
    if (m == "127.0.0.1" || m == "localhost" || m == "::1") {
      options.hostname = "127.0.0.1";
    } else {
      char name[256] = {};
      if (::gethostname(name, sizeof(name) - 1) != 0) {
        return UnavailableError("gloo: gethostname failed; set GlooOptions::hostname");
      }
      options.hostname = name;
    }
  }
  SK_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, ConnectWorldStore(env, options.timeout));
  return Create(std::move(store), "world", env.rank, env.world_size, options);
}

GlooProcessGroup::GlooProcessGroup(int rank, int size, std::shared_ptr<GlooState> state,
                                   std::shared_ptr<Store> store, std::string prefix,
                                   GlooOptions options, std::vector<int> global_ranks)
    : ProcessGroup(rank, size), state_(std::move(state)), store_(std::move(store)),
      prefix_(std::move(prefix)), options_(std::move(options)), global_ranks_(std::move(global_ranks)) {}

GlooProcessGroup::~GlooProcessGroup() { state_->Shutdown(options_.timeout); }

StatusOr<std::unique_ptr<ProcessGroup>> GlooProcessGroup::NewGroup(const std::vector<int>& ranks,
                                                                   Duration timeout) {
  SK_ASSIGN_OR_RETURN(SubGroupNames::Entry sub, sub_groups_.Next(ranks, size(), rank()));
  GlooOptions options = options_;
  options.timeout = timeout;
  SK_ASSIGN_OR_RETURN(std::unique_ptr<GlooProcessGroup> group,
                      Make(store_, sub.Prefix(prefix_), sub.sub_rank, static_cast<int>(ranks.size()),
                           options, SubGroupNames::GlobalRanks(ranks, global_ranks_), state_->heartbeat()));
  return std::unique_ptr<ProcessGroup>(std::move(group));
}

StatusOr<std::shared_ptr<Work>> GlooProcessGroup::Launch(Collective c, Stream& stream) {
  if (!KindCapabilities(stream.device().kind).host_memory) {
    return Invalid("the gloo backend moves host memory: it runs on streams of a device whose memory is "
                   "the host's (cpu), not " + stream.device().ToString());
  }
  std::string description = "gloo rank " + std::to_string(rank()) + ": " + c.Describe();
  const int rank = this->rank();
  const int64_t track = stream.id();
  const uint64_t seq = c.seq;
  SK_ASSIGN_OR_RETURN(
      std::shared_ptr<Work> work,
      EnqueueOnStream(std::move(description), stream,
                      [state = state_, c = std::move(c), rank, track]() -> Status {
                        TraceSpan span(CollectiveName(c.kind), "comm", rank, track);
                        return state->Run(c);
                      }));
  state_->NoteLaunched(seq);
  return work;
}

Status GlooProcessGroup::FailPeers(const Status& culprit) { return state_->Fail(ReserveSequence(), culprit); }

void GlooProcessGroup::OnResume(uint64_t next_seq) { state_->Resume(next_seq); }

bool GlooProcessGroup::usable() const { return state_->usable(); }

}  // namespace sk::comm
