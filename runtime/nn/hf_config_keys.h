// Reading and writing config.json keys, for the model families' Hugging
// Face architectures (model_family.h's HfArchitecture: the built-in ones,
// tests/nn/example_family's) and hf_config.cc.
#ifndef SHARDKIT_RUNTIME_NN_HF_CONFIG_KEYS_H_
#define SHARDKIT_RUNTIME_NN_HF_CONFIG_KEYS_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/status.h"

namespace sk {

// The keys of one config.json, every error naming the file and the key.
class HfConfigKeys {
 public:
  HfConfigKeys(const nlohmann::json& j, std::string file) : j_(j), file_(std::move(file)) {}

  Status Bad(const std::string& key, const std::string& why) const {
    return InvalidArgumentError("'" + file_ + "': key '" + key + "' " + why);
  }
  // A required positive integer.
  Status Int(const char* key, int64_t* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Bad(key, "is missing");
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return Bad(key, "must be a positive integer, not " + it->dump());
    }
    *out = it->get<int64_t>();
    return OkStatus();
  }
  // An optional positive integer; null or absent leaves *out.
  Status OptionalInt(const char* key, int64_t* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return OkStatus();
    return Int(key, out);
  }
  Status Bool(const char* key, bool* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return OkStatus();
    if (!it->is_boolean()) return Bad(key, "must be true or false, not " + it->dump());
    *out = it->get<bool>();
    return OkStatus();
  }
  // An optional positive number; absent leaves *out.
  Status Float(const char* key, float* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return OkStatus();
    if (!it->is_number() || !(it->get<double>() > 0.0) || !std::isfinite(it->get<double>())) {
      return Bad(key, "must be a positive number, not " + it->dump());
    }
    *out = static_cast<float>(it->get<double>());
    return OkStatus();
  }
  // When present, the key must have one of `allowed` (what shardkit computes).
  Status Expect(const char* key, const std::vector<nlohmann::json>& allowed, const char* meaning) const {
    auto it = j_.find(key);
    if (it == j_.end()) return OkStatus();
    for (const nlohmann::json& a : allowed) {
      if (*it == a || (it->is_number() && a.is_number() &&
                       std::fabs(it->get<double>() - a.get<double>()) <= 1e-12 * std::fabs(a.get<double>()))) {
        return OkStatus();
      }
    }
    return Bad(key, "is " + it->dump() + ", but shardkit's model computes " + meaning);
  }

 private:
  const nlohmann::json& j_;
  std::string file_;
};

// The shortest decimal that reads back as `f` (1e-5f as 1e-05, not
// 9.99999974737875e-06), as config.json files write their floats.
inline double ShortestDecimal(float f) {
  for (int digits = 1; digits < 9; ++digits) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(f));
    const double d = std::strtod(buf, nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return static_cast<double>(f);
}

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_HF_CONFIG_KEYS_H_
