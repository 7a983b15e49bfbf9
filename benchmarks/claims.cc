#include "benchmarks/claims.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

namespace sk::bench {

namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Percent(double fraction) {
  return (fraction >= 0 ? "+" : "") + Fixed(fraction * 100, 1) + "%";
}

const Table* Get(const std::map<std::string, const Table*>& tables, const std::string& name) {
  auto it = tables.find(name);
  return it == tables.end() ? nullptr : it->second;
}

bool Ok(const Row& r) { return r.Text("status") == "ok"; }

// The first row matching every (column, value).
const Row* FindRow(const Table& t, const std::vector<std::pair<std::string, std::string>>& match) {
  for (const Row& r : t.rows()) {
    bool all = true;
    for (const auto& [column, value] : match) all = all && r.Text(column) == value;
    if (all) return &r;
  }
  return nullptr;
}

std::vector<std::string> Distinct(const Table& t, const std::string& column) {
  std::vector<std::string> out;
  for (const Row& r : t.rows()) {
    std::string v = r.Text(column);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

// What each measured row rests on (issue 12: say when the setup guarantees
// the outcome).
std::string Evidence(const std::string& id) {
  if (id == "fsdp_matches_ddp") return "measured (wall clock, one run per configuration)";
  if (id == "ddp_ooms_fsdp_trains") {
    return "by construction (the cap is chosen between DDP's and FSDP's peaks); the peak ratio is measured";
  }
  if (id == "backward_prefetch_18pct") {
    return "by construction (the network model is calibrated so that full overlap gives 18%); "
           "the achieved overlap is measured";
  }
  if (id == "limiter_near_cap") return "measured (retries, peak reserved; the cap is the harness's)";
  if (id == "limiter_small_effect") return "measured (wall clock, one run per configuration)";
  if (id == "hybrid_cross_host_traffic") {
    return "by construction (the bytes the collectives declare, against the formula they implement)";
  }
  if (id == "hybrid_memory_for_speed") return "by construction (the link speed is set so the cross-host link dominates)";
  return "measured";
}

Row Claim(const std::string& id, const std::string& paper, const std::string& ours,
          const std::string& verdict, const std::string& judged_by) {
  Row r;
  r.Set("claim", id);
  r.Set("evidence", Evidence(id));
  r.Set("paper", paper);
  r.Set("ours", ours);
  r.Set("verdict", verdict);
  r.Set("judged_by", judged_by);
  return r;
}

Row SpeedParity(const Table* t) {
  const std::string paper = "T5-611M and T5-2.28B train as fast under FSDP as under DDP";
  const std::string rule =
      "FULL_SHARD/DDP step time on every model DDP fits (f32), two-sided: agrees within 10% of 1, partly "
      "within 50%";
  if (t == nullptr) return Claim("fsdp_matches_ddp", paper, "", "not run", rule);
  std::string ours;
  double worst = 0;
  int pairs = 0;
  for (const std::string& model : Distinct(*t, "model")) {
    const Row* ddp = FindRow(*t, {{"model", model}, {"strategy", "DDP"}, {"dtype", "f32"}});
    const Row* fsdp = FindRow(*t, {{"model", model}, {"strategy", "FULL_SHARD"}, {"dtype", "f32"}});
    if (ddp == nullptr || fsdp == nullptr || !Ok(*ddp) || !Ok(*fsdp)) continue;
    double ratio = fsdp->Number("step_ms") / ddp->Number("step_ms");
    worst = std::max(worst, std::fabs(ratio - 1));
    ++pairs;
    ours += (ours.empty() ? "" : "; ") + model + " " + Fixed(ratio, 2) + "x";
  }
  if (pairs == 0) return Claim("fsdp_matches_ddp", paper, "no model where both ran", "not run", rule);
  ours = "FULL_SHARD/DDP step time: " + ours;
  return Claim("fsdp_matches_ddp", paper, ours,
               worst <= 0.10 ? "agrees" : (worst <= 0.50 ? "partly" : "disagrees"), rule);
}

Row MemoryScaling(const Table* t) {
  const std::string paper = "above 2.28B DDP runs out of memory, FSDP trains T5-11B";
  const std::string rule =
      "agrees: DDP OOMs on some model under the cap and FULL_SHARD trains every model (the cap "
      "is chosen between the two peaks, so the peak ratio is the measured part); partly: no "
      "DDP OOM but FULL_SHARD's peak is lower; disagrees: FULL_SHARD OOMs where DDP does not";
  if (t == nullptr) return Claim("ddp_ooms_fsdp_trains", paper, "", "not run", rule);
  std::string ours, ooms;
  bool fsdp_all = true, any_ddp_oom = false, fsdp_lower = false, fsdp_worse = false;
  for (const std::string& model : Distinct(*t, "model")) {
    for (const std::string& dtype : Distinct(*t, "dtype")) {
      const Row* ddp = FindRow(*t, {{"model", model}, {"strategy", "DDP"}, {"dtype", dtype}});
      const Row* fsdp = FindRow(*t, {{"model", model}, {"strategy", "FULL_SHARD"}, {"dtype", dtype}});
      if (ddp == nullptr || fsdp == nullptr) continue;
      const bool ddp_oom = ddp->Text("status") == "OOM";
      fsdp_all = fsdp_all && Ok(*fsdp);
      if (ddp_oom) {
        any_ddp_oom = true;
        if (dtype == "f32") {
          ooms += (ooms.empty() ? "" : ", ") + model + " (" + ddp->Text("params_m") + "M)";
        }
        if (!Ok(*fsdp)) fsdp_worse = true;
      }
      if (Ok(*ddp) && Ok(*fsdp) && dtype == "f32") {
        double ratio = fsdp->Number("peak_alloc_mib") / ddp->Number("peak_alloc_mib");
        fsdp_lower = fsdp_lower || ratio < 1;
        ours += (ours.empty() ? "" : "; ") + model + " " + Fixed(ratio, 2) + "x";
      }
    }
  }
  std::string cap = t->rows().empty() ? "?" : t->rows().front().Text("memory_cap_mib");
  std::string text = "cap " + cap + " MiB/rank: DDP OOM on " + (ooms.empty() ? "none" : ooms) +
                     "; FULL_SHARD " + (fsdp_all ? "trains every model" : "fails on some") +
                     "; FULL_SHARD/DDP peak allocated where both fit: " + (ours.empty() ? "-" : ours);
  std::string verdict = fsdp_worse ? "disagrees"
                        : (any_ddp_oom && fsdp_all) ? "agrees"
                        : fsdp_lower               ? "partly"
                                                   : "disagrees";
  return Claim("ddp_ooms_fsdp_trains", paper, text, verdict, rule);
}

Row Prefetch(const Table* t) {
  const std::string paper = "backward prefetch speeds GPT-175B up by about 18%";
  const std::string rule =
      "speedup of BACKWARD_PRE over no prefetch, network model calibrated to the paper's ratio: "
      "agrees 9%..36% (half to twice), partly > 2% outside that band, disagrees <= 2%";
  if (t == nullptr) return Claim("backward_prefetch_18pct", paper, "", "not run", rule);
  const Row* none = FindRow(*t, {{"mode", "none"}});
  const Row* pre = FindRow(*t, {{"mode", "BACKWARD_PRE"}});
  if (none == nullptr || pre == nullptr || !Ok(*none) || !Ok(*pre)) {
    return Claim("backward_prefetch_18pct", paper, "a mode failed", "not run", rule);
  }
  const double base = none->Number("step_ms");
  std::string ours;
  for (const Row& r : t->rows()) {
    if (!Ok(r) || r.Text("mode") == "none") continue;
    ours += (ours.empty() ? "" : ", ") + r.Text("mode") + " " + Percent(base / r.Number("step_ms") - 1);
  }
  const double speedup = base / pre->Number("step_ms") - 1;
  std::string verdict = speedup >= 0.09 && speedup <= 0.36 ? "agrees"
                        : speedup > 0.02                 ? "partly"
                                                         : "disagrees";
  return Claim("backward_prefetch_18pct", paper,
               "speedup over no prefetch (" + pre->Text("model") + "): " + ours, verdict, rule);
}

Row LimiterNearCap(const Table* t) {
  const std::string paper = "the rate limiter speeds T5-11B up to 5x (allocator retries without it)";
  const std::string rule =
      "near the cap, limit 0 (off) vs limit 2: agrees if off is >= 2x slower or OOMs while 2 "
      "trains; partly if off has more alloc retries or is >= 1.1x slower; disagrees otherwise";
  if (t == nullptr) return Claim("limiter_near_cap", paper, "", "not run", rule);
  const Row* off = FindRow(*t, {{"setting", "near cap"}, {"limit", "0"}});
  const Row* on = FindRow(*t, {{"setting", "near cap"}, {"limit", "2"}});
  if (off == nullptr || on == nullptr || !Ok(*on)) {
    return Claim("limiter_near_cap", paper, "near-cap runs missing or limit 2 failed", "not run", rule);
  }
  const double retries_off = off->Number("alloc_retries"), retries_on = on->Number("alloc_retries");
  std::string ours = off->Text("model") + " under a " + on->Text("memory_cap_mib") + " MiB cap: ";
  if (!Ok(*off)) {
    ours += "off " + off->Text("status") + " (" + Fixed(retries_off, 0) + " retries), limit 2 trains (" +
            Fixed(retries_on, 0) + " retries)";
    return Claim("limiter_near_cap", paper, ours, off->Text("status") == "OOM" ? "agrees" : "not run",
                 rule);
  }
  const double slowdown = off->Number("step_ms") / on->Number("step_ms");
  ours += "off/limit-2 step time " + Fixed(slowdown, 2) + "x, alloc retries " + Fixed(retries_off, 0) +
          " vs " + Fixed(retries_on, 0) + ", peak reserved " + off->Text("peak_reserved_mib") + " vs " +
          on->Text("peak_reserved_mib") + " MiB";
  std::string verdict = slowdown >= 2 ? "agrees"
                        : (retries_off > retries_on || slowdown >= 1.1) ? "partly"
                                                                         : "disagrees";
  return Claim("limiter_near_cap", paper, ours, verdict, rule);
}

Row LimiterFarFromCap(const Table* t) {
  const std::string paper = "the limiter gains nothing on RegNet-9B and costs about 5% on DeepViT-8B";
  const std::string rule =
      "uncapped, limit 2 vs off step time on every model: agrees if within 10% (no large effect "
      "either way), partly within 25%, disagrees beyond";
  if (t == nullptr) return Claim("limiter_small_effect", paper, "", "not run", rule);
  std::string ours;
  double worst = 0;
  int pairs = 0;
  for (const std::string& model : Distinct(*t, "model")) {
    const Row* off = FindRow(*t, {{"model", model}, {"setting", "uncapped"}, {"limit", "0"}});
    const Row* on = FindRow(*t, {{"model", model}, {"setting", "uncapped"}, {"limit", "2"}});
    if (off == nullptr || on == nullptr || !Ok(*off) || !Ok(*on)) continue;
    const double change = off->Number("step_ms") / on->Number("step_ms") - 1;  // limiter's speedup
    worst = std::max(worst, std::fabs(change));
    ++pairs;
    ours += (ours.empty() ? "" : "; ") + model + " limit 2 vs off " + Percent(change) +
            " speed, peak reserved " + on->Text("peak_reserved_mib") + " vs " +
            off->Text("peak_reserved_mib") + " MiB";
  }
  if (pairs == 0) return Claim("limiter_small_effect", paper, "", "not run", rule);
  return Claim("limiter_small_effect", paper, ours,
               worst <= 0.10 ? "agrees" : (worst <= 0.25 ? "partly" : "disagrees"), rule);
}

Row HybridTraffic(const Table* t, int world) {
  const std::string paper =
      "cross-host traffic per rank: hybrid 2M(W-1)/(GW) < full replication 2M(W-1)/W < full "
      "sharding 3M(W-1)/W";
  const std::string rule =
      "measured cross-host bytes per rank (M = f32 parameter bytes): agrees if the order holds and "
      "FULL_SHARD and NO_SHARD are within 10% of their formulas; partly if only the order holds";
  if (t == nullptr) return Claim("hybrid_cross_host_traffic", paper, "", "not run", rule);
  const Row* full = FindRow(*t, {{"strategy", "FULL_SHARD"}});
  const Row* hybrid = FindRow(*t, {{"strategy", "HYBRID_SHARD"}});
  const Row* none = FindRow(*t, {{"strategy", "NO_SHARD"}});
  if (full == nullptr || hybrid == nullptr || none == nullptr || !Ok(*full) || !Ok(*hybrid) ||
      !Ok(*none)) {
    return Claim("hybrid_cross_host_traffic", paper, "a strategy failed", "not run", rule);
  }
  const double m = full->Number("params_m") * 1e6 * 4 / (1 << 20);  // MiB
  const double w = world, g = hybrid->Number("shard_group_size");
  const double f_full = 3 * m * (w - 1) / w, f_none = 2 * m * (w - 1) / w,
               f_hybrid = 2 * m * (w - 1) / (g * w);
  const double c_full = full->Number("cross_host_mib_per_step"),
               c_none = none->Number("cross_host_mib_per_step"),
               c_hybrid = hybrid->Number("cross_host_mib_per_step");
  std::string ours = "MiB/rank/step measured (formula): FULL_SHARD " + Fixed(c_full, 1) + " (" +
                     Fixed(f_full, 1) + "), NO_SHARD " + Fixed(c_none, 1) + " (" + Fixed(f_none, 1) +
                     "), HYBRID_SHARD " + Fixed(c_hybrid, 1) + " (" + Fixed(f_hybrid, 1) +
                     "; a ring all-reduce of the M/G shard over W/G replicas moves " +
                     Fixed(2 * (m / g) * (w / g - 1) / (w / g), 1) + ")";
  const bool order = c_hybrid < c_none && c_none < c_full;
  const bool sizes = std::fabs(c_full / f_full - 1) <= 0.10 && std::fabs(c_none / f_none - 1) <= 0.10;
  return Claim("hybrid_cross_host_traffic", paper, ours,
               order && sizes ? "agrees" : (order ? "partly" : "disagrees"), rule);
}

Row HybridSpeed(const Table* t) {
  const std::string paper =
      "hybrid sharding trades memory for speed when the cross-host link is slow (sharding "
      "factor between 1 and W)";
  const std::string rule =
      "slow inter-host link: agrees if HYBRID_SHARD is faster than FULL_SHARD and its peak memory "
      "lies between FULL_SHARD's and NO_SHARD's; partly if one of the two holds";
  if (t == nullptr) return Claim("hybrid_memory_for_speed", paper, "", "not run", rule);
  const Row* full = FindRow(*t, {{"strategy", "FULL_SHARD"}});
  const Row* hybrid = FindRow(*t, {{"strategy", "HYBRID_SHARD"}});
  const Row* none = FindRow(*t, {{"strategy", "NO_SHARD"}});
  if (full == nullptr || hybrid == nullptr || none == nullptr || !Ok(*full) || !Ok(*hybrid) ||
      !Ok(*none)) {
    return Claim("hybrid_memory_for_speed", paper, "a strategy failed", "not run", rule);
  }
  const double speed = full->Number("step_ms") / hybrid->Number("step_ms");
  const double mf = full->Number("peak_alloc_mib"), mh = hybrid->Number("peak_alloc_mib"),
               mn = none->Number("peak_alloc_mib");
  const bool faster = speed > 1, between = mf < mh && mh < mn;
  std::string ours = "HYBRID_SHARD " + Fixed(speed, 2) + "x the speed of FULL_SHARD (NO_SHARD " +
                     Fixed(full->Number("step_ms") / none->Number("step_ms"), 2) +
                     "x); peak allocated FULL_SHARD " + Fixed(mf, 1) + ", HYBRID " + Fixed(mh, 1) +
                     ", NO_SHARD " + Fixed(mn, 1) + " MiB";
  return Claim("hybrid_memory_for_speed", paper, ours,
               faster && between ? "agrees" : (faster || between ? "partly" : "disagrees"), rule);
}

}  // namespace

Table EvaluateClaims(const std::map<std::string, const Table*>& tables, int world) {
  Table claims("claims");
  const Table* ddp = Get(tables, "ddp_vs_fsdp");
  claims.Add(SpeedParity(ddp));
  claims.Add(MemoryScaling(ddp));
  claims.Add(Prefetch(Get(tables, "prefetch")));
  const Table* limiter = Get(tables, "rate_limiter");
  claims.Add(LimiterNearCap(limiter));
  claims.Add(LimiterFarFromCap(limiter));
  claims.Add(HybridTraffic(Get(tables, "hybrid"), world));
  claims.Add(HybridSpeed(Get(tables, "hybrid")));
  return claims;
}

}  // namespace sk::bench
