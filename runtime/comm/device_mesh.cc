#include "runtime/comm/device_mesh.h"

namespace sk::comm {

StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(ProcessGroup& world, int replicate,
                                                         int shard, Duration timeout) {
  if (replicate < 1 || shard < 1 || replicate * shard != world.size()) {
    return InvalidArgumentError("DeviceMesh(replicate=" + std::to_string(replicate) + ", shard=" +
                                std::to_string(shard) + ") does not cover a group of " +
                                std::to_string(world.size()) + " ranks");
  }
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh(world, replicate, shard));
  // Every rank forms its row first, then its column: the same order everywhere.
  SK_ASSIGN_OR_RETURN(mesh->shard_group_,
                      world.NewGroup(mesh->ShardGroupRanks(mesh->replicate_index()), timeout));
  SK_ASSIGN_OR_RETURN(mesh->replicate_group_,
                      world.NewGroup(mesh->ReplicateGroupRanks(mesh->shard_index()), timeout));
  return mesh;
}

std::vector<int> DeviceMesh::ShardGroupRanks(int replica) const {
  std::vector<int> ranks;
  for (int s = 0; s < shard_; ++s) ranks.push_back(replica * shard_ + s);
  return ranks;
}

std::vector<int> DeviceMesh::ReplicateGroupRanks(int shard_index) const {
  std::vector<int> ranks;
  for (int r = 0; r < replicate_; ++r) ranks.push_back(r * shard_ + shard_index);
  return ranks;
}

std::string DeviceMesh::ToString() const {
  return "DeviceMesh(replicate=" + std::to_string(replicate_) + ", shard=" + std::to_string(shard_) +
         ")";
}

}  // namespace sk::comm
