#include "runtime/ops/backend.h"

#include <string>

namespace sk::ops {

Status OpBackend::NotImplemented(const char* op) const {
  return UnimplementedError(std::string(op) + " is not implemented by the " + name() +
                            " op backend");
}

Status OpBackend::Account(const OpContext&, const OpCost&) { return OkStatus(); }

Status OpBackend::Gemm(const OpContext&, const GemmParams&, const MatrixRef&, const MatrixRef&,
                       const MatrixRef&) {
  return NotImplemented("gemm");
}
bool OpBackend::GemmStores16Bit(const GemmParams&) const { return false; }
bool OpBackend::GemmAddsBias(const GemmParams&, DType, DType, DType) const { return false; }
Status OpBackend::GemmBias(const OpContext&, const GemmParams&, const MatrixRef&, const MatrixRef&,
                           const Tensor&, const MatrixRef&) {
  return NotImplemented("gemm (with bias)");
}
bool OpBackend::GemmAddsResidual(const GemmParams&, DType, DType, DType, DType) const {
  return false;
}
Status OpBackend::GemmBiasResidual(const OpContext&, const GemmParams&, const MatrixRef&,
                                   const MatrixRef&, const Tensor&, const Tensor&,
                                   const MatrixRef&) {
  return NotImplemented("gemm (with bias and residual)");
}
bool OpBackend::GemmFusesGelu(const GemmParams&, DType, DType, DType, DType) const { return false; }
Status OpBackend::GemmBiasGelu(const OpContext&, const GemmParams&, const MatrixRef&,
                               const MatrixRef&, const Tensor&, const Tensor&, const Tensor&) {
  return NotImplemented("gemm (with bias and GELU)");
}
Status OpBackend::GemmGeluBackward(const OpContext&, const GemmParams&, const MatrixRef&,
                                   const MatrixRef&, const Tensor&, const MatrixRef&) {
  return NotImplemented("gemm (with GELU's gradient)");
}
bool OpBackend::Native16Bit(std::string_view) const { return false; }

bool OpBackend::IsStagedModelOp(std::string_view op) {
  static constexpr std::string_view kModelOps[] = {
      "broadcast_rows", "bias_add",       "bias_grad",      "gelu_fwd",
      "gelu_bwd",       "layer_norm_fwd", "layer_norm_bwd", "attention_fwd",
      "attention_bwd",  "embedding_fwd",  "embedding_bwd",  "cross_entropy_fwd",
      "cross_entropy_bwd", "cross_entropy_rows", "rms_norm_fwd",  "rms_norm_bwd",   "rope_fwd",
      "rope_bwd",       "swiglu_fwd",     "swiglu_bwd"};
  for (std::string_view n : kModelOps) {
    if (n == op) return true;
  }
  return false;
}
Status OpBackend::Copy(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("copy");
}
Status OpBackend::Cast(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("cast");
}
Status OpBackend::RoundToDType(const OpContext&, const Tensor&, DType) {
  return NotImplemented("round_to_dtype");
}
Status OpBackend::Scale(const OpContext&, const Tensor&, float) { return NotImplemented("scale"); }
Status OpBackend::Axpy(const OpContext&, float, const Tensor&, const Tensor&) {
  return NotImplemented("axpy");
}
Status OpBackend::Fill(const OpContext&, const Tensor&, float) { return NotImplemented("fill"); }
Status OpBackend::InitPhilox(const OpContext&, const Initializer&, uint64_t, uint64_t, int64_t,
                             const Tensor&) {
  return NotImplemented("init_philox");
}
Status OpBackend::BroadcastRows(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("broadcast_rows");
}
Status OpBackend::BiasAdd(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("bias_add");
}
Status OpBackend::BiasGrad(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("bias_grad");
}
Status OpBackend::RmsNormForward(const OpContext&, const Tensor&, const Tensor&, float,
                                 const Tensor&, const Tensor&) {
  return NotImplemented("rms_norm_fwd");
}
Status OpBackend::RmsNormBackward(const OpContext&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, const Tensor&) {
  return NotImplemented("rms_norm_bwd");
}
Status OpBackend::Rope(const OpContext&, const Tensor&, int64_t, int64_t, int64_t, float,
                       const RopeScaling&, bool inverse, const Tensor&, const Tensor&) {
  return NotImplemented(inverse ? "rope_bwd" : "rope_fwd");
}
Status OpBackend::SwiGluForward(const OpContext&, const Tensor&, const Tensor&, const Tensor&) {
  return NotImplemented("swiglu_fwd");
}
Status OpBackend::SwiGluBackward(const OpContext&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&) {
  return NotImplemented("swiglu_bwd");
}
Status OpBackend::GeluForward(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("gelu_fwd");
}
Status OpBackend::GeluBackward(const OpContext&, const Tensor&, const Tensor&, const Tensor&) {
  return NotImplemented("gelu_bwd");
}
Status OpBackend::LayerNormForward(const OpContext&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, const Tensor&, const Tensor&) {
  return NotImplemented("layer_norm_fwd");
}
Status OpBackend::LayerNormBackward(const OpContext&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&) {
  return NotImplemented("layer_norm_bwd");
}
Status OpBackend::AttentionForward(const OpContext&, const AttentionShape&, const MatrixRef&,
                                   const MatrixRef&, const MatrixRef&, const Tensor&,
                                   const MatrixRef&) {
  return NotImplemented("attention_fwd");
}
Status OpBackend::AttentionBackward(const OpContext&, const AttentionShape&, const MatrixRef&,
                                    const MatrixRef&, const MatrixRef&, const Tensor&,
                                    const MatrixRef&, const MatrixRef&, const MatrixRef&,
                                    const MatrixRef&, const Tensor&) {
  return NotImplemented("attention_bwd");
}
bool OpBackend::PrefersFlashAttention(const AttentionShape&, DType) const { return false; }
Status OpBackend::FlashAttentionForward(const OpContext&, const AttentionShape&,
                                        const MatrixRef&, const MatrixRef&, const MatrixRef&,
                                        const MatrixRef&, const Tensor&) {
  return NotImplemented("flash_attention_fwd");
}
Status OpBackend::FlashAttentionBackward(const OpContext&, const AttentionShape&,
                                         const MatrixRef&, const MatrixRef&, const MatrixRef&,
                                         const MatrixRef&, const MatrixRef&, const Tensor&,
                                         const MatrixRef&, const MatrixRef&, const MatrixRef&,
                                         const Tensor&) {
  return NotImplemented("flash_attention_bwd");
}
Status OpBackend::EmbeddingForward(const OpContext&, const Tensor&, const Tensor&, const Tensor&) {
  return NotImplemented("embedding_fwd");
}
Status OpBackend::EmbeddingBackward(const OpContext&, const Tensor&, const Tensor&,
                                    const Tensor&) {
  return NotImplemented("embedding_bwd");
}
Status OpBackend::CrossEntropyForward(const OpContext&, const Tensor&, const Tensor&,
                                      const Tensor&) {
  return NotImplemented("cross_entropy_fwd");
}
Status OpBackend::CrossEntropyBackward(const OpContext&, const Tensor&, const Tensor&,
                                       const Tensor&, float) {
  return NotImplemented("cross_entropy_bwd");
}
Status OpBackend::CrossEntropyRowLosses(const OpContext&, const Tensor&, const Tensor&,
                                        const Tensor&) {
  return NotImplemented("cross_entropy_rows");
}
Status OpBackend::CrossEntropyMean(const OpContext&, const Tensor&, const Tensor&, const Tensor&) {
  return NotImplemented("cross_entropy_mean");
}
Status OpBackend::SumOfSquares(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("sum_of_squares");
}
Status OpBackend::MaxAbs(const OpContext&, const Tensor&, const Tensor&) {
  return NotImplemented("max_abs");
}
Status OpBackend::SgdUpdate(const OpContext&, const SgdHyper&, const Tensor&, const Tensor&,
                            const Tensor&) {
  return NotImplemented("sgd_update");
}
Status OpBackend::AdamUpdate(const OpContext&, const AdamHyper& h, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&) {
  return NotImplemented(h.decoupled ? "adamw_update" : "adam_update");
}
StatusOr<double> OpBackend::ReadScalar(const OpContext&, const Tensor&) {
  return NotImplemented("read_scalar");
}
Status OpBackend::ReadValues(const OpContext&, const Tensor&, double*) { return NotImplemented("read_values"); }

}  // namespace sk::ops
