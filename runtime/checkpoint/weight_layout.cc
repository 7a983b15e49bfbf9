#include "runtime/checkpoint/weight_layout.h"

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace sk {

namespace {

// ---- The name tables -------------------------------------------------------

struct NamePair {
  const char* shardkit;
  const char* hf;  // without the "transformer." prefix
};

// Tensors outside the blocks.
constexpr NamePair kGpt2Globals[] = {
    {"embed.wte", "wte.weight"},
    {"embed.wpe", "wpe.weight"},
    {"head.ln.g", "ln_f.weight"},
    {"head.ln.b", "ln_f.bias"},
};

// Tensors of block i: "h.<i>.<shardkit>" <-> "h.<i>.<hf>".
constexpr NamePair kGpt2Block[] = {
    {"attn.ln.g", "ln_1.weight"},         {"attn.ln.b", "ln_1.bias"},
    {"attn.qkv.w", "attn.c_attn.weight"}, {"attn.qkv.b", "attn.c_attn.bias"},
    {"attn.proj.w", "attn.c_proj.weight"}, {"attn.proj.b", "attn.c_proj.bias"},
    {"mlp.ln.g", "ln_2.weight"},          {"mlp.ln.b", "ln_2.bias"},
    {"mlp.fc.w", "mlp.c_fc.weight"},      {"mlp.fc.b", "mlp.c_fc.bias"},
    {"mlp.proj.w", "mlp.c_proj.weight"},  {"mlp.proj.b", "mlp.c_proj.bias"},
};

// Buffers (not parameters) older GPT-2 files carry per block: skipped.
constexpr const char* kGpt2BlockBuffers[] = {"attn.bias", "attn.masked_bias"};

// Split projections some tools write instead of c_attn (nn.Linear layout).
constexpr const char* kSplitProj[] = {"attn.q_proj", "attn.k_proj", "attn.v_proj"};

// The Llama family's (LlamaForCausalLM, Qwen2ForCausalLM): outside the
// blocks, then per block "layers.<i>.<shardkit>" <-> "model.layers.<i>.<hf>";
// nn.Linear weights ([out, in]) are transposed.
struct LlamaNamePair {
  const char* shardkit;
  const char* hf;  // without the "model." prefix
  bool transposed;
};

constexpr LlamaNamePair kLlamaGlobals[] = {
    {"embed.embed_tokens.w", "embed_tokens.weight", false},
    {"head.norm.g", "norm.weight", false},
};

constexpr LlamaNamePair kLlamaBlock[] = {
    {"input_layernorm.g", "input_layernorm.weight", false},
    {"self_attn.q_proj.w", "self_attn.q_proj.weight", true},
    {"self_attn.q_proj.b", "self_attn.q_proj.bias", false},
    {"self_attn.k_proj.w", "self_attn.k_proj.weight", true},
    {"self_attn.k_proj.b", "self_attn.k_proj.bias", false},
    {"self_attn.v_proj.w", "self_attn.v_proj.weight", true},
    {"self_attn.v_proj.b", "self_attn.v_proj.bias", false},
    {"self_attn.o_proj.w", "self_attn.o_proj.weight", true},
    {"post_attention_layernorm.g", "post_attention_layernorm.weight", false},
    {"mlp.gate_proj.w", "mlp.gate_proj.weight", true},
    {"mlp.up_proj.w", "mlp.up_proj.weight", true},
    {"mlp.down_proj.w", "mlp.down_proj.weight", true},
};

// RoPE's inverse frequencies, a buffer older Llama files carry per block: skipped.
constexpr char kLlamaBlockBuffer[] = "self_attn.rotary_emb.inv_freq";

constexpr char kLlamaPrefix[] = "model.";
constexpr char kEmbedTokens[] = "embed.embed_tokens.w";

constexpr char kHfPrefix[] = "transformer.";
constexpr char kHfLmHead[] = "lm_head.weight";
constexpr char kLmHead[] = "head.lm_head.w";
constexpr char kWte[] = "embed.wte";
constexpr char kOptimPrefix[] = "optimizer.";
constexpr char kOptimMetaPrefix[] = "shardkit.optimizer.";
constexpr char kStepKey[] = "shardkit.step";

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool EndsWith(const std::string& s, const char* p) {
  const size_t n = std::strlen(p);
  return s.size() >= n && s.compare(s.size() - n, n, p) == 0;
}

// "<prefix><i>.<rest>" ("h." for GPT-2, "layers." for Llama): the block
// index and rest, or nullopt.
std::optional<std::pair<std::string, std::string>> SplitBlock(const std::string& name,
                                                              const char* prefix = "h.") {
  if (!StartsWith(name, prefix)) return std::nullopt;
  const size_t start = std::strlen(prefix);
  size_t i = start;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == start || i >= name.size() || name[i] != '.') return std::nullopt;
  return std::make_pair(name.substr(start, i - start), name.substr(i + 1));
}

// A Llama-family name: the other layout's name (hf with the "model." prefix
// when `to_hf`) and whether the tensor is transposed, or nullopt. The head
// (lm_head.weight) is the caller's.
std::optional<std::pair<std::string, bool>> LlamaName(const std::string& name, bool to_hf) {
  for (const LlamaNamePair& p : kLlamaGlobals) {
    if (name == (to_hf ? p.shardkit : p.hf)) {
      return std::make_pair(to_hf ? kLlamaPrefix + std::string(p.hf) : std::string(p.shardkit), p.transposed);
    }
  }
  if (auto b = SplitBlock(name, "layers.")) {
    for (const LlamaNamePair& p : kLlamaBlock) {
      if (b->second == (to_hf ? p.shardkit : p.hf)) {
        const std::string block = "layers." + b->first + ".";
        return std::make_pair(to_hf ? kLlamaPrefix + block + p.hf : block + p.shardkit, p.transposed);
      }
    }
  }
  return std::nullopt;
}

// shardkit name -> hf name (with the prefix), or nullopt.
std::optional<std::string> ToHfName(const std::string& name) {
  if (name == kLmHead) return std::string(kHfLmHead);
  for (const NamePair& p : kGpt2Globals) {
    if (name == p.shardkit) return kHfPrefix + std::string(p.hf);
  }
  if (auto b = SplitBlock(name)) {
    for (const NamePair& p : kGpt2Block) {
      if (b->second == p.shardkit) return kHfPrefix + ("h." + b->first + ".") + p.hf;
    }
  }
  return std::nullopt;
}

// hf name (prefix already stripped) -> shardkit name, or nullopt.
std::optional<std::string> FromHfName(const std::string& name) {
  for (const NamePair& p : kGpt2Globals) {
    if (name == p.hf) return std::string(p.shardkit);
  }
  if (auto b = SplitBlock(name)) {
    for (const NamePair& p : kGpt2Block) {
      if (b->second == p.hf) return "h." + b->first + "." + p.shardkit;
    }
  }
  return std::nullopt;
}

// ---- Tensors being converted -----------------------------------------------

struct Item {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  const char* data = nullptr;            // into the input file, or into owned
  std::shared_ptr<std::vector<char>> owned;

  size_t nbytes() const { return static_cast<size_t>(shape.numel()) * DTypeSize(dtype); }
};

Item FromFile(const SafeTensorsEntry& e) {
  Item it;
  it.name = e.name;
  it.dtype = e.dtype;
  it.shape = e.shape;
  it.data = static_cast<const char*>(e.data);
  return it;
}

// `src` [rows, cols] transposed to [cols, rows], as `name`. InvalidArgument
// unless src is 2-D.
StatusOr<Item> Transposed(const Item& src, const std::string& name, const std::string& why) {
  if (src.shape.rank() != 2) {
    return InvalidArgumentError("tensor '" + src.name + "' has shape " + src.shape.ToString() +
                                "; " + why + " needs a 2-D [rows, cols] tensor");
  }
  const int64_t rows = src.shape.dim(0), cols = src.shape.dim(1);
  const size_t es = DTypeSize(src.dtype);
  Item out;
  out.name = name;
  out.dtype = src.dtype;
  out.shape = Shape{cols, rows};
  out.owned = std::make_shared<std::vector<char>>(src.nbytes());
  char* dst = out.owned->data();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(dst + (c * rows + r) * es, src.data + (r * cols + c) * es, es);
    }
  }
  out.data = out.owned->data();
  return out;
}

Item Renamed(const Item& src, std::string name) {
  Item out = src;
  out.name = std::move(name);
  return out;
}

// Fuses split q/k/v of one block (nn.Linear [out, in] weights, optional
// biases) into shardkit's qkv.w [in, out_q + out_k + out_v] and qkv.b.
Status FuseQkv(const std::string& block, const std::map<std::string, Item>& parts,
               std::vector<Item>* out) {
  const std::string where = "h." + block + ".";
  const Item* w[3] = {nullptr, nullptr, nullptr};
  const Item* b[3] = {nullptr, nullptr, nullptr};
  for (int j = 0; j < 3; ++j) {
    auto wi = parts.find(std::string(kSplitProj[j]) + ".weight");
    auto bi = parts.find(std::string(kSplitProj[j]) + ".bias");
    if (wi != parts.end()) w[j] = &wi->second;
    if (bi != parts.end()) b[j] = &bi->second;
  }
  for (int j = 0; j < 3; ++j) {
    if (w[j] == nullptr) {
      return InvalidArgumentError("block " + block + " has split attention projections but no '" +
                                  kSplitProj[j] + ".weight' (q, k and v are needed)");
    }
    if (w[j]->shape.rank() != 2) {
      return InvalidArgumentError("tensor '" + w[j]->name + "' has shape " + w[j]->shape.ToString() +
                                  "; an nn.Linear weight is 2-D [out, in]");
    }
    if (w[j]->shape.dim(1) != w[0]->shape.dim(1) || w[j]->dtype != w[0]->dtype) {
      return InvalidArgumentError("tensor '" + w[j]->name + "' has shape " + w[j]->shape.ToString() +
                                  " (" + std::string(DTypeName(w[j]->dtype)) + ") but '" + w[0]->name + "' has " +
                                  w[0]->shape.ToString() + " (" + std::string(DTypeName(w[0]->dtype)) +
                                  "): q, k and v must share the input width and dtype");
    }
  }
  const bool any_bias = b[0] || b[1] || b[2];
  if (any_bias && !(b[0] && b[1] && b[2])) {
    return InvalidArgumentError("block " + block + ": q/k/v projections have biases for some but not all");
  }
  const int64_t in = w[0]->shape.dim(1);
  const size_t es = DTypeSize(w[0]->dtype);
  int64_t total = 0;
  for (int j = 0; j < 3; ++j) total += w[j]->shape.dim(0);
  Item qkv;
  qkv.name = where + "attn.qkv.w";
  qkv.dtype = w[0]->dtype;
  qkv.shape = Shape{in, total};
  qkv.owned = std::make_shared<std::vector<char>>(static_cast<size_t>(in * total) * es);
  int64_t col0 = 0;
  for (int j = 0; j < 3; ++j) {
    const int64_t outj = w[j]->shape.dim(0);
    for (int64_t o = 0; o < outj; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        std::memcpy(qkv.owned->data() + (i * total + col0 + o) * es, w[j]->data + (o * in + i) * es, es);
      }
    }
    col0 += outj;
  }
  qkv.data = qkv.owned->data();
  Item bias;
  bias.name = where + "attn.qkv.b";
  bias.dtype = qkv.dtype;
  bias.shape = Shape{total};
  bias.owned = std::make_shared<std::vector<char>>(static_cast<size_t>(total) * es, 0);
  if (any_bias) {
    size_t at = 0;
    for (int j = 0; j < 3; ++j) {
      if (b[j]->shape != Shape{w[j]->shape.dim(0)} || b[j]->dtype != qkv.dtype) {
        return InvalidArgumentError("tensor '" + b[j]->name + "' has shape " + b[j]->shape.ToString() +
                                    " (" + std::string(DTypeName(b[j]->dtype)) + ") but its weight '" + w[j]->name +
                                    "' needs " + Shape{w[j]->shape.dim(0)}.ToString() + " (" +
                                    std::string(DTypeName(qkv.dtype)) + ")");
      }
      std::memcpy(bias.owned->data() + at, b[j]->data, b[j]->nbytes());
      at += b[j]->nbytes();
    }
  }
  bias.data = bias.owned->data();
  out->push_back(std::move(qkv));
  out->push_back(std::move(bias));
  return OkStatus();
}

Status OptimizerStateError(const std::string& name, WeightLayout from, WeightLayout to) {
  return InvalidArgumentError("tensor '" + name + "' is optimizer state, which only the shardkit layout holds (" +
                              WeightLayoutName(from) + " -> " + WeightLayoutName(to) +
                              "): drop it explicitly (ConvertOptions::drop_optimizer_state, "
                              "convert --weights_only)");
}

// ---- Per layout --------------------------------------------------------------

// torch <-> shardkit: the same names, matmul weights transposed.
Status TransposeMatmulWeights(const std::vector<Item>& in, const char* why, std::vector<Item>* out) {
  for (const Item& it : in) {
    if (EndsWith(it.name, ".w")) {
      SK_ASSIGN_OR_RETURN(Item t, Transposed(it, it.name, why));
      out->push_back(std::move(t));
    } else {
      out->push_back(it);
    }
  }
  return OkStatus();
}

// The LM head of a Hugging Face file (lm_head.weight [vocab, d], or null
// when absent) into shardkit's head.lm_head.w [d, vocab], given the file's
// token embedding `embed` [vocab, d] (null when absent), which messages call
// `embed_label`. tied: see ConvertOptions::tie_word_embeddings.
// `absent_head_is_tied`: what a file without lm_head.weight means when `tied`
// is unset: true for GPT-2 (transformers always ties its head, and its files
// hold none), false for the Llama family (a head of its own unless
// config.json says tie_word_embeddings true), where it is then refused
// rather than guessed: the embedding's transpose would be silently wrong
// weights for an untied model.
Status HeadToShardkit(const Item* lm_head, const Item* embed, const std::string& embed_label,
                      std::optional<bool> tied, bool absent_head_is_tied, std::vector<Item>* out) {
  if (tied.has_value() && *tied) {
    // The model's head is the embedding itself: a file's head must be that, or absent.
    if (lm_head != nullptr) {
      const bool same = embed != nullptr && embed->dtype == lm_head->dtype && embed->shape == lm_head->shape &&
                        std::memcmp(embed->data, lm_head->data, embed->nbytes()) == 0;
      if (!same) {
        return InvalidArgumentError("tensor '" + std::string(kHfLmHead) + "' differs from " + embed_label +
                                    ", but the model ties its head to " + embed_label +
                                    " (tie_word_embeddings): it cannot hold a head of its own");
      }
    }
    return OkStatus();
  }
  if (tied.has_value() && lm_head == nullptr) {
    return InvalidArgumentError("tensor '" + std::string(kHfLmHead) + "' is missing, and the model's head is not tied to " +
                                embed_label + " (tie_word_embeddings false)");
  }
  if (!tied.has_value() && lm_head == nullptr && !absent_head_is_tied) {
    return InvalidArgumentError("tensor '" + std::string(kHfLmHead) + "' is missing, and nothing says whether the model ties its head to " +
                                embed_label + " (a Llama-family head is its own unless config.json says tie_word_embeddings "
                                "true): read the model's directory, or give its config (convert --model=DIR or NAME)");
  }
  if (lm_head != nullptr) {
    SK_ASSIGN_OR_RETURN(Item t, Transposed(*lm_head, kLmHead, "the LM head ([vocab, d] -> [d, vocab])"));
    out->push_back(std::move(t));
  } else if (embed != nullptr) {  // tied: the head is the embedding's transpose
    SK_ASSIGN_OR_RETURN(Item t, Transposed(*embed, kLmHead, "the tied LM head (" + embed_label + " transposed)"));
    out->push_back(std::move(t));
  }
  return OkStatus();
}

// shardkit's head.lm_head.w [d, vocab] as lm_head.weight [vocab, d], left out
// when the model is tied or (tied unset) when it equals `embed` bit for bit.
Status HeadToHf(const Item& head, const Item* embed, const std::string& embed_label, std::optional<bool> tied,
                std::vector<Item>* out) {
  if (tied.has_value() && *tied) {
    return InvalidArgumentError("tensor '" + head.name + "' is an LM head of its own, but the model ties its head to " +
                                embed_label);
  }
  SK_ASSIGN_OR_RETURN(Item t, Transposed(head, kHfLmHead, "the LM head ([d, vocab] -> [vocab, d])"));
  const bool same = embed != nullptr && embed->dtype == t.dtype && embed->shape == t.shape &&
                    std::memcmp(embed->data, t.data, t.nbytes()) == 0;
  if (!same || tied.has_value()) out->push_back(std::move(t));
  return OkStatus();
}

Status HfGpt2ToShardkit(const std::vector<Item>& in, std::optional<bool> tied, std::vector<Item>* out) {
  const Item* lm_head = nullptr;
  const Item* wte = nullptr;
  std::map<std::string, std::map<std::string, Item>> split;  // block -> part -> tensor
  std::vector<std::string> fused_blocks;
  for (const Item& it : in) {
    if (it.name == kHfLmHead) {
      lm_head = &it;
      continue;
    }
    const std::string n = StartsWith(it.name, kHfPrefix) ? it.name.substr(std::strlen(kHfPrefix)) : it.name;
    if (auto b = SplitBlock(n)) {
      bool skip = false;
      for (const char* buf : kGpt2BlockBuffers) skip = skip || b->second == buf;
      if (skip) continue;
      bool is_split = false;
      for (const char* p : kSplitProj) {
        is_split = is_split || b->second == std::string(p) + ".weight" || b->second == std::string(p) + ".bias";
      }
      if (is_split) {
        split[b->first][b->second] = it;
        continue;
      }
      if (b->second == "attn.c_attn.weight") fused_blocks.push_back(b->first);
    }
    std::optional<std::string> name = FromHfName(n);
    if (!name) {
      return InvalidArgumentError("tensor '" + it.name +
                                  "' is not part of a GPT-2 state dict (hf-gpt2 layout: "
                                  "transformer.{wte,wpe,ln_f}, transformer.h.<i>.{ln_1,attn.c_attn,"
                                  "attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}, lm_head)");
    }
    Item r = Renamed(it, *name);
    if (*name == kWte) wte = &it;
    out->push_back(std::move(r));
  }
  for (const std::string& b : fused_blocks) {
    if (split.count(b)) {
      return InvalidArgumentError("block " + b + " holds both attn.c_attn and split q/k/v projections");
    }
  }
  for (const auto& [block, parts] : split) SK_RETURN_IF_ERROR(FuseQkv(block, parts, out));
  return HeadToShardkit(lm_head, wte, "wte", tied, /*absent_head_is_tied=*/true, out);
}

Status ShardkitToHfGpt2(const std::vector<Item>& in, std::optional<bool> tied, std::vector<Item>* out) {
  const Item* wte = nullptr;
  for (const Item& it : in) {
    if (it.name == kWte) wte = &it;
  }
  for (const Item& it : in) {
    std::optional<std::string> name = ToHfName(it.name);
    if (!name) {
      return InvalidArgumentError("tensor '" + it.name +
                                  "' has no hf-gpt2 name: hf-gpt2 holds GPT models (units embed, "
                                  "h.<i> with attn and mlp, head)");
    }
    if (it.name != kLmHead) {
      out->push_back(Renamed(it, *name));
      continue;
    }
    SK_RETURN_IF_ERROR(HeadToHf(it, wte, "wte", tied, out));
  }
  return OkStatus();
}

Status HfLlamaToShardkit(const std::vector<Item>& in, std::optional<bool> tied, std::vector<Item>* out) {
  const Item* lm_head = nullptr;
  const Item* embed = nullptr;
  for (const Item& it : in) {
    if (it.name == kHfLmHead) {
      lm_head = &it;
      continue;
    }
    const std::string n = StartsWith(it.name, kLlamaPrefix) ? it.name.substr(std::strlen(kLlamaPrefix)) : it.name;
    if (auto b = SplitBlock(n, "layers."); b && b->second == kLlamaBlockBuffer) continue;
    std::optional<std::pair<std::string, bool>> name = LlamaName(n, /*to_hf=*/false);
    if (!name) {
      return InvalidArgumentError("tensor '" + it.name +
                                  "' is not part of a Llama-family state dict (hf-llama layout: "
                                  "model.{embed_tokens,norm}, model.layers.<i>.{input_layernorm,"
                                  "self_attn.{q,k,v,o}_proj,post_attention_layernorm,"
                                  "mlp.{gate,up,down}_proj}, lm_head)");
    }
    if (name->first == kEmbedTokens) embed = &it;
    if (name->second) {
      SK_ASSIGN_OR_RETURN(Item t, Transposed(it, name->first, "an nn.Linear weight ([out, in] -> [in, out])"));
      out->push_back(std::move(t));
    } else {
      out->push_back(Renamed(it, name->first));
    }
  }
  return HeadToShardkit(lm_head, embed, "embed_tokens", tied, /*absent_head_is_tied=*/false, out);
}

Status ShardkitToHfLlama(const std::vector<Item>& in, std::optional<bool> tied, std::vector<Item>* out) {
  const Item* embed = nullptr;
  for (const Item& it : in) {
    if (it.name == kEmbedTokens) embed = &it;
  }
  for (const Item& it : in) {
    if (it.name == kLmHead) {
      SK_RETURN_IF_ERROR(HeadToHf(it, embed, "embed_tokens", tied, out));
      continue;
    }
    std::optional<std::pair<std::string, bool>> name = LlamaName(it.name, /*to_hf=*/true);
    if (!name) {
      return InvalidArgumentError("tensor '" + it.name +
                                  "' has no hf-llama name: hf-llama holds Llama-family models (units "
                                  "embed, layers.<i> with self_attn and mlp, head)");
    }
    if (name->second) {
      SK_ASSIGN_OR_RETURN(Item t, Transposed(it, name->first, "a matmul weight ([in, out] -> [out, in])"));
      out->push_back(std::move(t));
    } else {
      out->push_back(Renamed(it, name->first));
    }
  }
  return OkStatus();
}

}  // namespace

const char* WeightLayoutName(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kShardkit: return "shardkit";
    case WeightLayout::kTorch: return "torch";
    case WeightLayout::kHfGpt2: return "hf-gpt2";
    case WeightLayout::kHfLlama: return "hf-llama";
  }
  return "?";
}

StatusOr<WeightLayout> ParseWeightLayout(const std::string& name) {
  for (WeightLayout l : {WeightLayout::kShardkit, WeightLayout::kTorch, WeightLayout::kHfGpt2,
                         WeightLayout::kHfLlama}) {
    if (name == WeightLayoutName(l)) return l;
  }
  return InvalidArgumentError("unknown weight layout '" + name + "' (shardkit, torch, hf-gpt2, hf-llama)");
}

StatusOr<std::string> LayoutName(const std::string& shardkit_name, WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kShardkit:
    case WeightLayout::kTorch:
      return shardkit_name;
    case WeightLayout::kHfGpt2:
      if (auto n = ToHfName(shardkit_name)) return *n;
      return InvalidArgumentError("parameter '" + shardkit_name + "' has no hf-gpt2 name");
    case WeightLayout::kHfLlama:
      if (shardkit_name == kLmHead) return std::string(kHfLmHead);
      if (auto n = LlamaName(shardkit_name, /*to_hf=*/true)) return n->first;
      return InvalidArgumentError("parameter '" + shardkit_name + "' has no hf-llama name");
  }
  return InvalidArgumentError("invalid weight layout " + std::to_string(static_cast<int>(layout)));
}

StatusOr<SafeTensorsFile> ConvertWeights(const SafeTensorsFile& in, WeightLayout from, WeightLayout to,
                                         const ConvertOptions& options) {
  for (WeightLayout l : {from, to}) {
    if (l != WeightLayout::kShardkit && l != WeightLayout::kTorch && l != WeightLayout::kHfGpt2 &&
        l != WeightLayout::kHfLlama) {
      return InvalidArgumentError("invalid weight layout " + std::to_string(static_cast<int>(l)));
    }
  }
  std::vector<Item> items;
  for (const SafeTensorsEntry& e : in.Entries()) {
    if (StartsWith(e.name, kOptimPrefix) && from != to) {
      if (!options.drop_optimizer_state) return OptimizerStateError(e.name, from, to);
      continue;
    }
    items.push_back(FromFile(e));
  }
  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : in.metadata()) {
    if (k == "format") continue;
    // Another layout holds weights only: no optimizer state, no step.
    if (from != to && (StartsWith(k, kOptimMetaPrefix) || k == kStepKey)) continue;
    meta[k] = v;
  }
  // Through the shardkit layout: from -> shardkit -> to.
  std::vector<Item> mid;
  switch (from) {
    case WeightLayout::kShardkit: mid = items; break;
    case WeightLayout::kTorch:
      SK_RETURN_IF_ERROR(TransposeMatmulWeights(items, "an nn.Linear weight [out, in]", &mid));
      break;
    case WeightLayout::kHfGpt2: SK_RETURN_IF_ERROR(HfGpt2ToShardkit(items, options.tie_word_embeddings, &mid)); break;
    case WeightLayout::kHfLlama: SK_RETURN_IF_ERROR(HfLlamaToShardkit(items, options.tie_word_embeddings, &mid)); break;
  }
  std::vector<Item> result;
  switch (to) {
    case WeightLayout::kShardkit: result = std::move(mid); break;
    case WeightLayout::kTorch:
      SK_RETURN_IF_ERROR(TransposeMatmulWeights(mid, "a matmul weight [in, out]", &result));
      break;
    case WeightLayout::kHfGpt2: SK_RETURN_IF_ERROR(ShardkitToHfGpt2(mid, options.tie_word_embeddings, &result)); break;
    case WeightLayout::kHfLlama: SK_RETURN_IF_ERROR(ShardkitToHfLlama(mid, options.tie_word_embeddings, &result)); break;
  }
  meta["format"] = to == WeightLayout::kShardkit ? "shardkit" : "pt";
  std::vector<SafeTensorsEntry> entries;
  entries.reserve(result.size());
  for (const Item& it : result) entries.push_back({it.name, it.dtype, it.shape, it.data});
  return SafeTensorsFile::FromEntries(entries, meta);
}

}  // namespace sk
