// DDP behaviour beyond equivalence: initialisation, bucket layout, when
// all-reduces are issued, no_sync, clipping, bf16 compute, the hook protocol,
// bad options and a missing peer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "runtime/ddp/ddp.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

using testing::MakeBatch;
using testing::RunRanks;

constexpr uint64_t kSeed = 99;
// Small enough that the tiny GPT needs several buckets, some spanning units.
constexpr int64_t kSmallBucket = 2048;

DdpOptions Options(int64_t bucket_bytes = kDefaultBucketBytes) {
  DdpOptions o;
  o.bucket_bytes = bucket_bytes;
  o.first_bucket_bytes = std::min(bucket_bytes, kDefaultFirstBucketBytes);
  o.seed = kSeed;
  o.timeout = Duration(60'000);
  return o;
}

std::unique_ptr<GptModel> Tiny(DType compute = DType::kF32) { return testing::TinyGptModel(compute); }

TEST(DdpTest, ReplicasAreInitialisedBitIdenticalToOwnedParametersOnEveryRank) {
  auto model = Tiny();
  auto full = *OwnedParameters::Create(model->units(), kSeed);
  RunRanks(3, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    for (int u = 0; u < ddp->num_units(); ++u) {
      for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
        const Tensor want = full->param(u, static_cast<int>(p));
        const Tensor got = ddp->param(u, static_cast<int>(p));
        ASSERT_EQ(got.shape(), want.shape());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.nbytes()))
            << "unit " << u << " param " << p << " rank " << rank;
        const Tensor g = ddp->grad(u, static_cast<int>(p));
        for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.data_as<float>()[i], 0.f);
      }
    }
  });
}

TEST(DdpTest, ParametersAndGradientsComeFromTheCachingAllocator) {
  auto model = Tiny();
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, Options());
    // Two f32 copies (parameters and gradients) of every parameter.
    EXPECT_GE(alloc.stats().allocated_bytes.current,
              2 * static_cast<int64_t>(sizeof(float)) * model->num_parameters());
  });
}

// Buckets are filled in the order gradients become final (reverse unit
// order, reverse parameter order within a unit) and close once they reach
// the cap; every parameter lies in exactly one bucket.
TEST(DdpTest, BucketsFollowReverseUnitOrderAndCloseAtTheCap) {
  auto model = Tiny();
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto one = *DistributedDataParallel::Create(model->units(), world, &alloc, Options());
    EXPECT_EQ(one->num_buckets(), 1) << "the tiny GPT fits one 25 MiB bucket";

    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    ASSERT_GT(ddp->num_buckets(), 2);
    int previous = 0;
    std::vector<int64_t> elements(ddp->num_buckets(), 0);
    std::vector<int> params(ddp->num_buckets(), 0);
    for (int u = ddp->num_units() - 1; u >= 0; --u) {
      for (int p = static_cast<int>(model->units()[u].params.size()) - 1; p >= 0; --p) {
        const int b = ddp->bucket_of(u, p);
        EXPECT_TRUE(b == previous || b == previous + 1) << "unit " << u << " param " << p;
        previous = b;
        elements[b] += model->units()[u].params[p].shape.numel();
        ++params[b];
        const DdpBucketInfo info = ddp->bucket_info(b);
        EXPECT_LE(info.lowest_unit, u);
        EXPECT_GE(info.highest_unit, u);
      }
    }
    EXPECT_EQ(previous, ddp->num_buckets() - 1);
    bool spans = false;
    for (int b = 0; b < ddp->num_buckets(); ++b) {
      const DdpBucketInfo info = ddp->bucket_info(b);
      EXPECT_EQ(info.num_params, params[b]);
      EXPECT_GE(info.numel, elements[b]);                  // plus alignment padding
      EXPECT_LT(info.numel, elements[b] + 4 * params[b]);  // 16-byte alignment at most
      if (b + 1 < ddp->num_buckets()) {
        EXPECT_GE(info.numel * 4, kSmallBucket) << "bucket " << b;
      }
      spans = spans || info.lowest_unit != info.highest_unit;
    }
    EXPECT_TRUE(spans) << "no bucket spans two units: the case is not exercised";
  });
}

// The bucket of every (unit, param) as the documented rule assigns it:
// reverse order, 16-byte aligned offsets, a bucket closes at its cap, the
// first bucket's cap being min(first_bucket_bytes, bucket_bytes).
std::vector<std::vector<int>> ExpectedBuckets(const std::vector<UnitSpec>& units, int64_t first,
                                              int64_t cap) {
  std::vector<std::vector<int>> out(units.size());
  for (size_t u = 0; u < units.size(); ++u) out[u].resize(units[u].params.size());
  int bucket = 0;
  int64_t bytes = 0;
  bool open = false;
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    for (int p = static_cast<int>(units[u].params.size()) - 1; p >= 0; --p) {
      if (!open) {
        if (bytes > 0) ++bucket;
        bytes = 0;
        open = true;
      }
      bytes = (bytes + 15) / 16 * 16 + 4 * units[u].params[p].shape.numel();
      out[u][p] = bucket;
      if (bytes >= (bucket == 0 ? std::min(first, cap) : cap)) open = false;
    }
  }
  return out;
}

TEST(DdpTest, FirstBucketIsCappedByFirstBucketBytes) {
  auto model = Tiny();
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    for (auto [first, cap] : {std::pair<int64_t, int64_t>{256, 4096}, {4096, 4096}, {100000, 2048},
                              {1, 1}}) {
      DdpOptions o = Options(cap);
      o.first_bucket_bytes = first;
      auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, o);
      const auto want = ExpectedBuckets(model->units(), first, cap);
      for (int u = 0; u < ddp->num_units(); ++u) {
        for (int p = 0; p < static_cast<int>(model->units()[u].params.size()); ++p) {
          EXPECT_EQ(ddp->bucket_of(u, p), want[u][p])
              << "first " << first << " cap " << cap << " unit " << u << " param " << p;
        }
      }
    }
    DdpOptions small_first = Options(4096), same = Options(4096);
    small_first.first_bucket_bytes = 256;
    same.first_bucket_bytes = 4096;
    auto a = *DistributedDataParallel::Create(model->units(), world, &alloc, small_first);
    auto b = *DistributedDataParallel::Create(model->units(), world, &alloc, same);
    EXPECT_LT(a->bucket_info(0).numel, b->bucket_info(0).numel);
    EXPECT_GE(a->bucket_info(0).numel * 4, 256);
  });
}

// Records DDP's counters after every hook call.
class RecordingHooks final : public UnitHooks {
 public:
  explicit RecordingHooks(DistributedDataParallel* d) : d_(d) {}
  StatusOr<std::vector<Tensor>> PreForward(int u) override { return d_->PreForward(u); }
  Status PostForward(int u) override { return d_->PostForward(u); }
  StatusOr<UnitBackwardBuffers> PreBackward(int u) override {
    auto r = d_->PreBackward(u);
    log.push_back({"PreBackward", u, d_->counters().all_reduces});
    return r;
  }
  Status PostBackward(int u) override {
    Status s = d_->PostBackward(u);
    log.push_back({"PostBackward", u, d_->counters().all_reduces});
    return s;
  }
  struct Entry {
    std::string call;
    int unit;
    int64_t all_reduces_after;
  };
  std::vector<Entry> log;

 private:
  DistributedDataParallel* d_;
};

// A bucket's all-reduce is issued by the PostBackward that makes its last
// gradient final, so the first one goes out while earlier units are still to
// compute their gradients; one all-reduce per bucket per step.
TEST(DdpTest, EachBucketIsAllReducedOnceAsSoonAsItsGradientsAreFinal) {
  auto model = Tiny();
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    RecordingHooks hooks(ddp.get());
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank, 1), hooks, ddp->activation_allocator()).ok());
    for (const auto& e : hooks.log) {
      if (e.call != "PostBackward") continue;
      // Buckets all of whose units have finished their backward by now.
      int64_t ready = 0;
      for (int b = 0; b < ddp->num_buckets(); ++b) ready += ddp->bucket_info(b).lowest_unit >= e.unit;
      EXPECT_EQ(e.all_reduces_after, ready) << "after PostBackward(" << e.unit << ")";
    }
    // Before unit 0 computes its gradients, at least the first bucket is out.
    ASSERT_GT(ddp->bucket_info(0).lowest_unit, 0);
    bool checked = false;
    for (const auto& e : hooks.log) {
      if (e.call == "PreBackward" && e.unit == 0) {
        EXPECT_GE(e.all_reduces_after, 1);
        checked = true;
      }
    }
    EXPECT_TRUE(checked);
    int64_t overlapping = 0, bytes = 0;
    for (int b = 0; b < ddp->num_buckets(); ++b) {
      overlapping += ddp->bucket_info(b).lowest_unit > 0;
      bytes += ddp->bucket_info(b).numel * 4;
    }
    EXPECT_EQ(ddp->counters().all_reduces, ddp->num_buckets());
    EXPECT_EQ(ddp->counters().buckets_ready, ddp->num_buckets());
    EXPECT_EQ(ddp->counters().all_reduces_overlapping_backward, overlapping);
    EXPECT_EQ(ddp->counters().all_reduce_bytes, bytes);
    ASSERT_TRUE(ddp->FinishBackward().ok());
  });
}

// M micro-batches with gradient sync off for all but the last equal one
// batch M times larger (each micro-batch's loss is a mean, so the
// accumulated gradient is M times the large batch's), and only the last
// backward communicates.
TEST(DdpTest, NoSyncAccumulationEqualsOneLargerBatch) {
  auto model = Tiny();
  constexpr int kWorld = 2, kMicro = 3, kRows = 2;
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto a = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    for (int m = 0; m < kMicro; ++m) {
      a->set_gradient_sync(m == kMicro - 1);
      TokenBatch b = MakeBatch(0, (rank * kMicro + m) * kRows, kRows);
      ASSERT_TRUE(model->ForwardBackward(b, *a, a->activation_allocator()).ok());
      EXPECT_EQ(a->counters().all_reduces, m == kMicro - 1 ? a->num_buckets() : 0) << "micro-batch " << m;
    }
    ASSERT_TRUE(a->FinishBackward().ok());
    EXPECT_EQ(a->counters().buckets_ready, kMicro * a->num_buckets());
    auto b = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank * kMicro * kRows, kMicro * kRows), *b,
                                       b->activation_allocator()).ok());
    ASSERT_TRUE(b->FinishBackward().ok());
    for (int u = 0; u < a->num_units(); ++u) {
      for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
        const Tensor ga = a->grad(u, static_cast<int>(p)), gb = b->grad(u, static_cast<int>(p));
        for (int64_t i = 0; i < ga.numel(); ++i) {
          const float x = ga.data_as<float>()[i] / kMicro, y = gb.data_as<float>()[i];
          EXPECT_NEAR(x, y, 1e-5 * (1 + std::fabs(y))) << "unit " << u << " param " << p << " elem " << i;
        }
      }
    }
  });
}

// Forwards to DDP and notes when the first PreBackward returned.
class FirstPreBackwardClock final : public UnitHooks {
 public:
  explicit FirstPreBackwardClock(DistributedDataParallel* d) : d_(d) {}
  StatusOr<std::vector<Tensor>> PreForward(int u) override { return d_->PreForward(u); }
  Status PostForward(int u) override { return d_->PostForward(u); }
  StatusOr<UnitBackwardBuffers> PreBackward(int u) override {
    auto r = d_->PreBackward(u);
    if (!returned) returned = std::chrono::steady_clock::now();
    return r;
  }
  Status PostBackward(int u) override { return d_->PostBackward(u); }
  std::optional<std::chrono::steady_clock::time_point> returned;

 private:
  DistributedDataParallel* d_;
};

// Two synced backward passes without FinishBackward in between. Rank 1
// arrives late, so rank 0's first reductions are still in flight when its
// second backward begins: that backward must wait for them before adding into
// the same buckets (it cannot return from PreBackward before rank 1 has even
// started), and the result is the sum of both batches' averaged gradients.
TEST(DdpTest, SecondBackwardWaitsForInFlightReductionsAndAccumulates) {
  auto model = Tiny();
  constexpr int kWorld = 2;
  auto owned = *OwnedParameters::Create(model->units(), kSeed);
  ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 0, kWorld), *owned, HostAllocator::Default()).ok());
  ASSERT_TRUE(model->ForwardBackward(MakeBatch(1, 0, kWorld), *owned, HostAllocator::Default()).ok());
  std::atomic<int64_t> rank1_started{0};
  std::atomic<int64_t> rank0_second_pre_backward{0};
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      rank1_started = std::chrono::steady_clock::now().time_since_epoch().count();
    }
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank, 1), *ddp, ddp->activation_allocator()).ok());
    FirstPreBackwardClock clock(ddp.get());
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(1, rank, 1), clock, ddp->activation_allocator()).ok());
    if (rank == 0) rank0_second_pre_backward = clock.returned->time_since_epoch().count();
    ASSERT_TRUE(ddp->FinishBackward().ok());
    EXPECT_EQ(ddp->counters().all_reduces, 2 * ddp->num_buckets());
    for (int u = 0; u < ddp->num_units(); ++u) {
      for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
        const Tensor got = ddp->grad(u, static_cast<int>(p)), want = owned->grad(u, static_cast<int>(p));
        for (int64_t i = 0; i < got.numel(); ++i) {
          const float y = want.data_as<float>()[i];
          EXPECT_NEAR(got.data_as<float>()[i], y, 1e-5 * (1 + std::fabs(y)))
              << "unit " << u << " param " << p << " elem " << i;
        }
      }
    }
  });
  EXPECT_GE(rank0_second_pre_backward.load(), rank1_started.load());
}

TEST(DdpTest, ClipGradNormReturnsTheGlobalNormAndClipsToIt) {
  auto model = Tiny();
  constexpr int kWorld = 2, kRows = 1;
  auto owned = *OwnedParameters::Create(model->units(), kSeed);
  ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 0, kWorld * kRows), *owned, HostAllocator::Default()).ok());
  double sq = 0, mx = 0;
  for (const Tensor& g : owned->all_grads()) {
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double x = g.data_as<float>()[i];
      sq += x * x;
      mx = std::max(mx, std::fabs(x));
    }
  }
  const double want_l2 = std::sqrt(sq);
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank * kRows, kRows), *ddp, ddp->activation_allocator()).ok());
    StatusOr<double> inf = ddp->ClipGradNorm(0, NormType::kInf);
    ASSERT_TRUE(inf.ok()) << inf.status();
    EXPECT_NEAR(*inf, mx, 1e-5 * mx);
    StatusOr<double> l2 = ddp->ClipGradNorm(want_l2 / 2);
    ASSERT_TRUE(l2.ok()) << l2.status();
    EXPECT_NEAR(*l2, want_l2, 1e-5 * want_l2);
    StatusOr<double> after = ddp->ClipGradNorm(0);
    ASSERT_TRUE(after.ok());
    EXPECT_NEAR(*after, want_l2 / 2, 1e-4 * want_l2);
    EXPECT_EQ(ddp->ClipGradNorm(-1).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(ddp->ClipGradNorm(std::nan("")).status().code(), StatusCode::kInvalidArgument);
  });
}

// bf16 compute: the model gets bf16 parameters (rounded from the f32
// master), gradients stay f32 and match OwnedParameters in bf16 to f32
// rounding (the batch split changes no bf16 rounding), and after a step the
// copies are refreshed.
TEST(DdpTest, Bf16ComputeHandsTheModelBf16CopiesOfTheF32Master) {
  auto model = Tiny(DType::kBF16);
  constexpr int kWorld = 2;
  auto owned = *OwnedParameters::Create(model->units(), kSeed, DType::kBF16);
  ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 0, kWorld), *owned, HostAllocator::Default()).ok());
  RunRanks(kWorld, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    DdpOptions o = Options(kSmallBucket);
    o.compute_dtype = DType::kBF16;
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, o);
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, rank, 1), *ddp, ddp->activation_allocator()).ok());
    ASSERT_TRUE(ddp->FinishBackward().ok());
    double max_abs = 0;
    for (const Tensor& g : owned->all_grads()) {
      for (int64_t i = 0; i < g.numel(); ++i) max_abs = std::max(max_abs, std::fabs(double{g.data_as<float>()[i]}));
    }
    for (int u = 0; u < ddp->num_units(); ++u) {
      for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
        const Tensor got = ddp->grad(u, static_cast<int>(p)), want = owned->grad(u, static_cast<int>(p));
        ASSERT_EQ(got.dtype(), DType::kF32);
        for (int64_t i = 0; i < got.numel(); ++i) {
          const float y = want.data_as<float>()[i];
          EXPECT_NEAR(got.data_as<float>()[i], y, 1e-5 * (max_abs + std::fabs(y)))
              << "unit " << u << " param " << p << " elem " << i;
        }
      }
    }
    // After a step the model sees the updated master, rounded to bf16.
    auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
    ASSERT_TRUE(ddp->OptimizerStep(*opt).ok());
    auto views = ddp->PreForward(1);
    ASSERT_TRUE(views.ok()) << views.status();
    for (size_t p = 0; p < views->size(); ++p) {
      const Tensor& v = (*views)[p];
      ASSERT_EQ(v.dtype(), DType::kBF16);
      const Tensor master = ddp->param(1, static_cast<int>(p));
      std::vector<uint16_t> want(static_cast<size_t>(master.numel()));
      ASSERT_TRUE(ConvertElements(master.data(), DType::kF32, want.data(), DType::kBF16, want.size()).ok());
      EXPECT_EQ(0, std::memcmp(v.data(), want.data(), want.size() * 2)) << "param " << p;
    }
    ASSERT_TRUE(ddp->PostForward(1).ok());
  });
}

TEST(DdpTest, HookCallsOutOfOrderAreFailedPreconditionNamingUnitAndState) {
  auto model = Tiny();
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, Options(kSmallBucket));
    Status s = ddp->PostForward(1);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("'h.0'"), std::string::npos) << s;
    EXPECT_NE(s.message().find("idle"), std::string::npos) << s;
    EXPECT_EQ(ddp->PreBackward(0).status().code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(ddp->PreForward(0).ok());
    Status twice = ddp->PreForward(0).status();
    EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(twice.message().find("'forward'"), std::string::npos) << twice;
    EXPECT_EQ(ddp->PostBackward(0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(ddp->FinishBackward().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(ddp->PreForward(99).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(ddp->PostBackward(-1).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(ddp->PostForward(0).ok());
    // The protocol still works after the rejected calls.
    ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 0, 1), *ddp, ddp->activation_allocator()).ok());
    ASSERT_TRUE(ddp->FinishBackward().ok());

    // A backward stopped inside a bucket that spans units leaves it partly
    // final: FinishBackward refuses, and finishing the backward recovers.
    int spanning = -1;
    for (int b = 0; b < ddp->num_buckets() && spanning < 0; ++b) {
      if (ddp->bucket_info(b).lowest_unit < ddp->bucket_info(b).highest_unit) spanning = b;
    }
    ASSERT_GE(spanning, 0);
    const int stop = ddp->bucket_info(spanning).highest_unit;
    for (int u = 0; u < ddp->num_units(); ++u) {
      ASSERT_TRUE(ddp->PreForward(u).ok());
      ASSERT_TRUE(ddp->PostForward(u).ok());
    }
    for (int u = ddp->num_units() - 1; u >= stop; --u) {
      ASSERT_TRUE(ddp->PreBackward(u).ok());
      ASSERT_TRUE(ddp->PostBackward(u).ok());
    }
    Status fb = ddp->FinishBackward();
    EXPECT_EQ(fb.code(), StatusCode::kFailedPrecondition) << fb;
    EXPECT_NE(fb.message().find("bucket " + std::to_string(spanning) + " is partly final"),
              std::string::npos) << fb;
    for (int u = stop - 1; u >= 0; --u) {
      ASSERT_TRUE(ddp->PreBackward(u).ok());
      ASSERT_TRUE(ddp->PostBackward(u).ok());
    }
    EXPECT_TRUE(ddp->FinishBackward().ok());
  });
}

TEST(DdpTest, BadArgumentsAreInvalidArgumentNamingTheField) {
  auto model = Tiny();
  RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    auto expect_invalid = [&](DdpOptions o, const std::string& field) {
      Status s = DistributedDataParallel::Create(model->units(), world, &alloc, o).status();
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
      EXPECT_NE(s.message().find(field), std::string::npos) << s;
    };
    DdpOptions o = Options();
    o.bucket_bytes = 0;
    expect_invalid(o, "bucket_bytes");
    o = Options();
    o.first_bucket_bytes = -1;
    expect_invalid(o, "first_bucket_bytes");
    o = Options();
    o.compute_dtype = DType::kF16;
    expect_invalid(o, "compute_dtype");
    o = Options();
    o.gradient_predivide_factor = -1;
    expect_invalid(o, "gradient_predivide_factor");
    o = Options();
    o.timeout = Duration(0);
    expect_invalid(o, "timeout");
    EXPECT_EQ(DistributedDataParallel::Create(model->units(), nullptr, &alloc, Options()).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(DistributedDataParallel::Create(model->units(), world, nullptr, Options()).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(DistributedDataParallel::Create({}, world, &alloc, Options()).status().code(),
              StatusCode::kInvalidArgument);
    std::vector<UnitSpec> tied = model->units();
    tied[1].params.push_back(tied[1].params[0]);
    Status t = DistributedDataParallel::Create(tied, world, &alloc, Options()).status();
    EXPECT_EQ(t.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.message().find("declared by two units"), std::string::npos) << t;
  });
}

// A rank that stops taking part makes the others fail within the timeout;
// the failed step leaves parameters untouched and gradients zeroed, and the
// next step starts from idle (and fails the same way).
TEST(DdpTest, MissingPeerFailsTheStepWithinTheTimeoutAndLosesNothing) {
  auto model = Tiny();
  constexpr Duration kTimeout(300);
  RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    DdpOptions o = Options();
    o.timeout = kTimeout;
    auto ddp = *DistributedDataParallel::Create(model->units(), world, &alloc, o);
    if (rank == 1) return;  // never trains
    auto snapshot = [&] {
      std::vector<std::vector<float>> out;
      for (int u = 0; u < ddp->num_units(); ++u) {
        for (size_t p = 0; p < model->units()[u].params.size(); ++p) {
          Tensor t = ddp->param(u, static_cast<int>(p));
          out.emplace_back(t.data_as<float>(), t.data_as<float>() + t.numel());
        }
      }
      return out;
    };
    const auto before = snapshot();
    auto opt = *Optimizer::Create(testing::TestOptimizer(), &HostAllocator::Default());
    for (int attempt = 0; attempt < 2; ++attempt) {
      ASSERT_TRUE(model->ForwardBackward(MakeBatch(0, 0, 1), *ddp, ddp->activation_allocator()).ok());
      const auto start = std::chrono::steady_clock::now();
      Status s = ddp->OptimizerStep(*opt);
      const auto waited = std::chrono::steady_clock::now() - start;
      EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
      EXPECT_NE(s.message().find("bucket 0"), std::string::npos) << s;
      EXPECT_LT(waited, 10 * kTimeout) << "attempt " << attempt;
      EXPECT_EQ(before, snapshot()) << "attempt " << attempt;
      EXPECT_EQ(opt->step_count(0), 0);
      for (int u = 0; u < ddp->num_units(); ++u) {
        Tensor g = ddp->grad(u, 0);
        for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.data_as<float>()[i], 0.f);
      }
    }
  });
}

}  // namespace
}  // namespace sk
