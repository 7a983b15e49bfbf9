#include "runtime/comm/network_model.h"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

namespace sk::comm {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct NetworkModelProcessGroup::LinkTurn {
  std::mutex mu;
  std::condition_variable cv;
  bool known = false;     // guarded by mu
  Clock::time_point end;  // guarded by mu

  // The first call sets the end; later ones do nothing.
  void Set(Clock::time_point t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (known) return;
      end = t;
      known = true;
    }
    cv.notify_all();
  }
};

namespace {

// Owned by a collective's start closure: if the closure is dropped without
// running (a failed stream, a failed enqueue), its turn still ends, so the
// group's next collective does not wait for a start that never comes.
struct TurnRelease {
  std::shared_ptr<NetworkModelProcessGroup::LinkTurn> turn;
  ~TurnRelease() {
    if (turn != nullptr) turn->Set(Clock::now());
  }
};

}  // namespace

StatusOr<LinkModel> LinkModel::Parse(std::string_view spec) {
  LinkModel m;
  std::string_view algo = spec.substr(0, spec.find(':'));
  if (algo == "ring") {
    m.algorithm = LinkAlgorithm::kRing;
  } else if (algo == "tree") {
    m.algorithm = LinkAlgorithm::kTree;
  } else {
    return InvalidArgumentError("network model '" + std::string(spec) +
                                "': algorithm must be ring or tree, got '" + std::string(algo) + "'");
  }
  if (spec.find(':') != std::string_view::npos) {
    std::string rest(spec.substr(spec.find(':') + 1));
    std::stringstream ss(rest);
    std::string item;
    bool seen_latency = false, seen_bandwidth = false;
    while (std::getline(ss, item, ',')) {
      size_t eq = item.find('=');
      std::string key = item.substr(0, eq);
      std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
      // A plain decimal number: from_chars takes no sign '+', no leading
      // space and no hex (strtod took all three), and must use every char.
      double v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v,
                                             std::chars_format::general);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size() ||
          !std::isfinite(v)) {
        return InvalidArgumentError("network model '" + std::string(spec) + "': '" + item +
                                    "' is not KEY=NUMBER (a decimal number)");
      }
      bool* seen = key == "latency_us" ? &seen_latency : key == "bandwidth_gbps" ? &seen_bandwidth : nullptr;
      if (seen == nullptr) {
        return InvalidArgumentError("network model '" + std::string(spec) + "': unknown key '" +
                                    key + "' (latency_us, bandwidth_gbps)");
      }
      if (*seen) {
        return InvalidArgumentError("network model '" + std::string(spec) + "': '" + key +
                                    "' is given twice");
      }
      *seen = true;
      (key == "latency_us" ? m.latency_us : m.bandwidth_gbps) = v;
    }
    if (rest.empty() || rest.back() == ',') {
      return InvalidArgumentError("network model '" + std::string(spec) +
                                  "': expected KEY=NUMBER after ':' and after every ','");
    }
  }
  if (m.latency_us < 0 || m.bandwidth_gbps <= 0) {
    return InvalidArgumentError("network model '" + std::string(spec) +
                                "': latency must be >= 0 and bandwidth > 0");
  }
  return m;
}

NetworkProfile LinkModel::profile() const {
  return NetworkProfile::SingleLink(latency_us, bandwidth_gbps);
}

double LinkModel::Seconds(CollectiveKind kind, size_t bytes, int world) const {
  if (world <= 1) return 0.0;
  StatusOr<GroupPlacement> group = GroupPlacement::Packed(world, 1);
  if (!group.ok()) return std::numeric_limits<double>::infinity();
  StatusOr<CollectivePlan> plan =
      PlanCollective(profile(), kind, bytes, *group, algorithm, LinkProtocol::kSimple);
  if (!plan.ok()) return std::numeric_limits<double>::infinity();
  return plan->seconds();
}

std::string LinkModel::ToString() const {
  std::ostringstream os;
  os << (algorithm == LinkAlgorithm::kRing ? "ring" : "tree") << ", alpha=" << latency_us
     << " us, beta=" << bandwidth_gbps << " GB/s";
  return os.str();
}

StatusOr<std::unique_ptr<NetworkModelProcessGroup>> NetworkModelProcessGroup::Wrap(
    std::unique_ptr<ProcessGroup> inner, LinkModel model) {
  if (inner == nullptr) return InvalidArgumentError("network model wraps a null group");
  if (model.latency_us < 0 || !(model.bandwidth_gbps > 0)) {
    return InvalidArgumentError("network model (" + model.ToString() +
                                "): latency must be >= 0 and bandwidth > 0");
  }
  return std::unique_ptr<NetworkModelProcessGroup>(
      new NetworkModelProcessGroup(std::move(inner), model));
}

NetworkModelProcessGroup::NetworkModelProcessGroup(std::unique_ptr<ProcessGroup> inner,
                                                   LinkModel model)
    : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)), model_(model) {}

std::string NetworkModelProcessGroup::label() const {
  return inner_->label() + " + network model (" + model_.ToString() + ")";
}

StatusOr<std::unique_ptr<ProcessGroup>> NetworkModelProcessGroup::NewGroup(
    const std::vector<int>& ranks, Duration timeout) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> sub, inner_->NewGroup(ranks, timeout));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<NetworkModelProcessGroup> wrapped,
                      Wrap(std::move(sub), model_));
  return std::unique_ptr<ProcessGroup>(std::move(wrapped));
}

StatusOr<std::shared_ptr<Work>> NetworkModelProcessGroup::Launch(Collective c, Stream& stream) {
  // Parse takes any finite numbers, so an extreme model ("latency_us=1e300",
  // "bandwidth_gbps=1e-320") can need more time than a steady_clock duration
  // holds (about 292 years): converting it would overflow (undefined; in
  // practice no delay at all). Refused before anything is issued.
  constexpr double kMaxModelledSeconds = 1e9;
  const double seconds = model_.Seconds(c.kind, c.nccl_bytes(), size());
  if (!(seconds >= 0 && seconds <= kMaxModelledSeconds)) {
    return InvalidArgumentError("network model (" + model_.ToString() + "): " + c.Describe() + " would take " +
                                std::to_string(seconds) + " s, more than the " +
                                std::to_string(static_cast<int64_t>(kMaxModelledSeconds)) + " s a model may delay");
  }
  const auto modelled = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(seconds));
  // When the collective starts on the modelled link: once the stream reaches
  // it and the group's previous collective (in issue order) has ended there.
  auto start = std::make_shared<Clock::time_point>();
  auto mine = std::make_shared<LinkTurn>();
  std::shared_ptr<LinkTurn> previous;
  {
    std::lock_guard<std::mutex> lock(mu_);
    previous = std::exchange(last_turn_, mine);
  }
  const std::string what = c.Describe();
  const Duration timeout = c.timeout;
  // Constructed in place: a temporary TurnRelease would end the turn when it
  // is destroyed.
  std::shared_ptr<TurnRelease> release(new TurnRelease{mine});
  SK_RETURN_IF_ERROR(stream.Enqueue([start, mine, previous, modelled, what, timeout, release]() -> Status {
    Clock::time_point begin = Clock::now();
    Status waited = OkStatus();
    if (previous != nullptr) {
      std::unique_lock<std::mutex> lock(previous->mu);
      if (!previous->cv.wait_for(lock, timeout, [&] { return previous->known; })) {
        waited = DeadlineExceededError("network model: " + what +
                                       " waited longer than its timeout for the group's previous collective "
                                       "to start on the modelled link (one communicator runs its collectives "
                                       "in issue order)");
      } else {
        begin = std::max(begin, previous->end);
      }
    }
    *start = begin;
    mine->Set(begin + modelled);
    return waited;
  }));
  StatusOr<std::shared_ptr<Work>> inner = InternalError("unreachable");
  switch (c.kind) {
    case CollectiveKind::kAllGather:
      inner = inner_->all_gather_coalesced(c.outputs, c.inputs, stream, {c.timeout});
      break;
    case CollectiveKind::kReduceScatter:
      inner = inner_->reduce_scatter_coalesced(
          c.outputs, c.inputs, stream, {c.op, c.pre_scale, c.post_scale, c.timeout});
      break;
    case CollectiveKind::kAllReduce:
      inner = inner_->all_reduce_coalesced(c.outputs, stream,
                                           {c.op, c.pre_scale, c.post_scale, c.timeout});
      break;
    case CollectiveKind::kBroadcast:
      inner = inner_->broadcast_coalesced(c.outputs, stream, {c.root, c.timeout});
      break;
    case CollectiveKind::kBarrier:
      inner = inner_->barrier(stream, {c.timeout});
      break;
  }
  SK_RETURN_IF_ERROR(inner.status());
  std::shared_ptr<Work> inner_work = std::move(inner).value();
  // The stream is busy until the modelled link would be done, as a real one is.
  return EnqueueOnStream(inner_work->description() + " [" + model_.ToString() + "]", stream,
                         [start, modelled, inner_work]() -> Status {
                           std::this_thread::sleep_until(*start + modelled);
                           return inner_work->status();
                         });
}

}  // namespace sk::comm
