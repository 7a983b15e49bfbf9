// How one training step normalises its loss over micro-batches and ranks.
//
// The step's loss is what PyTorch's cross_entropy(..., ignore_index=-100,
// reduction="mean") gives over the whole global batch at once: the sum of
// the cross-entropies of every COUNTED target (a target that is not
// kIgnoreTarget: shardkit's -1; the C ABI maps PyTorch's -100 to it) of
// every micro-batch on every rank, divided by N, the number of those
// targets. Padding and prompt tokens whose targets are ignored add nothing
// to either sum. The gradient is the gradient of that loss; gradient
// accumulation is exact however unevenly the counted targets fall over
// micro-batches and ranks.
//
// How the trainer gets there. Each micro-batch's gradient is computed
// before the next one runs, so N must be known before the first backward:
// the trainer counts its own micro-batches' targets and exchanges the
// counts with one all-gather per step (CountsNeedExchange says when), then
//  - uniform (every micro-batch of every rank counts the same number n of
//    targets, always so for the built-in sampler): each micro-batch
//    back-propagates its own mean, the M micro-batches' gradients are
//    summed and scaled by 1/M, and the data-parallel reduction averages the
//    ranks: sum / (W M n) = sum / N. This is the arithmetic the trainer has
//    always used, kept bit for bit;
//  - otherwise: every micro-batch back-propagates sum / (N / W)
//    (TokenBatch::loss_denominator), no 1/M scaling, and the data-parallel
//    average over W ranks divides once more: sum / N.
// A step where no target counts anywhere has loss 0 and a zero gradient.
//
// Thread safety: pure functions.
#ifndef SHARDKIT_RUNTIME_TRAIN_LOSS_NORMALIZATION_H_
#define SHARDKIT_RUNTIME_TRAIN_LOSS_NORMALIZATION_H_

#include <cstdint>
#include <vector>

#include "runtime/nn/model.h"

namespace sk {

// The targets of `batch` that count (are not kIgnoreTarget).
int64_t CountedTargets(const TokenBatch& batch);

struct LossNormalization {
  // Every micro-batch of every rank counts the same number of targets.
  bool uniform = true;
  // N: counted targets over every micro-batch of every rank.
  int64_t global_tokens = 0;
  // Not uniform: each micro-batch's TokenBatch::loss_denominator, N / W
  // (0 when N is 0: no gradient anywhere).
  double denominator = 0;
};

// From every rank's counts per micro-batch, rank-major: counts[r * M + m]
// is micro-batch m of rank r, over `world` ranks (counts.size() a multiple
// of world, at least one per rank).
LossNormalization NormalizeLoss(const std::vector<int64_t>& counts, int world);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_LOSS_NORMALIZATION_H_
