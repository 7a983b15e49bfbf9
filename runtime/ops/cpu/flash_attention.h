// Attention in linear memory on the CPU, in f32 (ops.h:
// FlashAttentionForward/Backward; the dispatcher stages 16-bit operands):
// FlashAttention-2 (Dao 2023) over blocks of kFlashQueryBlock queries and
// kFlashKeyBlock keys, each block's scores and products on LIBXSMM's small
// GEMMs (small_gemm.h) on operands packed contiguous per unit (K^T and V^T
// in key-block panels, Q and dO per head) and its exponentials vectorised
// (simd.h). Forward keeps a running max and sum per query row and writes
// only the output and lse; backward recomputes each block's probabilities
// from q, k and lse. Nothing of size q_len x kv_len is ever held: per thread, copies of
// one unit's K and V (backward: also K^T, V^T, dK, dV and one query head's
// Q and dO), a block of scores and the f32 workspace the op layer hands
// over.
//
// q and out are [batch * q_len, ld] row views with head h in columns
// [h * head_dim, (h + 1) * head_dim); k, v likewise with kv_len rows per
// sequence and s.KvHeads() heads (grouped-query attention: query head h
// reads key/value head h / s.Group()). lse is [batch, heads, q_len].
//
// Work is split into units (sequence b, key/value head kh) = b *
// s.KvHeads() + kh, each covering that head's group of query heads; a call
// computes units [unit_begin, unit_end), so disjoint ranges may run on
// several threads (their outputs, lse rows and workspace rows are
// disjoint). Each unit's result does not depend on the split.
//
// Thread safety: pure functions of their arguments (per-thread scratch).
#ifndef SHARDKIT_RUNTIME_OPS_CPU_FLASH_ATTENTION_H_
#define SHARDKIT_RUNTIME_OPS_CPU_FLASH_ATTENTION_H_

#include <cstdint>

#include "runtime/ops/backend.h"

namespace sk {

// Queries and keys per block of the online softmax (and of backward's
// recomputation). 64 x 64 on packed operands: every block GEMM runs at
// 80-90 GFLOP/s on one core of this repository's 2-core AVX2 EPYC (LIBXSMM,
// 32..128 x 64..256 blocks all did), and the smaller causal diagonal wastes
// less than 64 x 128 or 128 x 128 did; those and 32 x 128, 128 x 64 were
// 2-15% slower in backward at T = 1024 and 2048 (benchmarks/micro/kernels.cc:
// BM_AttentionLongSequence, 12 heads of 64, process CPU time).
inline constexpr int64_t kFlashQueryBlock = 64;
inline constexpr int64_t kFlashKeyBlock = 64;

// The number of units of s: batch * KvHeads().
int64_t FlashAttentionUnits(const ops::AttentionShape& s);

// key_start: packed documents (ops::AttentionShape::key_start's values on
// the host, [batch * q_len], read here instead of the shape's tensor), or
// nullptr: query i attends keys [key_start[b * q_len + i], i], the value
// clamped into [0, i]; key blocks that no query of a block attends are
// skipped in both passes.
void FlashAttentionForward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                           const float* k, int64_t ldk, const float* v, int64_t ldv, float* out,
                           int64_t ldo, float* lse, int64_t unit_begin, int64_t unit_end,
                           const int32_t* key_start = nullptr);

// `workspace`: f32[ops::FlashAttentionBackwardWorkspaceElements(s)]: delta
// [batch, heads, q_len] then the dQ accumulator [batch, heads, q_len,
// head_dim]. Overwrites dq, dk and dv.
void FlashAttentionBackward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                            const float* k, int64_t ldk, const float* v, int64_t ldv,
                            const float* out, int64_t ldo, const float* dout, int64_t lddo,
                            const float* lse, float* dq, int64_t lddq, float* dk, int64_t lddk,
                            float* dv, int64_t lddv, float* workspace, int64_t unit_begin,
                            int64_t unit_end, const int32_t* key_start = nullptr);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_CPU_FLASH_ATTENTION_H_
