// The 0.6.0 C ABI on GPUs, one process per rank over an NCCL group, through
// libshardkit.so and shardkit.h only (what a framework's backend calls):
//
//   launch --nproc_per_node=2 --share_gpu=0 --master_port=0 capi_nccl_check
//
//   1. the caller collectives on device buffers of the group's GPU:
//      sk_process_group_all_reduce (SUM, MEAN, MAX; f32 and bf16),
//      _broadcast from the last rank, _all_gather and _barrier, each result
//      checked element by element on the host; a host buffer is refused
//      with INVALID_ARGUMENT (the header: "a buffer of the other kind");
//   2. an engine on the GPU over the group whose optimizer is the caller's
//      own: two steps of Lion (Chen et al. 2023) through
//      sk_engine_begin_custom_step .. _end_custom_step, on the master,
//      gradient and state shards, which must be device pointers of the
//      engine's GPU (cudaPointerGetAttributes); the parameters read back
//      must equal Lion applied on the host to the initial parameters and
//      the mean of the ranks' gradients.
//
// Prints "PASS ..." or "FAIL ..." per part (tools/gpu/nccl_suite.sh's
// summary collects them) and exits 1 on a failure, 2 outside a launcher.
// Without --config=cuda, or without a visible GPU, it says it was skipped
// and exits 0.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shardkit/shardkit.h"

#if defined(SHARDKIT_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

#if defined(SHARDKIT_WITH_CUDA)

int g_rank = 0;
int g_failures = 0;

void Fail(const std::string& what) {
  std::printf("[rank %d] FAIL %s\n", g_rank, what.c_str());
  ++g_failures;
}

bool Ok(sk_status_t s, const char* call) {
  if (s == SK_STATUS_OK) return true;
  Fail(std::string(call) + ": " + sk_status_name(s) + ": " + sk_last_error_message());
  return false;
}
#define OK(call) Ok((call), #call)

bool CudaOk(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return true;
  Fail(std::string(call) + ": " + cudaGetErrorString(e));
  return false;
}
#define CUDA_OK(call) CudaOk((call), #call)

bool IsDevicePointer(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of an unknown pointer
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

// bf16 of small integers is exact: the high half of the f32.
uint16_t ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float FromBF16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rank r's value of element i: small integers, exact in f32 and bf16 and
// in their sums over a few ranks.
float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 7) - 3); }

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  void* d = nullptr;
  if (!CUDA_OK(cudaMalloc(&d, host.size() * sizeof(T)))) return nullptr;
  if (!CUDA_OK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice))) return nullptr;
  return static_cast<T*>(d);
}

template <typename T>
std::vector<T> HostCopy(const T* d, size_t n) {
  std::vector<T> h(n);
  CUDA_OK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

void CheckCollectives(sk_process_group* g, int rank, int world) {
  const int failures_before = g_failures;
  constexpr int64_t kCount = 1000;
  std::vector<float> mine(kCount);
  for (int64_t i = 0; i < kCount; ++i) mine[static_cast<size_t>(i)] = Value(rank, i);
  auto expect = [&](const char* what, const std::vector<float>& got, auto want_of) {
    for (int64_t i = 0; i < kCount; ++i) {
      const float want = want_of(i);
      if (got[static_cast<size_t>(i)] != want) {
        Fail(std::string(what) + ": element " + std::to_string(i) + " is " +
             std::to_string(got[static_cast<size_t>(i)]) + ", expected " + std::to_string(want));
        return;
      }
    }
  };
  auto sum_of = [&](int64_t i) {
    float s = 0;
    for (int r = 0; r < world; ++r) s += Value(r, i);
    return s;
  };
  const struct {
    sk_reduce_op_t op;
    const char* name;
  } ops[] = {{SK_REDUCE_SUM, "all_reduce SUM f32"},
             {SK_REDUCE_MEAN, "all_reduce MEAN f32"},
             {SK_REDUCE_MAX, "all_reduce MAX f32"}};
  for (const auto& o : ops) {
    float* d = DeviceCopy(mine);
    if (d == nullptr) return;
    if (OK(sk_process_group_all_reduce(g, d, kCount, SK_DTYPE_F32, o.op))) {
      expect(o.name, HostCopy(d, kCount), [&](int64_t i) {
        if (o.op == SK_REDUCE_SUM) return sum_of(i);
        if (o.op == SK_REDUCE_MEAN) return sum_of(i) / static_cast<float>(world);
        float m = Value(0, i);
        for (int r = 1; r < world; ++r) m = std::fmax(m, Value(r, i));
        return m;
      });
    }
    cudaFree(d);
  }
  {  // bf16 SUM
    std::vector<uint16_t> h(kCount);
    for (int64_t i = 0; i < kCount; ++i) h[static_cast<size_t>(i)] = ToBF16(mine[static_cast<size_t>(i)]);
    uint16_t* d = DeviceCopy(h);
    if (d != nullptr && OK(sk_process_group_all_reduce(g, d, kCount, SK_DTYPE_BF16, SK_REDUCE_SUM))) {
      std::vector<uint16_t> out = HostCopy(d, kCount);
      std::vector<float> got(kCount);
      for (int64_t i = 0; i < kCount; ++i) got[static_cast<size_t>(i)] = FromBF16(out[static_cast<size_t>(i)]);
      expect("all_reduce SUM bf16", got, sum_of);
    }
    cudaFree(d);
  }
  {  // broadcast from the last rank
    float* d = DeviceCopy(mine);
    if (d != nullptr && OK(sk_process_group_broadcast(g, d, kCount, SK_DTYPE_F32, world - 1))) {
      expect("broadcast", HostCopy(d, kCount), [&](int64_t i) { return Value(world - 1, i); });
    }
    cudaFree(d);
  }
  {  // all_gather
    float* in = DeviceCopy(mine);
    float* out = nullptr;
    if (in != nullptr && CUDA_OK(cudaMalloc(&out, sizeof(float) * kCount * world)) &&
        OK(sk_process_group_all_gather(g, in, out, kCount, SK_DTYPE_F32))) {
      const std::vector<float> all = HostCopy(out, static_cast<size_t>(kCount * world));
      for (int r = 0; r < world; ++r) {
        std::vector<float> part(all.begin() + r * kCount, all.begin() + (r + 1) * kCount);
        expect(("all_gather, rank " + std::to_string(r) + "'s part").c_str(), part,
               [&](int64_t i) { return Value(r, i); });
      }
    }
    cudaFree(in);
    cudaFree(out);
  }
  OK(sk_process_group_barrier(g));
  {  // host memory on an nccl group: refused on every rank alike
    std::vector<float> host = mine;
    const sk_status_t s = sk_process_group_all_reduce(g, host.data(), kCount, SK_DTYPE_F32, SK_REDUCE_SUM);
    if (s != SK_STATUS_INVALID_ARGUMENT) {
      Fail(std::string("all_reduce of a host buffer on an nccl group returned ") + sk_status_name(s) +
           " (" + sk_last_error_message() + "), expected INVALID_ARGUMENT");
    }
  }
  OK(sk_process_group_barrier(g));
  if (g_failures == failures_before) {
    std::printf("[rank %d] PASS caller collectives on device buffers (world %d)\n", rank, world);
  }
}

// Lion: c = b1 m + (1 - b1) g; p -= lr (sign(c) + wd p); m = b2 m + (1 - b2) g.
constexpr float kLr = 0.01f, kB1 = 0.9f, kB2 = 0.99f, kWd = 0.1f;

void Lion(float* p, float* m, const float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float c = kB1 * m[i] + (1.0f - kB1) * g[i];
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    p[i] -= kLr * (sign + kWd * p[i]);
    m[i] = kB2 * m[i] + (1.0f - kB2) * g[i];
  }
}

// fc.w [4, 5], fc.b [5]; ln.gain [5]: parameter (unit, index, numel).
struct ParamRef {
  int unit, param;
  int64_t numel;
};
constexpr ParamRef kParams[] = {{0, 0, 20}, {0, 1, 5}, {1, 0, 5}};
constexpr int kUnits = 2;

// Rank r's gradient of element i of parameter p in step s: multiples of
// 1/8, so the mean over ranks is exact.
float Grad(int rank, int p, int step, int64_t i) {
  return 0.125f * static_cast<float>(((rank + 1) * (i + 3 * p + step)) % 9 - 4);
}

sk_model_spec* Spec() {
  sk_model_spec* spec = nullptr;
  if (!OK(sk_model_spec_create(&spec))) return nullptr;
  int32_t fc = 0, ln = 0;
  const int64_t w_shape[2] = {4, 5}, v_shape[1] = {5};
  sk_param_spec p = SK_PARAM_SPEC_INIT;
  bool ok = OK(sk_model_spec_add_unit(spec, "fc", &fc)) && OK(sk_model_spec_add_unit(spec, "ln", &ln));
  p.name = "w";
  p.ndim = 2;
  p.shape = w_shape;
  p.init = SK_INIT_NORMAL;
  p.init_b = 1.0f;
  ok = ok && OK(sk_model_spec_add_param(spec, fc, &p, nullptr));
  p.name = "b";
  p.ndim = 1;
  p.shape = v_shape;
  ok = ok && OK(sk_model_spec_add_param(spec, fc, &p, nullptr));
  p.name = "gain";
  p.init = SK_INIT_ONES;
  p.init_b = 0.0f;
  ok = ok && OK(sk_model_spec_add_param(spec, ln, &p, nullptr));
  if (!ok) {
    sk_model_spec_destroy(spec);
    return nullptr;
  }
  return spec;
}

// One backward whose gradients are Grad(rank, ., step, .), written through
// the device pointers sk_engine_grad hands out.
bool Backward(sk_engine* e, int rank, int step) {
  if (!OK(sk_engine_zero_grad(e))) return false;
  for (int u = 0; u < kUnits; ++u) {
    if (!OK(sk_engine_pre_forward(e, u)) || !OK(sk_engine_post_forward(e, u))) return false;
  }
  for (int u = kUnits - 1; u >= 0; --u) {
    if (!OK(sk_engine_pre_backward(e, u))) return false;
    for (int p = 0; p < 3; ++p) {
      if (kParams[p].unit != u) continue;
      sk_tensor_view v = SK_TENSOR_VIEW_INIT;
      if (!OK(sk_engine_grad(e, u, kParams[p].param, &v))) return false;
      if (v.numel != kParams[p].numel || v.dtype != SK_DTYPE_F32 || !IsDevicePointer(v.data)) {
        Fail("sk_engine_grad(" + std::to_string(u) + ", " + std::to_string(kParams[p].param) +
             ") is not an f32 device buffer of " + std::to_string(kParams[p].numel) + " elements");
        return false;
      }
      std::vector<float> g(static_cast<size_t>(v.numel));
      for (int64_t i = 0; i < v.numel; ++i) g[static_cast<size_t>(i)] = Grad(rank, p, step, i);
      if (!CUDA_OK(cudaMemcpy(v.data, g.data(), g.size() * 4, cudaMemcpyHostToDevice))) return false;
    }
    if (!OK(sk_engine_post_backward(e, u))) return false;
  }
  return OK(sk_engine_finish_backward(e));
}

// The caller's Lion on the engine's shards, on the host through copies of
// the device views (what a framework's own kernel would read and write).
bool CustomLionStep(sk_engine* e) {
  if (!OK(sk_engine_begin_custom_step(e))) return false;
  bool ok = true;
  for (int u = 0; u < kUnits && ok; ++u) {
    sk_tensor_view mv = SK_TENSOR_VIEW_INIT, gv = SK_TENSOR_VIEW_INIT, sv = SK_TENSOR_VIEW_INIT;
    ok = OK(sk_engine_master_shard(e, u, &mv)) && OK(sk_engine_grad_shard(e, u, &gv)) &&
         OK(sk_engine_optimizer_state(e, u, 0, &sv));
    if (!ok) break;
    if (mv.numel != gv.numel || mv.numel != sv.numel) {
      Fail("unit " + std::to_string(u) + ": master, gradient and state shards differ in length");
      ok = false;
      break;
    }
    if (!IsDevicePointer(mv.data) || !IsDevicePointer(gv.data) || !IsDevicePointer(sv.data)) {
      Fail("unit " + std::to_string(u) + ": a custom-step view is not a device pointer on a cuda engine");
      ok = false;
      break;
    }
    if (mv.numel == 0) continue;
    const size_t n = static_cast<size_t>(mv.numel);
    std::vector<float> p = HostCopy(static_cast<float*>(mv.data), n);
    std::vector<float> m = HostCopy(static_cast<float*>(sv.data), n);
    const std::vector<float> g = HostCopy(static_cast<const float*>(gv.data), n);
    Lion(p.data(), m.data(), g.data(), mv.numel);
    ok = CUDA_OK(cudaMemcpy(mv.data, p.data(), n * 4, cudaMemcpyHostToDevice)) &&
         CUDA_OK(cudaMemcpy(sv.data, m.data(), n * 4, cudaMemcpyHostToDevice));
  }
  // End it even after a failure: a begun step left open refuses every later call.
  const sk_status_t end = sk_engine_end_custom_step(e);
  return ok && Ok(end, "sk_engine_end_custom_step(e)");
}

void CheckCustomStep(sk_process_group* g, int rank, int world) {
  const int failures_before = g_failures;
  sk_model_spec* spec = Spec();
  if (spec == nullptr) return;
  sk_optimizer_options opt = SK_OPTIMIZER_OPTIONS_INIT;
  opt.kind = SK_OPTIMIZER_SGD;  // one state tensor per unit: Lion's momentum
  opt.momentum = 0.9f;
  sk_device_options dev = SK_DEVICE_OPTIONS_INIT;
  dev.kind = SK_DEVICE_CUDA;
  sk_engine_options eo = SK_ENGINE_OPTIONS_INIT;
  eo.optimizer = &opt;
  eo.device = &dev;
  sk_engine* e = nullptr;
  if (!OK(sk_engine_create(spec, g, &eo, &e))) {
    sk_model_spec_destroy(spec);
    return;
  }
  // The expected parameters: Lion on the host over whole parameters (it is
  // elementwise, so sharding does not change it) from the initial values.
  std::vector<std::vector<float>> want(3), mom(3);
  bool ok = true;
  for (int p = 0; p < 3 && ok; ++p) {
    want[p].resize(static_cast<size_t>(kParams[p].numel));
    mom[p].assign(want[p].size(), 0.0f);
    ok = OK(sk_engine_read_param(e, kParams[p].unit, kParams[p].param, want[p].data(), kParams[p].numel));
  }
  for (int step = 0; step < 2 && ok; ++step) {
    ok = Backward(e, rank, step) && CustomLionStep(e);
    for (int p = 0; p < 3 && ok; ++p) {
      std::vector<float> mean(want[p].size());
      for (size_t i = 0; i < mean.size(); ++i) {
        float s = 0;
        for (int r = 0; r < world; ++r) s += Grad(r, p, step, static_cast<int64_t>(i));
        mean[i] = s / static_cast<float>(world);
      }
      Lion(want[p].data(), mom[p].data(), mean.data(), kParams[p].numel);
    }
  }
  for (int p = 0; p < 3 && ok; ++p) {
    std::vector<float> got(want[p].size());
    if (!OK(sk_engine_read_param(e, kParams[p].unit, kParams[p].param, got.data(), kParams[p].numel))) break;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::fabs(got[i] - want[p][i]) > 1e-6f * (1.0f + std::fabs(want[p][i]))) {
        Fail("custom Lion step: parameter " + std::to_string(p) + " element " + std::to_string(i) +
             " is " + std::to_string(got[i]) + ", expected " + std::to_string(want[p][i]));
        break;
      }
    }
  }
  int64_t steps = 0;
  if (OK(sk_engine_steps(e, &steps)) && steps != 2) {
    Fail("sk_engine_steps is " + std::to_string(steps) + " after two custom steps");
  }
  sk_engine_destroy(e);
  sk_model_spec_destroy(spec);
  if (g_failures == failures_before) {
    std::printf("[rank %d] PASS custom Lion step on device views of a cuda engine (world %d)\n", rank, world);
  }
}

#endif  // SHARDKIT_WITH_CUDA

int Main() {
#if !defined(SHARDKIT_WITH_CUDA)
  std::printf("capi_nccl_check: skipped (built without --config=cuda)\n");
  return 0;
#else
  if (std::getenv("RANK") == nullptr || std::getenv("WORLD_SIZE") == nullptr) {
    std::fprintf(stderr, "capi_nccl_check: RANK and WORLD_SIZE are not set (run it under launch)\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("capi_nccl_check: skipped (no CUDA device)\n");
    return 0;
  }
  sk_process_group* g = nullptr;
  if (!OK(sk_process_group_create_nccl(nullptr, &g))) return 1;
  int32_t rank = 0, world = 0;
  if (!OK(sk_process_group_rank(g, &rank)) || !OK(sk_process_group_size(g, &world))) return 1;
  g_rank = rank;
  // The group's GPU, chosen as sk_nccl_options documents (SK_CUDA_DEVICE,
  // which launch --share_gpu sets, else LOCAL_RANK, else 0): the test's own
  // buffers must live there.
  const char* dev = std::getenv("SK_CUDA_DEVICE");
  if (dev == nullptr) dev = std::getenv("LOCAL_RANK");
  if (!CUDA_OK(cudaSetDevice(dev != nullptr ? std::atoi(dev) : 0))) return 1;
  CheckCollectives(g, rank, world);
  CheckCustomStep(g, rank, world);
  sk_process_group_destroy(g);
  std::printf("[rank %d] capi_nccl_check: %s\n", rank, g_failures == 0 ? "passed" : "failed");
  return g_failures == 0 ? 0 : 1;
#endif
}

}  // namespace

int main() { return Main(); }
