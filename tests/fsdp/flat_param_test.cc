#include "runtime/fsdp/flat_param.h"

#include <gtest/gtest.h>

namespace sk {
namespace {

TEST(FlatParamLayoutTest, AlignsEachParameterAndPadsToEqualShards) {
  auto layout = FlatParamLayout::Make({{"w", Shape{3, 5}}, {"b", Shape{5}}, {"g", Shape{1}}}, 3);
  ASSERT_TRUE(layout.ok());
  const auto& p = layout->params();
  EXPECT_EQ(p[0].offset, 0);
  EXPECT_EQ(p[1].offset, 16);  // 15 rounded up to a multiple of 8
  EXPECT_EQ(p[2].offset, 24);
  EXPECT_EQ(layout->unpadded_numel(), 21);
  EXPECT_EQ(layout->padded_numel(), 48);  // 25 rounded up to a multiple of 3 * 8
  EXPECT_EQ(layout->shard_numel(), 16);
}

// Every element of every parameter is held by exactly one rank, at the place
// the slices say, for many shapes and group sizes.
TEST(FlatParamLayoutTest, ShardSlicesCoverEveryElementExactlyOnce) {
  for (int group = 1; group <= 8; ++group) {
    for (int64_t a : {1, 7, 8, 33}) {
      auto layout = FlatParamLayout::Make({{"a", Shape{a}}, {"b", Shape{2, a}}, {"c", Shape{0}}}, group);
      ASSERT_TRUE(layout.ok());
      std::vector<std::vector<int>> seen;
      for (const auto& p : layout->params()) seen.emplace_back(p.numel, 0);
      for (int r = 0; r < group; ++r) {
        for (const auto& s : layout->ShardSlices(r)) {
          const auto& p = layout->params()[s.param];
          EXPECT_EQ(r * layout->shard_numel() + s.shard_offset, p.offset + s.param_begin);
          EXPECT_LE(s.shard_offset + (s.param_end - s.param_begin), layout->shard_numel());
          for (int64_t k = s.param_begin; k < s.param_end; ++k) ++seen[s.param][k];
        }
      }
      for (const auto& v : seen) {
        for (int c : v) EXPECT_EQ(c, 1);
      }
      EXPECT_EQ(layout->shard_numel() % kFlatAlignElems, 0);
    }
  }
}

TEST(FlatParamLayoutTest, EmptyUnitStillHasAPaddingShard) {
  auto layout = FlatParamLayout::Make({}, 4);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->shard_numel(), kFlatAlignElems);
  EXPECT_TRUE(layout->ShardSlices(3).empty());
}

TEST(FlatParamLayoutTest, RejectsBadInputWithReasons) {
  EXPECT_EQ(FlatParamLayout::Make({{"a", Shape{1}}}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(FlatParamLayout::Make({{"a", Shape{1}}, {"a", Shape{2}}}, 2).status().message().find("'a'"),
            std::string::npos);
  EXPECT_EQ(FlatParamLayout::Make({{"", Shape{1}}}, 2).status().code(), StatusCode::kInvalidArgument);
  auto layout = *FlatParamLayout::Make({{"a", Shape{1}}}, 2);
  EXPECT_EQ(*layout.Find("a"), 0);
  EXPECT_EQ(layout.Find("z").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace sk
