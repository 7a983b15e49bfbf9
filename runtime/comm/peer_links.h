// Liveness links: one idle TCP connection between two ranks on different
// machines, so that each sees the other's process end at the speed of the
// transport (issue 47, item 6).
//
// A rank's heartbeat (heartbeat.h) judges a peer on its own machine from
// /proc, at once. A peer on another machine could only be judged from its
// beat standing still: 1.6 s after a kill. But when a process ends, exited or
// killed (SIGKILL included), its kernel closes its sockets, and the other end
// of each connection reads end of file (or a reset) as soon as the FIN (RST)
// arrives, the moment its gloo connections fail too. A link is a connection
// kept only for that: after a greeting each way nothing is sent on it, so
// end of file on it means that the peer's process is gone, never that it
// timed out, failed a collective or closed a group (gloo's own connections
// close then too: they cannot tell a dead peer from a live one that gave
// up). A stopped or hung process keeps its links open: its beats judge it,
// as before. So does a peer whose machine vanished without a FIN (power,
// network).
//
// Who connects: of two linked ranks, the lower one (Connect), to the address
// the higher one published (address(), through the store); this object's
// thread accepts. The greeting checks both ends (the token the acceptor
// published, and both ranks), so a connection to a stranger on a recycled
// port is never taken for a link. A pair that could not be linked is left to
// its beats. Nothing is ever written after the greeting, so a link costs a
// descriptor per peer on another machine and no traffic.
//
// Thread safety: every method may be called from any thread.
#ifndef SHARDKIT_RUNTIME_COMM_PEER_LINKS_H_
#define SHARDKIT_RUNTIME_COMM_PEER_LINKS_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace sk::comm {

class PeerLinks {
 public:
  // Listens on `host` (a name or an address, as gloo's transport takes it) at
  // a free port, for the links of world rank `rank`. Unavailable saying why
  // when it cannot.
  static StatusOr<std::unique_ptr<PeerLinks>> Listen(const std::string& host, int rank);
  ~PeerLinks();  // closes every link (peers then see this process as gone)
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // What a peer needs to connect: "<numeric address> <port> <token>".
  const std::string& address() const { return address_; }

  // Links to each (peer, its published address()) at once, all in
  // parallel, within `timeout`. Returns when each is linked or has failed;
  // the failures, one line each ("rank 3 at ...: connect: Connection
  // refused"), empty when every one is linked. When it returns OK for a
  // peer, that peer has the link too.
  std::vector<std::string> Connect(const std::vector<std::pair<int, std::string>>& peers, Duration timeout);

  enum class State { kNone, kOpen, kClosed };
  // Peer `r`'s link: kClosed once its end read end of file or a reset (its
  // process has exited or was killed); kNone when there is none.
  State Of(int r);
  // Waits up to `wait` until the link of one of `peers` closes (polling
  // those links); returns at once when one is closed or none is open.
  void AwaitClose(const std::vector<int>& peers, Duration wait);

 private:
  struct Request;
  PeerLinks(int listen_fd, int wake_fd, int rank, uint64_t token, std::string address);
  void Run();
  void Wake();
  // Takes `fd` as peer r's link (mu_ held); false if r already has one.
  bool Register(int r, int fd);
  // Of() with mu_ held.
  State OfLocked(int r);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: stop, or new requests
  const int rank_;
  const uint64_t token_;
  const std::string address_;
  std::mutex mu_;
  std::condition_variable cv_;  // a request finished
  bool stop_ = false;
  std::deque<std::shared_ptr<Request>> requests_;  // for the thread to start
  struct Link {
    int fd;
    bool closed;
  };
  std::map<int, Link> links_;  // by peer rank; fds are closed only by the destructor
  std::thread thread_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_PEER_LINKS_H_
