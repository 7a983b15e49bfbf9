// Hugging Face model configurations (config.json) <-> shardkit's model
// configurations, one table entry per architecture.
//
// A Hugging Face model directory holds config.json (the shape) beside its
// weights (runtime/fsdp/hf_checkpoint.h reads and writes those). The table
// in hf_config.cc maps each supported architecture ("architectures"[0] and
// "model_type" in config.json) to a reader and a writer of its keys; adding
// an architecture is adding an entry there and its name table in
// runtime/fsdp/weight_layout.cc.
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

// The architectures the table holds ("GPT2LMHeadModel", ...).
std::vector<std::string> HfArchitectures();

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
// model family no architecture of the table holds (T5, unit tables).
StatusOr<std::string> HfConfigJson(const NamedModelConfig& config);

// The architecture name config.json gives `config` ("GPT2LMHeadModel"), or
// InvalidArgument as HfConfigJson.
StatusOr<std::string> HfArchitectureOf(const NamedModelConfig& config);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_HF_CONFIG_H_
