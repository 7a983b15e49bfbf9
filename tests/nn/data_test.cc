#include "runtime/nn/data.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace sk {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

void WriteBytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) {
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  }
  std::fclose(f);
}

TEST(Data, SyntheticStreamIsDeterministicAndInVocabulary) {
  auto a = SyntheticTokenStream(7, 50, 1000);
  auto b = SyntheticTokenStream(7, 50, 1000);
  auto c = SyntheticTokenStream(8, 50, 1000);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  std::vector<int> seen(50, 0);
  for (int32_t t : *a) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 50);
    seen[t]++;
  }
  for (int count : seen) EXPECT_GT(count, 0);
  EXPECT_EQ(SyntheticTokenStream(1, 0, 10).status().code(), StatusCode::kInvalidArgument);
}

TEST(Data, ReadsLittleEndianUint16AndUint32Files) {
  std::string p16 = TempPath("t16.bin"), p32 = TempPath("t32.bin");
  WriteBytes(p16, {0x01, 0x00, 0x34, 0x12, 0xff, 0x00});
  WriteBytes(p32, {0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00});
  auto a = ReadTokenFile(p16, TokenWidth::kUint16, 0x10000);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::vector<int32_t>{1, 0x1234, 255}));
  auto b = ReadTokenFile(p32, TokenWidth::kUint32, 0x20000);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (std::vector<int32_t>{2, 0x10000}));
}

TEST(Data, BadTokenFilesAreClearErrors) {
  auto missing = ReadTokenFile(TempPath("does-not-exist.bin"), TokenWidth::kUint16, 100);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("does-not-exist.bin"), std::string::npos);

  std::string odd = TempPath("odd.bin");
  WriteBytes(odd, {1, 0, 2});
  auto r = ReadTokenFile(odd, TokenWidth::kUint16, 100);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("not a multiple"), std::string::npos) << r.status();

  std::string empty = TempPath("empty.bin");
  WriteBytes(empty, {});
  EXPECT_EQ(ReadTokenFile(empty, TokenWidth::kUint16, 100).status().code(),
            StatusCode::kInvalidArgument);

  std::string big = TempPath("big.bin");
  WriteBytes(big, {1, 0, 200, 0});
  r = ReadTokenFile(big, TokenWidth::kUint16, 100);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("token 1 is 200"), std::string::npos) << r.status();
}

// Tokens are int32: a vocabulary past 2^31 - 1 would let a uint32 token of
// 0xffffffff through as -1 (an out-of-range embedding row), so it is refused.
TEST(Data, VocabularyBeyondInt32IsInvalidArgument) {
  std::string path = TempPath("wide.bin");
  WriteBytes(path, {0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x80});
  for (int64_t vocab : {int64_t{1} << 31, int64_t{1} << 32, (int64_t{1} << 32) + 5,
                        std::numeric_limits<int64_t>::max()}) {
    auto r = ReadTokenFile(path, TokenWidth::kUint32, vocab);
    ASSERT_FALSE(r.ok()) << vocab << ": read token " << (*r)[0];
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("vocab"), std::string::npos) << r.status();
  }
  auto r = ReadTokenFile(path, TokenWidth::kUint32, (int64_t{1} << 31) - 1);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);  // 0xffffffff is outside it
  EXPECT_NE(r.status().message().find("token 0 is 4294967295"), std::string::npos) << r.status();
}

// A directory opens with fopen and seeks to a "size" of 2^63 - 1; /dev/null
// and a pipe are not files of tokens either.
TEST(Data, APathThatIsNotARegularFileIsInvalidArgument) {
  for (const std::string& path : {::testing::TempDir(), std::string("/dev/null")}) {
    auto r = ReadTokenFile(path, TokenWidth::kUint16, 100);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << path << ": " << r.status();
    EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status();
  }
}

TEST(Data, LanguageModelBatchTargetsAreInputsShiftedByOne) {
  auto stream = SyntheticTokenStream(1, 100, 500);
  ASSERT_TRUE(stream.ok());
  auto b = LanguageModelBatch(*stream, 3, 10, 5, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->inputs.size(), 30u);
  for (int r = 0; r < 3; ++r)
    for (int t = 0; t + 1 < 10; ++t) EXPECT_EQ(b->targets[r * 10 + t], b->inputs[r * 10 + t + 1]);
  auto again = LanguageModelBatch(*stream, 3, 10, 5, 0);
  EXPECT_EQ(b->inputs, again->inputs);
  auto next = LanguageModelBatch(*stream, 3, 10, 5, 1);
  EXPECT_NE(b->inputs, next->inputs);
}

TEST(Data, RanksGetTheRowsOfOneGlobalBatch) {
  auto stream = SyntheticTokenStream(2, 100, 500);
  auto global = LanguageModelBatch(*stream, 4, 8, 9, 3, 0, 1);
  auto r0 = LanguageModelBatch(*stream, 2, 8, 9, 3, 0, 2);
  auto r1 = LanguageModelBatch(*stream, 2, 8, 9, 3, 1, 2);
  ASSERT_TRUE(global.ok() && r0.ok() && r1.ok());
  std::vector<int32_t> joined = r0->inputs;
  joined.insert(joined.end(), r1->inputs.begin(), r1->inputs.end());
  EXPECT_EQ(joined, global->inputs);
  EXPECT_EQ(LanguageModelBatch(*stream, 2, 8, 9, 3, 2, 2).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Data, ShortStreamsAreInvalidArgument) {
  std::vector<int32_t> stream(5, 1);
  EXPECT_EQ(LanguageModelBatch(stream, 1, 5, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(LanguageModelBatch(stream, 1, 4, 0, 0).ok());
}

TEST(Data, ReversalBatchReversesTheSourceBehindBos) {
  auto stream = SyntheticTokenStream(3, 50, 200);
  auto b = ReversalBatch(*stream, 2, 6, 4, 0, 1, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 4; ++t) EXPECT_EQ(b->targets[r * 4 + t], b->source[r * 6 + 3 - t]);
    EXPECT_EQ(b->inputs[r * 4], 0);
    for (int t = 1; t < 4; ++t) EXPECT_EQ(b->inputs[r * 4 + t], b->targets[r * 4 + t - 1]);
  }
  EXPECT_EQ(ReversalBatch(*stream, 2, 4, 6, 0, 1, 0).status().code(), StatusCode::kInvalidArgument);
}

// A batch within CheckBatchArgs' 2^40 tokens but beyond the host's memory
// is ResourceExhausted before anything is allocated, for both batch kinds.
TEST(Data, BatchesBeyondHostMemoryAreResourceExhausted) {
  auto stream = SyntheticTokenStream(4, 50, 2048);
  ASSERT_TRUE(stream.ok());
  const int64_t huge = int64_t{1} << 30;  // x 1024 tokens x 4 bytes: 4 TiB per vector
  auto lm = LanguageModelBatch(*stream, huge, 1023, 0, 0);
  EXPECT_EQ(lm.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(lm.status().message()).find("does not fit in host memory"), std::string::npos);
  auto rev = ReversalBatch(*stream, huge, 1024, 512, 0, 0, 0);
  EXPECT_EQ(rev.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(rev.status().message()).find("does not fit in host memory"), std::string::npos);
}

}  // namespace
}  // namespace sk
