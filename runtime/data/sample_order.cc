#include "runtime/data/sample_order.h"

#include "runtime/ops/init.h"

namespace sk {
namespace data {
namespace {

constexpr int kFeistelRounds = 6;

// Salt so that data order never shares Philox counters with parameter
// initialisation or the synthetic streams under the same seed.
constexpr uint32_t kOrderStream = 0x6f726465;  // "orde"

}  // namespace

SampleOrder::SampleOrder(int64_t num_samples, uint64_t seed, bool shuffle)
    : num_samples_(num_samples), seed_(seed), shuffle_(shuffle) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < static_cast<uint64_t>(num_samples)) ++half_bits_;
}

uint64_t SampleOrder::Permute(uint64_t epoch, uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int round = 0; round < kFeistelRounds; ++round) {
    const Philox4x32Result r =
        Philox4x32(static_cast<uint32_t>(right), static_cast<uint32_t>(round) ^ kOrderStream,
                   static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32),
                   static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32));
    const uint64_t f = ((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t SampleOrder::At(int64_t epoch, int64_t i) const {
  if (!shuffle_) return i;
  uint64_t x = static_cast<uint64_t>(i);
  do {
    x = Permute(static_cast<uint64_t>(epoch), x);
  } while (x >= static_cast<uint64_t>(num_samples_));
  return static_cast<int64_t>(x);
}

}  // namespace data
}  // namespace sk
