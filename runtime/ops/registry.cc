// The op backends' registry (backend.h): one table entry per device kind.
// Each backend registers itself -- the CPU and CUDA backends from a static
// registration object in their own libraries (linked with alwayslink, so a
// binary that links them has them registered before main), the simulator
// when its first device is made -- so this file, like the dispatcher, names
// no backend.
#include <array>
#include <atomic>
#include <cstddef>

#include "runtime/ops/backend.h"

namespace sk::ops {

namespace {

constexpr size_t kMaxKinds = 16;

// A function-local static, so that a registration from another library's
// static initialiser finds it constructed whatever the initialisation order.
std::array<std::atomic<OpBackend*>, kMaxKinds>& Table() {
  static auto* table = [] {
    auto* t = new std::array<std::atomic<OpBackend*>, kMaxKinds>();
    for (auto& e : *t) e.store(nullptr);
    return t;
  }();
  return *table;
}

}  // namespace

void RegisterOpBackend(DeviceKind kind, OpBackend* backend) {
  size_t i = static_cast<size_t>(kind);
  CHECK_LT(i, kMaxKinds) << "device kind " << i << " out of the op registry's range";
  Table()[i].store(backend);
}

OpBackend* BackendFor(DeviceKind kind) {
  size_t i = static_cast<size_t>(kind);
  if (i >= kMaxKinds) return nullptr;
  return Table()[i].load();
}

}  // namespace sk::ops
