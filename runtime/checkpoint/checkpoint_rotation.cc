// Rotating checkpoints (checkpoint.h): `root`/step_<step, 12 digits>, each a
// sharded checkpoint, the newest `keep` kept; resume from the newest.
//
// Why a half-written checkpoint is never picked: SaveShardedCheckpoint
// writes into "<dir>.tmp" and renames it into place after its index.json
// (written last) is complete, so a directory named exactly step_N exists only
// whole, and ".tmp" and ".old" names never match. Pruning renames a
// checkpoint to "<dir>.deleting" before removing it, so a crash halfway
// through a removal leaves no step_N directory with files missing. Only world
// rank 0 lists, prunes and picks; the others get its choice (RankAgreement),
// so every rank loads the same checkpoint even when their views of a shared
// filesystem lag.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/rank_agreement.h"

namespace sk {

namespace {

namespace fs = std::filesystem;

constexpr const char kPrefix[] = "step_";
constexpr int kStepDigits = 12;

// The step of a directory named step_<digits>, or -1.
int64_t StepOf(const std::string& name) {
  const size_t p = sizeof(kPrefix) - 1;
  if (name.size() <= p || name.compare(0, p, kPrefix) != 0 || name.size() - p > 18) return -1;
  int64_t step = 0;
  for (size_t i = p; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

std::string RotatingCheckpointDir(const std::string& root, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "%s%0*lld", kPrefix, kStepDigits, static_cast<long long>(step));
  return (fs::path(root) / name).string();
}

StatusOr<std::vector<std::pair<int64_t, std::string>>> ListRotatingCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  if (!fs::is_directory(root, ec)) {
    return InvalidArgumentError("checkpoint root '" + root + "' exists and is not a directory");
  }
  fs::directory_iterator it(root, ec);
  if (ec) return UnavailableError("cannot list checkpoint root '" + root + "': " + ec.message());
  for (const fs::directory_entry& e : it) {
    const int64_t step = StepOf(e.path().filename().string());
    if (step < 0 || !e.is_directory(ec)) continue;
    // Complete: its index (written last, before the rename) reads.
    if (!ReadCheckpointIndex(e.path().string()).ok()) continue;
    out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

Status PrepareCheckpointRoot(const std::string& root, FullyShardedModel& f) {
  if (root.empty()) return InvalidArgumentError("empty checkpoint root");
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(f));
  Status made;
  if (f.rank() == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (!fs::is_directory(root, ec)) {
      made = fs::exists(root, ec) ? InvalidArgumentError("checkpoint root '" + root + "' exists and is not a directory")
                                  : UnavailableError("cannot create checkpoint root '" + root + "'");
    }
  }
  return sync->Agree(made);
}

Status PruneRotatingCheckpoints(const std::string& root, int keep) {
  if (keep < 1) return InvalidArgumentError("keep must be at least 1, not " + std::to_string(keep));
  // Removals a killed process left halfway (renamed, not yet removed).
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string suffix = ".deleting";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        StepOf(name.substr(0, name.size() - suffix.size())) >= 0) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
  SK_ASSIGN_OR_RETURN(auto all, ListRotatingCheckpoints(root));
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
    const std::string doomed = all[i].second + ".deleting";
    fs::remove_all(doomed, ec);
    if (::rename(all[i].second.c_str(), doomed.c_str()) != 0) {
      return UnavailableError("renaming the old checkpoint '" + all[i].second + "' for removal failed: " +
                              std::strerror(errno));
    }
    fs::remove_all(doomed, ec);
    if (ec) return UnavailableError("removing the old checkpoint '" + doomed + "' failed: " + ec.message());
  }
  return OkStatus();
}

StatusOr<std::string> PickLatestCheckpoint(const std::string& root, FullyShardedModel& f) {
  if (root.empty()) return InvalidArgumentError("empty checkpoint root");
  SK_ASSIGN_OR_RETURN(auto sync, RankAgreement::Create(f));
  // The step travels, not the path (agreement messages are cut at 1 KiB).
  std::string newest;
  Status listed;
  if (f.rank() == 0) {
    StatusOr<std::vector<std::pair<int64_t, std::string>>> all = ListRotatingCheckpoints(root);
    listed = all.status();
    if (all.ok() && !all->empty()) newest = std::to_string(all->front().first);
  }
  SK_RETURN_IF_ERROR(sync->Agree(listed).WithContext("looking for the newest checkpoint under '" + root + "'"));
  SK_ASSIGN_OR_RETURN(newest, sync->FromRankZero(newest));
  if (newest.empty()) return std::string();
  return RotatingCheckpointDir(root, std::stoll(newest));
}

}  // namespace sk
