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
  }
  return "?";
}

}  // namespace

const std::vector<EnvVarInfo>& EnvVars() {
  static const std::vector<EnvVarInfo> vars = {
      {EnvVar::kRank, "RANK", nullptr, EnvOwner::kLauncher, "runtime/comm (gloo, nccl: `DistributedEnv::FromEnvironment`)",
       "This process's rank in the world, 0..WORLD_SIZE-1. Required by `sk_gloo_options`/`sk_nccl_options` left at 0 and by `DistributedEnv::FromEnvironment`."},
      {EnvVar::kWorldSize, "WORLD_SIZE", nullptr, EnvOwner::kLauncher, "runtime/comm (as RANK)",
       "The number of ranks. Required where RANK is."},
      {EnvVar::kLocalRank, "LOCAL_RANK", nullptr, EnvOwner::kLauncher, "runtime/comm (gloo, nccl)",
       "This process's rank on its node; default RANK. Below LOCAL_WORLD_SIZE when both are set. An NCCL rank's default GPU when SK_CUDA_DEVICE is unset."},
      {EnvVar::kLocalWorldSize, "LOCAL_WORLD_SIZE", nullptr, EnvOwner::kLauncher, "runtime/comm, runtime/train/rank.cc (`LocalWorldSizeFromEnvironment`)",
       "The ranks of this node. Hybrid strategies shard within a node of this many ranks when `shard_group_size` is 0, and CPU ranks split the cores by it (GEMM threads). Unset or not a positive integer: 0 (one node)."},
      {EnvVar::kGroupRank, "GROUP_RANK", nullptr, EnvOwner::kLauncher, "set by `launch` only",
       "The node's index (`launch --node_rank`); exported for the programs it starts, not read by shardkit."},
      {EnvVar::kMasterAddr, "MASTER_ADDR", nullptr, EnvOwner::kLauncher, "runtime/comm (as RANK)",
       "Host of rank 0's rendezvous store. Required where RANK is."},
      {EnvVar::kMasterPort, "MASTER_PORT", nullptr, EnvOwner::kLauncher, "runtime/comm (as RANK)",
       "TCP port of rank 0's rendezvous store, 1..65535. Required where RANK is."},
      {EnvVar::kCudaDevice, "SK_CUDA_DEVICE", "SHARDKIT_CUDA_DEVICE", EnvOwner::kShardkit, "runtime/comm/nccl_backend.cc; exported by `launch --gpus`",
       "The GPU an NCCL rank uses when its options leave the device at 0 (`use_device` unset); unset: LOCAL_RANK, else 0. A non-negative integer."},
      {EnvVar::kFlightRecorderDir, "SK_FLIGHT_RECORDER_DIR", "SHARDKIT_FLIGHT_RECORDER_DIR", EnvOwner::kShardkit, "runtime/comm/flight_recorder.cc (on a collective's first error)",
       "A directory: a process group whose collective fails writes its flight recorder there as `GROUP.rankN.json`, once, for `flight_merge` (docs/multi_gpu.md). Unset: no dump."},
      {EnvVar::kCpuIsa, "SK_CPU_ISA", nullptr, EnvOwner::kShardkit, "runtime/ops/cpu/simd.cc (once, at first use)",
       "`scalar`, `avx2`, `avx512` or `avx512_bf16`: lowers (never raises) the instruction set of the CPU backend's own loops, for A/B runs. Anything else is ignored with a warning. Unset: the best the CPU has."},
      {EnvVar::kCudnnAttention, "SK_CUDNN_ATTENTION", nullptr, EnvOwner::kShardkit, "runtime/ops/cuda/cudnn_attention.cc (once)",
       "`0` turns cuDNN's fused attention off (the CUDA backend's own attention kernels run instead). Unset or anything else: cuDNN when it loads (docs/cuda.md)."},
      {EnvVar::kCublasReducedPrecisionReduction, "SK_CUBLAS_REDUCED_PRECISION_REDUCTION", nullptr, EnvOwner::kShardkit, "runtime/ops/cuda/cuda_backend.cc (once)",
       "`1` lets cuBLAS reduce 16-bit GEMMs in reduced precision (faster, less exact). Unset or anything else: f32 accumulation throughout."},
      {EnvVar::kCudaFusedEpilogues, "SK_CUDA_FUSED_EPILOGUES", nullptr, EnvOwner::kShardkit, "runtime/ops/cuda/cuda_backend.cc (once)",
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
