#include "runtime/comm/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <cuda_runtime.h>
#include <nccl.h>

#include "runtime/comm/gloo_backend.h"  // DistributedEnv
#include "runtime/core/dtype.h"

namespace sk::comm {

namespace {

using Clock = std::chrono::steady_clock;

Status NcclError(ncclResult_t r, const std::string& what) {
  std::string msg = what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return InvalidArgumentError(msg);
  return UnavailableError(msg);
}

#define SK_NCCL_RETURN(expr, what)                      \
  do {                                                  \
    ncclResult_t sk_nccl_r_ = (expr);                   \
    if (sk_nccl_r_ != ncclSuccess && sk_nccl_r_ != ncclInProgress) { \
      return NcclError(sk_nccl_r_, what);               \
    }                                                   \
  } while (0)

#define SK_CUDA_RETURN_COMM(expr, what)                                              \
  do {                                                                               \
    cudaError_t sk_cuda_e_ = (expr);                                                 \
    if (sk_cuda_e_ != cudaSuccess) {                                                 \
      return UnavailableError(std::string(what) + ": " + cudaGetErrorString(sk_cuda_e_)); \
    }                                                                                \
  } while (0)

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32:
    case DType::kF64:
    case DType::kInvalid: break;
  }
  return ncclFloat32;  // validated by ProcessGroup before we get here
}

}  // namespace

// One non-blocking communicator and the scratch a barrier reduces.
class NcclComm {
 public:
  static StatusOr<std::unique_ptr<NcclComm>> Init(const ncclUniqueId& id, int rank, int size,
                                                  int device, Duration timeout) {
    SK_CUDA_RETURN_COMM(cudaSetDevice(device), "cudaSetDevice");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    SK_NCCL_RETURN(ncclCommInitRankConfig(&comm, size, id, rank, &config), "ncclCommInitRankConfig");
    std::unique_ptr<NcclComm> c(new NcclComm(comm, device));
    SK_RETURN_IF_ERROR(c->WaitReady(timeout, "communicator creation"));
    SK_CUDA_RETURN_COMM(cudaMalloc(&c->barrier_scratch_, sizeof(float)), "cudaMalloc");
    return c;
  }

  // A communicator that was never shut down (failed creation) is aborted.
  ~NcclComm() {
    if (!closed_) Abort();
    if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
  }

  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }
  float* barrier_scratch() const { return static_cast<float*>(barrier_scratch_); }

  // Polls a non-blocking communicator until its last call is no longer in
  // progress; aborts it on timeout so nothing is left half-done.
  Status WaitReady(Duration timeout, const std::string& what) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      SK_NCCL_RETURN(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return OkStatus();
      if (state != ncclInProgress) return NcclError(state, what);
      if (Clock::now() >= deadline) {
        Abort();
        return DeadlineExceededError("nccl " + what + " did not finish within " +
                                     std::to_string(timeout.count()) + " ms; communicator aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ != nullptr && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
  }
  bool aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  // Finalize (flushes outstanding work), then destroy; abort if it hangs.
  void Shutdown(Duration timeout) {
    closed_ = true;
    cudaSetDevice(device_);
    if (aborted()) return;  // ncclCommAbort already released it
    ncclResult_t r = ncclCommFinalize(comm_);
    bool finalized = (r == ncclSuccess || r == ncclInProgress) && WaitReady(timeout, "finalize").ok();
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      Abort();  // no-op if WaitReady already aborted on its timeout
    }
  }

 private:
  NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {}

  ncclComm_t comm_;
  const int device_;
  void* barrier_scratch_ = nullptr;
  mutable std::mutex mu_;
  bool aborted_ = false;
  bool closed_ = false;
};

StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::Create(std::shared_ptr<Store> store,
                                                                     std::string prefix, int rank,
                                                                     int size, int device_index,
                                                                     NcclOptions options) {
  if (store == nullptr) return InvalidArgumentError("nccl group needs a store");
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("nccl group: rank " + std::to_string(rank) +
                                " is not in a group of size " + std::to_string(size));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || device_index < 0 || device_index >= devices) {
    return UnavailableError("nccl group: cuda:" + std::to_string(device_index) +
                            " is not a usable GPU (" + std::to_string(devices) + " found)");
  }
  const std::string key = prefix + "/nccl_unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    SK_NCCL_RETURN(ncclGetUniqueId(&id), "ncclGetUniqueId");
    SK_RETURN_IF_ERROR(store->Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    SK_ASSIGN_OR_RETURN(std::string bytes, store->Get(key, options.timeout));
    if (bytes.size() != sizeof(id)) return InternalError("nccl group: malformed unique id in store");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> comm,
                      NcclComm::Init(id, rank, size, device_index, options.timeout));
  return std::unique_ptr<NcclProcessGroup>(new NcclProcessGroup(
      rank, size, device_index, std::move(comm), std::move(store), std::move(prefix), options));
}

StatusOr<std::unique_ptr<NcclProcessGroup>> NcclProcessGroup::CreateFromEnvironment(
    NcclOptions options) {
  SK_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnv::FromEnvironment());
  SK_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store,
                      TcpStore::Create(env.master_addr, env.master_port, env.rank == 0,
                                       options.timeout));
  return Create(std::shared_ptr<Store>(std::move(store)), "nccl_world", env.rank, env.world_size,
                env.local_rank, options);
}

NcclProcessGroup::NcclProcessGroup(int rank, int size, int device_index,
                                   std::unique_ptr<NcclComm> comm, std::shared_ptr<Store> store,
                                   std::string prefix, NcclOptions options)
    : ProcessGroup(rank, size), device_index_(device_index), comm_(std::move(comm)),
      store_(std::move(store)), prefix_(std::move(prefix)), options_(options) {}

NcclProcessGroup::~NcclProcessGroup() { comm_->Shutdown(options_.timeout); }

Status NcclProcessGroup::CheckAsyncError() const {
  if (comm_->aborted()) return UnavailableError("nccl communicator was aborted");
  ncclResult_t state = ncclSuccess;
  SK_NCCL_RETURN(ncclCommGetAsyncError(comm_->get(), &state), "ncclCommGetAsyncError");
  if (state != ncclSuccess && state != ncclInProgress) return NcclError(state, "nccl async error");
  return OkStatus();
}

void NcclProcessGroup::Abort() { comm_->Abort(); }

StatusOr<std::unique_ptr<ProcessGroup>> NcclProcessGroup::NewGroup(const std::vector<int>& ranks,
                                                                   Duration timeout) {
  SK_RETURN_IF_ERROR(ValidateGroupRanks(ranks, size(), rank()));
  std::string key = RankList(ranks);
  int occurrence = 0;
  {
    std::lock_guard<std::mutex> lock(new_group_mu_);
    occurrence = new_group_counts_[key]++;
  }
  int sub_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
  NcclOptions options = options_;
  options.timeout = timeout;
  SK_ASSIGN_OR_RETURN(std::unique_ptr<NcclProcessGroup> group,
                      Create(store_, prefix_ + "/sub[" + key + "]#" + std::to_string(occurrence),
                             sub_rank, static_cast<int>(ranks.size()), device_index_, options));
  return std::unique_ptr<ProcessGroup>(std::move(group));
}

StatusOr<std::shared_ptr<Work>> NcclProcessGroup::Launch(Collective c, Stream& stream) {
  if (!stream.device().is_cuda() || stream.device().index != device_index_) {
    return Invalid("the nccl group of cuda:" + std::to_string(device_index_) +
                   " cannot run on stream '" + stream.name() + "' of " + stream.device().ToString());
  }
  SK_RETURN_IF_ERROR(CheckAsyncError());
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  ncclComm_t comm = comm_->get();
  SK_CUDA_RETURN_COMM(cudaSetDevice(device_index_), "cudaSetDevice");

  // One pre-multiplied sum per dtype folds pre_scale, post_scale and AVG.
  std::vector<ncclRedOp_t> custom_ops;
  auto reduce_op = [&](DType dtype, ncclRedOp_t* op) -> Status {
    const float factor = c.pre_scale * c.post_scale;
    if (factor == 1.0f) {
      *op = c.op == ReduceOp::kAvg ? ncclAvg : ncclSum;
      return OkStatus();
    }
    float scalar = c.op == ReduceOp::kAvg ? factor / static_cast<float>(size()) : factor;
    uint16_t half_bits = dtype == DType::kBF16 ? FloatToBF16(scalar).bits : FloatToF16(scalar).bits;
    void* p = dtype == DType::kF32 ? static_cast<void*>(&scalar) : static_cast<void*>(&half_bits);
    SK_NCCL_RETURN(ncclRedOpCreatePreMulSum(op, p, NcclType(dtype), ncclScalarHostImmediate, comm),
                   "ncclRedOpCreatePreMulSum");
    custom_ops.push_back(*op);
    return OkStatus();
  };

  Status launched;
  SK_NCCL_RETURN(ncclGroupStart(), "ncclGroupStart");
  for (size_t e = 0; e < c.outputs.size() && launched.ok(); ++e) {
    const Tensor& in = c.inputs[e];
    const Tensor& out = c.outputs[e];
    const ncclDataType_t type = NcclType(out.dtype());
    ncclResult_t r = ncclSuccess;
    ncclRedOp_t op = ncclSum;
    switch (c.kind) {
      case CollectiveKind::kAllGather:
        r = ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), type, comm, s);
        break;
      case CollectiveKind::kReduceScatter:
        launched = reduce_op(out.dtype(), &op);
        if (launched.ok()) {
          r = ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(out.numel()), type, op,
                                comm, s);
        }
        break;
      case CollectiveKind::kAllReduce:
        launched = reduce_op(out.dtype(), &op);
        if (launched.ok()) {
          r = ncclAllReduce(out.data(), out.data(), static_cast<size_t>(out.numel()), type, op,
                            comm, s);
        }
        break;
      case CollectiveKind::kBroadcast:
        r = ncclBroadcast(out.data(), out.data(), static_cast<size_t>(out.numel()), type, c.root,
                          comm, s);
        break;
      case CollectiveKind::kBarrier:
        break;
    }
    if (r != ncclSuccess && r != ncclInProgress) launched = NcclError(r, c.Describe());
  }
  if (c.kind == CollectiveKind::kBarrier) {
    ncclResult_t r = ncclAllReduce(comm_->barrier_scratch(), comm_->barrier_scratch(), 1,
                                   ncclFloat32, ncclSum, comm, s);
    if (r != ncclSuccess && r != ncclInProgress) launched = NcclError(r, c.Describe());
  }
  ncclResult_t end = ncclGroupEnd();
  if (launched.ok() && end != ncclSuccess && end != ncclInProgress) {
    launched = NcclError(end, "ncclGroupEnd for " + c.Describe());
  }
  if (launched.ok()) launched = comm_->WaitReady(options_.timeout, "enqueue of " + c.Describe());
  for (ncclRedOp_t op : custom_ops) ncclRedOpDestroy(op, comm);
  SK_RETURN_IF_ERROR(launched);

  SK_ASSIGN_OR_RETURN(Device * device, Device::Get(stream.device()));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Event> event, device->CreateEvent());
  auto work = std::make_shared<Work>("nccl rank " + std::to_string(rank()) + ": " + c.Describe(),
                                     std::move(event));
  SK_RETURN_IF_ERROR(work->mutable_event().Record(stream));
  return work;
}

}  // namespace sk::comm
