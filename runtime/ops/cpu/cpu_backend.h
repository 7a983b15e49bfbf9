// The CPU op backend: the kernels of runtime/ops/cpu/kernels.h behind the
// OpBackend table (oneDNN GEMM, with OpenBLAS selectable for measurement; the
// bf16 GEMM on oneDNN's matmul; loops, vectorised for AVX-512 or AVX2 at run time, for the rest: cpu/simd.h).
//
// Execution: every op runs synchronously on the calling thread (backend.h).
// Account() does nothing. Registered for DeviceKind::kCpu by //runtime/ops.
//
// Thread safety: stateless apart from the GEMM libraries' thread settings and
// oneDNN's per-shape primitive cache (mutex-guarded); safe from any thread.
#ifndef SHARDKIT_RUNTIME_OPS_CPU_CPU_BACKEND_H_
#define SHARDKIT_RUNTIME_OPS_CPU_CPU_BACKEND_H_

#include "runtime/ops/backend.h"

namespace sk::ops {

// The process-wide CPU backend (never destroyed).
OpBackend* CpuOpBackend();

// Sets how many threads a CPU GEMM issued from the calling thread may use:
// oneDNN's OpenMP team of this thread (an OpenMP setting of the calling
// thread) and OpenBLAS's pool (process-wide). InvalidArgument unless n >= 1.
// Ranks that run as threads of one process should each use cores / ranks:
// idle OpenMP workers spin, and oversubscribed teams spin against each other.
Status SetCpuGemmThreads(int n);

// The thread count CPU GEMMs from the calling thread use now.
int CpuGemmThreads();

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CPU_CPU_BACKEND_H_
