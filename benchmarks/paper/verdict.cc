#include "benchmarks/paper/verdict.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace sk::bench {

std::vector<int> AlternatingOrder(int variants, int reps) {
  std::vector<int> order;
  for (int r = 0; r < reps && variants > 0; ++r) {
    for (int i = 0; i < variants; ++i) order.push_back(r % 2 == 0 ? i : variants - 1 - i);
  }
  return order;
}

Spread SpreadOf(const std::vector<double>& values) {
  Spread s;
  if (values.empty()) return s;
  std::vector<double> v = values;
  std::sort(v.begin(), v.end());
  s.n = static_cast<int>(v.size());
  s.median = v[v.size() / 2];
  s.lo = v.front();
  s.hi = v.back();
  return s;
}

Spread PairedRatios(const std::vector<double>& numerator, const std::vector<double>& denominator) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(numerator.size(), denominator.size()); ++i) {
    if (denominator[i] > 0) ratios.push_back(numerator[i] / denominator[i]);
  }
  return SpreadOf(ratios);
}

Spread Shifted(const Spread& s, double offset) {
  Spread out = s;
  if (s.n == 0) return out;
  out.median += offset;
  out.lo += offset;
  out.hi += offset;
  return out;
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kAgrees:
      return "agrees";
    case Verdict::kPartly:
      return "partly";
    case Verdict::kDisagrees:
      return "disagrees";
    case Verdict::kInconclusive:
      return "inconclusive";
  }
  return "inconclusive";
}

namespace {

// -2 below the partly band, -1 partly below the agree band, 0 agree, +1
// partly above, +2 above the partly band.
int Region(double x, const Bands& b) {
  if (x < b.partly_lo) return -2;
  if (x < b.agree_lo) return -1;
  if (x <= b.agree_hi) return 0;
  if (x <= b.partly_hi) return 1;
  return 2;
}

}  // namespace

Verdict Judge(const Spread& s, const Bands& bands) {
  if (s.n == 0) return Verdict::kInconclusive;
  const int lo = Region(s.lo, bands), hi = Region(s.hi, bands);
  if (lo != hi) return Verdict::kInconclusive;
  if (lo == 0) return Verdict::kAgrees;
  return (lo == 1 || lo == -1) ? Verdict::kPartly : Verdict::kDisagrees;
}

Verdict Combine(const std::vector<Verdict>& verdicts) {
  if (verdicts.empty()) return Verdict::kInconclusive;
  auto any = [&](Verdict v) { return std::find(verdicts.begin(), verdicts.end(), v) != verdicts.end(); };
  if (any(Verdict::kDisagrees)) return Verdict::kDisagrees;
  if (any(Verdict::kInconclusive)) return Verdict::kInconclusive;
  if (any(Verdict::kPartly)) return Verdict::kPartly;
  return Verdict::kAgrees;
}

std::vector<double> ParseList(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ';')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end != item.c_str()) out.push_back(v);
  }
  return out;
}

}  // namespace sk::bench
