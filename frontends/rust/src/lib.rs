//! Rust bindings for shardkit's C ABI (`libshardkit.so`): fully sharded
//! data-parallel training (FSDP / ZeRO-3).
//!
//! Three layers, as rusqlite and cudarc's NCCL bindings have them:
//! * [`sys`]: the raw `extern "C"` declarations of `shardkit.h` (checked
//!   against the header by `tests/header.rs`);
//! * [`Error`] / [`Result`]: every status code becomes a `Result`, carrying
//!   the library's message;
//! * safe owners ([`ProcessGroup`], [`Trainer`], [`LocalSession`],
//!   [`ModelSpec`], [`Engine`]) that release their handle in `Drop`, and
//!   [`Device`] (cpu, cuda or the simulator) for their options.
//!
//! Semantics (lifetimes, threads, collectives) are the C API's; see
//! `shardkit.h`. Owners are `Send` (a handle may move to another thread) but
//! not `Sync` (one thread at a time).
//!
//! ```no_run
//! let options = shardkit::TrainerOptions { model: Some("gpt-tiny".into()), ..Default::default() };
//! let mut session = shardkit::LocalSession::new(&options, 2, None)?;
//! println!("loss {}", session.step()?.loss);
//! # Ok::<(), shardkit::Error>(())
//! ```

pub mod sys;

use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Mutex;

pub use sys::sk_fsdp_options as FsdpOptions;
pub use sys::sk_lr_schedule as LrSchedule;
pub use sys::sk_memory_estimate as MemoryEstimate;
pub use sys::sk_optimizer_options as OptimizerOptions;
pub use sys::sk_step_metrics as StepMetrics;

/// A failed call: the `sk_status_t` code and the library's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: sys::sk_status_t,
    pub message: String,
}

impl Error {
    /// The code's name: "INVALID_ARGUMENT", ...
    pub fn code_name(&self) -> String {
        unsafe { CStr::from_ptr(sys::sk_status_name(self.code)) }.to_string_lossy().into_owned()
    }
    fn invalid_argument(message: String) -> Error {
        Error { code: sys::SK_STATUS_INVALID_ARGUMENT, message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code_name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// The names and tensor layout of a state dict file (sk_weight_layout_t).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// shardkit's own names and [in, out] matmul weights, with optimizer state and step.
    Shardkit,
    /// The same names, matmul weights [out, in] as torch.nn.Linear; weights only.
    Torch,
    /// Hugging Face GPT2LMHeadModel names and layout; weights only.
    HfGpt2,
    /// Hugging Face LlamaForCausalLM / Qwen2ForCausalLM names and layout; weights only.
    HfLlama,
}

impl WeightLayout {
    fn raw(self) -> sys::sk_weight_layout_t {
        match self {
            WeightLayout::Shardkit => sys::SK_WEIGHT_LAYOUT_SHARDKIT,
            WeightLayout::Torch => sys::SK_WEIGHT_LAYOUT_TORCH,
            WeightLayout::HfGpt2 => sys::SK_WEIGHT_LAYOUT_HF_GPT2,
            WeightLayout::HfLlama => sys::SK_WEIGHT_LAYOUT_HF_LLAMA,
        }
    }
}

/// `Ok(())` for SK_STATUS_OK, else this thread's last error.
fn check(code: sys::sk_status_t) -> Result<()> {
    if code == sys::SK_STATUS_OK {
        return Ok(());
    }
    let message = unsafe { CStr::from_ptr(sys::sk_last_error_message()) }.to_string_lossy().into_owned();
    Err(Error { code, message })
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid_argument(format!("{} contains a NUL byte", what)))
}

fn opt_cstring(s: Option<&str>, what: &str) -> Result<Option<CString>> {
    match s {
        Some(s) => cstring(s, what).map(Some),
        None => Ok(None),
    }
}

/// A path as the C API takes it: its bytes, NUL-terminated.
fn path_cstring(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::invalid_argument(format!("path {} contains a NUL byte", p.display())))
}

fn opt_ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |c| c.as_ptr())
}

/// The loaded library's version ("0.4.0").
pub fn version() -> String {
    unsafe { CStr::from_ptr(sys::sk_version()) }.to_string_lossy().into_owned()
}

/// The loaded library's SK_VERSION_NUMBER.
pub fn version_number() -> i32 {
    unsafe { sys::sk_version_number() }
}

impl Default for FsdpOptions {
    /// SK_FSDP_OPTIONS_INIT: every field 0 ("default").
    fn default() -> Self {
        let mut o: FsdpOptions = unsafe { std::mem::zeroed() };
        o.struct_size = std::mem::size_of::<FsdpOptions>();
        o
    }
}

impl Default for OptimizerOptions {
    /// SK_OPTIMIZER_OPTIONS_INIT: lr 1e-3 (since 0.6.0 `lr` is taken as
    /// given: 0 is a rate of 0), every other field 0 ("default"). Parameter
    /// groups go in [`TrainerOptions::param_groups`] and
    /// [`EngineOptions::param_groups`], which fill in the raw pointer.
    fn default() -> Self {
        let mut o: OptimizerOptions = unsafe { std::mem::zeroed() };
        o.struct_size = std::mem::size_of::<OptimizerOptions>();
        o.lr = 1e-3;
        o
    }
}

impl Default for LrSchedule {
    /// SK_LR_SCHEDULE_INIT: constant.
    fn default() -> Self {
        LrSchedule { struct_size: std::mem::size_of::<LrSchedule>(), kind: 0, min_lr: 0.0, warmup_steps: 0, decay_steps: 0 }
    }
}

impl LrSchedule {
    /// Linear warmup over `warmup_steps`, then cosine decay over
    /// `decay_steps` to `min_lr`.
    pub fn warmup_cosine(warmup_steps: i64, decay_steps: i64, min_lr: f32) -> LrSchedule {
        LrSchedule { kind: sys::SK_LR_SCHEDULE_COSINE, min_lr, warmup_steps, decay_steps, ..Default::default() }
    }
    /// Linear warmup, then linear decay to `min_lr`.
    pub fn warmup_linear(warmup_steps: i64, decay_steps: i64, min_lr: f32) -> LrSchedule {
        LrSchedule { kind: sys::SK_LR_SCHEDULE_LINEAR, min_lr, warmup_steps, decay_steps, ..Default::default() }
    }
}

/// A parameter group (`sk_param_group`): overrides of weight decay and the
/// learning rate for the parameters it selects ("<unit>.<param>" by glob,
/// or a no-decay rule). The first group selecting a parameter wins.
#[derive(Clone, Debug)]
pub struct ParamGroup {
    /// '*'/'?' glob on "<unit>.<param>"; None selects nothing by name.
    pub pattern: Option<String>,
    /// Also select biases, norm gains (fewer than 2 dims) and embeddings
    /// (shardkit's rule before 0.8.0; the same as `no_decay` =
    /// `sys::SK_NO_DECAY_NORMS_BIASES_EMBEDDINGS`).
    pub norms_biases_embeddings: bool,
    /// Also select the parameters of this rule (`sys::SK_NO_DECAY_*`):
    /// `SK_NO_DECAY_BIASES_AND_NORMS` is Hugging Face Trainer's.
    pub no_decay: sys::sk_no_decay_t,
    /// The group's weight decay; None = the optimizer's.
    pub weight_decay: Option<f32>,
    /// The group's rate is the step's times this (0 freezes it).
    pub lr_multiplier: f32,
}

impl Default for ParamGroup {
    /// SK_PARAM_GROUP_INIT: no decay, multiplier 1, selecting nothing yet.
    fn default() -> Self {
        ParamGroup {
            pattern: None,
            norms_biases_embeddings: false,
            no_decay: sys::SK_NO_DECAY_NONE,
            weight_decay: Some(0.0),
            lr_multiplier: 1.0,
        }
    }
}

impl ParamGroup {
    /// The usual "no weight decay" group as Hugging Face's Trainer makes
    /// it: biases and norm weights; embeddings (and a tied head) decay
    /// (0.8.0; before, this was `no_decay_norms_biases_embeddings`).
    pub fn no_decay() -> ParamGroup {
        ParamGroup { no_decay: sys::SK_NO_DECAY_BIASES_AND_NORMS, ..Default::default() }
    }
    /// No weight decay for norms, biases and embeddings (shardkit's rule
    /// before 0.8.0).
    pub fn no_decay_norms_biases_embeddings() -> ParamGroup {
        ParamGroup { norms_biases_embeddings: true, ..Default::default() }
    }
}

/// Raw groups and the strings they point to, alive while the options are used.
struct RawGroups {
    raw: Vec<sys::sk_param_group>,
    _patterns: Vec<Option<CString>>,
}

impl RawGroups {
    fn new(groups: &[ParamGroup]) -> Result<RawGroups> {
        let patterns =
            groups.iter().map(|g| opt_cstring(g.pattern.as_deref(), "pattern")).collect::<Result<Vec<_>>>()?;
        let raw = groups
            .iter()
            .zip(&patterns)
            .map(|(g, p)| sys::sk_param_group {
                struct_size: std::mem::size_of::<sys::sk_param_group>(),
                pattern: opt_ptr(p),
                norms_biases_embeddings: g.norms_biases_embeddings as i32,
                weight_decay: g.weight_decay.unwrap_or(0.0),
                lr_multiplier: g.lr_multiplier,
                inherit_weight_decay: g.weight_decay.is_none() as i32,
                no_decay: g.no_decay,
            })
            .collect();
        Ok(RawGroups { raw, _patterns: patterns })
    }
    /// `optimizer` pointing at these groups (valid while `self` lives).
    fn optimizer(&self, optimizer: &OptimizerOptions) -> OptimizerOptions {
        let mut o = *optimizer;
        if !self.raw.is_empty() {
            o.param_groups = self.raw.as_ptr();
            o.num_param_groups = self.raw.len() as i32;
        }
        o
    }
}

/// bfloat16: the top half of an f32 (`sk_dtype_t` BF16), the compute and
/// communication format of `param_dtype`/`reduce_dtype = bf16`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounds to nearest, ties to even (as shardkit and PyTorch do); NaN
    /// stays NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) | 0x0040) as u16);
        }
        let rounding = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(rounding) >> 16) as u16)
    }
    /// Exact.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl From<f32> for Bf16 {
    fn from(x: f32) -> Bf16 {
        Bf16::from_f32(x)
    }
}

impl From<Bf16> for f32 {
    fn from(x: Bf16) -> f32 {
        x.to_f32()
    }
}

/// `f32` values into a new bf16 vector.
pub fn to_bf16(values: &[f32]) -> Vec<Bf16> {
    values.iter().map(|&x| Bf16::from_f32(x)).collect()
}

/// bf16 values into a new f32 vector (exact).
pub fn from_bf16(values: &[Bf16]) -> Vec<f32> {
    values.iter().map(|x| x.to_f32()).collect()
}

/// An element type the library moves: its `sk_dtype_t`. Implemented for
/// `f32` and [`Bf16`]; typed views and collectives check it against the
/// buffer's dtype.
pub trait Element: Copy + 'static {
    const DTYPE: sys::sk_dtype_t;
}

impl Element for f32 {
    const DTYPE: sys::sk_dtype_t = sys::SK_DTYPE_F32;
}

impl Element for Bf16 {
    const DTYPE: sys::sk_dtype_t = sys::SK_DTYPE_BF16;
}

/// f64, i32 and i64 move through the collectives on the caller's buffers
/// only (0.8.0); an engine's views are never of them.
impl Element for f64 {
    const DTYPE: sys::sk_dtype_t = sys::SK_DTYPE_F64;
}

impl Element for i32 {
    const DTYPE: sys::sk_dtype_t = sys::SK_DTYPE_I32;
}

impl Element for i64 {
    const DTYPE: sys::sk_dtype_t = sys::SK_DTYPE_I64;
}

/// How `Group::all_reduce` combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the group's size.
    Mean,
    /// Elementwise maximum (NaN wins).
    Max,
    /// Elementwise minimum (NaN wins; 0.8.0).
    Min,
}

impl ReduceOp {
    fn raw(self) -> sys::sk_reduce_op_t {
        match self {
            ReduceOp::Sum => sys::SK_REDUCE_SUM,
            ReduceOp::Mean => sys::SK_REDUCE_MEAN,
            ReduceOp::Max => sys::SK_REDUCE_MAX,
            ReduceOp::Min => sys::SK_REDUCE_MIN,
        }
    }
}

fn new_metrics() -> StepMetrics {
    StepMetrics { struct_size: std::mem::size_of::<StepMetrics>(), ..Default::default() }
}

/// `sk_parse_sharding_strategy`: "FULL_SHARD", "shard_grad_op", ...
pub fn parse_sharding_strategy(name: &str) -> Result<sys::sk_sharding_strategy_t> {
    let c = cstring(name, "name")?;
    let mut out = 0;
    check(unsafe { sys::sk_parse_sharding_strategy(c.as_ptr(), &mut out) })?;
    Ok(out)
}

/// The memory estimator's peak for one rank of a trainer with `options` on
/// `world_size` ranks (`sk_estimate_memory`); builds and runs nothing.
pub fn estimate_memory(options: &TrainerOptions, world_size: i32) -> Result<MemoryEstimate> {
    let mut e = MemoryEstimate { struct_size: std::mem::size_of::<MemoryEstimate>(), ..Default::default() };
    check(options.with_raw(|o| unsafe { sys::sk_estimate_memory(o, world_size, &mut e) })?)?;
    Ok(e)
}

/// What to plan (`sk_plan_request`): zero and `None` fields take the
/// library's defaults (profile "a100-80g", 8 GPUs, 8 per node, batch 1, the
/// model's sequence lengths, the whole candidate space).
/// `activation_checkpointing` and `cpu_offload`: 0 both, 1 off only, 2 on
/// only; `checkpointing` lists the checkpointing policies instead, by name
/// ("off,full,selective,selective_attention,selective_matmuls"; `None`: as
/// `activation_checkpointing` says).
#[derive(Clone, Debug, Default)]
pub struct PlanRequest {
    pub model: String,
    pub profile: Option<String>,
    pub gpus: i32,
    pub gpus_per_node: i32,
    pub batch_size: i64,
    pub seq_len: i64,
    pub source_len: i64,
    /// Comma-separated: "DDP,FULL_SHARD,..." (`None`: all).
    pub strategies: Option<String>,
    /// Comma-separated param[/reduce] dtypes: "f32,bf16,bf16/f32" (`None`: all).
    pub dtypes: Option<String>,
    pub activation_checkpointing: i32,
    pub cpu_offload: i32,
    /// Chrome trace of the recommended configuration's simulated step.
    pub trace_path: Option<PathBuf>,
    /// Comma-separated `sk_activation_checkpointing_t` names to search.
    pub checkpointing: Option<String>,
}

/// One ranked candidate of a [`Plan`] (`sk_plan_candidate`, owned).
#[derive(Clone, Debug)]
pub struct PlanCandidate {
    pub label: String,
    /// Why the simulation failed, other than memory.
    pub error: Option<String>,
    pub parallelism: sys::sk_parallelism_t,
    pub strategy: sys::sk_sharding_strategy_t,
    pub shard_group_size: i32,
    pub backward_prefetch: sys::sk_backward_prefetch_t,
    pub forward_prefetch: bool,
    pub rate_limit: i32,
    /// Whole-block checkpointing (`checkpointing` is `SK_CHECKPOINTING_FULL`).
    pub activation_checkpointing: bool,
    /// The candidate's checkpointing policy (`sys::SK_CHECKPOINTING_*`).
    pub checkpointing: sys::sk_activation_checkpointing_t,
    pub cpu_offload: bool,
    pub param_dtype: sys::sk_dtype_t,
    pub reduce_dtype: sys::sk_dtype_t,
    pub fits: bool,
    pub out_of_memory: bool,
    pub peak_allocated_bytes: i64,
    pub peak_reserved_bytes: i64,
    pub alloc_retries: i64,
    pub required_bytes: i64,
    pub step_seconds: f64,
    pub tflops_per_gpu: f64,
    pub mfu: f64,
    pub exposed_comm_seconds: f64,
    /// Peak simulated host memory per GPU: what CPU offload keeps there
    /// (f32 master and gradient shards, optimizer state, host temporaries);
    /// 0 without offload.
    pub peak_host_bytes: i64,
}

/// A plan (`sk_plan`), copied out of the library's result.
#[derive(Clone, Debug)]
pub struct Plan {
    pub profile: String,
    pub device_memory_bytes: i64,
    /// Index of the recommendation in `candidates` (0), or `None`: nothing fits.
    pub recommended: Option<usize>,
    pub recommendation: String,
    pub table: String,
    pub json: String,
    /// Ranked: the fastest that fits first.
    pub candidates: Vec<PlanCandidate>,
}

fn owned_str(p: *const c_char) -> String {
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Simulates every candidate configuration of `request` and ranks them
/// (`sk_plan`); runs nothing on a real device.
pub fn plan(request: &PlanRequest) -> Result<Plan> {
    let model = cstring(&request.model, "model")?;
    let profile = opt_cstring(request.profile.as_deref(), "profile")?;
    let strategies = opt_cstring(request.strategies.as_deref(), "strategies")?;
    let dtypes = opt_cstring(request.dtypes.as_deref(), "dtypes")?;
    let checkpointing = opt_cstring(request.checkpointing.as_deref(), "checkpointing")?;
    let trace = match &request.trace_path {
        Some(p) => Some(path_cstring(p)?),
        None => None,
    };
    let r = sys::sk_plan_request {
        struct_size: std::mem::size_of::<sys::sk_plan_request>(),
        model: model.as_ptr(),
        profile: opt_ptr(&profile),
        gpus: request.gpus,
        gpus_per_node: request.gpus_per_node,
        batch_size: request.batch_size,
        seq_len: request.seq_len,
        source_len: request.source_len,
        strategies: opt_ptr(&strategies),
        dtypes: opt_ptr(&dtypes),
        activation_checkpointing: request.activation_checkpointing,
        cpu_offload: request.cpu_offload,
        trace_path: opt_ptr(&trace),
        checkpointing: opt_ptr(&checkpointing),
    };
    let mut raw: *mut sys::sk_plan_result = std::ptr::null_mut();
    check(unsafe { sys::sk_plan(&r, &mut raw) })?;
    // Freed on every path below, errors included.
    struct Free(*mut sys::sk_plan_result);
    impl Drop for Free {
        fn drop(&mut self) {
            unsafe { sys::sk_plan_result_free(self.0) }
        }
    }
    let owner = Free(raw);
    let res = unsafe { &*owner.0 };
    let mut candidates = Vec::with_capacity(res.num_candidates.max(0) as usize);
    for i in 0..res.num_candidates {
        let mut c: sys::sk_plan_candidate = unsafe { std::mem::zeroed() };
        c.struct_size = std::mem::size_of::<sys::sk_plan_candidate>();
        check(unsafe { sys::sk_plan_result_candidate(owner.0, i, &mut c) })?;
        candidates.push(PlanCandidate {
            label: owned_str(c.label),
            error: if c.error.is_null() { None } else { Some(owned_str(c.error)) },
            parallelism: c.parallelism,
            strategy: c.strategy,
            shard_group_size: c.shard_group_size,
            backward_prefetch: c.backward_prefetch,
            forward_prefetch: c.forward_prefetch != 0,
            rate_limit: c.rate_limit,
            activation_checkpointing: c.activation_checkpointing == sys::SK_CHECKPOINTING_FULL,
            checkpointing: c.activation_checkpointing,
            cpu_offload: c.cpu_offload != 0,
            param_dtype: c.param_dtype,
            reduce_dtype: c.reduce_dtype,
            fits: c.fits != 0,
            out_of_memory: c.out_of_memory != 0,
            peak_allocated_bytes: c.peak_allocated_bytes,
            peak_reserved_bytes: c.peak_reserved_bytes,
            alloc_retries: c.alloc_retries,
            required_bytes: c.required_bytes,
            step_seconds: c.step_seconds,
            tflops_per_gpu: c.tflops_per_gpu,
            mfu: c.mfu,
            exposed_comm_seconds: c.exposed_comm_seconds,
            peak_host_bytes: c.peak_host_bytes,
        });
    }
    Ok(Plan {
        profile: owned_str(res.profile),
        device_memory_bytes: res.device_memory_bytes,
        recommended: if res.recommended >= 0 { Some(res.recommended as usize) } else { None },
        recommendation: owned_str(res.recommendation),
        table: owned_str(res.table),
        json: owned_str(res.json),
        candidates,
    })
}

/// Parameters of a named model config.
pub fn model_num_parameters(model: &str) -> Result<i64> {
    let c = cstring(model, "model")?;
    let mut n = 0;
    check(unsafe { sys::sk_model_num_parameters(c.as_ptr(), &mut n) })?;
    Ok(n)
}

// --- process groups ----------------------------------------------------------

/// Anything that names a live process group: an owned [`ProcessGroup`] or a
/// borrowed [`GroupRef`].
pub trait Group {
    fn as_ptr(&self) -> *mut sys::sk_process_group;

    fn rank(&self) -> Result<i32> {
        let mut r = 0;
        check(unsafe { sys::sk_process_group_rank(self.as_ptr(), &mut r) })?;
        Ok(r)
    }
    fn size(&self) -> Result<i32> {
        let mut s = 0;
        check(unsafe { sys::sk_process_group_size(self.as_ptr(), &mut s) })?;
        Ok(s)
    }
    fn label(&self) -> Result<String> {
        let mut l: *const c_char = ptr::null();
        check(unsafe { sys::sk_process_group_label(self.as_ptr(), &mut l) })?;
        Ok(unsafe { CStr::from_ptr(l) }.to_string_lossy().into_owned())
    }

    /// The mean of `value` over ranks (a loss, say).
    fn mean(&self, value: f32) -> Result<f32> {
        let mut v = [value];
        group_all_reduce(self.as_ptr(), &mut v, ReduceOp::Mean)?;
        Ok(v[0])
    }
    /// Returns when every rank has called it.
    fn barrier(&self) -> Result<()> {
        check(unsafe { sys::sk_process_group_barrier(self.as_ptr()) })
    }
}

// The generic collectives, on every kind of group: an owned ProcessGroup, a
// borrowed GroupRef and a `&dyn Group` (the one a framework gave
// Engine::new). Inherent methods: as generic trait methods they needed
// `Self: Sized`, so a `&dyn Group` could not call them.
macro_rules! group_collectives {
    ($($t:ty),*) => {$(
        impl $t {
            /// In place: `data` becomes the reduction over ranks
            /// (collective; host memory, so cpu groups:
            /// `sk_process_group_all_reduce`). f32, bf16, and (0.8.0) f64,
            /// i32 and i64; MEAN of integers is INVALID_ARGUMENT.
            pub fn all_reduce<T: Element>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
                group_all_reduce(self.as_ptr(), data, op)
            }
            /// In place: every rank's `data` becomes rank `root`'s (collective).
            pub fn broadcast<T: Element>(&self, data: &mut [T], root: i32) -> Result<()> {
                group_broadcast(self.as_ptr(), data, root)
            }
            /// Every rank's `input`, concatenated in rank order (collective).
            pub fn all_gather<T: Element + Default>(&self, input: &[T]) -> Result<Vec<T>> {
                group_all_gather(self.as_ptr(), input)
            }
        }
    )*};
}
group_collectives!(ProcessGroup, GroupRef<'_>, dyn Group + '_);

fn group_all_reduce<T: Element>(g: *mut sys::sk_process_group, data: &mut [T], op: ReduceOp) -> Result<()> {
    check(unsafe { sys::sk_process_group_all_reduce(g, data.as_mut_ptr() as *mut c_void, data.len() as i64, T::DTYPE, op.raw()) })
}

fn group_broadcast<T: Element>(g: *mut sys::sk_process_group, data: &mut [T], root: i32) -> Result<()> {
    check(unsafe { sys::sk_process_group_broadcast(g, data.as_mut_ptr() as *mut c_void, data.len() as i64, T::DTYPE, root) })
}

fn group_all_gather<T: Element + Default>(g: *mut sys::sk_process_group, input: &[T]) -> Result<Vec<T>> {
    let mut size = 0;
    check(unsafe { sys::sk_process_group_size(g, &mut size) })?;
    let mut out = vec![T::default(); input.len() * size as usize];
    check(unsafe {
        sys::sk_process_group_all_gather(
            g,
            input.as_ptr() as *const c_void,
            out.as_mut_ptr() as *mut c_void,
            input.len() as i64,
            T::DTYPE,
        )
    })?;
    Ok(out)
}

/// One rank's owned handle on a process group.
#[derive(Debug)]
pub struct ProcessGroup {
    raw: *mut sys::sk_process_group,
}

unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// The `world_size` rank handles of a new local group (ranks are threads).
    pub fn local(world_size: i32, network_model: Option<&str>) -> Result<Vec<ProcessGroup>> {
        let network = opt_cstring(network_model, "network_model")?;
        let mut raw: Vec<*mut sys::sk_process_group> = vec![ptr::null_mut(); world_size.max(1) as usize];
        check(unsafe { sys::sk_process_group_create_local(world_size, opt_ptr(&network), raw.as_mut_ptr()) })?;
        raw.truncate(world_size as usize);
        Ok(raw.into_iter().map(|raw| ProcessGroup { raw }).collect())
    }

    /// This process's rank of a gloo group, from torchrun's environment.
    pub fn gloo_from_env() -> Result<ProcessGroup> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::sk_process_group_create_gloo(ptr::null(), &mut raw) })?;
        Ok(ProcessGroup { raw })
    }

    /// This process's rank of an nccl group on its GPU, from torchrun's
    /// environment (the GPU: `SK_CUDA_DEVICE`, else `LOCAL_RANK`).
    /// `Unavailable` in a library built without CUDA.
    pub fn nccl_from_env() -> Result<ProcessGroup> {
        Self::nccl_with(None, None)
    }

    /// As [`ProcessGroup::nccl_from_env`], with this rank's GPU and the
    /// timeout (milliseconds) given instead of their defaults.
    pub fn nccl_with(device: Option<i32>, timeout_ms: Option<i64>) -> Result<ProcessGroup> {
        let options = sys::sk_nccl_options {
            struct_size: std::mem::size_of::<sys::sk_nccl_options>(),
            rank: 0,
            world_size: 0,
            master_addr: ptr::null(),
            master_port: 0,
            use_device: device.is_some() as i32,
            device: device.unwrap_or(0),
            timeout_ms: timeout_ms.unwrap_or(0),
            skip_call_check: 0,
        };
        let mut raw = ptr::null_mut();
        check(unsafe { sys::sk_process_group_create_nccl(&options, &mut raw) })?;
        Ok(ProcessGroup { raw })
    }
}

impl Group for ProcessGroup {
    fn as_ptr(&self) -> *mut sys::sk_process_group {
        self.raw
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        unsafe { sys::sk_process_group_destroy(self.raw) }
    }
}

/// A process group borrowed for the duration of a [`run_local_ranks`] callback.
#[derive(Clone, Copy, Debug)]
pub struct GroupRef<'a> {
    raw: *mut sys::sk_process_group,
    _call: PhantomData<&'a ()>,
}

impl<'a> Group for GroupRef<'a> {
    fn as_ptr(&self) -> *mut sys::sk_process_group {
        self.raw
    }
}

struct RankContext<F> {
    body: F,
    errors: Mutex<Vec<Option<Error>>>,
}

unsafe extern "C" fn rank_trampoline<F>(rank: i32, group: *mut sys::sk_process_group, user: *mut c_void) -> sys::sk_status_t
where
    F: Fn(i32, GroupRef<'_>) -> Result<()> + Sync,
{
    let ctx = &*(user as *const RankContext<F>);
    let group = GroupRef { raw: group, _call: PhantomData };
    // A panic must not unwind into C: it becomes this rank's error.
    let result = catch_unwind(AssertUnwindSafe(|| (ctx.body)(rank, group)));
    let error = match result {
        Ok(Ok(())) => return sys::SK_STATUS_OK,
        Ok(Err(e)) => e,
        Err(panic) => {
            let what = if let Some(s) = panic.downcast_ref::<&str>() {
                s.to_string()
            } else if let Some(s) = panic.downcast_ref::<String>() {
                s.clone()
            } else {
                "a panic".to_string()
            };
            Error { code: sys::SK_STATUS_INTERNAL, message: format!("rank {} panicked: {}", rank, what) }
        }
    };
    let code = error.code;
    if let Ok(mut errors) = ctx.errors.lock() {
        errors[rank as usize] = Some(error);
    }
    code
}

/// Runs `body(rank, group)` for every rank of a new local group of
/// `world_size` ranks, each on its own library thread, and waits for all.
/// Returns the lowest failing rank's error (a panic becomes an INTERNAL
/// error naming the rank: it never unwinds into the library).
pub fn run_local_ranks<F>(world_size: i32, network_model: Option<&str>, body: F) -> Result<()>
where
    F: Fn(i32, GroupRef<'_>) -> Result<()> + Sync,
{
    let network = opt_cstring(network_model, "network_model")?;
    let ctx = Box::new(RankContext { body, errors: Mutex::new(vec![None; world_size.max(0) as usize]) });
    let user = Box::into_raw(ctx);
    let code = unsafe {
        sys::sk_run_local_ranks(world_size, opt_ptr(&network), Some(rank_trampoline::<F>), user as *mut c_void)
    };
    let status = check(code);
    let ctx = unsafe { Box::from_raw(user) };
    let errors = ctx.errors.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(first) = errors.into_iter().flatten().next() {
        return Err(first);
    }
    status
}

// --- devices -----------------------------------------------------------------

/// Which device a rank computes on (`sk_device_options`, 0.4.0). The library
/// validates it when a trainer, session or engine is created: a bad value is
/// that call's `Err`, with the library's message naming the field.
///
/// ```no_run
/// use shardkit::{Device, Trainer, TrainerOptions};
/// // Train on cuda:0 (UNAVAILABLE where no GPU is visible).
/// let gpu = TrainerOptions { device: Some(Device::cuda(0)), ..Default::default() };
/// // Simulate 512 A100-80G GPUs, 8 per node: the trainer makes its own world.
/// let sim = TrainerOptions {
///     model: Some("gpt-175b".into()),
///     device: Some(Device::Sim {
///         profile: "a100-80g".into(),
///         world_size: 512,
///         gpus_per_node: 8,
///         index: None,
///         launch_blocking: false,
///     }),
///     ..Default::default()
/// };
/// let mut trainer = Trainer::simulated(&sim)?;
/// let m = trainer.step()?; // m.simulated != 0, m.loss is NaN, m.step_seconds virtual
/// # Ok::<(), shardkit::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// The host. `index`: `None` = cpu:rank. `launch_blocking`: every op
    /// completes before the host goes on (CUDA_LAUNCH_BLOCKING's analogue).
    Cpu { index: Option<i32>, launch_blocking: bool },
    /// A GPU. `index`: `None` = cuda:(rank modulo the visible GPUs). The
    /// library refuses launch blocking here (set CUDA_LAUNCH_BLOCKING=1
    /// instead). UNAVAILABLE when the library was built without CUDA or no
    /// GPU is visible.
    Cuda { index: Option<i32> },
    /// The simulator (docs/simulator.md): one simulated rank stands for a
    /// cluster of `world_size` GPUs (0 = 1) of hardware `profile` (a built-in
    /// name, "a100-80g", "h100-80g", "h200-141g", "cpu-local", or a .json path), with
    /// `gpus_per_node` per node (0 = the profile's). Tensors hold no data:
    /// losses and norms are NaN and `StepMetrics::simulated` is set. Create
    /// trainers and engines on it with [`Trainer::simulated`] and
    /// [`Engine::simulated`] (no process group). `index`: the simulated
    /// device, `None` = sim:0; one trainer or plan per sim device at a time.
    Sim { profile: String, world_size: i32, gpus_per_node: i32, index: Option<i32>, launch_blocking: bool },
}

impl Default for Device {
    /// cpu:rank, what `None` selects too.
    fn default() -> Self {
        Device::cpu()
    }
}

impl Device {
    /// cpu:rank.
    pub fn cpu() -> Device {
        Device::Cpu { index: None, launch_blocking: false }
    }
    /// cuda:`index`.
    pub fn cuda(index: i32) -> Device {
        Device::Cuda { index: Some(index) }
    }
    /// `world_size` simulated GPUs of `profile`, the profile's GPUs per node,
    /// on sim:0.
    pub fn sim(profile: &str, world_size: i32) -> Device {
        Device::Sim { profile: profile.to_string(), world_size, gpus_per_node: 0, index: None, launch_blocking: false }
    }

    fn kind(&self) -> sys::sk_device_kind_t {
        match self {
            Device::Cpu { .. } => sys::SK_DEVICE_CPU,
            Device::Cuda { .. } => sys::SK_DEVICE_CUDA,
            Device::Sim { .. } => sys::SK_DEVICE_SIM,
        }
    }

    /// The C struct and the profile string it points into (moving the
    /// `RawDevice` does not move the string's bytes).
    fn to_raw(&self) -> Result<RawDevice> {
        let mut raw = sys::sk_device_options {
            struct_size: std::mem::size_of::<sys::sk_device_options>(),
            kind: self.kind(),
            use_index: 0,
            index: 0,
            sim_profile: ptr::null(),
            sim_world_size: 0,
            sim_gpus_per_node: 0,
            launch_blocking: 0,
        };
        let mut profile = None;
        let index = match self {
            Device::Cpu { index, launch_blocking } => {
                raw.launch_blocking = *launch_blocking as i32;
                *index
            }
            Device::Cuda { index } => *index,
            Device::Sim { profile: p, world_size, gpus_per_node, index, launch_blocking } => {
                let c = cstring(p, "sim profile")?;
                raw.sim_profile = c.as_ptr();
                profile = Some(c);
                raw.sim_world_size = *world_size;
                raw.sim_gpus_per_node = *gpus_per_node;
                raw.launch_blocking = *launch_blocking as i32;
                *index
            }
        };
        if let Some(i) = index {
            raw.use_index = 1;
            raw.index = i;
        }
        Ok(RawDevice { raw, _profile: profile })
    }
}

struct RawDevice {
    raw: sys::sk_device_options,
    _profile: Option<CString>,
}

fn opt_raw_device(d: &Option<RawDevice>) -> *const sys::sk_device_options {
    d.as_ref().map_or(ptr::null(), |d| &d.raw)
}

// --- high level --------------------------------------------------------------

/// A dataset the trainer reads itself (`sk_dataset_options`, 0.8.0;
/// docs/data.md). Zero/None fields mean "default".
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    /// The files, read in this order as one dataset (at least one).
    pub paths: Vec<PathBuf>,
    /// `sys::SK_DATASET_FORMAT_*`; 0 = TOKENS.
    pub format: sys::sk_dataset_format_t,
    /// `sys::SK_TOKEN_FILE_LAYOUT_*`; 0 = AUTO.
    pub token_file_layout: sys::sk_token_file_layout_t,
    /// TOKENS: 2 or 4; 0 = 2, or the llm.c header's.
    pub token_bytes: i32,
    /// The order's seed; 0 = 1.
    pub seed: u64,
    /// File order every epoch (no shuffle).
    pub sequential: bool,
    /// Concatenate documents into rows (segment ids and positions per row).
    pub packing: bool,
    /// The end-of-sequence token; None = none.
    pub eos_id: Option<i64>,
    /// Held-out files for `Trainer::evaluate`.
    pub eval_paths: Vec<PathBuf>,
}

/// A `Dataset` as the C struct and the strings it points to.
struct RawDataset {
    raw: sys::sk_dataset_options,
    _paths: Vec<CString>,
    _path_ptrs: Vec<*const c_char>,
    _eval: Vec<CString>,
    _eval_ptrs: Vec<*const c_char>,
}

impl Dataset {
    fn to_raw(&self) -> Result<Box<RawDataset>> {
        let paths = self.paths.iter().map(|p| path_cstring(p)).collect::<Result<Vec<_>>>()?;
        let eval = self.eval_paths.iter().map(|p| path_cstring(p)).collect::<Result<Vec<_>>>()?;
        let path_ptrs: Vec<*const c_char> = paths.iter().map(|c| c.as_ptr()).collect();
        let eval_ptrs: Vec<*const c_char> = eval.iter().map(|c| c.as_ptr()).collect();
        let raw = sys::sk_dataset_options {
            struct_size: std::mem::size_of::<sys::sk_dataset_options>(),
            paths: if path_ptrs.is_empty() { ptr::null() } else { path_ptrs.as_ptr() },
            num_paths: path_ptrs.len() as i32,
            format: self.format,
            token_file_layout: self.token_file_layout,
            token_bytes: self.token_bytes,
            seed: self.seed,
            sequential: self.sequential as i32,
            packing: self.packing as i32,
            eos_id: self.eos_id.unwrap_or(0),
            has_eos_id: self.eos_id.is_some() as i32,
            num_eval_paths: eval_ptrs.len() as i32,
            eval_paths: if eval_ptrs.is_empty() { ptr::null() } else { eval_ptrs.as_ptr() },
        };
        // The pointer vectors' buffers do not move with the Vec values.
        Ok(Box::new(RawDataset { raw, _paths: paths, _path_ptrs: path_ptrs, _eval: eval, _eval_ptrs: eval_ptrs }))
    }
}

/// Where a trainer with a dataset stands in it (`sk_trainer_data_position`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPosition {
    /// Global samples the completed steps took (what a checkpoint records).
    pub samples_consumed: i64,
    pub samples_per_epoch: i64,
}

/// One micro-batch from the caller (`sk_batch`, 0.8.0; docs/batches.md):
/// `batch_size` rows of `seq_len` token ids, row-major. `targets` holds the
/// token each position predicts (the library does not shift; unlike Hugging
/// Face's labels) or [`sys::SK_IGNORE_INDEX`] (-100) to leave the position
/// out of the loss. The optional arrays: a loss mask (0 = ignored), position
/// ids and segment ids (packed documents: each token attends only to earlier
/// tokens of its own segment). Every array holds `batch_size * seq_len`
/// values: a wrong length is INVALID_ARGUMENT before the library is called.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub batch_size: i64,
    pub seq_len: i64,
    pub input_ids: Vec<i32>,
    pub targets: Vec<i32>,
    pub loss_mask: Option<Vec<u8>>,
    pub position_ids: Option<Vec<i32>>,
    pub segment_ids: Option<Vec<i32>>,
}

impl Batch {
    /// `batch_size` x `seq_len` ids and targets, every position counted
    /// unless its target is [`sys::SK_IGNORE_INDEX`].
    pub fn new(batch_size: i64, seq_len: i64, input_ids: Vec<i32>, targets: Vec<i32>) -> Batch {
        Batch { batch_size, seq_len, input_ids, targets, ..Default::default() }
    }
    /// With a loss mask (0 leaves a position out of the loss, 1 keeps it).
    pub fn with_loss_mask(mut self, loss_mask: Vec<u8>) -> Batch {
        self.loss_mask = Some(loss_mask);
        self
    }
    /// Packed documents: each token's position id and document (segment).
    pub fn packed(mut self, position_ids: Vec<i32>, segment_ids: Vec<i32>) -> Batch {
        self.position_ids = Some(position_ids);
        self.segment_ids = Some(segment_ids);
        self
    }
    /// The C struct pointing into `self` (valid while `self` is borrowed).
    /// The lengths are checked here: the library reads batch_size * seq_len
    /// values from each pointer. Sizes out of range are left to the library
    /// (it refuses them before reading anything).
    fn to_raw(&self, index: usize) -> Result<sys::sk_batch> {
        let n = if self.batch_size > 0 && self.seq_len > 0 {
            self.batch_size.checked_mul(self.seq_len).and_then(|n| usize::try_from(n).ok())
        } else {
            None
        };
        if let Some(n) = n {
            let check = |what: &str, len: Option<usize>| -> Result<()> {
                match len {
                    Some(len) if len != n => Err(Error::invalid_argument(format!(
                        "batch {}: {} has {} values, batch_size x seq_len = {} x {} = {}",
                        index, what, len, self.batch_size, self.seq_len, n
                    ))),
                    _ => Ok(()),
                }
            };
            check("input_ids", Some(self.input_ids.len()))?;
            check("targets", Some(self.targets.len()))?;
            check("loss_mask", self.loss_mask.as_ref().map(Vec::len))?;
            check("position_ids", self.position_ids.as_ref().map(Vec::len))?;
            check("segment_ids", self.segment_ids.as_ref().map(Vec::len))?;
        }
        Ok(sys::sk_batch {
            struct_size: std::mem::size_of::<sys::sk_batch>(),
            batch_size: self.batch_size,
            seq_len: self.seq_len,
            input_ids: self.input_ids.as_ptr(),
            targets: self.targets.as_ptr(),
            loss_mask: self.loss_mask.as_ref().map_or(ptr::null(), |v| v.as_ptr()),
            position_ids: self.position_ids.as_ref().map_or(ptr::null(), |v| v.as_ptr()),
            segment_ids: self.segment_ids.as_ref().map_or(ptr::null(), |v| v.as_ptr()),
        })
    }
}

/// The C structs of `batches` (pointing into them) and the array of
/// pointers to those structs the step entries take.
fn raw_batches(batches: &[Batch]) -> Result<(Vec<sys::sk_batch>, i32)> {
    let raw = batches.iter().enumerate().map(|(i, b)| b.to_raw(i)).collect::<Result<Vec<_>>>()?;
    let n = i32::try_from(raw.len())
        .map_err(|_| Error::invalid_argument(format!("{} batches: more than a step takes", raw.len())))?;
    Ok((raw, n))
}

/// `sk_trainer_options` with owned strings. Zero/None fields mean "default".
#[derive(Clone, Debug, Default)]
pub struct TrainerOptions {
    /// A named model config; None = "gpt-tiny".
    pub model: Option<String>,
    pub fsdp: FsdpOptions,
    pub optimizer: OptimizerOptions,
    pub batch_size: i64,
    pub grad_accum_steps: i32,
    pub seq_len: i64,
    pub source_len: i64,
    pub clip_grad_norm: f64,
    /// `sys::SK_CHECKPOINTING_*` (0.6.1): 0 = off, FULL, SELECTIVE,
    /// SELECTIVE_ATTENTION or (0.8.0) SELECTIVE_MATMULS, which only the
    /// Llama family implements; an `i32`, a `bool` before 0.6.1.
    pub activation_checkpointing: sys::sk_activation_checkpointing_t,
    pub memory_cap_bytes: u64,
    pub data_path: Option<String>,
    pub data_token_bytes: i32,
    pub data_seed: u64,
    pub data_tokens: i64,
    /// `sys::SK_PARALLELISM_*`; 0 = FSDP.
    pub parallelism: sys::sk_parallelism_t,
    /// DDP's gradient bucket size; 0 = 25 MiB.
    pub ddp_bucket_bytes: i64,
    /// The rank's device; `None` = cpu:rank (and no device struct is passed,
    /// so libraries older than 0.4.0 accept the options).
    pub device: Option<Device>,
    /// The learning rate per step; `None` = constant (`optimizer.lr`).
    pub lr_schedule: Option<LrSchedule>,
    /// Parameter groups (`optimizer.param_groups`); empty = none.
    pub param_groups: Vec<ParamGroup>,
    /// A dataset read in order instead of `data_path` (0.8.0); `None` = none.
    pub dataset: Option<Dataset>,
    /// No random initialisation: the weights come from a load
    /// (`load_state_dict` of a Hugging Face directory, `load_checkpoint`,
    /// `resume_latest`), before which steps, evaluation and saves are
    /// FAILED_PRECONDITION (0.8.0, `sk_trainer_options.skip_init`).
    pub skip_init: bool,
    /// A step whose loss or gradient norm is not finite is never applied;
    /// `true` (0.8.0): it returns Ok with `StepMetrics::skipped` set instead
    /// of ABORTED, and training goes on (PyTorch's GradScaler).
    pub skip_nonfinite_steps: bool,
    /// The batches passed to `step_batches` may pack several documents in a
    /// row (segment ids): `estimate_memory` counts what that costs on CUDA,
    /// as a packing dataset makes it (0.8.0,
    /// `sk_trainer_options.packed_documents`). Training is the same.
    pub packed_documents: bool,
}

impl TrainerOptions {
    /// Calls `f` with the C struct (valid during the call only).
    fn with_raw<R>(&self, f: impl FnOnce(&sys::sk_trainer_options) -> R) -> Result<R> {
        let model = opt_cstring(self.model.as_deref(), "model")?;
        let data_path = opt_cstring(self.data_path.as_deref(), "data_path")?;
        let device = self.device.as_ref().map(Device::to_raw).transpose()?;
        let groups = RawGroups::new(&self.param_groups)?;
        let optimizer = groups.optimizer(&self.optimizer);
        let dataset = self.dataset.as_ref().map(Dataset::to_raw).transpose()?;
        let raw = sys::sk_trainer_options {
            struct_size: std::mem::size_of::<sys::sk_trainer_options>(),
            model: opt_ptr(&model),
            fsdp: &self.fsdp,
            optimizer: &optimizer,
            batch_size: self.batch_size,
            grad_accum_steps: self.grad_accum_steps,
            seq_len: self.seq_len,
            source_len: self.source_len,
            clip_grad_norm: self.clip_grad_norm,
            activation_checkpointing: self.activation_checkpointing,
            memory_cap_bytes: self.memory_cap_bytes,
            data_path: opt_ptr(&data_path),
            data_token_bytes: self.data_token_bytes,
            data_seed: self.data_seed,
            data_tokens: self.data_tokens,
            parallelism: self.parallelism,
            ddp_bucket_bytes: self.ddp_bucket_bytes,
            device: opt_raw_device(&device),
            lr_schedule: self.lr_schedule.as_ref().map_or(ptr::null(), |s| s as *const LrSchedule),
            dataset: dataset.as_ref().map_or(ptr::null(), |d| &d.raw as *const sys::sk_dataset_options),
            skip_init: i32::from(self.skip_init),
            skip_nonfinite_steps: self.skip_nonfinite_steps as i32,
            packed_documents: i32::from(self.packed_documents),
        };
        Ok(f(&raw))
    }
}

/// One rank's trainer.
#[derive(Debug)]
pub struct Trainer {
    raw: *mut sys::sk_trainer,
}

unsafe impl Send for Trainer {}

impl Trainer {
    /// Collective over `group`; the trainer keeps the group alive. On
    /// [`Device::Sim`] use [`Trainer::simulated`]: a real group is
    /// INVALID_ARGUMENT there.
    pub fn new(options: &TrainerOptions, group: &dyn Group) -> Result<Trainer> {
        Trainer::create(options, group.as_ptr())
    }
    /// A trainer on [`Device::Sim`] that simulates its own world of the
    /// device's `world_size` ranks (no process group; not collective).
    /// INVALID_ARGUMENT from the library for any other device.
    pub fn simulated(options: &TrainerOptions) -> Result<Trainer> {
        Trainer::create(options, ptr::null_mut())
    }
    fn create(options: &TrainerOptions, group: *mut sys::sk_process_group) -> Result<Trainer> {
        let mut raw = ptr::null_mut();
        check(options.with_raw(|o| unsafe { sys::sk_trainer_create(o, group, &mut raw) })?)?;
        Ok(Trainer { raw })
    }
    pub fn step(&mut self) -> Result<StepMetrics> {
        let mut m = new_metrics();
        check(unsafe { sys::sk_trainer_step(self.raw, &mut m) })?;
        Ok(m)
    }
    /// One step on the caller's micro-batches (exactly grad_accum_steps of
    /// them; `sk_trainer_step_batches`): the loss is the mean over every
    /// counted target of every micro-batch and rank. Collective: every rank
    /// calls it (not `step`) for the step. A bad batch is INVALID_ARGUMENT
    /// naming it and the field; nothing changes.
    pub fn step_batches(&mut self, micro_batches: &[Batch]) -> Result<StepMetrics> {
        let (raw, n) = raw_batches(micro_batches)?;
        let mut ptrs: Vec<*const sys::sk_batch> = raw.iter().map(|b| b as *const sys::sk_batch).collect();
        let mut m = new_metrics();
        check(unsafe { sys::sk_trainer_step_batches(self.raw, ptrs.as_mut_ptr(), n, &mut m) })?;
        Ok(m)
    }
    pub fn evaluate(&mut self, batches: i32) -> Result<f32> {
        let mut loss = 0.0;
        check(unsafe { sys::sk_trainer_evaluate(self.raw, batches, &mut loss) })?;
        Ok(loss)
    }
    /// The rate of every later step, replacing the schedule (0 is valid).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        check(unsafe { sys::sk_trainer_set_lr(self.raw, lr) })
    }
    /// The rate the next step will use.
    pub fn lr(&self) -> Result<f32> {
        let mut lr = 0.0;
        check(unsafe { sys::sk_trainer_get_lr(self.raw, &mut lr) })?;
        Ok(lr)
    }
    pub fn num_parameters(&self) -> Result<i64> {
        let mut n = 0;
        check(unsafe { sys::sk_trainer_num_parameters(self.raw, &mut n) })?;
        Ok(n)
    }
    /// With a dataset: the samples consumed and per epoch; FAILED_PRECONDITION without one.
    pub fn data_position(&self) -> Result<DataPosition> {
        let mut p = DataPosition::default();
        check(unsafe { sys::sk_trainer_data_position(self.raw, &mut p.samples_consumed, &mut p.samples_per_epoch) })?;
        Ok(p)
    }
    /// This rank's sample ids of the last step, in row order (empty without a dataset).
    pub fn last_sample_ids(&self) -> Result<Vec<i64>> {
        let mut n = 0;
        check(unsafe { sys::sk_trainer_last_sample_ids(self.raw, ptr::null_mut(), 0, &mut n) })?;
        let mut ids = vec![0i64; n as usize];
        check(unsafe { sys::sk_trainer_last_sample_ids(self.raw, ids.as_mut_ptr(), n, &mut n) })?;
        Ok(ids)
    }
    /// Writes a sharded checkpoint to `dir` (collective).
    pub fn save_checkpoint(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = path_cstring(dir.as_ref())?;
        check(unsafe { sys::sk_trainer_save_checkpoint(self.raw, dir.as_ptr()) })
    }
    /// Restores the checkpoint in `dir` (collective); the restored step
    /// count. On error the trainer is unchanged.
    pub fn load_checkpoint(&mut self, dir: impl AsRef<Path>) -> Result<i64> {
        let dir = path_cstring(dir.as_ref())?;
        let mut step = 0;
        check(unsafe { sys::sk_trainer_load_checkpoint(self.raw, dir.as_ptr(), &mut step) })?;
        Ok(step)
    }
    /// Writes a checkpoint to `root`/step_<step> and keeps the newest `keep`
    /// there (collective; `sk_trainer_save_checkpoint_rotating`).
    pub fn save_checkpoint_rotating(&mut self, root: impl AsRef<Path>, keep: i32) -> Result<()> {
        let root = path_cstring(root.as_ref())?;
        check(unsafe { sys::sk_trainer_save_checkpoint_rotating(self.raw, root.as_ptr(), keep) })
    }
    /// Restores the newest complete checkpoint under `root` (collective); the
    /// step count afterwards, unchanged (0 for a new trainer) when `root`
    /// holds none (`sk_trainer_resume_latest`).
    pub fn resume_latest(&mut self, root: impl AsRef<Path>) -> Result<i64> {
        let root = path_cstring(root.as_ref())?;
        let mut step = 0;
        check(unsafe { sys::sk_trainer_resume_latest(self.raw, root.as_ptr(), &mut step) })?;
        Ok(step)
    }
    /// Writes one safetensors file of the whole model in `layout` (collective).
    pub fn save_state_dict(&mut self, path: impl AsRef<Path>, layout: WeightLayout) -> Result<()> {
        let path = path_cstring(path.as_ref())?;
        check(unsafe { sys::sk_trainer_save_state_dict(self.raw, path.as_ptr(), layout.raw()) })
    }
    /// Loads a state dict file in `layout` (collective); the step count
    /// afterwards. On error the trainer is unchanged.
    pub fn load_state_dict(&mut self, path: impl AsRef<Path>, layout: WeightLayout) -> Result<i64> {
        let path = path_cstring(path.as_ref())?;
        let mut step = 0;
        check(unsafe { sys::sk_trainer_load_state_dict(self.raw, path.as_ptr(), layout.raw(), &mut step) })?;
        Ok(step)
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        unsafe { sys::sk_trainer_destroy(self.raw) }
    }
}

/// N local ranks driven on library threads behind one handle.
#[derive(Debug)]
pub struct LocalSession {
    raw: *mut sys::sk_local_session,
}

unsafe impl Send for LocalSession {}

impl LocalSession {
    /// `world_size` ranks on library threads, each on `options.device`
    /// (cpu or cuda: a local session's group cannot carry the simulator's
    /// tensors, so [`Device::Sim`] is the library's INVALID_ARGUMENT; use
    /// [`Trainer::simulated`]).
    pub fn new(options: &TrainerOptions, world_size: i32, network_model: Option<&str>) -> Result<LocalSession> {
        let network = opt_cstring(network_model, "network_model")?;
        let mut raw = ptr::null_mut();
        check(options.with_raw(|o| unsafe {
            sys::sk_local_session_create(o, world_size, opt_ptr(&network), &mut raw)
        })?)?;
        Ok(LocalSession { raw })
    }
    /// One step on every rank; rank 0's metrics.
    pub fn step(&mut self) -> Result<StepMetrics> {
        let mut m = new_metrics();
        check(unsafe { sys::sk_local_session_step(self.raw, &mut m) })?;
        Ok(m)
    }
    /// One step on the caller's batches: world_size x grad_accum_steps of
    /// them, rank-major (rank 0's micro-batches first;
    /// `sk_local_session_step_batches`), all checked before any rank
    /// starts; rank 0's metrics.
    pub fn step_batches(&mut self, batches: &[Batch]) -> Result<StepMetrics> {
        let (raw, n) = raw_batches(batches)?;
        let mut ptrs: Vec<*const sys::sk_batch> = raw.iter().map(|b| b as *const sys::sk_batch).collect();
        let mut m = new_metrics();
        check(unsafe { sys::sk_local_session_step_batches(self.raw, ptrs.as_mut_ptr(), n, &mut m) })?;
        Ok(m)
    }
    pub fn metrics(&self, rank: i32) -> Result<StepMetrics> {
        let mut m = new_metrics();
        check(unsafe { sys::sk_local_session_metrics(self.raw, rank, &mut m) })?;
        Ok(m)
    }
    pub fn evaluate(&mut self, batches: i32) -> Result<f32> {
        let mut loss = 0.0;
        check(unsafe { sys::sk_local_session_evaluate(self.raw, batches, &mut loss) })?;
        Ok(loss)
    }
    /// `Trainer::set_lr` on every rank.
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        check(unsafe { sys::sk_local_session_set_lr(self.raw, lr) })
    }
    pub fn world_size(&self) -> Result<i32> {
        let mut n = 0;
        check(unsafe { sys::sk_local_session_world_size(self.raw, &mut n) })?;
        Ok(n)
    }
    /// One sharded checkpoint of every rank, in `dir`.
    pub fn save_checkpoint(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = path_cstring(dir.as_ref())?;
        check(unsafe { sys::sk_local_session_save_checkpoint(self.raw, dir.as_ptr()) })
    }
    /// Restores `dir` on every rank; the restored step count. On error no
    /// rank changed.
    pub fn load_checkpoint(&mut self, dir: impl AsRef<Path>) -> Result<i64> {
        let dir = path_cstring(dir.as_ref())?;
        let mut step = 0;
        check(unsafe { sys::sk_local_session_load_checkpoint(self.raw, dir.as_ptr(), &mut step) })?;
        Ok(step)
    }
    /// One safetensors file of the whole session's model in `layout`.
    pub fn save_state_dict(&mut self, path: impl AsRef<Path>, layout: WeightLayout) -> Result<()> {
        let path = path_cstring(path.as_ref())?;
        check(unsafe { sys::sk_local_session_save_state_dict(self.raw, path.as_ptr(), layout.raw()) })
    }
    /// Loads a state dict file on every rank; the step count afterwards. On
    /// error no rank changed.
    pub fn load_state_dict(&mut self, path: impl AsRef<Path>, layout: WeightLayout) -> Result<i64> {
        let path = path_cstring(path.as_ref())?;
        let mut step = 0;
        check(unsafe { sys::sk_local_session_load_state_dict(self.raw, path.as_ptr(), layout.raw(), &mut step) })?;
        Ok(step)
    }
}

impl Drop for LocalSession {
    fn drop(&mut self) {
        unsafe { sys::sk_local_session_destroy(self.raw) }
    }
}

// --- low level -----------------------------------------------------------------

/// A parameter to register: f32, `shape`, drawn by `init` (a, b as in
/// `sk_param_spec`).
#[derive(Clone, Debug)]
pub struct ParamSpec<'a> {
    pub name: &'a str,
    pub shape: &'a [i64],
    pub init: sys::sk_init_kind_t,
    pub init_a: f32,
    pub init_b: f32,
}

/// Units and parameters of a caller-computed model.
#[derive(Debug)]
pub struct ModelSpec {
    raw: *mut sys::sk_model_spec,
}

unsafe impl Send for ModelSpec {}

impl ModelSpec {
    pub fn new() -> Result<ModelSpec> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::sk_model_spec_create(&mut raw) })?;
        Ok(ModelSpec { raw })
    }
    /// The new unit's index.
    pub fn add_unit(&mut self, name: &str) -> Result<i32> {
        let c = cstring(name, "unit name")?;
        let mut u = 0;
        check(unsafe { sys::sk_model_spec_add_unit(self.raw, c.as_ptr(), &mut u) })?;
        Ok(u)
    }
    /// The new parameter's index within `unit`.
    pub fn add_param(&mut self, unit: i32, param: &ParamSpec<'_>) -> Result<i32> {
        let name = cstring(param.name, "parameter name")?;
        let ndim = i32::try_from(param.shape.len())
            .map_err(|_| Error::invalid_argument("shape has too many dimensions".to_string()))?;
        let raw = sys::sk_param_spec {
            struct_size: std::mem::size_of::<sys::sk_param_spec>(),
            name: name.as_ptr(),
            ndim,
            shape: param.shape.as_ptr(),
            dtype: sys::SK_DTYPE_F32,
            init: param.init,
            init_a: param.init_a,
            init_b: param.init_b,
        };
        let mut p = 0;
        check(unsafe { sys::sk_model_spec_add_param(self.raw, unit, &raw, &mut p) })?;
        Ok(p)
    }
    /// Declares that `unit` also uses parameter `owner_param` of the earlier
    /// unit `owner_unit` (a tied parameter, `sk_model_spec_add_tied_param`);
    /// returns its index within `unit`, after the unit's own parameters.
    pub fn add_tied_param(&mut self, unit: i32, name: &str, owner_unit: i32, owner_param: i32) -> Result<i32> {
        let name = cstring(name, "tied parameter name")?;
        let mut p = 0;
        check(unsafe {
            sys::sk_model_spec_add_tied_param(self.raw, unit, name.as_ptr(), owner_unit, owner_param, &mut p)
        })?;
        Ok(p)
    }
}

impl Drop for ModelSpec {
    fn drop(&mut self) {
        unsafe { sys::sk_model_spec_destroy(self.raw) }
    }
}

/// `sk_engine_options`.
#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    pub fsdp: FsdpOptions,
    pub optimizer: OptimizerOptions,
    pub memory_cap_bytes: u64,
    /// The rank's device; `None` = cpu:rank. Off the CPU the views are not
    /// host memory: [`Engine::param`] and [`Engine::grad`] refuse them
    /// (use [`Engine::param_view`]).
    pub device: Option<Device>,
    /// The caller's `cudaStream_t` on the engine's CUDA device: the engine's
    /// caller stream from creation (see [`Stream`]); `None` = synchronous
    /// hooks. It must outlive the engine.
    pub cuda_stream: Option<ptr::NonNull<c_void>>,
    /// Parameter groups (`optimizer.param_groups`); empty = none.
    pub param_groups: Vec<ParamGroup>,
    /// An update rule of your own (0.8.0): its name, recorded in checkpoints
    /// as the optimizer's kind, and the per-element state tensors it keeps;
    /// `None` = the built-in `optimizer.kind`. With it, `optimizer_step` is
    /// FAILED_PRECONDITION: step with [`Engine::custom_step`].
    pub custom_optimizer: Option<CustomOptimizer>,
}

/// `sk_engine_options.custom_optimizer` and its state names.
#[derive(Clone, Debug, Default)]
pub struct CustomOptimizer {
    /// "lion", "lamb": letters, digits, '_' or '-'; not a built-in kind's name.
    pub name: String,
    /// One f32 tensor per name per unit, shaped as the shard (at most 16).
    pub state_names: Vec<String>,
}

/// A caller stream (`sk_stream`): the caller's in-order work queue on the
/// engine's device. Once [`Engine::set_stream`] names it, the hooks are
/// stream-ordered: `pre_forward`/`pre_backward` make the stream wait for the
/// gather and return at once, and the engine frees or reduces a unit's
/// buffers only after the work enqueued on the stream before the matching
/// `post_` call. On cpu the closures given to [`Stream::enqueue`] are the
/// caller's kernels, run in order on the stream's worker thread.
#[derive(Debug)]
pub struct Stream {
    raw: *mut sys::sk_stream,
}

unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

unsafe extern "C" fn run_boxed_closure(user_data: *mut c_void) {
    let f = unsafe { Box::from_raw(user_data as *mut Box<dyn FnOnce() + Send>) };
    // A panic must not unwind into C: it is caught here and the process
    // aborts, as no caller is left to receive it.
    if catch_unwind(AssertUnwindSafe(move || f())).is_err() {
        std::process::abort();
    }
}

impl Stream {
    /// A new stream on the device of `engine` (cpu: a worker thread; cuda:
    /// a stream this handle owns).
    pub fn new(engine: &Engine) -> Result<Stream> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::sk_stream_create(engine.raw, &mut raw) })?;
        Ok(Stream { raw })
    }
    /// Wraps the caller's `cudaStream_t` (not owned; it must outlive the
    /// engine). INVALID_ARGUMENT off a cuda engine or for another GPU's stream.
    pub fn wrap_cuda(engine: &Engine, cuda_stream: *mut c_void) -> Result<Stream> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::sk_stream_wrap_cuda(engine.raw, cuda_stream, &mut raw) })?;
        Ok(Stream { raw })
    }
    /// Enqueues `f` after everything enqueued before it; returns once
    /// enqueued. On cuda `f` runs on a driver thread and must not call CUDA.
    /// A panic in `f` aborts the process.
    pub fn enqueue<F: FnOnce() + Send + 'static>(&self, f: F) -> Result<()> {
        let boxed: Box<Box<dyn FnOnce() + Send>> = Box::new(Box::new(f));
        let user_data = Box::into_raw(boxed) as *mut c_void;
        let status = unsafe { sys::sk_stream_enqueue(self.raw, Some(run_boxed_closure), user_data) };
        if status != sys::SK_STATUS_OK {
            drop(unsafe { Box::from_raw(user_data as *mut Box<dyn FnOnce() + Send>) });
        }
        check(status)
    }
    /// Blocks until everything enqueued so far has run.
    pub fn synchronize(&self) -> Result<()> {
        check(unsafe { sys::sk_stream_synchronize(self.raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        unsafe { sys::sk_stream_destroy(self.raw) }
    }
}

/// One rank's FSDP engine over a caller-computed model. Parameter and
/// gradient slices borrow the engine, so the borrow checker ends them before
/// the lifecycle call that invalidates them.
#[derive(Debug)]
pub struct Engine {
    raw: *mut sys::sk_engine,
    /// Where the views point: slices are made only of host memory.
    device: sys::sk_device_kind_t,
}

unsafe impl Send for Engine {}

fn f32_slice<'a>(v: &sys::sk_tensor_view) -> Result<&'a mut [f32]> {
    if v.dtype != sys::SK_DTYPE_F32 {
        return Err(Error::invalid_argument("buffer dtype is not f32 (param_dtype/reduce_dtype)".to_string()));
    }
    Ok(unsafe { std::slice::from_raw_parts_mut(v.data as *mut f32, v.numel as usize) })
}

/// One unit's shards in [`Engine::custom_step`].
pub struct CustomShard<'a> {
    pub unit: i32,
    /// This rank's f32 slice of the unit's flat parameter: update it in place.
    pub master: &'a mut [f32],
    /// Its gradient (the mean over ranks).
    pub grad: &'a [f32],
    /// The optimizer's state tensors for the unit (zeroed at first; saved by
    /// checkpoints): a custom rule's declared ones, else the built-in kind's.
    pub state: Vec<&'a mut [f32]>,
    /// Where each parameter lies in `master`, `grad` and `state` (0.8.0).
    pub layout: ShardLayout,
}

/// Where each parameter lies in this rank's shard of a unit
/// (`sk_engine_shard_layout`): the rank's index in the unit's shard group
/// (not its rank: under NO_SHARD every rank holds shard 0 of 1, under
/// HYBRID_SHARD the index within its replica group) and one piece per
/// parameter with elements in the shard, in shard order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardLayout {
    pub shard_index: i32,
    pub num_shards: i32,
    pub pieces: Vec<ShardPiece>,
}

/// One parameter's elements in a shard (`sk_shard_piece`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardPiece {
    /// "<unit>.<param>".
    pub name: String,
    /// The parameter's index in its unit.
    pub param: i32,
    /// The whole parameter's shape.
    pub shape: Vec<i64>,
    /// Its first element in the shard, and how many it holds.
    pub shard_offset: i64,
    pub numel: i64,
    /// The first one's index within the (row-major) parameter.
    pub param_offset: i64,
    /// The first `param_groups` entry selecting it, if any, and the weight
    /// decay and learning-rate multiplier it resolves to.
    pub param_group: Option<usize>,
    pub weight_decay: f32,
    pub lr_multiplier: f32,
}

fn typed_slice<'a, T: Element>(v: &sys::sk_tensor_view) -> Result<&'a mut [T]> {
    if v.dtype != T::DTYPE {
        return Err(Error::invalid_argument(format!(
            "buffer dtype is {} but the view asked for {}",
            v.dtype,
            T::DTYPE
        )));
    }
    Ok(unsafe { std::slice::from_raw_parts_mut(v.data as *mut T, v.numel as usize) })
}

impl Engine {
    /// Collective over `group`; the engine copies the spec and keeps the group alive.
    pub fn new(spec: &ModelSpec, group: &dyn Group, options: &EngineOptions) -> Result<Engine> {
        Engine::create(spec, group.as_ptr(), options)
    }
    /// An engine on [`Device::Sim`] that simulates its own world (no process
    /// group): the initialisers are priced, not run, and the views have
    /// shapes but no data. INVALID_ARGUMENT from the library for any other
    /// device.
    pub fn simulated(spec: &ModelSpec, options: &EngineOptions) -> Result<Engine> {
        Engine::create(spec, ptr::null_mut(), options)
    }
    fn create(spec: &ModelSpec, group: *mut sys::sk_process_group, options: &EngineOptions) -> Result<Engine> {
        let device = options.device.as_ref().map(Device::to_raw).transpose()?;
        let groups = RawGroups::new(&options.param_groups)?;
        let optimizer = groups.optimizer(&options.optimizer);
        let custom_name = opt_cstring(options.custom_optimizer.as_ref().map(|c| c.name.as_str()), "custom_optimizer")?;
        let state_names = match &options.custom_optimizer {
            Some(c) => c.state_names.iter().map(|n| cstring(n, "custom_optimizer.state_names")).collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let state_ptrs: Vec<*const c_char> = state_names.iter().map(|n| n.as_ptr()).collect();
        let raw_options = sys::sk_engine_options {
            struct_size: std::mem::size_of::<sys::sk_engine_options>(),
            fsdp: &options.fsdp,
            optimizer: &optimizer,
            memory_cap_bytes: options.memory_cap_bytes,
            device: opt_raw_device(&device),
            cuda_stream: options.cuda_stream.map_or(ptr::null_mut(), |p| p.as_ptr()),
            custom_optimizer: opt_ptr(&custom_name),
            custom_state_names: if state_ptrs.is_empty() { ptr::null() } else { state_ptrs.as_ptr() },
            num_custom_states: state_ptrs.len() as i32,
        };
        let mut raw = ptr::null_mut();
        check(unsafe { sys::sk_engine_create(spec.raw, group, &raw_options, &mut raw) })?;
        Ok(Engine { raw, device: device.map_or(sys::SK_DEVICE_CPU, |d| d.raw.kind) })
    }
    pub fn num_units(&self) -> Result<i32> {
        let mut n = 0;
        check(unsafe { sys::sk_engine_num_units(self.raw, &mut n) })?;
        Ok(n)
    }
    pub fn pre_forward(&mut self, unit: i32) -> Result<()> {
        check(unsafe { sys::sk_engine_pre_forward(self.raw, unit) })
    }
    pub fn post_forward(&mut self, unit: i32) -> Result<()> {
        check(unsafe { sys::sk_engine_post_forward(self.raw, unit) })
    }
    pub fn pre_backward(&mut self, unit: i32) -> Result<()> {
        check(unsafe { sys::sk_engine_pre_backward(self.raw, unit) })
    }
    pub fn post_backward(&mut self, unit: i32) -> Result<()> {
        check(unsafe { sys::sk_engine_post_backward(self.raw, unit) })
    }
    /// The raw view of a gathered parameter.
    pub fn param_view(&self, unit: i32, param: i32) -> Result<sys::sk_tensor_view> {
        self.view(sys::sk_engine_param, unit, param)
    }
    /// A gathered parameter as f32 (read only). FAILED_PRECONDITION off the
    /// CPU (the view is device or simulated memory: use `param_view`).
    pub fn param(&self, unit: i32, param: i32) -> Result<&[f32]> {
        let v = self.param_view(unit, param)?;
        self.check_host("param")?;
        Ok(f32_slice(&v)?)
    }
    /// A gradient buffer to add this step's gradient into; as `param`, CPU only.
    pub fn grad(&mut self, unit: i32, param: i32) -> Result<&mut [f32]> {
        let v = self.view(sys::sk_engine_grad, unit, param)?;
        self.check_host("grad")?;
        f32_slice(&v)
    }
    /// The raw view of a gradient buffer (on every device).
    pub fn grad_view(&mut self, unit: i32, param: i32) -> Result<sys::sk_tensor_view> {
        self.view(sys::sk_engine_grad, unit, param)
    }
    /// Stream-ordered hooks on `stream` from the next call on (`None`: the
    /// synchronous protocol). The engine keeps the stream alive.
    pub fn set_stream(&mut self, stream: Option<&Stream>) -> Result<()> {
        check(unsafe { sys::sk_engine_set_stream(self.raw, stream.map_or(ptr::null_mut(), |s| s.raw)) })
    }
    pub fn set_gradient_sync(&mut self, enabled: bool) -> Result<()> {
        check(unsafe { sys::sk_engine_set_gradient_sync(self.raw, enabled as i32) })
    }
    pub fn finish_backward(&mut self) -> Result<()> {
        check(unsafe { sys::sk_engine_finish_backward(self.raw) })
    }
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        let mut norm = 0.0;
        check(unsafe { sys::sk_engine_clip_grad_norm(self.raw, max_norm, &mut norm) })?;
        Ok(norm)
    }
    pub fn optimizer_step(&mut self) -> Result<()> {
        check(unsafe { sys::sk_engine_optimizer_step(self.raw) })
    }
    pub fn zero_grad(&mut self) -> Result<()> {
        check(unsafe { sys::sk_engine_zero_grad(self.raw) })
    }
    /// One safetensors file of the units' parameters (collective).
    pub fn save_state_dict(&mut self, path: impl AsRef<Path>, layout: WeightLayout) -> Result<()> {
        let path = path_cstring(path.as_ref())?;
        check(unsafe { sys::sk_engine_save_state_dict(self.raw, path.as_ptr(), layout.raw()) })
    }
    /// Loads a state dict file (collective); on error nothing changed.
    pub fn load_state_dict(&mut self, path: impl AsRef<Path>, layout: WeightLayout) -> Result<()> {
        let path = path_cstring(path.as_ref())?;
        check(unsafe { sys::sk_engine_load_state_dict(self.raw, path.as_ptr(), layout.raw()) })
    }
    /// An update rule of your own instead of `optimizer_step` (after
    /// `finish_backward`): `f` is called for every unit with this rank's f32
    /// master shard (update it in place), gradient shard and the built-in
    /// optimizer's state tensors for the unit (as many as its kind keeps:
    /// one for SGD with momentum, two for Adam). CPU engines only (the views
    /// are host memory); `sk_engine_begin_custom_step` in shardkit.h.
    pub fn custom_step<F>(&mut self, mut f: F) -> Result<()>
    where
        F: FnMut(CustomShard<'_>) -> Result<()>,
    {
        self.check_host("custom_step")?;
        check(unsafe { sys::sk_engine_begin_custom_step(self.raw) })?;
        let body = (|| {
            for unit in 0..self.num_units()? {
                let master = self.raw_view(|e, v| unsafe { sys::sk_engine_master_shard(e, unit, v) })?;
                let grad = self.raw_view(|e, v| unsafe { sys::sk_engine_grad_shard(e, unit, v) })?;
                let mut state = Vec::new();
                loop {
                    let i = state.len() as i32;
                    match self.raw_view(|e, v| unsafe { sys::sk_engine_optimizer_state(e, unit, i, v) }) {
                        Ok(v) => state.push(typed_slice::<f32>(&v)?),
                        Err(err) if err.code == sys::SK_STATUS_OUT_OF_RANGE => break,
                        Err(err) => return Err(err),
                    }
                }
                let layout = self.shard_layout(unit)?;
                f(CustomShard { unit, master: typed_slice::<f32>(&master)?, grad: typed_slice::<f32>(&grad)?, state, layout })?;
            }
            Ok(())
        })();
        let end = check(unsafe { sys::sk_engine_end_custom_step(self.raw) });
        body.and(end)
    }
    /// Where each parameter lies in this rank's shard of `unit` (any time).
    pub fn shard_layout(&self, unit: i32) -> Result<ShardLayout> {
        let mut l = ShardLayout::default();
        let mut n = 0;
        check(unsafe { sys::sk_engine_shard_layout(self.raw, unit, &mut l.shard_index, &mut l.num_shards, &mut n) })?;
        for i in 0..n {
            let mut p = sys::sk_shard_piece {
                struct_size: std::mem::size_of::<sys::sk_shard_piece>(),
                name: ptr::null(),
                param: 0,
                ndim: 0,
                shape: ptr::null(),
                shard_offset: 0,
                numel: 0,
                param_offset: 0,
                param_group: -1,
                weight_decay: 0.0,
                lr_multiplier: 1.0,
            };
            check(unsafe { sys::sk_engine_shard_piece(self.raw, unit, i, &mut p) })?;
            l.pieces.push(ShardPiece {
                name: unsafe { CStr::from_ptr(p.name) }.to_string_lossy().into_owned(),
                param: p.param,
                shape: if p.ndim > 0 { unsafe { std::slice::from_raw_parts(p.shape, p.ndim as usize) }.to_vec() } else { Vec::new() },
                shard_offset: p.shard_offset,
                numel: p.numel,
                param_offset: p.param_offset,
                param_group: usize::try_from(p.param_group).ok(),
                weight_decay: p.weight_decay,
                lr_multiplier: p.lr_multiplier,
            });
        }
        Ok(l)
    }
    fn raw_view(&self, f: impl FnOnce(*mut sys::sk_engine, *mut sys::sk_tensor_view) -> sys::sk_status_t) -> Result<sys::sk_tensor_view> {
        let mut v = sys::sk_tensor_view {
            struct_size: std::mem::size_of::<sys::sk_tensor_view>(),
            data: ptr::null_mut(),
            dtype: 0,
            ndim: 0,
            shape: ptr::null(),
            numel: 0,
        };
        check(f(self.raw, &mut v))?;
        Ok(v)
    }
    /// Sets a parameter's full f32 value (collective; every rank passes the
    /// same values).
    pub fn write_param(&mut self, unit: i32, param: i32, values: &[f32]) -> Result<()> {
        check(unsafe { sys::sk_engine_write_param(self.raw, unit, param, values.as_ptr(), values.len() as i64) })
    }
    /// The rate of the following optimizer steps (0 is valid).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        check(unsafe { sys::sk_engine_set_lr(self.raw, lr) })
    }
    /// A token-weighted loss (`sk_engine_set_loss_tokens`): `tokens` is this
    /// rank's counted tokens in the step's micro-batches; returns N, their
    /// sum over ranks. Add the gradients of each micro-batch's loss SUM: the
    /// step's reductions divide by N, so the gradient is that of the mean
    /// over every rank's and micro-batch's tokens. Collective; once per
    /// step, before its first reduction (`zero_grad` ends it).
    pub fn set_loss_tokens(&mut self, tokens: i64) -> Result<i64> {
        let mut n = 0;
        check(unsafe { sys::sk_engine_set_loss_tokens(self.raw, tokens, &mut n) })?;
        Ok(n)
    }
    pub fn lr(&self) -> Result<f32> {
        let mut lr = 0.0;
        check(unsafe { sys::sk_engine_get_lr(self.raw, &mut lr) })?;
        Ok(lr)
    }
    /// Optimizer steps taken (restored by checkpoints and state dicts).
    pub fn steps(&self) -> Result<i64> {
        let mut n = 0;
        check(unsafe { sys::sk_engine_steps(self.raw, &mut n) })?;
        Ok(n)
    }
    /// A sharded checkpoint in the trainer's format (collective).
    pub fn save_checkpoint(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = path_cstring(dir.as_ref())?;
        check(unsafe { sys::sk_engine_save_checkpoint(self.raw, dir.as_ptr()) })
    }
    /// Restores a checkpoint saved at any world size and strategy
    /// (collective); the restored step count.
    pub fn load_checkpoint(&mut self, dir: impl AsRef<Path>) -> Result<i64> {
        let dir = path_cstring(dir.as_ref())?;
        let mut step = 0;
        check(unsafe { sys::sk_engine_load_checkpoint(self.raw, dir.as_ptr(), &mut step) })?;
        Ok(step)
    }
    /// A gathered parameter as `T` (`f32`, or [`Bf16`] with param_dtype
    /// bf16); INVALID_ARGUMENT naming both dtypes when they differ, CPU only.
    pub fn param_as<T: Element>(&self, unit: i32, param: i32) -> Result<&[T]> {
        let v = self.param_view(unit, param)?;
        self.check_host("param")?;
        Ok(typed_slice::<T>(&v)?)
    }
    /// A gradient buffer as `T` to add into; as `param_as`.
    pub fn grad_as<T: Element>(&mut self, unit: i32, param: i32) -> Result<&mut [T]> {
        let v = self.view(sys::sk_engine_grad, unit, param)?;
        self.check_host("grad")?;
        typed_slice::<T>(&v)
    }
    /// The full f32 value of a parameter of `numel` elements (collective).
    pub fn read_param(&mut self, unit: i32, param: i32, numel: usize) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; numel];
        check(unsafe { sys::sk_engine_read_param(self.raw, unit, param, out.as_mut_ptr(), numel as i64) })?;
        Ok(out)
    }

    fn check_host(&self, what: &str) -> Result<()> {
        let on = match self.device {
            sys::SK_DEVICE_CUDA => "cuda (device memory)",
            sys::SK_DEVICE_SIM => "the simulator (no data behind it)",
            _ => return Ok(()),
        };
        Err(Error {
            code: sys::SK_STATUS_FAILED_PRECONDITION,
            message: format!("Engine::{}: the buffer is on {}, not host memory; use the raw {}_view", what, on, what),
        })
    }

    fn view(
        &self,
        f: unsafe extern "C" fn(*mut sys::sk_engine, i32, i32, *mut sys::sk_tensor_view) -> sys::sk_status_t,
        unit: i32,
        param: i32,
    ) -> Result<sys::sk_tensor_view> {
        let mut v = sys::sk_tensor_view {
            struct_size: std::mem::size_of::<sys::sk_tensor_view>(),
            data: ptr::null_mut(),
            dtype: 0,
            ndim: 0,
            shape: ptr::null(),
            numel: 0,
        };
        check(unsafe { f(self.raw, unit, param, &mut v) })?;
        Ok(v)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        unsafe { sys::sk_engine_destroy(self.raw) }
    }
}
