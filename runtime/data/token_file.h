// A flat file of little-endian unsigned token ids, read by ranges.
//
// Two layouts are in use for pre-tokenized text:
//   raw   nanoGPT's and Megatron's ".bin": the tokens and nothing else,
//         uint16 (vocabularies up to 65,536) or uint32;
//   llm.c llm.c's dev/data/*.bin: a header of 256 little-endian int32 (1 KiB),
//         then the tokens. header[0] is the magic, header[1] the version,
//         header[2] the number of tokens: magic 20240520 with version 1 holds
//         uint16 tokens (GPT-2), magic 20240801 with version 7 holds uint32
//         tokens (Llama 3).
// kAuto tells them apart by the first int32: a file that starts with one of
// the two magics is an llm.c file and must then be a consistent one (a raw
// file whose first two uint16 tokens happen to spell a magic is opened with
// kRaw). Nothing is read into memory at open beyond the header: ReadTokens
// preads the range asked for, so a 100 GB file costs what the caller reads.
//
// Thread safety: a TokenFile may be read from several threads at once
// (pread has no shared file position).
#ifndef SHARDKIT_RUNTIME_DATA_TOKEN_FILE_H_
#define SHARDKIT_RUNTIME_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/core/status.h"

namespace sk {
namespace data {

enum class TokenFileLayout : int { kAuto = 0, kRaw = 1, kLlmc = 2 };

// "auto", "raw", "llm.c".
const char* TokenFileLayoutName(TokenFileLayout layout);

inline constexpr int32_t kLlmcMagicUint16 = 20240520;  // version 1
inline constexpr int32_t kLlmcMagicUint32 = 20240801;  // version 7
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

class TokenFile {
 public:
  // Opens `path`. `token_bytes` is 2 or 4 for a raw file, or 0 for the
  // default (2; an llm.c file's header decides its width, and a nonzero
  // token_bytes that disagrees with it is an error). `vocab` bounds every
  // token read (checked in ReadTokens). Errors, each naming the file:
  // NotFound if it cannot be opened; InvalidArgument if it is not a regular
  // file, is empty, token_bytes or vocab is bad, or the layout and width
  // disagree; DataLoss if an llm.c header is wrong (magic, version, token
  // count against the file size: truncated) or a raw file's size is not a
  // multiple of the token width.
  static StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path, TokenFileLayout layout,
                                                   int token_bytes, int64_t vocab);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  int token_bytes() const { return token_bytes_; }
  TokenFileLayout layout() const { return layout_; }  // resolved: kRaw or kLlmc

  // Stores tokens [begin, begin + count) in out[0..count). OutOfRange if the
  // range is not inside the file; InvalidArgument naming the file and the
  // token's index if one is >= vocab; DataLoss if the read comes up short
  // (the file shrank).
  Status ReadTokens(int64_t begin, int64_t count, int32_t* out) const;

 private:
  TokenFile() = default;
  std::string path_;
  int fd_ = -1;
  TokenFileLayout layout_ = TokenFileLayout::kRaw;
  int token_bytes_ = 2;
  int64_t data_offset_ = 0;
  int64_t num_tokens_ = 0;
  int64_t vocab_ = 0;
};

}  // namespace data
}  // namespace sk

#endif  // SHARDKIT_RUNTIME_DATA_TOKEN_FILE_H_
