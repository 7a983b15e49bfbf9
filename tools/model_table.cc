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
#include "runtime/nn/model_family.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strncmp(argv[1], "--dump_table=", 13) == 0) {
    auto c = sk::FindModelConfig(argv[1] + 13);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return 1;
    }
    const sk::ModelFamilyDescription* family = sk::FindModelFamily(c->family);
    if (family == nullptr || family->model_file == nullptr) {
      std::fprintf(stderr, "%s is not a unit table (GPT, T5 and Llama are named configurations)\n", argv[1] + 13);
      return 1;
    }
    auto file = family->model_file(*c);
    if (!file.ok()) {
      std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
      return 1;
    }
    std::fputs(file->c_str(), stdout);
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
    // Per decoder token (unit tables: per image, their seq_len being 1).
    const double tokens = static_cast<double>(c.seq_len);
    const sk::ModelTableRow row = sk::FindModelFamily(c.family)->table_row(c);
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %.4g M | %.4g | %.4g |\n", c.name.c_str(),
                sk::ModelFamilyName(c.family), row.layers.c_str(), row.d_model.c_str(), row.heads.c_str(),
                row.d_ff.c_str(), row.vocab.c_str(), row.seq.c_str(),
                static_cast<double>((*m)->num_parameters()) / 1e6, f.model_flops / tokens / 1e9,
                f.hardware_flops / tokens / 1e9);
  }
  return 0;
}
