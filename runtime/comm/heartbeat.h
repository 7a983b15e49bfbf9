// Heartbeat: liveness of a group's ranks through its Store, for naming the
// rank that died or hung (the nccl backend's watchdog and call check).
//
// Each rank's Heartbeat bumps a counter under `prefix`/heartbeat/<rank>
// every `interval` on a thread of its own, so a rank that is busy or blocked
// elsewhere (its watchdog checking its peers, a long host wait, a slow
// step) keeps beating; only a process that died, was stopped (SIGSTOP, a
// debugger) or cannot reach the store falls silent. A peer is "stopped"
// once its counter has stood still for kMissedBeats intervals.
//
// On the H200 (27 Nov 2026) the beat ran on the watchdog's own thread, which
// sleeps while it checks its peers: two survivors checking at once saw each
// other fall silent and named each other as dead beside the rank that was
// killed. //tests/comm:heartbeat_test reproduces that case.
//
// Thread safety: every method may be called from any thread.
#ifndef SHARDKIT_RUNTIME_COMM_HEARTBEAT_H_
#define SHARDKIT_RUNTIME_COMM_HEARTBEAT_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/peer_links.h"
#include "runtime/comm/store.h"
#include "runtime/core/status.h"

namespace sk::comm {

class Heartbeat {
 public:
  static constexpr int kMissedBeats = 3;

  // Starts beating at once (the first beat is set before this returns).
  // `link_host`: where to accept liveness links (peer_links.h) from peers on
  // other machines, the address gloo's transport uses; "" for none (then
  // such peers are judged by their beats alone). `machine`: which machine
  // this process is on, for telling peers on this machine (judged from
  // /proc) from the others (linked); "" is this machine's boot id and PID
  // namespace. Processes given different `machine`s treat each other as on
  // other machines (tests take that path on one host that way).
  Heartbeat(std::shared_ptr<Store> store, std::string prefix, int rank,
            Duration interval = Duration(500), std::string link_host = "", std::string machine = "");
  ~Heartbeat();  // stops beating
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  Duration interval() const { return interval_; }
  // How long a peer must stay silent to count as stopped.
  Duration silence() const { return interval_ * kMissedBeats; }

  // The ranks of `peers` whose beat did not change over silence() plus a
  // margin; blocks that long (reads each peer twice). Unavailable naming the
  // store (served by rank 0) when it cannot be read. A peer that never beat
  // counts as stopped.
  StatusOr<std::vector<int>> StoppedPeers(const std::vector<int>& peers);

  // Starts reading `peers`' beats on the beating thread, once each per
  // interval, so that SilentPeers answers without waiting. Peers add up
  // over calls. With links (see the constructor), also links this rank to
  // each peer above it on another machine, waiting up to `link_timeout` for
  // them (in parallel); every rank's peers have published their link
  // addresses once a group formed, so call it after the rendezvous. A peer
  // that cannot be linked is logged and left to its beats.
  void Watch(const std::vector<int>& peers, Duration link_timeout = Duration(10'000));
  // Of `peers`, the watched ones whose beat has not changed for silence();
  // nullopt when one of them has not been watched that long (ask
  // StoppedPeers instead). Unavailable naming the store (served by rank 0)
  // when its last read failed. Does not wait.
  std::optional<StatusOr<std::vector<int>>> SilentPeers(const std::vector<int>& peers);

  // What this process can see of peer r's process directly, without
  // waiting for its beat to stand still: each rank publishes its machine
  // (boot id and PID namespace), pid and start time next to its beat, and a
  // peer on the same machine is looked up in /proc. kGone: no such process,
  // another process under its pid, or a zombie (killed, or exited early);
  // kStopped: stopped (SIGSTOP, a debugger); kRunning: alive; kLinkClosed:
  // on another machine, and its liveness link to this rank read end of file
  // or a reset (its process exited or was killed); kUnknown: on another
  // machine with its link open (alive, stopped or hung: ask the beats), or
  // not published. A killed peer is thus named as fast as the transport
  // notices, on this machine or another (its beats took 1.6 s).
  enum class ProcessState { kUnknown, kRunning, kStopped, kGone, kLinkClosed };
  ProcessState PeerProcess(int r);
  // Waits up to `wait` until the liveness link of one of `peers` closes;
  // at once when one has or none of them is linked. For a caller whose
  // collective lost a connection: a peer on another machine that was killed
  // closes its link the moment its gloo connections closed, but this
  // process may read the one before the other.
  void AwaitPeerLinkClosed(const std::vector<int>& peers, Duration wait);
  // Whether this process accepts liveness links (a link host was given and
  // it could listen there).
  bool links() const { return links_ != nullptr; }
  static const char* ProcessStateName(ProcessState s);
  // A rank whose collective failed for missing peers says so before it
  // reports (and typically exits): a peer that finds it gone then knows it
  // left after failing, held up by another, and is not the one at fault
  // (ranks held up in a sub-group by a stopped rank exited before the
  // world's collective timed out, and were named as dead beside it).
  // `culprits`: the world ranks its error blames ("1,3"; may be empty).
  void PublishFailure(const std::string& culprits);
  // Peer r's published culprits when it failed, nullopt when it did not.
  std::optional<std::string> PeerFailed(int r);

  // What a rank publishes about process `pid` under <prefix>/process/<rank>
  // ("<machine> <pid> <start time>"); "" where /proc cannot say.
  static std::string ProcessRecord(long pid);

  // For a caller that polls while it waits on peer `r`: whether r's beat has
  // stood still for silence(), judged from this rank's calls so far (each
  // reads r's beat once; the first call starts the clock). Unavailable when
  // the store cannot be read.
  StatusOr<bool> PeerStopped(int r);

 private:
  std::string Key(int r) const { return prefix_ + "/heartbeat/" + std::to_string(r); }
  std::string ProcessKey(int r) const { return prefix_ + "/process/" + std::to_string(r); }
  // Each peer's published "<machine> <pid> <start time>", read once (on
  // the beating thread for watched peers, while the store is there).
  std::map<int, std::string> processes_;  // under mu_
  std::string FailedKey(int r) const { return prefix_ + "/failed/" + std::to_string(r); }
  bool published_failure_ = false;  // under mu_
  std::string CulpritsKey(int r) const { return prefix_ + "/culprits/" + std::to_string(r); }
  std::map<int, std::string> failed_;  // under mu_: peers known to have failed, their culprits
  void LearnProcess(int r);
  std::string LinkKey(int r) const { return prefix_ + "/link/" + std::to_string(r); }
  // This process's machine (the constructor's `machine`, or MachineKey).
  const std::string machine_;
  // Liveness links to peers on other machines; null without a link host.
  std::unique_ptr<PeerLinks> links_;
  std::set<int> link_tried_;  // under mu_: peers Watch linked or tried to
  // r's beat, or "" when r has never beaten (absent key).
  StatusOr<std::string> Read(int r);
  void Run();

  // The connection in use; replaced by a new one (Store::NewConnection)
  // after a request fails, since a TcpStore connection whose reply came
  // late (a loaded store server) stays unusable, and a rank that cannot
  // beat would look dead to its peers.
  std::shared_ptr<Store> Connection();
  void Reconnect(const std::shared_ptr<Store>& failed);
  std::mutex store_mu_;
  std::shared_ptr<Store> store_;
  const std::string prefix_;
  const int rank_;
  const Duration interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t beats_ = 0;
  std::map<int, std::pair<std::string, std::chrono::steady_clock::time_point>> seen_;  // PeerStopped's
  // Watch's: each watched peer's last beat, when it last changed, and when
  // watching it began.
  struct Watched {
    std::string beat;
    std::chrono::steady_clock::time_point changed;
    std::chrono::steady_clock::time_point since;
    // Reads since the beat last changed, and when the last one was: a peer
    // is silent only if this process really watched it stand still (after
    // this process itself was stopped and resumed, every peer's beat looked
    // old at once, and a late peer named rank 0 "dead or hung").
    int unchanged_reads = 0;
    std::chrono::steady_clock::time_point read;
  };
  std::map<int, Watched> watched_;
  Status watch_error_;  // the last watch read's failure
  std::thread thread_;
};

}  // namespace sk::comm

#endif  // SHARDKIT_RUNTIME_COMM_HEARTBEAT_H_
