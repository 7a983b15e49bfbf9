#include "runtime/ops/cuda/cudnn_attention.h"
#include "runtime/core/env.h"
#include "runtime/ops/cuda/handle_pool.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

// The frontend's dynamic loading reads the library handle from here
// (cudnn_frontend_shim.h: "cudnn package initialization set this global").
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace sk::ops::cuda {

namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorAttr = fe::graph::Tensor_attributes;

// Tensor uids of the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

// libcudnn.so.9 opened once: OK, or why not (the message of every later call).
struct Library {
  Status status;
  int64_t version = 0;
};

const Library& Loaded() {
  static const Library lib = [] {
    Library l;
    if (const char* env = GetEnv(EnvVar::kCudnnAttention);
        env != nullptr && std::string_view(env) == "0") {
      l.status = UnavailableError("cuDNN attention is turned off (SK_CUDNN_ATTENTION=0)");
      return l;
    }
    // RTLD_GLOBAL: cuDNN 9 opens its engine libraries (libcudnn_engines_*,
    // libcudnn_graph) from its own directory, which must be on the
    // library path (tools/gpu/libpath.sh adds a Python wheel's).
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* err = dlerror();
      l.status = UnavailableError(std::string("cannot load libcudnn.so.9: ") +
                                  (err != nullptr ? err : "unknown dlopen error"));
      return l;
    }
    fe::cudnn_dlhandle = h;
    using VersionFn = size_t (*)();
    auto version = reinterpret_cast<VersionFn>(dlsym(h, "cudnnGetVersion"));
    if (version == nullptr) {
      l.status = UnavailableError("libcudnn.so.9 has no cudnnGetVersion");
      return l;
    }
    l.version = static_cast<int64_t>(version());
    if (l.version < 90000) {
      l.status = UnavailableError("cuDNN " + std::to_string(l.version) +
                                  " is older than 9, which fused SDPA backward needs");
    }
    return l;
  }();
  return lib;
}

Status FeStatus(fe::error_t e, const char* step) {
  if (e.is_good()) return OkStatus();
  return UnavailableError(std::string("cuDNN SDPA ") + step + ": " + e.get_message());
}

#define SK_FE(step, expr) SK_RETURN_IF_ERROR(FeStatus((expr), step))

fe::DataType_t FeType(DType t) {
  return t == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

std::vector<int64_t> V(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }

std::shared_ptr<TensorAttr> Input(Graph& g, const char* name, Uid uid, const SdpaTensorLayout& l) {
  return g.tensor(TensorAttr().set_name(name).set_uid(uid).set_dim(V(l.dim)).set_stride(V(l.stride)));
}

void Output(const std::shared_ptr<TensorAttr>& t, Uid uid, const SdpaTensorLayout& l) {
  t->set_output(true).set_uid(uid).set_dim(V(l.dim)).set_stride(V(l.stride));
}

// The process's cuDNN handles, lent to the threads that run attention
// (handle_pool.h: a thread keeps its handle while it lives and gives it
// back when it exits, so the graphs built on it serve the next thread too;
// never destroyed).
ThreadHandlePool<cudnnHandle_t>& Handles() {
  static auto* pool = new ThreadHandlePool<cudnnHandle_t>([](int d) -> StatusOr<cudnnHandle_t> {
    if (cudaSetDevice(d) != cudaSuccess) {
      cudaGetLastError();
      return UnavailableError("cudnnCreate: cuda:" + std::to_string(d) + " cannot be made current");
    }
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t st = fe::detail::create_handle(&h);
    if (st != CUDNN_STATUS_SUCCESS) {
      return UnavailableError(std::string("cudnnCreate failed: ") + fe::detail::get_error_string(st));
    }
    return h;
  });
  return *pool;
}
StatusOr<cudnnHandle_t> Handle(int device) { return Handles().Get(device); }

// The graph of `p`, built on `h`: SDPA forward with its statistics (the
// log-sum-exp per row), or SDPA backward from them; f32 softmax and
// accumulation; causal = top-left diagonal (key j <= query i).
StatusOr<std::shared_ptr<Graph>> Build(const SdpaPlan& p, cudnnHandle_t h) {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(FeType(p.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = Input(*g, "q", kQ, p.q);
  auto k = Input(*g, "k", kK, p.k);
  auto v = Input(*g, "v", kV, p.v);
  if (!p.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("flash_attention_fwd")
                       .set_generate_stats(true)
                       .set_attn_scale(p.scale);
    if (p.shape.causal) options.set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, k, v, options);
    Output(o, kO, p.o);
    Output(stats, kStats, p.stats);
    stats->set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = Input(*g, "o", kO, p.o);
    auto dout = Input(*g, "dout", kDout, p.dout);
    auto stats = Input(*g, "stats", kStats, p.stats);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("flash_attention_bwd")
                       .set_attn_scale(p.scale);
    if (p.shape.causal) options.set_causal_mask(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
    Output(dq, kDq, p.dq);
    Output(dk, kDk, p.dk);
    Output(dv, kDv, p.dv);
  }
  SK_FE("validate", g->validate());
  SK_FE("build_operation_graph", g->build_operation_graph(h));
  SK_FE("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A}));
  SK_FE("check_support", g->check_support(h));
  SK_FE("build_plans", g->build_plans(h));
  return g;
}

// Built graphs by handle (a plan is built on a handle and executed only
// with it; handles are pooled per device, so a graph serves every thread
// that is later lent its handle) and plan key; failures are cached too, so
// an unsupported shape is tried once per handle.
struct Cache {
  std::mutex mu;
  std::map<std::pair<cudnnHandle_t, std::string>, StatusOr<std::shared_ptr<Graph>>> graphs;
};
Cache& Graphs() {
  static Cache* cache = new Cache;  // lives for the process: ops may run at exit
  return *cache;
}

// Runs the plan's graph on ctx.stream with `pack`. Holds the cache's lock
// while it builds and enqueues (a graph is executed by one thread at a time).
Status Execute(const OpContext& ctx, const SdpaPlan& p, std::unordered_map<int64_t, void*>& pack,
               const Tensor& workspace) {
  SK_RETURN_IF_ERROR(CudnnAvailable());
  const int device = ctx.device->id().index;
  SK_ASSIGN_OR_RETURN(cudnnHandle_t h, Handle(device));
  const cudnnStatus_t st =
      fe::detail::set_stream(h, static_cast<cudaStream_t>(ctx.stream->native_handle()));
  if (st != CUDNN_STATUS_SUCCESS) {
    return UnavailableError(std::string("cudnnSetStream failed: ") + fe::detail::get_error_string(st));
  }
  Cache& cache = Graphs();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto key = std::make_pair(h, p.CacheKey());
  auto it = cache.graphs.find(key);
  if (it == cache.graphs.end()) it = cache.graphs.emplace(key, Build(p, h)).first;
  if (!it->second.ok()) return it->second.status();
  const std::shared_ptr<Graph>& g = *it->second;
  int64_t bytes = 0;
  SK_FE("get_workspace_size", g->get_workspace_size(bytes));
  Tensor extra;  // when the declared workspace is short of what this plan asks
  void* ws = workspace.defined() ? workspace.data() : nullptr;
  if (bytes > 0 && (!workspace.defined() || static_cast<int64_t>(workspace.nbytes()) < bytes)) {
    SK_ASSIGN_OR_RETURN(extra, ctx.alloc->Empty(DType::kF32, Shape{(bytes + 3) / 4}));
    ws = extra.data();
  }
  SK_FE("execute", g->execute(h, pack, ws));
  return OkStatus();
}

}  // namespace

Status CudnnAvailable(int64_t* version) {
  const Library& lib = Loaded();
  if (version != nullptr) *version = lib.version;
  return lib.status;
}

int CudnnHandlesCreated(int device) { return Handles().created(device); }

Status CudnnSdpaForward(const OpContext& ctx, const SdpaPlan& plan, const void* q, const void* k,
                        const void* v, void* out, float* lse) {
  try {
    std::unordered_map<int64_t, void*> pack = {
        {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)},
        {kO, out}, {kStats, lse}};
    return Execute(ctx, plan, pack, Tensor());
  } catch (const std::exception& e) {
    return UnavailableError(std::string("cuDNN SDPA forward threw: ") + e.what());
  }
}

Status CudnnSdpaBackward(const OpContext& ctx, const SdpaPlan& plan, const void* q, const void* k,
                         const void* v, const void* out, const void* dout, const float* lse,
                         void* dq, void* dk, void* dv, const Tensor& workspace) {
  try {
    std::unordered_map<int64_t, void*> pack = {
        {kQ, const_cast<void*>(q)},       {kK, const_cast<void*>(k)},
        {kV, const_cast<void*>(v)},       {kO, const_cast<void*>(out)},
        {kDout, const_cast<void*>(dout)}, {kStats, const_cast<float*>(lse)},
        {kDq, dq},                        {kDk, dk},
        {kDv, dv}};
    return Execute(ctx, plan, pack, workspace);
  } catch (const std::exception& e) {
    return UnavailableError(std::string("cuDNN SDPA backward threw: ") + e.what());
  }
}

}  // namespace sk::ops::cuda
