// The medians benchmark reports print. Two on purpose: the harnesses and
// their trackers were baselined with the one each uses, and changing which
// one a report prints changes its numbers.
//
// Thread safety: pure functions; safe from any thread.
#ifndef SHARDKIT_BENCHMARKS_UTIL_STATS_H_
#define SHARDKIT_BENCHMARKS_UTIL_STATS_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace sk::bench {

// The middle sample of `v`; for an even count, the mean of the two middle
// samples. 0 for no samples.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The sample at index size / 2 of sorted `v`: the median for an odd count,
// the upper of the two middle samples for an even one (always a measured
// value). 0 for no samples.
inline double UpperMedian(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_UTIL_STATS_H_
