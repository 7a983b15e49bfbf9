// convert: a safetensors weights file from one layout to another
// (runtime/checkpoint/weight_layout.h: shardkit, torch, hf-gpt2, hf-llama).
//
//   bazel run //tools:convert -- --from=hf-gpt2 gpt2.safetensors mine.safetensors
//   bazel run //tools:convert -- --to=hf-gpt2 mine.safetensors gpt2.safetensors
//
//   bazel run //tools:convert -- --from=hf-gpt2 path/to/gpt2-dir mine.safetensors
//   bazel run //tools:convert -- --to=hf-gpt2 --model=gpt2-small mine.safetensors out-dir/
//   bazel run //tools:convert -- --from=hf-llama path/to/llama-dir mine.safetensors
//
// --from and --to default to shardkit. Optimizer state (shardkit full state
// dicts) exists only in the shardkit layout: --weights_only leaves it out,
// otherwise converting such a file is an error.
// Hugging Face model directories (runtime/checkpoint/hf_checkpoint.h): with
// --from=hf-gpt2 or hf-llama an input directory is read whole (config.json and
// model.safetensors or its sharded files) and checked against config.json;
// with --to=hf-gpt2 or hf-llama an output that is a directory or ends in '/' gets
// config.json and the weights, sharded into files of at most
// --max_shard_mb MiB when given. Its shape comes from --model (a named
// configuration or another Hugging Face directory), or from the input
// directory. The written directory also gets the tokenizer files,
// generation_config.json and the bos/eos/pad token ids of the directory the
// model came from (--model or the input directory), or of --tokenizer_dir
// when given (HfWriteOptions::source_dir). A single --from=hf-* file takes
// whether the model ties its head from --model or the config.json beside it;
// an hf-llama file without lm_head.weight and with neither is refused (exit 1)
// rather than given the embedding's transpose. Relative paths are taken
// from the directory `bazel run` was started in. The output is written
// atomically (a failed conversion leaves any existing file as it was).
// Exit status: 0 done, 1 a conversion error (printed), 2 bad usage.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/env.h"
#include "runtime/core/file_io.h"
#include "runtime/core/status.h"
#include "runtime/checkpoint/hf_checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/hf_config.h"


namespace {

constexpr char kUsage[] =
    "usage: convert [--from=LAYOUT] [--to=LAYOUT] [--weights_only] [--model=NAME] [--max_shard_mb=N]\n"
    "               [--tokenizer_dir=DIR] IN OUT\n"
    "  LAYOUT: shardkit (default), torch, hf-gpt2, hf-llama\n"
    "  IN, OUT: safetensors files; with hf-gpt2 or hf-llama also Hugging Face model directories\n"
    "           (an OUT directory: an existing one or a path ending in '/')\n"
    "  --tokenizer_dir: a Hugging Face directory whose tokenizer files, generation_config.json and\n"
    "           special token ids go into an OUT directory (default: --model's or IN's directory)\n";

// `path` relative to where `bazel run` was invoked (BUILD_WORKING_DIRECTORY).
std::string FromCaller(const std::string& path) {
  const char* cwd = sk::GetEnv(sk::EnvVar::kBuildWorkingDirectory);
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
  std::string model, tokenizer_dir;
  long long max_shard_bytes = 0;
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
    } else if (a.rfind("--model=", 0) == 0) {
      model = a.substr(8);
    } else if (a.rfind("--tokenizer_dir=", 0) == 0) {
      tokenizer_dir = a.substr(16);
      if (tokenizer_dir.empty()) return Usage("--tokenizer_dir needs a directory");
    } else if (a.rfind("--max_shard_mb=", 0) == 0) {
      char* end = nullptr;
      const long long mb = std::strtoll(a.c_str() + 15, &end, 10);
      if (end == a.c_str() + 15 || *end != '\0' || mb < 1) return Usage("--max_shard_mb must be a positive integer");
      max_shard_bytes = mb << 20;
    } else if (a.rfind("--", 0) == 0) {
      return Usage("unknown flag '" + a + "'");
    } else {
      files.push_back(a);
    }
  }
  if (files.size() != 2) return Usage("expected an input and an output file");
  const std::string in = FromCaller(files[0]), out = FromCaller(files[1]);
  auto hugging_face = [](sk::WeightLayout l) {
    return l == sk::WeightLayout::kHfGpt2 || l == sk::WeightLayout::kHfLlama;
  };
  const bool in_dir = hugging_face(from) && sk::IsDirectory(in);
  const bool out_dir = hugging_face(to) && (sk::IsDirectory(out) || out.back() == '/');
  if (hugging_face(from) && !in_dir) {
    // A single Hugging Face file does not say whether the model ties its
    // head: --model's config says so, else the config.json beside the file.
    // Without either, an hf-llama file without lm_head.weight is refused
    // (ConvertOptions::tie_word_embeddings) rather than given the embedding's
    // transpose, which is wrong weights for an untied model.
    std::optional<sk::StatusOr<sk::NamedModelConfig>> config;
    const std::string beside = sk::ParentDirectory(in);
    if (!model.empty()) {
      config = sk::FindModelConfig(FromCaller(model));
    } else if (sk::IsRegularFile(beside + "/config.json")) {
      config = sk::ReadHfConfig(beside);
    }
    if (config.has_value()) {
      if (!config->ok()) {
        std::fprintf(stderr, "convert: %s: the model's config: %s\n", in.c_str(), config->status().ToString().c_str());
        return 1;
      }
      options.tie_word_embeddings = sk::HfConvertOptions(**config).tie_word_embeddings;
    }
  }
  if (in_dir || out_dir) {
    // Through shardkit's layout, checked against the model's shape.
    sk::StatusOr<sk::SafeTensorsFile> weights = sk::InvalidArgumentError("no input");
    sk::StatusOr<sk::NamedModelConfig> config = sk::InvalidArgumentError(
        "writing a Hugging Face directory needs the model's shape: --model=NAME (a named configuration or a "
        "Hugging Face directory)");
    if (!model.empty()) config = sk::FindModelConfig(FromCaller(model));
    if (in_dir) {
      sk::StatusOr<sk::HfModel> hf = sk::ReadHfModelDir(in);
      if (hf.ok()) {
        if (model.empty()) config = hf->config;
        weights = std::move(hf->weights);
      } else {
        weights = hf.status();
      }
    } else {
      sk::StatusOr<sk::SafeTensorsFile> file = sk::SafeTensorsFile::Read(in);
      weights = file.ok() ? sk::ConvertWeights(*file, from, sk::WeightLayout::kShardkit, options) : file.status();
    }
    sk::Status s = weights.status();
    if (s.ok() && out_dir) {
      s = config.status();
      sk::HfWriteOptions wo;
      wo.max_shard_bytes = max_shard_bytes;
      if (!tokenizer_dir.empty()) wo.source_dir = FromCaller(tokenizer_dir);
      if (s.ok()) s = sk::WriteHfModelDir(out, *config, *weights, wo);
    } else if (s.ok()) {
      sk::StatusOr<sk::SafeTensorsFile> converted =
          sk::ConvertWeights(*weights, sk::WeightLayout::kShardkit, to, options);
      s = converted.ok() ? converted->Write(out) : converted.status();
    }
    if (!s.ok()) {
      std::fprintf(stderr, "convert: %s -> %s: %s\n", in.c_str(), out.c_str(), s.ToString().c_str());
      return 1;
    }
    std::printf("%s (%s) -> %s (%s): %zu tensors\n", in.c_str(), sk::WeightLayoutName(from), out.c_str(),
                sk::WeightLayoutName(to), weights->names().size());
    return 0;
  }
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
