// Prints the named model configurations as a Markdown table: parameters,
// model FLOPs per (decoder) token of a training step at the default sequence
// lengths, and hardware FLOPs with activation checkpointing. For T5 the
// encoder's work is included in the per-decoder-token figure; unit tables
// (images) give GFLOP per image. docs/architecture.md carries its output.
//
//   model_table                      the Markdown table
//   model_table --dump_table=NAME    the unit table NAME as JSON (the format
//                                    of runtime/nn/unit_table_json.h), a
//                                    starting point for one's own
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/nn/configs.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strncmp(argv[1], "--dump_table=", 13) == 0) {
    auto c = sk::FindModelConfig(argv[1] + 13);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return 1;
    }
    if (c->family != sk::ModelFamily::kUnitTable) {
      std::fprintf(stderr, "%s is not a unit table (GPT, T5 and Llama are named configurations)\n", argv[1] + 13);
      return 1;
    }
    std::fputs(sk::UnitTableToJson(c->table).c_str(), stdout);
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr, "usage: model_table [--dump_table=NAME]\n");
    return 1;
  }
  std::printf("| name | family | layers | d_model | heads | d_ff | vocab | seq (src/tgt) | parameters | "
              "model GFLOP/token | hardware GFLOP/token (ckpt) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const sk::NamedModelConfig& c : sk::ModelConfigs()) {
    sk::ModelOptions ckpt;
    ckpt.activation_checkpointing = true;
    auto m = sk::CreateModel(c, ckpt);
    if (!m.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), m.status().ToString().c_str());
      return 1;
    }
    sk::StepFlops f = (*m)->Flops(1, c.seq_len, c.source_len);
    if (c.family == sk::ModelFamily::kUnitTable) {
      // Per image: the table has no token sequence; "layers" counts units.
      std::printf("| %s | unit table | %zu units | - | - | - | %lld classes | image %lld | %.4g M | %.4g | %.4g |\n",
                  c.name.c_str(), c.table.units.size(), static_cast<long long>(c.table.num_classes),
                  static_cast<long long>(c.table.image_size),
                  static_cast<double>((*m)->num_parameters()) / 1e6, f.model_flops / 1e9,
                  f.hardware_flops / 1e9);
      continue;
    }
    const double tokens = static_cast<double>(c.seq_len);
    const bool t5 = c.family == sk::ModelFamily::kT5;
    const bool llama = c.family == sk::ModelFamily::kLlama;
    char layers[32];
    long long d = c.t5.d_model, ff = c.t5.d_ff, vocab = c.t5.vocab_size;
    char heads[32];
    std::snprintf(heads, sizeof(heads), "%lld", static_cast<long long>(c.t5.n_head));
    if (t5) {
      std::snprintf(layers, sizeof(layers), "%lld+%lld", static_cast<long long>(c.t5.n_encoder_layers),
                    static_cast<long long>(c.t5.n_decoder_layers));
    } else if (llama) {
      std::snprintf(layers, sizeof(layers), "%lld", static_cast<long long>(c.llama.n_layer));
      // Query heads / key-value heads (grouped-query attention).
      std::snprintf(heads, sizeof(heads), "%lld/%lld", static_cast<long long>(c.llama.n_head),
                    static_cast<long long>(c.llama.kv_heads()));
      d = c.llama.d_model, ff = c.llama.d_ff, vocab = c.llama.vocab_size;
    } else {
      std::snprintf(layers, sizeof(layers), "%lld", static_cast<long long>(c.gpt.n_layer));
      std::snprintf(heads, sizeof(heads), "%lld", static_cast<long long>(c.gpt.n_head));
      d = c.gpt.d_model, ff = c.gpt.ff(), vocab = c.gpt.vocab_size;
    }
    char seq[64];
    if (!t5) {
      std::snprintf(seq, sizeof(seq), "%lld", static_cast<long long>(c.seq_len));
    } else {
      std::snprintf(seq, sizeof(seq), "%lld/%lld", static_cast<long long>(c.source_len),
                    static_cast<long long>(c.seq_len));
    }
    std::printf("| %s | %s | %s | %lld | %s | %lld | %lld | %s | %.4g M | %.4g | %.4g |\n",
                c.name.c_str(), sk::ModelFamilyName(c.family), layers, d, heads, ff,
                vocab, seq, static_cast<double>((*m)->num_parameters()) / 1e6,
                f.model_flops / tokens / 1e9, f.hardware_flops / tokens / 1e9);
  }
  return 0;
}
