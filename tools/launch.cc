// launch: starts one process per rank with torchrun's variables, serves
// their rendezvous store, and restarts the group after a failure.
//
//   bazel run //tools:launch -- --nproc_per_node=N [--nnodes=1]
//       [--node_rank=0] [--master_addr=127.0.0.1] [--master_port=29500]
//       [--max_restarts=0] [--kill_grace_s=5] [--gpus=local|G0,G1,...]
//       [--share_gpu=G] [--on_failure=stop|wait] PROGRAM [ARGS...]
//   launch --help
//
// The store: the launcher of node 0 serves the group's TcpStore on
// --master_port (all interfaces), as torchrun's agent does, and tells its
// ranks so (SK_LAUNCHER_STORE=1): no rank serves it, so rank 0's death is an
// ordinary rank death (the survivors' store still answers, and the report
// names rank 0), and the store outlives restarts. --master_port=0 serves on
// a free port (single node only).
//
// GPUs: by default local rank L uses cuda:L (what an nccl group and a cuda
// trainer pick from LOCAL_RANK, as under torchrun). --gpus=G0,G1,... maps
// local rank L to GPU G_L instead (one entry per local rank, or a single
// entry for all), exported as SK_CUDA_DEVICE. --share_gpu=G is for
// tests on a machine with fewer GPUs than ranks: every rank uses cuda:G and
// NCCL is told to accept several ranks on one GPU (a distinct NCCL_HOSTID
// per rank, so NCCL up to 2.29 connects them as separate hosts over its
// socket transport on loopback, and NCCL_MULTI_RANK_GPU_ENABLE=1 for 2.30
// on); such runs prove correctness and failure handling, not speed.
// --on_failure=wait keeps the other ranks running when one fails (to see
// how the survivors detect it); the default stops them (below).
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, GROUP_RANK (= node rank), SK_LAUNCHER_STORE=1 and
// TORCHELASTIC_RESTART_COUNT (the attempt, 0 first; store keys are scoped by
// it). Every line a rank prints on stdout/stderr is copied to the launcher's
// stdout/stderr prefixed with "[rank R] ". If a rank exits with a non-zero
// code or a signal, the launcher sends SIGTERM to the others, with SIGCONT so
// that a stopped rank acts on it (SIGKILL after --kill_grace_s). With
// --max_restarts=N it then starts the whole group again
// (TORCHELASTIC_RESTART_COUNT one higher), up to N times; a program that
// resumes from its newest checkpoint (sk_trainer_resume_latest) continues
// where the last complete checkpoint left it. On several nodes each node's
// launcher restarts its own ranks; a failure anywhere fails every node's
// collectives, so all restart together.
//
// Exit status (docs/launch.md):
//   0        every rank exited 0 (in the last attempt)
//   1..125   the first failing rank's exit code, after --max_restarts restarts
//   128+S    the first failing rank was killed by signal S (137: SIGKILL),
//            after --max_restarts restarts; or the launcher itself got
//            SIGINT/SIGTERM (130/143: no restart then); the last line on
//            stderr says which
//   2        bad usage, or the store could not be served (port in use)
//   127      PROGRAM could not be executed
// When the rank that failed first was only waiting for another (a hung
// peer: its error says "rank 2 did not arrive"), the report names the rank
// at fault too: the ranks the failed rank's last output names as not
// arriving, and any rank of this node that is stopped (SIGSTOP, a debugger).
// Ranks die with the launcher (PR_SET_PDEATHSIG): killing the launcher, even
// with SIGKILL, leaves no orphans training on. Ranks start with SIGPIPE's
// default action, as under torchrun (the launcher itself ignores it).
// Under `bazel run`, PROGRAM and the ranks' working directory are the
// caller's, not runfiles'.
//
// Flags end at the first argument that does not start with "--" or at "--".
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/comm/store.h"
#include "runtime/core/env.h"

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_interrupted = 0;
void OnSignal(int sig) { g_interrupted = sig; }

struct Flags {
  int nproc_per_node = -1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int kill_grace_s = 5;
  std::vector<int> gpus;  // --gpus: GPU of each local rank (empty: LOCAL_RANK)
  int share_gpu = -1;     // --share_gpu
  bool wait_on_failure = false;
  int max_restarts = 0;
};

constexpr const char* kUsage =
    "usage: launch --nproc_per_node=N [--nnodes=1] [--node_rank=0] [--master_addr=127.0.0.1]\n"
    "              [--master_port=29500] [--kill_grace_s=5] [--gpus=local|G0,G1,...]\n"
    "              [--share_gpu=G] [--on_failure=stop|wait] [--max_restarts=0] PROGRAM [ARGS...]\n"
    "Starts N processes per node, one per rank, with torchrun's variables (RANK, WORLD_SIZE,\n"
    "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK); node 0's launcher serves\n"
    "their rendezvous store (SK_LAUNCHER_STORE=1); prefixes each output line with [rank R]; when\n"
    "a rank fails, stops the others, restarts the group up to --max_restarts times\n"
    "(TORCHELASTIC_RESTART_COUNT), then exits with the failing rank's code (docs/launch.md).\n"
    "  --master_port=0         the store on a free port (single node)\n"
    "  --max_restarts=N        restart the whole group up to N times after a rank fails\n"
    "  --gpus=G0,G1,...        local rank L uses cuda:G_L (SK_CUDA_DEVICE); default cuda:LOCAL_RANK\n"
    "  --share_gpu=G           tests: every rank on cuda:G, NCCL set up to allow it (docs/multi_gpu.md)\n"
    "  --on_failure=wait       keep the other ranks running when one fails\n";

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "launch: %s\n%s", error.c_str(), kUsage);
  std::exit(2);
}

int ParseInt(const std::string& name, const std::string& value, int lo, int hi) {
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < lo || v > hi) {
    Usage("--" + name + "=" + value + " must be an integer in [" + std::to_string(lo) + ", " +
          std::to_string(hi) + "]");
  }
  return static_cast<int>(v);
}

// One rank's output stream: bytes are cut into lines and prefixed.
struct Output {
  int fd;
  int rank;
  FILE* sink;
  std::string partial;
  std::deque<std::string> recent;  // the last kRecentLines lines
};

constexpr size_t kRecentLines = 32;
// The longest line kept whole: longer output without a newline (a progress
// bar redrawn with '\r', a binary dump) is cut into lines of this many bytes,
// each prefixed. Without the cut the launcher held all of it (a rank that
// printed 300 MB without a newline grew the launcher to 510 MB).
constexpr size_t kMaxLineBytes = 64 << 10;

void Emit(Output& o, const char* data, size_t len) {
  o.partial.append(data, len);
  size_t start = 0;
  auto line = [&](size_t end, size_t next) {
    std::fprintf(o.sink, "[rank %d] %.*s\n", o.rank, static_cast<int>(end - start), o.partial.data() + start);
    o.recent.emplace_back(o.partial, start, end - start);
    if (o.recent.size() > kRecentLines) o.recent.pop_front();
    start = next;
  };
  while (true) {
    const size_t nl = o.partial.find('\n', start);
    if (nl != std::string::npos && nl - start <= kMaxLineBytes) {
      line(nl, nl + 1);
    } else if (o.partial.size() - start > kMaxLineBytes) {
      line(start + kMaxLineBytes, start + kMaxLineBytes);
    } else {
      break;
    }
  }
  o.partial.erase(0, start);
  std::fflush(o.sink);
}

void FlushPartial(Output& o) {
  if (!o.partial.empty()) {
    std::fprintf(o.sink, "[rank %d] %s\n", o.rank, o.partial.c_str());
    o.partial.clear();
    std::fflush(o.sink);
  }
}

// The world ranks a rank's error names as missing: "rank 2 did not arrive",
// "ranks 1,3 did not arrive", "rank 1 (world rank 2) did not arrive",
// "ranks 2 did not join" (the names our backends use; world ranks preferred).
std::set<int> NamedAsMissing(const std::deque<std::string>& lines) {
  std::set<int> ranks;
  auto numbers_after = [](const std::string& s, size_t at) {
    std::set<int> out;
    size_t p = at;
    while (p < s.size() && (std::isdigit(static_cast<unsigned char>(s[p])) || s[p] == ',')) {
      if (std::isdigit(static_cast<unsigned char>(s[p]))) {
        out.insert(std::atoi(s.c_str() + p));
        while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) ++p;
      } else {
        ++p;
      }
    }
    return out;
  };
  for (const std::string& line : lines) {
    for (const char* verb : {" did not arrive", " did not join"}) {
      for (size_t at = line.find(verb); at != std::string::npos; at = line.find(verb, at + 1)) {
        const std::string head = line.substr(0, at);
        // "... (world rank[s] N,M)" just before the verb.
        size_t world = head.rfind("(world rank");
        size_t plain = head.rfind("rank");
        size_t from = std::string::npos;
        if (world != std::string::npos && head.back() == ')') {
          from = world + std::strlen("(world rank");
        } else if (plain != std::string::npos) {
          from = plain + std::strlen("rank");
        }
        if (from == std::string::npos) continue;
        if (from < head.size() && head[from] == 's') ++from;
        if (from < head.size() && head[from] == ' ') ++from;
        for (int r : numbers_after(head, from)) ranks.insert(r);
      }
    }
  }
  return ranks;
}

// 'T' (stopped: SIGSTOP, a debugger) or 't' (traced) in /proc/PID/stat.
bool IsStopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // the command name may hold spaces
  if (n == 0 || paren == nullptr || paren[1] != ' ') return false;
  return paren[2] == 'T' || paren[2] == 't';
}

std::string Join(const std::set<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

struct AttemptResult {
  int exit_code = 0;        // 0, the first failing rank's code, or 128 + signal
  int failed_rank = -1;     // the first rank that failed, or -1
  bool interrupted = false; // the launcher got SIGINT/SIGTERM
  std::string why;          // what failed, for the report
};

// Starts this node's ranks for attempt `attempt` (TORCHELASTIC_RESTART_COUNT)
// and waits for all of them, stopping the others after the first failure.
AttemptResult RunAttempt(const Flags& flags, std::vector<char*>& program_args, int attempt, pid_t launcher) {
  AttemptResult result;
  const int world = flags.nproc_per_node * flags.nnodes;
  std::vector<pid_t> pids;
  std::vector<Output> outputs;
  for (int local = 0; local < flags.nproc_per_node; ++local) {
    const int rank = flags.node_rank * flags.nproc_per_node + local;
    int out_pipe[2], err_pipe[2];
    if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) Usage("pipe failed");
    pid_t pid = ::fork();
    if (pid < 0) Usage(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group, so stopping it stops its children too
      // Dies with the launcher: a killed launcher (SIGKILL, OOM) must not
      // leave its ranks training as orphans. Kept across exec. If the
      // launcher died before this line, the rank never starts.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) ::_exit(128 + SIGKILL);
      ::signal(SIGPIPE, SIG_DFL);  // the launcher's own SIG_IGN is not the rank's business
      ::dup2(out_pipe[1], 1);
      ::dup2(err_pipe[1], 2);
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      ::close(err_pipe[0]);
      ::close(err_pipe[1]);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(flags.nproc_per_node).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(flags.node_rank).c_str(), 1);
      setenv("MASTER_ADDR", flags.master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(flags.master_port).c_str(), 1);
      setenv("SK_LAUNCHER_STORE", "1", 1);
      setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt).c_str(), 1);
      if (!flags.gpus.empty()) {
        const int gpu = flags.gpus[flags.gpus.size() == 1 ? 0 : local];
        setenv("SK_CUDA_DEVICE", std::to_string(gpu).c_str(), 1);
      } else if (flags.share_gpu >= 0) {
        setenv("SK_CUDA_DEVICE", std::to_string(flags.share_gpu).c_str(), 1);
        // NCCL's host hash decides "same host"; distinct ones let ranks of
        // one GPU connect as if on different hosts (socket transport).
        const std::string host_id = "shardkit-" + std::to_string(flags.master_port) + "-node" +
                                    std::to_string(flags.node_rank) + "-rank" + std::to_string(rank);
        setenv("NCCL_HOSTID", host_id.c_str(), 1);
        setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
        setenv("NCCL_SOCKET_IFNAME", "lo", 0);
        setenv("NCCL_IB_DISABLE", "1", 0);
      }
      ::execvp(program_args[0], program_args.data());
      std::fprintf(stderr, "launch: cannot execute %s: %s\n", program_args[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    pids.push_back(pid);
    outputs.push_back(Output{out_pipe[0], rank, stdout, {}});
    outputs.push_back(Output{err_pipe[0], rank, stderr, {}});
  }

  std::map<pid_t, int> rank_of;
  for (int local = 0; local < flags.nproc_per_node; ++local) {
    rank_of[pids[local]] = flags.node_rank * flags.nproc_per_node + local;
  }
  std::vector<bool> running(pids.size(), true);
  int live = static_cast<int>(pids.size());
  int exit_code = 0;
  bool stopping = false;
  Clock::time_point kill_at = Clock::time_point::max();
  auto stop_others = [&](const std::string& why) {
    if (stopping) return;
    stopping = true;
    std::fprintf(stderr, "launch: %s; stopping the other ranks\n", why.c_str());
    for (size_t k = 0; k < pids.size(); ++k) {
      if (!running[k]) continue;
      ::kill(-pids[k], SIGTERM);
      // A stopped rank (SIGSTOP, the usual hung-rank case) acts on nothing
      // but SIGKILL until continued: without this it sat out the whole
      // grace (a 3 s timeout then 5 s, measured 8.5 s). Continued, it acts
      // on the SIGTERM at once, as systemd follows SIGTERM with SIGCONT.
      // Running ranks are unaffected and keep their grace.
      ::kill(-pids[k], SIGCONT);
    }
    kill_at = Clock::now() + std::chrono::seconds(flags.kill_grace_s);
  };

  int open_fds = static_cast<int>(outputs.size());
  // Output still open after every rank exited belongs to a process a rank
  // left behind; it gets this long before the launcher stops reading.
  constexpr auto kDrainAfterExit = std::chrono::seconds(2);
  Clock::time_point drain_until = Clock::time_point::max();
  while (live > 0 || (open_fds > 0 && Clock::now() < drain_until)) {
    std::vector<pollfd> pfds;
    std::vector<size_t> which;
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k].fd >= 0) {
        pfds.push_back(pollfd{outputs[k].fd, POLLIN, 0});
        which.push_back(k);
      }
    }
    int r = ::poll(pfds.data(), pfds.size(), 100);
    if (r > 0) {
      for (size_t p = 0; p < pfds.size(); ++p) {
        if ((pfds[p].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        Output& o = outputs[which[p]];
        char buf[65536];
        ssize_t n = ::read(o.fd, buf, sizeof(buf));
        if (n > 0) {
          Emit(o, buf, static_cast<size_t>(n));
        } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
          FlushPartial(o);
          ::close(o.fd);
          o.fd = -1;
          --open_fds;
        }
      }
    }
    for (int status; live > 0;) {
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      auto it = rank_of.find(pid);
      if (it == rank_of.end()) continue;
      size_t k = 0;
      while (pids[k] != pid) ++k;
      running[k] = false;
      if (--live == 0) drain_until = Clock::now() + kDrainAfterExit;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && !stopping && flags.wait_on_failure) {
        if (exit_code == 0) {
          exit_code = code;
          result.failed_rank = it->second;
          result.why = "rank " + std::to_string(it->second) +
                       (WIFEXITED(status) ? " exited with code " + std::to_string(code)
                                          : " was killed by signal " + std::to_string(WTERMSIG(status)));
        }
        std::fprintf(stderr, "launch: rank %d %s; the others keep running (--on_failure=wait)\n", it->second,
                     WIFEXITED(status) ? ("exited with code " + std::to_string(code)).c_str()
                                       : ("was killed by signal " + std::to_string(WTERMSIG(status))).c_str());
      } else if (code != 0 && !stopping) {
        exit_code = code;
        result.failed_rank = it->second;
        std::string why = "rank " + std::to_string(it->second) +
                          (WIFEXITED(status) ? " exited with code " + std::to_string(code)
                                             : " was killed by signal " + std::to_string(WTERMSIG(status)));
        // After a hang the first rank to fail is usually a healthy one that
        // timed out waiting: name the rank at fault, from what the failed
        // rank's error says did not arrive and which ranks of this node are
        // stopped.
        for (Output& o : outputs) {
          if (o.rank == it->second) FlushPartial(o);
        }
        std::set<int> named;
        for (const Output& o : outputs) {
          if (o.rank == it->second) {
            for (int r : NamedAsMissing(o.recent)) named.insert(r);
          }
        }
        std::set<int> stopped;
        for (size_t s = 0; s < pids.size(); ++s) {
          if (running[s] && IsStopped(pids[s])) stopped.insert(rank_of[pids[s]]);
        }
        std::set<int> fault(named);
        fault.insert(stopped.begin(), stopped.end());
        fault.erase(it->second);
        if (!fault.empty()) {
          why += ", but the rank" + std::string(fault.size() == 1 ? " at fault is rank " : "s at fault are ranks ") +
                 Join(fault) + " (";
          if (!named.empty()) why += "named as not arriving by rank " + std::to_string(it->second);
          if (!named.empty() && !stopped.empty()) why += "; ";
          if (!stopped.empty()) why += "stopped on this node: " + Join(stopped);
          why += ")";
        }
        result.why = why;
        stop_others(why);
      }
    }
    if (g_interrupted != 0 && !stopping) {
      exit_code = 128 + g_interrupted;
      result.interrupted = true;
      stop_others("interrupted by signal " + std::to_string(g_interrupted));
    }
    if (stopping && Clock::now() >= kill_at) {
      for (size_t k = 0; k < pids.size(); ++k) {
        if (running[k]) ::kill(-pids[k], SIGKILL);
      }
      kill_at = Clock::time_point::max();
    }
  }
  for (Output& o : outputs) FlushPartial(o);
  result.exit_code = exit_code;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("--", 0) != 0) break;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    size_t eq = arg.find('=');
    if (eq == std::string::npos) Usage("flag " + arg + " needs =VALUE");
    std::string name = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    if (name == "nproc_per_node") {
      flags.nproc_per_node = ParseInt(name, value, 1, 4096);
    } else if (name == "nnodes") {
      flags.nnodes = ParseInt(name, value, 1, 65536);
    } else if (name == "node_rank") {
      flags.node_rank = ParseInt(name, value, 0, 65535);
    } else if (name == "master_addr") {
      if (value.empty()) Usage("--master_addr must name a host (got an empty value)");
      flags.master_addr = value;
    } else if (name == "master_port") {
      flags.master_port = ParseInt(name, value, 0, 65535);
    } else if (name == "kill_grace_s") {
      flags.kill_grace_s = ParseInt(name, value, 0, 3600);
    } else if (name == "gpus") {
      flags.gpus.clear();
      if (value != "local") {
        size_t start = 0;
        while (start <= value.size()) {
          size_t comma = value.find(',', start);
          if (comma == std::string::npos) comma = value.size();
          flags.gpus.push_back(ParseInt(name, value.substr(start, comma - start), 0, 65535));
          start = comma + 1;
        }
      }
    } else if (name == "share_gpu") {
      flags.share_gpu = ParseInt(name, value, 0, 65535);
    } else if (name == "max_restarts") {
      flags.max_restarts = ParseInt(name, value, 0, 1000000);
    } else if (name == "on_failure") {
      if (value != "stop" && value != "wait") Usage("--on_failure must be stop or wait, not " + value);
      flags.wait_on_failure = value == "wait";
    } else {
      Usage("unknown flag --" + name);
    }
  }
  if (flags.nproc_per_node < 1) Usage("--nproc_per_node is required");
  if (flags.node_rank >= flags.nnodes) Usage("--node_rank must be below --nnodes");
  if (i >= argc) Usage("no PROGRAM given");
  if (!flags.gpus.empty() && flags.gpus.size() != 1 &&
      static_cast<int>(flags.gpus.size()) != flags.nproc_per_node) {
    Usage("--gpus lists " + std::to_string(flags.gpus.size()) + " GPUs for " +
          std::to_string(flags.nproc_per_node) + " local ranks (give one per local rank, or one for all)");
  }
  if (!flags.gpus.empty() && flags.share_gpu >= 0) Usage("--gpus and --share_gpu exclude each other");
  if (flags.master_port == 0 && flags.nnodes != 1) Usage("--master_port=0 only works with --nnodes=1");
  // Under `bazel run`, behave as if run from the caller's directory.
  if (const char* wd = sk::GetEnv(sk::EnvVar::kBuildWorkingDirectory); wd != nullptr) {
    if (::chdir(wd) != 0) Usage(std::string("cannot enter ") + wd);
  }
  std::vector<char*> program_args(argv + i, argv + argc);
  program_args.push_back(nullptr);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Node 0's launcher serves the store for every attempt (keys are scoped
  // by the attempt); it lives until the launcher exits.
  std::unique_ptr<sk::comm::TcpStore> store;
  if (flags.node_rank == 0) {
    sk::StatusOr<std::unique_ptr<sk::comm::TcpStore>> served =
        sk::comm::TcpStore::Create("127.0.0.1", flags.master_port, /*serve=*/true);
    if (!served.ok()) {
      std::fprintf(stderr, "launch: cannot serve the rendezvous store on port %d: %s (another job on that port? "
                   "pick another --master_port, or 0 for a free one)\n",
                   flags.master_port, std::string(served.status().message()).c_str());
      return 2;
    }
    store = std::move(served).value();
    flags.master_port = store->port();
  }
  const pid_t launcher = ::getpid();
  for (int attempt = 0;; ++attempt) {
    AttemptResult r = RunAttempt(flags, program_args, attempt, launcher);
    if (r.exit_code == 0) return 0;
    if (r.interrupted) {
      std::fprintf(stderr, "launch: exit %d: the launcher was interrupted by signal %d\n", r.exit_code,
                   r.exit_code - 128);
      return r.exit_code;
    }
    if (attempt < flags.max_restarts && g_interrupted == 0) {
      std::fprintf(stderr, "launch: attempt %d failed (%s); restarting the group (restart %d of %d)\n", attempt,
                   r.why.c_str(), attempt + 1, flags.max_restarts);
      continue;
    }
    std::fprintf(stderr, "launch: exit %d: %s%s\n", r.exit_code, r.why.c_str(),
                 flags.max_restarts > 0 ? (", after " + std::to_string(attempt) + " restart" +
                                           (attempt == 1 ? "" : "s")).c_str()
                                        : "");
    return r.exit_code;
  }
}
