// DeviceId: which device a tensor or stream lives on. A plain value; the
// device layer (runtime/device) gives it streams and events.
#ifndef SHARDKIT_RUNTIME_CORE_DEVICE_KIND_H_
#define SHARDKIT_RUNTIME_CORE_DEVICE_KIND_H_

#include <cstdint>
#include <string>

namespace sk {

// Values are part of the C ABI: never renumbered, only appended. Code must not
// assume that only kCpu and kCuda exist.
enum class DeviceKind : uint8_t {
  kCpu = 1,
  kCuda = 2,
  // The simulated accelerator (runtime/sim): virtual time and virtual memory,
  // executes nothing.
  kSim = 3,
};

struct DeviceId {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  static DeviceId Cpu(int index = 0) { return {DeviceKind::kCpu, index}; }
  static DeviceId Cuda(int index) { return {DeviceKind::kCuda, index}; }
  static DeviceId Sim(int index) { return {DeviceKind::kSim, index}; }

  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  bool is_sim() const { return kind == DeviceKind::kSim; }
  // "cpu:0", "cuda:1", "sim:2"; an unknown kind reads "device(kind 7):0".
  std::string ToString() const {
    std::string prefix;
    switch (kind) {
      case DeviceKind::kCpu:
        prefix = "cpu:";
        break;
      case DeviceKind::kCuda:
        prefix = "cuda:";
        break;
      case DeviceKind::kSim:
        prefix = "sim:";
        break;
      default:
        prefix = "device(kind " + std::to_string(static_cast<int>(kind)) + "):";
    }
    return prefix + std::to_string(index);
  }
  friend bool operator==(const DeviceId& a, const DeviceId& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend bool operator!=(const DeviceId& a, const DeviceId& b) { return !(a == b); }
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_DEVICE_KIND_H_
