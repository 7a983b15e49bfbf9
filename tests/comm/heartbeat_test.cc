// Heartbeat (runtime/comm/heartbeat.h): which ranks are named as stopped.
#include "runtime/comm/heartbeat.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <vector>

namespace sk::comm {
namespace {

constexpr Duration kBeat(100);

std::shared_ptr<Store> LocalStore() {
  StatusOr<std::unique_ptr<TcpStore>> s = TcpStore::Create("127.0.0.1", 0, /*serve=*/true, Duration(10'000));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::shared_ptr<Store>(std::move(*s));
}

TEST(Heartbeat, NamesExactlyTheRankThatStopped) {
  std::shared_ptr<Store> store = LocalStore();
  auto r0 = std::make_unique<Heartbeat>(store, "g", 0, kBeat);
  auto r1 = std::make_unique<Heartbeat>(store, "g", 1, kBeat);
  auto r2 = std::make_unique<Heartbeat>(store, "g", 2, kBeat);
  StatusOr<std::vector<int>> none = r0->StoppedPeers({1, 2});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());
  r2.reset();  // rank 2 dies
  StatusOr<std::vector<int>> stopped = r0->StoppedPeers({1, 2});
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  EXPECT_EQ(*stopped, std::vector<int>{2});
}

// The H200 case: two survivors check their peers at the same time (each
// check blocks its caller for the silence window). Neither may name the
// other: beats come from a thread of their own.
TEST(Heartbeat, SurvivorsCheckingAtOnceDoNotNameEachOther) {
  std::shared_ptr<Store> store = LocalStore();
  auto r0 = std::make_unique<Heartbeat>(store, "g", 0, kBeat);
  auto r1 = std::make_unique<Heartbeat>(store, "g", 1, kBeat);
  auto r2 = std::make_unique<Heartbeat>(store, "g", 2, kBeat);
  r2.reset();
  auto from0 = std::async(std::launch::async, [&] { return r0->StoppedPeers({1, 2}); });
  auto from1 = std::async(std::launch::async, [&] { return r1->StoppedPeers({0, 2}); });
  StatusOr<std::vector<int>> a = from0.get(), b = from1.get();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, std::vector<int>{2});
  EXPECT_EQ(*b, std::vector<int>{2});
}

TEST(Heartbeat, PeerStoppedNeedsTheWholeSilenceWindow) {
  std::shared_ptr<Store> store = LocalStore();
  Heartbeat r0(store, "g", 0, kBeat);
  auto r1 = std::make_unique<Heartbeat>(store, "g", 1, kBeat);
  StatusOr<bool> first = r0.PeerStopped(1);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(*first);  // the first look only starts the clock
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(kBeat);
    StatusOr<bool> alive = r0.PeerStopped(1);
    ASSERT_TRUE(alive.ok());
    EXPECT_FALSE(*alive) << "a beating peer was called stopped after " << (i + 1) << " beats";
  }
  r1.reset();
  bool stopped = false;
  for (int i = 0; i < 20 && !stopped; ++i) {
    std::this_thread::sleep_for(kBeat);
    StatusOr<bool> s = r0.PeerStopped(1);
    ASSERT_TRUE(s.ok());
    stopped = *s;
  }
  EXPECT_TRUE(stopped);
}

TEST(Heartbeat, AStoreThatIsGoneIsNamedAsRankZero) {
  std::shared_ptr<Store> server = LocalStore();
  const int port = static_cast<TcpStore*>(server.get())->port();
  StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Create("127.0.0.1", port, false, Duration(2'000));
  ASSERT_TRUE(client.ok());
  std::shared_ptr<Store> store(std::move(*client));
  Heartbeat r1(store, "g", 1, kBeat);
  {
    Heartbeat r0(server, "g", 0, kBeat);
  }
  server.reset();  // rank 0's process (the store's server) is gone
  StatusOr<std::vector<int>> s = r1.StoppedPeers({0});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(std::string(s.status().message()).find("rank 0"), std::string::npos) << s.status().ToString();
}

}  // namespace
}  // namespace sk::comm
