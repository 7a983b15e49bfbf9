// The op layer's backend interface: the context every op call carries, the
// argument types of the ops, and the per-device-kind implementation table.
//
// Callers use the functions of ops.h, never a backend directly: the
// dispatcher there validates arguments (a clear InvalidArgument naming the op
// and operand), computes the op's OpCost (cost.h), calls Account() on the
// backend of ctx.device's kind and then, if the backend executes(), the
// backend's method. A backend method may therefore assume validated
// arguments: shapes consistent, tensors defined, on ctx's device kind (Copy:
// one side may be host memory), dtypes among those the op accepts.
//
// Registration: a backend registers itself for a DeviceKind
// (RegisterOpBackend), so the dispatcher names no backend: the CPU and CUDA
// backends from a static registration object in their own libraries
// (//runtime/ops:cpu, :cuda, alwayslink; //runtime/ops links them, so the
// CPU backend is registered before main), the simulator (//runtime/sim)
// when its first device is made. The registry is registry.cc, in
// //runtime/ops:backend.
//
// Execution contract per kind (docs/ops.md):
// - cpu: the op runs synchronously on the calling thread, which must be the
//   thread that plays ctx.stream (the model's compute thread or a closure on
//   that stream's worker); ctx.stream may be null (the calling thread).
// - cuda: the op is enqueued on ctx.stream; results are ready in stream order.
// - sim: executes() is false; Account() prices the op on ctx.stream's virtual
//   clock and nothing runs (tensors there have no data).
//
// Thread safety: a backend is shared by every thread of the process: its
// methods must be safe to call concurrently on distinct operands.
#ifndef SHARDKIT_RUNTIME_OPS_BACKEND_H_
#define SHARDKIT_RUNTIME_OPS_BACKEND_H_

#include <cstdint>
#include <string_view>

#include "runtime/core/allocator.h"
#include "runtime/core/device_kind.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/device/device.h"
#include "runtime/ops/cost.h"
#include "runtime/ops/init.h"
#include "runtime/ops/rope_scaling.h"
#include "runtime/ops/update_rules.h"

namespace sk::ops {

// Where an op runs and where its temporaries come from. `device` and `alloc`
// are required for every op; `stream` is required except on cpu. The
// allocator must be on ctx.device (temporaries such as attention's score
// gradients come from it, so a caching allocator's stats cover them).
struct OpContext {
  Device* device = nullptr;
  Stream* stream = nullptr;
  Allocator* alloc = nullptr;
};

// The target id that leaves a row out of the cross-entropy loss.
inline constexpr int32_t kIgnoreTarget = -1;

// A row-major matrix (or a batch of them) inside a tensor: element (i, j) of
// matrix b is element offset + b * batch_stride + i * ld + j of `t`. The
// op's dimensions say how many rows and columns are meant; ld >= columns.
// Fused projections pass views into one buffer (q, k, v of a [rows, 3c] qkv).
struct MatrixRef {
  Tensor t;
  int64_t offset = 0;        // elements
  int64_t ld = 0;            // row stride, elements
  int64_t batch_stride = 0;  // elements between consecutive matrices (batch > 1)
};

// C = alpha op(A) op(B) + beta C for each of `batch` matrices: op(A) is m x k,
// op(B) is k x n, C is m x n (stored as given by the MatrixRefs; a transposed
// operand is stored k x m or n x k).
struct GemmParams {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// Multi-head scaled dot-product attention over `batch` sequences. q is
// [batch * q_len, heads * head_dim] (head h in columns [h*head_dim,
// (h+1)*head_dim)); k and v have kv_len rows per sequence and kv_heads()
// heads. causal masks key j > query i and requires q_len == kv_len.
//
// Grouped-query attention (Ainslie et al. 2023; Llama 2 70B, Llama 3):
// kv_heads > 0 and dividing heads gives k and v kv_heads heads, query head h
// attending with key/value head h / (heads / kv_heads). Only the
// linear-memory attention (FlashAttentionForward/Backward) takes it; the
// composed AttentionForward/Backward require kv_heads() == heads.
struct AttentionShape {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t head_dim = 0;
  bool causal = false;
  int64_t kv_heads = 0;  // 0: heads (multi-head attention)
  // Packed documents (block-diagonal causal attention; causal only).
  // Undefined: none. Else an i32 tensor [batch * q_len] on the op's device:
  // query i of sequence b attends keys [key_start[b * q_len + i], i], the
  // earlier positions of its own document. Values in [0, i] and
  // non-decreasing along a sequence (documents are contiguous); the caller
  // guarantees it (a device's memory is not read by the op's checks; the
  // CPU clamps into [0, i]). A backend that cannot honour it refuses the
  // call (Unimplemented), never ignores it.
  Tensor key_start;
  // With key_start: the (query, key) pairs it leaves per head, summed over
  // the sequences (the sum over queries of i - key_start + 1), in
  // [batch * q_len, batch * q_len (q_len + 1) / 2]: what the linear-memory
  // attention's cost counts (cost.h: FlashAttentionScorePairs), set where
  // the values are known on the host (the models, from a batch's segment
  // ids). 0 without key_start.
  int64_t masked_pairs = 0;

  int64_t KvHeads() const { return kv_heads > 0 ? kv_heads : heads; }
  // Query heads per key/value head (1 without grouping).
  int64_t Group() const { return KvHeads() > 0 ? heads / KvHeads() : 1; }
};

// One virtual method per op (ops.h documents each). The defaults return
// Unimplemented naming the op and the backend, so a backend that does not
// execute (the simulator) implements only Account().
// The key length from which the CPU's linear-memory attention
// (cpu/flash_attention.h: FlashAttention-2 on LIBXSMM's small GEMMs) is at
// least as fast as its composed attention in forward and in backward
// (benchmarks/micro/kernels.cc: BM_AttentionLongSequence, causal, one thread,
// process CPU time on this repository's 2-core AVX2 EPYC, 27 Nov 2026,
// docs/benchmarks.md: 12 heads of 64, forward 0.52-0.73x the composed
// one's time from T = 512 on, backward 0.88x, 0.80x, 0.59x at T = 1024,
// 2048, 4096 but 1.13x and 1.23x at T = 512 and 768, where recomputing P
// costs more than reading the kept one; 2 heads of 16: backward 0.91x and
// 0.85x at 1024 and 2048). Every dtype: 16-bit operands are staged to f32
// for both.
inline constexpr int64_t kCpuFlashAttentionMinKeys = 1024;

// The CPU backend's PrefersFlashAttention, which the simulator's copies so
// that a simulated run allocates what a CPU run does.
inline bool CpuPrefersFlashAttention(const AttentionShape& s) {
  return s.kv_len >= kCpuFlashAttentionMinKeys;
}

class OpBackend {
 public:
  virtual ~OpBackend() = default;

  // "cpu", "cuda", "sim".
  virtual const char* name() const = 0;
  // False for a backend that only prices ops (the simulator); the dispatcher
  // then calls Account() and nothing else.
  virtual bool executes() const = 0;
  // Called by the dispatcher for EVERY op, before executing it, with the
  // cost computed from the op's shapes. An error stops the op (and is its
  // result). Default: nothing.
  virtual Status Account(const OpContext& ctx, const OpCost& cost);

  virtual Status Gemm(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                      const MatrixRef& b, const MatrixRef& c);
  // Whether Gemm(p, ...) stores a C in A's 16-bit dtype itself (f32
  // accumulation, one rounding). When false (the default) the dispatcher
  // hands Gemm an f32 C and rounds it into the caller's C.
  virtual bool GemmStores16Bit(const GemmParams& p) const;
  // Whether GemmBias(p, ...) with these dtypes (A/B, bias, C) is one kernel
  // here. When false (the default) the dispatcher runs ops::GemmBias as
  // BroadcastRows then Gemm with beta = 1, pricing and executing two ops.
  virtual bool GemmAddsBias(const GemmParams& p, DType ab, DType bias, DType c) const;
  // C = alpha op(A) op(B) + bias (ops.h: GemmBias), called only where
  // GemmAddsBias said true, with the caller's tensors.
  virtual Status GemmBias(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                          const MatrixRef& b, const Tensor& bias, const MatrixRef& c);
  // Whether GemmBiasResidual(p, ...) with these dtypes (A/B, bias, residual,
  // C) is one kernel here. When false (the default) the dispatcher runs
  // ops::GemmBiasResidual as the ops it is defined by (GemmBias, Axpy and,
  // for a 16-bit C, Cast through an f32 temporary), pricing and executing
  // each.
  virtual bool GemmAddsResidual(const GemmParams& p, DType ab, DType bias, DType residual,
                                DType c) const;
  // C = alpha op(A) op(B) + bias + residual (ops.h: GemmBiasResidual),
  // called only where GemmAddsResidual said true, with the caller's tensors.
  virtual Status GemmBiasResidual(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                                  const MatrixRef& b, const Tensor& bias, const Tensor& residual,
                                  const MatrixRef& c);
  // Whether GemmBiasGelu and GemmGeluBackward(p, ...) with these dtypes
  // (A/B, bias -- the forward's; the backward passes C's --, pre, C) are one
  // kernel each here. When false (the default) the dispatcher runs them as
  // the ops they are defined by (GemmBias then GeluForward; Gemm then
  // GeluBackward), pricing and executing each.
  virtual bool GemmFusesGelu(const GemmParams& p, DType ab, DType bias, DType pre, DType c) const;
  // pre = alpha op(A) op(B) + bias, out = gelu(pre) (ops.h: GemmBiasGelu),
  // called only where GemmFusesGelu said true, with the caller's tensors.
  virtual Status GemmBiasGelu(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                              const MatrixRef& b, const Tensor& bias, const Tensor& pre,
                              const Tensor& out);
  // C = (alpha op(A) op(B)) * gelu'(pre) (ops.h: GemmGeluBackward), called
  // only where GemmFusesGelu said true.
  virtual Status GemmGeluBackward(const OpContext& ctx, const GemmParams& p, const MatrixRef& a,
                                  const MatrixRef& b, const Tensor& pre, const MatrixRef& c);
  // Whether this backend's method for the op named `op` (its OpCost name:
  // "bias_add", "gelu_fwd", "layer_norm_bwd", "attention_fwd", ...) reads
  // and writes bf16/f16 compute-dtype operands itself. When false (the
  // default) the dispatcher widens every 16-bit operand of that op into an
  // f32 temporary and narrows the written ones back (dispatch.h: F32Staging),
  // so the method sees f32 tensors only. When true the method receives the
  // caller's tensors in their own dtypes, any mix of f32/bf16/f16 the op
  // accepts, and must give what the staged op gives: each operand read
  // exactly, f32 arithmetic, each 16-bit output rounded once -- except for
  // attention, which is handed 16-bit operands only when q, k, v, out (and
  // backward's dout, dq, dk, dv) all share one 16-bit dtype (other mixes
  // are staged) and may round where its backend's header says. Default:
  // false for every op. Must not depend on anything but `op`.
  virtual bool Native16Bit(std::string_view op) const;
  // True for every op the dispatcher stages when a backend's Native16Bit
  // says false (the model ops: broadcast_rows, bias, GELU, LayerNorm,
  // attention, embedding, cross-entropy, RMSNorm, RoPE, SwiGLU, forward and
  // backward): a backend
  // that takes all of their 16-bit operands itself returns this. The
  // linear-memory attention (flash_attention_fwd/bwd) is staged too but is
  // not in this list: a backend opts into its 16-bit operands by name.
  static bool IsStagedModelOp(std::string_view op);
  virtual Status Copy(const OpContext& ctx, const Tensor& src, const Tensor& dst);
  virtual Status Cast(const OpContext& ctx, const Tensor& src, const Tensor& dst);
  virtual Status RoundToDType(const OpContext& ctx, const Tensor& x, DType t);
  virtual Status Scale(const OpContext& ctx, const Tensor& x, float alpha);
  virtual Status Axpy(const OpContext& ctx, float alpha, const Tensor& x, const Tensor& y);
  virtual Status Fill(const OpContext& ctx, const Tensor& x, float value);
  virtual Status InitPhilox(const OpContext& ctx, const Initializer& init, uint64_t seed,
                            uint64_t param_id, int64_t begin, const Tensor& out);
  virtual Status BroadcastRows(const OpContext& ctx, const Tensor& src, const Tensor& dst);
  virtual Status BiasAdd(const OpContext& ctx, const Tensor& bias, const Tensor& y);
  virtual Status BiasGrad(const OpContext& ctx, const Tensor& dy, const Tensor& dbias);
  virtual Status GeluForward(const OpContext& ctx, const Tensor& x, const Tensor& y);
  virtual Status GeluBackward(const OpContext& ctx, const Tensor& x, const Tensor& dy,
                              const Tensor& dx);
  virtual Status LayerNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, const Tensor& y, const Tensor& mean,
                                  const Tensor& rstd);
  virtual Status LayerNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta);
  virtual Status RmsNormForward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                                float eps, const Tensor& y, const Tensor& rstd);
  virtual Status RmsNormBackward(const OpContext& ctx, const Tensor& x, const Tensor& gamma,
                                 const Tensor& dy, const Tensor& rstd, const Tensor& dx,
                                 const Tensor& dgamma);
  // inverse: the backward (rotation by minus the angle). positions: i32
  // per row, or undefined (row % seq_len).
  virtual Status Rope(const OpContext& ctx, const Tensor& x, int64_t seq_len, int64_t heads,
                      int64_t head_dim, float theta, const RopeScaling& scaling, bool inverse,
                      const Tensor& y, const Tensor& positions);
  virtual Status SwiGluForward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                               const Tensor& y);
  virtual Status SwiGluBackward(const OpContext& ctx, const Tensor& gate, const Tensor& up,
                                const Tensor& dy, const Tensor& dgate, const Tensor& dup);
  virtual Status AttentionForward(const OpContext& ctx, const AttentionShape& s,
                                  const MatrixRef& q, const MatrixRef& k, const MatrixRef& v,
                                  const Tensor& probs, const MatrixRef& out);
  // `scratch`: the op's workspace, f32[AttentionBackwardScratchElements(s)]
  // from ctx.alloc, allocated by the dispatcher so that every backend (the
  // simulator included) holds the same bytes; its contents are undefined.
  virtual Status AttentionBackward(const OpContext& ctx, const AttentionShape& s,
                                   const MatrixRef& q, const MatrixRef& k, const MatrixRef& v,
                                   const Tensor& probs, const MatrixRef& dout,
                                   const MatrixRef& dq, const MatrixRef& dk,
                                   const MatrixRef& dv, const Tensor& scratch);
  // Whether a model should run attention on `s` in dtype t (q, k, v, out
  // all t; row strides and starts 16-byte aligned) as
  // FlashAttentionForward/Backward rather than the composed
  // AttentionForward/Backward here: the op runs as one fused kernel, not
  // through a temporary of the probabilities, and is not the slower one.
  // Default: false. cuda: where cuDNN's SDPA takes the call; cpu, and the
  // simulator (whose memory is a CPU run's): from kCpuFlashAttentionMinKeys
  // keys (CpuPrefersFlashAttention).
  virtual bool PrefersFlashAttention(const AttentionShape& s, DType t) const;
  virtual Status FlashAttentionForward(const OpContext& ctx, const AttentionShape& s,
                                       const MatrixRef& q, const MatrixRef& k, const MatrixRef& v,
                                       const MatrixRef& out, const Tensor& lse);
  // `workspace`: f32[FlashAttentionBackwardWorkspaceElements(s)] from
  // ctx.alloc (the dispatcher's, as for AttentionBackward); contents undefined.
  virtual Status FlashAttentionBackward(const OpContext& ctx, const AttentionShape& s,
                                        const MatrixRef& q, const MatrixRef& k,
                                        const MatrixRef& v, const MatrixRef& out,
                                        const MatrixRef& dout, const Tensor& lse,
                                        const MatrixRef& dq, const MatrixRef& dk,
                                        const MatrixRef& dv, const Tensor& workspace);
  virtual Status EmbeddingForward(const OpContext& ctx, const Tensor& table, const Tensor& ids,
                                  const Tensor& out);
  virtual Status EmbeddingBackward(const OpContext& ctx, const Tensor& ids, const Tensor& dout,
                                   const Tensor& dtable);
  virtual Status CrossEntropyForward(const OpContext& ctx, const Tensor& logits,
                                     const Tensor& targets, const Tensor& loss);
  // scale: ops.h's (> 0: the factor per counted row; 0: 1 / count).
  virtual Status CrossEntropyBackward(const OpContext& ctx, const Tensor& logits,
                                      const Tensor& targets, const Tensor& dlogits, float scale);
  // ops.h's CrossEntropyRowLosses and CrossEntropyMean: together exactly
  // what this backend's CrossEntropyForward computes.
  virtual Status CrossEntropyRowLosses(const OpContext& ctx, const Tensor& logits,
                                       const Tensor& targets, const Tensor& row_loss);
  virtual Status CrossEntropyMean(const OpContext& ctx, const Tensor& row_loss,
                                  const Tensor& targets, const Tensor& loss);
  virtual Status SumOfSquares(const OpContext& ctx, const Tensor& x, const Tensor& acc);
  virtual Status MaxAbs(const OpContext& ctx, const Tensor& x, const Tensor& acc);
  virtual Status SgdUpdate(const OpContext& ctx, const SgdHyper& h, const Tensor& param,
                           const Tensor& grad, const Tensor& momentum);
  virtual Status AdamUpdate(const OpContext& ctx, const AdamHyper& h, const Tensor& param,
                            const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq);
  virtual StatusOr<double> ReadScalar(const OpContext& ctx, const Tensor& t);
  // out[0 .. t.numel()) = t's values (ops::ReadValues checked the arguments).
  virtual Status ReadValues(const OpContext& ctx, const Tensor& t, double* out);

 protected:
  // Unimplemented("<op> is not implemented by the <name> op backend").
  Status NotImplemented(const char* op) const;
};

// Makes `backend` the table for `kind`, replacing any earlier one (nullptr
// unregisters). The backend must outlive every op call on that kind.
// Thread-safe; registration normally happens once, before any op runs.
void RegisterOpBackend(DeviceKind kind, OpBackend* backend);

// The table for `kind`, or nullptr when none is registered. kCpu has one in
// every binary that links //runtime/ops (its backend registers before main).
OpBackend* BackendFor(DeviceKind kind);

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_BACKEND_H_
