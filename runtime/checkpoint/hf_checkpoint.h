// Hugging Face model directories in and out: what transformers'
// from_pretrained reads and save_pretrained writes.
//
//   <dir>/config.json                      the shape (runtime/nn/hf_config.h)
//   <dir>/model.safetensors                the weights, in one file, or
//   <dir>/model.safetensors.index.json     {"weight_map": {tensor: file}} and
//   <dir>/model-0000k-of-0000n.safetensors the files it names (sharded)
//
// The tensors carry the architecture's names and layout (weight_layout.h:
// hf-gpt2 for GPT2LMHeadModel, hf-llama for LlamaForCausalLM and
// Qwen2ForCausalLM); reading converts them to shardkit's layout
// and checks them against the model config.json describes: every parameter
// present with its shape, nothing else (the attention-mask buffers of older
// GPT-2 files and RoPE's inv_freq buffers of older Llama files are
// skipped). A tied head (tie_word_embeddings) is stored once, as wte (GPT-2)
// or embed_tokens (Llama), both ways; a file that also holds lm_head.weight
// must hold the embedding's bytes there.
//
// Errors name the file and the tensor: NotFound for a missing config.json,
// weights file or shard the index lists; InvalidArgument for an unknown
// architecture, a missing config key, a tensor missing or of another shape
// than the config implies, a tensor the model does not have, an index that
// lists a tensor its file lacks; DataLoss for a corrupt file (as
// SafeTensorsFile::Read). Never an abort.
//
// Thread safety: the functions are thread-safe; concurrent writes to one
// directory are not.
#ifndef SHARDKIT_RUNTIME_CHECKPOINT_HF_CHECKPOINT_H_
#define SHARDKIT_RUNTIME_CHECKPOINT_HF_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/nn/configs.h"

namespace sk {

// The weight layout of `config`'s Hugging Face architecture (kHfGpt2 for a
// GPT, kHfLlama for a Llama-family model). InvalidArgument for a family
// without one.
StatusOr<WeightLayout> HfWeightLayout(const NamedModelConfig& config);

// How `config`'s weights convert from and to its Hugging Face layout: whether
// its head is tied (ConvertOptions::tie_word_embeddings, from the family).
ConvertOptions HfConvertOptions(const NamedModelConfig& config);

// Every tensor of the directory's weights (model.safetensors, or the index
// and its shards), under the file's names and in its dtypes, in one
// in-memory file. Errors as above.
StatusOr<SafeTensorsFile> ReadHfWeights(const std::string& dir);

// The weights of `path` opened for ranged reads: a directory's
// model.safetensors, or its index and every shard it lists; a file: itself.
// Only headers are read (SafeTensorsReader), so memory holds what the
// caller then reads. Errors as ReadHfWeights.
struct HfWeightReaders {
  std::vector<SafeTensorsReader> files;
  std::map<std::string, size_t> where;  // tensor name -> index into files
};
StatusOr<HfWeightReaders> OpenHfWeights(const std::string& path);

// A Hugging Face model directory read into shardkit's terms.
struct HfModel {
  NamedModelConfig config;   // from config.json (its name is the directory)
  SafeTensorsFile weights;   // shardkit layout: "<unit>.<param>", in the file's dtypes
};

// Reads `dir` (config.json and the weights), converts the weights to the
// shardkit layout and checks them against the model (above).
StatusOr<HfModel> ReadHfModelDir(const std::string& dir);

// The tensors of `weights` (shardkit layout, the same names as the model of
// `config` has, f32/bf16/f16) converted to `config`'s Hugging Face layout and
// checked against the model like a read. `where` names them in errors.
StatusOr<SafeTensorsFile> ToHfWeights(const NamedModelConfig& config, const SafeTensorsFile& weights,
                                      const std::string& where);

struct HfWriteOptions {
  // Most bytes of tensor data per file; 0 = one model.safetensors. Larger:
  // model-0000k-of-0000n.safetensors files of at most that much (a tensor
  // larger than it gets a file of its own) and model.safetensors.index.json.
  int64_t max_shard_bytes = 0;
  // The Hugging Face directory whose tokenizer and generation settings go
  // with the model: its tokenizer files (tokenizer.json,
  // tokenizer_config.json, special_tokens_map.json, added_tokens.json,
  // tokenizer.model, spiece.model, vocab.json, merges.txt, vocab.txt,
  // chat_template.jinja/.json, those present) and generation_config.json
  // are copied, and its config.json's bos_token_id, eos_token_id and
  // pad_token_id are written into config.json. Empty: the directory the
  // model came from (config.name, when that is a Hugging Face directory, as
  // ReadHfConfig names it), else none. Without a generation_config.json
  // there, one is written from those ids as transformers'
  // GenerationConfig.from_model_config does, so generate() stops at EOS.
  std::string source_dir;
};

// The parts of WriteHfModelDir besides the weights, for writers that
// stream them (SaveFullStateDict): creates `dir` and writes config.json,
// generation_config.json and the tokenizer files (above).
Status WriteHfDirectoryFiles(const std::string& dir, const NamedModelConfig& config,
                             const HfWriteOptions& options = {});
// model.safetensors.index.json as transformers writes it ({"metadata":
// {"total_size"}, "weight_map": {tensor: file}}) for the shards `files`
// already written; removes a model.safetensors and shards of an earlier
// save that `files` does not hold.
Status WriteHfIndex(const std::string& dir, const std::map<std::string, std::string>& weight_map, int64_t total_size,
                    const std::set<std::string>& files);

// Writes `dir` (created if needed; files of an earlier save there are
// replaced, each written durably): config.json for `config` and `weights`
// (shardkit layout) in its Hugging Face layout, "format": "pt" as
// transformers writes it, with the source directory's special tokens,
// generation_config.json and tokenizer files (HfWriteOptions::source_dir).
// The head of a tied model is not written (it is wte); an untied head
// always is. InvalidArgument for a source config.json whose token id is not
// an id (naming the key); NotFound for a source_dir that is not a directory.
Status WriteHfModelDir(const std::string& dir, const NamedModelConfig& config, const SafeTensorsFile& weights,
                       const HfWriteOptions& options = {});

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CHECKPOINT_HF_CHECKPOINT_H_
