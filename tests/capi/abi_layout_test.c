/* shardkit.h compiles as strict C11, so do the layout static_asserts of
 * capi/abi_layout.h (as they do in the library's C++), and the _INIT macros
 * give zeroed structs of the right size. */
#include <stdio.h>
#include <string.h>

#include "capi/abi_layout.h"
#include "shardkit/shardkit.h"

static int failures = 0;
#define EXPECT(cond)                                              \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                 \
    }                                                             \
  } while (0)

/* Every byte after struct_size is zero. */
static int zero_after_size(const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = sizeof(size_t); i < n; ++i) {
    if (b[i] != 0) return 0;
  }
  return 1;
}

int main(void) {
  sk_gloo_options g = SK_GLOO_OPTIONS_INIT;
  sk_fsdp_options f = SK_FSDP_OPTIONS_INIT;
  sk_optimizer_options o = SK_OPTIMIZER_OPTIONS_INIT;
  sk_trainer_options t = SK_TRAINER_OPTIONS_INIT;
  sk_step_metrics m = SK_STEP_METRICS_INIT;
  sk_param_spec p = SK_PARAM_SPEC_INIT;
  sk_engine_options e = SK_ENGINE_OPTIONS_INIT;
  sk_tensor_view v = SK_TENSOR_VIEW_INIT;
  sk_memory_estimate me = SK_MEMORY_ESTIMATE_INIT;
  sk_device_options d = SK_DEVICE_OPTIONS_INIT;
  EXPECT(d.struct_size == sizeof d && zero_after_size(&d, sizeof d));
  EXPECT(d.kind == SK_DEVICE_DEFAULT && t.device == NULL && e.device == NULL);
  EXPECT(g.struct_size == sizeof g && zero_after_size(&g, sizeof g));
  EXPECT(f.struct_size == sizeof f && zero_after_size(&f, sizeof f) && f.grad_accumulation == SK_GRAD_ACCUMULATION_DEFAULT);
  /* 0.6.0: lr is taken as given (0 is a rate), so the INIT macro sets the
   * default 1e-3 and zeroes the rest. */
  EXPECT(o.struct_size == sizeof o && o.lr == 1e-3f);
  o.lr = 0.0f;
  EXPECT(zero_after_size(&o, sizeof o));
  sk_lr_schedule ls = SK_LR_SCHEDULE_INIT;
  EXPECT(ls.struct_size == sizeof ls && zero_after_size(&ls, sizeof ls) && ls.kind == SK_LR_SCHEDULE_DEFAULT);
  sk_param_group pg = SK_PARAM_GROUP_INIT;
  EXPECT(pg.struct_size == sizeof pg && pg.lr_multiplier == 1.0f && pg.pattern == NULL &&
         pg.weight_decay == 0.0f && pg.inherit_weight_decay == 0 && pg.norms_biases_embeddings == 0 &&
         pg.no_decay == SK_NO_DECAY_NONE);
  EXPECT(t.lr_schedule == NULL && m.lr == 0.0f);
  EXPECT(t.struct_size == sizeof t && zero_after_size(&t, sizeof t));
  EXPECT(m.struct_size == sizeof m && zero_after_size(&m, sizeof m));
  EXPECT(p.struct_size == sizeof p && zero_after_size(&p, sizeof p));
  EXPECT(e.struct_size == sizeof e && zero_after_size(&e, sizeof e));
  EXPECT(v.struct_size == sizeof v && zero_after_size(&v, sizeof v));
  EXPECT(me.struct_size == sizeof me && zero_after_size(&me, sizeof me));
  EXPECT(t.parallelism == SK_PARALLELISM_DEFAULT);
  EXPECT(strcmp(sk_version(), SK_VERSION_STRING) == 0);
  if (failures == 0) printf("PASS\n");
  return failures == 0 ? 0 : 1;
}
