#include <map>
#include <mutex>

#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"

namespace sk {

#if defined(SHARDKIT_WITH_CUDA)
// cuda_device.cc
int CudaDeviceCountImpl();
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int index);
StatusOr<void*> CudaAllocatePinnedHost(size_t bytes);
void CudaFreePinnedHost(void* ptr);
std::optional<int> CudaPointerDevice(const void* ptr);
#endif

std::optional<DeviceId> Device::PointerDevice(const void* ptr) {
#if defined(SHARDKIT_WITH_CUDA)
  if (ptr == nullptr || CudaDeviceCountImpl() == 0) return std::nullopt;
  std::optional<int> index = CudaPointerDevice(ptr);
  if (index.has_value()) return DeviceId::Cuda(*index);
#else
  (void)ptr;
#endif
  return std::nullopt;
}

StatusOr<void*> Device::AllocatePinnedHost(size_t bytes) {
  if (bytes == 0) return nullptr;
#if defined(SHARDKIT_WITH_CUDA)
  if (CudaDeviceCountImpl() == 0) {
    return UnavailableError("pinned host memory needs a CUDA device; none is usable here");
  }
  return CudaAllocatePinnedHost(bytes);
#else
  return UnavailableError("pinned host memory needs CUDA: shardkit was built without --config=cuda");
#endif
}

void Device::FreePinnedHost(void* ptr) {
#if defined(SHARDKIT_WITH_CUDA)
  if (ptr != nullptr) CudaFreePinnedHost(ptr);
#else
  (void)ptr;
#endif
}

StatusOr<std::unique_ptr<Stream>> Device::WrapNativeStream(void* /*native*/, std::string_view name) {
  return InvalidArgumentError("stream '" + std::string(name) + "': " + id().ToString() +
                              " has no native streams to wrap (a caller stream there is one "
                              "this device creates: CreateStream)");
}

Status Device::ReleasePages(void* /*ptr*/, size_t /*bytes*/) {
  return UnimplementedError(id().ToString() + " cannot hand pages of its memory back (its "
                            "release_page_bytes is 0)");
}

Status Device::WaitStream(Stream& waiter, Stream& producer) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, CreateEvent(false));
  SK_RETURN_IF_ERROR(event->Record(producer));
  return waiter.WaitEvent(*event);
}

int Device::CudaDeviceCount() {
#if defined(SHARDKIT_WITH_CUDA)
  return CudaDeviceCountImpl();
#else
  return 0;
#endif
}

namespace {

std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

// Factories of device kinds implemented above this layer; guarded by RegistryMutex.
std::map<int, Device::Factory>& Factories() {
  static auto* factories = new std::map<int, Device::Factory>;
  return *factories;
}

}  // namespace

Status Device::RegisterFactory(DeviceKind kind, Factory factory) {
  if (kind == DeviceKind::kCpu || kind == DeviceKind::kCuda) {
    return InvalidArgumentError("RegisterFactory: " + DeviceId{kind, 0}.ToString() +
                                " devices are built in");
  }
  if (!factory) return InvalidArgumentError("RegisterFactory with a null factory");
  std::lock_guard<std::mutex> lock(RegistryMutex());
  if (!Factories().emplace(static_cast<int>(kind), std::move(factory)).second) {
    return AlreadyExistsError("a device factory for kind " +
                              std::to_string(static_cast<int>(kind)) + " is already registered");
  }
  return OkStatus();
}

StatusOr<DeviceCapabilities> Device::CapabilitiesOf(DeviceId id) {
  SK_ASSIGN_OR_RETURN(Device * device, Get(id));
  return device->capabilities();
}

StatusOr<Device*> Device::Get(DeviceId id) {
  // Devices live for the whole process: streams and allocators refer to them.
  static auto* devices = new std::map<std::pair<int, int>, std::unique_ptr<Device>>;
  if (id.index < 0) {
    return InvalidArgumentError("negative device index in " + id.ToString());
  }
  std::lock_guard<std::mutex> lock(RegistryMutex());
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
    default: {
      auto factory = Factories().find(static_cast<int>(id.kind));
      if (factory == Factories().end()) {
        if (id.is_sim()) {
          return UnavailableError(id.ToString() +
                                  ": sim devices come from //runtime/sim, which registers them "
                                  "(sim::SimDevice::Get); it is not linked or not yet used");
        }
        return InvalidArgumentError("unknown device kind " +
                                    std::to_string(static_cast<int>(id.kind)));
      }
      SK_ASSIGN_OR_RETURN(device, factory->second(id.index));
      if (device == nullptr || device->id() != id) {
        return InternalError("the device factory for " + id.ToString() +
                             " returned a device of another id");
      }
      break;
    }
  }
  Device* raw = device.get();
  devices->emplace(key, std::move(device));
  return raw;
}

}  // namespace sk
