// DeviceId: which device a tensor or stream lives on. A plain value; the
// device layer (runtime/device) gives it streams and events. DeviceCapabilities:
// what a kind of device can do, which the runtime asks instead of the kind.
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

// What a device does differently, asked instead of its kind: code outside
// the device layer (runtime/device) and the backends never tests
// is_cpu()/is_sim() or compares with a DeviceKind constant
// (tests/device:kind_checks_test fails where it does). A new kind says what
// it can do in KindCapabilities, and the rest of the runtime follows. The
// defaults describe a GPU: ops are enqueued on streams and run later, memory
// is the device's, time is the wall clock.
struct DeviceCapabilities {
  // An op runs to completion on the calling thread when it is issued, not
  // enqueued on its context's stream (cpu). Nothing then waits for the
  // compute stream (it holds no pending work) and memory an op used is free
  // when it returns (no record_stream); host work that must be ordered with
  // a stream's collectives is enqueued on it as a closure (Stream::Enqueue).
  bool ops_run_when_issued = false;
  // Its memory is the host's, read and written by the calling thread (cpu).
  bool host_memory = false;
  // Its clocks are virtual (sim): work is priced, not run, and wall-clock
  // traces of it mean nothing. Its tensors hold no data, and its ranks are
  // one process's stand-ins on a simulated process group.
  bool virtual_time = false;
  // Its streams are a driver's native streams (cudaStream_t on cuda), so a
  // caller's own native stream can be wrapped (WrapNativeStream) and work
  // ordered with it.
  bool native_streams = false;
  // Its linear-memory attention (ops::FlashAttentionForward/Backward) masks
  // packed documents (AttentionShape::key_start) inside the kernel, so a
  // packed call needs no memory its unpacked shape would not (cpu; sim,
  // priced as the CPU's). Without it (cuda: cuDNN's SDPA as shardkit calls
  // it takes no per-query document mask) a packed call runs the composed
  // attention with its probabilities in a temporary of that call
  // (ops::ComposedAttentionTemporaryBytes), which memory estimates count.
  bool masked_fused_attention = false;

  // Derived: its memory is its own, not the host's, and holds data (cuda):
  // host buffers reach it by copies (staged), and a pointer into it is the
  // device's (Device::PointerDevice).
  bool device_memory() const { return !host_memory && !virtual_time; }
};

// What every device of `kind` can do, known before one exists (options are
// checked before their device is made): the one place a kind's capabilities
// are stated. cpu: ops run when issued, host memory, masked fused attention;
// cuda: native streams; sim: virtual time, masked fused attention. An unknown
// kind: the defaults. Device::capabilities() is this for the device's kind.
DeviceCapabilities KindCapabilities(DeviceKind kind);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_CORE_DEVICE_KIND_H_
