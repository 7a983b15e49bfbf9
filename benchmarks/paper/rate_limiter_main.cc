// //benchmarks:rate_limiter: see experiments.h.
#include "benchmarks/paper/harness_main.h"

int main(int argc, char** argv) { return sk::bench::HarnessMain("rate_limiter", {"rate_limiter"}, argc, argv); }
