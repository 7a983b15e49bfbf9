// Hugging Face model configurations (config.json) <-> shardkit's model
// configurations, one entry per architecture in its model family's
// registered description.
//
// A Hugging Face model directory holds config.json (the shape) beside its
// weights (runtime/checkpoint/hf_checkpoint.h reads and writes those). Each model
// family (model_family.h) lists its supported architectures
// ("architectures"[0] and "model_type" in config.json) with a reader and a
// writer of their keys and the weight layout of their state dicts; adding
// an architecture is adding an entry there (gpt_family.cc,
// llama_family.cc) and, for a new layout, its name table in
// runtime/checkpoint/weight_layout.cc.
//
//   GPT2LMHeadModel / gpt2 -> GptConfig:
//     vocab_size, n_positions -> max_seq_len, n_layer, n_head, n_embd ->
//     d_model, n_inner (null: 4 n_embd) -> d_ff, tie_word_embeddings
//     (default true, as GPT2Config) and the keys whose other values
//     shardkit's GPT does not compute, checked when present:
//     activation_function "gelu_new" (or "gelu_pytorch_tanh", the same
//     function), layer_norm_epsilon 1e-5, scale_attn_weights true,
//     scale_attn_by_inverse_layer_idx false, reorder_and_upcast_attn false,
//     add_cross_attention false. Dropout keys are read as absent: shardkit's
//     models have no dropout; the writer writes 0.0 for them, so
//     transformers trains the written model with the same meaning.
//
//   LlamaForCausalLM / llama and Qwen2ForCausalLM / qwen2 -> LlamaConfig:
//     vocab_size, hidden_size -> d_model, intermediate_size -> d_ff,
//     num_hidden_layers, num_attention_heads, num_key_value_heads (absent:
//     the heads) -> n_kv_head, max_position_embeddings -> max_seq_len,
//     rms_norm_eps, rope_theta and the rotary scaling (below),
//     tie_word_embeddings (default false for Llama, true for Qwen2, as their
//     configs). Qwen2 has q/k/v biases (qkv_bias); a LlamaConfig with
//     qkv_bias is written as Qwen2ForCausalLM. Checked when present:
//     hidden_act "silu", head_dim = hidden_size / heads, mlp_bias false,
//     Llama's attention_bias false (it would bias o_proj too), Qwen2's
//     use_sliding_window false, partial_rotary_factor 1.
//
//     Rotary embeddings (runtime/ops/rope_scaling.h), read as transformers 5
//     reads them: the object rope_scaling (transformers 4's key) when not
//     null, else rope_parameters (transformers 5's); its rope_type ("type"
//     before transformers 4.43): "default", "linear" (factor) or "llama3"
//     (factor, low_freq_factor, high_freq_factor,
//     original_max_position_embeddings, which defaults to the top-level key
//     of that name and then to max_position_embeddings), as Llama 3.1 and
//     3.2 have it. Any other type (dynamic, yarn, longrope, ...) is
//     InvalidArgument naming it. theta is the object's rope_theta, else the
//     top-level one, else 10000. The writer writes both spellings: the
//     top-level rope_theta, rope_scaling (null when unscaled) and
//     rope_parameters (the scaling's keys with rope_theta).
//
// Errors name the file and the key: a missing key without a default, a
// value of the wrong type, a value shardkit does not compute (InvalidArgument);
// an unknown architecture (InvalidArgument listing the known ones); a file
// that is not JSON (DataLoss).
//
// Thread safety: the functions are pure (thread-safe).
#ifndef SHARDKIT_RUNTIME_NN_HF_CONFIG_H_
#define SHARDKIT_RUNTIME_NN_HF_CONFIG_H_

#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/nn/configs.h"

namespace sk {

// Whether `path` is a directory holding a config.json.
bool IsHfModelDirectory(const std::string& path);

// The model configuration of the Hugging Face directory `dir`, read from
// <dir>/config.json; its name is `dir` and its default sequence length the
// model's maximum. NotFound when there is no config.json; errors as above.
StatusOr<NamedModelConfig> ReadHfConfig(const std::string& dir);

// The same from config.json text; `file` names it in errors.
StatusOr<NamedModelConfig> ParseHfConfig(const std::string& text, const std::string& file);

// config.json text for `config` ("architectures", "model_type",
// "tie_word_embeddings" and the architecture's keys). InvalidArgument for a
// model family with no architecture (T5, unit tables) or not registered.
StatusOr<std::string> HfConfigJson(const NamedModelConfig& config);

// The architecture name config.json gives `config` ("GPT2LMHeadModel",
// "LlamaForCausalLM", "Qwen2ForCausalLM"), or
// InvalidArgument as HfConfigJson.
StatusOr<std::string> HfArchitectureOf(const NamedModelConfig& config);

// The weight layout of that architecture's state dicts, as
// ParseWeightLayout (runtime/checkpoint/weight_layout.h) reads it ("hf-gpt2",
// "hf-llama"), or InvalidArgument as HfConfigJson.
StatusOr<std::string> HfWeightLayoutOf(const NamedModelConfig& config);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_HF_CONFIG_H_
