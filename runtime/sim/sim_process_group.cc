#include "runtime/sim/sim_process_group.h"

#include <atomic>

#include "runtime/sim/sim_device.h"

namespace sk::sim {
namespace {

uint64_t NextCommunicatorId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

StatusOr<std::unique_ptr<SimProcessGroup>> SimProcessGroup::Create(
    const comm::NetworkProfile& profile, int world_size, int rank) {
  SK_RETURN_IF_ERROR(profile.Validate());
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return InvalidArgumentError("sim process group of " + std::to_string(world_size) + " ranks: a simulated world has 1 to " +
                                std::to_string(kMaxWorldSize));
  }
  if (rank < 0 || rank >= world_size) {
    return InvalidArgumentError("sim process group: rank " + std::to_string(rank) +
                                " is outside a world of " + std::to_string(world_size));
  }
  std::vector<int> positions(world_size);
  for (int r = 0; r < world_size; ++r) positions[r] = r;
  SK_ASSIGN_OR_RETURN(comm::GroupPlacement placement,
                      comm::GroupPlacement::Of(positions, profile.gpus_per_node));
  return std::unique_ptr<SimProcessGroup>(new SimProcessGroup(
      std::make_shared<const comm::NetworkProfile>(profile), std::move(positions), placement, rank,
      std::make_shared<LinkSchedule>()));
}

SimProcessGroup::SimProcessGroup(std::shared_ptr<const comm::NetworkProfile> profile,
                                 std::vector<int> positions, comm::GroupPlacement placement,
                                 int rank, std::shared_ptr<LinkSchedule> links)
    : ProcessGroup(rank, static_cast<int>(positions.size())),
      profile_(std::move(profile)),
      positions_(std::move(positions)),
      placement_(placement),
      links_(std::move(links)),
      communicator_id_(NextCommunicatorId()) {}

std::string SimProcessGroup::label() const {
  return "sim (" + profile_->name + ": " + placement_.ToString() + ")";
}

StatusOr<comm::CollectivePlan> SimProcessGroup::Plan(comm::CollectiveKind kind, size_t bytes) const {
  return comm::PlanCollective(*profile_, kind, bytes, placement_);
}

StatusOr<std::unique_ptr<comm::ProcessGroup>> SimProcessGroup::NewGroup(const std::vector<int>& ranks,
                                                                        Duration timeout) {
  SK_RETURN_IF_ERROR(comm::ValidateGroupRanks(ranks, size(), rank()));
  std::vector<int> positions;
  int my_rank = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank()) my_rank = static_cast<int>(i);
    positions.push_back(positions_[ranks[i]]);
  }
  SK_ASSIGN_OR_RETURN(comm::GroupPlacement placement,
                      comm::GroupPlacement::Of(positions, profile_->gpus_per_node));
  return std::unique_ptr<comm::ProcessGroup>(
      new SimProcessGroup(profile_, std::move(positions), placement, my_rank, links_));
}

StatusOr<std::shared_ptr<comm::Work>> SimProcessGroup::Launch(comm::Collective c, Stream& stream) {
  StatusOr<SimDevice*> device = SimDevice::For(stream);
  if (!device.ok()) {
    return Invalid(c.Describe() + " on stream '" + stream.name() + "' (" +
                   stream.device().ToString() + "): a sim group runs on sim streams only");
  }
  SK_ASSIGN_OR_RETURN(comm::CollectivePlan plan, Plan(c.kind, c.nccl_bytes()));
  std::string described = c.Describe();
  const std::string span_name = described + " " + comm::LinkAlgorithmName(plan.algorithm) + "/" +
                                comm::LinkProtocolName(plan.protocol);
  LinkSchedule* links = links_.get();
  std::lock_guard<std::mutex> issue(issue_mu_);
  // The price sees where the span starts, so the booking shares the links
  // with whatever is in flight then; it starts after this communicator's
  // previous collective (file comment).
  SK_ASSIGN_OR_RETURN(SimSpan span,
                      (*device)->EnqueueSpan(
                          stream, span_name,
                          [links, &plan](double start_s) {
                            return links->Book(plan, start_s).end_s - start_s;
                          },
                          {/*launch=*/true, /*category=*/"comm",
                           /*not_before_s=*/links->CommunicatorFreeAt(communicator_id_)}));
  links->SetCommunicatorFreeAt(communicator_id_, span.end_s);
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, (*device)->CreateEvent());
  SK_RETURN_IF_ERROR(event->Record(stream));
  // The Work's description (errors only) is formatted when first asked for:
  // the plan's text was 7% of a GPT-175B plan's instructions.
  return std::make_shared<comm::Work>(
      [described = std::move(described), rank = rank(), size = size(), plan] {
        return described + " on sim rank " + std::to_string(rank) + " of " +
               std::to_string(size) + " [" + plan.ToString() + "]";
      },
      std::move(event));
}

}  // namespace sk::sim
