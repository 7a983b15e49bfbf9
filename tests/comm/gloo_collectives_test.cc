// The gloo backend (ranks as threads over loopback TCP) against the serial
// reference: every op x dtype x size (0, 1, odd) at world sizes 1, 2, 3, 4, 8,
// on one context per world size (many collectives in a row), plus faults.
#include "runtime/comm/gloo_backend.h"
#include "tests/comm/conformance.h"
#include "tests/comm/gloo_world.h"

namespace sk::comm {
namespace {

using namespace std::chrono_literals;
using testing::GlooWorld;
using testing::OpCase;

bool Contains(const Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

class GlooCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectiveTest, EveryOpAndDtypeMatchesSerialReferenceBitForBit) {
  GlooWorld world(GetParam());
  for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,
                              CollectiveKind::kBarrier}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t n : {0, 1, 1001}) {
        testing::CheckOnAllRanks(world.groups, OpCase{kind, dtype, n, {}});
      }
    }
  }
  ReduceOptions scaled;
  scaled.op = ReduceOp::kAvg;
  scaled.pre_scale = 0.25f;
  scaled.post_scale = 2.0f;
  testing::CheckOnAllRanks(world.groups, OpCase{CollectiveKind::kReduceScatter, DType::kBF16, 77, scaled});
  testing::CheckOnAllRanks(world.groups, OpCase{CollectiveKind::kAllReduce, DType::kF32, 77, scaled});
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCollectiveTest, ::testing::Values(1, 2, 3, 4, 8));

TEST(GlooProcessGroup, LargeReduceScatterAndAllGather) {
  GlooWorld world(2);
  testing::CheckOnAllRanks(world.groups, OpCase{CollectiveKind::kReduceScatter, DType::kF32, 1 << 20, {}});
  testing::CheckOnAllRanks(world.groups, OpCase{CollectiveKind::kAllGather, DType::kBF16, 1 << 20, {}});
}

TEST(GlooProcessGroup, MissingRankMakesOthersFailWithinTheTimeout) {
  GlooWorld world(3);
  std::vector<Status> results(2);
  auto start = std::chrono::steady_clock::now();
  testing::RunRanks(2, [&](int r) {
    auto stream = testing::MakeStream(r, "comm");
    Tensor in = testing::MakeTensor(r, DType::kF32, 4);
    Tensor out = testing::MakeTensor(r, DType::kF32, 12);
    auto work = world.groups[r]->all_gather(out, in, *stream, CollectiveOptions{300ms});
    ASSERT_TRUE(work.ok());
    results[r] = (*work)->wait(20s);
    // The context is broken for good: the next call fails at once, naming why.
    auto next = world.groups[r]->barrier(*stream, CollectiveOptions{300ms});
    ASSERT_TRUE(next.ok());
    Status s = (*next)->wait(20s);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
    EXPECT_TRUE(Contains(s, "failed earlier")) << s;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  for (const Status& s : results) {
    EXPECT_TRUE(s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kUnavailable)
        << s;
    EXPECT_TRUE(Contains(s, "all_gather #0")) << s;
  }
}

TEST(GlooProcessGroup, TheProcessFormsANewGroupAfterAFailedOne) {
  {
    GlooWorld failed(2);
    auto stream = testing::MakeStream(0, "comm");
    auto work = failed.groups[0]->barrier(*stream, CollectiveOptions{200ms});  // rank 1 never comes
    ASSERT_TRUE(work.ok());
    EXPECT_FALSE((*work)->wait(20s).ok());
  }
  GlooWorld fresh(2);
  testing::CheckOnAllRanks(fresh.groups, OpCase{CollectiveKind::kReduceScatter, DType::kF32, 9, {}});
}

TEST(GlooProcessGroup, DesyncCheckNamesBothRanksCalls) {
  GlooOptions options;
  options.check_desync = true;
  GlooWorld world(2, options);
  std::vector<Status> results(2);
  testing::RunRanks(2, [&](int r) {
    auto stream = testing::MakeStream(r, "comm");
    Tensor in = testing::MakeTensor(r, DType::kF16, r == 0 ? 6 : 8);
    Tensor out = testing::MakeTensor(r, DType::kF16, in.numel() / 2);
    auto work = world.groups[r]->reduce_scatter(out, in, *stream);
    ASSERT_TRUE(work.ok());
    results[r] = (*work)->wait(20s);
    // A desync is the caller's error, not the transport's: the group still works.
    testing::CheckOnRank(*world.groups[r], OpCase{CollectiveKind::kAllReduce, DType::kF32, 5, {}});
  });
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(Contains(s, "rank 0 called reduce_scatter #0 (f16 6 -> 3, sum)")) << s;
    EXPECT_TRUE(Contains(s, "rank 1 called reduce_scatter #0 (f16 8 -> 4, sum)")) << s;
  }
}

TEST(GlooProcessGroup, SubGroupsFromNewGroup) {
  GlooWorld world(4);
  testing::RunRanks(4, [&](int r) {
    std::vector<int> members = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    auto sub = world.groups[r]->NewGroup(members, 20s);
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ((*sub)->rank(), r % 2);
    auto stream = testing::MakeStream(r, "comm");
    Tensor t = testing::MakeTensor(r, DType::kF32, 1);
    StoreFromFloat(t.data(), DType::kF32, 0, static_cast<float>(r));
    auto work = (*sub)->all_reduce(t, *stream);
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE((*work)->wait(20s).ok());
    EXPECT_EQ(testing::Values(t)[0], r < 2 ? 1.0f : 5.0f);
    // Sub-group members destroy together (final barrier): sync via the parent.
    sub->reset();
  });
}

TEST(TcpStore, SetGetAddAndTimeouts) {
  auto server = TcpStore::Create("127.0.0.1", 0, true, 5s);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = TcpStore::Create("localhost", (*server)->port(), false, 5s);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*server)->Set("k", std::string("v\0w", 3)).ok());
  auto v = (*client)->Get("k", 1s);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, std::string("v\0w", 3));
  EXPECT_EQ(*(*client)->Add("n", 5), 5);
  EXPECT_EQ(*(*server)->Add("n", -2), 3);
  auto missing = (*client)->Get("absent", 100ms);
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(missing.status(), "'absent'")) << missing.status();
  // A Get waits for a later Set from another client.
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE((*server)->Set("late", "x").ok());
  });
  auto late = (*client)->Get("late", 10s);
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "x");
}

TEST(TcpStore, UnreachableStoreIsDeadlineExceeded) {
  int port;
  {
    auto server = TcpStore::Create("127.0.0.1", 0, true, 5s);
    ASSERT_TRUE(server.ok());
    port = (*server)->port();
  }  // closed again
  auto client = TcpStore::Create("127.0.0.1", port, false, 200ms);
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded) << client.status();
  EXPECT_EQ(TcpStore::Create("127.0.0.1", 70000, false, 1s).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DistributedEnv, ReadsTorchrunVariablesAndNamesWhatIsMissing) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "29501", 1);
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
  auto env = DistributedEnv::FromEnvironment();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29501);
  setenv("RANK", "4", 1);
  EXPECT_TRUE(Contains(DistributedEnv::FromEnvironment().status(), "RANK=4 is not below WORLD_SIZE=4"));
  setenv("RANK", "x", 1);
  EXPECT_TRUE(Contains(DistributedEnv::FromEnvironment().status(), "RANK='x'"));
  unsetenv("RANK");
  EXPECT_TRUE(Contains(DistributedEnv::FromEnvironment().status(), "RANK is not set"));
}

}  // namespace
}  // namespace sk::comm
