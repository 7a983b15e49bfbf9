#include "runtime/comm/store_io.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace sk::comm::store_io {

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

Status WaitReady(int fd, short events, Clock::time_point deadline, const char* late) {
  for (;;) {
    const auto remaining = deadline - Clock::now();
    if (remaining <= Clock::duration::zero()) return DeadlineExceededError(late);
    // Rounded up: truncated, the last fraction of a millisecond read as 0 and
    // the wait ended up to 1 ms before its deadline (a Get of 1 s gave up
    // after 999.6 ms in CI).
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(remaining);
    pollfd pfd{fd, events, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return UnavailableError(Errno("store: poll"));
    if (r > 0) return OkStatus();
  }
}

Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t k = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      SK_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline, "store: the peer did not take the request in time"));
      continue;
    }
    if (k <= 0) return UnavailableError(Errno("store: send"));
    p += k;
    len -= static_cast<size_t>(k);
  }
  return OkStatus();
}

Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    SK_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline, "store: no reply in time"));
    ssize_t k = ::recv(fd, p, len, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return UnavailableError("store: connection closed");
    p += k;
    len -= static_cast<size_t>(k);
  }
  return OkStatus();
}

Status ConnectBefore(int fd, const sockaddr* addr, socklen_t addrlen, Clock::time_point deadline) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return UnavailableError(Errno("store: fcntl"));
  }
  if (::connect(fd, addr, addrlen) != 0) {
    if (errno != EINPROGRESS) return UnavailableError(Errno("connect"));
    SK_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline, "connect: timed out"));
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return UnavailableError(Errno("connect"));
    if (err != 0) {
      errno = err;
      return UnavailableError(Errno("connect"));
    }
  }
  if (::fcntl(fd, F_SETFL, flags) != 0) return UnavailableError(Errno("store: fcntl"));
  return OkStatus();
}

StatusOr<int> ConnectWithRetry(const std::string& host, int port, Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      return UnavailableError("store: cannot resolve '" + host + "': " + gai_strerror(gai));
    }
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      Status connected = ConnectBefore(fd, a->ai_addr, a->ai_addrlen, deadline);
      if (connected.ok()) {
        ::freeaddrinfo(res);
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
      }
      last_error = std::string(connected.message());
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (Clock::now() >= deadline) {
      return DeadlineExceededError("store: could not reach " + host + ":" + std::to_string(port) +
                                   " within " + std::to_string(timeout.count()) +
                                   " ms (last error: " + last_error + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace sk::comm::store_io
