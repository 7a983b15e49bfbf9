// A contract test for FSDP (issue 5): a minimal ZeRO-3-style UnitHooks,
// written only against model.h and init.h, with ranks simulated one after
// the other in one thread. Each rank stores one equal shard of each unit's
// flat (padded) parameter, initialised alone from the counter RNG; units
// are "all-gathered" before forward and backward and gradients
// "reduce-scattered" after. Training with it must equal plain training on
// the union of the ranks' batches.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/nn/configs.h"
#include "runtime/nn/data.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/nn/gradient_check.h"

namespace sk {
namespace {

class SimulatedShardedParameters {
 public:
  SimulatedShardedParameters(const std::vector<UnitSpec>& units, int world, uint64_t seed)
      : units_(units), world_(world) {
    for (const UnitSpec& u : units) {
      const int64_t flat = u.numel();
      const int64_t shard = (flat + world - 1) / world;  // padded to a multiple of world
      shard_size_.push_back(shard);
      std::vector<std::vector<float>> shards(world, std::vector<float>(shard, 0.0f));
      std::vector<std::vector<float>> grad_shards(world, std::vector<float>(shard, 0.0f));
      // Deferred initialisation: each rank fills only its own shard.
      for (int r = 0; r < world; ++r) {
        int64_t offset = 0;
        for (const ParamSpec& p : u.params) {
          const int64_t n = p.shape.numel();
          const int64_t lo = std::max(offset, r * shard), hi = std::min(offset + n, (r + 1) * shard);
          if (lo < hi) {
            CHECK(InitializeSlice(p.init, seed, ParamIdFromName(FullParamName(u, p)), lo - offset,
                                  hi - offset, shards[r].data() + (lo - r * shard))
                      .ok());
          }
          offset += n;
        }
      }
      shards_.push_back(std::move(shards));
      grad_shards_.push_back(std::move(grad_shards));
    }
    pending_.resize(units.size());
  }

  // The hooks one rank's model calls (ranks differ only in their batch here).
  class RankHooks : public UnitHooks {
   public:
    explicit RankHooks(SimulatedShardedParameters* owner) : owner_(owner) {}
    StatusOr<std::vector<Tensor>> PreForward(int u) override { return owner_->Gather(u, &gathered_); }
    Status PostForward(int u) override {
      gathered_.reset();  // reshard: the full parameter is freed
      return OkStatus();
    }
    StatusOr<UnitBackwardBuffers> PreBackward(int u) override {
      UnitBackwardBuffers b;
      SK_ASSIGN_OR_RETURN(b.params, owner_->Gather(u, &gathered_));
      grad_.assign(static_cast<size_t>(owner_->units_[u].numel()), 0.0f);
      b.grads = owner_->Views(u, grad_.data());
      return b;
    }
    Status PostBackward(int u) override {
      owner_->ReduceIntoPending(u, grad_);
      gathered_.reset();
      return OkStatus();
    }

   private:
    SimulatedShardedParameters* owner_;
    std::shared_ptr<std::vector<float>> gathered_;
    std::vector<float> grad_;
  };

  // After every rank's backward: each rank keeps the mean gradient of its shard.
  void ReduceScatter() {
    for (size_t u = 0; u < units_.size(); ++u) {
      for (int r = 0; r < world_; ++r) {
        for (int64_t i = 0; i < shard_size_[u]; ++i) {
          const int64_t g = r * shard_size_[u] + i;
          grad_shards_[u][r][i] = g < static_cast<int64_t>(pending_[u].size()) ? pending_[u][g] / world_ : 0.0f;
        }
      }
      pending_[u].clear();
    }
  }

  void SgdOnShards(float lr) {
    for (size_t u = 0; u < units_.size(); ++u)
      for (int r = 0; r < world_; ++r)
        for (int64_t i = 0; i < shard_size_[u]; ++i) shards_[u][r][i] -= lr * grad_shards_[u][r][i];
  }

  std::vector<float> FullParameters() {
    std::vector<float> out;
    for (size_t u = 0; u < units_.size(); ++u) {
      std::shared_ptr<std::vector<float>> g;
      CHECK(Gather(static_cast<int>(u), &g).ok());
      out.insert(out.end(), g->begin(), g->end());
    }
    return out;
  }

 private:
  // All-gather: concatenates the shards and drops the padding.
  StatusOr<std::vector<Tensor>> Gather(int u, std::shared_ptr<std::vector<float>>* keep) {
    auto full = std::make_shared<std::vector<float>>();
    for (int r = 0; r < world_; ++r) full->insert(full->end(), shards_[u][r].begin(), shards_[u][r].end());
    full->resize(static_cast<size_t>(units_[u].numel()));
    *keep = full;
    return Views(u, full->data());
  }

  std::vector<Tensor> Views(int u, float* flat) {
    std::vector<Tensor> out;
    int64_t offset = 0;
    for (const ParamSpec& p : units_[u].params) {
      out.push_back(*Tensor::Wrap(flat + offset, DType::kF32, p.shape));
      offset += p.shape.numel();
    }
    return out;
  }

  void ReduceIntoPending(int u, const std::vector<float>& grad) {
    if (pending_[u].empty()) pending_[u].assign(grad.size(), 0.0f);
    for (size_t i = 0; i < grad.size(); ++i) pending_[u][i] += grad[i];
  }

  std::vector<UnitSpec> units_;
  int world_;
  std::vector<int64_t> shard_size_;
  std::vector<std::vector<std::vector<float>>> shards_, grad_shards_;
  std::vector<std::vector<float>> pending_;
};

TEST(ShardedHooks, DeferredShardInitialisationGathersToTheFullInitialisation) {
  auto model = CreateModel("gpt-tiny");
  ASSERT_TRUE(model.ok());
  for (int world : {2, 3}) {
    SimulatedShardedParameters sharded((*model)->units(), world, 77);
    auto full = OwnedParameters::Create((*model)->units(), 77);
    ASSERT_TRUE(full.ok());
    std::vector<float> a = sharded.FullParameters(), b = Flatten((*full)->all_params());
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "world " << world;
  }
}

TEST(ShardedHooks, TrainingWithShardedHooksEqualsPlainTrainingOnTheGlobalBatch) {
  for (const char* name : {"gpt-tiny", "t5-tiny"}) {
    auto model = CreateModel(name);
    ASSERT_TRUE(model.ok());
    const bool t5 = std::string(name) == "t5-tiny";
    const int world = 2;
    SimulatedShardedParameters sharded((*model)->units(), world, 5);
    auto plain = OwnedParameters::Create((*model)->units(), 5);
    ASSERT_TRUE(plain.ok());
    auto stream = SyntheticTokenStream(3, 64, 2000);
    const float lr = 0.5f;
    OptimizerOptions plain_sgd;  // p -= (lr / world) * g
    plain_sgd.kind = OptimizerKind::kSgd;
    plain_sgd.lr = lr / world;
    auto sgd = *Optimizer::Create(plain_sgd, &HostAllocator::Default());
    auto refs = *ShardRefsFor((*plain)->all_params(), (*plain)->all_grads());
    for (int step = 0; step < 3; ++step) {
      (*plain)->ZeroGrad();
      for (int r = 0; r < world; ++r) {
        auto batch = t5 ? ReversalBatch(*stream, 2, 12, 10, 0, 9, step, r, world)
                        : LanguageModelBatch(*stream, 2, 12, 9, step, r, world);
        ASSERT_TRUE(batch.ok());
        SimulatedShardedParameters::RankHooks hooks(&sharded);
        ASSERT_TRUE((*model)->ForwardBackward(*batch, hooks, HostAllocator::Default()).ok());
        ASSERT_TRUE((*model)->ForwardBackward(*batch, **plain, HostAllocator::Default()).ok());
      }
      sharded.ReduceScatter();
      sharded.SgdOnShards(lr);
      // Plain: the summed gradient of the two halves, averaged like the ranks'.
      ASSERT_TRUE(sgd->Step(ops::HostContext(), refs).ok());
    }
    std::vector<float> a = sharded.FullParameters(), b = Flatten((*plain)->all_params());
    ASSERT_EQ(a.size(), b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1e-2, std::fabs(double{b[i]})));
    }
    EXPECT_LT(worst, 1e-5) << name;
  }
}

}  // namespace
}  // namespace sk
