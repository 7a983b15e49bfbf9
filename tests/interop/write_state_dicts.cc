// Writes the files tests/interop reads with Python: a gpt-tiny trained one
// step on two local ranks, saved as a shardkit full state dict (with AdamW
// state) and in the hf-gpt2 layout, plus expected.txt: for every tensor of
// the shardkit file its name, element count, first element and sum (f64, in
// file order), as shardkit's own reader sees them.
//   write_state_dicts OUT_DIR
#include <cinttypes>
#include <cstdio>
#include <string>

#include "runtime/comm/local_backend.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/train/trainer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_state_dicts OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  sk::TrainerOptions o;
  o.model = "gpt-tiny";
  o.data_tokens = 96;
  sk::Status s = sk::comm::RunLocalRanks(2, [&](int, sk::comm::ProcessGroup* g) -> sk::Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<sk::Trainer> t, sk::Trainer::Create(o, g));
    SK_RETURN_IF_ERROR(t->Step().status());
    SK_RETURN_IF_ERROR(t->SaveFullStateDict(dir + "/shardkit.safetensors"));
    return t->SaveFullStateDict(dir + "/hf-gpt2.safetensors", sk::WeightLayout::kHfGpt2);
  });
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  sk::StatusOr<sk::SafeTensorsFile> f = sk::SafeTensorsFile::Read(dir + "/shardkit.safetensors");
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().ToString().c_str());
    return 1;
  }
  FILE* out = std::fopen((dir + "/expected.txt").c_str(), "w");
  if (out == nullptr) return 1;
  for (const std::string& name : f->names()) {
    const sk::SafeTensorsFile::Info info = *f->info(name);
    const float* p = static_cast<const float*>(*f->data(name));
    const int64_t n = info.shape.numel();
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += p[i];
    std::fprintf(out, "%s %" PRId64 " %.9g %.17g\n", name.c_str(), n, n > 0 ? p[0] : 0.0f, sum);
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
