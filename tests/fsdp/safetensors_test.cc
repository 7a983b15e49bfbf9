#include "runtime/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <fstream>
#include <iterator>

#include "runtime/ops/ops.h"

namespace sk {
namespace {

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::vector<char> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Sample {
  std::vector<float> w = {1.f, -2.f, 3.5f, 0.f, 1e-3f, 7.f};
  std::vector<uint16_t> h = {0x3f80, 0xc000, 0x7f80};  // bf16 1, -2, inf
  std::vector<SafeTensorsEntry> entries() const {
    return {{"layer.weight", DType::kF32, Shape{2, 3}, w.data()},
            {"layer.bias_bf16", DType::kBF16, Shape{3}, h.data()},
            {"empty", DType::kF16, Shape{0, 4}, nullptr}};
  }
};

TEST(SafeTensorsTest, RoundTripsTensorsAndMetadata) {
  Sample s;
  std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafeTensors(path, s.entries(), {{"step", "12"}, {"world_size", "4"}}).ok());
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->names(), (std::vector<std::string>{"layer.weight", "layer.bias_bf16", "empty"}));
  EXPECT_EQ(f->metadata().at("step"), "12");
  EXPECT_EQ(f->metadata().at("format"), "shardkit");
  EXPECT_EQ(f->metadata().count("crc32.layer.weight"), 0u);
  auto info = *f->info("layer.weight");
  EXPECT_EQ(info.dtype, DType::kF32);
  EXPECT_EQ(info.shape, (Shape{2, 3}));
  Tensor w = *f->Load("layer.weight", ops::HostContext());
  EXPECT_EQ(0, std::memcmp(w.data(), s.w.data(), 24));
  Tensor h = *f->Load("layer.bias_bf16", ops::HostContext());
  EXPECT_EQ(0, std::memcmp(h.data(), s.h.data(), 6));
  EXPECT_EQ(f->Load("empty", ops::HostContext())->numel(), 0);
  // HostView: the file's own bytes, no copy.
  Tensor v = *f->HostView("layer.bias_bf16");
  EXPECT_EQ(v.dtype(), DType::kBF16);
  EXPECT_EQ(v.shape(), (Shape{3}));
  EXPECT_EQ(0, std::memcmp(v.data(), s.h.data(), 6));
  EXPECT_EQ(f->HostView("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f->Load("missing", ops::HostContext()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f->info("missing").status().code(), StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(SafeTensorsTest, HeaderLayoutIsTheReferenceFormat) {
  Sample s;
  std::string path = TempPath("layout.safetensors");
  ASSERT_TRUE(WriteSafeTensors(path, s.entries()).ok());
  std::vector<char> b = ReadBytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(b[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);  // data section 8-byte aligned
  std::string header(b.begin() + 8, b.begin() + 8 + static_cast<long>(n));
  EXPECT_NE(header.find("\"dtype\":\"F32\""), std::string::npos);
  EXPECT_NE(header.find("\"data_offsets\":[0,24]"), std::string::npos);
  EXPECT_EQ(b.size(), 8 + n + 24 + 6);
  std::remove(path.c_str());
}

TEST(SafeTensorsTest, ReadsFilesFromOtherToolsWithoutChecksums) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<char> b(8, 0);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(n >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  float v[2] = {4.f, 5.f};
  b.insert(b.end(), reinterpret_cast<char*>(v), reinterpret_cast<char*>(v) + 8);
  std::string path = TempPath("foreign.safetensors");
  WriteBytes(path, b);
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(static_cast<const float*>(*f->data("a"))[1], 5.f);
  std::remove(path.c_str());
}

TEST(SafeTensorsTest, EveryTruncationIsDataLossNeverACrash) {
  Sample s;
  std::string path = TempPath("trunc.safetensors");
  ASSERT_TRUE(WriteSafeTensors(path, s.entries()).ok());
  std::vector<char> full = ReadBytes(path);
  std::string cut = TempPath("cut.safetensors");
  for (size_t len = 0; len < full.size(); ++len) {
    WriteBytes(cut, std::vector<char>(full.begin(), full.begin() + static_cast<long>(len)));
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(cut);
    ASSERT_FALSE(f.ok()) << "length " << len;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << len << ": " << f.status();
  }
  std::remove(path.c_str());
  std::remove(cut.c_str());
}

TEST(SafeTensorsTest, FlippedDataBitIsDataLossNamingTheTensor) {
  Sample s;
  std::string path = TempPath("flip.safetensors");
  ASSERT_TRUE(WriteSafeTensors(path, s.entries()).ok());
  std::vector<char> b = ReadBytes(path);
  b[b.size() - 2] ^= 0x10;  // inside layer.bias_bf16
  WriteBytes(path, b);
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("layer.bias_bf16"), std::string::npos) << f.status();
  std::remove(path.c_str());
}

TEST(SafeTensorsTest, MalformedHeadersAreDataLoss) {
  const char* headers[] = {
      "not json",
      "[1,2]",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",     // size mismatch
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",  // overlap
      R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})",    // negative dim
      R"({"a":{"dtype":"F32","shape":[1]}})",                         // no offsets
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,400]}})",  // beyond the file
      R"({"__metadata__":{"k":1}})",
  };
  std::string path = TempPath("bad.safetensors");
  for (const char* h : headers) {
    std::string header(h);
    std::vector<char> b(8, 0);
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
    b.insert(b.end(), header.begin(), header.end());
    b.resize(b.size() + 8, 0);
    WriteBytes(path, b);
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << h << " -> " << f.status();
  }
  std::string unsupported = R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})";
  std::vector<char> b(8, 0);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(uint64_t(unsupported.size()) >> (8 * i));
  b.insert(b.end(), unsupported.begin(), unsupported.end());
  b.resize(b.size() + 8, 0);
  WriteBytes(path, b);
  EXPECT_EQ(SafeTensorsFile::Read(path).status().code(), StatusCode::kInvalidArgument);
  std::remove(path.c_str());
}

// A shape whose byte count wraps around 2^64 (4 * (2^62 + 1) = 4 mod 2^64)
// must not pass for a 4-byte tensor: views of it would read far past the file.
TEST(SafeTensorsTest, ByteCountOverflowingUint64IsDataLoss) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}})";
  std::vector<char> b(8, 0);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + 4, 0);
  std::string path = TempPath("wrap.safetensors");
  WriteBytes(path, b);
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
  ASSERT_FALSE(f.ok()) << "accepted " << f->info("a")->shape.ToString() << " in 4 bytes";
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status();
  EXPECT_NE(f.status().message().find("'a'"), std::string::npos) << f.status();
  std::remove(path.c_str());
}

// A directory (or anything else that is not a regular file) is an error
// naming the path, not a crash: its "size" from seeking is -1 or 2^63 - 1.
TEST(SafeTensorsTest, DirectoryIsInvalidArgumentNotACrash) {
  const std::string dir = TempPath("a_directory.safetensors");
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(dir);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status();
  EXPECT_NE(f.status().message().find(dir), std::string::npos) << f.status();
  EXPECT_FALSE(SafeTensorsHeaderCrc32(dir).ok());
}

// Runs `body` in a child process and returns its exit code; a child still
// running after `seconds` is killed and reported as -1 (a hang), one killed
// by a signal as -2 (a crash), so neither takes the test binary with it.
int InChild(const std::function<int()>& body, int seconds = 20) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (true) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Issue 47 item 3: a FIFO given as a safetensors file is refused at once
// (the read opened it before checking what it opened, and blocked for ever
// waiting for a writer). Run in a child so a hang fails instead of hanging.
TEST(SafeTensorsTest, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = TempPath("a_fifo.safetensors");
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto refused = [&](const Status& s) {
    return s.code() == StatusCode::kInvalidArgument && s.message().find("FIFO") != std::string::npos &&
           s.message().find(fifo) != std::string::npos;
  };
  EXPECT_EQ(InChild([&] { return refused(SafeTensorsFile::Read(fifo).status()) ? 0 : 1; }), 0)
      << "SafeTensorsFile::Read (-1: it hung)";
  EXPECT_EQ(InChild([&] { return refused(SafeTensorsHeaderCrc32(fifo).status()) ? 0 : 1; }), 0)
      << "SafeTensorsHeaderCrc32 (-1: it hung)";
  EXPECT_EQ(InChild([&] { return refused(SafeTensorsReader::Open(fifo).status()) ? 0 : 1; }), 0)
      << "SafeTensorsReader::Open (-1: it hung)";
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(fifo);  // and in this process, now that it cannot hang
  EXPECT_TRUE(refused(f.status())) << f.status();
  std::remove(fifo.c_str());
}

// Issue 47 item 8: bytes after the last tensor are DataLoss (the file is not
// the one its header describes), not silently ignored; so is a data section
// with no tensor at all but bytes in it.
TEST(SafeTensorsTest, BytesAfterTheLastTensorAreDataLoss) {
  Sample s;
  const std::string path = TempPath("appended.safetensors");
  ASSERT_TRUE(WriteSafeTensors(path, s.entries()).ok());
  ASSERT_TRUE(SafeTensorsFile::Read(path).ok());
  std::vector<char> b = ReadBytes(path);
  for (size_t extra : {size_t{1}, size_t{8}, size_t{4096}}) {
    std::vector<char> longer = b;
    longer.resize(b.size() + extra, 'x');
    WriteBytes(path, longer);
    StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
    ASSERT_FALSE(f.ok()) << extra << " trailing bytes accepted";
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status();
    EXPECT_NE(f.status().message().find(std::to_string(extra) + " bytes follow the last tensor"), std::string::npos)
        << f.status();
    EXPECT_EQ(SafeTensorsReader::Open(path).status().code(), StatusCode::kDataLoss);
  }
  // No tensors, one stray byte.
  std::string header = R"({"__metadata__":{"format":"pt"}})";
  std::vector<char> e(8, 0);
  for (int i = 0; i < 8; ++i) e[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  e.insert(e.end(), header.begin(), header.end());
  WriteBytes(path, e);
  EXPECT_TRUE(SafeTensorsFile::Read(path).ok());
  e.push_back(0);
  WriteBytes(path, e);
  EXPECT_EQ(SafeTensorsFile::Read(path).status().code(), StatusCode::kDataLoss);
  std::remove(path.c_str());
}

// The ranged reader sees what Read sees, reads a tensor or any part of it,
// verifies a whole tensor's checksum, and refuses what Read refuses.
TEST(SafeTensorsTest, RangedReaderReadsTensorsAndPartsOfThem) {
  Sample s;
  const std::string path = TempPath("ranged.safetensors");
  ASSERT_TRUE(WriteSafeTensors(path, s.entries(), {{"k", "v"}}).ok());
  StatusOr<SafeTensorsReader> r = SafeTensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::Read(path);
  EXPECT_EQ(r->names(), f->names());
  EXPECT_EQ(r->metadata(), f->metadata());
  std::vector<float> w(6);
  ASSERT_TRUE(r->Read("layer.weight", w.data()).ok());
  EXPECT_EQ(w, s.w);
  float part[2];
  ASSERT_TRUE(r->ReadRange("layer.weight", 8, 8, part).ok());
  EXPECT_EQ(part[0], 3.5f);
  EXPECT_EQ(part[1], 0.f);
  EXPECT_EQ(r->ReadRange("layer.weight", 20, 8, part).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r->Read("nope", part).code(), StatusCode::kNotFound);
  // A flipped bit: Open reads only the header; the tensor's read names it.
  std::vector<char> b = ReadBytes(path);
  b[b.size() - 2] ^= 0x10;  // inside layer.bias_bf16
  WriteBytes(path, b);
  StatusOr<SafeTensorsReader> flipped = SafeTensorsReader::Open(path);
  ASSERT_TRUE(flipped.ok()) << flipped.status();
  uint16_t h[3];
  Status bad = flipped->Read("layer.bias_bf16", h);
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss) << bad;
  EXPECT_NE(bad.message().find("layer.bias_bf16"), std::string::npos) << bad;
  EXPECT_TRUE(flipped->Read("layer.weight", w.data()).ok());
  EXPECT_EQ(SafeTensorsReader::Open(TempPath("missing.safetensors")).status().code(), StatusCode::kNotFound);
  // Every truncation is DataLoss at Open (the header's ranges pass the end).
  for (size_t len = 0; len < b.size(); len += 7) {
    WriteBytes(path, std::vector<char>(b.begin(), b.begin() + static_cast<long>(len)));
    EXPECT_EQ(SafeTensorsReader::Open(path).status().code(), StatusCode::kDataLoss) << len;
  }
  std::remove(path.c_str());
}

// Names and metadata become JSON, which is UTF-8: a name that is not is an
// error naming it, not nlohmann's type_error escaping the library.
TEST(SafeTensorsTest, ANameThatIsNotUtf8IsInvalidArgumentNotAnException) {
  float x = 1.f;
  const std::string bad = std::string("w\xff\xfe");
  std::string path = TempPath("not_utf8.safetensors");
  Status s = WriteSafeTensors(path, {{bad, DType::kF32, Shape{1}, &x}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("is not valid UTF-8"), std::string::npos) << s;
  EXPECT_FALSE(SafeTensorsFile::Read(path).ok());  // nothing was written
  s = WriteSafeTensors(path, {{"w", DType::kF32, Shape{1}, &x}}, {{"note", bad}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("metadata entry 'note'"), std::string::npos) << s;
  StatusOr<SafeTensorsFile> f = SafeTensorsFile::FromEntries({{bad, DType::kF32, Shape{1}, &x}});
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status();
  // Valid multi-byte UTF-8 is a name like any other.
  EXPECT_TRUE(WriteSafeTensors(path, {{"gewicht_\xc3\xa4", DType::kF32, Shape{1}, &x}}).ok());
  std::remove(path.c_str());
}

TEST(SafeTensorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(SafeTensorsFile::Read(TempPath("nope.safetensors")).status().code(), StatusCode::kNotFound);
}

TEST(SafeTensorsTest, BadEntriesAreRejectedBeforeAnythingIsWritten) {
  float x = 1.f;
  std::string path = TempPath("rejected.safetensors");
  EXPECT_EQ(WriteSafeTensors(path, {{"", DType::kF32, Shape{1}, &x}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafeTensors(path, {{"a", DType::kF32, Shape{1}, &x}, {"a", DType::kF32, Shape{1}, &x}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafeTensors(path, {{"__metadata__", DType::kF32, Shape{1}, &x}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafeTensors(path, {{"a", DType::kInvalid, Shape{1}, &x}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafeTensors(path, {{"a", DType::kF32, Shape{1}, nullptr}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafeTensors(path, {}, {{"crc32.a", "1"}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SafeTensorsFile::Read(path).status().code(), StatusCode::kNotFound);
}

TEST(SafeTensorsTest, FailedWriteLeavesThePreviousFileIntact) {
  Sample s;
  std::string dir = TempPath("ro_dir");
  std::string path = dir + "/ckpt.safetensors";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  ASSERT_TRUE(WriteSafeTensors(path, s.entries()).ok());
  std::vector<char> before = ReadBytes(path);
  // A write into a missing directory fails; writing a bad entry fails early.
  EXPECT_EQ(WriteSafeTensors(dir + "/missing/ckpt.safetensors", s.entries()).code(),
            StatusCode::kUnavailable);
  EXPECT_FALSE(WriteSafeTensors(path, {{"a", DType::kF32, Shape{1}, nullptr}}).ok());
  EXPECT_EQ(ReadBytes(path), before);
  EXPECT_TRUE(SafeTensorsFile::Read(path).ok());
}

}  // namespace
}  // namespace sk
