// Supervised fine-tuning of a Hugging Face model through the C++ frontend:
// the same settings and output as examples/c/finetune.c (docs/finetune.md).
//   bazel run //tools:launch -- --nproc_per_node=2 --master_port=0
//     -- bazel-bin/examples/cpp/finetune MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "shardkit/shardkit.hpp"

static void PrintLoss(const std::string& what, float loss) {
  uint32_t bits;
  std::memcpy(&bits, &loss, sizeof(bits));
  std::printf("%s loss %.9g bits 0x%08x\n", what.c_str(), loss, bits);
}

int main(int argc, char** argv) try {
  if (argc != 5) {
    std::cerr << "usage: " << argv[0] << " MODEL_DIR TRAIN.jsonl EVAL.jsonl OUT_DIR\n";
    return 2;
  }
  const std::string model_dir = argv[1];
  std::string out_dir = argv[4];
  if (out_dir.empty() || out_dir.back() != '/') out_dir += '/';  // written as a directory

  shardkit::ProcessGroup group = shardkit::ProcessGroup::Gloo();  // RANK, WORLD_SIZE, ...
  const int32_t rank = shardkit::ProcessGroup::Rank(group.get());

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
  options.model = model_dir.c_str();  // its config.json gives the shape
  options.optimizer = &optimizer;
  options.lr_schedule = &schedule;
  options.batch_size = 2;  // rows per rank per step
  options.seq_len = 16;
  options.clip_grad_norm = 1.0;
  options.skip_init = 1;  // no random weights: the load below brings them
  // input_ids + labels (-100 = not trained), in file order.
  shardkit::Dataset data = shardkit::Dataset::Jsonl({argv[2]}).Sequential().Eval({argv[3]});

  shardkit::Trainer trainer(data.Apply(options), group.get());
  trainer.LoadStateDict(model_dir, SK_WEIGHT_LAYOUT_HF_LLAMA);
  float eval = trainer.Evaluate(1000);  // one pass over the eval file
  if (rank == 0) PrintLoss("eval before", eval);
  for (int step = 1; step <= 8; ++step) {
    sk_step_metrics m = trainer.Step();
    if (rank == 0) PrintLoss("step " + std::to_string(step), m.global_loss);
  }
  eval = trainer.Evaluate(1000);
  if (rank == 0) PrintLoss("eval after", eval);
  trainer.SaveStateDict(out_dir, SK_WEIGHT_LAYOUT_HF_LLAMA);
  return 0;
} catch (const shardkit::Error& e) {
  std::cerr << e.what() << "\n";
  return 1;
}
