#include "runtime/fsdp/flat_param.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <unordered_set>

namespace sk {

namespace {
int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

StatusOr<FlatParamLayout> FlatParamLayout::Make(std::vector<std::pair<std::string, Shape>> params,
                                                int group_size) {
  if (group_size < 1) {
    return InvalidArgumentError("shard group size must be >= 1, got " + std::to_string(group_size));
  }
  FlatParamLayout layout;
  layout.group_size_ = group_size;
  // Views of `params`' own names (alive until we return), hashed: every
  // planner candidate lays out each of its units, and a set of copied names
  // was 2% of a GPT-175B plan.
  std::unordered_set<std::string_view> names;
  names.reserve(params.size());
  layout.params_.reserve(params.size());
  int64_t offset = 0;
  constexpr int64_t kLimit = std::numeric_limits<int64_t>::max() / 4;
  for (auto& [name, shape] : params) {
    if (name.empty()) return InvalidArgumentError("parameter with an empty name");
    if (!names.insert(std::string_view(name)).second) return InvalidArgumentError("parameter '" + name + "' appears twice");
    int64_t n = shape.numel();
    offset = RoundUp(offset, kFlatAlignElems);
    if (n > kLimit - offset) return InvalidArgumentError("flat parameter size overflows");
    layout.params_.push_back(Param{name, shape, offset, n});
    offset += n;
    layout.unpadded_numel_ += n;
  }
  int64_t chunk = static_cast<int64_t>(group_size) * kFlatAlignElems;
  int64_t padded = RoundUp(std::max<int64_t>(offset, 0), chunk);
  if (padded == 0) padded = chunk;  // an empty unit still has a (padding) shard
  layout.shard_numel_ = padded / group_size;
  return layout;
}

std::vector<FlatParamLayout::ShardSlice> FlatParamLayout::ShardSlices(int rank) const {
  CHECK(rank >= 0 && rank < group_size_) << "rank " << rank << " outside group of " << group_size_;
  int64_t begin = static_cast<int64_t>(rank) * shard_numel_;
  int64_t end = begin + shard_numel_;
  std::vector<ShardSlice> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    int64_t lo = std::max(begin, p.offset);
    int64_t hi = std::min(end, p.offset + p.numel);
    if (lo < hi) {
      out.push_back(ShardSlice{static_cast<int>(i), lo - p.offset, hi - p.offset, lo - begin});
    }
  }
  return out;
}

StatusOr<int> FlatParamLayout::Find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return NotFoundError("no parameter named '" + name + "'");
}

}  // namespace sk
