// flight_merge: reads the flight-recorder dumps of every rank (flight_recorder.h)
// and says who is behind and where.
//
//   flight_merge DIR_OR_FILE...
//
// For each group found: which ranks dumped (a rank without a dump is dead,
// hung, or was not given SK_FLIGHT_RECORDER_DIR), the last collective
// every dumped rank completed, then the first one that did not complete
// everywhere with each rank's state in it (running for how long, failed with
// what, or never issued), the first call that differs between ranks (a
// desync), and a verdict naming the ranks that are behind. Exit code 0 when
// the dumps were read (whatever they say), 2 on usage or read errors.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/file_io.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Entry {
  int64_t seq = 0;
  std::string call, label, state, error;
  int64_t enqueued_us = 0, started_us = 0, ended_us = 0;
};

struct RankDump {
  int rank = 0;
  int64_t dumped_at_us = 0;
  std::string reason;
  std::map<int64_t, Entry> entries;  // by seq
  int64_t last_issued() const { return entries.empty() ? -1 : entries.rbegin()->first; }
  int64_t last_completed() const {
    int64_t c = -1;
    for (const auto& [seq, e] : entries) {
      if (e.state == "completed") c = std::max(c, seq);
    }
    return c;
  }
};

struct Group {
  std::string backend;
  int size = 0;
  std::map<int, RankDump> ranks;
};

constexpr int64_t kMaxDumpBytes = 64 << 20;
// Largest group a dump may claim: Report lists every rank of it.
constexpr int64_t kMaxGroupSize = 1 << 20;
constexpr int kDumpVersion = 1;

// Field `key` of object `o` when it has the JSON type the format gives it
// (missing fields keep `*out`); else a message naming the field.
bool GetString(const json& o, const char* key, std::string* out, std::string* why) {
  auto it = o.find(key);
  if (it == o.end()) return true;
  if (!it->is_string()) {
    *why = std::string("field '") + key + "' is " + it->type_name() + ", not a string";
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

// As GetString, for integers in [lo, hi].
bool GetInt(const json& o, const char* key, int64_t lo, int64_t hi, int64_t* out, std::string* why) {
  auto it = o.find(key);
  if (it == o.end()) return true;
  // Positive numbers parse as unsigned: compare them as such (no wrap).
  const bool fits = it->is_number_unsigned()
                        ? it->get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                              (lo <= 0 || it->get<uint64_t>() >= static_cast<uint64_t>(lo))
                        : it->is_number_integer() && it->get<int64_t>() >= lo && it->get<int64_t>() <= hi;
  if (!fits) {
    *why = std::string("field '") + key + "' is " + it->dump() + ", not an integer";
    if (lo != INT64_MIN || hi != INT64_MAX) *why += " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return false;
  }
  *out = it->get<int64_t>();
  return true;
}

// The dump at `path`, or false with a message naming what is wrong with it.
bool ParseDump(const std::string& path, std::string* group, std::string* backend, int* size, RankDump* d,
               std::string* why) {
  sk::StatusOr<std::string> text = sk::ReadFileBounded(path, kMaxDumpBytes, "flight recorder dump");
  if (!text.ok()) {
    *why = text.status().ToString();
    return false;
  }
  const json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *why = "'" + path + "' is not a flight recorder dump (not a JSON object)";
    return false;
  }
  std::string format;
  int64_t version = kDumpVersion, rank = -1, sz = -1;
  std::string field;
  const bool fields_ok = GetString(j, "format", &format, &field) && GetInt(j, "version", 0, INT64_MAX, &version, &field) &&
                         GetString(j, "group", group, &field) && GetString(j, "backend", backend, &field) &&
                         GetInt(j, "size", 1, kMaxGroupSize, &sz, &field) &&
                         GetInt(j, "rank", 0, kMaxGroupSize - 1, &rank, &field) &&
                         GetInt(j, "dumped_at_us", INT64_MIN, INT64_MAX, &d->dumped_at_us, &field) &&
                         GetString(j, "reason", &d->reason, &field);
  if (format != "shardkit.flight_recorder") {
    *why = "'" + path + "' is not a flight recorder dump (no \"format\": \"shardkit.flight_recorder\")";
    return false;
  }
  if (!fields_ok) {
    *why = "flight recorder dump '" + path + "': " + field;
    return false;
  }
  if (version != kDumpVersion) {
    *why = "flight recorder dump '" + path + "' has version " + std::to_string(version) + "; this flight_merge reads version " +
           std::to_string(kDumpVersion);
    return false;
  }
  if (!j.contains("group") || !j.contains("size") || !j.contains("rank") || !j.contains("entries") ||
      !j["entries"].is_array()) {
    *why = "flight recorder dump '" + path + "' lacks one of group, size, rank and an entries array";
    return false;
  }
  if (rank >= sz) {
    *why = "flight recorder dump '" + path + "': rank " + std::to_string(rank) + " is not in [0, size " +
           std::to_string(sz) + ")";
    return false;
  }
  *size = static_cast<int>(sz);
  d->rank = static_cast<int>(rank);
  const json& entries = j["entries"];
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& je = entries[i];
    Entry e;
    e.seq = -1;
    const bool ok = je.is_object() && GetInt(je, "seq", 0, INT64_MAX - 1, &e.seq, &field) &&
                    GetString(je, "call", &e.call, &field) && GetString(je, "label", &e.label, &field) &&
                    GetString(je, "state", &e.state, &field) && GetString(je, "error", &e.error, &field) &&
                    GetInt(je, "enqueued_us", INT64_MIN, INT64_MAX, &e.enqueued_us, &field) &&
                    GetInt(je, "started_us", INT64_MIN, INT64_MAX, &e.started_us, &field) &&
                    GetInt(je, "ended_us", INT64_MIN, INT64_MAX, &e.ended_us, &field);
    if (!ok || e.seq < 0) {
      *why = "flight recorder dump '" + path + "': entry " + std::to_string(i) + ": " +
             (!je.is_object() ? std::string("not an object") : ok ? std::string("no 'seq'") : field);
      return false;
    }
    if (!d->entries.emplace(e.seq, e).second) {
      *why = "flight recorder dump '" + path + "': entry " + std::to_string(i) + " repeats seq " + std::to_string(e.seq);
      return false;
    }
  }
  return true;
}

bool ReadDump(const std::string& path, std::map<std::string, Group>* groups) {
  std::string name, backend, why;
  int size = 0;
  RankDump d;
  if (!ParseDump(path, &name, &backend, &size, &d, &why)) {
    std::fprintf(stderr, "flight_merge: %s\n", why.c_str());
    return false;
  }
  auto it = groups->find(name);
  if (it != groups->end()) {
    const Group& g = it->second;
    if (g.size != size || g.backend != backend) {
      std::fprintf(stderr,
                   "flight_merge: '%s' (rank %d) says group '%s' is %s with %d ranks, but an earlier dump says %s "
                   "with %d ranks: dumps of different runs?\n",
                   path.c_str(), d.rank, name.c_str(), backend.c_str(), size, g.backend.c_str(), g.size);
      return false;
    }
    if (g.ranks.count(d.rank)) {
      std::fprintf(stderr, "flight_merge: '%s': a second dump of rank %d of group '%s'\n", path.c_str(), d.rank,
                   name.c_str());
      return false;
    }
  }
  Group& g = (*groups)[name];
  g.backend = backend;
  g.size = size;
  g.ranks[d.rank] = std::move(d);
  return true;
}

// "all_gather #4 (f32, 1 -> 2)" without the "#4": calls compared across ranks.
std::string CallShape(const std::string& call) {
  size_t hash = call.find(" #");
  if (hash == std::string::npos) return call;
  size_t end = call.find(' ', hash + 2);
  return call.substr(0, hash) + (end == std::string::npos ? "" : call.substr(end));
}

std::string Ranks(const std::vector<int>& r) {
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? "," : "") + std::to_string(r[i]);
  return s;
}

// The group ranks an error names as not arriving: "rank 2 did not arrive",
// "ranks 2,3 did not arrive", "rank 1 (world rank 2) did not arrive".
std::set<int> NamedAsNotArriving(const std::string& error) {
  // A hand scan rather than std::regex: libstdc++'s regex compiler trips
  // GCC 12's -Wmaybe-uninitialized at -O1 (the sanitizer builds).
  std::set<int> out;
  const std::string kTail = " did not arrive";
  for (size_t at = error.find(kTail); at != std::string::npos; at = error.find(kTail, at + 1)) {
    size_t end = at;
    // Skip an optional " (world rank(s) ...)" just before the tail.
    if (end > 0 && error[end - 1] == ')') {
      size_t open = error.rfind(" (world rank", end);
      if (open == std::string::npos) continue;
      end = open;
    }
    size_t begin = end;
    while (begin > 0 && (std::isdigit(static_cast<unsigned char>(error[begin - 1])) || error[begin - 1] == ',')) --begin;
    if (begin == end || !std::isdigit(static_cast<unsigned char>(error[begin]))) continue;
    // The list must follow "rank " or "ranks " at a word boundary.
    size_t word = error.rfind("rank", begin);
    if (word == std::string::npos) continue;
    std::string between = error.substr(word + 4, begin - word - 4);
    if (between != " " && between != "s ") continue;
    if (word > 0 && std::isalnum(static_cast<unsigned char>(error[word - 1]))) continue;
    std::stringstream list(error.substr(begin, end - begin));
    for (std::string r; std::getline(list, r, ',');) {
      if (!r.empty() && r.size() < 10) out.insert(std::stoi(r));
    }
  }
  return out;
}

std::string Describe(const Entry& e) {
  std::string s = e.call;
  if (!e.label.empty()) s += " [" + e.label + "]";
  return s;
}

void Report(const std::string& name, const Group& g) {
  std::printf("group '%s' (%s, %d ranks): dumps from ranks ", name.c_str(), g.backend.c_str(), g.size);
  std::vector<int> dumped, missing;
  for (int r = 0; r < g.size; ++r) (g.ranks.count(r) ? dumped : missing).push_back(r);
  std::printf("%s", Ranks(dumped).c_str());
  if (!missing.empty()) std::printf("; no dump from ranks %s (dead, hung, or not dumping)", Ranks(missing).c_str());
  std::printf("\n");

  int64_t common = INT64_MAX, newest = -1;
  for (const auto& [r, d] : g.ranks) {
    common = std::min(common, d.last_completed());
    newest = std::max(newest, d.last_issued());
  }
  if (g.ranks.empty()) return;
  if (common >= 0) std::printf("  every dumped rank completed collectives through #%lld\n", (long long)common);
  const int64_t open = common + 1;
  std::set<int> behind(missing.begin(), missing.end());
  if (open <= newest) {
    std::printf("  first collective not completed everywhere: #%lld\n", (long long)open);
    // A rank that was stopped and then resumed did issue the collective, only
    // too late: the others' errors name it as not arriving, and it issued
    // the call after a peer's had already failed. Either makes it behind
    // (the verdict said "no rank is behind" once it had resumed).
    int64_t first_failure_us = INT64_MAX;
    for (const auto& [r, d] : g.ranks) {
      auto it = d.entries.find(open);
      if (it != d.entries.end() && it->second.state == "failed" && it->second.ended_us > 0) {
        first_failure_us = std::min(first_failure_us, it->second.ended_us);
      }
    }
    std::set<int> late;
    for (const auto& [r, d] : g.ranks) {
      auto it = d.entries.find(open);
      if (it != d.entries.end() && it->second.enqueued_us > first_failure_us) {
        std::printf("    rank %d issued it %.1f s after a peer's had failed\n", r,
                    (it->second.enqueued_us - first_failure_us) / 1e6);
        behind.insert(r);
        late.insert(r);
      }
    }
    // A late rank's own error names the ranks that had given up before it
    // came (healthy ones): only the others' errors say who did not arrive.
    for (const auto& [r, d] : g.ranks) {
      auto it = d.entries.find(open);
      if (it == d.entries.end() || late.count(r) != 0) continue;
      for (int named : NamedAsNotArriving(it->second.error)) {
        if (named >= 0 && named < g.size && named != r) behind.insert(named);
      }
    }
    for (const auto& [r, d] : g.ranks) {
      auto it = d.entries.find(open);
      if (it == d.entries.end()) {
        std::printf("    rank %d: never issued it (last issued #%lld)\n", r, (long long)d.last_issued());
        behind.insert(r);
        continue;
      }
      const Entry& e = it->second;
      std::printf("    rank %d: %s, %s", r, Describe(e).c_str(), e.state.c_str());
      const int64_t from = e.started_us ? e.started_us : e.enqueued_us;
      const int64_t to = e.ended_us ? e.ended_us : d.dumped_at_us;
      if (from > 0 && to >= from) std::printf(" for %.1f s", (to - from) / 1e6);
      if (!e.error.empty()) std::printf(": %s", e.error.c_str());
      std::printf("\n");
    }
  } else {
    std::printf("  every dumped rank completed everything it issued\n");
  }
  // The first sequence number whose calls differ between ranks.
  std::map<int64_t, std::map<std::string, std::vector<int>>> calls;
  for (const auto& [r, d] : g.ranks) {
    for (const auto& [seq, e] : d.entries) calls[seq][CallShape(e.call)].push_back(r);
  }
  for (const auto& [seq, by_call] : calls) {
    if (by_call.size() < 2) continue;
    std::printf("  desync at #%lld:", (long long)seq);
    for (const auto& [call, ranks] : by_call) std::printf(" ranks %s called %s;", Ranks(ranks).c_str(), call.c_str());
    std::printf("\n");
    break;
  }
  if (behind.empty()) {
    std::printf("  verdict: no rank is behind\n");
  } else {
    std::printf("  verdict: behind: ranks %s\n", Ranks(std::vector<int>(behind.begin(), behind.end())).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: flight_merge DIR_OR_FILE...\n");
    return 2;
  }
  std::map<std::string, Group> groups;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(argv[i], ec)) {
        if (e.path().extension() == ".json") files.push_back(e.path().string());
      }
      std::sort(files.begin(), files.end());
      for (const std::string& f : files) ok = ReadDump(f, &groups) && ok;
    } else {
      ok = ReadDump(argv[i], &groups) && ok;
    }
  }
  if (groups.empty()) {
    std::fprintf(stderr, "flight_merge: no dumps found\n");
    return 2;
  }
  for (const auto& [name, g] : groups) Report(name, g);
  return ok ? 0 : 2;
}
