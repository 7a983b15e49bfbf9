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
    lock.unlock();
    store_->Set(Key(rank_), beat).IgnoreError();
    lock.lock();
  }
}

StatusOr<std::string> Heartbeat::Read(int r) {
  // Every rank beats once before its group exists, so an absent key is a
  // rank that never got that far; do not hold the store connection long.
  StatusOr<std::string> got = store_->Get(Key(r), Duration(200));
  if (!got.ok() && got.status().code() == StatusCode::kDeadlineExceeded) return std::string();
  if (!got.ok()) {
    return UnavailableError("the store (served by rank 0) cannot be read, so rank 0 is dead or hung (" +
                            std::string(got.status().message()) + ")");
  }
  return *got;
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
