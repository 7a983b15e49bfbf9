// Unit-table models: networks shardkit has no hand-written model for (the
// FSDP paper's RegNet-9B and DeepViT-8B), described unit by unit as the
// GEMMs their layers are lowered to, so that they run, are priced and are
// sharded like GPT and T5.
//
// A table is an image size, a class count and a list of units. Each unit is
// one of:
//   kConv         a chain of convolutions, each followed by a bias (the
//                 BatchNorm shift) and optionally GELU, with an optional
//                 residual (identity or a projection convolution) added
//                 before the chain's last output and GELU after the sum:
//                 a RegNet stem, a RegNet X block, or a ViT patch embedding
//                 (one 16x16/16 convolution whose bias spans every patch
//                 position: the position embedding).
//   kTransformer  a pre-LayerNorm ViT block: non-causal self-attention and
//                 a GELU MLP (runtime/nn/transformer.h's block, unchanged).
//   kClassifier   optional LayerNorm, global average pooling over the
//                 positions, a linear layer to the classes, cross-entropy.
//
// How a convolution runs (the implicit-GEMM lowering cuDNN uses): activations
// are channels-last rows, [batch * H * W, C]. A convolution with C_in input
// and C_out output channels, a k x k kernel, stride s, padding p and g groups
// gathers its input patches with the embedding op (an im2col: row i of the
// patch matrix lists the k*k input pixels output pixel i reads, padding taps
// reading a zero row appended to the input) and multiplies them by its
// weight, one GEMM per group (GemmParams::batch = g):
//   M = batch * H_out * W_out,  K = k * k * C_in / g,  N = C_out / g,
//   weight [g, K, N]  (K ordered tap-major, then input channel).
// A 1x1 stride-1 ungrouped convolution multiplies its input directly.
// Backward re-gathers the patches from the saved input for the weight
// gradient and scatters the patch gradient back with the embedding op's
// backward (col2im). So forward and backward are real convolutions on every
// device kind, the simulator prices each GEMM by its shape and each gather
// by its bytes, and memory comes from the caching allocator like any model's.
//
// Inputs: a TokenBatch with seq_len 1 and no source. inputs[b] names image b:
// its pixels are Philox normal(0, 1) draws under that id (ops::InitPhilox,
// so the same id gives the same image on every device); targets[b] is its
// class (or kIgnoreTarget). Both ids lie in [0, num_classes), so the
// trainer's token streams (vocabulary = num_classes) feed these models as
// they feed GPT.
//
// Simplifications against the published networks, each small in parameters
// and FLOPs and stated in docs/architecture.md: BatchNorm is its per-channel
// shift only (its scale folds into the preceding convolution's weight at
// inference and is left out in training; its statistics are not computed);
// GELU stands in for ReLU; DeepViT's re-attention (a learned heads x heads
// mixing of the attention maps: heads^2 parameters and 2 heads^2 T^2 FLOPs
// per block) is plain attention; no class token (mean pooling instead).
//
// Thread safety: a UnitTableModel is immutable; concurrent calls with
// distinct hooks and allocators are safe.
#ifndef SHARDKIT_RUNTIME_NN_UNIT_TABLE_H_
#define SHARDKIT_RUNTIME_NN_UNIT_TABLE_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/configured_model.h"
#include "runtime/nn/model.h"
#include "runtime/nn/transformer.h"

namespace sk {

// One convolution of a kConv unit. padding < 0 means "same" for odd kernels
// (kernel / 2) and 0 for even ones.
struct ConvLayerSpec {
  std::string name;  // its parameters are "<name>.w" [groups, K, N] and "<name>.b"
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t groups = 1;
  int64_t padding = -1;
  bool gelu = false;  // GELU after the bias (for the chain's last layer with a
                      // residual: ignored; the unit's gelu_after_sum applies)

  int64_t pad() const { return padding >= 0 ? padding : (kernel % 2 == 1 ? kernel / 2 : 0); }
};

enum class TableUnitKind : uint8_t { kConv = 1, kTransformer = 2, kClassifier = 3 };
enum class Residual : uint8_t { kNone = 0, kIdentity = 1, kProjection = 2 };

struct TableUnit {
  std::string name;
  TableUnitKind kind = TableUnitKind::kConv;
  // Spatial size of the unit's input (kConv), or of the positions it sees
  // (kTransformer: tokens = in_h * in_w; kClassifier: pooled positions).
  int64_t in_h = 0, in_w = 0;
  // kConv.
  std::vector<ConvLayerSpec> convs;
  Residual residual = Residual::kNone;
  ConvLayerSpec projection;  // when residual == kProjection
  bool gelu_after_sum = true;  // with a residual
  bool position_bias = false;  // the last conv's bias is [H_out * W_out, C_out]
  // kTransformer and kClassifier: the width (d_model or channels).
  int64_t width = 0;
  int64_t heads = 0;  // kTransformer
  int64_t d_ff = 0;   // kTransformer
  bool layer_norm = false;  // kClassifier: LayerNorm before pooling (ViT)
};

// The Philox seed of the synthetic images: image b is InitPhilox(normal(0,
// 1), kUnitTableImageSeed, param_id = inputs[b]) over its H * W * C
// channels-last values.
inline constexpr uint64_t kUnitTableImageSeed = 0x696d616765ull;  // "image"

struct UnitTableConfig {
  std::string name;
  int64_t image_size = 0;      // square images, H = W
  int64_t image_channels = 3;
  int64_t num_classes = 0;
  std::vector<TableUnit> units;
  // Where the table's dimensions come from (printed by docs tooling).
  std::string source;

  // InvalidArgument naming the unit and field when a size is not positive,
  // the units do not chain (channels, spatial sizes), groups do not divide
  // the channels, a padded convolution starts any unit but the first, or the
  // last unit is not the one classifier.
  Status Validate() const;
};

class UnitTableModel final : public ConfiguredModel<UnitTableConfig> {
 public:
  static StatusOr<std::unique_ptr<UnitTableModel>> Create(const UnitTableConfig& config,
                                                          const ModelOptions& options = {});

  // seq_len 1, no source, inputs and targets [batch_size] in [0, num_classes)
  // (targets may be kIgnoreTarget).
  Status ValidateBatch(const TokenBatch& batch) const override;
  // Convolution GEMMs (2 M K N per group), attention blocks as in GPT, the
  // classifier's matmul; pooling, gathers and elementwise ops not counted.
  // seq_len and source_len are ignored (one image per batch entry).
  StepFlops Flops(int64_t batch_size, int64_t seq_len, int64_t source_len) const override;
  int64_t PeakActivationBytes(int64_t batch_size, int64_t seq_len, int64_t source_len,
                              DeviceKind device) const override;

  // Forward multiply-adds x 2 of unit u for one image (Flops' parts).
  double UnitForwardFlops(int u, int64_t batch_size) const;

 private:
  UnitTableModel(const UnitTableConfig& config, const ModelOptions& options);
  StatusOr<float> Run(const TokenBatch& batch, UnitHooks& hooks, Allocator& alloc,
                      bool backward) const override;

  nn_internal::TransformerBlock vit_block_;
};

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_NN_UNIT_TABLE_H_
