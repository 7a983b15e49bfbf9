#include "runtime/comm/launch_env.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "runtime/comm/c10d_store.h"
#include "runtime/core/env.h"

namespace sk::comm {

namespace {

// Decimal digits only (strtol would also take " 1", "+1" and "-0"), at most
// 2^24: more ranks than any launcher starts, and a port fits.
constexpr long kMaxInt = 1L << 24;

StatusOr<std::optional<int>> ParseInt(EnvVar var) {
  const char* v = GetEnv(var);
  if (v == nullptr) return std::optional<int>();
  char* end = nullptr;
  errno = 0;
  const long x = std::isdigit(static_cast<unsigned char>(*v)) ? std::strtol(v, &end, 10) : -1;
  if (x < 0 || *end != '\0' || errno == ERANGE || x > kMaxInt) {
    return InvalidArgumentError(std::string("environment variable ") + EnvName(var) + "='" + v +
                                "' is not an integer in [0, " + std::to_string(kMaxInt) + "]");
  }
  return std::optional<int>(static_cast<int>(x));
}

StatusOr<int> Required(EnvVar var, const std::string& why) {
  SK_ASSIGN_OR_RETURN(std::optional<int> v, ParseInt(var));
  if (!v) return InvalidArgumentError(std::string("environment variable ") + EnvName(var) + " is not set" + why);
  return *v;
}

StatusOr<int> Optional(EnvVar var, int fallback) {
  SK_ASSIGN_OR_RETURN(std::optional<int> v, ParseInt(var));
  return v.value_or(fallback);
}

StatusOr<bool> Flag(EnvVar var, const char* yes, const char* no) {
  const char* v = GetEnv(var);
  if (v == nullptr) return false;
  const std::string s = v;
  if (s == yes || s == "1" || s == "true") return true;
  if (s == no || s == "0" || s == "false") return false;
  return InvalidArgumentError(std::string("environment variable ") + EnvName(var) + "='" + v + "' is neither " +
                              yes + " nor " + no);
}

// 10000 + x mod 20000: 10000..29999, below Linux's ephemeral ports (32768 on).
int DerivedPort(uint64_t x) { return static_cast<int>(10000 + x % 20000); }

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The first host of the step's (or job's) node list, or "" when neither is set.
StatusOr<std::string> SlurmFirstNode() {
  for (EnvVar var : {EnvVar::kSlurmStepNodelist, EnvVar::kSlurmJobNodelist}) {
    const char* list = GetEnv(var);
    if (list == nullptr) continue;
    StatusOr<std::vector<std::string>> hosts = ExpandSlurmNodelist(list);
    if (!hosts.ok()) return hosts.status().WithContext(EnvName(var));
    return hosts->front();
  }
  return std::string();
}

StatusOr<int> SlurmPort() {
  SK_ASSIGN_OR_RETURN(std::optional<int> job, ParseInt(EnvVar::kSlurmJobId));
  if (!job) return -1;
  return DerivedPort(static_cast<uint64_t>(*job));
}

// This node's entry of SLURM_STEP_TASKS_PER_NODE, or 0 when unknown.
StatusOr<int> SlurmTasksOnThisNode() {
  const char* tasks = GetEnv(EnvVar::kSlurmStepTasksPerNode);
  SK_ASSIGN_OR_RETURN(std::optional<int> node, ParseInt(EnvVar::kSlurmNodeid));
  if (tasks == nullptr || !node) return 0;
  StatusOr<std::vector<int>> per_node = ExpandSlurmTasksPerNode(tasks);
  if (!per_node.ok()) return per_node.status().WithContext("SLURM_STEP_TASKS_PER_NODE");
  if (*node >= static_cast<int>(per_node->size())) {
    return InvalidArgumentError("SLURM_NODEID=" + std::to_string(*node) + " has no entry in SLURM_STEP_TASKS_PER_NODE='" +
                                tasks + "' (" + std::to_string(per_node->size()) + " nodes)");
  }
  return (*per_node)[*node];
}

// Fills master_addr/master_port: MASTER_* when set, else `addr`/`port`
// (empty / negative: none), naming `how` in the error.
Status Master(DistributedEnv& env, const std::string& addr, int port, const std::string& how) {
  const char* a = GetEnv(EnvVar::kMasterAddr);
  if (a != nullptr) {
    env.master_addr = a;
  } else if (!addr.empty()) {
    env.master_addr = addr;
  } else {
    return InvalidArgumentError("environment variable MASTER_ADDR is not set" + how);
  }
  SK_ASSIGN_OR_RETURN(std::optional<int> p, ParseInt(EnvVar::kMasterPort));
  if (p) {
    env.master_port = *p;
  } else if (port >= 0) {
    env.master_port = port;
  } else {
    return InvalidArgumentError("environment variable MASTER_PORT is not set" + how);
  }
  return OkStatus();
}

Status Agree(EnvVar a, int va, EnvVar b) {
  SK_ASSIGN_OR_RETURN(std::optional<int> vb, ParseInt(b));
  if (vb && *vb != va) {
    return InvalidArgumentError(std::string(EnvName(a)) + "=" + std::to_string(va) + " and " + EnvName(b) + "=" +
                                std::to_string(*vb) + " disagree: both name this process's rank (two launchers' "
                                "variables in one environment?)");
  }
  return OkStatus();
}

}  // namespace

StatusOr<DistributedEnv> DistributedEnv::FromEnvironment() {
  DistributedEnv env;
  bool local_rank_given = false;
  const char* size_name = "WORLD_SIZE";
  const char* local_rank_name = "LOCAL_RANK";
  const char* local_size_name = "LOCAL_WORLD_SIZE";
  if (GetEnv(EnvVar::kRank) != nullptr) {
    env.source = "RANK";
    SK_ASSIGN_OR_RETURN(env.rank, Required(EnvVar::kRank, ""));
    SK_ASSIGN_OR_RETURN(env.world_size,
                        Required(EnvVar::kWorldSize, " but RANK is (torchrun, launch and a PyTorchJob set both; a "
                                                     "scheduler's world size is not mixed in)"));
    SK_ASSIGN_OR_RETURN(std::optional<int> local_rank, ParseInt(EnvVar::kLocalRank));
    local_rank_given = local_rank.has_value();
    env.local_rank = local_rank.value_or(env.rank);
    SK_ASSIGN_OR_RETURN(env.local_world_size, Optional(EnvVar::kLocalWorldSize, env.world_size));
    const char* pet = GetEnv(EnvVar::kPetMasterAddr);
    SK_ASSIGN_OR_RETURN(int pet_port, Optional(EnvVar::kPetMasterPort, -1));
    SK_RETURN_IF_ERROR(Master(env, pet != nullptr ? pet : "", pet_port, " but RANK is"));
  } else if (GetEnv(EnvVar::kOmpiCommWorldRank) != nullptr) {
    env.source = "OMPI_COMM_WORLD_RANK";
    size_name = "OMPI_COMM_WORLD_SIZE";
    local_rank_name = "OMPI_COMM_WORLD_LOCAL_RANK";
    local_size_name = "OMPI_COMM_WORLD_LOCAL_SIZE";
    SK_ASSIGN_OR_RETURN(env.rank, Required(EnvVar::kOmpiCommWorldRank, ""));
    SK_ASSIGN_OR_RETURN(env.world_size, Required(EnvVar::kOmpiCommWorldSize, " but OMPI_COMM_WORLD_RANK is"));
    SK_RETURN_IF_ERROR(Agree(EnvVar::kOmpiCommWorldRank, env.rank, EnvVar::kPmixRank));
    SK_ASSIGN_OR_RETURN(std::optional<int> local_rank, ParseInt(EnvVar::kOmpiCommWorldLocalRank));
    local_rank_given = local_rank.has_value();
    env.local_rank = local_rank.value_or(env.rank);
    SK_ASSIGN_OR_RETURN(env.local_world_size, Optional(EnvVar::kOmpiCommWorldLocalSize, env.world_size));
    // One node: the store is local. Several: Slurm's first node if mpirun
    // runs in an allocation, else the user must say.
    std::string addr;
    if (env.local_world_size == env.world_size) {
      addr = "127.0.0.1";
    } else {
      SK_ASSIGN_OR_RETURN(addr, SlurmFirstNode());
    }
    int port = -1;
    if (const char* ns = GetEnv(EnvVar::kPmixNamespace); ns != nullptr) port = DerivedPort(Fnv1a(ns));
    if (port < 0) {
      SK_ASSIGN_OR_RETURN(port, SlurmPort());
    }
    SK_RETURN_IF_ERROR(Master(env, addr, port,
                              " and mpirun gives no store address for ranks on several nodes: pass "
                              "-x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<port> to mpirun"));
  } else if (GetEnv(EnvVar::kPmixRank) != nullptr || GetEnv(EnvVar::kSlurmProcid) != nullptr) {
    const bool pmix = GetEnv(EnvVar::kPmixRank) != nullptr;
    env.source = pmix ? "PMIX_RANK" : "SLURM_PROCID";
    size_name = "SLURM_NTASKS";
    local_rank_name = "SLURM_LOCALID";
    local_size_name = "SLURM_STEP_TASKS_PER_NODE";
    SK_ASSIGN_OR_RETURN(env.rank, Required(pmix ? EnvVar::kPmixRank : EnvVar::kSlurmProcid, ""));
    if (pmix) {
      SK_RETURN_IF_ERROR(Agree(EnvVar::kPmixRank, env.rank, EnvVar::kSlurmProcid));
    }
    SK_ASSIGN_OR_RETURN(env.world_size, Required(EnvVar::kSlurmNtasks, " but " + env.source + " is (srun sets both)"));
    SK_ASSIGN_OR_RETURN(std::optional<int> local_rank, ParseInt(EnvVar::kSlurmLocalid));
    local_rank_given = local_rank.has_value();
    env.local_rank = local_rank.value_or(env.rank);
    SK_ASSIGN_OR_RETURN(int on_node, SlurmTasksOnThisNode());
    env.local_world_size = on_node > 0 ? on_node : env.world_size;
    SK_ASSIGN_OR_RETURN(std::string addr, SlurmFirstNode());
    SK_ASSIGN_OR_RETURN(int port, SlurmPort());
    SK_RETURN_IF_ERROR(Master(env, addr, port,
                              " and neither SLURM_STEP_NODELIST/SLURM_JOB_NODELIST (the host) nor SLURM_JOB_ID "
                              "(the port) says it"));
  } else if (GetEnv(EnvVar::kPetNodeRank) != nullptr) {
    env.source = "PET_NODE_RANK";
    size_name = "PET_NNODES";
    if (const char* nproc = GetEnv(EnvVar::kPetNprocPerNode); nproc != nullptr && std::string(nproc) != "1") {
      return InvalidArgumentError(std::string("PET_NPROC_PER_NODE='") + nproc +
                                  "' asks for several processes per pod, which torchrun starts: run the program "
                                  "under torchrun in the PyTorchJob (docs/launch.md)");
    }
    if (const char* nnodes = GetEnv(EnvVar::kPetNnodes); nnodes != nullptr && std::string(nnodes).find(':') != std::string::npos) {
      return InvalidArgumentError(std::string("PET_NNODES='") + nnodes +
                                  "' is an elastic range, which torchrun's rendezvous resolves: run the program under "
                                  "torchrun in the PyTorchJob (docs/launch.md)");
    }
    SK_ASSIGN_OR_RETURN(env.rank, Required(EnvVar::kPetNodeRank, ""));
    SK_ASSIGN_OR_RETURN(env.world_size, Required(EnvVar::kPetNnodes, " but PET_NODE_RANK is"));
    env.local_rank = 0;
    env.local_world_size = 1;
    const char* addr = GetEnv(EnvVar::kPetMasterAddr);
    SK_ASSIGN_OR_RETURN(int port, Optional(EnvVar::kPetMasterPort, -1));
    SK_RETURN_IF_ERROR(Master(env, addr != nullptr ? addr : "", port, " nor PET_MASTER_ADDR/PET_MASTER_PORT"));
  } else {
    return InvalidArgumentError(
        "environment variable RANK is not set, nor any launcher's rank (OMPI_COMM_WORLD_RANK from mpirun, PMIX_RANK, "
        "SLURM_PROCID from srun, PET_NODE_RANK from a PyTorchJob): start the program with torchrun, launch, srun or "
        "mpirun, or pass rank and world_size in the options (docs/launch.md)");
  }
  if (env.world_size < 1 || env.rank >= env.world_size) {
    return InvalidArgumentError(env.source + "=" + std::to_string(env.rank) + " is not below " + size_name + "=" +
                                std::to_string(env.world_size));
  }
  // Both given (as launchers give them): the local rank must be one of the
  // node's. (LOCAL_WORLD_SIZE alone is also read as a thread budget, e.g.
  // set to the core count: not checked against the world size.)
  if (local_rank_given && (env.local_world_size < 1 || env.local_rank >= env.local_world_size)) {
    return InvalidArgumentError(std::string(local_rank_name) + "=" + std::to_string(env.local_rank) + " and " +
                                local_size_name + "=" + std::to_string(env.local_world_size) + " do not fit: " +
                                local_rank_name + " must be below " + local_size_name);
  }
  if (env.master_port < 1 || env.master_port > 65535) {
    return InvalidArgumentError("MASTER_PORT=" + std::to_string(env.master_port) + " is not a TCP port");
  }
  SK_ASSIGN_OR_RETURN(env.restart_count, Optional(EnvVar::kTorchelasticRestartCount, 0));
  SK_ASSIGN_OR_RETURN(bool agent, Flag(EnvVar::kTorchelasticUseAgentStore, "True", "False"));
  SK_ASSIGN_OR_RETURN(bool launcher, Flag(EnvVar::kLauncherStore, "1", "0"));
  if (agent && launcher) {
    return InvalidArgumentError(
        "TORCHELASTIC_USE_AGENT_STORE=True (torchrun's agent serves a c10d store) and SK_LAUNCHER_STORE=1 (our "
        "launch serves a shardkit store) are both set: one launcher's variables leaked into the other's");
  }
  if ((agent || launcher) && env.source != "RANK") {
    return InvalidArgumentError(std::string(agent ? "TORCHELASTIC_USE_AGENT_STORE" : "SK_LAUNCHER_STORE") +
                                " says a launcher serves the store, but RANK is not set (the rank came from " +
                                env.source + "): that launcher sets RANK for its ranks");
  }
  env.store_server = agent ? StoreServer::kTorchrunAgent : launcher ? StoreServer::kLauncher : StoreServer::kRankZero;
  return env;
}

StatusOr<std::shared_ptr<Store>> ConnectWorldStore(const DistributedEnv& env, Duration timeout) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  std::shared_ptr<Store> store;
  switch (env.store_server) {
    case StoreServer::kTorchrunAgent: {
      StatusOr<std::unique_ptr<C10dStore>> c = C10dStore::Create(env.master_addr, env.master_port, timeout);
      if (!c.ok()) {
        return c.status().WithContext("rank " + std::to_string(env.rank) + ": connecting to torchrun's agent store at " +
                                      where + " (TORCHELASTIC_USE_AGENT_STORE=True)");
      }
      store = std::move(*c);
      break;
    }
    case StoreServer::kLauncher:
    case StoreServer::kRankZero: {
      const bool serve = env.store_server == StoreServer::kRankZero && env.rank == 0;
      StatusOr<std::unique_ptr<TcpStore>> c = TcpStore::Create(env.master_addr, env.master_port, serve, timeout);
      if (!c.ok()) {
        const std::string who = env.store_server == StoreServer::kLauncher ? "the launcher's store (SK_LAUNCHER_STORE=1)"
                                : serve ? "serving the store as rank 0"
                                        : "rank 0's store";
        return c.status().WithContext("rank " + std::to_string(env.rank) + ": " + who + " at " + where);
      }
      store = std::move(*c);
      break;
    }
  }
  return std::shared_ptr<Store>(std::make_shared<PrefixStore>(env.KeyPrefix(), std::move(store)));
}

StatusOr<std::vector<std::string>> ExpandSlurmNodelist(const std::string& list) {
  constexpr size_t kMaxHosts = size_t{1} << 20;
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("Slurm node list '" + list + "' is malformed: " + why);
  };
  // Top-level items: commas outside brackets separate them.
  std::vector<std::string> items;
  int depth = 0;
  std::string cur;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) return bad("a ']' without its '['");
    if (c == '[' && depth > 1) return bad("nested '['");
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (depth != 0) return bad("a '[' without its ']'");
  items.push_back(cur);
  std::vector<std::string> hosts;
  for (const std::string& item : items) {
    if (item.empty()) return bad("an empty entry");
    std::vector<std::string> partial = {""};
    size_t i = 0;
    while (i < item.size()) {
      if (item[i] != '[') {
        const size_t next = std::min(item.find('[', i), item.size());
        for (std::string& p : partial) p += item.substr(i, next - i);
        i = next;
        continue;
      }
      const size_t close = item.find(']', i);
      const std::string ranges = item.substr(i + 1, close - i - 1);
      i = close + 1;
      std::vector<std::string> suffixes;
      size_t start = 0;
      while (start <= ranges.size()) {
        size_t comma = ranges.find(',', start);
        if (comma == std::string::npos) comma = ranges.size();
        const std::string r = ranges.substr(start, comma - start);
        start = comma + 1;
        const size_t dash = r.find('-');
        const std::string lo_s = r.substr(0, dash);
        const std::string hi_s = dash == std::string::npos ? lo_s : r.substr(dash + 1);
        auto digits = [](const std::string& s) {
          if (s.empty() || s.size() > 9) return false;
          for (char c : s) {
            if (!std::isdigit(static_cast<unsigned char>(c))) return false;
          }
          return true;
        };
        if (!digits(lo_s) || !digits(hi_s)) return bad("'" + r + "' is not a number or a range of numbers");
        const long lo = std::stol(lo_s), hi = std::stol(hi_s);
        if (hi < lo) return bad("the range '" + r + "' runs backwards");
        if (static_cast<size_t>(hi - lo + 1) > kMaxHosts) return bad("over 2^20 hosts");
        for (long v = lo; v <= hi; ++v) {
          std::string n = std::to_string(v);
          if (n.size() < lo_s.size()) n.insert(0, lo_s.size() - n.size(), '0');
          suffixes.push_back(n);
        }
      }
      if (partial.size() * suffixes.size() > kMaxHosts) return bad("over 2^20 hosts");
      std::vector<std::string> next;
      for (const std::string& p : partial) {
        for (const std::string& s : suffixes) next.push_back(p + s);
      }
      partial = std::move(next);
    }
    hosts.insert(hosts.end(), partial.begin(), partial.end());
    if (hosts.size() > kMaxHosts) return bad("over 2^20 hosts");
  }
  return hosts;
}

StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(const std::string& list) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("Slurm tasks per node '" + list + "' is malformed: " + why);
  };
  std::vector<int> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string entry = list.substr(start, comma - start);
    start = comma + 1;
    // "N" or "N(xM)".
    char* end = nullptr;
    const long n = std::isdigit(static_cast<unsigned char>(entry.empty() ? 'x' : entry[0]))
                       ? std::strtol(entry.c_str(), &end, 10)
                       : -1;
    if (n < 0 || n > kMaxInt) return bad("'" + entry + "' is not a task count");
    long repeat = 1;
    if (*end == '(') {
      char* rend = nullptr;
      if (end[1] != 'x' || !std::isdigit(static_cast<unsigned char>(end[2]))) return bad("'" + entry + "'");
      repeat = std::strtol(end + 2, &rend, 10);
      if (std::string(rend) != ")" || repeat < 1 || repeat > kMaxInt) return bad("'" + entry + "'");
    } else if (*end != '\0') {
      return bad("'" + entry + "'");
    }
    if (out.size() + static_cast<size_t>(repeat) > (size_t{1} << 20)) return bad("over 2^20 nodes");
    out.insert(out.end(), static_cast<size_t>(repeat), static_cast<int>(n));
  }
  return out;
}

int LocalWorldSizeHint() {
  for (EnvVar var : {EnvVar::kLocalWorldSize, EnvVar::kOmpiCommWorldLocalSize}) {
    StatusOr<std::optional<int>> v = ParseInt(var);
    if (!v.ok()) return 0;
    if (*v) return **v;
  }
  StatusOr<int> slurm = SlurmTasksOnThisNode();
  return slurm.ok() ? *slurm : 0;
}

StatusOr<std::pair<int, const char*>> LocalRankHint() {
  for (EnvVar var : {EnvVar::kLocalRank, EnvVar::kOmpiCommWorldLocalRank, EnvVar::kSlurmLocalid}) {
    SK_ASSIGN_OR_RETURN(std::optional<int> v, ParseInt(var));
    if (v) return std::make_pair(*v, EnvName(var));
  }
  return std::make_pair(-1, static_cast<const char*>(nullptr));
}

}  // namespace sk::comm
