// FlatParamLayout: where each parameter of a unit lives in its flat parameter,
// and which part of it each rank's shard holds.
//
//   flat:   | p0 ........ |pad| p1 .... |pad| p2 ...... |pad|   padding   |
//   shards: |   rank 0 shard   |   rank 1 shard   |   rank 2 shard   |
//
// Parameters are concatenated in order, each starting at a multiple of
// kFlatAlignElems elements (8 elements: 32 bytes in f32, 16 bytes in bf16/f16,
// so gathered views are 16-byte aligned in every compute dtype). The total is
// padded to a multiple of group_size * kFlatAlignElems, so every rank's shard
// has the same size (uneven all-gathers are slower, as the FSDP paper found)
// and starts aligned. Padding elements are zero in parameters and gradients,
// so they change neither norms nor optimizer results.
#ifndef SHARDKIT_RUNTIME_FSDP_FLAT_PARAM_H_
#define SHARDKIT_RUNTIME_FSDP_FLAT_PARAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/shape.h"
#include "runtime/core/status.h"

namespace sk {

inline constexpr int64_t kFlatAlignElems = 8;

class FlatParamLayout {
 public:
  struct Param {
    std::string name;
    Shape shape;
    int64_t offset;  // first element in the flat parameter
    int64_t numel;
  };
  // The part of parameter `param` that falls in one rank's shard:
  // elements [param_begin, param_end) of the parameter, stored at
  // [shard_offset, shard_offset + (param_end - param_begin)) of the shard.
  struct ShardSlice {
    int param;
    int64_t param_begin;
    int64_t param_end;
    int64_t shard_offset;
  };

  // InvalidArgument if group_size < 1, a name is empty or repeated, or the
  // sizes overflow.
  static StatusOr<FlatParamLayout> Make(std::vector<std::pair<std::string, Shape>> params,
                                        int group_size);

  const std::vector<Param>& params() const { return params_; }
  int group_size() const { return group_size_; }
  // Elements of real parameters, without alignment and padding.
  int64_t unpadded_numel() const { return unpadded_numel_; }
  // Elements of the full flat parameter, including alignment gaps and padding.
  int64_t padded_numel() const { return shard_numel_ * group_size_; }
  // Elements of each rank's shard.
  int64_t shard_numel() const { return shard_numel_; }
  // The slices of parameters that rank `rank` holds, in flat order. CHECKs rank range.
  std::vector<ShardSlice> ShardSlices(int rank) const;
  // Index of the parameter named `name`, or NotFound.
  StatusOr<int> Find(const std::string& name) const;

 private:
  std::vector<Param> params_;
  int group_size_ = 1;
  int64_t unpadded_numel_ = 0;
  int64_t shard_numel_ = 0;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_FSDP_FLAT_PARAM_H_
