// The local backend's stream-ordered mode (local_backend.h), which ranks
// sharing one GPU use, run here on CPU streams (LocalOptions::stream_ordered):
// the same conformance as the host-closure mode, plus what is particular to
// it (the rendezvous blocks the calling thread; later work on every rank's
// stream waits for every rank's copies). local_cuda_test.cc runs the same
// conformance on a GPU. Also checks reduce.h's per-element arithmetic, which
// the GPU reduction runs, against the CPU reduction.
#include <atomic>
#include <chrono>
#include <tuple>

#include "runtime/comm/local_backend.h"
#include "runtime/comm/reduce.h"
#include "tests/comm/conformance.h"

namespace sk::comm {
namespace {

using namespace std::chrono_literals;
using testing::Contains;
using testing::FillRank;
using testing::CheckOnAllRanks;
using testing::InputValue;
using testing::MakeStream;
using testing::MakeTensor;
using testing::OpCase;
using testing::RunRanks;
using testing::Values;

std::vector<std::unique_ptr<ProcessGroup>> OrderedGroup(int world) {
  LocalOptions options;
  options.stream_ordered = true;
  auto groups = LocalProcessGroup::Create(world, options);
  CHECK(groups.ok()) << groups.status();
  return std::move(groups).value();
}

using Param = std::tuple<CollectiveKind, DType, int, int64_t>;
class StreamOrderedCollectiveTest : public ::testing::TestWithParam<Param> {};

TEST_P(StreamOrderedCollectiveTest, MatchesSerialReferenceBitForBit) {
  auto [kind, dtype, world, n] = GetParam();
  CheckOnAllRanks(OrderedGroup(world), OpCase{kind, dtype, n, {}});
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, StreamOrderedCollectiveTest,
    ::testing::Combine(::testing::Values(CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                         CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                                         CollectiveKind::kBarrier),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(1, 2, 3, 4), ::testing::Values(0, 1, 1001)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::string(CollectiveName(std::get<0>(info.param))) + "_" +
             std::string(DTypeName(std::get<1>(info.param))) + "_world" +
             std::to_string(std::get<2>(info.param)) + "_n" + std::to_string(std::get<3>(info.param));
    });

TEST(StreamOrderedLocal, AvgWithPreAndPostScale) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    ReduceOptions opts;
    opts.op = ReduceOp::kAvg;
    opts.pre_scale = 0.5f;
    opts.post_scale = 3.0f;
    CheckOnAllRanks(OrderedGroup(3), OpCase{CollectiveKind::kReduceScatter, dtype, 777, opts});
    CheckOnAllRanks(OrderedGroup(4), OpCase{CollectiveKind::kAllReduce, dtype, 777, opts});
  }
}

TEST(StreamOrderedLocal, CoalescedCallsAndTwoStreams) {
  constexpr int kWorld = 3;
  auto groups = OrderedGroup(kWorld);
  RunRanks(kWorld, [&](int r) {
    auto ag_stream = MakeStream(r, "all-gather");
    auto rs_stream = MakeStream(r, "reduce-scatter");
    std::vector<Tensor> ins = {MakeTensor(r, DType::kF32, 3), MakeTensor(r, DType::kBF16, 5)};
    std::vector<Tensor> outs = {MakeTensor(r, DType::kF32, 9), MakeTensor(r, DType::kBF16, 15)};
    for (auto& t : ins) FillRank(t, r);
    auto ag = groups[r]->all_gather_coalesced(outs, ins, *ag_stream);
    ASSERT_TRUE(ag.ok()) << ag.status();
    // The reduce-scatter stream reads the gathered buffers: it waits for them.
    ASSERT_TRUE(rs_stream->WaitEvent((*ag)->event()).ok());
    std::vector<Tensor> rs_out = {MakeTensor(r, DType::kF32, 3), MakeTensor(r, DType::kBF16, 5)};
    auto rs = groups[r]->reduce_scatter_coalesced(rs_out, outs, *rs_stream);
    ASSERT_TRUE(rs.ok()) << rs.status();
    ASSERT_TRUE((*rs)->wait(10s).ok());
    ASSERT_TRUE((*ag)->wait(10s).ok());
    for (size_t e = 0; e < 2; ++e) {
      std::vector<float> gathered = Values(outs[e]);
      const int64_t n = ins[e].numel();
      for (int64_t i = 0; i < n * kWorld; ++i) {
        EXPECT_EQ(gathered[i], InputValue(ins[e].dtype(), static_cast<int>(i / n), i % n));
      }
      // Every rank gathered the same buffer, so the sum is kWorld times it.
      std::vector<float> reduced = Values(rs_out[e]);
      for (int64_t i = 0; i < n; ++i) {
        std::vector<float> per_rank(kWorld, gathered[r * n + i]);
        EXPECT_EQ(reduced[i], testing::ReferenceReduce(per_rank, ins[e].dtype(), ReduceOp::kSum,
                                                       1.0f, 1.0f));
      }
    }
  });
}

// The rendezvous is on the calling thread: a missing rank makes the call
// return (after the timeout) a failed Work naming the collective and the
// rank, and the failure is the stream's sticky error, as in host-closure mode.
TEST(StreamOrderedLocal, MissingRankFailsTheCallWithDeadlineExceeded) {
  auto groups = OrderedGroup(3);
  std::vector<Status> results(2);
  RunRanks(2, [&](int r) {  // rank 2 never calls
    auto stream = MakeStream(r, "comm");
    Tensor in = MakeTensor(r, DType::kF32, 4);
    Tensor out = MakeTensor(r, DType::kF32, 12);
    auto work = groups[r]->all_gather(out, in, *stream, CollectiveOptions{200ms});
    ASSERT_TRUE(work.ok()) << work.status();
    results[r] = (*work)->wait(10s);
    EXPECT_EQ(stream->Synchronize(10s).code(), StatusCode::kDeadlineExceeded);
  });
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(Contains(s, "all_gather #0")) << s;
    EXPECT_TRUE(Contains(s, "rank 2 did not arrive within 200 ms")) << s;
  }
  // The late rank fails at once; the next collective works for everyone.
  RunRanks(3, [&](int r) {
    auto stream = MakeStream(r, "comm");
    if (r == 2) {
      Tensor in = MakeTensor(r, DType::kF32, 4);
      Tensor out = MakeTensor(r, DType::kF32, 12);
      auto late = groups[r]->all_gather(out, in, *stream);
      ASSERT_TRUE(late.ok()) << late.status();
      EXPECT_EQ((*late)->wait(10s).code(), StatusCode::kAborted);
    }
    testing::CheckOnRank(*groups[r], OpCase{CollectiveKind::kAllReduce, DType::kF32, 33, {}});
  });
}

TEST(StreamOrderedLocal, MismatchedCallsAreInvalidArgumentNamingBothRanks) {
  auto groups = OrderedGroup(2);
  std::vector<Status> results(2);
  RunRanks(2, [&](int r) {
    auto stream = MakeStream(r, "comm");
    Tensor t = MakeTensor(r, DType::kBF16, 4);
    auto work = r == 0 ? groups[r]->all_reduce(t, *stream) : groups[r]->broadcast(t, *stream);
    ASSERT_TRUE(work.ok()) << work.status();
    results[r] = (*work)->wait(10s);
  });
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Contains(s, "rank 0 called all_reduce #0 (bf16 4, sum)")) << s;
    EXPECT_TRUE(Contains(s, "rank 1 called broadcast #0 (bf16 4, root 0)")) << s;
  }
}

// Departure: work a rank enqueues after a collective waits until every rank
// has finished copying, so it may overwrite its buffers at once. Rank 0's
// stream is held back; rank 1's later work must not run before it is released.
TEST(StreamOrderedLocal, LaterWorkWaitsForEveryRanksCopies) {
  auto groups = OrderedGroup(2);
  std::atomic<bool> release{false};
  std::atomic<bool> later_ran{false};
  RunRanks(2, [&](int r) {
    auto stream = MakeStream(r, "comm");
    if (r == 0) {
      ASSERT_TRUE(stream->Enqueue([&]() -> Status {
        while (!release.load()) std::this_thread::yield();
        return OkStatus();
      }).ok());
    }
    Tensor in = MakeTensor(r, DType::kF32, 4);
    FillRank(in, r);
    Tensor out = MakeTensor(r, DType::kF32, 8);
    auto work = groups[r]->all_gather(out, in, *stream);
    ASSERT_TRUE(work.ok()) << work.status();
    if (r == 1) {
      ASSERT_TRUE(stream->Enqueue([&]() -> Status {
        later_ran.store(true);
        return OkStatus();
      }).ok());
      std::this_thread::sleep_for(100ms);
      EXPECT_FALSE(later_ran.load());
      EXPECT_FALSE((*work)->is_completed());
      release.store(true);
    }
    ASSERT_TRUE((*work)->wait(10s).ok());
    ASSERT_TRUE(stream->Synchronize(10s).ok());
    std::vector<float> got = Values(out);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], InputValue(DType::kF32, i / 4, i % 4));
  });
  EXPECT_TRUE(later_ran.load());
}

// reduce.h's per-element function (what the CUDA kernel runs) gives the bits
// of the CPU reduction, for every dtype and scaling.
TEST(ReduceElement, MatchesReduceInRankOrder) {
  constexpr int kRanks = 5;
  constexpr size_t kCount = 3001;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (float pre : {1.0f, 0.37f}) {
      for (float divisor : {1.0f, 5.0f}) {
        for (float post : {1.0f, 1.7f}) {
          std::vector<std::vector<char>> bufs(kRanks, std::vector<char>(kCount * DTypeSize(dtype)));
          std::vector<const void*> srcs;
          for (int j = 0; j < kRanks; ++j) {
            for (size_t i = 0; i < kCount; ++i) {
              StoreFromFloat(bufs[j].data(), dtype, i, InputValue(dtype, j, i));
            }
            srcs.push_back(bufs[j].data());
          }
          std::vector<char> want(kCount * DTypeSize(dtype));
          ReduceInRankOrder(srcs.data(), kRanks, dtype, kCount, pre, divisor, post, want.data());
          for (size_t i = 0; i < kCount; ++i) {
            float v = ReduceElement(
                [&](int j) { return LoadAsFloat(srcs[j], dtype, i); }, kRanks, pre, divisor, post);
            std::vector<char> got(DTypeSize(dtype));
            StoreFromFloat(got.data(), dtype, 0, v);
            ASSERT_EQ(std::memcmp(got.data(), want.data() + i * DTypeSize(dtype), got.size()), 0)
                << DTypeName(dtype) << " element " << i << " pre " << pre << " divisor "
                << divisor << " post " << post;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace sk::comm
