// Named model configurations: the paper's real sizes (metadata for GPUs; the
// models can be built and counted anywhere, but training them needs FSDP on
// accelerators) and scaled sizes that train on a small CPU machine.
//
// The table of names, parameter counts and FLOPs per token in
// docs/architecture.md is printed by //tools:model_table from these
// definitions, so it cannot drift from the code.
#ifndef SHARDKIT_RUNTIME_NN_CONFIGS_H_
#define SHARDKIT_RUNTIME_NN_CONFIGS_H_

#include <any>
#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/gpt.h"
#include "runtime/nn/llama.h"
#include "runtime/nn/model.h"
#include "runtime/nn/t5.h"
#include "runtime/nn/unit_table.h"
#include "runtime/nn/unit_table_json.h"

namespace sk {

// A model family's id; what the rest of the runtime asks about a family is
// its registered description (model_family.h). The built-in families:
// kUnitTable: a network described as a table of units (unit_table.h): the
// paper's RegNet-9B and DeepViT-8B, which have no hand-written model.
// kLlama: Llama-family decoders (llama.h: RMSNorm, RoPE, GQA, SwiGLU).
// A family registered elsewhere takes any other nonzero value.
enum class ModelFamily : uint8_t { kGpt = 1, kT5 = 2, kUnitTable = 3, kLlama = 4 };

// The registered family's name ("gpt", "t5", "unit table", "llama"), or
// "unknown".
const char* ModelFamilyName(ModelFamily family);

struct NamedModelConfig {
  std::string name;
  ModelFamily family = ModelFamily::kGpt;
  GptConfig gpt;  // when family == kGpt
  T5Config t5;    // when family == kT5
  UnitTableConfig table;  // when family == kUnitTable
  LlamaConfig llama;      // when family == kLlama
  // A family registered elsewhere: its own config (model_family.h).
  std::any custom;
  // The sequence lengths a training step uses by default (decoder / encoder).
  int64_t seq_len = 0;
  int64_t source_len = 0;
  // True for the paper's sizes, which only make sense on GPUs.
  bool gpu_scale = false;
  std::string description;
};

// A GPT decoder's shape (d_ff 0: 4 d_model; tie_word_embeddings: the LM
// head is the token embedding).
struct GptShape {
  int64_t vocab, seq, layers, heads, d_model;
  int64_t d_ff = 0;
  bool tie_word_embeddings = false;
};

// A Llama-family decoder's shape, with d_ff the SwiGLU's hidden width and
// kv_heads key/value heads (grouped-query attention when fewer than heads).
struct LlamaShape {
  int64_t vocab, seq, layers, heads, kv_heads, d_model, d_ff;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  bool qkv_bias = false;
  bool tie_word_embeddings = false;
  RopeScaling rope_scaling = {};
  int64_t max_positions = 0;  // max_position_embeddings; 0: seq
};

// The configuration of a decoder of that shape named `name`, as the named
// configurations and decoder specs (decoder_spec.h) both build it: name,
// family and model config set, the step's default seq_len = shape.seq;
// gpu_scale and description are the caller's. Not validated.
NamedModelConfig GptDecoderConfig(const std::string& name, const GptShape& shape);
NamedModelConfig LlamaDecoderConfig(const std::string& name, const LlamaShape& shape);

// The size of the id space the model's batches draw from: the vocabulary
// (GPT, T5, Llama) or the number of classes (unit tables: image ids and
// labels); 0 for a family that is not registered.
int64_t BatchIdSpace(const NamedModelConfig& config);

// Every named configuration of the built-in families, small to large
// (FindModelConfig also knows those registered families add).
const std::vector<NamedModelConfig>& ModelConfigs();

// The named configuration; or a decoder by its shape, inline
// ("decoder:layers=32,d_model=4096,...") or in a .json file holding a
// "decoder" object (runtime/nn/decoder_spec.h); or, for any other file
// ending in ".json", the unit table in that file
// (runtime/nn/unit_table_json.h: a user's own network); or, when `name` is
// a directory holding a config.json, that Hugging Face model's shape
// (runtime/nn/hf_config.h). Errors name the file, the unit or key and the
// field; or a configuration a registered family adds (model_family.h).
// NotFound listing the known names when `name` is none of these.
StatusOr<NamedModelConfig> FindModelConfig(const std::string& name);

// InvalidArgument naming batch_size and the sequence lengths when a step of
// `batch_size` sequences of `seq_len` (and `source_len` encoder) tokens is too
// large to size: every byte count derived from it (activations, token
// buffers, the memory estimate) is int64, and a bound that dominates them all
// is computed here with checked arithmetic and must stay below 2^62 (a
// huge batch x seq used to wrap around to a small memory estimate).
// Lengths of 0 mean the configuration's defaults. The bound is the
// family's (ModelFamilyDescription::check_step_size); InvalidArgument for a
// family that is not registered.
Status CheckStepSizeFits(const NamedModelConfig& config, int64_t batch_size, int64_t seq_len,
                         int64_t source_len);

// Builds the model of a named configuration (no parameter memory is
// allocated: only the unit specs) with its family's builder;
// InvalidArgument naming the family when it is not registered.
StatusOr<std::unique_ptr<Model>> CreateModel(const std::string& name,
                                             const ModelOptions& options = {});
StatusOr<std::unique_ptr<Model>> CreateModel(const NamedModelConfig& config,
                                             const ModelOptions& options = {});

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_CONFIGS_H_
