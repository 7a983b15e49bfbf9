// Storage and Tensor: device memory and typed, shaped views of it.
//
// A Storage is one block of memory on one device, released when the last
// Tensor that views it goes away. Memory normally comes from the device's
// CachingAllocator (runtime/memory), which hands out Storages whose release
// returns the block to its pool; Storage::Wrap gives a non-owning Storage over
// memory the caller owns (the C ABI's caller-provided buffers).
//
// A Tensor is (storage, byte offset, dtype, shape), dense and row-major. Copies
// of a Tensor share the storage. Tensors are not synchronised: the stream
// discipline of runtime/device says when their contents may be read.
#ifndef SHARDKIT_RUNTIME_CORE_TENSOR_H_
#define SHARDKIT_RUNTIME_CORE_TENSOR_H_

#include <cstddef>
#include <memory>
#include <string>

#include "runtime/core/device_kind.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/status.h"

namespace sk {

class Storage {
 public:
  // Called once when the Storage dies, with the owner and handle given at
  // construction. Must not throw.
  using ReleaseFn = void (*)(void* owner, void* handle) noexcept;

  Storage(void* data, size_t nbytes, DeviceId device, void* owner, void* handle,
          ReleaseFn release)
      : data_(data), nbytes_(nbytes), device_(device), owner_(owner), handle_(handle),
        release_(release) {}
  ~Storage() {
    if (release_ != nullptr) release_(owner_, handle_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // A Storage over memory the caller owns and keeps alive longer than every
  // Tensor that views it. Nothing is freed when it dies.
  static std::shared_ptr<Storage> Wrap(void* data, size_t nbytes, DeviceId device) {
    return std::make_shared<Storage>(data, nbytes, device, nullptr, nullptr, nullptr);
  }

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  DeviceId device() const { return device_; }
  // The allocator that produced this storage (nullptr for wrapped memory) and
  // its private handle for the block; the allocator uses them in record_stream.
  void* owner() const { return owner_; }
  void* handle() const { return handle_; }

 private:
  void* data_;
  size_t nbytes_;
  DeviceId device_;
  void* owner_;
  void* handle_;
  ReleaseFn release_;
};

class Tensor {
 public:
  // An undefined tensor (no storage).
  Tensor() = default;
  // CHECKs that the view fits in the storage: for shardkit's own construction.
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, size_t byte_offset = 0);

  // A tensor over caller-owned memory. InvalidArgument if data is null while
  // the shape has elements, or the dtype is invalid.
  static StatusOr<Tensor> Wrap(void* data, DType dtype, Shape shape,
                               DeviceId device = DeviceId::Cpu());

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  DeviceId device() const;
  size_t byte_offset() const { return byte_offset_; }

  void* data() const;
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // A tensor sharing this storage, starting `byte_offset` bytes into this
  // tensor's data, with the given dtype and shape. InvalidArgument if it does
  // not fit inside this tensor's bytes.
  StatusOr<Tensor> View(size_t byte_offset, DType dtype, Shape shape) const;
  // The same bytes with a different shape of equal element count.
  StatusOr<Tensor> Reshape(Shape shape) const;

  // "Tensor(f32[2, 3] on cpu:0)".
  std::string ToString() const;

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::kInvalid;
  Shape shape_;
  size_t byte_offset_ = 0;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_TENSOR_H_
