#include "runtime/train/local_session.h"

#include <cmath>
#include <utility>

#include "runtime/comm/local_backend.h"
#include "runtime/fsdp/fsdp.h"

namespace sk {

StatusOr<std::unique_ptr<LocalSession>> LocalSession::Create(
    const TrainerOptions& options, std::vector<std::shared_ptr<comm::ProcessGroup>> groups,
    std::vector<Status>* per_rank, std::vector<MemoryStats>* memory_on_error) {
  if (groups.empty()) return InvalidArgumentError("a local session needs at least one rank's group");
  const int world_size = static_cast<int>(groups.size());
  // Validation is the same on every rank, so a bad option fails all ranks
  // before any of them waits in a collective.
  Status valid = ValidateTrainerOptions(options);
  if (valid.ok()) valid = ValidateFsdpOptions(options.fsdp, world_size);
  if (!valid.ok()) {
    if (per_rank != nullptr) per_rank->assign(static_cast<size_t>(world_size), valid);
    if (memory_on_error != nullptr) memory_on_error->assign(static_cast<size_t>(world_size), MemoryStats{});
    return valid;
  }
  std::unique_ptr<LocalSession> s(new LocalSession());
  s->groups_ = std::move(groups);
  s->trainers_.resize(static_cast<size_t>(world_size));
  std::vector<MemoryStats> memory(static_cast<size_t>(world_size));
  Status created = comm::RunRankThreads(
      world_size,
      [&](int r) -> Status {
        SK_ASSIGN_OR_RETURN(s->trainers_[r], Trainer::Create(options, s->groups_[r].get(),
                                                             memory_on_error != nullptr ? &memory[r] : nullptr));
        return OkStatus();
      },
      per_rank);
  if (!created.ok()) {
    if (memory_on_error != nullptr) {
      for (int r = 0; r < world_size; ++r) {
        if (s->trainers_[r] != nullptr) memory[r] = s->trainers_[r]->allocator().stats();
      }
      *memory_on_error = std::move(memory);
    }
    return created;
  }
  return s;
}

std::vector<std::shared_ptr<comm::ProcessGroup>> LocalSession::Share(
    std::vector<std::unique_ptr<comm::ProcessGroup>> groups) {
  std::vector<std::shared_ptr<comm::ProcessGroup>> shared;
  shared.reserve(groups.size());
  for (auto& g : groups) shared.push_back(std::move(g));
  return shared;
}

Trainer& LocalSession::trainer(int rank) {
  CHECK(rank >= 0 && rank < world_size()) << "rank " << rank << " of " << world_size();
  return *trainers_[rank];
}

const Trainer& LocalSession::trainer(int rank) const {
  CHECK(rank >= 0 && rank < world_size()) << "rank " << rank << " of " << world_size();
  return *trainers_[rank];
}

comm::ProcessGroup& LocalSession::group(int rank) {
  CHECK(rank >= 0 && rank < world_size()) << "rank " << rank << " of " << world_size();
  return *groups_[rank];
}

Status LocalSession::OnEveryRank(const std::function<Status(int rank, Trainer& trainer)>& fn,
                                 std::vector<Status>* per_rank) {
  return comm::RunRankThreads(
      world_size(), [&](int r) -> Status { return fn(r, *trainers_[r]); }, per_rank);
}

StatusOr<std::vector<StepMetrics>> LocalSession::Step() {
  std::vector<StepMetrics> metrics(trainers_.size());
  SK_RETURN_IF_ERROR(OnEveryRank([&](int r, Trainer& t) -> Status {
    SK_ASSIGN_OR_RETURN(metrics[r], t.Step());
    return OkStatus();
  }));
  last_metrics_ = metrics;
  return metrics;
}

StatusOr<std::vector<StepMetrics>> LocalSession::StepOnBatches(
    const std::vector<std::vector<TokenBatch>>& per_rank) {
  if (per_rank.size() != trainers_.size()) {
    return InvalidArgumentError("StepOnBatches needs one list of micro-batches per rank (" +
                                std::to_string(trainers_.size()) + "), got " + std::to_string(per_rank.size()));
  }
  std::vector<StepMetrics> metrics(trainers_.size());
  SK_RETURN_IF_ERROR(OnEveryRank([&](int r, Trainer& t) -> Status {
    SK_ASSIGN_OR_RETURN(metrics[r], t.StepOnBatches(per_rank[r]));
    return OkStatus();
  }));
  last_metrics_ = metrics;
  return metrics;
}

Status LocalSession::SetLr(float lr) {
  // Checked once, so that no rank changes when the rate is bad.
  if (!std::isfinite(lr) || lr < 0) {
    return InvalidArgumentError("learning rate must be finite and >= 0, not " + std::to_string(lr));
  }
  for (auto& t : trainers_) SK_RETURN_IF_ERROR(t->set_lr(lr));
  return OkStatus();
}

StatusOr<float> LocalSession::Evaluate(int batches) {
  std::vector<float> losses(trainers_.size());
  SK_RETURN_IF_ERROR(OnEveryRank([&](int r, Trainer& t) -> Status {
    SK_ASSIGN_OR_RETURN(losses[r], t.Evaluate(batches));
    return OkStatus();
  }));
  double sum = 0;
  for (float l : losses) sum += l;  // rank order: the same bits every run
  return static_cast<float>(sum / world_size());
}

Status LocalSession::SaveCheckpoint(const std::string& dir) {
  return OnEveryRank([&](int, Trainer& t) { return t.SaveCheckpoint(dir); });
}

Status LocalSession::LoadCheckpoint(const std::string& dir) {
  return OnEveryRank([&](int, Trainer& t) { return t.LoadCheckpoint(dir); });
}

Status LocalSession::SaveFullStateDict(const std::string& path, WeightLayout layout) {
  return OnEveryRank([&](int, Trainer& t) { return t.SaveFullStateDict(path, layout); });
}

Status LocalSession::LoadFullStateDict(const std::string& path, WeightLayout layout) {
  return OnEveryRank([&](int, Trainer& t) { return t.LoadFullStateDict(path, layout); });
}

}  // namespace sk
