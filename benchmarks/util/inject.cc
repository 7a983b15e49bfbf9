#include "benchmarks/util/inject.h"
#include "runtime/core/env.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace sk::bench {
namespace {

constexpr const char* kNames[] = {"fsdp_step", "collectives"};

[[noreturn]] void Malformed(const std::string& value, const std::string& why) {
  std::fprintf(stderr, "SK_BENCH_INJECT=\"%s\": %s (expected name:count,... with names fsdp_step, "
               "collectives and counts 1..16)\n", value.c_str(), why.c_str());
  std::exit(2);
}

std::map<std::string, int> Parse() {
  std::map<std::string, int> out;
  const char* env = GetEnv(EnvVar::kBenchInject);
  if (env == nullptr) return out;
  const std::string value = env;
  std::stringstream ss(value);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) Malformed(value, "'" + item + "' has no ':count'");
    const std::string name = item.substr(0, colon), count = item.substr(colon + 1);
    bool known = false;
    for (const char* n : kNames) known = known || name == n;
    if (!known) Malformed(value, "unknown name '" + name + "'");
    char* end = nullptr;
    const long n = std::strtol(count.c_str(), &end, 10);
    if (count.empty() || *end != '\0' || n < 1 || n > 16) Malformed(value, "bad count '" + count + "'");
    out[name] = static_cast<int>(n);
  }
  return out;
}

}  // namespace

int InjectedRepeats(std::string_view what) {
  static const std::map<std::string, int> repeats = Parse();
  auto it = repeats.find(std::string(what));
  return it == repeats.end() ? 1 : it->second;
}

}  // namespace sk::bench
