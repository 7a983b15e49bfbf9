// Every environment variable shardkit reads, declared once.
//
// Each variable has one entry in a table (env.cc): its name, the code that
// reads it and what it means. docs/environment.md is generated from the
// table (//tools:env_table) and tests/core:env_test checks that the
// two agree, so a variable cannot be read without being documented.
//
// Names: shardkit's own variables start with SK_. The launcher convention
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT: what torchrun and our `launch` set), torchrun's TORCHELASTIC_
// ones, a scheduler's or MPI launcher's (SLURM_, OMPI_COMM_WORLD_, PMIX_,
// Kubeflow's PET_) and variables that Bazel or a third-party library defines
// keep their own names. Two variables had a
// SHARDKIT_ prefix before 0.6.0, and the frontends' two before 0.8.0; those
// old names are still read when the new one is unset.
//
// Read at the edge: the library reads a variable where a process meets its
// environment (process-group and trainer creation, a backend's first use, a
// tool's main), never inside a step, and passes the value on as an option.
#ifndef SHARDKIT_RUNTIME_CORE_ENV_H_
#define SHARDKIT_RUNTIME_CORE_ENV_H_

#include <string>
#include <vector>

namespace sk {

enum class EnvVar {
  // Launcher convention.
  kRank,
  kWorldSize,
  kLocalRank,
  kLocalWorldSize,
  kGroupRank,
  kMasterAddr,
  kMasterPort,
  // torchrun's (its agent's store, its restarts).
  kTorchelasticUseAgentStore,
  kTorchelasticRestartCount,
  // Schedulers and MPI launchers (runtime/comm/launch_env.h resolves them).
  kOmpiCommWorldRank,
  kOmpiCommWorldSize,
  kOmpiCommWorldLocalRank,
  kOmpiCommWorldLocalSize,
  kPmixRank,
  kPmixNamespace,
  kSlurmProcid,
  kSlurmNtasks,
  kSlurmLocalid,
  kSlurmNodeid,
  kSlurmStepTasksPerNode,
  kSlurmStepNodelist,
  kSlurmJobNodelist,
  kSlurmJobId,
  kPetNnodes,
  kPetNprocPerNode,
  kPetNodeRank,
  kPetMasterAddr,
  kPetMasterPort,
  // shardkit's own.
  kLauncherStore,
  kCudaDevice,
  kFlightRecorderDir,
  kCpuIsa,
  kCudnnAttention,
  kCublasReducedPrecisionReduction,
  kCudaFusedEpilogues,
  kBenchThreads,
  kBenchInject,
  kGpuTrainSteps,
  kGpuTrainOpBreakdown,
  kGpuTrainSimProfile,
  // Read by the frontends (not by the library).
  kLib,
  kLibDir,
  // Set by Bazel (bazel run / bazel test).
  kBuildWorkingDirectory,
  kBuildWorkspaceDirectory,
  kRunfilesDir,
  kTestTmpdir,
  // A third-party library's.
  kOpenblasCoretype,
};

// Who defines a variable's name.
enum class EnvOwner { kShardkit, kLauncher, kBazel, kThirdParty, kScheduler };

struct EnvVarInfo {
  EnvVar var;
  const char* name;
  // The name before 0.6.0 (0.8.0 for the frontends'), read when `name` is
  // unset, or null.
  const char* old_name;
  EnvOwner owner;
  // Where it is read (a file or binary), for readers of the docs.
  const char* read_by;
  // What it does, its values and its default (one paragraph, Markdown).
  const char* meaning;
};

// The table, in EnvVar order.
const std::vector<EnvVarInfo>& EnvVars();
const EnvVarInfo& EnvVarInfoOf(EnvVar var);

// The variable's value, or null when it is unset or empty (an empty value
// counts as unset everywhere). Falls back to the old name.
const char* GetEnv(EnvVar var);
// Its name (for messages).
const char* EnvName(EnvVar var);

// docs/environment.md's table, generated from EnvVars().
std::string EnvVarsMarkdown();

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_ENV_H_
