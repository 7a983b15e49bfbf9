// Test-only slowdowns for the performance gate's self-test
// (benchmarks/track.py --self_test): a benchmark binary reads
//
//   SK_BENCH_INJECT="fsdp_step:2,collectives:2"
//
// and repeats the named work that many times inside its measured region, so
// both the instructions it executes and its time really multiply. Names:
//   fsdp_step    each FSDP training step (DDP steps are not repeated); in
//                //benchmarks:sim_track, each simulated FSDP step's forward
//                and backward (that many micro-batches per step);
//   collectives  each collective a collectives benchmark issues.
// Unset or empty: nothing is repeated. Nothing in runtime/ reads it.
#ifndef SHARDKIT_BENCHMARKS_UTIL_INJECT_H_
#define SHARDKIT_BENCHMARKS_UTIL_INJECT_H_

#include <string_view>

namespace sk::bench {

// How many times to run `what` (1 when SK_BENCH_INJECT does not name it).
// A malformed SK_BENCH_INJECT (unknown name, count not in 1..16) prints what
// is wrong to stderr and exits with status 2: a self-test must not silently
// measure the unchanged code. Thread-safe (reads the environment once).
int InjectedRepeats(std::string_view what);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_UTIL_INJECT_H_
