// The embedding kernels of the CUDA backend (kernels.h): the forward gather
// and the backward through CUB's stable radix sort of the ids. Shared
// helpers: kernels_common.cuh.
#include <cub/device/device_radix_sort.cuh>

#include "runtime/ops/cuda/kernels_common.cuh"

namespace sk::ops::cuda {
namespace {

// `bytes` rounded up to a multiple of 256 (the alignment of scratch pieces).
size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

__global__ void EmbeddingKernel(const void* table, DType tt, const int32_t* ids, int64_t count,
                                int64_t dim, void* out, DType ot) {
  int64_t i = Index();
  if (i < count * dim) {
    StoreF(out, ot, i, LoadF(table, tt, static_cast<int64_t>(ids[i / dim]) * dim + i % dim));
  }
}

// ---- Embedding backward: sort by id, then one block per id -----------------
//
// The ids are sorted as unsigned keys with their positions as values by CUB's
// stable radix sort (all 32 bits), so equal ids form runs whose positions
// ascend. A block whose sorted index i starts a run (i == 0 or the id before
// differs) owns that id's dtable row: its threads stride the columns, and
// each element gets dout of the run's positions added in position order, the
// CPU's order (so the bits are the CPU's). No two blocks write one row; no
// atomics. Ids outside [0, vocab) are out of the op's contract and are
// written nowhere.

__global__ void IotaKernel(int32_t* out, int64_t n) {
  const int64_t i = Index();
  if (i < n) out[i] = static_cast<int32_t>(i);
}

constexpr int64_t kMaxEmbeddingRunBlocks = 1 << 20;

__global__ void __launch_bounds__(kThreads)
    EmbeddingGradRunsKernel(const uint32_t* sorted_ids, const int32_t* positions, int64_t count,
                            int64_t dim, int64_t vocab, const void* dout, DType dt,
                            float* dtable) {
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const uint32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // inside a run another block owns
    if (static_cast<int64_t>(id) >= vocab) continue;
    int64_t end = i + 1;
    while (end < count && sorted_ids[end] == id) ++end;
    float* row = dtable + static_cast<int64_t>(id) * dim;
    for (int64_t j = blockIdx.y * static_cast<int64_t>(kThreads) + threadIdx.x; j < dim;
         j += static_cast<int64_t>(gridDim.y) * kThreads) {
      float acc = row[j];
#pragma unroll 4
      for (int64_t k = i; k < end; ++k) {
        acc += LoadF(dout, dt, static_cast<int64_t>(positions[k]) * dim + j);
      }
      row[j] = acc;
    }
  }
}

}  // namespace

int EmbeddingForward(CBuf table, const int32_t* ids, int64_t count, int64_t dim, Buf out,
                     void* stream) {
  SK_LAUNCH(count * dim, EmbeddingKernel, table.data, table.dtype, ids, count, dim, out.data,
            out.dtype);
}
int EmbeddingBackwardScratchBytes(int64_t count, size_t* bytes) {
  *bytes = 0;
  if (count <= 0) return 0;
  if (count > kMaxEmbeddingBackwardIds) return static_cast<int>(cudaErrorInvalidValue);
  size_t sort_bytes = 0;
  const cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int>(count), 0, 32);
  if (err != cudaSuccess) return static_cast<int>(err);
  *bytes = 3 * Align256(static_cast<size_t>(count) * 4) + sort_bytes;
  return 0;
}
int EmbeddingBackward(const int32_t* ids, CBuf dout, int64_t count, int64_t dim,
                      int64_t vocab, float* dtable, void* scratch, size_t scratch_bytes,
                      void* stream) {
  if (count <= 0 || dim <= 0) return 0;
  if (count > kMaxEmbeddingBackwardIds) return static_cast<int>(cudaErrorInvalidValue);
  // scratch: sorted ids | positions 0..count-1 | sorted positions | CUB's temporaries.
  const size_t piece = Align256(static_cast<size_t>(count) * 4);
  if (scratch_bytes < 3 * piece) return static_cast<int>(cudaErrorInvalidValue);
  char* base = static_cast<char*>(scratch);
  auto* sorted_ids = reinterpret_cast<uint32_t*>(base);
  auto* positions = reinterpret_cast<int32_t*>(base + piece);
  auto* sorted_positions = reinterpret_cast<int32_t*>(base + 2 * piece);
  size_t sort_bytes = scratch_bytes - 3 * piece;
  IotaKernel<<<Blocks(count), kThreads, 0, S(stream)>>>(positions, count);
  int err = Launched();
  if (err != 0) return err;
  err = static_cast<int>(cub::DeviceRadixSort::SortPairs(
      base + 3 * piece, sort_bytes, reinterpret_cast<const uint32_t*>(ids), sorted_ids, positions,
      sorted_positions, static_cast<int>(count), 0, 32, S(stream)));
  if (err != 0) return err;
  const int64_t tiles = (dim + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(count < kMaxEmbeddingRunBlocks ? count : kMaxEmbeddingRunBlocks),
                  static_cast<unsigned>(tiles < 65535 ? tiles : 65535));
  EmbeddingGradRunsKernel<<<grid, kThreads, 0, S(stream)>>>(sorted_ids, sorted_positions, count,
                                                            dim, vocab, dout.data, dout.dtype,
                                                            dtable);
  return Launched();
}

}  // namespace sk::ops::cuda
