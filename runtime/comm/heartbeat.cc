#include "runtime/comm/heartbeat.h"

#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace sk::comm {

using Clock = std::chrono::steady_clock;

namespace {

// This machine and PID namespace: processes with the same key see each
// other under /proc/<pid>.
std::string MachineKey() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (boot.empty() || n <= 0) return "";
  return boot + "/" + std::string(ns, static_cast<size_t>(n));
}

// The kernel's PF_EXITING (include/linux/sched.h): set when a process
// begins to exit, before it closes its sockets; it becomes a zombie only
// after, so a peer that sees the connection reset may still find it 'R'.
constexpr unsigned long kPfExiting = 0x4;

// The state letter, start time (clock ticks since boot) and flags of
// `pid`, from /proc/<pid>/stat; false when there is no such process.
bool ReadStat(long pid, char* state, unsigned long long* start, unsigned long* flags = nullptr) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> *state;
  // Fields 4..8, 9 = flags, 10..21, then 22 = starttime.
  for (int i = 4; i <= 8; ++i) rest >> field;
  unsigned long task_flags = 0;
  rest >> task_flags;
  if (flags != nullptr) *flags = task_flags;
  for (int i = 10; i <= 21; ++i) rest >> field;
  rest >> *start;
  return !rest.fail();
}

}  // namespace

namespace {

std::string Record(const std::string& machine, long pid) {
  char state = 0;
  unsigned long long start = 0;
  if (machine.empty() || machine.find(' ') != std::string::npos || !ReadStat(pid, &state, &start)) return "";
  return machine + " " + std::to_string(pid) + " " + std::to_string(start);
}

}  // namespace

std::string Heartbeat::ProcessRecord(long pid) { return Record(MachineKey(), pid); }

Heartbeat::Heartbeat(std::shared_ptr<Store> store, std::string prefix, int rank, Duration interval,
                     std::string link_host, std::string machine)
    : machine_(machine.empty() ? MachineKey() : std::move(machine)), store_(std::move(store)),
      prefix_(std::move(prefix)), rank_(rank), interval_(interval) {
  // A failing store is noticed by whoever reads it; a beat is best effort.
  store_->Set(Key(rank_), std::to_string(beats_++)).IgnoreError();
  const std::string me = Record(machine_, static_cast<long>(::getpid()));
  if (!me.empty()) store_->Set(ProcessKey(rank_), me).IgnoreError();
  if (!link_host.empty()) {
    // Published with the process record, before any group's rendezvous:
    // once a group formed, every peer's address is there for Watch.
    StatusOr<std::unique_ptr<PeerLinks>> links = PeerLinks::Listen(link_host, rank_);
    if (links.ok() && store_->Set(LinkKey(rank_), (*links)->address()).ok()) {
      links_ = std::move(links).value();
    } else if (!links.ok()) {
      LOG(WARNING) << "rank " << rank_ << ": no liveness links (peers on other machines see this process end "
                   << "only by its beats): " << links.status();
    }
  }
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
    for (int r : peers) {
      LearnProcess(r);
      beats.push_back(Read(r));
    }
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
        w.unchanged_reads = 0;
      } else {
        ++w.unchanged_reads;
      }
      w.read = now;
    }
  }
}

void Heartbeat::Watch(const std::vector<int>& peers, Duration link_timeout) {
  std::vector<int> to_link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    for (int r : peers) {
      if (r != rank_) watched_.try_emplace(r, Watched{"", now, now});
      // The lower rank of a pair connects (peer_links.h).
      if (links_ != nullptr && r > rank_ && link_tried_.insert(r).second) to_link.push_back(r);
    }
  }
  std::vector<std::pair<int, std::string>> addresses;
  for (int r : to_link) {
    LearnProcess(r);
    std::string machine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = processes_.find(r);
      if (it != processes_.end()) machine = it->second.substr(0, it->second.find(' '));
    }
    // On this machine /proc says more, and at once: no link.
    if (!machine.empty() && machine == machine_) continue;
    StatusOr<std::string> address = Connection()->Get(LinkKey(r), Duration(200));
    if (!address.ok()) continue;  // it accepts none (no link host), or the store: its beats decide
    addresses.emplace_back(r, *address);
  }
  if (addresses.empty()) return;
  for (const std::string& failure : links_->Connect(addresses, link_timeout)) {
    LOG(WARNING) << "rank " << rank_ << ": no liveness link to " << failure
                 << " (its end is seen only by its beats)";
  }
}

void Heartbeat::AwaitPeerLinkClosed(const std::vector<int>& peers, Duration wait) {
  if (links_ != nullptr) links_->AwaitClose(peers, wait);
}

std::optional<StatusOr<std::vector<int>>> Heartbeat::SilentPeers(const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  std::vector<int> silent;
  for (int r : peers) {
    auto it = watched_.find(r);
    if (it == watched_.end() || now - it->second.since < silence() + interval_) return std::nullopt;
    // This process must have been reading all along: a last read older
    // than two intervals means it was stopped itself (or starved), and its
    // view of everyone's beat is stale.
    if (now - it->second.read > 2 * interval_) return std::nullopt;
    if (now - it->second.changed >= silence() && it->second.unchanged_reads >= kMissedBeats) silent.push_back(r);
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

void Heartbeat::LearnProcess(int r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (processes_.count(r) != 0) return;
  }
  // Published before the group formed (with the first beat), so absent
  // means never: "" (the beats decide).
  StatusOr<std::string> got = Connection()->Get(ProcessKey(r), Duration(50));
  if (!got.ok() && got.status().code() != StatusCode::kDeadlineExceeded) return;  // the store: try again
  std::lock_guard<std::mutex> lock(mu_);
  processes_[r] = got.ok() ? *got : std::string();
}

void Heartbeat::PublishFailure(const std::string& culprits) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (published_failure_) return;
    published_failure_ = true;
  }
  std::shared_ptr<Store> store = Connection();
  store->Set(CulpritsKey(rank_), culprits).IgnoreError();
  // A counter, so that a peer asks with Add(0) and is answered at once (a
  // Get of an absent key waits out its timeout); set after the culprits.
  store->Add(FailedKey(rank_), 1).status().IgnoreError();
}

std::optional<std::string> Heartbeat::PeerFailed(int r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = failed_.find(r);
    if (it != failed_.end()) return it->second;
  }
  std::shared_ptr<Store> store = Connection();
  StatusOr<int64_t> failed = store->Add(FailedKey(r), 0);
  if (!failed.ok() || *failed == 0) return std::nullopt;
  StatusOr<std::string> culprits = store->Get(CulpritsKey(r), Duration(200));
  std::lock_guard<std::mutex> lock(mu_);
  return failed_[r] = culprits.ok() ? *culprits : std::string();
}

const char* Heartbeat::ProcessStateName(ProcessState s) {
  switch (s) {
    case ProcessState::kUnknown:
      return "unknown";
    case ProcessState::kRunning:
      return "running";
    case ProcessState::kStopped:
      return "stopped";
    case ProcessState::kGone:
      return "gone";
    case ProcessState::kLinkClosed:
      return "link closed";
  }
  return "?";
}

Heartbeat::ProcessState Heartbeat::PeerProcess(int r) {
  LearnProcess(r);
  std::string published;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = processes_.find(r);
    if (it != processes_.end()) published = it->second;
  }
  std::istringstream in(published);
  std::string machine;
  long pid = 0;
  unsigned long long start = 0;
  in >> machine >> pid >> start;
  if (in.fail() || machine.empty() || machine != machine_ || pid <= 0) {
    // On another machine (or unknown): its liveness link, if it has one.
    if (links_ != nullptr && links_->Of(r) == PeerLinks::State::kClosed) return ProcessState::kLinkClosed;
    return ProcessState::kUnknown;
  }
  char state = 0;
  unsigned long long now_start = 0;
  unsigned long flags = 0;
  if (!ReadStat(pid, &state, &now_start, &flags) || now_start != start) return ProcessState::kGone;
  if (state == 'Z' || state == 'X' || state == 'x' || (flags & kPfExiting) != 0) return ProcessState::kGone;
  if (state == 'T' || state == 't') return ProcessState::kStopped;
  return ProcessState::kRunning;
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
