// Issue 14, item 4: everything read from disk is bounded in size and depth.
// Each case runs in a child process: before the bounds, a deeply nested index
// overflowed the stack (SIGSEGV) and /dev/zero was read until memory ran out,
// which must fail that case, not the whole test binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/core/file_io.h"
#include "runtime/fsdp/checkpoint_index.h"
#include "runtime/fsdp/safetensors.h"
#include "tests/util/child_process.h"

namespace sk {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string d = std::string(t ? t : "/tmp") + "/" + name + "." + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

using sk::testing::InChild;

TEST(CheckpointIndexBounds, DeeplyNestedIndexIsDataLossNotAStackOverflow) {
  const std::string dir = TempDir("deep");
  {
    std::ofstream out(dir + "/index.json");
    out << "{\"index_crc32\": 1, \"format\": ";
    out << std::string(1000000, '[') << std::string(1000000, ']') << "}";
  }
  int rc = InChild([&] {
    StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
    if (ix.ok()) return 1;
    if (ix.status().code() != StatusCode::kDataLoss) return 2;
    if (std::string(ix.status().message()).find("nested deeper") == std::string::npos) return 3;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "exit code (128 + signal if it crashed)";
}

TEST(CheckpointIndexBounds, IndexPointingAtAnEndlessFileIsResourceExhausted) {
  const std::string dir = TempDir("endless");
  fs::create_symlink("/dev/zero", dir + "/index.json");
  int rc = InChild([&] {
    StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
    if (ix.ok()) return 1;
    if (ix.status().code() != StatusCode::kResourceExhausted) return 2;
    if (std::string(ix.status().message()).find("index.json") == std::string::npos) return 3;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "exit code (128 + signal if it crashed)";
}

TEST(CheckpointIndexBounds, DeeplyNestedSafetensorsHeaderIsDataLoss) {
  const std::string path = TempDir("deep-st") + "/x.safetensors";
  {
    const std::string header = "{\"__metadata__\": {}, \"x\": " + std::string(100000, '[') +
                                std::string(100000, ']') + "}";
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header;
  }
  int rc = InChild([&] {
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
    if (f.ok()) return 1;
    return f.status().code() == StatusCode::kDataLoss ? 0 : 2;
  });
  EXPECT_EQ(rc, 0);
}

TEST(CheckpointIndexBounds, NestingCheckIgnoresBracketsInStrings) {
  EXPECT_TRUE(CheckJsonNesting(R"({"a": "[[[[[[[[[[\"[[[[", "b": [1, [2]]})", 3, "x").ok());
  EXPECT_EQ(CheckJsonNesting("[[[]]]", 2, "x").code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace sk
