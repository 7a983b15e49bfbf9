// Files that survive crashes, and reads that cannot be made unbounded.
//
// Durable writes. Every file shardkit writes for a later run to read
// (checkpoint files, checkpoint indexes, safetensors state dicts, traces,
// flight-recorder dumps) goes through WriteFileDurably: the bytes go to a
// temporary file beside the target ("<path>.tmp.<pid>.<n>", unique within the
// process so concurrent writers never share one), which is fsynced, renamed
// over the target, and then the directory is fsynced so the rename itself is
// on disk. A crash at any instant leaves either the complete old file or the
// complete new one at `path`, never a torn one, and never a stray temporary
// after a reported error (it is unlinked).
//
// Bounded reads. ReadFileBounded reads regular files only (a FIFO, device,
// socket or directory is refused without blocking: a FIFO's open would wait
// for a writer for ever, /dev/zero never ends), refuses a file larger than a
// caller-given limit before reading it, and reads at most limit + 1 bytes
// even from a file that grows meanwhile.
//
// Thread safety: all functions may be called from any thread; two writers of
// the same path race only on which complete file wins.
#ifndef SHARDKIT_RUNTIME_CORE_FILE_IO_H_
#define SHARDKIT_RUNTIME_CORE_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/status.h"

namespace sk {

// A span of bytes to write; the memory stays owned by the caller.
struct ByteSpan {
  const void* data = nullptr;
  size_t size = 0;
};

// Writes the concatenation of `pieces` to `path` durably (see above).
// Unavailable naming the path and the failing system call on any I/O error;
// the previous file at `path`, if any, is then left as it was.
Status WriteFileDurably(const std::string& path, const std::vector<ByteSpan>& pieces);
// Same, for one string.
Status WriteFileDurably(const std::string& path, std::string_view text);

// fsyncs the directory (or file) at `path`, making renames and creations in it
// durable. Unavailable naming the path on failure.
Status FsyncPath(const std::string& path);

// The directory part of `path` ("." for a bare name, "/" for "/x").
std::string ParentDirectory(const std::string& path);

// Whether `path` names a regular file / a directory (symlinks followed);
// false when it does not exist or cannot be examined. Nothing is opened, so
// a FIFO is never waited on.
bool IsRegularFile(const std::string& path);
bool IsDirectory(const std::string& path);

// Reads the whole regular file at `path` (symlinks followed), at most
// `max_bytes` bytes. NotFound if it does not exist; InvalidArgument naming
// what it is if it is not a regular file (never blocks on a FIFO);
// ResourceExhausted naming the path and the limit if it is larger (checked
// with fstat, and by reading at most max_bytes + 1 bytes); Unavailable for
// other I/O errors.
// `what` names the file's role in errors ("checkpoint index").
StatusOr<std::string> ReadFileBounded(const std::string& path, int64_t max_bytes,
                                      const std::string& what = "file");

// Bounds the nesting of JSON text before anyone parses or walks it
// (nlohmann's dump and comparisons recurse: a file of 10^6 '[' overflows
// the stack). DataLoss naming `what` if brackets nest deeper than
// `max_depth`; OK otherwise (the text may still be invalid JSON). Brackets
// inside strings do not count. Linear time, no allocation.
Status CheckJsonNesting(std::string_view text, int max_depth, const std::string& what);

// Whether `s` is valid UTF-8, as every string in JSON text must be (names
// that go into checkpoint indexes, safetensors headers and traces): decided
// by nlohmann's own encoder, which throws on anything else.
bool IsValidUtf8(std::string_view s);

// Reads exactly `n` bytes of `fd` at `offset` (pread, retried on EINTR and
// short reads); false on end of file or an error.
bool PreadFully(int fd, void* buf, size_t n, int64_t offset);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_FILE_IO_H_
