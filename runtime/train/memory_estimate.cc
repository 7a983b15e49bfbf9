#include "runtime/train/memory_estimate.h"

#include "runtime/nn/configs.h"
#include "runtime/train/rank.h"

namespace sk {

StatusOr<MemoryEstimate> EstimateTrainerMemory(const TrainerOptions& o, int world_size) {
  SK_RETURN_IF_ERROR(ValidateTrainerOptions(o));
  MemoryEstimateRequest r;
  r.ddp = o.parallelism == Parallelism::kDdp;
  SK_ASSIGN_OR_RETURN(r.model, FindModelConfig(o.model));
  r.fsdp = o.fsdp;
  if (r.fsdp.ranks_per_node == 0) {
    SK_ASSIGN_OR_RETURN(r.fsdp.ranks_per_node, RanksPerNode(o.device));
  }
  r.optimizer = o.optimizer;
  r.world_size = world_size;
  r.batch_size = o.batch_size;
  r.grad_accum_steps = o.parallelism == Parallelism::kFsdp ? o.grad_accum_steps : 1;
  r.seq_len = o.seq_len;
  r.source_len = o.source_len;
  r.activation_checkpointing = o.activation_checkpointing;
  r.checkpointing = o.checkpointing;
  r.recompute_attention = o.recompute_attention;
  r.device = o.device.kind;
  // A packing dataset's rows hold several documents; the caller's own
  // batches do when it says so (TrainerOptions::packed_documents).
  r.packed_documents = o.packed_documents || (!o.dataset.paths.empty() && o.dataset.packing);
  return EstimatePeakMemory(r);
}

}  // namespace sk
