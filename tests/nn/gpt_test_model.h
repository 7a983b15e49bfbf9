// The GPT tests' tiny model and random batches (gpt_test,
// linear_attention_test): 2 layers, 2 heads, d_model 16, vocab 32,
// sequences of up to 8; batches of uniform tokens from a seeded mt19937,
// targets the inputs shifted by one.
#ifndef SHARDKIT_TESTS_NN_GPT_TEST_MODEL_H_
#define SHARDKIT_TESTS_NN_GPT_TEST_MODEL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/nn/model.h"
#include "runtime/nn/gpt.h"

namespace sk {

inline GptConfig Tiny() {
  GptConfig c;
  c.name = "gpt-test";
  c.vocab_size = 32;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  return c;
}

inline TokenBatch RandomBatch(int64_t b, int64_t t, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab) - 1);
  TokenBatch batch;
  batch.batch_size = b;
  batch.seq_len = t;
  for (int64_t i = 0; i < b; ++i) {
    std::vector<int32_t> s(t + 1);
    for (auto& x : s) x = tok(gen);
    batch.inputs.insert(batch.inputs.end(), s.begin(), s.end() - 1);
    batch.targets.insert(batch.targets.end(), s.begin() + 1, s.end());
  }
  return batch;
}

}  // namespace sk

#endif  // SHARDKIT_TESTS_NN_GPT_TEST_MODEL_H_
