// Parameter initialisation moved to the op layer (runtime/ops/init.h), where
// the Philox fill op executes it on every device kind. This header keeps the
// names visible to runtime/nn's users (ParamSpec holds an Initializer).
#ifndef SHARDKIT_RUNTIME_NN_INIT_H_
#define SHARDKIT_RUNTIME_NN_INIT_H_

#include "runtime/ops/init.h"

#endif  // SHARDKIT_RUNTIME_NN_INIT_H_
