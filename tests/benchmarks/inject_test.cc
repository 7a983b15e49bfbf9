// SK_BENCH_INJECT, the self-test's slowdown switch: parsed counts, names it
// does not mention, and malformed values that must stop the benchmark rather
// than let it measure unchanged code. Each case runs in a child process (the
// variable is read once per process).
#include <cstdlib>

#include <gtest/gtest.h>

#include "benchmarks/util/inject.h"

namespace sk::bench {
namespace {

// Exits with InjectedRepeats(what) after setting SK_BENCH_INJECT to value.
[[noreturn]] void ExitWithRepeats(const char* value, const char* what) {
  setenv("SK_BENCH_INJECT", value, 1);
  std::exit(InjectedRepeats(what));
}

class InjectTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(InjectTest, NamedWorkRepeatsTheGivenCount) {
  EXPECT_EXIT(ExitWithRepeats("fsdp_step:2", "fsdp_step"), ::testing::ExitedWithCode(2), "");
  EXPECT_EXIT(ExitWithRepeats("fsdp_step:2,collectives:3", "collectives"), ::testing::ExitedWithCode(3), "");
}

TEST_F(InjectTest, UnnamedOrUnsetWorkRunsOnce) {
  EXPECT_EXIT(ExitWithRepeats("collectives:4", "fsdp_step"), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(ExitWithRepeats("", "fsdp_step"), ::testing::ExitedWithCode(1), "");
}

TEST_F(InjectTest, MalformedValuesStopWithAMessage) {
  EXPECT_EXIT(ExitWithRepeats("fsdp:2", "fsdp_step"), ::testing::ExitedWithCode(2), "unknown name 'fsdp'");
  EXPECT_EXIT(ExitWithRepeats("fsdp_step", "fsdp_step"), ::testing::ExitedWithCode(2), "has no ':count'");
  EXPECT_EXIT(ExitWithRepeats("fsdp_step:0", "fsdp_step"), ::testing::ExitedWithCode(2), "bad count '0'");
  EXPECT_EXIT(ExitWithRepeats("fsdp_step:2x", "fsdp_step"), ::testing::ExitedWithCode(2), "bad count '2x'");
  EXPECT_EXIT(ExitWithRepeats("collectives:17", "fsdp_step"), ::testing::ExitedWithCode(2), "bad count '17'");
}

}  // namespace
}  // namespace sk::bench
