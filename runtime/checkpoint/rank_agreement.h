// Collective agreement over all ranks of a FullyShardedModel, used by every
// checkpoint operation so that an error on one rank (a missing file, a full
// disk) is returned on every rank instead of leaving the others waiting.
//
// An all-gather inside the shard group, then one across replicas, so every
// rank learns the first error anywhere (or rank 0's value) without a world
// group handle. Messages travel as f32 [code, length, bytes...]: every byte is
// exact in f32. Messages longer than kMaxMessageBytes are cut.
//
// Thread safety: one call at a time, on the rank's model thread; every rank of
// the model must make the same sequence of calls (they are collectives).
#ifndef SHARDKIT_RUNTIME_CHECKPOINT_RANK_AGREEMENT_H_
#define SHARDKIT_RUNTIME_CHECKPOINT_RANK_AGREEMENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"
#include "runtime/fsdp/fsdp.h"

namespace sk {

class RankAgreement {
 public:
  // Longest error message carried between ranks; longer ones are cut.
  static constexpr size_t kMaxMessageBytes = 1024;

  // An agreement over `f`'s ranks, with its own stream on `f`'s device.
  // `f` must outlive it.
  static StatusOr<std::unique_ptr<RankAgreement>> Create(FullyShardedModel& f);

  // OK on every rank if `mine` is OK on every rank; otherwise every rank gets
  // an error: its own, or the first failing rank's ("rank N: ..."). An error
  // of the collectives themselves is returned with context.
  Status Agree(const Status& mine);

  // World rank 0's `value`, on every rank.
  StatusOr<std::string> FromRankZero(const std::string& value);

 private:
  struct Message {
    int code = 0;
    std::string text;
  };
  static constexpr int64_t kFloats = 2 + kMaxMessageBytes;

  explicit RankAgreement(FullyShardedModel& f) : f_(f) {}

  StatusOr<Message> Combine(Message m, bool first_error);
  StatusOr<Message> GatherAndPick(comm::ProcessGroup& g, const Message& m, bool first_error);

  FullyShardedModel& f_;
  std::unique_ptr<Stream> stream_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CHECKPOINT_RANK_AGREEMENT_H_
