#include "runtime/core/shape.h"

#include <limits>

namespace sk {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  for (int64_t d : dims_) CHECK_GE(d, 0) << "negative dimension in " << ToString();
}

StatusOr<Shape> Shape::Make(std::vector<int64_t> dims) {
  int64_t n = 1;
  bool zero = false;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return InvalidArgumentError("dimension " + std::to_string(i) + " is negative (" +
                                  std::to_string(dims[i]) + ")");
    }
    if (dims[i] == 0) zero = true;
    if (!zero && dims[i] > 0 && n > std::numeric_limits<int64_t>::max() / dims[i]) {
      return InvalidArgumentError("shape's element count overflows int64");
    }
    if (!zero) n *= dims[i];
  }
  return Shape(std::move(dims));
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::vector<int64_t> Shape::ContiguousStrides() const {
  std::vector<int64_t> strides(dims_.size());
  int64_t s = 1;
  for (size_t i = dims_.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims_[i];
  }
  return strides;
}

std::string Shape::ToString() const {
  std::string out = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(dims_[i]);
  }
  return out + "]";
}

}  // namespace sk
