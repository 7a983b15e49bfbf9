// Store: the key-value rendezvous through which ranks of a multi-process
// group find each other (Gloo's transport addresses, NCCL's unique id).
//
// TcpStore is shardkit's own: rank 0 serves it on MASTER_ADDR:MASTER_PORT and
// every rank (rank 0 included) is a client, so a group can be formed from
// torchrun's environment variables alone, across hosts, with no shared
// filesystem. (Debian's Gloo has no TCP store, and a FileStore directory must
// be on a shared filesystem and fresh per run; see docs/architecture.md.)
//
// Protocol: one request at a time per client connection, each a byte opcode,
// a length-prefixed key and a length-prefixed value; the server answers with
// a status byte and a length-prefixed value. Values are opaque bytes.
//
// Thread safety: all methods may be called from several threads; a client
// serialises its requests on its connection.
#ifndef SHARDKIT_RUNTIME_COMM_STORE_H_
#define SHARDKIT_RUNTIME_COMM_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace sk::comm {

class Store {
 public:
  virtual ~Store() = default;
  // Sets `key` to `value`, replacing any previous value.
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting until some rank has set it.
  // DeadlineExceeded naming the key after `timeout` (not later: a server
  // that does not answer counts against the same timeout); Unavailable if
  // the store cannot be reached.
  virtual StatusOr<std::string> Get(const std::string& key, Duration timeout) = 0;
  // Adds `delta` to the integer at `key` (absent = 0) and returns the sum.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Another client of the same store whose requests do not queue behind
  // this one's (a heartbeat must not wait for a long Get), connected within
  // `timeout` (which also bounds its Set and Add replies), or null when the
  // store has no such thing or cannot be reached in that time.
  virtual std::shared_ptr<Store> NewConnection(Duration timeout) { return nullptr; }
};

// A view of `base` whose keys are prefixed with `prefix` (one store, many groups).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {}
  Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(prefix_ + key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override {
    return base_->Get(prefix_ + key, timeout);
  }
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_->Add(prefix_ + key, delta);
  }
  std::shared_ptr<Store> NewConnection(Duration timeout) override {
    std::shared_ptr<Store> base = base_->NewConnection(timeout);
    return base == nullptr ? nullptr : std::make_shared<PrefixStore>(prefix_, std::move(base));
  }

 private:
  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

class TcpStoreServer;

class TcpStore final : public Store {
 public:
  // Connects to the store at host:port, retrying until `timeout` (the server
  // may start after its clients). With `serve` the store is also served from
  // this process on `port` (all interfaces); port 0 picks a free port,
  // reported by port(). Unavailable if the server cannot be started or reached.
  // `timeout` also bounds each Set and Add (their reply). A request whose
  // reply does not come in time (or that the server does not take in time)
  // leaves the connection unusable: later requests are Unavailable (make a
  // new TcpStore). Add to a key set by Set (not an 8-byte counter), or one
  // that would overflow int64, is InvalidArgument and changes nothing.
  // Keys and values are each at most this long: a longer one is
  // InvalidArgument, and a peer announcing a longer one is a protocol error
  // (the server drops its connection; the client gets DataLoss). The server
  // keeps at most half the process's soft descriptor limit (ulimit -n, at
  // least 16) of connections open; one beyond it is closed at once and
  // logged, and its client gets Unavailable or DataLoss.
  static constexpr size_t kMaxBytes = size_t{256} << 20;

  static StatusOr<std::unique_ptr<TcpStore>> Create(const std::string& host, int port, bool serve,
                                                    Duration timeout = kDefaultTimeout);
  ~TcpStore() override;

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  // A client of the same server (not serving).
  std::shared_ptr<Store> NewConnection(Duration timeout) override;
  int port() const { return port_; }

 private:
  TcpStore(int fd, std::string host, int port, std::unique_ptr<TcpStoreServer> server, Duration timeout);
  StatusOr<std::string> Request(uint8_t op, const std::string& key, const std::string& value,
                                Duration timeout);

  std::mutex mu_;  // one request at a time on fd_
  int fd_;         // -1 once abandoned
  const std::string host_;
  const int port_;
  const Duration timeout_;
  std::unique_ptr<TcpStoreServer> server_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_STORE_H_
