// nccl_train_check: FSDP and DDP over NCCL process groups, one process per
// rank, checked against the same training over gloo on the CPU in the same
// processes. Run under the launcher (several ranks may share one GPU):
//
//   launch --nproc_per_node=4 --share_gpu=0 --master_port=0
//       nccl_train_check [--cases=all|NAME,...] [--steps=5]
//   launch --nproc_per_node=4 ... nccl_train_check --save=DIR     # train 3 steps, save
//   launch --nproc_per_node=2 ... nccl_train_check --resume=DIR   # resume at another world
//   launch --nproc_per_node=4 --on_failure=wait ... nccl_train_check --train_forever
//       --timeout_ms=20000 --pid_dir=DIR                          # for kill -9 of a rank
//
// Each rank builds one TcpStore (rank 0 serves it on MASTER_PORT) and two
// world groups over it: nccl on its GPU (SK_CUDA_DEVICE / LOCAL_RANK)
// and gloo on cpu:rank. Every case trains a Trainer on each and compares the
// global losses and the final parameters with the bounds of
// //tests/cuda:fsdp_equivalence_cuda_test (f32: losses 1e-4 relative,
// parameters 1e-5 + 1e-4 relative per element; bf16: losses 2%, each
// parameter's update as a vector within 25%). Prints one line per case
// ("case NAME: PASS ..." / "FAIL ...") and exits 1 if any failed; rank 0
// ends with "nccl_train_check: N passed, M failed".
//
// Without --config=cuda it prints that it was skipped and exits 0.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/store.h"
#include "runtime/ops/ops.h"
#include "runtime/train/trainer.h"
#ifdef SHARDKIT_WITH_CUDA
#include <cuda_runtime.h>

#include <thread>

#include "runtime/comm/nccl_backend.h"
#include "runtime/train/engine.h"
#include "tests/util/vector_units.h"
#endif

namespace sk {
namespace {

using Clock = std::chrono::steady_clock;

#ifdef SHARDKIT_WITH_CUDA  // the checks below need a GPU build
struct Case {
  std::string name;
  std::string model = "gpt-tiny";
  bool ddp = false;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int shard_group = 0;  // hybrid only
  bool bf16 = false;
  bool offload = false;
  int accum = 1;
  int min_world = 1;  // hybrid needs 4
  bool momentum = false;  // SGD with momentum 0.9 (state in checkpoints)
};

std::vector<Case> AllCases() {
  std::vector<Case> v;
  for (const char* model : {"gpt-tiny", "t5-tiny"}) {
    const std::string m = model;
    for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                               ShardingStrategy::kShardOptim, ShardingStrategy::kNoShard}) {
      Case c;
      c.model = m;
      c.strategy = s;
      c.name = m + "_" + ShardingStrategyName(s);
      v.push_back(c);
    }
    Case ddp;
    ddp.model = m;
    ddp.ddp = true;
    ddp.name = m + "_DDP";
    v.push_back(ddp);
    for (ShardingStrategy s : {ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardGradOp}) {
      Case h;
      h.model = m;
      h.strategy = s;
      h.shard_group = 2;
      h.min_world = 4;
      h.name = m + "_" + ShardingStrategyName(s) + "_2x2";
      v.push_back(h);
    }
  }
  Case bf16;
  bf16.bf16 = true;
  bf16.name = "gpt-tiny_FULL_SHARD_bf16";
  v.push_back(bf16);
  Case bf16z2 = bf16;
  bf16z2.strategy = ShardingStrategy::kShardGradOp;
  bf16z2.name = "gpt-tiny_SHARD_GRAD_OP_bf16";
  v.push_back(bf16z2);
  Case bf16ddp = bf16;
  bf16ddp.ddp = true;
  bf16ddp.name = "gpt-tiny_DDP_bf16";
  v.push_back(bf16ddp);
  Case bf16hy = bf16;
  bf16hy.strategy = ShardingStrategy::kHybridShard;
  bf16hy.shard_group = 2;
  bf16hy.min_world = 4;
  bf16hy.name = "gpt-tiny_HYBRID_SHARD_2x2_bf16";
  v.push_back(bf16hy);
  Case off;
  off.offload = true;
  off.name = "gpt-tiny_FULL_SHARD_offload";
  v.push_back(off);
  Case off16 = off;
  off16.bf16 = true;
  off16.name = "gpt-tiny_FULL_SHARD_offload_bf16";
  v.push_back(off16);
  Case acc;
  acc.accum = 2;
  acc.name = "gpt-tiny_FULL_SHARD_accum2";
  v.push_back(acc);
  Case accddp = acc;
  accddp.ddp = true;
  accddp.name = "gpt-tiny_DDP_accum2";
  v.push_back(accddp);
  return v;
}

TrainerOptions OptionsFor(const Case& c, DeviceKind kind, Duration timeout) {
  TrainerOptions o;
  o.model = c.model;
  o.batch_size = 2;
  o.grad_accum_steps = c.accum;
  o.data_tokens = 256;
  o.parallelism = c.ddp ? Parallelism::kDdp : Parallelism::kFsdp;
  o.fsdp.strategy = c.strategy;
  o.fsdp.shard_group_size = c.shard_group;
  o.fsdp.seed = 1234;
  o.fsdp.timeout = timeout;
  o.fsdp.cpu_offload = c.offload;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.lr = 0.1f;
  if (c.momentum) o.optimizer.momentum = 0.9f;
  if (c.bf16) {
    o.fsdp.mixed_precision.param_dtype = DType::kBF16;
    o.fsdp.mixed_precision.reduce_dtype = DType::kF32;
  }
  o.device.kind = kind;  // cuda: the nccl group's GPU; cpu: cpu:rank
  return o;
}

// Every parameter in full, as f32 on the host ([unit][param]).
using Params = std::vector<std::vector<std::vector<float>>>;

StatusOr<std::vector<float>> ToHost(Trainer& t, const Tensor& value) {
  std::vector<float> out(value.numel());
  if (value.numel() == 0) return out;
  SK_ASSIGN_OR_RETURN(Tensor host, HostAllocator::Default().Empty(DType::kF32, Shape{value.numel()}));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, t.device().CreateStream("check readback"));
  StreamAllocator alloc(&t.allocator(), stream.get());
  ops::OpContext ctx{&t.device(), stream.get(), &alloc};
  SK_ASSIGN_OR_RETURN(Tensor src, value.View(0, DType::kF32, Shape{value.numel()}));
  SK_RETURN_IF_ERROR(ops::Copy(ctx, src, host));
  SK_RETURN_IF_ERROR(stream->Synchronize(Duration(60'000)));
  const float* p = host.data_as<float>();
  out.assign(p, p + value.numel());
  return out;
}

StatusOr<Params> ReadParams(Trainer& t) {
  Params params;
  const auto& units = t.model().units();
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    params.emplace_back();
    for (int p = 0; p < static_cast<int>(units[u].params.size()); ++p) {
      Tensor value;
      if (t.fsdp() != nullptr) {
        SK_ASSIGN_OR_RETURN(value, t.fsdp()->GatherFullParam(u, p));  // collective; host memory
      } else {
        // Written asynchronously on DDP's streams (its initialisation too).
        SK_RETURN_IF_ERROR(t.ddp()->Synchronize(Duration(60'000)));
        value = t.ddp()->param(u, p);
      }
      SK_ASSIGN_OR_RETURN(std::vector<float> host, ToHost(t, value));
      params.back().push_back(std::move(host));
    }
  }
  return params;
}

struct Run {
  std::vector<float> losses;
  Params initial, final;
};

StatusOr<Run> Train(const Case& c, DeviceKind kind, comm::ProcessGroup* world, int steps, Duration timeout) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(OptionsFor(c, kind, timeout), world));
  Run run;
  if (c.bf16) {
    SK_ASSIGN_OR_RETURN(run.initial, ReadParams(*t));
  }
  for (int s = 0; s < steps; ++s) {
    SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
    run.losses.push_back(m.global_loss);
  }
  SK_ASSIGN_OR_RETURN(run.final, ReadParams(*t));
  return run;
}

// "" when `gpu` matches `cpu` within the bounds described at the top.
std::string Compare(const Case& c, const Run& cpu, const Run& gpu, double* worst_out) {
  char buf[512];
  const double loss_rel = c.bf16 ? 2e-2 : 1e-4;
  if (gpu.losses.size() != cpu.losses.size()) return "different step counts";
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    const float want = cpu.losses[s], got = gpu.losses[s];
    if (!std::isfinite(got) || std::fabs(got - want) > loss_rel * std::fabs(want)) {
      std::snprintf(buf, sizeof buf, "loss at step %zu: nccl %.9g, gloo %.9g", s + 1, got, want);
      return buf;
    }
  }
  double worst = 0;
  if (gpu.final.size() != cpu.final.size()) return "different unit counts";
  for (size_t u = 0; u < cpu.final.size(); ++u) {
    if (gpu.final[u].size() != cpu.final[u].size()) return "different parameter counts";
    for (size_t p = 0; p < cpu.final[u].size(); ++p) {
      const std::vector<float>& want = cpu.final[u][p];
      const std::vector<float>& got = gpu.final[u][p];
      if (got.size() != want.size()) return "different parameter sizes";
      if (!c.bf16) {
        for (size_t i = 0; i < want.size(); ++i) {
          const double d = std::fabs(double(got[i]) - want[i]);
          worst = std::max(worst, d);
          if (!(d <= 1e-5 + 1e-4 * std::fabs(want[i]))) {
            std::snprintf(buf, sizeof buf, "unit %zu param %zu [%zu]: nccl %.9g, gloo %.9g", u, p, i, got[i],
                          want[i]);
            return buf;
          }
        }
        continue;
      }
      double diff = 0, norm = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) return "non-finite parameter";
        const double d_cpu = double(want[i]) - cpu.initial[u][p][i];
        const double d_gpu = double(got[i]) - gpu.initial[u][p][i];
        diff += (d_gpu - d_cpu) * (d_gpu - d_cpu);
        norm += d_cpu * d_cpu;
      }
      if (norm > 0) worst = std::max(worst, std::sqrt(diff / norm));
      if (std::sqrt(diff) > 0.25 * std::sqrt(norm) + 1e-7) {
        std::snprintf(buf, sizeof buf, "unit %zu param %zu: update differs by %.4g of its norm", u, p,
                      std::sqrt(diff / std::max(norm, 1e-30)));
        return buf;
      }
    }
  }
  *worst_out = worst;
  return "";
}

// The low-level engine over the group, driven the way a framework drives it:
// three units of one parameter, the caller's "kernels" copy the gathered
// parameter into a buffer of its own in forward and that buffer into the
// gradient in backward (on a CUDA stream of the caller's, made late on
// purpose, with the engine's stream-ordered hooks; on the CPU with memcpy).
// Two SGD steps; this rank's parameters after them.
constexpr int kEngineUnits = 3;
constexpr int64_t kEngineWidth = 1 << 14;


void CUDART_CB LateOnStream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); }

StatusOr<std::vector<std::vector<float>>> TrainEngine(comm::ProcessGroup* world, bool gpu, Duration timeout) {
  FsdpEngineOptions options;
  options.device.kind = gpu ? DeviceKind::kCuda : DeviceKind::kCpu;
  options.fsdp.timeout = timeout;
  options.optimizer.kind = OptimizerKind::kSgd;
  options.optimizer.lr = 0.25f;
  cudaStream_t native = nullptr;
  const size_t bytes = kEngineWidth * sizeof(float);
  std::vector<void*> saved(kEngineUnits, nullptr);
  if (gpu) {
    if (cudaStreamCreateWithFlags(&native, cudaStreamNonBlocking) != cudaSuccess) {
      return InternalError("cudaStreamCreate failed");
    }
    SK_ASSIGN_OR_RETURN(Device * dev, Device::Get(*world->bound_device()));
    SK_ASSIGN_OR_RETURN(options.stream, dev->WrapNativeStream(native, "caller"));
    for (void*& p : saved) {
      if (cudaMalloc(&p, bytes) != cudaSuccess) return InternalError("cudaMalloc failed");
    }
  } else {
    for (void*& p : saved) p = std::malloc(bytes);
  }
  auto copy = [&](void* dst, const void* src) -> Status {
    if (!gpu) {
      std::memcpy(dst, src, bytes);
      return OkStatus();
    }
    if (cudaLaunchHostFunc(native, LateOnStream, nullptr) != cudaSuccess ||
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, native) != cudaSuccess) {
      return InternalError("enqueueing the caller's copy failed");
    }
    return OkStatus();
  };
  std::vector<std::vector<float>> params(kEngineUnits, std::vector<float>(kEngineWidth));
  Status s;
  {
    auto engine = FsdpEngine::Create(VectorUnits(kEngineUnits, kEngineWidth), world, options);
    s = engine.status();
    for (int step = 0; s.ok() && step < 2; ++step) {
      s = (*engine)->ZeroGrad();
      for (int u = 0; s.ok() && u < kEngineUnits; ++u) {
        s = (*engine)->PreForward(u);
        StatusOr<const Tensor*> w = s.ok() ? (*engine)->Param(u, 0) : StatusOr<const Tensor*>(s);
        s = w.status();
        if (s.ok()) s = copy(saved[u], (*w)->data());
        if (s.ok()) s = (*engine)->PostForward(u);
      }
      for (int u = kEngineUnits - 1; s.ok() && u >= 0; --u) {
        s = (*engine)->PreBackward(u);
        StatusOr<const Tensor*> g = s.ok() ? (*engine)->Grad(u, 0) : StatusOr<const Tensor*>(s);
        s = g.status();
        if (s.ok()) s = copy((*g)->data(), saved[u]);
        if (s.ok()) s = (*engine)->PostBackward(u);
      }
      if (s.ok()) s = (*engine)->FinishBackward();
      if (s.ok()) s = (*engine)->OptimizerStep();
    }
    for (int u = 0; s.ok() && u < kEngineUnits; ++u) s = (*engine)->ReadParam(u, 0, params[u].data(), kEngineWidth);
  }
  if (gpu) {
    cudaStreamSynchronize(native);
    for (void* p : saved) cudaFree(p);
    cudaStreamDestroy(native);
  } else {
    for (void* p : saved) std::free(p);
  }
  SK_RETURN_IF_ERROR(s);
  return params;
}

#endif  // SHARDKIT_WITH_CUDA

struct Flags {
  std::string cases = "all";
  int steps = 5;
  std::string save, resume, pid_dir;
  bool train_forever = false;
  bool bench = false;
  int64_t timeout_ms = 120'000;
};

#ifdef SHARDKIT_WITH_CUDA
// The call check's cost (a store round trip per peer and call) and NCCL's
// bus bandwidth on this machine, as a sanity check only: ranks sharing one
// GPU through the socket transport measure neither NVLink nor a NIC.
int Bench(std::shared_ptr<comm::Store> store, int rank, int world, int device, Duration timeout) {
  auto dev = Device::Get(DeviceId::Cuda(device));
  if (!dev.ok()) return 1;
  auto stream = (*dev)->CreateStream("bench");
  if (!stream.ok()) return 1;
  double per_call_us[2] = {0, 0};
  for (int checked = 0; checked < 2; ++checked) {
    comm::NcclOptions no;
    no.timeout = timeout;
    no.check_calls = checked == 1;
    auto g = comm::NcclProcessGroup::Create(store, checked ? "bench_checked" : "bench_unchecked", rank, world,
                                            device, no);
    if (!g.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, g.status().ToString().c_str());
      return 1;
    }
    void* p = nullptr;
    auto raw = (*dev)->RawAllocate(64 << 20);
    if (!raw.ok()) return 1;
    p = *raw;
    Tensor small(Storage::Wrap(p, 64 << 20, DeviceId::Cuda(device)), DType::kF32, Shape{256});
    Tensor big(Storage::Wrap(p, 64 << 20, DeviceId::Cuda(device)), DType::kF32, Shape{16 << 20});
    std::vector<double> times;
    for (int rep = 0; rep < 5; ++rep) {
      const int calls = 200;
      const auto start = Clock::now();
      for (int i = 0; i < calls; ++i) {
        auto w = (*g)->all_reduce(small, **stream);
        if (!w.ok() || !(*w)->wait(timeout).ok()) return 1;
      }
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls);
    }
    std::sort(times.begin(), times.end());
    per_call_us[checked] = times[times.size() / 2];
    if (checked == 0) {
      std::vector<double> secs;
      for (int rep = 0; rep < 5; ++rep) {
        const auto start = Clock::now();
        auto w = (*g)->all_reduce(big, **stream);
        if (!w.ok() || !(*w)->wait(timeout).ok()) return 1;
        secs.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      std::sort(secs.begin(), secs.end());
      const double bytes = 64.0 * (1 << 20);
      const double busbw = bytes / secs[secs.size() / 2] * 2.0 * (world - 1) / world / 1e9;
      if (rank == 0) {
        std::printf("bench: all_reduce 64 MiB f32 at world %d on one GPU: median %.2f ms, bus bandwidth %.2f GB/s "
                    "(sanity only: ranks share one GPU over sockets)\n",
                    world, secs[secs.size() / 2] * 1e3, busbw);
      }
    }
    (*dev)->RawFree(p, 64 << 20);
  }
  if (rank == 0) {
    std::printf("bench: all_reduce of 1 KiB, host-waited, median per call at world %d: %.1f us unchecked, "
                "%.1f us with the call check (+%.1f us per call)\n",
                world, per_call_us[0], per_call_us[1], per_call_us[1] - per_call_us[0]);
  }
  std::fflush(stdout);
  return 0;
}
#endif

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("cases")) {
      f.cases = v;
    } else if (const char* v = value("steps")) {
      f.steps = std::atoi(v);
    } else if (const char* v = value("save")) {
      f.save = v;
    } else if (const char* v = value("resume")) {
      f.resume = v;
    } else if (const char* v = value("pid_dir")) {
      f.pid_dir = v;
    } else if (const char* v = value("timeout_ms")) {
      f.timeout_ms = std::atoll(v);
    } else if (a == "--train_forever") {
      f.train_forever = true;
    } else if (a == "--bench") {
      f.bench = true;
    } else {
      std::fprintf(stderr, "nccl_train_check: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
#ifndef SHARDKIT_WITH_CUDA
  std::printf("nccl_train_check: skipped (built without --config=cuda)\n");
  return 0;
#else
  const Duration timeout(f.timeout_ms);
  StatusOr<comm::DistributedEnv> env = comm::DistributedEnv::FromEnvironment();
  if (!env.ok()) {
    std::fprintf(stderr, "nccl_train_check: %s (run it under launch)\n", env.status().ToString().c_str());
    return 2;
  }
  if (Device::CudaDeviceCount() == 0) {
    std::printf("nccl_train_check: skipped (no CUDA device)\n");
    return 0;
  }
  const int rank = env->rank, world = env->world_size;
  if (!f.pid_dir.empty()) {
    std::ofstream(f.pid_dir + "/rank" + std::to_string(rank) + ".pid") << getpid() << "\n";
  }
  const auto t0 = Clock::now();
  StatusOr<std::unique_ptr<comm::TcpStore>> store_or =
      comm::TcpStore::Create(env->master_addr, env->master_port, rank == 0, timeout);
  if (!store_or.ok()) {
    std::fprintf(stderr, "rank %d: store: %s\n", rank, store_or.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<comm::Store> store(std::move(*store_or));
  StatusOr<int> device = comm::DefaultCudaDeviceFromEnvironment();
  if (!device.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, device.status().ToString().c_str());
    return 2;
  }
  comm::NcclOptions no;
  no.timeout = timeout;
  auto nccl = comm::NcclProcessGroup::Create(store, "nccl", rank, world, *device, no);
  if (!nccl.ok()) {
    std::fprintf(stderr, "rank %d: nccl group: %s\n", rank, nccl.status().ToString().c_str());
    return 1;
  }
  comm::GlooOptions go;
  go.timeout = timeout;
  auto gloo = comm::GlooProcessGroup::Create(store, "gloo", rank, world, go);
  if (!gloo.ok()) {
    std::fprintf(stderr, "rank %d: gloo group: %s\n", rank, gloo.status().ToString().c_str());
    return 1;
  }
  std::printf("rank %d of %d: nccl on cuda:%d and gloo ready in %.1f s\n", rank, world, *device,
              std::chrono::duration<double>(Clock::now() - t0).count());
  std::fflush(stdout);

  if (f.bench) return Bench(store, rank, world, *device, timeout);

  if (f.train_forever) {
    // Until a peer dies: then this rank's error and how long it took to come.
    Case c;
    c.name = "forever";
    auto t = Trainer::Create(OptionsFor(c, DeviceKind::kCuda, timeout), nccl->get());
    if (!t.ok()) {
      std::printf("rank %d: ERROR creating the trainer: %s\n", rank, t.status().ToString().c_str());
      return 3;
    }
    for (int64_t step = 1;; ++step) {
      const auto start = Clock::now();
      StatusOr<StepMetrics> m = (*t)->Step();
      if (!m.ok()) {
        const double epoch =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        std::printf("rank %d: ERROR at step %lld after %.2f s in the step (at epoch %.3f): %s\n", rank,
                    static_cast<long long>(step), std::chrono::duration<double>(Clock::now() - start).count(),
                    epoch, m.status().ToString().c_str());
        std::fflush(stdout);
        // The process stays usable: a second step fails at once, cleanly.
        const auto again = Clock::now();
        StatusOr<StepMetrics> m2 = (*t)->Step();
        std::printf("rank %d: next step %s in %.3f s: %s\n", rank, m2.ok() ? "succeeded" : "failed",
                    std::chrono::duration<double>(Clock::now() - again).count(),
                    m2.ok() ? "" : m2.status().ToString().c_str());
        std::fflush(stdout);
        return 3;
      }
      std::printf("rank %d: step %lld loss %.4f\n", rank, static_cast<long long>(step), m->global_loss);
      std::fflush(stdout);
    }
  }

  int passed = 0, failed = 0;
  auto report = [&](const std::string& name, const std::string& error, double worst, double seconds) {
    if (error.empty()) {
      ++passed;
      std::printf("case %s: PASS (worst difference %.3g, %.1f s)\n", name.c_str(), worst, seconds);
    } else {
      ++failed;
      std::printf("case %s: FAIL: %s\n", name.c_str(), error.c_str());
    }
    std::fflush(stdout);
  };

  if (!f.save.empty() || !f.resume.empty()) {
    // Checkpoints: sharded and full state dict written over nccl at one
    // world size, read back over nccl and over gloo (cpu) at another.
    Case c;
    c.strategy = ShardingStrategy::kFullShard;
    c.momentum = true;  // optimizer state to save and restore
    const auto start = Clock::now();
    if (!f.save.empty()) {
      auto t = Trainer::Create(OptionsFor(c, DeviceKind::kCuda, timeout), nccl->get());
      Status s = t.status();
      for (int i = 0; s.ok() && i < 3; ++i) s = (*t)->Step().status();
      if (s.ok()) s = (*t)->SaveCheckpoint(f.save + "/sharded");
      if (s.ok()) s = (*t)->SaveFullStateDict(f.save + "/full.safetensors");
      report("save_at_world" + std::to_string(world), s.ok() ? "" : s.ToString(), 0,
             std::chrono::duration<double>(Clock::now() - start).count());
    } else {
      for (const char* kind : {"sharded", "full"}) {
        Run runs[2];
        Status s;
        int which = 0;
        for (DeviceKind dk : {DeviceKind::kCpu, DeviceKind::kCuda}) {
          comm::ProcessGroup* g = dk == DeviceKind::kCuda ? static_cast<comm::ProcessGroup*>(nccl->get())
                                                         : static_cast<comm::ProcessGroup*>(gloo->get());
          auto t = Trainer::Create(OptionsFor(c, dk, timeout), g);
          s = t.status();
          if (s.ok()) {
            s = std::string(kind) == "sharded" ? (*t)->LoadCheckpoint(f.resume + "/sharded")
                                               : (*t)->LoadFullStateDict(f.resume + "/full.safetensors");
          }
          if (s.ok() && (*t)->steps() != 3) s = InternalError("resumed at step " + std::to_string((*t)->steps()));
          for (int i = 0; s.ok() && i < 2; ++i) {
            StatusOr<StepMetrics> m = (*t)->Step();
            s = m.status();
            if (s.ok()) runs[which].losses.push_back(m->global_loss);
          }
          if (s.ok()) {
            auto p = ReadParams(**t);
            s = p.status();
            if (s.ok()) runs[which].final = std::move(*p);
          }
          if (!s.ok()) break;
          ++which;
        }
        double worst = 0;
        const std::string err = s.ok() ? Compare(c, runs[0], runs[1], &worst) : s.ToString();
        report(std::string("resume_") + kind + "_at_world" + std::to_string(world), err, worst,
               std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
  } else {
    for (const Case& c : AllCases()) {
      if (f.cases != "all" && ("," + f.cases + ",").find("," + c.name + ",") == std::string::npos) continue;
      if (world < c.min_world || (c.shard_group > 0 && world % c.shard_group != 0)) continue;
      const auto start = Clock::now();
      StatusOr<Run> cpu = Train(c, DeviceKind::kCpu, gloo->get(), f.steps, timeout);
      StatusOr<Run> gpu = cpu.ok() ? Train(c, DeviceKind::kCuda, nccl->get(), f.steps, timeout)
                                   : StatusOr<Run>(cpu.status());
      double worst = 0;
      std::string err;
      if (!cpu.ok()) {
        err = "gloo run: " + cpu.status().ToString();
      } else if (!gpu.ok()) {
        err = "nccl run: " + gpu.status().ToString();
      } else {
        err = Compare(c, *cpu, *gpu, &worst);
      }
      report(c.name + "_world" + std::to_string(world), err, worst,
             std::chrono::duration<double>(Clock::now() - start).count());
    }
    if (f.cases == "all" || ("," + f.cases + ",").find(",engine_caller_stream,") != std::string::npos) {
      // The engine as a framework drives it: NCCL with the caller's CUDA
      // stream (stream-ordered hooks) against gloo on the CPU.
      const auto start = Clock::now();
      StatusOr<std::vector<std::vector<float>>> cpu = TrainEngine(gloo->get(), false, timeout);
      StatusOr<std::vector<std::vector<float>>> gpu =
          cpu.ok() ? TrainEngine(nccl->get(), true, timeout) : cpu.status();
      std::string err;
      double worst = 0;
      if (!cpu.ok()) {
        err = "gloo engine: " + cpu.status().ToString();
      } else if (!gpu.ok()) {
        err = "nccl engine: " + gpu.status().ToString();
      } else {
        for (int u = 0; u < kEngineUnits && err.empty(); ++u) {
          for (int64_t i = 0; i < kEngineWidth; ++i) {
            const double d = std::fabs(double((*gpu)[u][i]) - (*cpu)[u][i]);
            worst = std::max(worst, d);
            if (!(d <= 1e-6 + 1e-6 * std::fabs((*cpu)[u][i]))) {
              err = "unit " + std::to_string(u) + " [" + std::to_string(i) + "]: nccl " +
                    std::to_string((*gpu)[u][i]) + ", gloo " + std::to_string((*cpu)[u][i]);
              break;
            }
          }
        }
      }
      report("engine_caller_stream_world" + std::to_string(world), err, worst,
             std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  if (rank == 0) std::printf("nccl_train_check: %d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
#endif
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) { return sk::Main(argc, argv); }
