// Weight layouts other tools use, and the converter between them and
// shardkit's own. Conversion is by table (names) and by shape (transposes,
// qkv fusion); no model configuration is needed, so a file converts without
// knowing the model it belongs to.
//
//   kShardkit  "<unit>.<param>" as the models name them (runtime/nn/gpt.h,
//              t5.h); matmul weights ("*.w") stored [in, out].
//   kTorch     the same names, with every matmul weight ("*.w", 2-D) stored
//              [out, in] as PyTorch's nn.Linear.weight holds it. Everything
//              else (embeddings [rows, dim], LayerNorm gains, biases) as is.
//   kHfGpt2    Hugging Face transformers' GPT2LMHeadModel state dict
//              (modeling_gpt2.py). shardkit's GPT is GPT-2's architecture:
//              pre-LayerNorm blocks, LayerNorm eps 1e-5, gelu_tanh
//              ("gelu_new"), biases on every projection, learned positions,
//              attention scaled by 1/sqrt(head_dim), fused q|k|v with head h
//              in columns [h*hd, (h+1)*hd) of each third. A GptConfig
//              corresponds to GPT2Config(vocab_size, n_positions =
//              max_seq_len, n_embd = d_model, n_layer, n_head, n_inner =
//              d_ff). The names:
//                embed.wte          transformer.wte.weight   [vocab, d]
//                embed.wpe          transformer.wpe.weight   [n_positions, d]
//                h.<i>.attn.ln.g/b  transformer.h.<i>.ln_1.weight/bias
//                h.<i>.attn.qkv.w/b transformer.h.<i>.attn.c_attn.weight/bias
//                                   (Conv1D: [d, 3d], the same bytes)
//                h.<i>.attn.proj.w/b  ...attn.c_proj.weight/bias  (Conv1D)
//                h.<i>.mlp.ln.g/b   transformer.h.<i>.ln_2.weight/bias
//                h.<i>.mlp.fc.w/b   transformer.h.<i>.mlp.c_fc.weight/bias
//                h.<i>.mlp.proj.w/b transformer.h.<i>.mlp.c_proj.weight/bias
//                head.ln.g/b        transformer.ln_f.weight/bias
//                head.lm_head.w     lm_head.weight [vocab, d] (transposed)
//              Reading: the "transformer." prefix is optional (GPT2Model
//              files lack it); without lm_head.weight the head is tied, i.e.
//              the transpose of wte; the attention-mask buffers
//              "h.<i>.attn.bias" and "h.<i>.attn.masked_bias" of older files
//              are skipped; instead of c_attn a layer may hold split
//              "attn.{q,k,v}_proj.{weight,bias}" in nn.Linear layout
//              ([d, d] each, [out, in]; biases all three or none, none
//              meaning zero), which are fused. Writing: lm_head.weight is
//              omitted when it equals wte bit for bit (tied, as HF saves
//              GPT-2); "format" is "pt". T5 models and tensors outside the
//              table have no hf-gpt2 name (InvalidArgument naming them).
//   kHfLlama   transformers' LlamaForCausalLM and Qwen2ForCausalLM state
//              dicts (modeling_llama.py, modeling_qwen2.py: the same names),
//              for shardkit's Llama-family model (runtime/nn/llama.h).
//              nn.Linear weights [out, in] are transposed to our [in, out];
//              RMSNorm gains, biases and the embedding are as is:
//                embed.embed_tokens.w     model.embed_tokens.weight [vocab, d]
//                layers.<i>.input_layernorm.g
//                                         model.layers.<i>.input_layernorm.weight
//                layers.<i>.self_attn.{q,k,v,o}_proj.w
//                                         ...self_attn.{q,k,v,o}_proj.weight (transposed)
//                layers.<i>.self_attn.{q,k,v}_proj.b
//                                         ...self_attn.{q,k,v}_proj.bias (Qwen2)
//                layers.<i>.post_attention_layernorm.g
//                                         ...post_attention_layernorm.weight
//                layers.<i>.mlp.{gate,up,down}_proj.w
//                                         ...mlp.{gate,up,down}_proj.weight (transposed)
//                head.norm.g              model.norm.weight
//                head.lm_head.w           lm_head.weight [vocab, d] (transposed)
//              Reading: the "model." prefix is optional (LlamaModel files
//              lack it); the "self_attn.rotary_emb.inv_freq" buffers of
//              older files are skipped; the head as hf-gpt2's, with
//              embed_tokens for wte (ConvertOptions::tie_word_embeddings).
//
// Optimizer state ("optimizer.<state>.<param>", full state dicts only) exists
// in the shardkit layout only: converting a file that has it is
// InvalidArgument unless ConvertOptions::drop_optimizer_state.
//
// Thread safety: the functions are pure (thread-safe).
#ifndef SHARDKIT_RUNTIME_CHECKPOINT_WEIGHT_LAYOUT_H_
#define SHARDKIT_RUNTIME_CHECKPOINT_WEIGHT_LAYOUT_H_

#include <optional>
#include <string>

#include "runtime/core/status.h"
#include "runtime/checkpoint/safetensors.h"

namespace sk {

// Values are part of the C ABI (sk_weight_layout_t): never renumbered.
enum class WeightLayout : int {
  kShardkit = 1,
  kTorch = 2,
  kHfGpt2 = 3,
  kHfLlama = 4,
};

// "shardkit", "torch", "hf-gpt2", "hf-llama".
const char* WeightLayoutName(WeightLayout layout);
// The inverse of WeightLayoutName; InvalidArgument listing the names.
StatusOr<WeightLayout> ParseWeightLayout(const std::string& name);

// The name shardkit parameter `shardkit_name` has in `layout`
// ("head.lm_head.w" -> "lm_head.weight" in kHfGpt2). InvalidArgument when the
// layout has no name for it.
StatusOr<std::string> LayoutName(const std::string& shardkit_name, WeightLayout layout);

struct ConvertOptions {
  // Leave optimizer state (and its metadata) out instead of failing.
  bool drop_optimizer_state = false;
  // hf-gpt2 and hf-llama (embed_tokens for wte): whether the model's LM
  // head is tied to wte (a GPT with
  // tie_word_embeddings, whose state dicts have no head.lm_head.w). Unset:
  // decided by the file, as above (reading: a head of its own, the file's or,
  // for hf-gpt2 only, wte's transpose; an hf-llama file without lm_head.weight
  // is InvalidArgument, since a Llama's head is its own unless its config
  // ties it; writing: lm_head.weight left out when it equals wte).
  // true: reading makes no head.lm_head.w, and an lm_head.weight in the file
  // must equal wte bit for bit (InvalidArgument otherwise: the model cannot
  // hold a different head); writing requires that there is no
  // head.lm_head.w. false: reading needs lm_head.weight (InvalidArgument
  // naming it when absent: an untied head is not wte), writing always
  // writes it.
  std::optional<bool> tie_word_embeddings;
};

// The tensors of `in` (in layout `from`) in layout `to`, in memory. Tensors
// keep their dtype and bytes (transposed or concatenated where the layouts
// differ), so a round trip gives identical bytes. Metadata is carried over
// ("format" becomes "shardkit" or "pt"). Errors (InvalidArgument) name the
// tensor: one the target layout has no name for, a transpose of a tensor
// that is not 2-D, split q/k/v projections that disagree (naming both
// shapes), optimizer state (see ConvertOptions). Between two different
// layouts the step ("shardkit.step") is not carried: the result is weights.
StatusOr<SafeTensorsFile> ConvertWeights(const SafeTensorsFile& in, WeightLayout from, WeightLayout to,
                                         const ConvertOptions& options = {});

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CHECKPOINT_WEIGHT_LAYOUT_H_
