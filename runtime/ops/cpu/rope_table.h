// Cached cos/sin tables of rotary position embeddings, so the CPU's RoPE
// turns each pair by two loads instead of a powf and a sincosf per element
// per call (those were about 7% of a llama-10m step's samples).
//
// A table holds, for one (head_dim, theta, scaling), cosf and sinf of
// math.h's RopeAngle(pos, i, ...) for positions [0, positions) and
// i < head_dim / 2: the angle computed from RopeInvFreq exactly as
// RopeAngle computes it (one f32 multiply of the position by the same f32
// inverse frequency), then the same cosf and sinf as RopePair. A rotation
// through a table entry (math.h's RopeRotate) therefore gives the bits of
// the direct computation (tests/ops/conformance_test.cc compares them).
//
// Thread safety: CachedRopeTable is thread-safe; a returned table is
// immutable and stays valid while the caller holds it.
#ifndef SHARDKIT_RUNTIME_OPS_CPU_ROPE_TABLE_H_
#define SHARDKIT_RUNTIME_OPS_CPU_ROPE_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/ops/rope_scaling.h"

namespace sk {

struct RopeTable {
  int64_t half = 0;       // head_dim / 2
  int64_t positions = 0;  // rows: positions [0, positions)
  std::vector<float> cos, sin;  // [positions, half], row pos at pos * half
};

// A table of (head_dim, theta, scaling) covering positions
// [0, min(positions, kMaxRopeTableBytes / (4 head_dim bytes))) at least, from
// the process-wide cache (built, or rebuilt larger, on a miss; the larger
// table replaces the smaller, which stays valid for its holders). Positions
// past a table's end (a context over 256K positions at head_dim 64) are
// the caller's to compute (RopeCosSinRow). head_dim even and > 0.
inline constexpr int64_t kMaxRopeTableBytes = int64_t{64} << 20;
std::shared_ptr<const RopeTable> CachedRopeTable(int64_t head_dim, float theta,
                                                 const RopeScaling& scaling, int64_t positions);

// cos[i] and sin[i] of RopeAngle(pos, i, head_dim, theta, scaling) for
// i < head_dim / 2, as a table row holds them: for positions outside a table.
void RopeCosSinRow(int64_t pos, int64_t head_dim, float theta, const RopeScaling& scaling,
                   float* cos, float* sin);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_CPU_ROPE_TABLE_H_
