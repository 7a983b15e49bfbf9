#include "runtime/checkpoint/rank_agreement.h"

#include <algorithm>

#include "runtime/core/allocator.h"

namespace sk {

StatusOr<std::unique_ptr<RankAgreement>> RankAgreement::Create(FullyShardedModel& f) {
  const DeviceId id = f.activation_allocator().device();
  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(id));
  std::unique_ptr<RankAgreement> a(new RankAgreement(f));
  SK_ASSIGN_OR_RETURN(a->stream_, device->CreateStream("checkpoint (rank " + std::to_string(f.rank()) + ")"));
  return a;
}

Status RankAgreement::Agree(const Status& mine) {
  Message m;
  if (!mine.ok()) {
    m = {static_cast<int>(mine.code()), "rank " + std::to_string(f_.rank()) + ": " + std::string(mine.message())};
  }
  StatusOr<Message> all = Combine(m, /*first_error=*/true);
  if (!all.ok()) return all.status().WithContext("checkpoint: agreeing across ranks");
  if (!mine.ok()) return mine;
  return Status(static_cast<StatusCode>(all->code), all->text);
}

StatusOr<std::string> RankAgreement::FromRankZero(const std::string& value) {
  SK_ASSIGN_OR_RETURN(Message m, Combine(Message{0, value}, /*first_error=*/false));
  return m.text;
}

StatusOr<RankAgreement::Message> RankAgreement::Combine(Message m, bool first_error) {
  SK_ASSIGN_OR_RETURN(m, GatherAndPick(f_.shard_group(), m, first_error));
  if (f_.replicate_group() != nullptr) {
    SK_ASSIGN_OR_RETURN(m, GatherAndPick(*f_.replicate_group(), m, first_error));
  }
  return m;
}

StatusOr<RankAgreement::Message> RankAgreement::GatherAndPick(comm::ProcessGroup& g, const Message& m,
                                                               bool first_error) {
  Allocator& host = HostAllocator::Default();
  SK_ASSIGN_OR_RETURN(Tensor in, host.Empty(DType::kF32, Shape{kFloats}));
  SK_ASSIGN_OR_RETURN(Tensor out, host.Empty(DType::kF32, Shape{kFloats * g.size()}));
  float* p = in.data_as<float>();
  const size_t len = std::min(m.text.size(), kMaxMessageBytes);
  std::fill(p, p + kFloats, 0.f);
  p[0] = static_cast<float>(m.code);
  p[1] = static_cast<float>(len);
  for (size_t i = 0; i < len; ++i) p[2 + i] = static_cast<unsigned char>(m.text[i]);
  comm::CollectiveOptions co;
  co.timeout = f_.options().timeout;
  SK_ASSIGN_OR_RETURN(auto work, g.all_gather(out, in, *stream_, co));
  SK_RETURN_IF_ERROR(work->wait(f_.options().timeout));
  int pick = 0;
  if (first_error) {
    for (int r = 0; r < g.size(); ++r) {
      if (out.data_as<float>()[r * kFloats] != 0.f) {
        pick = r;
        break;
      }
    }
  }
  const float* q = out.data_as<float>() + pick * kFloats;
  Message result;
  result.code = static_cast<int>(q[0]);
  const size_t n = std::min(static_cast<size_t>(q[1]), kMaxMessageBytes);
  for (size_t i = 0; i < n; ++i) result.text.push_back(static_cast<char>(static_cast<unsigned char>(q[2 + i])));
  return result;
}

}  // namespace sk
