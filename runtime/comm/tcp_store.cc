#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <system_error>
#include <thread>
#include <vector>

#include "runtime/comm/store.h"
#include "runtime/comm/store_io.h"

namespace sk::comm {

namespace {

using store_io::Clock;
using store_io::ConnectBefore;
using store_io::Errno;
using store_io::RecvAll;
using store_io::SendAll;
using store_io::WaitReady;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
// kRejected: a well-formed request the server refuses (an Add to a value that
// is not a counter, or one that overflows); the reply value says why.
enum Reply : uint8_t { kOk = 0, kTimeout = 1, kRejected = 2 };

// Strings arrive in chunks of at most this, so that a length prefix alone
// (up to TcpStore::kMaxBytes) allocates nothing the peer has not sent.
constexpr size_t kRecvChunk = size_t{1} << 20;

// The server ends a Get's wait this much before the client's deadline, so
// that its "not set" reply arrives in time and the client waits exactly its
// timeout (it used to wait a fixed 10 s more for the reply).
Duration ReplyMargin(Duration timeout) { return std::min(Duration(100), timeout / 2); }

// `s` must be at most TcpStore::kMaxBytes long (its length is sent in 4 bytes).
Status SendString(int fd, const std::string& s, Clock::time_point deadline) {
  uint32_t len = static_cast<uint32_t>(s.size());
  SK_RETURN_IF_ERROR(SendAll(fd, &len, 4, deadline));
  return SendAll(fd, s.data(), s.size(), deadline);
}

// A length-prefixed string. DataLoss if the peer announces more than
// TcpStore::kMaxBytes; memory grows only as the bytes arrive.
Status RecvString(int fd, std::string* s, Clock::time_point deadline) {
  uint32_t len = 0;
  SK_RETURN_IF_ERROR(RecvAll(fd, &len, 4, deadline));
  if (len > TcpStore::kMaxBytes) {
    return DataLossError("store: the peer announced a " + std::to_string(len) +
                         "-byte string, over the limit of " + std::to_string(TcpStore::kMaxBytes) +
                         " bytes (not a TcpStore peer?)");
  }
  s->clear();
  while (s->size() < len) {
    const size_t have = s->size();
    const size_t chunk = std::min<size_t>(len - have, kRecvChunk);
    s->resize(have + chunk);
    SK_RETURN_IF_ERROR(RecvAll(fd, s->data() + have, chunk, deadline));
  }
  return OkStatus();
}

}  // namespace

// Serves the key-value map: one thread accepts, one thread per client, for
// at most MaxClients() clients at a time.
class TcpStoreServer {
 public:
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(int port) {
    int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
    bool v6 = fd >= 0;
    if (!v6) fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return UnavailableError(Errno("store server: socket"));
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (v6) {
      int zero = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_addr = in6addr_any;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    } else {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    }
    if (rc != 0 || ::listen(fd, 128) != 0) {
      Status s = UnavailableError(Errno(("store server: bind/listen on port " +
                                         std::to_string(port)).c_str()));
      ::close(fd);
      return s;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    int actual = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(fd, actual));
  }

  ~TcpStoreServer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_thread_.join();
    for (auto& [id, t] : client_threads_) t.join();
    ::close(listen_fd_);
  }

  int port() const { return port_; }

  // Half the process's soft descriptor limit (at least 16): each client holds
  // a descriptor and a thread, and a peer opening idle connections without
  // end must not take the descriptors the rest of the process (gloo's
  // sockets, checkpoint files) needs. A connection beyond it is closed at
  // once (its client sees the connection closed) and logged.
  static size_t MaxClients() {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return size_t{1} << 16;
    return std::max<size_t>(16, static_cast<size_t>(lim.rlim_cur) / 2);
  }

 private:
  TcpStoreServer(int fd, int port) : listen_fd_(fd), port_(port), max_clients_(MaxClients()) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  void AcceptLoop() {
    for (;;) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      int r = ::poll(&pfd, 1, 200);
      std::vector<std::thread> finished;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        for (uint64_t id : finished_) {
          auto it = client_threads_.find(id);
          finished.push_back(std::move(it->second));
          client_threads_.erase(it);
        }
        finished_.clear();
      }
      // Joined as they end: an unjoined thread keeps its stack, and thousands
      // of short connections would exhaust the process's memory map.
      for (auto& t : finished) t.join();
      if (r <= 0) continue;
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        // Out of descriptors or memory: the pending connection stays queued
        // and poll would report it at once; do not spin.
        if (errno != EINTR && errno != ECONNABORTED) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) {
        ::close(fd);
        return;
      }
      if (clients_.size() >= max_clients_) {
        // Logged once per 1000 refusals: a flood must not flood the log too.
        if (refused_++ % 1000 == 0) {
          LOG(WARNING) << "store server on port " << port_ << ": refusing a connection: "
                       << clients_.size() << " clients are connected, the limit (half the "
                       << "process's descriptor limit, ulimit -n) is " << max_clients_ << "; "
                       << refused_ << " refused so far";
        }
        ::close(fd);
        continue;
      }
      const uint64_t id = next_id_++;
      try {
        client_threads_.emplace(id, std::thread([this, fd, id] { Serve(fd, id); }));
      } catch (const std::system_error& e) {
        // No thread for this client (the process is at its thread limit):
        // it sees its connection closed; the server keeps serving the others.
        LOG(WARNING) << "store server on port " << port_ << ": dropping a connection: " << e.what();
        ::close(fd);
        continue;
      }
      clients_.push_back(fd);
    }
  }

  void Serve(int fd, uint64_t id) {
    // A client may stay idle for a whole training run: requests have no deadline.
    const auto forever = Clock::time_point::max();
    for (;;) {
      uint8_t op = 0;
      std::string key, value;
      if (!RecvAll(fd, &op, 1, forever).ok() || !RecvString(fd, &key, forever).ok() ||
          !RecvString(fd, &value, forever).ok()) {
        break;
      }
      uint8_t reply = kOk;
      std::string out;
      if ((op == kGet || op == kAdd) && value.size() != sizeof(int64_t)) {
        break;  // not our protocol (Get and Add carry 8 bytes): drop the connection
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) break;
      if (op == kSet) {
        data_[key] = value;
        cv_.notify_all();
      } else if (op == kGet) {
        int64_t ms = 0;
        std::memcpy(&ms, value.data(), sizeof(ms));
        // A client asks for at most kMaxTimeout; clamping keeps a foreign
        // value from overflowing the clock arithmetic.
        ms = std::clamp<int64_t>(ms, 0, kMaxTimeout.count());
        bool found = cv_.wait_for(lock, Duration(ms),
                                  [&] { return stop_ || data_.count(key) > 0; });
        if (found && data_.count(key) > 0) {
          out = data_[key];
        } else {
          reply = kTimeout;
        }
      } else if (op == kAdd) {
        int64_t delta = 0, current = 0, sum = 0;
        std::memcpy(&delta, value.data(), sizeof(delta));
        auto it = data_.find(key);
        if (it != data_.end() && it->second.size() != sizeof(current)) {
          reply = kRejected;
          out = "it holds a " + std::to_string(it->second.size()) +
                "-byte value set by Set, not a counter made by Add";
        } else {
          if (it != data_.end()) std::memcpy(&current, it->second.data(), sizeof(current));
          if (__builtin_add_overflow(current, delta, &sum)) {
            reply = kRejected;
            out = "adding " + std::to_string(delta) + " to its value " + std::to_string(current) +
                  " overflows a 64-bit integer";
          } else {
            out.assign(reinterpret_cast<const char*>(&sum), sizeof(sum));
            data_[key] = out;
            cv_.notify_all();
          }
        }
      } else {
        break;  // not our protocol: drop the connection
      }
      lock.unlock();
      if (!SendAll(fd, &reply, 1, forever).ok() || !SendString(fd, out, forever).ok()) break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
      if (*it == fd) {
        clients_.erase(it);
        break;
      }
    }
    ::close(fd);
    finished_.push_back(id);
  }

  const int listen_fd_;
  const int port_;
  const size_t max_clients_;
  uint64_t refused_ = 0;  // connections closed for being over max_clients_ (under mu_)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, std::string> data_;
  std::vector<int> clients_;
  std::thread accept_thread_;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::thread> client_threads_;
  std::vector<uint64_t> finished_;  // ids of client threads that have ended, to join
};

StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const std::string& host, int port, bool serve,
                                                     Duration timeout) {
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("store port " + std::to_string(port) + " is not a TCP port");
  }
  if (!serve && port == 0) return InvalidArgumentError("a store client needs a port, got 0");
  if (timeout.count() <= 0 || timeout > kMaxTimeout) {
    return InvalidArgumentError("store timeout " + std::to_string(timeout.count()) + " ms is not in (0, " +
                                std::to_string(kMaxTimeout.count()) + "]");
  }
  std::unique_ptr<TcpStoreServer> server;
  if (serve) {
    SK_ASSIGN_OR_RETURN(server, TcpStoreServer::Start(port));
    port = server->port();
  }
  SK_ASSIGN_OR_RETURN(int fd, store_io::ConnectWithRetry(host, port, timeout));
  return std::unique_ptr<TcpStore>(new TcpStore(fd, host, port, std::move(server), timeout));
}

TcpStore::TcpStore(int fd, std::string host, int port, std::unique_ptr<TcpStoreServer> server, Duration timeout)
    : fd_(fd), host_(std::move(host)), port_(port), timeout_(timeout), server_(std::move(server)) {}

std::shared_ptr<Store> TcpStore::NewConnection(Duration timeout) {
  StatusOr<std::unique_ptr<TcpStore>> client = Create(host_, port_, /*serve=*/false, timeout);
  if (!client.ok()) return nullptr;
  return std::shared_ptr<Store>(std::move(client).value());
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

StatusOr<std::string> TcpStore::Request(uint8_t op, const std::string& key,
                                        const std::string& value, Duration timeout) {
  if (key.size() > kMaxBytes || value.size() > kMaxBytes) {
    return InvalidArgumentError("store: a " + std::to_string(key.size()) + "-byte key with a " +
                                std::to_string(value.size()) + "-byte value exceeds the limit of " +
                                std::to_string(kMaxBytes) + " bytes for each");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    return UnavailableError("store: the connection to port " + std::to_string(port_) +
                            " was abandoned after an earlier request failed or got no reply in time");
  }
  const auto deadline = Clock::now() + timeout;
  Status sent = SendAll(fd_, &op, 1, deadline);
  if (sent.ok()) sent = SendString(fd_, key, deadline);
  if (sent.ok()) sent = SendString(fd_, value, deadline);
  if (!sent.ok()) {
    // Part of the request may be on its way: the connection is out of step.
    ::close(fd_);
    fd_ = -1;
    if (sent.code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceededError("store: the server on port " + std::to_string(port_) +
                                   " did not take the request for key '" + key + "' within " +
                                   std::to_string(timeout.count()) + " ms (is rank 0 alive?)");
    }
    return UnavailableError("store: connection to port " + std::to_string(port_) + " lost (" +
                            std::string(sent.message()) + ")");
  }
  uint8_t reply = 0;
  std::string out;
  Status got = RecvAll(fd_, &reply, 1, deadline);
  if (got.ok() && reply != kOk && reply != kTimeout && reply != kRejected) {
    got = DataLossError("store: the reply's status byte " + std::to_string(reply) +
                        " is not one a TcpStore server sends (not a TcpStore server?)");
  }
  if (got.ok()) got = RecvString(fd_, &out, deadline);
  if (!got.ok()) {
    // A reply may still arrive and would answer the next request: this
    // connection is out of step for good.
    ::close(fd_);
    fd_ = -1;
    if (got.code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceededError("store: no reply from the server on port " + std::to_string(port_) +
                                   " within " + std::to_string(timeout.count()) + " ms (key '" + key +
                                   "'; is rank 0 alive?)");
    }
    return got.WithContext("store: request for key '" + key + "' to port " + std::to_string(port_));
  }
  if (reply == kTimeout) {
    return DeadlineExceededError("store: key '" + key + "' was not set within " +
                                 std::to_string(timeout.count()) + " ms");
  }
  if (reply == kRejected) {
    return InvalidArgumentError("store: the server rejected the request for key '" + key + "': " + out);
  }
  return out;
}

Status TcpStore::Set(const std::string& key, const std::string& value) {
  return Request(kSet, key, value, timeout_).status();
}

StatusOr<std::string> TcpStore::Get(const std::string& key, Duration timeout) {
  if (timeout.count() < 0 || timeout > kMaxTimeout) {
    return InvalidArgumentError("store: Get timeout " + std::to_string(timeout.count()) + " ms is not in [0, " +
                                std::to_string(kMaxTimeout.count()) + "]");
  }
  int64_t ms = (timeout - ReplyMargin(timeout)).count();
  return Request(kGet, key, std::string(reinterpret_cast<const char*>(&ms), sizeof(ms)), timeout);
}

StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  SK_ASSIGN_OR_RETURN(std::string out,
                      Request(kAdd, key,
                              std::string(reinterpret_cast<const char*>(&delta), sizeof(delta)),
                              timeout_));
  int64_t v = 0;
  if (out.size() != sizeof(v)) {
    return DataLossError("store: the server on port " + std::to_string(port_) + " answered an Add to key '" +
                         key + "' with " + std::to_string(out.size()) + " bytes, not 8");
  }
  std::memcpy(&v, out.data(), sizeof(v));
  return v;
}

}  // namespace sk::comm
