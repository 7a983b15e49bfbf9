#include "runtime/ops/cpu/cpu_backend.h"

#include <vector>

#include "runtime/ops/cpu/backend_common.h"

namespace sk::ops {

// One set of buffers per thread, shared by every op family (backend_common.h).
float* Scratch(int slot, int64_t n) {
  constexpr int kScratchSlots = 8;
  thread_local std::vector<float> bufs[kScratchSlots];
  std::vector<float>& b = bufs[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

Status SetCpuGemmThreads(int n) { return SetGemmThreads(n); }

OpBackend* CpuOpBackend() {
  static CpuBackend* backend = new CpuBackend();
  return backend;
}

namespace {

// The backend registers itself for DeviceKind::kCpu when this library is
// loaded (//runtime/ops:cpu is alwayslink): ops run on cpu from main on, and
// the dispatcher includes no backend.
[[maybe_unused]] const bool kRegistered = (RegisterOpBackend(DeviceKind::kCpu, CpuOpBackend()), true);

}  // namespace

}  // namespace sk::ops
