#ifndef SHARDKIT_TESTS_UTIL_CHILD_PROCESS_H_
#define SHARDKIT_TESTS_UTIL_CHILD_PROCESS_H_

// Crash cases in a child process: a stack overflow or an exhausted heap fails
// the one test that caused it instead of killing the test binary.

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>

namespace sk::testing {

// Runs `body` (returning an exit code) in a forked child whose address space
// is capped at 2 GiB where no sanitizer needs more (so an unbounded read
// fails there fast instead of exhausting the machine), and returns its exit
// code, or 128 + the signal that killed it.
template <typename F>
int InChild(F body) {
  pid_t pid = ::fork();
  if (pid == 0) {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    struct rlimit lim = {size_t{2} << 30, size_t{2} << 30};
    ::setrlimit(RLIMIT_AS, &lim);
#endif
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace sk::testing

#endif  // SHARDKIT_TESTS_UTIL_CHILD_PROCESS_H_
