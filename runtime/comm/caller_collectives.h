// Collectives on a caller's own buffers (the C ABI's sk_process_group_*
// collectives): a loss averaged over ranks, a flag broadcast from rank 0, a
// barrier before a file is read. The same ProcessGroup collectives FSDP
// uses, so each call is compared across ranks before it runs (a rank that
// calls another collective, count or dtype fails every rank with both calls
// named) and every wait is bounded by the timeout.
//
// Buffers: host memory on CPU groups (local, gloo); device memory of the
// group's GPU on groups bound to one (nccl). A buffer of the other kind is
// InvalidArgument naming it (where CUDA can tell: Device::PointerDevice).
//
// Every call is collective and returns when the result is in the buffer.
// MAX is an all-gather followed by an elementwise max on this rank (the
// backends reduce only by sum), so it moves world_size times the buffer: meant
// for metrics and flags, not for gradients.
//
// Thread safety: one thread at a time per CallerCollectives (as its group).
#ifndef SHARDKIT_RUNTIME_COMM_CALLER_COLLECTIVES_H_
#define SHARDKIT_RUNTIME_COMM_CALLER_COLLECTIVES_H_

#include <cstdint>
#include <memory>

#include "runtime/comm/process_group.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace sk::comm {

// Values are part of the C ABI (sk_reduce_op_t): never renumbered.
enum class CallerReduceOp : int { kSum = 1, kMean = 2, kMax = 3 };

class CallerCollectives {
 public:
  // Over `group` (which must outlive this), each wait bounded by `timeout`.
  // Creates a stream on the group's device (its bound device, else cpu:rank).
  static StatusOr<std::unique_ptr<CallerCollectives>> Create(ProcessGroup* group, Duration timeout);

  // In place over `count` elements of `dtype` (f32, bf16, f16).
  // InvalidArgument for a null buffer with count > 0, a negative count, an
  // unknown op or dtype, or a buffer on the wrong device.
  Status AllReduce(void* data, int64_t count, DType dtype, CallerReduceOp op);
  // In place: every rank's buffer becomes rank `root`'s. OutOfRange for a
  // root outside [0, size).
  Status Broadcast(void* data, int64_t count, DType dtype, int root);
  // output[r * count .. (r + 1) * count) = rank r's input; `output` holds
  // size() * count elements and must not overlap `input`.
  Status AllGather(const void* input, void* output, int64_t count, DType dtype);
  Status Barrier();

  Duration timeout() const { return timeout_; }

 private:
  CallerCollectives(ProcessGroup* group, Device* device, std::unique_ptr<Stream> stream, Duration timeout)
      : group_(group), device_(device), stream_(std::move(stream)), timeout_(timeout) {}
  // A tensor over the caller's buffer, after checking pointer, count, dtype
  // and device.
  StatusOr<Tensor> Wrap(const void* data, int64_t count, DType dtype, const char* what) const;
  Status Wait(StatusOr<std::shared_ptr<Work>> work, const std::string& what);

  ProcessGroup* group_;
  Device* device_;
  std::unique_ptr<Stream> stream_;
  Duration timeout_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_CALLER_COLLECTIVES_H_
