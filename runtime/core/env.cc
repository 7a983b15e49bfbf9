#include "runtime/core/env.h"

#include <cstdlib>

namespace sk {

namespace {

const char* OwnerName(EnvOwner owner) {
  switch (owner) {
    case EnvOwner::kShardkit:
      return "shardkit";
    case EnvOwner::kLauncher:
      return "launcher";
    case EnvOwner::kBazel:
      return "Bazel";
    case EnvOwner::kThirdParty:
      return "third party";
    case EnvOwner::kScheduler:
      return "scheduler";
  }
  return "?";
}

}  // namespace

const std::vector<EnvVarInfo>& EnvVars() {
  static const std::vector<EnvVarInfo> vars = {
      {EnvVar::kRank, "RANK", nullptr, EnvOwner::kLauncher, "runtime/comm/launch_env.cc (`DistributedEnv::FromEnvironment`: gloo, nccl)",
       "This process's rank in the world, 0..WORLD_SIZE-1 (torchrun, our `launch`, a Kubeflow PyTorchJob). Read by `sk_gloo_options`/`sk_nccl_options` left at 0 and by `DistributedEnv::FromEnvironment`; when set it wins over every scheduler's variables (the order is in docs/launch.md). Set without WORLD_SIZE: an error."},
      {EnvVar::kWorldSize, "WORLD_SIZE", nullptr, EnvOwner::kLauncher, "runtime/comm/launch_env.cc",
       "The number of ranks. Required where RANK is set."},
      {EnvVar::kLocalRank, "LOCAL_RANK", nullptr, EnvOwner::kLauncher, "runtime/comm/launch_env.cc",
       "This process's rank on its node; default RANK (or the scheduler's: OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID). Below LOCAL_WORLD_SIZE when both are set. An NCCL rank's default GPU when SK_CUDA_DEVICE is unset."},
      {EnvVar::kLocalWorldSize, "LOCAL_WORLD_SIZE", nullptr, EnvOwner::kLauncher, "runtime/comm, runtime/train/rank.cc (`LocalWorldSizeFromEnvironment`)",
       "The ranks of this node. Hybrid strategies shard within a node of this many ranks when `shard_group_size` is 0, and CPU ranks split the cores by it (GEMM threads). Unset or not a positive integer: 0 (one node)."},
      {EnvVar::kGroupRank, "GROUP_RANK", nullptr, EnvOwner::kLauncher, "set by `launch` only",
       "The node's index (`launch --node_rank`); exported for the programs it starts, not read by shardkit."},
      {EnvVar::kMasterAddr, "MASTER_ADDR", nullptr, EnvOwner::kLauncher, "runtime/comm/launch_env.cc",
       "Host of the rendezvous store (rank 0's, or the launcher's). Required where RANK is set; under Slurm it defaults to the first node of the step, under a one-node mpirun to 127.0.0.1, else PET_MASTER_ADDR."},
      {EnvVar::kMasterPort, "MASTER_PORT", nullptr, EnvOwner::kLauncher, "runtime/comm/launch_env.cc",
       "TCP port of the rendezvous store, 1..65535. Required where RANK is set; under Slurm it defaults to one derived from SLURM_JOB_ID, under mpirun from PMIX_NAMESPACE, else PET_MASTER_PORT."},
      {EnvVar::kTorchelasticUseAgentStore, "TORCHELASTIC_USE_AGENT_STORE", nullptr, EnvOwner::kLauncher, "runtime/comm/launch_env.cc",
       "`True` (set by torchrun): torchrun's agent serves a PyTorch c10d TCPStore on MASTER_ADDR:MASTER_PORT, so no rank serves one; every rank connects to it as a client (docs/launch.md). Needs RANK and the rest of the launcher convention."},
      {EnvVar::kTorchelasticRestartCount, "TORCHELASTIC_RESTART_COUNT", nullptr, EnvOwner::kLauncher, "runtime/comm/launch_env.cc",
       "How many times the launcher has restarted the group (torchrun's `--max-restarts`; our `launch --max_restarts` sets it too). Store keys are scoped by it, so a restarted group never reads the keys of the attempt before. Unset: 0."},
      {EnvVar::kOmpiCommWorldRank, "OMPI_COMM_WORLD_RANK", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Open MPI's rank (`mpirun`): the rank when RANK is unset. Must agree with PMIX_RANK when both are set."},
      {EnvVar::kOmpiCommWorldSize, "OMPI_COMM_WORLD_SIZE", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Open MPI's world size; required with OMPI_COMM_WORLD_RANK."},
      {EnvVar::kOmpiCommWorldLocalRank, "OMPI_COMM_WORLD_LOCAL_RANK", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Open MPI's rank on this node (the local rank under mpirun)."},
      {EnvVar::kOmpiCommWorldLocalSize, "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Open MPI's ranks on this node. Equal to OMPI_COMM_WORLD_SIZE (one node) with MASTER_ADDR unset: the store is on 127.0.0.1."},
      {EnvVar::kPmixRank, "PMIX_RANK", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "The PMIx rank (Open MPI 4/5, `srun --mpi=pmix`): the rank when neither RANK nor OMPI_COMM_WORLD_RANK is set (the world size then comes from SLURM_NTASKS); checked against them otherwise."},
      {EnvVar::kPmixNamespace, "PMIX_NAMESPACE", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "The PMIx job's name, the same on every rank: under mpirun with MASTER_PORT unset the store's port is derived from it (10000 + a hash of it mod 20000)."},
      {EnvVar::kSlurmProcid, "SLURM_PROCID", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Slurm's task rank (`srun`): the rank when RANK, OMPI_COMM_WORLD_RANK and PMIX_RANK are unset."},
      {EnvVar::kSlurmNtasks, "SLURM_NTASKS", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Slurm's task count, the world size with SLURM_PROCID (or PMIX_RANK)."},
      {EnvVar::kSlurmLocalid, "SLURM_LOCALID", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Slurm's task rank on this node (the local rank, an NCCL rank's default GPU)."},
      {EnvVar::kSlurmNodeid, "SLURM_NODEID", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Slurm's index of this node in the step; picks this node's entry of SLURM_STEP_TASKS_PER_NODE."},
      {EnvVar::kSlurmStepTasksPerNode, "SLURM_STEP_TASKS_PER_NODE", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Tasks per node of the step, compressed (`8(x2)`, `2(x3),1`): this node's entry is the local world size."},
      {EnvVar::kSlurmStepNodelist, "SLURM_STEP_NODELIST", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "The step's nodes, compressed (`node[01-04,07]`, `a[1-2]-ib,b3`): with MASTER_ADDR unset the first is the store's host."},
      {EnvVar::kSlurmJobNodelist, "SLURM_JOB_NODELIST", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "The job's nodes, read as SLURM_STEP_NODELIST is when that is unset."},
      {EnvVar::kSlurmJobId, "SLURM_JOB_ID", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "With MASTER_PORT unset under Slurm, the store's port is 10000 + SLURM_JOB_ID mod 20000 (10000..29999, below Linux's ephemeral ports); set MASTER_PORT where two steps of one job run at once."},
      {EnvVar::kPetNnodes, "PET_NNODES", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Kubeflow PyTorchJob: torchrun's `--nnodes` for the pod's torchrun. Read only when RANK is unset (the program started without torchrun): with PET_NPROC_PER_NODE unset or 1 and a fixed count, the world size."},
      {EnvVar::kPetNprocPerNode, "PET_NPROC_PER_NODE", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Kubeflow PyTorchJob: torchrun's `--nproc-per-node`. More than 1 without torchrun is an error (start the program with torchrun)."},
      {EnvVar::kPetNodeRank, "PET_NODE_RANK", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Kubeflow PyTorchJob: the pod's index, the rank when RANK is unset (see PET_NNODES)."},
      {EnvVar::kPetMasterAddr, "PET_MASTER_ADDR", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Kubeflow PyTorchJob: the master pod's address, read when MASTER_ADDR is unset."},
      {EnvVar::kPetMasterPort, "PET_MASTER_PORT", nullptr, EnvOwner::kScheduler, "runtime/comm/launch_env.cc",
       "Kubeflow PyTorchJob: the master pod's port, read when MASTER_PORT is unset."},
      {EnvVar::kLauncherStore, "SK_LAUNCHER_STORE", nullptr, EnvOwner::kShardkit, "runtime/comm/launch_env.cc; exported by `launch`",
       "`1` (set by our `launch`): the launcher serves a shardkit TcpStore on MASTER_ADDR:MASTER_PORT, so no rank serves one and rank 0's death is reported as any rank's (docs/launch.md). Unset: rank 0 serves the store (a program started by hand)."},
      {EnvVar::kCudaDevice, "SK_CUDA_DEVICE", "SHARDKIT_CUDA_DEVICE", EnvOwner::kShardkit, "runtime/comm/nccl_backend.cc; exported by `launch --gpus`",
       "The GPU an NCCL rank uses when its options leave the device at 0 (`use_device` unset); unset: LOCAL_RANK, else 0. A non-negative integer."},
      {EnvVar::kFlightRecorderDir, "SK_FLIGHT_RECORDER_DIR", "SHARDKIT_FLIGHT_RECORDER_DIR", EnvOwner::kShardkit, "runtime/comm/flight_recorder.cc (on a collective's first error)",
       "A directory: a process group whose collective fails writes its flight recorder there as `GROUP.rankN.json`, once, for `flight_merge` (docs/multi_gpu.md). Unset: no dump."},
      {EnvVar::kCpuIsa, "SK_CPU_ISA", nullptr, EnvOwner::kShardkit, "runtime/ops/cpu/simd.cc (once, at first use)",
       "`scalar`, `avx2`, `avx512` or `avx512_bf16`: lowers (never raises) the instruction set of the CPU backend's own loops, for A/B runs. Anything else is ignored with a warning. Unset: the best the CPU has."},
      {EnvVar::kCudnnAttention, "SK_CUDNN_ATTENTION", nullptr, EnvOwner::kShardkit, "runtime/ops/cuda/cudnn_attention.cc (once)",
       "`0` turns cuDNN's fused attention off (the CUDA backend's own attention kernels run instead). Unset or anything else: cuDNN when it loads (docs/cuda.md)."},
      {EnvVar::kCublasReducedPrecisionReduction, "SK_CUBLAS_REDUCED_PRECISION_REDUCTION", nullptr, EnvOwner::kShardkit, "runtime/ops/cuda/cublas.cc (once)",
       "`1` lets cuBLAS reduce 16-bit GEMMs in reduced precision (faster, less exact). Unset or anything else: f32 accumulation throughout."},
      {EnvVar::kCudaFusedEpilogues, "SK_CUDA_FUSED_EPILOGUES", nullptr, EnvOwner::kShardkit, "runtime/ops/cuda/cublas.cc (once)",
       "`1` runs GemmBias and GemmBiasResidual with 16-bit operands as one cuBLASLt GEMM with a fused epilogue. Unset or anything else: the unfused ops (the default; docs/cuda.md says why)."},
      {EnvVar::kBenchThreads, "SK_BENCH_THREADS", nullptr, EnvOwner::kShardkit, "benchmarks/micro/kernels.cc",
       "Threads for the kernel micro-benchmarks (both BLAS libraries are told, and the peak is that many threads'). Unset or not positive: every core."},
      {EnvVar::kBenchInject, "SK_BENCH_INJECT", nullptr, EnvOwner::kShardkit, "benchmarks/util/inject.cc (the tracking gate's self-test)",
       "`name:count,...` with names `fsdp_step`, `collectives` and counts 1..16: repeat that benchmark's work `count` times, to prove the tracking gate fails on a slowdown (docs/benchmarks.md). Malformed: the benchmark exits 2 naming the fault."},
      {EnvVar::kGpuTrainSteps, "SK_GPU_TRAIN_STEPS", nullptr, EnvOwner::kShardkit, "benchmarks/gpu/gpu_train.cc",
       "Timed steps per configuration of `gpu_train`, >= 1 (1 under a profiler such as ncu). Unset or invalid: 10."},
      {EnvVar::kGpuTrainOpBreakdown, "SK_GPU_TRAIN_OP_BREAKDOWN", nullptr, EnvOwner::kShardkit, "benchmarks/gpu/gpu_train.cc",
       "`1`: after each row, time one extra step per op with device events and print the per-op table (docs/cuda.md)."},
      {EnvVar::kGpuTrainSimProfile, "SK_GPU_TRAIN_SIM_PROFILE", nullptr, EnvOwner::kShardkit, "benchmarks/gpu/gpu_train.cc",
       "The simulator profile `gpu_train` compares each measured row with. Unset: `h100-80g`."},
      {EnvVar::kLib, "SK_LIB", "SHARDKIT_LIB", EnvOwner::kShardkit, "frontends/lua/shardkit.lua (at `require`)",
       "The Lua module loads `libshardkit.so` from this path. Unset: the path `bazel run //:install` recorded beside the installed module, else the loader's search path (docs/capi.md)."},
      {EnvVar::kLibDir, "SK_LIB_DIR", "SHARDKIT_LIB_DIR", EnvOwner::kShardkit, "frontends/rust/build.rs (at `cargo build`)",
       "The directory the Rust crate links `libshardkit.so` from (and puts in its tests' and examples' rpath). Unset: `pkg-config --variable=libdir shardkit`, else the checkout's `bazel-bin/capi` (docs/capi.md)."},
      {EnvVar::kBuildWorkingDirectory, "BUILD_WORKING_DIRECTORY", nullptr, EnvOwner::kBazel, "tools/launch.cc, tools/convert.cc",
       "Set by `bazel run`: the directory it was run from, so that relative paths on the command line mean what the user typed."},
      {EnvVar::kBuildWorkspaceDirectory, "BUILD_WORKSPACE_DIRECTORY", nullptr, EnvOwner::kBazel, "benchmarks/paper/harness_main.cc",
       "Set by `bazel run`: the workspace root, where the paper harness writes `benchmarks/results/` and finds plot.py."},
      {EnvVar::kRunfilesDir, "RUNFILES_DIR", nullptr, EnvOwner::kBazel, "benchmarks/paper/harness_main.cc",
       "Set by Bazel: the runfiles tree, one place the paper harness looks for plot.py."},
      {EnvVar::kTestTmpdir, "TEST_TMPDIR", nullptr, EnvOwner::kBazel, "capi/fuzz (the fuzz replayer), tests",
       "Set by `bazel test`: a private temporary directory. Unset: /tmp."},
      {EnvVar::kOpenblasCoretype, "OPENBLAS_CORETYPE", nullptr, EnvOwner::kThirdParty, "benchmarks/micro/kernels.cc (reported only)",
       "OpenBLAS's kernel choice; the kernel benchmarks record it in their context, so a run says which OpenBLAS kernels it measured."},
  };
  return vars;
}

const EnvVarInfo& EnvVarInfoOf(EnvVar var) { return EnvVars()[static_cast<size_t>(var)]; }

const char* EnvName(EnvVar var) { return EnvVarInfoOf(var).name; }

const char* GetEnv(EnvVar var) {
  const EnvVarInfo& info = EnvVarInfoOf(var);
  for (const char* name : {info.name, info.old_name}) {
    if (name == nullptr) continue;
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return nullptr;
}

std::string EnvVarsMarkdown() {
  std::string out = "| Variable | Defined by | Read by | Meaning |\n|---|---|---|---|\n";
  for (const EnvVarInfo& v : EnvVars()) {
    out += std::string("| `") + v.name + "`";
    if (v.old_name != nullptr) out += std::string(" (old name `") + v.old_name + "`, still read)";
    out += std::string(" | ") + OwnerName(v.owner) + " | " + v.read_by + " | " + v.meaning + " |\n";
  }
  return out;
}

}  // namespace sk
