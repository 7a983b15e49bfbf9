// An example model family that lives in this directory alone: its config,
// its Hugging Face architecture, its builder and its cost description, in
// one ModelFamilyDescription (runtime/nn/model_family.h). Nothing in
// runtime/ knows it; a program that wants it registers it with one line,
//
//   SK_RETURN_IF_ERROR(RegisterModelFamily(example::ExampleDecoderFamily()));
//
// and then trains, estimates, simulates, plans and exports its models by
// name like the built-in families' (docs/architecture.md, "Adding a model
// family"; example_family_test.cc does each).
//
// The family is a small decoder variant: a GPT-2 block with an MLP twice
// (not four times) the width, heads of 16, and the LM head tied to the
// token embedding, described by four numbers. Its model is shardkit's GPT
// (runtime/nn/gpt.h) of that shape: a family with its own layers writes a
// Model (usually a ConfiguredModel<Config>, runtime/nn/configured_model.h)
// here instead, and `create` builds it.
#ifndef SHARDKIT_TESTS_NN_EXAMPLE_FAMILY_EXAMPLE_FAMILY_H_
#define SHARDKIT_TESTS_NN_EXAMPLE_FAMILY_EXAMPLE_FAMILY_H_

#include <cstdint>
#include <string>

#include "runtime/nn/gpt.h"
#include "runtime/nn/model_family.h"

namespace sk {
namespace example {

// The family's id: any value no other family takes (registration refuses
// a taken one).
inline constexpr ModelFamily kExampleDecoder = static_cast<ModelFamily>(100);

// The family's own config, carried in NamedModelConfig::custom.
struct ExampleDecoderConfig {
  std::string name;
  int64_t vocab = 0;   // token ids
  int64_t seq = 0;     // the longest sequence
  int64_t layers = 0;  // blocks
  int64_t width = 0;   // d_model, a multiple of 16 (heads of 16)
};

// The GPT configuration the family's model is built as.
GptConfig AsGpt(const ExampleDecoderConfig& config);

// A named configuration of the family (step's default seq_len = seq).
NamedModelConfig ExampleDecoderNamed(const std::string& name, const ExampleDecoderConfig& config);

// The family's description: named configurations "example-decoder-2" and
// "example-decoder-4" (vocab 64, seq 16, width 32, 2 and 4 layers), and the
// Hugging Face architecture "ExampleDecoderForCausalLM" (model_type
// "example_decoder", GPT-2's tensor names: weight layout "hf-gpt2").
ModelFamilyDescription ExampleDecoderFamily();

}  // namespace example
}  // namespace sk

#endif  // SHARDKIT_TESTS_NN_EXAMPLE_FAMILY_EXAMPLE_FAMILY_H_
