// convert: a safetensors weights file from one layout to another
// (runtime/fsdp/weight_layout.h: shardkit, torch, hf-gpt2).
//
//   bazel run //tools:convert -- --from=hf-gpt2 gpt2.safetensors mine.safetensors
//   bazel run //tools:convert -- --to=hf-gpt2 mine.safetensors gpt2.safetensors
//
// --from and --to default to shardkit. Optimizer state (shardkit full state
// dicts) exists only in the shardkit layout: --weights_only leaves it out,
// otherwise converting such a file is an error. Relative paths are taken
// from the directory `bazel run` was started in. The output is written
// atomically (a failed conversion leaves any existing file as it was).
// Exit status: 0 done, 1 a conversion error (printed), 2 bad usage.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/fsdp/safetensors.h"
#include "runtime/fsdp/weight_layout.h"

namespace {

constexpr char kUsage[] =
    "usage: convert [--from=LAYOUT] [--to=LAYOUT] [--weights_only] IN.safetensors OUT.safetensors\n"
    "  LAYOUT: shardkit (default), torch, hf-gpt2\n";

// `path` relative to where `bazel run` was invoked (BUILD_WORKING_DIRECTORY).
std::string FromCaller(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

int Usage(const std::string& why) {
  std::fprintf(stderr, "convert: %s\n%s", why.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  sk::WeightLayout from = sk::WeightLayout::kShardkit, to = sk::WeightLayout::kShardkit;
  sk::ConvertOptions options;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a.rfind("--from=", 0) == 0 || a.rfind("--to=", 0) == 0) {
      const bool is_from = a[2] == 'f';
      sk::StatusOr<sk::WeightLayout> l = sk::ParseWeightLayout(a.substr(a.find('=') + 1));
      if (!l.ok()) return Usage(std::string(l.status().message()));
      (is_from ? from : to) = *l;
    } else if (a == "--weights_only") {
      options.drop_optimizer_state = true;
    } else if (a.rfind("--", 0) == 0) {
      return Usage("unknown flag '" + a + "'");
    } else {
      files.push_back(a);
    }
  }
  if (files.size() != 2) return Usage("expected an input and an output file");
  const std::string in = FromCaller(files[0]), out = FromCaller(files[1]);
  sk::StatusOr<sk::SafeTensorsFile> file = sk::SafeTensorsFile::Read(in);
  if (!file.ok()) {
    std::fprintf(stderr, "convert: %s\n", file.status().ToString().c_str());
    return 1;
  }
  sk::StatusOr<sk::SafeTensorsFile> converted = sk::ConvertWeights(*file, from, to, options);
  sk::Status s = converted.ok() ? converted->Write(out) : converted.status();
  if (!s.ok()) {
    std::fprintf(stderr, "convert: %s -> %s: %s\n", sk::WeightLayoutName(from), sk::WeightLayoutName(to),
                 s.ToString().c_str());
    return 1;
  }
  std::printf("%s (%s) -> %s (%s): %zu tensors\n", in.c_str(), sk::WeightLayoutName(from), out.c_str(),
              sk::WeightLayoutName(to), converted->names().size());
  return 0;
}
