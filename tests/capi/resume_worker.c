/* A rank program for restart_resume_test.sh: trains gpt-tiny over gloo from
 * the launcher's environment, resumes from the newest checkpoint under DIR
 * (sk_trainer_resume_latest), saves a rotating checkpoint every 2 steps
 * (keeping 2), and after STEPS steps writes the full model to DIR/final.safetensors.
 *   resume_worker DIR STEPS [KILL_RANK KILL_STEP]
 * With KILL_RANK/KILL_STEP, rank KILL_RANK kills itself (SIGKILL) right after
 * step KILL_STEP of the first attempt (TORCHELASTIC_RESTART_COUNT 0): the
 * launcher restarts the group, which resumes from the last checkpoint. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    fprintf(stderr, "usage: resume_worker DIR STEPS [KILL_RANK KILL_STEP]\n");
    return 2;
  }
  /* Line-buffered: the launcher stops the surviving ranks when one dies, and
   * a fully buffered pipe would lose the steps they printed before it (the
   * test compares every printed step with the uninterrupted run's). */
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* dir = argv[1];
  const int64_t steps = atoi(argv[2]);
  const int kill_rank = argc == 5 ? atoi(argv[3]) : -1;
  const int64_t kill_step = argc == 5 ? atoi(argv[4]) : -1;
  const char* attempt = getenv("TORCHELASTIC_RESTART_COUNT");
  const char* rank_text = getenv("RANK");
  const int rank = rank_text != NULL ? atoi(rank_text) : 0;

  sk_process_group* group = NULL;
  CHECK(sk_process_group_create_gloo(NULL, &group));
  sk_fsdp_options fsdp = SK_FSDP_OPTIONS_INIT;
  fsdp.strategy = SK_SHARDING_FULL_SHARD;
  fsdp.seed = 1234;
  sk_optimizer_options optimizer = SK_OPTIMIZER_OPTIONS_INIT;
  optimizer.kind = SK_OPTIMIZER_ADAMW;
  optimizer.lr = 0.01f;
  /* A schedule: a resumed run must continue the curve, not restart it. */
  sk_lr_schedule schedule = SK_LR_SCHEDULE_INIT;
  schedule.kind = SK_LR_SCHEDULE_COSINE;
  schedule.warmup_steps = 3;
  schedule.decay_steps = 10;
  schedule.min_lr = 0.001f;
  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = "gpt-tiny";
  options.fsdp = &fsdp;
  options.optimizer = &optimizer;
  options.lr_schedule = &schedule;
  options.batch_size = 2;
  options.data_seed = 7;
  options.data_tokens = 64;
  sk_trainer* trainer = NULL;
  CHECK(sk_trainer_create(&options, group, &trainer));
  sk_process_group_destroy(group); /* the trainer keeps it */

  int64_t step = -1;
  CHECK(sk_trainer_resume_latest(trainer, dir, &step));
  printf("attempt %s: resumed at step %lld\n", attempt != NULL ? attempt : "?", (long long)step);
  while (step < steps) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    CHECK(sk_trainer_step(trainer, &m));
    step = m.step;
    printf("step %lld loss %.6f lr %.6f\n", (long long)step, m.loss, m.lr);
    if (step % 2 == 0) CHECK(sk_trainer_save_checkpoint_rotating(trainer, dir, 2));
    if (rank == kill_rank && step == kill_step && attempt != NULL && strcmp(attempt, "0") == 0) {
      printf("rank %d: killing myself after step %lld\n", rank, (long long)step);
      fflush(stdout);
      raise(SIGKILL);
    }
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/final.safetensors", dir);
  CHECK(sk_trainer_save_state_dict(trainer, path, SK_WEIGHT_LAYOUT_DEFAULT));
  sk_trainer_destroy(trainer);
  return 0;
}
