// PinnedHostAllocator: page-locked host memory as an sk::Allocator.
//
// Copies between pinned host memory and a GPU run asynchronously in stream
// order (Device::CopyAsync, cudaMemcpyAsync), where copies from pageable
// memory would be staged and synchronous. FSDP's CPU offload on a GPU keeps
// master shards, gradient shards and optimizer state here (FsdpOptions's
// offload allocator). Each allocation is one cudaHostAlloc, freed when its
// Storage dies: offloaded state is allocated once, so there is no cache.
// Tensors from it live on cpu:0 (host memory, readable by CPU code).
//
// Thread safety: may be called from any thread.
#ifndef SHARDKIT_RUNTIME_MEMORY_PINNED_HOST_ALLOCATOR_H_
#define SHARDKIT_RUNTIME_MEMORY_PINNED_HOST_ALLOCATOR_H_

#include <memory>

#include "runtime/core/allocator.h"
#include "runtime/device/device.h"

namespace sk {

class PinnedHostAllocator final : public Allocator {
 public:
  DeviceId device() const override { return DeviceId::Cpu(0); }
  // Unavailable without CUDA or a usable GPU (Device::AllocatePinnedHost);
  // ResourceExhausted when the driver refuses, naming the size.
  StatusOr<std::shared_ptr<Storage>> AllocateBytes(size_t nbytes) override {
    SK_ASSIGN_OR_RETURN(void* p, Device::AllocatePinnedHost(nbytes));
    return std::make_shared<Storage>(p, nbytes, DeviceId::Cpu(0), nullptr, p, &Release);
  }

 private:
  static void Release(void*, void* handle) noexcept { Device::FreePinnedHost(handle); }
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_MEMORY_PINNED_HOST_ALLOCATOR_H_
