// Simulated collective bandwidth, nccl-tests style: what the topology model
// predicts for all_gather, reduce_scatter and all_reduce on a profile's
// cluster, to hold against published nccl-tests numbers.
//
//   ./bazelw run -c opt //benchmarks:sim_collectives
//   ./bazelw run -c opt //benchmarks:sim_collectives -- --profile=h100-80g --ranks=16
//
// Every number is SIMULATED (virtual time, no data moves): each collective
// runs alone through SimProcessGroup on a sim stream, from a synchronised
// host, with no launch overhead charged, so time = the collective's span.
// Bytes, algbw and busbw as nccl-tests define them (all_gather output,
// reduce_scatter input, all_reduce buffer; busbw = algbw x (n-1)/n, x 2(n-1)/n
// for all_reduce). The world is packed onto nodes of the profile's
// gpus_per_node; the algorithm column is NCCL's choice per the model.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "benchmarks/util/die.h"
#include "runtime/comm/topology.h"
#include "runtime/sim/profile.h"
#include "runtime/sim/sim_device.h"
#include "runtime/sim/sim_process_group.h"
#include "runtime/sim/topology.h"
#include "tools/cli_flags.h"

DEFINE_string(profile, "a100-80g", "built-in profile name or a .json path");
DEFINE_string(ranks, "8,128,512", "comma-separated world sizes");
DEFINE_string(ops, "all_gather,reduce_scatter,all_reduce", "comma-separated collectives");
DEFINE_string(sizes, "65536,1048576,16777216,134217728,1073741824,8589934592",
              "comma-separated sizes in bytes (nccl-tests' count; rounded down to a multiple of 4 x ranks)");

namespace sk::sim {
namespace {

using bench::Die;
using bench::OrDie;

// A positive integer at most `hi`; strtoll's clamp at 2^63 - 1 (ERANGE) is
// refused too. --ranks=4294967304 used to run as 8 ranks (cast to int).
int64_t ParseInt(const std::string& s, const char* flag, int64_t hi = INT64_MAX) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v <= 0 || v > hi) {
    Die(std::string("--") + flag + ": '" + s + "' is not an integer in [1, " + std::to_string(hi) + "]");
  }
  return v;
}

comm::CollectiveKind KindOf(const std::string& op) {
  if (op == "all_gather") return comm::CollectiveKind::kAllGather;
  if (op == "reduce_scatter") return comm::CollectiveKind::kReduceScatter;
  if (op == "all_reduce") return comm::CollectiveKind::kAllReduce;
  Die("--ops: unknown collective '" + op + "' (all_gather, reduce_scatter, all_reduce)");
}

// A sim tensor of `numel` f32 elements (a virtual address; nothing behind it).
Tensor SimTensor(SimDevice* d, int64_t numel) {
  void* p = OrDie(d->RawAllocate(static_cast<size_t>(numel) * 4), "sim allocation");
  return OrDie(Tensor::Wrap(p, DType::kF32, Shape({numel}), d->id()), "sim tensor");
}

int Main() {
  SimProfile profile = OrDie(LoadProfile(FLAGS_profile), "profile");
  comm::NetworkProfile network = OrDie(ParseNetworkProfile(profile.network), "profile " + profile.name);
  network.name = profile.name;
  SimDevice* device = OrDie(SimDevice::Get(0), "sim device");
  SimDeviceSpec spec;  // no launch overhead: the collective's own time
  spec.name = profile.name;
  if (Status s = device->Configure(spec); !s.ok()) Die("sim device: " + s.ToString());
  std::unique_ptr<Stream> stream = OrDie(device->CreateStream("comm"), "sim stream");

  std::printf("# SIMULATED collectives (virtual time, no data moved): profile %s, %d GPUs per node,\n",
              profile.name.c_str(), network.gpus_per_node);
  std::printf("# NVLink %.0f GB/s per GPU, %d x %.0f GB/s NICs per node; algorithm as NCCL's tuner would "
              "choose per the topology model\n",
              network.intra_node_gbps(), network.nics_per_node, network.nic_gbps * network.nic_efficiency);
  std::printf("%6s %6s %-15s %14s %12s %12s %12s  %s\n", "ranks", "nodes", "op", "bytes", "time_us",
              "algbw_GB/s", "busbw_GB/s", "algorithm");
  for (const std::string& r : cli::SplitList(FLAGS_ranks)) {
    const int ranks = static_cast<int>(ParseInt(r, "ranks", SimProcessGroup::kMaxWorldSize));
    std::unique_ptr<SimProcessGroup> world =
        OrDie(SimProcessGroup::Create(network, ranks), "sim process group");
    for (const std::string& op : cli::SplitList(FLAGS_ops)) {
      const comm::CollectiveKind kind = KindOf(op);
      for (const std::string& size : cli::SplitList(FLAGS_sizes)) {
        const int64_t shard = ParseInt(size, "sizes") / 4 / ranks;
        if (shard < 1) continue;
        device->ResetClocks();
        world->links().Clear();
        Tensor big = SimTensor(device, shard * ranks);
        Tensor small = SimTensor(device, shard);
        StatusOr<std::shared_ptr<comm::Work>> work = InternalError("unreachable");
        switch (kind) {
          case comm::CollectiveKind::kAllGather:
            work = world->all_gather(big, small, *stream);
            break;
          case comm::CollectiveKind::kReduceScatter:
            work = world->reduce_scatter(small, big, *stream);
            break;
          default:
            work = world->all_reduce(big, *stream);
        }
        std::shared_ptr<comm::Work> w = OrDie(std::move(work), op);
        const double seconds = static_cast<const SimEvent&>(w->event()).time_s();
        const size_t bytes = big.nbytes();
        const comm::CollectivePlan plan = OrDie(world->Plan(kind, bytes), "plan");
        const double algbw = bytes / seconds / 1e9;
        std::printf("%6d %6d %-15s %14zu %12.1f %12.2f %12.2f  %s/%s\n", ranks, world->placement().nodes,
                    op.c_str(), bytes, seconds * 1e6, algbw, algbw * comm::BusBandwidthFactor(kind, ranks),
                    comm::LinkAlgorithmName(plan.algorithm), comm::LinkProtocolName(plan.protocol));
        device->RawFree(big.data(), big.nbytes());
        device->RawFree(small.data(), small.nbytes());
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace sk::sim

int main(int argc, char** argv) {
  sk::cli::ParseFlags(
      "simulated collective bandwidth, nccl-tests style: sim_collectives [--profile=h100-80g --ranks=16]",
      __FILE__, &argc, &argv);
  return sk::sim::Main();
}
