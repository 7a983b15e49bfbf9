#include "runtime/ops/cuda/sdpa_plan.h"

#include <cmath>
#include <initializer_list>
#include <string>

namespace sk::ops::cuda {

namespace {

// q-shaped operands have s.heads heads; k-shaped ones (kv) s.KvHeads():
// cuDNN's SDPA takes grouped-query attention as K and V with fewer heads.
SdpaTensorLayout Rows(const AttentionShape& s, int64_t len, int64_t ld, bool kv = false) {
  SdpaTensorLayout l;
  l.dim = {s.batch, kv ? s.KvHeads() : s.heads, len, s.head_dim};
  l.stride = {len * ld, s.head_dim, ld, 1};
  return l;
}

SdpaTensorLayout Stats(const AttentionShape& s) {
  SdpaTensorLayout l;
  l.dim = {s.batch, s.heads, s.q_len, 1};
  l.stride = {s.heads * s.q_len, s.q_len, 1, 1};
  return l;
}

SdpaPlan Common(const AttentionShape& s, DType t, bool backward) {
  SdpaPlan p;
  p.backward = backward;
  p.dtype = t;
  p.shape = s;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  p.stats = Stats(s);
  return p;
}

void Append(std::string* key, const SdpaTensorLayout& l) {
  for (int64_t v : l.dim) *key += std::to_string(v) + ",";
  for (int64_t v : l.stride) *key += std::to_string(v) + ",";
  *key += ";";
}

}  // namespace

std::string SdpaPlan::CacheKey() const {
  std::string key = backward ? "bwd:" : "fwd:";
  key += std::string(DTypeName(dtype)) + (shape.causal ? ":causal:" : ":full:");
  for (const SdpaTensorLayout* l : {&q, &k, &v, &o, &stats}) Append(&key, *l);
  if (backward) {
    for (const SdpaTensorLayout* l : {&dout, &dq, &dk, &dv}) Append(&key, *l);
  }
  return key;
}

Status SdpaSupports(const AttentionShape& s, DType t, std::initializer_list<SdpaOperand> ops) {
  auto no = [](const std::string& why) { return FailedPreconditionError(why); };
  if (t != DType::kBF16 && t != DType::kF16) {
    return no("dtype " + std::string(DTypeName(t)) + " (cuDNN's fused SDPA takes bf16 and f16)");
  }
  if (s.batch == 0 || s.heads == 0 || s.q_len == 0 || s.kv_len == 0) return no("an empty shape");
  if (s.key_start.defined()) {
    // cuDNN's SDPA masks are causal, padding (per-sequence lengths) and
    // sliding windows; a block-diagonal mask inside one row would need the
    // documents as ragged sequences of their own, which the graph here does
    // not build.
    return no("packed documents (key_start: a block-diagonal causal mask, which cuDNN's SDPA "
              "graph here does not express)");
  }
  if (s.head_dim % 8 != 0 || s.head_dim > kSdpaMaxHeadDim) {
    return no("head_dim " + std::to_string(s.head_dim) + " (multiples of 8 up to " +
              std::to_string(kSdpaMaxHeadDim) + ")");
  }
  const int64_t elem = static_cast<int64_t>(DTypeSize(t));
  for (const SdpaOperand& op : ops) {
    if ((op.ld * elem) % kSdpaAlignmentBytes != 0) {
      return no("a row stride of " + std::to_string(op.ld) + " elements (not a multiple of " +
                std::to_string(kSdpaAlignmentBytes) + " bytes)");
    }
    if (op.misalignment != 0) {
      return no("an operand that does not start " + std::to_string(kSdpaAlignmentBytes) +
                "-byte aligned");
    }
  }
  return OkStatus();
}

SdpaPlan MakeSdpaForwardPlan(const AttentionShape& s, DType t, std::array<int64_t, 4> ld) {
  SdpaPlan p = Common(s, t, false);
  p.q = Rows(s, s.q_len, ld[0]);
  p.k = Rows(s, s.kv_len, ld[1], true);
  p.v = Rows(s, s.kv_len, ld[2], true);
  p.o = Rows(s, s.q_len, ld[3]);
  return p;
}

SdpaPlan MakeSdpaBackwardPlan(const AttentionShape& s, DType t, std::array<int64_t, 8> ld) {
  SdpaPlan p = Common(s, t, true);
  p.q = Rows(s, s.q_len, ld[0]);
  p.k = Rows(s, s.kv_len, ld[1], true);
  p.v = Rows(s, s.kv_len, ld[2], true);
  p.o = Rows(s, s.q_len, ld[3]);
  p.dout = Rows(s, s.q_len, ld[4]);
  p.dq = Rows(s, s.q_len, ld[5]);
  p.dk = Rows(s, s.kv_len, ld[6], true);
  p.dv = Rows(s, s.kv_len, ld[7], true);
  return p;
}

}  // namespace sk::ops::cuda
