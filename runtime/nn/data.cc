#include "runtime/nn/data.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <utility>

#include <sys/stat.h>
#include <unistd.h>

#include "runtime/ops/init.h"

namespace sk {
namespace {

// Philox keyed by the seed, counter (a, b, c): a uniform 64-bit value.
uint64_t Draw(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  Philox4x32Result r = Philox4x32(static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                                  static_cast<uint32_t>(b), static_cast<uint32_t>(c),
                                  static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

// A 64-bit value mapped to [0, n) by a 128-bit multiply (Lemire), bias < n / 2^64.
int64_t Below(uint64_t x, uint64_t n) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
}

Status CheckBatchArgs(const std::vector<int32_t>& stream, int64_t batch_size, int64_t window,
                      int rank, int world_size) {
  if (batch_size <= 0) return InvalidArgumentError("batch_size must be positive");
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " is not in a world of " +
                                std::to_string(world_size));
  }
  if (batch_size > (int64_t{1} << 40) / window) {
    return InvalidArgumentError("batch of " + std::to_string(batch_size) + " x " +
                                std::to_string(window) + " tokens is too large");
  }
  if (static_cast<int64_t>(stream.size()) < window) {
    return InvalidArgumentError("token stream of " + std::to_string(stream.size()) +
                                " tokens is shorter than one window of " + std::to_string(window));
  }
  return OkStatus();
}

// Whether `bytes` is at most this machine's physical memory: a batch larger
// than that is refused before it is allocated. (Sanitizer allocators abort
// on a terabyte request instead of throwing std::bad_alloc.)
bool WithinPhysicalMemory(double bytes) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return true;
  return bytes <= static_cast<double>(pages) * static_cast<double>(page);
}

// A batch whose token vectors the host cannot allocate: an error, not an
// uncaught std::bad_alloc (CheckBatchArgs admits up to 2^40 tokens).
Status BatchTooLarge(int64_t batch_size, int64_t window) {
  return ResourceExhaustedError("batch of " + std::to_string(batch_size) + " x " + std::to_string(window) +
                                " tokens does not fit in host memory");
}

// Reserves each vector's token count (CheckBatchArgs bounds the products):
// BatchTooLarge when together they exceed physical memory or an allocation
// fails.
Status ReserveTokens(std::initializer_list<std::pair<std::vector<int32_t>*, int64_t>> parts,
                     int64_t batch_size, int64_t window) {
  double bytes = 0;
  for (const auto& part : parts) bytes += sizeof(int32_t) * static_cast<double>(part.second);
  if (!WithinPhysicalMemory(bytes)) return BatchTooLarge(batch_size, window);
  try {
    for (const auto& part : parts) part.first->reserve(static_cast<size_t>(part.second));
  } catch (const std::bad_alloc&) {
    return BatchTooLarge(batch_size, window);
  } catch (const std::length_error&) {
    return BatchTooLarge(batch_size, window);
  }
  return OkStatus();
}

// Stream-level salt so that batch positions and synthetic tokens never share counters.
constexpr uint64_t kPositionStream = 0x706f736974696f6eull;

int64_t WindowStart(const std::vector<int32_t>& stream, int64_t window, uint64_t seed,
                    int64_t step, int64_t global_row) {
  const uint64_t starts = stream.size() - static_cast<uint64_t>(window) + 1;
  return Below(Draw(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(global_row),
                    static_cast<uint32_t>(kPositionStream)),
               starts);
}

}  // namespace

StatusOr<std::vector<int32_t>> SyntheticTokenStream(uint64_t seed, int64_t vocab,
                                                    int64_t length) {
  if (vocab <= 0 || vocab > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError("vocab must be in [1, 2^31), got " + std::to_string(vocab));
  }
  if (length < 0) return InvalidArgumentError("length must be >= 0, got " + std::to_string(length));
  // The stream is a pure function of its arguments, and callers that build
  // many trainers (the planner: thousands of simulated candidates) ask for
  // the same one each time: the last stream is kept and copied out (a copy
  // is a memcpy; drawing is one Philox per token).
  struct Last {
    std::mutex mu;
    uint64_t seed = 0;
    int64_t vocab = 0;
    std::vector<int32_t> tokens;
    bool valid = false;
  };
  static Last* last = new Last;  // never destroyed: trainers may be built at exit
  {
    std::lock_guard<std::mutex> lock(last->mu);
    if (last->valid && last->seed == seed && last->vocab == vocab &&
        static_cast<int64_t>(last->tokens.size()) == length) {
      return last->tokens;
    }
  }
  std::vector<int32_t> out(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) {
    out[i] = static_cast<int32_t>(Below(Draw(seed, static_cast<uint64_t>(i), 0, 0),
                                        static_cast<uint64_t>(vocab)));
  }
  std::lock_guard<std::mutex> lock(last->mu);
  last->seed = seed;
  last->vocab = vocab;
  last->tokens = out;
  last->valid = true;
  return out;
}

StatusOr<std::vector<int32_t>> ReadTokenFile(const std::string& path, TokenWidth width,
                                             int64_t vocab) {
  // Tokens are int32: a larger vocabulary would let 0xffffffff through as -1.
  if (vocab <= 0 || vocab > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError("vocab must be in [1, 2^31), got " + std::to_string(vocab));
  }
  if (width != TokenWidth::kUint16 && width != TokenWidth::kUint32) {
    return InvalidArgumentError("token width must be 2 or 4 bytes");
  }
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return NotFoundError("cannot open token file '" + path + "': " + std::strerror(errno));
  // A directory opens and "sizes" as 2^63 - 1; a pipe or device has no size.
  struct stat st;
  if (::fstat(::fileno(f.get()), &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgumentError("token file '" + path + "' is not a regular file (a directory?)");
  }
  if (std::fseek(f.get(), 0, SEEK_END) != 0) {
    return DataLossError("cannot seek in token file '" + path + "'");
  }
  const long size = std::ftell(f.get());
  if (size < 0) return DataLossError("cannot size token file '" + path + "'");
  std::rewind(f.get());
  const size_t w = static_cast<size_t>(width);
  if (size == 0) return InvalidArgumentError("token file '" + path + "' is empty");
  if (static_cast<size_t>(size) % w != 0) {
    return DataLossError("token file '" + path + "' has " + std::to_string(size) +
                         " bytes, not a multiple of the " + std::to_string(w) +
                         "-byte token width (truncated, or the wrong width?)");
  }
  std::vector<unsigned char> bytes;
  std::vector<int32_t> out;
  try {
    bytes.resize(static_cast<size_t>(size));
    out.resize(bytes.size() / w);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("token file '" + path + "' is " + std::to_string(size) +
                                  " bytes: it and its tokens do not fit in host memory");
  }
  if (std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
    return DataLossError("short read from token file '" + path + "'");
  }
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    for (size_t b = 0; b < w; ++b) v |= static_cast<uint64_t>(bytes[i * w + b]) << (8 * b);
    if (v >= static_cast<uint64_t>(vocab)) {
      return InvalidArgumentError("token file '" + path + "': token " + std::to_string(i) +
                                  " is " + std::to_string(v) + ", outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
    }
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

StatusOr<TokenBatch> LanguageModelBatch(const std::vector<int32_t>& stream, int64_t batch_size,
                                        int64_t seq_len, uint64_t seed, int64_t step, int rank,
                                        int world_size) {
  if (seq_len <= 0) return InvalidArgumentError("seq_len must be positive");
  SK_RETURN_IF_ERROR(CheckBatchArgs(stream, batch_size, seq_len + 1, rank, world_size));
  TokenBatch b;
  b.batch_size = batch_size;
  b.seq_len = seq_len;
  SK_RETURN_IF_ERROR(ReserveTokens({{&b.inputs, batch_size * seq_len}, {&b.targets, batch_size * seq_len}},
                                   batch_size, seq_len));
  for (int64_t r = 0; r < batch_size; ++r) {
    const int64_t start = WindowStart(stream, seq_len + 1, seed, step, rank * batch_size + r);
    const int32_t* w = stream.data() + start;
    b.inputs.insert(b.inputs.end(), w, w + seq_len);
    b.targets.insert(b.targets.end(), w + 1, w + seq_len + 1);
  }
  return b;
}

StatusOr<TokenBatch> ReversalBatch(const std::vector<int32_t>& stream, int64_t batch_size,
                                   int64_t source_len, int64_t seq_len, int32_t bos,
                                   uint64_t seed, int64_t step, int rank, int world_size) {
  if (source_len <= 0 || seq_len <= 0 || seq_len > source_len) {
    return InvalidArgumentError("need 0 < seq_len <= source_len, got seq_len " +
                                std::to_string(seq_len) + ", source_len " +
                                std::to_string(source_len));
  }
  SK_RETURN_IF_ERROR(CheckBatchArgs(stream, batch_size, source_len, rank, world_size));
  TokenBatch b;
  b.batch_size = batch_size;
  b.seq_len = seq_len;
  b.source_len = source_len;
  SK_RETURN_IF_ERROR(ReserveTokens({{&b.source, batch_size * source_len},
                                    {&b.targets, batch_size * seq_len},
                                    {&b.inputs, batch_size * seq_len}},
                                   batch_size, source_len));
  for (int64_t r = 0; r < batch_size; ++r) {
    const int64_t start = WindowStart(stream, source_len, seed, step, rank * batch_size + r);
    const int32_t* w = stream.data() + start;
    b.source.insert(b.source.end(), w, w + source_len);
    std::vector<int32_t> target(w, w + seq_len);
    std::reverse(target.begin(), target.end());
    b.targets.insert(b.targets.end(), target.begin(), target.end());
    b.inputs.push_back(bos);
    b.inputs.insert(b.inputs.end(), target.begin(), target.end() - 1);
  }
  return b;
}

}  // namespace sk
