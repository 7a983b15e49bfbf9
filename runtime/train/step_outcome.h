// StepAgreement: the ranks agree on a step's outcome before anything changes,
// the Trainer's and the FsdpEngine's one mechanism.
//
// Every rank contributes one fixed-size record to one all-gather on a group of
// its own (so it never falls out of step when a failed step issued different
// collectives on different ranks):
//   - its own status for the step. A failing rank first publishes its error
//     to the step's groups (ProcessGroup::FailPeers), so peers waiting in
//     the step's collectives fail at once with it, and abandons its step.
//     When any rank failed, every rank abandons the step, returns the error
//     of the rank whose failure came first ("rank 1 failed step 2: ..."), and
//     every group resumes at the largest sequence number any rank reached
//     (ProcessGroup::ResumeAt), so no rank reports a desync afterwards;
//   - values that must be equal on every rank (the learning rate): ranks
//     that differ all fail with InvalidArgument naming the field, rank 0's
//     value and the ranks that differ, and the step is abandoned;
//   - values that must be finite on every rank (the loss, the gradient
//     norm): a NaN or infinity anywhere fails the step on every rank with
//     Aborted naming the field and the ranks, the update skipped (the step
//     abandoned: gradients zeroed, parameters and optimizer state unchanged).
// The record is about 1.3 KiB; the all-gather is the only cost on a step that
// succeeds.
//
// Only on backends that publish failures (local, gloo, NCCL with its call
// check) and worlds of more than one rank (Create returns null elsewhere):
// without FailPeers a healthy rank would learn of a peer's failure only at
// its own collective's timeout.
//
// Thread safety: one thread per StepAgreement (its rank's).
#ifndef SHARDKIT_RUNTIME_TRAIN_STEP_OUTCOME_H_
#define SHARDKIT_RUNTIME_TRAIN_STEP_OUTCOME_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"
#include "runtime/parallel/data_parallel.h"

namespace sk {

// What a rank's step is checked against besides its status.
struct StepChecks {
  // A value that must be equal on every rank. `bits` is compared exactly; an
  // f32 value (is_f32) is shown as a number in errors, anything else (a
  // hash) only as "differs".
  struct Same {
    std::string field;  // "the learning rate"
    uint64_t bits = 0;
    bool is_f32 = false;
  };
  // A value that must be finite on every rank ("the loss").
  struct Finite {
    std::string field;
    double value = 0;
  };
  std::vector<Same> same;      // at most kMaxSame
  std::vector<Finite> finite;  // at most kMaxFinite
  static constexpr size_t kMaxSame = 4;
  static constexpr size_t kMaxFinite = 4;

  static Same F32(std::string field, float value);
};

// `s` (a failure after step `step`'s update, on one rank) with what it
// left: the update applied, the step counted, the full parameters gathered
// again at the next forward.
Status NoteUpdateApplied(const Status& s, int64_t step);

class StepAgreement {
 public:
  // A group of every rank of `world` for the agreement. Null (no agreement)
  // on one rank and on backends that do not publish failures. Collective
  // over `world` (NewGroup). `timeout`: how long a rank waits for the others
  // to reach the agreement.
  static StatusOr<std::unique_ptr<StepAgreement>> Create(comm::ProcessGroup& world, Device& device,
                                                         Duration timeout);

  // The outcome of step `step` (1-based, for messages) over the step's
  // `groups` (the same groups in the same order on every rank; at most 4),
  // with `mine` this rank's status for it. OK when every rank succeeded and
  // the checks hold; otherwise the step is abandoned on every rank
  // (model.AbandonStep) and every rank returns the same error (see above).
  // When a group is broken for good (gloo, after a dead or hung peer) and
  // this rank failed, it reports its own error at once, as without
  // agreement. Collective over the agreement's group; waits at most the
  // timeout given to Create for the other ranks.
  Status Agree(const Status& mine, int64_t step, const std::vector<comm::ProcessGroup*>& groups,
               DataParallelModel& model, const StepChecks& checks = {});

  // The outcome of the work that follows step `step`'s update (FSDP's
  // regather of the parameters NO_SHARD and SHARD_OPTIM keep unsharded:
  // DataParallelModel::UpdateEndsWithFallibleWork), with `mine` this rank's
  // status for it. The update was applied on every rank before (the ranks
  // agreed on it with Agree), so it is kept: when any rank failed, every
  // rank drops what the failed work made (model.AbandonAfterUpdate: the
  // next forward regathers), every group resumes at a common sequence
  // number, and every rank returns the error of the rank that failed first
  // ("rank 1 failed step 2 after the update: ...; the update was applied on
  // every rank ..."). The caller counts the step either way. Collective
  // over the agreement's group, as Agree.
  Status AgreeAfterUpdate(const Status& mine, int64_t step, const std::vector<comm::ProcessGroup*>& groups,
                          DataParallelModel& model);

  // Every rank's `value`, in rank order (one all-gather on the agreement's
  // group). For checks outside a step (the engine's WriteParam compares the
  // hashes of the values each rank passes). Collective.
  StatusOr<std::vector<uint64_t>> GatherU64(uint64_t value, const std::string& label);

  comm::ProcessGroup& group() { return *group_; }

 private:
  Status Decide(const Status& mine, int64_t step, const std::vector<comm::ProcessGroup*>& groups,
                DataParallelModel& model, const StepChecks& checks, bool after_update);

  StepAgreement(std::unique_ptr<comm::ProcessGroup> group, std::unique_ptr<Stream> stream, Duration timeout)
      : group_(std::move(group)), stream_(std::move(stream)), timeout_(timeout) {}

  std::unique_ptr<comm::ProcessGroup> group_;
  std::unique_ptr<Stream> stream_;
  Duration timeout_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_STEP_OUTCOME_H_
