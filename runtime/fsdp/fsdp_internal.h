// Helpers shared by the files of FullyShardedModel (fsdp.cc,
// fsdp_gather_reduce.cc, fsdp_collectives.cc, fsdp_load.cc); private to
// //runtime/fsdp:fsdp.
#ifndef SHARDKIT_RUNTIME_FSDP_FSDP_INTERNAL_H_
#define SHARDKIT_RUNTIME_FSDP_FSDP_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/backend.h"

namespace sk::fsdp_internal {

inline int64_t Bytes(const Tensor& t) { return static_cast<int64_t>(t.nbytes()); }

// Issues `op` with ctx on ctx.stream, from the thread that drives the model.
// CPU ops run on the thread that plays their stream, so on cpu the op runs
// in a closure on the stream's worker, in order with the collectives there;
// other kinds (cuda enqueues, sim prices) take it from this thread directly.
// The closure keeps what `op` captured alive until it has run.
inline Status OnStream(const ops::OpContext& ctx, std::function<Status(const ops::OpContext&)> op) {
  if (ctx.device->capabilities().ops_run_when_issued) {
    return ctx.stream->Enqueue([ctx, op = std::move(op)]() { return op(ctx); });
  }
  return op(ctx);
}

// The elements [offset, offset + n) of a 1-D tensor of `t`'s dtype.
inline StatusOr<Tensor> Slice(const Tensor& t, int64_t offset, int64_t n) {
  return t.View(static_cast<size_t>(offset) * DTypeSize(t.dtype()), t.dtype(), Shape{n});
}

}  // namespace sk::fsdp_internal

#endif  // SHARDKIT_RUNTIME_FSDP_FSDP_INTERNAL_H_
