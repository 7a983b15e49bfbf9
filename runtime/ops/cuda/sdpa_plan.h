// What the CUDA backend asks of cuDNN's fused scaled-dot-product attention
// for one call of flash_attention_fwd/bwd (ops.h), decided on the host
// without a GPU or cuDNN so that it is tested everywhere: whether the call
// is one cuDNN's fused SDPA takes (else the reason, which the backend logs
// before running the composed attention instead), the 4-D dims and strides
// of each operand as cuDNN's graph reads them, and the key under which the
// built graph is cached.
//
// Layout: q of AttentionShape s is [batch * q_len, ld] rows with head h in
// columns [h * head_dim, (h + 1) * head_dim), so as a [batch, heads, seq,
// head_dim] tensor its strides are {q_len * ld, head_dim, ld, 1} (cuDNN's
// "BSHD" layout with a row stride: a fused qkv buffer is read in place).
// lse (cuDNN's Stats) is [batch, heads, q_len, 1], dense. k, v, dk and dv
// have s.KvHeads() heads (grouped-query attention, as cuDNN takes it).
//
// Thread safety: pure functions.
#ifndef SHARDKIT_RUNTIME_OPS_CUDA_SDPA_PLAN_H_
#define SHARDKIT_RUNTIME_OPS_CUDA_SDPA_PLAN_H_

#include <array>
#include <initializer_list>
#include <cstdint>
#include <string>

#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/ops/backend.h"

namespace sk::ops::cuda {

// Head dimensions cuDNN 9's fused SDPA runs (forward and backward) on
// sm80/sm90: multiples of 8 up to 128. Larger ones exist on some GPUs and
// versions only; they take the composed path rather than a failed build.
inline constexpr int64_t kSdpaMaxHeadDim = 128;
// cuDNN reads operands with 16-byte vector loads: row strides and base
// addresses must be multiples of 16 bytes.
inline constexpr int64_t kSdpaAlignmentBytes = 16;

struct SdpaTensorLayout {
  std::array<int64_t, 4> dim{};
  std::array<int64_t, 4> stride{};
};

// One operand: its row stride (MatrixRef::ld, elements) and its first
// element's address modulo kSdpaAlignmentBytes (0 when aligned).
struct SdpaOperand {
  int64_t ld = 0;
  int64_t misalignment = 0;
};

struct SdpaPlan {
  bool backward = false;
  DType dtype = DType::kBF16;
  AttentionShape shape;
  float scale = 0;  // 1 / sqrt(head_dim)
  SdpaTensorLayout q, k, v, o, stats;
  SdpaTensorLayout dout, dq, dk, dv;  // backward only

  // Distinct for calls that need distinct graphs (direction, dtype, every
  // dim and stride, causality), equal for those one graph can execute.
  std::string CacheKey() const;
};

// OK when cuDNN's fused SDPA can run the call; otherwise FailedPrecondition
// naming the first reason ("head_dim 72 is not a multiple of 8"). `ops`
// lists the operands: forward q, k, v, out; backward q, k, v, out, dout,
// dq, dk, dv. Empty shapes (any of batch, heads, q_len, kv_len zero) are
// not SDPA's: they have nothing or zeros to write. Nor are packed documents
// (s.key_start defined): the composed attention masks them.
Status SdpaSupports(const AttentionShape& s, DType t, std::initializer_list<SdpaOperand> ops);

// The layouts of a forward (q, k, v, out) or backward (also dout, dq, dk,
// dv) call; `ld` lists the operands' row strides in that order.
SdpaPlan MakeSdpaForwardPlan(const AttentionShape& s, DType t, std::array<int64_t, 4> ld);
SdpaPlan MakeSdpaBackwardPlan(const AttentionShape& s, DType t, std::array<int64_t, 8> ld);

}  // namespace sk::ops::cuda

#endif  // SHARDKIT_RUNTIME_OPS_CUDA_SDPA_PLAN_H_
