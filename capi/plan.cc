// The planner (sk_plan): the request translated to runtime/plan's, the
// result copied into library-owned C structs.
#include "capi/abi.h"

#include "runtime/plan/plan.h"

using namespace sk::capi;  // NOLINT: the entry points below are this file's only code

namespace {

// What sk_plan allocates: the C struct the caller sees, first, and
// everything its pointers point into. Standard layout, so the registered
// sk_plan_result* is the owner's address too (FreeHandle).
struct PlanResultStrings {
  std::string profile, recommendation, table, json;
  std::vector<sk_plan_candidate> candidates;
  std::vector<std::string> labels, errors;
};
struct PlanResultOwner {
  sk_plan_result c;
  std::unique_ptr<PlanResultStrings> s;
};
static_assert(std::is_standard_layout_v<PlanResultOwner> && offsetof(PlanResultOwner, c) == 0,
              "an sk_plan_result* must convert to its PlanResultOwner*");

const PlanResultOwner& OwnerOf(const sk_plan_result* r) { return *reinterpret_cast<const PlanResultOwner*>(r); }

sk::StatusOr<std::vector<bool>> Both(int32_t v, const char* field) {
  switch (v) {
    case 0: return std::vector<bool>{};
    case 1: return std::vector<bool>{false};
    case 2: return std::vector<bool>{true};
    default:
      return sk::InvalidArgumentError(std::string("sk_plan_request.") + field + " must be 0 (both), 1 (off) or 2 (on), not " +
                                      std::to_string(v));
  }
}

sk::StatusOr<sk::plan::PlanRequest> ToPlanRequest(const sk_plan_request* in) {
  if (in == nullptr) return sk::InvalidArgumentError("request is NULL (use SK_PLAN_REQUEST_INIT)");
  sk_plan_request c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_plan_request", &c));
  if (c.model == nullptr) return sk::InvalidArgumentError("sk_plan_request.model is NULL (a model name is required)");
  sk::plan::PlanRequest r;
  r.model = c.model;
  if (c.profile != nullptr) r.profile = c.profile;
  if (c.gpus != 0) r.gpus = c.gpus;
  if (c.gpus_per_node != 0) r.gpus_per_node = c.gpus_per_node;
  if (c.batch_size != 0) r.batch_size = c.batch_size;
  r.seq_len = c.seq_len;
  r.source_len = c.source_len;
  if (c.strategies != nullptr && c.strategies[0] != '\0') {
    SK_ASSIGN_OR_RETURN(r.space.strategies, sk::plan::ParseStrategyList(c.strategies));
  }
  if (c.dtypes != nullptr && c.dtypes[0] != '\0') {
    SK_ASSIGN_OR_RETURN(r.space.dtypes, sk::plan::ParseDTypeList(c.dtypes));
  }
  // activation_checkpointing's off / on are kNone / kFull; `checkpointing`
  // (issue 33) names any of the four policies instead.
  SK_ASSIGN_OR_RETURN(std::vector<bool> ckpt, Both(c.activation_checkpointing, "activation_checkpointing"));
  if (c.checkpointing != nullptr && c.checkpointing[0] != '\0') {
    if (c.activation_checkpointing != 0) {
      return sk::InvalidArgumentError(
          "sk_plan_request.checkpointing and activation_checkpointing are both set (" +
          std::to_string(c.activation_checkpointing) + "); list the policies in checkpointing only");
    }
    SK_ASSIGN_OR_RETURN(r.space.activation_checkpointing,
                        sk::plan::ParseCheckpointingList(c.checkpointing, "sk_plan_request.checkpointing"));
  }
  for (bool on : ckpt) {
    r.space.activation_checkpointing.push_back(on ? sk::ActivationCheckpointing::kFull
                                                  : sk::ActivationCheckpointing::kNone);
  }
  SK_ASSIGN_OR_RETURN(r.space.cpu_offload, Both(c.cpu_offload, "cpu_offload"));
  if (c.trace_path != nullptr) r.trace_path = c.trace_path;
  return r;
}

}  // namespace

extern "C" {

SK_EXPORT sk_status_t sk_plan(const sk_plan_request* request, sk_plan_result** out_result) {
  SK_API_BEGIN
  SK_CHECK(CheckOut(out_result, "out_result"));
  SK_ASSIGN_OR_FAIL(sk::plan::PlanRequest r, ToPlanRequest(request));
  SK_ASSIGN_OR_FAIL(sk::plan::PlanResult plan, sk::plan::Plan(r));
  auto owner = std::make_unique<PlanResultOwner>();
  owner->s = std::make_unique<PlanResultStrings>();
  PlanResultStrings& strings = *owner->s;
  strings.profile = plan.profile_name;
  strings.recommendation = plan.recommendation;
  strings.table = sk::plan::FormatTable(plan, 20);
  strings.json = sk::plan::FormatJson(plan);
  const size_t n = plan.results.size();
  strings.labels.resize(n);
  strings.errors.resize(n);
  strings.candidates.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const sk::plan::CandidateResult& cr = plan.results[i];
    const sk::plan::Candidate& k = cr.candidate;
    const sk::plan::CandidateMetrics& m = cr.metrics;
    strings.labels[i] = k.Label();
    if (!cr.status.ok()) strings.errors[i] = cr.status.ToString();
    sk_plan_candidate& c = strings.candidates[i];
    std::memset(&c, 0, sizeof(c));
    c.struct_size = sizeof(c);
    c.label = strings.labels[i].c_str();
    c.parallelism = k.parallelism == sk::Parallelism::kDdp ? SK_PARALLELISM_DDP : SK_PARALLELISM_FSDP;
    c.strategy = k.parallelism == sk::Parallelism::kDdp ? SK_SHARDING_DEFAULT
                                                         : static_cast<sk_sharding_strategy_t>(k.fsdp.strategy);
    c.shard_group_size = k.fsdp.shard_group_size;
    c.backward_prefetch = static_cast<sk_backward_prefetch_t>(k.fsdp.backward_prefetch);
    c.forward_prefetch = k.fsdp.forward_prefetch ? 1 : 0;
    c.rate_limit = RateLimitTo(k.fsdp.all_gather_limit);
    c.activation_checkpointing = k.activation_checkpointing ? SK_CHECKPOINTING_FULL
                                 : k.selective_matmuls        ? SK_CHECKPOINTING_SELECTIVE_MATMULS
                                 : !k.selective_checkpointing ? SK_CHECKPOINTING_OFF
                                 : k.recompute_attention      ? SK_CHECKPOINTING_SELECTIVE_ATTENTION
                                                              : SK_CHECKPOINTING_SELECTIVE;
    c.cpu_offload = k.fsdp.cpu_offload ? 1 : 0;
    c.param_dtype = static_cast<sk_dtype_t>(k.fsdp.mixed_precision.param_dtype);
    c.reduce_dtype = static_cast<sk_dtype_t>(k.fsdp.mixed_precision.ReduceDType());
    c.fits = cr.fits() ? 1 : 0;
    c.out_of_memory = m.out_of_memory ? 1 : 0;
    c.error = cr.status.ok() ? nullptr : strings.errors[i].c_str();
    c.peak_allocated_bytes = m.peak_allocated_bytes;
    c.peak_reserved_bytes = m.peak_reserved_bytes;
    c.alloc_retries = m.alloc_retries;
    c.required_bytes = m.required_bytes;
    c.step_seconds = m.step_seconds;
    c.tflops_per_gpu = m.tflops_per_gpu;
    c.mfu = m.mfu;
    c.exposed_comm_seconds = m.exposed_comm_seconds;
    c.peak_host_bytes = m.peak_host_bytes;
  }
  sk_plan_result& c = owner->c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.profile = strings.profile.c_str();
  c.device_memory_bytes = plan.device_memory_bytes;
  c.num_candidates = static_cast<int32_t>(n);
  c.recommended = plan.recommended;
  c.recommendation = strings.recommendation.c_str();
  c.table = strings.table.c_str();
  c.json = strings.json.c_str();
  // Registered by the address the caller holds (sk_plan_result_free's).
  sk_plan_result* out = &owner.release()->c;
  HandleRegistry::Get().Add(out, HandleTraits<sk_plan_result>::kKind);
  *out_result = out;
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT sk_status_t sk_plan_result_candidate(const sk_plan_result* result, int32_t index,
                                               sk_plan_candidate* out) {
  SK_API_BEGIN
  SK_SHARE_HANDLE(result, "result");  // thread-safe (shardkit.h): it only reads
  SK_CHECK(CheckOutStruct(out, "out"));
  const std::vector<sk_plan_candidate>& candidates = OwnerOf(result).s->candidates;
  const int32_t n = static_cast<int32_t>(candidates.size());
  if (index < 0 || index >= n) {
    return Fail(SK_STATUS_OUT_OF_RANGE,
                "candidate " + std::to_string(index) + " out of range (the plan has " + std::to_string(n) + ")");
  }
  WriteStruct(out, candidates[static_cast<size_t>(index)]);
  return SK_STATUS_OK;
  SK_API_END
}

SK_EXPORT void sk_plan_result_free(sk_plan_result* result) {
  SK_API_VOID_BEGIN
  Destroy(result);
  SK_API_VOID_END
}

}  // extern "C"

template <>
void sk::capi::FreeHandle<sk_plan_result>(sk_plan_result* h) {
  delete reinterpret_cast<PlanResultOwner*>(h);
}
