// How rotary position embeddings stretch to contexts longer than the ones a
// model was trained on: the rescaled inverse frequencies of Hugging Face's
// rope_scaling (transformers 4) / rope_parameters (transformers 5). The
// arithmetic is math.h's RopeInvFreq, shared by the CPU and CUDA kernels, so
// the scaling travels to a kernel as this plain struct, by value.
//
//   kNone    rope_type "default": inv_freq_i = theta^(-2i / head_dim).
//   kLinear  rope_type "linear" (position interpolation, Chen et al. 2023):
//            every inv_freq divided by `factor` (positions divided by it).
//   kLlama3  rope_type "llama3" (Llama 3.1 and 3.2): with wavelength
//            w = 2 pi / inv_freq, L = original_max_positions,
//              w < L / high_freq_factor   unchanged (high frequencies),
//              w > L / low_freq_factor    divided by factor (low frequencies),
//              otherwise                  (1 - s) inv_freq / factor + s inv_freq,
//                                         s = (L / w - low_freq_factor) /
//                                             (high_freq_factor - low_freq_factor).
// Other rope types (dynamic, yarn, longrope) change attention's scale or
// depend on the sequence length; shardkit does not compute them.
#ifndef SHARDKIT_RUNTIME_OPS_ROPE_SCALING_H_
#define SHARDKIT_RUNTIME_OPS_ROPE_SCALING_H_

#include <cstdint>

namespace sk {

enum class RopeScalingType : int32_t { kNone = 0, kLinear = 1, kLlama3 = 2 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;                 // kLinear, kLlama3: > 0
  float low_freq_factor = 1.0f;        // kLlama3: > 0
  float high_freq_factor = 4.0f;       // kLlama3: > low_freq_factor
  int64_t original_max_positions = 0;  // kLlama3: > 0 (Llama 3.1: 8192)

  bool operator==(const RopeScaling&) const = default;
};

// Hugging Face's rope_type of each: "default", "linear", "llama3".
inline const char* RopeScalingTypeName(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone: return "default";
    case RopeScalingType::kLinear: return "linear";
    case RopeScalingType::kLlama3: return "llama3";
  }
  return "unknown";
}

}  // namespace sk

#endif  // SHARDKIT_RUNTIME_OPS_ROPE_SCALING_H_
