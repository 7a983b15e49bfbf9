// Heartbeat (runtime/comm/heartbeat.h): which ranks are named as stopped.
#include "runtime/comm/heartbeat.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

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

// Issue 47, items 5 and 6: a peer on this machine is judged from its
// process at once, not from its beat standing still for 1.6 s: a killed or
// exited peer is gone (zombie or reaped), a stopped one stopped, a live one
// running (it was "dead or hung" only after its beats fell silent, and a
// live peer that never called was named by no one when that wait outlasted
// the collective's grace).
Heartbeat::ProcessState WaitForState(Heartbeat& hb, int r, Heartbeat::ProcessState want) {
  // The kernel applies a signal asynchronously: poll until it has (or 10 s).
  Heartbeat::ProcessState s = hb.PeerProcess(r);
  for (int i = 0; i < 1000 && s != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = hb.PeerProcess(r);
  }
  return s;
}

TEST(Heartbeat, APeerProcessOnThisMachineIsSeenRunningStoppedAndGone) {
  using State = Heartbeat::ProcessState;
  std::shared_ptr<Store> store = LocalStore();
  Heartbeat r0(store, "g", 0, kBeat);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const std::string record = Heartbeat::ProcessRecord(child);
  ASSERT_FALSE(record.empty()) << "no /proc here";
  ASSERT_TRUE(store->Set("g/process/1", record).ok());
  EXPECT_EQ(r0.PeerProcess(2), State::kUnknown);  // never published
  EXPECT_EQ(WaitForState(r0, 1, State::kRunning), State::kRunning);
  ::kill(child, SIGSTOP);
  EXPECT_EQ(WaitForState(r0, 1, State::kStopped), State::kStopped);
  ::kill(child, SIGCONT);
  EXPECT_EQ(WaitForState(r0, 1, State::kRunning), State::kRunning);
  ::kill(child, SIGKILL);
  EXPECT_EQ(WaitForState(r0, 1, State::kGone), State::kGone);  // a zombie until reaped
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(r0.PeerProcess(1), State::kGone);
}

TEST(Heartbeat, APeerOnAnotherMachineIsLeftToTheBeats) {
  std::shared_ptr<Store> store = LocalStore();
  Heartbeat r0(store, "g", 0, kBeat);
  ASSERT_TRUE(store->Set("g/process/1", "another-machine/pid:[1] 1 1").ok());
  EXPECT_EQ(r0.PeerProcess(1), Heartbeat::ProcessState::kUnknown);
}

}  // namespace
}  // namespace sk::comm
