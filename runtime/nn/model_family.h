// A model family as one registered description: everything the rest of the
// runtime asks about a family (GPT, the Llama family, T5, unit tables, or
// one registered elsewhere) in one struct, found by the family's id. The
// sites that used to branch on the family (model construction, a step's
// size bound for the memory estimator, the id space batches draw from, what
// batches the family reads, Hugging Face config.json and weight layouts,
// decoder specs, the tied head, the model table's row) ask the registry
// instead, and an unregistered family is an error naming it, never a
// fallback to another family.
//
// Adding a family (docs/architecture.md, "Adding a model family"): write
// its model (a Model, usually a ConfiguredModel<Config>), describe it in one
// file, and register the description: a built-in family with one line in
// the registry's list of built-in families (model_family.cc,
// builtin_families.h), a family of one's own with RegisterModelFamily from
// anywhere (tests/plan/model_family_test.cc registers a tiny one there and
// builds, estimates and plans it). A family's config travels in
// NamedModelConfig: the built-in families in their own fields (gpt, llama,
// t5, table), any other in NamedModelConfig::custom.
//
// Thread safety: lookups and RegisterModelFamily may run concurrently; a
// registered description is never changed or removed, so the pointers the
// lookups return stay valid for the life of the process.
#ifndef SHARDKIT_RUNTIME_NN_MODEL_FAMILY_H_
#define SHARDKIT_RUNTIME_NN_MODEL_FAMILY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/core/status.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/model.h"

namespace sk {

// What the family's models read from a TokenBatch.
enum class FamilyBatches {
  // inputs and targets of one token sequence per entry, packable documents
  // (positions, segment ids): what datasets and language-model streams feed.
  kDecoder = 1,
  // source as well (an encoder-decoder): reversal batches.
  kEncoderDecoder = 2,
  // one id per entry (an image id and its label): unit tables.
  kImages = 3,
};

// One Hugging Face architecture the family reads from and writes to a
// config.json (runtime/nn/hf_config.h) and the weight layout of its
// state dicts (runtime/checkpoint/weight_layout.h).
struct HfArchitecture {
  std::string architecture;  // "architectures"[0]: "GPT2LMHeadModel"
  std::string model_type;    // "model_type": "gpt2"
  std::string weight_layout;  // ParseWeightLayout's name: "hf-gpt2"
  // Which configs of the family it writes (null: every one).
  bool (*writes)(const NamedModelConfig& config) = nullptr;
  // The config of a parsed config.json (`file` names it in errors), with
  // family, model config and seq_len set; validated by the caller.
  StatusOr<NamedModelConfig> (*from_config)(const nlohmann::json& j, const std::string& file) = nullptr;
  // The architecture's config.json keys for `config`, but for
  // "architectures" and "model_type", which HfConfigJson writes from this
  // entry (one place names the architecture).
  nlohmann::json (*to_config)(const NamedModelConfig& config) = nullptr;
};

// The columns of the family's row in the model table (//tools:model_table,
// docs/architecture.md): the shape as text.
struct ModelTableRow {
  std::string layers, d_model, heads, d_ff, vocab, seq;
};

struct ModelFamilyDescription {
  ModelFamily id{};
  std::string name;  // "gpt", "llama", "t5", "unit table": messages and tables
  FamilyBatches batches = FamilyBatches::kDecoder;

  // Required. The model of `config` (config.family == id): no parameter
  // memory, only the unit specs. Errors: the config's, the options'.
  StatusOr<std::unique_ptr<Model>> (*create)(const NamedModelConfig& config,
                                             const ModelOptions& options) = nullptr;
  // Required. InvalidArgument naming the field when the family's config is
  // not one its model builds.
  Status (*validate)(const NamedModelConfig& config) = nullptr;
  // Required. The size of the id space batches draw from (BatchIdSpace).
  int64_t (*batch_id_space)(const NamedModelConfig& config) = nullptr;
  // Required. CheckStepSizeFits for the family (configs.h): InvalidArgument
  // unless every byte count of a step of this size stays below 2^62. The
  // sizes are checked (batch_size >= 1, lengths >= 0) before it is called.
  // Transformer families bound it with CheckTransformerStepSize.
  Status (*check_step_size)(const NamedModelConfig& config, int64_t batch_size, int64_t seq_len,
                            int64_t source_len) = nullptr;
  // Required. Sets the config's name and its model's (configs name the
  // model after the file or directory they come from).
  void (*set_name)(NamedModelConfig& config, const std::string& name) = nullptr;
  // Required. The family's row of the model table.
  ModelTableRow (*table_row)(const NamedModelConfig& config) = nullptr;

  // Optional (null: the family has none of these).
  // Whether the LM head is the token embedding: the config's
  // tie_word_embeddings (every family's one name for a tied head, as
  // Hugging Face's config.json key). nullopt: the family has no tied head
  // to speak of.
  std::optional<bool> (*tie_word_embeddings)(const NamedModelConfig& config) = nullptr;
  // The inline decoder spec (decoder_spec.h) that reads back to the config.
  StatusOr<std::string> (*decoder_spec)(const NamedModelConfig& config) = nullptr;
  // The config as a model file that FindModelConfig reads back (a unit
  // table's JSON, unit_table_json.h): //tools:model_table --dump_table.
  StatusOr<std::string> (*model_file)(const NamedModelConfig& config) = nullptr;
  // The Hugging Face architectures of the family, the first that writes a
  // config being the one it is written as.
  std::vector<HfArchitecture> hf_architectures;
  // Named configurations the family adds to those FindModelConfig knows
  // (configs.h's ModelConfigs() holds the built-in families' catalogue).
  std::vector<NamedModelConfig> configs;

  // What the memory estimator (runtime/fsdp/memory_estimator.h) may count
  // on beyond the model's own PeakActivationBytes: whether the backward of
  // unit 0 runs without the parameter views the hooks give it
  // (UnitScope::PreBackwardGradientsOnly, transformer.h), so the gathered
  // parameters FSDP frees in its PostBackward are gone before the
  // reduction. false (the bound): every unit holds them until its backward
  // scope ends.
  bool first_unit_backward_without_parameters = false;
};

// Registers `family`. InvalidArgument naming the family when its id is 0 or
// registered, its name is empty or registered, a required hook is missing,
// one of its configs is of another family or has a name FindModelConfig
// already resolves, or a Hugging Face architecture of it is registered.
Status RegisterModelFamily(ModelFamilyDescription family);

// The registered family `id`, or nullptr.
const ModelFamilyDescription* FindModelFamily(ModelFamily id);

// The family of `config`; InvalidArgument naming the config and the family
// id when no family of that id is registered.
StatusOr<const ModelFamilyDescription*> ModelFamilyOf(const NamedModelConfig& config);

// Every registered family, built-in ones first, then in registration order.
std::vector<const ModelFamilyDescription*> ModelFamilies();

// CheckStepSizeFits's bound for a transformer of these dimensions
// (encoder and decoder layers together in `layers`): generously, every
// sublayer's saved and temporary tensors, its attention scores and the
// head's logits per token, at the longest of the step's lengths (0: the
// config's defaults).
Status CheckTransformerStepSize(const NamedModelConfig& config, int64_t layers, int64_t heads, int64_t d_model,
                                int64_t d_ff, int64_t vocab, int64_t batch_size, int64_t seq_len,
                                int64_t source_len);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_MODEL_FAMILY_H_
