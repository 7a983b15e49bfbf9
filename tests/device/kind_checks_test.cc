// Code outside the device layer and the backends asks a device's
// capabilities (KindCapabilities, runtime/core/device_kind.h), never its
// kind (issue 48): this test reads every source file of runtime/, capi/ and
// tools/ (their :sources filegroups, in the test's runfiles) and fails on a
// kind test anywhere but the allowed places below, naming file and line.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace sk {
namespace {

// Where a device kind may be tested: the kinds' own definition and
// capability table, the device layer, and the backends that implement a kind
// (the op backends of cpu and cuda, and the simulated device).
constexpr std::string_view kAllowed[] = {
    "runtime/core/device_kind.h", "runtime/core/device_kind.cc", "runtime/device/",
    "runtime/ops/cpu/",           "runtime/ops/cuda/",           "runtime/sim/",
};

bool Allowed(const std::string& path) {
  return std::any_of(std::begin(kAllowed), std::end(kAllowed),
                     [&](std::string_view a) { return path.compare(0, a.size(), a) == 0; });
}

bool IdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The line without its // comment (a comment may name a kind freely).
std::string_view Code(std::string_view line) {
  const size_t c = line.find("//");
  return c == std::string_view::npos ? line : line.substr(0, c);
}

// Whether `code` tests a device kind: calls is_cpu(), is_cuda() or is_sim(),
// or compares with (==, !=) or switches on (case) a DeviceKind constant.
// Naming a kind to choose one (DeviceId::Sim(0), `kind = DeviceKind::kSim`)
// is no test.
bool TestsKind(std::string_view code) {
  for (std::string_view call : {".is_cpu()", ".is_cuda()", ".is_sim()", "->is_cpu()", "->is_cuda()",
                                "->is_sim()"}) {
    if (code.find(call) != std::string_view::npos) return true;
  }
  constexpr std::string_view kConstant = "DeviceKind::k";
  for (size_t at = code.find(kConstant); at != std::string_view::npos;
       at = code.find(kConstant, at + 1)) {
    size_t before = at;
    while (before > 0 && code[before - 1] == ' ') --before;
    const std::string_view left = code.substr(0, before);
    if (left.size() >= 2 && (left.substr(left.size() - 2) == "==" || left.substr(left.size() - 2) == "!=")) {
      return true;
    }
    if (left.size() >= 4 && left.substr(left.size() - 4) == "case" &&
        (left.size() == 4 || !IdentChar(left[left.size() - 5]))) {
      return true;
    }
    size_t after = at + kConstant.size();
    while (after < code.size() && IdentChar(code[after])) ++after;
    while (after < code.size() && code[after] == ' ') ++after;
    const std::string_view right = code.substr(after, 2);
    if (right == "==" || right == "!=") return true;
  }
  return false;
}

TEST(KindChecksTest, RecognisesEachFormOfAKindTest) {
  EXPECT_TRUE(TestsKind("  if (!device().is_cpu()) return x;"));
  EXPECT_TRUE(TestsKind("  if (stream->is_cuda()) {"));
  EXPECT_TRUE(TestsKind("  return id.is_sim();"));
  EXPECT_TRUE(TestsKind("  if (o.kind == DeviceKind::kSim) {"));
  EXPECT_TRUE(TestsKind("  if (o.kind != DeviceKind::kCuda) {"));
  EXPECT_TRUE(TestsKind("  if (DeviceKind::kCpu == kind) {"));
  EXPECT_TRUE(TestsKind("    case DeviceKind::kCpu:"));
  EXPECT_TRUE(TestsKind("  bool cpu = x.kind==DeviceKind::kCpu;"));
}

TEST(KindChecksTest, ChoosingOrNamingAKindIsNoTest) {
  EXPECT_FALSE(TestsKind("  t.device.kind = DeviceKind::kSim;"));
  EXPECT_FALSE(TestsKind("  Device::Get(DeviceId::Cpu(rank));"));
  EXPECT_FALSE(TestsKind("  if (t.device().kind != ctx.device->id().kind) {"));
  EXPECT_FALSE(TestsKind("  if (KindCapabilities(kind).host_memory) {"));
  EXPECT_FALSE(TestsKind("  RegisterOpBackend(DeviceKind::kSim, b);"));
  EXPECT_FALSE(TestsKind("  {DeviceKind::kCpu, \"cpu\"},"));
  EXPECT_FALSE(TestsKind(Code("  x = 1;  // unlike is_cpu(), == DeviceKind::kCpu")));
}

// Every source file below runtime/, capi/ and tools/ in the runfiles.
std::vector<std::string> SourceFiles() {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const char* root : {"runtime", "capi", "tools"}) {
    if (!fs::is_directory(root)) continue;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) files.push_back(e.path().generic_string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(KindChecksTest, NoDeviceKindTestOutsideTheDeviceLayerAndTheBackends) {
  const std::vector<std::string> files = SourceFiles();
  // The sources are here (an empty or partial data list would pass vacuously).
  for (const char* must : {"runtime/core/allocator.cc", "runtime/comm/local_backend.cc",
                           "runtime/train/rank.cc", "runtime/ops/dispatch.h", "runtime/device/device.h",
                           "capi/engine.cc", "tools/train_main.cc"}) {
    EXPECT_TRUE(std::binary_search(files.begin(), files.end(), std::string(must))) << must << " is not in the data";
  }
  std::vector<std::string> found;
  for (const std::string& path : files) {
    if (Allowed(path)) continue;
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (TestsKind(Code(line))) found.push_back(path + ":" + std::to_string(n) + ": " + line);
    }
  }
  std::ostringstream list;
  for (const std::string& f : found) list << "\n  " << f;
  EXPECT_TRUE(found.empty()) << "device-kind tests outside runtime/device and the backends (ask "
                                "KindCapabilities(kind) instead):"
                             << list.str();
}

}  // namespace
}  // namespace sk
