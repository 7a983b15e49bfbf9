// Memory and time of Hugging Face directory import and export (issue 43
// item 5) at a fine-tuning size, on the host:
//
//   ./bazelw run -c opt //benchmarks/micro:hf_io -- [--model=SPEC] [--dir=PATH] [--worlds=1,2] [--before]
//       [--reuse] [--init=random,skip]
//
// --model is a decoder spec or model name whose configuration has a Hugging
// Face architecture (default: Qwen2-0.5B's exact shape, 494 M parameters,
// tied, q/k/v biases). A world-1 FSDP model of it (random init) is exported
// with SaveFullStateDict(dir/, hf-llama) -- the streaming export, one unit
// per file -- and the directory is imported with LoadFullStateDict at each
// world size (local ranks, threads of this process). For each operation it
// prints the process's peak RSS above its RSS before the operation
// (/proc/self/status VmHWM, reset through /proc/self/clear_refs), one
// rank's f32 shard, the largest tensor, and the goal: at most
// ranks x (1.2 x shard + largest tensor). --before also runs the former
// algorithms, rebuilt from today's functions: the whole model gathered and
// converted in memory (WriteHfModelDir), and every rank reading the whole
// directory and converting it (ReadHfModelDir).
// --reuse takes dir/export/ from an earlier run when its index is there
// (no export). --init lists how each import's model is created first:
// `random` (the initialisers run, then the load overwrites them) and `skip`
// (FsdpOptions::skip_init, what sk_trainer_options.skip_init sets); each
// prints the creation's time beside the import's.
#include <malloc.h>

#include <barrier>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/checkpoint/hf_checkpoint.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/configs.h"

namespace {

constexpr char kQwen2_05b[] =
    "decoder:name=qwen2-0.5b-shape,layers=24,d_model=896,heads=14,kv_heads=2,d_ff=4864,vocab=151936,seq=512,"
    "tied=true,qkv_bias=true,rope_theta=1000000,norm_eps=1e-6";

int64_t StatusKib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key));
  }
  return -1;
}

// Returns the RSS now (bytes) after resetting the peak to it.
int64_t ResetPeak() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  return StatusKib("VmRSS:") * 1024;
}

int64_t Peak() { return StatusKib("VmHWM:") * 1024; }

double GiB(int64_t b) { return static_cast<double>(b) / (1 << 30); }

struct Measured {
  int64_t extra = 0;
  double seconds = 0;
};

template <typename F>
Measured Measure(F&& f) {
  const int64_t before = ResetPeak();
  const auto t0 = std::chrono::steady_clock::now();
  sk::Status s = f();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) {
    std::fprintf(stderr, "hf_io: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return Measured{Peak() - before, secs};
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec = kQwen2_05b, dir = "/tmp/sk-hf-io";
  std::vector<int> worlds = {1, 2};
  bool before = false, reuse = false;
  std::vector<bool> skip_inits = {false};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--model=", 0) == 0) {
      spec = a.substr(8);
    } else if (a.rfind("--dir=", 0) == 0) {
      dir = a.substr(6);
    } else if (a.rfind("--worlds=", 0) == 0) {
      worlds.clear();
      std::stringstream ss(a.substr(9));
      for (std::string w; std::getline(ss, w, ',');) {
        const int n = std::atoi(w.c_str());
        if (n < 1 || n > 8) {
          std::fprintf(stderr, "hf_io: --worlds takes sizes 1..8\n");
          return 2;
        }
        worlds.push_back(n);
      }
    } else if (a == "--before") {
      before = true;
    } else if (a == "--reuse") {
      reuse = true;
    } else if (a.rfind("--init=", 0) == 0) {
      skip_inits.clear();
      std::stringstream ss(a.substr(7));
      for (std::string w; std::getline(ss, w, ',');) {
        if (w != "random" && w != "skip") {
          std::fprintf(stderr, "hf_io: --init takes random and/or skip\n");
          return 2;
        }
        skip_inits.push_back(w == "skip");
      }
    } else {
      std::fprintf(stderr,
                   "usage: hf_io [--model=SPEC] [--dir=PATH] [--worlds=1,2] [--before] [--reuse] "
                   "[--init=random,skip]\n");
      return 2;
    }
  }
  sk::StatusOr<sk::NamedModelConfig> config = sk::FindModelConfig(spec);
  if (!config.ok()) {
    std::fprintf(stderr, "hf_io: %s\n", config.status().ToString().c_str());
    return 2;
  }
  auto model = *sk::CreateModel(*config);
  int64_t params = 0, largest = 0;
  for (const sk::UnitSpec& u : model->units()) {
    for (const sk::ParamSpec& p : u.params) {
      params += p.shape.numel();
      largest = std::max(largest, p.shape.numel() * 4);
    }
  }
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/export/";
  std::printf("model %s: %lld parameters (%.3f GiB f32), largest tensor %.3f GiB; directory %s\n",
              config->name.c_str(), static_cast<long long>(params), GiB(params * 4), GiB(largest), out.c_str());
  sk::FsdpOptions fo;
  fo.timeout = sk::Duration(600'000);
  sk::FullStateDictOptions hf;
  hf.layout = sk::WeightLayout::kHfLlama;

  // Export from a world-1 model.
  if (reuse && std::filesystem::exists(out + "model.safetensors.index.json")) {
    std::printf("export  skipped: --reuse and %s holds an index\n", out.c_str());
  } else {
    sk::CachingAllocator alloc(*sk::Device::Get(sk::DeviceId::Cpu(0)));
    std::unique_ptr<sk::FullyShardedModel> fsdp;
    Measured init;
    sk::Status s = sk::comm::RunLocalRanks(1, [&](int, sk::comm::ProcessGroup* g) -> sk::Status {
      init = Measure([&]() -> sk::Status {
        SK_ASSIGN_OR_RETURN(fsdp, sk::FullyShardedModel::Create(model->units(), g, &alloc, fo));
        return sk::OkStatus();
      });
      int64_t shard = 0;
      for (int u = 0; u < fsdp->num_units(); ++u) shard += fsdp->layout(u).shard_numel() * 4;
      sk::TrainingState st{spec, &model->units(), fsdp.get(), nullptr};
      const Measured m = Measure([&] { return sk::SaveFullStateDict(out, st, 0, hf); });
      std::printf("export  world 1: peak RSS +%.3f GiB in %.1f s (shard %.3f GiB; goal <= 1.2 x shard + largest = "
                  "%.3f GiB): %s\n",
                  GiB(m.extra), m.seconds, GiB(shard), GiB(static_cast<int64_t>(1.2 * shard) + largest),
                  m.extra <= 1.2 * shard + largest ? "met" : "NOT met");
      if (before) {
        const Measured b = Measure([&]() -> sk::Status {
          // The former export: every parameter gathered on rank 0, the
          // whole model converted in memory, then written.
          std::vector<sk::Tensor> full;
          std::vector<sk::SafeTensorsEntry> entries;
          for (int u = 0; u < fsdp->num_units(); ++u) {
            for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
              SK_ASSIGN_OR_RETURN(sk::Tensor t, fsdp->GatherFullParam(u, static_cast<int>(p)));
              full.push_back(t);
              entries.push_back({sk::FullParamName(model->units()[u], model->units()[u].params[p]),
                                 sk::DType::kF32, t.shape(), t.data()});
            }
          }
          SK_ASSIGN_OR_RETURN(sk::SafeTensorsFile mine, sk::SafeTensorsFile::FromEntries(entries));
          full.clear();
          return sk::WriteHfModelDir(dir + "/export-before/", *config, mine);
        });
        std::printf("export  world 1, former algorithm: peak RSS +%.3f GiB in %.1f s\n", GiB(b.extra), b.seconds);
      }
      return sk::OkStatus();
    });
    if (!s.ok()) {
      std::fprintf(stderr, "hf_io: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("init    world 1 (random, deferred per shard): %.1f s\n", init.seconds);
  }
  // Imports.
  for (int world : worlds) {
    for (bool skip_init : skip_inits) {
      int64_t shard = 0, base = 0;
      Measured load;
      double create_seconds = 0;
      std::barrier sync(world);
      std::chrono::steady_clock::time_point t0;
      sk::Status s = sk::comm::RunLocalRanks(world, [&](int r, sk::comm::ProcessGroup* g) -> sk::Status {
        sk::CachingAllocator alloc(*sk::Device::Get(sk::DeviceId::Cpu(r)));
        sk::FsdpOptions create = fo;
        create.skip_init = skip_init;
        sync.arrive_and_wait();
        const auto c0 = std::chrono::steady_clock::now();
        SK_ASSIGN_OR_RETURN(auto fsdp, sk::FullyShardedModel::Create(model->units(), g, &alloc, create));
        sync.arrive_and_wait();
        if (r == 0) create_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
        sk::TrainingState st{spec, &model->units(), fsdp.get(), nullptr};
        sync.arrive_and_wait();
        if (r == 0) {
          for (int u = 0; u < fsdp->num_units(); ++u) shard += fsdp->layout(u).shard_numel() * 4;
          base = ResetPeak();
          t0 = std::chrono::steady_clock::now();
        }
        sync.arrive_and_wait();
        sk::Status loaded = sk::LoadFullStateDict(out, st, hf).status();
        sync.arrive_and_wait();
        if (r == 0) {
          load.extra = Peak() - base;
          load.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        return loaded;
      });
      if (!s.ok()) {
        std::fprintf(stderr, "hf_io: %s\n", s.ToString().c_str());
        return 1;
      }
      const double goal = world * (1.2 * shard + largest);
      std::printf("create  world %d (%s): %.1f s, then\n", world,
                  skip_init ? "skip_init: no random initialisation" : "random init, deferred per shard",
                  create_seconds);
      std::printf(
          "import  world %d: peak RSS +%.3f GiB in %.1f s (%d x shard %.3f GiB; goal <= %d x (1.2 x shard + "
          "largest) = %.3f GiB): %s\n",
          world, GiB(load.extra), load.seconds, world, GiB(shard), world, goal / (1 << 30),
          load.extra <= goal ? "met" : "NOT met");
      if (before && skip_init == skip_inits.front()) {
        const Measured b = Measure([&]() -> sk::Status {
          // The former import: each rank read the whole directory and
          // converted it, holding both.
          std::vector<sk::HfModel> held;
          for (int r = 0; r < world; ++r) {
            SK_ASSIGN_OR_RETURN(sk::HfModel m, sk::ReadHfModelDir(out));
            held.push_back(std::move(m));
          }
          return sk::OkStatus();
        });
        std::printf(
            "import  world %d, former algorithm (files read whole and converted, per rank): peak RSS +%.3f GiB "
            "in %.1f s\n",
            world, GiB(b.extra), b.seconds);
      }
    }
  }
  return 0;
}
