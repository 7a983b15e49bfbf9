// The engine's token-weighted loss (FsdpEngine::SetLossTokens,
// sk_engine_set_loss_tokens): ranks and micro-batches whose masks leave
// uneven numbers of counted tokens step exactly as one process on the whole
// global batch with PyTorch's cross_entropy(ignore_index=-100,
// reduction="mean"), under every sharding strategy, with no_sync or a
// reduction per micro-batch; the usual mean of per-batch means does not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/train/engine.h"

namespace sk {
namespace {

constexpr int kD = 3;  // features
constexpr int kV = 4;  // classes ("vocabulary")
constexpr int kT = 5;  // tokens per micro-batch
constexpr int kM = 2;  // micro-batches per rank

// proj.w [D, D] then head.w [V, D]: logits = W (P x).
std::vector<UnitSpec> TokenModel() {
  UnitSpec proj{"proj", {ParamSpec{"w", Shape{kD, kD}, Initializer{InitKind::kNormal, 0.f, 0.7f}}}};
  UnitSpec head{"head", {ParamSpec{"w", Shape{kV, kD}, Initializer{InitKind::kNormal, 0.f, 0.7f}}}};
  return {proj, head};
}

// The counted tokens of micro-batch m of rank r (of 4 possible ranks):
// uneven, one micro-batch counting none.
int Counted(int rank, int m) {
  static const int kCounts[4][kM] = {{1, 5}, {3, 0}, {2, 2}, {0, 4}};
  return kCounts[rank][m];
}

struct Token {
  float x[kD];
  int target;
  bool counted;
};

// Micro-batch m of rank r: deterministic features and targets; its first
// Counted(r, m) tokens count, the rest are masked (prompt, padding).
std::vector<Token> MicroBatch(int rank, int m) {
  std::vector<Token> b(kT);
  for (int t = 0; t < kT; ++t) {
    const int k = (rank * kM + m) * kT + t;
    for (int d = 0; d < kD; ++d) b[t].x[d] = std::sin(0.37f * static_cast<float>(k * kD + d) + 0.1f);
    b[t].target = (k * 7 + 3) % kV;
    b[t].counted = t < Counted(rank, m);
  }
  return b;
}

// Forward and backward of one micro-batch in double: adds `scale` x the
// gradient of the SUM of its counted tokens' cross-entropies to gP, gW.
void MicroBatchGrad(const std::vector<Token>& b, const float* P, const float* W, double scale,
                    std::vector<double>& gP, std::vector<double>& gW) {
  for (const Token& tok : b) {
    if (!tok.counted) continue;
    double h[kD], z[kV], dz[kV];
    for (int i = 0; i < kD; ++i) {
      h[i] = 0;
      for (int j = 0; j < kD; ++j) h[i] += static_cast<double>(P[i * kD + j]) * tok.x[j];
    }
    double mx = -1e300;
    for (int v = 0; v < kV; ++v) {
      z[v] = 0;
      for (int i = 0; i < kD; ++i) z[v] += static_cast<double>(W[v * kD + i]) * h[i];
      mx = std::max(mx, z[v]);
    }
    double sum = 0;
    for (int v = 0; v < kV; ++v) sum += std::exp(z[v] - mx);
    for (int v = 0; v < kV; ++v) dz[v] = std::exp(z[v] - mx) / sum - (v == tok.target ? 1.0 : 0.0);
    for (int v = 0; v < kV; ++v) {
      for (int i = 0; i < kD; ++i) gW[v * kD + i] += scale * dz[v] * h[i];
    }
    for (int i = 0; i < kD; ++i) {
      double dh = 0;
      for (int v = 0; v < kV; ++v) dh += static_cast<double>(W[v * kD + i]) * dz[v];
      for (int j = 0; j < kD; ++j) gP[i * kD + j] += scale * dh * tok.x[j];
    }
  }
}

// How the caller weights its micro-batches.
enum class Weighting {
  kLossTokens,    // SetLossTokens, then each micro-batch's loss sum: the fix
  kMeanOfMeans,   // each micro-batch's own mean / M, the ranks averaged: DDP's usual
  kSumsUnscaled,  // loss sums without SetLossTokens
};

struct Case {
  int world;
  ShardingStrategy strategy;
  bool sync_every_micro_batch;
};

// One SGD step (lr 1, no decay) on every rank; returns the gradient the
// step applied (before - after), proj.w then head.w, and the initial
// parameters in `initial`.
std::vector<float> EngineGradient(const Case& c, Weighting weighting, std::vector<float>* initial,
                                  int64_t* global_tokens) {
  std::vector<float> grad;
  Status s = comm::RunLocalRanks(c.world, [&](int rank, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o;
    o.optimizer.kind = OptimizerKind::kSgd;
    o.optimizer.lr = 1.f;
    o.optimizer.weight_decay = 0.f;
    o.fsdp.timeout = Duration(60'000);
    o.fsdp.strategy = c.strategy;
    if (c.strategy == ShardingStrategy::kHybridShard) o.fsdp.shard_group_size = 2;
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(TokenModel(), world, o));
    std::vector<float> P(kD * kD), W(kV * kD);
    SK_RETURN_IF_ERROR(e->ReadParam(0, 0, P.data(), static_cast<int64_t>(P.size())));
    SK_RETURN_IF_ERROR(e->ReadParam(1, 0, W.data(), static_cast<int64_t>(W.size())));
    SK_RETURN_IF_ERROR(e->ZeroGrad());
    int64_t mine = 0;
    for (int m = 0; m < kM; ++m) mine += Counted(rank, m);
    int64_t n = -1;
    if (weighting == Weighting::kLossTokens) {
      SK_ASSIGN_OR_RETURN(n, e->SetLossTokens(mine));
    }
    for (int m = 0; m < kM; ++m) {
      SK_RETURN_IF_ERROR(e->set_gradient_sync(c.sync_every_micro_batch || m + 1 == kM));
      const std::vector<Token> b = MicroBatch(rank, m);
      double scale = 1.0;
      if (weighting == Weighting::kMeanOfMeans) scale = Counted(rank, m) ? 1.0 / (Counted(rank, m) * kM) : 0.0;
      // The caller's own forward: the units' parameters as gathered.
      for (int u = 0; u < 2; ++u) {
        SK_RETURN_IF_ERROR(e->PreForward(u));
        SK_RETURN_IF_ERROR(e->PostForward(u));
      }
      std::vector<double> gP(P.size()), gW(W.size());
      MicroBatchGrad(b, P.data(), W.data(), scale, gP, gW);
      for (int u = 1; u >= 0; --u) {
        SK_RETURN_IF_ERROR(e->PreBackward(u));
        SK_ASSIGN_OR_RETURN(const Tensor* g, e->Grad(u, 0));
        const std::vector<double>& add = u == 0 ? gP : gW;
        for (int64_t i = 0; i < g->numel(); ++i) g->data_as<float>()[i] += static_cast<float>(add[i]);
        SK_RETURN_IF_ERROR(e->PostBackward(u));
      }
    }
    SK_RETURN_IF_ERROR(e->FinishBackward());
    SK_RETURN_IF_ERROR(e->OptimizerStep());
    std::vector<float> P1(P.size()), W1(W.size());
    SK_RETURN_IF_ERROR(e->ReadParam(0, 0, P1.data(), static_cast<int64_t>(P1.size())));
    SK_RETURN_IF_ERROR(e->ReadParam(1, 0, W1.data(), static_cast<int64_t>(W1.size())));
    if (rank == 0) {
      grad.clear();
      for (size_t i = 0; i < P.size(); ++i) grad.push_back(P[i] - P1[i]);
      for (size_t i = 0; i < W.size(); ++i) grad.push_back(W[i] - W1[i]);
      *initial = P;
      initial->insert(initial->end(), W.begin(), W.end());
      *global_tokens = n;
    }
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return grad;
}

// The single-process full-batch gradient: every rank's micro-batches at
// once, the loss sum over N.
std::vector<double> ReferenceGradient(int world, const std::vector<float>& initial, int64_t* n) {
  const float* P = initial.data();
  const float* W = initial.data() + kD * kD;
  *n = 0;
  for (int r = 0; r < world; ++r) {
    for (int m = 0; m < kM; ++m) *n += Counted(r, m);
  }
  std::vector<double> gP(kD * kD), gW(kV * kD);
  for (int r = 0; r < world; ++r) {
    for (int m = 0; m < kM; ++m) MicroBatchGrad(MicroBatch(r, m), P, W, 1.0 / static_cast<double>(*n), gP, gW);
  }
  gP.insert(gP.end(), gW.begin(), gW.end());
  return gP;
}

// The largest |a - b| relative to the reference's largest element.
double RelativeError(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

std::string Name(const Case& c) {
  return std::string(ShardingStrategyName(c.strategy)) + " world " + std::to_string(c.world) +
         (c.sync_every_micro_batch ? " reducing every micro-batch" : " no_sync");
}

const Case kCases[] = {
    {1, ShardingStrategy::kFullShard, false},   {2, ShardingStrategy::kFullShard, false},
    {2, ShardingStrategy::kFullShard, true},    {2, ShardingStrategy::kShardGradOp, false},
    {2, ShardingStrategy::kShardOptim, true},   {2, ShardingStrategy::kNoShard, false},
    {1, ShardingStrategy::kNoShard, true},      {4, ShardingStrategy::kHybridShard, false},
    {4, ShardingStrategy::kHybridShard, true},
};

TEST(EngineLossTokens, UnevenTokenCountsGiveTheSingleProcessFullBatchGradient) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(Name(c));
    std::vector<float> initial;
    int64_t engine_n = 0, n = 0;
    const std::vector<float> g = EngineGradient(c, Weighting::kLossTokens, &initial, &engine_n);
    ASSERT_EQ(g.size(), static_cast<size_t>(kD * kD + kV * kD));
    const std::vector<double> want = ReferenceGradient(c.world, initial, &n);
    EXPECT_EQ(engine_n, n) << "SetLossTokens returns the sum of the ranks' counts";
    EXPECT_LT(RelativeError(g, want), 2e-6);
  }
}

// Without SetLossTokens the same batches step elsewhere: the usual mean of
// the micro-batches' means, and loss sums divided by the number of ranks.
TEST(EngineLossTokens, WithoutItTheGradientIsNotTheGlobalMean) {
  for (const Case& c : {kCases[1], kCases[7]}) {
    SCOPED_TRACE(Name(c));
    for (Weighting w : {Weighting::kMeanOfMeans, Weighting::kSumsUnscaled}) {
      std::vector<float> initial;
      int64_t engine_n = 0, n = 0;
      const std::vector<float> g = EngineGradient(c, w, &initial, &engine_n);
      ASSERT_EQ(g.size(), static_cast<size_t>(kD * kD + kV * kD));
      EXPECT_GT(RelativeError(g, ReferenceGradient(c.world, initial, &n)), 0.05);
    }
  }
}

// N = 0 (every token masked everywhere): a zero gradient, as the trainer's.
TEST(EngineLossTokens, NoCountedTokenAnywhereGivesAZeroGradient) {
  Status s = comm::RunLocalRanks(2, [&](int, comm::ProcessGroup* world) -> Status {
    FsdpEngineOptions o;
    o.optimizer.kind = OptimizerKind::kSgd;
    o.optimizer.lr = 1.f;
    o.fsdp.timeout = Duration(60'000);
    SK_ASSIGN_OR_RETURN(auto e, FsdpEngine::Create(TokenModel(), world, o));
    SK_RETURN_IF_ERROR(e->ZeroGrad());
    SK_ASSIGN_OR_RETURN(int64_t n, e->SetLossTokens(0));
    EXPECT_EQ(n, 0);
    for (int u = 0; u < 2; ++u) {
      SK_RETURN_IF_ERROR(e->PreForward(u));
      SK_RETURN_IF_ERROR(e->PostForward(u));
    }
    for (int u = 1; u >= 0; --u) {
      SK_RETURN_IF_ERROR(e->PreBackward(u));
      SK_ASSIGN_OR_RETURN(const Tensor* g, e->Grad(u, 0));
      for (int64_t i = 0; i < g->numel(); ++i) g->data_as<float>()[i] += 1.f;
      SK_RETURN_IF_ERROR(e->PostBackward(u));
    }
    SK_RETURN_IF_ERROR(e->FinishBackward());
    SK_ASSIGN_OR_RETURN(double norm, e->ClipGradNorm(0));
    EXPECT_EQ(norm, 0.0);
    return OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace sk
