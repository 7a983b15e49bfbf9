// The C ABI: a translation layer between shardkit.h and the runtime.
//
// Every entry point has the same shape: SK_API_BEGIN clears this thread's
// error and opens a try block; arguments are checked (live handles, non-null
// out-pointers, struct sizes, enum values) and translated into runtime types;
// the runtime does the work; results are written to out-parameters only after
// everything has succeeded; SK_API_END maps any escaping exception to a
// status. The library itself makes no decisions the runtime does not make:
// defaults for zero fields are the ABI's convention, everything else is
// validated again by the runtime.
#include "shardkit/shardkit.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/comm/gloo_backend.h"
#include "runtime/comm/local_backend.h"
#include "runtime/comm/network_model.h"
#include "runtime/comm/store.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/memory_estimator.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/trainer.h"

#define SK_SAME_CODE(c, k) \
  static_assert(static_cast<int>(c) == static_cast<int>(::sk::StatusCode::k), #c)
SK_SAME_CODE(SK_STATUS_OK, kOk);
SK_SAME_CODE(SK_STATUS_CANCELLED, kCancelled);
SK_SAME_CODE(SK_STATUS_UNKNOWN, kUnknown);
SK_SAME_CODE(SK_STATUS_INVALID_ARGUMENT, kInvalidArgument);
SK_SAME_CODE(SK_STATUS_DEADLINE_EXCEEDED, kDeadlineExceeded);
SK_SAME_CODE(SK_STATUS_NOT_FOUND, kNotFound);
SK_SAME_CODE(SK_STATUS_ALREADY_EXISTS, kAlreadyExists);
SK_SAME_CODE(SK_STATUS_PERMISSION_DENIED, kPermissionDenied);
SK_SAME_CODE(SK_STATUS_RESOURCE_EXHAUSTED, kResourceExhausted);
SK_SAME_CODE(SK_STATUS_FAILED_PRECONDITION, kFailedPrecondition);
SK_SAME_CODE(SK_STATUS_ABORTED, kAborted);
SK_SAME_CODE(SK_STATUS_OUT_OF_RANGE, kOutOfRange);
SK_SAME_CODE(SK_STATUS_UNIMPLEMENTED, kUnimplemented);
SK_SAME_CODE(SK_STATUS_INTERNAL, kInternal);
SK_SAME_CODE(SK_STATUS_UNAVAILABLE, kUnavailable);
SK_SAME_CODE(SK_STATUS_DATA_LOSS, kDataLoss);
#undef SK_SAME_CODE

// The enums the runtime shares with the ABI keep the same numbers.
static_assert(SK_SHARDING_HYBRID_SHARD_GRAD_OP ==
              static_cast<int>(sk::ShardingStrategy::kHybridShardGradOp));
static_assert(SK_SHARDING_FULL_SHARD == static_cast<int>(sk::ShardingStrategy::kFullShard));
static_assert(SK_BACKWARD_PREFETCH_POST == static_cast<int>(sk::BackwardPrefetch::kBackwardPost));
static_assert(SK_OPTIMIZER_ADAMW == static_cast<int>(sk::OptimizerKind::kAdamW));
static_assert(SK_DTYPE_F16 == static_cast<int>(sk::DType::kF16));
static_assert(SK_INIT_UNIFORM == static_cast<int>(sk::InitKind::kUniform));
static_assert(SK_PARALLELISM_FSDP == static_cast<int>(sk::Parallelism::kFsdp));
static_assert(SK_PARALLELISM_DDP == static_cast<int>(sk::Parallelism::kDdp));

// ---------------------------------------------------------------------------
// Handles. Each is registered while live so that a destroyed handle passed
// back in is reported instead of dereferenced.
// ---------------------------------------------------------------------------

struct sk_process_group {
  std::shared_ptr<sk::comm::ProcessGroup> group;
  std::string label;
};

struct sk_trainer {
  std::shared_ptr<sk::comm::ProcessGroup> group;  // outlives the trainer
  std::unique_ptr<sk::Trainer> trainer;
};

struct sk_local_session {
  std::vector<std::shared_ptr<sk::comm::ProcessGroup>> groups;
  std::vector<std::unique_ptr<sk::Trainer>> trainers;
  std::vector<sk::StepMetrics> last_metrics;  // empty before the first step
};

struct sk_model_spec {
  std::vector<sk::UnitSpec> units;
};

struct sk_engine {
  // Declaration order is destruction order reversed: views release their
  // buffers first, then the optimizer (its state lives in FSDP's allocator),
  // FSDP, the allocator, and last the group.
  std::shared_ptr<sk::comm::ProcessGroup> group;
  std::vector<sk::UnitSpec> units;
  std::unique_ptr<sk::CachingAllocator> allocator;
  std::unique_ptr<sk::FullyShardedModel> fsdp;
  std::unique_ptr<sk::Optimizer> optimizer;
  // Per unit: the views handed out since pre_forward/pre_backward, released
  // before the matching post call so FSDP can free the gathered buffers.
  std::vector<std::vector<sk::Tensor>> params;
  std::vector<std::vector<sk::Tensor>> grads;

  void ReleaseViews(int unit) {
    params[unit].clear();
    grads[unit].clear();
  }
  void ReleaseAllViews() {
    for (size_t u = 0; u < units.size(); ++u) ReleaseViews(static_cast<int>(u));
  }
};

namespace {

using sk::Status;
using sk::StatusOr;

// 65536: far above any struct this header will ever declare, small enough
// that a garbage size is caught before bytes are read.
constexpr size_t kMaxStructSize = 65536;

thread_local std::string t_last_error;

enum class HandleKind { kProcessGroup, kTrainer, kLocalSession, kModelSpec, kEngine };

template <typename T> struct HandleTraits;
template <> struct HandleTraits<sk_process_group> {
  static constexpr HandleKind kKind = HandleKind::kProcessGroup;
  static constexpr const char* kName = "sk_process_group";
};
template <> struct HandleTraits<sk_trainer> {
  static constexpr HandleKind kKind = HandleKind::kTrainer;
  static constexpr const char* kName = "sk_trainer";
};
template <> struct HandleTraits<sk_local_session> {
  static constexpr HandleKind kKind = HandleKind::kLocalSession;
  static constexpr const char* kName = "sk_local_session";
};
template <> struct HandleTraits<sk_model_spec> {
  static constexpr HandleKind kKind = HandleKind::kModelSpec;
  static constexpr const char* kName = "sk_model_spec";
};
template <> struct HandleTraits<sk_engine> {
  static constexpr HandleKind kKind = HandleKind::kEngine;
  static constexpr const char* kName = "sk_engine";
};

class HandleRegistry {
 public:
  static HandleRegistry& Get() {
    static HandleRegistry* r = new HandleRegistry();  // never destroyed: used at exit
    return *r;
  }
  void Add(const void* p, HandleKind k) {
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = k;
  }
  // True if `p` was live with kind `k` (and is now removed).
  bool Remove(const void* p, HandleKind k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end() || it->second != k) return false;
    live_.erase(it);
    return true;
  }
  bool IsLive(const void* p, HandleKind k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    return it != live_.end() && it->second == k;
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, HandleKind> live_;
};

template <typename T>
T* Register(std::unique_ptr<T> h) {
  T* p = h.release();
  HandleRegistry::Get().Add(p, HandleTraits<T>::kKind);
  return p;
}

template <typename T>
void Destroy(T* h) {
  if (h == nullptr) return;
  // Destroying a handle that is not live (twice, or never created) is
  // ignored: there is nothing safe to free.
  if (HandleRegistry::Get().Remove(h, HandleTraits<T>::kKind)) delete h;
}

template <typename T>
Status CheckHandle(const T* h, const char* arg) {
  if (h == nullptr) {
    return sk::InvalidArgumentError(std::string(arg) + " is NULL (expected a " +
                                    HandleTraits<T>::kName + ")");
  }
  if (!HandleRegistry::Get().IsLive(h, HandleTraits<T>::kKind)) {
    return sk::InvalidArgumentError(std::string(arg) + " is not a live " +
                                    HandleTraits<T>::kName + " (destroyed, or never created)");
  }
  return sk::OkStatus();
}

Status CheckOut(const void* p, const char* arg) {
  if (p == nullptr) return sk::InvalidArgumentError(std::string(arg) + " is NULL");
  return sk::OkStatus();
}

sk_status_t Fail(const Status& s) {
  t_last_error = std::string(s.message());
  return static_cast<sk_status_t>(s.code());
}
sk_status_t Fail(sk_status_t code, const std::string& message) {
  t_last_error = message;
  return code;
}

// The size of each struct in its first version: a caller's struct_size below
// this cannot come from any header and is rejected. Appending a field never
// changes these.
template <typename T> constexpr size_t kFirstVersionSize = sizeof(T);
// 0.1.0's sk_trainer_options ended at data_tokens; 0.2.0 appended parallelism.
template <> constexpr size_t kFirstVersionSize<sk_trainer_options> =
    offsetof(sk_trainer_options, parallelism);

// Copies a caller's option struct into `out` (zeroed, then the caller's
// bytes up to min(struct_size, sizeof)); `in` NULL leaves all defaults.
template <typename T>
Status ReadStruct(const T* in, const char* name, T* out) {
  std::memset(out, 0, sizeof(T));
  out->struct_size = sizeof(T);
  if (in == nullptr) return sk::OkStatus();
  const size_t size = in->struct_size;
  if (size < kFirstVersionSize<T>) {
    return sk::InvalidArgumentError(std::string(name) + ".struct_size is " + std::to_string(size) +
                                    ", smaller than any version of the struct (" +
                                    std::to_string(kFirstVersionSize<T>) +
                                    "): initialise it with its _INIT macro");
  }
  if (size > kMaxStructSize) {
    return sk::InvalidArgumentError(std::string(name) + ".struct_size is " + std::to_string(size) +
                                    ", not a struct size (at most " +
                                    std::to_string(kMaxStructSize) + ")");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (size_t i = sizeof(T); i < size; ++i) {
    if (bytes[i] != 0) {
      return sk::InvalidArgumentError(
          std::string(name) + " has struct_size " + std::to_string(size) + " and sets fields beyond the " +
          std::to_string(sizeof(T)) + " bytes this library (" SK_VERSION_STRING
          ") knows: it asks for options this version cannot honour");
    }
  }
  std::memcpy(out, in, std::min(size, sizeof(T)));
  out->struct_size = sizeof(T);
  return sk::OkStatus();
}

// Checks an output struct's struct_size (before any work is done).
template <typename T>
Status CheckOutStruct(const T* out, const char* name) {
  SK_RETURN_IF_ERROR(CheckOut(out, name));
  if (out->struct_size < kFirstVersionSize<T> || out->struct_size > kMaxStructSize) {
    return sk::InvalidArgumentError(std::string(name) + "->struct_size is " +
                                    std::to_string(out->struct_size) + "; expected at least " +
                                    std::to_string(kFirstVersionSize<T>) +
                                    " (initialise it with its _INIT macro)");
  }
  return sk::OkStatus();
}

// Writes `value` into the caller's struct: only the bytes both know; the
// caller's struct_size and any newer fields stay as they were.
template <typename T>
void WriteStruct(T* out, const T& value) {
  const size_t n = std::min(out->struct_size, sizeof(T));
  const size_t skip = sizeof(size_t);
  std::memcpy(reinterpret_cast<unsigned char*>(out) + skip,
              reinterpret_cast<const unsigned char*>(&value) + skip, n - skip);
}

Status CheckEnum(int value, int max, const char* field) {
  if (value < 0 || value > max) {
    return sk::InvalidArgumentError(std::string(field) + ": unknown value " + std::to_string(value) +
                                    " (expected 0.." + std::to_string(max) + ")");
  }
  return sk::OkStatus();
}

Status CheckString(const char* s, const char* arg) {
  if (s == nullptr) return sk::InvalidArgumentError(std::string(arg) + " is NULL");
  return sk::OkStatus();
}

// ---------------------------------------------------------------------------
// Options: the ABI's structs to the runtime's.
// ---------------------------------------------------------------------------

StatusOr<sk::Duration> TimeoutFrom(int64_t ms, const char* field) {
  if (ms < 0) return sk::InvalidArgumentError(std::string(field) + " must be >= 0 (0 = default)");
  return ms == 0 ? sk::kDefaultTimeout : sk::Duration(ms);
}

StatusOr<sk::FsdpOptions> ToFsdpOptions(const sk_fsdp_options* in) {
  sk_fsdp_options c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_fsdp_options", &c));
  SK_RETURN_IF_ERROR(CheckEnum(c.strategy, SK_SHARDING_HYBRID_SHARD_GRAD_OP, "sk_fsdp_options.strategy"));
  SK_RETURN_IF_ERROR(CheckEnum(c.backward_prefetch, SK_BACKWARD_PREFETCH_POST,
                               "sk_fsdp_options.backward_prefetch"));
  SK_RETURN_IF_ERROR(CheckEnum(c.param_dtype, SK_DTYPE_F16, "sk_fsdp_options.param_dtype"));
  SK_RETURN_IF_ERROR(CheckEnum(c.reduce_dtype, SK_DTYPE_F16, "sk_fsdp_options.reduce_dtype"));
  SK_RETURN_IF_ERROR(CheckEnum(c.buffer_dtype, SK_DTYPE_F16, "sk_fsdp_options.buffer_dtype"));
  if (c.all_gather_limit < -1) {
    return sk::InvalidArgumentError("sk_fsdp_options.all_gather_limit must be >= -1 (0 = 2, -1 = no limit)");
  }
  sk::FsdpOptions o;
  o.strategy = c.strategy == SK_SHARDING_DEFAULT ? sk::ShardingStrategy::kFullShard
                                                 : static_cast<sk::ShardingStrategy>(c.strategy);
  o.shard_group_size = c.shard_group_size;
  o.backward_prefetch = c.backward_prefetch == SK_BACKWARD_PREFETCH_DEFAULT
                            ? sk::BackwardPrefetch::kBackwardPre
                            : static_cast<sk::BackwardPrefetch>(c.backward_prefetch);
  o.forward_prefetch = c.forward_prefetch != 0;
  o.all_gather_limit = c.all_gather_limit == 0 ? 2 : c.all_gather_limit == -1 ? 0 : c.all_gather_limit;
  o.mixed_precision.param_dtype =
      c.param_dtype == SK_DTYPE_DEFAULT ? sk::DType::kF32 : static_cast<sk::DType>(c.param_dtype);
  o.mixed_precision.reduce_dtype = static_cast<sk::DType>(c.reduce_dtype);
  o.mixed_precision.buffer_dtype = static_cast<sk::DType>(c.buffer_dtype);
  o.cpu_offload = c.cpu_offload != 0;
  o.gradient_predivide_factor = c.gradient_predivide_factor;
  o.seed = c.seed;
  SK_ASSIGN_OR_RETURN(o.timeout, TimeoutFrom(c.timeout_ms, "sk_fsdp_options.timeout_ms"));
  return o;
}

StatusOr<sk::OptimizerOptions> ToOptimizerOptions(const sk_optimizer_options* in) {
  sk_optimizer_options c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_optimizer_options", &c));
  SK_RETURN_IF_ERROR(CheckEnum(c.kind, SK_OPTIMIZER_ADAMW, "sk_optimizer_options.kind"));
  sk::OptimizerOptions o;
  o.kind = c.kind == SK_OPTIMIZER_DEFAULT ? sk::OptimizerKind::kAdamW
                                          : static_cast<sk::OptimizerKind>(c.kind);
  if (c.lr != 0.f) o.lr = c.lr;
  o.momentum = c.momentum;
  o.dampening = c.dampening;
  o.nesterov = c.nesterov != 0;
  if (c.beta1 != 0.f) o.beta1 = c.beta1;
  if (c.beta2 != 0.f) o.beta2 = c.beta2;
  if (c.eps != 0.f) o.eps = c.eps;
  o.weight_decay = c.weight_decay;
  SK_RETURN_IF_ERROR(sk::ValidateOptimizerOptions(o).WithContext("sk_optimizer_options"));
  return o;
}

StatusOr<sk::TrainerOptions> ToTrainerOptions(const sk_trainer_options* in) {
  if (in == nullptr) return sk::InvalidArgumentError("options is NULL (use SK_TRAINER_OPTIONS_INIT)");
  sk_trainer_options c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_trainer_options", &c));
  sk::TrainerOptions o;
  if (c.model != nullptr) o.model = c.model;
  SK_ASSIGN_OR_RETURN(o.fsdp, ToFsdpOptions(c.fsdp));
  SK_ASSIGN_OR_RETURN(o.optimizer, ToOptimizerOptions(c.optimizer));
  if (c.batch_size != 0) o.batch_size = c.batch_size;
  if (c.grad_accum_steps != 0) o.grad_accum_steps = c.grad_accum_steps;
  o.seq_len = c.seq_len;
  o.source_len = c.source_len;
  o.clip_grad_norm = c.clip_grad_norm;
  o.activation_checkpointing = c.activation_checkpointing != 0;
  o.memory_cap_bytes = static_cast<size_t>(c.memory_cap_bytes);
  if (c.data_path != nullptr) o.data_path = c.data_path;
  switch (c.data_token_bytes) {
    case 0:
    case 2: o.data_width = sk::TokenWidth::kUint16; break;
    case 4: o.data_width = sk::TokenWidth::kUint32; break;
    default:
      return sk::InvalidArgumentError("sk_trainer_options.data_token_bytes must be 2 or 4 (0 = 2), not " +
                                      std::to_string(c.data_token_bytes));
  }
  if (c.data_seed != 0) o.data_seed = c.data_seed;
  o.data_tokens = c.data_tokens;
  SK_RETURN_IF_ERROR(CheckEnum(c.parallelism, SK_PARALLELISM_DDP, "sk_trainer_options.parallelism"));
  o.parallelism = c.parallelism == SK_PARALLELISM_DEFAULT ? sk::Parallelism::kFsdp
                                                          : static_cast<sk::Parallelism>(c.parallelism);
  if (c.ddp_bucket_bytes < 0) {
    return sk::InvalidArgumentError("sk_trainer_options.ddp_bucket_bytes must be >= 0 (0 = 25 MiB)");
  }
  o.ddp_bucket_bytes = c.ddp_bucket_bytes;
  return o;
}

sk_memory_estimate ToMemoryEstimate(const sk::MemoryEstimate& e) {
  sk_memory_estimate c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.parameters = e.parameters;
  c.master_bytes = e.master_bytes;
  c.grad_shard_bytes = e.grad_shard_bytes;
  c.optimizer_bytes = e.optimizer_bytes;
  c.persistent_bytes = e.persistent_bytes;
  c.unsharded_bytes = e.unsharded_bytes;
  c.activation_bytes = e.activation_bytes;
  c.peak_bytes = e.peak_bytes;
  return c;
}

sk_step_metrics ToStepMetrics(const sk::StepMetrics& m, int rank) {
  sk_step_metrics c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.step = m.step;
  c.rank = rank;
  c.loss = m.loss;
  c.grad_norm = m.grad_norm;
  c.step_seconds = m.step_seconds;
  c.tokens_per_second = m.tokens_per_second;
  c.model_tflops_per_rank = m.model_tflops_per_rank;
  c.hardware_tflops_per_rank = m.hardware_tflops_per_rank;
  c.peak_allocated_bytes = m.peak_allocated_bytes;
  c.peak_reserved_bytes = m.peak_reserved_bytes;
  c.allocated_bytes = m.allocated_bytes;
  c.reserved_bytes = m.reserved_bytes;
  c.alloc_retries = m.alloc_retries;
  c.ooms = m.ooms;
  c.bytes_communicated = m.bytes_communicated;
  return c;
}

// ---------------------------------------------------------------------------
// Process groups and ranks as threads.
// ---------------------------------------------------------------------------

constexpr int32_t kMaxLocalWorld = 4096;

StatusOr<std::vector<std::shared_ptr<sk::comm::ProcessGroup>>> CreateLocalGroups(
    int32_t world_size, const char* network_model) {
  if (world_size < 1 || world_size > kMaxLocalWorld) {
    return sk::InvalidArgumentError("world_size must be in [1, " + std::to_string(kMaxLocalWorld) +
                                    "], not " + std::to_string(world_size));
  }
  std::optional<sk::comm::LinkModel> link;
  if (network_model != nullptr) {
    SK_ASSIGN_OR_RETURN(link, sk::comm::LinkModel::Parse(network_model));
  }
  SK_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<sk::comm::ProcessGroup>> ranks,
                      sk::comm::LocalProcessGroup::Create(world_size));
  std::vector<std::shared_ptr<sk::comm::ProcessGroup>> out;
  for (auto& r : ranks) {
    if (link) {
      SK_ASSIGN_OR_RETURN(std::unique_ptr<sk::comm::NetworkModelProcessGroup> w,
                          sk::comm::NetworkModelProcessGroup::Wrap(std::move(r), *link));
      out.push_back(std::move(w));
    } else {
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::unique_ptr<sk_process_group> MakeGroupHandle(std::shared_ptr<sk::comm::ProcessGroup> g) {
  auto h = std::make_unique<sk_process_group>();
  h->label = g->label();
  h->group = std::move(g);
  return h;
}

// Runs body(rank) on `n` new threads and waits for all. The lowest failing
// rank's status is returned, prefixed with its rank.
Status RunOnRankThreads(int n, const std::function<Status(int)>& body) {
  std::vector<Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        results[r] = body(r);
      } catch (const std::bad_alloc&) {
        results[r] = sk::ResourceExhaustedError("out of host memory (std::bad_alloc)");
      } catch (const std::exception& e) {
        results[r] = sk::InternalError(std::string("unexpected C++ exception: ") + e.what());
      } catch (...) {
        results[r] = sk::InternalError("unexpected C++ exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!results[r].ok()) return results[r].WithContext("rank " + std::to_string(r));
  }
  return sk::OkStatus();
}

// ---------------------------------------------------------------------------
// Low level.
// ---------------------------------------------------------------------------

Status CheckUnitIndex(const std::vector<sk::UnitSpec>& units, int32_t unit) {
  if (unit < 0 || static_cast<size_t>(unit) >= units.size()) {
    return sk::OutOfRangeError("unit " + std::to_string(unit) + " out of range (the model has " +
                               std::to_string(units.size()) + " units)");
  }
  return sk::OkStatus();
}

Status CheckParamIndex(const std::vector<sk::UnitSpec>& units, int32_t unit, int32_t param) {
  SK_RETURN_IF_ERROR(CheckUnitIndex(units, unit));
  const sk::UnitSpec& u = units[unit];
  if (param < 0 || static_cast<size_t>(param) >= u.params.size()) {
    return sk::OutOfRangeError("parameter " + std::to_string(param) + " out of range (unit '" +
                               u.name + "' has " + std::to_string(u.params.size()) + " parameters)");
  }
  return sk::OkStatus();
}

sk_tensor_view ViewOf(const sk::Tensor& t, const sk::ParamSpec& spec) {
  sk_tensor_view v;
  std::memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  v.data = t.data();
  v.dtype = static_cast<sk_dtype_t>(t.dtype());
  v.ndim = spec.shape.rank();
  v.shape = spec.shape.dims().data();
  v.numel = t.numel();
  return v;
}

// A hook call's result. FSDP reports a call out of order as
// FailedPrecondition and changes nothing; any other failure abandons the step
// (every unit back to idle, unsharded buffers dropped), so every view the
// caller holds is void then and its buffers are released.
Status HookResult(sk_engine* e, Status s) {
  if (!s.ok() && s.code() != sk::StatusCode::kFailedPrecondition) e->ReleaseAllViews();
  return s;
}

}  // namespace

// One try/catch pair around every entry point: no exception crosses the ABI.
#define SK_API_BEGIN \
  t_last_error.clear(); \
  try {
#define SK_API_END                                                                      \
  }                                                                                     \
  catch (const std::bad_alloc&) {                                                       \
    return Fail(SK_STATUS_RESOURCE_EXHAUSTED, "out of host memory (std::bad_alloc)");   \
  }                                                                                     \
  catch (const std::exception& e) {                                                     \
    return Fail(SK_STATUS_INTERNAL, std::string("unexpected C++ exception: ") + e.what()); \
  }                                                                                     \
  catch (...) {                                                                         \
    return Fail(SK_STATUS_INTERNAL, "unexpected C++ exception");                        \
  }
// For functions returning void (destroy): nothing to report, nothing escapes.
#define SK_API_VOID_BEGIN try {
#define SK_API_VOID_END \
  }                     \
  catch (...) {         \
  }

// Returns the status of `expr` from the entry point if it is not OK.
#define SK_CHECK(expr)                       \
  do {                                       \
    ::sk::Status sk_c_ = (expr);             \
    if (!sk_c_.ok()) return Fail(sk_c_);     \
  } while (0)
#define SK_ASSIGN_OR_FAIL(lhs, expr)                         \
  SK_ASSIGN_OR_FAIL_IMPL(SK_STATUS_CONCAT(sk_api_, __LINE__), lhs, expr)
#define SK_ASSIGN_OR_FAIL_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return Fail(tmp.status());    \
  lhs = std::move(tmp).value()

extern "C" {

// --- status and version ----------------------------------------------------

SK_EXPORT const char* sk_status_name(sk_status_t code) {
  switch (code) {
    case SK_STATUS_OK: return "OK";
    case SK_STATUS_CANCELLED: return "CANCELLED";
    case SK_STATUS_UNKNOWN: return "UNKNOWN";
    case SK_STATUS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case SK_STATUS_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case SK_STATUS_NOT_FOUND: return "NOT_FOUND";
    case SK_STATUS_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case SK_STATUS_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case SK_STATUS_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case SK_STATUS_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case SK_STATUS_ABORTED: return "ABORTED";
    case SK_STATUS_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case SK_STATUS_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case SK_STATUS_INTERNAL: return "INTERNAL";
    case SK_STATUS_UNAVAILABLE: return "UNAVAILABLE";
    case SK_STATUS_DATA_LOSS: return "DATA_LOSS";
  }
  return "UNKNOWN_CODE";
}

SK_EXPORT const char* sk_last_error_message(void) { return t_last_error.c_str(); }

SK_EXPORT const char* sk_version(void) { return SK_VERSION_STRING; }

SK_EXPORT int32_t sk_version_number(void) { return SK_VERSION_NUMBER; }

// --- parsing -------------------------------------------------------------------

SK_EXPORT sk_status_t sk_parse_sharding_strategy(const char* name, sk_sharding_strategy_t* out) {
  SK_API_BEGIN
  SK_CHECK(CheckString(name, "name"));
  SK_CHECK(CheckOut(out, "out"));
  SK_ASSIGN_OR_FAIL(sk::ShardingStrategy s, sk::ParseShardingStrategy(name));
  *out = static_cast<sk_sharding_strategy_t>(s);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_parse_backward_prefetch(const char* name, sk_backward_prefetch_t* out) {
  SK_API_BEGIN
  SK_CHECK(CheckString(name, "name"));
  SK_CHECK(CheckOut(out, "out"));
  SK_ASSIGN_OR_FAIL(sk::BackwardPrefetch p, sk::ParseBackwardPrefetch(name));
  *out = static_cast<sk_backward_prefetch_t>(p);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_parse_dtype(const char* name, sk_dtype_t* out) {
  SK_API_BEGIN
  SK_CHECK(CheckString(name, "name"));
  SK_CHECK(CheckOut(out, "out"));
  SK_ASSIGN_OR_FAIL(sk::DType d, sk::ParseDType(name));
  *out = static_cast<sk_dtype_t>(d);
  return SK_STATUS_OK;
  SK_API_END
}

// --- process groups ----------------------------------------------------------

SK_EXPORT sk_status_t sk_process_group_create_local(int32_t world_size, const char* network_model,
                                                    sk_process_group** out_groups) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_groups, "out_groups"));
  SK_ASSIGN_OR_FAIL(auto groups, CreateLocalGroups(world_size, network_model));
  std::vector<std::unique_ptr<sk_process_group>> handles;
  for (auto& g : groups) handles.push_back(MakeGroupHandle(std::move(g)));
  for (size_t r = 0; r < handles.size(); ++r) out_groups[r] = Register(std::move(handles[r]));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_create_gloo(const sk_gloo_options* options,
                                                   sk_process_group** out_group) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_group, "out_group"));
  sk_gloo_options c;
  SK_CHECK(ReadStruct(options, "sk_gloo_options", &c));
  sk::comm::GlooOptions go;
  if (c.hostname != nullptr) go.hostname = c.hostname;
  SK_ASSIGN_OR_FAIL(go.timeout, TimeoutFrom(c.timeout_ms, "sk_gloo_options.timeout_ms"));
  go.check_desync = c.check_desync != 0;
  std::optional<sk::comm::LinkModel> link;
  if (c.network_model != nullptr) {
    SK_ASSIGN_OR_FAIL(link, sk::comm::LinkModel::Parse(c.network_model));
  }
  std::unique_ptr<sk::comm::ProcessGroup> group;
  if (c.world_size == 0) {
    SK_ASSIGN_OR_FAIL(group, sk::comm::GlooProcessGroup::CreateFromEnvironment(go));
  } else {
    if (c.world_size < 0 || c.rank < 0 || c.rank >= c.world_size) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  "sk_gloo_options: rank " + std::to_string(c.rank) + " is not in [0, world_size " +
                      std::to_string(c.world_size) + ")");
    }
    if (c.master_addr == nullptr || c.master_port <= 0 || c.master_port > 65535) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  "sk_gloo_options: master_addr and master_port (1..65535) are required when "
                  "world_size is set");
    }
    SK_ASSIGN_OR_FAIL(std::unique_ptr<sk::comm::TcpStore> store,
                      sk::comm::TcpStore::Create(c.master_addr, c.master_port, c.rank == 0, go.timeout));
    SK_ASSIGN_OR_FAIL(group, sk::comm::GlooProcessGroup::Create(
                                 std::shared_ptr<sk::comm::Store>(std::move(store)), "world", c.rank,
                                 c.world_size, go));
  }
  if (link) {
    SK_ASSIGN_OR_FAIL(group, sk::comm::NetworkModelProcessGroup::Wrap(std::move(group), *link));
  }
  *out_group = Register(MakeGroupHandle(std::move(group)));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_process_group_destroy(sk_process_group* group) {
  SK_API_VOID_BEGIN
  Destroy(group);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_process_group_rank(const sk_process_group* group, int32_t* out_rank) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(group, "group"));
  SK_CHECK(CheckOut(out_rank, "out_rank"));
  *out_rank = group->group->rank();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_size(const sk_process_group* group, int32_t* out_size) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(group, "group"));
  SK_CHECK(CheckOut(out_size, "out_size"));
  *out_size = group->group->size();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_process_group_label(const sk_process_group* group, const char** out_label) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(group, "group"));
  SK_CHECK(CheckOut(out_label, "out_label"));
  *out_label = group->label.c_str();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_run_local_ranks(int32_t world_size, const char* network_model,
                                         sk_rank_fn fn, void* user_data) {
  SK_API_BEGIN
  if (fn == nullptr) return Fail(SK_STATUS_INVALID_ARGUMENT, "fn is NULL");
  SK_ASSIGN_OR_FAIL(auto groups, CreateLocalGroups(world_size, network_model));
  std::vector<sk_process_group*> handles;
  for (auto& g : groups) handles.push_back(Register(MakeGroupHandle(std::move(g))));
  Status s = RunOnRankThreads(world_size, [&](int r) -> Status {
    sk_status_t code = fn(r, handles[r], user_data);
    if (code == SK_STATUS_OK) return sk::OkStatus();
    return Status(static_cast<sk::StatusCode>(code),
                  std::string("callback returned ") + sk_status_name(code) +
                      (t_last_error.empty() ? "" : ": " + t_last_error));
  });
  for (sk_process_group* h : handles) Destroy(h);
  SK_CHECK(s);
  return SK_STATUS_OK;
  SK_API_END
}

// --- trainer -----------------------------------------------------------------

SK_EXPORT sk_status_t sk_trainer_create(const sk_trainer_options* options, sk_process_group* group,
                                        sk_trainer** out_trainer) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(group, "group"));
  SK_CHECK(CheckOut(out_trainer, "out_trainer"));
  SK_ASSIGN_OR_FAIL(sk::TrainerOptions o, ToTrainerOptions(options));
  auto h = std::make_unique<sk_trainer>();
  h->group = group->group;
  SK_ASSIGN_OR_FAIL(h->trainer, sk::Trainer::Create(o, h->group.get()));
  *out_trainer = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_trainer_destroy(sk_trainer* trainer) {
  SK_API_VOID_BEGIN
  Destroy(trainer);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_trainer_step(sk_trainer* trainer, sk_step_metrics* out_metrics) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(trainer, "trainer"));
  if (out_metrics != nullptr) SK_CHECK(CheckOutStruct(out_metrics, "out_metrics"));
  SK_ASSIGN_OR_FAIL(sk::StepMetrics m, trainer->trainer->Step());
  if (out_metrics != nullptr) WriteStruct(out_metrics, ToStepMetrics(m, trainer->trainer->rank()));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_evaluate(sk_trainer* trainer, int32_t batches, float* out_loss) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(trainer, "trainer"));
  SK_CHECK(CheckOut(out_loss, "out_loss"));
  SK_ASSIGN_OR_FAIL(float loss, trainer->trainer->Evaluate(batches));
  *out_loss = loss;
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_num_parameters(const sk_trainer* trainer, int64_t* out_count) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(trainer, "trainer"));
  SK_CHECK(CheckOut(out_count, "out_count"));
  *out_count = trainer->trainer->model().num_parameters();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_model_num_parameters(const char* model, int64_t* out_count) {
  SK_API_BEGIN
  SK_CHECK(CheckString(model, "model"));
  SK_CHECK(CheckOut(out_count, "out_count"));
  SK_ASSIGN_OR_FAIL(std::unique_ptr<sk::Model> m, sk::CreateModel(std::string(model)));
  *out_count = m->num_parameters();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_save_checkpoint(sk_trainer* trainer, const char* dir) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(trainer, "trainer"));
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(trainer->trainer->SaveCheckpoint(dir));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_trainer_load_checkpoint(sk_trainer* trainer, const char* dir,
                                                 int64_t* out_step) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(trainer, "trainer"));
  SK_CHECK(CheckString(dir, "dir"));
  SK_CHECK(trainer->trainer->LoadCheckpoint(dir));
  if (out_step != nullptr) *out_step = trainer->trainer->steps();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_estimate_memory(const sk_trainer_options* options, int32_t world_size,
                                         sk_memory_estimate* out) {
  SK_API_BEGIN
  SK_CHECK(CheckOutStruct(out, "out"));
  SK_ASSIGN_OR_FAIL(sk::TrainerOptions o, ToTrainerOptions(options));
  SK_CHECK(sk::ValidateTrainerOptions(o));
  sk::MemoryEstimateRequest r;
  r.ddp = o.parallelism == sk::Parallelism::kDdp;
  SK_ASSIGN_OR_FAIL(r.model, sk::FindModelConfig(o.model));
  r.fsdp = o.fsdp;
  r.optimizer = o.optimizer;
  r.world_size = world_size;
  r.batch_size = o.batch_size;
  r.seq_len = o.seq_len;
  r.source_len = o.source_len;
  r.activation_checkpointing = o.activation_checkpointing;
  SK_ASSIGN_OR_FAIL(sk::MemoryEstimate e, sk::EstimatePeakMemory(r));
  WriteStruct(out, ToMemoryEstimate(e));
  return SK_STATUS_OK;
  SK_API_END
}

// --- local session -----------------------------------------------------------

SK_EXPORT sk_status_t sk_local_session_create(const sk_trainer_options* options, int32_t world_size,
                                              const char* network_model,
                                              sk_local_session** out_session) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_session, "out_session"));
  SK_ASSIGN_OR_FAIL(sk::TrainerOptions o, ToTrainerOptions(options));
  auto h = std::make_unique<sk_local_session>();
  SK_ASSIGN_OR_FAIL(h->groups, CreateLocalGroups(world_size, network_model));
  // Validation is the same on every rank, so a bad option fails all ranks
  // before any of them waits in a collective.
  SK_CHECK(sk::ValidateTrainerOptions(o));
  SK_CHECK(sk::ValidateFsdpOptions(o.fsdp, world_size));
  h->trainers.resize(static_cast<size_t>(world_size));
  SK_CHECK(RunOnRankThreads(world_size, [&](int r) -> Status {
    SK_ASSIGN_OR_RETURN(h->trainers[r], sk::Trainer::Create(o, h->groups[r].get()));
    return sk::OkStatus();
  }));
  *out_session = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_local_session_destroy(sk_local_session* session) {
  SK_API_VOID_BEGIN
  Destroy(session);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_local_session_step(sk_local_session* session, sk_step_metrics* out_rank0) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(session, "session"));
  if (out_rank0 != nullptr) SK_CHECK(CheckOutStruct(out_rank0, "out_rank0"));
  const int n = static_cast<int>(session->trainers.size());
  std::vector<sk::StepMetrics> metrics(static_cast<size_t>(n));
  SK_CHECK(RunOnRankThreads(n, [&](int r) -> Status {
    SK_ASSIGN_OR_RETURN(metrics[r], session->trainers[r]->Step());
    return sk::OkStatus();
  }));
  session->last_metrics = std::move(metrics);
  if (out_rank0 != nullptr) WriteStruct(out_rank0, ToStepMetrics(session->last_metrics[0], 0));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_metrics(const sk_local_session* session, int32_t rank,
                                               sk_step_metrics* out_metrics) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(session, "session"));
  SK_CHECK(CheckOutStruct(out_metrics, "out_metrics"));
  const int n = static_cast<int>(session->trainers.size());
  if (rank < 0 || rank >= n) {
    return Fail(SK_STATUS_OUT_OF_RANGE,
                "rank " + std::to_string(rank) + " out of range (world size " + std::to_string(n) + ")");
  }
  if (session->last_metrics.empty()) {
    return Fail(SK_STATUS_FAILED_PRECONDITION, "no step has completed yet (call sk_local_session_step)");
  }
  WriteStruct(out_metrics, ToStepMetrics(session->last_metrics[rank], rank));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_evaluate(sk_local_session* session, int32_t batches,
                                                float* out_loss) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(session, "session"));
  SK_CHECK(CheckOut(out_loss, "out_loss"));
  const int n = static_cast<int>(session->trainers.size());
  std::vector<float> losses(static_cast<size_t>(n));
  SK_CHECK(RunOnRankThreads(n, [&](int r) -> Status {
    SK_ASSIGN_OR_RETURN(losses[r], session->trainers[r]->Evaluate(batches));
    return sk::OkStatus();
  }));
  double sum = 0;
  for (float l : losses) sum += l;  // rank order: the same bits every run
  *out_loss = static_cast<float>(sum / n);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_world_size(const sk_local_session* session,
                                                  int32_t* out_world_size) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(session, "session"));
  SK_CHECK(CheckOut(out_world_size, "out_world_size"));
  *out_world_size = static_cast<int32_t>(session->trainers.size());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_save_checkpoint(sk_local_session* session, const char* dir) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(session, "session"));
  SK_CHECK(CheckString(dir, "dir"));
  const std::string path = dir;
  const int n = static_cast<int>(session->trainers.size());
  SK_CHECK(RunOnRankThreads(n, [&](int r) { return session->trainers[r]->SaveCheckpoint(path); }));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_local_session_load_checkpoint(sk_local_session* session, const char* dir,
                                                       int64_t* out_step) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(session, "session"));
  SK_CHECK(CheckString(dir, "dir"));
  const std::string path = dir;
  const int n = static_cast<int>(session->trainers.size());
  SK_CHECK(RunOnRankThreads(n, [&](int r) { return session->trainers[r]->LoadCheckpoint(path); }));
  if (out_step != nullptr) *out_step = session->trainers[0]->steps();
  return SK_STATUS_OK;
  SK_API_END
}

// --- model spec --------------------------------------------------------------

SK_EXPORT sk_status_t sk_model_spec_create(sk_model_spec** out_spec) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_spec, "out_spec"));
  *out_spec = Register(std::make_unique<sk_model_spec>());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_model_spec_destroy(sk_model_spec* spec) {
  SK_API_VOID_BEGIN
  Destroy(spec);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_model_spec_add_unit(sk_model_spec* spec, const char* name, int32_t* out_unit) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(spec, "spec"));
  SK_CHECK(CheckString(name, "name"));
  if (name[0] == '\0') return Fail(SK_STATUS_INVALID_ARGUMENT, "unit name is empty");
  for (const sk::UnitSpec& u : spec->units) {
    if (u.name == name) {
      return Fail(SK_STATUS_INVALID_ARGUMENT, "a unit named '" + u.name + "' already exists");
    }
  }
  sk::UnitSpec u;
  u.name = name;
  spec->units.push_back(std::move(u));
  if (out_unit != nullptr) *out_unit = static_cast<int32_t>(spec->units.size() - 1);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_model_spec_add_param(sk_model_spec* spec, int32_t unit,
                                              const sk_param_spec* param, int32_t* out_param) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(spec, "spec"));
  SK_CHECK(CheckUnitIndex(spec->units, unit));
  if (param == nullptr) return Fail(SK_STATUS_INVALID_ARGUMENT, "param is NULL (use SK_PARAM_SPEC_INIT)");
  sk_param_spec c;
  SK_CHECK(ReadStruct(param, "sk_param_spec", &c));
  sk::UnitSpec& u = spec->units[unit];
  if (c.name == nullptr || c.name[0] == '\0') {
    return Fail(SK_STATUS_INVALID_ARGUMENT, "sk_param_spec.name is NULL or empty (unit '" + u.name + "')");
  }
  const std::string name = c.name;
  for (const sk::ParamSpec& p : u.params) {
    if (p.name == name) {
      return Fail(SK_STATUS_INVALID_ARGUMENT,
                  "unit '" + u.name + "' already has a parameter named '" + name + "'");
    }
  }
  const std::string where = "parameter '" + u.name + "." + name + "': ";
  if (c.ndim < 0 || c.ndim > SK_MAX_DIMS) {
    return Fail(SK_STATUS_INVALID_ARGUMENT, where + "ndim " + std::to_string(c.ndim) +
                                                " is not in [0, " + std::to_string(SK_MAX_DIMS) + "]");
  }
  if (c.ndim > 0 && c.shape == nullptr) {
    return Fail(SK_STATUS_INVALID_ARGUMENT, where + "shape is NULL while ndim is " + std::to_string(c.ndim));
  }
  SK_CHECK(CheckEnum(c.dtype, SK_DTYPE_F16, "sk_param_spec.dtype"));
  if (c.dtype != SK_DTYPE_DEFAULT && c.dtype != SK_DTYPE_F32) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                where + "dtype must be f32: master parameters are always f32 (choose the compute "
                        "precision with sk_fsdp_options.param_dtype)");
  }
  SK_CHECK(CheckEnum(c.init, SK_INIT_UNIFORM, "sk_param_spec.init"));
  std::vector<int64_t> dims(c.shape, c.shape + c.ndim);
  auto shape = sk::Shape::Make(dims);
  if (!shape.ok()) return Fail(shape.status().WithContext(where + "shape"));
  sk::ParamSpec p;
  p.name = name;
  p.shape = *shape;
  p.init.kind = c.init == SK_INIT_DEFAULT ? sk::InitKind::kZeros : static_cast<sk::InitKind>(c.init);
  p.init.a = c.init_a;
  p.init.b = c.init_b;
  if (p.init.kind == sk::InitKind::kZeros || p.init.kind == sk::InitKind::kOnes) p.init.a = p.init.b = 0.f;
  Status valid = sk::ValidateInitializer(p.init);
  if (!valid.ok()) return Fail(valid.WithContext(where + "initializer"));
  u.params.push_back(std::move(p));
  if (out_param != nullptr) *out_param = static_cast<int32_t>(u.params.size() - 1);
  return SK_STATUS_OK;
  SK_API_END
}

// --- engine ------------------------------------------------------------------

SK_EXPORT sk_status_t sk_engine_create(const sk_model_spec* spec, sk_process_group* group,
                                       const sk_engine_options* options, sk_engine** out_engine) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(spec, "spec"));
  SK_CHECK(CheckHandle(group, "group"));
  SK_CHECK(CheckOut(out_engine, "out_engine"));
  sk_engine_options c;
  SK_CHECK(ReadStruct(options, "sk_engine_options", &c));
  SK_ASSIGN_OR_FAIL(sk::FsdpOptions fo, ToFsdpOptions(c.fsdp));
  SK_ASSIGN_OR_FAIL(sk::OptimizerOptions oo, ToOptimizerOptions(c.optimizer));
  if (spec->units.empty()) return Fail(SK_STATUS_INVALID_ARGUMENT, "the model spec has no units");
  for (const sk::UnitSpec& u : spec->units) {
    if (u.params.empty()) {
      return Fail(SK_STATUS_INVALID_ARGUMENT, "unit '" + u.name + "' has no parameters");
    }
  }
  auto h = std::make_unique<sk_engine>();
  h->group = group->group;
  h->units = spec->units;
  SK_ASSIGN_OR_FAIL(sk::Device * device, sk::Device::Get(sk::DeviceId::Cpu(h->group->rank())));
  sk::CachingAllocator::Options ao;
  ao.capacity_bytes = static_cast<size_t>(c.memory_cap_bytes);
  h->allocator = std::make_unique<sk::CachingAllocator>(device, ao);
  SK_ASSIGN_OR_FAIL(h->fsdp, sk::FullyShardedModel::Create(h->units, h->group.get(),
                                                           h->allocator.get(), fo));
  sk::Allocator& state = fo.cpu_offload ? static_cast<sk::Allocator&>(sk::HostAllocator::Default())
                                        : h->fsdp->activation_allocator();
  SK_ASSIGN_OR_FAIL(h->optimizer, sk::Optimizer::Create(oo, &state));
  h->params.resize(h->units.size());
  h->grads.resize(h->units.size());
  *out_engine = Register(std::move(h));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_engine_destroy(sk_engine* engine) {
  SK_API_VOID_BEGIN
  Destroy(engine);
  SK_API_VOID_END
}

SK_EXPORT sk_status_t sk_engine_num_units(const sk_engine* engine, int32_t* out_units) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckOut(out_units, "out_units"));
  *out_units = static_cast<int32_t>(engine->units.size());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_pre_forward(sk_engine* engine, int32_t unit) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckUnitIndex(engine->units, unit));
  StatusOr<std::vector<sk::Tensor>> params = engine->fsdp->PreForward(unit);
  if (!params.ok()) return Fail(HookResult(engine, params.status()));
  engine->params[unit] = std::move(params).value();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_post_forward(sk_engine* engine, int32_t unit) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckUnitIndex(engine->units, unit));
  engine->ReleaseViews(unit);
  SK_CHECK(HookResult(engine, engine->fsdp->PostForward(unit)));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_pre_backward(sk_engine* engine, int32_t unit) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckUnitIndex(engine->units, unit));
  StatusOr<sk::UnitBackwardBuffers> buffers = engine->fsdp->PreBackward(unit);
  if (!buffers.ok()) return Fail(HookResult(engine, buffers.status()));
  engine->params[unit] = std::move(buffers->params);
  engine->grads[unit] = std::move(buffers->grads);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_post_backward(sk_engine* engine, int32_t unit) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckUnitIndex(engine->units, unit));
  engine->ReleaseViews(unit);
  SK_CHECK(HookResult(engine, engine->fsdp->PostBackward(unit)));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_param(sk_engine* engine, int32_t unit, int32_t param,
                                      sk_tensor_view* out_view) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckParamIndex(engine->units, unit, param));
  SK_CHECK(CheckOutStruct(out_view, "out_view"));
  const std::vector<sk::Tensor>& held = engine->params[unit];
  if (held.empty()) {
    return Fail(SK_STATUS_FAILED_PRECONDITION,
                "unit '" + engine->units[unit].name +
                    "' has no gathered parameters now: they are readable between "
                    "sk_engine_pre_forward and sk_engine_post_forward, and between "
                    "sk_engine_pre_backward and sk_engine_post_backward");
  }
  WriteStruct(out_view, ViewOf(held[param], engine->units[unit].params[param]));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_grad(sk_engine* engine, int32_t unit, int32_t param,
                                     sk_tensor_view* out_view) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckParamIndex(engine->units, unit, param));
  SK_CHECK(CheckOutStruct(out_view, "out_view"));
  const std::vector<sk::Tensor>& held = engine->grads[unit];
  if (held.empty()) {
    return Fail(SK_STATUS_FAILED_PRECONDITION,
                "unit '" + engine->units[unit].name +
                    "' has no gradient buffers now: they exist between sk_engine_pre_backward "
                    "and sk_engine_post_backward");
  }
  WriteStruct(out_view, ViewOf(held[param], engine->units[unit].params[param]));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_set_gradient_sync(sk_engine* engine, int32_t enabled) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  engine->fsdp->set_gradient_sync(enabled != 0);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_finish_backward(sk_engine* engine) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(engine->fsdp->FinishBackward());
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_clip_grad_norm(sk_engine* engine, double max_norm, double* out_norm) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  if (!(max_norm >= 0)) {
    return Fail(SK_STATUS_INVALID_ARGUMENT, "max_norm must be >= 0 (0 = compute the norm only)");
  }
  SK_ASSIGN_OR_FAIL(double norm, engine->fsdp->ClipGradNorm(max_norm));
  if (out_norm != nullptr) *out_norm = norm;
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_optimizer_step(sk_engine* engine) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(engine->fsdp->OptimizerStep(*engine->optimizer));
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_zero_grad(sk_engine* engine) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  engine->fsdp->ZeroGrad();
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_engine_read_param(sk_engine* engine, int32_t unit, int32_t param, float* out,
                                           int64_t count) {
  SK_API_BEGIN
  SK_CHECK(CheckHandle(engine, "engine"));
  SK_CHECK(CheckParamIndex(engine->units, unit, param));
  SK_CHECK(CheckOut(out, "out"));
  const sk::ParamSpec& spec = engine->units[unit].params[param];
  if (count != spec.shape.numel()) {
    return Fail(SK_STATUS_INVALID_ARGUMENT,
                "count " + std::to_string(count) + " does not match parameter '" +
                    engine->units[unit].name + "." + spec.name + "' of shape " +
                    spec.shape.ToString() + " (" + std::to_string(spec.shape.numel()) + " elements)");
  }
  SK_ASSIGN_OR_FAIL(sk::Tensor full, engine->fsdp->GatherFullParam(unit, param));
  std::memcpy(out, full.data(), static_cast<size_t>(count) * sizeof(float));
  return SK_STATUS_OK;
  SK_API_END
}

}  // extern "C"
