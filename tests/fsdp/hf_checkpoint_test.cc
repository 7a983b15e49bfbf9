// Hugging Face model directories in and out, against files transformers
// wrote (tests/fsdp/testdata/hf, made by tools/hf_fixtures/make_fixtures.py):
// our GPT-2 computes transformers' loss and gradients from its directory,
// a sharded directory loads, our directories round-trip bit for bit with the
// tied head stored once, and bad directories are errors naming the file and
// the tensor.
#include "runtime/fsdp/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/fsdp/checkpoint.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/hf_config.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/train/trainer.h"
#include "runtime/train/trainer.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

namespace fs = std::filesystem;

const std::string kData = "tests/fsdp/testdata/hf/";
const std::string kGpt2 = kData + "gpt2-tiny";

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void Spit(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
}

// A fresh copy of a fixture directory under the test's temporary directory.
std::string CopyOf(const std::string& fixture, const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(fixture)) {
    fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
    fs::permissions(dir + "/" + e.path().filename().string(), fs::perms::owner_read | fs::perms::owner_write);
  }
  return dir;
}

TokenBatch FixtureBatch(const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(Slurp(kData + name + ".batch.json"));
  TokenBatch b;
  b.batch_size = static_cast<int64_t>(j["inputs"].size());
  b.seq_len = static_cast<int64_t>(j["inputs"][0].size());
  for (const auto& row : j["inputs"]) {
    for (const auto& t : row) b.inputs.push_back(t.get<int32_t>());
  }
  for (const auto& row : j["targets"]) {
    for (const auto& t : row) b.targets.push_back(t.get<int32_t>());
  }
  return b;
}

void ExpectSameTensors(const SafeTensorsFile& a, const SafeTensorsFile& b) {
  ASSERT_EQ(a.names().size(), b.names().size());
  for (const std::string& n : a.names()) {
    ASSERT_TRUE(b.contains(n)) << n;
    SafeTensorsFile::Info ia = *a.info(n), ib = *b.info(n);
    EXPECT_EQ(ia.shape, ib.shape) << n;
    EXPECT_EQ(ia.dtype, ib.dtype) << n;
    ASSERT_EQ(ia.nbytes, ib.nbytes) << n;
    EXPECT_EQ(std::memcmp(*a.data(n), *b.data(n), ia.nbytes), 0) << n << " differs";
  }
}

TEST(HfCheckpoint, ReadsATransformersGpt2DirectoryAsATiedGpt) {
  StatusOr<HfModel> m = ReadHfModelDir(kGpt2);
  ASSERT_TRUE(m.ok()) << m.status();
  const GptConfig& g = m->config.gpt;
  EXPECT_EQ(m->config.family, ModelFamily::kGpt);
  EXPECT_EQ(g.vocab_size, 128);
  EXPECT_EQ(g.max_seq_len, 32);
  EXPECT_EQ(g.n_layer, 2);
  EXPECT_EQ(g.n_head, 4);
  EXPECT_EQ(g.d_model, 32);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_TRUE(m->weights.contains("embed.wte"));
  EXPECT_FALSE(m->weights.contains("head.lm_head.w"));
  // The directory names the model wherever a model name goes.
  StatusOr<std::unique_ptr<Model>> model = CreateModel(kGpt2);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_parameters(), 30592);  // transformers' count
}

// The acceptance test of the import: transformers' f32 loss and every
// parameter's gradient, from the same weights and batch, to rounding.
TEST(HfCheckpoint, Gpt2MatchesTransformersLossAndGradients) {
  StatusOr<HfModel> m = ReadHfModelDir(kGpt2);
  ASSERT_TRUE(m.ok()) << m.status();
  auto model = *GptModel::Create(m->config.gpt);
  auto params = *OwnedParameters::Create(model->units(), 0);
  for (int u = 0; u < params->num_units(); ++u) {
    for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
      const std::string name = FullParamName(model->units()[u], model->units()[u].params[i]);
      const Tensor& p = params->param(u, static_cast<int>(i));
      ASSERT_EQ(m->weights.info(name)->nbytes, p.nbytes()) << name;
      std::memcpy(p.data(), *m->weights.data(name), p.nbytes());
    }
  }
  StatusOr<float> loss = model->ForwardBackward(FixtureBatch("gpt2-tiny"), *params, HostAllocator::Default());
  ASSERT_TRUE(loss.ok()) << loss.status();

  StatusOr<SafeTensorsFile> expected = SafeTensorsFile::Read(kData + "gpt2-tiny.expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const float want_loss = *static_cast<const float*>(*expected->data("loss"));
  EXPECT_NEAR(*loss, want_loss, 2e-6 * want_loss);
  // transformers' gradients under their own names, into shardkit's layout.
  std::vector<SafeTensorsEntry> grads;
  for (const SafeTensorsEntry& e : expected->Entries()) {
    if (e.name.rfind("grad.", 0) == 0) grads.push_back({e.name.substr(5), e.dtype, e.shape, e.data});
  }
  ConvertOptions tied;
  tied.tied_lm_head = true;
  StatusOr<SafeTensorsFile> want =
      ConvertWeights(*SafeTensorsFile::FromEntries(grads), WeightLayout::kHfGpt2, WeightLayout::kShardkit, tied);
  ASSERT_TRUE(want.ok()) << want.status();
  int tensors = 0;
  double worst = 0;  // largest |ours - transformers'| / max |transformers'| of a tensor
  for (int u = 0; u < params->num_units(); ++u) {
    for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
      const std::string name = FullParamName(model->units()[u], model->units()[u].params[i]);
      ASSERT_TRUE(want->contains(name)) << name;
      const float* w = static_cast<const float*>(*want->data(name));
      const Tensor& g = params->grad(u, static_cast<int>(i));
      double scale = 0;
      for (int64_t k = 0; k < g.numel(); ++k) scale = std::max(scale, std::fabs(static_cast<double>(w[k])));
      ASSERT_GT(scale, 0) << name;
      for (int64_t k = 0; k < g.numel(); ++k) {
        ASSERT_NEAR(g.data_as<float>()[k], w[k], 1e-5 * scale + 1e-8) << name << "[" << k << "]";
        worst = std::max(worst, std::fabs(g.data_as<float>()[k] - w[k]) / scale);
      }
      ++tensors;
    }
  }
  EXPECT_EQ(tensors, 2 + 2 * 12 + 2);  // wte's gradient holds the head's use too
  RecordProperty("loss_abs_error", std::to_string(std::fabs(*loss - want_loss)));
  RecordProperty("grad_max_rel_error", std::to_string(worst));
}

TEST(HfCheckpoint, ATransformersShardedDirectoryLoadsTheSameTensors) {
  StatusOr<HfModel> one = ReadHfModelDir(kGpt2);
  StatusOr<HfModel> sharded = ReadHfModelDir(kGpt2 + "-sharded");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  ExpectSameTensors(one->weights, sharded->weights);
}

TEST(HfCheckpoint, OursToHuggingFaceToOursIsBitForBitAndStaysTied) {
  StatusOr<HfModel> m = ReadHfModelDir(kGpt2);
  ASSERT_TRUE(m.ok()) << m.status();
  for (int64_t shard_bytes : {int64_t{0}, int64_t{30000}}) {
    const std::string dir = ::testing::TempDir() + "/roundtrip-" + std::to_string(shard_bytes);
    fs::remove_all(dir);
    HfWriteOptions o;
    o.max_shard_bytes = shard_bytes;
    Status w = WriteHfModelDir(dir, m->config, m->weights, o);
    ASSERT_TRUE(w.ok()) << w;
    nlohmann::json config = nlohmann::json::parse(Slurp(dir + "/config.json"));
    EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
    EXPECT_EQ(config["model_type"], "gpt2");
    EXPECT_EQ(config["tie_word_embeddings"], true);
    EXPECT_EQ(config["n_positions"], 32);
    StatusOr<SafeTensorsFile> hf = ReadHfWeights(dir);
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_FALSE(hf->contains("lm_head.weight"));  // the tied head is wte, stored once
    EXPECT_TRUE(hf->contains("transformer.wte.weight"));
    EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), shard_bytes > 0);
    // transformers' own file and ours hold the same tensors under the same names.
    ExpectSameTensors(*ReadHfWeights(kGpt2), *hf);
    StatusOr<HfModel> back = ReadHfModelDir(dir);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->config.gpt.tie_word_embeddings);
    ExpectSameTensors(m->weights, back->weights);
  }
}

// An untied model keeps its own head in the file and says so in config.json,
// even when the head happens to equal wte (transformers would otherwise tie
// it on load and lose a fine-tuned head).
TEST(HfCheckpoint, AnUntiedHeadIsAlwaysWrittenAndDeclaredUntied) {
  StatusOr<HfModel> m = ReadHfModelDir(kGpt2);
  ASSERT_TRUE(m.ok()) << m.status();
  NamedModelConfig untied = m->config;
  untied.gpt.tie_word_embeddings = false;
  // head.lm_head.w = wte^T: equal to the embedding, yet a parameter of its own.
  const SafeTensorsFile::Info wte = *m->weights.info("embed.wte");
  std::vector<float> head(static_cast<size_t>(wte.shape.numel()));
  const float* w = static_cast<const float*>(*m->weights.data("embed.wte"));
  const int64_t V = wte.shape.dim(0), D = wte.shape.dim(1);
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t d = 0; d < D; ++d) head[d * V + v] = w[v * D + d];
  }
  std::vector<SafeTensorsEntry> entries = m->weights.Entries();
  entries.push_back({"head.lm_head.w", DType::kF32, Shape{D, V}, head.data()});
  SafeTensorsFile weights = *SafeTensorsFile::FromEntries(entries);
  const std::string dir = ::testing::TempDir() + "/untied";
  fs::remove_all(dir);
  ASSERT_TRUE(WriteHfModelDir(dir, untied, weights).ok());
  EXPECT_EQ(nlohmann::json::parse(Slurp(dir + "/config.json"))["tie_word_embeddings"], false);
  EXPECT_TRUE(ReadHfWeights(dir)->contains("lm_head.weight"));
  StatusOr<HfModel> back = ReadHfModelDir(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->config.gpt.tie_word_embeddings);
  ExpectSameTensors(weights, back->weights);
}

// FSDP ranks load a directory through the full-state-dict path (what the
// trainer and the C ABI call with the hf-gpt2 layout), and save one that
// reads back the same.
TEST(HfCheckpoint, FsdpLoadsAndSavesDirectoriesAsFullStateDicts) {
  StatusOr<HfModel> m = ReadHfModelDir(kGpt2);
  ASSERT_TRUE(m.ok()) << m.status();
  auto model = *GptModel::Create(m->config.gpt);
  const std::string out = ::testing::TempDir() + "/fsdp-saved/";
  fs::remove_all(out);
  std::mutex mu;
  testing::RunRanks(2, [&](int rank, comm::ProcessGroup* world) {
    CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
    FsdpOptions o;
    o.timeout = Duration(60'000);
    auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
    TrainingState st{kGpt2, &model->units(), fsdp.get(), nullptr};
    FullStateDictOptions hf;
    hf.layout = WeightLayout::kHfGpt2;
    StatusOr<int64_t> step = LoadFullStateDict(kGpt2 + "-sharded", st, hf);
    ASSERT_TRUE(step.ok()) << step.status();
    for (size_t u = 0; u < model->units().size(); ++u) {
      for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
        StatusOr<Tensor> t = fsdp->GatherFullParam(static_cast<int>(u), static_cast<int>(i));
        ASSERT_TRUE(t.ok()) << t.status();
        const std::string name = FullParamName(model->units()[u], model->units()[u].params[i]);
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_EQ(std::memcmp(t->data(), *m->weights.data(name), t->nbytes()), 0) << name;
      }
    }
    Status saved = SaveFullStateDict(out, st, 0, hf);
    ASSERT_TRUE(saved.ok()) << saved;
  });
  StatusOr<HfModel> back = ReadHfModelDir(out);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(m->weights, back->weights);
}

// What a user does: a trainer whose model is the directory, its weights
// loaded from it, a step, and a directory written back that reads as the
// same tied model with the trained weights.
TEST(HfCheckpoint, ATrainerTrainsFromADirectoryAndWritesOneBack) {
  const std::string out = ::testing::TempDir() + "/trained/";
  fs::remove_all(out);
  std::vector<float> losses(2);
  Status s = comm::RunLocalRanks(2, [&](int r, comm::ProcessGroup* g) -> Status {
    TrainerOptions o;
    o.model = kGpt2;
    o.batch_size = 2;
    o.data_tokens = 1024;
    o.fsdp.timeout = Duration(60'000);
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, g));
    SK_RETURN_IF_ERROR(t->LoadFullStateDict(kGpt2, WeightLayout::kHfGpt2));
    SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
    losses[r] = m.loss;
    return t->SaveFullStateDict(out, WeightLayout::kHfGpt2);
  });
  ASSERT_TRUE(s.ok()) << s;
  for (float l : losses) EXPECT_TRUE(std::isfinite(l) && l > 0);
  StatusOr<HfModel> before = ReadHfModelDir(kGpt2);
  StatusOr<HfModel> after = ReadHfModelDir(out);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->config.gpt.tie_word_embeddings);
  EXPECT_FALSE(ReadHfWeights(out)->contains("lm_head.weight"));
  const SafeTensorsFile::Info info = *after->weights.info("embed.wte");
  EXPECT_NE(std::memcmp(*after->weights.data("embed.wte"), *before->weights.data("embed.wte"), info.nbytes), 0)
      << "the step changed the embedding";
}

// Every way a directory can be wrong is a Status naming the file and what
// in it is wrong, never an abort.
TEST(HfCheckpoint, BadDirectoriesAreErrorsNamingTheFileAndTensor) {
  auto expect = [](const StatusOr<HfModel>& r, StatusCode code, const std::vector<std::string>& words) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    for (const std::string& w : words) {
      EXPECT_NE(r.status().message().find(w), std::string::npos) << "'" << w << "' not in: " << r.status();
    }
  };
  {  // A config key missing.
    const std::string dir = CopyOf(kGpt2, "no-key");
    nlohmann::json c = nlohmann::json::parse(Slurp(dir + "/config.json"));
    c.erase("n_layer");
    Spit(dir + "/config.json", c.dump());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"config.json", "n_layer", "missing"});
  }
  {  // Shapes that disagree with config.json.
    const std::string dir = CopyOf(kGpt2, "wrong-width");
    nlohmann::json c = nlohmann::json::parse(Slurp(dir + "/config.json"));
    c["n_positions"] = 64;
    Spit(dir + "/config.json", c.dump());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"transformer.wpe.weight", "[32, 32]", "[64, 32]"});
  }
  {  // An architecture shardkit does not have.
    const std::string dir = CopyOf(kGpt2, "unknown-arch");
    nlohmann::json c = nlohmann::json::parse(Slurp(dir + "/config.json"));
    c["architectures"] = {"BertForMaskedLM"};
    Spit(dir + "/config.json", c.dump());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"BertForMaskedLM", "GPT2LMHeadModel"});
  }
  {  // A value shardkit's GPT does not compute.
    const std::string dir = CopyOf(kGpt2, "relu");
    nlohmann::json c = nlohmann::json::parse(Slurp(dir + "/config.json"));
    c["activation_function"] = "relu";
    Spit(dir + "/config.json", c.dump());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"activation_function", "relu"});
  }
  {  // A shard the index lists is missing.
    const std::string dir = CopyOf(kGpt2 + "-sharded", "no-shard");
    fs::remove(dir + "/model-00002-of-00004.safetensors");
    expect(ReadHfModelDir(dir), StatusCode::kNotFound, {"model-00002-of-00004.safetensors"});
  }
  {  // The index lists a tensor its file does not hold.
    const std::string dir = CopyOf(kGpt2 + "-sharded", "index-lies");
    nlohmann::json idx = nlohmann::json::parse(Slurp(dir + "/model.safetensors.index.json"));
    idx["weight_map"]["transformer.h.9.ln_1.weight"] = "model-00001-of-00004.safetensors";
    Spit(dir + "/model.safetensors.index.json", idx.dump());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument,
           {"model-00001-of-00004.safetensors", "transformer.h.9.ln_1.weight"});
  }
  {  // A tensor missing from the weights.
    const std::string dir = CopyOf(kGpt2, "no-tensor");
    SafeTensorsFile f = *SafeTensorsFile::Read(dir + "/model.safetensors");
    std::vector<SafeTensorsEntry> kept;
    for (const SafeTensorsEntry& e : f.Entries()) {
      if (e.name != "transformer.h.1.mlp.c_fc.bias") kept.push_back(e);
    }
    ASSERT_TRUE(WriteSafeTensors(dir + "/model.safetensors", kept, {{"format", "pt"}}).ok());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"transformer.h.1.mlp.c_fc.bias", "missing"});
  }
  {  // No weights at all, and no config at all.
    const std::string dir = CopyOf(kGpt2, "no-weights");
    fs::remove(dir + "/model.safetensors");
    expect(ReadHfModelDir(dir), StatusCode::kNotFound, {"model.safetensors"});
    fs::remove(dir + "/config.json");
    expect(ReadHfModelDir(dir), StatusCode::kNotFound, {"config.json"});
  }
  {  // A tied model cannot take a head that is not wte.
    const std::string dir = CopyOf(kGpt2, "odd-head");
    SafeTensorsFile f = *SafeTensorsFile::Read(dir + "/model.safetensors");
    std::vector<SafeTensorsEntry> all = f.Entries();
    std::vector<float> head(128 * 32, 0.5f);
    all.push_back({"lm_head.weight", DType::kF32, Shape{128, 32}, head.data()});
    ASSERT_TRUE(WriteSafeTensors(dir + "/model.safetensors", all, {{"format", "pt"}}).ok());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"lm_head.weight", "tie"});
  }
}

}  // namespace
}  // namespace sk
