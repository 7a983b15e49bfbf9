// DistributedDataParallel: the DDP baseline of the FSDP paper around any
// model that drives UnitHooks (runtime/nn/model.h).
//
// Every rank holds a full f32 replica of every parameter, its full gradient
// and (through the optimizer) full optimizer state: 16 bytes per parameter
// with Adam, the memory FSDP is measured against. Parameters come from the
// counter-based initialiser (init.h), so ranks with the same seed start
// identical, bit for bit equal to OwnedParameters, without a broadcast.
//
// Buckets. Parameters are packed into buckets of about `bucket_bytes` (25 MiB
// by default, as torch.nn.parallel.DistributedDataParallel's bucket_cap_mb)
// in REVERSE unit order, and in reverse parameter order within a unit, i.e.
// in the order their gradients become final during backward. A bucket closes
// once it holds at least its cap, so a parameter larger than that gets a
// bucket of its own; each parameter lies in exactly one bucket, a unit may
// span several. The first bucket's cap is min(first_bucket_bytes,
// bucket_bytes) (1 MiB by default, torch's _DEFAULT_FIRST_BUCKET_BYTES) so
// that communication starts early in backward. Each bucket is one contiguous f32 parameter buffer and one
// f32 gradient buffer with the same layout (every parameter aligned to 16
// bytes, padding zero). The gradient tensors handed to the model are views
// into the gradient buffer (torch's gradient_as_bucket_view), so the
// reduction needs no copy in or out, and the optimizer steps one bucket as
// one slot (slot = bucket index).
//
// Overlap. When the last unit of a bucket passes PostBackward (all of the
// bucket's gradients are final) and gradient sync is on, the bucket's
// all-reduce is enqueued on this rank's "reduce" stream and PostBackward
// returns at once: the model goes on computing earlier units' gradients on
// the calling thread (the "compute" stream, whose allocator is
// activation_allocator()) while the reduction runs. Every rank issues its
// buckets in the same order, so collectives match across ranks.
// FinishBackward waits for all of them. A bucket's gradients are not touched
// again before its reduction has completed: PreBackward of a unit whose
// bucket is still being reduced (a second backward without FinishBackward)
// waits for that reduction first.
//
// Data goes through the op layer (runtime/ops) on the compute stream's
// context: Fill and InitPhilox at creation, Cast into the compute-dtype copies,
// Fill to zero gradients, SumOfSquares/MaxAbs and Scale for clipping and the
// optimizer's fused updates; the averaging is the all-reduce's pre/post scale.
//
// Averaging. The all-reduce pre-divides by p and post-divides by N/p, with p
// chosen as PyTorch FSDP chooses its gradient_predivide_factor (the largest
// power of two with N % p == 0 and N / p > p), so DDP and FSDP average the
// same way and low-precision sums cannot overflow. Gradients accumulate:
// with sync off (no_sync) a backward only adds locally, and the next synced
// backward averages the accumulated total.
//
// Tied parameters (UnitSpec::tied) live in their owner's bucket only; the
// using unit gets views of the owner's parameter and gradient, so both uses
// add into one gradient, reduced once when the owner's bucket is final.
//
// Mixed precision. With compute_dtype bf16 each bucket also keeps a bf16
// copy of its parameters, made at creation and after every optimizer step,
// which the model computes with; gradients, the master parameters and
// optimizer state stay f32 (as OwnedParameters does).
//
// Errors. Hook calls out of order are FailedPrecondition naming the unit and
// its state. A failing collective fails the call that waited for it
// (FinishBackward, or anything that calls it); the step is then abandoned:
// every unit returns to idle and gradients are zeroed. Parameters and
// optimizer state change only in OptimizerStep, so nothing is lost.
//
// Thread safety: one DistributedDataParallel per rank, used by one thread.
#ifndef SHARDKIT_RUNTIME_DDP_DDP_H_
#define SHARDKIT_RUNTIME_DDP_DDP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/core/status.h"
#include "runtime/core/tensor.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/memory/caching_allocator.h"
#include "runtime/nn/model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/ops/backend.h"

namespace sk {

// torch DDP's default bucket_cap_mb and its first, smaller bucket.
inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;
inline constexpr int64_t kDefaultFirstBucketBytes = int64_t{1} << 20;

struct DdpOptions {
  // Target bytes of f32 gradients per bucket (> 0).
  int64_t bucket_bytes = kDefaultBucketBytes;
  // Target bytes of the first bucket (> 0); capped at bucket_bytes.
  int64_t first_bucket_bytes = kDefaultFirstBucketBytes;
  // What the model computes in: f32, or bf16 (f32 master and gradients).
  DType compute_dtype = DType::kF32;
  // 0 = automatic (see "Averaging" above); otherwise > 0.
  float gradient_predivide_factor = 0.f;
  // Seed of the counter-based initialiser.
  uint64_t seed = 0;
  // Timeout of every collective and wait.
  Duration timeout = kDefaultTimeout;
};

// InvalidArgument naming the field.
Status ValidateDdpOptions(const DdpOptions& options);

// Counters of one rank since creation (or ResetCounters).
struct DdpCounters {
  int64_t all_reduces = 0;
  int64_t all_reduce_bytes = 0;  // nccl-tests bytes (the all_reduce buffer)
  // Buckets whose gradients became final in a backward (reduced, or kept
  // local under no_sync).
  int64_t buckets_ready = 0;
  // All-reduces enqueued while some unit had not yet finished its backward
  // (still awaiting PreBackward or PostBackward): the overlap DDP exists for.
  int64_t all_reduces_overlapping_backward = 0;
};

// Where one bucket lies (for tests and reports).
struct DdpBucketInfo {
  int64_t numel = 0;        // elements including alignment padding
  int num_params = 0;
  int lowest_unit = 0;      // the bucket is ready after this unit's PostBackward
  int highest_unit = 0;
};

class DistributedDataParallel final : public DataParallelModel {
 public:
  // Wraps `units` (the model's) for this rank of `world`. Every rank calls it
  // with the same units and options; no collective is made. Parameter and
  // gradient memory come from `allocator` (on its device's "compute" stream,
  // as activations do). `world` and `allocator` must outlive the object.
  // InvalidArgument for null arguments, bad options, no units, an empty or
  // duplicated parameter name, an invalid initializer.
  static StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      const std::vector<UnitSpec>& units, comm::ProcessGroup* world, CachingAllocator* allocator,
      const DdpOptions& options);
  // Waits (up to the timeout) for reductions still in flight.
  ~DistributedDataParallel() override;

  // UnitHooks, driven by Model::ForwardBackward / Forward. The model's ops
  // run on DDP's compute stream (on cpu: still the calling thread).
  Stream* compute_stream() override { return compute_stream_.get(); }
  StatusOr<std::vector<Tensor>> PreForward(int unit) override;
  Status PostForward(int unit) override;
  StatusOr<UnitBackwardBuffers> PreBackward(int unit) override;
  Status PostBackward(int unit) override;

  // DataParallelModel.
  Allocator& activation_allocator() override { return *compute_allocator_; }
  void set_gradient_sync(bool enabled) override { gradient_sync_ = enabled; }
  bool gradient_sync() const override { return gradient_sync_; }
  // FailedPrecondition if a unit is mid-forward or mid-backward, or a bucket
  // is partly final (some but not all of its units passed PostBackward).
  Status FinishBackward() override;
  // Gradients are replicated, so the local norm is the global one: no
  // collective. Calls FinishBackward first.
  StatusOr<double> ClipGradNorm(double max_norm, NormType type = NormType::kL2) override;
  Status ScaleGradients(float factor) override;
  // Steps every bucket (slot = bucket index), then refreshes the bf16 copies.
  Status OptimizerStep(Optimizer& optimizer) override;
  Status PrepareOptimizer(Optimizer& optimizer) override;
  void ZeroGrad() override;
  void AbandonStep() override { Fail(OkStatus()).IgnoreError(); }

  const DdpOptions& options() const { return options_; }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int num_units() const { return static_cast<int>(units_.size()); }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  DdpBucketInfo bucket_info(int bucket) const;
  // The bucket holding parameter `param` of `unit`; CHECKs the indices.
  int bucket_of(int unit, int param) const { return where_.at(unit).at(param).bucket; }
  // Views of the f32 master parameter / gradient of (unit, param); CHECKs
  // the indices. On a GPU they are written asynchronously (initialisation,
  // reductions, the optimizer on DDP's streams): call Synchronize() before
  // reading them from the host or another stream.
  Tensor param(int unit, int param) const;
  Tensor grad(int unit, int param) const;
  // Waits until everything DDP has enqueued on its compute and reduce
  // streams has run (DeadlineExceeded after `timeout`).
  Status Synchronize(Duration timeout) const;
  const DdpCounters& counters() const { return counters_; }
  int64_t bytes_communicated() const override { return counters_.all_reduce_bytes; }
  void ResetCounters() { counters_ = DdpCounters(); }

 private:

  struct Location {
    int bucket = 0;
    int64_t offset = 0;  // elements into the bucket
  };
  struct Bucket {
    int64_t numel = 0;
    std::vector<int> units;  // distinct, descending
    int num_params = 0;
    Tensor params;   // f32 [numel], master
    Tensor grads;    // f32 [numel]
    Tensor compute;  // compute_dtype copy of params when it is not f32
    int units_pending = 0;  // units not yet past PostBackward in this backward
    std::shared_ptr<comm::Work> reduction;  // in flight
  };

  DistributedDataParallel(std::vector<UnitSpec> units, comm::ProcessGroup* world,
                          CachingAllocator* allocator, const DdpOptions& options);
  Status Init();
  Status CheckUnit(int unit, const char* call) const;
  Status Expect(int unit, UnitState want, const char* call) const;
  StatusOr<std::vector<Tensor>> ParamViews(int unit) const;
  Status RefreshComputeCopies();
  Status IssueAllReduce(int bucket);
  // Waits for the bucket's reduction, if any; on failure returns it with the
  // bucket named (the caller abandons the step).
  Status WaitReduction(int bucket);
  Status WaitAllReductions();
  Status Fail(Status s);  // abandons the step, returns s

  std::vector<UnitSpec> units_;
  comm::ProcessGroup* world_;
  CachingAllocator* allocator_;
  DdpOptions options_;
  std::unique_ptr<Stream> reduce_stream_, compute_stream_;
  std::unique_ptr<StreamAllocator> compute_allocator_;
  ops::OpContext ctx_;  // the compute stream's (set by Init)
  std::vector<Bucket> buckets_;
  std::vector<std::vector<Location>> where_;  // [unit][param]
  std::vector<std::vector<ParamRef>> tied_;   // [unit]: owners of its tied parameters
  std::vector<UnitState> state_;
  bool gradient_sync_ = true;
  float pre_scale_ = 1.f, post_scale_ = 1.f;
  DdpCounters counters_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_DDP_DDP_H_
