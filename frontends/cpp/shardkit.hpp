// shardkit.hpp: header-only C++ RAII over the C ABI (shardkit/shardkit.h).
//
// Modelled on onnxruntime_cxx_api.h: every owning type is move-only and
// releases its handle in the destructor; every failing call throws
// shardkit::Error carrying the sk_status_t and the library's message. There
// is no logic here that the C API does not have; option structs are the C
// structs themselves (initialise them with their SK_*_INIT macros), except
// the device, which shardkit::Device owns (with its profile string):
//   shardkit::Trainer gpu(options, shardkit::Device::Cuda(0), group);
//   shardkit::Trainer sim(options, shardkit::Device::Sim("a100-80g", 512));
//
// Thread safety and lifetimes are the C API's (see shardkit.h): one thread
// per object, objects keep their process group alive.
//
// Requires C++17.
#ifndef SHARDKIT_FRONTENDS_CPP_SHARDKIT_HPP_
#define SHARDKIT_FRONTENDS_CPP_SHARDKIT_HPP_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "shardkit/shardkit.h"

namespace shardkit {

// The one exception type: a status code and the library's message.
class Error : public std::runtime_error {
 public:
  Error(sk_status_t code, const std::string& message)
      : std::runtime_error(std::string(sk_status_name(code)) + ": " + message), code_(code),
        message_(message) {}
  sk_status_t code() const noexcept { return code_; }
  // The library's message alone (what() prefixes the code's name).
  const std::string& message() const noexcept { return message_; }

 private:
  sk_status_t code_;
  std::string message_;
};

// Throws Error unless `code` is SK_STATUS_OK.
inline void Check(sk_status_t code) {
  if (code != SK_STATUS_OK) throw Error(code, sk_last_error_message());
}

inline std::string Version() { return sk_version(); }

namespace detail {

// The sk_dtype_t of an element type the caller collectives move (0.8.0
// added f64, i32 and i64).
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr sk_dtype_t value = SK_DTYPE_F32; };
template <> struct DTypeOf<double> { static constexpr sk_dtype_t value = SK_DTYPE_F64; };
template <> struct DTypeOf<int32_t> { static constexpr sk_dtype_t value = SK_DTYPE_I32; };
template <> struct DTypeOf<int64_t> { static constexpr sk_dtype_t value = SK_DTYPE_I64; };

// A move-only owner of a C handle released by Destroy.
template <typename T, void (*Destroy)(T*)>
class Owner {
 public:
  Owner() = default;
  explicit Owner(T* handle) noexcept : handle_(handle) {}
  ~Owner() { Destroy(handle_); }
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;
  Owner(Owner&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Owner& operator=(Owner&& other) noexcept {
    if (this != &other) {
      Destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  T* get() const noexcept { return handle_; }
  // Gives up ownership: the caller destroys the handle.
  T* release() noexcept { return std::exchange(handle_, nullptr); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  T* handle_ = nullptr;
};

}  // namespace detail

// One rank's handle on a process group.
class ProcessGroup : public detail::Owner<sk_process_group, sk_process_group_destroy> {
 public:
  using Owner::Owner;

  // The world_size rank handles of a new local group (ranks are threads).
  static std::vector<ProcessGroup> Local(int32_t world_size, const char* network_model = nullptr) {
    // At least one slot, so that a bad world_size is what the library reports.
    std::vector<sk_process_group*> raw(static_cast<size_t>(world_size > 1 ? world_size : 1));
    Check(sk_process_group_create_local(world_size, network_model, raw.data()));
    std::vector<ProcessGroup> out;
    out.reserve(raw.size());
    for (sk_process_group* g : raw) out.emplace_back(g);
    return out;
  }
  // This process's rank of a gloo group (options NULL: torchrun's environment).
  static ProcessGroup Gloo(const sk_gloo_options* options = nullptr) {
    sk_process_group* g = nullptr;
    Check(sk_process_group_create_gloo(options, &g));
    return ProcessGroup(g);
  }
  // This process's rank of an nccl group on its GPU (options NULL: torchrun's
  // environment, cuda:LOCAL_RANK). Throws Error(UNAVAILABLE) in a library
  // built without CUDA.
  static ProcessGroup Nccl(const sk_nccl_options* options = nullptr) {
    sk_process_group* g = nullptr;
    Check(sk_process_group_create_nccl(options, &g));
    return ProcessGroup(g);
  }

  int32_t rank() const { return Rank(get()); }
  int32_t size() const { return Size(get()); }
  std::string label() const { return Label(get()); }

  // The same queries for a borrowed handle (sk_run_local_ranks' callback).
  static int32_t Rank(const sk_process_group* g) {
    int32_t r = 0;
    Check(sk_process_group_rank(g, &r));
    return r;
  }
  static int32_t Size(const sk_process_group* g) {
    int32_t s = 0;
    Check(sk_process_group_size(g, &s));
    return s;
  }
  static std::string Label(const sk_process_group* g) {
    const char* l = nullptr;
    Check(sk_process_group_label(g, &l));
    return l;
  }

  // Collectives on the caller's host buffers of float, double, int32_t or
  // int64_t (0.6.0, the last three 0.8.0; on nccl groups use the static
  // forms with device pointers). Collective. MEAN of integers throws
  // INVALID_ARGUMENT.
  template <typename T = float>
  void AllReduce(std::vector<T>& data, sk_reduce_op_t op = SK_REDUCE_SUM) { AllReduce(get(), data, op); }
  // The mean of `value` over ranks (a loss).
  float Mean(float value) { return Mean(get(), value); }
  template <typename T = float>
  void Broadcast(std::vector<T>& data, int32_t root) { Broadcast(get(), data, root); }
  template <typename T = float>
  std::vector<T> AllGather(const std::vector<T>& input) { return AllGather(get(), input); }
  void Barrier() { Check(sk_process_group_barrier(get())); }

  // The same for a borrowed handle.
  template <typename T = float>
  static void AllReduce(sk_process_group* g, std::vector<T>& data, sk_reduce_op_t op = SK_REDUCE_SUM) {
    Check(sk_process_group_all_reduce(g, data.data(), static_cast<int64_t>(data.size()), detail::DTypeOf<T>::value, op));
  }
  static float Mean(sk_process_group* g, float value) {
    Check(sk_process_group_all_reduce(g, &value, 1, SK_DTYPE_F32, SK_REDUCE_MEAN));
    return value;
  }
  template <typename T = float>
  static void Broadcast(sk_process_group* g, std::vector<T>& data, int32_t root) {
    Check(sk_process_group_broadcast(g, data.data(), static_cast<int64_t>(data.size()), detail::DTypeOf<T>::value,
                                     root));
  }
  template <typename T = float>
  static std::vector<T> AllGather(sk_process_group* g, const std::vector<T>& input) {
    std::vector<T> out(input.size() * static_cast<size_t>(Size(g)));
    Check(sk_process_group_all_gather(g, input.data(), out.data(), static_cast<int64_t>(input.size()),
                                      detail::DTypeOf<T>::value));
    return out;
  }
  static void Barrier(sk_process_group* g) { Check(sk_process_group_barrier(g)); }
};

// Runs fn(rank, group) on `world_size` new threads of a new local group and
// waits for all. An exception thrown by fn on any rank is caught on that
// thread (it never crosses the C ABI) and the lowest rank's is rethrown here.
inline void RunLocalRanks(int32_t world_size,
                          const std::function<void(int32_t rank, sk_process_group* group)>& fn,
                          const char* network_model = nullptr) {
  struct Context {
    const std::function<void(int32_t, sk_process_group*)>* fn;
    std::vector<std::exception_ptr> errors;
  } ctx{&fn, std::vector<std::exception_ptr>(static_cast<size_t>(world_size > 0 ? world_size : 0))};
  auto trampoline = [](int32_t rank, sk_process_group* group, void* user) -> sk_status_t {
    auto* c = static_cast<Context*>(user);
    try {
      (*c->fn)(rank, group);
      return SK_STATUS_OK;
    } catch (const Error& e) {
      c->errors[rank] = std::current_exception();
      return e.code();
    } catch (...) {
      c->errors[rank] = std::current_exception();
      return SK_STATUS_UNKNOWN;
    }
  };
  const sk_status_t code = sk_run_local_ranks(world_size, network_model, trampoline, &ctx);
  for (const std::exception_ptr& e : ctx.errors) {
    if (e) std::rethrow_exception(e);
  }
  Check(code);
}

// Which device a rank computes on: a value that owns an sk_device_options and
// the profile string it points to (copies and moves keep their own). The C
// API validates it when a trainer, session or engine is created; this class
// checks nothing itself.
//   shardkit::Device::Cuda(0)                              cuda:0
//   shardkit::Device::Sim("a100-80g", 512).GpusPerNode(8)  512 simulated GPUs
// Thread-safety: a const Device may be shared; modifying one is not
// thread-safe.
class Device {
 public:
  // cpu:rank, as a NULL sk_*_options.device.
  Device() = default;
  Device(const Device& other) : raw_(other.raw_), profile_(other.profile_) { Repoint(); }
  Device(Device&& other) noexcept : raw_(other.raw_), profile_(std::move(other.profile_)) { Repoint(); }
  Device& operator=(const Device& other) {
    if (this != &other) {
      raw_ = other.raw_;
      profile_ = other.profile_;
      Repoint();
    }
    return *this;
  }
  Device& operator=(Device&& other) noexcept {
    if (this != &other) {
      raw_ = other.raw_;
      profile_ = std::move(other.profile_);
      Repoint();
    }
    return *this;
  }
  ~Device() = default;

  // cpu:rank.
  static Device Cpu() { return Of(SK_DEVICE_CPU); }
  // cpu:index.
  static Device Cpu(int32_t index) { return Of(SK_DEVICE_CPU).Index(index); }
  // cuda:(rank modulo the visible GPUs). UNAVAILABLE at creation where the
  // library was built without CUDA or no GPU is visible.
  static Device Cuda() { return Of(SK_DEVICE_CUDA); }
  // cuda:index.
  static Device Cuda(int32_t index) { return Of(SK_DEVICE_CUDA).Index(index); }
  // The simulator (docs/simulator.md): one simulated rank standing for
  // `world_size` GPUs (0 = 1) of `profile` ("a100-80g", "h100-80g",
  // "cpu-local" or a .json path), on sim:0. Losses and norms are NaN,
  // sk_step_metrics.simulated is set. Create trainers and engines on it
  // without a process group: the C API then simulates the world.
  static Device Sim(std::string profile, int32_t world_size) {
    Device d = Of(SK_DEVICE_SIM);
    d.profile_ = std::move(profile);
    d.raw_.sim_world_size = world_size;
    d.Repoint();
    return d;
  }

  // Setters, chainable on lvalues and temporaries:
  // Device::index of the kind (use_index = 1).
  Device& Index(int32_t index) & {
    raw_.use_index = 1;
    raw_.index = index;
    return *this;
  }
  Device&& Index(int32_t index) && { return std::move(Index(index)); }
  // SIM: GPUs per node of the simulated cluster (0 = the profile's).
  Device& GpusPerNode(int32_t n) & {
    raw_.sim_gpus_per_node = n;
    return *this;
  }
  Device&& GpusPerNode(int32_t n) && { return std::move(GpusPerNode(n)); }
  // cpu and sim: every op completes before the host goes on (the C API
  // refuses it on cuda: set CUDA_LAUNCH_BLOCKING=1 instead).
  Device& LaunchBlocking(bool on = true) & {
    raw_.launch_blocking = on ? 1 : 0;
    return *this;
  }
  Device&& LaunchBlocking(bool on = true) && { return std::move(LaunchBlocking(on)); }

  sk_device_kind_t kind() const noexcept { return raw_.kind; }
  // The C struct; valid while this Device lives and is not modified.
  const sk_device_options* get() const noexcept { return &raw_; }

  // `options` with .device pointing at this Device (valid while it lives);
  // a struct_size from a header older than 0.4.0 grows to include it.
  sk_trainer_options Apply(sk_trainer_options options) const noexcept { return With(options); }
  sk_engine_options Apply(sk_engine_options options) const noexcept { return With(options); }

 private:
  static Device Of(sk_device_kind_t kind) {
    Device d;
    d.raw_.kind = kind;
    return d;
  }
  template <typename Options>
  Options With(Options options) const noexcept {
    options.device = &raw_;
    if (options.struct_size < sizeof(Options)) options.struct_size = sizeof(Options);
    return options;
  }
  void Repoint() noexcept { raw_.sim_profile = raw_.kind == SK_DEVICE_SIM ? profile_.c_str() : nullptr; }

  sk_device_options raw_ = SK_DEVICE_OPTIONS_INIT;
  std::string profile_;
};

// A dataset the trainer reads itself (sk_dataset_options, 0.8.0; docs/data.md),
// owning its paths. Setters chain like Device's.
class Dataset {
 public:
  // Flat token files (raw or llm.c .bin), read in this order.
  static Dataset Tokens(std::vector<std::string> paths) { return Of(SK_DATASET_FORMAT_TOKENS, std::move(paths)); }
  // JSONL records {"input_ids", "labels" | "loss_mask"}, read in this order.
  static Dataset Jsonl(std::vector<std::string> paths) { return Of(SK_DATASET_FORMAT_JSONL, std::move(paths)); }

  Dataset& Seed(uint64_t seed) & {
    raw_.seed = seed;
    return *this;
  }
  Dataset&& Seed(uint64_t seed) && { return std::move(Seed(seed)); }
  // File order every epoch (no shuffle).
  Dataset& Sequential(bool on = true) & {
    raw_.sequential = on ? 1 : 0;
    return *this;
  }
  Dataset&& Sequential(bool on = true) && { return std::move(Sequential(on)); }
  Dataset& Packing(bool on = true) & {
    raw_.packing = on ? 1 : 0;
    return *this;
  }
  Dataset&& Packing(bool on = true) && { return std::move(Packing(on)); }
  Dataset& EosId(int64_t id) & {
    raw_.has_eos_id = 1;
    raw_.eos_id = id;
    return *this;
  }
  Dataset&& EosId(int64_t id) && { return std::move(EosId(id)); }
  // Token files: 2 or 4 bytes (0 = 2, or the llm.c header's) and the layout.
  Dataset& TokenBytes(int32_t bytes) & {
    raw_.token_bytes = bytes;
    return *this;
  }
  Dataset&& TokenBytes(int32_t bytes) && { return std::move(TokenBytes(bytes)); }
  Dataset& Layout(sk_token_file_layout_t layout) & {
    raw_.token_file_layout = layout;
    return *this;
  }
  Dataset&& Layout(sk_token_file_layout_t layout) && { return std::move(Layout(layout)); }
  // Held-out files for Trainer::Evaluate.
  Dataset& Eval(std::vector<std::string> paths) & {
    eval_paths_ = std::move(paths);
    return *this;
  }
  Dataset&& Eval(std::vector<std::string> paths) && { return std::move(Eval(std::move(paths))); }

  // The C struct; valid while this Dataset lives and is not modified.
  const sk_dataset_options* get() const {
    path_ptrs_.clear();
    for (const std::string& p : paths_) path_ptrs_.push_back(p.c_str());
    eval_ptrs_.clear();
    for (const std::string& p : eval_paths_) eval_ptrs_.push_back(p.c_str());
    raw_.paths = path_ptrs_.data();
    raw_.num_paths = static_cast<int32_t>(path_ptrs_.size());
    raw_.eval_paths = eval_ptrs_.empty() ? nullptr : eval_ptrs_.data();
    raw_.num_eval_paths = static_cast<int32_t>(eval_ptrs_.size());
    return &raw_;
  }
  // `options` with .dataset pointing at this Dataset (valid while it lives
  // and is not modified); a struct_size from an older header grows to
  // include it.
  sk_trainer_options Apply(sk_trainer_options options) const {
    options.dataset = get();
    if (options.struct_size < sizeof(sk_trainer_options)) options.struct_size = sizeof(sk_trainer_options);
    return options;
  }

 private:
  static Dataset Of(sk_dataset_format_t format, std::vector<std::string> paths) {
    Dataset d;
    d.raw_.format = format;
    d.paths_ = std::move(paths);
    return d;
  }
  std::vector<std::string> paths_, eval_paths_;
  mutable std::vector<const char*> path_ptrs_, eval_ptrs_;
  mutable sk_dataset_options raw_ = SK_DATASET_OPTIONS_INIT;
};

namespace detail {

// The kind of device `options->device` names (cpu when there is none).
inline sk_device_kind_t DeviceKindOf(const sk_engine_options* options) noexcept {
  if (options == nullptr || options->struct_size < offsetof(sk_engine_options, device) + sizeof(options->device) ||
      options->device == nullptr) {
    return SK_DEVICE_CPU;
  }
  return options->device->kind;
}

}  // namespace detail

inline int64_t ModelNumParameters(const std::string& model) {
  int64_t n = 0;
  Check(sk_model_num_parameters(model.c_str(), &n));
  return n;
}

// The memory estimator's peak for one rank of a trainer with `options` on
// `world_size` ranks (sk_estimate_memory).
inline sk_memory_estimate EstimateMemory(const sk_trainer_options& options, int32_t world_size) {
  sk_memory_estimate e = SK_MEMORY_ESTIMATE_INIT;
  Check(sk_estimate_memory(&options, world_size, &e));
  return e;
}

// A plan (sk_plan): every candidate configuration simulated and ranked.
// Owns the sk_plan_result; candidates and strings are valid while it lives.
//   sk_plan_request r = SK_PLAN_REQUEST_INIT;
//   r.model = "t5-11b"; r.gpus = 512; r.batch_size = 8;
//   shardkit::Plan plan(r);
//   std::cout << plan.Table();
class Plan : public detail::Owner<sk_plan_result, sk_plan_result_free> {
 public:
  explicit Plan(const sk_plan_request& request) : Owner(Create(request)) {}

  // The result as the library wrote it (profile, memory, counts, strings).
  const sk_plan_result& result() const noexcept { return *get(); }
  int32_t NumCandidates() const noexcept { return get()->num_candidates; }
  // Index of the recommendation (0), or -1 when nothing fits.
  int32_t Recommended() const noexcept { return get()->recommended; }
  std::string Recommendation() const { return get()->recommendation; }
  std::string Table() const { return get()->table; }
  std::string Json() const { return get()->json; }
  // Candidate `index` in ranked order (0 = the best); its strings live as
  // long as this Plan.
  sk_plan_candidate Candidate(int32_t index) const {
    sk_plan_candidate c = SK_PLAN_CANDIDATE_INIT;
    Check(sk_plan_result_candidate(get(), index, &c));
    return c;
  }

 private:
  static sk_plan_result* Create(const sk_plan_request& request) {
    sk_plan_result* r = nullptr;
    Check(sk_plan(&request, &r));
    return r;
  }
};

// One rank's trainer (sk_trainer).
class Trainer : public detail::Owner<sk_trainer, sk_trainer_destroy> {
 public:
  // Collective over `group`; the trainer keeps the group alive.
  Trainer(const sk_trainer_options& options, sk_process_group* group) : Owner(Create(options, group)) {}
  // The same on `device` (replacing options.device). On Device::Sim pass no
  // group: the trainer simulates a world of the device's world_size ranks
  // (a real group is INVALID_ARGUMENT there).
  Trainer(const sk_trainer_options& options, const Device& device, sk_process_group* group = nullptr)
      : Owner(Create(device.Apply(options), group)) {}

  sk_step_metrics Step() {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    Check(sk_trainer_step(get(), &m));
    return m;
  }
  // One step on the caller's micro-batches (grad_accum_steps of them;
  // sk_trainer_step_batches).
  sk_step_metrics StepBatches(const std::vector<sk_batch>& micro_batches) {
    std::vector<const sk_batch*> p;
    for (const sk_batch& b : micro_batches) p.push_back(&b);
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    Check(sk_trainer_step_batches(get(), p.data(), static_cast<int32_t>(p.size()), &m));
    return m;
  }
  float Evaluate(int32_t batches) {
    float loss = 0;
    Check(sk_trainer_evaluate(get(), batches, &loss));
    return loss;
  }
  // The rate of every later step, replacing the schedule (0 is valid).
  void SetLr(float lr) { Check(sk_trainer_set_lr(get(), lr)); }
  float Lr() const {
    float lr = 0;
    Check(sk_trainer_get_lr(get(), &lr));
    return lr;
  }
  int64_t NumParameters() const {
    int64_t n = 0;
    Check(sk_trainer_num_parameters(get(), &n));
    return n;
  }
  // With a dataset: global samples consumed and samples per epoch
  // (sk_trainer_data_position).
  struct DataPosition {
    int64_t samples_consumed = 0;
    int64_t samples_per_epoch = 0;
  };
  DataPosition Position() const {
    DataPosition p;
    Check(sk_trainer_data_position(get(), &p.samples_consumed, &p.samples_per_epoch));
    return p;
  }
  // This rank's sample ids of the last step (sk_trainer_last_sample_ids).
  std::vector<int64_t> LastSampleIds() const {
    int64_t n = 0;
    Check(sk_trainer_last_sample_ids(get(), nullptr, 0, &n));
    std::vector<int64_t> ids(static_cast<size_t>(n));
    Check(sk_trainer_last_sample_ids(get(), ids.data(), n, &n));
    return ids;
  }
  // Collective; see sk_trainer_save_checkpoint.
  void SaveCheckpoint(const std::string& dir) { Check(sk_trainer_save_checkpoint(get(), dir.c_str())); }
  // Collective; returns the restored step count. On error nothing changed.
  int64_t LoadCheckpoint(const std::string& dir) {
    int64_t step = 0;
    Check(sk_trainer_load_checkpoint(get(), dir.c_str(), &step));
    return step;
  }
  // A checkpoint in root/step_<step>, keeping the newest `keep`
  // (sk_trainer_save_checkpoint_rotating). Collective.
  void SaveCheckpointRotating(const std::string& root, int32_t keep) {
    Check(sk_trainer_save_checkpoint_rotating(get(), root.c_str(), keep));
  }
  // Restores the newest complete checkpoint under `root`; the step count
  // afterwards (unchanged, 0 for a new trainer, when there is none:
  // sk_trainer_resume_latest). Collective.
  int64_t ResumeLatest(const std::string& root) {
    int64_t step = 0;
    Check(sk_trainer_resume_latest(get(), root.c_str(), &step));
    return step;
  }
  // One safetensors file in `layout` (sk_trainer_save_state_dict). Collective.
  void SaveStateDict(const std::string& path, sk_weight_layout_t layout = SK_WEIGHT_LAYOUT_SHARDKIT) {
    Check(sk_trainer_save_state_dict(get(), path.c_str(), layout));
  }
  // Collective; returns the step count afterwards. On error nothing changed.
  int64_t LoadStateDict(const std::string& path, sk_weight_layout_t layout = SK_WEIGHT_LAYOUT_SHARDKIT) {
    int64_t step = 0;
    Check(sk_trainer_load_state_dict(get(), path.c_str(), layout, &step));
    return step;
  }

 private:
  static sk_trainer* Create(const sk_trainer_options& options, sk_process_group* group) {
    sk_trainer* t = nullptr;
    Check(sk_trainer_create(&options, group, &t));
    return t;
  }
};

// N local ranks behind one object (sk_local_session).
class LocalSession : public detail::Owner<sk_local_session, sk_local_session_destroy> {
 public:
  LocalSession(const sk_trainer_options& options, int32_t world_size,
               const char* network_model = nullptr)
      : Owner(Create(options, world_size, network_model)) {}
  // Every rank on `device` (replacing options.device): cpu or cuda. A local
  // group cannot carry the simulator's tensors: Device::Sim is the C API's
  // INVALID_ARGUMENT (use a Trainer without a group).
  LocalSession(const sk_trainer_options& options, const Device& device, int32_t world_size,
               const char* network_model = nullptr)
      : Owner(Create(device.Apply(options), world_size, network_model)) {}

  // One step on every rank; returns rank 0's metrics.
  sk_step_metrics Step() {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    Check(sk_local_session_step(get(), &m));
    return m;
  }
  // One step on the caller's batches: world_size x grad_accum_steps,
  // rank-major (sk_local_session_step_batches); rank 0's metrics.
  sk_step_metrics StepBatches(const std::vector<sk_batch>& batches) {
    std::vector<const sk_batch*> p;
    for (const sk_batch& b : batches) p.push_back(&b);
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    Check(sk_local_session_step_batches(get(), p.data(), static_cast<int32_t>(p.size()), &m));
    return m;
  }
  sk_step_metrics Metrics(int32_t rank) const {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    Check(sk_local_session_metrics(get(), rank, &m));
    return m;
  }
  float Evaluate(int32_t batches) {
    float loss = 0;
    Check(sk_local_session_evaluate(get(), batches, &loss));
    return loss;
  }
  int32_t WorldSize() const {
    int32_t n = 0;
    Check(sk_local_session_world_size(get(), &n));
    return n;
  }
  // Trainer::SetLr on every rank.
  void SetLr(float lr) { Check(sk_local_session_set_lr(get(), lr)); }
  void SaveCheckpoint(const std::string& dir) {
    Check(sk_local_session_save_checkpoint(get(), dir.c_str()));
  }
  // Returns the restored step count; on error no rank changed.
  int64_t LoadCheckpoint(const std::string& dir) {
    int64_t step = 0;
    Check(sk_local_session_load_checkpoint(get(), dir.c_str(), &step));
    return step;
  }
  void SaveStateDict(const std::string& path, sk_weight_layout_t layout = SK_WEIGHT_LAYOUT_SHARDKIT) {
    Check(sk_local_session_save_state_dict(get(), path.c_str(), layout));
  }
  // Returns the step count afterwards; on error no rank changed.
  int64_t LoadStateDict(const std::string& path, sk_weight_layout_t layout = SK_WEIGHT_LAYOUT_SHARDKIT) {
    int64_t step = 0;
    Check(sk_local_session_load_state_dict(get(), path.c_str(), layout, &step));
    return step;
  }

 private:
  static sk_local_session* Create(const sk_trainer_options& options, int32_t world_size,
                                  const char* network_model) {
    sk_local_session* s = nullptr;
    Check(sk_local_session_create(&options, world_size, network_model, &s));
    return s;
  }
};

// Units and parameters of a caller-computed model (sk_model_spec).
class ModelSpec : public detail::Owner<sk_model_spec, sk_model_spec_destroy> {
 public:
  ModelSpec() : Owner(Create()) {}

  int32_t AddUnit(const std::string& name) {
    int32_t u = 0;
    Check(sk_model_spec_add_unit(get(), name.c_str(), &u));
    return u;
  }
  int32_t AddParam(int32_t unit, const sk_param_spec& param) {
    int32_t p = 0;
    Check(sk_model_spec_add_param(get(), unit, &param, &p));
    return p;
  }
  // `unit` also uses parameter `owner_param` of the earlier `owner_unit`
  // (sk_model_spec_add_tied_param); returns its index in `unit`.
  int32_t AddTiedParam(int32_t unit, const std::string& name, int32_t owner_unit, int32_t owner_param) {
    int32_t p = 0;
    Check(sk_model_spec_add_tied_param(get(), unit, name.c_str(), owner_unit, owner_param, &p));
    return p;
  }
  // An f32 parameter of `shape` drawn by `init` (a, b as sk_param_spec's).
  int32_t AddParam(int32_t unit, const std::string& name, const std::vector<int64_t>& shape,
                   sk_init_kind_t init = SK_INIT_ZEROS, float a = 0.0f, float b = 0.0f) {
    sk_param_spec p = SK_PARAM_SPEC_INIT;
    p.name = name.c_str();
    p.ndim = static_cast<int32_t>(shape.size());
    p.shape = shape.data();
    p.init = init;
    p.init_a = a;
    p.init_b = b;
    return AddParam(unit, p);
  }

 private:
  static sk_model_spec* Create() {
    sk_model_spec* s = nullptr;
    Check(sk_model_spec_create(&s));
    return s;
  }
};

// A view of an engine-owned buffer; valid as long as the C API says.
struct TensorView {
  sk_tensor_view view;
  // The engine's device: cpu views are host memory, cuda views device memory.
  sk_device_kind_t device = SK_DEVICE_CPU;

  int64_t numel() const { return view.numel; }
  sk_dtype_t dtype() const { return view.dtype; }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(view.shape, view.shape + view.ndim); }
  // The data as f32 (on cuda a device pointer); Error(INVALID_ARGUMENT) if
  // the buffer is another dtype, Error(FAILED_PRECONDITION) on the simulator
  // (its views have shapes and no data).
  float* f32() const {
    if (device == SK_DEVICE_SIM) {
      throw Error(SK_STATUS_FAILED_PRECONDITION,
                  "a simulated engine's buffers have no data (the view's shape and dtype are real)");
    }
    if (view.dtype != SK_DTYPE_F32) {
      throw Error(SK_STATUS_INVALID_ARGUMENT, "buffer dtype is not f32 (param_dtype/reduce_dtype)");
    }
    return static_cast<float*>(view.data);
  }
};

// One rank's FSDP engine over a caller-computed model (sk_engine).
// A caller stream of an engine's device (sk_stream_create): the caller's
// work queue that the engine's hooks order themselves against once
// Engine::SetStream names it. On cpu its Enqueue'd functions are the
// caller's kernels, run in order on the stream's worker thread.
class Stream : public detail::Owner<sk_stream, sk_stream_destroy> {
 public:
  using Owner::Owner;
  // A new stream on the device of `engine` (an Engine's get()).
  explicit Stream(sk_engine* engine) : Owner(CreateOn(engine)) {}
  // Wraps the caller's cudaStream_t (not owned; it must outlive the engine).
  static Stream WrapCuda(sk_engine* engine, void* cuda_stream) {
    sk_stream* s = nullptr;
    Check(sk_stream_wrap_cuda(engine, cuda_stream, &s));
    return Stream(s);
  }
  // Enqueues `fn` after everything enqueued before it; returns when
  // enqueued. `fn` runs on the stream's thread (cuda: a driver thread, where
  // it must not call CUDA) and must not throw: an exception there ends the
  // process (std::terminate), as no caller is left to receive it.
  void Enqueue(std::function<void()> fn) {
    auto* boxed = new std::function<void()>(std::move(fn));
    const sk_status_t s = sk_stream_enqueue(get(), &Run, boxed);
    if (s != SK_STATUS_OK) {
      delete boxed;
      Check(s);
    }
  }
  // Blocks until everything enqueued so far has run.
  void Synchronize() { Check(sk_stream_synchronize(get())); }

 private:
  static sk_stream* CreateOn(sk_engine* engine) {
    sk_stream* s = nullptr;
    Check(sk_stream_create(engine, &s));
    return s;
  }
  static void Run(void* p) noexcept {
    std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(p));
    (*fn)();
  }
};

class Engine : public detail::Owner<sk_engine, sk_engine_destroy> {
 public:
  // Collective over `group`; the engine copies the spec and keeps the group alive.
  Engine(const ModelSpec& spec, sk_process_group* group, const sk_engine_options* options = nullptr)
      : Owner(Create(spec, group, options)), device_(detail::DeviceKindOf(options)) {}
  // The same on `device` (replacing options->device). On Device::Sim pass no
  // group: the engine simulates its own world; its initialisers are priced,
  // not run, and its views have shapes but no data.
  Engine(const ModelSpec& spec, const Device& device, sk_process_group* group = nullptr,
         const sk_engine_options* options = nullptr)
      : Owner(CreateOn(spec, group, options, device)), device_(device.kind()) {}

  int32_t NumUnits() const {
    int32_t n = 0;
    Check(sk_engine_num_units(get(), &n));
    return n;
  }
  void PreForward(int32_t unit) { Check(sk_engine_pre_forward(get(), unit)); }
  void PostForward(int32_t unit) { Check(sk_engine_post_forward(get(), unit)); }
  void PreBackward(int32_t unit) { Check(sk_engine_pre_backward(get(), unit)); }
  void PostBackward(int32_t unit) { Check(sk_engine_post_backward(get(), unit)); }
  TensorView Param(int32_t unit, int32_t param) {
    TensorView v{SK_TENSOR_VIEW_INIT, device_};
    Check(sk_engine_param(get(), unit, param, &v.view));
    return v;
  }
  TensorView Grad(int32_t unit, int32_t param) {
    TensorView v{SK_TENSOR_VIEW_INIT, device_};
    Check(sk_engine_grad(get(), unit, param, &v.view));
    return v;
  }
  // The device kind the engine was created on.
  sk_device_kind_t device_kind() const noexcept { return device_; }
  void SetGradientSync(bool enabled) { Check(sk_engine_set_gradient_sync(get(), enabled ? 1 : 0)); }
  // Stream-ordered hooks on `stream` from the next call on
  // (sk_engine_set_stream); the engine keeps the stream alive.
  void SetStream(const Stream& stream) { Check(sk_engine_set_stream(get(), stream.get())); }
  // Back to the synchronous protocol.
  void ClearStream() { Check(sk_engine_set_stream(get(), nullptr)); }
  void FinishBackward() { Check(sk_engine_finish_backward(get())); }
  double ClipGradNorm(double max_norm) {
    double norm = 0;
    Check(sk_engine_clip_grad_norm(get(), max_norm, &norm));
    return norm;
  }
  void OptimizerStep() { Check(sk_engine_optimizer_step(get())); }
  void ZeroGrad() { Check(sk_engine_zero_grad(get())); }
  // Full state dicts of the units (sk_engine_save_state_dict). Collective.
  void SaveStateDict(const std::string& path, sk_weight_layout_t layout = SK_WEIGHT_LAYOUT_SHARDKIT) {
    Check(sk_engine_save_state_dict(get(), path.c_str(), layout));
  }
  void LoadStateDict(const std::string& path, sk_weight_layout_t layout = SK_WEIGHT_LAYOUT_SHARDKIT) {
    Check(sk_engine_load_state_dict(get(), path.c_str(), layout));
  }
  std::vector<float> ReadParam(int32_t unit, int32_t param, int64_t numel) {
    std::vector<float> out(static_cast<size_t>(numel > 0 ? numel : 0));
    Check(sk_engine_read_param(get(), unit, param, out.data(), numel));
    return out;
  }
  // An update rule of your own (sk_engine_begin_custom_step): after
  // FinishBackward, BeginCustomStep; update MasterShard(u) from GradShard(u)
  // (state: OptimizerState(u, i)) for every unit; EndCustomStep.
  void BeginCustomStep() { Check(sk_engine_begin_custom_step(get())); }
  TensorView MasterShard(int32_t unit) {
    TensorView v{SK_TENSOR_VIEW_INIT, device_};
    Check(sk_engine_master_shard(get(), unit, &v.view));
    return v;
  }
  TensorView GradShard(int32_t unit) {
    TensorView v{SK_TENSOR_VIEW_INIT, device_};
    Check(sk_engine_grad_shard(get(), unit, &v.view));
    return v;
  }
  TensorView OptimizerState(int32_t unit, int32_t index) {
    TensorView v{SK_TENSOR_VIEW_INIT, device_};
    Check(sk_engine_optimizer_state(get(), unit, index, &v.view));
    return v;
  }
  void EndCustomStep() { Check(sk_engine_end_custom_step(get())); }
  // Where each parameter lies in this rank's shard of `unit`
  // (sk_engine_shard_layout): the rank's index in the unit's shard group
  // (not its rank), the group's size and one piece per parameter in the
  // shard (names and shapes live as long as the engine).
  struct ShardLayout {
    int32_t shard_index = 0;
    int32_t num_shards = 0;
    std::vector<sk_shard_piece> pieces;
  };
  ShardLayout GetShardLayout(int32_t unit) const {
    ShardLayout l;
    int32_t n = 0;
    Check(sk_engine_shard_layout(get(), unit, &l.shard_index, &l.num_shards, &n));
    for (int32_t i = 0; i < n; ++i) {
      sk_shard_piece piece = SK_SHARD_PIECE_INIT;
      Check(sk_engine_shard_piece(get(), unit, i, &piece));
      l.pieces.push_back(piece);
    }
    return l;
  }
  // Sets a parameter's full value (collective; every rank passes the same).
  void WriteParam(int32_t unit, int32_t param, const std::vector<float>& values) {
    Check(sk_engine_write_param(get(), unit, param, values.data(), static_cast<int64_t>(values.size())));
  }
  // The rate of the following optimizer steps (0 is valid).
  void SetLr(float lr) { Check(sk_engine_set_lr(get(), lr)); }
  // A token-weighted loss (sk_engine_set_loss_tokens): this rank's counted
  // tokens in the step's micro-batches; returns N, their sum over ranks. Add
  // the gradients of each micro-batch's loss SUM: the step's reductions
  // divide by N (collective; once per step, before its first reduction).
  int64_t SetLossTokens(int64_t tokens) {
    int64_t n = 0;
    Check(sk_engine_set_loss_tokens(get(), tokens, &n));
    return n;
  }
  float Lr() const {
    float lr = 0;
    Check(sk_engine_get_lr(get(), &lr));
    return lr;
  }
  int64_t Steps() const {
    int64_t n = 0;
    Check(sk_engine_steps(get(), &n));
    return n;
  }
  // Sharded checkpoints in the trainer's format (collective); Load returns the step.
  void SaveCheckpoint(const std::string& dir) { Check(sk_engine_save_checkpoint(get(), dir.c_str())); }
  int64_t LoadCheckpoint(const std::string& dir) {
    int64_t step = 0;
    Check(sk_engine_load_checkpoint(get(), dir.c_str(), &step));
    return step;
  }

 private:
  static sk_engine* Create(const ModelSpec& spec, sk_process_group* group,
                           const sk_engine_options* options) {
    sk_engine* e = nullptr;
    Check(sk_engine_create(spec.get(), group, options, &e));
    return e;
  }
  static sk_engine* CreateOn(const ModelSpec& spec, sk_process_group* group, const sk_engine_options* options,
                             const Device& device) {
    sk_engine_options o = SK_ENGINE_OPTIONS_INIT;
    if (options != nullptr) o = *options;
    o = device.Apply(o);
    return Create(spec, group, &o);
  }

  sk_device_kind_t device_ = SK_DEVICE_CPU;
};

}  // namespace shardkit

#endif  // SHARDKIT_FRONTENDS_CPP_SHARDKIT_HPP_
