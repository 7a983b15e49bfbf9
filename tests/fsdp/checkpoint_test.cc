// Checkpoints: a run saved at world 4 and resumed at another world size,
// strategy or through a full state dict continues exactly as if it had never
// stopped; damaged or mismatched checkpoints fail cleanly and change nothing;
// a failed save leaves the previous checkpoint in place.
#include "runtime/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "runtime/checkpoint/safetensors.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

namespace fs = std::filesystem;
using testing::ExpectRelClose;
using testing::MakeBatch;
using testing::RunRanks;

constexpr int kGlobalRows = 4;  // divisible by every world size used here
constexpr int kSaveStep = 3;
constexpr int kTotalSteps = 6;
constexpr uint64_t kSeed = 1234;
constexpr uint64_t kOtherSeed = 999;  // a resumed run starts from other weights: the load must matter

struct RunSetup {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int world = 4;
  int shard_group = 0;  // hybrid only
  uint64_t seed = kSeed;
};

// One rank's FSDP model and optimizer.
struct RankState {
  std::unique_ptr<CachingAllocator> alloc;
  std::unique_ptr<FullyShardedModel> fsdp;
  std::unique_ptr<Optimizer> opt;
  TrainingState state;

  ~RankState() {
    opt.reset();
    fsdp.reset();
  }
};

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/ckpt-" + std::to_string(::getpid()) + "-" + name;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  return dir;
}

// Runs `body(rank, state)` on every rank of a fresh FSDP model under `setup`.
void RunModel(const GptModel& model, const RunSetup& setup, const OptimizerOptions& opt_options,
              const std::function<void(int, RankState&)>& body) {
  RunRanks(setup.world, [&](int rank, comm::ProcessGroup* world) {
    RankState r;
    r.alloc = std::make_unique<CachingAllocator>(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o;
    o.strategy = setup.strategy;
    o.shard_group_size = setup.shard_group;
    o.seed = setup.seed;
    o.timeout = Duration(60'000);
    auto fsdp = FullyShardedModel::Create(model.units(), world, r.alloc.get(), o);
    ASSERT_TRUE(fsdp.ok()) << fsdp.status();
    r.fsdp = std::move(*fsdp);
    r.opt = *Optimizer::Create(opt_options, &HostAllocator::Default());
    r.state = TrainingState{"gpt-test", &model.units(), r.fsdp.get(), r.opt.get()};
    body(rank, r);
  });
}

// Trains steps [first, last) on this rank's rows of each global batch;
// returns the rank's losses.
std::vector<float> TrainSteps(const GptModel& model, RankState& r, int rank, int world, int first, int last) {
  std::vector<float> losses;
  const int rows = kGlobalRows / world;
  for (int s = first; s < last; ++s) {
    r.fsdp->ZeroGrad();
    StatusOr<float> loss =
        model.ForwardBackward(MakeBatch(s, rank * rows, rows), *r.fsdp, r.fsdp->activation_allocator());
    EXPECT_TRUE(loss.ok()) << loss.status();
    if (!loss.ok()) return losses;
    EXPECT_TRUE(r.fsdp->OptimizerStep(*r.opt).ok());
    losses.push_back(*loss);
  }
  return losses;
}

// Global losses (mean over ranks) of steps [first, last) under `setup`, after
// `prepare` (a checkpoint load, say) and before `finish` (a save).
std::vector<float> TrainRun(const GptModel& model, const RunSetup& setup, int first, int last,
                            const std::function<void(int, RankState&)>& prepare = {},
                            const std::function<void(int, RankState&)>& finish = {}) {
  std::mutex mu;
  std::vector<std::vector<float>> per_rank(setup.world);
  RunModel(model, setup, testing::TestOptimizer(), [&](int rank, RankState& r) {
    if (prepare) prepare(rank, r);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<float> l = TrainSteps(model, r, rank, setup.world, first, last);
    if (finish) finish(rank, r);
    std::lock_guard<std::mutex> lock(mu);
    per_rank[rank] = std::move(l);
  });
  std::vector<float> mean(last - first, 0.f);
  for (int s = 0; s < last - first; ++s) {
    double sum = 0;
    for (int r = 0; r < setup.world; ++r)
      sum += per_rank[r].size() > static_cast<size_t>(s) ? per_rank[r][s] : NAN;
    mean[s] = static_cast<float>(sum / setup.world);
  }
  return mean;
}

// Master shards and optimizer state of one rank, to prove a failed load changed nothing.
struct Snapshot {
  std::vector<std::vector<float>> values;
  static Snapshot Of(const RankState& r) {
    Snapshot s;
    for (int u = 0; u < r.fsdp->num_units(); ++u) {
      const Tensor& m = r.fsdp->master_shard(u);
      s.values.emplace_back(m.data_as<float>(), m.data_as<float>() + m.numel());
      for (const std::string& name : r.opt->StateNames()) {
        StatusOr<Tensor> t = r.opt->State(u, name);
        if (t.ok()) s.values.emplace_back(t->data_as<float>(), t->data_as<float>() + t->numel());
      }
      s.values.push_back({static_cast<float>(r.opt->step_count(u))});
    }
    return s;
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = *GptModel::Create(testing::TinyGpt()); }

  // Trains kSaveStep steps (at world 4 FULL_SHARD unless told) and saves a
  // sharded checkpoint to `dir`.
  void SaveAtStep3(const std::string& dir, RunSetup setup = {}) {
    TrainRun(*model_, setup, 0, kSaveStep, {}, [&](int, RankState& r) {
      Status s = SaveShardedCheckpoint(dir, r.state, kSaveStep);
      ASSERT_TRUE(s.ok()) << s;
    });
  }

  // A world-2 FULL_SHARD model trained one step (so its optimizer has
  // state); `body` tries something that must fail, and the model must be
  // untouched afterwards.
  void ExpectLoadFailsUntouched(const std::function<Status(RankState&)>& load, StatusCode code,
                                const std::string& message_part) {
    RunSetup s;
    s.world = 2;
    s.seed = kOtherSeed;
    RunModel(*model_, s, testing::TestOptimizer(), [&](int rank, RankState& r) {
      TrainSteps(*model_, r, rank, 2, 0, 1);
      Snapshot before = Snapshot::Of(r);
      Status st = load(r);
      EXPECT_EQ(st.code(), code) << "rank " << rank << ": " << st;
      EXPECT_NE(st.message().find(message_part), std::string::npos)
          << "rank " << rank << ": '" << st.message() << "' does not mention '" << message_part << "'";
      Snapshot after = Snapshot::Of(r);
      EXPECT_EQ(before.values, after.values) << "rank " << rank << ": a failed load changed the model";
    });
  }

  std::unique_ptr<GptModel> model_;
};

void ExpectLossesMatch(const std::vector<float>& got, const std::vector<float>& want, int first_step,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectRelClose(got[i], want[i], 1e-5, what + ": loss at step " + std::to_string(first_step + i));
  }
}

TEST_F(CheckpointTest, ShardedCheckpointFromWorld4ResumesExactlyAtAnyWorldSizeAndStrategy) {
  const std::vector<float> uninterrupted = TrainRun(*model_, RunSetup{}, 0, kTotalSteps);
  const std::string dir = TempDir("resume") + "/ckpt";
  SaveAtStep3(dir);
  const std::vector<float> want(uninterrupted.begin() + kSaveStep, uninterrupted.end());

  const std::vector<RunSetup> resumes = {
      {ShardingStrategy::kFullShard, 4, 0, kOtherSeed},   {ShardingStrategy::kFullShard, 2, 0, kOtherSeed},
      {ShardingStrategy::kFullShard, 1, 0, kOtherSeed},   {ShardingStrategy::kShardGradOp, 2, 0, kOtherSeed},
      {ShardingStrategy::kShardOptim, 2, 0, kOtherSeed},  {ShardingStrategy::kNoShard, 2, 0, kOtherSeed},
      {ShardingStrategy::kHybridShard, 4, 2, kOtherSeed},
  };
  for (const RunSetup& s : resumes) {
    const std::string what =
        std::string(ShardingStrategyName(s.strategy)) + " at world " + std::to_string(s.world);
    std::vector<float> got = TrainRun(*model_, s, kSaveStep, kTotalSteps, [&](int, RankState& r) {
      StatusOr<int64_t> step = LoadShardedCheckpoint(dir, r.state);
      ASSERT_TRUE(step.ok()) << what << ": " << step.status();
      EXPECT_EQ(*step, kSaveStep);
      for (int u = 0; u < r.fsdp->num_units(); ++u) EXPECT_EQ(r.opt->step_count(u), kSaveStep);
    });
    ExpectLossesMatch(got, want, kSaveStep, what);
  }
}

TEST_F(CheckpointTest, HybridCheckpointWritesOneReplicaAndResumesAtWorld1) {
  RunSetup hybrid{ShardingStrategy::kHybridShard, 4, 2, kSeed};
  const std::vector<float> uninterrupted = TrainRun(*model_, hybrid, 0, kTotalSteps);
  const std::string dir = TempDir("hybrid") + "/ckpt";
  SaveAtStep3(dir, hybrid);

  StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
  ASSERT_TRUE(ix.ok()) << ix.status();
  EXPECT_EQ(ix->world_size, 4);
  EXPECT_EQ(ix->shard_group_size, 2);
  EXPECT_EQ(ix->strategy, "HYBRID_SHARD");
  EXPECT_EQ(ix->files.size(), 2u);
  EXPECT_FALSE(fs::exists(dir + "/rank-00002.safetensors"));

  std::vector<float> got = TrainRun(*model_, RunSetup{ShardingStrategy::kFullShard, 1, 0, kOtherSeed},
                                    kSaveStep, kTotalSteps, [&](int, RankState& r) {
                                      StatusOr<int64_t> step = LoadShardedCheckpoint(dir, r.state);
                                      ASSERT_TRUE(step.ok()) << step.status();
                                    });
  ExpectLossesMatch(got, std::vector<float>(uninterrupted.begin() + kSaveStep, uninterrupted.end()),
                    kSaveStep, "hybrid 2x2 -> world 1");
}

TEST_F(CheckpointTest, IndexDescribesTheRunAndEveryFile) {
  const std::string dir = TempDir("index") + "/ckpt";
  SaveAtStep3(dir);
  StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
  ASSERT_TRUE(ix.ok()) << ix.status();
  EXPECT_EQ(ix->format_version, kCheckpointFormatVersion);
  EXPECT_EQ(ix->model, "gpt-test");
  EXPECT_EQ(ix->world_size, 4);
  EXPECT_EQ(ix->shard_group_size, 4);
  EXPECT_EQ(ix->strategy, "FULL_SHARD");
  EXPECT_EQ(ix->step, kSaveStep);
  EXPECT_TRUE(ix->has_optimizer);
  EXPECT_EQ(ix->optimizer_kind, "SGD");
  EXPECT_EQ(ix->optimizer_state_names, std::vector<std::string>{"momentum"});
  ASSERT_EQ(ix->units.size(), model_->units().size());
  for (size_t u = 0; u < ix->units.size(); ++u) {
    EXPECT_EQ(ix->units[u].name, model_->units()[u].name);
    EXPECT_EQ(ix->units[u].optimizer_step, kSaveStep);
    EXPECT_EQ(ix->units[u].shard_numel * 4, ix->units[u].padded_numel);
    ASSERT_EQ(ix->units[u].params.size(), model_->units()[u].params.size());
    for (size_t p = 0; p < ix->units[u].params.size(); ++p) {
      EXPECT_EQ(ix->units[u].params[p].name, model_->units()[u].params[p].name);
      EXPECT_EQ(ix->units[u].params[p].shape, model_->units()[u].params[p].shape);
    }
  }
  ASSERT_EQ(ix->files.size(), 4u);
  for (const auto& f : ix->files) {
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir + "/" + f.name)), f.bytes) << f.name;
    StatusOr<SafeTensorsFile> sf = SafeTensorsFile::Read(dir + "/" + f.name);
    ASSERT_TRUE(sf.ok()) << sf.status();
    EXPECT_TRUE(sf->contains("units.0.master"));
    EXPECT_TRUE(sf->contains("units.0.optim.momentum"));
    EXPECT_EQ(sf->metadata().at("checkpoint_id"), ix->checkpoint_id);
  }
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
}

TEST_F(CheckpointTest, FullStateDictResumesExactlyAtWorld2And1AndIsReadableByName) {
  const std::vector<float> uninterrupted = TrainRun(*model_, RunSetup{}, 0, kTotalSteps);
  const std::string path = TempDir("full") + "/model.safetensors";
  std::vector<std::vector<Tensor>> full(model_->units().size());
  TrainRun(*model_, RunSetup{}, 0, kSaveStep, {}, [&](int rank, RankState& r) {
    Status s = SaveFullStateDict(path, r.state, kSaveStep);
    ASSERT_TRUE(s.ok()) << s;
    for (int u = 0; u < r.fsdp->num_units(); ++u) {
      for (size_t p = 0; p < model_->units()[u].params.size(); ++p) {
        StatusOr<Tensor> t = r.fsdp->GatherFullParam(u, static_cast<int>(p));
        ASSERT_TRUE(t.ok());
        if (rank == 0) full[u].push_back(*t);
      }
    }
  });
  // Any safetensors reader finds every parameter under "<unit>.<param>".
  StatusOr<SafeTensorsFile> sf = SafeTensorsFile::Read(path);
  ASSERT_TRUE(sf.ok()) << sf.status();
  for (size_t u = 0; u < model_->units().size(); ++u) {
    for (size_t p = 0; p < model_->units()[u].params.size(); ++p) {
      const std::string name = FullParamName(model_->units()[u], model_->units()[u].params[p]);
      StatusOr<SafeTensorsFile::Info> info = sf->info(name);
      ASSERT_TRUE(info.ok()) << name;
      EXPECT_EQ(info->shape, model_->units()[u].params[p].shape);
      const float* data = static_cast<const float*>(*sf->data(name));
      EXPECT_EQ(
          std::vector<float>(data, data + info->shape.numel()),
          std::vector<float>(full[u][p].data_as<float>(), full[u][p].data_as<float>() + full[u][p].numel()))
          << name;
    }
  }
  const std::vector<float> want(uninterrupted.begin() + kSaveStep, uninterrupted.end());
  for (int world : {2, 1}) {
    std::vector<float> got = TrainRun(*model_, RunSetup{ShardingStrategy::kFullShard, world, 0, kOtherSeed},
                                      kSaveStep, kTotalSteps, [&](int, RankState& r) {
                                        StatusOr<int64_t> step = LoadFullStateDict(path, r.state);
                                        ASSERT_TRUE(step.ok()) << step.status();
                                        EXPECT_EQ(*step, kSaveStep);
                                      });
    ExpectLossesMatch(got, want, kSaveStep, "full state dict at world " + std::to_string(world));
  }
}

void FlipByte(const std::string& path, int64_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(-from_end, std::ios::end);
  f.write(&c, 1);
}

TEST_F(CheckpointTest, NoShardCheckpointIsOneFileAndResumesFullyShardedAtWorld4) {
  RunSetup no_shard{ShardingStrategy::kNoShard, 2, 0, kSeed};
  const std::vector<float> uninterrupted = TrainRun(*model_, no_shard, 0, kTotalSteps);
  const std::string dir = TempDir("no-shard") + "/ckpt";
  SaveAtStep3(dir, no_shard);
  StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
  ASSERT_TRUE(ix.ok()) << ix.status();
  EXPECT_EQ(ix->shard_group_size, 1);
  EXPECT_EQ(ix->files.size(), 1u);
  std::vector<float> got =
      TrainRun(*model_, RunSetup{ShardingStrategy::kFullShard, 4, 0, kOtherSeed}, kSaveStep, kTotalSteps,
               [&](int, RankState& r) { ASSERT_TRUE(LoadShardedCheckpoint(dir, r.state).ok()); });
  ExpectLossesMatch(got, std::vector<float>(uninterrupted.begin() + kSaveStep, uninterrupted.end()),
                    kSaveStep, "NO_SHARD world 2 -> FULL_SHARD world 4");
}

TEST_F(CheckpointTest, FullStateDictFromAnotherToolLoadsParametersWidenedAndLeavesTheOptimizer) {
  // Another tool's file: bf16 tensors under the parameters' names, no
  // shardkit metadata, no optimizer state.
  const std::string path = TempDir("foreign") + "/model.safetensors";
  std::vector<std::vector<BF16>> storage;
  std::vector<SafeTensorsEntry> entries;
  for (const UnitSpec& u : model_->units()) {
    for (const ParamSpec& p : u.params) {
      std::vector<BF16> v(static_cast<size_t>(p.shape.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = FloatToBF16(0.25f * static_cast<float>(i % 7) - 0.5f);
      storage.push_back(std::move(v));
      entries.push_back({FullParamName(u, p), DType::kBF16, p.shape, storage.back().data()});
    }
  }
  ASSERT_TRUE(WriteSafeTensors(path, entries).ok());
  RunModel(*model_, RunSetup{ShardingStrategy::kFullShard, 2, 0, kSeed}, testing::TestOptimizer(),
           [&](int rank, RankState& r) {
             TrainSteps(*model_, r, rank, 2, 0, 1);
             StatusOr<int64_t> step = LoadFullStateDict(path, r.state);
             ASSERT_TRUE(step.ok()) << step.status();
             EXPECT_EQ(*step, 0);
             EXPECT_EQ(r.opt->step_count(0), 1) << "the optimizer must be left alone";
             for (int u = 0; u < r.fsdp->num_units(); ++u) {
               for (size_t p = 0; p < model_->units()[u].params.size(); ++p) {
                 StatusOr<Tensor> t = r.fsdp->GatherFullParam(u, static_cast<int>(p));
                 ASSERT_TRUE(t.ok());
                 for (int64_t i = 0; i < t->numel(); ++i) {
                   ASSERT_EQ(t->data_as<float>()[i], 0.25f * static_cast<float>(i % 7) - 0.5f)
                       << model_->units()[u].params[p].name << "[" << i << "]";
                 }
               }
             }
           });
}

TEST_F(CheckpointTest, FullStateDictWithAForeignTensorIsInvalidArgumentNamingIt) {
  const std::string path = TempDir("extra") + "/model.safetensors";
  std::vector<std::vector<float>> storage;
  std::vector<SafeTensorsEntry> entries;
  for (const UnitSpec& u : model_->units()) {
    for (const ParamSpec& p : u.params) {
      storage.emplace_back(static_cast<size_t>(p.shape.numel()), 0.f);
      entries.push_back({FullParamName(u, p), DType::kF32, p.shape, storage.back().data()});
    }
  }
  float extra[3] = {1, 2, 3};
  entries.push_back({"decoder.lm_bias", DType::kF32, Shape{3}, extra});
  ASSERT_TRUE(WriteSafeTensors(path, entries).ok());
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadFullStateDict(path, r.state).status(); },
                           StatusCode::kInvalidArgument, "decoder.lm_bias");
}

TEST_F(CheckpointTest, CorruptFullStateDictIsDataLossAndChangesNothing) {
  const std::string path = TempDir("full-corrupt") + "/model.safetensors";
  TrainRun(*model_, RunSetup{}, 0, 1, {},
           [&](int, RankState& r) { ASSERT_TRUE(SaveFullStateDict(path, r.state, 1).ok()); });
  FlipByte(path, 9);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadFullStateDict(path, r.state).status(); },
                           StatusCode::kDataLoss, "model.safetensors");
}

TEST_F(CheckpointTest, FlippedByteIsDataLossNamingTheFileAndChangesNothing) {
  const std::string dir = TempDir("corrupt") + "/ckpt";
  SaveAtStep3(dir);
  FlipByte(dir + "/rank-00001.safetensors", 5);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kDataLoss, "rank-00001.safetensors");
}

TEST_F(CheckpointTest, TruncatedFileIsDataLossNamingTheFileAndChangesNothing) {
  const std::string dir = TempDir("truncated") + "/ckpt";
  SaveAtStep3(dir);
  const std::string victim = dir + "/rank-00002.safetensors";
  fs::resize_file(victim, fs::file_size(victim) - 100);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kDataLoss, "rank-00002.safetensors");
}

TEST_F(CheckpointTest, TruncatedIndexIsDataLossAndChangesNothing) {
  const std::string dir = TempDir("truncated-index") + "/ckpt";
  SaveAtStep3(dir);
  fs::resize_file(dir + "/index.json", fs::file_size(dir + "/index.json") / 2);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kDataLoss, "index.json");
}

TEST_F(CheckpointTest, EditedIndexFailsItsChecksumAndChangesNothing) {
  const std::string dir = TempDir("edited-index") + "/ckpt";
  SaveAtStep3(dir);
  // Still valid JSON, but the step is no longer the one saved.
  std::ifstream in(dir + "/index.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "\"step\": " + std::to_string(kSaveStep);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, from.size(), "\"step\": 7");
  std::ofstream(dir + "/index.json", std::ios::trunc) << text;
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kDataLoss, "checksum");
}

TEST_F(CheckpointTest, MissingFileIsNotFoundNamingTheFileAndChangesNothing) {
  const std::string dir = TempDir("missing") + "/ckpt";
  SaveAtStep3(dir);
  fs::remove(dir + "/rank-00003.safetensors");
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kNotFound, "rank-00003.safetensors");
  ExpectLoadFailsUntouched(
      [&](RankState& r) { return LoadShardedCheckpoint(dir + "-nowhere", r.state).status(); },
      StatusCode::kNotFound, "index.json");
}

TEST_F(CheckpointTest, FileFromAnotherCheckpointIsDataLoss) {
  const std::string a = TempDir("mix-a") + "/ckpt";
  const std::string b = TempDir("mix-b") + "/ckpt";
  SaveAtStep3(a);
  SaveAtStep3(b);
  fs::copy_file(b + "/rank-00000.safetensors", a + "/rank-00000.safetensors",
                fs::copy_options::overwrite_existing);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(a, r.state).status(); },
                           StatusCode::kDataLoss, "another checkpoint");
}

// Issue 14, item 6: rank files of one checkpoint swapped, or one copied over
// another, used to load OK with another shard's weights.
TEST_F(CheckpointTest, SwappedOrCopiedRankFilesAreDataLossNotWrongWeights) {
  const std::string dir = TempDir("swapped") + "/ckpt";
  SaveAtStep3(dir);
  const std::string a = dir + "/rank-00001.safetensors", b = dir + "/rank-00002.safetensors";
  fs::rename(a, dir + "/x");
  fs::rename(b, a);
  fs::rename(dir + "/x", b);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kDataLoss, "holds shard rank 2, the index lists it as shard rank 1");
  const std::string c = TempDir("copied") + "/ckpt";
  SaveAtStep3(c);
  fs::copy_file(c + "/rank-00000.safetensors", c + "/rank-00003.safetensors", fs::copy_options::overwrite_existing);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(c, r.state).status(); },
                           StatusCode::kDataLoss, "rank-00003.safetensors' holds shard rank 0");
}

// A rank file rewritten with valid checksums, the same size, id and shard
// rank but other values: only the index's header CRC can tell.
TEST_F(CheckpointTest, RankFileRewrittenWithOtherValuesFailsTheIndexChecksum) {
  const std::string dir = TempDir("rewritten") + "/ckpt";
  SaveAtStep3(dir);
  const std::string path = dir + "/rank-00001.safetensors";
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<std::vector<char>> copies;
  std::vector<SafeTensorsEntry> entries;
  for (const std::string& name : f->names()) {
    SafeTensorsFile::Info info = *f->info(name);
    const char* data = static_cast<const char*>(*f->data(name));
    copies.emplace_back(data, data + info.nbytes);
    if (info.nbytes >= sizeof(float)) {
      float v;
      std::memcpy(&v, copies.back().data(), sizeof v);
      v += 1.0f;
      std::memcpy(copies.back().data(), &v, sizeof v);
    }
    entries.push_back({name, info.dtype, info.shape, copies.back().data()});
  }
  ASSERT_TRUE(WriteSafeTensors(path, entries, f->metadata()).ok());
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kDataLoss, "does not match the index");
}

TEST_F(CheckpointTest, CheckpointOfAnotherModelIsInvalidArgumentNamingTheParameter) {
  GptConfig other_config = testing::TinyGpt();
  other_config.vocab_size = 48;
  auto other = *GptModel::Create(other_config);
  const std::string dir = TempDir("other-model") + "/ckpt";
  const std::string full = TempDir("other-model-full") + "/model.safetensors";
  RunModel(*other, RunSetup{}, testing::TestOptimizer(), [&](int rank, RankState& r) {
    TrainSteps(*other, r, rank, 4, 0, 1);
    ASSERT_TRUE(SaveShardedCheckpoint(dir, r.state, 1).ok());
    ASSERT_TRUE(SaveFullStateDict(full, r.state, 1).ok());
  });
  // The first parameter whose shape depends on the vocabulary.
  std::string changed;
  for (size_t u = 0; u < model_->units().size() && changed.empty(); ++u) {
    const UnitSpec& mine = model_->units()[u];
    for (size_t p = 0; p < mine.params.size() && changed.empty(); ++p) {
      if (mine.params[p].shape != other->units()[u].params[p].shape) {
        changed = FullParamName(mine, mine.params[p]);
      }
    }
  }
  ASSERT_FALSE(changed.empty());
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kInvalidArgument, changed);
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadFullStateDict(full, r.state).status(); },
                           StatusCode::kInvalidArgument, changed);
}

TEST_F(CheckpointTest, CheckpointOfAnotherOptimizerIsInvalidArgument) {
  const std::string dir = TempDir("other-optimizer") + "/ckpt";
  OptimizerOptions adam;
  adam.kind = OptimizerKind::kAdam;
  RunModel(*model_, RunSetup{}, adam, [&](int rank, RankState& r) {
    TrainSteps(*model_, r, rank, 4, 0, 1);
    ASSERT_TRUE(SaveShardedCheckpoint(dir, r.state, 1).ok());
  });
  ExpectLoadFailsUntouched([&](RankState& r) { return LoadShardedCheckpoint(dir, r.state).status(); },
                           StatusCode::kInvalidArgument, "exp_avg");
}

TEST_F(CheckpointTest, FailedSaveLeavesThePreviousCheckpointIntact) {
  const std::string dir = TempDir("failed-save") + "/ckpt";
  SaveAtStep3(dir);
  StatusOr<CheckpointIndex> before = ReadCheckpointIndex(dir);
  ASSERT_TRUE(before.ok());
  // The next save fails on shard rank 2 after it wrote its file.
  TrainRun(*model_, RunSetup{}, 0, kTotalSteps, {}, [&](int rank, RankState& r) {
    CheckpointOptions o;
    o.on_file_written = [](const std::string& path) {
      return path.find("rank-00002") != std::string::npos ? UnavailableError("disk full (simulated)")
                                                          : OkStatus();
    };
    Status s = SaveShardedCheckpoint(dir, r.state, kTotalSteps, o);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << "rank " << rank << ": " << s;
    EXPECT_NE(s.message().find("disk full"), std::string::npos) << s;
    EXPECT_NE(s.message().find("the previous checkpoint (step 3)"), std::string::npos) << s;
  });
  StatusOr<CheckpointIndex> after = ReadCheckpointIndex(dir);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->step, kSaveStep);
  EXPECT_EQ(after->checkpoint_id, before->checkpoint_id);
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  // And it still loads.
  TrainRun(*model_, RunSetup{ShardingStrategy::kFullShard, 2, 0, kOtherSeed}, kSaveStep, kSaveStep + 1,
           [&](int, RankState& r) {
             StatusOr<int64_t> step = LoadShardedCheckpoint(dir, r.state);
             ASSERT_TRUE(step.ok()) << step.status();
             EXPECT_EQ(*step, kSaveStep);
           });
}

TEST_F(CheckpointTest, SaveReplacesAnOlderCheckpointButNeverAnotherDirectory) {
  const std::string root = TempDir("replace");
  const std::string dir = root + "/ckpt";
  SaveAtStep3(dir);
  const std::string first_id = ReadCheckpointIndex(dir)->checkpoint_id;
  SaveAtStep3(dir);
  StatusOr<CheckpointIndex> second = ReadCheckpointIndex(dir);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->checkpoint_id, first_id);

  const std::string precious = root + "/precious";
  fs::create_directories(precious);
  std::ofstream(precious + "/notes.txt") << "not a checkpoint";
  TrainRun(*model_, RunSetup{ShardingStrategy::kFullShard, 2, 0, kSeed}, 0, 0, {}, [&](int, RankState& r) {
    Status s = SaveShardedCheckpoint(precious, r.state, 0);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  });
  EXPECT_TRUE(fs::exists(precious + "/notes.txt"));
}

TEST_F(CheckpointTest, SaveThroughASymlinkToADirectoryWritesIntoTheTargetAndKeepsTheLink) {
  const std::string root = TempDir("symlink");
  const std::string target = root + "/big_disk/ck";
  fs::create_directories(root + "/big_disk");
  SaveAtStep3(target);
  const std::string first_id = ReadCheckpointIndex(target)->checkpoint_id;
  const std::string link = root + "/ck";
  fs::create_directory_symlink(target, link);
  TrainRun(*model_, RunSetup{}, 0, 1, {}, [&](int rank, RankState& r) {
    Status s = SaveShardedCheckpoint(link, r.state, kTotalSteps);
    EXPECT_TRUE(s.ok()) << "rank " << rank << ": " << s;
  });
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link))) << "the link was replaced";
  StatusOr<CheckpointIndex> in_target = ReadCheckpointIndex(target);
  ASSERT_TRUE(in_target.ok()) << in_target.status();
  EXPECT_EQ(in_target->step, kTotalSteps) << "the target still holds the old checkpoint";
  EXPECT_NE(in_target->checkpoint_id, first_id);
  EXPECT_FALSE(fs::exists(root + "/big_disk/ck.tmp"));

  // A link to nothing, or to a file, is refused on every rank and left alone.
  const std::string dangling = root + "/dangling";
  fs::create_directory_symlink(root + "/nowhere", dangling);
  const std::string to_file = root + "/to_file";
  std::ofstream(root + "/file.txt") << "x";
  fs::create_symlink(root + "/file.txt", to_file);
  TrainRun(*model_, RunSetup{ShardingStrategy::kFullShard, 2, 0, kSeed}, 0, 0, {}, [&](int rank, RankState& r) {
    for (const std::string& bad : {dangling, to_file}) {
      Status s = SaveShardedCheckpoint(bad, r.state, 0);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << rank << ": " << s;
      EXPECT_NE(s.message().find("symlink"), std::string::npos) << s;
    }
  });
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dangling)));
  EXPECT_FALSE(fs::exists(root + "/nowhere"));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(to_file)));
}

TEST_F(CheckpointTest, AFailureAfterTheExchangeSaysTheNewCheckpointIsOnDisk) {
  const std::string dir = TempDir("failed-after-commit") + "/ckpt";
  SaveAtStep3(dir);
  TrainRun(*model_, RunSetup{}, 0, 1, {}, [&](int rank, RankState& r) {
    CheckpointOptions o;
    o.on_committed = [](const std::string&) { return UnavailableError("rank 0 crashed (simulated)"); };
    Status s = SaveShardedCheckpoint(dir, r.state, kTotalSteps, o);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << "rank " << rank << ": " << s;
    EXPECT_NE(s.message().find("the new checkpoint (step 6) is complete"), std::string::npos)
        << "rank " << rank << ": " << s;
    EXPECT_EQ(s.message().find("intact"), std::string::npos) << "rank " << rank << ": " << s;
  });
  EXPECT_EQ(ReadCheckpointIndex(dir)->step, kTotalSteps);
}

}  // namespace
}  // namespace sk
