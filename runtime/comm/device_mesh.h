// DeviceMesh: a 2-D arrangement of a group's ranks for hybrid sharding.
//
// `replicate` x `shard` ranks, row-major: world rank = r * shard + s. The
// shard group of a rank holds the `shard` ranks of its row (parameters are
// sharded across it: all_gather / reduce_scatter); its replicate group holds
// the `replicate` ranks of its column, same shard index on every replica
// (gradient shards are all-reduced across it). shard == world is FULL_SHARD,
// replicate == world is DDP-like replication, anything between is
// HYBRID_SHARD with sharding factor F = shard.
//
// MeshShape is the arithmetic alone (which world ranks form each group),
// for callers that must know the groups without forming them: FSDP's
// sharding plan (runtime/parallel/sharding_plan.h), the memory estimator
// and the planner.
//
// Thread safety: immutable after Create; the groups are ordinary ProcessGroups.
#ifndef SHARDKIT_RUNTIME_COMM_DEVICE_MESH_H_
#define SHARDKIT_RUNTIME_COMM_DEVICE_MESH_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"

namespace sk::comm {

// A replicate x shard arrangement of `replicate * shard` ranks, row-major.
struct MeshShape {
  int replicate = 1;
  int shard = 1;

  // InvalidArgument unless replicate * shard == world_size and both >= 1.
  static StatusOr<MeshShape> Make(int replicate, int shard, int world_size);

  int world_size() const { return replicate * shard; }
  // The row (replica) and column (shard index) of world rank `rank`.
  int ReplicaOf(int rank) const { return rank / shard; }
  int ShardIndexOf(int rank) const { return rank % shard; }
  // World ranks of row `replica` and of column `shard_index`, ascending.
  std::vector<int> ShardGroupRanks(int replica) const;
  std::vector<int> ReplicateGroupRanks(int shard_index) const;
  // "DeviceMesh(replicate=2, shard=4)".
  std::string ToString() const;
};

class DeviceMesh {
 public:
  // Collective over `world`: every rank calls it with the same shape.
  // InvalidArgument unless replicate * shard == world.size() and both >= 1.
  // `world` must outlive the mesh.
  static StatusOr<std::unique_ptr<DeviceMesh>> Create(ProcessGroup& world, int replicate, int shard,
                                                      Duration timeout = kDefaultTimeout);

  const MeshShape& shape() const { return shape_; }
  int replicate_size() const { return shape_.replicate; }
  int shard_size() const { return shape_.shard; }
  // This rank's coordinates: its row (replica) and column (shard index).
  int replicate_index() const { return shape_.ReplicaOf(world_.rank()); }
  int shard_index() const { return shape_.ShardIndexOf(world_.rank()); }

  ProcessGroup& world() const { return world_; }
  ProcessGroup& shard_group() const { return *shard_group_; }
  ProcessGroup& replicate_group() const { return *replicate_group_; }

  // World ranks of row `replica` and of column `shard_index`.
  std::vector<int> ShardGroupRanks(int replica) const { return shape_.ShardGroupRanks(replica); }
  std::vector<int> ReplicateGroupRanks(int shard_index) const {
    return shape_.ReplicateGroupRanks(shard_index);
  }
  // "DeviceMesh(replicate=2, shard=4)".
  std::string ToString() const { return shape_.ToString(); }

 private:
  DeviceMesh(ProcessGroup& world, MeshShape shape) : world_(world), shape_(shape) {}

  ProcessGroup& world_;
  const MeshShape shape_;
  std::unique_ptr<ProcessGroup> shard_group_;
  std::unique_ptr<ProcessGroup> replicate_group_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_DEVICE_MESH_H_
