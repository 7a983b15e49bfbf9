#include "runtime/comm/device_mesh.h"

namespace sk::comm {

StatusOr<MeshShape> MeshShape::Make(int replicate, int shard, int world_size) {
  if (replicate < 1 || shard < 1 || replicate * shard != world_size) {
    return InvalidArgumentError("DeviceMesh(replicate=" + std::to_string(replicate) + ", shard=" +
                                std::to_string(shard) + ") does not cover a group of " +
                                std::to_string(world_size) + " ranks");
  }
  return MeshShape{replicate, shard};
}

std::vector<int> MeshShape::ShardGroupRanks(int replica) const {
  std::vector<int> ranks;
  for (int s = 0; s < shard; ++s) ranks.push_back(replica * shard + s);
  return ranks;
}

std::vector<int> MeshShape::ReplicateGroupRanks(int shard_index) const {
  std::vector<int> ranks;
  for (int r = 0; r < replicate; ++r) ranks.push_back(r * shard + shard_index);
  return ranks;
}

std::string MeshShape::ToString() const {
  return "DeviceMesh(replicate=" + std::to_string(replicate) + ", shard=" + std::to_string(shard) + ")";
}

StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(ProcessGroup& world, int replicate,
                                                         int shard, Duration timeout) {
  SK_ASSIGN_OR_RETURN(MeshShape shape, MeshShape::Make(replicate, shard, world.size()));
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh(world, shape));
  // Every rank forms its row first, then its column: the same order everywhere.
  SK_ASSIGN_OR_RETURN(mesh->shard_group_,
                      world.NewGroup(mesh->ShardGroupRanks(mesh->replicate_index()), timeout));
  SK_ASSIGN_OR_RETURN(mesh->replicate_group_,
                      world.NewGroup(mesh->ReplicateGroupRanks(mesh->shard_index()), timeout));
  return mesh;
}

}  // namespace sk::comm
