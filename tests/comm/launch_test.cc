// The launcher and the gloo backend with real processes on loopback.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace {

// Paths inside the test's runfiles (the working directory of a bazel test).
constexpr char kLaunch[] = "runtime/comm/launch";
constexpr char kWorker[] = "tests/comm/gloo_worker";

struct Result {
  int exit_code;
  std::string output;
  double seconds;
};

Result RunLauncher(const std::string& args) {
  auto start = std::chrono::steady_clock::now();
  std::string cmd = std::string(kLaunch) + " --master_port=0 " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r{-1, "", 0};
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

bool Has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(Launch, TwoGlooRanksRunEveryCollective) {
  Result r = RunLauncher(std::string("--nproc_per_node=2 ") + kWorker + " collectives");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 0] rank 0 of 2: all collectives match the reference")) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 1] rank 1 of 2: all collectives match the reference")) << r.output;
}

TEST(Launch, FourGlooRanksRunEveryCollective) {
  Result r = RunLauncher(std::string("--nproc_per_node=4 ") + kWorker + " collectives");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(Has(r.output, "[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                                  " of 4: all collectives match"))
        << r.output;
  }
}

TEST(Launch, RankExitingMidCollectiveMakesTheOthersFailInTime) {
  Result r = RunLauncher(std::string("--nproc_per_node=3 ") + kWorker + " exit_mid_collective");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 2] rank 2 leaving mid-collective (the rest in flight)")) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 0] rank 0 failed as expected")) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 1] rank 1 failed as expected")) << r.output;
}

TEST(Launch, ACrashedRankStopsTheOthersAndTheLauncherFails) {
  Result r = RunLauncher(std::string("--nproc_per_node=3 --kill_grace_s=2 ") + kWorker + " crash");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(Has(r.output, "launch: rank 1 exited with code 3; stopping the other ranks")) << r.output;
  EXPECT_FALSE(Has(r.output, "was not stopped by the launcher")) << r.output;
  EXPECT_LT(r.seconds, 60.0);
}

TEST(Launch, EnvironmentAndPrefixes) {
  Result r = RunLauncher("--nproc_per_node=2 --nnodes=2 --node_rank=1 --master_port=1234 /bin/sh -c "
                 "'echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$MASTER_ADDR:$MASTER_PORT; "
                 "printf partial'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 2] 2/4/0/2/127.0.0.1:1234")) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 3] 3/4/1/2/127.0.0.1:1234")) << r.output;
  EXPECT_TRUE(Has(r.output, "[rank 3] partial")) << r.output;
}

TEST(Launch, BadUsageIsReported) {
  Result r = RunLauncher("--nproc_per_node=0 /bin/true");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.output, "--nproc_per_node=0 must be an integer")) << r.output;
  r = RunLauncher("--nproc_per_node=1 /nonexistent/program");
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_TRUE(Has(r.output, "cannot execute /nonexistent/program")) << r.output;
}

}  // namespace
