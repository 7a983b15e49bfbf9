// The command line shared by the paper harnesses (//benchmarks:ddp_vs_fsdp,
// :prefetch, :rate_limiter, :hybrid and :paper, which runs all four): flags,
// the output folder, progress, tables (console, CSV, JSON, Markdown), plots
// (python3 benchmarks/paper/plot.py, after the measurements) and, for the
// experiments that ran, the claims table.
#ifndef SHARDKIT_BENCHMARKS_PAPER_HARNESS_MAIN_H_
#define SHARDKIT_BENCHMARKS_PAPER_HARNESS_MAIN_H_

#include <string>
#include <vector>

namespace sk::bench {

// `experiments`: names from experiments.h, in run order. Returns the exit code.
int HarnessMain(const std::string& harness, const std::vector<std::string>& experiments, int argc,
                char** argv);

}  // namespace sk::bench

#endif  // SHARDKIT_BENCHMARKS_PAPER_HARNESS_MAIN_H_
