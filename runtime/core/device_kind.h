// DeviceId: which device a tensor or stream lives on. A plain value; the
// device layer (runtime/device) gives it streams and events.
#ifndef SHARDKIT_RUNTIME_CORE_DEVICE_KIND_H_
#define SHARDKIT_RUNTIME_CORE_DEVICE_KIND_H_

#include <cstdint>
#include <string>

namespace sk {

// Values are part of the C ABI: never renumbered.
enum class DeviceKind : uint8_t {
  kCpu = 1,
  kCuda = 2,
};

struct DeviceId {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  static DeviceId Cpu(int index = 0) { return {DeviceKind::kCpu, index}; }
  static DeviceId Cuda(int index) { return {DeviceKind::kCuda, index}; }

  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  // "cpu:0", "cuda:1".
  std::string ToString() const {
    return std::string(kind == DeviceKind::kCpu ? "cpu:" : "cuda:") + std::to_string(index);
  }
  friend bool operator==(const DeviceId& a, const DeviceId& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend bool operator!=(const DeviceId& a, const DeviceId& b) { return !(a == b); }
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_DEVICE_KIND_H_
