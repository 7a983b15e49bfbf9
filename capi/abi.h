// Internal to libshardkit.so: what every translation unit of the C ABI
// shares. The handles' definitions, the handle registry, reading and writing
// the ABI's versioned structs, errors, and the entry-point macros.
//
// Every entry point has the same shape: SK_API_BEGIN clears this thread's
// error and opens a try block; arguments are checked (live handles, non-null
// out-pointers, struct sizes, enum values) and translated into runtime types;
// the runtime does the work; results are written to out-parameters only after
// everything has succeeded; SK_API_END maps any escaping exception to a
// status. The library itself makes no decisions the runtime does not make:
// the ABI's zero fields mean "the runtime's default" and are translated in
// options.cc; everything else is validated by the runtime.
//
// The files: abi.cc (this support, status, version, parsing),
// options.cc (the option and result structs), process_group.cc,
// trainer.cc (trainer, memory estimate, local session), engine.cc (model
// spec and the low-level engine), plan.cc (the planner). Each translates
// and checks; the runtime decides (the local session is
// runtime/train/local_session.h, the estimate's mapping
// runtime/train/memory_estimate.h, the model spec's rules
// runtime/nn/model_spec.h).
#ifndef SHARDKIT_CAPI_ABI_H_
#define SHARDKIT_CAPI_ABI_H_

#include "shardkit/shardkit.h"
#include "capi/abi_layout.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "runtime/comm/caller_collectives.h"
#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/fsdp/memory_estimator.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/nn/model.h"
#include "runtime/nn/model_spec.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/engine.h"
#include "runtime/train/local_session.h"
#include "runtime/train/trainer.h"

// ---------------------------------------------------------------------------
// Handles. Each is registered while live so that a destroyed handle passed
// back in is reported instead of dereferenced.
// ---------------------------------------------------------------------------

struct sk_process_group {
  std::shared_ptr<sk::comm::ProcessGroup> group;
  std::string label;
  // The group's timeout (gloo/nccl options; the default for local groups):
  // what the caller's collectives wait for at most.
  sk::Duration timeout = sk::kDefaultTimeout;
  // The caller's collectives (sk_process_group_all_reduce, ...), made on
  // first use. Declared after `group`: destroyed before it.
  std::unique_ptr<sk::comm::CallerCollectives> collectives;
};

struct sk_trainer {
  std::shared_ptr<sk::comm::ProcessGroup> group;  // outlives the trainer
  std::unique_ptr<sk::Trainer> trainer;
};

struct sk_local_session {
  std::unique_ptr<sk::LocalSession> session;
};

struct sk_model_spec {
  sk::ModelSpecBuilder builder;
};

struct sk_engine {
  // Declared first, destroyed last: the engine uses the group until it is gone.
  std::shared_ptr<sk::comm::ProcessGroup> group;
  std::unique_ptr<sk::FsdpEngine> engine;
};

struct sk_stream {
  // Shared with every engine that uses it (they keep it alive).
  std::shared_ptr<sk::Stream> stream;
};

namespace sk::capi {

// 65536: far above any struct this header will ever declare, small enough
// that a garbage size is caught before bytes are read.
constexpr size_t kMaxStructSize = 65536;

// This thread's last error message (sk_last_error_message).
extern thread_local std::string t_last_error;

enum class HandleKind { kProcessGroup, kTrainer, kLocalSession, kModelSpec, kEngine, kStream, kPlanResult };

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
template <> struct HandleTraits<sk_stream> {
  static constexpr HandleKind kKind = HandleKind::kStream;
  static constexpr const char* kName = "sk_stream";
};
// Not opaque: the caller reads its fields. The library's storage around it
// is plan.cc's, which frees it (FreeHandle).
template <> struct HandleTraits<sk_plan_result> {
  static constexpr HandleKind kKind = HandleKind::kPlanResult;
  static constexpr const char* kName = "sk_plan_result";
};

// Frees a handle Register made live, once the registry says it may. A
// handle allocated inside a larger object (sk_plan_result) specialises it.
template <typename T>
void FreeHandle(T* h) {
  delete h;
}
template <> void FreeHandle<sk_plan_result>(sk_plan_result* h);

// Live handles, and which entry points are using each. A handle takes one
// call at a time (shardkit.h, "Threads"): a second thread's call while one
// runs is FailedPrecondition naming the handle and the call in progress,
// instead of two threads inside one Trainer (SIGSEGV) or one blocking on the
// other's collectives for minutes. Nothing here ever waits: a claim is
// granted or refused at once, so claims on several handles cannot deadlock.
//
// Three kinds of claim:
//  - exclusive (SK_USE_HANDLE), for the rest of one entry point: every call
//    that changes a handle or runs collectives on it;
//  - shared (SK_SHARE_HANDLE), for the rest of one entry point: a call that
//    several threads legitimately make on one handle at once, because it
//    only reads it (every rank's sk_engine_create copies the one model spec)
//    or the runtime object is thread-safe (a stream). Shared claims coexist;
//    an exclusive claim on another thread refuses them and they refuse it;
//  - a span (OpenSpan .. CloseSpan), begun by an entry point that holds the
//    handle exclusively and kept after it returns, until another entry point
//    closes it: sk_engine_begin_custom_step .. sk_engine_end_custom_step.
//    During a span the handle belongs to the thread that opened it: that
//    thread's calls go ahead, another thread's are refused naming the span.
// Nested calls on the thread that holds the handle (from a callback) are let
// through. A handle destroyed while a call uses it is unregistered at once
// (later calls: "not live") and freed when the last call using it returns;
// one destroyed during a span with no call running is freed at once.
class HandleRegistry { public:
  enum class Access { kExclusive, kShared };

  static HandleRegistry& Get();
  void Add(const void* p, HandleKind k);
  // True if `p` was live with kind `k` and may be freed now (it is removed
  // either way; while calls use it, the last of them frees it: Release).
  bool Remove(const void* p, HandleKind k);
  // Claims live handle `p` for `call` on this thread. InvalidArgument naming
  // `arg` if it is not live; FailedPrecondition naming `call`, `arg`, the
  // handle and the call (or span) in progress if another thread's claim
  // conflicts. `*nested` is true when this thread already held it
  // exclusively (Release must then not be called).
  Status Acquire(const void* p, HandleKind k, const char* kind_name, const char* arg, const char* call,
                 Access access, bool* nested);
  // Ends a claim Acquire granted. True if the handle was destroyed
  // meanwhile and this was its last use: the caller frees it.
  bool Release(const void* p, Access access);
  // While this thread holds `p` exclusively: keeps `p` this thread's after
  // the claim ends, until CloseSpan. `span` says what is open and what ends
  // it, for the messages of refused calls (a string literal).
  void OpenSpan(const void* p, const char* span);
  void CloseSpan(const void* p);

 private:
  struct SharedClaim {
    std::thread::id thread;
    const char* call;
  };
  struct Entry {
    HandleKind kind;
    const char* call = nullptr;       // the entry point holding it exclusively, or null
    const char* span = nullptr;       // the open span, or null
    std::thread::id owner;            // the thread of `call` and of `span`
    std::vector<SharedClaim> shared;  // one per shared claim
    bool destroyed = false;           // destroyed while in use: the last Release frees it
    bool in_use() const { return call != nullptr || !shared.empty(); }
  };
  // FailedPrecondition for `call` refused because of another thread's `e`.
  static Status Refusal(const Entry& e, const void* p, const char* kind_name, const char* arg,
                        const char* call);
  std::mutex mu_;
  std::unordered_map<const void*, Entry> live_;
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
  if (HandleRegistry::Get().Remove(h, HandleTraits<T>::kKind)) FreeHandle(h);
}

// InvalidArgument for a NULL handle argument `arg` of type T.
template <typename T>
Status NullHandleError(const char* arg) {
  return sk::InvalidArgumentError(std::string(arg) + " is NULL (expected a " + HandleTraits<T>::kName + ")");
}

// One claim on a handle for the rest of an entry point (SK_USE_HANDLE,
// SK_SHARE_HANDLE). status() is what Acquire said; a NULL handle is
// InvalidArgument unless `optional`, when it claims nothing and is OK.
template <typename T>
class HandleUse {
 public:
  using Access = HandleRegistry::Access;
  HandleUse(const T* h, const char* arg, const char* call, Access access, bool optional = false)
      : h_(h), access_(access) {
    if (h == nullptr) {
      if (!optional) status_ = NullHandleError<T>(arg);
      return;
    }
    status_ = HandleRegistry::Get().Acquire(h, HandleTraits<T>::kKind, HandleTraits<T>::kName, arg, call,
                                            access, &nested_);
    held_ = status_.ok() && !nested_;
  }
  ~HandleUse() {
    if (held_ && HandleRegistry::Get().Release(h_, access_)) FreeHandle(const_cast<T*>(h_));
  }
  HandleUse(const HandleUse&) = delete;
  HandleUse& operator=(const HandleUse&) = delete;
  const Status& status() const { return status_; }

 private:
  const T* h_;
  Access access_;
  Status status_;
  bool nested_ = false;
  bool held_ = false;
};

Status CheckOut(const void* p, const char* arg);

// Records `s`'s message as this thread's error and returns its code.
sk_status_t Fail(const Status& s);
sk_status_t Fail(sk_status_t code, const std::string& message);


// The size of each struct in its first version, from its SK_*_STRUCT_SIZE_V1
// trait in shardkit.h (capi/abi_layout.h): a caller's struct_size below
// this cannot come from any header and is rejected. Appending a field never
// changes it. A struct that is not in SK_VERSIONED_STRUCTS has none, and
// reading it does not compile.
template <typename T> struct FirstVersion;
#define SK_FIRST_VERSION(type, prefix)                                                  \
  template <> struct FirstVersion<type> {                                               \
    static constexpr size_t kSize = SK_VERSION_SIZE(type, prefix##_STRUCT_SIZE_V1); \
  };
SK_VERSIONED_STRUCTS(SK_FIRST_VERSION)
#undef SK_FIRST_VERSION
template <typename T> inline constexpr size_t kFirstVersionSize = FirstVersion<T>::kSize;

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
  // Every version of a struct ends on its alignment (struct_size is a
  // size_t); any other size would end inside a field and copy part of it
  // (a torn pointer, read as an address).
  if (size % alignof(T) != 0) {
    return sk::InvalidArgumentError(std::string(name) + ".struct_size is " + std::to_string(size) +
                                    ", not the size of any version of the struct (a multiple of " +
                                    std::to_string(alignof(T)) +
                                    "): initialise it with its _INIT macro");
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
  if (out->struct_size % alignof(T) != 0) {  // as ReadStruct: it would end inside a field
    return sk::InvalidArgumentError(std::string(name) + "->struct_size is " +
                                    std::to_string(out->struct_size) +
                                    ", not the size of any version of the struct (a multiple of " +
                                    std::to_string(alignof(T)) +
                                    "): initialise it with its _INIT macro");
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

Status CheckEnum(int value, int max, const char* field);
Status CheckString(const char* s, const char* arg);

// --- options.cc: the ABI's structs to the runtime's and back. ---------------

StatusOr<Duration> TimeoutFrom(int64_t ms, const char* field);
// The ABI's rate-limit encoding (all_gather_limit, rate_limit: 0 = the
// default 2, -1 = off, N >= 1) to the runtime's RateLimit and back.
StatusOr<RateLimit> RateLimitFrom(int32_t limit, const char* field);
int32_t RateLimitTo(RateLimit limit);
StatusOr<FsdpOptions> ToFsdpOptions(const sk_fsdp_options* in);
StatusOr<OptimizerOptions> ToOptimizerOptions(const sk_optimizer_options* in);
// `group` (may be null): a device kind left at SK_DEVICE_DEFAULT becomes the
// kind of the device the group is bound to (nccl: cuda), else cpu.
StatusOr<TrainerOptions> ToTrainerOptions(const sk_trainer_options* in,
                                          const sk::comm::ProcessGroup* group = nullptr);
StatusOr<DeviceOptions> ToDeviceOptions(const sk_device_options* in,
                                        const sk::comm::ProcessGroup* group = nullptr);
sk_memory_estimate ToMemoryEstimate(const MemoryEstimate& e);
sk_step_metrics ToStepMetrics(const StepMetrics& m, int rank);
// SK_WEIGHT_LAYOUT_DEFAULT is the shardkit layout.
StatusOr<WeightLayout> ToWeightLayout(sk_weight_layout_t layout);

// --- process_group.cc ---------------------------------------------------------

// The world_size rank handles of a new local group, each wrapped in the
// network model `network_model` names (NULL: none).
StatusOr<std::vector<std::shared_ptr<comm::ProcessGroup>>> CreateLocalGroups(
    int32_t world_size, const char* network_model);

}  // namespace sk::capi

// One try/catch pair around every entry point: no exception crosses the ABI.
#define SK_API_BEGIN \
  ::sk::capi::t_last_error.clear(); \
  try {
#define SK_API_END                                                                      \
  }                                                                                     \
  catch (const std::bad_alloc&) {                                                       \
    return ::sk::capi::Fail(SK_STATUS_RESOURCE_EXHAUSTED, "out of host memory (std::bad_alloc)");   \
  }                                                                                     \
  catch (const std::exception& e) {                                                     \
    return ::sk::capi::Fail(SK_STATUS_INTERNAL, std::string("unexpected C++ exception: ") + e.what()); \
  }                                                                                     \
  catch (...) {                                                                         \
    return ::sk::capi::Fail(SK_STATUS_INTERNAL, "unexpected C++ exception");                        \
  }
// For functions returning void (destroy): nothing to report, nothing escapes.
#define SK_API_VOID_BEGIN try {
#define SK_API_VOID_END \
  }                     \
  catch (...) {         \
  }

// Checks handle `h` (argument `arg`) and holds it for the rest of the entry
// point: another thread's call on it meanwhile is FailedPrecondition.
#define SK_USE_HANDLE(h, arg) \
  SK_CLAIM_HANDLE_IMPL(h, arg, ::sk::capi::HandleRegistry::Access::kExclusive, false)
// The same for a handle that may be NULL (a simulated world's group): NULL
// claims nothing; the entry point checks whether NULL is allowed.
#define SK_USE_OPTIONAL_HANDLE(h, arg) \
  SK_CLAIM_HANDLE_IMPL(h, arg, ::sk::capi::HandleRegistry::Access::kExclusive, true)
// Checks handle `h` and holds it shared for the rest of the entry point, for
// calls that several threads may make on it at once (they only read it, or
// the runtime object is thread-safe); an exclusive call on it meanwhile
// (either way round) is FailedPrecondition, and destroying it waits for them.
#define SK_SHARE_HANDLE(h, arg) \
  SK_CLAIM_HANDLE_IMPL(h, arg, ::sk::capi::HandleRegistry::Access::kShared, false)
#define SK_SHARE_OPTIONAL_HANDLE(h, arg) \
  SK_CLAIM_HANDLE_IMPL(h, arg, ::sk::capi::HandleRegistry::Access::kShared, true)
#define SK_CLAIM_HANDLE_IMPL(h, arg, access, optional)                                                  \
  ::sk::capi::HandleUse<std::remove_cv_t<std::remove_pointer_t<decltype(h)>>> sk_use_##h##_(h, arg, \
                                                                                             __func__, \
                                                                                             access, \
                                                                                             optional); \
  if (!sk_use_##h##_.status().ok()) return ::sk::capi::Fail(sk_use_##h##_.status())

// Returns the status of `expr` from the entry point if it is not OK.
#define SK_CHECK(expr)                       \
  do {                                       \
    ::sk::Status sk_c_ = (expr);             \
    if (!sk_c_.ok()) return ::sk::capi::Fail(sk_c_);     \
  } while (0)
#define SK_ASSIGN_OR_FAIL(lhs, expr)                         \
  SK_ASSIGN_OR_FAIL_IMPL(SK_STATUS_CONCAT(sk_api_, __LINE__), lhs, expr)
#define SK_ASSIGN_OR_FAIL_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return ::sk::capi::Fail(tmp.status());    \
  lhs = std::move(tmp).value()


#endif  // SHARDKIT_CAPI_ABI_H_
