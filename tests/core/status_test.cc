#include "runtime/core/status.h"

#include <gtest/gtest.h>

namespace sk {
namespace {

TEST(StatusTest, DefaultIsOkWithEmptyMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoriesCarryCanonicalCodeAndMessage) {
  struct Case {
    Status s;
    StatusCode code;
    const char* name;
  } cases[] = {
      {InvalidArgumentError("a"), StatusCode::kInvalidArgument, "INVALID_ARGUMENT"},
      {FailedPreconditionError("a"), StatusCode::kFailedPrecondition, "FAILED_PRECONDITION"},
      {ResourceExhaustedError("a"), StatusCode::kResourceExhausted, "RESOURCE_EXHAUSTED"},
      {DeadlineExceededError("a"), StatusCode::kDeadlineExceeded, "DEADLINE_EXCEEDED"},
      {UnavailableError("a"), StatusCode::kUnavailable, "UNAVAILABLE"},
      {InternalError("a"), StatusCode::kInternal, "INTERNAL"},
      {NotFoundError("a"), StatusCode::kNotFound, "NOT_FOUND"},
      {DataLossError("a"), StatusCode::kDataLoss, "DATA_LOSS"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.s.ok());
    EXPECT_EQ(c.s.code(), c.code);
    EXPECT_EQ(c.s.message(), "a");
    EXPECT_EQ(c.s.ToString(), std::string(c.name) + ": a");
  }
}

TEST(StatusTest, OkCodeDropsMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, CopiesAreIndependentValues) {
  Status a = InvalidArgumentError("x");
  Status b = a;
  EXPECT_EQ(a, b);
  b = OkStatus();
  EXPECT_FALSE(a.ok());
  EXPECT_TRUE(b.ok());
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
  Status s = UnavailableError("peer 3 closed").WithContext("all_gather #7");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "all_gather #7: peer 3 closed");
  EXPECT_TRUE(OkStatus().WithContext("x").ok());
}

TEST(StatusTest, UnknownCodeValueHasReadableName) {
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(99)), "UNKNOWN_CODE(99)");
}

Status Fails() { return NotFoundError("nope"); }
Status PropagatesThroughMacro(bool fail, int* reached) {
  if (fail) SK_RETURN_IF_ERROR(Fails());
  *reached = 1;
  return OkStatus();
}

TEST(StatusTest, ReturnIfErrorPropagatesFirstError) {
  int reached = 0;
  EXPECT_EQ(PropagatesThroughMacro(true, &reached).code(), StatusCode::kNotFound);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(PropagatesThroughMacro(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd");
  return x / 2;
}
StatusOr<int> Quarter(int x) {
  SK_ASSIGN_OR_RETURN(int h, Half(x));
  SK_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusOrTest, AssignOrReturnYieldsValueOrError) {
  StatusOr<int> ok = Quarter(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 2);
  StatusOr<int> bad = Quarter(6);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(StatusOrTest, HoldsMoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(5);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> v = std::move(p).value();
  EXPECT_EQ(*v, 5);
}

TEST(StatusOrDeathTest, ValueOfErrorIsABug) {
  StatusOr<int> bad = InternalError("boom");
  EXPECT_DEATH((void)bad.value(), "boom");
}

}  // namespace
}  // namespace sk
