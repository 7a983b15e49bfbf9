/*
 * shardkit.h: the stable C ABI of shardkit (libshardkit.so).
 *
 * shardkit is a runtime for fully sharded data-parallel training (FSDP /
 * ZeRO-3). This header is the one contract for every other language: the C++,
 * Rust and Lua frontends call nothing else. It has two levels:
 *
 *   High level  a process group, a trainer built from a named model config,
 *               sk_trainer_step() returning the loss and the measurements.
 *               sk_local_session bundles N local ranks (threads of this
 *               process) so a single-threaded caller trains in three calls.
 *   Low level   the caller computes its own model. It describes the model's
 *               units and parameters (sk_model_spec), creates an FSDP engine,
 *               and drives each unit's lifecycle around its own compute:
 *                 pre_forward -> read gathered parameters -> post_forward
 *                 pre_backward -> read parameters, ADD gradients -> post_backward
 *               then finish_backward, clip_grad_norm, optimizer_step.
 *
 * Conventions (they hold for every function below unless its comment says
 * otherwise):
 *
 *  Errors. Every fallible function returns sk_status_t (SK_STATUS_OK = 0; the
 *  other values are absl's canonical codes and never change). On failure
 *  sk_last_error_message() gives the detail and every out-parameter is left
 *  untouched. No C++ exception ever crosses this boundary.
 *
 *  Handles. Opaque pointers created by sk_*_create and released by the
 *  matching sk_*_destroy, which returns nothing and accepts NULL. A handle
 *  passed to any other function must be live: a NULL handle gives
 *  SK_STATUS_INVALID_ARGUMENT, and so does a destroyed one (the library keeps
 *  a registry of live handles, so a stale pointer is detected rather than
 *  dereferenced; a stale pointer whose address has since been reused by a new
 *  handle of the same type cannot be told apart from it). Objects that depend
 *  on another keep it alive: a trainer or engine holds its process group, so
 *  handles may be destroyed in any order.
 *
 *  Option structs. Each starts with `size_t struct_size`, which the caller
 *  sets to sizeof the struct as its header declares it; the SK_*_INIT macros
 *  do that and zero everything else. Every field's zero value means "the
 *  default" (named in its comment). Fields are only ever appended, so:
 *   - a struct_size smaller than the first version of the struct is
 *     SK_STATUS_INVALID_ARGUMENT;
 *   - a smaller struct from an older header is accepted: the fields it lacks
 *     take their defaults;
 *   - a larger struct from a newer header is accepted when the fields this
 *     library does not know are all zero (defaults), and is
 *     SK_STATUS_INVALID_ARGUMENT otherwise (it asks for something this
 *     version cannot do). struct_size above 65536 is rejected.
 *  Under each struct, two size traits (PJRT's struct-size traits) name the
 *  last field of its first version (SK_*_STRUCT_SIZE_V1, fixed forever) and
 *  of this header's (SK_*_STRUCT_SIZE: name the new field there when
 *  appending one); SK_STRUCT_SIZE(type, last_field) is the offset just
 *  past that field. A
 *  caller's struct_size is the version's size padded to the struct's
 *  alignment (sizeof in that header). The library's build pins every
 *  field's offset, so a layout change cannot ship by accident.
 *  Output structs (sk_step_metrics, sk_tensor_view, sk_memory_estimate)
 *  also begin with struct_size: the library writes only the fields that fit
 *  in it.
 *
 *  Enums. Explicit values, never renumbered; 0 is "default/unset". An
 *  unknown value is SK_STATUS_INVALID_ARGUMENT naming the field. Enum-typed
 *  struct fields are 32 bits wide.
 *
 *  Strings. Strings passed in are NUL-terminated UTF-8, copied by the
 *  library before the call returns. Strings returned are owned by the library;
 *  each function says how long they stay valid.
 *
 *  Threads. Functions marked "thread-safe" may be called concurrently from
 *  any threads. A handle that is not marked so must be used by one thread at a
 *  time (different handles may be used concurrently); a call on a handle
 *  while another thread's call on it runs returns FAILED_PRECONDITION naming
 *  the handle and the call in progress, and changes nothing. That holds for
 *  every call on every kind of handle (a process group's collectives too:
 *  two at once on one rank's handle would interleave), except calls that
 *  only read: several threads may create engines from one model spec at
 *  once (every rank of a local group does) and query one group's rank, size
 *  and label at once, though not while another thread's call changes it.
 *  Streams are thread-safe. An engine between sk_engine_begin_custom_step and
 *  sk_engine_end_custom_step belongs to the thread that began the step:
 *  another thread's calls on it are refused, naming the custom step, until
 *  that thread ends it. No call waits for another thread's call to end. A
 *  handle destroyed while another thread's call uses it is freed when that
 *  call returns. Calls marked
 *  "collective" must be made by every rank of the process group, in the same
 *  order; they block until the peers take part (within the group's timeout).
 *  Every function returns when its work is done, except where its comment
 *  says "enqueued".
 *
 *  Version. SK_VERSION_* give the version this header belongs to;
 *  sk_version() the version of the library actually loaded. What each
 *  version added, and where one changed what a value means, is in the
 *  changelog (docs/abi_changelog.md in shardkit's source tree).
 */
#ifndef SHARDKIT_SHARDKIT_H_
#define SHARDKIT_SHARDKIT_H_

#include <stddef.h>
#include <stdint.h>

/* The size of `type` up to and including `last_field` (see "Option structs"). */
#define SK_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

#if defined(_WIN32)
#define SK_EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define SK_EXPORT __attribute__((visibility("default")))
#else
#define SK_EXPORT
#endif

#if defined(__GNUC__)
#define SK_NODISCARD __attribute__((warn_unused_result))
#else
#define SK_NODISCARD
#endif

/* Enums are 32-bit in both languages. In C++ they get a fixed underlying
 * type as well, so that any 32-bit value a C caller stores (an unknown enum
 * value is INVALID_ARGUMENT, not undefined behaviour) is a valid value of the
 * C++ type. */
#if defined(__cplusplus)
#define SK_ENUM(name) enum name : int32_t
#else
#define SK_ENUM(name) enum name
#endif

#define SK_VERSION_MAJOR 0
#define SK_VERSION_MINOR 8
#define SK_VERSION_PATCH 0
/* MAJOR * 1000000 + MINOR * 1000 + PATCH, as SQLITE_VERSION_NUMBER. */
#define SK_VERSION_NUMBER (SK_VERSION_MAJOR * 1000000 + SK_VERSION_MINOR * 1000 + SK_VERSION_PATCH)
#define SK_VERSION_STRING "0.8.0"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

/* absl's canonical codes, with absl's values. */
typedef SK_ENUM(sk_status_t) {
  SK_STATUS_OK = 0,
  SK_STATUS_CANCELLED = 1,
  SK_STATUS_UNKNOWN = 2,
  SK_STATUS_INVALID_ARGUMENT = 3,   /* bad handle, pointer, enum, size, shape, name */
  SK_STATUS_DEADLINE_EXCEEDED = 4,  /* a peer did not arrive within the timeout */
  SK_STATUS_NOT_FOUND = 5,          /* e.g. an unknown model name */
  SK_STATUS_ALREADY_EXISTS = 6,
  SK_STATUS_PERMISSION_DENIED = 7,
  SK_STATUS_RESOURCE_EXHAUSTED = 8, /* the memory cap was hit, or host memory ran out */
  SK_STATUS_FAILED_PRECONDITION = 9,/* a call in the wrong order or state */
  SK_STATUS_ABORTED = 10,           /* a step skipped: non-finite loss or gradient norm */
  SK_STATUS_OUT_OF_RANGE = 11,      /* an index (unit, parameter, rank) out of range */
  SK_STATUS_UNIMPLEMENTED = 12,
  SK_STATUS_INTERNAL = 13,          /* a bug in shardkit */
  SK_STATUS_UNAVAILABLE = 14,       /* a peer is gone */
  SK_STATUS_DATA_LOSS = 15          /* a data file is truncated or corrupt */
} sk_status_t;

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN_CODE" for other values. A static
 * string. Thread-safe. */
SK_EXPORT const char* sk_status_name(sk_status_t code);

/* The message of the last failed call made by this thread ("" if the last
 * call succeeded: every status-returning call clears it first). Owned by the
 * library, valid until this thread's next call into it. Thread-safe (each
 * thread has its own). */
SK_EXPORT const char* sk_last_error_message(void);

/* ------------------------------------------------------------------------ */
/* Version                                                                   */
/* ------------------------------------------------------------------------ */

/* The loaded library's SK_VERSION_STRING ("0.8.0"). A static string. Thread-safe. */
SK_EXPORT const char* sk_version(void);
/* The loaded library's SK_VERSION_NUMBER. Thread-safe. */
SK_EXPORT int32_t sk_version_number(void);

/* ------------------------------------------------------------------------ */
/* Enums                                                                     */
/* ------------------------------------------------------------------------ */

/* Element types. Master parameters, gradient shards and optimizer state are
 * always f32; bf16/f16 are compute and communication formats. */
typedef SK_ENUM(sk_dtype_t) {
  SK_DTYPE_DEFAULT = 0, /* f32 where a dtype is required, "same as param" elsewhere */
  SK_DTYPE_F32 = 1,
  SK_DTYPE_BF16 = 2,
  SK_DTYPE_F16 = 3,
  /* 0.8.0: for the collectives on the caller's buffers only
   * (sk_process_group_all_reduce, _broadcast, _all_gather); anywhere else
   * they are INVALID_ARGUMENT. */
  SK_DTYPE_F64 = 4,
  SK_DTYPE_I32 = 5,
  SK_DTYPE_I64 = 6
} sk_dtype_t;

/* FSDP sharding strategies (docs/fsdp.md). */
typedef SK_ENUM(sk_sharding_strategy_t) {
  SK_SHARDING_DEFAULT = 0, /* FULL_SHARD */
  SK_SHARDING_FULL_SHARD = 1,          /* ZeRO-3 */
  SK_SHARDING_SHARD_GRAD_OP = 2,       /* ZeRO-2 */
  SK_SHARDING_SHARD_OPTIM = 3,         /* ZeRO-1 */
  SK_SHARDING_NO_SHARD = 4,            /* DDP-like */
  SK_SHARDING_HYBRID_SHARD = 5,        /* FULL_SHARD within shard groups, replicated across */
  SK_SHARDING_HYBRID_SHARD_GRAD_OP = 6
} sk_sharding_strategy_t;

typedef SK_ENUM(sk_backward_prefetch_t) {
  SK_BACKWARD_PREFETCH_DEFAULT = 0, /* BACKWARD_PRE */
  SK_BACKWARD_PREFETCH_NONE = 1,
  SK_BACKWARD_PREFETCH_PRE = 2,
  SK_BACKWARD_PREFETCH_POST = 3
} sk_backward_prefetch_t;

typedef SK_ENUM(sk_optimizer_kind_t) {
  SK_OPTIMIZER_DEFAULT = 0, /* AdamW */
  SK_OPTIMIZER_SGD = 1,
  SK_OPTIMIZER_ADAM = 2,
  SK_OPTIMIZER_ADAMW = 3
} sk_optimizer_kind_t;

/* How a parameter's initial values are drawn. Values are a pure function of
 * (seed, parameter full name "<unit>.<param>", element index), so every
 * sharding and world size initialises the same model. */
typedef SK_ENUM(sk_init_kind_t) {
  SK_INIT_DEFAULT = 0, /* zeros */
  SK_INIT_ZEROS = 1,
  SK_INIT_ONES = 2,
  SK_INIT_NORMAL = 3,  /* mean a, standard deviation b */
  SK_INIT_UNIFORM = 4  /* [a, b) */
} sk_init_kind_t;

/* How a trainer spreads the model over the ranks. */
typedef SK_ENUM(sk_parallelism_t) {
  SK_PARALLELISM_DEFAULT = 0, /* FSDP */
  SK_PARALLELISM_FSDP = 1,    /* fully sharded, as sk_fsdp_options.strategy says */
  SK_PARALLELISM_DDP = 2      /* the DDP baseline: a full replica per rank,
                                 gradients all-reduced in buckets */
} sk_parallelism_t;

/* What each transformer block keeps from its forward for its backward
 * (sk_trainer_options.activation_checkpointing; 0.6.1 gave the values above 1
 * their meaning, which any nonzero value had been whole-block before). The
 * selective policies keep the GEMM outputs and recompute the cheap ops
 * (norms, activations) before each block's backward; GPT and Llama-family
 * models implement them, others (T5, unit tables) refuse them with
 * INVALID_ARGUMENT naming the model. SELECTIVE_MATMULS (0.8.0) is
 * torchtitan's op-level policy: selective, and of each block's GEMMs in
 * forward order every other one's output recomputed (a Llama block keeps
 * q, v, gate and the attention, recomputes k, o's output and up); the Llama
 * family implements it, other models refuse it with INVALID_ARGUMENT.
 * Losses and gradients are the same under every policy; memory and compute
 * differ. */
typedef SK_ENUM(sk_activation_checkpointing_t) {
  SK_CHECKPOINTING_OFF = 0,                  /* default: keep everything */
  SK_CHECKPOINTING_FULL = 1,                 /* keep the block input, recompute the block */
  SK_CHECKPOINTING_SELECTIVE = 2,            /* keep GEMM outputs and attention */
  SK_CHECKPOINTING_SELECTIVE_ATTENTION = 3,  /* selective, and recompute attention from q/k/v */
  SK_CHECKPOINTING_SELECTIVE_MATMULS = 4     /* selective, and every other GEMM recomputed */
} sk_activation_checkpointing_t;

/* The names and tensor layout of a state dict file (0.4.0). */
typedef SK_ENUM(sk_weight_layout_t) {
  SK_WEIGHT_LAYOUT_DEFAULT = 0,  /* SHARDKIT */
  SK_WEIGHT_LAYOUT_SHARDKIT = 1, /* "<unit>.<param>", matmul weights [in, out];
                                    with optimizer state and step */
  SK_WEIGHT_LAYOUT_TORCH = 2,    /* the same names, matmul weights ("*.w")
                                    [out, in] as torch.nn.Linear; weights only */
  SK_WEIGHT_LAYOUT_HF_GPT2 = 3,  /* Hugging Face GPT2LMHeadModel names and
                                    layout (GPT models only); weights only */
  SK_WEIGHT_LAYOUT_HF_LLAMA = 4  /* Hugging Face LlamaForCausalLM and
                                    Qwen2ForCausalLM names and layout
                                    (Llama-family models only); weights only
                                    (appended in 0.6.0) */
} sk_weight_layout_t;

/* Thread-safe. On success stores the value named by `name` ("FULL_SHARD" or
 * "full_shard", ...) in *out. INVALID_ARGUMENT listing the known names. */
SK_EXPORT SK_NODISCARD sk_status_t sk_parse_sharding_strategy(const char* name,
                                                              sk_sharding_strategy_t* out);
/* "NONE", "BACKWARD_PRE", "BACKWARD_POST" (any case). Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_parse_backward_prefetch(const char* name,
                                                              sk_backward_prefetch_t* out);
/* "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"/"half". Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_parse_dtype(const char* name, sk_dtype_t* out);
/* "shardkit", "torch", "hf-gpt2", "hf-llama" (any case). Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_parse_weight_layout(const char* name, sk_weight_layout_t* out);

/* ------------------------------------------------------------------------ */
/* Process groups                                                            */
/* ------------------------------------------------------------------------ */

/* One rank's handle on a group of ranks that run collectives together. */
typedef struct sk_process_group sk_process_group;

/* Creates the `world_size` rank handles of a new `local` group: ranks are
 * threads of this process, collectives move data through shared memory.
 * out_groups[r] receives rank r's handle (the caller provides an array of
 * world_size pointers); each must be destroyed with
 * sk_process_group_destroy. Rank r's collectives must be driven by one thread
 * per rank, all ranks concurrently.
 * `network_model`: NULL for none, or an alpha-beta link model that delays
 * each collective's completion to what that link would take, e.g.
 * "ring:latency_us=5,bandwidth_gbps=12.5" or "tree" (the data still moves).
 * Errors: INVALID_ARGUMENT for world_size outside [1, 4096], NULL out_groups,
 * or a malformed network_model. Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_create_local(int32_t world_size,
                                                                 const char* network_model,
                                                                 sk_process_group** out_groups);

typedef struct sk_gloo_options {
  size_t struct_size;
  /* The group. When world_size is 0, rank, world_size, master_addr and
   * master_port are read from torchrun's environment variables RANK,
   * WORLD_SIZE, MASTER_ADDR, MASTER_PORT (what `launch` and torchrun set). */
  int32_t rank;
  int32_t world_size;
  const char* master_addr; /* rank 0 serves the rendezvous store on master_port */
  int32_t master_port;
  /* The address this rank listens on and advertises. NULL: from the
   * environment, 127.0.0.1 when MASTER_ADDR is a loopback name, else this
   * host's name; with explicit rank/world_size, 127.0.0.1 (set it for a
   * group that spans hosts). */
  const char* hostname;
  /* Rendezvous and collective timeout in milliseconds; 0 = 300000; at most
   * 604800000 (7 days): INVALID_ARGUMENT beyond. */
  int64_t timeout_ms;
  /* Ignored (kept for layout): every collective's call is compared across
     ranks before it runs, always. */
  int32_t check_desync;
  /* As in sk_process_group_create_local; NULL for none. */
  const char* network_model;
} sk_gloo_options;
/* Size traits ("Option structs" above). */
#define SK_GLOO_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_gloo_options, network_model)
#define SK_GLOO_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_gloo_options, network_model)

#define SK_GLOO_OPTIONS_INIT {sizeof(sk_gloo_options), 0, 0, NULL, 0, NULL, 0, 0, NULL}

/* Creates this process's rank of a `gloo` group (ranks are processes on one
 * or many hosts, TCP between them). `options` may be NULL: all from the
 * environment. Collective: blocks until every rank has joined or the timeout
 * passes (DEADLINE_EXCEEDED). Errors: INVALID_ARGUMENT naming a missing or
 * malformed environment variable or option; UNAVAILABLE if the store cannot
 * be reached. Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_create_gloo(const sk_gloo_options* options,
                                                                sk_process_group** out_group);

/* 0.5.0: an `nccl` group: ranks are processes, one GPU each (several may
 * share one GPU for tests: docs/multi_gpu.md); collectives move device
 * memory with NVIDIA NCCL, bootstrapped through the same store as gloo. */
typedef struct sk_nccl_options {
  size_t struct_size;
  /* As in sk_gloo_options: when world_size is 0, rank, world_size,
   * master_addr and master_port come from RANK, WORLD_SIZE, MASTER_ADDR,
   * MASTER_PORT (what `launch`, torchrun and Slurm wrappers set). */
  int32_t rank;
  int32_t world_size;
  const char* master_addr; /* rank 0 serves the rendezvous store on master_port */
  int32_t master_port;
  /* Nonzero: this rank's GPU is cuda:`device`. Zero: SK_CUDA_DEVICE (or its old name
   * SHARDKIT_CUDA_DEVICE; set by `launch --gpus`), else LOCAL_RANK, else 0. */
  int32_t use_device;
  int32_t device;
  /* Rendezvous and collective timeout in milliseconds; 0 = 300000; at most
   * 604800000 (7 days): INVALID_ARGUMENT beyond. A collective that does not
   * complete in time aborts the communicator; the error names the ranks
   * that stopped. */
  int64_t timeout_ms;
  /* Nonzero: do not compare each collective's call across ranks before it
   * runs (saves one store round trip per peer and call; a rank that issues
   * a different collective then hangs until the timeout instead of failing
   * at once with both calls named). */
  int32_t skip_call_check;
} sk_nccl_options;
/* Size traits ("Option structs" above). */
#define SK_NCCL_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_nccl_options, skip_call_check)
#define SK_NCCL_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_nccl_options, skip_call_check)

#define SK_NCCL_OPTIONS_INIT {sizeof(sk_nccl_options), 0, 0, NULL, 0, 0, 0, 0, 0}

/* Creates this process's rank of an `nccl` group on its GPU. `options` may
 * be NULL: all from the environment. Collective: blocks until every rank has
 * joined or the timeout passes (DEADLINE_EXCEEDED naming what it waited
 * for). Trainers and engines created over it compute on the group's GPU
 * (sk_device_options kind 0 or SK_DEVICE_CUDA; another kind or index is
 * INVALID_ARGUMENT). Errors: UNAVAILABLE in a library built without CUDA
 * (saying so), or when the GPU is not visible; INVALID_ARGUMENT naming a
 * missing or malformed environment variable or option. The label is
 * "nccl". Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_create_nccl(const sk_nccl_options* options,
                                                                sk_process_group** out_group);

/* Releases the caller's reference; objects created from the group keep it
 * alive until they are destroyed. For gloo, the last release drains this
 * rank's collectives and runs a final barrier (bounded by the timeout).
 * Accepts NULL. */
SK_EXPORT void sk_process_group_destroy(sk_process_group* group);

/* This handle's rank and the group's size. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_rank(const sk_process_group* group,
                                                         int32_t* out_rank);
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_size(const sk_process_group* group,
                                                         int32_t* out_size);
/* "local", "gloo", or "local + network model (ring, alpha=5 us, beta=12.5
 * GB/s)": what produced any timing measured through it. The string has the
 * lifetime of `group`. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_label(const sk_process_group* group,
                                                          const char** out_label);

/* Runs fn(rank, group, user_data) for every rank of a new local group of
 * `world_size` ranks, each on its own new thread, and returns when all have
 * returned. `group` is borrowed: valid during the call (objects created from
 * it keep it alive longer); do not destroy it. Returns SK_STATUS_OK if every
 * call returned OK, else the code of the lowest failing rank, with a message
 * naming the rank (and that thread's last error message). fn runs on threads
 * the library creates; it must not unwind (throw, panic, longjmp) out of the
 * call. Errors as sk_process_group_create_local, and INVALID_ARGUMENT for a
 * NULL fn. Thread-safe. */
typedef sk_status_t (*sk_rank_fn)(int32_t rank, sk_process_group* group, void* user_data);
SK_EXPORT SK_NODISCARD sk_status_t sk_run_local_ranks(int32_t world_size, const char* network_model,
                                                      sk_rank_fn fn, void* user_data);

/* --- Collectives on the caller's buffers (0.6.0) ---------------------------
 *
 * For a framework's own communication: a loss averaged over ranks, a value
 * broadcast from one rank, a barrier. All are collective (every rank of the
 * group calls them in the same order with the same count, dtype, op and
 * root) and return when the result is in the buffer. Each call is compared
 * across ranks before it runs, as the library's own collectives are: a rank
 * whose call differs fails every rank with INVALID_ARGUMENT naming both
 * calls. Every wait is bounded by the group's timeout (sk_gloo_options /
 * sk_nccl_options timeout_ms; 300 s for local groups): DEADLINE_EXCEEDED
 * naming the collective when a peer does not arrive.
 * Buffers: host memory on local and gloo groups; device memory of the
 * group's GPU on nccl groups. A buffer of the other kind is INVALID_ARGUMENT
 * (where CUDA can tell); so is a NULL buffer with count > 0, a negative
 * count, or an unknown dtype. Since 0.8.0 the buffers may also hold f64,
 * i32 or i64 (SK_DTYPE_F64, _I32, _I64): their all-reduce (SUM, MAX, MIN;
 * MEAN of f64 too, of integers INVALID_ARGUMENT) gathers every rank's
 * buffer and reduces it on each rank in rank order, so every rank gets the
 * same bits; integer sums wrap (two's complement). The group's handle is used by
 * one thread at a time: another thread's collective on it meanwhile is
 * FAILED_PRECONDITION naming the collective in progress (one rank's
 * collectives are driven by one thread, in order). */
typedef SK_ENUM(sk_reduce_op_t) {
  SK_REDUCE_DEFAULT = 0, /* SUM */
  SK_REDUCE_SUM = 1,
  SK_REDUCE_MEAN = 2,    /* the sum divided by the group's size */
  /* The elementwise maximum (NaN wins). An all-gather and a max on each
   * rank: it moves size times the buffer, for metrics and flags. */
  SK_REDUCE_MAX = 3,
  /* 0.8.0: the elementwise minimum (NaN wins), gathered as MAX is. */
  SK_REDUCE_MIN = 4
} sk_reduce_op_t;

/* In place: data[0..count) becomes the reduction over ranks. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_all_reduce(sk_process_group* group, void* data,
                                                               int64_t count, sk_dtype_t dtype,
                                                               sk_reduce_op_t op);
/* In place: every rank's data[0..count) becomes rank `root`'s. OUT_OF_RANGE
 * for a root outside the group. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_broadcast(sk_process_group* group, void* data,
                                                              int64_t count, sk_dtype_t dtype,
                                                              int32_t root);
/* output[r * count .. (r + 1) * count) = rank r's input[0..count); output
 * holds size * count elements and must not overlap input. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_all_gather(sk_process_group* group, const void* input,
                                                               void* output, int64_t count,
                                                               sk_dtype_t dtype);
/* Returns when every rank has called it. */
SK_EXPORT SK_NODISCARD sk_status_t sk_process_group_barrier(sk_process_group* group);

/* ------------------------------------------------------------------------ */
/* Strategy and optimizer options                                            */
/* ------------------------------------------------------------------------ */

/* 0.8.0: how gradients accumulate over the micro-batches of one
 * optimizer step (sk_fsdp_options.grad_accumulation; docs/fsdp.md). Both
 * give the gradient of the mean loss; memory and communication differ. */
typedef SK_ENUM(sk_grad_accumulation_t) {
  /* SHARDED for FULL_SHARD, SHARD_GRAD_OP and the hybrids; UNSHARDED for
   * SHARD_OPTIM and NO_SHARD (which keep full gradients anyway). */
  SK_GRAD_ACCUMULATION_DEFAULT = 0,
  /* Every micro-batch reduce-scatters into the f32 gradient shards (FSDP2
   * with gradient sync left on): unsharded gradients live only during each
   * unit's backward, at a reduction per micro-batch. */
  SK_GRAD_ACCUMULATION_SHARDED = 1,
  /* no_sync: each unit's full gradient accumulates over the micro-batches
   * and is reduced once, by the last: one reduction per step, every unit's
   * full gradient alive through all micro-batches. */
  SK_GRAD_ACCUMULATION_UNSHARDED = 2
} sk_grad_accumulation_t;

typedef struct sk_fsdp_options {
  size_t struct_size;
  sk_sharding_strategy_t strategy;
  /* Ranks per shard group for the hybrid strategies; must divide the world
   * size. 0 = the ranks per node: LOCAL_WORLD_SIZE from the environment (on
   * a simulated world its GPUs per node), which must then divide the world
   * size when below it; unset, the world size (docs/fsdp.md). */
  int32_t shard_group_size;
  sk_backward_prefetch_t backward_prefetch;
  /* Nonzero: prefetch the next unit's all-gather during forward. */
  int32_t forward_prefetch;
  /* Most unsharded units alive at once (the rate limiter); 0 = 2, -1 = no limit. */
  int32_t all_gather_limit;
  /* Compute dtype of gathered parameters; 0 = f32. */
  sk_dtype_t param_dtype;
  /* Gradient communication dtype; 0 = param_dtype. */
  sk_dtype_t reduce_dtype;
  /* Model buffer dtype; 0 = param_dtype. No model has buffers
   * (non-parameter state) for it to apply to, so any value other than 0 or
   * param_dtype is INVALID_ARGUMENT rather than silently ignored. */
  sk_dtype_t buffer_dtype;
  /* Nonzero: master shards, gradient shards and optimizer state in host memory. */
  int32_t cpu_offload;
  /* Gradient pre-division factor; 0 = automatic (largest power of two p
   * dividing N with p * p < N). */
  float gradient_predivide_factor;
  /* Seed of the parameter initialiser (0 is a valid seed). */
  uint64_t seed;
  /* Timeout of every collective in milliseconds; 0 = 300000; at most
   * 604800000 (7 days): INVALID_ARGUMENT beyond. */
  int64_t timeout_ms;
  /* Appended in 0.8.0: how a trainer's grad_accum_steps > 1
   * micro-batches accumulate gradients (sk_grad_accumulation_t; a struct
   * from an older header, which ends at timeout_ms, reads DEFAULT). Applies
   * to trainers, local sessions and sk_estimate_memory; an engine's caller
   * chooses per backward with sk_engine_set_gradient_sync, so
   * sk_engine_create refuses any value but DEFAULT (INVALID_ARGUMENT). */
  sk_grad_accumulation_t grad_accumulation;
} sk_fsdp_options;
/* Size traits ("Option structs" above). */
#define SK_FSDP_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_fsdp_options, timeout_ms)
#define SK_FSDP_OPTIONS_STRUCT_SIZE_V2 SK_STRUCT_SIZE(sk_fsdp_options, grad_accumulation)
#define SK_FSDP_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_fsdp_options, grad_accumulation)

#define SK_FSDP_OPTIONS_INIT {sizeof(sk_fsdp_options), SK_SHARDING_DEFAULT, 0, SK_BACKWARD_PREFETCH_DEFAULT, 0, 0, SK_DTYPE_DEFAULT, SK_DTYPE_DEFAULT, SK_DTYPE_DEFAULT, 0, 0.0f, 0, 0, SK_GRAD_ACCUMULATION_DEFAULT}

/* 0.8.0: the "no weight decay" rules a parameter group selects by
 * (sk_param_group.no_decay). */
typedef SK_ENUM(sk_no_decay_t) {
  SK_NO_DECAY_NONE = 0,
  /* Hugging Face Trainer's default (get_decay_parameter_names): biases and
   * norm weights, i.e. parameters of fewer than two dimensions; embeddings
   * and a head tied to them ARE decayed. The rule to use by default. */
  SK_NO_DECAY_BIASES_AND_NORMS = 1,
  /* The above and embedding tables ("emb", "wte" or "wpe" in the unit or
   * parameter name): what norms_biases_embeddings selects. */
  SK_NO_DECAY_NORMS_BIASES_EMBEDDINGS = 2
} sk_no_decay_t;

/* 0.6.0: a parameter group, per-parameter overrides of the optimizer's weight
 * decay and learning rate (torch.optim's param_groups). A parameter's full
 * name is "<unit>.<param>"; the first group in the list that selects it
 * decides, and a parameter no group selects uses the optimizer's values. */
typedef struct sk_param_group {
  size_t struct_size;
  /* A glob on the full name ('*' any run of characters, '?' one character):
   * "*.b", "ln_f.*" (a whole unit). NULL or "": selects nothing by name. */
  const char* pattern;
  /* Nonzero: also select parameters of fewer than two dimensions (biases,
   * norm gains) and embedding tables (a unit or parameter name containing
   * "emb", "wte" or "wpe"): shardkit's no-decay rule before 0.8.0, the same
   * as no_decay = SK_NO_DECAY_NORMS_BIASES_EMBEDDINGS. Hugging Face's
   * Trainer decays embeddings: use no_decay = SK_NO_DECAY_BIASES_AND_NORMS
   * for its rule. */
  int32_t norms_biases_embeddings;
  /* The group's weight decay, as given (0 = no decay), unless
   * inherit_weight_decay is nonzero (then the optimizer's). */
  float weight_decay;
  /* The group's learning rate is the step's rate times this, as given
   * (0 freezes the group); SK_PARAM_GROUP_INIT sets 1. */
  float lr_multiplier;
  int32_t inherit_weight_decay;
  /* Appended in 0.8.0: also select the parameters of this
   * no-decay rule (sk_no_decay_t; a 0.6.0 struct, which ends at
   * inherit_weight_decay, reads SK_NO_DECAY_NONE). With
   * norms_biases_embeddings nonzero it must be NONE or
   * NORMS_BIASES_EMBEDDINGS; another value is INVALID_ARGUMENT. */
  sk_no_decay_t no_decay;
} sk_param_group;
/* Size traits ("Option structs" above). */
#define SK_PARAM_GROUP_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_param_group, inherit_weight_decay)
#define SK_PARAM_GROUP_STRUCT_SIZE_V2 SK_STRUCT_SIZE(sk_param_group, no_decay)
#define SK_PARAM_GROUP_STRUCT_SIZE SK_STRUCT_SIZE(sk_param_group, no_decay)

#define SK_PARAM_GROUP_INIT {sizeof(sk_param_group), NULL, 0, 0.0f, 1.0f, 0, SK_NO_DECAY_NONE}

typedef struct sk_optimizer_options {
  size_t struct_size;
  sk_optimizer_kind_t kind;
  /* The base learning rate, as given (0 is a rate of 0): the INIT macro sets
   * 1e-3. A struct from a header before 0.6.0 (struct_size 48) reads 0 as
   * 1e-3, as those headers documented. */
  float lr;
  float momentum;      /* SGD; 0 = none */
  float dampening;     /* SGD; 0 = none */
  int32_t nesterov;    /* SGD; nonzero = Nesterov momentum */
  float beta1;         /* Adam/AdamW; 0 = 0.9 */
  float beta2;         /* Adam/AdamW; 0 = 0.999 */
  float eps;           /* Adam/AdamW; 0 = 1e-8 */
  float weight_decay;  /* L2 for SGD and Adam, decoupled for AdamW; 0 = none */
  /* Appended in 0.6.0: num_param_groups groups (copied at creation; NULL
   * when 0). Each is checked (INVALID_ARGUMENT naming it: one that selects
   * nothing, a negative or non-finite multiplier). FSDP only: a DDP trainer
   * with groups is UNIMPLEMENTED. */
  const sk_param_group* param_groups;
  int32_t num_param_groups;
} sk_optimizer_options;
/* Size traits ("Option structs" above); the first version (before 0.6.0) ended at weight_decay. */
#define SK_OPTIMIZER_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_optimizer_options, weight_decay)
#define SK_OPTIMIZER_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_optimizer_options, num_param_groups)

#define SK_OPTIMIZER_OPTIONS_INIT {sizeof(sk_optimizer_options), SK_OPTIMIZER_DEFAULT, 1e-3f, 0.0f, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, NULL, 0}

/* ------------------------------------------------------------------------ */
/* Devices (0.4.0)                                                           */
/* ------------------------------------------------------------------------ */

typedef SK_ENUM(sk_device_kind_t) {
  SK_DEVICE_DEFAULT = 0, /* cpu; on an nccl group (0.5.0), the group's GPU */
  SK_DEVICE_CPU = 1,
  /* A GPU: UNAVAILABLE when the library was built without CUDA or no GPU is
   * visible. */
  SK_DEVICE_CUDA = 2,
  /* The simulator (docs/simulator.md): the same trainer, FSDP, DDP,
   * allocator and optimizer code on virtual time and virtual memory of a
   * hardware profile; one simulated rank stands for a cluster of
   * sim_world_size GPUs. Tensors hold no data: losses and norms are NaN
   * (sk_step_metrics.simulated is set), checkpoints are FAILED_PRECONDITION,
   * cpu_offload runs on the profile's simulated host (FAILED_PRECONDITION
   * for a profile without one: cpu-local). */
  SK_DEVICE_SIM = 3
} sk_device_kind_t;

/* Which device a rank computes on. */
typedef struct sk_device_options {
  size_t struct_size;
  sk_device_kind_t kind;    /* 0 = cpu */
  /* Nonzero: use device `index`; zero: the rank's device (cpu:rank,
   * cuda:(rank modulo the visible GPUs), sim:0). */
  int32_t use_index;
  int32_t index;
  /* SIM only: a built-in profile ("a100-80g", "h100-80g", "h200-141g", "cpu-local") or
   * the path of a .json profile; NULL = "a100-80g". */
  const char* sim_profile;
  int32_t sim_world_size;    /* SIM: ranks of the simulated cluster; 0 = 1 */
  int32_t sim_gpus_per_node; /* SIM: 0 = the profile's */
  /* Nonzero: every launched op, copy and collective completes before the
   * host goes on (CUDA_LAUNCH_BLOCKING=1's analogue; cpu and sim; on cuda
   * INVALID_ARGUMENT: set the environment variable instead). */
  int32_t launch_blocking;
} sk_device_options;
/* Size traits ("Option structs" above). */
#define SK_DEVICE_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_device_options, launch_blocking)
#define SK_DEVICE_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_device_options, launch_blocking)

#define SK_DEVICE_OPTIONS_INIT {sizeof(sk_device_options), SK_DEVICE_DEFAULT, 0, 0, NULL, 0, 0, 0}

/* ------------------------------------------------------------------------ */
/* High level: trainer                                                       */
/* ------------------------------------------------------------------------ */

/* 0.6.0: learning-rate schedules. Step s (0-based) uses
 *   s < warmup_steps:  lr * (s + 1) / warmup_steps
 *   then CONSTANT:     lr
 *        COSINE:       min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
 *        LINEAR:       lr + (min_lr - lr) * p
 * with p = min(1, (s - warmup_steps) / decay_steps) and lr the optimizer's.
 * Checkpoints restore the step, so a resumed run continues the curve. */
typedef SK_ENUM(sk_lr_schedule_kind_t) {
  SK_LR_SCHEDULE_DEFAULT = 0, /* CONSTANT */
  SK_LR_SCHEDULE_CONSTANT = 1,
  SK_LR_SCHEDULE_COSINE = 2,
  SK_LR_SCHEDULE_LINEAR = 3
} sk_lr_schedule_kind_t;

typedef struct sk_lr_schedule {
  size_t struct_size;
  sk_lr_schedule_kind_t kind;
  float min_lr;          /* the floor decay ends at, in [0, lr]; 0 = decay to 0 */
  int64_t warmup_steps;  /* linear warmup steps; 0 = none */
  int64_t decay_steps;   /* COSINE, LINEAR: steps of decay after warmup, >= 1 */
} sk_lr_schedule;
/* Size traits ("Option structs" above). */
#define SK_LR_SCHEDULE_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_lr_schedule, decay_steps)
#define SK_LR_SCHEDULE_STRUCT_SIZE SK_STRUCT_SIZE(sk_lr_schedule, decay_steps)

#define SK_LR_SCHEDULE_INIT {sizeof(sk_lr_schedule), SK_LR_SCHEDULE_DEFAULT, 0.0f, 0, 0}

/* 0.8.0: datasets the trainer reads itself (docs/data.md). The samples are
 * numbered 0..S-1; epoch e visits them in a permutation keyed by (seed, e);
 * step t takes the next G = batch_size * grad_accum_steps * world size of
 * them and rank r the r-th slice. Sharded checkpoints save the position
 * (samples consumed, seed), so a resumed run (also at another world size
 * with the same G) sees the samples the uninterrupted run would have. */
typedef SK_ENUM(sk_dataset_format_t) {
  SK_DATASET_FORMAT_DEFAULT = 0, /* TOKENS */
  /* Flat little-endian token files: nanoGPT's raw uint16/uint32 ".bin", or
   * llm.c's (a 256-int32 header with magic 20240520 or 20240801). Without
   * an EOS id, non-overlapping windows of seq_len + 1 tokens; with one, the
   * documents it ends. */
  SK_DATASET_FORMAT_TOKENS = 1,
  /* One JSON record per line: {"input_ids": [...]} with optional "labels"
   * (aligned with input_ids, -100 = not trained, as transformers takes them)
   * or "loss_mask" (0/1 per token). */
  SK_DATASET_FORMAT_JSONL = 2
} sk_dataset_format_t;

/* How a TOKENS file begins. */
typedef SK_ENUM(sk_token_file_layout_t) {
  SK_TOKEN_FILE_LAYOUT_AUTO = 0, /* llm.c if it starts with an llm.c magic, else RAW */
  SK_TOKEN_FILE_LAYOUT_RAW = 1,  /* tokens only */
  SK_TOKEN_FILE_LAYOUT_LLMC = 2  /* llm.c's 1 KiB header, then tokens */
} sk_token_file_layout_t;

typedef struct sk_dataset_options {
  size_t struct_size;
  /* num_paths (>= 1) files, read in this order as one dataset (shards).
   * Copied at sk_trainer_create; the files stay open for the trainer's life. */
  const char* const* paths;
  int32_t num_paths;
  sk_dataset_format_t format;
  sk_token_file_layout_t token_file_layout; /* TOKENS only */
  int32_t token_bytes;   /* TOKENS: 2 or 4; 0 = 2, or what the llm.c header says */
  uint64_t seed;         /* the order's seed; 0 = 1 */
  int32_t sequential;    /* nonzero: file order every epoch (no shuffle) */
  /* Nonzero: concatenate documents in order and cut rows of seq_len tokens
   * (segment ids and per-document positions travel with each row; TOKENS
   * needs has_eos_id). Zero: one document per row, truncated or padded. */
  int32_t packing;
  int64_t eos_id;        /* the end-of-sequence token, when has_eos_id */
  /* Nonzero: eos_id ends each TOKENS document and is appended to each
   * JSONL record (and pads rows); zero: no EOS (pad token 0). */
  int32_t has_eos_id;
  /* Held-out files for sk_trainer_evaluate (same format; read in file
   * order); 0 = none (evaluate is then FAILED_PRECONDITION). */
  int32_t num_eval_paths;
  const char* const* eval_paths;
} sk_dataset_options;
/* Size traits ("Option structs" above). */
#define SK_DATASET_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_dataset_options, eval_paths)
#define SK_DATASET_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_dataset_options, eval_paths)

#define SK_DATASET_OPTIONS_INIT {sizeof(sk_dataset_options), NULL, 0, SK_DATASET_FORMAT_DEFAULT, SK_TOKEN_FILE_LAYOUT_AUTO, 0, 0, 0, 0, 0, 0, 0, NULL}

/* One rank's trainer: a named model, FSDP (or DDP) around it, an optimizer
 * and a deterministic data stream. */
typedef struct sk_trainer sk_trainer;

typedef struct sk_trainer_options {
  size_t struct_size;
  /* A named model config ("gpt-tiny", "gpt-1m", "gpt-10m", "t5-tiny", ...;
   * the image models "regnet-tiny", "deepvit-tiny", "regnet-9b",
   * "deepvit-8b" take one image per batch entry, seq_len 1;
   * sk_model_num_parameters tells whether a name exists), or the path of a
   * unit-table JSON file (ending in ".json": a network of one's own described
   * unit by unit; format in docs/architecture.md, "Unit tables as JSON").
   * NULL = "gpt-tiny". */
  const char* model;
  const sk_fsdp_options* fsdp;           /* NULL = defaults (FULL_SHARD) */
  const sk_optimizer_options* optimizer; /* NULL = defaults (AdamW, lr 1e-3) */
  int64_t batch_size;        /* sequences per rank per micro-batch; 0 = 2 */
  /* Micro-batches per step; 0 = 1. The step's loss is their mean and its
   * gradient is that loss's gradient (the micro-batches' sum divided by M,
   * PyTorch's (loss / M).backward()), so grad_norm, clip_grad_norm and the
   * learning rate mean the same for every M: M micro-batches of B sequences
   * step as one batch of M * B. (Before 0.3.0 the gradients were summed.) */
  int32_t grad_accum_steps;
  int64_t seq_len;           /* 0 = the config's */
  int64_t source_len;        /* encoder-decoder only; 0 = the config's */
  double clip_grad_norm;     /* clip the total norm to this; 0 = no clipping */
  /* An sk_activation_checkpointing_t (0 = off, 1 = whole block, 2 =
   * selective, 3 = selective with attention recomputed, 4 = selective with
   * every other matmul recomputed, 0.8.0); another value is
   * INVALID_ARGUMENT. Before 0.6.1 any nonzero value meant whole block. */
  int32_t activation_checkpointing;
  uint64_t memory_cap_bytes; /* per-rank device memory cap; 0 = unlimited */
  /* Token file (little-endian uint16 or uint32, no header); NULL = a
   * synthetic stream from data_seed. */
  const char* data_path;
  int32_t data_token_bytes;  /* 2 or 4; 0 = 2 */
  uint64_t data_seed;        /* 0 = 1 */
  int64_t data_tokens;       /* synthetic stream length; 0 = 64 Ki tokens */
  /* Appended in 0.2.0; 0.1.0's struct_size (120) leaves them 0.
   * parallelism 0 = FSDP. Under DDP the sk_fsdp_options fields that are not
   * about sharding (param_dtype, gradient_predivide_factor, seed,
   * timeout_ms) still apply. */
  sk_parallelism_t parallelism;
  int64_t ddp_bucket_bytes;  /* DDP's gradient bucket size; 0 = 25 MiB */
  /* Appended in 0.4.0: the rank's device; NULL = cpu:rank. On SIM,
   * memory_cap_bytes 0 means the profile's device memory. */
  const sk_device_options* device;
  /* Appended in 0.6.0: the learning rate of each step; NULL = constant
   * (the optimizer's lr). INVALID_ARGUMENT naming the field for a bad one. */
  const sk_lr_schedule* lr_schedule;
  /* Appended in 0.8.0: a dataset read in order (sk_dataset_options,
   * docs/data.md) instead of data_path or the synthetic stream; NULL = none.
   * Setting it with data_path is INVALID_ARGUMENT, and so is a model that is
   * not decoder-only (GPT, Llama). */
  const sk_dataset_options* dataset;
  /* Appended in 0.8.0: nonzero: the parameters are not drawn
   * from their initialisers (the shards stay zero), for a trainer whose
   * weights come from a load: sk_trainer_load_state_dict of a Hugging Face
   * directory or state dict, sk_trainer_load_checkpoint or
   * sk_trainer_resume_latest (torch's meta-device creation and
   * from_pretrained; docs/checkpoints.md). Creation then costs no random
   * initialisation. Until a load succeeds, sk_trainer_step,
   * sk_trainer_step_batches, sk_trainer_evaluate and the saves are
   * FAILED_PRECONDITION on every rank, changing nothing. INVALID_ARGUMENT
   * with SK_PARALLELISM_DDP or on the simulator (neither loads weights).
   * Zero (an older struct): initialised as before. */
  int32_t skip_init;
  /* Appended in 0.8.0: what a step whose loss (on any rank) or gradient
   * norm is not finite returns. Either way the update is not applied and
   * parameters and optimizer state stay as they were on every rank. 0:
   * ABORTED on every rank, naming the value and the ranks. 1: OK with
   * sk_step_metrics.skipped set and the step counted (the data moves on), as
   * PyTorch's GradScaler skips such steps and goes on. Other values are
   * INVALID_ARGUMENT. */
  int32_t skip_nonfinite_steps;
  /* Appended in 0.8.0: nonzero: the batches the caller passes
   * (sk_trainer_step_batches, sk_local_session_step_batches) may pack several
   * documents in a row (segment ids), so that sk_estimate_memory counts what
   * packed rows cost where that differs: on CUDA, one attention call's
   * temporaries of the composed path packed rows take (docs/cuda.md, "Packed
   * documents"), as a packing dataset (sk_dataset_options.packing) sets by
   * itself. Training is the same either way: this only declares the batches
   * for the estimate. 0 or 1; other values are INVALID_ARGUMENT. */
  int32_t packed_documents;
} sk_trainer_options;
/* Size traits ("Option structs" above); the first version (0.1.0) ended at data_tokens. */
#define SK_TRAINER_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_trainer_options, data_tokens)
#define SK_TRAINER_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_trainer_options, packed_documents)

#define SK_TRAINER_OPTIONS_INIT {sizeof(sk_trainer_options), NULL, NULL, NULL, 0, 0, 0, 0, 0.0, 0, 0, NULL, 0, 0, 0, SK_PARALLELISM_DEFAULT, 0, NULL, NULL, NULL, 0, 0, 0}

/* What one step measured on one rank. */
typedef struct sk_step_metrics {
  size_t struct_size;              /* set by the caller (SK_STEP_METRICS_INIT) */
  int64_t step;                    /* steps completed, including this one */
  int32_t rank;
  float loss;                      /* THIS RANK's loss: the mean over its micro-batches */
  double grad_norm;                /* total L2 norm before clipping */
  double step_seconds;
  double tokens_per_second;        /* this rank's */
  double model_tflops_per_rank;    /* model FLOPs (no recomputation) / time / 1e12 */
  double hardware_tflops_per_rank; /* with recomputation */
  int64_t peak_allocated_bytes;    /* during this step */
  int64_t peak_reserved_bytes;
  int64_t allocated_bytes;
  int64_t reserved_bytes;
  int64_t alloc_retries;           /* cumulative */
  int64_t ooms;                    /* cumulative */
  int64_t bytes_communicated;      /* this step, as nccl-tests count bytes */
  /* 0.3.0: the global batch's loss, the mean of `loss` over all ranks (the
   * same on every rank). A caller's struct from 0.2.0 ends before it. */
  float global_loss;
  /* 0.4.0: nonzero on the simulator: step_seconds and the rates are virtual
   * time, loss, global_loss and grad_norm are NaN (nothing was computed). */
  int32_t simulated;
  /* 0.6.0: the learning rate this step's update used. */
  float lr;
  /* 0.8.0: nonzero when the step was counted but not applied because its
   * loss or gradient norm was not finite (sk_trainer_options.
   * skip_nonfinite_steps; the same on every rank). */
  int32_t skipped;
  /* 0.8.0: the targets the loss counted (neither
   * SK_IGNORE_INDEX nor masked out): this rank's over its micro-batches
   * (`loss` is their mean), and every rank's (`global_loss` is the mean
   * over these; docs/batches.md). A struct of 136 bytes (0.6.0's, or one
   * ending at skipped) ends before them. */
  int64_t target_tokens;
  int64_t global_target_tokens;
} sk_step_metrics;
/* Size traits ("Option structs" above); the first version (0.2.0's) ended at bytes_communicated. */
#define SK_STEP_METRICS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_step_metrics, bytes_communicated)
#define SK_STEP_METRICS_STRUCT_SIZE SK_STRUCT_SIZE(sk_step_metrics, global_target_tokens)

#define SK_STEP_METRICS_INIT {sizeof(sk_step_metrics), 0, 0, 0.0f, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0.0f, 0, 0, 0}

/* Creates this rank's trainer. Collective over `group`: every rank calls it
 * with the same options. The trainer keeps `group` alive. Parameters are
 * initialised shard by shard (deferred initialisation: the full model never
 * exists on one rank). Errors: INVALID_ARGUMENT naming the bad option;
 * NOT_FOUND for an unknown model (listing the known ones) or data file;
 * RESOURCE_EXHAUSTED if the memory cap is too small for the model state.
 * On SK_DEVICE_SIM `group` may be NULL: the trainer then simulates a world
 * of device->sim_world_size ranks itself (a real group is INVALID_ARGUMENT
 * there: its collectives would move data the simulator does not have, so a
 * local session cannot run on the simulator). */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_create(const sk_trainer_options* options,
                                                     sk_process_group* group,
                                                     sk_trainer** out_trainer);
/* Accepts NULL. Not collective. */
SK_EXPORT void sk_trainer_destroy(sk_trainer* trainer);

/* One optimizer step over grad_accum_steps micro-batches; returns when the
 * step is done (parameters updated). Collective. `out_metrics` may be NULL;
 * otherwise its struct_size must be set. RESOURCE_EXHAUSTED when the memory
 * cap is hit (counted in ooms; the trainer stays usable); DEADLINE_EXCEEDED
 * or UNAVAILABLE when a peer fails. One rank's failure is every rank's: on
 * local and gloo groups every rank's step fails with the failing rank's
 * error ("rank 1 failed step 2: ...") and nothing changes anywhere; except
 * under NO_SHARD and SHARD_OPTIM, when the failure comes after the update,
 * in the regather of the updated parameters ("rank 1 failed step 2 after
 * the update: ..."): then the update is kept and the step counts on every
 * rank, and the next step gathers the parameters again.
 * ABORTED on every rank when the loss on any rank or the gradient norm is
 * not finite: the update is skipped, parameters and optimizer state are
 * unchanged. INVALID_ARGUMENT on every rank when the ranks' learning rates
 * differ (sk_trainer_set_lr), naming the ranks and rates; nothing changes. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_step(sk_trainer* trainer,
                                                   sk_step_metrics* out_metrics);

/* 0.8.0: one micro-batch from the caller (docs/batches.md).
 * Row-major arrays of batch_size * seq_len int32 values, read during the
 * call only. */
#define SK_IGNORE_INDEX (-100)
typedef struct sk_batch {
  size_t struct_size;          /* SK_BATCH_INIT */
  int64_t batch_size;          /* rows: 1 .. the trainer's batch_size */
  int64_t seq_len;             /* positions per row: 1 .. the trainer's seq_len */
  const int32_t* input_ids;    /* token ids in [0, vocab) */
  /* The token each position predicts (input_ids shifted left by one: the
   * library does not shift, unlike Hugging Face's labels), or
   * SK_IGNORE_INDEX (-100, PyTorch's ignore_index) to leave the position
   * out of the loss. */
  const int32_t* targets;
  /* Optional (NULL: every position counts): 0 leaves a position out of the
   * loss as SK_IGNORE_INDEX does, 1 keeps it. */
  const uint8_t* loss_mask;
  /* Optional (NULL: 0 .. seq_len - 1 in every row): each token's position
   * id in [0, the model's max_seq_len) (packed documents restart at 0). */
  const int32_t* position_ids;
  /* Optional (NULL: one document per row): each token's document, non-
   * decreasing along a row; a token attends only to earlier tokens of its
   * own document (block-diagonal causal attention, on CPU and CUDA). GPT
   * and Llama-family models only. */
  const int32_t* segment_ids;
} sk_batch;
/* Size traits ("Option structs" above). */
#define SK_BATCH_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_batch, segment_ids)
#define SK_BATCH_STRUCT_SIZE SK_STRUCT_SIZE(sk_batch, segment_ids)

#define SK_BATCH_INIT {sizeof(sk_batch), 0, 0, NULL, NULL, NULL, NULL, NULL}

/* 0.8.0: one optimizer step on the caller's micro-batches
 * instead of the trainer's data: `micro_batches` points to
 * `num_micro_batches` batches (pointers, so that each carries its own
 * struct_size), exactly the trainer's grad_accum_steps. The loss is the
 * mean over every counted target of every micro-batch and rank (PyTorch's
 * ignore_index mean over the global batch; docs/batches.md); on several
 * ranks the counts are exchanged with one all-gather per step. Shapes may
 * differ per micro-batch, step and rank up to the trainer's batch_size and
 * seq_len. Collective: every rank calls this entry (not sk_trainer_step)
 * for the step. INVALID_ARGUMENT naming the batch and field for a NULL
 * pointer, a bad struct_size, sizes out of range, a target that is neither
 * a token id nor SK_IGNORE_INDEX, a loss_mask value other than 0 and 1
 * (those found here fail on this rank at once; the rest, ids outside the
 * vocabulary, positions, decreasing segment ids, fail the step on every
 * rank alike); nothing changes. Otherwise as sk_trainer_step. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_step_batches(sk_trainer* trainer,
                                                           const sk_batch* const* micro_batches,
                                                           int32_t num_micro_batches,
                                                           sk_step_metrics* out_metrics);

/* 0.6.0: the learning rate of every later step, replacing the schedule (0 is
 * valid: such a step changes no parameter but counts as a step).
 * INVALID_ARGUMENT for a negative or non-finite lr. Not collective; every
 * rank must set the same rate (the next step checks: see sk_trainer_step). */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_set_lr(sk_trainer* trainer, float lr);
/* The rate the next sk_trainer_step will use. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_get_lr(const sk_trainer* trainer, float* out_lr);

/* Mean loss of `batches` (>= 1) forward passes on held-out data; no update.
 * Collective. With a dataset (0.8.0): the eval files' first `batches`
 * batches of batch_size * world size rows in file order (fewer if the set
 * ends sooner, so a large `batches` is one pass over it), and the loss is the
 * mean over every unmasked target token of all of them on all ranks (the same
 * on every rank); FAILED_PRECONDITION without eval files. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_evaluate(sk_trainer* trainer, int32_t batches,
                                                       float* out_loss);

/* 0.8.0: where a trainer with a dataset stands in it: *out_samples_consumed
 * (global samples the completed steps took; what a sharded checkpoint
 * records) and *out_samples_per_epoch (S). FAILED_PRECONDITION without a
 * dataset. Either pointer may be NULL. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_data_position(const sk_trainer* trainer,
                                                            int64_t* out_samples_consumed,
                                                            int64_t* out_samples_per_epoch);

/* 0.8.0: this rank's sample ids of the last completed step, in row order
 * (micro-batch 0's rows first): the document each row holds, or with packing
 * the document its first token belongs to (docs/data.md). *out_count
 * receives their number (0 before the first step and without a dataset);
 * out_ids, when not NULL, receives them and must hold `capacity` >= that
 * many (OUT_OF_RANGE otherwise, nothing written). */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_last_sample_ids(const sk_trainer* trainer, int64_t* out_ids,
                                                              int64_t capacity, int64_t* out_count);

/* Parameters of the trainer's whole model (not of the shard). */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_num_parameters(const sk_trainer* trainer,
                                                             int64_t* out_count);

/* Parameters of the named model config; builds no parameter memory.
 * NOT_FOUND listing the known names. Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_model_num_parameters(const char* model, int64_t* out_count);

/* Checkpoints. A sharded checkpoint is a directory: one safetensors file per
 * shard rank (f32 master shards and optimizer state) and an index.json
 * written last. It holds the model, the optimizer state and the step count,
 * and loads at any world size and sharding strategy (the shards are re-cut
 * on load). To continue the same run at another world size, keep the global
 * batch (batch_size * grad_accum_steps * world size): the step count and the
 * learning rate refer to it, and the data continues by step. With a dataset
 * (0.8.0) the index also records its position (samples consumed, seed,
 * samples per epoch, global batch): a load continues from the samples
 * consumed, and a checkpoint of another seed or dataset size is
 * INVALID_ARGUMENT before anything changes. */

/* Writes this trainer's checkpoint to `dir` (created, or replaced if it
 * already holds a checkpoint: the new one is written beside it and swapped in
 * atomically, so a failed save leaves the previous checkpoint intact).
 * Collective: every rank calls it with the same `dir`, on a filesystem all
 * ranks share; an error on one rank is returned on every rank. Errors:
 * INVALID_ARGUMENT for a NULL `dir` or a `dir` that exists and is not a
 * checkpoint (never overwritten); UNIMPLEMENTED for a DDP trainer (the
 * runtime checkpoints FSDP trainers only); UNAVAILABLE for I/O failures. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_save_checkpoint(sk_trainer* trainer, const char* dir);

/* Restores the checkpoint in `dir` into this trainer: parameters, optimizer
 * state and step count, so the next sk_trainer_step continues where the
 * saved run stopped (at the same world size: the same batches and losses).
 * `out_step` (may be NULL) receives the restored step count. Collective, as
 * the save. Everything is read and validated on every rank before anything
 * changes: on any error the trainer is as it was (unless a peer or an
 * allocation fails while the validated state is being installed, which is
 * reported as that failure). Errors: NOT_FOUND for a missing directory,
 * index or shard file; DATA_LOSS naming the file for a corrupt, truncated or
 * inconsistent one; INVALID_ARGUMENT naming the unit or parameter when the
 * checkpoint is of another model or optimizer, or for a NULL `dir`;
 * UNIMPLEMENTED for a DDP trainer (checkpoints are written from FSDP's
 * shards; FSDP's NO_SHARD replicates like DDP and can be checkpointed). */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_load_checkpoint(sk_trainer* trainer, const char* dir,
                                                              int64_t* out_step);

/* 0.8.0: checkpoints every K steps and a restart that resumes from the
 * newest (docs/launch.md). Writes this trainer's checkpoint (as
 * sk_trainer_save_checkpoint) to `dir_root`/step_<step count as 12 digits>,
 * creating `dir_root` if needed, then removes all but the newest `keep`
 * checkpoints there (world rank 0 removes them once every rank has saved; a
 * removal that fails is logged and the new checkpoint stands). Collective, as
 * sk_trainer_save_checkpoint. Errors: INVALID_ARGUMENT for a NULL or empty
 * `dir_root`, `keep` < 1, or a `dir_root` that exists and is not a directory
 * (nothing is written); otherwise as sk_trainer_save_checkpoint. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_save_checkpoint_rotating(sk_trainer* trainer, const char* dir_root,
                                                                       int32_t keep);

/* 0.8.0: restores the newest complete checkpoint under `dir_root` (as
 * sk_trainer_load_checkpoint: parameters, optimizer state, step count, hence
 * the learning-rate schedule's position, and a dataset's position) and stores
 * its step count in *out_step. A first start is not an error: when
 * `dir_root` does not exist or holds no checkpoint, nothing changes and
 * *out_step receives the trainer's step count (0 for a new trainer). A
 * half-written checkpoint (a save that crashed) is never picked; world rank
 * 0 picks and every rank loads what it picked. `out_step` may be NULL.
 * Collective. Errors: INVALID_ARGUMENT for a NULL or empty `dir_root` or one
 * that is not a directory; otherwise as sk_trainer_load_checkpoint (nothing
 * changed on error). */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_resume_latest(sk_trainer* trainer, const char* dir_root,
                                                            int64_t* out_step);

/* Full state dicts (0.4.0). One safetensors file holding every parameter in
 * full under its own name (docs/checkpoints.md), readable by any safetensors
 * tool. In the SHARDKIT layout it also holds the optimizer state and the
 * step count, so loading it resumes training exactly, at any world size and
 * sharding strategy; the TORCH, HF_GPT2 and HF_LLAMA layouts hold weights
 * only, in the names and layout those tools use (HF_GPT2: transformers'
 * GPT-2, with the LM head tied to wte when they are equal; HF_LLAMA:
 * transformers' Llama and Qwen2, the head likewise tied to embed_tokens). */

/* Gathers the model and writes it to the file `path` (rank 0 writes it
 * atomically and durably: a failed save leaves any previous file intact).
 * Collective: every rank passes the same arguments; an error on one rank is
 * returned on every rank. Errors: INVALID_ARGUMENT for a NULL path, an
 * unknown layout, or a layout without names for this model (HF_GPT2 and a
 * T5 model, HF_LLAMA and a GPT); UNIMPLEMENTED for a DDP trainer; UNAVAILABLE for I/O failures. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_save_state_dict(sk_trainer* trainer, const char* path,
                                                              sk_weight_layout_t layout);
/* Loads the file `path`, in `layout`, into this trainer: parameters, and
 * where the file has them (SHARDKIT) the optimizer state and step count;
 * `out_step` (may be NULL) receives the trainer's step count afterwards (0
 * for weights from other tools). Collective. Everything is read, converted
 * and checked on every rank before anything changes: on any error the
 * trainer is as it was. Errors: NOT_FOUND for a missing file; DATA_LOSS for
 * a corrupt or truncated one; INVALID_ARGUMENT for a NULL path, an unknown
 * layout, or a file of another model (naming the tensor, in both layouts'
 * names, and both shapes); UNIMPLEMENTED for a DDP trainer. */
SK_EXPORT SK_NODISCARD sk_status_t sk_trainer_load_state_dict(sk_trainer* trainer, const char* path,
                                                              sk_weight_layout_t layout,
                                                              int64_t* out_step);

/* The memory estimator's prediction for one rank (bytes unless named
 * otherwise). */
typedef struct sk_memory_estimate {
  size_t struct_size;        /* set by the caller (SK_MEMORY_ESTIMATE_INIT) */
  int64_t parameters;        /* of the whole model (elements) */
  int64_t master_bytes;      /* f32 master shards (0 on the device with cpu_offload) */
  int64_t grad_shard_bytes;  /* f32 gradient shards alive at the peak (0 with cpu_offload):
                              * they exist from each unit's first reduction of a step
                              * to zero_grad, so all of them at the end of backward,
                              * one at the start */
  int64_t optimizer_bytes;   /* optimizer state (0 with cpu_offload) */
  int64_t persistent_bytes;  /* full parameters/gradients NO_SHARD and SHARD_OPTIM keep */
  int64_t unsharded_bytes;   /* gathered parameters and full gradients in flight at the peak */
  int64_t activation_bytes;  /* activations and temporaries at the peak */
  int64_t peak_bytes;        /* the sum: the peak the rank's allocator holds in a step */
} sk_memory_estimate;
/* Size traits ("Option structs" above). */
#define SK_MEMORY_ESTIMATE_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_memory_estimate, peak_bytes)
#define SK_MEMORY_ESTIMATE_STRUCT_SIZE SK_STRUCT_SIZE(sk_memory_estimate, peak_bytes)

#define SK_MEMORY_ESTIMATE_INIT {sizeof(sk_memory_estimate), 0, 0, 0, 0, 0, 0, 0, 0}

/* Predicts the peak device memory of one rank of a trainer with `options`
 * on `world_size` ranks, without building the model's parameters or running
 * anything. The estimate depends on the model, sk_fsdp_options (strategy,
 * shard group, dtypes, all_gather_limit, cpu_offload; a hybrid strategy
 * without a shard group shards within a node: on a sim device the simulated
 * GPUs per node, else LOCAL_WORLD_SIZE), the optimizer,
 * batch_size, seq_len, source_len, activation_checkpointing and
 * device.kind (which attention the model runs there: a log-sum-exp per row
 * where the device's backend runs attention in linear memory, else the
 * probabilities), packed_documents or a packing dataset (on CUDA, one
 * composed attention call's temporaries), and grad_accum_steps accumulated as
 * sk_fsdp_options.grad_accumulation says (FSDP; DDP: one micro-batch). The other fields are validated
 * as sk_trainer_create validates them but do not change it (data_path is not
 * opened). `out->struct_size` must be set; the fields that fit in it are
 * written. Errors: INVALID_ARGUMENT for bad options or world_size (< 1, or
 * one the strategy cannot use); NOT_FOUND for an unknown model. For
 * parallelism DDP the estimate is the full replica (f32 parameters,
 * gradients, optimizer state, a compute-dtype copy) plus activations, and
 * unsharded_bytes is 0. Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_estimate_memory(const sk_trainer_options* options,
                                                      int32_t world_size,
                                                      sk_memory_estimate* out);

/* ------------------------------------------------------------------------ */
/* High level: local session (N local ranks behind one handle)               */
/* ------------------------------------------------------------------------ */

/* `world_size` trainers on a local group, each driven on its own thread by
 * the library, so that a single-threaded caller (a Lua script) trains with
 * several ranks:
 *   sk_local_session_create(&options, 2, NULL, &s);
 *   sk_local_session_step(s, &metrics);   (repeat)
 *   sk_local_session_destroy(s);
 */
typedef struct sk_local_session sk_local_session;

/* Creates the group and one trainer per rank. `network_model` as in
 * sk_process_group_create_local. Errors as sk_process_group_create_local and
 * sk_trainer_create (the lowest failing rank's). */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_create(const sk_trainer_options* options,
                                                           int32_t world_size,
                                                           const char* network_model,
                                                           sk_local_session** out_session);
/* Accepts NULL. */
SK_EXPORT void sk_local_session_destroy(sk_local_session* session);

/* One step on every rank (concurrently); returns when all are done.
 * `out_rank0` (may be NULL) receives rank 0's metrics: its `loss` is rank
 * 0's (the mean over rank 0's micro-batches), `global_loss` the whole
 * step's (the mean over all ranks: the loss of the global batch, what a
 * single-process run on the same data reports). The other ranks' metrics
 * through sk_local_session_metrics. On failure, the lowest failing rank's
 * error. */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_step(sk_local_session* session,
                                                         sk_step_metrics* out_rank0);
/* 0.8.0: sk_trainer_step_batches on every rank: `batches`
 * holds world_size x grad_accum_steps pointers, rank-major (rank r's
 * micro-batch m at r * grad_accum_steps + m). Every batch is checked
 * before any rank starts: a bad one is INVALID_ARGUMENT naming the rank and
 * micro-batch, and nothing changes. */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_step_batches(sk_local_session* session,
                                                                 const sk_batch* const* batches,
                                                                 int32_t num_batches,
                                                                 sk_step_metrics* out_rank0);
/* The metrics of `rank`'s last step (FAILED_PRECONDITION before the first
 * step, OUT_OF_RANGE for a bad rank). */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_metrics(const sk_local_session* session,
                                                            int32_t rank,
                                                            sk_step_metrics* out_metrics);
/* sk_trainer_set_lr on every rank (0.6.0). */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_set_lr(sk_local_session* session, float lr);
/* sk_trainer_evaluate on every rank; *out_loss is the mean over ranks. */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_evaluate(sk_local_session* session,
                                                             int32_t batches, float* out_loss);
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_world_size(const sk_local_session* session,
                                                               int32_t* out_world_size);
/* sk_trainer_save_checkpoint on every rank (concurrently); one checkpoint of
 * the whole session. Errors as sk_trainer_save_checkpoint (the lowest failing
 * rank's). */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_save_checkpoint(sk_local_session* session,
                                                                    const char* dir);
/* sk_trainer_load_checkpoint on every rank; the checkpoint may come from any
 * world size (a session, trainers, or gloo processes). `out_step` (may be
 * NULL) receives the restored step count. On error no rank has changed.
 * sk_local_session_metrics keeps reporting the last step taken through the
 * session. */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_load_checkpoint(sk_local_session* session,
                                                                    const char* dir,
                                                                    int64_t* out_step);
/* sk_trainer_save_state_dict on every rank (one file of the whole session).
 * Errors as sk_trainer_save_state_dict (the lowest failing rank's). */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_save_state_dict(sk_local_session* session,
                                                                    const char* path,
                                                                    sk_weight_layout_t layout);
/* sk_trainer_load_state_dict on every rank; on error no rank changed.
 * `out_step` (may be NULL) as there. */
SK_EXPORT SK_NODISCARD sk_status_t sk_local_session_load_state_dict(sk_local_session* session,
                                                                    const char* path,
                                                                    sk_weight_layout_t layout,
                                                                    int64_t* out_step);

/* ------------------------------------------------------------------------ */
/* The planner: which configuration, simulated before launch                 */
/* ------------------------------------------------------------------------ */

/* What to plan (docs/planner.md). The planner simulates one training step of
 * every candidate configuration (DDP and the six FSDP strategies, the hybrid
 * shard-group size, backward/forward prefetch, the rate limit, activation
 * checkpointing, CPU offload, param/reduce dtypes) on the simulator with a
 * hardware profile, and ranks them: those that fit by step time, then those
 * out of memory by the memory they need. Nothing runs on a real device. */
typedef struct sk_plan_request {
  size_t struct_size;
  const char* model;         /* a named config ("t5-11b", "gpt-175b") or a unit-table
                                .json path; required */
  const char* profile;       /* "a100-80g", "h100-80g", "h200-141g", "cpu-local" or a .json path;
                                NULL = "a100-80g" */
  int32_t gpus;              /* GPUs in the simulated cluster; 0 = 8 */
  int32_t gpus_per_node;     /* 0 = 8 */
  int64_t batch_size;        /* sequences per GPU per step; 0 = 1 */
  int64_t seq_len;           /* 0 = the model's */
  int64_t source_len;        /* encoder-decoder; 0 = the model's */
  /* Restrictions of the candidate space, comma-separated; NULL or "" = the
   * whole dimension. strategies: "DDP,FULL_SHARD,SHARD_GRAD_OP,SHARD_OPTIM,
   * NO_SHARD,HYBRID_SHARD,HYBRID_SHARD_GRAD_OP"; dtypes: param[/reduce]
   * pairs, "f32,bf16,bf16/f32". */
  const char* strategies;
  const char* dtypes;
  /* 0 = both, 1 = off only, 2 = on only. activation_checkpointing's on is
   * whole-block checkpointing; `checkpointing` below lists the other
   * policies. */
  int32_t activation_checkpointing;
  int32_t cpu_offload;
  /* When not NULL, a Chrome trace (JSON, virtual time) of the recommended
   * configuration's simulated step is written to this path. */
  const char* trace_path;
  /* Appended in 0.7.0 (a 0.6.1 struct, which ends at
   * trace_path, is still accepted). The checkpointing policies to search,
   * comma-separated sk_activation_checkpointing_t names: "off", "full" (or
   * "on"), "selective", "selective_attention", "selective_matmuls" (0.8.0:
   * SK_CHECKPOINTING_SELECTIVE_MATMULS); e.g. "off,selective,
   * selective_attention". NULL or "" = as activation_checkpointing says.
   * Setting both is INVALID_ARGUMENT, as is an unknown name (named).
   * The selective policies need a model that implements them (GPT, the
   * Llama family; selective_matmuls the Llama family only); on another, those
   * candidates fail with the reason. */
  const char* checkpointing;
} sk_plan_request;
/* Size traits ("Option structs" above). */
#define SK_PLAN_REQUEST_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_plan_request, trace_path)
#define SK_PLAN_REQUEST_STRUCT_SIZE SK_STRUCT_SIZE(sk_plan_request, checkpointing)

#define SK_PLAN_REQUEST_INIT {sizeof(sk_plan_request), NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, NULL, NULL}

/* One ranked candidate (sk_plan_result_candidate copies it out). Strings are
 * owned by the result and valid until sk_plan_result_free. */
typedef struct sk_plan_candidate {
  size_t struct_size;     /* set by the caller (SK_PLAN_CANDIDATE_INIT) */
  const char* label;      /* "FULL_SHARD bwd=PRE limit=2 ckpt bf16" */
  sk_parallelism_t parallelism;
  sk_sharding_strategy_t strategy;           /* FSDP's (unset for DDP) */
  int32_t shard_group_size;                  /* hybrid strategies; else 0 */
  sk_backward_prefetch_t backward_prefetch;
  int32_t forward_prefetch;
  int32_t rate_limit;                        /* all_gather_limit; -1 = off */
  int32_t activation_checkpointing;          /* an sk_activation_checkpointing_t */
  int32_t cpu_offload;
  sk_dtype_t param_dtype;
  sk_dtype_t reduce_dtype;
  int32_t fits;           /* simulated without error and within memory */
  int32_t out_of_memory;
  const char* error;      /* why the simulation failed otherwise; NULL if it did not */
  int64_t peak_allocated_bytes;  /* per GPU */
  int64_t peak_reserved_bytes;
  int64_t alloc_retries;
  int64_t required_bytes;        /* out of memory: the memory it needs (estimate); else 0 */
  double step_seconds;           /* simulated; 0 when it did not fit */
  double tflops_per_gpu;
  double mfu;
  double exposed_comm_seconds;
  /* Appended after 0.4.0's first planner (whose struct ended at
   * exposed_comm_seconds: that struct_size, 136, is still accepted and gets
   * the fields before this one). Peak simulated host memory per GPU: what
   * CPU offload keeps there (f32 master and gradient shards, optimizer
   * state, host temporaries); 0 without offload. */
  int64_t peak_host_bytes;
} sk_plan_candidate;
/* Size traits ("Option structs" above); the first version (0.4.0's) ended at exposed_comm_seconds. */
#define SK_PLAN_CANDIDATE_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_plan_candidate, exposed_comm_seconds)
#define SK_PLAN_CANDIDATE_STRUCT_SIZE SK_STRUCT_SIZE(sk_plan_candidate, peak_host_bytes)

#define SK_PLAN_CANDIDATE_INIT {sizeof(sk_plan_candidate), NULL, SK_PARALLELISM_DEFAULT, SK_SHARDING_DEFAULT, 0, \
                                SK_BACKWARD_PREFETCH_DEFAULT, 0, 0, 0, 0, SK_DTYPE_DEFAULT, SK_DTYPE_DEFAULT, 0, 0, \
                                NULL, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0}

/* A plan, allocated by sk_plan and released by sk_plan_result_free. The
 * library sets struct_size to the size it allocated (fields are only ever
 * appended: read only those your header declares). Strings have the
 * lifetime of the result. */
typedef struct sk_plan_result {
  size_t struct_size;
  const char* profile;            /* the profile's name as loaded */
  int64_t device_memory_bytes;    /* memory per GPU of the profile */
  int32_t num_candidates;
  int32_t recommended;            /* index of the recommendation (0), or -1: nothing fits */
  const char* recommendation;     /* one sentence */
  const char* table;              /* the ranked table as //tools:plan prints it (20 rows
                                     and the best of every other strategy) */
  const char* json;               /* every candidate, ranked, as JSON */
} sk_plan_result;
/* Size traits ("Option structs" above). */
#define SK_PLAN_RESULT_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_plan_result, json)
#define SK_PLAN_RESULT_STRUCT_SIZE SK_STRUCT_SIZE(sk_plan_result, json)

/* Simulates every candidate and ranks them into a new result in
 * *out_result. The same request gives byte-identical table and JSON.
 * Returns when done (GPT-175B on 512 GPUs takes seconds). Errors:
 * INVALID_ARGUMENT for a bad request (naming the field), NOT_FOUND for an
 * unknown model or profile. A candidate that fails to simulate is part of
 * the result (its `error`), not an error of the call. Thread-safe with
 * respect to other sk_plan calls only when neither writes a trace; it uses
 * the simulated device sim:0, so it must not run concurrently with a
 * simulated trainer. */
SK_EXPORT SK_NODISCARD sk_status_t sk_plan(const sk_plan_request* request, sk_plan_result** out_result);
/* Candidate `index` (0 = the best; OUT_OF_RANGE beyond num_candidates) into
 * *out (its struct_size set by the caller; only the fields it has room for
 * are written). Thread-safe. */
SK_EXPORT SK_NODISCARD sk_status_t sk_plan_result_candidate(const sk_plan_result* result, int32_t index,
                                                            sk_plan_candidate* out);
/* Releases a result and its strings. Accepts NULL; a result already freed
 * is ignored, and a freed result passed to sk_plan_result_candidate is
 * INVALID_ARGUMENT (results are registered as handles are). Freed while
 * another thread's sk_plan_result_candidate reads it, it is released when
 * that call returns. */
SK_EXPORT void sk_plan_result_free(sk_plan_result* result);

/* ------------------------------------------------------------------------ */
/* Low level: a model the caller computes                                    */
/* ------------------------------------------------------------------------ */

/* The description of a model as FSDP sees it: ordered units (the granularity
 * of all-gather and reduce-scatter), each an ordered list of parameters. */
typedef struct sk_model_spec sk_model_spec;

/* The most dimensions a parameter may have. */
#define SK_MAX_DIMS 8

typedef struct sk_param_spec {
  size_t struct_size;
  const char* name;      /* unique within its unit; not empty; UTF-8 */
  int32_t ndim;          /* 0 (a scalar) .. SK_MAX_DIMS */
  const int64_t* shape;  /* ndim entries >= 0; may be NULL when ndim is 0 */
  sk_dtype_t dtype;      /* 0 or SK_DTYPE_F32: the master copy is always f32
                            (compute precision is sk_fsdp_options.param_dtype) */
  sk_init_kind_t init;
  float init_a;          /* NORMAL: mean; UNIFORM: low */
  float init_b;          /* NORMAL: standard deviation; UNIFORM: high */
} sk_param_spec;
/* Size traits ("Option structs" above). */
#define SK_PARAM_SPEC_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_param_spec, init_b)
#define SK_PARAM_SPEC_STRUCT_SIZE SK_STRUCT_SIZE(sk_param_spec, init_b)

#define SK_PARAM_SPEC_INIT {sizeof(sk_param_spec), NULL, 0, NULL, SK_DTYPE_DEFAULT, SK_INIT_DEFAULT, 0.0f, 0.0f}

/* An empty spec. Not thread-safe per handle. */
SK_EXPORT SK_NODISCARD sk_status_t sk_model_spec_create(sk_model_spec** out_spec);
/* Accepts NULL. Engines created from the spec keep their own copy. */
SK_EXPORT void sk_model_spec_destroy(sk_model_spec* spec);
/* Appends a unit named `name` (unique, not empty, UTF-8); *out_unit (may be NULL)
 * receives its index, 0, 1, ... in call order. */
SK_EXPORT SK_NODISCARD sk_status_t sk_model_spec_add_unit(sk_model_spec* spec, const char* name,
                                                          int32_t* out_unit);
/* Appends a parameter to unit `unit`; *out_param (may be NULL) receives its
 * index within the unit. INVALID_ARGUMENT for a bad name, ndim, shape, dtype,
 * initializer kind or parameters (negative stddev, empty uniform range);
 * OUT_OF_RANGE for an unknown unit. */
SK_EXPORT SK_NODISCARD sk_status_t sk_model_spec_add_param(sk_model_spec* spec, int32_t unit,
                                                           const sk_param_spec* param,
                                                           int32_t* out_param);
/* 0.6.0: declares that unit `unit` also uses parameter `owner_param` of
 * the earlier unit `owner_unit` (a tied parameter: GPT-2's output head and
 * token embedding). It stays ONE parameter, the owner's: initialised,
 * sharded, optimised and checkpointed once. In `unit` it is parameter
 * *out_param (may be NULL), numbered after the unit's own parameters (add
 * those first: sk_model_spec_add_param on a unit with tied parameters is
 * FAILED_PRECONDITION). Between pre_forward/pre_backward and the matching
 * post call of `unit`, sk_engine_param gives the owner's gathered value and
 * sk_engine_grad a buffer whose additions are summed with the owner's own
 * gradient before the owner's reduction; the engine gathers the owner again
 * for each such use. The owner must come first in execution order
 * (owner_unit < unit, else INVALID_ARGUMENT) and have finished its forward
 * when `unit` runs. OUT_OF_RANGE for an unknown unit or owner parameter;
 * INVALID_ARGUMENT for an empty, non-UTF-8 or repeated name. */
SK_EXPORT SK_NODISCARD sk_status_t sk_model_spec_add_tied_param(sk_model_spec* spec, int32_t unit,
                                                                const char* name, int32_t owner_unit,
                                                                int32_t owner_param, int32_t* out_param);

/* One rank's FSDP engine over a caller-computed model. */
typedef struct sk_engine sk_engine;

/* A caller stream: an in-order queue of the caller's work on the engine's
 * device, which the engine's hooks order themselves against without
 * blocking the host (sk_engine_set_stream). On a CUDA engine it is a
 * cudaStream_t: one the engine creates (sk_stream_create) or the caller's own
 * (sk_stream_wrap_cuda). On a CPU engine it is a worker thread that runs the
 * functions given to sk_stream_enqueue in order: the caller's "kernels".
 * Appended in 0.5.0 (stream-ordered hooks). */
typedef struct sk_stream sk_stream;

typedef struct sk_engine_options {
  size_t struct_size;
  const sk_fsdp_options* fsdp;           /* NULL = defaults (FULL_SHARD) */
  const sk_optimizer_options* optimizer; /* NULL = defaults (AdamW, lr 1e-3) */
  uint64_t memory_cap_bytes;             /* per-rank cap; 0 = unlimited */
  /* Appended in 0.4.0: the rank's device; NULL = cpu:rank. */
  const sk_device_options* device;
  /* Appended in 0.5.0: the caller's cudaStream_t on the engine's CUDA
   * device, the engine's caller stream from creation (as
   * sk_stream_wrap_cuda then sk_engine_set_stream). NULL = none: the
   * synchronous protocol. INVALID_ARGUMENT on a cpu or sim engine (use
   * sk_stream_create and sk_engine_set_stream there) or for a stream of
   * another GPU. Must outlive the engine. */
  void* cuda_stream;
  /* Appended in 0.8.0: an update rule of the caller's own (Lion, LAMB...)
   * stepped with sk_engine_begin_custom_step .. _end_custom_step. NULL =
   * none: the built-in optimizer of sk_optimizer_options.kind. When set,
   * its name (1 to 64 letters, digits, '_' or '-'; not SGD, ADAM or
   * ADAMW in any case) is what checkpoints and state dicts record as the
   * optimizer's kind, and the rule keeps num_custom_states per-element f32
   * state tensors named custom_state_names[0..num_custom_states) (the same
   * rules, distinct; at most 16; NULL when 0): what
   * sk_engine_optimizer_state hands out and checkpoints save under those
   * names. sk_optimizer_options.lr, weight_decay and param_groups still
   * apply (sk_engine_shard_piece reports each parameter's); its kind is
   * ignored and sk_engine_optimizer_step is FAILED_PRECONDITION.
   * INVALID_ARGUMENT naming the field for a bad name, a repeated state name
   * or a count outside [0, 16]. The strings are copied. */
  const char* custom_optimizer;
  const char* const* custom_state_names;
  int32_t num_custom_states;
} sk_engine_options;
/* Size traits ("Option structs" above); the first version (0.3.0's) ended at memory_cap_bytes. */
#define SK_ENGINE_OPTIONS_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_engine_options, memory_cap_bytes)
#define SK_ENGINE_OPTIONS_STRUCT_SIZE SK_STRUCT_SIZE(sk_engine_options, num_custom_states)

#define SK_ENGINE_OPTIONS_INIT {sizeof(sk_engine_options), NULL, NULL, 0, NULL, NULL, NULL, NULL, 0}

/* A view of a buffer owned by an engine. */
typedef struct sk_tensor_view {
  size_t struct_size;     /* set by the caller (SK_TENSOR_VIEW_INIT) */
  /* Dense row-major. cpu: host memory. cuda: a device pointer (read it with
   * CUDA on the engine's device, after the engine's work is complete; with a
   * caller stream, in work enqueued on that stream after the pre_ call:
   * sk_engine_set_stream). sim:
   * an address of the simulator's virtual memory with nothing behind it:
   * never dereference it (shape, dtype and numel are real). */
  void* data;
  sk_dtype_t dtype;       /* f32 unless sk_fsdp_options asked for bf16/f16 */
  int32_t ndim;
  const int64_t* shape;   /* ndim entries; has the lifetime of the engine */
  int64_t numel;
} sk_tensor_view;
/* Size traits ("Option structs" above). */
#define SK_TENSOR_VIEW_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_tensor_view, numel)
#define SK_TENSOR_VIEW_STRUCT_SIZE SK_STRUCT_SIZE(sk_tensor_view, numel)

#define SK_TENSOR_VIEW_INIT {sizeof(sk_tensor_view), NULL, SK_DTYPE_DEFAULT, 0, NULL, 0}

/* Creates this rank's engine over the units of `spec` (copied; at least one
 * unit, every unit with at least one parameter). Collective over `group`:
 * every rank passes the same spec and options. Each rank materialises only
 * its f32 master shard of every unit, from the initialisers. The engine keeps
 * `group` alive. Errors: INVALID_ARGUMENT for bad options or an empty spec;
 * RESOURCE_EXHAUSTED if the memory cap is too small. On local and gloo groups
 * the ranks first compare their specs and options: ranks that differ (a
 * shape, an optimizer value, a parameter group given on one rank only) all
 * get INVALID_ARGUMENT naming the field and both values. On SK_DEVICE_SIM
 * `group` may be NULL (as for sk_trainer_create) and nothing is
 * initialised: the initialisers are priced, not run. Several threads may
 * create engines from one spec at once (each rank's thread of a local group
 * does); changing the spec meanwhile is FAILED_PRECONDITION. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_create(const sk_model_spec* spec,
                                                    sk_process_group* group,
                                                    const sk_engine_options* options,
                                                    sk_engine** out_engine);
/* Accepts NULL. Views obtained from the engine become invalid. */
SK_EXPORT void sk_engine_destroy(sk_engine* engine);

SK_EXPORT SK_NODISCARD sk_status_t sk_engine_num_units(const sk_engine* engine,
                                                       int32_t* out_units);

/* The unit lifecycle, for unit `unit` (OUT_OF_RANGE otherwise), in this
 * order per step:
 *   forward:  pre_forward(u), compute with sk_engine_param(u, *), post_forward(u)
 *             for the units in forward order;
 *   backward: pre_backward(u), compute, add gradients into sk_engine_grad(u, *),
 *             post_backward(u) for the units in reverse order;
 * then sk_engine_finish_backward, sk_engine_clip_grad_norm (optional) and
 * sk_engine_optimizer_step; sk_engine_zero_grad before the next step. A call
 * out of order is FAILED_PRECONDITION naming the call made and the one
 * expected, and changes nothing: a hook out of its unit's order; zero_grad,
 * set_gradient_sync, finish_backward, clip_grad_norm or optimizer_step while
 * a unit is between its pre_ and post_ call; zero_grad between a
 * post_backward and finish_backward; finish_backward with no backward since
 * the last one; clip_grad_norm and optimizer_step before finish_backward.
 * Any other failure (a
 * peer timing out, the memory cap) abandons the step: every unit back to
 * idle, every view invalid, the step's gradients zeroed, master parameters
 * and optimizer state untouched. On local and gloo groups it abandons the
 * step on every rank: the failing rank's peers' calls fail at once with its
 * error ("rank 1 failed step 3: ... out of memory ..."), every rank's call
 * returns that error, and the next step works everywhere. Under NO_SHARD
 * and SHARD_OPTIM, sk_engine_optimizer_step and sk_engine_end_custom_step
 * regather the updated parameters; a failure there is every rank's too
 * ("rank 1 failed step 3 after the update: ..."), but the update is kept on
 * every rank, the step counts (a custom step is closed) and the next
 * pre_forward gathers the parameters again.
 * All four are collective (the all-gathers and reduce-scatters they issue are
 * matched across ranks). pre_forward/pre_backward return when the unit's
 * parameters are gathered (and may enqueue prefetches of later units);
 * post_backward returns when the unit's gradient reduction is ENQUEUED: its
 * result is final after sk_engine_finish_backward. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_pre_forward(sk_engine* engine, int32_t unit);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_post_forward(sk_engine* engine, int32_t unit);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_pre_backward(sk_engine* engine, int32_t unit);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_post_backward(sk_engine* engine, int32_t unit);

/* The gathered (full, unsharded) value of parameter `param` of `unit`, in
 * param_dtype, with the registered shape. Valid between pre_forward(unit) and
 * post_forward(unit), and between pre_backward(unit) and post_backward(unit);
 * FAILED_PRECONDITION outside. The memory is the engine's: read it, never
 * write or free it. `out_view->struct_size` must be set. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_param(sk_engine* engine, int32_t unit, int32_t param,
                                                   sk_tensor_view* out_view);
/* The gradient buffer of parameter `param` of `unit`, between
 * pre_backward(unit) and post_backward(unit) (FAILED_PRECONDITION outside):
 * the caller ADDS this backward's gradient into it (never assigns or zeroes
 * it), in its dtype: param_dtype, the compute dtype (f32 by default);
 * reduce_dtype is only what the gradients are communicated in.
 * What it holds when handed out: zeros in the first backward after
 * sk_engine_zero_grad or after a backward with gradient sync on. Under
 * no_sync (sk_engine_set_gradient_sync(e, 0)) it is the accumulation buffer
 * itself: in the next backward it holds the running sum of this rank's
 * gradients of the micro-batches since then, as torch's .grad does under
 * no_sync (zeroing it per micro-batch would cost a second full-size buffer
 * per unit while accumulating). Assigning would lose those micro-batches. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_grad(sk_engine* engine, int32_t unit, int32_t param,
                                                  sk_tensor_view* out_view);

/* Nonzero (the default): the next backward reduces gradients across ranks.
 * Zero (no_sync): gradients accumulate locally, unreduced, until a backward
 * with sync enabled reduces the total (gradient accumulation). */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_set_gradient_sync(sk_engine* engine, int32_t enabled);
/* Waits for every gradient reduction of the step. Call after the last
 * post_backward, before clipping and the optimizer step. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_finish_backward(sk_engine* engine);
/* The total L2 gradient norm over all ranks' shards into *out_norm (may be
 * NULL); with max_norm > 0 also scales gradients so the norm is at most
 * max_norm. Collective. ABORTED on every rank when the norm is not finite
 * (a NaN or infinite gradient anywhere): the step is abandoned and no update
 * applied; the next step works (keep going, as PyTorch's GradScaler skips
 * such steps, or stop). */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_clip_grad_norm(sk_engine* engine, double max_norm,
                                                            double* out_norm);
/* Steps the optimizer on this rank's master shards. Collective: on local
 * and gloo groups the ranks first agree on the step (one small all-gather);
 * INVALID_ARGUMENT on every rank, nothing changed, when their learning
 * rates differ (sk_engine_set_lr), naming the ranks and rates. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_optimizer_step(sk_engine* engine);
/* Zeroes the gradients: releases the f32 gradient shards (their memory
 * returns to the engine's allocator; the step's first reduction of each unit
 * makes its shard again) and zeroes no_sync accumulations. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_zero_grad(sk_engine* engine);

/* Copies the full f32 value of parameter `param` of `unit` into out[0..count)
 * (count must equal its element count: INVALID_ARGUMENT otherwise).
 * Collective over the shard group. FAILED_PRECONDITION on SK_DEVICE_SIM
 * (there is no value). */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_read_param(sk_engine* engine, int32_t unit,
                                                        int32_t param, float* out, int64_t count);

/* 0.6.0: sets the full f32 value of parameter `param` of `unit` from
 * values[0..count) (host memory; every rank passes the same values), for
 * frameworks that initialise their own weights: each rank keeps its slice.
 * Collective over the group. INVALID_ARGUMENT when count is not the
 * parameter's element count or values is NULL; OUT_OF_RANGE for bad
 * indices; FAILED_PRECONDITION while a unit is between a pre_ and its post_
 * call, and on SK_DEVICE_SIM. Optimizer state is kept. On local and gloo
 * groups of several ranks, ranks that pass different values all get
 * INVALID_ARGUMENT naming them, and nothing is written. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_write_param(sk_engine* engine, int32_t unit,
                                                         int32_t param, const float* values,
                                                         int64_t count);

/* 0.6.0: the learning rate of the following sk_engine_optimizer_step calls
 * (the optimizer options' lr until set; 0 is valid). INVALID_ARGUMENT for a
 * negative or non-finite lr. Not collective; every rank must set the same
 * rate (sk_engine_optimizer_step checks). A schedule is the caller's loop:
 * set the rate before each step. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_set_lr(sk_engine* engine, float lr);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_get_lr(const sk_engine* engine, float* out_lr);
/* 0.8.0: a token-weighted loss over uneven batches, as the trainer's
 * (docs/batches.md): the step's loss is PyTorch's cross_entropy(...,
 * ignore_index=-100, reduction="mean") over the whole global batch at once,
 * the sum of the counted (unmasked) tokens' losses of every micro-batch on
 * every rank divided by N, their number, however unevenly the tokens fall
 * over ranks and micro-batches. Each rank passes `tokens`, its counted
 * tokens in ALL of this step's micro-batches; the ranks sum them and
 * *out_global_tokens (may be NULL) receives N. Then, for every micro-batch,
 * add into sk_engine_grad the gradient of that micro-batch's loss SUM
 * (reduction="sum": no division by any count): every gradient reduction
 * until sk_engine_zero_grad divides the sum over ranks by N instead of by
 * the number of ranks, so after sk_engine_finish_backward the gradients are
 * those of the global mean (clip_grad_norm and the optimizer see those).
 * N = 0 gives zero gradients. Without this call the reduction is the mean
 * over ranks, as before. Call it once per step, after sk_engine_zero_grad
 * and before the step's first reduction (forward may have run: the counts
 * are usually known from the batch). Collective: every rank calls it (one
 * all-gather of 8 bytes per rank). sk_engine_zero_grad and an abandoned
 * step return to the mean over ranks. INVALID_ARGUMENT for a NULL engine or
 * tokens < 0; FAILED_PRECONDITION, nothing changed: a unit between its pre_
 * and post_ call, a custom step, a reduction already issued since the last
 * sk_engine_zero_grad (a post_backward with gradient sync on), or several
 * ranks of an NCCL group without its call check (no group to sum the
 * counts on). On SK_DEVICE_SIM the ranks mirror this one: N = ranks x
 * tokens. examples: tests/train/engine_loss_tokens_test.cc. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_set_loss_tokens(sk_engine* engine, int64_t tokens,
                                                             int64_t* out_global_tokens);

/* 0.6.0: optimizer steps taken, restored by checkpoints and SHARDKIT state
 * dicts (other layouts load as step 0). */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_steps(const sk_engine* engine, int64_t* out_steps);

/* 0.6.0: your own optimizer. Instead of sk_engine_optimizer_step, after
 * sk_engine_finish_backward (and clip_grad_norm):
 *   sk_engine_begin_custom_step(e);
 *   for every unit u: read sk_engine_grad_shard(e, u), update
 *     sk_engine_master_shard(e, u) in place (state: sk_engine_optimizer_state);
 *   sk_engine_end_custom_step(e);
 * The views are this rank's f32 slices of the unit's flat parameter
 * (1-D, padding included: its gradient is 0), valid until end_custom_step
 * (a gradient shard exists only from the unit's first reduction of a step,
 * or finish_backward, until zero_grad: between steps there is none to view):
 * host memory on cpu engines and with cpu_offload, device pointers of the
 * engine's GPU on cuda (finish your device work on them before
 * end_custom_step). The gradient is the mean over ranks (clipped if
 * clip_grad_norm clipped). sk_engine_optimizer_state(e, u, i) is state
 * tensor i of the optimizer's slot for the unit, zeroed on first use and
 * saved by checkpoints: those sk_engine_options.custom_state_names declare
 * (0.8.0), else sk_optimizer_options.kind decides how many (SGD with
 * momentum > 0: one; Adam, AdamW: two); OUT_OF_RANGE beyond.
 * end_custom_step refreshes what FSDP keeps of the parameters (collective
 * for SHARD_OPTIM and NO_SHARD) and counts the step (sk_engine_steps).
 * FAILED_PRECONDITION: begin before finish_backward or with a unit between
 * its pre_ and post_ call; a view outside begin..end; any other step call
 * inside it; any call on the engine from another thread than the one whose
 * begin succeeded, until its end succeeds (a failed begin or end changes
 * nothing). examples: tests/train/engine_framework_test.cc (Lion). */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_begin_custom_step(sk_engine* engine);

/* 0.8.0: where each parameter lies in this rank's shard of `unit` (the
 * master, gradient and state shards alike), for rules that treat
 * parameters differently (LAMB's per-parameter trust ratio, decay by name).
 * sk_engine_shard_layout gives this rank's index in the unit's shard group
 * and the group's size (NOT the rank: under NO_SHARD every rank holds shard
 * 0 of 1, under HYBRID_SHARD the index within its replica group), and how
 * many pieces the shard holds; piece i (0 <= i < num_pieces, in shard
 * order) is one parameter's elements in the shard. Padding is in no piece
 * (its gradient is 0). Any time, not only in a custom step; out-pointers
 * may be NULL. OUT_OF_RANGE for a bad unit or piece index. */
typedef struct sk_shard_piece {
  size_t struct_size;    /* set by the caller (SK_SHARD_PIECE_INIT) */
  const char* name;      /* "<unit>.<param>"; has the lifetime of the engine */
  int32_t param;         /* the parameter's index in its unit */
  int32_t ndim;          /* of the whole parameter */
  const int64_t* shape;  /* ndim entries; has the lifetime of the engine */
  int64_t shard_offset;  /* its first element in the shard */
  int64_t numel;         /* its elements in the shard */
  int64_t param_offset;  /* the first one's index within the parameter (row-major) */
  /* The first sk_optimizer_options.param_groups entry that selects the
   * parameter (-1: none) and the weight decay and learning-rate multiplier
   * it resolves to (the options' weight_decay and 1 without a group). */
  int32_t param_group;
  float weight_decay;
  float lr_multiplier;
} sk_shard_piece;
/* Size traits ("Option structs" above). */
#define SK_SHARD_PIECE_STRUCT_SIZE_V1 SK_STRUCT_SIZE(sk_shard_piece, lr_multiplier)
#define SK_SHARD_PIECE_STRUCT_SIZE SK_STRUCT_SIZE(sk_shard_piece, lr_multiplier)

#define SK_SHARD_PIECE_INIT {sizeof(sk_shard_piece), NULL, 0, 0, NULL, 0, 0, 0, -1, 0.0f, 1.0f}

SK_EXPORT SK_NODISCARD sk_status_t sk_engine_shard_layout(sk_engine* engine, int32_t unit,
                                                          int32_t* out_shard_index, int32_t* out_num_shards,
                                                          int32_t* out_num_pieces);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_shard_piece(sk_engine* engine, int32_t unit, int32_t index,
                                                         sk_shard_piece* out_piece);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_master_shard(sk_engine* engine, int32_t unit,
                                                          sk_tensor_view* out_view);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_grad_shard(sk_engine* engine, int32_t unit,
                                                        sk_tensor_view* out_view);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_optimizer_state(sk_engine* engine, int32_t unit, int32_t index,
                                                             sk_tensor_view* out_view);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_end_custom_step(sk_engine* engine);

/* 0.6.0: sharded checkpoints of the engine in the trainer's format (a
 * directory: one safetensors file per shard rank and index.json; see
 * sk_trainer_save_checkpoint): master shards, optimizer state and the step
 * count, loadable into an engine over the same units at any world size and
 * sharding strategy. Collective. FAILED_PRECONDITION while a unit is
 * between a pre_ and its post_ call, and on SK_DEVICE_SIM. Errors as the
 * trainer's; a failed save keeps the previous checkpoint, a failed load
 * changes nothing. `out_step` (may be NULL) receives the restored step. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_save_checkpoint(sk_engine* engine, const char* dir);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_load_checkpoint(sk_engine* engine, const char* dir,
                                                             int64_t* out_step);

/* --- Caller streams: stream-ordered hooks ---------------------------------
 *
 * With no caller stream (the default) the hooks are synchronous: views are
 * valid once pre_forward/pre_backward return, and post_backward reads the
 * gradients when it is called, so a CUDA caller must synchronise its stream
 * before each post_ call. With a caller stream S set, the hooks are
 * stream-ordered and never wait on the host for S:
 *   pre_forward(u), pre_backward(u): enqueue (or find) the unit's all-gather,
 *     make S wait for it (an event) and return at once. The views are valid
 *     for work enqueued on S after the call (until post_ as before).
 *   post_forward(u): the engine frees or reshards the unit's gathered
 *     buffers only after the work enqueued on S before the call.
 *   post_backward(u): the reduction waits for an event recorded on S now
 *     before it reads the gradient buffers; buffers are reused only after it.
 *   finish_backward, clip_grad_norm, optimizer_step: ordered after the
 *     reductions (themselves after S's gradients). finish_backward returns
 *     when the reductions are done; clip_grad_norm's norm reaches the host.
 *     S need not be synchronised around them: the next pre_ call orders S
 *     after the updated parameters' gather.
 * Each post_ call uses the stream its pre_ call used. An all-gather that
 * fails (a peer times out) fails the next hook that finds it complete, or
 * finish_backward. */

/* A new stream on the engine's device: cpu, a worker thread; cuda, a
 * non-blocking CUDA stream owned by the returned handle. INVALID_ARGUMENT on a
 * sim engine. Keeps nothing alive; the engine keeps a stream it uses alive
 * (sk_stream_destroy may come first). */
SK_EXPORT SK_NODISCARD sk_status_t sk_stream_create(sk_engine* engine, sk_stream** out_stream);
/* Wraps the caller's cudaStream_t (not owned: never destroyed or synchronised
 * by shardkit; it must outlive the engine and the handle). INVALID_ARGUMENT
 * for NULL (the legacy default stream, which synchronises with every other
 * stream), a stream of another GPU than the engine's, or a cpu/sim engine;
 * UNAVAILABLE in a build without CUDA. */
SK_EXPORT SK_NODISCARD sk_status_t sk_stream_wrap_cuda(sk_engine* engine, void* cuda_stream,
                                                       sk_stream** out_stream);
/* Enqueues fn(user_data) on the stream after everything enqueued before it;
 * returns when enqueued. cpu: fn runs on the stream's worker thread; cuda:
 * on a driver thread (cudaLaunchHostFunc), and must not call CUDA.
 * INVALID_ARGUMENT for a NULL fn. Thread-safe. */
typedef void (*sk_stream_fn)(void* user_data);
SK_EXPORT SK_NODISCARD sk_status_t sk_stream_enqueue(sk_stream* stream, sk_stream_fn fn, void* user_data);
/* Blocks until everything enqueued on the stream so far has run
 * (DEADLINE_EXCEEDED after 300 s). Thread-safe; a stream destroyed meanwhile
 * by another thread is freed when this returns. */
SK_EXPORT SK_NODISCARD sk_status_t sk_stream_synchronize(sk_stream* stream);
/* Accepts NULL. An engine that used the stream keeps it alive. */
SK_EXPORT void sk_stream_destroy(sk_stream* stream);
/* Makes `stream` the engine's caller stream for the calls that follow (the
 * protocol above); NULL restores the synchronous protocol. Per call: set a
 * stream before a pre_ call and its post_ call follows it. INVALID_ARGUMENT for
 * a stream of another device than the engine's. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_set_stream(sk_engine* engine, sk_stream* stream);

/* Full state dicts of the engine's units (see sk_trainer_save_state_dict):
 * tensors "<unit>.<param>"; in the SHARDKIT layout with the optimizer state
 * and (0.6.0) the step count, which a load restores (sk_engine_steps).
 * The TORCH layout transposes 2-D parameters whose name ends in ".w";
 * HF_GPT2 applies to units named as shardkit's GPT names them, HF_LLAMA to
 * units named as its Llama-family model names them. Collective;
 * FAILED_PRECONDITION while a unit is between a pre_ call and its post_
 * call; on a failed load nothing changed. Errors otherwise as the trainer's. */
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_save_state_dict(sk_engine* engine, const char* path,
                                                             sk_weight_layout_t layout);
SK_EXPORT SK_NODISCARD sk_status_t sk_engine_load_state_dict(sk_engine* engine, const char* path,
                                                             sk_weight_layout_t layout);

#ifdef __cplusplus
} /* extern "C" */
#endif


#endif /* SHARDKIT_SHARDKIT_H_ */
