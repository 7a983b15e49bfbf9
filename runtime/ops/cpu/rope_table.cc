#include "runtime/ops/cpu/rope_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "runtime/ops/math.h"

namespace sk {

namespace {

// At most this many (head_dim, theta, scaling) tables are kept (a model has
// one; tests a few); past it the oldest is dropped.
constexpr size_t kMaxCachedTables = 8;
// Tables grow in whole blocks of positions, so that a run whose packed
// documents reach a little further each step does not rebuild every step.
constexpr int64_t kPositionBlock = 256;

struct CachedTable {
  int64_t head_dim = 0;
  uint32_t theta_bits = 0;
  RopeScaling scaling;
  std::shared_ptr<const RopeTable> table;
};

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

std::shared_ptr<const RopeTable> BuildTable(int64_t head_dim, float theta,
                                            const RopeScaling& scaling, int64_t positions) {
  auto t = std::make_shared<RopeTable>();
  t->half = head_dim / 2;
  t->positions = positions;
  t->cos.resize(static_cast<size_t>(positions * t->half));
  t->sin.resize(t->cos.size());
  std::vector<float> inv_freq(static_cast<size_t>(t->half));
  for (int64_t i = 0; i < t->half; ++i) {
    inv_freq[i] = ops::math::RopeInvFreq(i, head_dim, theta, scaling);
  }
  for (int64_t p = 0; p < positions; ++p) {
    float* c = t->cos.data() + p * t->half;
    float* s = t->sin.data() + p * t->half;
    for (int64_t i = 0; i < t->half; ++i) {
      // RopeAngle's product: static_cast<float>(pos) * RopeInvFreq(...).
      const float angle = static_cast<float>(p) * inv_freq[i];
      c[i] = cosf(angle);
      s[i] = sinf(angle);
    }
  }
  return t;
}

}  // namespace

std::shared_ptr<const RopeTable> CachedRopeTable(int64_t head_dim, float theta,
                                                 const RopeScaling& scaling, int64_t positions) {
  const int64_t half = head_dim / 2;
  const int64_t row_bytes = std::max<int64_t>(1, 2 * half * static_cast<int64_t>(sizeof(float)));
  positions = std::min(positions, kMaxRopeTableBytes / row_bytes);
  static std::mutex mu;
  static std::vector<CachedTable>* cache = new std::vector<CachedTable>();
  const uint32_t theta_bits = Bits(theta);
  std::lock_guard<std::mutex> lock(mu);
  auto it = std::find_if(cache->begin(), cache->end(), [&](const CachedTable& c) {
    return c.head_dim == head_dim && c.theta_bits == theta_bits && c.scaling == scaling;
  });
  if (it != cache->end() && it->table->positions >= positions) return it->table;
  int64_t rows = (std::max<int64_t>(positions, 1) + kPositionBlock - 1) / kPositionBlock * kPositionBlock;
  if (it != cache->end()) rows = std::max(rows, 2 * it->table->positions);
  rows = std::min(rows, kMaxRopeTableBytes / row_bytes);
  std::shared_ptr<const RopeTable> table = BuildTable(head_dim, theta, scaling, rows);
  if (it != cache->end()) {
    it->table = table;
  } else {
    if (cache->size() == kMaxCachedTables) cache->erase(cache->begin());
    cache->push_back(CachedTable{head_dim, theta_bits, scaling, table});
  }
  return table;
}

void RopeCosSinRow(int64_t pos, int64_t head_dim, float theta, const RopeScaling& scaling,
                   float* cos, float* sin) {
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float angle = ops::math::RopeAngle(pos, i, head_dim, theta, scaling);
    cos[i] = cosf(angle);
    sin[i] = sinf(angle);
  }
}

}  // namespace sk
