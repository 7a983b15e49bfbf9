#include "runtime/ops/cuda/cuda_backend.h"

#include "runtime/ops/cuda/backend_common.h"

namespace sk::ops {

OpBackend* CudaOpBackend() {
  static CudaBackend* backend = new CudaBackend();
  return backend;
}

namespace {

// The backend registers itself for DeviceKind::kCuda when this library is
// loaded (//runtime/ops:cuda is alwayslink; built under --config=cuda only),
// so the dispatcher includes no backend. Nothing here touches the GPU: a
// machine without one has the backend registered and no cuda device.
[[maybe_unused]] const bool kRegistered = (RegisterOpBackend(DeviceKind::kCuda, CudaOpBackend()), true);

}  // namespace

}  // namespace sk::ops
