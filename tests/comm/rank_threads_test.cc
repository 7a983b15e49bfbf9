// RunRankThreads when the rank threads cannot all be created (issue 14,
// item 5): it used to die in std::terminate (std::thread's constructor threw
// std::system_error and the vector of joinable threads was destroyed). The
// failing case runs in a fresh child process (this binary re-executed) that
// drops to an unprivileged user and lowers RLIMIT_NPROC, so thread creation
// really fails with EAGAIN; a regression kills the child, not the run.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"

extern char** environ;

namespace sk::comm {
namespace {

constexpr char kChildEnv[] = "SK_RANK_THREADS_CHILD";
constexpr uid_t kNobody = 65534;

// In the child: as `nobody` with at most 4 processes (this one and 3
// threads), 16 rank threads cannot all be created. Exit codes say what was
// wrong.
int ChildBody() {
  if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 10;
  struct rlimit lim = {4, 4};
  if (::setrlimit(RLIMIT_NPROC, &lim) != 0) return 11;
  std::atomic<int> ran{0};
  std::vector<Status> per_rank;
  Status s = RunRankThreads(16, [&](int) {
    ran.fetch_add(1);
    return OkStatus();
  }, &per_rank);
  if (s.code() != StatusCode::kResourceExhausted) {
    std::fprintf(stderr, "got %s\n", s.ToString().c_str());
    return 12;
  }
  if (std::string(s.message()).find("could not create the thread of rank") == std::string::npos) return 13;
  if (ran.load() != 0) return 14;  // no rank may run while another is missing
  if (per_rank.size() != 16) return 15;
  for (const Status& r : per_rank) {
    if (r.ok()) return 16;
  }
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 0;
}

// Runs this test binary again with kChildEnv set, filtered to `test`; returns
// its exit code, or 128 + signal.
int RunSelf(const std::string& test) {
  std::string filter = "--gtest_filter=" + test;
  char* argv[] = {const_cast<char*>("/proc/self/exe"), filter.data(), nullptr};
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kChildEnv) + "=1");
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(RankThreads, ThreadsThatCannotBeCreatedAreResourceExhaustedNotTerminate) {
  if (std::getenv(kChildEnv) != nullptr) ::_exit(ChildBody());
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root: the child drops to uid " << kNobody
                 << " so that RLIMIT_NPROC counts only its own threads";
  }
  EXPECT_EQ(RunSelf("RankThreads.ThreadsThatCannotBeCreatedAreResourceExhaustedNotTerminate"), 0)
      << "exit code of the child (128 + signal: it crashed; 134 = SIGABRT from std::terminate)";
}

TEST(RankThreads, EveryRankRunsWhenThreadsCanBeCreated) {
  std::atomic<int> ran{0};
  Status s = RunRankThreads(8, [&](int) {
    ran.fetch_add(1);
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ran.load(), 8);
}

}  // namespace
}  // namespace sk::comm
