// Token data for training the reference models: deterministic synthetic
// streams and token files, cut into TokenBatches.
//
// Everything here is a pure function of its arguments (seeds go through the
// same counter-based Philox as parameter initialisation), so every rank of a
// data-parallel job can compute its own batch for a step without
// communication, and reruns see identical data.
#ifndef SHARDKIT_RUNTIME_NN_DATA_H_
#define SHARDKIT_RUNTIME_NN_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/nn/model.h"

namespace sk {

// `length` tokens drawn uniformly from [0, vocab) under `seed`.
// InvalidArgument if vocab is not in [1, 2^31) or length is negative.
StatusOr<std::vector<int32_t>> SyntheticTokenStream(uint64_t seed, int64_t vocab,
                                                    int64_t length);

// Element width of a token file.
enum class TokenWidth : uint8_t { kUint16 = 2, kUint32 = 4 };

// Reads a file of little-endian unsigned tokens (the nanoGPT/Megatron ".bin"
// layout, no header). Errors, each naming the file: NotFound if it cannot be
// opened; DataLoss if its size is not a multiple of the width or a read
// fails; InvalidArgument if it is empty or a token is >= vocab (naming the
// token's index), vocab is not in [1, 2^31) or the path is not a regular
// file (a directory, a pipe); ResourceExhausted if it does not fit in memory.
StatusOr<std::vector<int32_t>> ReadTokenFile(const std::string& path, TokenWidth width,
                                             int64_t vocab);

// Language-model batch `step` from a token stream: batch_size windows of
// seq_len + 1 tokens at positions drawn from (seed, step, row); inputs are
// the first seq_len, targets the next-token shift. `rank` and `world_size`
// select a disjoint set of rows for data parallelism (rank r of W gets rows
// r*batch_size.. of a global batch of W*batch_size). InvalidArgument if the
// stream is shorter than seq_len + 1 or the sizes are not positive.
StatusOr<TokenBatch> LanguageModelBatch(const std::vector<int32_t>& stream, int64_t batch_size,
                                        int64_t seq_len, uint64_t seed, int64_t step,
                                        int rank = 0, int world_size = 1);

// Sequence-to-sequence batch for the encoder-decoder: the source is a
// window of source_len tokens, the target its first seq_len tokens reversed;
// the decoder input is `bos` followed by the target shifted right. A
// deterministic task a model can learn. Same errors as LanguageModelBatch.
StatusOr<TokenBatch> ReversalBatch(const std::vector<int32_t>& stream, int64_t batch_size,
                                   int64_t source_len, int64_t seq_len, int32_t bos,
                                   uint64_t seed, int64_t step, int rank = 0,
                                   int world_size = 1);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_DATA_H_
