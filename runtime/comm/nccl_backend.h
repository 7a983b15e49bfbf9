// The `nccl` backend: NCCL communicators on CUDA devices, bootstrapped
// through the same Store as gloo (rank 0 publishes the ncclUniqueId).
// Built only under --config=cuda (SHARDKIT_WITH_CUDA); the development
// machines have no GPU, so it is compile-checked there and run where one is.
//
// Collectives are enqueued on the caller's CUDA stream (its native
// cudaStream_t) and the Work's event is a cudaEvent recorded right after, so
// compute streams order themselves with WaitEvent as on CPU. Differences from
// the CPU backends, all NCCL's: reductions use NCCL's own order and
// arithmetic (bf16/f16 are not widened to f32 by us); pre_scale, post_scale
// and AVG's 1/N are folded into one ncclRedOpCreatePreMulSum factor.
//
// Failure semantics (the gloo backend's, on GPUs):
//   - Call check: before a collective is enqueued, every rank publishes its
//     CallFingerprint (kind, sequence number, dtypes, sizes, root) in the
//     store and reads its peers' (two slots per rank, so a rank at most one
//     call ahead never overwrites what a peer still has to read). A
//     disagreement is InvalidArgument on every rank naming both ranks' calls
//     (nothing was enqueued; the group stays usable); a peer that does not
//     publish within the collective's timeout is DeadlineExceeded naming it.
//     NcclOptions::check_calls = false skips the exchange (its cost, a store
//     round trip per peer and call, is measured in docs/multi_gpu.md).
//   - Watchdog: one thread per group polls the enqueued collectives' events
//     and ncclCommGetAsyncError. A collective that outlives its timeout, or
//     an asynchronous NCCL error (a peer that died mid-collective: its
//     sockets close), aborts the communicator (ncclCommAbort: kernels stop,
//     streams drain) after setting every pending Work's status, so waiting
//     hosts and streams return; every later call fails with the same error.
//     The error names the ranks that stopped: each rank beats in the store
//     from a thread of its own (heartbeat.h), and the ranks whose heartbeat
//     stood still (or the store's server, rank 0, when it is unreachable)
//     are named dead or hung. The first rank to name them publishes that in
//     the store, and the other ranks' watchdogs, which look for it every
//     beat, fail at once with the same finding.
//   - Flight recorder entries as on gloo (enqueued, started = enqueued on
//     the GPU, ended), dumped on the first failure when
//     SK_FLIGHT_RECORDER_DIR is set.
//
// Host tensors on the group's CUDA stream are staged through device memory
// by ProcessGroup (process_group.h), for checkpoints and rank agreement.
//
// Thread safety: as ProcessGroup. Communicators are non-blocking
// (ncclConfig_t.blocking = 0), so creation and teardown are bounded by the
// options' timeout.
#ifndef SHARDKIT_RUNTIME_COMM_NCCL_BACKEND_H_
#define SHARDKIT_RUNTIME_COMM_NCCL_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/comm/store.h"

namespace sk::comm {

struct NcclOptions {
  // Bounds communicator creation, each enqueue, the call check, and teardown.
  Duration timeout = kDefaultTimeout;
  // Compare every collective's fingerprint across ranks before enqueueing it.
  bool check_calls = true;
};

// The GPU a process-group rank uses when the caller does not say: the
// environment's SK_CUDA_DEVICE (set by the launcher's --gpus mapping),
// else LOCAL_RANK, else 0. InvalidArgument naming a malformed variable.
StatusOr<int> DefaultCudaDeviceFromEnvironment();

class NcclComm;
class NcclWatchdog;

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Rank `rank` of `size` on cuda:`device_index`, rendezvous through `store`
  // under `prefix`. Unavailable without a usable GPU or NCCL.
  static StatusOr<std::unique_ptr<NcclProcessGroup>> Create(std::shared_ptr<Store> store,
                                                          std::string prefix, int rank, int size,
                                                          int device_index, NcclOptions options = {});
  // The world group from torchrun's variables; device_index < 0: the
  // device DefaultCudaDeviceFromEnvironment() names (cuda:LOCAL_RANK).
  static StatusOr<std::unique_ptr<NcclProcessGroup>> CreateFromEnvironment(NcclOptions options = {},
                                                                         int device_index = -1);
  ~NcclProcessGroup() override;

  std::string backend_name() const override { return "nccl"; }
  int device_index() const { return device_index_; }
  std::optional<DeviceId> bound_device() const override { return DeviceId::Cuda(device_index_); }
  StatusOr<std::unique_ptr<ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                   Duration timeout = kDefaultTimeout) override;

  // An error NCCL has recorded asynchronously (a peer that died, a network
  // failure), as Unavailable; OK otherwise.
  Status CheckAsyncError() const;
  // Aborts the communicator: in-flight collectives stop, later ones fail.
  void Abort();

  // Failing one step (ProcessGroup::FailPeers), through the call check:
  // the failing rank publishes, as its call for a sequence number of its
  // own, a failure marker (the culprit's text beside it in the store).
  // Every peer's call check for that collective reads the marker and fails
  // it, and every later collective, at once with the culprit, before
  // anything is enqueued; no rank enqueues a collective the others skip, so
  // the communicator stays in step, and ResumeAt lets collectives run again.
  // Only with check_calls (publishes_failures() is false without it).
  Status FailPeers(const Status& culprit) override;
  bool publishes_failures() const override { return options_.check_calls && size() > 1; }
  // False once the watchdog has failed the group (an aborted communicator).
  bool usable() const override;

 protected:
  StatusOr<std::shared_ptr<Work>> Launch(Collective c, Stream& stream) override;
  void OnResume(uint64_t next_seq) override;

 private:
  NcclProcessGroup(int rank, int size, int device_index, std::unique_ptr<NcclComm> comm,
                   std::shared_ptr<Store> store, std::string prefix, NcclOptions options,
                   std::vector<int> global_ranks);
  static StatusOr<std::unique_ptr<NcclProcessGroup>> Make(std::shared_ptr<Store> store,
                                                          std::string prefix, int rank, int size,
                                                          int device_index, NcclOptions options,
                                                          std::vector<int> global_ranks);
  // The store exchange of CallFingerprint described above.
  Status CheckCall(const Collective& c);
  // "rank 2" in world numbering.
  std::string GlobalRank(int r) const;

  const int device_index_;
  std::unique_ptr<NcclComm> comm_;
  const std::vector<int> global_ranks_;
  std::unique_ptr<NcclWatchdog> watchdog_;
  std::shared_ptr<Store> store_;
  const std::string prefix_;
  const NcclOptions options_;
  SubGroupNames sub_groups_;  // NewGroup's names
  // A failed step (FailPeers, or a peer's marker): collectives from
  // failed_at_ on fail with failure_ until ResumeAt.
  mutable std::mutex failure_mu_;
  Status failure_;
  uint64_t failed_at_ = UINT64_MAX;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_NCCL_BACKEND_H_
