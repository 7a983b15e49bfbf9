#include "runtime/comm/heartbeat.h"

namespace sk::comm {

using Clock = std::chrono::steady_clock;

Heartbeat::Heartbeat(std::shared_ptr<Store> store, std::string prefix, int rank, Duration interval)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), interval_(interval) {
  // A failing store is noticed by whoever reads it; a beat is best effort.
  store_->Set(Key(rank_), std::to_string(beats_++)).IgnoreError();
  thread_ = std::thread([this] { Run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
    const std::string beat = std::to_string(beats_++);
    std::vector<int> peers;
    for (const auto& [r, w] : watched_) peers.push_back(r);
    lock.unlock();
    std::shared_ptr<Store> store = Connection();
    if (!store->Set(Key(rank_), beat).ok()) Reconnect(store);
    std::vector<StatusOr<std::string>> beats;
    for (int r : peers) beats.push_back(Read(r));
    lock.lock();
    const auto now = Clock::now();
    watch_error_ = OkStatus();
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!beats[i].ok()) {
        watch_error_ = beats[i].status();
        continue;
      }
      Watched& w = watched_[peers[i]];
      if (*beats[i] != w.beat) {
        w.beat = *beats[i];
        w.changed = now;
      }
    }
  }
}

void Heartbeat::Watch(const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (int r : peers) {
    if (r != rank_) watched_.try_emplace(r, Watched{"", now, now});
  }
}

std::optional<StatusOr<std::vector<int>>> Heartbeat::SilentPeers(const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  std::vector<int> silent;
  for (int r : peers) {
    auto it = watched_.find(r);
    if (it == watched_.end() || now - it->second.since < silence() + interval_) return std::nullopt;
    if (now - it->second.changed >= silence()) silent.push_back(r);
  }
  if (!watch_error_.ok()) return StatusOr<std::vector<int>>(watch_error_);
  return StatusOr<std::vector<int>>(silent);
}

StatusOr<std::string> Heartbeat::Read(int r) {
  // Every rank beats once before its group exists, so an absent key is a
  // rank that never got that far; do not hold the store connection long.
  std::shared_ptr<Store> store = Connection();
  StatusOr<std::string> got = store->Get(Key(r), Duration(200));
  if (!got.ok() && got.status().code() == StatusCode::kDeadlineExceeded) return std::string();
  if (!got.ok()) {
    Reconnect(store);
    got = Connection()->Get(Key(r), Duration(200));
    if (got.ok()) return *got;
    if (got.status().code() == StatusCode::kDeadlineExceeded) return std::string();
    return UnavailableError("the store (served by rank 0) cannot be read, so rank 0 is dead or hung (" +
                            std::string(got.status().message()) + ")");
  }
  return *got;
}

std::shared_ptr<Store> Heartbeat::Connection() {
  std::lock_guard<std::mutex> lock(store_mu_);
  return store_;
}

void Heartbeat::Reconnect(const std::shared_ptr<Store>& failed) {
  // Briefly: a store that is gone (rank 0 exited) must not hold up a beat
  // or a caller naming the dead.
  std::shared_ptr<Store> fresh = failed->NewConnection(interval_);
  if (fresh == nullptr) return;
  std::lock_guard<std::mutex> lock(store_mu_);
  if (store_ == failed) store_ = std::move(fresh);
}

StatusOr<std::vector<int>> Heartbeat::StoppedPeers(const std::vector<int>& peers) {
  std::vector<std::string> before;
  for (int r : peers) {
    SK_ASSIGN_OR_RETURN(std::string b, Read(r));
    before.push_back(std::move(b));
  }
  std::this_thread::sleep_for(silence() + interval_ / 5);
  std::vector<int> stopped;
  for (size_t i = 0; i < peers.size(); ++i) {
    SK_ASSIGN_OR_RETURN(std::string after, Read(peers[i]));
    if (after.empty() || after == before[i]) stopped.push_back(peers[i]);
  }
  return stopped;
}

StatusOr<bool> Heartbeat::PeerStopped(int r) {
  SK_ASSIGN_OR_RETURN(std::string beat, Read(r));
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, first] = seen_.try_emplace(r, beat, Clock::now());
  if (first || it->second.first != beat) {
    it->second = {beat, Clock::now()};
    return false;
  }
  return Clock::now() - it->second.second >= silence();
}

}  // namespace sk::comm
