#include <map>
#include <mutex>

#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"

namespace sk {

#if defined(SHARDKIT_WITH_CUDA)
// cuda_device.cc
int CudaDeviceCountImpl();
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int index);
#endif

int Device::CudaDeviceCount() {
#if defined(SHARDKIT_WITH_CUDA)
  return CudaDeviceCountImpl();
#else
  return 0;
#endif
}

StatusOr<Device*> Device::Get(DeviceId id) {
  static std::mutex* mu = new std::mutex;
  // Devices live for the whole process: streams and allocators refer to them.
  static auto* devices = new std::map<std::pair<int, int>, std::unique_ptr<Device>>;
  if (id.index < 0) {
    return InvalidArgumentError("negative device index in " + id.ToString());
  }
  std::lock_guard<std::mutex> lock(*mu);
  auto key = std::make_pair(static_cast<int>(id.kind), id.index);
  auto it = devices->find(key);
  if (it != devices->end()) return it->second.get();
  std::unique_ptr<Device> device;
  switch (id.kind) {
    case DeviceKind::kCpu:
      device = std::make_unique<CpuDevice>(id.index);
      break;
    case DeviceKind::kCuda: {
#if defined(SHARDKIT_WITH_CUDA)
      SK_ASSIGN_OR_RETURN(device, CreateCudaDevice(id.index));
      break;
#else
      return UnavailableError("shardkit was built without CUDA (build with --config=cuda); " +
                              id.ToString() + " is not available");
#endif
    }
    default:
      return InvalidArgumentError("unknown device kind " +
                                  std::to_string(static_cast<int>(id.kind)));
  }
  Device* raw = device.get();
  devices->emplace(key, std::move(device));
  return raw;
}

}  // namespace sk
