// Writing small data files for the dataset tests.
#ifndef SHARDKIT_TESTS_DATA_DATA_FILES_H_
#define SHARDKIT_TESTS_DATA_DATA_FILES_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace sk {
namespace testing {

inline std::string DataTempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

inline void WriteText(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!text.empty() && std::fwrite(text.data(), 1, text.size(), f) != text.size()) std::abort();
  std::fclose(f);
}

// Little-endian tokens of `width` bytes, after an llm.c header when `magic` != 0
// (header[2] = `header_count`, or the token count when negative).
inline void WriteTokens(const std::string& path, const std::vector<uint32_t>& tokens, int width,
                        int32_t magic = 0, int32_t version = 0, int64_t header_count = -1) {
  std::string bytes;
  if (magic != 0) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(header_count < 0 ? static_cast<int64_t>(tokens.size()) : header_count);
    for (int32_t h : header) {
      for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((static_cast<uint32_t>(h) >> (8 * b)) & 0xff));
    }
  }
  for (uint32_t t : tokens) {
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
  }
  WriteText(path, bytes);
}

// One JSONL line {"input_ids": [...]} with "labels" when given.
inline std::string JsonlRecord(const std::vector<int>& ids, const std::vector<int>& labels = {}) {
  auto list = [](const std::vector<int>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  std::string s = "{\"input_ids\": " + list(ids);
  if (!labels.empty()) s += ", \"labels\": " + list(labels);
  return s + "}\n";
}

}  // namespace testing
}  // namespace sk

#endif  // SHARDKIT_TESTS_DATA_DATA_FILES_H_
