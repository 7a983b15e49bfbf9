// ScopedSigpipeBlock: keeps SIGPIPE from killing the process while a
// library we call (gloo) writes to sockets on this thread.
//
// Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a peer that
// just died raises SIGPIPE, whose default action kills the whole process
// (survivors of a killed peer died this way in 3 of 30 trials under a
// launcher that leaves SIGPIPE's default action, as torchrun does). A library must not change
// the process-wide disposition behind its host's back, so, as libcurl and
// OpenSSL users do, we block SIGPIPE on the calling thread for the duration,
// discard a SIGPIPE raised meanwhile (the write itself fails with EPIPE,
// which gloo reports), and restore the thread's mask. Threads gloo creates
// while this is in scope (its I/O loop, created with the device) inherit the
// blocked mask for their whole life. Cost: two pthread_sigmask calls and one
// sigpending per collective (about a microsecond).
//
// Thread safety: affects only the constructing thread; construct and destroy
// on the same thread. Nesting is fine (an inner block finds SIGPIPE blocked
// and leaves it so).
#ifndef SHARDKIT_RUNTIME_COMM_SIGPIPE_H_
#define SHARDKIT_RUNTIME_COMM_SIGPIPE_H_

#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace sk::comm {

class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    restore_ = pthread_sigmask(SIG_BLOCK, &pipe, &old_) == 0 && !sigismember(&old_, SIGPIPE);
  }
  ~ScopedSigpipeBlock() {
    if (!restore_) return;  // it was blocked already: leave it so
    sigset_t pending;
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t old_;
  bool restore_ = false;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_SIGPIPE_H_
