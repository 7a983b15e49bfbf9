// DDP changes nothing but where the work runs: a tiny GPT trained for five
// steps with DDP at world sizes 2 and 4, with one bucket and with many small
// ones, ends with the same losses and parameters as one unsharded rank, and
// every replica holds the same bits.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <ostream>

#include "runtime/ddp/ddp.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

using testing::ExpectRelClose;
using testing::MakeBatch;
using testing::RunRanks;

struct Case {
  int world;
  int64_t bucket_bytes;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "world " << c.world << ", bucket_bytes " << c.bucket_bytes;
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  return "world" + std::to_string(info.param.world) + "_bucket" +
         std::to_string(info.param.bucket_bytes);
}

class DdpEquivalenceTest : public ::testing::TestWithParam<Case> {};

constexpr int kSteps = 5;
constexpr int kRowsPerRank = 2;
constexpr uint64_t kSeed = 1234;

TEST_P(DdpEquivalenceTest, LossesAndParametersMatchOneUnshardedRank) {
  const Case c = GetParam();
  auto model = *GptModel::Create(testing::TinyGpt());
  testing::ReferenceRun ref = testing::RunReference(*model, kSteps, kRowsPerRank * c.world, kSeed);

  std::mutex mu;
  std::vector<std::vector<float>> losses(c.world);
  std::vector<std::vector<std::vector<std::vector<float>>>> params(c.world);  // [rank][unit][param]
  std::vector<int> buckets(c.world);
  RunRanks(c.world, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    DdpOptions o;
    o.bucket_bytes = c.bucket_bytes;
    o.seed = kSeed;
    o.timeout = Duration(60'000);
    auto ddp = DistributedDataParallel::Create(model->units(), world, &alloc, o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
    // Trained only through the interface a trainer shares with FSDP.
    DataParallelModel& dp = **ddp;
    std::vector<float> mine;
    for (int s = 0; s < kSteps; ++s) {
      dp.ZeroGrad();
      StatusOr<float> loss = model->ForwardBackward(MakeBatch(s, rank * kRowsPerRank, kRowsPerRank),
                                                    dp, dp.activation_allocator());
      ASSERT_TRUE(loss.ok()) << loss.status();
      Status st = dp.OptimizerStep(*opt);
      ASSERT_TRUE(st.ok()) << st;
      mine.push_back(*loss);
    }
    EXPECT_EQ((*ddp)->counters().all_reduces, kSteps * (*ddp)->num_buckets());
    std::vector<std::vector<std::vector<float>>> p;
    for (int u = 0; u < (*ddp)->num_units(); ++u) {
      p.emplace_back();
      for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
        Tensor t = (*ddp)->param(u, static_cast<int>(i));
        p.back().emplace_back(t.data_as<float>(), t.data_as<float>() + t.numel());
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    losses[rank] = std::move(mine);
    params[rank] = std::move(p);
    buckets[rank] = (*ddp)->num_buckets();
  });
  ASSERT_FALSE(::testing::Test::HasFailure());
  if (c.bucket_bytes < kDefaultBucketBytes) {
    EXPECT_GT(buckets[0], 2) << "the small-bucket case must really use several buckets";
  } else {
    EXPECT_EQ(buckets[0], 1);
  }
  for (int s = 0; s < kSteps; ++s) {
    // The global loss is the mean of the ranks' local means (equal batch sizes).
    double mean = 0;
    for (int r = 0; r < c.world; ++r) mean += losses[r][s];
    mean /= c.world;
    ExpectRelClose(static_cast<float>(mean), ref.losses[s], 1e-5, "loss at step " + std::to_string(s));
  }
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(params[r].size(), ref.params.size());
    for (size_t u = 0; u < ref.params.size(); ++u) {
      for (size_t p = 0; p < ref.params[u].size(); ++p) {
        const std::string what = "rank " + std::to_string(r) + " " + model->units()[u].name + "." +
                                 model->units()[u].params[p].name;
        // Replicas never drift: every rank averaged to the same bits.
        ASSERT_EQ(0, std::memcmp(params[r][u][p].data(), params[0][u][p].data(),
                                 params[0][u][p].size() * sizeof(float)))
            << what << " differs from rank 0";
        for (size_t i = 0; i < ref.params[u][p].size(); ++i) {
          ExpectRelClose(params[r][u][p][i], ref.params[u][p][i], 1e-5, what + "[" + std::to_string(i) + "]");
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DdpEquivalenceTest,
                         ::testing::Values(Case{2, kDefaultBucketBytes}, Case{4, kDefaultBucketBytes},
                                           Case{2, 2048}, Case{4, 2048}),
                         Name);

}  // namespace
}  // namespace sk
