// //benchmarks:paper: every paper experiment, then the claims table.
#include "benchmarks/paper/harness_main.h"

int main(int argc, char** argv) {
  return sk::bench::HarnessMain("paper", {"ddp_vs_fsdp", "prefetch", "rate_limiter", "hybrid"}, argc,
                                argv);
}
