// The CUDA implementation of Device, Stream and Event (see device.h). Built
// only under --config=cuda. It is thin: streams and events are the driver's.
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "runtime/core/trace.h"
#include "runtime/device/cpu_device.h"
#include "runtime/device/device.h"

namespace sk {

namespace {

Status CudaError(cudaError_t err, std::string_view what) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  std::string msg = std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  return InternalError(msg);
}

#define SK_CUDA_RETURN(expr)                                       \
  do {                                                             \
    cudaError_t sk_err_ = (expr);                                  \
    if (sk_err_ != cudaSuccess) return CudaError(sk_err_, #expr);  \
  } while (0)

std::atomic<int64_t> g_next_cuda_stream_id{1 << 20};

class CudaStream;

class CudaEvent final : public Event {
 public:
  CudaEvent(DeviceId device, cudaEvent_t event, bool timing)
      : device_(device), event_(event), timing_(timing) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  DeviceId device() const override { return device_; }
  Status Record(Stream& stream) override;
  bool Query() const override { return cudaEventQuery(event_) == cudaSuccess; }
  Status Synchronize(Duration timeout) const override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      cudaError_t err = cudaEventQuery(event_);
      if (err == cudaSuccess) return OkStatus();
      if (err != cudaErrorNotReady) return CudaError(err, "cudaEventQuery");
      if (std::chrono::steady_clock::now() > deadline) {
        return DeadlineExceededError("CUDA event not reached within " +
                                     std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  StatusOr<double> ElapsedMillis(const Event& end) const override {
    const CudaEvent* other = dynamic_cast<const CudaEvent*>(&end);
    if (other == nullptr) return InvalidArgumentError("ElapsedMillis between events of different devices");
    if (!timing_ || !other->timing_) {
      return FailedPreconditionError("ElapsedMillis needs two events created with timing");
    }
    float ms = 0;
    cudaError_t err = cudaEventElapsedTime(&ms, event_, other->event_);
    if (err != cudaSuccess) return CudaError(err, "cudaEventElapsedTime");
    return static_cast<double>(ms);
  }
  cudaEvent_t native() const { return event_; }

 private:
  DeviceId device_;
  cudaEvent_t event_;
  bool timing_;
};

class CudaStream final : public Stream {
 public:
  // `owned`: destroyed with this object (else a caller's stream, wrapped).
  CudaStream(DeviceId device, cudaStream_t stream, std::string name, bool owned = true)
      : device_(device), stream_(stream), id_(g_next_cuda_stream_id.fetch_add(1)),
        name_(std::move(name)), owned_(owned) {}
  ~CudaStream() override {
    if (!owned_) return;
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  DeviceId device() const override { return device_; }
  int64_t id() const override { return id_; }
  const std::string& name() const override { return name_; }

  Status Enqueue(std::function<Status()> fn) override {
    if (!fn) return InvalidArgumentError("Enqueue of an empty function on stream " + name_);
    auto* ctx = new HostFn{this, std::move(fn)};
    cudaError_t err = cudaLaunchHostFunc(stream_, &CudaStream::RunHostFn, ctx);
    if (err != cudaSuccess) {
      delete ctx;
      return CudaError(err, "cudaLaunchHostFunc");
    }
    return OkStatus();
  }

  Status WaitEvent(const Event& event) override {
    if (const auto* ce = dynamic_cast<const CudaEvent*>(&event)) {
      SK_CUDA_RETURN(cudaStreamWaitEvent(stream_, ce->native(), 0));
      return OkStatus();
    }
    if (event.Query()) return OkStatus();
    // A host event: block the stream (not the caller) on a driver thread.
    const Event* e = &event;
    auto wait = dynamic_cast<const CpuEvent*>(e) != nullptr
                    ? dynamic_cast<const CpuEvent*>(e)->WaitFunctionForCurrentRecord()
                    : std::function<Status(Duration)>([e](Duration t) { return e->Synchronize(t); });
    return Enqueue([wait]() { return wait(kDefaultTimeout); });
  }

  Status Synchronize(Duration timeout) override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) break;
      if (err != cudaErrorNotReady) return CudaError(err, "cudaStreamQuery on " + name_);
      if (std::chrono::steady_clock::now() > deadline) {
        return DeadlineExceededError("CUDA stream '" + name_ + "' did not finish within " +
                                     std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return error();
  }
  bool Query() const override { return cudaStreamQuery(stream_) == cudaSuccess; }
  Status error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  void ClearError() override {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = OkStatus();
  }
  void* native_handle() const override { return stream_; }

 private:
  struct HostFn {
    CudaStream* stream;
    std::function<Status()> fn;
  };
  static void CUDART_CB RunHostFn(void* p) {
    std::unique_ptr<HostFn> ctx(static_cast<HostFn*>(p));
    Status s = ctx->fn();
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(ctx->stream->mu_);
      if (ctx->stream->error_.ok()) ctx->stream->error_ = std::move(s);
    }
  }

  DeviceId device_;
  cudaStream_t stream_;
  int64_t id_;
  std::string name_;
  bool owned_;
  mutable std::mutex mu_;
  Status error_;
};

Status CudaEvent::Record(Stream& stream) {
  auto* cs = dynamic_cast<CudaStream*>(&stream);
  if (cs == nullptr) {
    return InvalidArgumentError("a CUDA event cannot be recorded on stream '" + stream.name() +
                                "' of " + stream.device().ToString());
  }
  SK_CUDA_RETURN(cudaEventRecord(event_, static_cast<cudaStream_t>(cs->native_handle())));
  return OkStatus();
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : id_(DeviceId::Cuda(index)) {}
  DeviceId id() const override { return id_; }

  StatusOr<std::unique_ptr<Stream>> CreateStream(std::string_view name) override {
    SK_CUDA_RETURN(cudaSetDevice(id_.index));
    cudaStream_t s;
    SK_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::unique_ptr<Stream>(new CudaStream(id_, s, std::string(name)));
  }
  StatusOr<std::unique_ptr<Stream>> WrapNativeStream(void* native, std::string_view name) override {
    if (native == nullptr) {
      return InvalidArgumentError("a NULL cudaStream_t (the legacy default stream, which "
                                  "synchronises with every other stream): pass a stream created "
                                  "with cudaStreamCreate");
    }
    int device = -1;
    cudaError_t err = cudaStreamGetDevice(static_cast<cudaStream_t>(native), &device);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return InvalidArgumentError(std::string("not a usable cudaStream_t (cudaStreamGetDevice: ") +
                                  cudaGetErrorName(err) + ")");
    }
    if (device != id_.index) {
      return InvalidArgumentError("the cudaStream_t is on cuda:" + std::to_string(device) +
                                  ", not on " + id_.ToString());
    }
    return std::unique_ptr<Stream>(
        new CudaStream(id_, static_cast<cudaStream_t>(native), std::string(name), /*owned=*/false));
  }
  StatusOr<std::unique_ptr<Event>> CreateEvent(bool enable_timing) override {
    SK_CUDA_RETURN(cudaSetDevice(id_.index));
    cudaEvent_t e;
    SK_CUDA_RETURN(cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault
                                                              : cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(id_, e, enable_timing));
  }
  StatusOr<void*> RawAllocate(size_t bytes) override {
    SK_CUDA_RETURN(cudaSetDevice(id_.index));
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) {
      return CudaError(err, "cudaMalloc of " + std::to_string(bytes) + " bytes on " + id_.ToString());
    }
    return p;
  }
  void RawFree(void* ptr, size_t /*bytes*/) override {
    cudaSetDevice(id_.index);
    cudaFree(ptr);
  }
  Status CopyAsync(void* dst, const void* src, size_t bytes, Stream& stream) override {
    if (bytes == 0) return OkStatus();
    if (dst == nullptr || src == nullptr) return InvalidArgumentError("CopyAsync with a null pointer");
    auto* cs = dynamic_cast<CudaStream*>(&stream);
    if (cs == nullptr) return InvalidArgumentError("CopyAsync on a CUDA device needs a CUDA stream");
    SK_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                   static_cast<cudaStream_t>(cs->native_handle())));
    return OkStatus();
  }

 private:
  DeviceId id_;
};

}  // namespace

int CudaDeviceCountImpl() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  // cudaErrorInsufficientDriver (35) and cudaErrorNoDevice (100) on machines
  // without a GPU: that is "no GPU", not a failure.
  if (err != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

StatusOr<void*> CudaAllocatePinnedHost(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return CudaError(err, "cudaHostAlloc of " + std::to_string(bytes) + " pinned bytes");
  }
  return p;
}

void CudaFreePinnedHost(void* ptr) { cudaFreeHost(ptr); }

std::optional<int> CudaPointerDevice(const void* ptr) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is host memory, not a sticky error
    return std::nullopt;
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return a.device;
  return std::nullopt;
}

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int index) {
  int n = CudaDeviceCountImpl();
  if (index >= n) {
    return UnavailableError("cuda:" + std::to_string(index) + " is not available (" +
                            std::to_string(n) + " CUDA devices found)");
  }
  return std::unique_ptr<Device>(new CudaDevice(index));
}

}  // namespace sk
