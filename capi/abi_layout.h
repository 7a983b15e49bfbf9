/* Internal to shardkit (not installed): the layout of every struct of
 * shardkit.h, pinned at compile time. capi/abi.cc includes it, so the
 * library does not build when a field moves; tests/capi:abi_layout_test
 * checks the same as strict C11; frontends/rust/tests/header.rs reads the
 * offsets below to check the Rust declarations against them.
 *
 * Appending a field to a struct: name it as the struct's last field in its
 * SK_*_STRUCT_SIZE trait (shardkit.h; the size check below fails until
 * then) and add its offset and the new sizeof here. Nothing else: the first
 * version's size, which the library accepts as the smallest struct_size,
 * comes from the SK_*_STRUCT_SIZE_V1 trait, which never changes. A new
 * struct: its two traits in shardkit.h, a line in SK_VERSIONED_STRUCTS and
 * its layout here. */
#ifndef SHARDKIT_CAPI_ABI_LAYOUT_H_
#define SHARDKIT_CAPI_ABI_LAYOUT_H_

#include "shardkit/shardkit.h"

/* Every versioned struct and the prefix of its size traits:
 * X(type, SK_TYPE) for each. */
#define SK_VERSIONED_STRUCTS(X) \
  X(sk_gloo_options, SK_GLOO_OPTIONS) \
  X(sk_nccl_options, SK_NCCL_OPTIONS) \
  X(sk_fsdp_options, SK_FSDP_OPTIONS) \
  X(sk_param_group, SK_PARAM_GROUP) \
  X(sk_optimizer_options, SK_OPTIMIZER_OPTIONS) \
  X(sk_device_options, SK_DEVICE_OPTIONS) \
  X(sk_lr_schedule, SK_LR_SCHEDULE) \
  X(sk_dataset_options, SK_DATASET_OPTIONS) \
  X(sk_trainer_options, SK_TRAINER_OPTIONS) \
  X(sk_step_metrics, SK_STEP_METRICS) \
  X(sk_memory_estimate, SK_MEMORY_ESTIMATE) \
  X(sk_plan_request, SK_PLAN_REQUEST) \
  X(sk_plan_candidate, SK_PLAN_CANDIDATE) \
  X(sk_plan_result, SK_PLAN_RESULT) \
  X(sk_param_spec, SK_PARAM_SPEC) \
  X(sk_engine_options, SK_ENGINE_OPTIONS) \
  X(sk_tensor_view, SK_TENSOR_VIEW) \
  X(sk_shard_piece, SK_SHARD_PIECE) \
  X(sk_batch, SK_BATCH)

#if defined(__cplusplus)
#define SK_LAYOUT_ASSERT(cond, msg) static_assert(cond, msg)
#define SK_ALIGNOF(type) alignof(type)
#else
#define SK_LAYOUT_ASSERT(cond, msg) _Static_assert(cond, msg)
#define SK_ALIGNOF(type) _Alignof(type)
#endif

/* A version's struct_size: the size up to its last field, padded to the
 * struct's alignment (what sizeof was in that version's header). */
#define SK_VERSION_SIZE(type, traits_size) \
  (((traits_size) + SK_ALIGNOF(type) - 1) / SK_ALIGNOF(type) * SK_ALIGNOF(type))

/* Each struct's SK_*_STRUCT_SIZE names its last field: a field appended
 * without moving the trait fails here. */
#define SK_CHECK_SIZE_TRAIT(type, prefix)                                        \
  SK_LAYOUT_ASSERT(SK_VERSION_SIZE(type, prefix##_STRUCT_SIZE) == sizeof(type), \
                   #type ": " #prefix "_STRUCT_SIZE must name its last field");
SK_VERSIONED_STRUCTS(SK_CHECK_SIZE_TRAIT)
#undef SK_CHECK_SIZE_TRAIT

/* Layout (LP64). The first versions' sizes are history: they never change. */
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
SK_LAYOUT_ASSERT(sizeof(sk_status_t) == 4 && sizeof(sk_dtype_t) == 4 &&
                 sizeof(sk_sharding_strategy_t) == 4 && sizeof(sk_init_kind_t) == 4 &&
                 sizeof(sk_optimizer_kind_t) == 4 && sizeof(sk_backward_prefetch_t) == 4 &&
                 sizeof(sk_parallelism_t) == 4 && sizeof(sk_weight_layout_t) == 4 &&
                 sizeof(sk_device_kind_t) == 4 && sizeof(sk_lr_schedule_kind_t) == 4 &&
                 sizeof(sk_dataset_format_t) == 4 && sizeof(sk_token_file_layout_t) == 4 &&
                 sizeof(sk_reduce_op_t) == 4,
                 "enums are 32-bit");
SK_LAYOUT_ASSERT(offsetof(sk_gloo_options, rank) == 8 && offsetof(sk_gloo_options, world_size) == 12 &&
                 offsetof(sk_gloo_options, master_addr) == 16 && offsetof(sk_gloo_options, master_port) == 24 &&
                 offsetof(sk_gloo_options, hostname) == 32 && offsetof(sk_gloo_options, timeout_ms) == 40 &&
                 offsetof(sk_gloo_options, check_desync) == 48 && offsetof(sk_gloo_options, network_model) == 56 &&
                 sizeof(sk_gloo_options) == 64, "sk_gloo_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_nccl_options, rank) == 8 && offsetof(sk_nccl_options, world_size) == 12 &&
                 offsetof(sk_nccl_options, master_addr) == 16 && offsetof(sk_nccl_options, master_port) == 24 &&
                 offsetof(sk_nccl_options, use_device) == 28 && offsetof(sk_nccl_options, device) == 32 &&
                 offsetof(sk_nccl_options, timeout_ms) == 40 && offsetof(sk_nccl_options, skip_call_check) == 48 &&
                 sizeof(sk_nccl_options) == 56, "sk_nccl_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_fsdp_options, strategy) == 8 && offsetof(sk_fsdp_options, shard_group_size) == 12 &&
                 offsetof(sk_fsdp_options, backward_prefetch) == 16 && offsetof(sk_fsdp_options, forward_prefetch) == 20 &&
                 offsetof(sk_fsdp_options, all_gather_limit) == 24 && offsetof(sk_fsdp_options, param_dtype) == 28 &&
                 offsetof(sk_fsdp_options, reduce_dtype) == 32 && offsetof(sk_fsdp_options, buffer_dtype) == 36 &&
                 offsetof(sk_fsdp_options, cpu_offload) == 40 && offsetof(sk_fsdp_options, gradient_predivide_factor) == 44 &&
                 offsetof(sk_fsdp_options, seed) == 48 && offsetof(sk_fsdp_options, timeout_ms) == 56 &&
                 offsetof(sk_fsdp_options, grad_accumulation) == 64 &&
                 sizeof(sk_fsdp_options) == 72, "sk_fsdp_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_optimizer_options, kind) == 8 && offsetof(sk_optimizer_options, lr) == 12 &&
                 offsetof(sk_optimizer_options, momentum) == 16 && offsetof(sk_optimizer_options, dampening) == 20 &&
                 offsetof(sk_optimizer_options, nesterov) == 24 && offsetof(sk_optimizer_options, beta1) == 28 &&
                 offsetof(sk_optimizer_options, beta2) == 32 && offsetof(sk_optimizer_options, eps) == 36 &&
                 offsetof(sk_optimizer_options, weight_decay) == 40 &&
                 offsetof(sk_optimizer_options, param_groups) == 48 &&
                 offsetof(sk_optimizer_options, num_param_groups) == 56 && sizeof(sk_optimizer_options) == 64,
                 "sk_optimizer_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_param_group, pattern) == 8 && offsetof(sk_param_group, norms_biases_embeddings) == 16 &&
                 offsetof(sk_param_group, weight_decay) == 20 && offsetof(sk_param_group, lr_multiplier) == 24 &&
                 offsetof(sk_param_group, inherit_weight_decay) == 28 && offsetof(sk_param_group, no_decay) == 32 &&
                 sizeof(sk_param_group) == 40,
                 "sk_param_group layout");
SK_LAYOUT_ASSERT(offsetof(sk_lr_schedule, kind) == 8 && offsetof(sk_lr_schedule, min_lr) == 12 &&
                 offsetof(sk_lr_schedule, warmup_steps) == 16 && offsetof(sk_lr_schedule, decay_steps) == 24 &&
                 sizeof(sk_lr_schedule) == 32, "sk_lr_schedule layout");
SK_LAYOUT_ASSERT(offsetof(sk_batch, batch_size) == 8 && offsetof(sk_batch, seq_len) == 16 &&
                 offsetof(sk_batch, input_ids) == 24 && offsetof(sk_batch, targets) == 32 &&
                 offsetof(sk_batch, loss_mask) == 40 && offsetof(sk_batch, position_ids) == 48 &&
                 offsetof(sk_batch, segment_ids) == 56 && sizeof(sk_batch) == 64,
                 "sk_batch layout");
SK_LAYOUT_ASSERT(offsetof(sk_dataset_options, paths) == 8 && offsetof(sk_dataset_options, num_paths) == 16 &&
                 offsetof(sk_dataset_options, format) == 20 &&
                 offsetof(sk_dataset_options, token_file_layout) == 24 &&
                 offsetof(sk_dataset_options, token_bytes) == 28 && offsetof(sk_dataset_options, seed) == 32 &&
                 offsetof(sk_dataset_options, sequential) == 40 && offsetof(sk_dataset_options, packing) == 44 &&
                 offsetof(sk_dataset_options, eos_id) == 48 && offsetof(sk_dataset_options, has_eos_id) == 56 &&
                 offsetof(sk_dataset_options, num_eval_paths) == 60 &&
                 offsetof(sk_dataset_options, eval_paths) == 64 && sizeof(sk_dataset_options) == 72,
                 "sk_dataset_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_trainer_options, model) == 8 && offsetof(sk_trainer_options, fsdp) == 16 &&
                 offsetof(sk_trainer_options, optimizer) == 24 && offsetof(sk_trainer_options, batch_size) == 32 &&
                 offsetof(sk_trainer_options, grad_accum_steps) == 40 && offsetof(sk_trainer_options, seq_len) == 48 &&
                 offsetof(sk_trainer_options, source_len) == 56 && offsetof(sk_trainer_options, clip_grad_norm) == 64 &&
                 offsetof(sk_trainer_options, activation_checkpointing) == 72 &&
                 offsetof(sk_trainer_options, memory_cap_bytes) == 80 && offsetof(sk_trainer_options, data_path) == 88 &&
                 offsetof(sk_trainer_options, data_token_bytes) == 96 && offsetof(sk_trainer_options, data_seed) == 104 &&
                 offsetof(sk_trainer_options, data_tokens) == 112 &&
                 offsetof(sk_trainer_options, parallelism) == 120 &&
                 offsetof(sk_trainer_options, ddp_bucket_bytes) == 128 &&
                 offsetof(sk_trainer_options, device) == 136 &&
                 offsetof(sk_trainer_options, lr_schedule) == 144 &&
                 offsetof(sk_trainer_options, dataset) == 152 &&
                 offsetof(sk_trainer_options, skip_init) == 160 &&
                 offsetof(sk_trainer_options, skip_nonfinite_steps) == 164 &&
                 offsetof(sk_trainer_options, packed_documents) == 168 && sizeof(sk_trainer_options) == 176,
                 "sk_trainer_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_step_metrics, step) == 8 && offsetof(sk_step_metrics, rank) == 16 &&
                 offsetof(sk_step_metrics, loss) == 20 && offsetof(sk_step_metrics, grad_norm) == 24 &&
                 offsetof(sk_step_metrics, step_seconds) == 32 && offsetof(sk_step_metrics, tokens_per_second) == 40 &&
                 offsetof(sk_step_metrics, model_tflops_per_rank) == 48 &&
                 offsetof(sk_step_metrics, hardware_tflops_per_rank) == 56 &&
                 offsetof(sk_step_metrics, peak_allocated_bytes) == 64 && offsetof(sk_step_metrics, peak_reserved_bytes) == 72 &&
                 offsetof(sk_step_metrics, allocated_bytes) == 80 && offsetof(sk_step_metrics, reserved_bytes) == 88 &&
                 offsetof(sk_step_metrics, alloc_retries) == 96 && offsetof(sk_step_metrics, ooms) == 104 &&
                 offsetof(sk_step_metrics, bytes_communicated) == 112 &&
                 offsetof(sk_step_metrics, global_loss) == 120 && offsetof(sk_step_metrics, simulated) == 124 &&
                 offsetof(sk_step_metrics, lr) == 128 && offsetof(sk_step_metrics, skipped) == 132 &&
                 offsetof(sk_step_metrics, target_tokens) == 136 &&
                 offsetof(sk_step_metrics, global_target_tokens) == 144 && sizeof(sk_step_metrics) == 152,
                 "sk_step_metrics layout");
SK_LAYOUT_ASSERT(offsetof(sk_memory_estimate, parameters) == 8 && offsetof(sk_memory_estimate, master_bytes) == 16 &&
                 offsetof(sk_memory_estimate, grad_shard_bytes) == 24 &&
                 offsetof(sk_memory_estimate, optimizer_bytes) == 32 &&
                 offsetof(sk_memory_estimate, persistent_bytes) == 40 &&
                 offsetof(sk_memory_estimate, unsharded_bytes) == 48 &&
                 offsetof(sk_memory_estimate, activation_bytes) == 56 &&
                 offsetof(sk_memory_estimate, peak_bytes) == 64 && sizeof(sk_memory_estimate) == 72,
                 "sk_memory_estimate layout");
SK_LAYOUT_ASSERT(offsetof(sk_param_spec, name) == 8 && offsetof(sk_param_spec, ndim) == 16 &&
                 offsetof(sk_param_spec, shape) == 24 && offsetof(sk_param_spec, dtype) == 32 &&
                 offsetof(sk_param_spec, init) == 36 && offsetof(sk_param_spec, init_a) == 40 &&
                 offsetof(sk_param_spec, init_b) == 44 && sizeof(sk_param_spec) == 48, "sk_param_spec layout");
SK_LAYOUT_ASSERT(offsetof(sk_engine_options, fsdp) == 8 && offsetof(sk_engine_options, optimizer) == 16 &&
                 offsetof(sk_engine_options, memory_cap_bytes) == 24 && offsetof(sk_engine_options, device) == 32 &&
                 offsetof(sk_engine_options, cuda_stream) == 40 &&
                 offsetof(sk_engine_options, custom_optimizer) == 48 &&
                 offsetof(sk_engine_options, custom_state_names) == 56 &&
                 offsetof(sk_engine_options, num_custom_states) == 64 && sizeof(sk_engine_options) == 72,
                 "sk_engine_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_shard_piece, name) == 8 && offsetof(sk_shard_piece, param) == 16 &&
                 offsetof(sk_shard_piece, ndim) == 20 && offsetof(sk_shard_piece, shape) == 24 &&
                 offsetof(sk_shard_piece, shard_offset) == 32 && offsetof(sk_shard_piece, numel) == 40 &&
                 offsetof(sk_shard_piece, param_offset) == 48 && offsetof(sk_shard_piece, param_group) == 56 &&
                 offsetof(sk_shard_piece, weight_decay) == 60 && offsetof(sk_shard_piece, lr_multiplier) == 64 &&
                 sizeof(sk_shard_piece) == 72, "sk_shard_piece layout");
SK_LAYOUT_ASSERT(offsetof(sk_device_options, kind) == 8 && offsetof(sk_device_options, use_index) == 12 &&
                 offsetof(sk_device_options, index) == 16 && offsetof(sk_device_options, sim_profile) == 24 &&
                 offsetof(sk_device_options, sim_world_size) == 32 &&
                 offsetof(sk_device_options, sim_gpus_per_node) == 36 &&
                 offsetof(sk_device_options, launch_blocking) == 40 && sizeof(sk_device_options) == 48,
                 "sk_device_options layout");
SK_LAYOUT_ASSERT(offsetof(sk_tensor_view, data) == 8 && offsetof(sk_tensor_view, dtype) == 16 &&
                 offsetof(sk_tensor_view, ndim) == 20 && offsetof(sk_tensor_view, shape) == 24 &&
                 offsetof(sk_tensor_view, numel) == 32 && sizeof(sk_tensor_view) == 40, "sk_tensor_view layout");
SK_LAYOUT_ASSERT(offsetof(sk_plan_request, model) == 8 && offsetof(sk_plan_request, profile) == 16 &&
                 offsetof(sk_plan_request, gpus) == 24 && offsetof(sk_plan_request, gpus_per_node) == 28 &&
                 offsetof(sk_plan_request, batch_size) == 32 && offsetof(sk_plan_request, seq_len) == 40 &&
                 offsetof(sk_plan_request, source_len) == 48 && offsetof(sk_plan_request, strategies) == 56 &&
                 offsetof(sk_plan_request, dtypes) == 64 &&
                 offsetof(sk_plan_request, activation_checkpointing) == 72 &&
                 offsetof(sk_plan_request, cpu_offload) == 76 && offsetof(sk_plan_request, trace_path) == 80 &&
                 offsetof(sk_plan_request, checkpointing) == 88 &&
                 sizeof(sk_plan_request) == 96, "sk_plan_request layout");
SK_LAYOUT_ASSERT(offsetof(sk_plan_candidate, label) == 8 && offsetof(sk_plan_candidate, parallelism) == 16 &&
                 offsetof(sk_plan_candidate, strategy) == 20 && offsetof(sk_plan_candidate, shard_group_size) == 24 &&
                 offsetof(sk_plan_candidate, backward_prefetch) == 28 &&
                 offsetof(sk_plan_candidate, forward_prefetch) == 32 && offsetof(sk_plan_candidate, rate_limit) == 36 &&
                 offsetof(sk_plan_candidate, activation_checkpointing) == 40 &&
                 offsetof(sk_plan_candidate, cpu_offload) == 44 && offsetof(sk_plan_candidate, param_dtype) == 48 &&
                 offsetof(sk_plan_candidate, reduce_dtype) == 52 && offsetof(sk_plan_candidate, fits) == 56 &&
                 offsetof(sk_plan_candidate, out_of_memory) == 60 && offsetof(sk_plan_candidate, error) == 64 &&
                 offsetof(sk_plan_candidate, peak_allocated_bytes) == 72 &&
                 offsetof(sk_plan_candidate, peak_reserved_bytes) == 80 &&
                 offsetof(sk_plan_candidate, alloc_retries) == 88 && offsetof(sk_plan_candidate, required_bytes) == 96 &&
                 offsetof(sk_plan_candidate, step_seconds) == 104 && offsetof(sk_plan_candidate, tflops_per_gpu) == 112 &&
                 offsetof(sk_plan_candidate, mfu) == 120 && offsetof(sk_plan_candidate, exposed_comm_seconds) == 128 &&
                 offsetof(sk_plan_candidate, peak_host_bytes) == 136 &&
                 sizeof(sk_plan_candidate) == 144, "sk_plan_candidate layout");
SK_LAYOUT_ASSERT(offsetof(sk_plan_result, profile) == 8 && offsetof(sk_plan_result, device_memory_bytes) == 16 &&
                 offsetof(sk_plan_result, num_candidates) == 24 && offsetof(sk_plan_result, recommended) == 28 &&
                 offsetof(sk_plan_result, recommendation) == 32 && offsetof(sk_plan_result, table) == 40 &&
                 offsetof(sk_plan_result, json) == 48 && sizeof(sk_plan_result) == 56, "sk_plan_result layout");
SK_LAYOUT_ASSERT(SK_VERSION_SIZE(sk_trainer_options, SK_TRAINER_OPTIONS_STRUCT_SIZE_V1) == 120 &&
                 SK_VERSION_SIZE(sk_step_metrics, SK_STEP_METRICS_STRUCT_SIZE_V1) == 120 &&
                 SK_VERSION_SIZE(sk_engine_options, SK_ENGINE_OPTIONS_STRUCT_SIZE_V1) == 32 &&
                 SK_VERSION_SIZE(sk_optimizer_options, SK_OPTIMIZER_OPTIONS_STRUCT_SIZE_V1) == 48 &&
                 SK_VERSION_SIZE(sk_plan_candidate, SK_PLAN_CANDIDATE_STRUCT_SIZE_V1) == 136,
                 "first versions' sizes");
#endif /* LP64 */

#endif /* SHARDKIT_CAPI_ABI_LAYOUT_H_ */
