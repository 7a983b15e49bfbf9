// Unit tables as JSON: how a user describes a network shardkit has no
// hand-written model for (a convolutional or ViT-like model), without
// recompiling, so that it trains, is simulated and is planned like the named
// configurations. Wherever a model name is accepted (TrainerOptions::model,
// the C ABI's model string, //tools:plan --model, the frontends) the path of
// such a file (ending in ".json") may stand instead (FindModelConfig).
//
// The format mirrors UnitTableConfig field for field (runtime/nn/unit_table.h
// says what each means); a field left out takes the struct's default, an
// unknown key is an error (a misspelt "stride" must not silently become 1):
//
//   {"name": "my-net", "image_size": 32, "image_channels": 3, "num_classes": 10,
//    "source": "where the sizes come from",
//    "units": [
//      {"name": "stem", "kind": "conv", "in_h": 32, "in_w": 32,
//       "convs": [{"name": "stem.conv", "in_channels": 3, "out_channels": 16,
//                  "kernel": 3, "stride": 2, "gelu": true}]},
//      {"name": "block", "kind": "conv", "in_h": 16, "in_w": 16,
//       "convs": [...], "residual": "identity" | "projection" | "none",
//       "projection": {...conv...}, "gelu_after_sum": true},
//      {"name": "vit0", "kind": "transformer", "in_h": 4, "in_w": 4,
//       "width": 64, "heads": 4, "d_ff": 256},
//      {"name": "head", "kind": "classifier", "in_h": 8, "in_w": 8,
//       "width": 16, "layer_norm": false}]}
//
// `//tools:model_table -- --dump_table=regnet-tiny` prints a named
// table in this form, a starting point for one's own.
//
// Thread safety: free functions without shared state.
#ifndef SHARDKIT_RUNTIME_NN_UNIT_TABLE_JSON_H_
#define SHARDKIT_RUNTIME_NN_UNIT_TABLE_JSON_H_

#include <string>
#include <string_view>

#include "runtime/core/status.h"
#include "runtime/nn/unit_table.h"

namespace sk {

// Parses and validates (UnitTableConfig::Validate) a table. InvalidArgument
// naming `origin`, the unit and the field for malformed JSON, an unknown or
// mistyped key, an unknown kind or residual, or a table that does not chain.
// Never throws.
StatusOr<UnitTableConfig> UnitTableFromJson(std::string_view text, std::string_view origin);

// Every field of `table`, pretty-printed; UnitTableFromJson gives back an
// equal table.
std::string UnitTableToJson(const UnitTableConfig& table);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_UNIT_TABLE_JSON_H_
