// Who this process is in the world, from whichever launcher started it, and
// where the world's rendezvous store is (docs/launch.md).
//
// One order of precedence, resolved once, here: the first source whose rank
// variable is set gives the rank, the world size and the local rank and size;
// sources are never mixed (RANK with SLURM_NTASKS is an error, not a world).
//   1. RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT:
//      torchrun, our `launch`, a Kubeflow PyTorchJob. Wins over everything
//      (torchrun under srun: Slurm's variables describe the torchrun agents).
//   2. Open MPI: OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE (PMIX_RANK,
//      when also set, must agree).
//   3. PMIx alone (srun --mpi=pmix without Open MPI's variables): PMIX_RANK,
//      with SLURM_NTASKS as the world size (SLURM_PROCID, if set, must agree).
//   4. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and this node's entry
//      (SLURM_NODEID) of SLURM_STEP_TASKS_PER_NODE as the local world size.
//   5. Kubeflow PyTorchJob without torchrun: PET_NODE_RANK, PET_NNODES (one
//      process per pod only).
// The store's address: MASTER_ADDR/MASTER_PORT when set; else under Slurm the
// first node of SLURM_STEP_NODELIST (SLURM_JOB_NODELIST) and a port derived
// from SLURM_JOB_ID; under a one-node mpirun 127.0.0.1 and a port derived
// from PMIX_NAMESPACE; for a PyTorchJob PET_MASTER_ADDR/PET_MASTER_PORT.
//
// Who serves the store:
//   TORCHELASTIC_USE_AGENT_STORE=True  torchrun's agent (a c10d TCPStore):
//                                      every rank is a C10dStore client.
//   SK_LAUNCHER_STORE=1                our `launch` (a shardkit TcpStore):
//                                      every rank is a client.
//   neither                            rank 0 serves a TcpStore (by hand).
// Keys are scoped by TORCHELASTIC_RESTART_COUNT ("attempt_N/"), so a group
// restarted against a store that outlived the attempt uses fresh keys.
#ifndef SHARDKIT_RUNTIME_COMM_LAUNCH_ENV_H_
#define SHARDKIT_RUNTIME_COMM_LAUNCH_ENV_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/store.h"
#include "runtime/core/status.h"

namespace sk::comm {

enum class StoreServer {
  kRankZero,       // rank 0 serves a TcpStore
  kTorchrunAgent,  // torchrun's agent serves a c10d TCPStore
  kLauncher,       // our launch serves a TcpStore
};

// The environment a launcher gives each rank.
struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // The variable that gave the rank: "RANK", "OMPI_COMM_WORLD_RANK",
  // "PMIX_RANK", "SLURM_PROCID" or "PET_NODE_RANK".
  std::string source = "RANK";
  StoreServer store_server = StoreServer::kRankZero;
  int restart_count = 0;

  // Resolves the variables above. InvalidArgument naming the variable when
  // one is missing (a rank without its world size, no store address) or
  // malformed, when a rank is not below its world size, or when two
  // sources that describe the same process disagree.
  static StatusOr<DistributedEnv> FromEnvironment();

  // "attempt_N/": the scope of this attempt's keys in the world store.
  std::string KeyPrefix() const { return "attempt_" + std::to_string(restart_count) + "/"; }
};

// The world's store for `env`: a client of torchrun's agent or of our
// launcher's store, or (rank 0 serving) a TcpStore, scoped by KeyPrefix().
// `timeout` bounds reaching it and each later reply. Errors say which
// server was expected (torchrun's agent, the launcher, rank 0).
StatusOr<std::shared_ptr<Store>> ConnectWorldStore(const DistributedEnv& env, Duration timeout);

// Slurm's compressed host list ("node[01-04,07]", "a[1-2]-ib,b3",
// "r[1-2]n[1-2]"), expanded in order, zero padding kept. InvalidArgument
// naming the list when it is malformed or expands to over 2^20 hosts.
StatusOr<std::vector<std::string>> ExpandSlurmNodelist(const std::string& list);

// Slurm's compressed tasks per node ("8(x2),4" -> 8,8,4).
StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(const std::string& list);

// This node's rank count as the launcher says (LOCAL_WORLD_SIZE, else
// OMPI_COMM_WORLD_LOCAL_SIZE, else Slurm's tasks on this node), or 0 when
// none says or what it says is malformed. Never fails: a hint.
int LocalWorldSizeHint();

// This process's local rank as the launcher says (LOCAL_RANK, else
// OMPI_COMM_WORLD_LOCAL_RANK, else SLURM_LOCALID), with the variable that
// said it, or -1 and null. InvalidArgument if the one set is malformed.
StatusOr<std::pair<int, const char*>> LocalRankHint();

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_LAUNCH_ENV_H_
