// C10dStore: a client of PyTorch's c10d TCPStore, the store torchrun's agent
// serves on MASTER_ADDR:MASTER_PORT when it tells its workers
// TORCHELASTIC_USE_AGENT_STORE=True. Under torchrun no rank may serve a store
// of its own (the port is the agent's), so every rank is a client of this.
//
// Wire protocol (PyTorch's torch/csrc/distributed/c10d/TCPStore.cpp and its
// libuv server, checked against torch 2.15's server by the recorded
// exchanges in tests/comm/testdata/c10d_store/): little-endian; a request is
// a command byte followed by its operands; strings and byte vectors are a
// uint64 length and the bytes.
//   on connect  VALIDATE(0) uint32 0x3C85F7CE (no reply), then
//               PING(13) uint32 nonce -> the same uint32 back
//   SET(1)         key value                  (no reply)
//   COMPARE_SET(2) key expected desired       -> value now stored
//   GET(3)         key                        -> value (the key must exist)
//   ADD(4)         key int64                  -> int64 sum (stored as decimal text)
//   CHECK(5)       uint64 n, n keys           -> uint8 0 ready / 1 not ready
//   WAIT(6)        uint64 n, n keys           -> uint8 0 (STOP_WAITING) once all exist
//   CANCEL_WAIT(12)                           -> uint8 1 (WAIT_CANCELED), after a
//                                                STOP_WAITING if the wait ended first
// Get(key, timeout) is WAIT, then GET, as PyTorch's client does; a WAIT that
// times out is cancelled so the connection stays in step.
//
// Thread safety: all methods may be called from several threads; one
// request at a time per connection. A request that fails midway (no reply
// in time, connection lost) leaves the connection unusable: later requests
// are Unavailable (NewConnection makes another).
#ifndef SHARDKIT_RUNTIME_COMM_C10D_STORE_H_
#define SHARDKIT_RUNTIME_COMM_C10D_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/store.h"

namespace sk::comm {

class C10dStore final : public Store {
 public:
  // The longest key and value PyTorch's libuv server takes (it drops a
  // connection that sends more): a longer one is InvalidArgument here.
  static constexpr size_t kMaxKeyBytes = size_t{8} << 10;
  static constexpr size_t kMaxValueBytes = size_t{8} << 20;

  // Connects to the TCPStore at host:port, retrying until `timeout`, and
  // validates it (VALIDATE, then a PING that must come back). `timeout` also
  // bounds every later reply (Set, Add, CompareSet, Check; a Get's GET after
  // its WAIT). InvalidArgument for a bad port or timeout; Unavailable when
  // host:port does not answer as a c10d TCPStore (e.g. a shardkit TcpStore:
  // is TORCHELASTIC_USE_AGENT_STORE set by mistake?); DeadlineExceeded when
  // it cannot be reached in time.
  static StatusOr<std::unique_ptr<C10dStore>> Create(const std::string& host, int port,
                                                     Duration timeout = kDefaultTimeout);
  ~C10dStore() override;

  Status Set(const std::string& key, const std::string& value) override;
  // WAIT for `key` up to `timeout` (DeadlineExceeded naming the key; the
  // cancellation's reply may add one round trip), then GET it.
  StatusOr<std::string> Get(const std::string& key, Duration timeout) override;
  // The sum; the server keeps it as decimal text (what PyTorch's add does).
  // A key set by Set to something that is not an integer makes PyTorch's
  // server drop the connection: Unavailable.
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  std::shared_ptr<Store> NewConnection(Duration timeout) override;

  // Sets `key` to `desired` if its value is `expected` (or if it is absent
  // and `expected` is empty); returns the value stored afterwards.
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   const std::string& desired);
  // Whether every key of `keys` is set, without waiting.
  StatusOr<bool> Check(const std::vector<std::string>& keys);

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  C10dStore(int fd, std::string host, int port, Duration timeout);
  // Sends `request`; on failure abandons the connection.
  Status SendLocked(const std::string& request, const std::string& what);
  // Receives exactly `len` bytes before `deadline`; on failure abandons.
  Status RecvLocked(void* data, size_t len, std::chrono::steady_clock::time_point deadline,
                    const std::string& what);
  StatusOr<std::string> RecvBytesLocked(std::chrono::steady_clock::time_point deadline,
                                        const std::string& what);
  Status UsableLocked() const;
  void AbandonLocked();

  std::mutex mu_;  // one request at a time on fd_
  int fd_;         // -1 once abandoned
  const std::string host_;
  const int port_;
  const Duration timeout_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_C10D_STORE_H_
