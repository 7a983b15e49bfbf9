#include "runtime/data/token_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/core/file_io.h"

namespace sk {
namespace data {
namespace {

int32_t LoadLe32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}


}  // namespace

const char* TokenFileLayoutName(TokenFileLayout layout) {
  switch (layout) {
    case TokenFileLayout::kAuto: return "auto";
    case TokenFileLayout::kRaw: return "raw";
    case TokenFileLayout::kLlmc: return "llm.c";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path, TokenFileLayout layout,
                                                     int token_bytes, int64_t vocab) {
  const std::string where = "token file '" + path + "'";
  if (vocab <= 0 || vocab > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError(where + ": vocab must be in [1, 2^31), got " + std::to_string(vocab));
  }
  if (token_bytes != 0 && token_bytes != 2 && token_bytes != 4) {
    return InvalidArgumentError(where + ": token width must be 2 or 4 bytes (0 = 2), got " +
                                std::to_string(token_bytes));
  }
  if (layout != TokenFileLayout::kAuto && layout != TokenFileLayout::kRaw && layout != TokenFileLayout::kLlmc) {
    return InvalidArgumentError(where + ": unknown layout " + std::to_string(static_cast<int>(layout)));
  }
  std::unique_ptr<TokenFile> f(new TokenFile);
  f->path_ = path;
  f->vocab_ = vocab;
  // O_NONBLOCK: a FIFO's open would otherwise wait for a writer; regular
  // files ignore the flag.
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd_ < 0) return NotFoundError("cannot open " + where + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(f->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgumentError(where + " is not a regular file (a directory?)");
  }
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (size == 0) return InvalidArgumentError(where + " is empty");

  int32_t head[3] = {0, 0, 0};
  if (size >= 12) {
    unsigned char b[12];
    if (!PreadFully(f->fd_, b, sizeof b, 0)) return DataLossError("cannot read " + where);
    for (int i = 0; i < 3; ++i) head[i] = LoadLe32(b + 4 * i);
  }
  const bool has_magic = head[0] == kLlmcMagicUint16 || head[0] == kLlmcMagicUint32;
  if (layout == TokenFileLayout::kAuto) layout = has_magic ? TokenFileLayout::kLlmc : TokenFileLayout::kRaw;
  f->layout_ = layout;

  if (layout == TokenFileLayout::kLlmc) {
    if (size < kLlmcHeaderBytes) {
      return DataLossError(where + " is " + std::to_string(size) + " bytes, shorter than llm.c's " +
                           std::to_string(kLlmcHeaderBytes) + "-byte header (truncated?)");
    }
    if (!has_magic) {
      return DataLossError(where + ": llm.c header magic is " + std::to_string(head[0]) + ", expected " +
                           std::to_string(kLlmcMagicUint16) + " (uint16 tokens) or " +
                           std::to_string(kLlmcMagicUint32) + " (uint32 tokens); a file without a header "
                           "is read with the raw layout");
    }
    const bool wide = head[0] == kLlmcMagicUint32;
    const int want_version = wide ? 7 : 1;
    if (head[1] != want_version) {
      return DataLossError(where + ": llm.c header version is " + std::to_string(head[1]) + ", magic " +
                           std::to_string(head[0]) + " goes with version " + std::to_string(want_version) +
                           " (header corrupt?)");
    }
    f->token_bytes_ = wide ? 4 : 2;
    if (token_bytes != 0 && token_bytes != f->token_bytes_) {
      return InvalidArgumentError(where + ": its llm.c header says " + std::to_string(f->token_bytes_) +
                                  "-byte tokens, the options say " + std::to_string(token_bytes));
    }
    f->data_offset_ = kLlmcHeaderBytes;
    if (head[2] < 0) {
      return DataLossError(where + ": llm.c header gives a negative token count " + std::to_string(head[2]));
    }
    const int64_t want = kLlmcHeaderBytes + int64_t{head[2]} * f->token_bytes_;
    if (want != size) {
      return DataLossError(where + ": llm.c header says " + std::to_string(head[2]) + " tokens (" +
                           std::to_string(want) + " bytes with the header), the file has " +
                           std::to_string(size) + " bytes" + (size < want ? " (truncated)" : ""));
    }
    f->num_tokens_ = head[2];
  } else {
    f->token_bytes_ = token_bytes == 0 ? 2 : token_bytes;
    if (size % f->token_bytes_ != 0) {
      return DataLossError(where + " has " + std::to_string(size) + " bytes, not a multiple of the " +
                           std::to_string(f->token_bytes_) + "-byte token width (truncated, or the wrong width?)");
    }
    f->num_tokens_ = size / f->token_bytes_;
  }
  if (f->num_tokens_ == 0) return InvalidArgumentError(where + " holds no tokens");
  return f;
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status TokenFile::ReadTokens(int64_t begin, int64_t count, int32_t* out) const {
  if (begin < 0 || count < 0 || begin > num_tokens_ || count > num_tokens_ - begin) {
    return OutOfRangeError("token file '" + path_ + "': tokens [" + std::to_string(begin) + ", " +
                           std::to_string(begin + count) + ") are outside its " + std::to_string(num_tokens_));
  }
  // Read in pieces of at most 1 MiB so a long read needs no large buffer.
  constexpr int64_t kChunkTokens = 1 << 18;
  std::vector<unsigned char> bytes(static_cast<size_t>(std::min(count, kChunkTokens) * token_bytes_));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(count - done, kChunkTokens);
    const int64_t offset = data_offset_ + (begin + done) * token_bytes_;
    if (!PreadFully(fd_, bytes.data(), static_cast<size_t>(n * token_bytes_), offset)) {
      return DataLossError("short read from token file '" + path_ + "' at byte " + std::to_string(offset) +
                           " (did it shrink?)");
    }
    for (int64_t i = 0; i < n; ++i) {
      const unsigned char* p = bytes.data() + i * token_bytes_;
      uint32_t v = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
      if (token_bytes_ == 4) v |= static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
      if (v >= static_cast<uint64_t>(vocab_)) {
        const int64_t index = begin + done + i;
        return InvalidArgumentError("token file '" + path_ + "': token " + std::to_string(index) + " (byte " +
                                    std::to_string(data_offset_ + index * token_bytes_) + ") is " +
                                    std::to_string(v) + ", outside the vocabulary [0, " + std::to_string(vocab_) +
                                    ")");
      }
      out[done + i] = static_cast<int32_t>(v);
    }
    done += n;
  }
  return OkStatus();
}

}  // namespace data
}  // namespace sk
