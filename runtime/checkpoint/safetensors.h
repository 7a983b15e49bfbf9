// safetensors files: how shardkit writes every checkpoint.
//
// The format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the
// data section) plus an optional "__metadata__" string map, then the raw
// little-endian data. Other tools read our files as they are.
//
// shardkit adds, inside __metadata__: "format": "shardkit" (unless the caller
// names another format, e.g. "pt" for files meant for PyTorch tools), and for each
// tensor "crc32.<name>" (zlib's CRC-32 of its bytes, decimal), so a flipped bit
// is reported as DataLoss naming the tensor. Files without checksums (written
// by other tools) are read without verification.
//
// Writes are atomic and durable (WriteFileDurably in runtime/core/file_io.h:
// temporary file, fsync, rename over `path`, fsync of the directory), so a
// crash leaves either the old file or the new one, never a torn one.
#ifndef SHARDKIT_RUNTIME_CHECKPOINT_SAFETENSORS_H_
#define SHARDKIT_RUNTIME_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/backend.h"

namespace sk {

// One tensor to write: `data` holds shape.numel() elements of `dtype` (host memory).
struct SafeTensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};

// Writes `entries` and `metadata` to `path` atomically. `metadata` may set
// "format" (default "shardkit"). InvalidArgument for an empty or duplicate
// name, a name starting with "__", a dtype other than F32/BF16/F16, a
// "crc32." metadata key, or a null data pointer with elements; Unavailable for I/O failures (the previous file
// at `path`, if any, is left intact).
Status WriteSafeTensors(const std::string& path, const std::vector<SafeTensorsEntry>& entries,
                        const std::map<std::string, std::string>& metadata = {});

// A safetensors file read fully into memory and validated.
class SafeTensorsFile {
 public:
  struct Info {
    DType dtype;
    Shape shape;
    uint64_t offset;  // into the data section
    uint64_t nbytes;
  };

  // NotFound if the file does not exist; DataLoss naming the problem if it is
  // truncated, its header is not valid JSON or not safetensors, offsets are out
  // of range or overlap, sizes disagree with shapes, or a checksum fails;
  // InvalidArgument for a dtype shardkit does not compute in, or for a path
  // that is not a regular file (a directory, FIFO, socket or device: refused
  // after a non-blocking open and fstat, so a FIFO never hangs the read);
  // DataLoss for bytes after the last tensor; ResourceExhausted if the file
  // does not fit in host memory.
  static StatusOr<SafeTensorsFile> Read(const std::string& path);
  // The file WriteSafeTensors(entries, metadata) would write, held in memory
  // (the entries' bytes are copied). Errors as WriteSafeTensors.
  static StatusOr<SafeTensorsFile> FromEntries(const std::vector<SafeTensorsEntry>& entries,
                                               const std::map<std::string, std::string>& metadata = {});
  // Writes these tensors (in file order) and metadata to `path` with
  // WriteSafeTensors (fresh checksums). Errors as WriteSafeTensors.
  Status Write(const std::string& path) const;
  // The tensors in file order, pointing into this object (valid while it lives).
  std::vector<SafeTensorsEntry> Entries() const;

  // User metadata (shardkit's own "crc32.*" keys are excluded).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor names in file order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  // NotFound if absent.
  StatusOr<Info> info(const std::string& name) const;
  // Pointer to the tensor's bytes inside this object (valid while it lives).
  StatusOr<const void*> data(const std::string& name) const;
  // A host tensor viewing the tensor's bytes inside this object (valid while
  // it lives; read only). NotFound if absent.
  StatusOr<Tensor> HostView(const std::string& name) const;
  // A copy of the tensor in new storage from ctx.alloc (on ctx's device),
  // made with the Copy op on ctx (ops::HostContext() for host memory).
  StatusOr<Tensor> Load(const std::string& name, const ops::OpContext& ctx) const;
  // CRC-32 of the header: the 8-byte length and the JSON (which holds every
  // tensor's CRC-32 and the metadata), so it stands for the whole file.
  uint32_t header_crc32() const;

 private:
  // Validates `bytes` (a whole file; `path` names it in errors).
  static StatusOr<SafeTensorsFile> Parse(const std::string& path, std::vector<char> bytes);

  std::string path_;
  std::vector<char> bytes_;
  size_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, Info> infos_;
  std::map<std::string, std::string> metadata_;
};

namespace safetensors_internal {
struct ParsedHeader {
  std::vector<std::string> names;  // file order
  std::map<std::string, SafeTensorsFile::Info> infos;
  std::map<std::string, std::string> metadata;  // without "crc32.*"
  std::map<std::string, uint32_t> crcs;
};
Status ParseHeader(const std::string& where, std::string_view json, uint64_t data_size, ParsedHeader* out);
}  // namespace safetensors_internal

// A safetensors file opened for ranged reads: Open reads and validates the
// header only (as SafeTensorsFile::Read does, with the same errors, except
// that checksums are verified by Read of a whole tensor, not up front), and
// tensors are read with pread one at a time, or in part, so memory holds
// what the caller reads and nothing else (the bounded-memory loads of
// docs/checkpoints.md). Copies share the open file; thread-safe for reads.
class SafeTensorsReader {
 public:
  static StatusOr<SafeTensorsReader> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::string>& names() const { return header_.names; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  bool contains(const std::string& name) const { return header_.infos.count(name) != 0; }
  // NotFound if absent.
  StatusOr<SafeTensorsFile::Info> info(const std::string& name) const;
  // The whole tensor's bytes into `dst` (info(name).nbytes of room), its
  // checksum verified when the file has one (DataLoss naming it).
  Status Read(const std::string& name, void* dst) const;
  // Bytes [begin, begin + nbytes) of the tensor's data into `dst`, not
  // verified. InvalidArgument for a range outside the tensor.
  Status ReadRange(const std::string& name, uint64_t begin, uint64_t nbytes, void* dst) const;

 private:
  std::string path_;
  std::shared_ptr<int> fd_;
  uint64_t data_start_ = 0;
  safetensors_internal::ParsedHeader header_;
};

// SafeTensorsFile::header_crc32() of the file at `path`, reading only its
// header. NotFound, or DataLoss if it is not safetensors.
StatusOr<uint32_t> SafeTensorsHeaderCrc32(const std::string& path);

// zlib's CRC-32 of `n` bytes.
uint32_t Crc32(const void* data, size_t n);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CHECKPOINT_SAFETENSORS_H_
