#include "runtime/core/device_kind.h"

namespace sk {

DeviceCapabilities KindCapabilities(DeviceKind kind) {
  DeviceCapabilities c;
  switch (kind) {
    case DeviceKind::kCpu:
      c.ops_run_when_issued = true;
      c.host_memory = true;
      c.masked_fused_attention = true;
      break;
    case DeviceKind::kCuda:
      c.native_streams = true;
      break;
    case DeviceKind::kSim:
      c.virtual_time = true;
      c.masked_fused_attention = true;
      break;
  }
  return c;
}

}  // namespace sk
