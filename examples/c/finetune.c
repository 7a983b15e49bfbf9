/* Supervised fine-tuning of a Hugging Face model (docs/finetune.md): import a
 * transformers directory, train on a JSONL of token ids whose prompt tokens
 * are masked (labels -100), evaluate on a held-out JSONL, and export a
 * directory transformers loads. One process per rank over gloo:
 *   bazel run //tools:launch -- --nproc_per_node=2 --master_port=0 \
 *       bazel-bin/examples/c/finetune MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR
 * (torchrun, Slurm and mpirun work too: docs/launch.md). Rank 0 prints each
 * step's global loss and the eval losses; the same settings in every
 * frontend print the same lines, bit for bit
 * (tests/frontends/finetune_test.sh), and they match transformers +
 * torch.optim.AdamW on examples/data/finetune. */
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

static void print_loss(const char* what, int step, float loss) {
  uint32_t bits;
  memcpy(&bits, &loss, sizeof(bits));
  if (step > 0) {
    printf("%s %d loss %.9g bits 0x%08" PRIx32 "\n", what, step, loss, bits);
  } else {
    printf("%s loss %.9g bits 0x%08" PRIx32 "\n", what, loss, bits);
  }
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR\n", argv[0]);
    return 2;
  }
  const char* model_dir = argv[1];
  const char* train[] = {argv[2]};
  const char* held_out[] = {argv[3]};
  /* A path ending in '/' (or an existing directory) is written as a directory. */
  char out_dir[4096];
  size_t n = strlen(argv[4]);
  if (n == 0 || n + 2 > sizeof(out_dir)) {
    fprintf(stderr, "OUT_DIR must be a path of 1 to %zu bytes\n", sizeof(out_dir) - 2);
    return 2;
  }
  snprintf(out_dir, sizeof(out_dir), "%s%s", argv[4], argv[4][n - 1] == '/' ? "" : "/");

  sk_process_group* group = NULL;
  CHECK(sk_process_group_create_gloo(NULL, &group)); /* RANK, WORLD_SIZE, ... */
  int32_t rank = 0;
  CHECK(sk_process_group_rank(group, &rank));

  sk_dataset_options data = SK_DATASET_OPTIONS_INIT;
  data.paths = train;
  data.num_paths = 1;
  data.format = SK_DATASET_FORMAT_JSONL; /* input_ids + labels (-100 = not trained) */
  data.sequential = 1;                   /* file order (set 0 and a seed to shuffle) */
  data.eval_paths = held_out;
  data.num_eval_paths = 1;

  sk_optimizer_options optimizer = SK_OPTIMIZER_OPTIONS_INIT;
  optimizer.kind = SK_OPTIMIZER_ADAMW;
  optimizer.lr = 5e-3f;
  optimizer.beta1 = 0.9f;
  optimizer.beta2 = 0.999f;
  optimizer.eps = 1e-8f;
  optimizer.weight_decay = 0.01f;
  sk_lr_schedule schedule = SK_LR_SCHEDULE_INIT;
  schedule.kind = SK_LR_SCHEDULE_COSINE;
  schedule.warmup_steps = 2;
  schedule.decay_steps = 6;
  schedule.min_lr = 5e-4f;

  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = model_dir; /* its config.json gives the shape */
  options.optimizer = &optimizer;
  options.lr_schedule = &schedule;
  options.batch_size = 2; /* rows per rank per step */
  options.seq_len = 16;
  options.clip_grad_norm = 1.0;
  options.dataset = &data;
  options.skip_init = 1; /* no random weights: the load below brings them */

  sk_trainer* trainer = NULL;
  CHECK(sk_trainer_create(&options, group, &trainer));
  sk_process_group_destroy(group); /* the trainer keeps it */
  CHECK(sk_trainer_load_state_dict(trainer, model_dir, SK_WEIGHT_LAYOUT_HF_LLAMA, NULL));

  float eval_loss = 0;
  CHECK(sk_trainer_evaluate(trainer, 1000, &eval_loss)); /* one pass over the eval file */
  if (rank == 0) print_loss("eval before", 0, eval_loss);
  for (int step = 1; step <= 8; ++step) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    CHECK(sk_trainer_step(trainer, &m));
    if (rank == 0) print_loss("step", step, m.global_loss);
  }
  CHECK(sk_trainer_evaluate(trainer, 1000, &eval_loss));
  if (rank == 0) print_loss("eval after", 0, eval_loss);
  CHECK(sk_trainer_save_state_dict(trainer, out_dir, SK_WEIGHT_LAYOUT_HF_LLAMA)); /* a directory */
  sk_trainer_destroy(trainer);
  return 0;
}
