/* Trains gpt-tiny with FULL_SHARD on 2 local ranks through the high-level C
 * API. The same settings in every frontend print the same losses, bit for bit
 * (tests/frontends/same_losses_test.sh compares them). */
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
  options.data_tokens = 64; /* a short stream repeats: the model can learn it */

  sk_local_session* session = NULL;
  CHECK(sk_local_session_create(&options, 2, NULL, &session));
  for (int step = 1; step <= 8; ++step) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    CHECK(sk_local_session_step(session, &m));
    uint32_t bits;
    memcpy(&bits, &m.loss, sizeof(bits));
    printf("step %d loss %.6f bits 0x%08" PRIx32 "\n", step, m.loss, bits);
  }
  sk_local_session_destroy(session);
  return 0;
}
