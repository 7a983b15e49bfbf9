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
// and AVG's 1/N are folded into one ncclRedOpCreatePreMulSum factor; there is
// no desync check; a collective has no timeout of its own inside NCCL: a Work
// that misses its wait() deadline can be cancelled with Abort(), which also
// makes every later call fail.
//
// Thread safety: as ProcessGroup. Communicators are non-blocking
// (ncclConfig_t.blocking = 0), so creation and teardown are bounded by the
// options' timeout.
#ifndef SHARDKIT_RUNTIME_COMM_NCCL_BACKEND_H_
#define SHARDKIT_RUNTIME_COMM_NCCL_BACKEND_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/comm/store.h"

namespace sk::comm {

struct NcclOptions {
  // Bounds communicator creation, each enqueue, and teardown.
  Duration timeout = kDefaultTimeout;
};

class NcclComm;

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Rank `rank` of `size` on cuda:`device_index`, rendezvous through `store`
  // under `prefix`. Unavailable without a usable GPU or NCCL.
  static StatusOr<std::unique_ptr<NcclProcessGroup>> Create(std::shared_ptr<Store> store,
                                                          std::string prefix, int rank, int size,
                                                          int device_index, NcclOptions options = {});
  // The world group from torchrun's variables; the device is cuda:LOCAL_RANK.
  static StatusOr<std::unique_ptr<NcclProcessGroup>> CreateFromEnvironment(NcclOptions options = {});
  ~NcclProcessGroup() override;

  std::string backend_name() const override { return "nccl"; }
  StatusOr<std::unique_ptr<ProcessGroup>> NewGroup(const std::vector<int>& ranks,
                                                   Duration timeout = kDefaultTimeout) override;

  // An error NCCL has recorded asynchronously (a peer that died, a network
  // failure), as Unavailable; OK otherwise.
  Status CheckAsyncError() const;
  // Aborts the communicator: in-flight collectives stop, later ones fail.
  void Abort();

 protected:
  StatusOr<std::shared_ptr<Work>> Launch(Collective c, Stream& stream) override;

 private:
  NcclProcessGroup(int rank, int size, int device_index, std::unique_ptr<NcclComm> comm,
                   std::shared_ptr<Store> store, std::string prefix, NcclOptions options);

  const int device_index_;
  std::unique_ptr<NcclComm> comm_;
  std::shared_ptr<Store> store_;
  const std::string prefix_;
  const NcclOptions options_;
  std::mutex new_group_mu_;
  std::map<std::string, int> new_group_counts_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_NCCL_BACKEND_H_
