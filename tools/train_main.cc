// Trains a named reference model on one process, without FSDP: the small
// program that shows the models learn.
//
//   bazel run -c opt //tools:train -- --model=gpt-1m --steps=200
//   bazel run -c opt //tools:train -- --model=t5-10m --data=tokens.bin --token_width=2
//   bazel run -c opt //tools:train -- --model=llama-10m --checkpointing=selective
//   bazel run -c opt //tools:train -- --model=gpt-1m --dataset=sft.jsonl --dataset_format=jsonl --eos_id=2
//
// Data is a synthetic token stream unless --data names a token file (random
// windows) or --dataset names the files of a dataset read in order
// (docs/data.md: token files raw or llm.c-headed, JSONL with labels or
// loss_mask; GPT and Llama-family models). GPT models learn the next token;
// T5 models learn to reverse their source.
// Prints loss, tokens/s and model TFLOP/s every --log_every steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <gflags/gflags.h>

#include "runtime/data/dataset.h"
#include "runtime/nn/configs.h"
#include "runtime/nn/model_family.h"
#include "runtime/nn/data.h"
#include "runtime/ops/cpu/cpu_backend.h"
#include "runtime/nn/owned_parameters.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tools/cli_flags.h"

DEFINE_string(model, "gpt-1m", "named model config (see //tools:model_table)");
DEFINE_int32(steps, 100, "training steps");
DEFINE_int32(batch_size, 8, "sequences per step");
DEFINE_int32(seq_len, 0, "decoder tokens per sequence (0: the config's default)");
DEFINE_int32(source_len, 0, "encoder tokens per sequence for T5 (0: the config's default)");
DEFINE_double(lr, 1e-3, "Adam learning rate");
DEFINE_uint64(seed, 1, "seed for initialisation and data");
DEFINE_string(data, "", "token file (little-endian, no header); empty: synthetic tokens");
DEFINE_int32(token_width, 2, "bytes per token in --data: 2 or 4");
DEFINE_string(dataset, "", "comma-separated dataset files read in order (docs/data.md); instead of --data");
DEFINE_string(dataset_format, "tokens", "--dataset's format: tokens (raw or llm.c .bin) or jsonl");
DEFINE_int32(dataset_token_bytes, 0, "--dataset token files: 2 or 4 (0: 2, or the llm.c header's)");
DEFINE_int64(eos_id, -1, "--dataset: the end-of-sequence token (-1: none)");
DEFINE_bool(packing, false, "--dataset: pack documents into rows");
DEFINE_bool(shuffle, true, "--dataset: a new order each epoch (false: file order)");
DEFINE_int64(synthetic_tokens, 4096,
             "length of the synthetic stream (small = memorisable); at most 2^26 (4 bytes a token, held twice)");
DEFINE_bool(bf16, false, "bf16 compute");
DEFINE_string(checkpointing, "off",
              "per-block activation checkpointing: off, on (the whole block recomputed), selective "
              "(norms and activations recomputed; GPT and Llama-family models) or "
              "selective_matmuls (selective, every other matmul recomputed too; Llama family)");
DEFINE_bool(recompute_attention, false,
            "with --checkpointing=selective: recompute attention from q/k/v as well");
DEFINE_int32(log_every, 10, "steps between log lines");
DEFINE_int32(gemm_threads, 0, "threads per GEMM (0: the OpenMP/OpenBLAS default)");

namespace sk {
namespace {

// The largest --synthetic_tokens: the stream is drawn into memory (4 bytes a
// token) and a copy is cached, so 2^26 tokens is 512 MiB; more is refused
// rather than growing toward tens of GB (1e9 took 28 s and 7.9 GB).
constexpr int64_t kMaxSyntheticTokens = int64_t{1} << 26;

// Flags the loop below divides by or counts with, checked before any work.
Status ValidateFlags() {
  if (FLAGS_steps < 0) return InvalidArgumentError("--steps must be >= 0, got " + std::to_string(FLAGS_steps));
  if (FLAGS_log_every < 1) {
    return InvalidArgumentError("--log_every must be >= 1, got " + std::to_string(FLAGS_log_every));
  }
  if (FLAGS_batch_size < 1) {
    return InvalidArgumentError("--batch_size must be >= 1, got " + std::to_string(FLAGS_batch_size));
  }
  if (FLAGS_seq_len < 0 || FLAGS_source_len < 0) {
    return InvalidArgumentError("--seq_len and --source_len must be >= 0 (0: the config's default)");
  }
  if (FLAGS_data.empty() && (FLAGS_synthetic_tokens < 0 || FLAGS_synthetic_tokens > kMaxSyntheticTokens)) {
    return InvalidArgumentError("--synthetic_tokens must be in [0, " + std::to_string(kMaxSyntheticTokens) +
                                "], got " + std::to_string(FLAGS_synthetic_tokens));
  }
  if (FLAGS_gemm_threads < 0) {
    return InvalidArgumentError("--gemm_threads must be >= 0 (0: the default), got " +
                                std::to_string(FLAGS_gemm_threads));
  }
  if (!FLAGS_dataset.empty() && !FLAGS_data.empty()) {
    return InvalidArgumentError("give --data or --dataset, not both");
  }
  if (FLAGS_dataset_format != "tokens" && FLAGS_dataset_format != "jsonl") {
    return InvalidArgumentError("--dataset_format must be tokens or jsonl, got '" + FLAGS_dataset_format + "'");
  }
  return OkStatus();
}

// --dataset and its flags as dataset options.
data::DatasetOptions DatasetFromFlags() {
  data::DatasetOptions o;
  for (size_t start = 0; start <= FLAGS_dataset.size();) {
    const size_t comma = std::min(FLAGS_dataset.find(',', start), FLAGS_dataset.size());
    o.paths.push_back(FLAGS_dataset.substr(start, comma - start));
    start = comma + 1;
  }
  o.format = FLAGS_dataset_format == "jsonl" ? data::DatasetFormat::kJsonl : data::DatasetFormat::kTokens;
  o.token_bytes = FLAGS_dataset_token_bytes;
  o.seed = FLAGS_seed;
  o.shuffle = FLAGS_shuffle;
  o.packing = FLAGS_packing;
  o.eos_id = FLAGS_eos_id;
  return o;
}

Status Run() {
  SK_RETURN_IF_ERROR(ValidateFlags());
  if (FLAGS_gemm_threads != 0) SK_RETURN_IF_ERROR(ops::SetCpuGemmThreads(FLAGS_gemm_threads));
  SK_ASSIGN_OR_RETURN(NamedModelConfig cfg, FindModelConfig(FLAGS_model));
  ModelOptions options;
  options.compute_dtype = FLAGS_bf16 ? DType::kBF16 : DType::kF32;
  SK_ASSIGN_OR_RETURN(options.checkpointing,
                      ParseActivationCheckpointing(FLAGS_checkpointing, "--checkpointing"));
  options.recompute_attention = FLAGS_recompute_attention;
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, CreateModel(cfg, options));
  SK_ASSIGN_OR_RETURN(const ModelFamilyDescription* family, ModelFamilyOf(cfg));
  const bool t5 = family->batches == FamilyBatches::kEncoderDecoder;
  const int64_t vocab = BatchIdSpace(cfg);
  const int64_t seq = FLAGS_seq_len > 0 ? FLAGS_seq_len : cfg.seq_len;
  const int64_t src = t5 ? (FLAGS_source_len > 0 ? FLAGS_source_len : cfg.source_len) : 0;
  std::vector<int32_t> stream;
  std::unique_ptr<data::Dataset> dataset;
  if (!FLAGS_dataset.empty()) {
    if (family->batches != FamilyBatches::kDecoder) {
      return InvalidArgumentError("--dataset feeds decoder-only models (GPT, Llama); " + cfg.name + " is not one");
    }
    SK_ASSIGN_OR_RETURN(dataset, data::Dataset::Open(DatasetFromFlags(), seq, vocab));
    std::printf("dataset: %lld documents, %lld samples per epoch\n",
                static_cast<long long>(dataset->num_documents()), static_cast<long long>(dataset->num_samples()));
  } else if (FLAGS_data.empty()) {
    SK_ASSIGN_OR_RETURN(stream, SyntheticTokenStream(FLAGS_seed, vocab, FLAGS_synthetic_tokens));
  } else {
    if (FLAGS_token_width != 2 && FLAGS_token_width != 4) {
      return InvalidArgumentError("--token_width must be 2 or 4");
    }
    SK_ASSIGN_OR_RETURN(stream, ReadTokenFile(FLAGS_data,
                                              FLAGS_token_width == 2 ? TokenWidth::kUint16
                                                                     : TokenWidth::kUint32,
                                              vocab));
  }
  SK_ASSIGN_OR_RETURN(std::unique_ptr<OwnedParameters> params,
                      OwnedParameters::Create(model->units(), FLAGS_seed, options.compute_dtype));
  std::printf("model %s: %.3f M parameters, %lld units, batch %d x %lld tokens%s\n",
              cfg.name.c_str(), static_cast<double>(model->num_parameters()) / 1e6,
              static_cast<long long>(model->units().size()), FLAGS_batch_size,
              static_cast<long long>(seq), t5 ? " (+ encoder)" : "");
  OptimizerOptions adam_options;
  adam_options.kind = OptimizerKind::kAdam;
  adam_options.lr = static_cast<float>(FLAGS_lr);
  SK_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> adam,
                      Optimizer::Create(adam_options, &HostAllocator::Default()));
  SK_ASSIGN_OR_RETURN(std::vector<ShardRef> refs, ShardRefsFor(params->all_params(), params->all_grads()));
  const StepFlops flops = model->Flops(FLAGS_batch_size, seq, src);
  auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < FLAGS_steps; ++step) {
    TokenBatch batch;
    if (dataset) {
      SK_ASSIGN_OR_RETURN(batch, dataset->Rows(int64_t{step} * FLAGS_batch_size, FLAGS_batch_size, nullptr));
    } else if (t5) {
      SK_ASSIGN_OR_RETURN(batch, ReversalBatch(stream, FLAGS_batch_size, src, std::min(seq, src), 0,
                                               FLAGS_seed, step));
    } else {
      SK_ASSIGN_OR_RETURN(batch, LanguageModelBatch(stream, FLAGS_batch_size, seq, FLAGS_seed, step));
    }
    params->ZeroGrad();
    SK_ASSIGN_OR_RETURN(float loss, model->ForwardBackward(batch, *params, HostAllocator::Default()));
    SK_RETURN_IF_ERROR(adam->Step(ops::HostContext(), refs));
    if ((step + 1) % FLAGS_log_every == 0 || step == 0 || step + 1 == FLAGS_steps) {
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      double tokens = static_cast<double>(step + 1) * batch.num_target_tokens();
      std::printf("step %5d  loss %.4f  tokens/s %.0f  model TFLOP/s %.4f\n", step + 1, loss,
                  tokens / sec, flops.model_flops * (step + 1) / sec / 1e12);
      std::fflush(stdout);
    }
  }
  return OkStatus();
}

}  // namespace
}  // namespace sk

int main(int argc, char** argv) {
  sk::cli::ParseFlags(
      "trains a reference model on one process: train --model=gpt-1m --steps=200 [--data=tokens.bin]",
      __FILE__, &argc, &argv);
  sk::Status s = sk::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
