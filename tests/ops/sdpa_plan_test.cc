// What the CUDA backend asks of cuDNN's fused SDPA, checked without a GPU:
// which calls it takes (and the reason it names for the others), the
// operand layouts it hands cuDNN's graph, and the graph cache's keys.
#include "runtime/ops/cuda/sdpa_plan.h"

#include <array>
#include <string>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/ops/cost.h"
#include "runtime/ops/ops.h"

namespace sk::ops::cuda {
namespace {

// gpt-1.3b's attention: 8 x 1024 tokens, 32 heads of 128, q/k/v in one
// [rows, 3 * 4096] buffer, out [rows, 4096].
const AttentionShape kGpt{8, 32, 1024, 1024, 128, true};
constexpr int64_t kC = 32 * 128;

TEST(SdpaPlan, TakesBf16AndF16ModelShapes) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int64_t hd : {64, 128}) {
      AttentionShape s = kGpt;
      s.head_dim = hd;
      const int64_t c = s.heads * hd;
      EXPECT_TRUE(SdpaSupports(s, t, {{3 * c, 0}, {3 * c, 0}, {3 * c, 0}, {c, 0}}).ok());
    }
  }
}

TEST(SdpaPlan, NamesWhyItDeclinesACall) {
  const SdpaOperand ok{3 * kC, 0};
  auto why = [](const Status& s) { return s.ok() ? std::string("ok") : s.ToString(); };
  Status f32 = SdpaSupports(kGpt, DType::kF32, {ok});
  EXPECT_EQ(f32.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(why(f32).find("dtype f32"), std::string::npos) << why(f32);

  AttentionShape odd = kGpt;
  odd.head_dim = 72 + 4;
  EXPECT_NE(why(SdpaSupports(odd, DType::kBF16, {ok})).find("head_dim 76"), std::string::npos);
  AttentionShape wide = kGpt;
  wide.head_dim = 256;
  EXPECT_NE(why(SdpaSupports(wide, DType::kBF16, {ok})).find("head_dim 256"), std::string::npos);

  // A row stride of 100 bf16 elements is 200 bytes: not a multiple of 16.
  EXPECT_NE(why(SdpaSupports(kGpt, DType::kBF16, {ok, {100, 0}})).find("row stride of 100"),
            std::string::npos);
  EXPECT_NE(why(SdpaSupports(kGpt, DType::kBF16, {{3 * kC, 2}})).find("aligned"),
            std::string::npos);
  AttentionShape empty = kGpt;
  empty.q_len = empty.kv_len = 0;
  EXPECT_NE(why(SdpaSupports(empty, DType::kBF16, {ok})).find("empty"), std::string::npos);

  // Packed documents: a block-diagonal mask, which the composed path takes.
  AttentionShape packed = kGpt;
  packed.key_start = *HostAllocator::Default().Empty(DType::kI32, Shape{8 * 1024});
  packed.masked_pairs = 8 * 1024;
  EXPECT_NE(why(SdpaSupports(packed, DType::kBF16, {ok})).find("packed documents"),
            std::string::npos);
}

TEST(SdpaPlan, ForwardLayoutReadsAFusedQkvBufferInPlace) {
  const SdpaPlan p = MakeSdpaForwardPlan(kGpt, DType::kBF16, {3 * kC, 3 * kC, 3 * kC, kC});
  EXPECT_FALSE(p.backward);
  EXPECT_FLOAT_EQ(p.scale, 1.0f / std::sqrt(128.0f));
  using A = std::array<int64_t, 4>;
  EXPECT_EQ(p.q.dim, (A{8, 32, 1024, 128}));
  // [batch, heads, seq, head_dim]: a sequence is 1024 rows of 3C, a head
  // 128 columns over, a token one row down.
  EXPECT_EQ(p.q.stride, (A{1024 * 3 * kC, 128, 3 * kC, 1}));
  EXPECT_EQ(p.k.stride, p.q.stride);
  EXPECT_EQ(p.o.stride, (A{1024 * kC, 128, kC, 1}));
  EXPECT_EQ(p.stats.dim, (A{8, 32, 1024, 1}));
  EXPECT_EQ(p.stats.stride, (A{32 * 1024, 1024, 1, 1}));
}

TEST(SdpaPlan, CrossLengthsUseEachOperandsOwnSequence) {
  const AttentionShape s{2, 4, 96, 160, 64, false};
  const SdpaPlan p = MakeSdpaBackwardPlan(s, DType::kF16, {256, 512, 512, 256, 256, 256, 512, 512});
  using A = std::array<int64_t, 4>;
  EXPECT_EQ(p.k.dim, (A{2, 4, 160, 64}));
  EXPECT_EQ(p.k.stride, (A{160 * 512, 64, 512, 1}));
  EXPECT_EQ(p.dq.dim, (A{2, 4, 96, 64}));
  EXPECT_EQ(p.dv.stride, (A{160 * 512, 64, 512, 1}));
}

TEST(SdpaPlan, CacheKeySeparatesWhatNeedsAnotherGraph) {
  const std::array<int64_t, 4> ld{3 * kC, 3 * kC, 3 * kC, kC};
  const std::string base = MakeSdpaForwardPlan(kGpt, DType::kBF16, ld).CacheKey();
  EXPECT_EQ(base, MakeSdpaForwardPlan(kGpt, DType::kBF16, ld).CacheKey());
  EXPECT_NE(base, MakeSdpaForwardPlan(kGpt, DType::kF16, ld).CacheKey());
  AttentionShape full = kGpt;
  full.causal = false;
  EXPECT_NE(base, MakeSdpaForwardPlan(full, DType::kBF16, ld).CacheKey());
  AttentionShape shorter = kGpt;
  shorter.q_len = shorter.kv_len = 512;
  EXPECT_NE(base, MakeSdpaForwardPlan(shorter, DType::kBF16, ld).CacheKey());
  EXPECT_NE(base, MakeSdpaForwardPlan(kGpt, DType::kBF16, {kC, kC, kC, kC}).CacheKey());
  const std::array<int64_t, 8> ld8{3 * kC, 3 * kC, 3 * kC, kC, kC, 3 * kC, 3 * kC, 3 * kC};
  EXPECT_NE(base, MakeSdpaBackwardPlan(kGpt, DType::kBF16, ld8).CacheKey());
}

// Grouped-query attention (llama3-8b: 32 query heads, 8 key/value heads):
// cuDNN reads k and v (and writes dk, dv) with kv_heads heads; q, out and
// their gradients keep all heads; the cache tells the two shapes apart.
TEST(SdpaPlan, GroupedQueryAttentionGivesKAndVTheirOwnHeadCount) {
  AttentionShape s = kGpt;
  s.kv_heads = 8;
  const int64_t kc = 8 * 128;
  const SdpaPlan p = MakeSdpaBackwardPlan(
      s, DType::kBF16, {kC, 2 * kc, 2 * kc, kC, kC, kC, 2 * kc, 2 * kc});
  EXPECT_EQ(p.q.dim, (std::array<int64_t, 4>{8, 32, 1024, 128}));
  EXPECT_EQ(p.k.dim, (std::array<int64_t, 4>{8, 8, 1024, 128}));
  EXPECT_EQ(p.v.stride, (std::array<int64_t, 4>{1024 * 2 * kc, 128, 2 * kc, 1}));
  EXPECT_EQ(p.dk.dim[1], 8);
  EXPECT_EQ(p.dq.dim[1], 32);
  EXPECT_EQ(p.stats.dim, (std::array<int64_t, 4>{8, 32, 1024, 1}));
  AttentionShape mha = s;
  mha.kv_heads = 0;
  EXPECT_NE(p.CacheKey(),
            MakeSdpaBackwardPlan(mha, DType::kBF16, {kC, 2 * kc, 2 * kc, kC, kC, kC, 2 * kc, 2 * kc})
                .CacheKey());
}

// Grouped k and v are read (and their gradients written) at kv_heads' size;
// the flops stay the query heads'.
TEST(FlashAttentionCost, GroupedQueryAttentionReadsFewerKeyAndValueBytes) {
  const OpCost mha = FlashAttentionForwardCost(8, 32, 1024, 1024, 128, true, DType::kBF16);
  const OpCost gqa = FlashAttentionForwardCost(8, 32, 1024, 1024, 128, true, DType::kBF16, 8);
  const double rows = 8.0 * 32 * 1024;
  EXPECT_DOUBLE_EQ(gqa.flops, mha.flops);
  EXPECT_DOUBLE_EQ(gqa.bytes_read, rows * 128 * 2 + 2 * (rows / 4) * 128 * 2);
  const OpCost mb = FlashAttentionBackwardCost(8, 32, 1024, 1024, 128, true, DType::kBF16);
  const OpCost gb = FlashAttentionBackwardCost(8, 32, 1024, 1024, 128, true, DType::kBF16, 8);
  EXPECT_DOUBLE_EQ(mb.bytes_written - gb.bytes_written, 2 * (rows - rows / 4) * 128 * 2);
}

// The op's declared cost and workspace (cost.h, ops.h), which the
// simulator prices and allocates.
TEST(FlashAttentionCost, CountsAttendedPairsAndTheWorkspace) {
  const AttentionShape s = kGpt;
  const double pairs = 8.0 * 32 * 1024 * 1025 / 2;  // causal: i + 1 keys for query i
  EXPECT_DOUBLE_EQ(FlashAttentionScorePairs(8, 32, 1024, 1024, true), pairs);
  EXPECT_DOUBLE_EQ(FlashAttentionScorePairs(8, 32, 1024, 1024, false), 8.0 * 32 * 1024 * 1024);
  const OpCost f = FlashAttentionForwardCost(8, 32, 1024, 1024, 128, true, DType::kBF16);
  EXPECT_STREQ(f.name, "flash_attention_fwd");
  EXPECT_EQ(f.cls, OpClass::kAttention);
  EXPECT_DOUBLE_EQ(f.flops, 4.0 * pairs * 128 + kSoftmaxFlops * pairs);
  const double rows = 8.0 * 32 * 1024;  // (batch, head, query) rows
  EXPECT_DOUBLE_EQ(f.bytes_read, 3 * rows * 128 * 2);
  EXPECT_DOUBLE_EQ(f.bytes_written, rows * 128 * 2 + rows * 4);  // out bf16, lse f32
  const OpCost b = FlashAttentionBackwardCost(8, 32, 1024, 1024, 128, true, DType::kBF16);
  EXPECT_STREQ(b.name, "flash_attention_bwd");
  EXPECT_GT(b.flops, 10.0 * pairs * 128);  // five GEMMs' worth plus the elementwise work
  EXPECT_LT(b.flops, 11.0 * pairs * 128);
  EXPECT_EQ(FlashAttentionBackwardWorkspaceElements(s), 8 * 32 * 1024 * 129);
  // Nothing quadratic: the workspace is far below one head's scores.
  EXPECT_LT(FlashAttentionBackwardWorkspaceElements(s), 8 * 32 * 1024 * 1024);
}

}  // namespace
}  // namespace sk::ops::cuda
