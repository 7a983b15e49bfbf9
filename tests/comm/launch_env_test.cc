// DistributedEnv::FromEnvironment (runtime/comm/launch_env.h): each case
// resolves a fake launcher environment in a child process whose environment
// holds only those variables.
#include "runtime/comm/launch_env.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace sk::comm {
namespace {

using Vars = std::vector<std::pair<std::string, std::string>>;

const char* StoreName(StoreServer s) {
  switch (s) {
    case StoreServer::kRankZero:
      return "rank0";
    case StoreServer::kTorchrunAgent:
      return "agent";
    case StoreServer::kLauncher:
      return "launcher";
  }
  return "?";
}

// "rank/world local/local_world addr:port source store attempt", or
// "error: message".
std::string Resolve(const Vars& vars) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::clearenv();
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
    StatusOr<DistributedEnv> env = DistributedEnv::FromEnvironment();
    std::string out;
    if (env.ok()) {
      out = std::to_string(env->rank) + "/" + std::to_string(env->world_size) + " " + std::to_string(env->local_rank) +
            "/" + std::to_string(env->local_world_size) + " " + env->master_addr + ":" +
            std::to_string(env->master_port) + " " + env->source + " " + StoreName(env->store_server) + " " +
            env->KeyPrefix();
    } else {
      out = "error: " + std::string(env.status().message());
    }
    ssize_t ignored = ::write(fds[1], out.data(), out.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(LaunchEnv, TorchrunsAgentStoreAndItsRestartCount) {
  EXPECT_EQ(Resolve({{"RANK", "1"},
                     {"WORLD_SIZE", "4"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "localhost"},
                     {"MASTER_PORT", "29500"},
                     {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                     {"TORCHELASTIC_RESTART_COUNT", "2"}}),
            "1/4 1/2 localhost:29500 RANK agent attempt_2/");
  // By hand: rank 0 serves; our launcher: it serves.
  Vars by_hand = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29501"}};
  EXPECT_EQ(Resolve(by_hand), "0/2 0/2 127.0.0.1:29501 RANK rank0 attempt_0/");
  Vars launched = by_hand;
  launched.push_back({"SK_LAUNCHER_STORE", "1"});
  launched.push_back({"TORCHELASTIC_RESTART_COUNT", "1"});
  EXPECT_EQ(Resolve(launched), "0/2 0/2 127.0.0.1:29501 RANK launcher attempt_1/");
  Vars both = launched;
  both.push_back({"TORCHELASTIC_USE_AGENT_STORE", "True"});
  EXPECT_TRUE(Has(Resolve(both), "are both set")) << Resolve(both);
  Vars odd = by_hand;
  odd.push_back({"TORCHELASTIC_USE_AGENT_STORE", "maybe"});
  EXPECT_TRUE(Has(Resolve(odd), "TORCHELASTIC_USE_AGENT_STORE='maybe' is neither True nor False")) << Resolve(odd);
}

// torchrun under srun: Slurm's variables describe the agents, RANK the worker.
TEST(LaunchEnv, RankWinsOverSlurmAndIsNeverCompletedByIt) {
  EXPECT_EQ(Resolve({{"RANK", "5"},
                     {"WORLD_SIZE", "16"},
                     {"MASTER_ADDR", "node01"},
                     {"MASTER_PORT", "29500"},
                     {"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "2"}}),
            "5/16 5/16 node01:29500 RANK rank0 attempt_0/");
  const std::string half = Resolve({{"RANK", "5"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}});
  EXPECT_TRUE(Has(half, "WORLD_SIZE is not set but RANK is")) << half;
  const std::string no_port = Resolve({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}});
  EXPECT_TRUE(Has(no_port, "MASTER_PORT is not set but RANK is")) << no_port;
}

TEST(LaunchEnv, SlurmAloneGivesRanksTheFirstNodeAndAPortFromTheJob) {
  Vars slurm = {{"SLURM_PROCID", "9"},
                {"SLURM_NTASKS", "16"},
                {"SLURM_LOCALID", "1"},
                {"SLURM_NODEID", "1"},
                {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"},
                {"SLURM_STEP_NODELIST", "node[07-08]"},
                {"SLURM_JOB_NODELIST", "node[01-04,07-08]"},
                {"SLURM_JOB_ID", "123456"}};
  // 10000 + 123456 mod 20000 (docs/launch.md).
  EXPECT_EQ(Resolve(slurm), "9/16 1/8 node07:13456 SLURM_PROCID rank0 attempt_0/");
  Vars job_list_only = slurm;
  job_list_only.erase(job_list_only.begin() + 5);
  EXPECT_EQ(Resolve(job_list_only), "9/16 1/8 node01:13456 SLURM_PROCID rank0 attempt_0/");
  Vars told = slurm;
  told.push_back({"MASTER_ADDR", "login1"});
  told.push_back({"MASTER_PORT", "29400"});
  EXPECT_EQ(Resolve(told), "9/16 1/8 login1:29400 SLURM_PROCID rank0 attempt_0/");
  const std::string nowhere = Resolve({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_TRUE(Has(nowhere, "MASTER_ADDR is not set and neither SLURM_STEP_NODELIST")) << nowhere;
  const std::string over = Resolve({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "n1"},
                                    {"SLURM_JOB_ID", "7"}});
  EXPECT_TRUE(Has(over, "SLURM_PROCID=4 is not below SLURM_NTASKS=4")) << over;
  const std::string no_size = Resolve({{"SLURM_PROCID", "0"}});
  EXPECT_TRUE(Has(no_size, "SLURM_NTASKS is not set but SLURM_PROCID is")) << no_size;
  Vars bad_local = slurm;
  bad_local[2].second = "8";
  EXPECT_TRUE(Has(Resolve(bad_local), "SLURM_LOCALID=8 and SLURM_STEP_TASKS_PER_NODE=8 do not fit")) << Resolve(bad_local);
  Vars bad_list = slurm;
  bad_list[5].second = "node[07-";
  EXPECT_TRUE(Has(Resolve(bad_list), "SLURM_STEP_NODELIST: Slurm node list 'node[07-' is malformed")) << Resolve(bad_list);
  Vars bad_node = slurm;
  bad_node[3].second = "2";
  EXPECT_TRUE(Has(Resolve(bad_node), "SLURM_NODEID=2 has no entry")) << Resolve(bad_node);
}

TEST(LaunchEnv, PmixAndSlurmMustAgree) {
  Vars v = {{"PMIX_RANK", "1"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[1-2]-ib,b3"},
            {"SLURM_JOB_ID", "20001"}};
  EXPECT_EQ(Resolve(v), "1/2 1/2 a1-ib:10001 PMIX_RANK rank0 attempt_0/");
  v[1].second = "0";
  EXPECT_TRUE(Has(Resolve(v), "PMIX_RANK=1 and SLURM_PROCID=0 disagree")) << Resolve(v);
}

TEST(LaunchEnv, OpenMpiOnOneNodeNeedsNoAddress) {
  auto rank = [](int r, const std::string& ns) {
    return Resolve({{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                    {"PMIX_RANK", std::to_string(r)},
                    {"PMIX_NAMESPACE", ns}});
  };
  const std::string r0 = rank(0, "1346043905"), r1 = rank(1, "1346043905"), other = rank(0, "99");
  ASSERT_TRUE(Has(r0, "0/2 0/2 127.0.0.1:")) << r0;
  ASSERT_TRUE(Has(r1, "1/2 1/2 127.0.0.1:")) << r1;
  const int port0 = std::atoi(r0.c_str() + r0.find(':') + 1), port1 = std::atoi(r1.c_str() + r1.find(':') + 1);
  EXPECT_EQ(port0, port1) << "every rank of one job derives the same port";
  EXPECT_GE(port0, 10000);
  EXPECT_LT(port0, 30000);
  EXPECT_NE(port0, std::atoi(other.c_str() + other.find(':') + 1)) << "another job, another port";
  EXPECT_TRUE(Has(r0, "OMPI_COMM_WORLD_RANK rank0")) << r0;

  const std::string disagree = Resolve({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_RANK", "1"}});
  EXPECT_TRUE(Has(disagree, "OMPI_COMM_WORLD_RANK=0 and PMIX_RANK=1 disagree")) << disagree;
  const std::string nodes = Resolve({{"OMPI_COMM_WORLD_RANK", "0"},
                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                     {"PMIX_NAMESPACE", "5"}});
  EXPECT_TRUE(Has(nodes, "-x MASTER_ADDR=")) << nodes;
  const std::string no_size = Resolve({{"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_TRUE(Has(no_size, "OMPI_COMM_WORLD_SIZE is not set but OMPI_COMM_WORLD_RANK is")) << no_size;
  const std::string agent = Resolve({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"},
                                     {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"MASTER_PORT", "5"}});
  EXPECT_TRUE(Has(agent, "RANK is not set (the rank came from OMPI_COMM_WORLD_RANK)")) << agent;
}

TEST(LaunchEnv, KubeflowPyTorchJob) {
  // The operator sets the launcher convention itself.
  EXPECT_EQ(Resolve({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"},
                     {"PET_NNODES", "3"}, {"PET_NODE_RANK", "2"}}),
            "2/3 2/3 job-master-0:23456 RANK rank0 attempt_0/");
  Vars pet = {{"PET_NODE_RANK", "1"}, {"PET_NNODES", "3"}, {"PET_MASTER_ADDR", "job-master-0"},
              {"PET_MASTER_PORT", "23456"}};
  EXPECT_EQ(Resolve(pet), "1/3 0/1 job-master-0:23456 PET_NODE_RANK rank0 attempt_0/");
  Vars eight = pet;
  eight.push_back({"PET_NPROC_PER_NODE", "8"});
  EXPECT_TRUE(Has(Resolve(eight), "run the program under torchrun")) << Resolve(eight);
  Vars elastic = pet;
  elastic[1].second = "1:4";
  EXPECT_TRUE(Has(Resolve(elastic), "'1:4' is an elastic range")) << Resolve(elastic);
}

TEST(LaunchEnv, NothingSetNamesEveryLauncher) {
  const std::string none = Resolve({});
  EXPECT_TRUE(Has(none, "RANK is not set")) << none;
  EXPECT_TRUE(Has(none, "SLURM_PROCID")) << none;
  EXPECT_TRUE(Has(none, "OMPI_COMM_WORLD_RANK")) << none;
}

TEST(SlurmNodelist, ExpandsCompressedLists) {
  using L = std::vector<std::string>;
  EXPECT_EQ(*ExpandSlurmNodelist("node[01-04,07]"), (L{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(*ExpandSlurmNodelist("a[1-2]-ib,b3"), (L{"a1-ib", "a2-ib", "b3"}));
  EXPECT_EQ(*ExpandSlurmNodelist("r[1-2]n[1-2]"), (L{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(*ExpandSlurmNodelist("host"), (L{"host"}));
  EXPECT_EQ(*ExpandSlurmNodelist("n[8-10]"), (L{"n8", "n9", "n10"}));
  for (const char* bad : {"n[3-1]", "n[", "n]", "", "a,,b", "n[x]", "n[1-]", "n[[1]]", "n[0-99999999]"}) {
    StatusOr<std::vector<std::string>> s = ExpandSlurmNodelist(bad);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Has(std::string(s.status().message()), "is malformed")) << bad << ": " << s.status().ToString();
  }
}

TEST(SlurmNodelist, ExpandsTasksPerNode) {
  EXPECT_EQ(*ExpandSlurmTasksPerNode("8(x2),4"), (std::vector<int>{8, 8, 4}));
  EXPECT_EQ(*ExpandSlurmTasksPerNode("2"), (std::vector<int>{2}));
  for (const char* bad : {"(x2)", "8(x0)", "8(y2)", "8(x2", "", "8,", "-1"}) {
    EXPECT_EQ(ExpandSlurmTasksPerNode(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace sk::comm
