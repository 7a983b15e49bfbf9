/* examples/c/train_gpt.c with one process per rank: the process group comes
 * from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT) over gloo. Run it with the launcher:
 *   bazel run //tools:launch -- --nproc_per_node=2 --master_port=0 \
 *       bazel-bin/examples/c/train_gpt_gloo
 * Each rank prints its own losses; rank 0's equal train_gpt's bit for bit
 * (gloo reduces in the same rank order as the local backend). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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
  CHECK(sk_process_group_create_gloo(NULL, &group));

  sk_fsdp_options fsdp = SK_FSDP_OPTIONS_INIT;
  fsdp.strategy = SK_SHARDING_FULL_SHARD;
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
  options.data_tokens = 64;

  sk_trainer* trainer = NULL;
  CHECK(sk_trainer_create(&options, group, &trainer));
  sk_process_group_destroy(group); /* the trainer keeps it */
  for (int step = 1; step <= 8; ++step) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    CHECK(sk_trainer_step(trainer, &m));
    uint32_t bits;
    memcpy(&bits, &m.loss, sizeof(bits));
    printf("step %d loss %.6f bits 0x%08" PRIx32 "\n", step, m.loss, bits);
  }
  sk_trainer_destroy(trainer);
  return 0;
}
