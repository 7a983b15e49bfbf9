// A GPT-style decoder (minGPT / GPT-2 shape): token + learned position
// embeddings, n_layer pre-LayerNorm blocks of causal self-attention and a
// GELU MLP (d_ff = 4 d_model by default), a final LayerNorm and an LM head,
// untied or (tie_word_embeddings, as GPT-2) tied to the token embedding.
//
// Units, in execution order:
//   0            "embed"   wte [vocab, d], wpe [max_seq_len, d]
//   1..n_layer   "h.<i>"   attn.{ln.g, ln.b, qkv.w, qkv.b, proj.w, proj.b},
//                          mlp.{ln.g, ln.b, fc.w, fc.b, proj.w, proj.b}
//   n_layer + 1  "head"    ln.g, ln.b, lm_head.w [d, vocab]; tied: no lm_head.w
//                          of its own, embed.wte as a tied parameter
//                          (UnitSpec::tied, model.h), logits = x wte^T
// Initialisation follows GPT-2:
// normal(0, 0.02), residual output projections normal(0, 0.02 / sqrt(2 L)).
#ifndef SHARDKIT_RUNTIME_NN_GPT_H_
#define SHARDKIT_RUNTIME_NN_GPT_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/configured_model.h"
#include "runtime/nn/model.h"
#include "runtime/nn/transformer.h"

namespace sk {

struct GptConfig {
  std::string name = "gpt";
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;  // 0 means 4 * d_model
  // The LM head is the token embedding (GPT-2's weight tying): one
  // parameter, embed.wte, used by the embed and head units.
  bool tie_word_embeddings = false;

  // InvalidArgument naming the field when a size is not positive, d_model is
  // not a multiple of n_head, or the vocabulary does not fit int32 ids.
  Status Validate() const;
  int64_t ff() const { return d_ff > 0 ? d_ff : 4 * d_model; }
};

class GptModel final : public ConfiguredModel<GptConfig> {
 public:
  static StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config,
                                                    const ModelOptions& options = {});

  // inputs and targets [batch_size, seq_len] with 1 <= seq_len <= max_seq_len;
  // no source.
  Status ValidateBatch(const TokenBatch& batch) const override;
  StepFlops Flops(int64_t batch_size, int64_t seq_len, int64_t source_len) const override;
  int64_t PeakActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                              DeviceKind device) const override;
  int64_t BackwardEndActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                                     DeviceKind device) const override;
  int64_t BetweenBackwardsActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                                          DeviceKind device) const override;
  int64_t PackedAttentionTemporaryBytes(int64_t batch_size, int64_t seq_len,
                                        DeviceKind device) const override;

 private:
  GptModel(const GptConfig& config, const ModelOptions& options);
  StatusOr<float> Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                      bool backward) const override;
  // What one block keeps from its forward to its backward, and what the
  // forward keeps in all (the activation counts' common part: gpt.cc).
  int64_t SavedPerBlockBytes(const nn_internal::BlockDims& d, DeviceKind device) const;
  int64_t KeptActivationBytes(const nn_internal::BlockDims& d, DeviceKind device) const;

  nn_internal::TransformerBlock block_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_GPT_H_
