#include "benchmarks/util/host_info.h"

#include <sys/utsname.h>

#include <fstream>

namespace sk::bench {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  struct utsname u;
  return uname(&u) == 0 ? std::string(u.machine) : "unknown CPU";
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace sk::bench
