// Trains gpt-tiny with FULL_SHARD on 2 local ranks through the C++ frontend
// (same settings and output as examples/c/train_gpt.c).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "shardkit/shardkit.hpp"

int main() try {
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

  shardkit::LocalSession session(options, 2);
  for (int step = 1; step <= 8; ++step) {
    sk_step_metrics m = session.Step();
    uint32_t bits;
    std::memcpy(&bits, &m.loss, sizeof(bits));
    std::printf("step %d loss %.6f bits 0x%08x\n", step, m.loss, bits);
  }
  return 0;
} catch (const shardkit::Error& e) {
  std::cerr << e.what() << "\n";
  return 1;
}
