// One gloo rank (a process) out of memory: every rank's step fails with that
// rank's error, at once, and training goes on (issue 35, defect 2 on gloo).
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

// Paths inside the test's runfiles (the working directory of a bazel test).
constexpr char kLaunch[] = "tools/launch";
constexpr char kWorker[] = "tests/train/gloo_oom_worker";

struct Result {
  int exit_code;
  std::string output;
};

Result RunLauncher(const std::string& args) {
  std::string cmd = std::string(kLaunch) + " --master_port=0 " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r{-1, ""};
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The rest of the line of `out` that starts with `prefix`, or "(missing)".
std::string LineAfter(const std::string& out, const std::string& prefix) {
  size_t at = out.find(prefix);
  if (at == std::string::npos) return "(missing)";
  at += prefix.size();
  return out.substr(at, out.find('\n', at) - at);
}

// Rank 1 alone has a memory cap none and half of the way from
// what its step starts with to the step's peak. Before, the other ranks
// waited out their timeout (DeadlineExceeded, naming no out-of-memory) and
// the gloo context was broken, so every later step failed too.
TEST(GlooOutOfMemory, OneRankOutOfMemoryFailsTheStepOnEveryRankWithItsErrorAndTrainingGoesOn) {
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    // 10 s: a failure that waited for a timeout shows as a step of 10 s or more.
    Result r = RunLauncher("--nproc_per_node=" + std::to_string(ranks) + " --kill_grace_s=2 " + kWorker + " 10000");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string me = "[rank " + std::to_string(rank) + "] ";
      for (int trial = 0; trial < 2; ++trial) {
        const std::string t = "trial " + std::to_string(trial) + ": ";
        const std::string step = LineAfter(r.output, me + t);
        SCOPED_TRACE(me + t + step);
        EXPECT_EQ(step.rfind("RESOURCE_EXHAUSTED: rank 1 failed step 2: ", 0), 0u) << r.output;
        EXPECT_NE(step.find("out of memory"), std::string::npos);
        EXPECT_EQ(step.find("desync"), std::string::npos);
        const size_t in = step.rfind(" in ");
        ASSERT_NE(in, std::string::npos);
        EXPECT_LT(std::stod(step.substr(in + 4)), 5.0) << "the failure waited for a timeout";
        EXPECT_NE(r.output.find(me + t + "state unchanged"), std::string::npos)
            << "a failed step changed parameters or optimizer state\n" << r.output;
      }
      EXPECT_EQ(LineAfter(r.output, me + "next step: "), "OK, loss equals the reference's") << r.output;
    }
  }
}

}  // namespace
