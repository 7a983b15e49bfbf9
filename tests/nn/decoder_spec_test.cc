// A decoder by its shape (runtime/nn/decoder_spec.h): inline and JSON forms
// give the configuration the named models have, and every bad key is named.
#include "runtime/nn/decoder_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "runtime/nn/configs.h"

namespace sk {
namespace {

std::string TempFile(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DecoderSpec, Llama3_8bByShapeIsTheNamedModel) {
  auto named = FindModelConfig("llama3-8b");
  ASSERT_TRUE(named.ok()) << named.status();
  auto spec = FindModelConfig(
      "decoder:name=llama3-8b,layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,"
      "vocab=128256,seq=8192,rope_theta=500000");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->family, ModelFamily::kLlama);
  EXPECT_EQ(spec->seq_len, 8192);
  auto a = CreateModel(*named);
  auto b = CreateModel(*spec);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->num_parameters(), (*b)->num_parameters());
  EXPECT_EQ((*b)->num_parameters(), 8030261248);
  // The spec of a config reads back to the same shape.
  auto text = DecoderSpecOf(*named);
  ASSERT_TRUE(text.ok()) << text.status();
  auto again = ParseDecoderSpec(*text);
  ASSERT_TRUE(again.ok()) << again.status() << " " << *text;
  auto c = CreateModel(*again);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->num_parameters(), (*a)->num_parameters());
  EXPECT_EQ(again->llama.rope_theta, named->llama.rope_theta);
  EXPECT_EQ(again->llama.kv_heads(), 8);
}

// Llama 3.2 1B ties its head to the token embedding: 1,235,814,400
// parameters, as the named config, and tied=true reads back.
TEST(DecoderSpec, TiedLlamaByShapeIsTheNamedModel) {
  auto named = FindModelConfig("llama3.2-1b");
  ASSERT_TRUE(named.ok()) << named.status();
  auto spec = FindModelConfig(
      "decoder:layers=16,d_model=2048,heads=32,kv_heads=8,d_ff=8192,vocab=128256,seq=4096,"
      "rope_theta=500000,tied=true");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->family, ModelFamily::kLlama);
  EXPECT_TRUE(spec->llama.tie_word_embeddings);
  auto a = CreateModel(*named);
  auto b = CreateModel(*spec);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*b)->num_parameters(), 1235814400);
  EXPECT_EQ((*a)->num_parameters(), (*b)->num_parameters());
  auto text = DecoderSpecOf(*named);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("tied=true"), std::string::npos) << *text;
  auto again = ParseDecoderSpec(*text);
  ASSERT_TRUE(again.ok()) << again.status() << " " << *text;
  EXPECT_TRUE(again->llama.tie_word_embeddings);
  EXPECT_EQ((*CreateModel(*again))->num_parameters(), 1235814400);
}

// Llama 3.2 scales its rotary frequencies (rope_type llama3, factor 32):
// the spec of the named config carries that scaling and reads back to it.
TEST(DecoderSpec, RopeScalingOfTheNamedModelReadsBack) {
  auto named = FindModelConfig("llama3.2-1b");
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_EQ(named->llama.rope_scaling.type, RopeScalingType::kLlama3);
  auto text = DecoderSpecOf(*named);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("rope_type=llama3,rope_factor=32,rope_low_freq_factor=1,"
                       "rope_high_freq_factor=4,rope_original_max_positions=8192"),
            std::string::npos)
      << *text;
  auto again = ParseDecoderSpec(*text);
  ASSERT_TRUE(again.ok()) << again.status() << " " << *text;
  EXPECT_EQ(again->llama.rope_scaling, named->llama.rope_scaling);
  // An unscaled model's spec names no scaling.
  auto plain = DecoderSpecOf(*FindModelConfig("llama3-8b"));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->find("rope_type"), std::string::npos) << *plain;
}

TEST(DecoderSpec, LinearRopeScalingInlineAndJson) {
  auto inline_spec = FindModelConfig(
      "decoder:layers=2,d_model=32,heads=4,d_ff=64,vocab=64,seq=64,rope_type=linear,rope_factor=2.5");
  ASSERT_TRUE(inline_spec.ok()) << inline_spec.status();
  EXPECT_EQ(inline_spec->llama.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(inline_spec->llama.rope_scaling.factor, 2.5f);
  const std::string path = TempFile("scaled.json", R"({"decoder": {"layers": 2, "d_model": 32,
      "heads": 4, "d_ff": 64, "vocab": 64, "seq": 64, "rope_type": "llama3", "rope_factor": 8,
      "rope_low_freq_factor": 1, "rope_high_freq_factor": 4, "rope_original_max_positions": 16}})");
  auto json = FindModelConfig(path);
  ASSERT_TRUE(json.ok()) << json.status();
  const RopeScaling want{RopeScalingType::kLlama3, 8.0f, 1.0f, 4.0f, 16};
  EXPECT_EQ(json->llama.rope_scaling, want);
  ASSERT_TRUE(CreateModel(*json).ok());
}

TEST(DecoderSpec, GeluIsAGpt2Block) {
  auto spec = FindModelConfig("decoder:ffn=gelu,layers=12,d_model=768,heads=12,vocab=50257,seq=1024");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->family, ModelFamily::kGpt);
  EXPECT_EQ(spec->gpt.ff(), 3072);
  auto m = CreateModel(*spec);
  ASSERT_TRUE(m.ok()) << m.status();
  auto text = DecoderSpecOf(*spec);
  ASSERT_TRUE(text.ok());
  auto again = ParseDecoderSpec(*text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*CreateModel(*again))->num_parameters(), (*m)->num_parameters());
  // GPT-2 ties its head to the token embedding: 124M, not 163M.
  auto tied = FindModelConfig(
      "decoder:ffn=gelu,layers=12,d_model=768,heads=12,vocab=50257,seq=1024,tied=true");
  ASSERT_TRUE(tied.ok()) << tied.status();
  auto gpt2 = FindModelConfig("gpt2-small");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ((*CreateModel(*tied))->num_parameters(), (*CreateModel(*gpt2))->num_parameters());
  EXPECT_EQ((*CreateModel(*tied))->num_parameters(), 124439808);
  EXPECT_NE(DecoderSpecOf(*tied)->find("tied=true"), std::string::npos);
}

TEST(DecoderSpec, JsonFileGivesTheSameShapeAndUnitTablesStillLoad) {
  const std::string path = TempFile("llama.json", R"({"decoder": {"name": "mine", "layers": 2,
      "d_model": 32, "heads": 4, "kv_heads": 2, "d_ff": 64, "vocab": 64, "seq": 32,
      "qkv_bias": true, "rope_theta": 1e6}})");
  auto c = FindModelConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "mine");
  EXPECT_EQ(c->family, ModelFamily::kLlama);
  EXPECT_TRUE(c->llama.qkv_bias);
  EXPECT_EQ(c->llama.rope_theta, 1e6f);
  EXPECT_EQ(c->llama.kv_heads(), 2);
  // A file without "decoder" is still read as a unit table, with its errors.
  const std::string table = TempFile("table.json", R"({"name": "t"})");
  auto t = FindModelConfig(table);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(table), std::string::npos) << t.status();
}

TEST(DecoderSpec, EveryBadKeyIsNamed) {
  const std::string base = "decoder:layers=2,d_model=32,heads=4,d_ff=64,vocab=64,seq=32";
  ASSERT_TRUE(FindModelConfig(base).ok()) << FindModelConfig(base).status();
  const std::pair<std::string, std::string> cases[] = {
      {"decoder:d_model=32,heads=4,d_ff=64,vocab=64,seq=32", "'layers' is required"},
      {base + ",widht=3", "unknown key 'widht'"},
      {base + ",layers=3", "'layers' is given twice"},
      {"decoder:layers=two,d_model=32,heads=4,d_ff=64,vocab=64,seq=32", "'layers' is 'two'"},
      {"decoder:layers=-2,d_model=32,heads=4,d_ff=64,vocab=64,seq=32", "'layers' must be > 0"},
      {base + ",kv_heads=3", "kv"},
      {base + ",ffn=relu", "'ffn' is 'relu'"},
      {base + ",tied=maybe", "'tied' is 'maybe'"},
      {base + ",rope_theta=inf", "'rope_theta'"},
      {base + ",oops", "'oops' is not key=value"},
      {"decoder:ffn=gelu,layers=2,d_model=32,heads=4,vocab=64,seq=32,kv_heads=2",
       "'kv_heads' applies to ffn=swiglu only"},
      {"decoder:layers=2,d_model=32,heads=4,vocab=64,seq=32", "'d_ff' is required"},
      {base + ",rope_type=yarn", "'rope_type' is 'yarn'"},
      {base + ",rope_type=linear", "'rope_factor' is required with rope_type=linear"},
      {base + ",rope_type=linear,rope_factor=0", "'rope_factor' must be > 0"},
      {base + ",rope_factor=2", "'rope_factor' applies to rope_type=linear or llama3 only"},
      {base + ",rope_type=linear,rope_factor=2,rope_low_freq_factor=1",
       "'rope_low_freq_factor' applies to rope_type=llama3 only"},
      {base + ",rope_type=llama3,rope_factor=8,rope_low_freq_factor=1,rope_high_freq_factor=4",
       "'rope_original_max_positions' is required with rope_type=llama3"},
      {base + ",rope_type=llama3,rope_factor=8,rope_low_freq_factor=4,rope_high_freq_factor=2,"
              "rope_original_max_positions=16",
       "high_freq_factor must be a number above low_freq_factor"},
      {base + ",rope_type=llama3,rope_factor=8,rope_low_freq_factor=1,rope_high_freq_factor=4,"
              "rope_original_max_positions=x",
       "'rope_original_max_positions' is 'x'"},
      {"decoder:ffn=gelu,layers=2,d_model=32,heads=4,vocab=64,seq=32,rope_type=linear",
       "'rope_type' applies to ffn=swiglu only"},
  };
  for (const auto& [spec, want] : cases) {
    auto c = FindModelConfig(spec);
    ASSERT_FALSE(c.ok()) << spec;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << spec << ": " << c.status();
  }
  const std::string bad_json = TempFile("bad.json", R"({"decoder": {"layers": [2]}})");
  auto j = FindModelConfig(bad_json);
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("'layers' must be a number"), std::string::npos) << j.status();
  EXPECT_NE(j.status().message().find(bad_json), std::string::npos) << j.status();
  // Issue 47 item 8: a string (or boolean) where a number belongs, and the
  // reverse, are refused naming the key, as config.json's keys are.
  const std::pair<const char*, const char*> typed[] = {
      {R"("layers": "2", "d_model": 32)", "'layers' is a string (\"2\"); it takes an integer"},
      {R"("layers": 2, "d_model": true)", "'d_model' is a boolean (true); it takes an integer"},
      {R"("layers": 2, "d_model": 32, "tied": "true")", "'tied' is a string (\"true\"); it takes true or false"},
      {R"("layers": 2, "d_model": 32, "tied": 1)", "'tied' is a number (1); it takes true or false"},
      {R"("layers": 2, "d_model": 32, "norm_eps": "1e-5")", "'norm_eps' is a string"},
      {R"("layers": 2, "d_model": 32, "name": 7)", "'name' is a number (7); it takes a string"},
  };
  int n = 0;
  for (const auto& [keys, want] : typed) {
    const std::string path = TempFile("typed" + std::to_string(n++) + ".json", std::string(R"({"decoder": {)") + keys +
                                                        R"(, "heads": 4, "vocab": 64, "seq": 32, "d_ff": 64}})");
    auto t = FindModelConfig(path);
    ASSERT_FALSE(t.ok()) << keys;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << keys;
    EXPECT_NE(t.status().message().find(want), std::string::npos) << keys << ": " << t.status();
  }
  const std::string extra = TempFile("extra.json", R"({"decoder": {"layers": 2}, "units": []})");
  auto e = FindModelConfig(extra);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("holds only"), std::string::npos) << e.status();
}

}  // namespace
}  // namespace sk
