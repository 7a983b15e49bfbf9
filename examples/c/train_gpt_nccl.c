/* examples/c/train_gpt_gloo.c on GPUs: one process per GPU, the process
 * group over NCCL from the launcher's environment (RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT); each rank trains on cuda:LOCAL_RANK
 * (the trainer's device defaults to the group's GPU). Needs a library built
 * with --config=cuda. On 8 GPUs of one machine:
 *   launch --nproc_per_node=8 --master_port=0 bazel-bin/examples/c/train_gpt_nccl
 * On two machines of 8 GPUs (run on each, node_rank 0 and 1):
 *   launch --nnodes=2 --node_rank=N --nproc_per_node=8 --master_addr=HOST0 \
 *       --master_port=29500 bazel-bin/examples/c/train_gpt_nccl
 * (docs/multi_gpu.md). It prints the global batch's loss, the same on every
 * rank, and bf16 mixed precision with f32 gradient reduction. */
#include <stdio.h>

#include "shardkit/shardkit.h"

#define CHECK(call)                                                                 \
  do {                                                                              \
    sk_status_t st_ = (call);                                                       \
    if (st_ != SK_STATUS_OK) {                                                      \
      fprintf(stderr, "%s failed: %s: %s\n", #call, sk_status_name(st_),            \
              sk_last_error_message());                                             \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

int main(void) {
  sk_process_group* group = NULL;
  CHECK(sk_process_group_create_nccl(NULL, &group));
  int32_t rank = 0, world = 0;
  CHECK(sk_process_group_rank(group, &rank));
  CHECK(sk_process_group_size(group, &world));

  sk_fsdp_options fsdp = SK_FSDP_OPTIONS_INIT;
  fsdp.strategy = SK_SHARDING_FULL_SHARD;
  fsdp.param_dtype = SK_DTYPE_BF16;
  fsdp.reduce_dtype = SK_DTYPE_F32;
  fsdp.seed = 1234;
  sk_optimizer_options optimizer = SK_OPTIMIZER_OPTIONS_INIT;
  optimizer.kind = SK_OPTIMIZER_ADAMW;
  optimizer.lr = 0.01f;
  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = "gpt-tiny";
  options.fsdp = &fsdp;
  options.optimizer = &optimizer;
  options.batch_size = 2;
  options.data_seed = 7;
  options.data_tokens = 64; /* a short stream repeats: the loss falls */

  sk_trainer* trainer = NULL;
  CHECK(sk_trainer_create(&options, group, &trainer)); /* on the group's GPU */
  sk_process_group_destroy(group); /* the trainer keeps it */
  for (int step = 1; step <= 8; ++step) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    CHECK(sk_trainer_step(trainer, &m));
    if (rank == 0) printf("step %d global loss %.4f (%d ranks)\n", step, m.global_loss, world);
  }
  sk_trainer_destroy(trainer);
  return 0;
}
