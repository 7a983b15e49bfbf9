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
// MAX and MIN, and every reduction of f64, i32 and i64 buffers, are an
// all-gather of the buffer's bytes followed by the reduction on this rank in
// rank order (the backends reduce only f32/bf16/f16, and only by sum), so
// they move world_size times the buffer and give every rank the same bits:
// meant for metrics, counts and flags, not for gradients. Integer sums wrap
// (two's complement), as NCCL's do.
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
enum class CallerReduceOp : int { kSum = 1, kMean = 2, kMax = 3, kMin = 4 };

// The element types of caller buffers. Values are the C ABI's sk_dtype_t
// (never renumbered); f64, i32 and i64 exist only here (no model tensor
// holds them).
enum class CallerDType : int { kF32 = 1, kBF16 = 2, kF16 = 3, kF64 = 4, kI32 = 5, kI64 = 6 };
// "f32", "bf16", "f16", "f64", "i32", "i64"; "invalid" otherwise.
const char* CallerDTypeName(CallerDType t);

class CallerCollectives {
 public:
  // Over `group` (which must outlive this), each wait bounded by `timeout`.
  // Creates a stream on the group's device (its bound device, else cpu:rank).
  static StatusOr<std::unique_ptr<CallerCollectives>> Create(ProcessGroup* group, Duration timeout);

  // In place over `count` elements of `dtype`. InvalidArgument for a null
  // buffer with count > 0, a negative count, an unknown op or dtype, MEAN of
  // an integer buffer, or a buffer on the wrong device.
  Status AllReduce(void* data, int64_t count, CallerDType dtype, CallerReduceOp op);
  // In place: every rank's buffer becomes rank `root`'s. OutOfRange for a
  // root outside [0, size). Ranks that pass different dtypes get
  // InvalidArgument naming both (every rank), the buffers unchanged.
  Status Broadcast(void* data, int64_t count, CallerDType dtype, int root);
  // output[r * count .. (r + 1) * count) = rank r's input; `output` holds
  // size() * count elements and must not overlap `input`. Different dtypes
  // on different ranks: as Broadcast.
  Status AllGather(const void* input, void* output, int64_t count, CallerDType dtype);
  Status Barrier();

  Duration timeout() const { return timeout_; }

 private:
  CallerCollectives(ProcessGroup* group, Device* device, std::unique_ptr<Stream> stream, Duration timeout)
      : group_(group), device_(device), stream_(std::move(stream)), timeout_(timeout) {}
  // A tensor over the caller's buffer, after checking pointer, count, dtype
  // and device. f32, bf16 and f16 buffers keep their dtype; f64, i32 and
  // i64 travel as f32 words (moved, never added, by the backends).
  StatusOr<Tensor> Wrap(const void* data, int64_t count, CallerDType dtype, const char* what) const;
  // The all-gather-and-reduce path (MAX, MIN; f64 and integer buffers).
  Status GatherAndReduce(void* data, const Tensor& t, int64_t count, CallerDType dtype, CallerReduceOp op);
  Status Wait(StatusOr<std::shared_ptr<Work>> work, const std::string& what);
  // For the calls that move bytes (broadcast, all_gather) of a dtype that
  // travels as f32 words: gathers every rank's dtype and fails on every
  // rank, naming the first that differs from rank 0, when they differ.
  Status AgreeOnDType(const char* call, CallerDType dtype);

  ProcessGroup* group_;
  Device* device_;
  std::unique_ptr<Stream> stream_;
  Duration timeout_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_CALLER_COLLECTIVES_H_
