#include "runtime/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <new>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"
#include "runtime/ops/ops.h"

namespace sk {

namespace {

constexpr char kFormatKey[] = "format";
constexpr char kCrcPrefix[] = "crc32.";

std::string SafeTensorsDTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  return "";
}

StatusOr<DType> ParseSafeTensorsDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  return InvalidArgumentError("tensor dtype '" + s + "' is not one shardkit computes in (F32, BF16, F16)");
}


}  // namespace

uint32_t Crc32(const void* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const Bytef* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib takes uInt lengths
    uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

namespace {

// The 8-byte length and the JSON header of a file holding `entries` and
// `metadata` (see WriteSafeTensors for the checks).
StatusOr<std::string> SerializeHeader(const std::vector<SafeTensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : metadata) {
    if (k.rfind(kCrcPrefix, 0) == 0) {
      return InvalidArgumentError("metadata key '" + k + "' is reserved for checksums");
    }
    meta[k] = v;
  }
  if (!meta.contains(kFormatKey)) meta[kFormatKey] = "shardkit";
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const SafeTensorsEntry& e : entries) {
    if (e.name.empty()) return InvalidArgumentError("safetensors entry with an empty name");
    if (e.name.rfind("__", 0) == 0) {
      return InvalidArgumentError("tensor name '" + e.name + "' starts with '__' (reserved)");
    }
    if (!seen.insert(e.name).second) return InvalidArgumentError("duplicate tensor name '" + e.name + "'");
    SK_RETURN_IF_ERROR(ValidateDType(e.dtype).WithContext("tensor '" + e.name + "'"));
    if (SafeTensorsDTypeName(e.dtype).empty()) {
      return InvalidArgumentError("tensor '" + e.name + "' has dtype " + std::string(DTypeName(e.dtype)) +
                                  ", which shardkit does not write (F32, BF16, F16)");
    }
    uint64_t nbytes = static_cast<uint64_t>(e.shape.numel()) * DTypeSize(e.dtype);
    if (nbytes > 0 && e.data == nullptr) {
      return InvalidArgumentError("tensor '" + e.name + "' has a null data pointer");
    }
    header[e.name] = {{"dtype", SafeTensorsDTypeName(e.dtype)},
                      {"shape", e.shape.ToVector()},
                      {"data_offsets", {offset, offset + nbytes}}};
    meta[kCrcPrefix + e.name] = std::to_string(Crc32(e.data, nbytes));
    offset += nbytes;
  }
  header["__metadata__"] = meta;
  // JSON text is UTF-8 (nlohmann's dump throws on anything else): name the
  // string that is not.
  for (const SafeTensorsEntry& e : entries) {
    if (!IsValidUtf8(e.name)) return InvalidArgumentError("tensor name '" + e.name + "' is not valid UTF-8");
  }
  for (const auto& [k, v] : metadata) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return InvalidArgumentError("metadata entry '" + k + "' is not valid UTF-8");
    }
  }
  std::string json = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned (as the
  // reference implementation does).
  while ((json.size() + 8) % 8 != 0) json.push_back(' ');
  const uint64_t n = json.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<unsigned char>(n >> (8 * i)));
  return out + json;
}

}  // namespace

Status WriteSafeTensors(const std::string& path, const std::vector<SafeTensorsEntry>& entries,
                        const std::map<std::string, std::string>& metadata) {
  SK_ASSIGN_OR_RETURN(const std::string header, SerializeHeader(entries, metadata));
  std::vector<ByteSpan> pieces = {{header.data(), header.size()}};
  for (const SafeTensorsEntry& e : entries) {
    pieces.push_back({e.data, static_cast<size_t>(e.shape.numel()) * DTypeSize(e.dtype)});
  }
  return WriteFileDurably(path, pieces);
}

StatusOr<SafeTensorsFile> SafeTensorsFile::FromEntries(const std::vector<SafeTensorsEntry>& entries,
                                                       const std::map<std::string, std::string>& metadata) {
  SK_ASSIGN_OR_RETURN(const std::string header, SerializeHeader(entries, metadata));
  std::vector<char> bytes(header.begin(), header.end());
  for (const SafeTensorsEntry& e : entries) {
    const char* p = static_cast<const char*>(e.data);
    bytes.insert(bytes.end(), p, p + static_cast<size_t>(e.shape.numel()) * DTypeSize(e.dtype));
  }
  return Parse("(in memory)", std::move(bytes));
}

std::vector<SafeTensorsEntry> SafeTensorsFile::Entries() const {
  std::vector<SafeTensorsEntry> out;
  for (const std::string& name : names_) {
    const Info& i = infos_.at(name);
    out.push_back({name, i.dtype, i.shape, bytes_.data() + data_start_ + i.offset});
  }
  return out;
}

Status SafeTensorsFile::Write(const std::string& path) const {
  return WriteSafeTensors(path, Entries(), metadata_);
}

uint32_t SafeTensorsFile::header_crc32() const { return Crc32(bytes_.data(), data_start_); }

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// A file descriptor closed when it goes.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

// Opens `path` for reading without blocking (a FIFO without a writer would
// block open() for ever), then refuses anything fstat does not call a
// regular file: a directory, FIFO, socket or device is InvalidArgument
// naming what it is. NotFound if it does not exist. *size is the file's.
StatusOr<Fd> OpenRegular(const std::string& path, uint64_t* size) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFoundError("checkpoint file '" + path + "' does not exist");
    return UnavailableError("cannot open '" + path + "': " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return UnavailableError("cannot stat '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    return InvalidArgumentError("'" + path + "' is not a regular file (it is " + kind +
                                "), so not a safetensors file; refusing to read it");
  }
  // Reads of a regular file never block; clear the flag all the same.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// pread of exactly `n` bytes at `offset`; DataLoss if the file ends first.
Status PreadExactly(int fd, const std::string& path, uint64_t offset, uint64_t n, void* dst) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
    const ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return UnavailableError("cannot read '" + path + "': " + std::strerror(errno));
    }
    if (r == 0) return DataLossError("'" + path + "': truncated (the file ended while reading it)");
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return OkStatus();
}

// The 8-byte length and JSON header of the file `fd` (of `size` bytes).
StatusOr<std::string> ReadHeaderBytes(int fd, const std::string& path, uint64_t size) {
  if (size < 8) {
    return DataLossError("'" + path + "': truncated: " + std::to_string(size) +
                         " bytes, shorter than the 8-byte header length");
  }
  std::string bytes(8, '\0');
  SK_RETURN_IF_ERROR(PreadExactly(fd, path, 0, 8, bytes.data()));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > size - 8) {
    return DataLossError("'" + path + "': header length " + std::to_string(n) + " exceeds the file (" +
                         std::to_string(size) + " bytes): truncated or not safetensors");
  }
  if (n > kMaxHeaderBytes) {
    return DataLossError("'" + path + "': header length " + std::to_string(n) + " is implausible");
  }
  bytes.resize(8 + n);
  SK_RETURN_IF_ERROR(PreadExactly(fd, path, 8, n, bytes.data() + 8));
  return bytes;
}

}  // namespace

StatusOr<uint32_t> SafeTensorsHeaderCrc32(const std::string& path) {
  uint64_t size = 0;
  SK_ASSIGN_OR_RETURN(Fd fd, OpenRegular(path, &size));
  SK_ASSIGN_OR_RETURN(std::string bytes, ReadHeaderBytes(fd.get(), path, size));
  return Crc32(bytes.data(), bytes.size());
}

StatusOr<SafeTensorsFile> SafeTensorsFile::Read(const std::string& path) {
  uint64_t size = 0;
  SK_ASSIGN_OR_RETURN(Fd fd, OpenRegular(path, &size));
  std::vector<char> bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("'" + path + "' is " + std::to_string(size) +
                                  " bytes, more than the host memory can hold");
  }
  SK_RETURN_IF_ERROR(PreadExactly(fd.get(), path, 0, size, bytes.data()));
  return Parse(path, std::move(bytes));
}

namespace safetensors_internal {

// The tensors, metadata and checksums of a header (the JSON text `json`)
// of a file whose data section holds `data_size` bytes; `where` ("'path': ")
// prefixes errors. Every tensor's range lies in the data section, the ranges
// do not overlap, and they end where the data section ends: bytes after the
// last tensor are DataLoss (as the reference implementation's
// MetadataIncompleteBuffer), not silently ignored.
Status ParseHeader(const std::string& where, std::string_view json, uint64_t data_size, ParsedHeader* out) {
  // Our headers nest 3 deep; bound it before the parser and its users recurse.
  SK_RETURN_IF_ERROR(CheckJsonNesting(json, 16, where + "header"));
  nlohmann::json header = nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return DataLossError(where + "header is not a JSON object");
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) return DataLossError(where + "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return DataLossError(where + "metadata value '" + m.key() + "' is not a string");
        std::string v = m->get<std::string>();
        if (m.key().rfind(kCrcPrefix, 0) == 0) {
          char* end = nullptr;
          errno = 0;
          unsigned long long c = std::strtoull(v.c_str(), &end, 10);
          if (errno != 0 || end == v.c_str() || *end != '\0' || c > 0xffffffffull) {
            return DataLossError(where + "malformed checksum for '" + m.key() + "'");
          }
          out->crcs[m.key().substr(std::strlen(kCrcPrefix))] = static_cast<uint32_t>(c);
        } else {
          out->metadata[m.key()] = v;
        }
      }
      continue;
    }
    const nlohmann::json& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
        !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return DataLossError(where + "entry '" + name + "' is not {dtype, shape, data_offsets}");
    }
    SK_ASSIGN_OR_RETURN(DType dtype, ParseSafeTensorsDType(e["dtype"].get<std::string>()));
    std::vector<int64_t> dims;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer()) return DataLossError(where + "shape of '" + name + "' is not integers");
      dims.push_back(d.get<int64_t>());
    }
    StatusOr<Shape> shape = Shape::Make(dims);
    if (!shape.ok()) return DataLossError(where + "shape of '" + name + "': " + std::string(shape.status().message()));
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() && !off[0].is_number_integer()) {
      return DataLossError(where + "data_offsets of '" + name + "' are not integers");
    }
    if (!off[1].is_number_unsigned() && !off[1].is_number_integer()) {
      return DataLossError(where + "data_offsets of '" + name + "' are not integers");
    }
    int64_t b = off[0].get<int64_t>(), en = off[1].get<int64_t>();
    if (b < 0 || en < b || static_cast<uint64_t>(en) > data_size) {
      return DataLossError(where + "data of '" + name + "' [" + std::to_string(b) + ", " +
                           std::to_string(en) + ") lies outside the data section of " +
                           std::to_string(data_size) + " bytes (truncated?)");
    }
    // numel < 2^63 and dtypes are at most 4 bytes: the product fits in 128
    // bits, and one that does not fit in 64 can never match a range in the file.
    const unsigned __int128 wide = static_cast<unsigned __int128>(shape->numel()) * DTypeSize(dtype);
    const uint64_t nbytes = static_cast<uint64_t>(wide);
    if (wide != nbytes) {
      return DataLossError(where + "'" + name + "' has shape " + shape->ToString() + " of " +
                           std::string(DTypeName(dtype)) + ", whose byte count overflows 64 bits");
    }
    if (static_cast<uint64_t>(en - b) != nbytes) {
      return DataLossError(where + "'" + name + "' has " + std::to_string(en - b) + " bytes but shape " +
                           shape->ToString() + " of " + std::string(DTypeName(dtype)) + " needs " +
                           std::to_string(nbytes));
    }
    ranges.emplace_back(static_cast<uint64_t>(b), static_cast<uint64_t>(en));
    out->names.push_back(name);
    out->infos[name] = SafeTensorsFile::Info{dtype, *shape, static_cast<uint64_t>(b), nbytes};
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t last_end = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0 && ranges[i].first < ranges[i - 1].second) return DataLossError(where + "tensor data ranges overlap");
    last_end = std::max(last_end, ranges[i].second);
  }
  if (last_end != data_size) {
    return DataLossError(where + std::to_string(data_size - last_end) + " bytes follow the last tensor (the data " +
                         "section is " + std::to_string(data_size) + " bytes, the tensors end at " +
                         std::to_string(last_end) + "): appended to, or not the file its header describes");
  }
  for (const auto& [name, crc] : out->crcs) {
    if (out->infos.count(name) == 0) return DataLossError(where + "checksum for missing tensor '" + name + "'");
  }
  auto fmt = out->metadata.find(kFormatKey);
  if (fmt != out->metadata.end() && fmt->second == "shardkit" && out->crcs.size() != out->infos.size()) {
    return DataLossError(where + "a shardkit file with tensors lacking checksums");
  }
  // File order: nlohmann's object iterates sorted by key; order by offset instead.
  std::sort(out->names.begin(), out->names.end(), [out](const std::string& a, const std::string& b) {
    return out->infos.at(a).offset < out->infos.at(b).offset;
  });
  return OkStatus();
}

}  // namespace safetensors_internal

StatusOr<SafeTensorsFile> SafeTensorsFile::Parse(const std::string& path, std::vector<char> bytes) {
  SafeTensorsFile f;
  f.path_ = path;
  f.bytes_ = std::move(bytes);
  const std::string where = "'" + path + "': ";
  if (f.bytes_.size() < 8) {
    return DataLossError(where + "truncated: " + std::to_string(f.bytes_.size()) +
                         " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(f.bytes_[i])) << (8 * i);
  if (n > f.bytes_.size() - 8) {
    return DataLossError(where + "header length " + std::to_string(n) + " exceeds the file (" +
                         std::to_string(f.bytes_.size()) + " bytes): truncated or not safetensors");
  }
  f.data_start_ = 8 + static_cast<size_t>(n);
  safetensors_internal::ParsedHeader h;
  SK_RETURN_IF_ERROR(safetensors_internal::ParseHeader(
      where, std::string_view(f.bytes_.data() + 8, static_cast<size_t>(n)), f.bytes_.size() - f.data_start_, &h));
  for (const auto& [name, crc] : h.crcs) {
    const Info& i = h.infos.at(name);
    uint32_t got = Crc32(f.bytes_.data() + f.data_start_ + i.offset, i.nbytes);
    if (got != crc) return DataLossError(where + "checksum mismatch in tensor '" + name + "' (corrupt file)");
  }
  f.names_ = std::move(h.names);
  f.infos_ = std::move(h.infos);
  f.metadata_ = std::move(h.metadata);
  return f;
}

StatusOr<SafeTensorsReader> SafeTensorsReader::Open(const std::string& path) {
  uint64_t size = 0;
  SK_ASSIGN_OR_RETURN(Fd fd, OpenRegular(path, &size));
  SK_ASSIGN_OR_RETURN(std::string header, ReadHeaderBytes(fd.get(), path, size));
  SafeTensorsReader r;
  r.path_ = path;
  r.data_start_ = header.size();
  SK_RETURN_IF_ERROR(safetensors_internal::ParseHeader("'" + path + "': ",
                                                       std::string_view(header).substr(8),
                                                       size - header.size(), &r.header_));
  r.fd_ = std::shared_ptr<int>(new int(fd.release()), [](int* p) {
    ::close(*p);
    delete p;
  });
  return r;
}

StatusOr<SafeTensorsFile::Info> SafeTensorsReader::info(const std::string& name) const {
  auto it = header_.infos.find(name);
  if (it == header_.infos.end()) return NotFoundError("no tensor '" + name + "' in '" + path_ + "'");
  return it->second;
}

Status SafeTensorsReader::ReadRange(const std::string& name, uint64_t begin, uint64_t nbytes, void* dst) const {
  SK_ASSIGN_OR_RETURN(SafeTensorsFile::Info i, info(name));
  if (begin > i.nbytes || nbytes > i.nbytes - begin) {
    return InvalidArgumentError("bytes [" + std::to_string(begin) + ", +" + std::to_string(nbytes) +
                                ") are outside tensor '" + name + "' of " + std::to_string(i.nbytes) +
                                " bytes in '" + path_ + "'");
  }
  if (nbytes > 0 && dst == nullptr) return InvalidArgumentError("SafeTensorsReader::ReadRange: null destination");
  return PreadExactly(*fd_, path_, data_start_ + i.offset + begin, nbytes, dst);
}

Status SafeTensorsReader::Read(const std::string& name, void* dst) const {
  SK_ASSIGN_OR_RETURN(SafeTensorsFile::Info i, info(name));
  SK_RETURN_IF_ERROR(ReadRange(name, 0, i.nbytes, dst));
  auto crc = header_.crcs.find(name);
  if (crc != header_.crcs.end() && Crc32(dst, i.nbytes) != crc->second) {
    return DataLossError("'" + path_ + "': checksum mismatch in tensor '" + name + "' (corrupt file)");
  }
  return OkStatus();
}

StatusOr<SafeTensorsFile::Info> SafeTensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) return NotFoundError("no tensor '" + name + "' in '" + path_ + "'");
  return it->second;
}

StatusOr<const void*> SafeTensorsFile::data(const std::string& name) const {
  SK_ASSIGN_OR_RETURN(Info i, info(name));
  return static_cast<const void*>(bytes_.data() + data_start_ + i.offset);
}

StatusOr<Tensor> SafeTensorsFile::HostView(const std::string& name) const {
  SK_ASSIGN_OR_RETURN(Info i, info(name));
  char* data = const_cast<char*>(bytes_.data()) + data_start_ + i.offset;
  return Tensor::Wrap(data, i.dtype, i.shape);
}

StatusOr<Tensor> SafeTensorsFile::Load(const std::string& name, const ops::OpContext& ctx) const {
  if (ctx.alloc == nullptr) return InvalidArgumentError("SafeTensorsFile::Load: the op context has no allocator");
  SK_ASSIGN_OR_RETURN(Tensor src, HostView(name));
  SK_ASSIGN_OR_RETURN(Tensor t, ctx.alloc->Empty(src.dtype(), src.shape()));
  SK_RETURN_IF_ERROR(ops::Copy(ctx, src, t).WithContext("loading '" + name + "' from '" + path_ + "'"));
  return t;
}

}  // namespace sk
