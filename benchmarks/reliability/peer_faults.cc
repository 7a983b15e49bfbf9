#include "benchmarks/reliability/peer_faults.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "runtime/comm/gloo_backend.h"
#include "runtime/train/trainer.h"

DEFINE_int64(fault_trials, 0, "peer-fault injection: this many trials of one gloo rank killed or stopped (1..10000)");
DEFINE_int32(fault_world, 3, "gloo ranks (processes) per peer-fault trial (2..16)");
DEFINE_string(fault_signal, "kill", "what happens to the victim: kill (SIGKILL) or stop (SIGSTOP)");
DEFINE_string(fault_phase, "step", "what the ranks do when it happens: step (train) or load (load_checkpoint)");
DEFINE_uint64(fault_seed, 1, "seed choosing each trial's victim and moment");
DEFINE_int64(fault_timeout_ms, 5000, "the ranks' collective timeout in peer-fault trials (500..600000)");
DEFINE_bool(fault_victim_zero, false, "let rank 0, which serves the store, be the victim too");
DEFINE_bool(fault_distinct_machines, false,
            "give each rank a machine of its own (GlooOptions::machine), so that peers are judged as on other "
            "machines (liveness links and beats) instead of from /proc");
DEFINE_int32(fault_child_rank, -1, "internal: run as this rank of a trial (set by the parent)");
DEFINE_string(fault_dir, "", "internal: the trial's checkpoint directory (set by the parent)");

namespace sk::bench {
namespace {

using Clock = std::chrono::steady_clock;

bool EndsWith(const std::string& s, size_t end, const char* tail) {
  const size_t n = std::strlen(tail);
  return end >= n && s.compare(end - n, n, tail) == 0;
}

// "1,3" at `at` (digits and commas); advances `at` past it.
std::vector<int> ReadList(const std::string& s, size_t* at) {
  std::vector<int> out;
  size_t i = *at;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    int v = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && v < 1000000) v = v * 10 + (s[i++] - '0');
    out.push_back(v);
    if (i + 1 < s.size() && s[i] == ',' && std::isdigit(static_cast<unsigned char>(s[i + 1]))) ++i;
  }
  *at = i;
  return out;
}

// One child: a rank that trains (or loads) until an error, prints it, and
// stays alive until the parent ends the trial.
int Child() {
  const int rank = FLAGS_fault_child_rank;
  const Duration timeout(FLAGS_fault_timeout_ms);
  auto say = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  auto fail = [&](const std::string& what, const Status& s) {
    say("error " + what + ": " + s.ToString());
    for (;;) ::pause();  // a live rank, as under a launcher that has not stopped it yet
  };
  comm::GlooOptions go;
  go.timeout = timeout;
  if (FLAGS_fault_distinct_machines) go.machine = "machine-" + std::to_string(rank);
  StatusOr<std::unique_ptr<comm::GlooProcessGroup>> world = comm::GlooProcessGroup::CreateFromEnvironment(go);
  if (!world.ok()) fail("setup", world.status());
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 2;
  o.data_tokens = 4096;
  o.gemm_threads = 1;
  o.optimizer.lr = 1e-3f;
  o.fsdp.timeout = timeout;
  StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o, world->get());
  if (!t.ok()) fail("setup", t.status());
  if (StatusOr<StepMetrics> m = (*t)->Step(); !m.ok()) fail("setup", m.status());
  const bool load = FLAGS_fault_phase == "load";
  const std::string ckpt = FLAGS_fault_dir + "/ckpt";
  if (load) {
    if (Status s = (*t)->SaveCheckpoint(ckpt); !s.ok()) fail("setup", s);
  }
  say("ready " + std::to_string(rank));
  for (;;) {
    Status s = load ? (*t)->LoadCheckpoint(ckpt) : (*t)->Step().status();
    if (!s.ok()) fail(load ? "load_checkpoint" : "step", s);
  }
}

// A free TCP port on loopback (bound, read, released: the store's rank 0
// binds it a moment later).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

struct Rank {
  pid_t pid = -1;
  int out = -1;  // its stdout
  std::string text;
  bool ready = false;
  std::string error;  // its "error ..." line, without the prefix
  Clock::time_point error_at;  // when that line was read
};

// Reads what the ranks printed until `done` or `deadline`.
template <typename Done>
void Pump(std::vector<Rank>& ranks, Clock::time_point deadline, Done done) {
  while (!done() && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    for (Rank& r : ranks) fds.push_back({r.out, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = ::read(ranks[i].out, buf, sizeof buf);
      if (n <= 0) continue;
      ranks[i].text.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = ranks[i].text.find('\n')) != std::string::npos) {
        const std::string line = ranks[i].text.substr(0, nl);
        ranks[i].text.erase(0, nl + 1);
        if (line.rfind("ready ", 0) == 0) ranks[i].ready = true;
        if (line.rfind("error ", 0) == 0 && ranks[i].error.empty()) {
          ranks[i].error = line.substr(6);
          ranks[i].error_at = Clock::now();
        }
      }
    }
  }
}

int Parent(const char* self) {
  const int world = FLAGS_fault_world;
  const int signal = FLAGS_fault_signal == "kill" ? SIGKILL : SIGSTOP;
  std::mt19937_64 rng(FLAGS_fault_seed);
  int64_t errors = 0, named_victim = 0, named_healthy = 0, named_none = 0, hangs = 0, setup_failures = 0;
  int shown = 0;
  // Seconds from the signal to each survivor's error (the time to report).
  std::vector<double> report_seconds;
  const auto base = std::filesystem::temp_directory_path() / ("soak_faults." + std::to_string(::getpid()));
  for (int64_t trial = 0; trial < FLAGS_fault_trials; ++trial) {
    const int lowest = FLAGS_fault_victim_zero ? 0 : 1;
    const int victim = lowest + static_cast<int>(rng() % static_cast<uint64_t>(world - lowest));
    const int delay_ms = static_cast<int>(rng() % 200);
    const std::string dir = (base / std::to_string(trial)).string();
    std::filesystem::create_directories(dir);
    const int port = FreePort();
    std::vector<Rank> ranks(world);
    for (int r = 0; r < world; ++r) {
      int p[2];
      if (::pipe(p) != 0) return 1;
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::dup2(p[1], 1);
        ::close(p[0]);
        ::close(p[1]);
        ::setenv("RANK", std::to_string(r).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        const std::vector<std::string> args = {
            self, "--fault_child_rank=" + std::to_string(r), "--fault_world=" + std::to_string(world),
            "--fault_phase=" + FLAGS_fault_phase, "--fault_timeout_ms=" + std::to_string(FLAGS_fault_timeout_ms),
            "--fault_dir=" + dir, "--fault_trials=1", "--minloglevel=3",
            std::string("--fault_distinct_machines=") + (FLAGS_fault_distinct_machines ? "true" : "false")};
        std::vector<char*> argv;
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(self, argv.data());
        std::_Exit(127);
      }
      ::close(p[1]);
      ranks[r].pid = pid;
      ranks[r].out = p[0];
    }
    const Duration timeout(FLAGS_fault_timeout_ms);
    Clock::time_point signalled_at;
    Pump(ranks, Clock::now() + std::chrono::seconds(60), [&] {
      return std::all_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.ready || !r.error.empty(); });
    });
    const bool ready = std::all_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.ready; });
    if (ready) {
      Pump(ranks, Clock::now() + std::chrono::milliseconds(delay_ms), [] { return false; });
      ::kill(ranks[victim].pid, signal);
      signalled_at = Clock::now();
      Pump(ranks, Clock::now() + 4 * timeout + std::chrono::seconds(10), [&] {
        for (int r = 0; r < world; ++r) {
          if (r != victim && ranks[r].error.empty()) return false;
        }
        return true;
      });
    } else {
      ++setup_failures;
    }
    for (Rank& r : ranks) {
      ::kill(r.pid, SIGKILL);
      ::kill(r.pid, SIGCONT);
      ::waitpid(r.pid, nullptr, 0);
      ::close(r.out);
    }
    std::filesystem::remove_all(dir);
    if (!ready) continue;
    for (int r = 0; r < world; ++r) {
      if (r == victim) continue;
      if (ranks[r].error.empty()) {
        ++hangs;
        continue;
      }
      ++errors;
      report_seconds.push_back(std::chrono::duration<double>(ranks[r].error_at - signalled_at).count());
      const std::vector<int> blamed = BlamedRanks(ranks[r].error);
      const bool victim_named = std::find(blamed.begin(), blamed.end(), victim) != blamed.end();
      const bool healthy_named = std::any_of(blamed.begin(), blamed.end(), [&](int b) { return b != victim; });
      named_victim += victim_named;
      named_healthy += healthy_named;
      named_none += blamed.empty();
      if ((!victim_named || healthy_named) && shown < 5) {
        ++shown;
        std::printf("trial %lld, rank %d signalled, rank %d said: %s\n", static_cast<long long>(trial), victim, r,
                    ranks[r].error.c_str());
      }
    }
  }
  std::filesystem::remove_all(base);
  std::printf(
      "fault: %lld trials, %d gloo ranks%s, %s during %s, seed %llu: %lld survivor errors; naming the signalled "
      "rank: %lld; naming a healthy rank: %lld; naming no rank: %lld; hangs: %lld; trials that did not start: %lld\n",
      static_cast<long long>(FLAGS_fault_trials), world,
      FLAGS_fault_distinct_machines ? " (each on a machine of its own)" : "", FLAGS_fault_signal.c_str(),
      FLAGS_fault_phase.c_str(),
      static_cast<unsigned long long>(FLAGS_fault_seed), static_cast<long long>(errors),
      static_cast<long long>(named_victim), static_cast<long long>(named_healthy), static_cast<long long>(named_none),
      static_cast<long long>(hangs), static_cast<long long>(setup_failures));
  if (!report_seconds.empty()) {
    std::sort(report_seconds.begin(), report_seconds.end());
    const size_t n = report_seconds.size();
    const double median = n % 2 ? report_seconds[n / 2] : (report_seconds[n / 2 - 1] + report_seconds[n / 2]) / 2;
    std::printf("fault report time (signal to survivor error, timeout %lld ms): median %.3f s, min %.3f s, "
                "max %.3f s over %zu errors\n",
                static_cast<long long>(FLAGS_fault_timeout_ms), median, report_seconds.front(), report_seconds.back(),
                n);
  }
  return errors > 0 && named_victim == errors && named_healthy == 0 && hangs == 0 && setup_failures == 0 ? 0 : 1;
}

}  // namespace

bool PeerFaultsRequested() { return FLAGS_fault_trials != 0 || FLAGS_fault_child_rank >= 0; }

std::vector<int> BlamedRanks(const std::string& error) {
  std::vector<int> out;
  size_t i = 0;
  while ((i = error.find("rank", i)) != std::string::npos) {
    const size_t word = i;
    size_t at = i + 4;
    if (at < error.size() && error[at] == 's') ++at;
    // A whole word: not "ranks_per_node", not "world_rank".
    if (at >= error.size() || error[at] != ' ' ||
        (word > 0 && (std::isalnum(static_cast<unsigned char>(error[word - 1])) || error[word - 1] == '_'))) {
      i = at;
      continue;
    }
    ++at;
    std::vector<int> list = ReadList(error, &at);
    i = at;
    if (list.empty()) continue;
    if (EndsWith(error, word, "gloo ") || EndsWith(error, word, "local ") || EndsWith(error, word, "nccl ") ||
        EndsWith(error, word, "on ") || EndsWith(error, word, "group ") || error.compare(at, 4, " of ") == 0) {
      continue;
    }
    // "rank 1 (world rank 2)": the world's number is the one that counts.
    if (error.compare(at, 8, " (world ") == 0 && !EndsWith(error, word, "world ")) continue;
    out.insert(out.end(), list.begin(), list.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int RunPeerFaults(const char* self) {
  if (FLAGS_fault_child_rank >= 0) return Child();
  if (FLAGS_fault_trials < 1 || FLAGS_fault_trials > 10000 || FLAGS_fault_world < 2 || FLAGS_fault_world > 16 ||
      FLAGS_fault_timeout_ms < 500 || FLAGS_fault_timeout_ms > 600000 ||
      (FLAGS_fault_signal != "kill" && FLAGS_fault_signal != "stop") ||
      (FLAGS_fault_phase != "step" && FLAGS_fault_phase != "load")) {
    std::fprintf(stderr, "soak: need 1 <= --fault_trials <= 10000, 2 <= --fault_world <= 16, "
                         "500 <= --fault_timeout_ms <= 600000, --fault_signal=kill|stop, --fault_phase=step|load\n");
    return 2;
  }
  return Parent(self);
}

}  // namespace sk::bench
