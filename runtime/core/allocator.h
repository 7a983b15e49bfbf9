// Allocator: the interface through which layers above memory/ obtain tensors.
//
// The CachingAllocator (runtime/memory) implements it bound to a stream, so
// that model activations, gathered parameters and gradients all count in the
// same statistics and under the same capacity cap. HostAllocator is a plain
// 64-byte-aligned malloc for code that needs no caching (tests, tools).
//
// Thread safety: implementations are safe to call from several threads.
#ifndef SHARDKIT_RUNTIME_CORE_ALLOCATOR_H_
#define SHARDKIT_RUNTIME_CORE_ALLOCATOR_H_

#include <cstddef>
#include <memory>

#include "runtime/core/device_kind.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"

namespace sk {

// Host memory is aligned to this many bytes (a cache line; AVX-512 loads).
inline constexpr size_t kHostAlignment = 64;

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DeviceId device() const = 0;
  // Storage of at least `nbytes` bytes (contents unspecified). nbytes == 0
  // gives a valid storage with no memory. ResourceExhausted when the memory
  // (or the configured cap) is exhausted; the allocator stays usable.
  virtual StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) = 0;

  // A tensor of `dtype` and `shape` in new (uninitialised) storage.
  StatusOr<Tensor> Empty(DType dtype, Shape shape);
  // Like Empty, then filled with zero bytes. Host devices only.
  StatusOr<Tensor> Zeros(DType dtype, Shape shape);
};

// 64-byte-aligned host memory straight from the C library, no caching.
class HostAllocator final : public Allocator {
 public:
  explicit HostAllocator(DeviceId device = DeviceId::Cpu()) : device_(device) {}
  DeviceId device() const override { return device_; }
  StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) override;

  // The process-wide instance for cpu:0.
  static HostAllocator& Default();

 private:
  DeviceId device_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_ALLOCATOR_H_
