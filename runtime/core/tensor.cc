#include "runtime/core/tensor.h"

namespace sk {

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, size_t byte_offset)
    : storage_(std::move(storage)), dtype_(dtype), shape_(std::move(shape)),
      byte_offset_(byte_offset) {
  CHECK(storage_ != nullptr);
  CHECK(DTypeSize(dtype_) > 0) << "invalid dtype";
  CHECK_LE(byte_offset_ + nbytes(), storage_->nbytes())
      << "tensor view " << ToString() << " at offset " << byte_offset_
      << " exceeds its storage of " << storage_->nbytes() << " bytes";
}

StatusOr<Tensor> Tensor::Wrap(void* data, DType dtype, Shape shape, DeviceId device) {
  SK_RETURN_IF_ERROR(ValidateTensorDType(dtype));
  size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  if (data == nullptr && bytes > 0) {
    return InvalidArgumentError("null data pointer for a tensor of shape " + shape.ToString());
  }
  return Tensor(Storage::Wrap(data, bytes, device), dtype, std::move(shape));
}

DeviceId Tensor::device() const { return storage_ ? storage_->device() : DeviceId::Cpu(); }

void* Tensor::data() const {
  if (!storage_ || storage_->data() == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) + byte_offset_;
}

StatusOr<Tensor> Tensor::View(size_t byte_offset, DType dtype, Shape shape) const {
  if (!defined()) return FailedPreconditionError("View of an undefined tensor");
  SK_RETURN_IF_ERROR(ValidateTensorDType(dtype));
  size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  if (byte_offset > nbytes() || bytes > nbytes() - byte_offset) {
    return InvalidArgumentError("view of " + std::to_string(bytes) + " bytes at offset " +
                                std::to_string(byte_offset) + " does not fit in " + ToString());
  }
  return Tensor(storage_, dtype, std::move(shape), byte_offset_ + byte_offset);
}

StatusOr<Tensor> Tensor::Reshape(Shape shape) const {
  if (shape.numel() != numel()) {
    return InvalidArgumentError("cannot reshape " + ToString() + " to " + shape.ToString() +
                                ": element counts differ");
  }
  return View(0, dtype_, std::move(shape));
}

std::string Tensor::ToString() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor(" + std::string(DTypeName(dtype_)) + shape_.ToString() + " on " +
         device().ToString() + ")";
}

}  // namespace sk
