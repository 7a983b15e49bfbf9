// gpu_ops.h in a build without --config=cuda: there is no device, and every
// operation says so instead of pretending to run.
#include "runtime/nn/cuda/gpu_ops.h"

namespace sk {
namespace gpu {
namespace {

Status NoCuda() {
  return UnavailableError("shardkit was built without CUDA (build with --config=cuda)");
}

}  // namespace

int CudaDeviceCount(std::string* reason) {
  if (reason) *reason = "shardkit was built without CUDA (build with --config=cuda)";
  return 0;
}

Status Gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
            int64_t, float, float*, int64_t, void*) {
  return NoCuda();
}
Status GeluForward(const float*, int64_t, float*, void*) { return NoCuda(); }
Status GeluBackward(const float*, const float*, int64_t, float*, void*) { return NoCuda(); }
Status LayerNormForward(const float*, const float*, const float*, int64_t, int64_t, float*, float*,
                        float*, void*) {
  return NoCuda();
}
Status LayerNormBackward(const float*, const float*, const float*, const float*, const float*,
                         int64_t, int64_t, float*, float*, float*, void*) {
  return NoCuda();
}
Status SoftmaxRowsInPlace(float*, int64_t, int64_t, void*) { return NoCuda(); }
Status CrossEntropyForward(const float*, const int32_t*, int64_t, int64_t, float*, void*) {
  return NoCuda();
}
Status CrossEntropyBackward(const float*, const int32_t*, int64_t, int64_t, float, float*, void*) {
  return NoCuda();
}
Status AddBiasRows(float*, const float*, int64_t, int64_t, void*) { return NoCuda(); }
StatusOr<void*> Malloc(size_t) { return NoCuda(); }
void Free(void*) {}
Status CopyToDevice(void*, const void*, size_t) { return NoCuda(); }
Status CopyToHost(void*, const void*, size_t) { return NoCuda(); }
Status Synchronize() { return NoCuda(); }

}  // namespace gpu
}  // namespace sk
