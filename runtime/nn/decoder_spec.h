// A decoder-only transformer described by its shape instead of a name, for
// the planner and every API that takes a model name (docs/planner.md,
// "Any decoder"):
//
//   decoder:layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256,seq=8192
//
// or a JSON file (a path ending in .json whose top-level object has a
// "decoder" key; any other .json is a unit table, unit_table_json.h):
//
//   {"decoder": {"layers": 32, "d_model": 4096, "heads": 32, "kv_heads": 8,
//                "d_ff": 14336, "vocab": 128256, "seq": 8192}}
//
// Keys (the same in both forms):
//   layers, d_model, heads, vocab, seq   required, > 0 (seq: the longest
//                                        sequence, and a step's default)
//   ffn          swiglu (default: a Llama-family block, RMSNorm, RoPE,
//                runtime/nn/llama.h) or gelu (a GPT-2 block, LayerNorm,
//                learned positions, runtime/nn/gpt.h)
//   d_ff         the MLP's hidden width (swiglu: required; gelu: 4 d_model)
//   kv_heads     key/value heads, dividing heads (default heads; swiglu only)
//   tied         the head is the token embedding (default false)
//   qkv_bias     biases on q, k, v as Qwen2 (swiglu only; default false)
//   rope_theta   RoPE's base (swiglu only; default 10000)
//   rope_type    RoPE scaling for long contexts (swiglu only;
//                LlamaConfig::rope_scaling, runtime/ops/rope_scaling.h):
//                default (none), linear or llama3, Hugging Face's
//                rope_scaling.rope_type
//   rope_factor  linear, llama3: required, > 0
//   rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions
//                llama3: required (Llama 3.1: 1, 4, 8192); high above low
//   norm_eps     RMSNorm's epsilon (swiglu only; default 1e-5)
//   name         the model's name in tables (default "decoder")
// A rope_* key that the rope_type does not read is an error, as is one it
// reads and is missing. The spec of llama3.2-1b reads back with its llama3
// scaling (and with seq its 131072 positions).
// Every error names the key (and the file): a missing or unknown key, a
// value that is not a number or a boolean, a shape the model refuses.
#ifndef SHARDKIT_RUNTIME_NN_DECODER_SPEC_H_
#define SHARDKIT_RUNTIME_NN_DECODER_SPEC_H_

#include <string>

#include "runtime/core/status.h"
#include "runtime/nn/configs.h"

namespace sk {

// The prefix of the inline form.
inline constexpr char kDecoderSpecPrefix[] = "decoder:";

// True when `name` is the inline form (starts with "decoder:").
bool IsDecoderSpec(const std::string& name);

// The configuration of an inline spec ("decoder:layers=2,...").
StatusOr<NamedModelConfig> ParseDecoderSpec(const std::string& spec);

// The configuration of a JSON document's "decoder" object; `where` (the
// file) prefixes errors. NotFound when the document has no "decoder" key
// (the caller then tries a unit table).
StatusOr<NamedModelConfig> DecoderFromJson(const std::string& text, const std::string& where);

// The inline spec of a decoder configuration (its family's decoder_spec,
// model_family.h: GPT or Llama family): what ParseDecoderSpec reads back to
// the same shape. InvalidArgument for any other family.
StatusOr<std::string> DecoderSpecOf(const NamedModelConfig& config);

// The inline specs of a GPT and of a Llama-family decoder (their families'
// decoder_spec).
std::string GptDecoderSpec(const GptConfig& config);
std::string LlamaDecoderSpec(const LlamaConfig& config);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_DECODER_SPEC_H_
