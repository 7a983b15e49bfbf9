// The ABI's option and result structs translated to the runtime's and back.
#include "capi/abi.h"

#include "runtime/nn/data.h"

namespace sk::capi {

StatusOr<sk::Duration> TimeoutFrom(int64_t ms, const char* field) {
  if (ms < 0) return sk::InvalidArgumentError(std::string(field) + " must be >= 0 (0 = default)");
  if (ms > sk::kMaxTimeout.count()) {
    return sk::InvalidArgumentError(std::string(field) + " = " + std::to_string(ms) + " exceeds the maximum of " +
                                    std::to_string(sk::kMaxTimeout.count()) + " ms (7 days)");
  }
  return ms == 0 ? sk::kDefaultTimeout : sk::Duration(ms);
}

StatusOr<sk::RateLimit> RateLimitFrom(int32_t limit, const char* field) {
  if (limit == 0) return sk::kDefaultRateLimit;
  if (limit == -1) return sk::RateLimit::Off();
  if (limit < -1) {
    return sk::InvalidArgumentError(std::string(field) + " must be >= -1 (0 = 2, -1 = no limit), not " +
                                    std::to_string(limit));
  }
  return sk::RateLimit::InFlight(limit);
}

int32_t RateLimitTo(sk::RateLimit limit) { return limit.off() ? -1 : limit.max_in_flight(); }

StatusOr<sk::FsdpOptions> ToFsdpOptions(const sk_fsdp_options* in) {
  sk_fsdp_options c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_fsdp_options", &c));
  SK_RETURN_IF_ERROR(CheckEnum(c.strategy, SK_SHARDING_HYBRID_SHARD_GRAD_OP, "sk_fsdp_options.strategy"));
  SK_RETURN_IF_ERROR(CheckEnum(c.backward_prefetch, SK_BACKWARD_PREFETCH_POST,
                               "sk_fsdp_options.backward_prefetch"));
  SK_RETURN_IF_ERROR(CheckEnum(c.param_dtype, SK_DTYPE_F16, "sk_fsdp_options.param_dtype"));
  SK_RETURN_IF_ERROR(CheckEnum(c.reduce_dtype, SK_DTYPE_F16, "sk_fsdp_options.reduce_dtype"));
  SK_RETURN_IF_ERROR(CheckEnum(c.buffer_dtype, SK_DTYPE_F16, "sk_fsdp_options.buffer_dtype"));
  SK_RETURN_IF_ERROR(CheckEnum(c.grad_accumulation, SK_GRAD_ACCUMULATION_UNSHARDED,
                               "sk_fsdp_options.grad_accumulation"));
  // Each zero ("default") field is resolved here, once: a zero field keeps
  // the runtime's default (the member initialisers of sk::FsdpOptions), and
  // the runtime's fields hold resolved values only.
  sk::FsdpOptions o;
  if (c.strategy != SK_SHARDING_DEFAULT) o.strategy = static_cast<sk::ShardingStrategy>(c.strategy);
  o.shard_group_size = c.shard_group_size;
  if (c.backward_prefetch != SK_BACKWARD_PREFETCH_DEFAULT) {
    o.backward_prefetch = static_cast<sk::BackwardPrefetch>(c.backward_prefetch);
  }
  o.forward_prefetch = c.forward_prefetch != 0;
  SK_ASSIGN_OR_RETURN(o.all_gather_limit, RateLimitFrom(c.all_gather_limit, "sk_fsdp_options.all_gather_limit"));
  if (c.param_dtype != SK_DTYPE_DEFAULT) o.mixed_precision.param_dtype = static_cast<sk::DType>(c.param_dtype);
  if (c.reduce_dtype != SK_DTYPE_DEFAULT) o.mixed_precision.reduce_dtype = static_cast<sk::DType>(c.reduce_dtype);
  // No model the runtime wraps has buffers (non-parameter state): a buffer
  // dtype other than the documented default would change nothing, so it is
  // refused rather than silently ignored. Spelling the default out (the
  // param dtype) is accepted.
  if (c.buffer_dtype != SK_DTYPE_DEFAULT &&
      static_cast<sk::DType>(c.buffer_dtype) != o.mixed_precision.param_dtype) {
    return sk::InvalidArgumentError(
        "sk_fsdp_options.buffer_dtype = " + std::string(sk::DTypeName(static_cast<sk::DType>(c.buffer_dtype))) +
        " is not supported: the models have no buffers (non-parameter state) for it to apply to; leave it 0 "
        "(param_dtype, " + std::string(sk::DTypeName(o.mixed_precision.param_dtype)) + ")");
  }
  o.cpu_offload = c.cpu_offload != 0;
  o.gradient_predivide_factor = c.gradient_predivide_factor;
  o.seed = c.seed;
  SK_ASSIGN_OR_RETURN(o.timeout, TimeoutFrom(c.timeout_ms, "sk_fsdp_options.timeout_ms"));
  o.grad_accumulation = static_cast<sk::GradAccumulation>(c.grad_accumulation);
  return o;
}

StatusOr<sk::OptimizerOptions> ToOptimizerOptions(const sk_optimizer_options* in) {
  sk_optimizer_options c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_optimizer_options", &c));
  SK_RETURN_IF_ERROR(CheckEnum(c.kind, SK_OPTIMIZER_ADAMW, "sk_optimizer_options.kind"));
  sk::OptimizerOptions o;
  if (c.kind != SK_OPTIMIZER_DEFAULT) o.kind = static_cast<sk::OptimizerKind>(c.kind);
  // The rate is taken as given from a 0.6.0 struct (0 is a rate); a struct
  // from an older header, whose lr 0 meant "default", keeps that meaning.
  const bool lr_as_given = in != nullptr && in->struct_size > offsetof(sk_optimizer_options, param_groups);
  if (lr_as_given || c.lr != 0.f) o.lr = c.lr;
  if (c.num_param_groups < 0 || (c.num_param_groups > 0 && c.param_groups == nullptr)) {
    return sk::InvalidArgumentError("sk_optimizer_options.num_param_groups is " +
                                    std::to_string(c.num_param_groups) + " with param_groups " +
                                    (c.param_groups == nullptr ? "NULL" : "set"));
  }
  for (int32_t i = 0; i < c.num_param_groups; ++i) {
    const std::string name = "sk_optimizer_options.param_groups[" + std::to_string(i) + "]";
    sk_param_group g;
    SK_RETURN_IF_ERROR(ReadStruct(&c.param_groups[i], name.c_str(), &g));
    sk::ParamGroup pg;
    if (g.pattern != nullptr) pg.pattern = g.pattern;
    pg.norms_biases_embeddings = g.norms_biases_embeddings != 0;
    if (g.no_decay < SK_NO_DECAY_NONE || g.no_decay > SK_NO_DECAY_NORMS_BIASES_EMBEDDINGS) {
      return sk::InvalidArgumentError(name + ".no_decay is " + std::to_string(static_cast<int>(g.no_decay)) +
                                      ", not an sk_no_decay_t (SK_NO_DECAY_NONE, _BIASES_AND_NORMS, "
                                      "_NORMS_BIASES_EMBEDDINGS)");
    }
    pg.no_decay = static_cast<sk::NoDecay>(g.no_decay);
    pg.weight_decay = g.inherit_weight_decay != 0 ? -1.f : g.weight_decay;
    if (g.inherit_weight_decay == 0 && !(g.weight_decay >= 0)) {
      return sk::InvalidArgumentError(name + ".weight_decay must be >= 0 (set inherit_weight_decay for "
                                             "the optimizer's)");
    }
    pg.lr_multiplier = g.lr_multiplier;
    o.param_groups.push_back(std::move(pg));
  }
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

StatusOr<sk::DeviceOptions> ToDeviceOptions(const sk_device_options* in,
                                            const sk::comm::ProcessGroup* group) {
  sk_device_options c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_device_options", &c));
  SK_RETURN_IF_ERROR(CheckEnum(c.kind, SK_DEVICE_SIM, "sk_device_options.kind"));
  sk::DeviceOptions o;
  if (c.kind != SK_DEVICE_DEFAULT) {
    o.kind = static_cast<sk::DeviceKind>(c.kind);
  } else if (group != nullptr && group->bound_device().has_value()) {
    o.kind = group->bound_device()->kind;
  }
  if (c.use_index != 0) {
    if (c.index < 0) {
      return sk::InvalidArgumentError("sk_device_options.index must be >= 0 when use_index is set, not " +
                                      std::to_string(c.index));
    }
    o.index = c.index;
  }
  if (c.sim_profile != nullptr) o.sim_profile = c.sim_profile;
  o.sim_world_size = c.sim_world_size;
  o.sim_gpus_per_node = c.sim_gpus_per_node;
  o.launch_blocking = c.launch_blocking != 0;
  SK_RETURN_IF_ERROR(sk::ValidateDeviceOptions(o).WithContext("sk_device_options"));
  return o;
}

namespace {

// `n` strings from `paths` (NULL with n = 0 is none). InvalidArgument naming
// `field` for a negative count, a NULL array or a NULL or empty string.
StatusOr<std::vector<std::string>> ToPaths(const char* const* paths, int32_t n, const std::string& field) {
  if (n < 0 || n > (1 << 20) || (n > 0 && paths == nullptr)) {
    return sk::InvalidArgumentError(field + ": num is " + std::to_string(n) + " with the array " +
                                    (paths == nullptr ? "NULL" : "set"));
  }
  std::vector<std::string> out;
  for (int32_t i = 0; i < n; ++i) {
    if (paths[i] == nullptr || paths[i][0] == '\0') {
      return sk::InvalidArgumentError(field + "[" + std::to_string(i) + "] is " +
                                      (paths[i] == nullptr ? "NULL" : "empty"));
    }
    out.emplace_back(paths[i]);
  }
  return out;
}

// Fills the dataset fields of `o` from the caller's struct.
Status ToDatasetOptions(const sk_dataset_options* in, sk::TrainerOptions& o) {
  sk_dataset_options c;
  SK_RETURN_IF_ERROR(ReadStruct(in, "sk_dataset_options", &c));
  SK_RETURN_IF_ERROR(CheckEnum(c.format, SK_DATASET_FORMAT_JSONL, "sk_dataset_options.format"));
  SK_RETURN_IF_ERROR(
      CheckEnum(c.token_file_layout, SK_TOKEN_FILE_LAYOUT_LLMC, "sk_dataset_options.token_file_layout"));
  SK_ASSIGN_OR_RETURN(o.dataset.paths, ToPaths(c.paths, c.num_paths, "sk_dataset_options.paths"));
  if (o.dataset.paths.empty()) return sk::InvalidArgumentError("sk_dataset_options.num_paths must be >= 1");
  SK_ASSIGN_OR_RETURN(o.eval_dataset_paths,
                      ToPaths(c.eval_paths, c.num_eval_paths, "sk_dataset_options.eval_paths"));
  o.dataset.format = c.format == SK_DATASET_FORMAT_JSONL ? sk::data::DatasetFormat::kJsonl
                                                         : sk::data::DatasetFormat::kTokens;
  o.dataset.layout = static_cast<sk::data::TokenFileLayout>(c.token_file_layout);
  o.dataset.token_bytes = c.token_bytes;
  if (c.seed != 0) o.dataset.seed = c.seed;
  o.dataset.shuffle = c.sequential == 0;
  o.dataset.packing = c.packing != 0;
  if (c.has_eos_id != 0) {
    if (c.eos_id < 0) {
      return sk::InvalidArgumentError("sk_dataset_options.eos_id is " + std::to_string(c.eos_id) +
                                      " with has_eos_id set: a token id is >= 0");
    }
    o.dataset.eos_id = c.eos_id;
  }
  return sk::data::ValidateDatasetOptions(o.dataset).WithContext("sk_dataset_options");
}

}  // namespace

StatusOr<sk::TrainerOptions> ToTrainerOptions(const sk_trainer_options* in,
                                              const sk::comm::ProcessGroup* group) {
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
  SK_RETURN_IF_ERROR(CheckEnum(c.activation_checkpointing, SK_CHECKPOINTING_SELECTIVE_MATMULS,
                               "sk_trainer_options.activation_checkpointing (0 off, 1 whole block, 2 "
                               "selective, 3 selective with attention, 4 selective with every other "
                               "matmul)"));
  switch (static_cast<sk_activation_checkpointing_t>(c.activation_checkpointing)) {
    case SK_CHECKPOINTING_OFF: o.checkpointing = sk::ActivationCheckpointing::kNone; break;
    case SK_CHECKPOINTING_FULL: o.checkpointing = sk::ActivationCheckpointing::kFull; break;
    case SK_CHECKPOINTING_SELECTIVE: o.checkpointing = sk::ActivationCheckpointing::kSelective; break;
    case SK_CHECKPOINTING_SELECTIVE_ATTENTION:
      o.checkpointing = sk::ActivationCheckpointing::kSelective;
      o.recompute_attention = true;
      break;
    case SK_CHECKPOINTING_SELECTIVE_MATMULS:
      o.checkpointing = sk::ActivationCheckpointing::kSelectiveMatmuls;
      break;
  }
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
  if (c.parallelism != SK_PARALLELISM_DEFAULT) o.parallelism = static_cast<sk::Parallelism>(c.parallelism);
  if (c.ddp_bucket_bytes < 0) {
    return sk::InvalidArgumentError("sk_trainer_options.ddp_bucket_bytes must be >= 0 (0 = 25 MiB)");
  }
  o.ddp_bucket_bytes = c.ddp_bucket_bytes;
  SK_ASSIGN_OR_RETURN(o.device, ToDeviceOptions(c.device, group));
  if (c.lr_schedule != nullptr) {
    sk_lr_schedule ls;
    SK_RETURN_IF_ERROR(ReadStruct(c.lr_schedule, "sk_lr_schedule", &ls));
    SK_RETURN_IF_ERROR(CheckEnum(ls.kind, SK_LR_SCHEDULE_LINEAR, "sk_lr_schedule.kind"));
    if (ls.kind != SK_LR_SCHEDULE_DEFAULT) o.lr_schedule.kind = static_cast<sk::LrScheduleKind>(ls.kind);
    o.lr_schedule.warmup_steps = ls.warmup_steps;
    o.lr_schedule.decay_steps = ls.decay_steps;
    o.lr_schedule.min_lr = ls.min_lr;
    SK_RETURN_IF_ERROR(sk::ValidateLrSchedule(o.lr_schedule, o.optimizer.lr).WithContext("sk_trainer_options"));
  }
  if (c.dataset != nullptr) SK_RETURN_IF_ERROR(ToDatasetOptions(c.dataset, o));
  o.fsdp.skip_init = c.skip_init != 0;
  if (c.skip_nonfinite_steps != 0 && c.skip_nonfinite_steps != 1) {
    return sk::InvalidArgumentError("sk_trainer_options.skip_nonfinite_steps must be 0 or 1, not " +
                                    std::to_string(c.skip_nonfinite_steps));
  }
  o.skip_nonfinite_steps = c.skip_nonfinite_steps == 1;
  if (c.packed_documents != 0 && c.packed_documents != 1) {
    return sk::InvalidArgumentError("sk_trainer_options.packed_documents must be 0 or 1, not " +
                                    std::to_string(c.packed_documents));
  }
  o.packed_documents = c.packed_documents == 1;
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

StatusOr<sk::WeightLayout> ToWeightLayout(sk_weight_layout_t layout) {
  SK_RETURN_IF_ERROR(CheckEnum(layout, SK_WEIGHT_LAYOUT_HF_LLAMA, "layout"));
  if (layout == SK_WEIGHT_LAYOUT_DEFAULT) return sk::WeightLayout::kShardkit;
  return static_cast<sk::WeightLayout>(layout);
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
  c.global_loss = m.global_loss;
  c.simulated = m.simulated ? 1 : 0;
  c.lr = m.lr;
  c.skipped = m.skipped ? 1 : 0;
  c.target_tokens = m.target_tokens;
  c.global_target_tokens = m.global_target_tokens;
  return c;
}

}  // namespace sk::capi
