#include "runtime/core/shape.h"

#include <algorithm>
#include <limits>

namespace sk {

namespace {

template <typename It>
void CheckDims(It begin, It end) {
  for (It it = begin; it != end; ++it) {
    if (*it < 0) {
      std::string dims = "[";
      for (It j = begin; j != end; ++j) dims += (j == begin ? "" : ", ") + std::to_string(*j);
      CHECK_GE(*it, 0) << "negative dimension in " << dims << "]";
    }
  }
}

}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims) : rank_(static_cast<int>(dims.size())) {
  CheckDims(dims.begin(), dims.end());
  if (rank_ <= kInlineRank) {
    std::copy(dims.begin(), dims.end(), inline_.begin());
  } else {
    heap_.assign(dims.begin(), dims.end());
  }
  for (int64_t d : dims) numel_ *= d;
}

Shape::Shape(std::vector<int64_t> dims) : rank_(static_cast<int>(dims.size())) {
  CheckDims(dims.begin(), dims.end());
  for (int64_t d : dims) numel_ *= d;
  if (rank_ <= kInlineRank) {
    std::copy(dims.begin(), dims.end(), inline_.begin());
  } else {
    heap_ = std::move(dims);
  }
}

int64_t Shape::dim(int i) const {
  CHECK(i >= 0 && i < rank_) << "dimension " << i << " of a rank-" << rank_ << " shape";
  return dims()[static_cast<size_t>(i)];
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

std::vector<int64_t> Shape::ContiguousStrides() const {
  std::span<const int64_t> d = dims();
  std::vector<int64_t> strides(d.size());
  int64_t s = 1;
  for (size_t i = d.size(); i-- > 0;) {
    strides[i] = s;
    s *= d[i];
  }
  return strides;
}

std::string Shape::ToString() const {
  std::string out = "[";
  std::span<const int64_t> d = dims();
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(d[i]);
  }
  return out + "]";
}

}  // namespace sk
