#pragma once

// Command-line parsing shared by shardkit's programs (the paper harnesses,
// the planner, the benchmarks, the train example).
//
// gflags' --help lists every flag linked into the binary: glog's ~40
// logging flags first, this program's own after them. Here --help (and
// -help) lists only the flags defined in the calling program's source file,
// under its usage line; --helpfull still lists everything.
//
//   int main(int argc, char** argv) {
//     sk::cli::ParseFlags("what this program does", __FILE__, &argc, &argv);

#include <gflags/gflags.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sk::cli {

// The part of a source path gflags' --helpmatch compares against the file a
// flag was defined in: "benchmarks/paper/harness_main.cc" -> "/harness_main.".
inline std::string HelpMatch(std::string_view source_file) {
  const size_t slash = source_file.rfind('/');
  std::string_view base = slash == std::string_view::npos ? source_file : source_file.substr(slash + 1);
  const size_t dot = base.rfind('.');
  if (dot != std::string_view::npos) base = base.substr(0, dot + 1);
  return (slash == std::string_view::npos ? "" : "/") + std::string(base);
}

// SetUsageMessage(usage), --help narrowed to `source_file`'s flags, then
// ParseCommandLineFlags (removing the flags it parsed from argv).
inline void ParseFlags(const char* usage, const char* source_file, int* argc, char*** argv) {
  static std::string usage_line;  // gflags keeps the pointer
  usage_line = std::string(usage) + "\n(--help: this program's flags; --helpfull: every flag, glog's too)";
  gflags::SetUsageMessage(usage_line);
  static std::string narrowed;  // argv keeps pointing at it until exit
  narrowed = "--helpmatch=" + HelpMatch(source_file);
  for (int i = 1; i < *argc; ++i) {
    const std::string_view a = (*argv)[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help") (*argv)[i] = narrowed.data();
  }
  gflags::ParseCommandLineFlags(argc, argv, true);
}

// `s` as a decimal count in [lo, hi]: digits only, so "abc", "-1", "1e9",
// " 1" and "4294967297" for an int (which stoull/atoi read as garbage,
// 2^64 - 1, 1 or 1, or truncated) are refused: false, *out untouched.
inline bool ParseCount(std::string_view s, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string_view::npos) return false;
  uint64_t v = 0;
  for (char c : s) v = v * 10 + static_cast<uint64_t>(c - '0');  // 19 digits fit
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

// The items of a comma-separated flag value ("a,b,,c" -> {"a", "b", "c"}):
// empty items are dropped, nothing is trimmed.
inline std::vector<std::string> SplitList(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string_view::npos) end = s.size();
    if (end > start) out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace sk::cli
