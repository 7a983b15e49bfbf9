#include "runtime/core/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/child_process.h"

namespace sk {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string d = std::string(t ? t : "/tmp") + "/" + name + "." + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(FileIoTest, WriteFileDurablyConcatenatesPiecesAndLeavesNoTemporary) {
  const std::string dir = TempDir("durable");
  const std::string path = dir + "/f.bin";
  const char a[] = "abc";
  const std::string b = "defg";
  ASSERT_TRUE(WriteFileDurably(path, {{a, 3}, {nullptr, 0}, {b.data(), b.size()}}).ok());
  EXPECT_EQ(Slurp(path), "abcdefg");
  ASSERT_TRUE(WriteFileDurably(path, std::string_view("replaced")).ok());
  EXPECT_EQ(Slurp(path), "replaced");
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "f.bin");
  }
  EXPECT_EQ(files, 1);
}

TEST(FileIoTest, WriteFileDurablyFailureKeepsTheOldFileAndNamesThePath) {
  const std::string dir = TempDir("durable_fail");
  const std::string path = dir + "/f.bin";
  ASSERT_TRUE(WriteFileDurably(path, std::string_view("old")).ok());
  // A directory where the target's parent should be: creating the temporary fails.
  Status s = WriteFileDurably(dir + "/missing/f.bin", std::string_view("x"));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("missing/f.bin"), std::string_view::npos) << s;
  // Renaming over a non-empty directory fails after the temporary was written:
  // the temporary is removed and the directory untouched.
  fs::create_directories(dir + "/busy/x");
  s = WriteFileDurably(dir + "/busy", std::string_view("x"));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_TRUE(fs::is_directory(dir + "/busy"));
  EXPECT_EQ(Slurp(path), "old");
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

// A path naming a FIFO (or a device: /dev/null, /dev/full) is refused, not
// replaced by a regular file through the rename: run as root, writing a
// trace or a converted checkpoint to /dev/full used to swap the device node
// for a regular file.
TEST(FileIoTest, WriteFileDurablyRefusesToReplaceANonRegularFile) {
  const std::string dir = TempDir("file_io_fifo");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Status s = WriteFileDurably(fifo, "x");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("is not a regular file"), std::string::npos) << s;
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // A symlink to a regular file is still replaced, as before.
  const std::string target = dir + "/target", link = dir + "/link";
  ASSERT_TRUE(WriteFileDurably(target, "old").ok());
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_TRUE(WriteFileDurably(link, "new").ok());
}

TEST(FileIoTest, ConcurrentWritersOfOnePathNeverShareATemporary) {
  const std::string dir = TempDir("durable_race");
  const std::string path = dir + "/f.bin";
  std::vector<std::thread> threads;
  std::vector<Status> results(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string text(1000, static_cast<char>('a' + t));
      for (int i = 0; i < 20 && results[t].ok(); ++i) results[t] = WriteFileDurably(path, text);
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s;
  const std::string got = Slurp(path);
  ASSERT_EQ(got.size(), 1000u);
  EXPECT_EQ(got, std::string(1000, got[0]));
}

TEST(FileIoTest, ReadFileBoundedReadsSmallFilesAndRefusesLargeOnes) {
  const std::string dir = TempDir("bounded");
  const std::string path = dir + "/f.txt";
  ASSERT_TRUE(WriteFileDurably(path, std::string_view("0123456789")).ok());
  StatusOr<std::string> r = ReadFileBounded(path, 10, "index");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "0123456789");
  r = ReadFileBounded(path, 9, "index");
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("index '" + path + "'"), std::string_view::npos) << r.status();
  r = ReadFileBounded(dir + "/absent", 10, "index");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

// Only regular files are read: /dev/zero never ends, and a FIFO without a
// writer blocked the open for ever (a unit-table path naming one hung
// sk_plan). In a child with an alarm, so a hang fails instead of blocking.
TEST(FileIoTest, ReadFileBoundedRefusesWhatIsNotARegularFileWithoutBlocking) {
  const std::string dir = TempDir("bounded_fifo");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo, dir}) {
    int rc = testing::InChild([&] {
      ::alarm(20);
      StatusOr<std::string> r = ReadFileBounded(path, 1 << 20, "unit table");
      if (r.ok()) return 1;
      if (r.status().code() != StatusCode::kInvalidArgument) return 2;
      if (std::string(r.status().message()).find("unit table '" + path + "' is not a regular file") ==
          std::string::npos) {
        return 3;
      }
      return 0;
    });
    EXPECT_EQ(rc, 0) << path << ": exit code (128 + signal if it crashed; 142: blocked)";
  }
}

TEST(FileIoTest, IsRegularFileAndIsDirectoryFollowLinksAndNeverOpen) {
  const std::string dir = TempDir("kinds");
  const std::string file = dir + "/file";
  std::ofstream(file) << "x";
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(file.c_str(), (dir + "/to_file").c_str()), 0);
  ASSERT_EQ(::symlink(dir.c_str(), (dir + "/to_dir").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/absent").c_str(), (dir + "/dangling").c_str()), 0);
  EXPECT_TRUE(IsRegularFile(file));
  EXPECT_TRUE(IsRegularFile(dir + "/to_file"));
  EXPECT_FALSE(IsRegularFile(dir));
  EXPECT_FALSE(IsRegularFile(fifo));  // stat only: no open to block on
  EXPECT_FALSE(IsRegularFile(dir + "/dangling"));
  EXPECT_FALSE(IsRegularFile(dir + "/absent"));
  EXPECT_FALSE(IsRegularFile(""));
  EXPECT_TRUE(IsDirectory(dir));
  EXPECT_TRUE(IsDirectory(dir + "/to_dir"));
  EXPECT_FALSE(IsDirectory(file));
  EXPECT_FALSE(IsDirectory(fifo));
  EXPECT_FALSE(IsDirectory(dir + "/absent"));
  EXPECT_FALSE(IsDirectory(""));
}

}  // namespace
}  // namespace sk
