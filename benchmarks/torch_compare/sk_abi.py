"""shardkit's C ABI (capi/include/shardkit/shardkit.h) through ctypes.

Shared by the optional PyTorch comparisons beside it (compare.py on CPU,
gpu_vs_torch.py on a GPU). Only the structs and entry points they use, laid
out as the header lays them out; the sizes the header asserts
(SK_LAYOUT_ASSERT) are checked at import, so a header change that this file
misses fails here instead of passing garbage to the library.
"""

import ctypes

# Enum values of the header (explicit there, never renumbered).
SK_DTYPE_F32, SK_DTYPE_BF16 = 1, 2
SK_SHARDING_FULL_SHARD = 1
SK_OPTIMIZER_ADAMW = 3
SK_PARALLELISM_FSDP, SK_PARALLELISM_DDP = 1, 2
SK_DEVICE_CPU, SK_DEVICE_CUDA = 1, 2


class SkGlooOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int32),
                ("world_size", ctypes.c_int32), ("master_addr", ctypes.c_char_p),
                ("master_port", ctypes.c_int32), ("hostname", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_int64), ("check_desync", ctypes.c_int32),
                ("network_model", ctypes.c_char_p)]


class SkFsdpOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("strategy", ctypes.c_int32),
                ("shard_group_size", ctypes.c_int32), ("backward_prefetch", ctypes.c_int32),
                ("forward_prefetch", ctypes.c_int32), ("all_gather_limit", ctypes.c_int32),
                ("param_dtype", ctypes.c_int32), ("reduce_dtype", ctypes.c_int32),
                ("buffer_dtype", ctypes.c_int32), ("cpu_offload", ctypes.c_int32),
                ("gradient_predivide_factor", ctypes.c_float), ("seed", ctypes.c_uint64),
                ("timeout_ms", ctypes.c_int64)]


class SkOptimizerOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("kind", ctypes.c_int32),
                ("lr", ctypes.c_float), ("momentum", ctypes.c_float),
                ("dampening", ctypes.c_float), ("nesterov", ctypes.c_int32),
                ("beta1", ctypes.c_float), ("beta2", ctypes.c_float), ("eps", ctypes.c_float),
                ("weight_decay", ctypes.c_float)]


class SkDeviceOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("kind", ctypes.c_int32),
                ("use_index", ctypes.c_int32), ("index", ctypes.c_int32),
                ("sim_profile", ctypes.c_char_p), ("sim_world_size", ctypes.c_int32),
                ("sim_gpus_per_node", ctypes.c_int32), ("launch_blocking", ctypes.c_int32)]


class SkTrainerOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("model", ctypes.c_char_p),
                ("fsdp", ctypes.POINTER(SkFsdpOptions)),
                ("optimizer", ctypes.POINTER(SkOptimizerOptions)),
                ("batch_size", ctypes.c_int64), ("grad_accum_steps", ctypes.c_int32),
                ("seq_len", ctypes.c_int64), ("source_len", ctypes.c_int64),
                ("clip_grad_norm", ctypes.c_double), ("activation_checkpointing", ctypes.c_int32),
                ("memory_cap_bytes", ctypes.c_uint64), ("data_path", ctypes.c_char_p),
                ("data_token_bytes", ctypes.c_int32), ("data_seed", ctypes.c_uint64),
                ("data_tokens", ctypes.c_int64), ("parallelism", ctypes.c_int32),
                ("ddp_bucket_bytes", ctypes.c_int64),
                ("device", ctypes.POINTER(SkDeviceOptions))]


class SkStepMetrics(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("step", ctypes.c_int64),
                ("rank", ctypes.c_int32), ("loss", ctypes.c_float),
                ("grad_norm", ctypes.c_double), ("step_seconds", ctypes.c_double),
                ("tokens_per_second", ctypes.c_double), ("model_tflops_per_rank", ctypes.c_double),
                ("hardware_tflops_per_rank", ctypes.c_double),
                ("peak_allocated_bytes", ctypes.c_int64), ("peak_reserved_bytes", ctypes.c_int64),
                ("allocated_bytes", ctypes.c_int64), ("reserved_bytes", ctypes.c_int64),
                ("alloc_retries", ctypes.c_int64), ("ooms", ctypes.c_int64),
                ("bytes_communicated", ctypes.c_int64), ("global_loss", ctypes.c_float),
                ("simulated", ctypes.c_int32)]


# Sizes the header asserts (SK_LAYOUT_ASSERT): a mismatch means this file and
# the library disagree, so refuse rather than pass garbage.
for _s, _n in ((SkGlooOptions, 64), (SkFsdpOptions, 64), (SkOptimizerOptions, 48),
               (SkDeviceOptions, 48), (SkTrainerOptions, 144), (SkStepMetrics, 128)):
    assert ctypes.sizeof(_s) == _n, (_s.__name__, ctypes.sizeof(_s), _n)


def load_shardkit(path):
    lib = ctypes.CDLL(path)
    lib.sk_last_error_message.restype = ctypes.c_char_p
    lib.sk_version.restype = ctypes.c_char_p
    lib.sk_process_group_create_gloo.argtypes = [ctypes.POINTER(SkGlooOptions),
                                                 ctypes.POINTER(ctypes.c_void_p)]
    lib.sk_process_group_create_local.argtypes = [ctypes.c_int32, ctypes.c_char_p,
                                                  ctypes.POINTER(ctypes.c_void_p)]
    lib.sk_trainer_create.argtypes = [ctypes.POINTER(SkTrainerOptions), ctypes.c_void_p,
                                      ctypes.POINTER(ctypes.c_void_p)]
    lib.sk_trainer_step.argtypes = [ctypes.c_void_p, ctypes.POINTER(SkStepMetrics)]
    lib.sk_trainer_num_parameters.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    lib.sk_trainer_destroy.argtypes = [ctypes.c_void_p]
    lib.sk_process_group_destroy.argtypes = [ctypes.c_void_p]
    lib.sk_model_num_parameters.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]
    return lib


def sk_check(lib, status, what):
    if status != 0:
        raise RuntimeError("shardkit %s: status %d: %s" %
                           (what, status, lib.sk_last_error_message().decode()))


def fsdp_options(param_dtype, forward_prefetch=False):
    """FULL_SHARD with `param_dtype` ("f32" or "bf16": gathers and computes
    in bf16 on f32 master weights) and gradients reduced in f32, as
    PyTorch's MixedPrecisionPolicy(param_dtype, reduce_dtype=float32) and
    autocast's f32 gradients do."""
    fsdp = SkFsdpOptions()
    fsdp.struct_size = ctypes.sizeof(SkFsdpOptions)
    fsdp.strategy = SK_SHARDING_FULL_SHARD
    fsdp.param_dtype = SK_DTYPE_BF16 if param_dtype == "bf16" else SK_DTYPE_F32
    fsdp.reduce_dtype = SK_DTYPE_F32
    fsdp.forward_prefetch = 1 if forward_prefetch else 0
    return fsdp


def adamw_options(lr, betas, eps, weight_decay):
    return SkOptimizerOptions(ctypes.sizeof(SkOptimizerOptions), SK_OPTIMIZER_ADAMW, lr, 0.0, 0.0,
                              0, betas[0], betas[1], eps, weight_decay)


def new_step_metrics():
    m = SkStepMetrics()
    m.struct_size = ctypes.sizeof(SkStepMetrics)
    return m
