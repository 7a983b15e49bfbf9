#include "runtime/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <thread>

#include "runtime/ops/cpu/cpu_backend.h"
#include "runtime/ops/ops.h"

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/nn/model_family.h"
#include "runtime/train/rank.h"
#include "runtime/train/rank_agreement.h"
#include "runtime/comm/work.h"
#include "runtime/sim/sim_device.h"
#include "runtime/sim/sim_ops.h"
#include "runtime/sim/sim_process_group.h"
#include "runtime/sim/topology.h"

namespace sk {

Status ValidateTrainerOptions(const TrainerOptions& o) {
  SK_ASSIGN_OR_RETURN(NamedModelConfig config, FindModelConfig(o.model));
  switch (o.parallelism) {
    case Parallelism::kFsdp:
      break;
    case Parallelism::kDdp:
      break;
    default:
      return InvalidArgumentError("unknown parallelism value " +
                                  std::to_string(static_cast<int>(o.parallelism)));
  }
  if (o.batch_size < 1) return InvalidArgumentError("batch_size must be >= 1");
  if (o.grad_accum_steps < 1) return InvalidArgumentError("grad_accum_steps must be >= 1");
  if (o.seq_len < 0 || o.source_len < 0) return InvalidArgumentError("sequence lengths must be >= 0");
  if (o.data_tokens < 0) return InvalidArgumentError("data_tokens must be >= 0");
  if (o.gemm_threads < 0) return InvalidArgumentError("gemm_threads must be >= 0 (0 = automatic)");
  if (!(o.clip_grad_norm >= 0) || !std::isfinite(o.clip_grad_norm)) {
    return InvalidArgumentError("clip_grad_norm must be finite and >= 0 (0 = do not clip), got " +
                                std::to_string(o.clip_grad_norm));
  }
  SK_RETURN_IF_ERROR(ValidateDeviceOptions(o.device));
  if (o.fsdp.skip_init && o.parallelism == Parallelism::kDdp) {
    return InvalidArgumentError(
        "skip_init: a DDP trainer loads no weights (checkpoints and state dicts are FSDP's), so it must initialise them");
  }
  if (o.fsdp.skip_init && KindCapabilities(o.device.kind).virtual_time) {
    return InvalidArgumentError(
        "skip_init: the simulator loads no weights (its tensors hold no data), so there is nothing to skip for");
  }
  SK_RETURN_IF_ERROR(ValidateOptimizerOptions(o.optimizer));
  SK_RETURN_IF_ERROR(ValidateLrSchedule(o.lr_schedule, o.optimizer.lr));
  SK_RETURN_IF_ERROR(CheckStepSizeFits(config, o.batch_size, o.seq_len, o.source_len));
  if (!o.dataset.paths.empty()) {
    SK_RETURN_IF_ERROR(data::ValidateDatasetOptions(o.dataset));
    if (!o.data_path.empty()) {
      return InvalidArgumentError("give data_path or dataset, not both (data_path '" + o.data_path + "')");
    }
    SK_ASSIGN_OR_RETURN(const ModelFamilyDescription* family, ModelFamilyOf(config));
    if (family->batches != FamilyBatches::kDecoder) {
      return InvalidArgumentError(std::string("dataset: datasets feed decoder-only models (GPT, Llama); '") +
                                  o.model + "' is a " + ModelFamilyName(config.family) + " model");
    }
  } else if (!o.eval_dataset_paths.empty()) {
    return InvalidArgumentError("eval_dataset_paths needs a dataset (dataset.paths is empty)");
  }
  for (size_t i = 0; i < o.eval_dataset_paths.size(); ++i) {
    if (o.eval_dataset_paths[i].empty()) {
      return InvalidArgumentError("eval_dataset_paths[" + std::to_string(i) + "] is empty");
    }
  }
  return OkStatus();
}

namespace {

// The options every rank must share, each as (field, exact value).
std::vector<std::pair<std::string, std::string>> SharedFields(const TrainerOptions& o) {
  auto num = [](double v) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  auto i = [](int64_t v) { return std::to_string(v); };
  const bool ddp = o.parallelism == Parallelism::kDdp;
  std::vector<std::pair<std::string, std::string>> v = {
      {"model", o.model},
      {"parallelism", ddp ? "DDP" : "FSDP"},
  };
  for (auto& f : SharedFsdpAndOptimizerFields(o.fsdp, o.optimizer)) v.push_back(std::move(f));
  const std::vector<std::pair<std::string, std::string>> rest = {
      {"lr_schedule.kind", i(static_cast<int>(o.lr_schedule.kind))},
      {"lr_schedule.warmup_steps", i(o.lr_schedule.warmup_steps)},
      {"lr_schedule.decay_steps", i(o.lr_schedule.decay_steps)},
      {"lr_schedule.min_lr", num(o.lr_schedule.min_lr)},
      {"batch_size", i(o.batch_size)},
      {"grad_accum_steps", i(o.grad_accum_steps)},
      {"seq_len", i(o.seq_len)},
      {"source_len", i(o.source_len)},
      {"clip_grad_norm", num(o.clip_grad_norm)},
      {"activation_checkpointing", i(o.activation_checkpointing)},
      {"checkpointing", i(static_cast<int>(o.checkpointing))},
      {"recompute_attention", i(o.recompute_attention)},
      {"ddp_bucket_bytes", i(o.ddp_bucket_bytes)},
      {"data_path", o.data_path},
      {"data_width", i(static_cast<int>(o.data_width))},
      {"data_seed", std::to_string(o.data_seed)},
      {"data_tokens", i(o.data_tokens)},
      {"dataset.format", i(static_cast<int>(o.dataset.format))},
      {"dataset.layout", i(static_cast<int>(o.dataset.layout))},
      {"dataset.token_bytes", i(o.dataset.token_bytes)},
      {"dataset.seed", std::to_string(o.dataset.seed)},
      {"dataset.shuffle", i(o.dataset.shuffle)},
      {"dataset.packing", i(o.dataset.packing)},
      {"dataset.eos_id", i(o.dataset.eos_id)},
      {"dataset.paths", i(static_cast<int64_t>(o.dataset.paths.size()))},
      {"eval_dataset_paths", i(static_cast<int64_t>(o.eval_dataset_paths.size()))},
      {"skip_nonfinite_steps", i(o.skip_nonfinite_steps)},
      {"packed_documents", i(o.packed_documents)},
      {"skip_init", i(o.fsdp.skip_init)},
  };
  v.insert(v.end(), rest.begin(), rest.end());
  for (size_t k = 0; k < o.dataset.paths.size(); ++k) {
    v.push_back({"dataset.paths[" + std::to_string(k) + "]", o.dataset.paths[k]});
  }
  for (size_t k = 0; k < o.eval_dataset_paths.size(); ++k) {
    v.push_back({"eval_dataset_paths[" + std::to_string(k) + "]", o.eval_dataset_paths[k]});
  }
  return v;
}

}  // namespace

Status AgreeOnTrainerOptions(const TrainerOptions& options, const Status& local_validity,
                             comm::ProcessGroup* world) {
  if (world == nullptr) return InvalidArgumentError("Trainer needs a process group");
  // The timeout may be what is wrong with the options: then the default.
  const Duration timeout = options.fsdp.timeout.count() > 0 && options.fsdp.timeout <= kMaxTimeout
                               ? options.fsdp.timeout
                               : kDefaultTimeout;
  return AgreeOnFields(SharedFields(options), local_validity, *world, timeout, "trainer");
}

Trainer::Trainer(const TrainerOptions& options, comm::ProcessGroup* world)
    : options_(options), world_(world) {}

Trainer::~Trainer() {
  if (sim_device_ != nullptr && adjusts_compute_) {
    sim::SetComputeAdjustment(sim_device_->id().index, nullptr);
  }
  // The data-parallel model's streams hold buffers of the allocator: destroy it first.
  optimizer_.reset();
  data_parallel_ = nullptr;
  fsdp_.reset();
  ddp_.reset();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options,
                                                   comm::ProcessGroup* world,
                                                   MemoryStats* memory_on_error) {
  Status valid = ValidateTrainerOptions(options);
  const DeviceCapabilities can = KindCapabilities(options.device.kind);
  const bool sim = can.virtual_time;
  if (world == nullptr && !sim) return InvalidArgumentError("Trainer needs a process group");
  // Ranks of CPU worlds (host memory over local or gloo) and of groups bound
  // to a device (nccl) agree on their options before anything else
  // collective. A simulated world's ranks share one set of options.
  if (!sim && ((can.host_memory &&
                (world->backend_name() == "local" || world->backend_name() == "gloo")) ||
               world->bound_device().has_value())) {
    if (valid.ok()) valid = ValidateFsdpOptions(options.fsdp, world->size());
    SK_RETURN_IF_ERROR(AgreeOnTrainerOptions(options, valid, world));
  }
  SK_RETURN_IF_ERROR(valid);
  std::unique_ptr<comm::ProcessGroup> owned;
  if (world == nullptr) {
    SK_ASSIGN_OR_RETURN(owned, CreateSimWorld(options.device));
    world = owned.get();
  }
  SK_RETURN_IF_ERROR(CheckWorldForDevice(options.device, *world));
  SK_RETURN_IF_ERROR(ValidateFsdpOptions(options.fsdp, world->size()));
  std::unique_ptr<Trainer> t(new Trainer(options, world));
  t->owned_world_ = std::move(owned);
  Status s = t->Init();
  if (!s.ok()) {
    if (memory_on_error != nullptr && t->allocator_ != nullptr) {
      // Release what the failed set-up holds first: its buffers return to
      // the cache, the peaks stay.
      t->optimizer_.reset();
      t->data_parallel_ = nullptr;
      t->fsdp_.reset();
      t->ddp_.reset();
      *memory_on_error = t->allocator_->stats();
    }
    return s;
  }
  return t;
}

Status Trainer::Init() {
  weights_loaded_ = !options_.fsdp.skip_init;
  SK_ASSIGN_OR_RETURN(config_, FindModelConfig(options_.model));
  if (options_.seq_len == 0) options_.seq_len = config_.seq_len;
  if (options_.source_len == 0) options_.source_len = config_.source_len;
  ModelOptions mo;
  mo.compute_dtype = options_.fsdp.mixed_precision.param_dtype;
  mo.activation_checkpointing = options_.activation_checkpointing;
  mo.checkpointing = options_.checkpointing;
  mo.recompute_attention = options_.recompute_attention;
  SK_ASSIGN_OR_RETURN(model_, CreateModel(config_, mo));

  gemm_threads_ = options_.gemm_threads;
  if (gemm_threads_ == 0) {
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int sharing = 1;
    if (world_->backend_name() == "local") {
      sharing = world_->size();
    } else {
      sharing = std::max(1, LocalWorldSizeFromEnvironment());
    }
    gemm_threads_ = std::max(1, cores / sharing);
  }
  SK_ASSIGN_OR_RETURN(device_, ResolveRankDevice(options_.device, *world_));
  sim_device_ = dynamic_cast<sim::SimDevice*>(device_);  // null unless simulated
  if (auto* sim_world = dynamic_cast<sim::SimProcessGroup*>(world_); sim_world != nullptr) {
    // Communication kernels hold SMs: compute slows by the profile's factor
    // (network.compute_slowdown_while_communicating, with its source there)
    // for the fraction of an op's time that some collective runs.
    const double factor = sim_world->profile().compute_slowdown_while_communicating;
    if (factor > 1) {
      sim::LinkSchedule* links = &sim_world->links();
      sim::SetComputeAdjustment(device_->id().index, [links, factor](double start, double seconds) {
        return seconds * (1 + (factor - 1) * links->BusyFraction(start, start + seconds));
      });
      adjusts_compute_ = true;
    }
  }
  SK_ASSIGN_OR_RETURN(allocator_, CreateRankAllocator(device_, options_.memory_cap_bytes));
  SK_ASSIGN_OR_RETURN(metrics_stream_, device_->CreateStream("metrics"));
  if (!device_->capabilities().host_memory && sim_device_ == nullptr && world_->size() > 1) {
    // GlobalMean's one element, for the trainer's life: allocated there, after
    // the ranks agreed on the step and counted it, one rank out of memory
    // would fail that rank alone while its peers waited in the average.
    StreamAllocator alloc(allocator_.get(), metrics_stream_.get());
    SK_ASSIGN_OR_RETURN(mean_buffer_, alloc.Empty(DType::kF32, Shape{1}));
  }

  const int64_t vocab = BatchIdSpace(config_);
  if (!options_.dataset.paths.empty()) {
    SK_ASSIGN_OR_RETURN(dataset_, data::Dataset::Open(options_.dataset, options_.seq_len, vocab));
    if (!options_.eval_dataset_paths.empty()) {
      data::DatasetOptions eval = options_.dataset;
      eval.paths = options_.eval_dataset_paths;
      eval.shuffle = false;
      SK_ASSIGN_OR_RETURN(eval_dataset_, data::Dataset::Open(eval, options_.seq_len, vocab));
    }
  } else if (options_.data_path.empty()) {
    int64_t length = options_.data_tokens > 0
                         ? options_.data_tokens
                         : std::max<int64_t>(1 << 16, 8 * (options_.seq_len + options_.source_len + 1));
    SK_ASSIGN_OR_RETURN(tokens_, SyntheticTokenStream(options_.data_seed, vocab, length));
  } else {
    SK_ASSIGN_OR_RETURN(tokens_, ReadTokenFile(options_.data_path, options_.data_width, vocab));
  }
  SK_RETURN_IF_ERROR(BatchFor(0, 0).status());

  if (options_.parallelism == Parallelism::kDdp) {
    DdpOptions d;
    d.compute_dtype = options_.fsdp.mixed_precision.param_dtype;
    d.gradient_predivide_factor = options_.fsdp.gradient_predivide_factor;
    d.seed = options_.fsdp.seed;
    d.timeout = options_.fsdp.timeout;
    if (options_.ddp_bucket_bytes > 0) d.bucket_bytes = options_.ddp_bucket_bytes;
    SK_ASSIGN_OR_RETURN(ddp_, DistributedDataParallel::Create(model_->units(), world_,
                                                               allocator_.get(), d));
    data_parallel_ = ddp_.get();
  } else {
    if (options_.fsdp.cpu_offload) {
      SK_ASSIGN_OR_RETURN(offload_, CreateOffloadHost(device_));
    }
    // The model accumulates 16-bit gradients in f32: let it do so in FSDP's
    // unsharded gradient itself (fsdp.h, "Mixed precision").
    FsdpOptions fo = options_.fsdp;
    fo.f32_unsharded_gradients = true;
    if (fo.ranks_per_node == 0) fo.ranks_per_node = RanksPerNode(*world_);
    SK_ASSIGN_OR_RETURN(fsdp_, FullyShardedModel::Create(model_->units(), world_, allocator_.get(),
                                                         fo,
                                                         offload_ ? offload_->shards : nullptr,
                                                         offload_ ? offload_->stream : nullptr));
    data_parallel_ = fsdp_.get();
  }
  SK_ASSIGN_OR_RETURN(optimizer_, CreateEngineOptimizer(options_.optimizer, *data_parallel_,
                                                        offload_ ? offload_->optimizer_state : nullptr));
  // Agreeing on outcomes needs the peers to learn of a failure at once
  // (ProcessGroup::FailPeers: local, gloo, nccl with its call check);
  // elsewhere a healthy rank would first wait out its collective's timeout
  // and then the agreement's: each rank reports its own error.
  if (sim_device_ == nullptr) {
    SK_ASSIGN_OR_RETURN(outcome_, StepAgreement::Create(*world_, *device_, options_.fsdp.timeout));
  }
  return OkStatus();
}

std::vector<comm::ProcessGroup*> Trainer::StepGroups() {
  std::vector<comm::ProcessGroup*> groups = {world_};
  if (fsdp_) {
    groups.push_back(&fsdp_->shard_group());
    if (fsdp_->replicate_group() != nullptr) groups.push_back(fsdp_->replicate_group());
  }
  return groups;
}

int64_t Trainer::global_batch() const {
  return options_.batch_size * options_.grad_accum_steps * world_->size();
}

int64_t Trainer::SamplesBefore(int64_t step) const {
  return data_base_samples_ + (step - data_base_step_) * global_batch();
}

StatusOr<TokenBatch> Trainer::DatasetBatch(int64_t step, int micro, std::vector<int64_t>* sample_ids) const {
  const int64_t per_rank = options_.batch_size * options_.grad_accum_steps;
  const int64_t first = SamplesBefore(step) + world_->rank() * per_rank + micro * options_.batch_size;
  if (first < 0) return InvalidArgumentError("step " + std::to_string(step) + " is before the data position");
  return dataset_->Rows(first, options_.batch_size, sample_ids);
}

StatusOr<TokenBatch> Trainer::BatchFor(int64_t step, int micro) const {
  if (dataset_) return DatasetBatch(step, micro, nullptr);
  const int64_t index = step * options_.grad_accum_steps + micro;
  SK_ASSIGN_OR_RETURN(const ModelFamilyDescription* family, ModelFamilyOf(config_));
  if (family->batches == FamilyBatches::kEncoderDecoder) {
    return ReversalBatch(tokens_, options_.batch_size, options_.source_len, options_.seq_len,
                         /*bos=*/0, options_.data_seed, index, world_->rank(), world_->size());
  }
  return LanguageModelBatch(tokens_, options_.batch_size, options_.seq_len, options_.data_seed,
                            index, world_->rank(), world_->size());
}

StatusOr<float> Trainer::GlobalMean(float loss) {
  if (world_->size() == 1) return loss;
  // Simulated ranks have no loss to average.
  if (sim_device_ != nullptr) return std::numeric_limits<float>::quiet_NaN();
  comm::ReduceOptions ro;
  ro.op = comm::ReduceOp::kAvg;
  ro.timeout = options_.fsdp.timeout;
  if (!device_->capabilities().host_memory) {
    // A GPU's collectives move device memory (NCCL, and the local backend's
    // device-to-device copies and reduction kernel): the loss goes through a
    // one-element tensor on this rank's device (mean_buffer_, allocated at
    // creation: nothing here can run out of memory), written and read back
    // in the metrics stream's order, so one call's read is done before the
    // next call's write.
    StreamAllocator alloc(allocator_.get(), metrics_stream_.get());
    ops::OpContext ctx{device_, metrics_stream_.get(), &alloc};
    const Tensor& d = mean_buffer_;
    SK_RETURN_IF_ERROR(ops::Fill(ctx, d, loss));
    SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w, world_->all_reduce(d, *metrics_stream_, ro));
    SK_RETURN_IF_ERROR(w->wait(options_.fsdp.timeout).WithContext("averaging the loss over ranks"));
    SK_ASSIGN_OR_RETURN(double mean, ops::ReadScalar(ctx, d));
    return static_cast<float>(mean);
  }
  SK_ASSIGN_OR_RETURN(Tensor t, HostAllocator::Default().Empty(DType::kF32, Shape{1}));
  t.data_as<float>()[0] = loss;
  SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w, world_->all_reduce(t, *metrics_stream_, ro));
  SK_RETURN_IF_ERROR(w->wait(options_.fsdp.timeout).WithContext("averaging the loss over ranks"));
  return t.data_as<float>()[0];
}

Status Trainer::UseGemmThreads() const { return ops::SetCpuGemmThreads(gemm_threads_); }

Status Trainer::set_lr(float lr) {
  if (!std::isfinite(lr) || lr < 0) {
    return InvalidArgumentError("learning rate must be finite and >= 0, not " + std::to_string(lr));
  }
  lr_override_ = lr;
  return OkStatus();
}

float Trainer::lr() const {
  if (lr_override_ >= 0) return lr_override_;
  return LrAt(options_.lr_schedule, options_.optimizer.lr, step_);
}

StatusOr<StepMetrics> Trainer::Step() { return RunStep(nullptr); }

StatusOr<StepMetrics> Trainer::StepOnBatches(const std::vector<TokenBatch>& micro_batches) {
  return RunStep(&micro_batches);
}

Status Trainer::CheckCallerBatches(const std::vector<TokenBatch>& batches) const {
  if (static_cast<int64_t>(batches.size()) != options_.grad_accum_steps) {
    return InvalidArgumentError(
        "a step takes grad_accum_steps = " + std::to_string(options_.grad_accum_steps) +
        " micro-batches (every rank runs the same number), got " + std::to_string(batches.size()));
  }
  for (size_t m = 0; m < batches.size(); ++m) {
    const TokenBatch& b = batches[m];
    const std::string which = "micro-batch " + std::to_string(m) + ": ";
    if (b.batch_size < 1 || b.batch_size > options_.batch_size) {
      return InvalidArgumentError(which + "batch_size " + std::to_string(b.batch_size) +
                                  " is outside [1, " + std::to_string(options_.batch_size) +
                                  "] (the trainer's batch_size is the most a micro-batch holds)");
    }
    if (b.seq_len < 1 || b.seq_len > options_.seq_len) {
      return InvalidArgumentError(which + "seq_len " + std::to_string(b.seq_len) + " is outside [1, " +
                                  std::to_string(options_.seq_len) +
                                  "] (the trainer's seq_len is the longest a step takes)");
    }
    if (b.source_len > options_.source_len) {
      return InvalidArgumentError(which + "source_len " + std::to_string(b.source_len) +
                                  " is above the trainer's source_len " +
                                  std::to_string(options_.source_len));
    }
    if (b.loss_denominator != 0) {
      return InvalidArgumentError(which + "loss_denominator is the trainer's to set (leave it 0)");
    }
    SK_RETURN_IF_ERROR(model_->ValidateBatch(b).WithContext("micro-batch " + std::to_string(m)));
  }
  return OkStatus();
}

StatusOr<std::vector<int64_t>> Trainer::ExchangeTargetCounts(const std::vector<int64_t>& mine) {
  const int n = world_->size();
  const int64_t per_rank = static_cast<int64_t>(mine.size());
  // Counts travel as the bits of f32 words (collectives carry floats; an
  // all-gather copies them unchanged), as the step outcome's bytes do.
  SK_ASSIGN_OR_RETURN(Tensor in, HostAllocator::Default().Empty(DType::kF32, Shape{per_rank}));
  SK_ASSIGN_OR_RETURN(Tensor all, HostAllocator::Default().Empty(DType::kF32, Shape{per_rank * n}));
  for (int64_t m = 0; m < per_rank; ++m) {
    if (mine[m] > std::numeric_limits<int32_t>::max()) {
      return InvalidArgumentError("micro-batch " + std::to_string(m) + " counts " +
                                  std::to_string(mine[m]) + " targets, more than an int32");
    }
    const int32_t c = static_cast<int32_t>(mine[m]);
    std::memcpy(static_cast<char*>(in.data()) + 4 * m, &c, 4);
  }
  comm::CollectiveOptions co;
  co.timeout = options_.fsdp.timeout;
  co.label = "target counts";
  SK_ASSIGN_OR_RETURN(std::shared_ptr<comm::Work> w, world_->all_gather(all, in, *metrics_stream_, co));
  SK_RETURN_IF_ERROR(w->wait(options_.fsdp.timeout).WithContext("exchanging the step's target counts"));
  std::vector<int64_t> counts(static_cast<size_t>(per_rank * n));
  for (size_t k = 0; k < counts.size(); ++k) {
    int32_t c = 0;
    std::memcpy(&c, static_cast<const char*>(all.data()) + 4 * k, 4);
    counts[k] = c;
  }
  return counts;
}

Status Trainer::CheckWeightsLoaded(const char* call) const {
  if (weights_loaded_) return OkStatus();
  return FailedPreconditionError(
      std::string(call) +
      ": the trainer was created with skip_init and holds no weights yet (its parameters are zero, not "
      "initialised); load them first: LoadFullStateDict (a Hugging Face directory or a state dict), "
      "LoadCheckpoint or ResumeLatest (nothing was changed)");
}

StatusOr<StepMetrics> Trainer::RunStep(const std::vector<TokenBatch>* given) {
  SK_RETURN_IF_ERROR(CheckWeightsLoaded(given == nullptr ? "Step" : "StepOnBatches"));
  SK_RETURN_IF_ERROR(UseGemmThreads());
  allocator_->ResetPeakStats();
  const int64_t bytes_before = data_parallel_->bytes_communicated();
  const auto t0 = std::chrono::steady_clock::now();
  const double sim_t0 = sim_device_ != nullptr ? sim_device_->HostClock() : 0;
  const int M = options_.grad_accum_steps;
  const int W = world_->size();
  double loss_sum = 0;   // the micro-batches' mean losses
  double token_sum = 0;  // the micro-batches' mean losses x their counted targets
  int64_t local_tokens = 0;
  LossNormalization norm_of_loss;
  double norm = 0;
  // Everything before the update may fail anywhere (an allocation inside the
  // model's compute leaves a unit mid-backward, outside any hook that could
  // clean up): abandon the step then, so every unit is idle again and the
  // next step starts clean. Parameters and optimizer state change only in
  // OptimizerStep. A caller's bad batch fails here too, so that every rank
  // fails the step alike.
  std::vector<int64_t> sample_ids, micro_ids;
  const bool sync_every_micro_batch =
      options_.parallelism == Parallelism::kFsdp && ReducesEveryMicroBatch(options_.fsdp);
  Status computed = [&]() -> Status {
    data_parallel_->ZeroGrad();
    std::vector<TokenBatch> built;
    if (given != nullptr) {
      SK_RETURN_IF_ERROR(CheckCallerBatches(*given));
    } else {
      for (int m = 0; m < M; ++m) {
        SK_ASSIGN_OR_RETURN(TokenBatch batch, dataset_ ? DatasetBatch(step_, m, &micro_ids) : BatchFor(step_, m));
        sample_ids.insert(sample_ids.end(), micro_ids.begin(), micro_ids.end());
        built.push_back(std::move(batch));
      }
    }
    const std::vector<TokenBatch>& batches = given != nullptr ? *given : built;
    // The loss normaliser (loss_normalization.h). The built-in sampler's
    // micro-batches count every target on every rank: uniform without a
    // word exchanged. Batches that may mask (the caller's, a dataset's) on
    // several ranks: one all-gather of the counts, so every rank decides
    // alike. The simulator moves no data: its ranks mirror this one.
    std::vector<int64_t> mine(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) mine[m] = CountedTargets(batches[m]);
    for (int64_t c : mine) local_tokens += c;
    std::vector<int64_t> counts;
    if (W > 1 && (given != nullptr || dataset_) && sim_device_ == nullptr) {
      SK_ASSIGN_OR_RETURN(counts, ExchangeTargetCounts(mine));
    } else {
      for (int r = 0; r < W; ++r) counts.insert(counts.end(), mine.begin(), mine.end());
    }
    norm_of_loss = NormalizeLoss(counts, W);
    for (int m = 0; m < M; ++m) {
      // Sharded accumulation reduces every micro-batch into the gradient
      // shards; unsharded (no_sync, and DDP) only the last.
      data_parallel_->set_gradient_sync(m + 1 == M || sync_every_micro_batch);
      const TokenBatch* batch = &batches[m];
      TokenBatch weighted;
      if (!norm_of_loss.uniform) {
        weighted = *batch;
        weighted.loss_denominator = norm_of_loss.denominator;
        batch = &weighted;
      }
      SK_ASSIGN_OR_RETURN(float loss, model_->ForwardBackward(*batch, *data_parallel_, data_parallel_->activation_allocator()));
      loss_sum += loss;
      token_sum += static_cast<double>(loss) * static_cast<double>(mine[m]);
    }
    SK_RETURN_IF_ERROR(data_parallel_->FinishBackward());
    // Uniform: the micro-batches' gradients (each of its own mean) were
    // summed; the reported loss is their mean. Make the gradient that of
    // the reported loss, as PyTorch's (loss / M).backward() does: grad_norm,
    // clipping and the learning rate then mean the same for every M.
    // Otherwise each micro-batch's gradient already carried 1 / (N / W).
    if (norm_of_loss.uniform && M > 1) {
      SK_RETURN_IF_ERROR(data_parallel_->ScaleGradients(1.f / static_cast<float>(M)));
    }
    SK_ASSIGN_OR_RETURN(norm, data_parallel_->ClipGradNorm(options_.clip_grad_norm));
    return OkStatus();
  }();
  const float lr = this->lr();
  // This rank's loss: the mean of its micro-batches' means (uniform), else
  // the mean over its counted targets.
  const float loss = norm_of_loss.uniform ? static_cast<float>(loss_sum / M)
                     : local_tokens > 0   ? static_cast<float>(token_sum / static_cast<double>(local_tokens))
                                          : 0.0f;
  // The update must not turn the model into NaNs (a learning rate of
  // FLT_MAX did so while every step returned OK): a non-finite loss or
  // gradient norm skips it on every rank. On the simulator nothing is
  // computed (both are NaN by design).
  // The optimizer's state exists before the ranks agree: a first step's
  // allocation that failed on one rank after the agreement left its peers
  // updated and counted and itself not, apart for good.
  if (computed.ok()) computed = data_parallel_->PrepareOptimizer(*optimizer_);
  StepChecks checks;
  if (sim_device_ == nullptr) {
    checks.finite = {{"the loss", loss}, {"the gradient norm", norm}};
  }
  checks.same = {StepChecks::F32("the learning rate", lr)};
  Status outcome;
  if (outcome_ != nullptr) {
    outcome = outcome_->Agree(computed, step_ + 1, StepGroups(), *data_parallel_, checks);
  } else if (!computed.ok()) {
    optimizer_->ReleaseUnsteppedState();
    data_parallel_->set_gradient_sync(true);
    data_parallel_->AbandonStep();
    return computed.WithContext("step " + std::to_string(step_ + 1) + " on rank " +
                                std::to_string(world_->rank()));
  } else {
    // One rank, or a backend without agreement: the norm is every rank's
    // (all-reduced), the loss this rank's.
    for (const StepChecks::Finite& f : checks.finite) {
      if (std::isfinite(f.value)) continue;
      data_parallel_->AbandonStep();
      outcome = AbortedError("step " + std::to_string(step_ + 1) + " skipped on rank " +
                             std::to_string(world_->rank()) + ": " + f.field + " is " + std::to_string(f.value) +
                             "; the update was not applied (parameters and optimizer state are unchanged)");
      break;
    }
  }
  if (!outcome.ok()) {
    optimizer_->ReleaseUnsteppedState();  // created above for this step
    const bool nonfinite = outcome.code() == StatusCode::kAborted && computed.ok();
    if (!nonfinite || !options_.skip_nonfinite_steps) return outcome;
    // GradScaler's way: the step counts (the data moves on), nothing changed.
    ++step_;
    ++steps_skipped_;
    last_sample_ids_ = std::move(sample_ids);
    StepMetrics m;
    m.step = step_;
    m.loss = loss;
    m.global_loss = std::numeric_limits<float>::quiet_NaN();
    m.grad_norm = norm;
    m.lr = lr;
    m.skipped = true;
    m.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return m;
  }
  optimizer_->set_lr(lr);
  Status updated = data_parallel_->OptimizerStep(*optimizer_);
  if (data_parallel_->UpdateEndsWithFallibleWork()) {
    // PrepareOptimizer did what can fail before the update, so the update
    // was applied on every rank; what follows it (FSDP's regather under
    // NO_SHARD and SHARD_OPTIM) may fail on one rank alone: every rank
    // returns its error, the step counts, and the next forward regathers.
    if (outcome_ != nullptr) {
      updated = outcome_->AgreeAfterUpdate(updated, step_ + 1, StepGroups(), *data_parallel_);
    } else if (!updated.ok()) {
      data_parallel_->AbandonAfterUpdate();
      updated = NoteUpdateApplied(
          updated.WithContext("step " + std::to_string(step_ + 1) + " on rank " + std::to_string(world_->rank())),
          step_ + 1);
    }
    if (!updated.ok()) {
      data_parallel_->ZeroGrad();
      ++step_;
      last_sample_ids_ = std::move(sample_ids);
      return updated;
    }
  }
  SK_RETURN_IF_ERROR(updated);
  // The gradients are spent: FSDP releases its gradient shards here (as
  // PyTorch's zero_grad(set_to_none=True)), so none is held between steps
  // nor through the next step's forward. (DDP's gradient buckets are its
  // model's storage for good: zeroing them twice a step would buy nothing.)
  if (fsdp_ != nullptr) data_parallel_->ZeroGrad();
  if (!device_->capabilities().ops_run_when_issued && sim_device_ == nullptr) {
    // On a GPU the update is only enqueued: the step ends when the device has
    // run it (as torch.cuda.synchronize() in a benchmark), so step_seconds is
    // the device's time and the caller may read parameters, checkpoint or
    // gather on other streams without racing the update.
    Stream* compute = data_parallel_->compute_stream();
    if (compute != nullptr) {
      SK_RETURN_IF_ERROR(compute->Synchronize(options_.fsdp.timeout)
                             .WithContext("step " + std::to_string(step_ + 1) + " on rank " +
                                          std::to_string(world_->rank()) + ": waiting for the device"));
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sim_device_ != nullptr) {
    // The step ends when the device has run everything it was given (as a
    // benchmark's torch.cuda.synchronize()): virtual seconds from the host's
    // start of the step.
    sim_device_->WaitHostUntil(sim_device_->Horizon());
    seconds = sim_device_->HostClock() - sim_t0;
  }
  ++step_;
  last_sample_ids_ = std::move(sample_ids);

  StepMetrics m;
  m.simulated = sim_device_ != nullptr;
  m.step = step_;
  m.loss = loss;
  m.target_tokens = local_tokens;
  m.global_target_tokens = norm_of_loss.global_tokens;
  if (norm_of_loss.uniform) {
    SK_ASSIGN_OR_RETURN(m.global_loss, GlobalMean(m.loss));
  } else {
    // The mean over all N counted targets: the ranks' sums averaged, x W / N.
    SK_ASSIGN_OR_RETURN(float mean_sum, GlobalMean(static_cast<float>(token_sum)));
    m.global_loss = static_cast<float>(static_cast<double>(mean_sum) * W /
                                       static_cast<double>(norm_of_loss.global_tokens));
  }
  m.grad_norm = norm;
  m.lr = lr;
  m.step_seconds = seconds;
  if (given == nullptr) {
    const double tokens = static_cast<double>(options_.batch_size) * options_.seq_len * M;
    m.tokens_per_second = tokens / seconds;
    StepFlops flops = model_->Flops(options_.batch_size, options_.seq_len, options_.source_len);
    m.model_tflops_per_rank = flops.model_flops * M / seconds / 1e12;
    m.hardware_tflops_per_rank = flops.hardware_flops * M / seconds / 1e12;
  } else {
    // The caller's micro-batches may each have their own shape.
    double tokens = 0, model_flops = 0, hardware_flops = 0;
    for (const TokenBatch& b : *given) {
      tokens += static_cast<double>(b.batch_size) * b.seq_len;
      const StepFlops f = model_->Flops(b.batch_size, b.seq_len, b.source_len);
      model_flops += f.model_flops;
      hardware_flops += f.hardware_flops;
    }
    m.tokens_per_second = tokens / seconds;
    m.model_tflops_per_rank = model_flops / seconds / 1e12;
    m.hardware_tflops_per_rank = hardware_flops / seconds / 1e12;
  }
  MemoryStats s = allocator_->stats();
  m.peak_allocated_bytes = s.allocated_bytes.peak;
  m.peak_reserved_bytes = s.reserved_bytes.peak;
  m.allocated_bytes = s.allocated_bytes.current;
  m.reserved_bytes = s.reserved_bytes.current;
  m.alloc_retries = s.num_alloc_retries;
  m.ooms = s.num_ooms;
  m.bytes_communicated = data_parallel_->bytes_communicated() - bytes_before;
  return m;
}

// Checkpoints are written from FSDP's flat shards; the DDP baseline keeps
// bucketed replicas and has no checkpoint format of its own.
constexpr char kNoDdpCheckpoints[] =
    "checkpoints are written by FSDP trainers; this trainer uses the DDP baseline "
    "(FSDP's NO_SHARD replicates like DDP and can be checkpointed)";

constexpr char kNoSimCheckpoints[] = "checkpoints need tensor data; a sim device's tensors hold none";

Status Trainer::SaveCheckpoint(const std::string& dir) {
  if (sim_device_ != nullptr) return FailedPreconditionError(kNoSimCheckpoints);
  if (ddp_) return UnimplementedError(kNoDdpCheckpoints);
  SK_RETURN_IF_ERROR(CheckWeightsLoaded("SaveCheckpoint"));
  TrainingState state{options_.model, &model_->units(), fsdp_.get(), optimizer_.get()};
  CheckpointIndex::DataPosition position;
  if (dataset_) {
    position.samples_consumed = SamplesBefore(step_);
    position.seed = options_.dataset.seed;
    position.samples_per_epoch = dataset_->num_samples();
    position.global_batch = global_batch();
    state.data = &position;
  }
  return SaveShardedCheckpoint(dir, state, step_);
}

Status Trainer::SaveCheckpointRotating(const std::string& root, int keep) {
  if (sim_device_ != nullptr) return FailedPreconditionError(kNoSimCheckpoints);
  if (ddp_) return UnimplementedError(kNoDdpCheckpoints);
  SK_RETURN_IF_ERROR(CheckWeightsLoaded("SaveCheckpointRotating"));
  if (root.empty()) return InvalidArgumentError("SaveCheckpointRotating: empty checkpoint root");
  if (keep < 1) {
    return InvalidArgumentError("SaveCheckpointRotating: keep must be at least 1 (the checkpoint being saved), not " +
                                std::to_string(keep));
  }
  SK_RETURN_IF_ERROR(PrepareCheckpointRoot(root, *fsdp_));
  SK_RETURN_IF_ERROR(SaveCheckpoint(RotatingCheckpointDir(root, step_)));
  if (fsdp_->rank() == 0) {
    Status pruned = PruneRotatingCheckpoints(root, keep);
    if (!pruned.ok()) LOG(WARNING) << "checkpoint saved, but old ones under '" << root << "' remain: " << pruned;
  }
  return OkStatus();
}

StatusOr<bool> Trainer::ResumeLatest(const std::string& root) {
  if (sim_device_ != nullptr) return FailedPreconditionError(kNoSimCheckpoints);
  if (ddp_) return UnimplementedError(kNoDdpCheckpoints);
  if (root.empty()) return InvalidArgumentError("ResumeLatest: empty checkpoint root");
  SK_ASSIGN_OR_RETURN(std::string dir, PickLatestCheckpoint(root, *fsdp_));
  if (dir.empty()) return false;
  SK_RETURN_IF_ERROR(LoadCheckpoint(dir));
  return true;
}

Status Trainer::LoadCheckpoint(const std::string& dir) {
  if (sim_device_ != nullptr) return FailedPreconditionError(kNoSimCheckpoints);
  if (ddp_) return UnimplementedError(kNoDdpCheckpoints);
  TrainingState state{options_.model, &model_->units(), fsdp_.get(), optimizer_.get()};
  if (dataset_) {
    // The data position must belong to this dataset and order; checked from
    // the index before anything loads (every rank reads the same index, so
    // every rank fails alike).
    StatusOr<CheckpointIndex> ix = ReadCheckpointIndex(dir);
    if (ix.ok() && ix->data) {
      const CheckpointIndex::DataPosition& d = *ix->data;
      if (d.seed != options_.dataset.seed || d.samples_per_epoch != dataset_->num_samples()) {
        return InvalidArgumentError(
            "checkpoint '" + dir + "' was saved reading a dataset of " + std::to_string(d.samples_per_epoch) +
            " samples per epoch in the order of seed " + std::to_string(d.seed) + "; this trainer's has " +
            std::to_string(dataset_->num_samples()) + " with seed " + std::to_string(options_.dataset.seed) +
            " (nothing was changed)");
      }
    }
  }
  std::optional<CheckpointIndex::DataPosition> position;
  SK_ASSIGN_OR_RETURN(int64_t step, LoadShardedCheckpoint(dir, state, &position));
  step_ = step;
  data_base_step_ = step_;
  // A checkpoint without a data position (saved without a dataset) counts
  // its steps at this trainer's global batch.
  data_base_samples_ = position ? position->samples_consumed : step_ * global_batch();
  last_sample_ids_.clear();
  weights_loaded_ = true;
  return OkStatus();
}

Status Trainer::SaveFullStateDict(const std::string& path, WeightLayout layout) {
  if (sim_device_ != nullptr) return FailedPreconditionError(kNoSimCheckpoints);
  if (ddp_) return UnimplementedError(kNoDdpCheckpoints);
  SK_RETURN_IF_ERROR(CheckWeightsLoaded("SaveFullStateDict"));
  // The export's gathered units and file buffers are the host's, not the
  // allocator's: the blocks the allocator caches but no tensor holds go back
  // to the system first, so the export's extra memory is not stacked on a
  // step's worth of cached free blocks (a 1.2B Llama at world 2 on 24 GiB
  // trained under memory_cap_bytes and was killed for memory in the export
  // without this: benchmarks/results/finetune_1b_20261207.txt).
  allocator_->EmptyCache();
  TrainingState state{options_.model, &model_->units(), fsdp_.get(), optimizer_.get()};
  FullStateDictOptions o;
  o.layout = layout;
  return sk::SaveFullStateDict(path, state, step_, o);
}

Status Trainer::LoadFullStateDict(const std::string& path, WeightLayout layout) {
  if (sim_device_ != nullptr) return FailedPreconditionError(kNoSimCheckpoints);
  if (ddp_) return UnimplementedError(kNoDdpCheckpoints);
  TrainingState state{options_.model, &model_->units(), fsdp_.get(), optimizer_.get()};
  FullStateDictOptions o;
  o.layout = layout;
  SK_ASSIGN_OR_RETURN(step_, sk::LoadFullStateDict(path, state, o));
  // A state dict holds no data position: its steps count at this trainer's global batch.
  data_base_step_ = step_;
  data_base_samples_ = step_ * global_batch();
  last_sample_ids_.clear();
  weights_loaded_ = true;
  return OkStatus();
}

StatusOr<float> Trainer::Evaluate(int batches) {
  if (batches < 1) return InvalidArgumentError("Evaluate needs at least one batch");
  SK_RETURN_IF_ERROR(CheckWeightsLoaded("Evaluate"));
  SK_RETURN_IF_ERROR(UseGemmThreads());
  if (dataset_) return EvaluateDataset(batches);
  double sum = 0;
  for (int b = 0; b < batches; ++b) {
    // Held-out: batch indices far beyond any training step's.
    SK_ASSIGN_OR_RETURN(TokenBatch batch, BatchFor((int64_t{1} << 40) + b, 0));
    SK_ASSIGN_OR_RETURN(float loss, model_->Forward(batch, *data_parallel_, data_parallel_->activation_allocator()));
    sum += loss;
  }
  return static_cast<float>(sum / batches);
}

StatusOr<float> Trainer::EvaluateDataset(int batches) {
  if (!eval_dataset_) {
    return FailedPreconditionError(
        "Evaluate: this trainer reads a dataset and has no held-out one (give eval_dataset_paths)");
  }
  const int64_t rows = options_.batch_size * world_->size();
  const int64_t in_set = (eval_dataset_->num_samples() + rows - 1) / rows;
  const int64_t n = std::min<int64_t>(batches, in_set);
  // Sum of token losses and count of counted tokens, this rank's.
  double sum = 0, count = 0;
  for (int64_t b = 0; b < n; ++b) {
    const int64_t first = b * rows + world_->rank() * options_.batch_size;
    SK_ASSIGN_OR_RETURN(TokenBatch batch, eval_dataset_->Rows(first, options_.batch_size, nullptr, /*one_pass=*/true));
    int64_t counted = 0;
    for (int32_t t : batch.targets) counted += t != kIgnoreTarget;
    // Every rank runs the forward (FSDP's gathers are collective), even on
    // rows that are all padding.
    SK_ASSIGN_OR_RETURN(float loss, model_->Forward(batch, *data_parallel_, data_parallel_->activation_allocator()));
    sum += static_cast<double>(loss) * counted;
    count += static_cast<double>(counted);
  }
  // sum / count over all ranks: the ratio of the two means (GlobalMean
  // moves them the way this device's collectives need).
  SK_ASSIGN_OR_RETURN(float mean_sum, GlobalMean(static_cast<float>(sum)));
  SK_ASSIGN_OR_RETURN(float mean_count, GlobalMean(static_cast<float>(count)));
  sum = mean_sum;
  count = mean_count;
  if (count == 0) return InvalidArgumentError("Evaluate: the eval dataset has no unmasked target token");
  return static_cast<float>(sum / count);
}

}  // namespace sk
