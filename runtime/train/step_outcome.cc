#include "runtime/train/step_outcome.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "runtime/core/allocator.h"

namespace sk {

StepChecks::Same StepChecks::F32(std::string field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return Same{std::move(field), bits, true};
}

namespace {

// One rank's word on a step, as raw bytes in an all-gather (the collective
// only copies them).
struct StepRecord {
  static constexpr int kMaxGroups = 4;
  static constexpr size_t kMaxText = 1024;
  int32_t code = 0;
  int32_t primary = 0;  // the failure is this rank's own, not a peer's consequence
  uint64_t next_seq[kMaxGroups] = {};
  uint64_t same[StepChecks::kMaxSame] = {};
  double finite[StepChecks::kMaxFinite] = {};
  uint32_t text_len = 0;
  char text[kMaxText] = {};
};
constexpr int64_t kRecordFloats = (sizeof(StepRecord) + 3) / 4;

std::string ShowF32(uint64_t bits) {
  const uint32_t b = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b, sizeof f);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", f);
  return buf;
}

}  // namespace

StatusOr<std::unique_ptr<StepAgreement>> StepAgreement::Create(comm::ProcessGroup& world, Device& device,
                                                               Duration timeout) {
  if (world.size() < 2 || !world.publishes_failures()) return std::unique_ptr<StepAgreement>();
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  SK_ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> group, world.NewGroup(all, timeout));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream("step agreement"));
  return std::unique_ptr<StepAgreement>(new StepAgreement(std::move(group), std::move(stream), timeout));
}

Status NoteUpdateApplied(const Status& s, int64_t step) {
  if (s.ok()) return s;
  return Status(s.code(), std::string(s.message()) + "; the update of step " + std::to_string(step) +
                              " was applied on every rank and the step counts (parameters and optimizer "
                              "state hold it); the unsharded parameters are gathered again at the next forward");
}

Status StepAgreement::Agree(const Status& mine, int64_t step, const std::vector<comm::ProcessGroup*>& groups,
                            DataParallelModel& model, const StepChecks& checks) {
  return Decide(mine, step, groups, model, checks, /*after_update=*/false);
}

Status StepAgreement::AgreeAfterUpdate(const Status& mine, int64_t step,
                                       const std::vector<comm::ProcessGroup*>& groups, DataParallelModel& model) {
  return NoteUpdateApplied(Decide(mine, step, groups, model, StepChecks{}, /*after_update=*/true), step);
}

Status StepAgreement::Decide(const Status& mine, int64_t step, const std::vector<comm::ProcessGroup*>& groups,
                             DataParallelModel& model, const StepChecks& checks, bool after_update) {
  const int me = group_->rank();
  const std::string where = "step " + std::to_string(step) + " on rank " + std::to_string(me);
  // A failed step is abandoned: before the update nothing changed; after it,
  // the update stays and what the failed work made is dropped.
  auto abandon = [&]() {
    model.set_gradient_sync(true);
    if (after_update) {
      model.AbandonAfterUpdate();
    } else {
      model.AbandonStep();
    }
  };
  if (checks.same.size() > StepChecks::kMaxSame || checks.finite.size() > StepChecks::kMaxFinite ||
      groups.size() > static_cast<size_t>(StepRecord::kMaxGroups)) {
    return InternalError("StepAgreement::Agree: more checks or groups than its record holds");
  }
  // A peer that died or hung broke a group (gloo): it would not answer the
  // agreement either, and the group cannot resume. Report this rank's error
  // (which names the peer) at once, as backends without agreement do.
  for (comm::ProcessGroup* g : groups) {
    if (mine.ok() || g->usable()) continue;
    abandon();
    return mine.WithContext(where);
  }
  StepRecord out;
  if (!mine.ok()) {
    // Publish the failure before draining: peers waiting in this step's
    // collectives fail now with it instead of at their timeout.
    const Status culprit(mine.code(), "rank " + std::to_string(me) + " failed step " + std::to_string(step) +
                                          (after_update ? " after the update: " : ": ") +
                                          std::string(mine.message()));
    bool primary = true;
    for (comm::ProcessGroup* g : groups) {
      if (!g->FailPeers(culprit).ok()) primary = false;
    }
    abandon();
    out.code = static_cast<int32_t>(mine.code());
    out.primary = primary ? 1 : 0;
    const std::string text(culprit.message());
    out.text_len = static_cast<uint32_t>(std::min(text.size(), StepRecord::kMaxText));
    std::memcpy(out.text, text.data(), out.text_len);
  }
  for (size_t i = 0; i < groups.size(); ++i) out.next_seq[i] = groups[i]->next_sequence();
  for (size_t i = 0; i < checks.same.size(); ++i) out.same[i] = checks.same[i].bits;
  for (size_t i = 0; i < checks.finite.size(); ++i) out.finite[i] = checks.finite[i].value;

  const int n = group_->size();
  SK_ASSIGN_OR_RETURN(Tensor in, HostAllocator::Default().Empty(DType::kF32, Shape{kRecordFloats}));
  SK_ASSIGN_OR_RETURN(Tensor all, HostAllocator::Default().Empty(DType::kF32, Shape{kRecordFloats * n}));
  std::memset(in.data(), 0, in.nbytes());
  std::memcpy(in.data(), &out, sizeof out);
  comm::CollectiveOptions co;
  // Within the collectives' own timeout: a rank that failed publishes its
  // failure first, so its peers' collectives fail at once and they arrive
  // here promptly (it waited three timeouts, and survivors of a hung peer
  // reported long after their own timeout).
  co.timeout = timeout_;
  co.label = "step outcome";
  Status agreed = [&]() -> Status {
    SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w, group_->all_gather(all, in, *stream_, co));
    return w->wait(co.timeout);
  }();
  if (!agreed.ok()) {
    (void)stream_->Synchronize(timeout_);
    stream_->ClearError();
    if (mine.ok()) abandon();
    return agreed.WithContext(where + ": agreeing on the step's outcome" +
                              (mine.ok() ? std::string() : " after: " + std::string(mine.message())));
  }
  std::vector<StepRecord> records(n);
  for (int r = 0; r < n; ++r) {
    std::memcpy(&records[r], static_cast<const char*>(all.data()) + r * kRecordFloats * 4, sizeof(StepRecord));
  }
  int pick = -1;
  for (int r = 0; r < n && pick < 0; ++r) {
    if (records[r].code != 0 && records[r].primary) pick = r;
  }
  for (int r = 0; r < n && pick < 0; ++r) {
    if (records[r].code != 0) pick = r;
  }
  if (pick >= 0) {
    if (mine.ok()) abandon();
    for (size_t i = 0; i < groups.size(); ++i) {
      uint64_t next = 0;
      for (const StepRecord& o : records) next = std::max(next, o.next_seq[i]);
      groups[i]->ResumeAt(next);
    }
    const StepRecord& o = records[pick];
    return Status(static_cast<StatusCode>(o.code),
                  std::string(o.text, std::min<size_t>(o.text_len, StepRecord::kMaxText)));
  }
  // Every rank stepped: the values that must agree, then those that must be
  // finite. Every rank reads the same records, so every rank decides alike.
  for (size_t i = 0; i < checks.same.size(); ++i) {
    std::vector<int> differ;
    for (int r = 1; r < n; ++r) {
      if (records[r].same[i] != records[0].same[i]) differ.push_back(r);
    }
    if (differ.empty()) continue;
    model.AbandonStep();
    const StepChecks::Same& c = checks.same[i];
    std::string msg = "step " + std::to_string(step) + " refused on every rank: the ranks disagree on " + c.field;
    if (c.is_f32) {
      msg += " (" + ShowF32(records[0].same[i]) + " on rank 0";
      for (int r : differ) msg += ", " + ShowF32(records[r].same[i]) + " on rank " + std::to_string(r);
      msg += ")";
    } else {
      msg += ": " + comm::NameRanks(differ) + " differ from rank 0";
    }
    return InvalidArgumentError(msg + "; every rank must use the same value. Nothing was updated.");
  }
  for (size_t i = 0; i < checks.finite.size(); ++i) {
    std::vector<int> bad;
    for (int r = 0; r < n; ++r) {
      if (!std::isfinite(records[r].finite[i])) bad.push_back(r);
    }
    if (bad.empty()) continue;
    model.AbandonStep();
    char value[32];
    std::snprintf(value, sizeof(value), "%g", records[bad[0]].finite[i]);
    return AbortedError("step " + std::to_string(step) + " skipped on every rank: " + checks.finite[i].field +
                        " is " + value + " on " + comm::NameRanks(bad) +
                        "; the update was not applied (parameters and optimizer state are unchanged)");
  }
  return OkStatus();
}

StatusOr<std::vector<uint64_t>> StepAgreement::GatherU64(uint64_t value, const std::string& label) {
  const int n = group_->size();
  SK_ASSIGN_OR_RETURN(Tensor in, HostAllocator::Default().Empty(DType::kF32, Shape{2}));
  SK_ASSIGN_OR_RETURN(Tensor all, HostAllocator::Default().Empty(DType::kF32, Shape{2 * n}));
  std::memcpy(in.data(), &value, sizeof value);
  comm::CollectiveOptions co;
  co.timeout = timeout_;
  co.label = label;
  Status s = [&]() -> Status {
    SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w, group_->all_gather(all, in, *stream_, co));
    return w->wait(co.timeout);
  }();
  if (!s.ok()) {
    (void)stream_->Synchronize(timeout_);
    stream_->ClearError();
    return s.WithContext(label);
  }
  std::vector<uint64_t> values(n);
  std::memcpy(values.data(), all.data(), n * sizeof(uint64_t));
  return values;
}

}  // namespace sk
