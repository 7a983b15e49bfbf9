// How a benchmark program stops on a bad flag or a failed call: one line on
// stderr, "<program>: <what>", and exit status 1. The program is named by
// the name it was started under (glibc's program_invocation_short_name), so
// each benchmark reports as itself without passing its name around.
//
// Thread safety: Die ends the process; call it only where that is intended
// (a benchmark's own setup, never inside the runtime).
#ifndef SHARDKIT_BENCHMARKS_UTIL_DIE_H_
#define SHARDKIT_BENCHMARKS_UTIL_DIE_H_

#include <errno.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "runtime/core/status.h"

namespace sk::bench {

[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

// v's value, or Die naming `what` and the status.
template <typename T>
T OrDie(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().ToString());
  return std::move(v).value();
}

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_UTIL_DIE_H_
