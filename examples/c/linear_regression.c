/* The low-level C API: the caller computes a linear regression itself on
 * parameters the FSDP engine gathers, and adds its gradients into the
 * engine's buffers. Every frontend runs the same arithmetic (in double,
 * gradients rounded to f32 once) and prints the same losses, bit for bit. */
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

enum { kFeatures = 4, kBatch = 8, kSteps = 20 };

/* Row i of step `step`'s batch: features in [-1, 1.2] and the target of
 * y = 0.5 x0 - x1 + 2 x2 + 0.25 x3 + 0.3. */
static double feature(int step, int i, int j) { return ((step * 5 + i * 3 + j * 7) % 11) / 5.0 - 1.0; }
static double target(int step, int i) {
  static const double w[kFeatures] = {0.5, -1.0, 2.0, 0.25};
  double y = 0.0;
  for (int j = 0; j < kFeatures; ++j) y += w[j] * feature(step, i, j);
  return y + 0.3;
}

int main(void) {
  sk_model_spec* spec = NULL;
  CHECK(sk_model_spec_create(&spec));
  int32_t unit = 0;
  CHECK(sk_model_spec_add_unit(spec, "linear", &unit));
  const int64_t w_shape[1] = {kFeatures};
  const int64_t b_shape[1] = {1};
  sk_param_spec w = SK_PARAM_SPEC_INIT;
  w.name = "w";
  w.ndim = 1;
  w.shape = w_shape;
  w.init = SK_INIT_NORMAL;
  w.init_a = 0.0f;
  w.init_b = 0.5f;
  sk_param_spec b = SK_PARAM_SPEC_INIT;
  b.name = "b";
  b.ndim = 1;
  b.shape = b_shape;
  b.init = SK_INIT_ZEROS;
  CHECK(sk_model_spec_add_param(spec, unit, &w, NULL));
  CHECK(sk_model_spec_add_param(spec, unit, &b, NULL));

  sk_process_group* group = NULL;
  CHECK(sk_process_group_create_local(1, NULL, &group));
  sk_fsdp_options fsdp = SK_FSDP_OPTIONS_INIT;
  fsdp.seed = 42;
  sk_optimizer_options sgd = SK_OPTIMIZER_OPTIONS_INIT;
  sgd.kind = SK_OPTIMIZER_SGD;
  sgd.lr = 0.05f;
  sk_engine_options options = SK_ENGINE_OPTIONS_INIT;
  options.fsdp = &fsdp;
  options.optimizer = &sgd;
  sk_engine* engine = NULL;
  CHECK(sk_engine_create(spec, group, &options, &engine));
  sk_model_spec_destroy(spec);      /* the engine keeps its own copy */
  sk_process_group_destroy(group);  /* and keeps the group alive */

  for (int step = 0; step < kSteps; ++step) {
    CHECK(sk_engine_zero_grad(engine));
    /* Forward: predictions from the gathered parameters. */
    double err[kBatch];
    double loss = 0.0;
    CHECK(sk_engine_pre_forward(engine, unit));
    sk_tensor_view wv = SK_TENSOR_VIEW_INIT, bv = SK_TENSOR_VIEW_INIT;
    CHECK(sk_engine_param(engine, unit, 0, &wv));
    CHECK(sk_engine_param(engine, unit, 1, &bv));
    const float* wp = (const float*)wv.data;
    const float* bp = (const float*)bv.data;
    for (int i = 0; i < kBatch; ++i) {
      double pred = 0.0;
      for (int j = 0; j < kFeatures; ++j) pred += (double)wp[j] * feature(step, i, j);
      pred += (double)bp[0];
      err[i] = pred - target(step, i);
      loss += err[i] * err[i];
    }
    loss /= kBatch;
    CHECK(sk_engine_post_forward(engine, unit));
    /* Backward: d loss / d w_j = 2/B sum_i err_i x_ij, added into the buffers. */
    CHECK(sk_engine_pre_backward(engine, unit));
    sk_tensor_view gw = SK_TENSOR_VIEW_INIT, gb = SK_TENSOR_VIEW_INIT;
    CHECK(sk_engine_grad(engine, unit, 0, &gw));
    CHECK(sk_engine_grad(engine, unit, 1, &gb));
    float* gwp = (float*)gw.data;
    float* gbp = (float*)gb.data;
    for (int j = 0; j < kFeatures; ++j) {
      double g = 0.0;
      for (int i = 0; i < kBatch; ++i) g += err[i] * feature(step, i, j);
      gwp[j] = (float)((double)gwp[j] + g * (2.0 / kBatch));
    }
    double g = 0.0;
    for (int i = 0; i < kBatch; ++i) g += err[i];
    gbp[0] = (float)((double)gbp[0] + g * (2.0 / kBatch));
    CHECK(sk_engine_post_backward(engine, unit));
    CHECK(sk_engine_finish_backward(engine));
    CHECK(sk_engine_optimizer_step(engine));

    float loss32 = (float)loss;
    uint32_t bits;
    memcpy(&bits, &loss32, sizeof(bits));
    printf("step %d loss %.6f bits 0x%08" PRIx32 "\n", step + 1, loss32, bits);
  }
  float final_w[kFeatures];
  CHECK(sk_engine_read_param(engine, unit, 0, final_w, kFeatures));
  printf("w %.4f %.4f %.4f %.4f\n", final_w[0], final_w[1], final_w[2], final_w[3]);
  sk_engine_destroy(engine);
  return 0;
}
