#include "runtime/comm/c10d_store.h"

#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "runtime/comm/store_io.h"

namespace sk::comm {

namespace {

using store_io::Clock;

constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum Command : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kCancelWait = 12,
  kPing = 13,
};

enum WaitResponse : uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };
enum CheckResponse : uint8_t { kReady = 0, kNotReady = 1 };

// Requests are built whole and sent in one write, as PyTorch's SendBuffer does.
class Request {
 public:
  explicit Request(uint8_t command) { bytes_.push_back(static_cast<char>(command)); }
  template <typename T>
  Request& Value(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Request& Bytes(const std::string& s) {
    Value<uint64_t>(s.size());
    bytes_ += s;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

Status CheckKey(const std::string& key) {
  if (key.size() > C10dStore::kMaxKeyBytes) {
    return InvalidArgumentError("c10d store: a " + std::to_string(key.size()) +
                                "-byte key is over the TCPStore server's limit of " +
                                std::to_string(C10dStore::kMaxKeyBytes) + " bytes");
  }
  return OkStatus();
}

Status CheckValue(const std::string& key, const std::string& value) {
  if (value.size() > C10dStore::kMaxValueBytes) {
    return InvalidArgumentError("c10d store: the " + std::to_string(value.size()) + "-byte value for key '" +
                                key + "' is over the TCPStore server's limit of " +
                                std::to_string(C10dStore::kMaxValueBytes) + " bytes");
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<C10dStore>> C10dStore::Create(const std::string& host, int port, Duration timeout) {
  if (port < 1 || port > 65535) {
    return InvalidArgumentError("c10d store: port " + std::to_string(port) + " is not a TCP port (1..65535)");
  }
  if (timeout.count() <= 0 || timeout > kMaxTimeout) {
    return InvalidArgumentError("c10d store: timeout " + std::to_string(timeout.count()) + " ms is not in (0, " +
                                std::to_string(kMaxTimeout.count()) + "]");
  }
  SK_ASSIGN_OR_RETURN(int fd, store_io::ConnectWithRetry(host, port, timeout));
  std::unique_ptr<C10dStore> store(new C10dStore(fd, host, port, timeout));
  // The server ignores every command but VALIDATE until it has seen the
  // magic number; the PING proves it did (and that this is a TCPStore).
  const uint32_t nonce = static_cast<uint32_t>(::getpid());
  std::lock_guard<std::mutex> lock(store->mu_);
  const std::string what = "validating the c10d TCPStore at " + host + ":" + std::to_string(port);
  SK_RETURN_IF_ERROR(store->SendLocked(
      Request(kValidate).Value(kValidationMagic).bytes() + Request(kPing).Value(nonce).bytes(), what));
  uint32_t echo = 0;
  Status got = store->RecvLocked(&echo, sizeof(echo), Clock::now() + timeout, what);
  if (!got.ok()) {
    return UnavailableError("c10d store: " + host + ":" + std::to_string(port) +
                            " did not answer as PyTorch's TCPStore (its VALIDATE and PING handshake; a server too old to know PING "
                            "cannot answer it) within " +
                            std::to_string(timeout.count()) + " ms: " + std::string(got.message()) +
                            " (TORCHELASTIC_USE_AGENT_STORE=True says torchrun's agent serves the store there)");
  }
  if (echo != nonce) {
    return DataLossError("c10d store: " + host + ":" + std::to_string(port) + " answered PING " +
                         std::to_string(nonce) + " with " + std::to_string(echo) + " (not a c10d TCPStore?)");
  }
  return store;
}

C10dStore::C10dStore(int fd, std::string host, int port, Duration timeout)
    : fd_(fd), host_(std::move(host)), port_(port), timeout_(timeout) {}

C10dStore::~C10dStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<Store> C10dStore::NewConnection(Duration timeout) {
  StatusOr<std::unique_ptr<C10dStore>> client = Create(host_, port_, timeout);
  if (!client.ok()) return nullptr;
  return std::shared_ptr<Store>(std::move(client).value());
}

void C10dStore::AbandonLocked() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status C10dStore::UsableLocked() const {
  if (fd_ >= 0) return OkStatus();
  return UnavailableError("c10d store: the connection to " + host_ + ":" + std::to_string(port_) +
                          " was abandoned after an earlier request failed or got no reply in time");
}

Status C10dStore::SendLocked(const std::string& request, const std::string& what) {
  SK_RETURN_IF_ERROR(UsableLocked());
  Status sent = store_io::SendAll(fd_, request.data(), request.size(), Clock::now() + timeout_);
  if (sent.ok()) return sent;
  // Part of the request may be on its way: the connection is out of step.
  AbandonLocked();
  return UnavailableError("c10d store " + host_ + ":" + std::to_string(port_) + ": " + what + ": " +
                          std::string(sent.message()) + " (is the store's server, torchrun's agent, alive?)");
}

Status C10dStore::RecvLocked(void* data, size_t len, Clock::time_point deadline, const std::string& what) {
  SK_RETURN_IF_ERROR(UsableLocked());
  Status got = store_io::RecvAll(fd_, data, len, deadline);
  if (got.ok()) return got;
  // A late reply would answer the next request: out of step for good.
  AbandonLocked();
  if (got.code() == StatusCode::kDeadlineExceeded) {
    return DeadlineExceededError("c10d store " + host_ + ":" + std::to_string(port_) + ": no reply to " + what +
                                 " within " + std::to_string(timeout_.count()) + " ms");
  }
  return UnavailableError("c10d store " + host_ + ":" + std::to_string(port_) + ": " + what + ": " +
                          std::string(got.message()) + " (the server closed the connection: it refused the "
                          "request, or it is gone)");
}

StatusOr<std::string> C10dStore::RecvBytesLocked(Clock::time_point deadline, const std::string& what) {
  uint64_t len = 0;
  SK_RETURN_IF_ERROR(RecvLocked(&len, sizeof(len), deadline, what));
  if (len > kMaxValueBytes) {
    AbandonLocked();
    return DataLossError("c10d store " + host_ + ":" + std::to_string(port_) + ": the reply to " + what +
                         " announces " + std::to_string(len) + " bytes, over the limit of " +
                         std::to_string(kMaxValueBytes));
  }
  std::string out(len, '\0');
  SK_RETURN_IF_ERROR(RecvLocked(out.data(), out.size(), deadline, what));
  return out;
}

Status C10dStore::Set(const std::string& key, const std::string& value) {
  SK_RETURN_IF_ERROR(CheckKey(key));
  SK_RETURN_IF_ERROR(CheckValue(key, value));
  std::lock_guard<std::mutex> lock(mu_);
  return SendLocked(Request(kSet).Bytes(key).Bytes(value).bytes(), "set of key '" + key + "'");
}

StatusOr<std::string> C10dStore::Get(const std::string& key, Duration timeout) {
  if (timeout.count() < 0 || timeout > kMaxTimeout) {
    return InvalidArgumentError("c10d store: Get timeout " + std::to_string(timeout.count()) + " ms is not in [0, " +
                                std::to_string(kMaxTimeout.count()) + "]");
  }
  SK_RETURN_IF_ERROR(CheckKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "wait for key '" + key + "'";
  SK_RETURN_IF_ERROR(SendLocked(Request(kWait).Value<uint64_t>(1).Bytes(key).bytes(), what));
  uint8_t response = 0;
  Status ready = store_io::WaitReady(fd_, POLLIN, Clock::now() + timeout, "timeout");
  if (ready.ok()) {
    SK_RETURN_IF_ERROR(RecvLocked(&response, 1, Clock::now() + timeout_, what));
    if (response != kStopWaiting) {
      AbandonLocked();
      return DataLossError("c10d store " + host_ + ":" + std::to_string(port_) + ": answered a " + what +
                           " with " + std::to_string(response) + ", not STOP_WAITING (0)");
    }
  } else if (ready.code() == StatusCode::kDeadlineExceeded) {
    // Not set in time: cancel the wait. The key may have come meanwhile, in
    // which case STOP_WAITING precedes WAIT_CANCELED.
    const std::string cancel = "cancel of the " + what;
    SK_RETURN_IF_ERROR(SendLocked(Request(kCancelWait).bytes(), cancel));
    SK_RETURN_IF_ERROR(RecvLocked(&response, 1, Clock::now() + timeout_, cancel));
    if (response == kStopWaiting) {
      SK_RETURN_IF_ERROR(RecvLocked(&response, 1, Clock::now() + timeout_, cancel));
    }
    if (response != kWaitCanceled) {
      AbandonLocked();
      return DataLossError("c10d store " + host_ + ":" + std::to_string(port_) + ": answered the " + cancel +
                           " with " + std::to_string(response) + ", not WAIT_CANCELED (1)");
    }
    return DeadlineExceededError("store: key '" + key + "' was not set within " + std::to_string(timeout.count()) +
                                 " ms (c10d store " + host_ + ":" + std::to_string(port_) + ")");
  } else {
    AbandonLocked();
    return ready;
  }
  const std::string get = "get of key '" + key + "'";
  SK_RETURN_IF_ERROR(SendLocked(Request(kGet).Bytes(key).bytes(), get));
  return RecvBytesLocked(Clock::now() + timeout_, get);
}

StatusOr<int64_t> C10dStore::Add(const std::string& key, int64_t delta) {
  SK_RETURN_IF_ERROR(CheckKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "add to key '" + key + "'";
  SK_RETURN_IF_ERROR(SendLocked(Request(kAdd).Bytes(key).Value<int64_t>(delta).bytes(), what));
  int64_t sum = 0;
  SK_RETURN_IF_ERROR(RecvLocked(&sum, sizeof(sum), Clock::now() + timeout_, what));
  return sum;
}

StatusOr<std::string> C10dStore::CompareSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  SK_RETURN_IF_ERROR(CheckKey(key));
  SK_RETURN_IF_ERROR(CheckValue(key, expected));
  SK_RETURN_IF_ERROR(CheckValue(key, desired));
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "compare-set of key '" + key + "'";
  SK_RETURN_IF_ERROR(SendLocked(Request(kCompareSet).Bytes(key).Bytes(expected).Bytes(desired).bytes(), what));
  return RecvBytesLocked(Clock::now() + timeout_, what);
}

StatusOr<bool> C10dStore::Check(const std::vector<std::string>& keys) {
  Request request(kCheck);
  request.Value<uint64_t>(keys.size());
  for (const std::string& key : keys) {
    SK_RETURN_IF_ERROR(CheckKey(key));
    request.Bytes(key);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "check of " + std::to_string(keys.size()) + " keys";
  SK_RETURN_IF_ERROR(SendLocked(request.bytes(), what));
  uint8_t response = 0;
  SK_RETURN_IF_ERROR(RecvLocked(&response, 1, Clock::now() + timeout_, what));
  if (response != kReady && response != kNotReady) {
    AbandonLocked();
    return DataLossError("c10d store " + host_ + ":" + std::to_string(port_) + ": answered a " + what + " with " +
                         std::to_string(response) + ", not READY (0) or NOT_READY (1)");
  }
  return response == kReady;
}

}  // namespace sk::comm
