// A T5-style encoder-decoder.
//
// Encoder: n_encoder_layers pre-LayerNorm blocks of non-causal
// self-attention and an MLP, then a final LayerNorm. Decoder:
// n_decoder_layers blocks of causal self-attention, cross-attention to the
// encoder output, and an MLP; a final LayerNorm and an LM head.
//
// Simplifications against T5 (Raffel et al. 2020), documented in
// docs/architecture.md: learned absolute position embeddings instead of
// relative position buckets; LayerNorm with bias instead of RMSNorm; GELU
// MLP instead of ReLU; attention inner width = d_model (d_kv * heads =
// d_model); separate (untied) encoder, decoder and output embeddings so that
// no parameter is shared between units. Parameter count and FLOPs follow
// from this architecture, not from T5's checkpoints.
//
// Units, in execution order:
//   0                      "embed"     enc_wte, dec_wte [vocab, d], enc_wpe
//                                      [max_source_len, d], dec_wpe [max_target_len, d]
//   1..E                   "enc.<i>"   attn.*, mlp.*
//   E + 1                  "enc_norm"  ln.g, ln.b
//   E + 2..E + 1 + D       "dec.<i>"   attn.*, cross.*, mlp.*
//   E + D + 2              "head"      ln.g, ln.b, lm_head.w [d, vocab]
// The embedding unit computes both the encoder's and the decoder's input
// embeddings in its forward (neither depends on the encoder), so every unit
// runs exactly once per direction.
#ifndef SHARDKIT_RUNTIME_NN_T5_H_
#define SHARDKIT_RUNTIME_NN_T5_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/configured_model.h"
#include "runtime/nn/model.h"
#include "runtime/nn/transformer.h"

namespace sk {

struct T5Config {
  std::string name = "t5";
  int64_t vocab_size = 0;
  int64_t max_source_len = 0;
  int64_t max_target_len = 0;
  int64_t n_encoder_layers = 0;
  int64_t n_decoder_layers = 0;
  int64_t n_head = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;

  // InvalidArgument naming the field for non-positive sizes, d_model not a
  // multiple of n_head, or a vocabulary beyond int32 ids.
  Status Validate() const;
};

class T5Model final : public ConfiguredModel<T5Config> {
 public:
  static StatusOr<std::unique_ptr<T5Model>> Create(const T5Config& config,
                                                   const ModelOptions& options = {});

  // source [batch_size, source_len] (1..max_source_len), inputs (decoder
  // input) and targets [batch_size, seq_len] (1..max_target_len).
  Status ValidateBatch(const TokenBatch& batch) const override;
  StepFlops Flops(int64_t batch_size, int64_t seq_len, int64_t source_len) const override;
  int64_t PeakActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                              DeviceKind device) const override;
  int64_t BackwardEndActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                                     DeviceKind device) const override;

 private:
  T5Model(const T5Config& config, const ModelOptions& options);
  StatusOr<float> Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                      bool backward) const override;
  // The encoder's and the decoder's block shapes for one batch.
  struct Dims {
    nn_internal::BlockDims encoder, decoder;
  };
  Dims DimsFor(int64_t batch_size, int64_t seq_len, int64_t source_len) const;
  // What PeakActivationBytes and BackwardEndActivationBytes both count.
  struct ActivationTerms {
    int64_t a;          // bytes of the compute dtype
    int64_t dec_saved;  // one decoder block's saved activations
    int64_t enc_kept;   // what the encoder side keeps through the forward
    int64_t grads;      // backward buffers allocated before the head
    int64_t enc;        // the encoder's backward from its last block
  };
  ActivationTerms TermsFor(const Dims& dims, DeviceKind device) const;

  nn_internal::TransformerBlock encoder_block_;
  nn_internal::TransformerBlock decoder_block_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_T5_H_
