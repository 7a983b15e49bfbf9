// LocalSession: N ranks of one training job as N threads of this process,
// one Trainer per rank over an in-process world (LocalProcessGroup, or any
// groups the caller built, such as a network model around it).
//
// What it owns is what every caller of "N local trainers" used to write
// itself: the trainers are created each on its own thread (Trainer::Create
// runs collectives, so all ranks must be inside it at once), every
// whole-session call runs the ranks concurrently and reports the lowest
// failing rank's error, and the options are validated once before any rank
// waits in a collective. The C ABI's sk_local_session_* functions are this
// class; so can be a benchmark that trains N local ranks.
//
//   SK_ASSIGN_OR_RETURN(auto groups, comm::LocalProcessGroup::Create(4));
//   SK_ASSIGN_OR_RETURN(std::unique_ptr<LocalSession> s,
//                       LocalSession::Create(options, LocalSession::Share(std::move(groups))));
//   SK_ASSIGN_OR_RETURN(std::vector<StepMetrics> m, s->Step());  // m[r]: rank r's
//
// Thread safety: one thread at a time per session (its calls run the rank
// threads themselves and return when every rank has returned).
#ifndef SHARDKIT_RUNTIME_TRAIN_LOCAL_SESSION_H_
#define SHARDKIT_RUNTIME_TRAIN_LOCAL_SESSION_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/train/trainer.h"

namespace sk {

class LocalSession {
 public:
  // Validates `options` (ValidateTrainerOptions, then ValidateFsdpOptions for
  // groups.size() ranks) and creates one Trainer per group, rank r on
  // groups[r] on its own thread. `groups` are the ranks of one world in rank
  // order (groups[r]->rank() == r); the session shares them (they outlive
  // its trainers). InvalidArgument for invalid options or no groups (before
  // any rank starts, so no rank waits in a collective for a peer that failed
  // validation); otherwise the lowest failing rank's Trainer::Create error.
  // When creation fails and they are not null, `per_rank` receives every
  // rank's status (each one the validation error when options are
  // invalid), and `memory_on_error` every rank's allocator statistics at
  // the failure (a failed rank's from Trainer::Create, a created rank's
  // from its trainer; zeros for a rank that never got an allocator), as a
  // harness reporting an out-of-memory configuration needs them.
  static StatusOr<std::unique_ptr<LocalSession>> Create(
      const TrainerOptions& options, std::vector<std::shared_ptr<comm::ProcessGroup>> groups,
      std::vector<Status>* per_rank = nullptr, std::vector<MemoryStats>* memory_on_error = nullptr);

  // The unique_ptrs LocalProcessGroup::Create returns, as the shared
  // pointers Create takes.
  static std::vector<std::shared_ptr<comm::ProcessGroup>> Share(
      std::vector<std::unique_ptr<comm::ProcessGroup>> groups);

  LocalSession(const LocalSession&) = delete;
  LocalSession& operator=(const LocalSession&) = delete;

  int world_size() const { return static_cast<int>(trainers_.size()); }
  // Rank r's trainer and group (0 <= r < world_size(); checked by CHECK).
  Trainer& trainer(int rank);
  const Trainer& trainer(int rank) const;
  comm::ProcessGroup& group(int rank);

  // Runs fn(rank, trainer) for every rank, each on its own thread
  // (comm::RunRankThreads), and returns when all have returned: OK, or the
  // lowest failing rank's error with "rank R" as context. `per_rank` (when
  // not null) receives every rank's status.
  Status OnEveryRank(const std::function<Status(int rank, Trainer& trainer)>& fn,
                     std::vector<Status>* per_rank = nullptr);

  // One training step on every rank. On success the ranks' metrics in rank
  // order, also kept as last_metrics(); on failure last_metrics() is as it
  // was.
  StatusOr<std::vector<StepMetrics>> Step();
  // Trainer::StepOnBatches on every rank, rank r with per_rank[r]
  // (per_rank.size() == world_size(), else InvalidArgument). As Step.
  StatusOr<std::vector<StepMetrics>> StepOnBatches(const std::vector<std::vector<TokenBatch>>& per_rank);
  // The last successful Step()'s metrics, rank order; empty before it.
  const std::vector<StepMetrics>& last_metrics() const { return last_metrics_; }

  // Sets every rank's learning rate (Trainer::set_lr). InvalidArgument, with
  // no rank changed, unless lr is finite and >= 0.
  Status SetLr(float lr);

  // Trainer::Evaluate(batches) on every rank; the mean of the ranks' losses,
  // summed in rank order (the same bits every run).
  StatusOr<float> Evaluate(int batches);

  // Trainer::SaveCheckpoint / LoadCheckpoint / SaveFullStateDict /
  // LoadFullStateDict on every rank (they are collective).
  Status SaveCheckpoint(const std::string& dir);
  Status LoadCheckpoint(const std::string& dir);
  Status SaveFullStateDict(const std::string& path, WeightLayout layout);
  Status LoadFullStateDict(const std::string& path, WeightLayout layout);

  // Steps completed (rank 0's count; every rank's is the same).
  int64_t steps() const { return trainers_[0]->steps(); }

 private:
  LocalSession() = default;

  // Declared before the trainers: destroyed after them.
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
  std::vector<StepMetrics> last_metrics_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_LOCAL_SESSION_H_
