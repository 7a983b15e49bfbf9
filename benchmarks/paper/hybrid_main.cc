// //benchmarks:hybrid: see experiments.h.
#include "benchmarks/paper/harness_main.h"

int main(int argc, char** argv) { return sk::bench::HarnessMain("hybrid", {"hybrid"}, argc, argv); }
