// ABI support: the handle registry, errors, status codes, version, parsing.
#include "capi/abi.h"

#include <cctype>
#include <cstdio>

#include "runtime/core/dtype.h"

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
static_assert(SK_WEIGHT_LAYOUT_SHARDKIT == static_cast<int>(sk::WeightLayout::kShardkit) &&
              SK_WEIGHT_LAYOUT_TORCH == static_cast<int>(sk::WeightLayout::kTorch) &&
              SK_WEIGHT_LAYOUT_HF_GPT2 == static_cast<int>(sk::WeightLayout::kHfGpt2) &&
              SK_WEIGHT_LAYOUT_HF_LLAMA == static_cast<int>(sk::WeightLayout::kHfLlama));
static_assert(SK_PARALLELISM_FSDP == static_cast<int>(sk::Parallelism::kFsdp));
static_assert(SK_NO_DECAY_NONE == static_cast<int>(sk::NoDecay::kNone) &&
              SK_NO_DECAY_BIASES_AND_NORMS == static_cast<int>(sk::NoDecay::kBiasesAndNorms) &&
              SK_NO_DECAY_NORMS_BIASES_EMBEDDINGS == static_cast<int>(sk::NoDecay::kNormsBiasesEmbeddings));
static_assert(SK_PARALLELISM_DDP == static_cast<int>(sk::Parallelism::kDdp));
static_assert(SK_GRAD_ACCUMULATION_DEFAULT == static_cast<int>(sk::GradAccumulation::kDefault) &&
              SK_GRAD_ACCUMULATION_SHARDED == static_cast<int>(sk::GradAccumulation::kSharded) &&
              SK_GRAD_ACCUMULATION_UNSHARDED == static_cast<int>(sk::GradAccumulation::kUnsharded));

namespace sk::capi {

thread_local std::string t_last_error;

HandleRegistry& HandleRegistry::Get() {
  static HandleRegistry* r = new HandleRegistry();  // never destroyed: used at exit
  return *r;
}

void HandleRegistry::Add(const void* p, HandleKind k) {
  std::lock_guard<std::mutex> lock(mu_);
  live_[p] = Entry{k};
}

bool HandleRegistry::Remove(const void* p, HandleKind k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end() || it->second.kind != k || it->second.destroyed) return false;
  if (it->second.in_use()) {
    it->second.destroyed = true;  // the last call using it frees it (Release)
    return false;
  }
  live_.erase(it);  // an open span alone does not keep it: no call is inside it
  return true;
}

Status HandleRegistry::Refusal(const Entry& e, const void* p, const char* kind_name, const char* arg,
                               const char* call) {
  const std::thread::id me = std::this_thread::get_id();
  char addr[32];
  std::snprintf(addr, sizeof addr, "%p", p);
  std::string m = std::string(call) + ": " + arg + " (" + kind_name + " " + addr + ") is ";
  if (e.owner != me && e.span != nullptr) {
    if (e.call != nullptr) m += std::string("in use by ") + e.call + ", ";
    m += std::string("in ") + e.span + " begun on another thread; a handle takes one call at a time, and " +
         e.span + " belongs to the thread that began it";
    return sk::FailedPreconditionError(m);
  }
  const char* holder = e.owner != me ? e.call : nullptr;
  for (const SharedClaim& r : e.shared) {
    if (holder == nullptr && r.thread != me) holder = r.call;
  }
  return sk::FailedPreconditionError(m + "in use by " + (holder != nullptr ? holder : "another call") +
                                     " on another thread; a handle takes one call at a time");
}

Status HandleRegistry::Acquire(const void* p, HandleKind k, const char* kind_name, const char* arg,
                               const char* call, Access access, bool* nested) {
  std::lock_guard<std::mutex> lock(mu_);
  *nested = false;
  auto it = live_.find(p);
  if (it == live_.end() || it->second.kind != k || it->second.destroyed) {
    return sk::InvalidArgumentError(std::string(arg) + " is not a live " + kind_name +
                                    " (destroyed, or never created)");
  }
  Entry& e = it->second;
  const std::thread::id me = std::this_thread::get_id();
  // Another thread's exclusive call or open span refuses every claim.
  if ((e.call != nullptr || e.span != nullptr) && e.owner != me) {
    return Refusal(e, p, kind_name, arg, call);
  }
  if (access == Access::kShared) {
    e.shared.push_back(SharedClaim{me, call});
    return sk::OkStatus();
  }
  // Another thread's shared claim refuses an exclusive one.
  for (const SharedClaim& r : e.shared) {
    if (r.thread != me) return Refusal(e, p, kind_name, arg, call);
  }
  if (e.call != nullptr) {  // this thread's own call, from a callback
    *nested = true;
    return sk::OkStatus();
  }
  e.call = call;
  e.owner = me;
  return sk::OkStatus();
}

bool HandleRegistry::Release(const void* p, Access access) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return false;
  Entry& e = it->second;
  if (access == Access::kShared) {
    const std::thread::id me = std::this_thread::get_id();
    for (auto r = e.shared.begin(); r != e.shared.end(); ++r) {
      if (r->thread == me) {
        e.shared.erase(r);
        break;
      }
    }
  } else {
    e.call = nullptr;
    if (e.span == nullptr) e.owner = std::thread::id();
  }
  if (e.destroyed && !e.in_use()) {
    live_.erase(it);
    return true;
  }
  return false;
}

void HandleRegistry::OpenSpan(const void* p, const char* span) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it != live_.end()) it->second.span = span;
}

void HandleRegistry::CloseSpan(const void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it != live_.end()) it->second.span = nullptr;
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

}  // namespace sk::capi

using namespace sk::capi;  // NOLINT: the entry points below are this file's only code

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

SK_EXPORT sk_status_t sk_parse_weight_layout(const char* name, sk_weight_layout_t* out) {
  SK_API_BEGIN
  SK_CHECK(CheckString(name, "name"));
  SK_CHECK(CheckOut(out, "out"));
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  SK_ASSIGN_OR_FAIL(sk::WeightLayout l, sk::ParseWeightLayout(lower));
  *out = static_cast<sk_weight_layout_t>(l);
  return SK_STATUS_OK;
  SK_API_END
}

}  // extern "C"
