#include "runtime/nn/configs.h"

#include "runtime/nn/hf_config.h"

#include <algorithm>

#include "runtime/core/file_io.h"
#include "runtime/nn/decoder_spec.h"
#include "runtime/nn/model_family.h"

namespace sk {
namespace {

// A model file (a decoder shape or a unit table) is a few kilobytes.
constexpr int64_t kMaxModelFileBytes = 16 << 20;

NamedModelConfig Gpt(const std::string& name, int64_t vocab, int64_t seq, int64_t layers,
                     int64_t heads, int64_t d_model, bool gpu, const std::string& description) {
  NamedModelConfig c = GptDecoderConfig(name, {vocab, seq, layers, heads, d_model});
  c.gpu_scale = gpu;
  c.description = description;
  return c;
}

NamedModelConfig T5(const std::string& name, int64_t vocab, int64_t src, int64_t tgt,
                    int64_t layers, int64_t heads, int64_t d_model, int64_t d_ff, bool gpu,
                    const std::string& description) {
  NamedModelConfig c;
  c.name = name;
  c.family = ModelFamily::kT5;
  c.t5.name = name;
  c.t5.vocab_size = vocab;
  c.t5.max_source_len = src;
  c.t5.max_target_len = tgt;
  c.t5.n_encoder_layers = layers;
  c.t5.n_decoder_layers = layers;
  c.t5.n_head = heads;
  c.t5.d_model = d_model;
  c.t5.d_ff = d_ff;
  c.seq_len = tgt;
  c.source_len = src;
  c.gpu_scale = gpu;
  c.description = description;
  return c;
}

// Llama 3.1 and 3.2's rotary scaling (their config.json's rope_scaling:
// rope_type llama3, low_freq_factor 1, high_freq_factor 4, pre-training
// context 8192), with its factor (3.1: 8; 3.2: 32).
RopeScaling Llama3RopeScaling(float factor) {
  return RopeScaling{RopeScalingType::kLlama3, factor, 1.0f, 4.0f, 8192};
}

NamedModelConfig Llama(const std::string& name, const LlamaShape& s, bool gpu,
                       const std::string& description) {
  NamedModelConfig c = LlamaDecoderConfig(name, s);
  c.gpu_scale = gpu;
  c.description = description;
  return c;
}

// A RegNet (Radosavovic et al. 2020, "Designing Network Design Spaces",
// CVPR): a 3x3 stride-2 stem of `stem` channels, then four stages of X
// blocks (bottleneck ratio 1: 1x1 conv, 3x3 group conv of group width
// `group_width` with the stage's stride 2 in its first block, 1x1 conv,
// residual with a 1x1 projection where the shape changes), global average
// pooling and a linear classifier. Images image x image x 3.
UnitTableConfig RegNet(const std::string& name, int64_t image, int64_t classes, int64_t stem,
                       const std::vector<int64_t>& depths, const std::vector<int64_t>& widths,
                       int64_t group_width, const std::string& source) {
  UnitTableConfig t;
  t.name = name;
  t.image_size = image;
  t.num_classes = classes;
  t.source = source;
  auto conv = [](const std::string& n, int64_t cin, int64_t cout, int64_t k, int64_t s, int64_t g,
                 bool gelu) {
    ConvLayerSpec l;
    l.name = n;
    l.in_channels = cin;
    l.out_channels = cout;
    l.kernel = k;
    l.stride = s;
    l.groups = g;
    l.gelu = gelu;
    return l;
  };
  TableUnit u;
  u.name = "stem";
  u.kind = TableUnitKind::kConv;
  u.in_h = u.in_w = image;
  u.convs = {conv("conv", 3, stem, 3, 2, 1, true)};
  t.units.push_back(u);
  int64_t hw = (image + 2 - 3) / 2 + 1, cin = stem;
  for (size_t s = 0; s < depths.size(); ++s) {
    const int64_t w = widths[s];
    for (int64_t b = 0; b < depths[s]; ++b) {
      const int64_t stride = b == 0 ? 2 : 1;
      TableUnit x;
      x.name = "s" + std::to_string(s + 1) + ".b" + std::to_string(b);
      x.kind = TableUnitKind::kConv;
      x.in_h = x.in_w = hw;
      x.convs = {conv("a", cin, w, 1, 1, 1, true), conv("b", w, w, 3, stride, w / group_width, true),
                 conv("c", w, w, 1, 1, 1, false)};
      if (stride != 1 || cin != w) {
        x.residual = Residual::kProjection;
        x.projection = conv("proj", cin, w, 1, stride, 1, false);
      } else {
        x.residual = Residual::kIdentity;
      }
      t.units.push_back(x);
      hw = (hw - 1) / stride + 1;
      cin = w;
    }
  }
  TableUnit head;
  head.name = "head";
  head.kind = TableUnitKind::kClassifier;
  head.in_h = head.in_w = hw;
  head.width = cin;
  t.units.push_back(head);
  return t;
}

// A ViT-style stack (Dosovitskiy et al. 2021) as DeepViT (Zhou et al.
// 2021, "DeepViT: Towards Deeper Vision Transformer") builds it: a
// patch x patch stride-patch patch embedding with a learned position
// embedding, `depth` pre-LayerNorm blocks of width d with `heads` heads and
// an MLP of d_ff, a final LayerNorm, mean pooling and a linear classifier.
UnitTableConfig DeepVit(const std::string& name, int64_t image, int64_t classes, int64_t patch,
                        int64_t depth, int64_t d, int64_t heads, int64_t d_ff,
                        const std::string& source) {
  UnitTableConfig t;
  t.name = name;
  t.image_size = image;
  t.num_classes = classes;
  t.source = source;
  const int64_t grid = image / patch;
  TableUnit embed;
  embed.name = "patch_embed";
  embed.kind = TableUnitKind::kConv;
  embed.in_h = embed.in_w = image;
  ConvLayerSpec l;
  l.name = "proj";
  l.in_channels = 3;
  l.out_channels = d;
  l.kernel = patch;
  l.stride = patch;
  embed.convs = {l};
  embed.position_bias = true;
  t.units.push_back(embed);
  for (int64_t i = 0; i < depth; ++i) {
    TableUnit b;
    b.name = "blocks." + std::to_string(i);
    b.kind = TableUnitKind::kTransformer;
    b.in_h = b.in_w = grid;
    b.width = d;
    b.heads = heads;
    b.d_ff = d_ff;
    t.units.push_back(b);
  }
  TableUnit head;
  head.name = "head";
  head.kind = TableUnitKind::kClassifier;
  head.in_h = head.in_w = grid;
  head.width = d;
  head.layer_norm = true;
  t.units.push_back(head);
  return t;
}

NamedModelConfig Table(UnitTableConfig table, bool gpu, const std::string& description) {
  NamedModelConfig c;
  c.name = table.name;
  c.family = ModelFamily::kUnitTable;
  c.table = std::move(table);
  c.seq_len = 1;  // one image per batch entry
  c.gpu_scale = gpu;
  c.description = description;
  return c;
}

std::vector<NamedModelConfig> BuildConfigs() {
  std::vector<NamedModelConfig> v;
  // Scaled configurations for one small CPU machine.
  v.push_back(Gpt("gpt-tiny", 64, 16, 2, 2, 32, false, "unit tests"));
  v.push_back(Gpt("gpt-1m", 256, 128, 4, 4, 128, false, "byte-level, seconds per step on 2 cores"));
  v.push_back(Gpt("gpt-10m", 1024, 256, 6, 6, 384, false, "CPU benchmark and FSDP harness model"));
  v.push_back(Gpt("gpt-50m", 4096, 256, 8, 8, 704, false, "memory-bound FSDP experiments on CPU"));
  // Many narrow units: each unit is ~4% of the model, so a rank's memory is
  // dominated by model states, not by the units it gathers (FSDP's memory
  // benchmark).
  v.push_back(Gpt("gpt-deep-20m", 1024, 128, 24, 8, 256, false, "deep and narrow: model-state-bound memory"));
  v.push_back(Gpt("gpt-150m", 32768, 512, 14, 12, 768, false, "GPT-2-small width; slow on CPU"));
  // GPT-3 XL's shape (Brown et al. 2020, "Language Models are Few-Shot
  // Learners", table 2.1: 24 layers, d_model 2048, 16 heads of 128, context
  // 2048; GPT-2's 50257-token vocabulary): the 1B-class model of the GPU
  // suite (//benchmarks:gpu_train). Sequence 1024 here: the composed CUDA
  // attention keeps heads x T x T probabilities per layer.
  v.push_back(Gpt("gpt-1.3b", 50257, 1024, 24, 16, 2048, true, "GPT-3 XL's shape: the 1B-class GPU benchmark model"));
  // GPT-2's four sizes (Radford et al. 2019, table 2; the config.json of
  // openai-community/gpt2, gpt2-medium, gpt2-large, gpt2-xl: vocabulary
  // 50257, context 1024, tie_word_embeddings true), so Hugging Face's
  // weights load (runtime/checkpoint/hf_checkpoint.h): 124M, 355M, 774M, 1558M
  // parameters, the LM head tied to wte as in GPT-2.
  for (NamedModelConfig c : {Gpt("gpt2-small", 50257, 1024, 12, 12, 768, false, "GPT-2 small (124M): loads Hugging Face's gpt2"),
                             Gpt("gpt2-medium", 50257, 1024, 24, 16, 1024, true, "GPT-2 medium (355M)"),
                             Gpt("gpt2-large", 50257, 1024, 36, 20, 1280, true, "GPT-2 large (774M)"),
                             Gpt("gpt2-xl", 50257, 1024, 48, 25, 1600, true, "GPT-2 XL (1558M)")}) {
    c.gpt.tie_word_embeddings = true;
    v.push_back(std::move(c));
  }
  // Llama-family decoders (llama.h). The tiny ones exercise grouped-query
  // attention (2 query heads per key/value head; qwen2-tiny: 4, and Qwen2's
  // q/k/v biases); llama-10m is gpt-10m's CPU size.
  v.push_back(Llama("llama-tiny", {64, 32, 2, 4, 2, 32, 64}, false, "unit tests: GQA, RoPE, SwiGLU"));
  v.push_back(Llama("qwen2-tiny", {64, 32, 2, 4, 1, 32, 48, 1e6f, 1e-6f, true}, false,
                    "unit tests: Qwen2's q/k/v biases, one kv head"));
  v.push_back(Llama("llama-10m", {1024, 256, 6, 6, 2, 384, 1024}, false, "CPU Llama-family decoder"));
  v.push_back(T5("t5-tiny", 64, 16, 16, 2, 2, 32, 64, false, "unit tests"));
  v.push_back(T5("t5-10m", 1024, 128, 128, 4, 4, 256, 1024, false, "CPU encoder-decoder"));
  v.push_back(T5("t5-60m", 8192, 256, 128, 6, 8, 512, 2048, false, "CPU encoder-decoder, larger"));
  // The paper's sizes (Zhao et al. 2023, "PyTorch FSDP", section 6), for
  // GPUs and the simulator. Sources, dimension by dimension:
  //   T5 (all three): vocabulary 32128 and 24 encoder + 24 decoder layers:
  //     Raffel et al. 2020 (JMLR 21:140), section 3.7 and the released
  //     t5-large/3b/11b configurations (num_layers = num_decoder_layers = 24,
  //     vocab_size = 32128). Sequence lengths 512/512: T5's pre-training
  //     input length (section 3.1.2); the FSDP paper does not state its own.
  //     d_model, d_ff and heads: the FSDP paper gives only the parameter
  //     counts (611M, 2.28B, 11B), and published T5 shapes do not have them
  //     (t5-large 738M; t5-11b uses d_model 1024 with 128 heads of d_kv 128,
  //     which this architecture, heads x head_dim = d_model, cannot express).
  //     So d_model follows T5's ladder (1024 as t5-large; 2048; 4096 as
  //     T5 v1.1-XXL) with head_dim 64 (T5's d_kv for large), and d_ff is
  //     solved for the paper's count (docs/architecture.md prints 610M,
  //     2277M, 11.07B): derived, not published.
  //   GPT-175B: GPT-3 (Brown et al. 2020, Table 2.1): 96 layers, d_model
  //     12288, 96 heads of 128, context 2048; d_ff = 4 d_model (ibid., 2.1,
  //     following GPT-2); vocabulary 50257: GPT-2's BPE (Radford et al. 2019),
  //     which GPT-3 reuses.
  v.push_back(T5("t5-611m", 32128, 512, 512, 24, 16, 1024, 2112, true, "paper's T5-611M"));
  v.push_back(T5("t5-2.28b", 32128, 512, 512, 24, 32, 2048, 4416, true, "paper's T5-2.28B"));
  v.push_back(T5("t5-11b", 32128, 512, 512, 24, 64, 4096, 14848, true, "paper's T5-11B"));
  v.push_back(Gpt("gpt-175b", 50257, 2048, 96, 96, 12288, true, "paper's GPT-175B (GPT-3)"));
  // Published Llama-family shapes (the models' Hugging Face config.json:
  // vocab_size, hidden_size, intermediate_size, num_hidden_layers,
  // num_attention_heads, num_key_value_heads, rope_theta, rope_scaling,
  // rms_norm_eps, max_position_embeddings). Sequence lengths are the
  // training lengths one plans for (8192 for Llama 3, as Meta trained it;
  // 4096 for the fine-tuning shapes), not the models' maximum positions.
  // Llama 3.2 1B scales RoPE (llama3, factor 32) to 131072 positions; Llama
  // 3 8B and 70B (not 3.1) are unscaled, 8192 positions. The LM head is tied where the original's
  // is (tie_word_embeddings: Qwen2-0.5B and Llama 3.2 1B) and untied
  // otherwise (Llama 3 8B/70B), so every count is the published one:
  // 494,032,768; 1,235,814,400; 8.03 B; 70.55 B.
  v.push_back(Llama("qwen2-0.5b", {151936, 4096, 24, 14, 2, 896, 4864, 1e6f, 1e-6f, true, true},
                    true, "Qwen2-0.5B: a fine-tuning-size model, head tied"));
  v.push_back(Llama("llama3.2-1b",
                    {128256, 4096, 16, 32, 8, 2048, 8192, 500000.0f, 1e-5f, false, true,
                     Llama3RopeScaling(32.0f), 131072},
                    true, "Llama 3.2 1B, head tied"));
  v.push_back(Llama("llama3-8b", {128256, 8192, 32, 32, 8, 4096, 14336, 500000.0f}, true,
                    "Llama 3 8B"));
  v.push_back(Llama("llama3-70b", {128256, 8192, 80, 64, 8, 8192, 28672, 500000.0f}, true,
                    "Llama 3 70B"));
  // Unit tables for tests: every layer kind (stem, strided and identity
  // residual blocks, group convolutions; patch embedding, attention
  // blocks, LayerNorm classifier) at sizes a CPU runs in milliseconds.
  v.push_back(Table(RegNet("regnet-tiny", 16, 10, 8, {1, 2}, {16, 32}, 8, "unit tests"), false,
                    "unit tests: RegNet layer kinds"));
  v.push_back(Table(DeepVit("deepvit-tiny", 16, 10, 4, 2, 32, 2, 64, "unit tests"), false,
                    "unit tests: ViT layer kinds"));
  // The paper's vision models (Zhao et al. 2023, section 7.3: the rate
  // limiter on RegNet-9B and DeepViT-8B). The paper gives only names and
  // sizes; the shapes are ours, from the published design spaces:
  //   RegNet-9B: torchvision's regnet_y_128gf (RegNetY-128GF, the
  //     SEER model's shape; Radosavovic et al. 2020 design space) has depths
  //     [2, 7, 17, 1], widths [528, 1056, 2904, 7392], group width 264 and a
  //     32-channel stem. Scaled 4x in width (widths [2112, 4224, 11616,
  //     29568], group width 1056: still multiples of the group width, as the
  //     design space quantises them) with X blocks (no squeeze-excitation):
  //     8.88 B parameters (docs/architecture.md prints it). ImageNet's
  //     224x224 images and 1000 classes.
  //   DeepViT-8B: DeepViT's deepest configuration has 32 blocks (Zhou et
  //     al. 2021, table 1); patch 16 on 224x224 images (196 tokens) and an
  //     MLP ratio of 4 as ViT (Dosovitskiy et al. 2021); width 4608 (36 heads
  //     of 128) puts it at 8.16 B parameters. Width and head count are ours.
  v.push_back(Table(RegNet("regnet-9b", 224, 1000, 32, {2, 7, 17, 1}, {2112, 4224, 11616, 29568}, 1056,
                           "regnet_y_128gf's depths and stem, 4x its widths and group width; X blocks"),
                    true, "paper's RegNet-9B (unit table)"));
  v.push_back(Table(DeepVit("deepvit-8b", 224, 1000, 16, 32, 4608, 36, 4 * 4608,
                            "DeepViT's 32 blocks, ViT-style patch 16 and MLP ratio 4; width for 8B"),
                    true, "paper's DeepViT-8B (unit table)"));
  return v;
}

}  // namespace

NamedModelConfig GptDecoderConfig(const std::string& name, const GptShape& shape) {
  NamedModelConfig c;
  c.name = name;
  c.family = ModelFamily::kGpt;
  c.gpt.name = name;
  c.gpt.vocab_size = shape.vocab;
  c.gpt.max_seq_len = shape.seq;
  c.gpt.n_layer = shape.layers;
  c.gpt.n_head = shape.heads;
  c.gpt.d_model = shape.d_model;
  c.gpt.d_ff = shape.d_ff;
  c.gpt.tie_word_embeddings = shape.tie_word_embeddings;
  c.seq_len = shape.seq;
  return c;
}

NamedModelConfig LlamaDecoderConfig(const std::string& name, const LlamaShape& shape) {
  NamedModelConfig c;
  c.name = name;
  c.family = ModelFamily::kLlama;
  c.llama.name = name;
  c.llama.vocab_size = shape.vocab;
  c.llama.max_seq_len = shape.max_positions > 0 ? shape.max_positions : shape.seq;
  c.llama.n_layer = shape.layers;
  c.llama.n_head = shape.heads;
  c.llama.n_kv_head = shape.kv_heads;
  c.llama.d_model = shape.d_model;
  c.llama.d_ff = shape.d_ff;
  c.llama.rope_theta = shape.rope_theta;
  c.llama.rope_scaling = shape.rope_scaling;
  c.llama.rms_norm_eps = shape.rms_norm_eps;
  c.llama.qkv_bias = shape.qkv_bias;
  c.llama.tie_word_embeddings = shape.tie_word_embeddings;
  c.seq_len = shape.seq;
  return c;
}

const std::vector<NamedModelConfig>& ModelConfigs() {
  static const std::vector<NamedModelConfig>* configs =
      new std::vector<NamedModelConfig>(BuildConfigs());
  return *configs;
}

const char* ModelFamilyName(ModelFamily family) {
  const ModelFamilyDescription* f = FindModelFamily(family);
  return f != nullptr ? f->name.c_str() : "unknown";
}

int64_t BatchIdSpace(const NamedModelConfig& c) {
  const ModelFamilyDescription* f = FindModelFamily(c.family);
  return f != nullptr ? f->batch_id_space(c) : 0;
}

StatusOr<NamedModelConfig> FindModelConfig(const std::string& name) {
  if (IsDecoderSpec(name)) return ParseDecoderSpec(name);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) {
    SK_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(name, kMaxModelFileBytes, "model file"));
    StatusOr<NamedModelConfig> decoder = DecoderFromJson(text, name);
    if (decoder.ok() || decoder.status().code() != StatusCode::kNotFound) return decoder;
    SK_ASSIGN_OR_RETURN(UnitTableConfig table, UnitTableFromJson(text, name));
    return Table(std::move(table), false, "unit table from " + name);
  }
  if (IsHfModelDirectory(name)) return ReadHfConfig(name);
  std::string known;
  for (const NamedModelConfig& c : ModelConfigs()) {
    if (c.name == name) return c;
    known += (known.empty() ? "" : ", ") + c.name;
  }
  for (const ModelFamilyDescription* f : ModelFamilies()) {
    for (const NamedModelConfig& c : f->configs) {
      if (c.name == name) return c;
      known += ", " + c.name;
    }
  }
  return NotFoundError("no model config named '" + name + "'; known: " + known);
}

Status CheckStepSizeFits(const NamedModelConfig& c, int64_t batch_size, int64_t seq_len,
                         int64_t source_len) {
  if (batch_size < 1) return InvalidArgumentError("batch_size must be >= 1");
  if (seq_len < 0 || source_len < 0) return InvalidArgumentError("sequence lengths must be >= 0");
  SK_ASSIGN_OR_RETURN(const ModelFamilyDescription* family, ModelFamilyOf(c));
  return family->check_step_size(c, batch_size, seq_len, source_len);
}

StatusOr<std::unique_ptr<Model>> CreateModel(const NamedModelConfig& config,
                                             const ModelOptions& options) {
  SK_ASSIGN_OR_RETURN(const ModelFamilyDescription* family, ModelFamilyOf(config));
  return family->create(config, options);
}

StatusOr<std::unique_ptr<Model>> CreateModel(const std::string& name,
                                             const ModelOptions& options) {
  SK_ASSIGN_OR_RETURN(NamedModelConfig c, FindModelConfig(name));
  return CreateModel(c, options);
}

}  // namespace sk
