#include "runtime/sim/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include "runtime/core/file_io.h"

namespace sk::sim {

namespace internal {
// builtin_profiles.cc (generated from profiles/*.json): name -> JSON text.
const std::map<std::string, std::string>& BuiltinProfileTexts();
}  // namespace internal

namespace {

constexpr double kUs = 1e-6;
constexpr double kGB = 1e9;
constexpr double kTera = 1e12;
// The largest GEMM tile side (and K quantum) a profile may give.
constexpr int64_t kMaxTile = 1000000;
// How deep a profile file's JSON may nest (ours reach 7), and how large it
// may be (ours are under 64 KiB).
constexpr int kMaxProfileNesting = 32;
constexpr int64_t kMaxProfileBytes = int64_t{16} << 20;

// Reads numbers written as {"value": x, "source": "..."}, naming the key
// path of anything wrong.
class Reader {
 public:
  explicit Reader(std::string_view origin) : origin_(origin) {}

  Status Error(const std::string& path, const std::string& what) const {
    return InvalidArgumentError("profile " + origin_ + ": " + path + ": " + what);
  }

  StatusOr<const nlohmann::json*> Section(const nlohmann::json& parent, const std::string& key,
                                          const std::string& path) const {
    auto it = parent.find(key);
    if (it == parent.end() || !it->is_object()) {
      return Error(path + key, "missing, or not an object");
    }
    return &*it;
  }

  // The entry {"value", "source"} at parent[key]: its value, checked to be a
  // number in [lo, hi].
  StatusOr<double> Number(const nlohmann::json& parent, const std::string& key,
                          const std::string& path, double lo, double hi) const {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* entry, Sourced(parent, key, path));
    const nlohmann::json& v = (*entry)["value"];
    if (!v.is_number()) return Error(path + key, "\"value\" is not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) {
      // %g: 1e-300 printed by to_string was "0.000000", and 1e300 three
      // hundred digits.
      auto g = [](double d) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%g", d);
        return std::string(buf);
      };
      return Error(path + key, "value " + g(x) + " is outside [" + g(lo) + ", " + g(hi) + "]");
    }
    return x;
  }

  // The entry at parent[key] with a "source"; its "value" of any type.
  StatusOr<const nlohmann::json*> Sourced(const nlohmann::json& parent, const std::string& key,
                                          const std::string& path) const {
    auto it = parent.find(key);
    if (it == parent.end()) return Error(path + key, "missing");
    if (!it->is_object() || !it->contains("value")) {
      return Error(path + key, "must be {\"value\": ..., \"source\": \"...\"}");
    }
    auto source = it->find("source");
    if (source == it->end() || !source->is_string() || source->get<std::string>().empty()) {
      return Error(path + key, "has no \"source\": every number in a profile says where it "
                               "comes from");
    }
    return &*it;
  }

 private:
  std::string origin_;
};

StatusOr<DType> DTypeKey(const Reader& r, const std::string& name, const std::string& path) {
  StatusOr<DType> t = ParseDType(name);
  if (!t.ok()) return r.Error(path, "unknown dtype '" + name + "'");
  return *t;
}

StatusOr<SimDeviceSpec> ParseDevice(const Reader& r, const nlohmann::json& doc,
                                    const std::string& name) {
  SK_ASSIGN_OR_RETURN(const nlohmann::json* d, r.Section(doc, "device", ""));
  const std::string p = "device.";
  SimDeviceSpec spec;
  spec.name = name;
  // Physical quantities are positive: a device of 0 bytes "fits" nothing yet
  // was accepted (the planner then recommended DDP as fitting "0.03 of 0.00
  // GiB"), and a host link of 0 GB/s priced every copy at nothing.
  // Durations may be 0 (a CPU's ops have no separate launch).
  SK_ASSIGN_OR_RETURN(double memory, r.Number(*d, "memory_bytes", p, 1, 1e18));
  spec.memory_bytes = static_cast<size_t>(memory);
  SK_ASSIGN_OR_RETURN(double launch, r.Number(*d, "launch_overhead_us", p, 0, 1e6));
  SK_ASSIGN_OR_RETURN(double alloc, r.Number(*d, "raw_alloc_us", p, 0, 1e9));
  SK_ASSIGN_OR_RETURN(double free_us, r.Number(*d, "raw_free_us", p, 0, 1e9));
  SK_ASSIGN_OR_RETURN(double link, r.Number(*d, "host_link_gbps", p, 1e-6, 1e6));
  spec.launch_overhead_s = launch * kUs;
  spec.raw_alloc_s = alloc * kUs;
  spec.raw_free_s = free_us * kUs;
  spec.host_link_bytes_per_s = link * kGB;
  // Optional: a CPU's host memory gives free pages back (0, a GPU's
  // cudaMalloc, when absent).
  if (d->contains("release_page_bytes")) {
    SK_ASSIGN_OR_RETURN(double page, r.Number(*d, "release_page_bytes", p, 0, 1 << 30));
    spec.release_page_bytes = static_cast<size_t>(page);
    SK_RETURN_IF_ERROR(spec.Validate());
  }
  return spec;
}

// attention.curves: {"value": [{"pass": "fwd"|"bwd", "causal": bool,
// "head_dim": int, "tflops": [[sequence, TFLOP/s], ...], "source": "..."},
// ...], "source": "..."}. Every curve says where its numbers come from; at
// most one curve per (pass, mask, head size); both passes present.
StatusOr<std::vector<ComputeProfile::Attention::Curve>> ParseAttentionCurves(
    const Reader& r, const nlohmann::json& a, const std::string& path) {
  SK_ASSIGN_OR_RETURN(const nlohmann::json* entry, r.Sourced(a, "curves", path));
  const nlohmann::json& list = (*entry)["value"];
  const std::string where = path + "curves";
  if (!list.is_array() || list.empty()) {
    return r.Error(where, "\"value\" must be a non-empty list of curves");
  }
  std::vector<ComputeProfile::Attention::Curve> curves;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    const Status bad = r.Error(at, "a curve is {\"pass\": \"fwd\"|\"bwd\", \"causal\": bool, "
                                   "\"head_dim\": int in [1, 4096], \"tflops\": [[sequence >= 1, "
                                   "TFLOP/s > 0], ...] with increasing sequences, \"source\": \"...\"}");
    if (!e.is_object() || !e.value("pass", nlohmann::json()).is_string() ||
        !e.value("causal", nlohmann::json()).is_boolean() ||
        !e.value("head_dim", nlohmann::json()).is_number_integer() ||
        !e.value("tflops", nlohmann::json()).is_array() || e["tflops"].empty()) {
      return bad;
    }
    const nlohmann::json source = e.value("source", nlohmann::json());
    if (!source.is_string() || source.get<std::string>().empty()) {
      return r.Error(at, "has no \"source\": every number in a profile says where it comes from");
    }
    ComputeProfile::Attention::Curve c;
    const std::string pass = e["pass"].get<std::string>();
    if (pass != "fwd" && pass != "bwd") return bad;
    c.backward = pass == "bwd";
    c.causal = e["causal"].get<bool>();
    c.head_dim = e["head_dim"].get<int64_t>();
    if (c.head_dim < 1 || c.head_dim > 4096) return bad;
    for (const nlohmann::json& pt : e["tflops"]) {
      if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number()) return bad;
      const double seq = pt[0].get<double>(), tflops = pt[1].get<double>();
      if (!std::isfinite(seq) || !std::isfinite(tflops) || seq < 1 || seq > 1e9 || !(tflops > 0) ||
          tflops > 1e6 || (!c.points.empty() && seq <= c.points.back().first)) {
        return bad;
      }
      c.points.emplace_back(seq, tflops * kTera);
    }
    for (const auto& other : curves) {
      if (other.backward == c.backward && other.causal == c.causal && other.head_dim == c.head_dim) {
        return r.Error(at, "a second " + pass + (c.causal ? " causal" : " non-causal") + " curve for head_dim " +
                               std::to_string(c.head_dim));
      }
    }
    curves.push_back(std::move(c));
  }
  for (bool backward : {false, true}) {
    if (std::none_of(curves.begin(), curves.end(),
                     [&](const ComputeProfile::Attention::Curve& c) { return c.backward == backward; })) {
      return r.Error(where, std::string("no ") + (backward ? "bwd" : "fwd") + " curve (both passes are priced)");
    }
  }
  return curves;
}

StatusOr<ComputeProfile> ParseCompute(const Reader& r, const nlohmann::json& doc) {
  SK_ASSIGN_OR_RETURN(const nlohmann::json* c, r.Section(doc, "compute", ""));
  const std::string p = "compute.";
  ComputeProfile out;
  SK_ASSIGN_OR_RETURN(double sms, r.Number(*c, "sm_count", p, 1, 1e6));
  out.sm_count = static_cast<int64_t>(sms);

  SK_ASSIGN_OR_RETURN(const nlohmann::json* peaks, r.Section(*c, "gemm_peak_tflops", p));
  for (auto it = peaks->begin(); it != peaks->end(); ++it) {
    if (it.key() == "note") continue;
    const std::string path = p + "gemm_peak_tflops.";
    SK_ASSIGN_OR_RETURN(DType t, DTypeKey(r, it.key(), path + it.key()));
    SK_ASSIGN_OR_RETURN(double tflops, r.Number(*peaks, it.key(), path, 1e-6, 1e6));
    out.gemm_peak_flops[t] = tflops * kTera;
  }
  if (out.gemm_peak_flops.count(DType::kF32) == 0) {
    return r.Error(p + "gemm_peak_tflops.f32", "missing (the rate of every other dtype's default)");
  }
  SK_ASSIGN_OR_RETURN(out.gemm_efficiency, r.Number(*c, "gemm_efficiency", p, 1e-3, 1));
  if (c->contains("gemm_efficiency_by_dtype")) {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* by, r.Section(*c, "gemm_efficiency_by_dtype", p));
    const std::string path = p + "gemm_efficiency_by_dtype.";
    for (auto it = by->begin(); it != by->end(); ++it) {
      SK_ASSIGN_OR_RETURN(DType t, DTypeKey(r, it.key(), path + it.key()));
      SK_ASSIGN_OR_RETURN(double e, r.Number(*by, it.key(), path, 1e-3, 1));
      out.gemm_efficiency_by_dtype[t] = e;
    }
  }
  if (c->contains("gemm_tiles")) {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* tiles, r.Sourced(*c, "gemm_tiles", p));
    const nlohmann::json& list = (*tiles)["value"];
    // An empty list silently changed prices (no tile: every shape fully
    // efficient); leave the key out for that.
    if (!list.is_array() || list.empty()) {
      return r.Error(p + "gemm_tiles", "\"value\" must be a non-empty list of tiles");
    }
    for (const nlohmann::json& t : list) {
      if (!t.is_object() || !t.value("m", nlohmann::json()).is_number_integer() ||
          !t.value("n", nlohmann::json()).is_number_integer() ||
          !t.value("relative_efficiency", nlohmann::json()).is_number()) {
        return r.Error(p + "gemm_tiles", "each tile is {\"m\": int, \"n\": int, "
                                         "\"relative_efficiency\": number}");
      }
      GemmTile tile{t["m"].get<int64_t>(), t["n"].get<int64_t>(),
                    t["relative_efficiency"].get<double>()};
      // Bounded like gemm_k_quantum: pricing computes ceil(m / Tm) * Tm in int64.
      if (tile.m < 1 || tile.n < 1 || tile.m > kMaxTile || tile.n > kMaxTile ||
          !(tile.relative_efficiency > 0) || tile.relative_efficiency > 1) {
        return r.Error(p + "gemm_tiles", "a tile needs m, n in [1, " + std::to_string(kMaxTile) +
                                             "] and relative_efficiency in (0, 1]");
      }
      out.gemm_tiles.push_back(tile);
    }
    SK_ASSIGN_OR_RETURN(double kq, r.Number(*c, "gemm_k_quantum", p, 1, kMaxTile));
    out.gemm_k_quantum = static_cast<int64_t>(kq);
  }
  if (c->contains("gemm_table")) {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* table, r.Sourced(*c, "gemm_table", p));
    const nlohmann::json& list = (*table)["value"];
    if (!list.is_array() || list.empty()) {
      return r.Error(p + "gemm_table", "\"value\" must be a non-empty list of measurements");
    }
    for (const nlohmann::json& e : list) {
      if (!e.is_object() || !e.value("m", nlohmann::json()).is_number_integer() ||
          !e.value("n", nlohmann::json()).is_number_integer() ||
          !e.value("k", nlohmann::json()).is_number_integer() ||
          !e.value("dtype", nlohmann::json()).is_string() ||
          !e.value("gflops", nlohmann::json()).is_number()) {
        return r.Error(p + "gemm_table",
                       "each entry is {\"m\", \"n\", \"k\": int, \"dtype\": str, \"gflops\": number}");
      }
      SK_ASSIGN_OR_RETURN(DType t, DTypeKey(r, e["dtype"].get<std::string>(), p + "gemm_table"));
      GemmPoint pt{e["m"].get<int64_t>(), e["n"].get<int64_t>(), e["k"].get<int64_t>(), t,
                   e["gflops"].get<double>() * 1e9};
      if (pt.m < 1 || pt.n < 1 || pt.k < 1 || !(pt.flops_per_s > 0) ||
          !std::isfinite(pt.flops_per_s)) {
        return r.Error(p + "gemm_table", "an entry needs m, n, k >= 1 and gflops > 0");
      }
      out.gemm_table.push_back(pt);
    }
  }
  SK_ASSIGN_OR_RETURN(double vector, r.Number(*c, "vector_tflops", p, 1e-9, 1e6));
  out.vector_flops = vector * kTera;
  SK_ASSIGN_OR_RETURN(double bw, r.Number(*c, "memory_bandwidth_gbps", p, 1e-3, 1e7));
  SK_ASSIGN_OR_RETURN(double bw_eff, r.Number(*c, "memory_efficiency", p, 1e-3, 1));
  out.memory_bandwidth = bw * kGB * bw_eff;
  out.memory_bandwidth_peak = bw * kGB;
  SK_ASSIGN_OR_RETURN(double overhead, r.Number(*c, "kernel_overhead_us", p, 0, 1e6));
  out.kernel_overhead_s = overhead * kUs;
  if (c->contains("op_memory_efficiency")) {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* ops, r.Sourced(*c, "op_memory_efficiency", p));
    const nlohmann::json& map = (*ops)["value"];
    if (!map.is_object() || map.empty()) {
      return r.Error(p + "op_memory_efficiency", "\"value\" must map op names to fractions in (0, 1]");
    }
    for (auto it = map.begin(); it != map.end(); ++it) {
      const nlohmann::json& e = it.value();
      if (!e.is_number() || !(e.get<double>() > 0) || e.get<double>() > 1) {
        return r.Error(p + "op_memory_efficiency." + it.key(), "must be a fraction in (0, 1]");
      }
      out.op_memory_efficiency.emplace(it.key(), e.get<double>());
    }
  }
  if (c->contains("attention")) {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* a, r.Section(*c, "attention", p));
    const std::string path = p + "attention.";
    ComputeProfile::Attention att;
    // Measured curves, or the two efficiencies and the key overhead.
    const bool curves = a->contains("curves");
    if (curves) {
      SK_ASSIGN_OR_RETURN(att.curves, ParseAttentionCurves(r, *a, path));
      SK_ASSIGN_OR_RETURN(double tokens, r.Number(*a, "curve_tokens", path, 1, 1e12));
      SK_ASSIGN_OR_RETURN(double hidden, r.Number(*a, "curve_hidden", path, 1, 1e9));
      att.curve_tokens = static_cast<int64_t>(tokens);
      att.curve_hidden = static_cast<int64_t>(hidden);
    } else {
      SK_ASSIGN_OR_RETURN(att.fwd_efficiency, r.Number(*a, "fwd_efficiency", path, 1e-3, 1));
      SK_ASSIGN_OR_RETURN(att.bwd_efficiency, r.Number(*a, "bwd_efficiency", path, 1e-3, 1));
    }
    SK_ASSIGN_OR_RETURN(double q_block, r.Number(*a, "q_block", path, 1, kMaxTile));
    att.q_block = static_cast<int64_t>(q_block);
    if (!curves) {
      SK_ASSIGN_OR_RETURN(att.key_overhead, r.Number(*a, "key_overhead", path, 0, 1e9));
    }
    out.attention = att;
  }
  if (c->contains("op_rates")) {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* rates, r.Sourced(*c, "op_rates", p));
    const nlohmann::json& map = (*rates)["value"];
    if (!map.is_object()) return r.Error(p + "op_rates", "\"value\" must map op names to rates");
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string path = p + "op_rates." + it.key();
      const nlohmann::json& e = it.value();
      const Status bad = r.Error(path, "must be {\"per\": \"byte\"|\"flop\", \"points\": "
                                       "[[work > 0, rate > 0], ...]} with increasing work");
      if (!e.is_object() || !e.contains("per") || !e["per"].is_string() ||
          !e.contains("points") || !e["points"].is_array() || e["points"].empty()) {
        return bad;
      }
      OpRate rate;
      const std::string per = e["per"].get<std::string>();
      if (per != "byte" && per != "flop") return bad;
      rate.per_flop = per == "flop";
      for (const nlohmann::json& pt : e["points"]) {
        if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number()) return bad;
        const double work = pt[0].get<double>(), per_s = pt[1].get<double>();
        if (!(work > 0) || !(per_s > 0) || !std::isfinite(work) || !std::isfinite(per_s) ||
            (!rate.points.empty() && work <= rate.points.back().first)) {
          return bad;
        }
        rate.points.emplace_back(work, per_s);
      }
      out.op_rates.emplace(it.key(), std::move(rate));
    }
  }
  return out;
}

// The optional "host" section: memory into `spec`, rates into a profile.
StatusOr<ComputeProfile> ParseHost(const Reader& r, const nlohmann::json& h, SimDeviceSpec& spec) {
  if (!h.is_object()) return r.Error("host", "must be an object");
  const std::string p = "host.";
  SK_ASSIGN_OR_RETURN(double memory, r.Number(h, "memory_bytes", p, 1, 1e18));
  SK_ASSIGN_OR_RETURN(double bw, r.Number(h, "memory_bandwidth_gbps", p, 1e-3, 1e7));
  SK_ASSIGN_OR_RETURN(double bw_eff, r.Number(h, "memory_efficiency", p, 1e-3, 1));
  SK_ASSIGN_OR_RETURN(double vector, r.Number(h, "vector_tflops", p, 1e-9, 1e6));
  SK_ASSIGN_OR_RETURN(double overhead, r.Number(h, "op_overhead_us", p, 0, 1e6));
  spec.host_memory_bytes = static_cast<size_t>(memory);
  ComputeProfile out;
  out.vector_flops = vector * 1e12;
  out.gemm_peak_flops[DType::kF32] = out.vector_flops;  // no GEMMs run on the host
  out.memory_bandwidth = bw * kGB * bw_eff;
  out.kernel_overhead_s = overhead * kUs;
  return out;
}

// The optional "implementations" section into `out` (every implementation
// described, and the default's name).
Status ParseImplementations(const Reader& r, const nlohmann::json& doc, SimProfile& out) {
  SK_ASSIGN_OR_RETURN(const nlohmann::json* s, r.Section(doc, "implementations", ""));
  const std::string p = "implementations.";
  auto def = s->find("default");
  if (def == s->end() || !def->is_string() || def->get<std::string>().empty()) {
    return r.Error(p + "default", "missing, or not the name of one of the implementations");
  }
  out.default_implementation = def->get<std::string>();
  for (auto it = s->begin(); it != s->end(); ++it) {
    if (it.key() == "default") continue;
    const std::string path = p + it.key() + ".";
    if (!it->is_object()) return r.Error(p + it.key(), "must be an object");
    if (it.key().empty() || it.key().find(':') != std::string::npos) {
      return r.Error(p + it.key(), "an implementation's name is non-empty and has no ':'");
    }
    KernelImplementation impl;
    auto desc = it->find("description");
    if (desc == it->end() || !desc->is_string() || desc->get<std::string>().empty()) {
      return r.Error(path + "description", "missing: say whose kernels these are");
    }
    impl.description = desc->get<std::string>();
    if (it->contains("gemm_fraction_by_dtype")) {
      SK_ASSIGN_OR_RETURN(const nlohmann::json* by, r.Section(*it, "gemm_fraction_by_dtype", path));
      for (auto d = by->begin(); d != by->end(); ++d) {
        const std::string dpath = path + "gemm_fraction_by_dtype.";
        SK_ASSIGN_OR_RETURN(DType t, DTypeKey(r, d.key(), dpath + d.key()));
        SK_ASSIGN_OR_RETURN(double f, r.Number(*by, d.key(), dpath, 1e-3, 1));
        impl.gemm_fraction_by_dtype[t] = f;
      }
    }
    if (it->contains("op_memory_efficiency")) {
      SK_ASSIGN_OR_RETURN(const nlohmann::json* ops, r.Sourced(*it, "op_memory_efficiency", path));
      const nlohmann::json& map = (*ops)["value"];
      if (!map.is_object() || map.empty()) {
        return r.Error(path + "op_memory_efficiency", "\"value\" must map op names to fractions in (0, 1]");
      }
      for (auto e = map.begin(); e != map.end(); ++e) {
        if (!e->is_number() || !(e->get<double>() > 0) || e->get<double>() > 1) {
          return r.Error(path + "op_memory_efficiency." + e.key(), "must be a fraction in (0, 1]");
        }
        impl.op_memory_efficiency.emplace(e.key(), e->get<double>());
      }
    }
    out.implementations.emplace(it.key(), std::move(impl));
  }
  if (out.implementations.count(out.default_implementation) == 0) {
    return r.Error(p + "default", "'" + out.default_implementation + "' is not one of the implementations");
  }
  return OkStatus();
}

// The implementations' names, comma-separated ("none" without any).
std::string ImplementationNames(const SimProfile& p) {
  std::string names;
  for (const auto& [name, impl] : p.implementations) names += (names.empty() ? "" : ", ") + name;
  return names.empty() ? "none" : names;
}

// Prices `compute` with the kernels of `impl`.
void ApplyImplementation(const KernelImplementation& impl, ComputeProfile& compute) {
  for (const auto& [t, f] : impl.gemm_fraction_by_dtype) {
    auto by = compute.gemm_efficiency_by_dtype.find(t);
    const double base = by != compute.gemm_efficiency_by_dtype.end() ? by->second : compute.gemm_efficiency;
    compute.gemm_efficiency_by_dtype[t] = base * f;
  }
  for (const auto& [op, f] : impl.op_memory_efficiency) compute.op_memory_efficiency[op] = f;
}

}  // namespace

std::pair<std::string, std::string> SplitProfileName(std::string_view name_or_path) {
  const size_t colon = name_or_path.rfind(':');
  if (colon == std::string_view::npos || name_or_path.find('/', colon) != std::string_view::npos) {
    return {std::string(name_or_path), ""};
  }
  return {std::string(name_or_path.substr(0, colon)), std::string(name_or_path.substr(colon + 1))};
}

StatusOr<SimProfile> ParseProfile(const nlohmann::json& doc, std::string_view origin,
                                  std::string_view implementation) {
  Reader r(origin);
  if (!doc.is_object()) return r.Error("(top)", "a profile is a JSON object");
  auto name = doc.find("name");
  if (name == doc.end() || !name->is_string() || name->get<std::string>().empty()) {
    return r.Error("name", "missing or not a string");
  }
  SimProfile out;
  out.name = name->get<std::string>();
  if (doc.contains("description") && doc["description"].is_string()) {
    out.description = doc["description"].get<std::string>();
  }
  SK_ASSIGN_OR_RETURN(out.device, ParseDevice(r, doc, out.name));
  SK_ASSIGN_OR_RETURN(out.compute, ParseCompute(r, doc));
  out.device.memory_bandwidth_bytes_per_s = out.compute.memory_bandwidth;
  if (doc.contains("implementations")) SK_RETURN_IF_ERROR(ParseImplementations(r, doc, out));
  if (!implementation.empty() || !out.default_implementation.empty()) {
    const std::string want = implementation.empty() ? out.default_implementation : std::string(implementation);
    auto impl = out.implementations.find(want);
    if (impl == out.implementations.end()) {
      return NotFoundError("profile " + std::string(origin) + " describes no kernel implementation '" + want +
                           "' (it has: " + ImplementationNames(out) + ")");
    }
    ApplyImplementation(impl->second, out.compute);
    out.implementation = want;
  }
  if (doc.contains("network")) out.network = doc["network"];
  if (doc.contains("host")) {
    SK_ASSIGN_OR_RETURN(out.host, ParseHost(r, doc["host"], out.device));
  }
  if (doc.contains("validation")) {
    SK_ASSIGN_OR_RETURN(const nlohmann::json* v, r.Section(doc, "validation", ""));
    const std::string p = "validation.";
    ValidationSpread spread;
    SK_ASSIGN_OR_RETURN(double runs, r.Number(*v, "runs", p, 1, 1e6));
    spread.runs = static_cast<int>(runs);
    SK_ASSIGN_OR_RETURN(spread.ratio_low, r.Number(*v, "ratio_low", p, 1e-3, 1e3));
    SK_ASSIGN_OR_RETURN(spread.ratio_median, r.Number(*v, "ratio_median", p, spread.ratio_low, 1e3));
    SK_ASSIGN_OR_RETURN(spread.ratio_high, r.Number(*v, "ratio_high", p, spread.ratio_median, 1e3));
    spread.source = (*v)["runs"]["source"].get<std::string>();
    out.validation = spread;
  }
  SK_RETURN_IF_ERROR(out.device.Validate());
  return out;
}

StatusOr<SimProfile> LoadProfileFile(const std::string& path, std::string_view implementation) {
  // Bounded, and regular files only: a path naming an endless file
  // (/dev/zero) or a FIFO is InvalidArgument, not an exhausted heap or a
  // blocked open.
  StatusOr<std::string> text = ReadFileBounded(path, kMaxProfileBytes, "profile file");
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kResourceExhausted ||
        text.status().code() == StatusCode::kInvalidArgument) {
      return text.status();
    }
    return NotFoundError(std::string(text.status().message()));  // names the path and the reason
  }
  // Profiles nest 7 deep; the "network" section is kept as JSON and copied,
  // which recurses: bound the nesting before anything parses or copies it.
  if (Status s = CheckJsonNesting(*text, kMaxProfileNesting, "profile " + path); !s.ok()) {
    return InvalidArgumentError(std::string(s.message()));
  }
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return InvalidArgumentError("profile " + path + ": not valid JSON");
  }
  return ParseProfile(doc, path, implementation);
}

std::vector<std::string> BuiltinProfileNames() {
  std::vector<std::string> names;
  for (const auto& [name, text] : internal::BuiltinProfileTexts()) names.push_back(name);
  return names;  // std::map: sorted
}

StatusOr<SimProfile> LoadProfile(std::string_view name_or_path) {
  const auto [key, implementation] = SplitProfileName(name_or_path);
  if (key.size() > 5 && key.compare(key.size() - 5, 5, ".json") == 0) {
    return LoadProfileFile(key, implementation);
  }
  const auto& texts = internal::BuiltinProfileTexts();
  auto it = texts.find(key);
  if (it == texts.end()) {
    std::string known;
    for (const auto& [name, text] : texts) known += (known.empty() ? "" : ", ") + name;
    return NotFoundError("no profile named '" + key + "' (built in: " + known +
                         "; or give a path ending in .json)");
  }
  // Built-in profiles are constants: each is parsed once per process and
  // copied out after (the planner loads one per simulated candidate).
  static std::mutex* mu = new std::mutex;
  static auto* parsed = new std::map<std::string, SimProfile>;  // never destroyed
  const std::string cache_key(name_or_path);
  {
    std::lock_guard<std::mutex> lock(*mu);
    auto hit = parsed->find(cache_key);
    if (hit != parsed->end()) return hit->second;
  }
  nlohmann::json doc = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InternalError("built-in profile " + key + " is not valid JSON");
  SK_ASSIGN_OR_RETURN(SimProfile profile, ParseProfile(doc, "builtin:" + key, implementation));
  std::lock_guard<std::mutex> lock(*mu);
  parsed->emplace(cache_key, profile);
  return profile;
}

// ---------------------------------------------------------------- pricing

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

double PeakFor(const ComputeProfile& p, DType t) {
  auto it = p.gemm_peak_flops.find(t);
  if (it != p.gemm_peak_flops.end()) return it->second;
  return p.gemm_peak_flops.at(DType::kF32);
}

// Log-linear interpolation of the measured rate over the grid of `dtype`
// (f32's when the table has none of `dtype`). 0 if the table has neither.
double TableRate(const ComputeProfile& p, int64_t m, int64_t n, int64_t k, DType dtype) {
  DType use = dtype;
  if (std::none_of(p.gemm_table.begin(), p.gemm_table.end(),
                   [&](const GemmPoint& g) { return g.dtype == dtype; })) {
    use = DType::kF32;
  }
  std::vector<int64_t> axis[3];
  std::map<std::tuple<int64_t, int64_t, int64_t>, double> rate;
  for (const GemmPoint& g : p.gemm_table) {
    if (g.dtype != use) continue;
    axis[0].push_back(g.m);
    axis[1].push_back(g.n);
    axis[2].push_back(g.k);
    rate[{g.m, g.n, g.k}] = g.flops_per_s;
  }
  if (rate.empty()) return 0;
  const int64_t want[3] = {m, n, k};
  int64_t lo[3], hi[3];
  double frac[3];
  for (int d = 0; d < 3; ++d) {
    std::sort(axis[d].begin(), axis[d].end());
    axis[d].erase(std::unique(axis[d].begin(), axis[d].end()), axis[d].end());
    const double x = static_cast<double>(want[d]);
    if (x <= axis[d].front()) {
      lo[d] = hi[d] = axis[d].front();
      frac[d] = 0;
    } else if (x >= axis[d].back()) {
      lo[d] = hi[d] = axis[d].back();
      frac[d] = 0;
    } else {
      auto up = std::upper_bound(axis[d].begin(), axis[d].end(), want[d]);
      hi[d] = *up;
      lo[d] = *std::prev(up);
      frac[d] = std::log(x / lo[d]) / std::log(static_cast<double>(hi[d]) / lo[d]);
    }
  }
  // Trilinear in log(rate) over the 8 corners; a missing corner (an
  // incomplete grid) falls back to the nearest measured point.
  double log_rate = 0;
  for (int corner = 0; corner < 8; ++corner) {
    const int64_t c[3] = {(corner & 1) ? hi[0] : lo[0], (corner & 2) ? hi[1] : lo[1],
                          (corner & 4) ? hi[2] : lo[2]};
    auto it = rate.find({c[0], c[1], c[2]});
    if (it == rate.end()) {
      double best = 0, best_d = 1e300;
      for (const auto& [key, r] : rate) {
        const double dd = std::pow(std::log(double(std::get<0>(key)) / m), 2) +
                          std::pow(std::log(double(std::get<1>(key)) / n), 2) +
                          std::pow(std::log(double(std::get<2>(key)) / k), 2);
        if (dd < best_d) best_d = dd, best = r;
      }
      return best;
    }
    double w = 1;
    for (int d = 0; d < 3; ++d) w *= ((corner >> d) & 1) ? frac[d] : 1 - frac[d];
    log_rate += w * std::log(it->second);
  }
  return std::exp(log_rate);
}

}  // namespace

double GemmShapeEfficiency(const ComputeProfile& p, int64_t m, int64_t n, int64_t k,
                           int64_t batch) {
  if (p.gemm_tiles.empty() || m < 1 || n < 1 || k < 1 || batch < 1) return 1;
  double best = 0;
  for (const GemmTile& t : p.gemm_tiles) {
    const int64_t tm = CeilDiv(m, t.m);
    const int64_t tn = CeilDiv(n, t.n);
    const double tile_q = static_cast<double>(m) * n / (static_cast<double>(tm * t.m) * (tn * t.n));
    const double ctas = static_cast<double>(tm) * tn * batch;
    const double waves = std::ceil(ctas / p.sm_count);
    const double wave_q = ctas / (waves * p.sm_count);
    best = std::max(best, t.relative_efficiency * tile_q * wave_q);
  }
  const int64_t kq = std::max<int64_t>(1, p.gemm_k_quantum);
  const double k_q = static_cast<double>(k) / (CeilDiv(k, kq) * kq);
  return best * k_q;
}

double GemmSeconds(const ComputeProfile& p, int64_t m, int64_t n, int64_t k, int64_t batch,
                   DType dtype, double flops, double bytes) {
  if (m < 1 || n < 1 || k < 1 || batch < 1) return p.kernel_overhead_s;
  if (!p.gemm_table.empty()) {
    const double rate = TableRate(p, m, n, k, dtype);
    if (rate > 0) return flops / rate;
  }
  auto by_dtype = p.gemm_efficiency_by_dtype.find(dtype);
  const double efficiency =
      by_dtype != p.gemm_efficiency_by_dtype.end() ? by_dtype->second : p.gemm_efficiency;
  const double compute =
      flops / (PeakFor(p, dtype) * efficiency * GemmShapeEfficiency(p, m, n, k, batch));
  const double memory = p.memory_bandwidth > 0 ? bytes / p.memory_bandwidth : 0;
  return std::max(compute, memory) + p.kernel_overhead_s;
}

double KernelSeconds(const ComputeProfile& p, std::string_view name, double flops, double bytes) {
  auto it = p.op_rates.find(name);
  if (it != p.op_rates.end()) {
    const OpRate& r = it->second;
    const double work = r.per_flop ? flops : bytes;
    if (!(work > 0)) return p.kernel_overhead_s;
    double rate;
    const auto& pts = r.points;
    if (work <= pts.front().first) {
      rate = pts.front().second;
    } else if (work >= pts.back().first) {
      rate = pts.back().second;
    } else {
      auto up = std::upper_bound(pts.begin(), pts.end(), std::make_pair(work, 0.0));
      auto lo = std::prev(up);
      const double f = std::log(work / lo->first) / std::log(up->first / lo->first);
      rate = std::exp((1 - f) * std::log(lo->second) + f * std::log(up->second));
    }
    return std::max(p.kernel_overhead_s, work / rate);
  }
  double bandwidth = p.memory_bandwidth;
  if (auto measured = p.op_memory_efficiency.find(name);
      measured != p.op_memory_efficiency.end() && p.memory_bandwidth_peak > 0) {
    bandwidth = p.memory_bandwidth_peak * measured->second;
  }
  const double memory = bandwidth > 0 ? bytes / bandwidth : 0;
  const double compute = p.vector_flops > 0 ? flops / p.vector_flops : 0;
  return std::max(memory, compute) + p.kernel_overhead_s;
}

namespace {

// The last wave's fill of `blocks` thread blocks over the SMs, in (0, 1].
double WaveFill(double blocks, int64_t sms) {
  if (!(blocks > 0) || sms < 1) return 1;
  const double waves = std::ceil(blocks / static_cast<double>(sms));
  return blocks / (waves * static_cast<double>(sms));
}

// A curve's FLOP/s at `seq`: linear in log2(sequence) between its points,
// clamped at its ends.
double CurveRate(const ComputeProfile::Attention::Curve& c, double seq) {
  const auto& pts = c.points;
  if (seq <= pts.front().first) return pts.front().second;
  if (seq >= pts.back().first) return pts.back().second;
  auto up = std::upper_bound(pts.begin(), pts.end(), std::make_pair(seq, 0.0));
  auto lo = std::prev(up);
  const double f = std::log2(seq / lo->first) / std::log2(up->first / lo->first);
  return lo->second + f * (up->second - lo->second);
}

// The rate of one pass and mask at (seq, head_dim) over the curves given:
// between the two measured head sizes around head_dim, linear in
// log2(head_dim) (clamped to the smallest and largest). 0 when no curve
// matches.
double PassRate(const std::vector<ComputeProfile::Attention::Curve>& curves, bool backward, bool causal,
                double seq, int64_t head_dim) {
  const ComputeProfile::Attention::Curve* lo = nullptr;
  const ComputeProfile::Attention::Curve* hi = nullptr;
  for (const auto& c : curves) {
    if (c.backward != backward || c.causal != causal) continue;
    if (c.head_dim <= head_dim && (lo == nullptr || c.head_dim > lo->head_dim)) lo = &c;
    if (c.head_dim >= head_dim && (hi == nullptr || c.head_dim < hi->head_dim)) hi = &c;
  }
  if (lo == nullptr && hi == nullptr) return 0;
  if (lo == nullptr) return CurveRate(*hi, seq);
  if (hi == nullptr || hi == lo) return CurveRate(*lo, seq);
  const double f = std::log2(static_cast<double>(head_dim) / lo->head_dim) /
                   std::log2(static_cast<double>(hi->head_dim) / lo->head_dim);
  return CurveRate(*lo, seq) + f * (CurveRate(*hi, seq) - CurveRate(*lo, seq));
}

// The measured curves' rate for a call (the file comment), FLOP/s.
double CurvesRate(const ComputeProfile::Attention& a, bool backward, bool causal, double seq,
                  int64_t head_dim) {
  const double direct = PassRate(a.curves, backward, causal, seq, head_dim);
  if (direct > 0) return direct;
  // A pass measured with one mask only: the other mask's curve as it is.
  if (!causal) return PassRate(a.curves, backward, true, seq, head_dim);
  // No causal curve of this pass: its non-causal rate times the forward's
  // causal / non-causal ratio (1 when the forward lacks either).
  const double open = PassRate(a.curves, backward, false, seq, head_dim);
  const double fwd_causal = PassRate(a.curves, false, true, seq, head_dim);
  const double fwd_open = PassRate(a.curves, false, false, seq, head_dim);
  return fwd_causal > 0 && fwd_open > 0 ? open * fwd_causal / fwd_open : open;
}

}  // namespace

double AttentionEfficiency(const ComputeProfile& p, bool backward, int64_t m, int64_t n,
                           int64_t batch, int64_t head_dim, bool causal) {
  if (!p.attention) return 0;
  const ComputeProfile::Attention& a = *p.attention;
  const int64_t q_block = std::max<int64_t>(1, a.q_block);
  if (!a.curves.empty()) {
    const double peak16 = PeakFor(p, p.gemm_peak_flops.count(DType::kBF16) ? DType::kBF16 : DType::kF16);
    const int64_t hd = std::max<int64_t>(1, head_dim);
    const double seq = static_cast<double>(std::max<int64_t>(1, causal ? m : n));
    const double rate = CurvesRate(a, backward, causal, seq, hd);
    if (m < 1 || n < 1 || batch < 1) return rate / peak16;
    // The published calls' last wave: curve_tokens / seq sequences of
    // curve_hidden / head_dim heads, ceil(seq / q_block) blocks each.
    const double bench_blocks = std::max(1.0, static_cast<double>(a.curve_tokens) / seq) *
                                std::max(1.0, static_cast<double>(a.curve_hidden) / hd) *
                                std::ceil(seq / static_cast<double>(q_block));
    const double blocks = static_cast<double>(CeilDiv(m, q_block)) * batch;
    return rate / peak16 * WaveFill(blocks, p.sm_count) / WaveFill(bench_blocks, p.sm_count);
  }
  const double base = backward ? a.bwd_efficiency : a.fwd_efficiency;
  if (m < 1 || n < 1 || batch < 1) return base;
  const double blocks = static_cast<double>(CeilDiv(m, q_block)) * batch;
  return base * WaveFill(blocks, p.sm_count) * static_cast<double>(n) /
         (static_cast<double>(n) + a.key_overhead);
}

}  // namespace sk::sim
