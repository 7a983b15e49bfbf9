// Memory estimator: the peak bytes one rank's device allocator will hold in a
// Trainer's training step (runtime/train: FSDP with f32 unsharded gradients),
// predicted from the model, strategy, world size, dtypes,
// optimizer and batch, without running anything.
//
//   peak = model states (master shards, optimizer state, and the full
//          parameters/gradients that NO_SHARD and SHARD_OPTIM keep)
//        + the most, over the moments of the backward, of the buffers in
//          flight then, the gradient shards made by then and the
//          activations bounding that moment.
//
// The buffers in flight come from a walk of the backward unit by unit, as
// FullyShardedModel runs it: the unit computing with its gathered
// parameters and full gradient (f32 under a 16-bit param_dtype, as the
// Trainer's f32_unsharded_gradients makes it), the units prefetched as
// backward_prefetch and all_gather_limit allow (SHARD_GRAD_OP: every unit
// not yet through its backward, kept since forward), the previous unit's
// reduction (its full gradient, a cast to reduce_dtype, the reduce-scatter's
// output shard), a tied parameter's owner gathered while the unit borrowing
// it computes and its full gradient from then until the owner's own
// backward reduces it, f32 sinks for 16-bit gradients (runtime/nn
// UnitGrads), with CPU offload under a 16-bit param_dtype the staged f32
// master shards of gathers not yet waited for, and the parameters the
// model's views hold through PostBackward (all but the input embeddings').
// Each unit's gradient shard exists from its first reduction of a step to
// ZeroGrad. Gradient accumulation walks each kind of micro-batch: sharded,
// the later ones with every shard made; no_sync, the earlier ones keeping
// every full gradient (param_dtype) and the last reducing them one by one.
// A moment's activations are bounded by the model's counts
// (Model::PeakActivationBytes, every saved tensor and backward temporary its
// code allocates; Model::BackwardEndActivationBytes from the first block's
// backward on), and shards and activations together by the larger of the
// two ends of the backward (activations fall while shards grow). Model
// states and flat parameters are rounded to the caching allocator's
// 512-byte blocks. Every buffer is counted alive until the latest point it
// can be freed (a reduction until the next unit waits for it), so the
// estimate is an upper bound: tests hold every strategy's, dtype's,
// prefetch's and offload's measured peak at or below it, and within 10%
// (15% with offload) of it.
#ifndef SHARDKIT_RUNTIME_FSDP_MEMORY_ESTIMATOR_H_
#define SHARDKIT_RUNTIME_FSDP_MEMORY_ESTIMATOR_H_

#include <cstdint>
#include <string>

#include "runtime/fsdp/fsdp.h"
#include "runtime/nn/configs.h"
#include "runtime/optim/optimizer.h"

namespace sk {

struct MemoryEstimateRequest {
  NamedModelConfig model;
  // Sharded as FSDP shards it: ResolveSharding of fsdp.strategy,
  // fsdp.shard_group_size, world_size and fsdp.ranks_per_node (set it as
  // the Trainer does: RanksPerNode in runtime/train/engine.h).
  FsdpOptions fsdp;
  OptimizerOptions optimizer;
  int world_size = 1;
  int64_t batch_size = 1;  // per rank (of one micro-batch)
  // Micro-batches per optimizer step, accumulated as fsdp.grad_accumulation
  // says (ReducesEveryMicroBatch): sharded, every gradient shard exists from
  // the first micro-batch on, so through the later ones' activation peaks;
  // unsharded (no_sync), every unit's full gradient in param_dtype does.
  int grad_accum_steps = 1;
  int64_t seq_len = 0;     // 0 = the model's default
  int64_t source_len = 0;  // encoder-decoder; 0 = default
  // As ModelOptions' two fields (runtime/nn/model.h).
  bool activation_checkpointing = false;
  ActivationCheckpointing checkpointing = ActivationCheckpointing::kNone;
  bool recompute_attention = false;
  // The kind of device the trainer runs on: it decides which attention the
  // model runs, and so what it keeps (Model::PeakActivationBytes). The
  // simulator's is a CPU run's.
  DeviceKind device = DeviceKind::kCpu;
  // The batches pack documents (TokenBatch::segment_ids): adds what one
  // attention call over them allocates beyond the model's counts
  // (Model::PackedAttentionTemporaryBytes: on CUDA, every pair's
  // probabilities where the model runs the linear-memory attention, whose
  // fallback runs packed rows; 0 on the CPU and the simulator).
  bool packed_documents = false;
  // The DDP baseline instead of FSDP (fsdp.strategy is then ignored, and
  // fsdp.mixed_precision.param_dtype is DDP's compute dtype).
  bool ddp = false;
};

struct MemoryEstimate {
  int64_t parameters = 0;         // model parameters (elements)
  int64_t master_bytes = 0;       // f32 master shards (0 on the device with offload)
  int64_t grad_shard_bytes = 0;   // f32 gradient shards alive at the peak (0 with offload)
  int64_t optimizer_bytes = 0;    // optimizer state (0 with offload)
  int64_t persistent_bytes = 0;   // full params/grads kept by NO_SHARD and SHARD_OPTIM
  int64_t unsharded_bytes = 0;    // gathered params and full grads in flight at the peak
  int64_t activation_bytes = 0;   // activations and temporaries at the peak
  int64_t peak_bytes = 0;         // the sum
  // "master 1.2 MiB + grads ... = peak 9.9 MiB".
  std::string ToString() const;
};

// InvalidArgument for invalid options or sizes.
StatusOr<MemoryEstimate> EstimatePeakMemory(const MemoryEstimateRequest& request);

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_FSDP_MEMORY_ESTIMATOR_H_
