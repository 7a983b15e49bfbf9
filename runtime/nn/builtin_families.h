// Internal to runtime/nn: the built-in model families' descriptions
// (model_family.h), one file each beside its model; model_family.cc
// registers them, one line each.
#ifndef SHARDKIT_RUNTIME_NN_BUILTIN_FAMILIES_H_
#define SHARDKIT_RUNTIME_NN_BUILTIN_FAMILIES_H_

#include "runtime/nn/model_family.h"

namespace sk {

ModelFamilyDescription GptFamily();        // gpt_family.cc
ModelFamilyDescription LlamaFamily();      // llama_family.cc: Llama, Qwen2
ModelFamilyDescription T5Family();         // t5_family.cc
ModelFamilyDescription UnitTableFamily();  // unit_table_family.cc

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_BUILTIN_FAMILIES_H_
