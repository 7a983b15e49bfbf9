// The CPU op backend: the kernels of runtime/ops/cpu/kernels.h behind the
// OpBackend table (oneDNN GEMM, with OpenBLAS selectable for measurement; the
// bf16 GEMM on oneDNN's matmul; plain loops for everything else).
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

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CPU_CPU_BACKEND_H_
