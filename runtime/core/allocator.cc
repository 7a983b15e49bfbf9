#include "runtime/core/allocator.h"

#include <cstdlib>
#include <cstring>

namespace sk {

StatusOr<Tensor> Allocator::Empty(DType dtype, Shape shape) {
  SK_RETURN_IF_ERROR(ValidateTensorDType(dtype));
  size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  SK_ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage, AllocateBytes(bytes));
  return Tensor(std::move(storage), dtype, std::move(shape));
}

StatusOr<Tensor> Allocator::Zeros(DType dtype, Shape shape) {
  if (!KindCapabilities(device().kind).host_memory) {
    return InvalidArgumentError("Zeros is for host memory only, not " + device().ToString() + "'s");
  }
  SK_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, std::move(shape)));
  if (t.nbytes() > 0) std::memset(t.data(), 0, t.nbytes());
  return t;
}

namespace {
void FreeHost(void* /*owner*/, void* handle) noexcept { std::free(handle); }
}  // namespace

StatusOr<std::shared_ptr<Storage>> HostAllocator::AllocateBytes(size_t nbytes) {
  if (nbytes == 0) return std::make_shared<Storage>(nullptr, 0, device_, nullptr, nullptr, nullptr);
  size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* p = std::aligned_alloc(kHostAlignment, rounded);
  if (p == nullptr) {
    return ResourceExhaustedError("host allocation of " + std::to_string(nbytes) + " bytes failed");
  }
  return std::make_shared<Storage>(p, nbytes, device_, this, p, &FreeHost);
}

HostAllocator& HostAllocator::Default() {
  static HostAllocator* a = new HostAllocator();
  return *a;
}

}  // namespace sk
