// The fused classifier: a language model's output projection, softmax
// cross-entropy and, for training, the gradient of both, computed a chunk
// of rows (tokens) at a time.
//
// The unfused head materialises the logits of every token, [rows, vocab]
// (GPT-2's 50257 columns: 0.77 GiB in bf16 for 8 x 1024 tokens), keeps them
// from the forward to the backward as their gradient, and only then runs
// the two backward GEMMs. Fused, one chunk's logits exist at a time: the
// GEMM writes them, CrossEntropyRowLosses stores each row's loss, and with
// gradients CrossEntropyBackward overwrites them with dlogits, which the two
// backward GEMMs consume at once: dx rows for the chunk, and the weight's
// gradient accumulated over the chunks (beta = 1). The loss is the mean of
// the stored row losses (CrossEntropyMean), so it equals the unfused
// CrossEntropyForward's bit for bit; dx rows are the same GEMM over fewer
// rows; only dw's sum over rows is split into the chunks' partial GEMMs
// (summation order: the f32 rounding of a sum in parts).
//
// Everything runs through the ops of ops.h on ctx's stream and allocator,
// so every backend runs it (the simulator prices each op from its declared
// cost and counts the chunk's memory as its allocator holds it) and
// ClassifierWorkspaceBytes says what it allocates.
#ifndef SHARDKIT_RUNTIME_OPS_CLASSIFIER_H_
#define SHARDKIT_RUNTIME_OPS_CLASSIFIER_H_

#include <cstdint>

#include "runtime/ops/ops.h"

namespace sk::ops {

struct ClassifierShape {
  int64_t rows = 0;
  int64_t d_model = 0;
  int64_t vocab = 0;
  // The weight is [vocab, d_model] (a head tied to the token embedding:
  // logits = x w^T) instead of [d_model, vocab].
  bool transposed_weight = false;
  // Rows per chunk; 0: ClassifierChunkRows(rows, d_model, vocab).
  int64_t chunk_rows = 0;
};

// The fewest rows a default chunk has. Smaller chunks make the chunk's dx
// GEMM ([chunk, d_model] = dlogits w^T, k = vocab) too few output tiles to
// fill a GPU: with 256 x 128 tiles on 132 SMs (the H100/H200 profiles'
// GemmShapeEfficiency), 4096 rows give 128 tiles from d_model 1024. With
// Liger-Kernel's chunks alone the simulator priced t5-611m's step (128-row
// chunks) 22% slower and gpt-1.3b's (512 rows) 0.5% slower than the
// unfused head.
inline constexpr int64_t kMinClassifierChunkRows = 4096;

// The default chunk: the rows split into ceil(vocab / d_model) parts, each
// rounded up to a power of two (Liger-Kernel's fused linear cross-entropy
// rule: a chunk's logits about as many elements as x), but at least
// kMinClassifierChunkRows; at most `rows`, at least 1.
int64_t ClassifierChunkRows(int64_t rows, int64_t d_model, int64_t vocab);

// Bytes the classifier allocates from ctx.alloc while it runs, besides its
// outputs: the row losses (rows f32) and one chunk of logits (chunk x vocab
// in x's dtype), and a copy of the weight in x's dtype when the weight's
// dtype differs (`weight` its dtype).
int64_t ClassifierWorkspaceBytes(const ClassifierShape& s, DType x, DType weight);

// loss (f32, one element) = the mean over the rows whose target is not
// kIgnoreTarget of -log softmax(x w)[target] (CrossEntropyForward's value,
// bit for bit), with x [rows, d_model] in the compute dtype, w as the shape
// says (any float dtype: cast to x's for the GEMMs) and targets [rows] i32.
// With dx defined (x's dtype, [rows, d_model], overwritten) also the
// gradient: dlogits = CrossEntropyBackward's with scale `grad_scale`, the
// factor per counted row (finite and > 0; 1 / the number of counted rows
// for the mean loss: a chunk cannot count the other chunks' rows, so the
// caller, who has the targets on the host, says), dx = dlogits w^T and
// dw += x^T dlogits (w^T's layout for a transposed weight; dw: w's shape,
// f32 or x's dtype; required with dx).
Status Classifier(const OpContext& ctx, const ClassifierShape& s, const Tensor& x,
                  const Tensor& w, const Tensor& targets, const Tensor& loss,
                  const Tensor& dx = Tensor(), const Tensor& dw = Tensor(),
                  float grad_scale = 0.0f);

}  // namespace sk::ops

#endif  // SHARDKIT_RUNTIME_OPS_CLASSIFIER_H_
