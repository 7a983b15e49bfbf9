/* A fine-tune at the size people run, in the memory the estimate promises
 * (issue 43 item 5: "a 1.2B Llama fine-tunes at world 2 on a 24 GiB machine
 * when the estimator says it fits"). The flow of examples/c/finetune.c --
 * import a Hugging Face directory with skip_init, evaluate, train on a
 * masked JSONL, evaluate, export a directory -- driven through the C ABI as a
 * user would, one process per rank over gloo:
 *
 *   ./bazelw build -c opt //benchmarks/micro:finetune_memory //tools:launch
 *   bazel-bin/tools/launch --nproc_per_node=2 --master_port=0 \
 *       bazel-bin/benchmarks/micro/finetune_memory MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR \
 *       [STEPS [BATCH [SEQ [adamw|sgd]]]]
 *
 * (defaults 4 steps, 2 rows of 16 tokens per rank, AdamW; sgd is SGD with
 * momentum 0.9, one f32 state per parameter instead of two). FT_CAP_GIB sets
 * sk_trainer_options.memory_cap_bytes, the per-rank allocator cap.
 * Before creating anything, rank 0 prints sk_estimate_memory's peak for one
 * rank beside what a rank may use: the cap, which must fit in an equal share
 * of MemAvailable less 0.75 GiB for the process itself, or without a cap
 * that share, which every rank then sets as its cap. It stops (exit 3) when the estimate does not fit, unless
 * FT_FORCE is set (to check a "does not fit" against a run). Every rank then
 * prints its own peak RSS (VmHWM) and RSS after each phase, so the record
 * shows the estimate beside what each process held. Memory figures are the
 * processes' own (/proc/self/status); the machine's total at a moment is
 * their sum plus the page cache the kernel may drop. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent. */
static int64_t proc_kib(const char* file, const char* key) {
  FILE* f = fopen(file, "r");
  if (f == NULL) return -1;
  char line[256];
  int64_t value = -1;
  size_t n = strlen(key);
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, key, n) == 0) {
      value = strtoll(line + n, NULL, 10) * 1024;
      break;
    }
  }
  fclose(f);
  return value;
}

static double gib(int64_t bytes) { return (double)bytes / (double)(1LL << 30); }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double t_start;

static void report(int rank, const char* phase) {
  printf("rank %d %-14s peak RSS %6.2f GiB  RSS %6.2f GiB  at %7.1f s\n", rank, phase,
         gib(proc_kib("/proc/self/status", "VmHWM:")), gib(proc_kib("/proc/self/status", "VmRSS:")),
         now_s() - t_start);
  fflush(stdout);
}

static int positive_arg(const char* text, const char* what, int64_t max, int64_t* out) {
  char* end = NULL;
  long long v = strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 1 || v > max) {
    fprintf(stderr, "%s must be an integer in [1, %" PRId64 "], got '%s'\n", what, max, text);
    return 0;
  }
  *out = v;
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 5 || argc > 9) {
    fprintf(stderr,
            "usage: %s MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR [STEPS [BATCH [SEQ [adamw|sgd]]]]\n",
            argv[0]);
    return 2;
  }
  int64_t steps = 4, batch = 2, seq = 16;
  if (argc > 5 && !positive_arg(argv[5], "STEPS", 100000, &steps)) return 2;
  if (argc > 6 && !positive_arg(argv[6], "BATCH", 4096, &batch)) return 2;
  if (argc > 7 && !positive_arg(argv[7], "SEQ", 1 << 20, &seq)) return 2;
  const int sgd = argc > 8 && strcmp(argv[8], "sgd") == 0;
  if (argc > 8 && !sgd && strcmp(argv[8], "adamw") != 0) {
    fprintf(stderr, "the optimizer is adamw or sgd, got '%s'\n", argv[8]);
    return 2;
  }
  t_start = now_s();
  const char* model_dir = argv[1];
  const char* train[] = {argv[2]};
  const char* held_out[] = {argv[3]};
  char out_dir[4096];
  size_t n = strlen(argv[4]);
  if (n == 0 || n + 2 > sizeof(out_dir)) {
    fprintf(stderr, "OUT_DIR must be a path of 1 to %zu bytes\n", sizeof(out_dir) - 2);
    return 2;
  }
  snprintf(out_dir, sizeof(out_dir), "%s%s", argv[4], argv[4][n - 1] == '/' ? "" : "/");

  sk_dataset_options data = SK_DATASET_OPTIONS_INIT;
  data.paths = train;
  data.num_paths = 1;
  data.format = SK_DATASET_FORMAT_JSONL;
  data.sequential = 1;
  data.eval_paths = held_out;
  data.num_eval_paths = 1;
  sk_optimizer_options optimizer = SK_OPTIMIZER_OPTIONS_INIT;
  /* AdamW keeps two f32 moments per parameter; SGD with momentum one. */
  optimizer.kind = sgd ? SK_OPTIMIZER_SGD : SK_OPTIMIZER_ADAMW;
  optimizer.lr = sgd ? 1e-3f : 1e-5f;
  optimizer.momentum = sgd ? 0.9f : 0.0f;
  optimizer.weight_decay = sgd ? 0.0f : 0.01f;
  sk_trainer_options options = SK_TRAINER_OPTIONS_INIT;
  options.model = model_dir;
  options.optimizer = &optimizer;
  options.batch_size = batch;
  options.seq_len = seq;
  options.clip_grad_norm = 1.0;
  options.dataset = &data;
  options.skip_init = 1;
  /* FT_CAP_GIB: the per-rank allocator cap (sk_trainer_options.memory_cap_bytes): cached
   * blocks are returned to the system before the process's reserve passes it. */
  const char* cap_env = getenv("FT_CAP_GIB");
  if (cap_env != NULL) {
    char* end = NULL;
    double cap = strtod(cap_env, &end);
    if (end == cap_env || *end != '\0' || !(cap > 0 && cap < 1e6)) {
      fprintf(stderr, "FT_CAP_GIB must be a number of GiB in (0, 1e6), got '%s'\n", cap_env);
      return 2;
    }
    options.memory_cap_bytes = (uint64_t)(cap * (double)(1LL << 30));
  }

  /* WORLD_SIZE and LOCAL_WORLD_SIZE as the launcher sets them. */
  const char* world_env = getenv("WORLD_SIZE");
  const char* local_env = getenv("LOCAL_WORLD_SIZE");
  const char* rank_env = getenv("RANK");
  int64_t world = 1, local = 1;
  if (world_env != NULL && !positive_arg(world_env, "WORLD_SIZE", 1 << 20, &world)) return 2;
  if (local_env != NULL && !positive_arg(local_env, "LOCAL_WORLD_SIZE", 1 << 20, &local)) return 2;
  /* What each rank may use: the cap when one is set, else an equal part of
   * the memory available now, which then becomes the cap (without one the
   * caching allocator keeps freed blocks and a process grows past its
   * allocations: an uncapped run the estimate called a fit was killed).
   * Either way each process also needs itself (code, gloo's buffers:
   * kProcessBytes, measured 0.63 GiB above the allocator's cap at this size). */
  const int64_t kProcessBytes = 3LL << 28; /* 0.75 GiB */
  const int64_t available = proc_kib("/proc/meminfo", "MemAvailable:");
  const int64_t share = available / local - kProcessBytes;
  const int capped = options.memory_cap_bytes > 0;
  if (!capped && share > 0) options.memory_cap_bytes = (uint64_t)share;
  if (rank_env == NULL || strcmp(rank_env, "0") == 0) {
    sk_memory_estimate e = SK_MEMORY_ESTIMATE_INIT;
    CHECK(sk_estimate_memory(&options, (int32_t)world, &e));
    const int64_t budget = capped ? (int64_t)options.memory_cap_bytes : share;
    const int fits = e.peak_bytes <= budget && budget <= share;
    printf("estimate: %" PRId64 " parameters; one rank's peak %.2f GiB (master %.2f, gradient shards %.2f, "
           "optimizer %.2f, unsharded %.2f, activations %.2f); per rank %.2f GiB %s; MemAvailable %.2f GiB "
           "over %" PRId64 " local ranks leaves %.2f GiB each after 0.75 GiB for the process: %s\n",
           e.parameters, gib(e.peak_bytes), gib(e.master_bytes), gib(e.grad_shard_bytes),
           gib(e.optimizer_bytes), gib(e.unsharded_bytes), gib(e.activation_bytes), gib(budget),
           capped ? "(the cap)" : "(no cap given: an equal share, set as the cap)", gib(available), local,
           gib(share), fits ? "fits" : "does not fit");
    fflush(stdout);
    if (!fits && getenv("FT_FORCE") == NULL) return 3;
  }

  sk_process_group* group = NULL;
  CHECK(sk_process_group_create_gloo(NULL, &group));
  int32_t rank = 0;
  CHECK(sk_process_group_rank(group, &rank));
  sk_trainer* trainer = NULL;
  CHECK(sk_trainer_create(&options, group, &trainer));
  sk_process_group_destroy(group);
  report(rank, "created");
  CHECK(sk_trainer_load_state_dict(trainer, model_dir, SK_WEIGHT_LAYOUT_HF_LLAMA, NULL));
  report(rank, "imported");
  float loss = 0;
  CHECK(sk_trainer_evaluate(trainer, 1000, &loss));
  if (rank == 0) printf("eval before loss %.9g\n", loss);
  report(rank, "evaluated");
  for (int64_t step = 1; step <= steps; ++step) {
    sk_step_metrics m = SK_STEP_METRICS_INIT;
    CHECK(sk_trainer_step(trainer, &m));
    if (rank == 0) printf("step %" PRId64 " loss %.9g\n", step, m.global_loss);
    char phase[32];
    snprintf(phase, sizeof(phase), "step %" PRId64, step);
    report(rank, phase);
  }
  CHECK(sk_trainer_evaluate(trainer, 1000, &loss));
  if (rank == 0) printf("eval after loss %.9g\n", loss);
  CHECK(sk_trainer_save_state_dict(trainer, out_dir, SK_WEIGHT_LAYOUT_HF_LLAMA));
  report(rank, "exported");
  sk_trainer_destroy(trainer);
  return 0;
}
