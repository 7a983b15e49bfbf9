// LocalSession: N trainers as threads of one process, as the C ABI's
// sk_local_session and the benchmarks drive them.
#include "runtime/train/local_session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"

namespace sk {
namespace {

TrainerOptions Tiny() {
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 2;
  o.data_tokens = 96;
  o.optimizer.lr = 3e-3f;
  o.fsdp.timeout = Duration(60'000);
  return o;
}

std::vector<std::shared_ptr<comm::ProcessGroup>> LocalWorld(int n) {
  auto groups = comm::LocalProcessGroup::Create(n);
  EXPECT_TRUE(groups.ok()) << groups.status();
  return LocalSession::Share(std::move(*groups));
}

std::unique_ptr<LocalSession> MakeSession(const TrainerOptions& o, int n) {
  auto s = LocalSession::Create(o, LocalWorld(n));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// The session is N hand-made trainers, one per rank thread: the same
// options step to the same losses, bit for bit, on every rank.
TEST(LocalSessionTest, StepsExactlyAsOneTrainerPerRankThread) {
  constexpr int kWorld = 2, kSteps = 3;
  const TrainerOptions o = Tiny();
  std::vector<std::vector<float>> by_hand(kWorld);
  ASSERT_TRUE(comm::RunLocalRanks(kWorld, [&](int r, comm::ProcessGroup* g) -> Status {
                SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, g));
                for (int i = 0; i < kSteps; ++i) {
                  SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
                  by_hand[r].push_back(m.loss);
                }
                return OkStatus();
              }).ok());

  std::unique_ptr<LocalSession> s = MakeSession(o, kWorld);
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->world_size(), kWorld);
  EXPECT_TRUE(s->last_metrics().empty());
  for (int i = 0; i < kSteps; ++i) {
    StatusOr<std::vector<StepMetrics>> m = s->Step();
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->size(), static_cast<size_t>(kWorld));
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ((*m)[r].loss, by_hand[r][i]) << "rank " << r << " step " << i;
      EXPECT_EQ((*m)[r].step, i + 1);
      EXPECT_EQ(s->last_metrics()[r].loss, (*m)[r].loss);
    }
  }
  EXPECT_EQ(s->steps(), kSteps);
  EXPECT_EQ(s->trainer(1).rank(), 1);
  EXPECT_EQ(s->group(1).rank(), 1);
}

TEST(LocalSessionTest, InvalidOptionsFailBeforeAnyRankStarts) {
  TrainerOptions o = Tiny();
  o.batch_size = 0;
  auto s = LocalSession::Create(o, LocalWorld(2));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("batch_size"), std::string::npos) << s.status();

  auto none = LocalSession::Create(Tiny(), {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);

  o = Tiny();
  o.model = "no-such-model";
  auto unknown = LocalSession::Create(o, LocalWorld(2));
  EXPECT_FALSE(unknown.ok());
}

// A creation that runs out of memory reports every rank's status and
// allocator statistics, as a harness recording the OOM needs them.
TEST(LocalSessionTest, FailedCreationReportsEachRanksStatusAndMemory) {
  TrainerOptions o = Tiny();
  o.memory_cap_bytes = 4096;  // far below gpt-tiny's shards
  std::vector<Status> per_rank;
  std::vector<MemoryStats> memory;
  auto s = LocalSession::Create(o, LocalWorld(2), &per_rank, &memory);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status();
  ASSERT_EQ(per_rank.size(), 2u);
  ASSERT_EQ(memory.size(), 2u);
  int64_t ooms = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(per_rank[r].ok()) << "rank " << r;
    ooms += memory[r].num_ooms;
  }
  EXPECT_GT(ooms, 0);

  o = Tiny();
  o.batch_size = 0;
  s = LocalSession::Create(o, LocalWorld(2), &per_rank, &memory);
  ASSERT_FALSE(s.ok());
  ASSERT_EQ(per_rank.size(), 2u);
  EXPECT_EQ(per_rank[1].code(), StatusCode::kInvalidArgument);
}

TEST(LocalSessionTest, BadLearningRateChangesNoRank) {
  std::unique_ptr<LocalSession> s = MakeSession(Tiny(), 2);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->SetLr(0.25f).ok());
  Status bad = s->SetLr(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad;
  EXPECT_EQ(s->SetLr(-1.0f).code(), StatusCode::kInvalidArgument);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(s->trainer(r).lr(), 0.25f) << "rank " << r;
}

// Evaluate is every rank's loss, averaged in rank order.
TEST(LocalSessionTest, EvaluateIsTheMeanOfTheRanksLosses) {
  std::unique_ptr<LocalSession> s = MakeSession(Tiny(), 2);
  ASSERT_NE(s, nullptr);
  std::vector<float> each(2);
  ASSERT_TRUE(s->OnEveryRank([&](int r, Trainer& t) -> Status {
                 SK_ASSIGN_OR_RETURN(each[r], t.Evaluate(2));
                 return OkStatus();
               }).ok());
  StatusOr<float> mean = s->Evaluate(2);
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ(*mean, static_cast<float>((static_cast<double>(each[0]) + each[1]) / 2));
}

// A rank's failure is the session's, naming the lowest failing rank, and
// per_rank has every rank's status.
TEST(LocalSessionTest, AFailingRankIsReportedByRank) {
  std::unique_ptr<LocalSession> s = MakeSession(Tiny(), 2);
  ASSERT_NE(s, nullptr);
  std::vector<Status> per_rank;
  Status st = s->OnEveryRank(
      [](int r, Trainer&) -> Status {
        return r == 1 ? InvalidArgumentError("rank one refuses") : OkStatus();
      },
      &per_rank);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.ToString().find("rank 1"), std::string::npos) << st;
  ASSERT_EQ(per_rank.size(), 2u);
  EXPECT_TRUE(per_rank[0].ok());
  EXPECT_FALSE(per_rank[1].ok());

  const std::string missing = ::testing::TempDir() + "/local_session_no_checkpoint";
  std::filesystem::remove_all(missing);
  EXPECT_FALSE(s->LoadCheckpoint(missing).ok());
}

// A checkpoint saved by the session restores every rank's step count and
// the next step's losses.
TEST(LocalSessionTest, CheckpointRestoresTheSession) {
  const std::string dir = ::testing::TempDir() + "/local_session_ckpt";
  std::filesystem::remove_all(dir);
  std::unique_ptr<LocalSession> a = MakeSession(Tiny(), 2);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->Step().ok());
  ASSERT_TRUE(a->SaveCheckpoint(dir).ok());
  StatusOr<std::vector<StepMetrics>> next = a->Step();
  ASSERT_TRUE(next.ok()) << next.status();

  std::unique_ptr<LocalSession> b = MakeSession(Tiny(), 2);
  ASSERT_NE(b, nullptr);
  Status loaded = b->LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ(b->steps(), 1);
  StatusOr<std::vector<StepMetrics>> again = b->Step();
  ASSERT_TRUE(again.ok()) << again.status();
  for (int r = 0; r < 2; ++r) EXPECT_EQ((*again)[r].loss, (*next)[r].loss) << "rank " << r;
}

}  // namespace
}  // namespace sk
