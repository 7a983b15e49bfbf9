#include "runtime/ops/dispatch.h"

#include <atomic>

#include "runtime/core/allocator.h"
#include "runtime/device/device.h"
#include "runtime/ops/ops.h"

namespace sk::ops {

namespace internal {

std::atomic<OpTimingObserver*> g_timing_observer{nullptr};

}  // namespace internal

void SetOpTimingObserver(OpTimingObserver* observer) {
  internal::g_timing_observer.store(observer, std::memory_order_release);
}

OpContext HostContext() {
  static Device* cpu = [] {
    auto d = Device::Get(DeviceId::Cpu(0));
    CHECK(d.ok()) << d.status().ToString();
    return *d;
  }();
  return OpContext{cpu, nullptr, &HostAllocator::Default()};
}

}  // namespace sk::ops
