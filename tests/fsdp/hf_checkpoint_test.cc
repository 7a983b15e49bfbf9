// Hugging Face model directories in and out, against files transformers
// wrote (tests/fsdp/testdata/hf, made by tools/hf_fixtures/make_fixtures.py):
// our GPT-2 computes transformers' loss and gradients from its directory,
// a sharded directory loads, our directories round-trip bit for bit with the
// tied head stored once, and bad directories are errors naming the file and
// the tensor.
#include "runtime/checkpoint/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/nn/gpt.h"
#include "runtime/nn/llama.h"
#include "runtime/nn/hf_config.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/train/trainer.h"
#include "tests/util/training_test_util.h"

namespace sk {
namespace {

namespace fs = std::filesystem;

const std::string kData = "tests/fsdp/testdata/hf/";
const std::string kGpt2 = kData + "gpt2-tiny";
const std::string kLlama = kData + "llama-tiny";
const std::string kLlama3 = kData + "llama3-tiny";

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

// The acceptance test of an import: transformers' f32 loss and every
// parameter's gradient, from the same weights and batch, to rounding.
// `fixture` names the directory, batch and expected files; returns the
// number of parameter tensors compared.
int ExpectTransformersLossAndGradients(const std::string& fixture, WeightLayout layout) {
  StatusOr<HfModel> m = ReadHfModelDir(kData + fixture);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return 0;
  std::unique_ptr<Model> model = *CreateModel(m->config);
  auto params = *OwnedParameters::Create(model->units(), 0);
  for (int u = 0; u < params->num_units(); ++u) {
    for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
      const std::string name = FullParamName(model->units()[u], model->units()[u].params[i]);
      const Tensor& p = params->param(u, static_cast<int>(i));
      EXPECT_EQ(m->weights.info(name)->nbytes, p.nbytes()) << name;
      if (m->weights.info(name)->nbytes != p.nbytes()) return 0;
      std::memcpy(p.data(), *m->weights.data(name), p.nbytes());
    }
  }
  StatusOr<float> loss = model->ForwardBackward(FixtureBatch(fixture), *params, HostAllocator::Default());
  EXPECT_TRUE(loss.ok()) << loss.status();
  StatusOr<SafeTensorsFile> expected = SafeTensorsFile::Read(kData + fixture + ".expected.safetensors");
  EXPECT_TRUE(expected.ok()) << expected.status();
  if (!loss.ok() || !expected.ok()) return 0;
  const float want_loss = *static_cast<const float*>(*expected->data("loss"));
  EXPECT_NEAR(*loss, want_loss, 2e-6 * want_loss);
  // transformers' gradients under their own names, into shardkit's layout.
  std::vector<SafeTensorsEntry> grads;
  for (const SafeTensorsEntry& e : expected->Entries()) {
    if (e.name.rfind("grad.", 0) == 0) grads.push_back({e.name.substr(5), e.dtype, e.shape, e.data});
  }
  // A tied model's gradient file has no head (its embedding's gradient
  // holds both uses); an untied one's has.
  ConvertOptions tied;
  tied.tie_word_embeddings = model->units().back().tied.size() == 1;
  StatusOr<SafeTensorsFile> want =
      ConvertWeights(*SafeTensorsFile::FromEntries(grads), layout, WeightLayout::kShardkit, tied);
  EXPECT_TRUE(want.ok()) << want.status();
  if (!want.ok()) return 0;
  int tensors = 0;
  double worst = 0;  // largest |ours - transformers'| / max |transformers'| of a tensor
  for (int u = 0; u < params->num_units(); ++u) {
    for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
      const std::string name = FullParamName(model->units()[u], model->units()[u].params[i]);
      EXPECT_TRUE(want->contains(name)) << name;
      if (!want->contains(name)) continue;
      const float* w = static_cast<const float*>(*want->data(name));
      const Tensor& g = params->grad(u, static_cast<int>(i));
      double scale = 0;
      for (int64_t k = 0; k < g.numel(); ++k) scale = std::max(scale, std::fabs(static_cast<double>(w[k])));
      EXPECT_GT(scale, 0) << name;
      for (int64_t k = 0; k < g.numel(); ++k) {
        EXPECT_NEAR(g.data_as<float>()[k], w[k], 1e-5 * scale + 1e-8) << name << "[" << k << "]";
        worst = std::max(worst, std::fabs(g.data_as<float>()[k] - w[k]) / scale);
      }
      ++tensors;
    }
  }
  EXPECT_EQ(static_cast<size_t>(tensors), want->names().size());  // every gradient transformers has
  ::testing::Test::RecordProperty(fixture + ".loss_abs_error", std::to_string(std::fabs(*loss - want_loss)));
  ::testing::Test::RecordProperty(fixture + ".grad_max_rel_error", std::to_string(worst));
  return tensors;
}

TEST(HfCheckpoint, Gpt2MatchesTransformersLossAndGradients) {
  // wte's gradient holds the head's use too.
  EXPECT_EQ(ExpectTransformersLossAndGradients("gpt2-tiny", WeightLayout::kHfGpt2), 2 + 2 * 12 + 2);
}

TEST(HfCheckpoint, ReadsATransformersLlamaDirectoryAsAnUntiedLlama) {
  StatusOr<HfModel> m = ReadHfModelDir(kLlama);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->config.family, ModelFamily::kLlama);
  const LlamaConfig& l = m->config.llama;
  EXPECT_EQ(l.vocab_size, 128);
  EXPECT_EQ(l.d_model, 64);
  EXPECT_EQ(l.d_ff, 128);
  EXPECT_EQ(l.n_layer, 2);
  EXPECT_EQ(l.n_head, 4);
  EXPECT_EQ(l.kv_heads(), 2);
  EXPECT_EQ(l.max_seq_len, 64);
  EXPECT_EQ(l.rope_theta, 10000.0f);  // from transformers 5's rope_parameters
  EXPECT_EQ(l.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(l.tie_word_embeddings);
  EXPECT_FALSE(l.qkv_bias);
  EXPECT_TRUE(m->weights.contains("head.lm_head.w"));
  // q_proj [out 64, in 64] and k_proj [out 32, in 64] transposed to [in, out].
  EXPECT_EQ(m->weights.info("layers.1.self_attn.k_proj.w")->shape, Shape({64, 32}));
  EXPECT_EQ(m->weights.info("head.lm_head.w")->shape, Shape({64, 128}));
  StatusOr<std::unique_ptr<Model>> model = CreateModel(kLlama);
  ASSERT_TRUE(model.ok()) << model.status();
  // transformers' count: 2 x 128 x 64 + 2 layers x (2 x 64 + 64 x (64 + 32 + 32 + 64) + 3 x 64 x 128) + 64.
  EXPECT_EQ((*model)->num_parameters(), 2 * 128 * 64 + 2 * (2 * 64 + 64 * 192 + 3 * 64 * 128) + 64);
}

// GQA, RoPE (rotate-half), RMSNorm and SwiGLU against transformers' LlamaForCausalLM.
TEST(HfCheckpoint, LlamaMatchesTransformersLossAndGradients) {
  // embed, 9 per layer, final norm, untied head.
  EXPECT_EQ(ExpectTransformersLossAndGradients("llama-tiny", WeightLayout::kHfLlama), 1 + 2 * 9 + 2);
}

// Llama 3.1/3.2's scaled rotary embeddings (rope_type llama3, written by
// transformers 5 in rope_parameters) on a tied Llama.
TEST(HfCheckpoint, ReadsLlama3RopeScaling) {
  StatusOr<HfModel> m = ReadHfModelDir(kLlama3);
  ASSERT_TRUE(m.ok()) << m.status();
  const LlamaConfig& l = m->config.llama;
  EXPECT_EQ(l.rope_theta, 10000.0f);
  EXPECT_EQ(l.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(l.rope_scaling.factor, 8.0f);
  EXPECT_EQ(l.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(l.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(l.rope_scaling.original_max_positions, 32);
  EXPECT_EQ(l.max_seq_len, 256);
  EXPECT_TRUE(l.tie_word_embeddings);
}

// The llama3 frequencies against transformers: kept, smoothed and divided
// bands all turn q and k (fixture: tools/hf_fixtures/make_fixtures.py).
TEST(HfCheckpoint, Llama3RopeScalingMatchesTransformersLossAndGradients) {
  // embed (holding the tied head's gradient too), 9 per layer, final norm.
  EXPECT_EQ(ExpectTransformersLossAndGradients("llama3-tiny", WeightLayout::kHfLlama), 1 + 2 * 9 + 1);
}

// The fixture can tell scaled from unscaled frequencies: the same weights
// and batch without rope_scaling give a loss and gradients that miss the
// tolerances of ExpectTransformersLossAndGradients (2e-6 of the loss, 1e-5
// of a tensor's largest gradient) several times over.
TEST(HfCheckpoint, Llama3FixtureDependsOnTheScaling) {
  StatusOr<HfModel> m = ReadHfModelDir(kLlama3);
  ASSERT_TRUE(m.ok()) << m.status();
  struct Run {
    float loss = 0;
    std::vector<std::vector<float>> grads;  // per parameter tensor
  };
  auto run_with = [&](const RopeScaling& scaling) {
    NamedModelConfig c = m->config;
    c.llama.rope_scaling = scaling;
    std::unique_ptr<Model> model = *CreateModel(c);
    auto params = *OwnedParameters::Create(model->units(), 0);
    for (int u = 0; u < params->num_units(); ++u) {
      for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
        const Tensor& p = params->param(u, static_cast<int>(i));
        std::memcpy(p.data(), *m->weights.data(FullParamName(model->units()[u], model->units()[u].params[i])),
                    p.nbytes());
      }
    }
    Run r;
    r.loss = *model->ForwardBackward(FixtureBatch("llama3-tiny"), *params, HostAllocator::Default());
    for (int u = 0; u < params->num_units(); ++u) {
      for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
        const Tensor& g = params->grad(u, static_cast<int>(i));
        r.grads.emplace_back(g.data_as<float>(), g.data_as<float>() + g.numel());
      }
    }
    return r;
  };
  const Run scaled = run_with(m->config.llama.rope_scaling);
  const Run unscaled = run_with(RopeScaling{});
  EXPECT_GT(std::fabs(scaled.loss - unscaled.loss), 5 * 2e-6 * scaled.loss) << scaled.loss << " vs " << unscaled.loss;
  double worst = 0;
  for (size_t t = 0; t < scaled.grads.size(); ++t) {
    double scale = 0, diff = 0;
    for (size_t k = 0; k < scaled.grads[t].size(); ++k) {
      scale = std::max(scale, std::fabs(static_cast<double>(scaled.grads[t][k])));
      diff = std::max(diff, std::fabs(static_cast<double>(scaled.grads[t][k]) - unscaled.grads[t][k]));
    }
    worst = std::max(worst, diff / scale);
  }
  EXPECT_GT(worst, 10 * 1e-5) << "largest gradient change relative to its tensor's largest element";
  ::testing::Test::RecordProperty("llama3-tiny.unscaled_grad_max_rel_change", std::to_string(worst));
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

// The parameters of `model` initialised from `seed`, as a shardkit-layout file.
SafeTensorsFile InitialWeights(const Model& model, uint64_t seed) {
  auto params = *OwnedParameters::Create(model.units(), seed);
  std::vector<SafeTensorsEntry> entries;
  for (int u = 0; u < params->num_units(); ++u) {
    for (size_t i = 0; i < model.units()[u].params.size(); ++i) {
      const Tensor& t = params->param(u, static_cast<int>(i));
      entries.push_back({FullParamName(model.units()[u], model.units()[u].params[i]), DType::kF32, t.shape(),
                         t.data()});
    }
  }
  return *SafeTensorsFile::FromEntries(entries);  // copies the bytes
}

// Writes `config` and `weights` as a directory (one file, then shards),
// checks config.json and the head, reads it back: the same config and bytes.
void ExpectLlamaRoundTrip(const NamedModelConfig& config, const SafeTensorsFile& weights, const std::string& label) {
  const LlamaConfig& l = config.llama;
  for (int64_t shard_bytes : {int64_t{0}, int64_t{60000}}) {
    SCOPED_TRACE(label + " max_shard_bytes " + std::to_string(shard_bytes));
    const std::string dir = ::testing::TempDir() + "/" + label + "-" + std::to_string(shard_bytes);
    fs::remove_all(dir);
    HfWriteOptions o;
    o.max_shard_bytes = shard_bytes;
    Status w = WriteHfModelDir(dir, config, weights, o);
    ASSERT_TRUE(w.ok()) << w;
    nlohmann::json c = nlohmann::json::parse(Slurp(dir + "/config.json"));
    EXPECT_EQ(c["architectures"][0], l.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    EXPECT_EQ(c["model_type"], l.qkv_bias ? "qwen2" : "llama");
    EXPECT_EQ(c["tie_word_embeddings"], l.tie_word_embeddings);
    EXPECT_EQ(c["num_key_value_heads"], l.kv_heads());
    EXPECT_EQ(c["hidden_act"], "silu");
    EXPECT_EQ(c["rope_scaling"].is_null(), l.rope_scaling.type == RopeScalingType::kNone);
    EXPECT_EQ(c["rope_parameters"]["rope_type"], RopeScalingTypeName(l.rope_scaling.type));
    EXPECT_EQ(c["rms_norm_eps"].dump(), l.rms_norm_eps == 1e-5f ? "1e-05" : "1e-06");  // as transformers writes it
    EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), shard_bytes > 0);
    StatusOr<SafeTensorsFile> hf = ReadHfWeights(dir);
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_TRUE(hf->contains("model.embed_tokens.weight"));
    EXPECT_EQ(hf->contains("lm_head.weight"), !l.tie_word_embeddings);  // a tied head is stored once
    EXPECT_EQ(hf->contains("model.layers.0.self_attn.q_proj.bias"), l.qkv_bias);
    StatusOr<HfModel> back = ReadHfModelDir(dir);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->config.llama.tie_word_embeddings, l.tie_word_embeddings);
    EXPECT_EQ(back->config.llama.qkv_bias, l.qkv_bias);
    EXPECT_EQ(back->config.llama.kv_heads(), l.kv_heads());
    EXPECT_EQ(back->config.llama.rope_theta, l.rope_theta);
    EXPECT_EQ(back->config.llama.rope_scaling, l.rope_scaling);
    EXPECT_EQ(back->config.llama.rms_norm_eps, l.rms_norm_eps);
    ExpectSameTensors(weights, back->weights);
  }
}

TEST(HfCheckpoint, LlamaOursToHuggingFaceToOursIsBitForBitTiedAndUntied) {
  // Untied: transformers' own weights; our file holds the same tensors as theirs.
  StatusOr<HfModel> m = ReadHfModelDir(kLlama);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectLlamaRoundTrip(m->config, m->weights, "llama-untied");
  const std::string dir = ::testing::TempDir() + "/llama-as-theirs";
  fs::remove_all(dir);
  ASSERT_TRUE(WriteHfModelDir(dir, m->config, m->weights).ok());
  ExpectSameTensors(*ReadHfWeights(kLlama), *ReadHfWeights(dir));
  // Tied, and Qwen2 (q/k/v biases, tied as Qwen2-0.5B): freshly initialised.
  for (bool qwen2 : {false, true}) {
    NamedModelConfig tied = m->config;
    tied.llama.tie_word_embeddings = true;
    tied.llama.qkv_bias = qwen2;
    tied.llama.rope_theta = qwen2 ? 1e6f : 500000.0f;
    tied.llama.rms_norm_eps = 1e-6f;
    std::unique_ptr<Model> model = *CreateModel(tied);
    ASSERT_EQ(model->units().back().tied.size(), 1u);
    ExpectLlamaRoundTrip(tied, InitialWeights(*model, 7), qwen2 ? "qwen2-tied" : "llama-tied");
  }
  // Scaled rotary embeddings: transformers' llama3 fixture, and linear.
  StatusOr<HfModel> llama3 = ReadHfModelDir(kLlama3);
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  ExpectLlamaRoundTrip(llama3->config, llama3->weights, "llama3-scaled");
  NamedModelConfig linear = llama3->config;
  linear.llama.rope_scaling = RopeScaling{RopeScalingType::kLinear, 2.5f};
  ExpectLlamaRoundTrip(linear, llama3->weights, "linear-scaled");
}

// Llama-family directories that shardkit's model cannot hold are errors
// naming the file and the key or tensor.
TEST(HfCheckpoint, BadLlamaDirectoriesAreErrorsNamingTheKeyOrTensor) {
  auto expect = [](const StatusOr<HfModel>& r, StatusCode code, const std::vector<std::string>& words) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    for (const std::string& w : words) {
      EXPECT_NE(r.status().message().find(w), std::string::npos) << "'" << w << "' not in: " << r.status();
    }
  };
  auto with_config = [](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = CopyOf(kLlama, name);
    nlohmann::json c = nlohmann::json::parse(Slurp(dir + "/config.json"));
    edit(c);
    Spit(dir + "/config.json", c.dump());
    return dir;
  };
  // Rope types shardkit does not compute, in transformers 4's key and in
  // 5's, and a llama3 scaling without its band factors.
  expect(ReadHfModelDir(with_config("rope-dynamic", [](nlohmann::json& c) {
           c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
         })),
         StatusCode::kInvalidArgument, {"config.json", "rope_scaling", "dynamic"});
  expect(ReadHfModelDir(with_config("rope-type", [](nlohmann::json& c) {
           c["rope_parameters"]["rope_type"] = "yarn";
         })),
         StatusCode::kInvalidArgument, {"config.json", "rope_parameters", "yarn"});
  expect(ReadHfModelDir(with_config("rope-longrope", [](nlohmann::json& c) {
           c["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
         })),
         StatusCode::kInvalidArgument, {"config.json", "rope_scaling", "longrope"});
  expect(ReadHfModelDir(with_config("rope-llama3-incomplete", [](nlohmann::json& c) {
           c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}};
         })),
         StatusCode::kInvalidArgument, {"config.json", "rope_scaling", "low_freq_factor"});
  expect(ReadHfModelDir(with_config("rope-llama3-bands", [](nlohmann::json& c) {
           c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 4.0},
                                {"high_freq_factor", 1.0}, {"original_max_position_embeddings", 8192}};
         })),
         StatusCode::kInvalidArgument, {"config.json", "rope_scaling", "high_freq_factor"});
  expect(ReadHfModelDir(with_config("rope-partial", [](nlohmann::json& c) {
           c["partial_rotary_factor"] = 0.5;
         })),
         StatusCode::kInvalidArgument, {"config.json", "partial_rotary_factor"});
  {  // transformers 4's spelling of Llama 3.1: rope_scaling beside a top-level theta.
    const std::string dir = with_config("rope-llama31", [](nlohmann::json& c) {
      c.erase("rope_parameters");
      c["rope_theta"] = 500000.0;
      c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    });
    StatusOr<HfModel> r = ReadHfModelDir(dir);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->config.llama.rope_theta, 500000.0f);
    EXPECT_EQ(r->config.llama.rope_scaling,
              (RopeScaling{RopeScalingType::kLlama3, 8.0f, 1.0f, 4.0f, 8192}));
  }
  expect(ReadHfModelDir(with_config("gelu", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; })),
         StatusCode::kInvalidArgument, {"config.json", "hidden_act", "gelu"});
  expect(ReadHfModelDir(with_config("attention-bias", [](nlohmann::json& c) { c["attention_bias"] = true; })),
         StatusCode::kInvalidArgument, {"attention_bias"});
  expect(ReadHfModelDir(with_config("no-layers", [](nlohmann::json& c) { c.erase("num_hidden_layers"); })),
         StatusCode::kInvalidArgument, {"num_hidden_layers", "missing"});
  expect(ReadHfModelDir(with_config("kv-heads", [](nlohmann::json& c) { c["num_key_value_heads"] = 3; })),
         StatusCode::kInvalidArgument, {"n_kv_head"});
  {  // A tensor missing from the weights.
    const std::string dir = CopyOf(kLlama, "llama-no-tensor");
    SafeTensorsFile f = *SafeTensorsFile::Read(dir + "/model.safetensors");
    std::vector<SafeTensorsEntry> kept;
    for (const SafeTensorsEntry& e : f.Entries()) {
      if (e.name != "model.layers.1.mlp.up_proj.weight") kept.push_back(e);
    }
    ASSERT_TRUE(WriteSafeTensors(dir + "/model.safetensors", kept, {{"format", "pt"}}).ok());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"model.layers.1.mlp.up_proj.weight", "missing"});
  }
  {  // An untied model needs its head.
    const std::string dir = CopyOf(kLlama, "llama-no-head");
    SafeTensorsFile f = *SafeTensorsFile::Read(dir + "/model.safetensors");
    std::vector<SafeTensorsEntry> kept;
    for (const SafeTensorsEntry& e : f.Entries()) {
      if (e.name != "lm_head.weight") kept.push_back(e);
    }
    ASSERT_TRUE(WriteSafeTensors(dir + "/model.safetensors", kept, {{"format", "pt"}}).ok());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"lm_head.weight", "missing", "tie_word_embeddings"});
  }
  {  // A tied model cannot take a head that is not embed_tokens.
    const std::string dir = with_config("llama-odd-head", [](nlohmann::json& c) { c["tie_word_embeddings"] = true; });
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"lm_head.weight", "embed_tokens", "tie"});
  }
  {  // A tensor the model does not have.
    const std::string dir = CopyOf(kLlama, "llama-extra");
    SafeTensorsFile f = *SafeTensorsFile::Read(dir + "/model.safetensors");
    std::vector<SafeTensorsEntry> all = f.Entries();
    std::vector<float> bias(64, 0.0f);
    all.push_back({"model.layers.0.self_attn.o_proj.bias", DType::kF32, Shape{64}, bias.data()});
    ASSERT_TRUE(WriteSafeTensors(dir + "/model.safetensors", all, {{"format", "pt"}}).ok());
    expect(ReadHfModelDir(dir), StatusCode::kInvalidArgument, {"model.layers.0.self_attn.o_proj.bias"});
  }
}

// What a user does with a Llama directory: a trainer whose model is the
// directory, its weights loaded in the hf-llama layout, a step, and a
// directory written back that reads as the same model with trained
// weights: transformers' untied Llama, and a tied one of ours (its head is
// the embedding, gathered for both uses and stored once).
TEST(HfCheckpoint, ATrainerTrainsALlamaDirectoryAndWritesOneBack) {
  StatusOr<HfModel> untied = ReadHfModelDir(kLlama);
  ASSERT_TRUE(untied.ok()) << untied.status();
  NamedModelConfig tied_config = untied->config;
  tied_config.llama.tie_word_embeddings = true;
  const std::string tied_dir = ::testing::TempDir() + "/tied-llama-in";
  fs::remove_all(tied_dir);
  ASSERT_TRUE(WriteHfModelDir(tied_dir, tied_config, InitialWeights(**CreateModel(tied_config), 3)).ok());
  for (const std::string& in : {kLlama, tied_dir}) {
    SCOPED_TRACE(in);
    const std::string out = ::testing::TempDir() + "/trained-" + fs::path(in).filename().string() + "/";
    fs::remove_all(out);
    Status s = comm::RunLocalRanks(2, [&](int, comm::ProcessGroup* g) -> Status {
      TrainerOptions o;
      o.model = in;
      o.batch_size = 2;
      o.seq_len = 16;
      o.data_tokens = 1024;
      o.fsdp.timeout = Duration(60'000);
      SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, g));
      SK_RETURN_IF_ERROR(t->LoadFullStateDict(in, WeightLayout::kHfLlama));
      SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
      if (!(std::isfinite(m.loss) && m.loss > 0)) return InternalError("loss " + std::to_string(m.loss));
      return t->SaveFullStateDict(out, WeightLayout::kHfLlama);
    });
    ASSERT_TRUE(s.ok()) << s;
    StatusOr<HfModel> before = ReadHfModelDir(in);
    StatusOr<HfModel> after = ReadHfModelDir(out);
    ASSERT_TRUE(before.ok() && after.ok()) << before.status() << after.status();
    const bool tied = before->config.llama.tie_word_embeddings;
    EXPECT_EQ(after->config.llama.tie_word_embeddings, tied);
    EXPECT_EQ(ReadHfWeights(out)->contains("lm_head.weight"), !tied);
    for (const char* name : {"layers.0.self_attn.q_proj.w", "embed.embed_tokens.w"}) {
      const SafeTensorsFile::Info info = *after->weights.info(name);
      EXPECT_NE(std::memcmp(*after->weights.data(name), *before->weights.data(name), info.nbytes), 0)
          << name << ": the step changed it";
    }
  }
}

// Issue 43 item 5: a trainer created with skip_init draws nothing from the
// initialisers; loading a directory into it gives the bits a load into an
// initialised trainer gives (master shards, then a step's loss and shards),
// at world 1 and 2, tied and untied. Until a load succeeds every step,
// evaluation and save is FailedPrecondition and nothing changes: the shards
// stay zero, the step count 0; a failed load or a resume from an empty root
// loads nothing.
TEST(HfCheckpoint, SkipInitLoadsTheBitsALoadAfterInitLoads) {
  for (const std::string& dir : {kLlama, kGpt2}) {
    const WeightLayout layout = dir == kGpt2 ? WeightLayout::kHfGpt2 : WeightLayout::kHfLlama;
    for (int world : {1, 2}) {
      SCOPED_TRACE(dir + " at world " + std::to_string(world));
      // Per rank: [0] = initialised, [1] = skip_init; shards after the load
      // and after one step, and the step's loss.
      std::vector<std::vector<float>> loaded[2][2], stepped[2][2];
      float loss[2][2] = {};
      std::mutex mu;
      Status s = comm::RunLocalRanks(world, [&](int r, comm::ProcessGroup* g) -> Status {
        auto shards = [](Trainer& t) {
          std::vector<float> all;
          for (int u = 0; u < t.fsdp()->num_units(); ++u) {
            const Tensor& m = t.fsdp()->master_shard(u);
            const float* p = static_cast<const float*>(m.data());
            all.insert(all.end(), p, p + m.numel());
          }
          return all;
        };
        for (int skip = 0; skip < 2; ++skip) {
          TrainerOptions o;
          o.model = dir;
          o.batch_size = 2;
          o.seq_len = 12;
          o.data_tokens = 1024;
          o.fsdp.timeout = Duration(60'000);
          o.fsdp.skip_init = skip == 1;
          SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, g));
          if (skip == 1) {
            if (t->weights_loaded()) return InternalError("skip_init trainer claims weights");
            for (float v : shards(*t)) {
              if (v != 0.f) return InternalError("skip_init left a nonzero (initialised?) master value");
            }
            const std::string ckpt = ::testing::TempDir() + "/skip-init-ckpt-" + std::to_string(world);
            const std::vector<std::pair<std::string, Status>> refused = {
                {"Step", t->Step().status()},
                {"StepOnBatches", t->StepOnBatches({*t->BatchFor(0, 0)}).status()},
                {"Evaluate", t->Evaluate(1).status()},
                {"SaveCheckpoint", t->SaveCheckpoint(ckpt)},
                {"SaveCheckpointRotating", t->SaveCheckpointRotating(ckpt, 1)},
                {"SaveFullStateDict", t->SaveFullStateDict(ckpt + ".safetensors")},
            };
            for (const auto& [call, st] : refused) {
              if (st.code() != StatusCode::kFailedPrecondition ||
                  st.message().find("skip_init") == std::string::npos ||
                  st.message().find(call) == std::string::npos) {
                return InternalError(call + " without weights: " + st.ToString());
              }
            }
            if (t->steps() != 0 || fs::exists(ckpt) || fs::exists(ckpt + ".safetensors")) {
              return InternalError("a refused call changed something");
            }
            // Loads that load nothing leave it refusing.
            SK_ASSIGN_OR_RETURN(bool resumed, t->ResumeLatest(::testing::TempDir() + "/skip-init-none"));
            if (resumed) return InternalError("resumed from an empty root");
            if (t->LoadFullStateDict(dir + "/missing", layout).ok()) return InternalError("loaded a missing dir");
            if (t->Step().status().code() != StatusCode::kFailedPrecondition) {
              return InternalError("a failed load counted as loaded");
            }
          }
          SK_RETURN_IF_ERROR(t->LoadFullStateDict(dir, layout));
          if (!t->weights_loaded()) return InternalError("not loaded after the load");
          std::vector<float> after_load = shards(*t);
          SK_ASSIGN_OR_RETURN(StepMetrics m, t->Step());
          std::vector<float> after_step = shards(*t);
          std::lock_guard<std::mutex> lock(mu);
          loaded[skip][r].push_back(std::move(after_load));
          stepped[skip][r].push_back(std::move(after_step));
          loss[skip][r] = m.loss;
        }
        return OkStatus();
      });
      ASSERT_TRUE(s.ok()) << s;
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(loaded[0][r].size(), 1u);
        ASSERT_EQ(loaded[1][r].size(), 1u);
        const std::vector<float>& a = loaded[0][r][0];
        const std::vector<float>& b = loaded[1][r][0];
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "rank " << r << " after the load";
        const std::vector<float>& c = stepped[0][r][0];
        const std::vector<float>& d = stepped[1][r][0];
        EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)), 0) << "rank " << r << " after a step";
        EXPECT_EQ(loss[0][r], loss[1][r]) << "rank " << r;
        EXPECT_NE(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0) << "the step changed nothing";
      }
    }
  }
}

// A skip_init trainer takes its weights from a sharded checkpoint as well;
// DDP and the simulator, which load none, refuse the option.
TEST(HfCheckpoint, SkipInitLoadsACheckpointAndIsRefusedWhereNothingLoads) {
  const std::string ckpt = ::testing::TempDir() + "/skip-init-from";
  fs::remove_all(ckpt);
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 2;
  o.seq_len = 16;
  o.data_tokens = 1024;
  o.fsdp.timeout = Duration(60'000);
  float losses[2] = {};
  Status s = comm::RunLocalRanks(2, [&](int r, comm::ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> a, Trainer::Create(o, g));
    SK_RETURN_IF_ERROR(a->Step().status());
    SK_RETURN_IF_ERROR(a->SaveCheckpoint(ckpt));
    SK_ASSIGN_OR_RETURN(StepMetrics ma, a->Step());
    TrainerOptions skip = o;
    skip.fsdp.skip_init = true;
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> b, Trainer::Create(skip, g));
    SK_RETURN_IF_ERROR(b->LoadCheckpoint(ckpt));
    SK_ASSIGN_OR_RETURN(StepMetrics mb, b->Step());
    if (r == 0) {
      losses[0] = ma.loss;
      losses[1] = mb.loss;
    }
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(losses[0], losses[1]);

  TrainerOptions ddp = o;
  ddp.fsdp.skip_init = true;
  ddp.parallelism = Parallelism::kDdp;
  Status st = ValidateTrainerOptions(ddp);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("skip_init"), std::string::npos) << st;
  TrainerOptions sim = o;
  sim.fsdp.skip_init = true;
  sim.device.kind = DeviceKind::kSim;
  st = Trainer::Create(sim, nullptr).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("skip_init"), std::string::npos) << st;
}

// Issue 47 item 1: an untied model's directory (or single file) without
// lm_head.weight is InvalidArgument for a full-state-dict load too (the
// trainer's and the engine's path), never the embedding's transpose; and
// nothing in the model changes.
TEST(HfCheckpoint, AnUntiedModelWithoutItsHeadIsRefusedByFullStateDictLoads) {
  StatusOr<HfModel> llama = ReadHfModelDir(kLlama);
  ASSERT_TRUE(llama.ok()) << llama.status();
  NamedModelConfig gpt = ReadHfModelDir(kGpt2)->config;
  gpt.gpt.tie_word_embeddings = false;
  const std::string gpt_dir = ::testing::TempDir() + "/untied-gpt2-in";
  fs::remove_all(gpt_dir);
  ASSERT_TRUE(WriteHfModelDir(gpt_dir, gpt, InitialWeights(**CreateModel(gpt), 5)).ok());
  struct Case {
    std::string dir;
    NamedModelConfig config;
    WeightLayout layout;
  };
  for (const Case& c : {Case{CopyOf(kLlama, "llama-headless"), llama->config, WeightLayout::kHfLlama},
                        Case{gpt_dir, gpt, WeightLayout::kHfGpt2}}) {
    SCOPED_TRACE(c.dir);
    SafeTensorsFile f = *SafeTensorsFile::Read(c.dir + "/model.safetensors");
    ASSERT_TRUE(f.contains("lm_head.weight"));
    std::vector<SafeTensorsEntry> kept;
    for (const SafeTensorsEntry& e : f.Entries()) {
      if (e.name != "lm_head.weight") kept.push_back(e);
    }
    ASSERT_TRUE(WriteSafeTensors(c.dir + "/model.safetensors", kept, {{"format", "pt"}}).ok());
    auto model = *CreateModel(c.config);
    testing::RunRanks(1, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o;
      o.timeout = Duration(60'000);
      auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
      TrainingState st{c.dir, &model->units(), fsdp.get(), nullptr};
      const int head = static_cast<int>(model->units().size()) - 1;
      int lm = 0;
      while (model->units()[head].params[lm].name != "lm_head.w") ++lm;
      const Tensor before = *fsdp->GatherFullParam(head, lm);
      std::vector<char> was(static_cast<const char*>(before.data()),
                            static_cast<const char*>(before.data()) + before.nbytes());
      FullStateDictOptions hf;
      hf.layout = c.layout;
      for (const std::string& path : {c.dir, c.dir + "/model.safetensors"}) {
        StatusOr<int64_t> step = LoadFullStateDict(path, st, hf);
        ASSERT_FALSE(step.ok()) << path << " loaded without lm_head.weight";
        EXPECT_EQ(step.status().code(), StatusCode::kInvalidArgument) << step.status();
        for (const char* w : {"lm_head.weight", "missing"}) {
          EXPECT_NE(step.status().message().find(w), std::string::npos) << w << " not in " << step.status();
        }
        const Tensor after = *fsdp->GatherFullParam(head, lm);
        EXPECT_EQ(std::memcmp(after.data(), was.data(), was.size()), 0) << "the head changed";
      }
    });
  }
}

// Issue 43 item 5: a full-state-dict load of a Hugging Face directory reads
// each parameter's tensor by itself (byte ranges of the rank's slices, or one
// tensor whole when the file holds its transpose) and widens it into the
// shard: at world 3 (slices that split tensors unevenly), from f32 and bf16
// files, sharded or single, it holds exactly the parameters ReadHfModelDir
// reads whole.
TEST(HfCheckpoint, RangedLoadsGiveTheWholeFileReadsParametersOnEveryRank) {
  StatusOr<HfModel> llama = ReadHfModelDir(kLlama);
  ASSERT_TRUE(llama.ok()) << llama.status();
  // The same weights in bf16, sharded (two tensors per file at most).
  const std::string bf16_dir = CopyOf(kLlama, "llama-bf16");
  {
    SafeTensorsFile f = *SafeTensorsFile::Read(kLlama + "/model.safetensors");
    std::vector<std::vector<uint16_t>> halves;
    std::vector<SafeTensorsEntry> entries;
    for (const SafeTensorsEntry& e : f.Entries()) {
      std::vector<uint16_t> h(e.shape.numel());
      for (size_t i = 0; i < h.size(); ++i) h[i] = FloatToBF16(static_cast<const float*>(e.data)[i]).bits;
      halves.push_back(std::move(h));
      entries.push_back({e.name, DType::kBF16, e.shape, halves.back().data()});
    }
    SafeTensorsFile b = *SafeTensorsFile::FromEntries(entries, {{"format", "pt"}});
    fs::remove(bf16_dir + "/model.safetensors");
    ASSERT_TRUE(WriteHfModelDir(bf16_dir, llama->config, *ConvertWeights(b, WeightLayout::kHfLlama,
                                                                        WeightLayout::kShardkit),
                                HfWriteOptions{4096, ""})
                    .ok());
    ASSERT_TRUE(fs::exists(bf16_dir + "/model.safetensors.index.json"));
  }
  StatusOr<HfModel> widened = ReadHfModelDir(bf16_dir);
  ASSERT_TRUE(widened.ok()) << widened.status();
  auto model = *CreateModel(llama->config);
  for (const auto& [dir, want] : std::vector<std::pair<std::string, const HfModel*>>{
           {kLlama, &*llama}, {bf16_dir, &*widened}, {kLlama + "/model.safetensors", &*llama}}) {
    SCOPED_TRACE(dir);
    std::mutex mu;
    testing::RunRanks(3, [&](int rank, comm::ProcessGroup* world) {
      CachingAllocator alloc(*Device::Get(DeviceId::Cpu(rank)));
      FsdpOptions o;
      o.timeout = Duration(60'000);
      auto fsdp = *FullyShardedModel::Create(model->units(), world, &alloc, o);
      TrainingState st{kLlama, &model->units(), fsdp.get(), nullptr};
      FullStateDictOptions hf;
      hf.layout = WeightLayout::kHfLlama;
      StatusOr<int64_t> step = LoadFullStateDict(dir, st, hf);
      ASSERT_TRUE(step.ok()) << step.status();
      EXPECT_EQ(*step, 0);
      for (size_t u = 0; u < model->units().size(); ++u) {
        for (size_t i = 0; i < model->units()[u].params.size(); ++i) {
          StatusOr<Tensor> t = fsdp->GatherFullParam(static_cast<int>(u), static_cast<int>(i));
          ASSERT_TRUE(t.ok()) << t.status();
          const std::string name = FullParamName(model->units()[u], model->units()[u].params[i]);
          const SafeTensorsFile::Info info = *want->weights.info(name);
          std::vector<float> expected(t->numel());
          for (int64_t k = 0; k < t->numel(); ++k) {
            const char* p = static_cast<const char*>(*want->weights.data(name));
            if (info.dtype == DType::kBF16) {
              BF16 h;
              std::memcpy(&h.bits, p + 2 * k, 2);
              expected[k] = BF16ToFloat(h);
            } else {
              std::memcpy(&expected[k], p + 4 * k, 4);
            }
          }
          std::lock_guard<std::mutex> lock(mu);
          EXPECT_EQ(std::memcmp(t->data(), expected.data(), t->nbytes()), 0) << name;
        }
      }
    });
  }
}

// Issue 43 items 4 and 5: a trainer's directory is written one unit per
// file with transformers' index, and carries what generate() and the
// tokenizer need from the directory the model came from: bos/eos/pad in
// config.json, generation_config.json (copied, or written from the ids) and
// the tokenizer files. A second save with fewer files leaves no stale shard.
TEST(HfCheckpoint, ExportsCarryTokensGenerationConfigAndTokenizerFiles) {
  const std::string src = CopyOf(kLlama, "llama-with-tokenizer");
  fs::remove(src + "/generation_config.json");  // written from the ids, first
  nlohmann::json c = nlohmann::json::parse(Slurp(src + "/config.json"));
  c["bos_token_id"] = 1;
  c["eos_token_id"] = nlohmann::json::array({2, 7});
  c["pad_token_id"] = nullptr;
  Spit(src + "/config.json", c.dump());
  Spit(src + "/tokenizer.json", R"({"version": "1.0", "model": {"type": "WordLevel"}})");
  Spit(src + "/tokenizer_config.json", R"({"eos_token": "</s>"})");
  Spit(src + "/special_tokens_map.json", R"({"eos_token": "</s>"})");
  const std::string out = ::testing::TempDir() + "/exported-with-tokenizer/";
  fs::remove_all(out);
  fs::create_directories(out);
  Spit(out + "/model-00001-of-00099.safetensors", "stale");  // an earlier save's
  Status s = comm::RunLocalRanks(2, [&](int, comm::ProcessGroup* g) -> Status {
    TrainerOptions o;
    o.model = src;
    o.batch_size = 2;
    o.seq_len = 16;
    o.data_tokens = 1024;
    o.fsdp.timeout = Duration(60'000);
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(o, g));
    SK_RETURN_IF_ERROR(t->LoadFullStateDict(src, WeightLayout::kHfLlama));
    return t->SaveFullStateDict(out, WeightLayout::kHfLlama);
  });
  ASSERT_TRUE(s.ok()) << s;
  nlohmann::json written = nlohmann::json::parse(Slurp(out + "/config.json"));
  EXPECT_EQ(written["bos_token_id"], 1);
  EXPECT_EQ(written["eos_token_id"], nlohmann::json::array({2, 7}));
  EXPECT_TRUE(written["pad_token_id"].is_null());
  nlohmann::json gen = nlohmann::json::parse(Slurp(out + "/generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], nlohmann::json::array({2, 7}));
  EXPECT_EQ(gen["bos_token_id"], 1);
  EXPECT_TRUE(gen["_from_model_config"].get<bool>());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    EXPECT_EQ(Slurp(out + "/" + f), Slurp(src + "/" + f)) << f;
  }
  // One file per unit (embed, two layers, head), named as transformers names shards.
  nlohmann::json index = nlohmann::json::parse(Slurp(out + "/model.safetensors.index.json"));
  std::set<std::string> files;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) files.insert(it.value());
  EXPECT_EQ(files, (std::set<std::string>{"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                          "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}));
  EXPECT_GT(index["metadata"]["total_size"].get<int64_t>(), 0);
  EXPECT_FALSE(fs::exists(out + "/model-00001-of-00099.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  StatusOr<HfModel> back = ReadHfModelDir(out);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(ReadHfModelDir(src)->weights, back->weights);
  // A source's own generation_config.json is copied as it is.
  Spit(src + "/generation_config.json", R"({"eos_token_id": 7, "temperature": 0.5})");
  const std::string out2 = ::testing::TempDir() + "/exported-with-generation-config";
  fs::remove_all(out2);
  NamedModelConfig config = *ReadHfConfig(src);
  ASSERT_TRUE(WriteHfModelDir(out2, config, back->weights).ok());
  EXPECT_EQ(Slurp(out2 + "/generation_config.json"), Slurp(src + "/generation_config.json"));
  // Or a directory the caller names; a model of no directory writes no ids.
  const std::string out3 = ::testing::TempDir() + "/exported-named-source";
  fs::remove_all(out3);
  NamedModelConfig plain = config;
  plain.name = "llama-tiny";
  ASSERT_TRUE(WriteHfModelDir(out3, plain, back->weights).ok());
  EXPECT_FALSE(fs::exists(out3 + "/generation_config.json"));
  EXPECT_FALSE(nlohmann::json::parse(Slurp(out3 + "/config.json")).contains("eos_token_id"));
  ASSERT_TRUE(WriteHfModelDir(out3, plain, back->weights, HfWriteOptions{0, src}).ok());
  EXPECT_TRUE(fs::exists(out3 + "/tokenizer.json"));
  EXPECT_EQ(nlohmann::json::parse(Slurp(out3 + "/config.json"))["eos_token_id"], nlohmann::json::array({2, 7}));
  // Bad input: a token id that is not one, a source that is not a directory.
  c["eos_token_id"] = "2";
  Spit(src + "/config.json", c.dump());
  Status bad = WriteHfModelDir(out3, plain, back->weights, HfWriteOptions{0, src});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("eos_token_id"), std::string::npos) << bad;
  EXPECT_EQ(WriteHfModelDir(out3, plain, back->weights, HfWriteOptions{0, src + "/nope"}).code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace sk
