// Stream-ordered engine hooks on CPU streams (issue 31, item 4): the caller
// computes on a CpuStream of its own, whose closures are its "kernels", and
// each of them sleeps before it reads a parameter or writes a gradient. The
// engine must neither reduce a gradient before the caller's stream wrote it
// nor reuse a gathered buffer before the caller's stream read it, and a step
// computed this way equals the synchronous protocol bit for bit (f32, local
// backend, 2 ranks as threads).
#include "runtime/train/engine.h"
#include "tests/util/vector_units.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/device/device.h"

namespace sk {
namespace {

constexpr int kWorld = 2;
constexpr int kUnits = 3;
constexpr int64_t kWidth = 256;  // every unit the same size: freed buffers are reused at once
constexpr int kSteps = 2;
// How long each caller "kernel" sleeps before touching a view: far longer
// than a gather or a reduction of kWidth floats, so an engine that does not
// wait for the caller's stream reads or overwrites too early.
constexpr auto kKernelDelay = std::chrono::milliseconds(30);


// The caller's model: forward saves (rank + 1) * w of each unit; backward
// adds saved + 0.5 * w + rank into the gradient, so every value read in
// either pass reaches the result.
struct CallerModel {
  int rank = 0;
  std::vector<std::vector<float>> saved = std::vector<std::vector<float>>(kUnits);

  void Forward(int unit, const float* w) {
    saved[unit].assign(w, w + kWidth);
    for (float& v : saved[unit]) v *= static_cast<float>(rank + 1);
  }
  void Backward(int unit, const float* w, float* grad) const {
    for (int64_t i = 0; i < kWidth; ++i) {
      grad[i] += saved[unit][i] + 0.5f * w[i] + static_cast<float>(rank);
    }
  }
};

enum class Protocol { kSynchronous, kCallerStream };

struct RunResult {
  std::vector<std::vector<float>> params;  // per unit, after kSteps steps
  bool forward_hooks_returned_before_the_stream_ran = true;
};

// Runs kSteps steps on every rank and returns rank 0's parameters.
StatusOr<RunResult> Train(Protocol protocol, ShardingStrategy strategy) {
  RunResult result;
  Status s = comm::RunLocalRanks(kWorld, [&](int rank, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions options;
    options.fsdp.strategy = strategy;
    options.fsdp.timeout = Duration(60'000);
    options.optimizer.kind = OptimizerKind::kSgd;
    options.optimizer.lr = 0.25f;
    std::shared_ptr<Stream> stream;
    if (protocol == Protocol::kCallerStream) {
      SK_ASSIGN_OR_RETURN(Device * device, Device::Get(DeviceId::Cpu(rank)));
      SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> s, device->CreateStream("caller"));
      stream = std::move(s);
      options.stream = stream;
    }
    SK_ASSIGN_OR_RETURN(std::unique_ptr<FsdpEngine> engine,
                        FsdpEngine::Create(VectorUnits(kUnits, kWidth), world, options));
    auto model = std::make_shared<CallerModel>();
    model->rank = rank;
    // A caller kernel: on the caller's stream after a delay, or at once.
    auto launch = [&](std::function<void()> kernel) -> Status {
      if (!stream) {
        kernel();
        return OkStatus();
      }
      return stream->Enqueue([kernel = std::move(kernel)]() {
        std::this_thread::sleep_for(kKernelDelay);
        kernel();
        return OkStatus();
      });
    };
    for (int step = 0; step < kSteps; ++step) {
      SK_RETURN_IF_ERROR(engine->ZeroGrad());
      for (int u = 0; u < kUnits; ++u) {
        SK_RETURN_IF_ERROR(engine->PreForward(u));
        SK_ASSIGN_OR_RETURN(const Tensor* w, engine->Param(u, 0));
        const float* wp = static_cast<const float*>(w->data());
        SK_RETURN_IF_ERROR(launch([model, u, wp] { model->Forward(u, wp); }));
        SK_RETURN_IF_ERROR(engine->PostForward(u));
      }
      // Three delayed kernels are still queued: the hooks did not wait.
      if (rank == 0 && stream && stream->Query()) {
        result.forward_hooks_returned_before_the_stream_ran = false;
      }
      for (int u = kUnits - 1; u >= 0; --u) {
        SK_RETURN_IF_ERROR(engine->PreBackward(u));
        SK_ASSIGN_OR_RETURN(const Tensor* w, engine->Param(u, 0));
        SK_ASSIGN_OR_RETURN(const Tensor* g, engine->Grad(u, 0));
        const float* wp = static_cast<const float*>(w->data());
        float* gp = static_cast<float*>(g->data());
        SK_RETURN_IF_ERROR(launch([model, u, wp, gp] { model->Backward(u, wp, gp); }));
        SK_RETURN_IF_ERROR(engine->PostBackward(u));
      }
      SK_RETURN_IF_ERROR(engine->FinishBackward());
      SK_RETURN_IF_ERROR(engine->OptimizerStep());
    }
    std::vector<std::vector<float>> params(kUnits, std::vector<float>(kWidth));
    for (int u = 0; u < kUnits; ++u) {
      SK_RETURN_IF_ERROR(engine->ReadParam(u, 0, params[u].data(), kWidth));
    }
    if (stream) SK_RETURN_IF_ERROR(stream->Synchronize());
    if (rank == 0) result.params = std::move(params);
    return OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

class EngineCallerStreamTest : public ::testing::TestWithParam<ShardingStrategy> {};

TEST_P(EngineCallerStreamTest, DelayedCallerKernelsGiveTheSynchronousResultBitForBit) {
  StatusOr<RunResult> sync = Train(Protocol::kSynchronous, GetParam());
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  StatusOr<RunResult> streamed = Train(Protocol::kCallerStream, GetParam());
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  for (int u = 0; u < kUnits; ++u) {
    ASSERT_EQ(sync->params[u].size(), streamed->params[u].size());
    int differing = 0;
    for (int64_t i = 0; i < kWidth; ++i) {
      if (std::memcmp(&sync->params[u][i], &streamed->params[u][i], sizeof(float)) != 0) ++differing;
    }
    EXPECT_EQ(differing, 0) << "unit " << u << ": " << differing << " of " << kWidth
                            << " parameters differ from the synchronous protocol (first: "
                            << sync->params[u][0] << " vs " << streamed->params[u][0] << ")";
  }
  EXPECT_TRUE(streamed->forward_hooks_returned_before_the_stream_ran)
      << "the forward hooks waited on the host for the caller's stream";
}

INSTANTIATE_TEST_SUITE_P(Strategies, EngineCallerStreamTest,
                         ::testing::Values(ShardingStrategy::kFullShard,
                                           ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard),
                         [](const auto& info) { return std::string(ShardingStrategyName(info.param)); });

TEST(EngineCallerStream, AStreamOfAnotherDeviceIsAnInvalidArgumentNamingBoth) {
  Status s = comm::RunLocalRanks(1, [](int, comm::ProcessGroup* world) -> Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<FsdpEngine> engine,
                        FsdpEngine::Create(VectorUnits(kUnits, kWidth), world, FsdpEngineOptions()));
    SK_ASSIGN_OR_RETURN(Device * other, Device::Get(DeviceId::Cpu(7)));
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> foreign, other->CreateStream("elsewhere"));
    Status r = engine->SetStream(std::move(foreign));
    EXPECT_EQ(r.code(), StatusCode::kInvalidArgument) << r.ToString();
    EXPECT_NE(std::string(r.message()).find("cpu:7"), std::string::npos) << r.ToString();
    EXPECT_NE(std::string(r.message()).find("cpu:0"), std::string::npos) << r.ToString();
    EXPECT_EQ(engine->stream(), nullptr);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace sk
