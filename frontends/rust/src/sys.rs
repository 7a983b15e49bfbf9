//! Raw declarations of shardkit.h. `tests/header.rs` checks every function
//! signature and every struct layout here against the header itself, so this
//! file cannot silently drift from the C ABI.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_void};

pub type sk_status_t = i32;
pub const SK_STATUS_OK: sk_status_t = 0;
pub const SK_STATUS_CANCELLED: sk_status_t = 1;
pub const SK_STATUS_UNKNOWN: sk_status_t = 2;
pub const SK_STATUS_INVALID_ARGUMENT: sk_status_t = 3;
pub const SK_STATUS_DEADLINE_EXCEEDED: sk_status_t = 4;
pub const SK_STATUS_NOT_FOUND: sk_status_t = 5;
pub const SK_STATUS_ALREADY_EXISTS: sk_status_t = 6;
pub const SK_STATUS_PERMISSION_DENIED: sk_status_t = 7;
pub const SK_STATUS_RESOURCE_EXHAUSTED: sk_status_t = 8;
pub const SK_STATUS_FAILED_PRECONDITION: sk_status_t = 9;
pub const SK_STATUS_ABORTED: sk_status_t = 10;
pub const SK_STATUS_OUT_OF_RANGE: sk_status_t = 11;
pub const SK_STATUS_UNIMPLEMENTED: sk_status_t = 12;
pub const SK_STATUS_INTERNAL: sk_status_t = 13;
pub const SK_STATUS_UNAVAILABLE: sk_status_t = 14;
pub const SK_STATUS_DATA_LOSS: sk_status_t = 15;

pub type sk_dtype_t = i32;
pub const SK_DTYPE_DEFAULT: sk_dtype_t = 0;
pub const SK_DTYPE_F32: sk_dtype_t = 1;
pub const SK_DTYPE_BF16: sk_dtype_t = 2;
pub const SK_DTYPE_F16: sk_dtype_t = 3;
pub const SK_DTYPE_F64: sk_dtype_t = 4;
pub const SK_DTYPE_I32: sk_dtype_t = 5;
pub const SK_DTYPE_I64: sk_dtype_t = 6;

pub type sk_sharding_strategy_t = i32;
pub const SK_SHARDING_DEFAULT: sk_sharding_strategy_t = 0;
pub const SK_SHARDING_FULL_SHARD: sk_sharding_strategy_t = 1;
pub const SK_SHARDING_SHARD_GRAD_OP: sk_sharding_strategy_t = 2;
pub const SK_SHARDING_SHARD_OPTIM: sk_sharding_strategy_t = 3;
pub const SK_SHARDING_NO_SHARD: sk_sharding_strategy_t = 4;
pub const SK_SHARDING_HYBRID_SHARD: sk_sharding_strategy_t = 5;
pub const SK_SHARDING_HYBRID_SHARD_GRAD_OP: sk_sharding_strategy_t = 6;

pub type sk_backward_prefetch_t = i32;
pub const SK_BACKWARD_PREFETCH_DEFAULT: sk_backward_prefetch_t = 0;
pub const SK_BACKWARD_PREFETCH_NONE: sk_backward_prefetch_t = 1;
pub const SK_BACKWARD_PREFETCH_PRE: sk_backward_prefetch_t = 2;
pub const SK_BACKWARD_PREFETCH_POST: sk_backward_prefetch_t = 3;

pub type sk_optimizer_kind_t = i32;
pub const SK_OPTIMIZER_DEFAULT: sk_optimizer_kind_t = 0;
pub const SK_OPTIMIZER_SGD: sk_optimizer_kind_t = 1;
pub const SK_OPTIMIZER_ADAM: sk_optimizer_kind_t = 2;
pub const SK_OPTIMIZER_ADAMW: sk_optimizer_kind_t = 3;

pub type sk_init_kind_t = i32;
pub const SK_INIT_DEFAULT: sk_init_kind_t = 0;
pub const SK_INIT_ZEROS: sk_init_kind_t = 1;
pub const SK_INIT_ONES: sk_init_kind_t = 2;
pub const SK_INIT_NORMAL: sk_init_kind_t = 3;
pub const SK_INIT_UNIFORM: sk_init_kind_t = 4;

pub type sk_parallelism_t = i32;
pub const SK_PARALLELISM_DEFAULT: sk_parallelism_t = 0;
pub const SK_PARALLELISM_FSDP: sk_parallelism_t = 1;
pub const SK_PARALLELISM_DDP: sk_parallelism_t = 2;

pub type sk_activation_checkpointing_t = i32;
pub const SK_CHECKPOINTING_OFF: sk_activation_checkpointing_t = 0;
pub const SK_CHECKPOINTING_FULL: sk_activation_checkpointing_t = 1;
pub const SK_CHECKPOINTING_SELECTIVE: sk_activation_checkpointing_t = 2;
pub const SK_CHECKPOINTING_SELECTIVE_ATTENTION: sk_activation_checkpointing_t = 3;
pub const SK_CHECKPOINTING_SELECTIVE_MATMULS: sk_activation_checkpointing_t = 4;

pub type sk_lr_schedule_kind_t = i32;
pub const SK_LR_SCHEDULE_DEFAULT: sk_lr_schedule_kind_t = 0;
pub const SK_LR_SCHEDULE_CONSTANT: sk_lr_schedule_kind_t = 1;
pub const SK_LR_SCHEDULE_COSINE: sk_lr_schedule_kind_t = 2;
pub const SK_LR_SCHEDULE_LINEAR: sk_lr_schedule_kind_t = 3;

pub type sk_dataset_format_t = i32;
pub const SK_DATASET_FORMAT_DEFAULT: sk_dataset_format_t = 0;
pub const SK_DATASET_FORMAT_TOKENS: sk_dataset_format_t = 1;
pub const SK_DATASET_FORMAT_JSONL: sk_dataset_format_t = 2;

pub type sk_token_file_layout_t = i32;
pub const SK_TOKEN_FILE_LAYOUT_AUTO: sk_token_file_layout_t = 0;
pub const SK_TOKEN_FILE_LAYOUT_RAW: sk_token_file_layout_t = 1;
pub const SK_TOKEN_FILE_LAYOUT_LLMC: sk_token_file_layout_t = 2;

pub type sk_grad_accumulation_t = i32;
pub const SK_GRAD_ACCUMULATION_DEFAULT: sk_grad_accumulation_t = 0;
pub const SK_GRAD_ACCUMULATION_SHARDED: sk_grad_accumulation_t = 1;
pub const SK_GRAD_ACCUMULATION_UNSHARDED: sk_grad_accumulation_t = 2;

pub type sk_no_decay_t = i32;
pub const SK_NO_DECAY_NONE: sk_no_decay_t = 0;
pub const SK_NO_DECAY_BIASES_AND_NORMS: sk_no_decay_t = 1;
pub const SK_NO_DECAY_NORMS_BIASES_EMBEDDINGS: sk_no_decay_t = 2;

pub type sk_reduce_op_t = i32;
pub const SK_REDUCE_DEFAULT: sk_reduce_op_t = 0;
pub const SK_REDUCE_SUM: sk_reduce_op_t = 1;
pub const SK_REDUCE_MEAN: sk_reduce_op_t = 2;
pub const SK_REDUCE_MAX: sk_reduce_op_t = 3;
pub const SK_REDUCE_MIN: sk_reduce_op_t = 4;

pub type sk_device_kind_t = i32;
pub const SK_DEVICE_DEFAULT: sk_device_kind_t = 0;
pub const SK_DEVICE_CPU: sk_device_kind_t = 1;
pub const SK_DEVICE_CUDA: sk_device_kind_t = 2;
pub const SK_DEVICE_SIM: sk_device_kind_t = 3;

pub type sk_weight_layout_t = i32;
pub const SK_WEIGHT_LAYOUT_DEFAULT: sk_weight_layout_t = 0;
pub const SK_WEIGHT_LAYOUT_SHARDKIT: sk_weight_layout_t = 1;
pub const SK_WEIGHT_LAYOUT_TORCH: sk_weight_layout_t = 2;
pub const SK_WEIGHT_LAYOUT_HF_GPT2: sk_weight_layout_t = 3;
pub const SK_WEIGHT_LAYOUT_HF_LLAMA: sk_weight_layout_t = 4;

pub const SK_MAX_DIMS: i32 = 8;

#[repr(C)]
pub struct sk_process_group {
    _private: [u8; 0],
}
#[repr(C)]
pub struct sk_trainer {
    _private: [u8; 0],
}
#[repr(C)]
pub struct sk_local_session {
    _private: [u8; 0],
}
#[repr(C)]
pub struct sk_model_spec {
    _private: [u8; 0],
}
#[repr(C)]
pub struct sk_engine {
    _private: [u8; 0],
}
#[repr(C)]
pub struct sk_stream {
    _private: [u8; 0],
}

pub type sk_stream_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

pub type sk_rank_fn = Option<
    unsafe extern "C" fn(rank: i32, group: *mut sk_process_group, user_data: *mut c_void) -> sk_status_t,
>;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_gloo_options {
    pub struct_size: usize,
    pub rank: i32,
    pub world_size: i32,
    pub master_addr: *const c_char,
    pub master_port: i32,
    pub hostname: *const c_char,
    pub timeout_ms: i64,
    pub check_desync: i32,
    pub network_model: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_nccl_options {
    pub struct_size: usize,
    pub rank: i32,
    pub world_size: i32,
    pub master_addr: *const c_char,
    pub master_port: i32,
    pub use_device: i32,
    pub device: i32,
    pub timeout_ms: i64,
    pub skip_call_check: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_fsdp_options {
    pub struct_size: usize,
    pub strategy: sk_sharding_strategy_t,
    pub shard_group_size: i32,
    pub backward_prefetch: sk_backward_prefetch_t,
    pub forward_prefetch: i32,
    pub all_gather_limit: i32,
    pub param_dtype: sk_dtype_t,
    pub reduce_dtype: sk_dtype_t,
    pub buffer_dtype: sk_dtype_t,
    pub cpu_offload: i32,
    pub gradient_predivide_factor: f32,
    pub seed: u64,
    pub timeout_ms: i64,
    pub grad_accumulation: sk_grad_accumulation_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_optimizer_options {
    pub struct_size: usize,
    pub kind: sk_optimizer_kind_t,
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub nesterov: i32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub param_groups: *const sk_param_group,
    pub num_param_groups: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_param_group {
    pub struct_size: usize,
    pub pattern: *const c_char,
    pub norms_biases_embeddings: i32,
    pub weight_decay: f32,
    pub lr_multiplier: f32,
    pub inherit_weight_decay: i32,
    pub no_decay: sk_no_decay_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_lr_schedule {
    pub struct_size: usize,
    pub kind: sk_lr_schedule_kind_t,
    pub min_lr: f32,
    pub warmup_steps: i64,
    pub decay_steps: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_dataset_options {
    pub struct_size: usize,
    pub paths: *const *const c_char,
    pub num_paths: i32,
    pub format: sk_dataset_format_t,
    pub token_file_layout: sk_token_file_layout_t,
    pub token_bytes: i32,
    pub seed: u64,
    pub sequential: i32,
    pub packing: i32,
    pub eos_id: i64,
    pub has_eos_id: i32,
    pub num_eval_paths: i32,
    pub eval_paths: *const *const c_char,
}

/// 0.8.0: one micro-batch from the caller (shardkit.h: sk_batch).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_batch {
    pub struct_size: usize,
    pub batch_size: i64,
    pub seq_len: i64,
    pub input_ids: *const i32,
    pub targets: *const i32,
    pub loss_mask: *const u8,
    pub position_ids: *const i32,
    pub segment_ids: *const i32,
}

pub const SK_IGNORE_INDEX: i32 = -100;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_trainer_options {
    pub struct_size: usize,
    pub model: *const c_char,
    pub fsdp: *const sk_fsdp_options,
    pub optimizer: *const sk_optimizer_options,
    pub batch_size: i64,
    pub grad_accum_steps: i32,
    pub seq_len: i64,
    pub source_len: i64,
    pub clip_grad_norm: f64,
    pub activation_checkpointing: i32,
    pub memory_cap_bytes: u64,
    pub data_path: *const c_char,
    pub data_token_bytes: i32,
    pub data_seed: u64,
    pub data_tokens: i64,
    pub parallelism: sk_parallelism_t,
    pub ddp_bucket_bytes: i64,
    pub device: *const sk_device_options,
    pub lr_schedule: *const sk_lr_schedule,
    pub dataset: *const sk_dataset_options,
    pub skip_init: i32,
    pub skip_nonfinite_steps: i32,
    pub packed_documents: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_device_options {
    pub struct_size: usize,
    pub kind: sk_device_kind_t,
    pub use_index: i32,
    pub index: i32,
    pub sim_profile: *const c_char,
    pub sim_world_size: i32,
    pub sim_gpus_per_node: i32,
    pub launch_blocking: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct sk_step_metrics {
    pub struct_size: usize,
    pub step: i64,
    pub rank: i32,
    pub loss: f32,
    pub grad_norm: f64,
    pub step_seconds: f64,
    pub tokens_per_second: f64,
    pub model_tflops_per_rank: f64,
    pub hardware_tflops_per_rank: f64,
    pub peak_allocated_bytes: i64,
    pub peak_reserved_bytes: i64,
    pub allocated_bytes: i64,
    pub reserved_bytes: i64,
    pub alloc_retries: i64,
    pub ooms: i64,
    pub bytes_communicated: i64,
    pub global_loss: f32,
    pub simulated: i32,
    pub lr: f32,
    pub skipped: i32,
    pub target_tokens: i64,
    pub global_target_tokens: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct sk_memory_estimate {
    pub struct_size: usize,
    pub parameters: i64,
    pub master_bytes: i64,
    pub grad_shard_bytes: i64,
    pub optimizer_bytes: i64,
    pub persistent_bytes: i64,
    pub unsharded_bytes: i64,
    pub activation_bytes: i64,
    pub peak_bytes: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_param_spec {
    pub struct_size: usize,
    pub name: *const c_char,
    pub ndim: i32,
    pub shape: *const i64,
    pub dtype: sk_dtype_t,
    pub init: sk_init_kind_t,
    pub init_a: f32,
    pub init_b: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_engine_options {
    pub struct_size: usize,
    pub fsdp: *const sk_fsdp_options,
    pub optimizer: *const sk_optimizer_options,
    pub memory_cap_bytes: u64,
    pub device: *const sk_device_options,
    pub cuda_stream: *mut c_void,
    pub custom_optimizer: *const c_char,
    pub custom_state_names: *const *const c_char,
    pub num_custom_states: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_shard_piece {
    pub struct_size: usize,
    pub name: *const c_char,
    pub param: i32,
    pub ndim: i32,
    pub shape: *const i64,
    pub shard_offset: i64,
    pub numel: i64,
    pub param_offset: i64,
    pub param_group: i32,
    pub weight_decay: f32,
    pub lr_multiplier: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_tensor_view {
    pub struct_size: usize,
    pub data: *mut c_void,
    pub dtype: sk_dtype_t,
    pub ndim: i32,
    pub shape: *const i64,
    pub numel: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_plan_request {
    pub struct_size: usize,
    pub model: *const c_char,
    pub profile: *const c_char,
    pub gpus: i32,
    pub gpus_per_node: i32,
    pub batch_size: i64,
    pub seq_len: i64,
    pub source_len: i64,
    pub strategies: *const c_char,
    pub dtypes: *const c_char,
    pub activation_checkpointing: i32,
    pub cpu_offload: i32,
    pub trace_path: *const c_char,
    pub checkpointing: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_plan_candidate {
    pub struct_size: usize,
    pub label: *const c_char,
    pub parallelism: sk_parallelism_t,
    pub strategy: sk_sharding_strategy_t,
    pub shard_group_size: i32,
    pub backward_prefetch: sk_backward_prefetch_t,
    pub forward_prefetch: i32,
    pub rate_limit: i32,
    pub activation_checkpointing: i32,
    pub cpu_offload: i32,
    pub param_dtype: sk_dtype_t,
    pub reduce_dtype: sk_dtype_t,
    pub fits: i32,
    pub out_of_memory: i32,
    pub error: *const c_char,
    pub peak_allocated_bytes: i64,
    pub peak_reserved_bytes: i64,
    pub alloc_retries: i64,
    pub required_bytes: i64,
    pub step_seconds: f64,
    pub tflops_per_gpu: f64,
    pub mfu: f64,
    pub exposed_comm_seconds: f64,
    pub peak_host_bytes: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct sk_plan_result {
    pub struct_size: usize,
    pub profile: *const c_char,
    pub device_memory_bytes: i64,
    pub num_candidates: i32,
    pub recommended: i32,
    pub recommendation: *const c_char,
    pub table: *const c_char,
    pub json: *const c_char,
}

extern "C" {
    pub fn sk_status_name(code: sk_status_t) -> *const c_char;
    pub fn sk_last_error_message() -> *const c_char;
    pub fn sk_version() -> *const c_char;
    pub fn sk_version_number() -> i32;

    pub fn sk_parse_sharding_strategy(name: *const c_char, out: *mut sk_sharding_strategy_t) -> sk_status_t;
    pub fn sk_parse_backward_prefetch(name: *const c_char, out: *mut sk_backward_prefetch_t) -> sk_status_t;
    pub fn sk_parse_dtype(name: *const c_char, out: *mut sk_dtype_t) -> sk_status_t;
    pub fn sk_parse_weight_layout(name: *const c_char, out: *mut sk_weight_layout_t) -> sk_status_t;

    pub fn sk_process_group_create_local(
        world_size: i32,
        network_model: *const c_char,
        out_groups: *mut *mut sk_process_group,
    ) -> sk_status_t;
    pub fn sk_process_group_create_gloo(
        options: *const sk_gloo_options,
        out_group: *mut *mut sk_process_group,
    ) -> sk_status_t;
    pub fn sk_process_group_create_nccl(
        options: *const sk_nccl_options,
        out_group: *mut *mut sk_process_group,
    ) -> sk_status_t;
    pub fn sk_process_group_destroy(group: *mut sk_process_group);
    pub fn sk_process_group_rank(group: *const sk_process_group, out_rank: *mut i32) -> sk_status_t;
    pub fn sk_process_group_size(group: *const sk_process_group, out_size: *mut i32) -> sk_status_t;
    pub fn sk_process_group_label(group: *const sk_process_group, out_label: *mut *const c_char) -> sk_status_t;
    pub fn sk_run_local_ranks(
        world_size: i32,
        network_model: *const c_char,
        fn_: sk_rank_fn,
        user_data: *mut c_void,
    ) -> sk_status_t;

    pub fn sk_trainer_create(
        options: *const sk_trainer_options,
        group: *mut sk_process_group,
        out_trainer: *mut *mut sk_trainer,
    ) -> sk_status_t;
    pub fn sk_trainer_destroy(trainer: *mut sk_trainer);
    pub fn sk_trainer_step(trainer: *mut sk_trainer, out_metrics: *mut sk_step_metrics) -> sk_status_t;
    pub fn sk_trainer_step_batches(
        trainer: *mut sk_trainer,
        micro_batches: *mut *const sk_batch,
        num_micro_batches: i32,
        out_metrics: *mut sk_step_metrics,
    ) -> sk_status_t;
    pub fn sk_process_group_all_reduce(
        group: *mut sk_process_group,
        data: *mut c_void,
        count: i64,
        dtype: sk_dtype_t,
        op: sk_reduce_op_t,
    ) -> sk_status_t;
    pub fn sk_process_group_broadcast(
        group: *mut sk_process_group,
        data: *mut c_void,
        count: i64,
        dtype: sk_dtype_t,
        root: i32,
    ) -> sk_status_t;
    pub fn sk_process_group_all_gather(
        group: *mut sk_process_group,
        input: *const c_void,
        output: *mut c_void,
        count: i64,
        dtype: sk_dtype_t,
    ) -> sk_status_t;
    pub fn sk_process_group_barrier(group: *mut sk_process_group) -> sk_status_t;
    pub fn sk_trainer_set_lr(trainer: *mut sk_trainer, lr: f32) -> sk_status_t;
    pub fn sk_trainer_get_lr(trainer: *const sk_trainer, out_lr: *mut f32) -> sk_status_t;
    pub fn sk_trainer_evaluate(trainer: *mut sk_trainer, batches: i32, out_loss: *mut f32) -> sk_status_t;
    pub fn sk_trainer_data_position(
        trainer: *const sk_trainer,
        out_samples_consumed: *mut i64,
        out_samples_per_epoch: *mut i64,
    ) -> sk_status_t;
    pub fn sk_trainer_last_sample_ids(
        trainer: *const sk_trainer,
        out_ids: *mut i64,
        capacity: i64,
        out_count: *mut i64,
    ) -> sk_status_t;
    pub fn sk_trainer_num_parameters(trainer: *const sk_trainer, out_count: *mut i64) -> sk_status_t;
    pub fn sk_model_num_parameters(model: *const c_char, out_count: *mut i64) -> sk_status_t;
    pub fn sk_trainer_save_checkpoint(trainer: *mut sk_trainer, dir: *const c_char) -> sk_status_t;
    pub fn sk_trainer_load_checkpoint(trainer: *mut sk_trainer, dir: *const c_char, out_step: *mut i64) -> sk_status_t;
    pub fn sk_trainer_save_checkpoint_rotating(trainer: *mut sk_trainer, dir_root: *const c_char, keep: i32)
        -> sk_status_t;
    pub fn sk_trainer_resume_latest(trainer: *mut sk_trainer, dir_root: *const c_char, out_step: *mut i64)
        -> sk_status_t;
    pub fn sk_trainer_save_state_dict(
        trainer: *mut sk_trainer,
        path: *const c_char,
        layout: sk_weight_layout_t,
    ) -> sk_status_t;
    pub fn sk_trainer_load_state_dict(
        trainer: *mut sk_trainer,
        path: *const c_char,
        layout: sk_weight_layout_t,
        out_step: *mut i64,
    ) -> sk_status_t;
    pub fn sk_estimate_memory(
        options: *const sk_trainer_options,
        world_size: i32,
        out: *mut sk_memory_estimate,
    ) -> sk_status_t;

    pub fn sk_plan(request: *const sk_plan_request, out_result: *mut *mut sk_plan_result) -> sk_status_t;
    pub fn sk_plan_result_candidate(
        result: *const sk_plan_result,
        index: i32,
        out: *mut sk_plan_candidate,
    ) -> sk_status_t;
    pub fn sk_plan_result_free(result: *mut sk_plan_result);

    pub fn sk_local_session_create(
        options: *const sk_trainer_options,
        world_size: i32,
        network_model: *const c_char,
        out_session: *mut *mut sk_local_session,
    ) -> sk_status_t;
    pub fn sk_local_session_destroy(session: *mut sk_local_session);
    pub fn sk_local_session_step(session: *mut sk_local_session, out_rank0: *mut sk_step_metrics) -> sk_status_t;
    pub fn sk_local_session_step_batches(
        session: *mut sk_local_session,
        batches: *mut *const sk_batch,
        num_batches: i32,
        out_rank0: *mut sk_step_metrics,
    ) -> sk_status_t;
    pub fn sk_local_session_metrics(
        session: *const sk_local_session,
        rank: i32,
        out_metrics: *mut sk_step_metrics,
    ) -> sk_status_t;
    pub fn sk_local_session_set_lr(session: *mut sk_local_session, lr: f32) -> sk_status_t;
    pub fn sk_local_session_evaluate(session: *mut sk_local_session, batches: i32, out_loss: *mut f32) -> sk_status_t;
    pub fn sk_local_session_world_size(session: *const sk_local_session, out_world_size: *mut i32) -> sk_status_t;
    pub fn sk_local_session_save_checkpoint(session: *mut sk_local_session, dir: *const c_char) -> sk_status_t;
    pub fn sk_local_session_load_checkpoint(
        session: *mut sk_local_session,
        dir: *const c_char,
        out_step: *mut i64,
    ) -> sk_status_t;
    pub fn sk_local_session_save_state_dict(
        session: *mut sk_local_session,
        path: *const c_char,
        layout: sk_weight_layout_t,
    ) -> sk_status_t;
    pub fn sk_local_session_load_state_dict(
        session: *mut sk_local_session,
        path: *const c_char,
        layout: sk_weight_layout_t,
        out_step: *mut i64,
    ) -> sk_status_t;

    pub fn sk_model_spec_create(out_spec: *mut *mut sk_model_spec) -> sk_status_t;
    pub fn sk_model_spec_destroy(spec: *mut sk_model_spec);
    pub fn sk_model_spec_add_unit(spec: *mut sk_model_spec, name: *const c_char, out_unit: *mut i32) -> sk_status_t;
    pub fn sk_model_spec_add_param(
        spec: *mut sk_model_spec,
        unit: i32,
        param: *const sk_param_spec,
        out_param: *mut i32,
    ) -> sk_status_t;
    pub fn sk_model_spec_add_tied_param(
        spec: *mut sk_model_spec,
        unit: i32,
        name: *const c_char,
        owner_unit: i32,
        owner_param: i32,
        out_param: *mut i32,
    ) -> sk_status_t;

    pub fn sk_engine_create(
        spec: *const sk_model_spec,
        group: *mut sk_process_group,
        options: *const sk_engine_options,
        out_engine: *mut *mut sk_engine,
    ) -> sk_status_t;
    pub fn sk_engine_destroy(engine: *mut sk_engine);
    pub fn sk_engine_num_units(engine: *const sk_engine, out_units: *mut i32) -> sk_status_t;
    pub fn sk_engine_pre_forward(engine: *mut sk_engine, unit: i32) -> sk_status_t;
    pub fn sk_engine_post_forward(engine: *mut sk_engine, unit: i32) -> sk_status_t;
    pub fn sk_engine_pre_backward(engine: *mut sk_engine, unit: i32) -> sk_status_t;
    pub fn sk_engine_post_backward(engine: *mut sk_engine, unit: i32) -> sk_status_t;
    pub fn sk_engine_param(engine: *mut sk_engine, unit: i32, param: i32, out_view: *mut sk_tensor_view) -> sk_status_t;
    pub fn sk_engine_grad(engine: *mut sk_engine, unit: i32, param: i32, out_view: *mut sk_tensor_view) -> sk_status_t;
    pub fn sk_engine_set_gradient_sync(engine: *mut sk_engine, enabled: i32) -> sk_status_t;
    pub fn sk_stream_create(engine: *mut sk_engine, out_stream: *mut *mut sk_stream) -> sk_status_t;
    pub fn sk_stream_wrap_cuda(engine: *mut sk_engine, cuda_stream: *mut c_void, out_stream: *mut *mut sk_stream) -> sk_status_t;
    pub fn sk_stream_enqueue(stream: *mut sk_stream, fn_: sk_stream_fn, user_data: *mut c_void) -> sk_status_t;
    pub fn sk_stream_synchronize(stream: *mut sk_stream) -> sk_status_t;
    pub fn sk_stream_destroy(stream: *mut sk_stream);
    pub fn sk_engine_set_stream(engine: *mut sk_engine, stream: *mut sk_stream) -> sk_status_t;
    pub fn sk_engine_finish_backward(engine: *mut sk_engine) -> sk_status_t;
    pub fn sk_engine_clip_grad_norm(engine: *mut sk_engine, max_norm: f64, out_norm: *mut f64) -> sk_status_t;
    pub fn sk_engine_optimizer_step(engine: *mut sk_engine) -> sk_status_t;
    pub fn sk_engine_zero_grad(engine: *mut sk_engine) -> sk_status_t;
    pub fn sk_engine_write_param(
        engine: *mut sk_engine,
        unit: i32,
        param: i32,
        values: *const f32,
        count: i64,
    ) -> sk_status_t;
    pub fn sk_engine_begin_custom_step(engine: *mut sk_engine) -> sk_status_t;
    pub fn sk_engine_master_shard(engine: *mut sk_engine, unit: i32, out_view: *mut sk_tensor_view) -> sk_status_t;
    pub fn sk_engine_grad_shard(engine: *mut sk_engine, unit: i32, out_view: *mut sk_tensor_view) -> sk_status_t;
    pub fn sk_engine_optimizer_state(
        engine: *mut sk_engine,
        unit: i32,
        index: i32,
        out_view: *mut sk_tensor_view,
    ) -> sk_status_t;
    pub fn sk_engine_end_custom_step(engine: *mut sk_engine) -> sk_status_t;
    pub fn sk_engine_shard_layout(
        engine: *mut sk_engine,
        unit: i32,
        out_shard_index: *mut i32,
        out_num_shards: *mut i32,
        out_num_pieces: *mut i32,
    ) -> sk_status_t;
    pub fn sk_engine_shard_piece(engine: *mut sk_engine, unit: i32, index: i32, out_piece: *mut sk_shard_piece) -> sk_status_t;
    pub fn sk_engine_set_lr(engine: *mut sk_engine, lr: f32) -> sk_status_t;
    pub fn sk_engine_get_lr(engine: *const sk_engine, out_lr: *mut f32) -> sk_status_t;
    pub fn sk_engine_steps(engine: *const sk_engine, out_steps: *mut i64) -> sk_status_t;
    pub fn sk_engine_set_loss_tokens(engine: *mut sk_engine, tokens: i64, out_global_tokens: *mut i64) -> sk_status_t;
    pub fn sk_engine_save_checkpoint(engine: *mut sk_engine, dir: *const c_char) -> sk_status_t;
    pub fn sk_engine_load_checkpoint(engine: *mut sk_engine, dir: *const c_char, out_step: *mut i64) -> sk_status_t;
    pub fn sk_engine_read_param(
        engine: *mut sk_engine,
        unit: i32,
        param: i32,
        out: *mut f32,
        count: i64,
    ) -> sk_status_t;
    pub fn sk_engine_save_state_dict(engine: *mut sk_engine, path: *const c_char, layout: sk_weight_layout_t) -> sk_status_t;
    pub fn sk_engine_load_state_dict(engine: *mut sk_engine, path: *const c_char, layout: sk_weight_layout_t) -> sk_status_t;
}
