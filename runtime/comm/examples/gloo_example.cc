// The two-process example of docs/architecture.md: every rank contributes a shard, the
// group all-gathers the shards and all-reduces a gradient, FSDP-style.
//
//   bazel build //tools:launch //runtime/comm/examples:gloo_example
//   bazel-bin/tools/launch --nproc_per_node=2 --master_port=0
//       bazel-bin/runtime/comm/examples/gloo_example   (one command line)
#include <chrono>
#include <cstdio>
#include <string>

#include "runtime/comm/gloo_backend.h"
#include "runtime/core/allocator.h"
#include "runtime/device/device.h"

namespace {

int Run() {
  using namespace std::chrono_literals;
  using namespace sk;
  auto pg = comm::GlooProcessGroup::CreateFromEnvironment();  // RANK, WORLD_SIZE, MASTER_*
  if (!pg.ok()) {
    std::fprintf(stderr, "%s\n", pg.status().ToString().c_str());
    return 1;
  }
  const int rank = (*pg)->rank(), world = (*pg)->size();
  Device* cpu = Device::Get(DeviceId::Cpu()).value();
  std::unique_ptr<Stream> comm_stream = cpu->CreateStream("comm").value();
  HostAllocator& alloc = HostAllocator::Default();

  // all_gather: 4 elements per rank into one contiguous buffer.
  Tensor shard = alloc.Empty(DType::kF32, Shape({4})).value();
  Tensor full = alloc.Empty(DType::kF32, Shape({4 * world})).value();
  for (int i = 0; i < 4; ++i) shard.data_as<float>()[i] = static_cast<float>(rank * 10 + i);
  auto gathered = (*pg)->all_gather(full, shard, *comm_stream);

  // all_reduce (average) of a bf16 "gradient", accumulated in f32.
  Tensor grad = alloc.Empty(DType::kBF16, Shape({3})).value();
  for (int i = 0; i < 3; ++i) StoreFromFloat(grad.data(), DType::kBF16, i, static_cast<float>(rank + i));
  comm::ReduceOptions avg;
  avg.op = comm::ReduceOp::kAvg;
  auto reduced = (*pg)->all_reduce(grad, *comm_stream, avg);

  for (auto* w : {&gathered, &reduced}) {
    if (!w->ok()) {
      std::fprintf(stderr, "%s\n", w->status().ToString().c_str());
      return 1;
    }
    Status s = (**w)->wait(60s);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::string line = "rank " + std::to_string(rank) + "/" + std::to_string(world) + " gathered";
  for (int i = 0; i < 4 * world; ++i) line += " " + std::to_string(static_cast<int>(full.data_as<float>()[i]));
  line += "; mean grad";
  for (int i = 0; i < 3; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), " %.2f", LoadAsFloat(grad.data(), DType::kBF16, i));
    line += buf;
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

int main() { return Run(); }
