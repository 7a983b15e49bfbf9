// Weight layouts (runtime/checkpoint/weight_layout.h): a Hugging Face GPT-2 state
// dict built here by hand (GPT2LMHeadModel names, Conv1D [in, out] weights,
// tied head) converts to shardkit's layout and back to identical bytes; the
// split q/k/v and torch layouts convert to the same shardkit tensors; a
// trainer that imports the file computes the same forward pass as one that
// loads the converted file natively, and exports it byte for byte; mismatches
// are errors naming the tensor and both shapes.
#include "runtime/checkpoint/weight_layout.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/comm/local_backend.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/nn/configs.h"
#include "runtime/train/trainer.h"

namespace sk {
namespace {

// gpt-tiny (runtime/nn/configs.cc): vocab 64, 16 positions, 2 layers, d 32.
constexpr int64_t kVocab = 64, kPos = 16, kLayers = 2, kD = 32, kFf = 4 * kD;

std::string TempPath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/weight-layout-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

// Named f32 tensors with their storage.
class Tensors {
 public:
  void Add(const std::string& name, std::vector<int64_t> dims, uint32_t seed) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    uint32_t x = seed * 2654435761u + 1;
    for (float& f : v) {
      x = x * 1664525u + 1013904223u;
      f = (static_cast<float>(x >> 8) / static_cast<float>(1 << 24) - 0.5f) * 0.1f;
    }
    AddValues(name, std::move(dims), std::move(v));
  }
  void AddValues(const std::string& name, std::vector<int64_t> dims, std::vector<float> v) {
    names_.push_back(name);
    shapes_[name] = Shape(std::move(dims));
    data_[name] = std::move(v);
  }
  const std::vector<float>& operator[](const std::string& name) const { return data_.at(name); }
  std::vector<SafeTensorsEntry> Entries() const {
    std::vector<SafeTensorsEntry> e;
    for (const auto& n : names_) e.push_back({n, DType::kF32, shapes_.at(n), data_.at(n).data()});
    return e;
  }
  SafeTensorsFile File() const {
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::FromEntries(Entries(), {{"format", "pt"}});
    EXPECT_TRUE(f.ok()) << f.status();
    return std::move(*f);
  }

 private:
  std::vector<std::string> names_;
  std::map<std::string, Shape> shapes_;
  std::map<std::string, std::vector<float>> data_;
};

// A GPT2LMHeadModel state dict of gpt-tiny's shape, as transformers saves
// it: tied head (no lm_head.weight), Conv1D weights [in, out].
Tensors HfGpt2(bool with_lm_head = false) {
  Tensors t;
  uint32_t seed = 1;
  t.Add("transformer.wte.weight", {kVocab, kD}, seed++);
  t.Add("transformer.wpe.weight", {kPos, kD}, seed++);
  for (int l = 0; l < kLayers; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    t.Add(h + "ln_1.weight", {kD}, seed++);
    t.Add(h + "ln_1.bias", {kD}, seed++);
    t.Add(h + "attn.c_attn.weight", {kD, 3 * kD}, seed++);
    t.Add(h + "attn.c_attn.bias", {3 * kD}, seed++);
    t.Add(h + "attn.c_proj.weight", {kD, kD}, seed++);
    t.Add(h + "attn.c_proj.bias", {kD}, seed++);
    t.Add(h + "ln_2.weight", {kD}, seed++);
    t.Add(h + "ln_2.bias", {kD}, seed++);
    t.Add(h + "mlp.c_fc.weight", {kD, kFf}, seed++);
    t.Add(h + "mlp.c_fc.bias", {kFf}, seed++);
    t.Add(h + "mlp.c_proj.weight", {kFf, kD}, seed++);
    t.Add(h + "mlp.c_proj.bias", {kD}, seed++);
  }
  t.Add("transformer.ln_f.weight", {kD}, seed++);
  t.Add("transformer.ln_f.bias", {kD}, seed++);
  if (with_lm_head) t.Add("lm_head.weight", {kVocab, kD}, seed++);
  return t;
}

std::vector<char> Bytes(const SafeTensorsFile& f, const std::string& name) {
  StatusOr<SafeTensorsFile::Info> i = f.info(name);
  EXPECT_TRUE(i.ok()) << name << ": " << i.status();
  if (!i.ok()) return {};
  const char* p = static_cast<const char*>(*f.data(name));
  return std::vector<char>(p, p + i->nbytes);
}

// Every tensor of `a` is in `b` with the same dtype, shape and bytes, and
// neither has others.
void ExpectSameTensors(const SafeTensorsFile& a, const SafeTensorsFile& b) {
  std::set<std::string> an(a.names().begin(), a.names().end()), bn(b.names().begin(), b.names().end());
  EXPECT_EQ(an, bn);
  for (const std::string& n : a.names()) {
    if (!b.contains(n)) continue;
    EXPECT_EQ(a.info(n)->dtype, b.info(n)->dtype) << n;
    EXPECT_EQ(a.info(n)->shape, b.info(n)->shape) << n;
    EXPECT_TRUE(Bytes(a, n) == Bytes(b, n)) << n << " differs";
  }
}

float At(const SafeTensorsFile& f, const std::string& name, int64_t i) {
  float v;
  std::memcpy(&v, static_cast<const char*>(*f.data(name)) + i * 4, 4);
  return v;
}

TEST(WeightLayoutTest, HfGpt2ToShardkitAndBackIsByteIdentical) {
  const SafeTensorsFile hf = HfGpt2().File();
  StatusOr<SafeTensorsFile> mine = ConvertWeights(hf, WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->metadata().at("format"), "shardkit");
  // Names and layout: c_attn is qkv.w as is; the tied head is wte transposed.
  EXPECT_EQ(mine->info("h.1.attn.qkv.w")->shape, (Shape{kD, 3 * kD}));
  EXPECT_TRUE(Bytes(*mine, "h.1.attn.qkv.w") == Bytes(hf, "transformer.h.1.attn.c_attn.weight"));
  EXPECT_TRUE(Bytes(*mine, "h.0.mlp.ln.b") == Bytes(hf, "transformer.h.0.ln_2.bias"));
  EXPECT_TRUE(Bytes(*mine, "head.ln.g") == Bytes(hf, "transformer.ln_f.weight"));
  ASSERT_EQ(mine->info("head.lm_head.w")->shape, (Shape{kD, kVocab}));
  EXPECT_EQ(At(*mine, "head.lm_head.w", 5 * kVocab + 7), At(hf, "transformer.wte.weight", 7 * kD + 5));
  EXPECT_EQ(mine->names().size(), 4u + 12u * kLayers + 1u);

  StatusOr<SafeTensorsFile> back = ConvertWeights(*mine, WeightLayout::kShardkit, WeightLayout::kHfGpt2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metadata().at("format"), "pt");
  ExpectSameTensors(hf, *back);  // the tied head is left out again
}

TEST(WeightLayoutTest, UntiedHeadRoundTripsAsLmHeadWeight) {
  const SafeTensorsFile hf = HfGpt2(/*with_lm_head=*/true).File();
  StatusOr<SafeTensorsFile> mine = ConvertWeights(hf, WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(At(*mine, "head.lm_head.w", 3 * kVocab + 9), At(hf, "lm_head.weight", 9 * kD + 3));
  StatusOr<SafeTensorsFile> back = ConvertWeights(*mine, WeightLayout::kShardkit, WeightLayout::kHfGpt2);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(hf, *back);
}

TEST(WeightLayoutTest, GptModelFilesWithoutPrefixAndWithMaskBuffersRead) {
  // GPT2Model files have no "transformer." prefix; older ones carry the
  // attention mask buffers, which are not weights.
  Tensors t;
  const Tensors full = HfGpt2();
  for (const SafeTensorsEntry& e : full.Entries()) {
    std::vector<float> v(full[e.name]);
    t.AddValues(e.name.substr(std::strlen("transformer.")), e.shape.ToVector(), std::move(v));
  }
  t.Add("h.0.attn.bias", {1, 1, kPos, kPos}, 99);
  t.Add("h.1.attn.masked_bias", {}, 98);
  StatusOr<SafeTensorsFile> a = ConvertWeights(t.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  StatusOr<SafeTensorsFile> b = ConvertWeights(full.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectSameTensors(*a, *b);
}

TEST(WeightLayoutTest, SplitQkvInLinearLayoutFusesIntoCAttn) {
  const Tensors fused = HfGpt2();
  Tensors split;
  for (const SafeTensorsEntry& e : fused.Entries()) {
    const std::string& n = e.name;
    const size_t at = n.find("attn.c_attn.");
    if (at == std::string::npos) {
      split.AddValues(n, e.shape.ToVector(), fused[n]);
      continue;
    }
    const std::string h = n.substr(0, at);
    const char* parts[3] = {"q_proj", "k_proj", "v_proj"};
    const std::vector<float>& v = fused[n];
    for (int j = 0; j < 3; ++j) {
      if (n.find("weight") != std::string::npos) {
        // c_attn [d, 3d] -> nn.Linear [out = d, in = d] per projection.
        std::vector<float> w(kD * kD);
        for (int64_t o = 0; o < kD; ++o) {
          for (int64_t i = 0; i < kD; ++i) w[o * kD + i] = v[i * 3 * kD + j * kD + o];
        }
        split.AddValues(h + "attn." + parts[j] + ".weight", {kD, kD}, std::move(w));
      } else {
        split.AddValues(h + "attn." + parts[j] + ".bias", {kD},
                        std::vector<float>(v.begin() + j * kD, v.begin() + (j + 1) * kD));
      }
    }
  }
  StatusOr<SafeTensorsFile> a = ConvertWeights(split.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  StatusOr<SafeTensorsFile> b = ConvertWeights(fused.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectSameTensors(*a, *b);
}

TEST(WeightLayoutTest, SplitQkvMismatchNamesBothTensorsAndShapes) {
  Tensors t = HfGpt2();
  Tensors split;
  for (const SafeTensorsEntry& e : t.Entries()) {
    if (e.name.find("h.0.attn.c_attn") == std::string::npos) split.AddValues(e.name, e.shape.ToVector(), t[e.name]);
  }
  split.Add("transformer.h.0.attn.q_proj.weight", {kD, kD}, 1);
  split.Add("transformer.h.0.attn.k_proj.weight", {kD, kD + 1}, 2);
  split.Add("transformer.h.0.attn.v_proj.weight", {kD, kD}, 3);
  StatusOr<SafeTensorsFile> r = ConvertWeights(split.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string m(r.status().message());
  EXPECT_NE(m.find("transformer.h.0.attn.k_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[32, 33]"), std::string::npos) << m;
  EXPECT_NE(m.find("transformer.h.0.attn.q_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[32, 32]"), std::string::npos) << m;
}

TEST(WeightLayoutTest, TorchLayoutTransposesMatmulWeightsOnly) {
  StatusOr<SafeTensorsFile> mine = ConvertWeights(HfGpt2().File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(mine.ok()) << mine.status();
  StatusOr<SafeTensorsFile> torch = ConvertWeights(*mine, WeightLayout::kShardkit, WeightLayout::kTorch);
  ASSERT_TRUE(torch.ok()) << torch.status();
  EXPECT_EQ(torch->info("h.0.mlp.fc.w")->shape, (Shape{kFf, kD}));  // nn.Linear [out, in]
  EXPECT_EQ(At(*torch, "h.0.mlp.fc.w", 100 * kD + 3), At(*mine, "h.0.mlp.fc.w", 3 * kFf + 100));
  EXPECT_TRUE(Bytes(*torch, "embed.wte") == Bytes(*mine, "embed.wte"));  // embeddings as they are
  EXPECT_TRUE(Bytes(*torch, "h.1.attn.qkv.b") == Bytes(*mine, "h.1.attn.qkv.b"));
  StatusOr<SafeTensorsFile> back = ConvertWeights(*torch, WeightLayout::kTorch, WeightLayout::kShardkit);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(*mine, *back);
}

TEST(WeightLayoutTest, ErrorsNameTheTensor) {
  Tensors extra = HfGpt2();
  extra.Add("transformer.h.0.attn.rotary.weight", {4}, 1);
  StatusOr<SafeTensorsFile> r = ConvertWeights(extra.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("transformer.h.0.attn.rotary.weight"), std::string::npos);

  Tensors t5;
  t5.Add("embed.enc_wte", {kVocab, kD}, 1);
  r = ConvertWeights(t5.File(), WeightLayout::kShardkit, WeightLayout::kHfGpt2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("embed.enc_wte"), std::string::npos) << r.status();

  Tensors optim;
  optim.Add("embed.wte", {kVocab, kD}, 1);
  optim.Add("optimizer.exp_avg.embed.wte", {kVocab, kD}, 2);
  r = ConvertWeights(optim.File(), WeightLayout::kShardkit, WeightLayout::kTorch);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("optimizer.exp_avg.embed.wte"), std::string::npos) << r.status();
  ConvertOptions drop;
  drop.drop_optimizer_state = true;
  r = ConvertWeights(optim.File(), WeightLayout::kShardkit, WeightLayout::kTorch, drop);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->names(), std::vector<std::string>{"embed.wte"});

  Tensors bad;
  bad.Add("h.0.attn.qkv.w", {kD * 3 * kD}, 1);  // 1-D: cannot be an nn.Linear weight
  r = ConvertWeights(bad.File(), WeightLayout::kTorch, WeightLayout::kShardkit);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("h.0.attn.qkv.w"), std::string::npos) << r.status();

  EXPECT_FALSE(ParseWeightLayout("hf").ok());
  EXPECT_EQ(*ParseWeightLayout("hf-gpt2"), WeightLayout::kHfGpt2);
  EXPECT_EQ(*LayoutName("h.3.mlp.fc.b", WeightLayout::kHfGpt2), "transformer.h.3.mlp.c_fc.bias");
}

// transformers' Llama names (LlamaModel's, without "model.", as some files
// have them, with an older file's inv_freq buffer): nn.Linear weights
// [out, in] become ours [in, out], the rest keeps its bytes, the buffer is
// skipped, and writing back gives transformers' names and bytes.
TEST(WeightLayoutTest, HfLlamaTransposesLinearWeightsAndRoundTrips) {
  Tensors hf;
  hf.Add("model.embed_tokens.weight", {kVocab, kD}, 1);
  hf.Add("layers.0.input_layernorm.weight", {kD}, 2);
  hf.Add("model.layers.0.self_attn.q_proj.weight", {kD, kD}, 3);
  hf.Add("model.layers.0.self_attn.q_proj.bias", {kD}, 4);
  hf.Add("model.layers.0.self_attn.k_proj.weight", {kD / 2, kD}, 5);
  hf.Add("model.layers.0.mlp.down_proj.weight", {kD, kFf}, 6);
  hf.Add("model.layers.0.self_attn.rotary_emb.inv_freq", {kD / 8}, 7);
  hf.Add("model.norm.weight", {kD}, 8);
  hf.Add("lm_head.weight", {kVocab, kD}, 9);
  StatusOr<SafeTensorsFile> mine = ConvertWeights(hf.File(), WeightLayout::kHfLlama, WeightLayout::kShardkit);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->names().size(), 8u);  // the inv_freq buffer is not a parameter
  EXPECT_EQ(mine->info("layers.0.self_attn.k_proj.w")->shape, Shape({kD, kD / 2}));
  EXPECT_EQ(mine->info("layers.0.mlp.down_proj.w")->shape, Shape({kFf, kD}));
  EXPECT_EQ(mine->info("head.lm_head.w")->shape, Shape({kD, kVocab}));
  const float* k = static_cast<const float*>(*mine->data("layers.0.self_attn.k_proj.w"));
  EXPECT_EQ(k[3 * (kD / 2) + 5], hf["model.layers.0.self_attn.k_proj.weight"][5 * kD + 3]);  // [in 3, out 5]
  EXPECT_EQ(std::memcmp(*mine->data("layers.0.self_attn.q_proj.b"),
                        hf["model.layers.0.self_attn.q_proj.bias"].data(), kD * sizeof(float)),
            0);
  StatusOr<SafeTensorsFile> back = ConvertWeights(*mine, WeightLayout::kShardkit, WeightLayout::kHfLlama);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->contains("model.layers.0.input_layernorm.weight"));  // written with the prefix
  for (const std::string& n : back->names()) {
    const std::string theirs = n == "model.layers.0.input_layernorm.weight" ? "layers.0.input_layernorm.weight" : n;
    ASSERT_EQ(back->info(n)->nbytes, hf[theirs].size() * sizeof(float)) << n;
    EXPECT_EQ(std::memcmp(*back->data(n), hf[theirs].data(), hf[theirs].size() * sizeof(float)), 0) << n;
  }
  EXPECT_EQ(*ParseWeightLayout("hf-llama"), WeightLayout::kHfLlama);
  EXPECT_EQ(*LayoutName("layers.3.mlp.gate_proj.w", WeightLayout::kHfLlama), "model.layers.3.mlp.gate_proj.weight");
  EXPECT_EQ(*LayoutName("head.lm_head.w", WeightLayout::kHfLlama), "lm_head.weight");
  // GPT names have none here.
  StatusOr<std::string> gpt = LayoutName("h.0.attn.qkv.w", WeightLayout::kHfLlama);
  ASSERT_FALSE(gpt.ok());
  EXPECT_NE(gpt.status().message().find("h.0.attn.qkv.w"), std::string::npos) << gpt.status();
}

// Issue 47 item 1: an hf-llama file without lm_head.weight says nothing of
// tying. Unset, it is refused naming the tensor (a Llama's head is its own
// unless its config ties it; the embedding's transpose would be silent wrong
// weights); tied gives no head of its own; untied is refused. GPT-2's files
// never hold a head, so there unset still means the tied wte.
TEST(WeightLayoutTest, HeadlessLlamaFileIsRefusedUnlessTheModelSaysItIsTied) {
  Tensors hf;
  hf.Add("model.embed_tokens.weight", {kVocab, kD}, 1);
  hf.Add("model.norm.weight", {kD}, 2);
  StatusOr<SafeTensorsFile> unset = ConvertWeights(hf.File(), WeightLayout::kHfLlama, WeightLayout::kShardkit);
  ASSERT_FALSE(unset.ok());
  EXPECT_EQ(unset.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unset.status().message().find("lm_head.weight"), std::string::npos) << unset.status();
  ConvertOptions tied;
  tied.tie_word_embeddings = true;
  StatusOr<SafeTensorsFile> mine = ConvertWeights(hf.File(), WeightLayout::kHfLlama, WeightLayout::kShardkit, tied);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_FALSE(mine->contains("head.lm_head.w"));
  ConvertOptions untied;
  untied.tie_word_embeddings = false;
  StatusOr<SafeTensorsFile> refused = ConvertWeights(hf.File(), WeightLayout::kHfLlama, WeightLayout::kShardkit, untied);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("tie_word_embeddings false"), std::string::npos) << refused.status();

  Tensors gpt2;
  gpt2.Add("transformer.wte.weight", {kVocab, kD}, 3);
  StatusOr<SafeTensorsFile> gpt = ConvertWeights(gpt2.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_EQ(gpt->info("head.lm_head.w")->shape, Shape({kD, kVocab}));
}

// GPT-2 small as Hugging Face holds it (GPT2Config(): vocab 50257,
// n_positions 1024, n_embd 768, n_layer 12, Conv1D weights [in, out], the
// head tied to wte and so not in the file): every parameter of the
// gpt2-small config has a name there and the same shape, and its head is
// wte, so the real weights load (the file itself is 500 MB: not downloaded
// here).
TEST(WeightLayoutTest, Gpt2SmallConfigMatchesHuggingFaceGpt2Shapes) {
  std::map<std::string, Shape> hf = {
      {"transformer.wte.weight", Shape{50257, 768}}, {"transformer.wpe.weight", Shape{1024, 768}},
      {"transformer.ln_f.weight", Shape{768}},      {"transformer.ln_f.bias", Shape{768}}};
  for (int l = 0; l < 12; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      hf[h + ln + ".weight"] = Shape{768};
      hf[h + ln + ".bias"] = Shape{768};
    }
    hf[h + "attn.c_attn.weight"] = Shape{768, 2304};
    hf[h + "attn.c_attn.bias"] = Shape{2304};
    hf[h + "attn.c_proj.weight"] = Shape{768, 768};
    hf[h + "attn.c_proj.bias"] = Shape{768};
    hf[h + "mlp.c_fc.weight"] = Shape{768, 3072};
    hf[h + "mlp.c_fc.bias"] = Shape{3072};
    hf[h + "mlp.c_proj.weight"] = Shape{3072, 768};
    hf[h + "mlp.c_proj.bias"] = Shape{768};
  }
  StatusOr<std::unique_ptr<Model>> model = CreateModel(std::string("gpt2-small"));
  ASSERT_TRUE(model.ok()) << model.status();
  size_t seen = 0;
  for (const UnitSpec& u : (*model)->units()) {
    for (const ParamSpec& p : u.params) {
      const std::string mine = u.name + "." + p.name;
      StatusOr<std::string> theirs = LayoutName(mine, WeightLayout::kHfGpt2);
      ASSERT_TRUE(theirs.ok()) << theirs.status();
      ASSERT_TRUE(hf.count(*theirs)) << mine << " -> " << *theirs;
      const Shape want = hf[*theirs];
      EXPECT_EQ(p.shape, want) << mine << " " << p.shape.ToString() << " vs " << *theirs << " " << want.ToString();
      ++seen;
    }
  }
  EXPECT_EQ(seen, hf.size());
  const UnitSpec& head = (*model)->units().back();
  ASSERT_EQ(head.tied.size(), 1u);
  EXPECT_EQ(head.tied[0].owner, "embed.wte");
}

// ---- Through a trainer ------------------------------------------------------

TrainerOptions Tiny(int world) {
  TrainerOptions o;
  o.model = "gpt-tiny";
  o.batch_size = 4 / world;
  o.data_tokens = 96;
  o.fsdp.timeout = Duration(60'000);
  return o;
}

// Runs body on `world` local ranks, each with a gpt-tiny trainer.
void WithTrainers(int world, const std::function<void(int, Trainer&)>& body) {
  Status s = comm::RunLocalRanks(world, [&](int r, comm::ProcessGroup* g) -> Status {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(Tiny(world), g));
    body(r, *t);
    return OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// gpt-tiny's head is a parameter of its own (untied), so the files it loads
// hold lm_head.weight: one without it is INVALID_ARGUMENT, never wte's
// transpose (issue 47 item 1; hf_checkpoint_test).
TEST(WeightLayoutTest, ImportedGpt2ComputesTheNativeForwardAndExportsTheSameBytes) {
  const Tensors hf = HfGpt2(/*with_lm_head=*/true);
  const std::string hf_path = TempPath("hf.safetensors");
  ASSERT_TRUE(WriteSafeTensors(hf_path, hf.Entries(), {{"format", "pt"}}).ok());
  // The same weights in shardkit's layout, loaded natively.
  StatusOr<SafeTensorsFile> mine = ConvertWeights(hf.File(), WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(mine.ok()) << mine.status();
  const std::string native_path = TempPath("native.safetensors");
  ASSERT_TRUE(mine->Write(native_path).ok());

  // Each rank evaluates its own batches: compare rank 0 with rank 0.
  float native_loss = 0, imported_loss = 0;
  WithTrainers(2, [&](int r, Trainer& t) {
    ASSERT_TRUE(t.LoadFullStateDict(native_path).ok());
    const float loss = *t.Evaluate(2);
    if (r == 0) native_loss = loss;
  });
  // Imported on two ranks (each keeps its shard), then exported again.
  const std::string out_path = TempPath("exported.safetensors");
  WithTrainers(2, [&](int r, Trainer& t) {
    const float before = *t.Evaluate(2);
    Status s = t.LoadFullStateDict(hf_path, WeightLayout::kHfGpt2);
    ASSERT_TRUE(s.ok()) << s;
    const float loss = *t.Evaluate(2);
    EXPECT_NE(loss, before);
    if (r == 0) imported_loss = loss;
    s = t.SaveFullStateDict(out_path, WeightLayout::kHfGpt2);
    ASSERT_TRUE(s.ok()) << s;
  });
  EXPECT_EQ(imported_loss, native_loss);
  StatusOr<SafeTensorsFile> exported = SafeTensorsFile::Read(out_path);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->metadata().at("format"), "pt");
  ExpectSameTensors(hf.File(), *exported);
}

// A bf16 GPT-2 file (as many Hugging Face checkpoints are stored): the
// converter keeps bf16 bytes, and a trainer widens them exactly, computing
// the same forward pass as from the same values stored in f32.
TEST(WeightLayoutTest, Bf16Gpt2FilesConvertAsBf16AndLoadWidenedExactly) {
  const Tensors f32 = HfGpt2(/*with_lm_head=*/true);
  std::vector<std::vector<uint16_t>> halves;
  std::vector<std::vector<float>> widened;
  std::vector<SafeTensorsEntry> bf16_entries, f32_entries;
  for (const SafeTensorsEntry& e : f32.Entries()) {
    const std::vector<float>& v = f32[e.name];
    std::vector<uint16_t> h(v.size());
    std::vector<float> w(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &v[i], 4);
      h[i] = static_cast<uint16_t>(bits >> 16);  // truncation: any bf16 value will do
      bits = static_cast<uint32_t>(h[i]) << 16;
      std::memcpy(&w[i], &bits, 4);
    }
    halves.push_back(std::move(h));
    widened.push_back(std::move(w));
    bf16_entries.push_back({e.name, DType::kBF16, e.shape, halves.back().data()});
    f32_entries.push_back({e.name, DType::kF32, e.shape, widened.back().data()});
  }
  StatusOr<SafeTensorsFile> bf16 = SafeTensorsFile::FromEntries(bf16_entries, {{"format", "pt"}});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  StatusOr<SafeTensorsFile> mine = ConvertWeights(*bf16, WeightLayout::kHfGpt2, WeightLayout::kShardkit);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->info("head.lm_head.w")->dtype, DType::kBF16);
  StatusOr<SafeTensorsFile> back = ConvertWeights(*mine, WeightLayout::kShardkit, WeightLayout::kHfGpt2);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(*bf16, *back);

  const std::string bf16_path = TempPath("bf16.safetensors"), f32_path = TempPath("widened.safetensors");
  ASSERT_TRUE(WriteSafeTensors(bf16_path, bf16_entries).ok());
  ASSERT_TRUE(WriteSafeTensors(f32_path, f32_entries).ok());
  float from_bf16 = 0, from_f32 = 0;
  WithTrainers(1, [&](int, Trainer& t) {
    Status s = t.LoadFullStateDict(bf16_path, WeightLayout::kHfGpt2);
    ASSERT_TRUE(s.ok()) << s;
    from_bf16 = *t.Evaluate(1);
    s = t.LoadFullStateDict(f32_path, WeightLayout::kHfGpt2);
    ASSERT_TRUE(s.ok()) << s;
    from_f32 = *t.Evaluate(1);
  });
  EXPECT_EQ(from_bf16, from_f32);
}

TEST(WeightLayoutTest, MismatchedModelIsAnErrorNamingBothNamesAndShapesAndChangesNothing) {
  Tensors wide = HfGpt2(/*with_lm_head=*/true);
  Tensors bad;
  for (const SafeTensorsEntry& e : wide.Entries()) {
    if (e.name == "transformer.h.1.mlp.c_fc.weight") {
      bad.Add(e.name, {kD, kFf + 8}, 5);
    } else {
      bad.AddValues(e.name, e.shape.ToVector(), wide[e.name]);
    }
  }
  const std::string path = TempPath("bad.safetensors");
  ASSERT_TRUE(WriteSafeTensors(path, bad.Entries()).ok());
  WithTrainers(2, [&](int, Trainer& t) {
    const float before = *t.Evaluate(1);
    Status s = t.LoadFullStateDict(path, WeightLayout::kHfGpt2);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    const std::string m(s.message());
    EXPECT_NE(m.find("h.1.mlp.fc.w"), std::string::npos) << m;
    EXPECT_NE(m.find("transformer.h.1.mlp.c_fc.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[32, 136]"), std::string::npos) << m;
    EXPECT_NE(m.find("[32, 128]"), std::string::npos) << m;
    EXPECT_EQ(*t.Evaluate(1), before);
  });
}

}  // namespace
}  // namespace sk
