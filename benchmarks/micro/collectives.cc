// Collective bandwidth in the style of nccl-tests, next to memcpy and
// loopback-TCP bandwidth measured in the same run.
//
//   ./bazelw run -c opt //benchmarks:collectives
//   ./bazelw run -c opt //benchmarks:collectives -- --benchmark_format=json
//
// For each backend (local, gloo) x rank count x op x size: every rank's
// collective is issued on its own stream, then all are waited for; the time
// of one iteration is from the first issue to the last completion. After
// --warmup iterations, --iters are timed; the table shows the median time and
// the spread (min..max) of algbw. Bytes, algbw and busbw as
// docs/benchmarks.md ("How we measure") and nccl-tests define them:
// bytes = all_gather output, reduce_scatter input, all_reduce buffer; busbw = algbw x (N-1)/N for
// all_gather and reduce_scatter, x 2(N-1)/N for all_reduce.
//
// all_gather runs in place (each rank's input is its chunk of the output:
// FSDP's flat parameter), so a rank copies the (N-1)/N of the output it does
// not hold, which is what busbw counts.
//
// "vs copy": busbw against memcpy measured right after each row with N
// threads at once, each copying the bytes busbw counts for one rank (so load
// that changes during the run affects both alike); 100% = as fast as plain
// concurrent copies. Only where a rank moves at least 8 MiB. Reference lines: memcpy of --memcpy_bytes with 1 thread and with N
// threads (each its own buffers, aggregate bandwidth, counting bytes copied),
// and one loopback TCP connection (what gloo's transport can carry per pair).
// With --network_model=ring:latency_us=5,bandwidth_gbps=12.5 every group is
// wrapped in the alpha-beta model and every line says so.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>
#include <nlohmann/json.hpp>

#include "benchmarks/util/die.h"
#include "benchmarks/util/inject.h"
#include "benchmarks/util/stats.h"
#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/network_model.h"
#include "runtime/comm/store.h"
#include "runtime/core/allocator.h"
#include "runtime/device/device.h"
#include "tools/cli_flags.h"

DEFINE_string(backends, "local,gloo", "comma-separated: local, gloo");
DEFINE_string(ranks, "2,4", "comma-separated rank counts");
DEFINE_string(ops, "all_gather,reduce_scatter,all_reduce", "comma-separated collectives");
DEFINE_string(sizes, "65536,1048576,16777216,67108864", "comma-separated sizes in bytes (nccl-tests' count)");
DEFINE_string(dtype, "f32", "f32, bf16 or f16");
DEFINE_int32(warmup, 2, "untimed iterations per size");
DEFINE_int32(iters, 5, "timed iterations per size");
DEFINE_int64(memcpy_bytes, 64 << 20,
             "bytes per thread for the memcpy reference (2 x ranks x this at most 2 GiB)");
DEFINE_string(network_model, "", "wrap every group in an alpha-beta link model, e.g. ring:latency_us=5,bandwidth_gbps=12.5");
DEFINE_string(benchmark_format, "console", "console or json");

namespace sk::comm {
namespace {

using bench::Median;

using Clock = std::chrono::steady_clock;
using nlohmann::json;

using bench::Die;
using bench::OrDie;

// Limits on the flags, checked before anything is measured: each rank is a
// thread with its own buffers, and the memcpy reference gives each of N
// threads a source and a destination of --memcpy_bytes.
constexpr uint64_t kMaxRanks = 256;
constexpr uint64_t kMaxSizeBytes = uint64_t{1} << 40;
constexpr int kMaxIterations = 1 << 20;
constexpr uint64_t kMaxMemcpyReferenceBytes = uint64_t{2} << 30;  // all threads' buffers together

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// GB/s (10^9 bytes per second) of memcpy with `threads` threads, each
// copying its own `bytes`-byte buffer, aggregated over the threads; median
// of `reps` after a warm-up copy.
double MemcpyGBps(int threads, size_t bytes, int reps = 5) {
  if (bytes == 0) return 0.0;
  std::vector<std::vector<char>> src(threads, std::vector<char>(bytes, 1));
  std::vector<std::vector<char>> dst(threads, std::vector<char>(bytes, 0));
  std::vector<double> samples;
  for (int it = 0; it <= reps; ++it) {
    auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] { std::memcpy(dst[t].data(), src[t].data(), bytes); });
    }
    for (auto& t : ts) t.join();
    if (it > 0) samples.push_back(threads * static_cast<double>(bytes) / Seconds(Clock::now() - t0) / 1e9);
  }
  return Median(samples);
}

// GB/s through one loopback TCP connection (the path a gloo pair uses).
double LoopbackTcpGBps(size_t bytes) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("loopback listener");
  }
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("loopback connect");
  int server = ::accept(listener, nullptr, nullptr);
  constexpr int kRounds = 4;
  std::vector<char> buf(bytes, 7), sink(1 << 20);
  auto t0 = Clock::now();
  std::thread reader([&] {
    size_t left = bytes * kRounds;
    while (left > 0) {
      ssize_t k = ::recv(server, sink.data(), std::min(sink.size(), left), 0);
      if (k <= 0) break;
      left -= static_cast<size_t>(k);
    }
  });
  for (int r = 0; r < kRounds; ++r) {
    size_t sent = 0;
    while (sent < bytes) {
      ssize_t k = ::send(client, buf.data() + sent, bytes - sent, 0);
      if (k <= 0) Die("loopback send");
      sent += static_cast<size_t>(k);
    }
  }
  reader.join();
  double gbps = kRounds * static_cast<double>(bytes) / Seconds(Clock::now() - t0) / 1e9;
  ::close(client);
  ::close(server);
  ::close(listener);
  return gbps;
}

struct Ranks {
  std::unique_ptr<TcpStore> server;  // gloo only
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  std::vector<std::unique_ptr<Stream>> streams;
  ~Ranks() {
    // gloo groups barrier with each other on destruction: in parallel.
    std::vector<std::thread> ts;
    for (auto& g : groups) ts.emplace_back([&g] { g.reset(); });
    for (auto& t : ts) t.join();
  }
};

std::unique_ptr<Ranks> MakeRanks(const std::string& backend, int n) {
  auto ranks = std::make_unique<Ranks>();
  ranks->groups.resize(n);
  if (backend == "local") {
    ranks->groups = OrDie(LocalProcessGroup::Create(n), "local group");
  } else if (backend == "gloo") {
    ranks->server = OrDie(TcpStore::Create("127.0.0.1", 0, true, std::chrono::seconds(30)), "store");
    const int port = ranks->server->port();
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        auto client = OrDie(TcpStore::Create("127.0.0.1", port, false, std::chrono::seconds(30)), "store client");
        ranks->groups[r] = OrDie(GlooProcessGroup::Create(std::shared_ptr<Store>(std::move(client)),
                                                          "bench", r, n),
                                 "gloo group");
      });
    }
    for (auto& t : ts) t.join();
  } else {
    Die("unknown backend '" + backend + "'");
  }
  if (!FLAGS_network_model.empty()) {
    LinkModel model = OrDie(LinkModel::Parse(FLAGS_network_model), "--network_model");
    for (auto& g : ranks->groups) {
      g = OrDie(NetworkModelProcessGroup::Wrap(std::move(g), model), "network model");
    }
  }
  for (int r = 0; r < n; ++r) {
    Device* device = OrDie(Device::Get(DeviceId::Cpu(r)), "device");
    ranks->streams.push_back(OrDie(device->CreateStream("comm"), "stream"));
  }
  return ranks;
}

struct Row {
  std::string backend, label, op;
  int ranks;
  size_t bytes;
  double median_s, min_s, max_s;
  double algbw, busbw, algbw_min, algbw_max;
  // busbw against memcpy measured right after the row: N threads at once,
  // each copying the bytes busbw counts for one rank. 100% means the
  // collective moved its data as fast as plain concurrent copies did.
  double memcpy_ratio;
};

Row Measure(Ranks& ranks, const std::string& backend, const std::string& op, size_t bytes, DType dtype) {
  const int n = static_cast<int>(ranks.groups.size());
  const size_t esize = DTypeSize(dtype);
  const int64_t total = static_cast<int64_t>(bytes / esize / n * n);  // divisible by n
  const int64_t chunk = total / n;
  std::vector<Tensor> big(n), small(n);
  for (int r = 0; r < n; ++r) {
    HostAllocator alloc(DeviceId::Cpu(r));
    big[r] = OrDie(alloc.Zeros(dtype, Shape({total})), "buffer");
    small[r] = OrDie(alloc.Zeros(dtype, Shape({chunk})), "buffer");
  }
  auto issue = [&](int r) -> std::shared_ptr<Work> {
    ProcessGroup& pg = *ranks.groups[r];
    Stream& s = *ranks.streams[r];
    if (op == "all_gather") {
      Tensor mine = OrDie(big[r].View(r * chunk * esize, dtype, Shape({chunk})), "view");
      return OrDie(pg.all_gather(big[r], mine, s), op);
    }
    if (op == "reduce_scatter") return OrDie(pg.reduce_scatter(small[r], big[r], s), op);
    if (op == "all_reduce") return OrDie(pg.all_reduce(big[r], s), op);
    Die("unknown op '" + op + "'");
  };
  // SK_BENCH_INJECT=collectives:N (track.py --self_test): each iteration issues
  // the collective N times, one after another.
  const int repeats = sk::bench::InjectedRepeats("collectives");
  std::vector<double> times;
  for (int it = 0; it < FLAGS_warmup + FLAGS_iters; ++it) {
    auto t0 = Clock::now();
    for (int rep = 0; rep < repeats; ++rep) {
      std::vector<std::shared_ptr<Work>> works;
      for (int r = 0; r < n; ++r) works.push_back(issue(r));
      for (auto& w : works) {
        Status s = w->wait(std::chrono::minutes(5));
        if (!s.ok()) Die(s.ToString());
      }
    }
    if (it >= FLAGS_warmup) times.push_back(Seconds(Clock::now() - t0));
  }
  Row row;
  row.backend = backend;
  row.label = ranks.groups[0]->label();
  row.op = op;
  row.ranks = n;
  row.bytes = static_cast<size_t>(total) * esize;
  row.median_s = Median(times);
  row.min_s = *std::min_element(times.begin(), times.end());
  row.max_s = *std::max_element(times.begin(), times.end());
  const double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : (n - 1.0) / n;
  row.algbw = row.bytes / row.median_s / 1e9;
  row.busbw = row.algbw * factor;
  row.algbw_min = row.bytes / row.max_s / 1e9;
  row.algbw_max = row.bytes / row.min_s / 1e9;
  // Below kMinCopyReference per thread, starting the copy threads costs more
  // than the copy: no reference (0, printed as "-").
  constexpr size_t kMinCopyReference = 8 << 20;
  const size_t per_rank = static_cast<size_t>(static_cast<double>(row.bytes) * factor);
  row.memcpy_ratio = 0.0;
  if (per_rank >= kMinCopyReference) {
    const double per_thread_gbps = MemcpyGBps(n, per_rank, 3) / n;
    if (per_thread_gbps > 0) row.memcpy_ratio = row.busbw / per_thread_gbps;
  }
  return row;
}

int Main() {
  const DType dtype = OrDie(ParseDType(FLAGS_dtype), "--dtype");
  if (FLAGS_benchmark_format != "console" && FLAGS_benchmark_format != "json") {
    Die("--benchmark_format must be console or json");
  }
  if (FLAGS_iters < 1 || FLAGS_iters > kMaxIterations || FLAGS_warmup < 0 || FLAGS_warmup > kMaxIterations) {
    Die("--iters must be in [1, " + std::to_string(kMaxIterations) + "] and --warmup in [0, " +
        std::to_string(kMaxIterations) + "]");
  }
  std::vector<int> rank_counts;
  for (const std::string& r : cli::SplitList(FLAGS_ranks)) {
    uint64_t n = 0;
    if (!cli::ParseCount(r, 1, kMaxRanks, &n)) {
      Die("--ranks: '" + r + "' is not a rank count in [1, " + std::to_string(kMaxRanks) + "]");
    }
    rank_counts.push_back(static_cast<int>(n));
  }
  if (rank_counts.empty()) Die("--ranks: no rank counts given");
  std::vector<size_t> sizes;
  for (const std::string& s : cli::SplitList(FLAGS_sizes)) {
    uint64_t n = 0;
    if (!cli::ParseCount(s, 0, kMaxSizeBytes, &n)) {
      Die("--sizes: '" + s + "' is not a byte count in [0, " + std::to_string(kMaxSizeBytes) + "] (digits only)");
    }
    sizes.push_back(static_cast<size_t>(n));
  }
  for (const std::string& b : cli::SplitList(FLAGS_backends)) {
    if (b != "local" && b != "gloo") Die("--backends: unknown backend '" + b + "' (local, gloo)");
  }
  for (const std::string& op : cli::SplitList(FLAGS_ops)) {
    if (op != "all_gather" && op != "reduce_scatter" && op != "all_reduce") {
      Die("--ops: unknown collective '" + op + "' (all_gather, reduce_scatter, all_reduce)");
    }
  }
  if (!FLAGS_network_model.empty()) (void)OrDie(LinkModel::Parse(FLAGS_network_model), "--network_model");
  const int max_ranks = *std::max_element(rank_counts.begin(), rank_counts.end());
  if (FLAGS_memcpy_bytes < 0 ||
      2 * static_cast<uint64_t>(max_ranks) * static_cast<uint64_t>(FLAGS_memcpy_bytes) > kMaxMemcpyReferenceBytes) {
    Die("--memcpy_bytes=" + std::to_string(FLAGS_memcpy_bytes) + " must be >= 0 and at most " +
        std::to_string(kMaxMemcpyReferenceBytes / 2 / max_ranks) + " with --ranks up to " +
        std::to_string(max_ranks) + " (the reference copies give every rank's thread a source and a "
        "destination of that size: " + std::to_string(kMaxMemcpyReferenceBytes >> 20) + " MiB in all at most)");
  }
  const bool console = FLAGS_benchmark_format == "console";

  json context;
  context["dtype"] = std::string(DTypeName(dtype));
  context["iters"] = FLAGS_iters;
  context["warmup"] = FLAGS_warmup;
  context["hardware_concurrency"] = std::thread::hardware_concurrency();
  context["network_model"] = FLAGS_network_model;
  const size_t mbytes = static_cast<size_t>(FLAGS_memcpy_bytes);
  context["memcpy_bytes"] = mbytes;
  context["memcpy_1_thread_GBps"] = MemcpyGBps(1, mbytes);
  for (int n : rank_counts) {
    context["memcpy_" + std::to_string(n) + "_threads_GBps"] = MemcpyGBps(n, mbytes);
  }
  context["tcp_loopback_1_connection_GBps"] = LoopbackTcpGBps(mbytes);
  if (console) {
    std::printf("# memcpy %zu bytes: 1 thread %.2f GB/s", mbytes,
                context["memcpy_1_thread_GBps"].get<double>());
    for (int n : rank_counts) {
      std::printf(", %d threads %.2f GB/s (aggregate)", n,
                  context["memcpy_" + std::to_string(n) + "_threads_GBps"].get<double>());
    }
    std::printf("\n# loopback TCP, 1 connection: %.2f GB/s\n",
                context["tcp_loopback_1_connection_GBps"].get<double>());
    std::printf("# dtype %s, %d warm-up + %d timed iterations, median time; all_gather in place; "
                "%u hardware threads\n",
                std::string(DTypeName(dtype)).c_str(), FLAGS_warmup, FLAGS_iters,
                std::thread::hardware_concurrency());
  }
  json rows = json::array();
  for (const std::string& backend : cli::SplitList(FLAGS_backends)) {
    for (int n : rank_counts) {
      std::unique_ptr<Ranks> ranks = MakeRanks(backend, n);
      if (console) {
        std::printf("\n# %s, %d ranks\n", ranks->groups[0]->label().c_str(), n);
        std::printf("%-15s %12s %12s %10s %10s %19s %9s\n", "op", "bytes", "time(us)", "algbw",
                    "busbw", "algbw min..max", "vs copy");
        std::printf("%-15s %12s %12s %10s %10s %19s %9s\n", "", "", "", "(GB/s)", "(GB/s)",
                    "(GB/s)", "");
      }
      for (const std::string& op : cli::SplitList(FLAGS_ops)) {
        for (size_t bytes : sizes) {
          Row r = Measure(*ranks, backend, op, bytes, dtype);
          if (console) {
            std::string vs_copy = "-";
            if (r.memcpy_ratio > 0) vs_copy = std::to_string(static_cast<int>(100 * r.memcpy_ratio + 0.5)) + "%";
            std::printf("%-15s %12zu %12.1f %10.2f %10.2f %8.2f..%-8.2f %9s\n", op.c_str(),
                        r.bytes, r.median_s * 1e6, r.algbw, r.busbw, r.algbw_min, r.algbw_max,
                        vs_copy.c_str());
            std::fflush(stdout);
          }
          rows.push_back({{"name", backend + "/" + op + "/ranks:" + std::to_string(n) +
                                       "/bytes:" + std::to_string(r.bytes)},
                          {"backend", backend},
                          {"label", r.label},
                          {"op", op},
                          {"ranks", n},
                          {"bytes", r.bytes},
                          {"time_us_median", r.median_s * 1e6},
                          {"time_us_min", r.min_s * 1e6},
                          {"time_us_max", r.max_s * 1e6},
                          {"algbw_GBps", r.algbw},
                          {"busbw_GBps", r.busbw},
                          {"busbw_vs_concurrent_memcpy", r.memcpy_ratio}});
        }
      }
    }
  }
  if (!console) {
    json out;
    out["context"] = context;
    out["benchmarks"] = rows;
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace sk::comm

int main(int argc, char** argv) {
  sk::cli::ParseFlags("collective bandwidth, nccl-tests style (see benchmarks/micro/collectives.cc)", __FILE__, &argc, &argv);
  return sk::comm::Main();
}
