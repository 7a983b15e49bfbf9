// Issue 14, item 4: everything read from disk is bounded in size and depth.
// Each case runs in a child process: before the bounds, a deeply nested index
// overflowed the stack (SIGSEGV) and /dev/zero was read until memory ran out,
// which must fail that case, not the whole test binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/safetensors.h"
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

TEST(CheckpointIndexBounds, IndexPointingAtAnEndlessFileIsRefused) {
  const std::string dir = TempDir("endless");
  fs::create_symlink("/dev/zero", dir + "/index.json");
  int rc = InChild([&] {
    StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
    if (ix.ok()) return 1;
    if (ix.status().code() != StatusCode::kInvalidArgument) return 2;
    if (std::string(ix.status().message()).find("index.json") == std::string::npos) return 3;
    if (std::string(ix.status().message()).find("not a regular file") == std::string::npos) return 4;
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


// An index text with files[0].header_crc32 set to `crc` (or the key removed
// when `crc` is absent), re-signed as the writer signs it: the CRC-32 of the
// compact JSON without the "index_crc32" key.
std::string WithHeaderCrc(const std::string& text, std::optional<int64_t> crc) {
  nlohmann::json j = nlohmann::json::parse(text);
  if (crc) {
    j["files"][0]["header_crc32"] = *crc;
  } else {
    j["files"][0].erase("header_crc32");
  }
  j.erase("index_crc32");
  const std::string compact = j.dump();
  j["index_crc32"] = Crc32(compact.data(), compact.size());
  return j.dump(1);
}

// header_crc32: absent in indexes written before it was recorded, which
// still load (-1 in memory). Serialising such an index leaves the key out:
// it wrote -1, which the reader rejects, so an index re-written from an old
// one could not be read back. Outside [0, 2^32) is DataLoss naming the field.
TEST(CheckpointIndexFields, HeaderCrcIsACrcOrAbsent) {
  CheckpointIndex ix;
  ix.checkpoint_id = "test-id";
  ix.model = "gpt-tiny";
  ix.world_size = 1;
  ix.shard_group_size = 1;
  ix.strategy = "FULL_SHARD";
  CheckpointIndex::Unit u;
  u.name = "unit0";
  u.unpadded_numel = u.padded_numel = u.shard_numel = 4;
  u.params.push_back({"w", Shape({2, 2}), 0, 4});
  ix.units.push_back(u);
  ix.files.push_back({CheckpointRankFileName(0), 0, 128, -1});
  const std::string without = SerializeCheckpointIndex(ix, nullptr);
  EXPECT_EQ(without.find("header_crc32"), std::string::npos) << without;
  auto parsed = ParseCheckpointIndex("index.json", without);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->files[0].header_crc32, -1);

  ix.files[0].header_crc32 = 0x1234abcd;
  const std::string with = SerializeCheckpointIndex(ix, nullptr);
  auto round = ParseCheckpointIndex("index.json", with);
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(round->files[0].header_crc32, 0x1234abcd);

  for (int64_t crc : {int64_t{0}, int64_t{0xffffffffll}}) {
    auto r = ParseCheckpointIndex("index.json", WithHeaderCrc(with, crc));
    ASSERT_TRUE(r.ok()) << crc << ": " << r.status();
    EXPECT_EQ(r->files[0].header_crc32, crc);
  }
  auto absent = ParseCheckpointIndex("index.json", WithHeaderCrc(with, std::nullopt));
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->files[0].header_crc32, -1);
  for (int64_t crc : {int64_t{-1}, int64_t{-7}, int64_t{1} << 32}) {
    auto r = ParseCheckpointIndex("index.json", WithHeaderCrc(with, crc));
    ASSERT_FALSE(r.ok()) << crc;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(std::string(r.status().message()).find("files[0].header_crc32"), std::string::npos) << r.status();
  }
}

// The data position of a trainer that reads a dataset: absent unless set,
// round-trips a seed above 2^63 (a decimal string), and a malformed one is
// DataLoss naming the field.
TEST(CheckpointIndexFields, DataPositionRoundTripsAndIsChecked) {
  CheckpointIndex ix;
  ix.checkpoint_id = "test-id";
  ix.model = "gpt-tiny";
  ix.world_size = 1;
  ix.shard_group_size = 1;
  ix.strategy = "FULL_SHARD";
  ix.files.push_back({CheckpointRankFileName(0), 0, 128, -1});
  auto none = ParseCheckpointIndex("index.json", SerializeCheckpointIndex(ix, nullptr));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->data.has_value());

  ix.data = CheckpointIndex::DataPosition{100, 0xfedcba9876543210ull, 30, 8};
  const std::string text = SerializeCheckpointIndex(ix, nullptr);
  auto round = ParseCheckpointIndex("index.json", text);
  ASSERT_TRUE(round.ok()) << round.status();
  ASSERT_TRUE(round->data.has_value());
  EXPECT_EQ(round->data->samples_consumed, 100);
  EXPECT_EQ(round->data->seed, 0xfedcba9876543210ull);
  EXPECT_EQ(round->data->samples_per_epoch, 30);
  EXPECT_EQ(round->data->global_batch, 8);
  EXPECT_EQ(nlohmann::json::parse(text)["data"]["epoch"], 3);

  for (const char* seed : {"-1", "12x", "", "18446744073709551616"}) {
    nlohmann::json j = nlohmann::json::parse(text);
    j["data"]["seed"] = seed;
    j.erase("index_crc32");
    const std::string compact = j.dump();
    j["index_crc32"] = Crc32(compact.data(), compact.size());
    auto r = ParseCheckpointIndex("index.json", j.dump());
    ASSERT_FALSE(r.ok()) << seed;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(std::string(r.status().message()).find("data.seed"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace sk
