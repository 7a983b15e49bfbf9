// The CPU op backend: the kernels of runtime/ops/cpu/kernels.h behind the
// OpBackend table (oneDNN GEMM, with OpenBLAS selectable for measurement; the
// bf16 GEMM on oneDNN's matmul; loops, vectorised for AVX-512 or AVX2 at run time, for the rest: cpu/simd.h).
//
// 16-bit operands are computed here (Native16Bit, GemmStores16Bit): widened
// a row, a chunk or a sequence at a time into f32 scratch of the calling
// thread (bf16 vectorised, f16 scalar), the f32 loop run on it, 16-bit
// outputs rounded once: the f32 op's results on the widened values, bit for
// bit (docs/ops.md).
//
// Execution: every op runs synchronously on the calling thread (backend.h).
// Account() does nothing. Registers itself for DeviceKind::kCpu when its
// library is loaded (cpu_backend.cc; //runtime/ops:cpu is alwayslink).
//
// Thread safety: stateless apart from the GEMM libraries' thread settings,
// oneDNN's per-shape primitive cache (mutex-guarded) and each thread's own
// f32 scratch (thread_local, kept for the thread's life: a few rows, one
// sequence's q/k/v, and of a 16-bit GEMM a block of at most 2^20 elements
// of C and, where its operands are widened to the f32 GEMM, a block of A
// and a panel of B of at most 2^22 elements each, or 64 rows or columns
// where k is longer than 65536); safe from any thread.
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

// For tests of the blocked 16-bit GEMM: sets how many elements of C the CPU
// backend computes per f32 block (a widened A block or B panel: 4x that;
// default 2^20; at least 1) and returns the previous value. Not to be
// called while GEMMs run.
int64_t SetCpuGemmBlockElementsForTest(int64_t elements);

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CPU_CPU_BACKEND_H_
