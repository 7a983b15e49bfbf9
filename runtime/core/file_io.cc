#include "runtime/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

namespace sk {

namespace {

std::string ErrnoText() { return std::strerror(errno); }

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return UnavailableError("write to '" + path + "' failed: " + ErrnoText());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

std::string TempNameFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
}

}  // namespace

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string ParentDirectory(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return UnavailableError("cannot open '" + path + "' to fsync: " + ErrnoText());
  int rc = ::fsync(fd);
  const std::string err = rc != 0 ? ErrnoText() : std::string();
  ::close(fd);
  if (rc != 0) return UnavailableError("fsync of '" + path + "' failed: " + err);
  return OkStatus();
}

Status WriteFileDurably(const std::string& path, const std::vector<ByteSpan>& pieces) {
  if (path.empty()) return InvalidArgumentError("WriteFileDurably: empty path");
  // The rename below replaces whatever `path` names. For a device, FIFO or
  // socket (an output flag given /dev/null or /dev/full) that swapped the
  // node for a regular file where the caller may (as root) create files in
  // /dev; such a path is refused instead. Symlinks are followed for the check.
  // (A directory is left to rename, which fails on it.)
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 &&
      (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
    return InvalidArgumentError("'" + path + "' is not a regular file (a device, FIFO or socket): not replacing it");
  }
  const std::string tmp = TempNameFor(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return UnavailableError("cannot create '" + tmp + "': " + ErrnoText());
  Status s;
  for (size_t i = 0; s.ok() && i < pieces.size(); ++i) {
    if (pieces[i].size > 0) s = WriteAll(fd, pieces[i].data, pieces[i].size, tmp);
  }
  if (s.ok() && ::fsync(fd) != 0) s = UnavailableError("fsync of '" + tmp + "' failed: " + ErrnoText());
  if (::close(fd) != 0 && s.ok()) s = UnavailableError("close of '" + tmp + "' failed: " + ErrnoText());
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = UnavailableError("cannot rename '" + tmp + "' to '" + path + "': " + ErrnoText());
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncPath(ParentDirectory(path));
}

Status WriteFileDurably(const std::string& path, std::string_view text) {
  return WriteFileDurably(path, std::vector<ByteSpan>{{text.data(), text.size()}});
}

StatusOr<std::string> ReadFileBounded(const std::string& path, int64_t max_bytes, const std::string& what) {
  if (max_bytes < 0) return InvalidArgumentError("ReadFileBounded: negative limit");
  // O_NONBLOCK: opening a FIFO without a writer would block for ever (a
  // unit-table path naming a FIFO hung sk_plan and trainer creation); with it
  // the open returns at once and fstat refuses what it is.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(what + " '" + path + "' does not exist");
    return UnavailableError("cannot open " + what + " '" + path + "': " + ErrnoText());
  }
  auto too_big = [&](const std::string& size) {
    return ResourceExhaustedError(what + " '" + path + "' is " + size + ", larger than the limit of " +
                                  std::to_string(max_bytes) + " bytes (not a " + what + "?)");
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = UnavailableError("cannot stat " + what + " '" + path + "': " + ErrnoText());
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    return InvalidArgumentError(what + " '" + path + "' is not a regular file (it is " + kind + "); refusing to read it");
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    return too_big(std::to_string(st.st_size) + " bytes");
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const int64_t room = max_bytes + 1 - static_cast<int64_t>(out.size());
    if (room <= 0) {
      ::close(fd);
      return too_big("more than " + std::to_string(max_bytes) + " bytes");
    }
    ssize_t r = ::read(fd, buf, static_cast<size_t>(std::min<int64_t>(room, sizeof buf)));
    if (r < 0) {
      if (errno == EINTR) continue;
      Status s = UnavailableError("cannot read " + what + " '" + path + "': " + ErrnoText());
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

Status CheckJsonNesting(std::string_view text, int max_depth, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;  // skip the escaped character
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > max_depth) {
        return DataLossError(what + ": JSON nested deeper than " + std::to_string(max_depth) +
                             " levels (at byte " + std::to_string(i) + "): corrupt or not ours");
      }
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return OkStatus();
}

bool IsValidUtf8(std::string_view s) {
  try {
    (void)nlohmann::json(std::string(s)).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

bool PreadFully(int fd, void* buf, size_t n, int64_t offset) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
  return true;
}

}  // namespace sk
