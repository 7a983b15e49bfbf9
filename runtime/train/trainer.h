// Trainer: a model, a parallelism strategy, an optimizer and data, put
// together into one `Step()` that returns the loss and the measurements every
// harness reports (step time, tokens/s, model TFLOPS per rank, memory,
// communication). It is what the C ABI's high-level API and the paper
// harnesses drive.
//
// One Trainer per rank. Ranks are the ranks of `world`; rank r computes on
// the device TrainerOptions::device selects (cpu:r by default) with its own
// caching allocator (capped at memory_cap_bytes to emulate a device of that
// size), so N local ranks in one process each have their own memory
// statistics, exactly as N GPUs would.
//
// On the simulator (device.kind = kSim, docs/simulator.md "Running a model on
// sim") the same model, FSDP/DDP, allocator and optimizer code runs on sim:0
// against virtual time and virtual memory: one simulated rank of a
// SimProcessGroup of device.sim_world_size ranks stands for all. Parameters
// are never materialised (initialisation is priced, not computed), the
// allocator is the real CachingAllocator at the profile's capacity, and a
// step's time is virtual. Values read back (loss, grad norm) are NaN and
// StepMetrics::simulated says so.
//
// Thread safety: one thread per Trainer.
#ifndef SHARDKIT_RUNTIME_TRAIN_TRAINER_H_
#define SHARDKIT_RUNTIME_TRAIN_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/device/device.h"
#include "runtime/data/dataset.h"
#include "runtime/ddp/ddp.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/checkpoint/weight_layout.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/data.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/loss_normalization.h"
#include "runtime/train/rank.h"
#include "runtime/train/step_outcome.h"

namespace sk {

namespace sim {
class SimDevice;
}  // namespace sim

// Values equal the C ABI's sk_parallelism_t (capi/abi.cc asserts it): never
// renumbered. The ABI's 0 ("default": FSDP) is resolved when it translates
// options.
enum class Parallelism : int {
  kFsdp = 1,  // FullyShardedModel with FsdpOptions::strategy
  kDdp = 2,   // the DDP baseline: full replicas, bucketed all-reduce
};

struct TrainerOptions {
  // A name from ModelConfigs() ("gpt-10m", "t5-60m", ...), or what else
  // FindModelConfig takes: a unit table's ".json" file, or a Hugging Face
  // model directory (its config.json; load its weights with
  // LoadFullStateDict(dir, WeightLayout::kHfGpt2), or kHfLlama for a
  // Llama or Qwen2 directory).
  std::string model = "gpt-tiny";
  Parallelism parallelism = Parallelism::kFsdp;
  FsdpOptions fsdp;
  OptimizerOptions optimizer;
  // The learning rate of each step: optimizer.lr is the schedule's base rate
  // (runtime/optim/lr_schedule.h). Trainer::set_lr overrides it.
  LrSchedule lr_schedule;
  // Sequences per rank per micro-batch, and micro-batches per step (gradient
  // accumulation with no_sync for all but the last). The step's loss is the
  // mean over its M micro-batches and the gradient is that loss's gradient
  // (the micro-batches' sum divided by M, PyTorch's (loss / M).backward()),
  // so M micro-batches of B step exactly as one batch of M * B.
  int64_t batch_size = 2;
  int grad_accum_steps = 1;
  // 0: the configuration's default sequence lengths.
  int64_t seq_len = 0;
  int64_t source_len = 0;
  // Clip the total gradient norm to this value; 0 = compute it, do not clip.
  double clip_grad_norm = 0;
  // Whole-block activation checkpointing: the older spelling of
  // checkpointing = ActivationCheckpointing::kFull (runtime/nn/model.h says
  // how the two resolve; kSelective with this set is InvalidArgument).
  bool activation_checkpointing = false;
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  // With checkpointing = kSelective: recompute attention too (ModelOptions).
  bool recompute_attention = false;
  // GEMM threads of this rank's compute; 0 = the machine's cores divided by
  // the ranks sharing it (all ranks for the local backend, LOCAL_WORLD_SIZE
  // for process ranks), at least 1. Oversubscribed OpenMP teams spin against
  // each other (runtime/ops/cpu/cpu_backend.h: SetCpuGemmThreads).
  int gemm_threads = 0;
  // DDP's gradient bucket size; 0 = its default (25 MiB).
  int64_t ddp_bucket_bytes = 0;
  // Per-rank device memory cap in bytes; 0 = unlimited (on sim: the
  // profile's device memory).
  size_t memory_cap_bytes = 0;
  // The device each rank computes on (cpu:rank by default; rank.h).
  DeviceOptions device;
  // Training data: a token file (uint16/uint32 little-endian) or, when empty,
  // a synthetic stream from data_seed.
  std::string data_path;
  TokenWidth data_width = TokenWidth::kUint16;
  uint64_t data_seed = 1;
  // Length of the synthetic stream; 0 = 64 Ki tokens (or enough for 8 windows).
  // A short stream repeats, so a model can memorise it (tests, demos).
  int64_t data_tokens = 0;
  // A dataset read in order (runtime/data/dataset.h, docs/data.md), used
  // instead of data_path and the synthetic stream when dataset.paths is not
  // empty (giving both is InvalidArgument). Decoder-only models (GPT, Llama)
  // only. Step t reads global samples [t * G, (t + 1) * G) of the dataset's
  // order, G = batch_size * grad_accum_steps * world size; this rank reads
  // the rank-th slice of batch_size * grad_accum_steps, micro-batch m its
  // m-th batch_size rows.
  data::DatasetOptions dataset;
  // Held-out files for Evaluate, read in file order with `dataset`'s format,
  // layout, width, packing and eos_id (empty: Evaluate is FailedPrecondition
  // on a trainer that reads a dataset).
  std::vector<std::string> eval_dataset_paths;
  // A step whose loss (on any rank) or gradient norm is not finite is never
  // applied: parameters and optimizer state stay as they were on every rank.
  // false: Step fails with Aborted naming the value and the ranks. true:
  // Step returns OK with StepMetrics::skipped set and the step counted (the
  // data moves on), as PyTorch's GradScaler skips such steps and goes on.
  bool skip_nonfinite_steps = false;
  // The caller's batches (StepOnBatches) may pack several documents in a
  // row: EstimateTrainerMemory counts what packed rows cost where that
  // differs (on CUDA, one composed attention call's temporaries), as a
  // packing dataset does by itself. Training is the same either way.
  bool packed_documents = false;
  // fsdp.skip_init (FSDP only; InvalidArgument under kDdp and on the
  // simulator): the parameters are not drawn from the initialisers, for a
  // trainer whose weights come from a load (a Hugging Face directory, a
  // state dict, a checkpoint). Until LoadFullStateDict, LoadCheckpoint or
  // ResumeLatest has loaded weights, Step, StepOnBatches, Evaluate and the
  // saves are FailedPrecondition, on every rank alike.
};

// InvalidArgument naming the field.
Status ValidateTrainerOptions(const TrainerOptions& options);

// Collective over `world` (one all-gather of about 2 KiB): every rank's
// options must agree on everything that shapes the collectives or the
// training (model, parallelism, strategy, dtypes, prefetch, optimizer and its
// hyperparameters, per-rank batch, sequence lengths, accumulation, clipping,
// seeds, data). Fails on every rank alike with InvalidArgument naming the
// first field that differs and both ranks' values ("fsdp.strategy is
// FULL_SHARD on rank 0 but NO_SHARD on rank 1"); then, when
// `local_validity` (this rank's own validation) failed, with it; then,
// naming the rank, when another rank's failed. Options that may differ per
// rank: memory_cap_bytes, gemm_threads, timeouts. Used by Trainer::Create
// before anything else collective, so ranks created inconsistently (FSDP on
// one, DDP on another) fail at once instead of after the collective timeout.
Status AgreeOnTrainerOptions(const TrainerOptions& options, const Status& local_validity,
                             comm::ProcessGroup* world);

struct StepMetrics {
  int64_t step = 0;             // steps completed, including this one
  // The losses (runtime/train/loss_normalization.h says what is averaged):
  // this rank's, the mean over its counted targets (when every micro-batch
  // of every rank counts as many, the mean of its micro-batches' means, the
  // same number up to rounding), and the global batch's, the mean over the
  // counted targets of every rank and micro-batch: the loss whose gradient
  // the step took.
  float loss = 0;
  float global_loss = 0;
  // Counted targets (not kIgnoreTarget): this rank's over its micro-batches,
  // and every rank's (N).
  int64_t target_tokens = 0;
  int64_t global_target_tokens = 0;
  double grad_norm = 0;         // total L2 norm before clipping
  float lr = 0;                 // the learning rate this step's update used
  double step_seconds = 0;
  double tokens_per_second = 0;     // this rank's
  double model_tflops_per_rank = 0; // model FLOPs (no recomputation) / time / 1e12
  double hardware_tflops_per_rank = 0;
  int64_t peak_allocated_bytes = 0;  // since the previous step
  int64_t peak_reserved_bytes = 0;
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t alloc_retries = 0;         // cumulative
  int64_t ooms = 0;                  // cumulative
  int64_t bytes_communicated = 0;    // this step, nccl-tests bytes
  // True on a sim device: step_seconds and the rates are virtual time, loss,
  // global_loss and grad_norm are NaN (nothing was computed).
  bool simulated = false;
  // True when the update was skipped for a non-finite loss or gradient norm
  // (TrainerOptions::skip_nonfinite_steps); the trainer's steps_skipped()
  // counts them.
  bool skipped = false;
};

class Trainer {
 public:
  // Collective over `world` (every rank calls it with the same options: on
  // CPU worlds, local and gloo, AgreeOnTrainerOptions checks that first, and
  // every rank fails alike otherwise).
  // `world` must outlive the trainer. With device.kind = kSim, `world` may be
  // null: the trainer then creates and owns the simulated world
  // (CreateSimWorld); a non-sim world is InvalidArgument there, as is a sim
  // world with another device kind. cpu_offload on sim needs a profile with a
  // host section (FailedPrecondition otherwise: cpu-local has none).
  // When set-up fails after the rank's allocator exists (ResourceExhausted
  // while sharding, say) and `memory_on_error` is not null, it receives the
  // allocator's statistics at the failure (peaks included).
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                   comm::ProcessGroup* world,
                                                   MemoryStats* memory_on_error = nullptr);
  ~Trainer();

  // One optimizer step over grad_accum_steps micro-batches. Collective.
  // A non-finite loss on any rank or gradient norm is Aborted on every rank
  // ("step 3 skipped on every rank: the loss is nan on rank 1; ..."), nothing
  // updated, unless skip_nonfinite_steps. Ranks whose learning rate differs
  // (set_lr) fail with InvalidArgument naming the ranks and rates, nothing
  // updated (on backends that publish failures, see below).
  // ResourceExhausted when the memory cap is hit (counted in ooms; the
  // trainer stays usable), DeadlineExceeded/Unavailable when a peer fails.
  // The ranks agree on the step's outcome before anything changes (one
  // small all-gather on a group of their own): when any rank fails before
  // the update, every rank's step fails with that rank's error ("rank 1
  // failed step 2: RESOURCE_EXHAUSTED ..."), parameters and optimizer state
  // stay untouched everywhere, and the next step works on every rank. The
  // failing rank makes its peers' waiting collectives fail at once
  // (ProcessGroup::FailPeers). Only on backends that publish failures (local,
  // gloo, NCCL with its call check); elsewhere, and after a peer died or hung
  // (a group no longer usable), each rank abandons the step and reports its
  // own error (a peer's failure as the timeout of a collective).
  StatusOr<StepMetrics> Step();
  // One optimizer step on the caller's micro-batches instead of the
  // trainer's data: exactly grad_accum_steps of them (every rank runs as
  // many), each with 1 <= batch_size <= options().batch_size and 1 <=
  // seq_len <= options().seq_len (shapes may differ per micro-batch, step
  // and rank), loss_denominator 0, and what the model's ValidateBatch
  // accepts (ids within the vocabulary, targets or kIgnoreTarget, packed
  // documents' positions and segment ids). The loss is the mean over the
  // counted targets of every rank and micro-batch (loss_normalization.h);
  // on several ranks the counts are exchanged with one all-gather per
  // step. Collective: every rank calls StepOnBatches for the step (not
  // Step). A bad batch on any rank fails the step on every rank (as a
  // failed Step does) with InvalidArgument naming the micro-batch and the
  // field; nothing changes. The data position (datasets) does not advance.
  StatusOr<StepMetrics> StepOnBatches(const std::vector<TokenBatch>& micro_batches);
  // The mean loss of `batches` forward passes on held-out batches (no update).
  // With a dataset: the eval dataset's first `batches` global batches of
  // batch_size * world rows in file order (fewer when it ends sooner: a
  // large `batches` is one pass over the whole set, its last batch padded
  // with ignored rows), this rank's slice of each; the result is the mean
  // over every unmasked target token of all of them on all ranks (the same
  // on every rank; PyTorch's ignore_index mean over the set). Collective.
  StatusOr<float> Evaluate(int batches);

  const TrainerOptions& options() const { return options_; }
  const Model& model() const { return *model_; }
  int64_t steps() const { return step_; }
  // Steps counted but not applied (skip_nonfinite_steps).
  int64_t steps_skipped() const { return steps_skipped_; }

  // The learning rate. By default each step uses
  // LrAt(options().lr_schedule, options().optimizer.lr, steps()). set_lr
  // fixes the rate of every later step to `lr` instead (0 is valid: a step
  // with lr 0 changes no parameter but still advances the optimizer's
  // moments and the step count), until clear_lr returns to the schedule.
  // InvalidArgument for a negative or non-finite lr. Not collective, but
  // every rank should set the same rate.
  Status set_lr(float lr);
  void clear_lr() { lr_override_ = -1; }
  // The rate the next Step will use.
  float lr() const;
  // The rank's device (sim:0 on the simulator).
  Device& device() { return *device_; }
  // The simulated device, or null unless device.kind = kSim.
  sim::SimDevice* sim_device() { return sim_device_; }
  // Where FSDP's cpu_offload keeps the rank's offloaded state
  // (runtime/train/rank.h), or null without offload (and under kDdp).
  OffloadHost* offload_host() { return offload_.get(); }
  // The process group the trainer runs over (the simulated world when it
  // created one).
  comm::ProcessGroup& world() { return *world_; }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  CachingAllocator& allocator() { return *allocator_; }
  // The data-parallel model: FSDP (null under kDdp) or DDP (null under
  // kFsdp), and the one in use whichever it is (data_parallel()).
  FullyShardedModel* fsdp() { return fsdp_.get(); }
  DistributedDataParallel* ddp() { return ddp_.get(); }
  DataParallelModel& data_parallel() { return *data_parallel_; }
  Optimizer& optimizer() { return *optimizer_; }
  // The batch of micro-step `micro` of step `step` for this rank.
  StatusOr<TokenBatch> BatchFor(int64_t step, int micro) const;

  // The dataset the trainer reads, or null (data_path or synthetic data).
  const data::Dataset* dataset() const { return dataset_.get(); }
  // With a dataset: the global samples consumed by the steps so far (what a
  // checkpoint records), and the samples one step takes (G).
  int64_t samples_consumed() const { return SamplesBefore(step_); }
  int64_t global_batch() const;
  // With a dataset: this rank's sample ids of the last successful step, in
  // row order (micro-batch 0's rows first); Dataset::Rows says what an id
  // is. Empty before the first step and without a dataset.
  const std::vector<int64_t>& last_sample_ids() const { return last_sample_ids_; }

  // Sharded checkpoint of the model, optimizer state and step counter
  // (runtime/checkpoint/checkpoint.h). Collective. FailedPrecondition on sim. A failed save leaves the
  // previous checkpoint in `dir` intact.
  Status SaveCheckpoint(const std::string& dir);
  // Restores a checkpoint saved at any world size and strategy, including
  // the step counter (so BatchFor continues the data where it stopped).
  // To continue the same run at another world size keep the global batch
  // (batch_size * grad_accum_steps * world size). Collective; on error
  // nothing changes.
  Status LoadCheckpoint(const std::string& dir);
  // A checkpoint every few steps into one root: SaveCheckpoint to
  // root/step_<steps(), 12 digits>, then world rank 0 removes all but the
  // newest `keep` (>= 1; a removal that fails is logged, the save stands).
  // InvalidArgument for an empty root, keep < 1, or a root that is not a
  // directory; otherwise as SaveCheckpoint. Collective.
  Status SaveCheckpointRotating(const std::string& root, int keep);
  // LoadCheckpoint of the newest complete checkpoint under `root` (rank 0
  // picks it; a half-written one is never picked: checkpoint.h) and true;
  // false, changing nothing, when `root` holds none or does not exist (a
  // first start). Errors as LoadCheckpoint, or InvalidArgument for an empty
  // root or one that is not a directory. Collective.
  StatusOr<bool> ResumeLatest(const std::string& root);

  // A full state dict: one safetensors file at `path` (rank 0 writes it
  // durably) with every parameter in full, in `layout` (weight_layout.h); in
  // the shardkit layout also the optimizer state and the step counter, so a
  // load resumes exactly. Collective. Errors as SaveFullStateDict
  // (runtime/checkpoint/checkpoint.h); Unimplemented under kDdp, FailedPrecondition
  // on a sim device.
  Status SaveFullStateDict(const std::string& path, WeightLayout layout = WeightLayout::kShardkit);
  // Loads a full state dict in `layout` at any world size and strategy, and
  // sets steps() to the step it records (0 for weights from other tools).
  // Optimizer state is restored when the file has it (else left as it is).
  // Collective; on error nothing changes.
  Status LoadFullStateDict(const std::string& path, WeightLayout layout = WeightLayout::kShardkit);
  // False while a trainer created with fsdp.skip_init has loaded no weights.
  bool weights_loaded() const { return weights_loaded_; }

 private:
  Trainer(const TrainerOptions& options, comm::ProcessGroup* world);
  Status Init();
  // The mean of `loss` over all ranks. Collective.
  StatusOr<float> GlobalMean(float loss);
  // The groups the step's collectives use (world, FSDP's shard and
  // replicate groups), in the same order on every rank.
  std::vector<comm::ProcessGroup*> StepGroups();
  // FailedPrecondition naming `call` while no weights are loaded (skip_init).
  Status CheckWeightsLoaded(const char* call) const;
  // Applies the GEMM thread count to the calling thread.
  Status UseGemmThreads() const;
  // Step (given null: the trainer's own data) or StepOnBatches.
  StatusOr<StepMetrics> RunStep(const std::vector<TokenBatch>* given);
  // StepOnBatches's checks of the caller's micro-batches.
  Status CheckCallerBatches(const std::vector<TokenBatch>& batches) const;
  // Every rank's counted targets per micro-batch, rank-major, from this
  // rank's: one all-gather on the world. Collective.
  StatusOr<std::vector<int64_t>> ExchangeTargetCounts(const std::vector<int64_t>& mine);
  // The global sample index step `step` starts at (with a dataset).
  int64_t SamplesBefore(int64_t step) const;
  // This rank's rows of micro-batch `micro` of step `step` from the dataset.
  StatusOr<TokenBatch> DatasetBatch(int64_t step, int micro, std::vector<int64_t>* sample_ids) const;
  StatusOr<float> EvaluateDataset(int batches);

  TrainerOptions options_;
  std::unique_ptr<comm::ProcessGroup> owned_world_;  // the simulated world, when created here
  comm::ProcessGroup* world_;
  // Every rank's agreement on each step's outcome (step_outcome.h); null on
  // one rank, on the simulator and on backends that do not publish failures.
  std::unique_ptr<StepAgreement> outcome_;
  Device* device_ = nullptr;
  sim::SimDevice* sim_device_ = nullptr;
  bool adjusts_compute_ = false;  // installed sim::SetComputeAdjustment
  std::unique_ptr<Model> model_;
  NamedModelConfig config_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<OffloadHost> offload_;  // FSDP with cpu_offload
  std::unique_ptr<FullyShardedModel> fsdp_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  DataParallelModel* data_parallel_ = nullptr;
  std::unique_ptr<Optimizer> optimizer_;
  // Averages the step's loss over ranks (StepMetrics::global_loss).
  std::unique_ptr<Stream> metrics_stream_;
  // GlobalMean's one f32 on a GPU (world size > 1, not simulated), allocated
  // at creation and kept; empty elsewhere. Freed before the stream and the
  // allocator (declared after them).
  Tensor mean_buffer_;
  std::vector<int32_t> tokens_;
  std::unique_ptr<data::Dataset> dataset_;
  std::unique_ptr<data::Dataset> eval_dataset_;
  // The data position: step data_base_step_ started at global sample
  // data_base_samples_ (0, 0 until a checkpoint is loaded).
  int64_t data_base_step_ = 0;
  int64_t data_base_samples_ = 0;
  std::vector<int64_t> last_sample_ids_;
  int64_t step_ = 0;
  int64_t steps_skipped_ = 0;
  bool weights_loaded_ = true;  // false from a skip_init creation to the first load
  float lr_override_ = -1;  // set_lr's rate; negative: the schedule's
  int gemm_threads_ = 1;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_TRAIN_TRAINER_H_
