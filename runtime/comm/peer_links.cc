#include "runtime/comm/peer_links.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>

namespace sk::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// A greeting, each way: "sk-link1", from rank, to rank, the acceptor's token
// (all little-endian). The connector sends the token the acceptor published;
// the acceptor answers with the ranks swapped and the same token.
constexpr size_t kGreetingBytes = 24;
constexpr char kMagic[8] = {'s', 'k', '-', 'l', 'i', 'n', 'k', '1'};

struct Greeting {
  uint32_t from = 0;
  uint32_t to = 0;
  uint64_t token = 0;
};

void Encode(const Greeting& g, unsigned char* out) {
  std::memcpy(out, kMagic, 8);
  for (int i = 0; i < 4; ++i) out[8 + i] = static_cast<unsigned char>(g.from >> (8 * i));
  for (int i = 0; i < 4; ++i) out[12 + i] = static_cast<unsigned char>(g.to >> (8 * i));
  for (int i = 0; i < 8; ++i) out[16 + i] = static_cast<unsigned char>(g.token >> (8 * i));
}

bool Decode(const unsigned char* in, Greeting* g) {
  if (std::memcmp(in, kMagic, 8) != 0) return false;
  *g = Greeting{};
  for (int i = 0; i < 4; ++i) g->from |= static_cast<uint32_t>(in[8 + i]) << (8 * i);
  for (int i = 0; i < 4; ++i) g->to |= static_cast<uint32_t>(in[12 + i]) << (8 * i);
  for (int i = 0; i < 8; ++i) g->token |= static_cast<uint64_t>(in[16 + i]) << (8 * i);
  return true;
}

// What recv says about a link: its peer closed it (end of file, a reset),
// or not. Bytes a peer should not have sent are read and dropped, so that
// they cannot hide an end of file behind them.
bool PeerClosed(int fd) {
  for (;;) {
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN;
    }
    if (::recv(fd, buf, static_cast<size_t>(n), MSG_DONTWAIT) <= 0) return false;
  }
}

int MillisUntil(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
}

}  // namespace

// One Connect's peer, shared by the caller (waiting for `done`) and the
// thread (which makes the link).
struct PeerLinks::Request {
  int peer = -1;
  std::string address;
  Clock::time_point deadline;
  bool done = false;  // under mu_
  std::string error;  // under mu_: why it failed, "" when linked
};

StatusOr<std::unique_ptr<PeerLinks>> PeerLinks::Listen(const std::string& host, int rank) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), "0", &hints, &res);
  if (gai != 0) return UnavailableError("liveness links: cannot resolve '" + host + "': " + gai_strerror(gai));
  std::string last = "no address";
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = Errno("socket");
      continue;
    }
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last = Errno("bind/listen");
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) return UnavailableError("liveness links: cannot listen on '" + host + "': " + last);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  char numeric[NI_MAXHOST] = {};
  char port[NI_MAXSERV] = {};
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, numeric, sizeof numeric, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    ::close(fd);
    return UnavailableError(Errno("liveness links: getsockname"));
  }
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    ::close(fd);
    return UnavailableError(Errno("liveness links: eventfd"));
  }
  std::random_device entropy;
  const uint64_t token = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  return std::unique_ptr<PeerLinks>(new PeerLinks(
      fd, wake, rank, token, std::string(numeric) + " " + port + " " + std::to_string(token)));
}

PeerLinks::PeerLinks(int listen_fd, int wake_fd, int rank, uint64_t token, std::string address)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), rank_(rank), token_(token), address_(std::move(address)) {
  thread_ = std::thread([this] { Run(); });
}

PeerLinks::~PeerLinks() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
  for (auto& [r, link] : links_) ::close(link.fd);
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void PeerLinks::Wake() {
  const uint64_t one = 1;
  while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

bool PeerLinks::Register(int r, int fd) {
  if (links_.count(r) != 0) return false;
  links_[r] = Link{fd, false};
  return true;
}

std::vector<std::string> PeerLinks::Connect(const std::vector<std::pair<int, std::string>>& peers,
                                            Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::shared_ptr<Request>> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [peer, address] : peers) {
      auto req = std::make_shared<Request>();
      req->peer = peer;
      req->address = address;
      req->deadline = deadline;
      mine.push_back(req);
      requests_.push_back(std::move(req));
    }
  }
  Wake();
  std::vector<std::string> failures;
  std::unique_lock<std::mutex> lock(mu_);
  // The thread finishes each by its deadline; a second more for it to run.
  cv_.wait_until(lock, deadline + std::chrono::seconds(1), [&] {
    return std::all_of(mine.begin(), mine.end(), [](const auto& r) { return r->done; });
  });
  for (const auto& r : mine) {
    if (!r->done) {
      failures.push_back("rank " + std::to_string(r->peer) + " at " + r->address + ": not linked in time");
    } else if (!r->error.empty()) {
      failures.push_back("rank " + std::to_string(r->peer) + " at " + r->address + ": " + r->error);
    }
  }
  return failures;
}

PeerLinks::State PeerLinks::OfLocked(int r) {
  auto it = links_.find(r);
  if (it == links_.end()) return State::kNone;
  if (!it->second.closed && PeerClosed(it->second.fd)) it->second.closed = true;
  return it->second.closed ? State::kClosed : State::kOpen;
}

PeerLinks::State PeerLinks::Of(int r) {
  std::lock_guard<std::mutex> lock(mu_);
  return OfLocked(r);
}

void PeerLinks::AwaitClose(const std::vector<int>& peers, Duration wait) {
  const auto deadline = Clock::now() + wait;
  for (;;) {
    std::vector<pollfd> fds;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int r : peers) {
        switch (OfLocked(r)) {
          case State::kClosed:
            return;
          case State::kOpen:
            fds.push_back({links_[r].fd, static_cast<short>(POLLIN | POLLRDHUP), 0});
            break;
          case State::kNone:
            break;
        }
      }
    }
    if (fds.empty() || Clock::now() >= deadline) return;
    // Link descriptors stay open until the destructor: polling them
    // outside the lock is safe.
    if (::poll(fds.data(), fds.size(), MillisUntil(deadline)) < 0 && errno != EINTR) return;
  }
}

void PeerLinks::Run() {
  // Connections accepted whose greeting has not all come, and links being
  // made for Connect.
  struct Incoming {
    int fd;
    Clock::time_point deadline;
    unsigned char buf[kGreetingBytes];
    size_t got = 0;
  };
  struct Outgoing {
    std::shared_ptr<Request> req;
    int fd = -1;
    uint64_t token = 0;  // the peer's
    bool connected = false;
    unsigned char buf[kGreetingBytes];
    size_t got = 0;
  };
  std::vector<Incoming> incoming;
  std::vector<Outgoing> outgoing;
  auto finish = [&](Outgoing& o, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (o.fd >= 0 && (!error.empty() || !Register(o.req->peer, o.fd))) ::close(o.fd);
    o.fd = -1;
    o.req->done = true;
    o.req->error = error;
    cv_.notify_all();
  };
  auto start = [&](std::shared_ptr<Request> req) {
    Outgoing o;
    o.req = std::move(req);
    std::istringstream in(o.req->address);
    std::string host, port;
    in >> host >> port >> o.token;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (in.fail() || ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) {
      finish(o, "not an address");
      return;
    }
    o.fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    std::string error;
    if (o.fd < 0) {
      error = Errno("socket");
    } else if (::connect(o.fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = Errno("connect");
    }
    ::freeaddrinfo(res);
    if (!error.empty()) {
      finish(o, error);
      return;
    }
    outgoing.push_back(std::move(o));
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) break;
      std::deque<std::shared_ptr<Request>> fresh;
      fresh.swap(requests_);
      lock.unlock();
      for (auto& req : fresh) start(std::move(req));
    }
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const Incoming& i : incoming) fds.push_back({i.fd, POLLIN, 0});
    for (const Outgoing& o : outgoing) fds.push_back({o.fd, static_cast<short>(o.connected ? POLLIN : POLLOUT), 0});
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);
    for (const Incoming& i : incoming) next = std::min(next, i.deadline);
    for (const Outgoing& o : outgoing) next = std::min(next, o.req->deadline);
    if (::poll(fds.data(), fds.size(), MillisUntil(next)) < 0 && errno != EINTR) {
      LOG(WARNING) << "liveness links of rank " << rank_ << ": " << Errno("poll");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const auto now = Clock::now();
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      while (::read(wake_fd_, &count, sizeof count) < 0 && errno == EINTR) {
      }
    }
    size_t at = 2;
    for (auto it = incoming.begin(); it != incoming.end(); ++at) {
      Incoming& i = *it;
      bool drop = now >= i.deadline;
      bool linked = false;
      if (!drop && fds[at].revents != 0) {
        const ssize_t n = ::recv(i.fd, i.buf + i.got, kGreetingBytes - i.got, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) drop = true;
        if (n > 0) i.got += static_cast<size_t>(n);
        Greeting g;
        if (i.got == kGreetingBytes) {
          // From a lower rank of this world, for this rank, with our token.
          if (!Decode(i.buf, &g) || g.to != static_cast<uint32_t>(rank_) || g.token != token_ ||
              g.from >= static_cast<uint32_t>(rank_)) {
            drop = true;
          } else {
            std::lock_guard<std::mutex> lock(mu_);
            // Registered before the answer: once the connector has it, both
            // ends are linked.
            linked = Register(static_cast<int>(g.from), i.fd);
            drop = !linked;
          }
          if (linked) {
            unsigned char answer[kGreetingBytes];
            Encode(Greeting{static_cast<uint32_t>(rank_), g.from, token_}, answer);
            // 24 bytes into a fresh connection's empty buffer: sent at once
            // or the peer is gone already (which the link then shows).
            if (::send(i.fd, answer, sizeof answer, MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof answer) {
              LOG(WARNING) << "liveness links of rank " << rank_ << ": " << Errno("answering rank " + std::to_string(g.from));
            }
          }
        }
      }
      if (drop || linked) {
        if (drop) ::close(i.fd);
        it = incoming.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = outgoing.begin(); it != outgoing.end(); ++at) {
      Outgoing& o = *it;
      std::string error;
      bool linked = false;
      if (fds[at].revents != 0 && !o.connected) {
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(o.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err != 0) {
          errno = err;
          error = Errno("connect");
        } else {
          unsigned char hello[kGreetingBytes];
          Encode(Greeting{static_cast<uint32_t>(rank_), static_cast<uint32_t>(o.req->peer), o.token}, hello);
          if (::send(o.fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof hello) {
            error = Errno("send");
          }
          o.connected = true;
        }
      } else if (fds[at].revents != 0) {
        const ssize_t n = ::recv(o.fd, o.buf + o.got, kGreetingBytes - o.got, MSG_DONTWAIT);
        if (n == 0) error = "closed before answering";
        if (n < 0 && errno != EAGAIN && errno != EINTR) error = Errno("recv");
        if (n > 0) o.got += static_cast<size_t>(n);
        Greeting g;
        if (error.empty() && o.got == kGreetingBytes) {
          if (!Decode(o.buf, &g) || g.from != static_cast<uint32_t>(o.req->peer) ||
              g.to != static_cast<uint32_t>(rank_) || g.token != o.token) {
            error = "answered with another greeting: not that rank's liveness link";
          } else {
            linked = true;
          }
        }
      }
      if (error.empty() && !linked && now >= o.req->deadline) error = "timed out";
      if (!error.empty() || linked) {
        finish(o, error);
        it = outgoing.erase(it);
      } else {
        ++it;
      }
    }
    // Last: the entries above are those polled (fds' order).
    if (fds[1].revents != 0) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN: none left (others: the next poll tries again)
        Incoming i;
        i.fd = fd;
        i.deadline = now + std::chrono::seconds(10);
        incoming.push_back(i);
      }
    }
  }
  for (Incoming& i : incoming) ::close(i.fd);
  for (Outgoing& o : outgoing) {
    std::lock_guard<std::mutex> lock(mu_);
    ::close(o.fd);
    o.req->done = true;
    o.req->error = "the links were closed";
  }
  cv_.notify_all();
}

}  // namespace sk::comm
