#include "runtime/sim/topology.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace sk::sim {

namespace {

using nlohmann::json;
using comm::LinkAlgorithm;
using comm::LinkProtocol;

// Reads one section, remembering which keys were used so that the rest can be
// reported as unknown.
class Section {
 public:
  Section(const json& j, std::string path, comm::NetworkProfile* profile)
      : j_(j), path_(std::move(path)), profile_(profile) {}

  Status CheckObject() const {
    if (!j_.is_object()) return InvalidArgumentError(path_ + ": expected an object");
    return OkStatus();
  }
  bool Has(const std::string& key) const { return j_.contains(key); }

  StatusOr<Section> Child(const std::string& key) {
    used_.insert(key);
    if (!j_.contains(key)) return InvalidArgumentError(path_ + "." + key + ": missing");
    Section child(j_.at(key), path_ + "." + key, profile_);
    SK_RETURN_IF_ERROR(child.CheckObject());
    return child;
  }

  // {"value": x, "source": "..."}; the source is kept under the path below
  // "network".
  StatusOr<double> Number(const std::string& key) {
    used_.insert(key);
    const std::string path = path_ + "." + key;
    if (!j_.contains(key)) return InvalidArgumentError(path + ": missing");
    const json& n = j_.at(key);
    if (!n.is_object() || !n.contains("value") || !n.contains("source")) {
      return InvalidArgumentError(path + ": expected {\"value\": number, \"source\": \"...\"}");
    }
    for (const auto& [k, v] : n.items()) {
      if (k != "value" && k != "source") return InvalidArgumentError(path + ": unknown key '" + k + "'");
    }
    if (!n.at("value").is_number()) return InvalidArgumentError(path + ".value: not a number");
    if (!n.at("source").is_string() || n.at("source").get<std::string>().empty()) {
      return InvalidArgumentError(path + ".source: must be a non-empty string saying where the number comes from");
    }
    const double v = n.at("value").get<double>();
    if (!std::isfinite(v)) return InvalidArgumentError(path + ".value: not finite");
    profile_->sources[path.substr(path.find('.') + 1)] = n.at("source").get<std::string>();
    return v;
  }

  StatusOr<int> Integer(const std::string& key) {
    SK_ASSIGN_OR_RETURN(double v, Number(key));
    if (v != std::floor(v) || std::fabs(v) > 1e9) {
      return InvalidArgumentError(path_ + "." + key + ": expected an integer, got " + std::to_string(v));
    }
    return static_cast<int>(v);
  }

  void Allow(const std::string& key) { used_.insert(key); }

  Status NoUnknownKeys() const {
    for (const auto& [k, v] : j_.items()) {
      if (!used_.count(k)) return InvalidArgumentError(path_ + ": unknown key '" + k + "'");
    }
    return OkStatus();
  }

  const json& raw() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string path_;
  comm::NetworkProfile* profile_;
  std::set<std::string> used_;
};

Status ParsePair(Section& algorithms, const char* algo_name, LinkAlgorithm algo,
                 comm::NetworkProfile* profile) {
  SK_ASSIGN_OR_RETURN(Section algo_section, algorithms.Child(algo_name));
  for (LinkProtocol proto : {LinkProtocol::kSimple, LinkProtocol::kLL, LinkProtocol::kLL128}) {
    const char* proto_name = comm::LinkProtocolName(proto);
    comm::AlgorithmCost& cost = profile->cost(algo, proto);
    SK_ASSIGN_OR_RETURN(Section pair, algo_section.Child(proto_name));
    if (pair.Has("enabled")) {
      pair.Allow("enabled");
      pair.Allow("source");
      const json& enabled = pair.raw().at("enabled");
      if (!enabled.is_boolean() || enabled.get<bool>()) {
        return InvalidArgumentError(pair.path() +
                                    ".enabled: only false is meaningful (a pair is enabled by its numbers)");
      }
      if (!pair.raw().contains("source") || !pair.raw().at("source").is_string()) {
        return InvalidArgumentError(pair.path() + ": a disabled pair says why in \"source\"");
      }
      profile->sources[pair.path().substr(pair.path().find('.') + 1) + ".enabled"] =
          pair.raw().at("source").get<std::string>();
      cost.enabled = false;
    } else {
      cost.enabled = true;
      SK_ASSIGN_OR_RETURN(cost.base_latency_us, pair.Number("base_latency_us"));
      SK_ASSIGN_OR_RETURN(cost.intra_step_latency_us, pair.Number("intra_step_latency_us"));
      SK_ASSIGN_OR_RETURN(cost.inter_step_latency_us, pair.Number("inter_step_latency_us"));
      SK_ASSIGN_OR_RETURN(cost.bandwidth_fraction, pair.Number("bandwidth_fraction"));
    }
    SK_RETURN_IF_ERROR(pair.NoUnknownKeys());
  }
  return algo_section.NoUnknownKeys();
}

StatusOr<comm::CollectiveKind> KindByName(const std::string& path, const json& name) {
  if (name.is_string()) {
    for (comm::CollectiveKind k :
         {comm::CollectiveKind::kAllReduce, comm::CollectiveKind::kAllGather,
          comm::CollectiveKind::kReduceScatter, comm::CollectiveKind::kBroadcast}) {
      if (name.get<std::string>() == comm::CollectiveName(k)) return k;
    }
  }
  return InvalidArgumentError(path + ": expected one of \"all_reduce\", \"all_gather\", "
                              "\"reduce_scatter\", \"broadcast\", got " + name.dump());
}

// "measured_bus_bandwidth": [{"collectives": [...], "ranks": N, "nodes": N,
// "points": [[bytes, GB/s], ...], "source": "..."}, ...].
Status ParseMeasured(const json& list, comm::NetworkProfile* profile) {
  const std::string base = "network.measured_bus_bandwidth";
  if (!list.is_array()) return InvalidArgumentError(base + ": expected an array of curves");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = base + "[" + std::to_string(i) + "]";
    const json& c = list[i];
    if (!c.is_object()) return InvalidArgumentError(path + ": expected an object");
    for (const auto& [k, v] : c.items()) {
      if (k != "collectives" && k != "ranks" && k != "nodes" && k != "points" && k != "source") {
        return InvalidArgumentError(path + ": unknown key '" + k + "'");
      }
    }
    for (const char* k : {"collectives", "ranks", "nodes", "points", "source"}) {
      if (!c.contains(k)) return InvalidArgumentError(path + "." + k + ": missing");
    }
    comm::MeasuredBusBandwidth m;
    if (!c.at("collectives").is_array() || c.at("collectives").empty()) {
      return InvalidArgumentError(path + ".collectives: expected a non-empty array of names");
    }
    for (const json& name : c.at("collectives")) {
      SK_ASSIGN_OR_RETURN(comm::CollectiveKind k, KindByName(path + ".collectives", name));
      m.kinds.push_back(k);
    }
    for (const char* k : {"ranks", "nodes"}) {
      const json& v = c.at(k);
      if (!v.is_number_integer()) return InvalidArgumentError(path + "." + k + ": expected an integer");
    }
    m.ranks = c.at("ranks").get<int>();
    m.nodes = c.at("nodes").get<int>();
    if (!c.at("source").is_string() || c.at("source").get<std::string>().empty()) {
      return InvalidArgumentError(path + ".source: must be a non-empty string saying where the curve comes from");
    }
    m.source = c.at("source").get<std::string>();
    const json& points = c.at("points");
    if (!points.is_array()) return InvalidArgumentError(path + ".points: expected [[bytes, GB/s], ...]");
    for (const json& pt : points) {
      if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number()) {
        return InvalidArgumentError(path + ".points: expected [[bytes, GB/s], ...], got " + pt.dump());
      }
      m.bytes.push_back(pt[0].get<double>());
      m.busbw_gbps.push_back(pt[1].get<double>());
    }
    profile->sources["measured_bus_bandwidth[" + std::to_string(i) + "]"] = m.source;
    profile->measured.push_back(std::move(m));
  }
  return OkStatus();
}

}  // namespace

StatusOr<comm::NetworkProfile> ParseNetworkProfile(const nlohmann::json& network) {
  comm::NetworkProfile p;
  if (network.is_null()) return InvalidArgumentError("network: the profile has no network section");
  Section root(network, "network", &p);
  SK_RETURN_IF_ERROR(root.CheckObject());
  SK_ASSIGN_OR_RETURN(p.gpus_per_node, root.Integer("gpus_per_node"));
  SK_ASSIGN_OR_RETURN(Section nvlink, root.Child("nvlink"));
  SK_ASSIGN_OR_RETURN(p.nvlink_links_per_gpu, nvlink.Integer("links_per_gpu"));
  SK_ASSIGN_OR_RETURN(p.nvlink_link_gbps, nvlink.Number("link_bandwidth_gbps"));
  SK_RETURN_IF_ERROR(nvlink.NoUnknownKeys());
  SK_ASSIGN_OR_RETURN(Section nic, root.Child("nic"));
  SK_ASSIGN_OR_RETURN(p.nics_per_node, nic.Integer("per_node"));
  SK_ASSIGN_OR_RETURN(p.nic_gbps, nic.Number("bandwidth_gbps"));
  SK_ASSIGN_OR_RETURN(p.nic_efficiency, nic.Number("efficiency"));
  SK_RETURN_IF_ERROR(nic.NoUnknownKeys());
  SK_ASSIGN_OR_RETURN(Section algorithms, root.Child("algorithms"));
  SK_RETURN_IF_ERROR(ParsePair(algorithms, "ring", LinkAlgorithm::kRing, &p));
  SK_RETURN_IF_ERROR(ParsePair(algorithms, "tree", LinkAlgorithm::kTree, &p));
  SK_RETURN_IF_ERROR(algorithms.NoUnknownKeys());
  SK_ASSIGN_OR_RETURN(p.compute_slowdown_while_communicating,
                      root.Number("compute_slowdown_while_communicating"));
  if (root.Has("measured_bus_bandwidth")) {
    root.Allow("measured_bus_bandwidth");
    SK_RETURN_IF_ERROR(ParseMeasured(network.at("measured_bus_bandwidth"), &p));
  }
  root.Allow("note");
  SK_RETURN_IF_ERROR(root.NoUnknownKeys());
  if (Status s = p.Validate(); !s.ok()) {
    return InvalidArgumentError("network: " + std::string(s.message()));
  }
  return p;
}

// ---------------------------------------------------------------------------
// LinkSchedule

double LinkSchedule::At(const Usage& u, double t) {
  auto it = u.upper_bound(t);
  if (it == u.begin()) return 0.0;
  return std::prev(it)->second;
}

void LinkSchedule::Split(Usage& u, double t) {
  if (u.count(t)) return;
  u[t] = At(u, t);
}

LinkSchedule::Booking LinkSchedule::Book(const comm::CollectivePlan& plan, double start_s) {
  std::lock_guard<std::mutex> lock(mu_);
  Booking b;
  b.start_s = start_s;
  b.alone_s = plan.seconds();
  if (plan.network_use_per_byte_s > 0) network_bus_bytes_ += plan.bus_bytes;
  const double uses[kLinks] = {plan.nvlink_use_per_byte_s, plan.network_use_per_byte_s};
  double t = start_s + plan.latency_s;
  double remaining = plan.bus_bytes;
  const double alone_rate = plan.bus_bytes_per_s;
  if (!(remaining > 0) || !(alone_rate > 0) || (uses[0] <= 0 && uses[1] <= 0)) {
    b.end_s = start_s + b.alone_s;
  } else {
    // Walk the segments where earlier bookings' usage is constant, taking
    // what they leave; collect this booking's own usage to add afterwards.
    struct Segment {
      double from, to, rate;
    };
    std::vector<Segment> mine;
    // A rate below this is a link that is (numerically) full.
    const double negligible = alone_rate * 1e-9;
    while (remaining > 0) {
      double next = std::numeric_limits<double>::infinity();
      double rate = alone_rate;
      for (int l = 0; l < kLinks; ++l) {
        if (uses[l] <= 0) continue;
        auto it = usage_[l].upper_bound(t);
        if (it != usage_[l].end()) next = std::min(next, it->first);
        const double free = std::max(0.0, 1.0 - At(usage_[l], t));
        rate = std::min(rate, free / uses[l]);
      }
      if (rate <= negligible && std::isfinite(next)) {
        // Full until the next change. (Past the last breakpoint usage is 0,
        // so a full link always has a next change.)
        t = next;
        continue;
      }
      rate = std::max(rate, negligible);
      const double finish = t + remaining / rate;
      if (finish <= next) {
        mine.push_back({t, finish, rate});
        remaining = 0;
        t = finish;
      } else {
        mine.push_back({t, next, rate});
        remaining -= rate * (next - t);
        t = next;
      }
    }
    b.end_s = t;
    for (const Segment& s : mine) {
      for (int l = 0; l < kLinks; ++l) {
        if (uses[l] <= 0) continue;
        Split(usage_[l], s.from);
        Split(usage_[l], s.to);
        for (auto it = usage_[l].find(s.from); it != usage_[l].end() && it->first < s.to; ++it) {
          it->second = std::min(1.0, it->second + s.rate * uses[l]);
        }
      }
    }
  }
  if (b.end_s > b.start_s) {
    Split(busy_, b.start_s);
    Split(busy_, b.end_s);
    for (auto it = busy_.find(b.start_s); it != busy_.end() && it->first < b.end_s; ++it) {
      it->second += 1;
    }
  }
  return b;
}

double LinkSchedule::BusyFraction(double t0, double t1) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!(t1 > t0)) return 0.0;
  double busy = 0;
  double t = t0;
  double value = At(busy_, t0);
  for (auto it = busy_.upper_bound(t0); it != busy_.end() && it->first < t1; ++it) {
    if (value > 0) busy += it->first - t;
    t = it->first;
    value = it->second;
  }
  if (value > 0) busy += t1 - t;
  return busy / (t1 - t0);
}

void LinkSchedule::ForgetBefore(double t_s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Usage* u : {&usage_[0], &usage_[1], &busy_}) {
    if (u->empty() || u->begin()->first >= t_s) continue;
    Split(*u, t_s);
    u->erase(u->begin(), u->find(t_s));
  }
}

double LinkSchedule::network_bus_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return network_bus_bytes_;
}

void LinkSchedule::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Usage* u : {&usage_[0], &usage_[1], &busy_}) u->clear();
  network_bus_bytes_ = 0;
  communicator_free_at_.clear();
}

double LinkSchedule::CommunicatorFreeAt(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = communicator_free_at_.find(id);
  return it == communicator_free_at_.end() ? 0.0 : it->second;
}

void LinkSchedule::SetCommunicatorFreeAt(uint64_t id, double end_s) {
  std::lock_guard<std::mutex> lock(mu_);
  double& at = communicator_free_at_[id];
  at = std::max(at, end_s);
}

}  // namespace sk::sim
