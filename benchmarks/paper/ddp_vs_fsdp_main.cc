// //benchmarks:ddp_vs_fsdp: see experiments.h.
#include "benchmarks/paper/harness_main.h"

int main(int argc, char** argv) { return sk::bench::HarnessMain("ddp_vs_fsdp", {"ddp_vs_fsdp"}, argc, argv); }
