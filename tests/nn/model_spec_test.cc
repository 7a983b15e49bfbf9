// ModelSpecBuilder: the rules a model's unit list keeps, checked as each
// unit and parameter is added (what sk_model_spec enforces).
#include "runtime/nn/model_spec.h"
#include "runtime/nn/model.h"

#include <gtest/gtest.h>

#include <string>

namespace sk {
namespace {

ParamSpec Param(const std::string& name, int64_t n, InitKind kind = InitKind::kZeros) {
  ParamSpec p;
  p.name = name;
  p.shape = *Shape::Make({n});
  p.init.kind = kind;
  return p;
}

bool Mentions(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(ModelSpecBuilderTest, UnitsAndParametersAreNumberedInTheOrderAdded) {
  ModelSpecBuilder b;
  EXPECT_EQ(*b.AddUnit("embed"), 0);
  EXPECT_EQ(*b.AddUnit("head"), 1);
  EXPECT_EQ(*b.AddParam(0, Param("w", 3)), 0);
  EXPECT_EQ(*b.AddParam(0, Param("b", 3)), 1);
  EXPECT_EQ(*b.AddParam(1, Param("b", 2)), 0);  // names are per unit
  ASSERT_EQ(b.units().size(), 2u);
  EXPECT_EQ(b.units()[0].params[1].name, "b");
}

TEST(ModelSpecBuilderTest, UnitNamesMustBeNonEmptyUtf8AndUnique) {
  ModelSpecBuilder b;
  ASSERT_TRUE(b.AddUnit("linear").ok());
  Status taken = b.AddUnit("linear").status();
  EXPECT_EQ(taken.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(taken, "already exists")) << taken;
  EXPECT_EQ(b.AddUnit("").status().code(), StatusCode::kInvalidArgument);
  Status bytes = b.AddUnit("unit\xc3").status();
  EXPECT_TRUE(Mentions(bytes, "not valid UTF-8")) << bytes;
  EXPECT_EQ(b.units().size(), 1u);  // nothing refused was added
}

TEST(ModelSpecBuilderTest, BadParametersAreRefusedNamingThem) {
  ModelSpecBuilder b;
  ASSERT_TRUE(b.AddUnit("linear").ok());
  ASSERT_TRUE(b.AddParam(0, Param("w", 4)).ok());
  EXPECT_EQ(b.AddParam(1, Param("x", 1)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.AddParam(-1, Param("x", 1)).status().code(), StatusCode::kOutOfRange);
  Status taken = b.AddParam(0, Param("w", 4)).status();
  EXPECT_TRUE(Mentions(taken, "already")) << taken;
  EXPECT_EQ(b.AddParam(0, Param("", 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(b.AddParam(0, Param("w\xff", 4)).status(), "not valid UTF-8"));
  ParamSpec bad = Param("u", 4, InitKind::kUniform);
  bad.init.a = 1.0f;
  bad.init.b = 0.0f;  // an empty range
  Status init = b.AddParam(0, bad).status();
  EXPECT_EQ(init.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(init, "linear.u")) << init;
  EXPECT_EQ(b.units()[0].params.size(), 1u);
}

// Zeros and ones take no range: whatever a and b say is dropped, not refused.
TEST(ModelSpecBuilderTest, ConstantInitializersIgnoreTheirRange) {
  ModelSpecBuilder b;
  ASSERT_TRUE(b.AddUnit("ln").ok());
  ParamSpec p = Param("g", 4, InitKind::kOnes);
  p.init.a = 7.0f;
  p.init.b = -3.0f;
  ASSERT_TRUE(b.AddParam(0, p).ok());
  EXPECT_EQ(b.units()[0].params[0].init.a, 0.0f);
  EXPECT_EQ(b.units()[0].params[0].init.b, 0.0f);
}

TEST(ModelSpecBuilderTest, TiesNeedAnEarlierOwnerAndComeAfterTheUnitsOwnParameters) {
  ModelSpecBuilder b;
  ASSERT_TRUE(b.AddUnit("embed").ok());
  ASSERT_TRUE(b.AddUnit("head").ok());
  ASSERT_TRUE(b.AddParam(0, Param("w", 3)).ok());
  ASSERT_TRUE(b.AddParam(1, Param("b", 2)).ok());
  EXPECT_EQ(b.AddTiedParam(0, "x", 1, 0).status().code(), StatusCode::kInvalidArgument);  // later owner
  EXPECT_EQ(b.AddTiedParam(1, "x", 0, 5).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.AddTiedParam(1, "x", 2, 0).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.AddTiedParam(1, "b", 0, 0).status().code(), StatusCode::kInvalidArgument);  // name taken
  EXPECT_EQ(b.AddTiedParam(1, "", 0, 0).status().code(), StatusCode::kInvalidArgument);
  StatusOr<int> tied = b.AddTiedParam(1, "w_tied", 0, 0);
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_EQ(*tied, 1);  // after the unit's own parameter
  EXPECT_EQ(b.units()[1].tied[0].owner, "embed.w");
  EXPECT_EQ(b.units()[1].tied[0].shape, b.units()[0].params[0].shape);
  Status late = b.AddParam(1, Param("c", 2)).status();
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late;
}

// ResolveTiedParams keys parameters by their full "<unit>.<param>" name, not
// by the pair: two units whose names and parameters spell the same full
// name declare one parameter twice, and a tied parameter finds its owner by
// the full name however it is split.
TEST(ResolveTiedParamsTest, FullNamesDecideDuplicatesAndOwners) {
  std::vector<UnitSpec> units(2);
  units[0].name = "a";
  units[0].params = {Param("b.c", 4)};
  units[1].name = "a.b";
  units[1].params = {Param("c", 4)};
  StatusOr<std::vector<std::vector<ParamRef>>> twice = ResolveTiedParams(units);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(twice.status(), "parameter 'a.b.c' is declared by two units")) << twice.status();

  units[1].params = {Param("d", 4)};
  units[1].tied = {TiedParamSpec{"head.w", "a.b.c", *Shape::Make({4})}};
  StatusOr<std::vector<std::vector<ParamRef>>> refs = ResolveTiedParams(units);
  ASSERT_TRUE(refs.ok()) << refs.status();
  ASSERT_EQ(refs->size(), 2u);
  EXPECT_TRUE((*refs)[0].empty());
  ASSERT_EQ((*refs)[1].size(), 1u);
  EXPECT_EQ((*refs)[1][0].unit, 0);
  EXPECT_EQ((*refs)[1][0].param, 0);

  units[1].tied[0].owner = "a.b";  // a prefix of a full name is no name
  StatusOr<std::vector<std::vector<ParamRef>>> missing = ResolveTiedParams(units);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(Mentions(missing.status(), "names owner 'a.b', which no unit declares")) << missing.status();
}

}  // namespace
}  // namespace sk
