#include "runtime/data/jsonl_file.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"

namespace sk {
namespace data {
namespace {

constexpr int32_t kIgnore = -1;  // the runtime's kIgnoreTarget
// JSON records are flat: an array inside an object.
constexpr int kMaxRecordNesting = 8;

StatusOr<std::vector<int64_t>> IntArray(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (!it->is_array()) return DataLossError(where + ": \"" + key + "\" is not an array");
  std::vector<int64_t> out;
  out.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& v = (*it)[i];
    if (!v.is_number_integer()) {
      return DataLossError(where + ": \"" + key + "\"[" + std::to_string(i) + "] is " + v.dump() +
                           ", not an integer");
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

bool IsBlank(const std::string& line) {
  for (char c : line) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

}  // namespace

StatusOr<TokenRecord> ParseTokenRecord(const std::string& line, int64_t vocab, const std::string& where) {
  SK_RETURN_IF_ERROR(CheckJsonNesting(line, kMaxRecordNesting, where));
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLossError(where + " is not valid JSON");
  if (!j.is_object()) return DataLossError(where + " is not a JSON object");
  if (!j.contains("input_ids")) return DataLossError(where + " has no \"input_ids\"");
  SK_ASSIGN_OR_RETURN(std::vector<int64_t> ids, IntArray(j, "input_ids", where));
  if (ids.empty()) return DataLossError(where + ": \"input_ids\" is empty");
  TokenRecord r;
  r.input_ids.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return DataLossError(where + ": input_ids[" + std::to_string(i) + "] is " + std::to_string(ids[i]) +
                           ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    r.input_ids[i] = static_cast<int32_t>(ids[i]);
  }
  const bool has_labels = j.contains("labels"), has_mask = j.contains("loss_mask");
  if (has_labels && has_mask) {
    return DataLossError(where + " has both \"labels\" and \"loss_mask\"; give one");
  }
  r.labels = r.input_ids;
  if (has_labels || has_mask) {
    const char* key = has_labels ? "labels" : "loss_mask";
    SK_ASSIGN_OR_RETURN(std::vector<int64_t> v, IntArray(j, key, where));
    if (v.size() != ids.size()) {
      return DataLossError(where + ": \"" + key + "\" has " + std::to_string(v.size()) + " entries, \"input_ids\" " +
                           std::to_string(ids.size()));
    }
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string at = where + ": " + key + "[" + std::to_string(i) + "] is " + std::to_string(v[i]);
      if (has_mask) {
        if (v[i] != 0 && v[i] != 1) return DataLossError(at + ", not 0 or 1");
        if (v[i] == 0) r.labels[i] = kIgnore;
      } else if (v[i] == kHfIgnoreLabel) {
        r.labels[i] = kIgnore;
      } else if (v[i] < 0 || v[i] >= vocab) {
        return DataLossError(at + ", neither -100 nor a token id in [0, " + std::to_string(vocab) + ")");
      } else {
        r.labels[i] = static_cast<int32_t>(v[i]);
      }
    }
  }
  return r;
}

StatusOr<std::unique_ptr<JsonlFile>> JsonlFile::Open(const std::string& path, int64_t vocab) {
  const std::string where = "JSONL file '" + path + "'";
  if (vocab <= 0 || vocab > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError(where + ": vocab must be in [1, 2^31), got " + std::to_string(vocab));
  }
  std::unique_ptr<JsonlFile> f(new JsonlFile);
  f->path_ = path;
  f->vocab_ = vocab;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd_ < 0) return NotFoundError("cannot open " + where + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(f->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgumentError(where + " is not a regular file (a directory?)");
  }
  // One pass in 1 MiB reads; only the current line is held.
  std::vector<char> buf(1 << 20);
  std::string line;
  int64_t offset = 0, line_start = 0, line_no = 1;
  auto finish_line = [&]() -> Status {
    if (!IsBlank(line)) {
      const std::string at = where + " line " + std::to_string(line_no);
      SK_ASSIGN_OR_RETURN(TokenRecord r, ParseTokenRecord(line, vocab, at));
      if (r.input_ids.size() > static_cast<size_t>(INT32_MAX)) return DataLossError(at + " is too long");
      f->records_.push_back({line_start, line_no, static_cast<int32_t>(line.size()),
                             static_cast<int32_t>(r.input_ids.size())});
    }
    line.clear();
    return OkStatus();
  };
  for (;;) {
    const ssize_t got = ::pread(f->fd_, buf.data(), buf.size(), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return DataLossError("cannot read " + where + ": " + std::strerror(errno));
    if (got == 0) break;
    for (ssize_t i = 0; i < got; ++i) {
      if (buf[i] == '\n') {
        SK_RETURN_IF_ERROR(finish_line());
        ++line_no;
        line_start = offset + i + 1;
      } else {
        line.push_back(buf[i]);
        if (static_cast<int64_t>(line.size()) > kMaxJsonlLineBytes) {
          return DataLossError(where + " line " + std::to_string(line_no) + " is longer than " +
                               std::to_string(kMaxJsonlLineBytes) + " bytes (is it JSONL?)");
        }
      }
    }
    offset += got;
  }
  SK_RETURN_IF_ERROR(finish_line());
  if (f->records_.empty()) return InvalidArgumentError(where + " holds no record");
  return f;
}

JsonlFile::~JsonlFile() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<TokenRecord> JsonlFile::ReadRecord(int64_t i) const {
  const Entry& e = records_.at(static_cast<size_t>(i));
  const std::string at = "JSONL file '" + path_ + "' line " + std::to_string(e.line);
  std::string line(static_cast<size_t>(e.bytes), '\0');
  if (!PreadFully(fd_, line.data(), line.size(), e.offset)) {
    return DataLossError("short read from " + at + " (did the file change after it was indexed?)");
  }
  SK_ASSIGN_OR_RETURN(TokenRecord r, ParseTokenRecord(line, vocab_, at));
  if (static_cast<int64_t>(r.input_ids.size()) != e.length) {
    return DataLossError(at + " changed after the file was indexed");
  }
  return r;
}

}  // namespace data
}  // namespace sk
