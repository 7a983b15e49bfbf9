/* A framework's training loop on the low-level engine: the caller owns the
 * model (a 2-layer MLP regression, forward and backward written here) and
 * shardkit shards it (FULL_SHARD) across the ranks of a process group.
 * What a framework needs beyond the hooks, all shown here:
 *   - warmup then cosine decay of the learning rate (sk_engine_set_lr each step);
 *   - a no-decay parameter group for biases (sk_param_group);
 *   - the loss averaged across ranks (sk_process_group_all_reduce, MEAN);
 *   - a sharded checkpoint with the step, resumed at any world size.
 * Usage (one process per rank over gloo from the launcher's environment, or
 * a one-rank local group without it):
 *   framework STEPS [SAVE_AT DIR]   train STEPS steps; after step SAVE_AT save to DIR
 *   framework STEPS resume DIR      load DIR, then train up to step STEPS
 * The global batch is 8 samples, split over the ranks, so every world size
 * trains the same model: rank 0 prints the same losses (within rounding) at
 * 1 rank, at 2 ranks, and resumed at 1 rank from a 2-rank checkpoint. */
#include <math.h>
#include <stdint.h>
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
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

enum { IN = 4, HIDDEN = 8, GLOBAL_BATCH = 8 };
static const float kBaseLr = 0.05f, kMinLr = 0.005f;
static const int kWarmup = 3, kDecay = 12;

/* Warmup then cosine decay (the formula of sk_lr_schedule COSINE). */
static float LrAt(int64_t step) {
  if (step < kWarmup) return kBaseLr * (float)(step + 1) / (float)kWarmup;
  double p = (double)(step - kWarmup) / kDecay;
  if (p > 1) p = 1;
  return (float)(kMinLr + (kBaseLr - kMinLr) * 0.5 * (1 + cos(3.14159265358979323846 * p)));
}

/* Sample i of step s (the same for every world size): x in [-1, 1]^4 and
 * y = sin(x0 + 2 x1) - x2 * x3. */
static void Sample(int64_t s, int i, float x[IN], float* y) {
  for (int k = 0; k < IN; ++k) {
    uint32_t h = (uint32_t)(s * 7919 + i * 104729 + k * 1299709) * 2654435761u;
    x[k] = (float)((h >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  *y = sinf(x[0] + 2 * x[1]) - x[2] * x[3];
}

static void AddParam(sk_model_spec* spec, int unit, const char* name, int ndim, const int64_t* shape,
                     sk_init_kind_t init, float b) {
  sk_param_spec p = SK_PARAM_SPEC_INIT;
  p.name = name;
  p.ndim = ndim;
  p.shape = shape;
  p.init = init;
  p.init_b = b;
  CHECK(sk_model_spec_add_param(spec, unit, &p, NULL));
}

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    fprintf(stderr, "usage: %s STEPS [SAVE_AT DIR | resume DIR]\n", argv[0]);
    return 2;
  }
  const int64_t steps = atoll(argv[1]);
  const int resume = argc == 4 && strcmp(argv[2], "resume") == 0;
  const int64_t save_at = argc == 4 && !resume ? atoll(argv[2]) : -1;
  const char* dir = argc == 4 ? argv[3] : NULL;

  sk_process_group* group = NULL;
  if (getenv("WORLD_SIZE") != NULL) {
    CHECK(sk_process_group_create_gloo(NULL, &group));
  } else {
    CHECK(sk_process_group_create_local(1, NULL, &group));
  }
  int32_t rank = 0, world = 1;
  CHECK(sk_process_group_rank(group, &rank));
  CHECK(sk_process_group_size(group, &world));
  if (GLOBAL_BATCH % world != 0) {
    fprintf(stderr, "the world size must divide %d\n", GLOBAL_BATCH);
    return 2;
  }
  const int local_batch = GLOBAL_BATCH / world;

  /* fc1: w [4, 8], b [8]; fc2: w [8, 1], b [1]. */
  sk_model_spec* spec = NULL;
  CHECK(sk_model_spec_create(&spec));
  int32_t fc1 = 0, fc2 = 0;
  const int64_t w1_shape[2] = {IN, HIDDEN}, b1_shape[1] = {HIDDEN}, w2_shape[2] = {HIDDEN, 1}, b2_shape[1] = {1};
  CHECK(sk_model_spec_add_unit(spec, "fc1", &fc1));
  AddParam(spec, fc1, "w", 2, w1_shape, SK_INIT_NORMAL, 0.5f);
  AddParam(spec, fc1, "b", 1, b1_shape, SK_INIT_ZEROS, 0.0f);
  CHECK(sk_model_spec_add_unit(spec, "fc2", &fc2));
  AddParam(spec, fc2, "w", 2, w2_shape, SK_INIT_NORMAL, 0.35f);
  AddParam(spec, fc2, "b", 1, b2_shape, SK_INIT_ZEROS, 0.0f);

  sk_param_group no_decay = SK_PARAM_GROUP_INIT;
  no_decay.norms_biases_embeddings = 1; /* the biases: weight decay 0 */
  sk_optimizer_options adamw = SK_OPTIMIZER_OPTIONS_INIT;
  adamw.kind = SK_OPTIMIZER_ADAMW;
  adamw.weight_decay = 0.1f;
  adamw.param_groups = &no_decay;
  adamw.num_param_groups = 1;
  sk_fsdp_options fsdp = SK_FSDP_OPTIONS_INIT;
  fsdp.strategy = SK_SHARDING_FULL_SHARD;
  fsdp.seed = 42;
  sk_engine_options options = SK_ENGINE_OPTIONS_INIT;
  options.fsdp = &fsdp;
  options.optimizer = &adamw;
  sk_engine* e = NULL;
  CHECK(sk_engine_create(spec, group, &options, &e));
  sk_model_spec_destroy(spec);

  int64_t step = 0;
  if (resume) {
    CHECK(sk_engine_load_checkpoint(e, dir, &step));
    if (rank == 0) printf("resumed at step %lld from %s\n", (long long)step, dir);
  }

  for (; step < steps; ++step) {
    CHECK(sk_engine_set_lr(e, LrAt(step)));
    CHECK(sk_engine_zero_grad(e));
    float x[GLOBAL_BATCH][IN], y[GLOBAL_BATCH], h[GLOBAL_BATCH][HIDDEN], out[GLOBAL_BATCH];
    for (int i = 0; i < local_batch; ++i) Sample(step, rank * local_batch + i, x[i], &y[i]);

    /* Forward: h = tanh(x w1 + b1), out = h w2 + b2. */
    sk_tensor_view w = SK_TENSOR_VIEW_INIT, b = SK_TENSOR_VIEW_INIT;
    CHECK(sk_engine_pre_forward(e, fc1));
    CHECK(sk_engine_param(e, fc1, 0, &w));
    CHECK(sk_engine_param(e, fc1, 1, &b));
    for (int i = 0; i < local_batch; ++i) {
      for (int j = 0; j < HIDDEN; ++j) {
        float a = ((const float*)b.data)[j];
        for (int k = 0; k < IN; ++k) a += x[i][k] * ((const float*)w.data)[k * HIDDEN + j];
        h[i][j] = tanhf(a);
      }
    }
    CHECK(sk_engine_post_forward(e, fc1));
    CHECK(sk_engine_pre_forward(e, fc2));
    CHECK(sk_engine_param(e, fc2, 0, &w));
    CHECK(sk_engine_param(e, fc2, 1, &b));
    float loss = 0;
    for (int i = 0; i < local_batch; ++i) {
      out[i] = ((const float*)b.data)[0];
      for (int j = 0; j < HIDDEN; ++j) out[i] += h[i][j] * ((const float*)w.data)[j];
      loss += (out[i] - y[i]) * (out[i] - y[i]) / (float)local_batch;
    }
    CHECK(sk_engine_post_forward(e, fc2));

    /* Backward of this rank's mean squared error; FSDP averages over ranks. */
    float dout[GLOBAL_BATCH], dh[GLOBAL_BATCH][HIDDEN];
    for (int i = 0; i < local_batch; ++i) dout[i] = 2 * (out[i] - y[i]) / (float)local_batch;
    sk_tensor_view gw = SK_TENSOR_VIEW_INIT, gb = SK_TENSOR_VIEW_INIT;
    CHECK(sk_engine_pre_backward(e, fc2));
    CHECK(sk_engine_param(e, fc2, 0, &w));
    CHECK(sk_engine_grad(e, fc2, 0, &gw));
    CHECK(sk_engine_grad(e, fc2, 1, &gb));
    for (int i = 0; i < local_batch; ++i) {
      ((float*)gb.data)[0] += dout[i]; /* gradients are ADDED into the views */
      for (int j = 0; j < HIDDEN; ++j) {
        ((float*)gw.data)[j] += h[i][j] * dout[i];
        dh[i][j] = dout[i] * ((const float*)w.data)[j] * (1 - h[i][j] * h[i][j]);
      }
    }
    CHECK(sk_engine_post_backward(e, fc2));
    CHECK(sk_engine_pre_backward(e, fc1));
    CHECK(sk_engine_grad(e, fc1, 0, &gw));
    CHECK(sk_engine_grad(e, fc1, 1, &gb));
    for (int i = 0; i < local_batch; ++i) {
      for (int j = 0; j < HIDDEN; ++j) {
        ((float*)gb.data)[j] += dh[i][j];
        for (int k = 0; k < IN; ++k) ((float*)gw.data)[k * HIDDEN + j] += x[i][k] * dh[i][j];
      }
    }
    CHECK(sk_engine_post_backward(e, fc1));
    CHECK(sk_engine_finish_backward(e));
    CHECK(sk_engine_optimizer_step(e));

    /* The loss of the global batch: the mean of the ranks' (equal) batches. */
    CHECK(sk_process_group_all_reduce(group, &loss, 1, SK_DTYPE_F32, SK_REDUCE_MEAN));
    if (rank == 0) printf("step %lld lr %.6f loss %.6f\n", (long long)step + 1, LrAt(step), loss);
    if (step + 1 == save_at) {
      CHECK(sk_engine_save_checkpoint(e, dir));
      if (rank == 0) printf("saved step %lld to %s\n", (long long)save_at, dir);
    }
  }
  sk_engine_destroy(e);
  sk_process_group_destroy(group);
  return 0;
}
