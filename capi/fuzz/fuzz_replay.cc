// A standalone driver for LLVMFuzzerTestOneInput, for toolchains without
// libFuzzer (the Bazel build uses gcc): replays every file of the corpus
// directories given as arguments, then `--random=N` inputs from a fixed-seed
// generator (mutations of the corpus and fresh random buffers).
//   fuzz_replay [--random=N] [--seed=S] DIR...
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  long random_inputs = 1000;
  uint64_t seed = 1;
  std::vector<std::vector<uint8_t>> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--random=", 0) == 0) {
      random_inputs = std::strtol(a.c_str() + 9, nullptr, 10);
    } else if (a.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(a.c_str() + 7, nullptr, 10);
    } else {
      for (const auto& e : std::filesystem::recursive_directory_iterator(a)) {
        if (!e.is_regular_file()) continue;
        std::ifstream f(e.path(), std::ios::binary);
        corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      }
    }
  }
  for (const auto& input : corpus) LLVMFuzzerTestOneInput(input.data(), input.size());
  std::mt19937_64 rng(seed);
  for (long n = 0; n < random_inputs; ++n) {
    std::vector<uint8_t> input;
    if (!corpus.empty() && rng() % 2 == 0) {
      input = corpus[rng() % corpus.size()];
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < flips && !input.empty(); ++k) input[rng() % input.size()] = static_cast<uint8_t>(rng());
      if (rng() % 4 == 0) input.resize(rng() % (input.size() + 16));
    } else {
      input.resize(rng() % 512);
      for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("fuzz_replay: %zu corpus inputs and %ld random inputs, no crash\n", corpus.size(),
              random_inputs);
  return 0;
}
