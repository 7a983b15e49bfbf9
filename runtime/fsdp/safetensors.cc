#include "runtime/fsdp/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
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

StatusOr<uint32_t> SafeTensorsHeaderCrc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return NotFoundError("checkpoint file '" + path + "' does not exist");
    return UnavailableError("cannot open '" + path + "'");
  }
  std::string bytes(8, '\0');
  if (!in.read(bytes.data(), 8)) return DataLossError("'" + path + "': shorter than a safetensors header");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > (uint64_t{100} << 20)) return DataLossError("'" + path + "': header length " + std::to_string(n) + " is implausible");
  bytes.resize(8 + n);
  if (n > 0 && !in.read(bytes.data() + 8, static_cast<std::streamsize>(n))) {
    return DataLossError("'" + path + "': truncated header");
  }
  return Crc32(bytes.data(), bytes.size());
}

StatusOr<SafeTensorsFile> SafeTensorsFile::Read(const std::string& path) {
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    struct stat st;
    if (!in) {
      if (::stat(path.c_str(), &st) != 0) return NotFoundError("checkpoint file '" + path + "' does not exist");
      return UnavailableError("cannot open '" + path + "'");
    }
    // A directory opens, and seeking to its end "sizes" it as -1 or 2^63 - 1
    // (so do pipes and devices): only a regular file has a size to read.
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return InvalidArgumentError("'" + path + "' is not a regular file (a directory?), so not a safetensors file");
    }
    std::streamsize size = in.tellg();
    if (size < 0) return UnavailableError("cannot size '" + path + "'");
    in.seekg(0);
    try {
      bytes.resize(static_cast<size_t>(size));
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError("'" + path + "' is " + std::to_string(size) +
                                    " bytes, more than the host memory can hold");
    }
    if (size > 0 && !in.read(bytes.data(), size)) return UnavailableError("cannot read '" + path + "'");
  }
  return Parse(path, std::move(bytes));
}

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
  // Our headers nest 3 deep; bound it before the parser and its users recurse.
  SK_RETURN_IF_ERROR(CheckJsonNesting(std::string_view(f.bytes_.data() + 8, static_cast<size_t>(n)), 16,
                                      "'" + path + "' header"));
  nlohmann::json header = nlohmann::json::parse(f.bytes_.begin() + 8, f.bytes_.begin() + 8 + n,
                                                nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return DataLossError(where + "header is not a JSON object");
  }
  const uint64_t data_size = f.bytes_.size() - f.data_start_;
  std::map<std::string, uint32_t> crcs;
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
          crcs[m.key().substr(std::strlen(kCrcPrefix))] = static_cast<uint32_t>(c);
        } else {
          f.metadata_[m.key()] = v;
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
    f.names_.push_back(name);
    f.infos_[name] = Info{dtype, *shape, static_cast<uint64_t>(b), nbytes};
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return DataLossError(where + "tensor data ranges overlap");
  }
  // File order: nlohmann's object iterates sorted by key; order by offset instead.
  std::sort(f.names_.begin(), f.names_.end(), [&f](const std::string& a, const std::string& b) {
    return f.infos_[a].offset < f.infos_[b].offset;
  });
  for (const auto& [name, crc] : crcs) {
    auto it = f.infos_.find(name);
    if (it == f.infos_.end()) return DataLossError(where + "checksum for missing tensor '" + name + "'");
    uint32_t got = Crc32(f.bytes_.data() + f.data_start_ + it->second.offset, it->second.nbytes);
    if (got != crc) return DataLossError(where + "checksum mismatch in tensor '" + name + "' (corrupt file)");
  }
  if (f.metadata_.count(kFormatKey) && f.metadata_[kFormatKey] == "shardkit" && crcs.size() != f.infos_.size()) {
    return DataLossError(where + "a shardkit file with tensors lacking checksums");
  }
  return f;
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
