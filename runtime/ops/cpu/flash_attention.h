// Attention in linear memory on the CPU, in f32 (ops.h:
// FlashAttentionForward/Backward; the dispatcher stages 16-bit operands):
// FlashAttention-2's blocking written plainly, for correctness over speed.
// Forward walks key blocks of kFlashKeyBlock with a running max and sum per
// query row and keeps only the output and lse; backward recomputes each
// block's probabilities from q, k and lse. Nothing of size q_len x kv_len is
// ever held: per (sequence, head) a block of scores and the f32 workspace
// the op layer hands over.
//
// q and out are [batch * q_len, ld] row views with head h in columns
// [h * head_dim, (h + 1) * head_dim); k, v likewise with kv_len rows per
// sequence. lse is [batch, heads, q_len].
//
// Thread safety: pure functions of their arguments.
#ifndef SHARDKIT_RUNTIME_OPS_CPU_FLASH_ATTENTION_H_
#define SHARDKIT_RUNTIME_OPS_CPU_FLASH_ATTENTION_H_

#include <cstdint>

#include "runtime/ops/backend.h"

namespace sk {

// Keys per block of the online softmax (and of backward's recomputation).
inline constexpr int64_t kFlashKeyBlock = 64;

void FlashAttentionForward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                           const float* k, int64_t ldk, const float* v, int64_t ldv, float* out,
                           int64_t ldo, float* lse);

// `workspace`: f32[ops::FlashAttentionBackwardWorkspaceElements(s)]: delta
// [batch, heads, q_len] then the dQ accumulator [batch, heads, q_len,
// head_dim]. Overwrites dq, dk and dv.
void FlashAttentionBackward(const ops::AttentionShape& s, const float* q, int64_t ldq,
                            const float* k, int64_t ldk, const float* v, int64_t ldv,
                            const float* out, int64_t ldo, const float* dout, int64_t lddo,
                            const float* lse, float* dq, int64_t lddq, float* dk, int64_t lddk,
                            float* dv, int64_t lddv, float* workspace);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_CPU_FLASH_ATTENTION_H_
