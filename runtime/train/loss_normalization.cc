#include "runtime/train/loss_normalization.h"

namespace sk {

int64_t CountedTargets(const TokenBatch& batch) {
  int64_t n = 0;
  for (int32_t t : batch.targets) n += t != kIgnoreTarget;
  return n;
}

LossNormalization NormalizeLoss(const std::vector<int64_t>& counts, int world) {
  LossNormalization l;
  for (int64_t c : counts) {
    l.global_tokens += c;
    if (c != counts.front()) l.uniform = false;
  }
  if (!l.uniform && l.global_tokens > 0) {
    l.denominator = static_cast<double>(l.global_tokens) / static_cast<double>(world);
  }
  return l;
}

}  // namespace sk
