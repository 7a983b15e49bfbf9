// Shape: the dimensions of a dense, row-major tensor.
//
// Shapes are made for every tensor view of every op, so a shape of rank up
// to kInlineRank keeps its dimensions inline (no allocation to make, copy or
// destroy one) and caches its element count; larger ranks (only from files a
// caller passes) go to the heap. dims() views the dimensions; the view lives
// as long as the Shape and moves with it.
#ifndef SHARDKIT_RUNTIME_CORE_SHAPE_H_
#define SHARDKIT_RUNTIME_CORE_SHAPE_H_

#include <cstdint>
#include <array>
#include <initializer_list>
#include <span>
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

  Shape(const Shape&) = default;
  Shape& operator=(const Shape&) = default;
  // A moved-from shape is a scalar (as a moved-from std::vector is empty).
  Shape(Shape&& o) noexcept
      : rank_(o.rank_), numel_(o.numel_), inline_(o.inline_), heap_(std::move(o.heap_)) {
    o.rank_ = 0;
    o.numel_ = 1;
  }
  Shape& operator=(Shape&& o) noexcept {
    if (&o == this) return *this;
    rank_ = o.rank_;
    numel_ = o.numel_;
    inline_ = o.inline_;
    heap_ = std::move(o.heap_);
    o.rank_ = 0;
    o.numel_ = 1;
    return *this;
  }

  // InvalidArgument if a dimension is negative or the element count overflows int64.
  static StatusOr<Shape> Make(std::vector<int64_t> dims);

  int rank() const { return rank_; }
  // CHECKs 0 <= i < rank().
  int64_t dim(int i) const;
  std::span<const int64_t> dims() const {
    return {rank_ <= kInlineRank ? inline_.data() : heap_.data(), static_cast<size_t>(rank_)};
  }
  std::vector<int64_t> ToVector() const { return {dims().begin(), dims().end()}; }
  // Product of the dimensions (1 for a scalar, 0 if any dimension is 0).
  int64_t numel() const { return numel_; }
  // Row-major (C-contiguous) strides in elements.
  std::vector<int64_t> ContiguousStrides() const;
  // "[2, 3, 4]".
  std::string ToString() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    std::span<const int64_t> x = a.dims(), y = b.dims();
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] != y[i]) return false;
    }
    return true;
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

  static constexpr int kInlineRank = 6;

 private:
  int rank_ = 0;
  int64_t numel_ = 1;
  std::array<int64_t, kInlineRank> inline_{};
  std::vector<int64_t> heap_;  // the dimensions when rank_ > kInlineRank, else empty
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_SHAPE_H_
