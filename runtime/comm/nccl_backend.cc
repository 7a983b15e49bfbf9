#include "runtime/comm/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <thread>

#include <cuda_runtime.h>
#include <nccl.h>

#include "runtime/comm/flight_recorder.h"
#include "runtime/comm/gloo_backend.h"  // DistributedEnv
#include "runtime/comm/heartbeat.h"
#include "runtime/core/env.h"
#include "runtime/core/dtype.h"

namespace sk::comm {

namespace {

using Clock = std::chrono::steady_clock;

Status NcclError(ncclResult_t r, const std::string& what) {
  std::string msg = what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return InvalidArgumentError(msg);
  return UnavailableError(msg);
}

#define SK_NCCL_RETURN(expr, what)                      \
  do {                                                  \
    ncclResult_t sk_nccl_r_ = (expr);                   \
    if (sk_nccl_r_ != ncclSuccess && sk_nccl_r_ != ncclInProgress) { \
      return NcclError(sk_nccl_r_, what);               \
    }                                                   \
  } while (0)

#define SK_CUDA_RETURN_COMM(expr, what)                                              \
  do {                                                                               \
    cudaError_t sk_cuda_e_ = (expr);                                                 \
    if (sk_cuda_e_ != cudaSuccess) {                                                 \
      return UnavailableError(std::string(what) + ": " + cudaGetErrorString(sk_cuda_e_)); \
    }                                                                                \
  } while (0)

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  return ncclFloat32;  // validated by ProcessGroup before we get here
}

}  // namespace

// One non-blocking communicator and the scratch a barrier reduces. Every
// use of the communicator holds mu_, so the watchdog's abort (another
// thread) never races a call on it; after the abort every use fails.
class NcclComm {
 public:
  static StatusOr<std::unique_ptr<NcclComm>> Init(const ncclUniqueId& id, int rank, int size,
                                                  int device, Duration timeout) {
    SK_CUDA_RETURN_COMM(cudaSetDevice(device), "cudaSetDevice");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    SK_NCCL_RETURN(ncclCommInitRankConfig(&comm, size, id, rank, &config), "ncclCommInitRankConfig");
    std::unique_ptr<NcclComm> c(new NcclComm(comm, device));
    SK_RETURN_IF_ERROR(c->WaitReady(timeout, "communicator creation"));
    SK_CUDA_RETURN_COMM(cudaMalloc(&c->barrier_scratch_, sizeof(float)), "cudaMalloc");
    return c;
  }

  // A communicator that was never shut down (failed creation) is aborted.
  ~NcclComm() {
    if (!closed_) Abort(UnavailableError("communicator destroyed"));
    if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
  }

  int device() const { return device_; }
  float* barrier_scratch() const { return static_cast<float*>(barrier_scratch_); }

  // Runs fn(comm) under the lock; the abort's reason if aborted.
  Status Use(const std::function<Status(ncclComm_t)>& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return abort_reason_;
    return fn(comm_);
  }

  // Polls a non-blocking communicator until its last call is no longer in
  // progress; aborts it on timeout so nothing is left half-done.
  Status WaitReady(Duration timeout, const std::string& what) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      Status polled = Use([&](ncclComm_t comm) -> Status {
        SK_NCCL_RETURN(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
        return OkStatus();
      });
      SK_RETURN_IF_ERROR(polled);
      if (state == ncclSuccess) return OkStatus();
      if (state != ncclInProgress) return NcclError(state, what);
      if (Clock::now() >= deadline) {
        Status s = DeadlineExceededError("nccl " + what + " did not finish within " +
                                         std::to_string(timeout.count()) + " ms; communicator aborted");
        Abort(s);
        return s;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // The asynchronous error state (ncclSuccess, ncclInProgress or an error).
  ncclResult_t AsyncState() {
    ncclResult_t state = ncclSuccess;
    Status s = Use([&](ncclComm_t comm) -> Status {
      SK_NCCL_RETURN(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
      return OkStatus();
    });
    return s.ok() ? state : ncclInternalError;
  }

  // Aborts once; `reason` is what every later use returns.
  void Abort(const Status& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ != nullptr && !aborted_) {
      cudaSetDevice(device_);
      ncclCommAbort(comm_);
      aborted_ = true;
      abort_reason_ = reason.ok() ? UnavailableError("nccl communicator was aborted") : reason;
    }
  }
  bool aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  Status abort_reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return abort_reason_;
  }

  // Finalize (flushes outstanding work), then destroy; abort if it hangs.
  void Shutdown(Duration timeout) {
    closed_ = true;
    cudaSetDevice(device_);
    if (aborted()) return;  // ncclCommAbort already released it
    Status fin = Use([&](ncclComm_t comm) -> Status {
      SK_NCCL_RETURN(ncclCommFinalize(comm), "ncclCommFinalize");
      return OkStatus();
    });
    if (fin.ok() && WaitReady(timeout, "finalize").ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ncclCommDestroy(comm_);
      aborted_ = true;  // released: no later use
      abort_reason_ = UnavailableError("nccl communicator was destroyed");
    } else {
      Abort(UnavailableError("nccl communicator finalize failed"));
    }
  }

 private:
  NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {}

  ncclComm_t comm_;
  const int device_;
  void* barrier_scratch_ = nullptr;
  mutable std::mutex mu_;
  bool aborted_ = false;
  Status abort_reason_;
  bool closed_ = false;
};

// The group's watchdog thread: heartbeats in the store, and the enqueued
// collectives' completion, timeouts and asynchronous NCCL errors (the
// header says what it does about them).
class NcclWatchdog {
 public:
  static constexpr int kHeartbeatMs = 500;

  NcclWatchdog(NcclComm* comm, std::shared_ptr<Store> store, std::string prefix, int rank,
               std::vector<int> global_ranks, FlightRecorder* recorder, std::string who)
      : comm_(comm), store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank),
        global_ranks_(std::move(global_ranks)), recorder_(recorder), who_(std::move(who)),
        heartbeat_(store_, prefix_, rank_, std::chrono::milliseconds(kHeartbeatMs)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~NcclWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Track(uint64_t seq, std::shared_ptr<Work> work, Duration timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({seq, std::move(work), Clock::now() + timeout, timeout});
  }

  // The sticky error once the watchdog has failed the group; OK before.
  Status error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  // Ranks (world numbering) whose heartbeat stood still (heartbeat.h), or
  // a sentence about the store when it cannot be read. Blocks ~1.6 s.
  std::string StoppedRanks() {
    std::vector<int> peers;
    for (int r = 0; r < static_cast<int>(global_ranks_.size()); ++r) {
      if (r != rank_) peers.push_back(r);
    }
    StatusOr<std::vector<int>> stopped = heartbeat_.StoppedPeers(peers);
    if (!stopped.ok()) return std::string(stopped.status().message());
    if (stopped->empty()) return "";
    std::vector<int> global;
    for (int r : *stopped) global.push_back(global_ranks_[r]);
    return NameRanks(global) + (global.size() == 1 ? " is" : " are") + " dead or hung (no heartbeat for " +
           std::to_string(heartbeat_.silence().count()) + " ms)";
  }

  // For a caller waiting on peer `r` (Heartbeat::PeerStopped).
  StatusOr<bool> PeerStopped(int r) { return heartbeat_.PeerStopped(r); }

 private:
  struct Pending {
    uint64_t seq;
    std::shared_ptr<Work> work;
    Clock::time_point deadline;
    Duration timeout;
  };

  // One failure record per world (sub-groups share their world's prefix).
  std::string FailureKey() const { return prefix_.substr(0, prefix_.find("/sub[")) + "/failure"; }

  // The culprit sentence some rank published, or "" (none yet, or the store
  // cannot be read: then this rank's own checks decide).
  std::string PublishedFailure() {
    // Adding 0 reads the claim counter without waiting (a Get of an absent
    // key would hold the store connection for its whole timeout).
    StatusOr<int64_t> claims = store_->Add(FailureKey() + "_claims", 0);
    if (!claims.ok() || *claims == 0) return "";
    StatusOr<std::string> got = store_->Get(FailureKey(), Duration(2000));
    return got.ok() ? *got : "";
  }
  void Publish(const std::string& culprits) {
    StatusOr<int64_t> claim = store_->Add(FailureKey() + "_claims", 1);
    if (claim.ok() && *claim == 1) store_->Set(FailureKey(), culprits).IgnoreError();
  }

  void Run() {
    auto next_beat = Clock::now() + std::chrono::milliseconds(kHeartbeatMs);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 50 : 1));
      if (stop_) break;
      std::string published;  // a failure another rank found (see PublishedFailure)
      if (Clock::now() >= next_beat) {
        lock.unlock();
        published = PublishedFailure();
        lock.lock();
        next_beat = Clock::now() + std::chrono::milliseconds(kHeartbeatMs);
      }
      if (!error_.ok()) continue;
      // Completed collectives leave in order (one communicator: NCCL runs
      // them in issue order).
      while (!pending_.empty() && pending_.front().work->is_completed()) {
        if (recorder_ != nullptr) recorder_->Ended(pending_.front().seq, OkStatus());
        pending_.pop_front();
      }
      Status failure;
      if (!published.empty()) {
        // Another rank of this world found a dead peer: fail at once with
        // its finding instead of waiting for the NCCL error to cascade here
        // (by then the failed ranks may have exited, and their silence
        // would be blamed on them).
        failure = UnavailableError(
            who_ + ": " + (pending_.empty() ? std::string("the group") : pending_.front().work->description()) +
            " cannot complete: " + published);
      } else if (!pending_.empty()) {
        const ncclResult_t state = comm_->AsyncState();
        if (state != ncclSuccess && state != ncclInProgress) {
          failure = UnavailableError(who_ + ": " + pending_.front().work->description() +
                                     " failed: " + ncclGetErrorString(state) +
                                     " (a peer died or its connection broke)");
        } else if (Clock::now() >= pending_.front().deadline) {
          failure = DeadlineExceededError(who_ + ": " + pending_.front().work->description() +
                                          " did not complete within " +
                                          std::to_string(pending_.front().timeout.count()) + " ms");
        }
      }
      if (failure.ok()) continue;
      lock.unlock();
      if (published.empty()) {
        // The first rank to find the culprits publishes them; later ones
        // (the NCCL error reaches ranks one after another) take its finding.
        std::string culprits = PublishedFailure();
        if (culprits.empty()) {
          culprits = StoppedRanks();
          if (!culprits.empty()) {
            culprits += " (found by rank " + std::to_string(global_ranks_[rank_]) + ")";
            Publish(culprits);
          }
        }
        if (!culprits.empty()) failure = Status(failure.code(), std::string(failure.message()) + ": " + culprits);
      }
      failure = Status(failure.code(), std::string(failure.message()) + "; communicator aborted");
      lock.lock();
      error_ = failure;
      for (Pending& p : pending_) {
        p.work->SetStatus(failure);
        if (recorder_ != nullptr) recorder_->Ended(p.seq, failure);
      }
      pending_.clear();
      lock.unlock();
      if (recorder_ != nullptr) recorder_->DumpOnError(failure);
      comm_->Abort(failure);  // kernels stop; the streams drain
      lock.lock();
    }
  }

  NcclComm* comm_;
  std::shared_ptr<Store> store_;
  const std::string prefix_;
  const int rank_;
  const std::vector<int> global_ranks_;
  FlightRecorder* recorder_;
  const std::string who_;
  // Beats on a thread of its own: this watchdog's thread sleeps while it
  // checks its peers, and must not look dead to them meanwhile.
  Heartbeat heartbeat_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Pending> pending_;
  Status error_;
  std::thread thread_;
};

StatusOr<int> DefaultCudaDeviceFromEnvironment() {
  if (const char* v = GetEnv(EnvVar::kCudaDevice); v != nullptr) {
    char* end = nullptr;
    long d = std::strtol(v, &end, 10);
    if (*end != '\0' || d < 0 || d > 1 << 16) {
      return InvalidArgumentError(std::string(EnvName(EnvVar::kCudaDevice)) + "='" + v + "' is not a device index");
    }
    return static_cast<int>(d);
  }
  // The local rank as the launcher says it (LOCAL_RANK, OMPI's, Slurm's).
  SK_ASSIGN_OR_RETURN(auto local, LocalRankHint());
  if (local.first > 1 << 16) {
    return InvalidArgumentError(std::string(local.second) + "=" + std::to_string(local.first) + " is not a device index");
  }
  return std::max(0, local.first);
}

StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::Create(std::shared_ptr<Store> store,
                                                                     std::string prefix, int rank,
                                                                     int size, int device_index,
                                                                     NcclOptions options) {
  std::vector<int> global(size > 0 ? size : 0);
  for (int r = 0; r < size; ++r) global[r] = r;
  return Make(std::move(store), std::move(prefix), rank, size, device_index, options, std::move(global));
}

StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::Make(std::shared_ptr<Store> store,
                                                                   std::string prefix, int rank,
                                                                   int size, int device_index,
                                                                   NcclOptions options,
                                                                   std::vector<int> global_ranks) {
  if (store == nullptr) return InvalidArgumentError("nccl group needs a store");
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("nccl group: rank " + std::to_string(rank) +
                                " is not in a group of size " + std::to_string(size));
  }
  if (options.timeout.count() <= 0 || options.timeout > kMaxTimeout) {
    return InvalidArgumentError("nccl group: timeout " + std::to_string(options.timeout.count()) +
                                " ms is not in [1, " + std::to_string(kMaxTimeout.count()) + "]");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || device_index < 0 || device_index >= devices) {
    return UnavailableError("nccl group: cuda:" + std::to_string(device_index) +
                            " is not a usable GPU (" + std::to_string(devices) + " found)");
  }
  const std::string key = prefix + "/nccl_unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    SK_NCCL_RETURN(ncclGetUniqueId(&id), "ncclGetUniqueId");
    SK_RETURN_IF_ERROR(store->Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    StatusOr<std::string> got = store->Get(key, options.timeout);
    if (!got.ok()) {
      return got.status().WithContext("nccl group rank " + std::to_string(global_ranks[rank]) +
                                      ": waiting for rank " + std::to_string(global_ranks[0]) +
                                      "'s communicator id");
    }
    const std::string bytes = *got;
    if (bytes.size() != sizeof(id)) return InternalError("nccl group: malformed unique id in store");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> comm,
                      NcclComm::Init(id, rank, size, device_index, options.timeout));
  return std::unique_ptr<NcclProcessGroup>(new NcclProcessGroup(rank, size, device_index, std::move(comm),
                                                                std::move(store), std::move(prefix),
                                                                options, std::move(global_ranks)));
}

StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::CreateFromEnvironment(
    NcclOptions options, int device_index) {
  SK_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnv::FromEnvironment());
  if (device_index < 0) {
    SK_ASSIGN_OR_RETURN(device_index, DefaultCudaDeviceFromEnvironment());
  }
  SK_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, ConnectWorldStore(env, options.timeout));
  return Create(std::move(store), "nccl_world", env.rank, env.world_size, device_index, options);
}

NcclProcessGroup::NcclProcessGroup(int rank, int size, int device_index,
                                   std::unique_ptr<NcclComm> comm, std::shared_ptr<Store> store,
                                   std::string prefix, NcclOptions options,
                                   std::vector<int> global_ranks)
    : ProcessGroup(rank, size), device_index_(device_index), comm_(std::move(comm)),
      global_ranks_(std::move(global_ranks)), store_(std::move(store)), prefix_(std::move(prefix)),
      options_(options) {
  flight_recorder_ = std::make_shared<FlightRecorder>("nccl", prefix_, global_ranks_[rank], size);
  watchdog_ = std::make_unique<NcclWatchdog>(
      comm_.get(), store_, prefix_, rank, global_ranks_, flight_recorder_.get(),
      "nccl group " + prefix_ + " rank " + std::to_string(global_ranks_[rank]));
}

NcclProcessGroup::~NcclProcessGroup() {
  watchdog_.reset();
  comm_->Shutdown(options_.timeout);
}

std::string NcclProcessGroup::GlobalRank(int r) const { return "rank " + std::to_string(global_ranks_[r]); }

Status NcclProcessGroup::CheckAsyncError() const {
  SK_RETURN_IF_ERROR(watchdog_->error());
  if (comm_->aborted()) return comm_->abort_reason();
  const ncclResult_t state = comm_->AsyncState();
  if (state != ncclSuccess && state != ncclInProgress) return NcclError(state, "nccl async error");
  return OkStatus();
}

void NcclProcessGroup::Abort() { comm_->Abort(UnavailableError("nccl communicator aborted by the caller")); }

StatusOr<std::unique_ptr<ProcessGroup>> NcclProcessGroup::NewGroup(const std::vector<int>& ranks,
                                                                   Duration timeout) {
  SK_ASSIGN_OR_RETURN(SubGroupNames::Entry sub, sub_groups_.Next(ranks, size(), rank()));
  NcclOptions options = options_;
  options.timeout = timeout;
  SK_ASSIGN_OR_RETURN(std::unique_ptr<NcclProcessGroup> group,
                      Make(store_, sub.Prefix(prefix_), sub.sub_rank, static_cast<int>(ranks.size()),
                           device_index_, options, SubGroupNames::GlobalRanks(ranks, global_ranks_)));
  return std::unique_ptr<ProcessGroup>(std::move(group));
}

namespace {

std::string EncodeCall(const CallFingerprint& fp) {
  return std::string(reinterpret_cast<const char*>(&fp), sizeof(fp));
}

// CallFingerprint::kind of a failure marker (FailPeers), as gloo's: no
// CollectiveKind, and never one.
constexpr uint8_t kFailureMarkerKind = 0xfe;

std::string FailureKey(const std::string& prefix, uint64_t seq, int rank) {
  return prefix + "/failure/" + std::to_string(seq) + "/" + std::to_string(rank);
}

}  // namespace

Status NcclProcessGroup::FailPeers(const Status& culprit) {
  if (!publishes_failures()) return OkStatus();
  const uint64_t seq = ReserveSequence();
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (!failure_.ok() && failed_at_ <= seq) return failure_;
    failure_ = culprit;
    failed_at_ = seq;
  }
  Status stored = store_->Set(FailureKey(prefix_, seq, rank()),
                              std::to_string(static_cast<int>(culprit.code())) + "\n" + std::string(culprit.message()));
  CallFingerprint marker;
  marker.seq = seq;
  marker.kind = kFailureMarkerKind;
  marker.entries = static_cast<int32_t>(culprit.code());
  if (stored.ok()) {
    stored = store_->Set(prefix_ + "/call/" + std::to_string(seq % 2) + "/" + std::to_string(rank()), EncodeCall(marker));
  }
  // A store that cannot be written: the peers fail at their timeout instead.
  if (!stored.ok()) LOG(WARNING) << "nccl group " << prefix_ << " rank " << rank() << ": publishing a failure: " << stored;
  return OkStatus();
}

void NcclProcessGroup::OnResume(uint64_t next_seq) {
  std::lock_guard<std::mutex> lock(failure_mu_);
  failure_ = OkStatus();
  failed_at_ = UINT64_MAX;
}

bool NcclProcessGroup::usable() const { return watchdog_->error().ok(); }

Status NcclProcessGroup::CheckCall(const Collective& c) {
  const CallFingerprint mine = CallFingerprint::Of(c);
  const std::string slot = "/call/" + std::to_string(c.seq % 2) + "/";
  SK_RETURN_IF_ERROR(store_->Set(prefix_ + slot + std::to_string(rank()), EncodeCall(mine))
                         .WithContext("publishing " + c.Describe()));
  std::vector<CallFingerprint> all(size());
  all[rank()] = mine;
  const auto start = Clock::now();
  const auto deadline = start + c.timeout;
  std::vector<int> missing;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    auto pause = std::chrono::microseconds(20);
    auto next_liveness_check = start + std::chrono::seconds(2);
    for (;;) {
      const auto now = Clock::now();
      if (now >= deadline) {
        missing.push_back(global_ranks_[r]);
        break;
      }
      // A collective that already failed (the watchdog aborted the group)
      // answers at once; so does a peer whose heartbeat stopped.
      SK_RETURN_IF_ERROR(watchdog_->error());
      if (now >= next_liveness_check) {
        next_liveness_check = now + std::chrono::milliseconds(NcclWatchdog::kHeartbeatMs);
        StatusOr<bool> stopped = watchdog_->PeerStopped(r);
        if (!stopped.ok()) {
          return UnavailableError("nccl group " + prefix_ + ": " + c.Describe() + " on " + GlobalRank(rank()) +
                                  ": " + std::string(stopped.status().message()));
        }
        if (*stopped) {
          return UnavailableError("nccl group " + prefix_ + ": " + c.Describe() + " on " + GlobalRank(rank()) +
                                  ": " + GlobalRank(r) + " did not arrive: it is dead or hung (no heartbeat for " +
                                  std::to_string(3 * NcclWatchdog::kHeartbeatMs) + " ms)");
        }
      }
      const Duration left = std::chrono::duration_cast<Duration>(deadline - now);
      StatusOr<std::string> got = store_->Get(prefix_ + slot + std::to_string(r), std::min(left, Duration(200)));
      if (got.ok() && got->size() == sizeof(CallFingerprint)) {
        CallFingerprint theirs;
        std::memcpy(&theirs, got->data(), sizeof(theirs));
        if (theirs.seq == c.seq) {
          all[r] = theirs;
          break;
        }
        if (theirs.seq > c.seq) {
          return InternalError(GlobalRank(r) + " published call #" + std::to_string(theirs.seq) +
                               " while " + GlobalRank(rank()) + " checks #" + std::to_string(c.seq));
        }
      } else if (!got.ok() && got.status().code() != StatusCode::kDeadlineExceeded) {
        return got.status().WithContext("reading " + GlobalRank(r) + "'s call for " + c.Describe() +
                                        " from the store (served by rank 0)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
  if (!missing.empty()) {
    return DeadlineExceededError("nccl group " + prefix_ + ": " + c.Describe() + " on " + GlobalRank(rank()) +
                                 ": " + NameRanks(missing) + " did not arrive within " +
                                 std::to_string(c.timeout.count()) + " ms");
  }
  for (int r = 0; r < size(); ++r) {
    if (all[r].kind != kFailureMarkerKind || all[r].seq != c.seq) continue;
    // A peer failed its step here (FailPeers): so does this rank, with its error.
    const int32_t code = all[r].entries;
    const StatusCode fallback = code > 0 && code <= static_cast<int32_t>(StatusCode::kDataLoss)
                                    ? static_cast<StatusCode>(code)
                                    : StatusCode::kUnknown;
    StatusOr<std::string> text = store_->Get(FailureKey(prefix_, c.seq, r), std::min(c.timeout, Duration(10'000)));
    Status culprit = text.ok() ? Status(fallback, text->find('\n') == std::string::npos
                                                      ? *text
                                                      : text->substr(text->find('\n') + 1))
                               : Status(fallback, GlobalRank(r) + " failed (" + StatusCodeName(fallback) +
                                                      "); its message could not be read: " + text.status().ToString());
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.ok() || failed_at_ > c.seq) {
      failure_ = culprit;
      failed_at_ = c.seq;
    }
    return culprit;
  }
  return CompareFingerprints(all, "nccl group " + prefix_ + " of " + std::to_string(size()));
}

StatusOr<std::shared_ptr<Work>> NcclProcessGroup::Launch(Collective c, Stream& stream) {
  if (stream.device() != DeviceId::Cuda(device_index_)) {
    return Invalid("the nccl group of cuda:" + std::to_string(device_index_) +
                   " cannot run on stream '" + stream.name() + "' of " + stream.device().ToString());
  }
  SK_RETURN_IF_ERROR(CheckAsyncError());
  {
    // Part of a failed step: skipped by every rank alike, nothing enqueued.
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (!failure_.ok() && c.seq >= failed_at_) return failure_;
  }
  if (options_.check_calls && size() > 1) SK_RETURN_IF_ERROR(CheckCall(c));
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  SK_CUDA_RETURN_COMM(cudaSetDevice(device_index_), "cudaSetDevice");
  const uint64_t seq = c.seq;
  const Duration timeout = c.timeout;
  // Enqueued under the communicator's lock (the watchdog may abort it).
  Status enqueued = comm_->Use([&](ncclComm_t comm) -> Status {

  // One pre-multiplied sum per dtype folds pre_scale, post_scale and AVG.
  std::vector<ncclRedOp_t> custom_ops;
  auto reduce_op = [&](DType dtype, ncclRedOp_t* op) -> Status {
    const float factor = c.pre_scale * c.post_scale;
    if (factor == 1.0f) {
      *op = c.op == ReduceOp::kAvg ? ncclAvg : ncclSum;
      return OkStatus();
    }
    float scalar = c.op == ReduceOp::kAvg ? factor / static_cast<float>(size()) : factor;
    uint16_t half_bits = dtype == DType::kBF16 ? FloatToBF16(scalar).bits : FloatToF16(scalar).bits;
    void* p = dtype == DType::kF32 ? static_cast<void*>(&scalar) : static_cast<void*>(&half_bits);
    SK_NCCL_RETURN(ncclRedOpCreatePreMulSum(op, p, NcclType(dtype), ncclScalarHostImmediate, comm),
                   "ncclRedOpCreatePreMulSum");
    custom_ops.push_back(*op);
    return OkStatus();
  };

  Status launched;
  SK_NCCL_RETURN(ncclGroupStart(), "ncclGroupStart");
  for (size_t e = 0; e < c.outputs.size() && launched.ok(); ++e) {
    const Tensor& in = c.inputs[e];
    const Tensor& out = c.outputs[e];
    const ncclDataType_t type = NcclType(out.dtype());
    ncclResult_t r = ncclSuccess;
    ncclRedOp_t op = ncclSum;
    switch (c.kind) {
      case CollectiveKind::kAllGather:
        r = ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), type, comm, s);
        break;
      case CollectiveKind::kReduceScatter:
        launched = reduce_op(out.dtype(), &op);
        if (launched.ok()) {
          r = ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(out.numel()), type, op,
                                comm, s);
        }
        break;
      case CollectiveKind::kAllReduce:
        launched = reduce_op(out.dtype(), &op);
        if (launched.ok()) {
          r = ncclAllReduce(out.data(), out.data(), static_cast<size_t>(out.numel()), type, op,
                            comm, s);
        }
        break;
      case CollectiveKind::kBroadcast:
        r = ncclBroadcast(out.data(), out.data(), static_cast<size_t>(out.numel()), type, c.root,
                          comm, s);
        break;
      case CollectiveKind::kBarrier:
        break;
    }
    if (r != ncclSuccess && r != ncclInProgress) launched = NcclError(r, c.Describe());
  }
  if (c.kind == CollectiveKind::kBarrier) {
    ncclResult_t r = ncclAllReduce(comm_->barrier_scratch(), comm_->barrier_scratch(), 1,
                                   ncclFloat32, ncclSum, comm, s);
    if (r != ncclSuccess && r != ncclInProgress) launched = NcclError(r, c.Describe());
  }
  ncclResult_t end = ncclGroupEnd();
  if (launched.ok() && end != ncclSuccess && end != ncclInProgress) {
    launched = NcclError(end, "ncclGroupEnd for " + c.Describe());
  }
  for (ncclRedOp_t op : custom_ops) ncclRedOpDestroy(op, comm);
  return launched;
  });
  if (enqueued.ok()) enqueued = comm_->WaitReady(options_.timeout, "enqueue of " + c.Describe());
  SK_RETURN_IF_ERROR(enqueued);

  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(stream.device()));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device->CreateEvent());
  auto work = std::make_shared<Work>("nccl " + GlobalRank(rank()) + ": " + c.Describe(),
                                     std::move(event));
  SK_RETURN_IF_ERROR(work->mutable_event().Record(stream));
  if (flight_recorder_ != nullptr) flight_recorder_->Started(seq);
  watchdog_->Track(seq, work, timeout);
  return work;
}

}  // namespace sk::comm
