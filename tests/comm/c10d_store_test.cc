// C10dStore (runtime/comm/c10d_store.h) against recorded exchanges of
// PyTorch's own TCPStore client and server (tests/comm/testdata/c10d_store/,
// recorded by tools/interop/record_c10d_store.py): a fake server replays each
// connection's script, checks every byte C10dStore sends against what
// PyTorch's client sent, and answers what PyTorch's server answered.
#include "runtime/comm/c10d_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace sk::comm {
namespace {

struct Step {
  bool from_client = false;
  bool eof = false;
  std::vector<int> bytes;  // -1: any byte (a '>' line) or the captured one (a '<' line)
};
using Script = std::vector<Step>;

std::vector<Script> LoadFixture(const std::string& name) {
  const std::string path = "tests/comm/testdata/c10d_store/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<Script> scripts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("conn ", 0) == 0) {
      scripts.emplace_back();
      continue;
    }
    Step step;
    step.from_client = line[0] == '>';
    const std::string hex = line.substr(2);
    if (hex == "EOF") {
      step.eof = true;
    } else {
      for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        step.bytes.push_back(hex[i] == '?' ? -1 : std::stoi(hex.substr(i, 2), nullptr, 16));
      }
    }
    scripts.back().push_back(step);
  }
  return scripts;
}

std::string Hex(const std::vector<uint8_t>& b) {
  std::string s;
  char buf[3];
  for (uint8_t c : b) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    s += buf;
  }
  return s;
}

// Serves one script per accepted connection, in accept order.
class FakeServer {
 public:
  explicit FakeServer(std::vector<Script> scripts) : scripts_(std::move(scripts)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_ = std::thread([this] {
      for (size_t i = 0; i < scripts_.size(); ++i) {
        pollfd p{listen_fd_, POLLIN, 0};
        if (::poll(&p, 1, 20'000) <= 0) return;
        int fd = ::accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) return;
        serving_.emplace_back([this, fd, i] { Serve(fd, scripts_[i], i); });
      }
    });
  }
  ~FakeServer() {
    accept_.join();
    for (auto& t : serving_) t.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  // Every mismatch and every script step left unplayed; empty when the client
  // sent exactly what PyTorch's client sent.
  std::vector<std::string> Errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  // Waits until connection `i`'s script has been played (or failed).
  void WaitDone(size_t n) {
    for (int t = 0; t < 2000 && done_.load() < n; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

 private:
  void Fail(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.push_back(e);
  }

  void Serve(int fd, const Script& script, size_t conn) {
    std::vector<uint8_t> captured;
    for (size_t s = 0; s < script.size(); ++s) {
      const Step& step = script[s];
      const std::string where = "conn " + std::to_string(conn) + " step " + std::to_string(s);
      if (step.eof) break;
      if (step.from_client) {
        std::vector<uint8_t> got(step.bytes.size());
        size_t have = 0;
        while (have < got.size()) {
          pollfd p{fd, POLLIN, 0};
          if (::poll(&p, 1, 10'000) <= 0) break;
          ssize_t k = ::recv(fd, got.data() + have, got.size() - have, 0);
          if (k <= 0) break;
          have += static_cast<size_t>(k);
        }
        got.resize(have);
        std::vector<uint8_t> want;
        bool match = have == step.bytes.size();
        for (size_t b = 0; b < step.bytes.size(); ++b) {
          if (step.bytes[b] < 0) {
            if (b < have) captured.push_back(got[b]);
            want.push_back(b < have ? got[b] : 0);
          } else {
            want.push_back(static_cast<uint8_t>(step.bytes[b]));
            if (b < have && got[b] != want.back()) match = false;
          }
        }
        if (!match) {
          Fail(where + ": the client sent " + Hex(got) + ", PyTorch's client sent " + Hex(want));
          break;
        }
      } else {
        std::vector<uint8_t> out;
        size_t next = 0;
        for (int b : step.bytes) out.push_back(b >= 0 ? static_cast<uint8_t>(b) : captured.at(next++));
        if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
          Fail(where + ": send failed");
          break;
        }
      }
    }
    ::close(fd);
    ++done_;
  }

  std::vector<Script> scripts_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_;
  std::vector<std::thread> serving_;
  std::mutex mu_;
  std::vector<std::string> errors_;
  std::atomic<size_t> done_{0};
};

template <class T, class U>
T ValueOr(const StatusOr<T>& s, U fallback) {
  return s.ok() ? *s : T(fallback);
}

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

// The operations tools/interop/record_c10d_store.py made with PyTorch's
// client (its keys carry PyTorch's "/" prefix), made with C10dStore.
void ReplayAgainst(const std::string& fixture) {
  FakeServer server(LoadFixture(fixture));
  {
    StatusOr<std::unique_ptr<C10dStore>> made = C10dStore::Create("127.0.0.1", server.port(), Duration(5000));
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    C10dStore& c0 = **made;
    ASSERT_TRUE(c0.Set("/k", "v1").ok());
    EXPECT_EQ(ValueOr(c0.Get("/k", Duration(5000)), "?"), "v1");
    EXPECT_EQ(ValueOr(c0.Add("/ctr", 5), -1), 5);
    EXPECT_EQ(ValueOr(c0.Add("/ctr", -2), -1), 3);
    EXPECT_EQ(ValueOr(c0.Get("/ctr", Duration(5000)), "?"), "3");  // a counter is decimal text
    EXPECT_EQ(ValueOr(c0.CompareSet("/k", "v1", "v2"), "?"), "v2");
    EXPECT_EQ(ValueOr(c0.CompareSet("/k", "zz", "v3"), "?"), "v2");  // no match: the current value
    EXPECT_EQ(ValueOr(c0.CompareSet("/new", "", "n1"), "?"), "n1");  // absent, expected empty: set
    EXPECT_EQ(ValueOr(c0.Check({"/k", "/missing"}), true), false);
    EXPECT_EQ(ValueOr(c0.Check({"/k"}), false), true);
    StatusOr<std::string> missing = c0.Get("/missing", Duration(300));
    EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded) << missing.status().ToString();
    EXPECT_NE(std::string(missing.status().message()).find("'/missing'"), std::string::npos);
    ASSERT_TRUE(c0.Set("/bin", Bytes({0, 1, 255})).ok());
    EXPECT_EQ(ValueOr(c0.Get("/bin", Duration(5000)), "?"), Bytes({0, 1, 255}));
    ASSERT_TRUE(c0.Set("/empty", "").ok());
    EXPECT_EQ(ValueOr(c0.Get("/empty", Duration(5000)), "?"), "");
    server.WaitDone(1);

    std::shared_ptr<Store> c1 = c0.NewConnection(Duration(5000));
    ASSERT_NE(c1, nullptr);
    std::shared_ptr<Store> c2 = c0.NewConnection(Duration(5000));
    ASSERT_NE(c2, nullptr);
    EXPECT_EQ(ValueOr(c1->Get("/late", Duration(5000)), "?"), "here");
    ASSERT_TRUE(c2->Set("/late", "here").ok());
    server.WaitDone(3);

    // The server drops a connection whose add it cannot parse.
    StatusOr<std::unique_ptr<C10dStore>> c3 = C10dStore::Create("127.0.0.1", server.port(), Duration(5000));
    ASSERT_TRUE(c3.ok()) << c3.status().ToString();
    StatusOr<int64_t> bad = (*c3)->Add("/k", 1);
    EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable) << bad.status().ToString();
    StatusOr<int64_t> after = (*c3)->Add("/ctr", 1);
    EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(std::string(after.status().message()).find("abandoned"), std::string::npos) << after.status().ToString();
  }
  for (const std::string& e : server.Errors()) ADD_FAILURE() << fixture << ": " << e;
}

TEST(C10dStore, SpeaksLikePyTorchsClientToTheLibuvServer) { ReplayAgainst("torch_libuv_server.txt"); }

TEST(C10dStore, SpeaksLikePyTorchsClientToTheClassicServer) { ReplayAgainst("torch_classic_server.txt"); }

TEST(C10dStore, RefusesBadArgumentsBeforeSendingAnything) {
  EXPECT_EQ(C10dStore::Create("127.0.0.1", 0, Duration(100)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(C10dStore::Create("127.0.0.1", 70000, Duration(100)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(C10dStore::Create("127.0.0.1", 29500, Duration(0)).status().code(), StatusCode::kInvalidArgument);
  // A handshake only: the long key must never reach the server.
  std::vector<Script> handshake = LoadFixture("torch_libuv_server.txt");
  handshake.resize(1);
  handshake[0].resize(2);
  FakeServer server(handshake);
  StatusOr<std::unique_ptr<C10dStore>> store = C10dStore::Create("127.0.0.1", server.port(), Duration(5000));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string long_key(C10dStore::kMaxKeyBytes + 1, 'k');
  Status set = (*store)->Set(long_key, "v");
  EXPECT_EQ(set.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(set.message()).find("8192"), std::string::npos) << set.ToString();
  EXPECT_EQ((*store)->Get(long_key, Duration(10)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Add(long_key, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Get("k", Duration(-1)).status().code(), StatusCode::kInvalidArgument);
  store->reset();
  server.WaitDone(1);
  EXPECT_TRUE(server.Errors().empty());
}

// A shardkit TcpStore server on the port (TORCHELASTIC_USE_AGENT_STORE set
// where no torchrun agent serves): a clear Unavailable, not a hang.
TEST(C10dStore, NamesAServerThatIsNotATorchStore) {
  StatusOr<std::unique_ptr<TcpStore>> ours = TcpStore::Create("127.0.0.1", 0, /*serve=*/true, Duration(5000));
  ASSERT_TRUE(ours.ok());
  StatusOr<std::unique_ptr<C10dStore>> store = C10dStore::Create("127.0.0.1", (*ours)->port(), Duration(500));
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable) << store.status().ToString();
  EXPECT_NE(std::string(store.status().message()).find("did not answer as PyTorch's TCPStore"), std::string::npos)
      << store.status().ToString();
}

}  // namespace
}  // namespace sk::comm
