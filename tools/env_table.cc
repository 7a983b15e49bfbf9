// Prints the table of environment variables that docs/environment.md holds:
//   ./bazelw run //tools:env_table
#include <cstdio>

#include "runtime/core/env.h"

int main() {
  std::fputs(sk::EnvVarsMarkdown().c_str(), stdout);
  return 0;
}
