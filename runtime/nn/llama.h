// A Llama-family decoder (Llama 2/3, Qwen2, Mistral without sliding
// windows): token embedding, n_layer pre-RMSNorm blocks of grouped-query
// causal self-attention with rotary position embeddings (Hugging Face's
// rotate-half layout) and a SwiGLU MLP, a final RMSNorm and an LM head. No
// biases, except q/k/v biases with qkv_bias (Qwen2). Attention runs in
// linear memory on every device (ops.h: FlashAttentionForward, with
// kv heads dividing the query heads).
//
// Units, in execution order (names close to transformers' LlamaForCausalLM,
// "model.layers.<i>.self_attn.q_proj.weight" -> "layers.<i>" /
// "self_attn.q_proj.w"; our linear weights are [in, out], the transpose of
// torch.nn.Linear's [out, in]):
//   0            "embed"       embed_tokens.w [vocab, d]
//   1..n_layer   "layers.<i>"  input_layernorm.g [d],
//                              self_attn.{q_proj.w [d, H hd], (q_proj.b [H hd]),
//                                         k_proj.w [d, KV hd], (k_proj.b),
//                                         v_proj.w [d, KV hd], (v_proj.b),
//                                         o_proj.w [H hd, d]},
//                              post_attention_layernorm.g [d],
//                              mlp.{gate_proj.w [d, F], up_proj.w [d, F], down_proj.w [F, d]}
//   n_layer + 1  "head"        norm.g [d], lm_head.w [d, vocab]; with
//                              tie_word_embeddings no lm_head.w of its own but
//                              embed.embed_tokens.w as a tied parameter
//                              (UnitSpec::tied, model.h; "lm_head.w",
//                              [vocab, d]), logits = x embed_tokens^T
// (H heads, KV kv heads, hd = d / H, F = d_ff.) Initialisation as
// transformers': linear weights and the embedding normal(0, 0.02), biases
// zero, RMSNorm gains one.
#ifndef SHARDKIT_RUNTIME_NN_LLAMA_H_
#define SHARDKIT_RUNTIME_NN_LLAMA_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/configured_model.h"
#include "runtime/nn/model.h"
#include "runtime/nn/model_common.h"
#include "runtime/ops/rope_scaling.h"

namespace sk {

struct LlamaConfig {
  std::string name = "llama";
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;  // 0 means n_head (no grouping)
  int64_t d_model = 0;
  int64_t d_ff = 0;        // the SwiGLU's hidden width (intermediate_size)
  float rope_theta = 10000.0f;
  // Rotary frequencies rescaled for long contexts (Llama 3.1 and 3.2:
  // llama3; runtime/ops/rope_scaling.h). Default: none.
  RopeScaling rope_scaling;
  float rms_norm_eps = 1e-5f;
  bool qkv_bias = false;        // Qwen2: biases on q, k and v
  bool tie_word_embeddings = false;  // the LM head is the token embedding (Llama 3.2, Qwen2-0.5B)

  // InvalidArgument naming the field: sizes not positive, d_model not a
  // multiple of n_head, an odd head_dim (RoPE rotates pairs), n_kv_head not
  // dividing n_head, theta or eps not positive, a vocabulary beyond int32,
  // a rope_scaling the RoPE op refuses (ops.h: ValidateRopeScaling).
  Status Validate() const;
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_dim() const { return d_model / n_head; }
};

class LlamaModel final : public ConfiguredModel<LlamaConfig> {
 public:
  static StatusOr<std::unique_ptr<LlamaModel>> Create(const LlamaConfig& config,
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
  LlamaModel(const LlamaConfig& config, const ModelOptions& options);
  StatusOr<float> Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                      bool backward) const override;

};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_LLAMA_H_
