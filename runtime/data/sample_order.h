// The order in which an epoch visits a dataset's samples: a pseudo-random
// permutation of 0..S-1 per epoch, computable at any position without
// replaying the positions before it.
//
// The permutation is a balanced Feistel network over the smallest even
// power-of-two domain 2^k >= S, with six rounds whose round function is
// Philox4x32-10 (runtime/ops/init.h: the generator parameter initialisation
// uses) keyed by the seed and counting (half-block, round, epoch); values that
// land at or above S walk the cycle again until they fall inside (at most a
// few steps on average: 2^k < 4S). A Feistel network is a bijection for any
// round function, so every epoch visits each sample exactly once, and At(e, i)
// costs a handful of Philox calls whatever i is. This is what makes a resumed
// run (at any world size) see the same order: the position is one integer.
//
// Thread safety: immutable after construction; At may be called from any thread.
#ifndef SHARDKIT_RUNTIME_DATA_SAMPLE_ORDER_H_
#define SHARDKIT_RUNTIME_DATA_SAMPLE_ORDER_H_

#include <cstdint>

namespace sk {
namespace data {

class SampleOrder {
 public:
  // num_samples >= 1. shuffle = false: the identity order every epoch.
  SampleOrder(int64_t num_samples, uint64_t seed, bool shuffle);

  int64_t num_samples() const { return num_samples_; }
  // The sample visited at position `i` (0 <= i < num_samples) of `epoch` (>= 0).
  int64_t At(int64_t epoch, int64_t i) const;

 private:
  uint64_t Permute(uint64_t epoch, uint64_t x) const;

  int64_t num_samples_;
  uint64_t seed_;
  bool shuffle_;
  int half_bits_ = 1;  // each Feistel half; the domain is 2^(2 * half_bits_)
};

}  // namespace data
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_DATA_SAMPLE_ORDER_H_
