// Issue 14, item 2: a write to a dead peer must never kill the process with
// SIGPIPE. Each case runs in a child process with SIGPIPE's default action,
// so a regression kills that child, not the test.
#include "runtime/comm/sigpipe.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace sk::comm {
namespace {

// Runs `body` in a child with SIGPIPE at its default action; returns the
// child's wait status.
template <typename F>
int InChild(F body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// A connected socket whose peer is closed: writing to it raises SIGPIPE.
int DeadPeerSocket() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
  ::close(sv[1]);
  return sv[0];
}

bool SigpipeBlocked() {
  sigset_t cur;
  pthread_sigmask(SIG_BLOCK, nullptr, &cur);
  return sigismember(&cur, SIGPIPE);
}

TEST(SigpipeTest, WithoutTheBlockAWriteToADeadPeerKillsTheProcess) {
  // The control: proves the cases below would fail without ScopedSigpipeBlock.
  int status = InChild([] {
    int fd = DeadPeerSocket();
    (void)!::write(fd, "x", 1);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGPIPE);
}

TEST(SigpipeTest, AWriteInsideTheBlockFailsWithEpipeAndTheProcessLives) {
  int status = InChild([] {
    int fd = DeadPeerSocket();
    {
      ScopedSigpipeBlock block;
      for (int i = 0; i < 3; ++i) {
        if (::write(fd, "x", 1) != -1 || errno != EPIPE) return 10;
      }
    }
    // The mask is restored and the raised SIGPIPEs were discarded, not left
    // pending to kill us now.
    if (SigpipeBlocked()) return 11;
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) return 12;
    return 0;
  });
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SigpipeTest, ThreadsCreatedInsideTheBlockKeepSigpipeBlocked) {
  // Gloo's I/O thread is created with its device, inside the block.
  int status = InChild([] {
    int fd = DeadPeerSocket();
    std::thread io;
    {
      ScopedSigpipeBlock block;
      io = std::thread([fd] {
        for (int i = 0; i < 3; ++i) (void)!::write(fd, "x", 1);
      });
    }
    io.join();
    return SigpipeBlocked() ? 13 : 0;
  });
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(SigpipeTest, NestedBlocksLeaveAnOuterBlockInPlace) {
  sigset_t before;
  pthread_sigmask(SIG_BLOCK, nullptr, &before);
  {
    ScopedSigpipeBlock outer;
    { ScopedSigpipeBlock inner; }
    EXPECT_TRUE(SigpipeBlocked());
  }
  EXPECT_EQ(SigpipeBlocked(), static_cast<bool>(sigismember(&before, SIGPIPE)));
}

}  // namespace
}  // namespace sk::comm
