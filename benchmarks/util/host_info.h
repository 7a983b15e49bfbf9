// What a benchmark report says about the machine it ran on.
//
// Thread safety: free functions reading /proc; safe from any thread.
#ifndef SHARDKIT_BENCHMARKS_UTIL_HOST_INFO_H_
#define SHARDKIT_BENCHMARKS_UTIL_HOST_INFO_H_

#include <string>

namespace sk::bench {

// The first "model name" of /proc/cpuinfo; else the machine uname(2)
// reports ("aarch64"); else "unknown CPU".
std::string CpuModel();

// The 1-, 5- and 15-minute load averages as /proc/loadavg prints them
// ("1.23 0.79 0.34"); empty fields when it cannot be read.
std::string LoadAverage();

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_UTIL_HOST_INFO_H_
