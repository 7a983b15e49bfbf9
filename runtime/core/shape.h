// Shape: the dimensions of a dense, row-major tensor.
#ifndef SHARDKIT_RUNTIME_CORE_SHAPE_H_
#define SHARDKIT_RUNTIME_CORE_SHAPE_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/core/status.h"

namespace sk {

class Shape {
 public:
  // A scalar (rank 0, one element).
  Shape() = default;
  // CHECKs that no dimension is negative: for shapes built by shardkit itself.
  // Anything that comes from a caller goes through Shape::Make.
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  // InvalidArgument if a dimension is negative or the element count overflows int64.
  static StatusOr<Shape> Make(std::vector<int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_.at(static_cast<size_t>(i)); }
  const std::vector<int64_t>& dims() const { return dims_; }
  // Product of the dimensions (1 for a scalar, 0 if any dimension is 0).
  int64_t numel() const;
  // Row-major (C-contiguous) strides in elements.
  std::vector<int64_t> ContiguousStrides() const;
  // "[2, 3, 4]".
  std::string ToString() const;

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::vector<int64_t> dims_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_SHAPE_H_
