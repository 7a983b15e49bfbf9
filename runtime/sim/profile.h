// Hardware profiles for the simulator, and how they price an op.
//
// A profile is a JSON file (runtime/sim/profiles/<name>.json) in which every
// number is an object {"value": x, "source": "where x comes from"}: a
// datasheet, a whitepaper, a published measurement, our own calibration run,
// or "assumption: ..." with the reasoning. Numbers are never fitted to the
// FSDP paper's end results (those are the simulator's held-out check).
//
//   {
//     "name": "a100-80g",
//     "description": "...",
//     "device":  { memory_bytes, launch_overhead_us, raw_alloc_us, raw_free_us,
//                  host_link_gbps },
//     "compute": { sm_count, gemm_peak_tflops {f32, bf16, f16}, gemm_efficiency,
//                  gemm_tiles [{m, n, relative_efficiency}], gemm_k_quantum,
//                  vector_tflops, memory_bandwidth_gbps, memory_efficiency,
//                  kernel_overhead_us,
//                  optional: gemm_efficiency_by_dtype {f32, bf16, f16},
//                            op_memory_efficiency {op name: fraction},
//                            attention {q_block, and either
//                                       fwd_efficiency, bwd_efficiency,
//                                       key_overhead, or curve_tokens,
//                                       curve_hidden, curves},
//                            gemm_table [{m, n, k, dtype, gflops}],
//                            op_rates {op name: {per: "byte"|"flop",
//                                                points: [[work, work/s], ...]}} },
//     "network": { ... }   (parsed by topology.h's ParseNetworkProfile)
//     optional "implementations": { "default": name,
//                 name: { description, optional gemm_fraction_by_dtype
//                         {dtype: fraction of the compute section's
//                         efficiency}, op_memory_efficiency {op: fraction} } }
//                 (whose kernels run on the hardware: the compute section
//                 is the hardware as the kernel libraries achieve it, kernel
//                 by kernel; an implementation says what one framework's own
//                 kernels lose against those rates. "reference" is the
//                 libraries' rates, "shardkit" this project's measured
//                 shortfall. A profile name "h100-80g:reference" picks one;
//                 a bare name takes the default)
//     optional "validation": { runs, ratio_low, ratio_median, ratio_high }
//                 (how far the planner's predicted throughput has landed from
//                 published runs on this hardware: predicted / published,
//                 written by //benchmarks/paper:planner_validation)
//     optional "host": { memory_bytes, memory_bandwidth_gbps,
//                        memory_efficiency, vector_tflops, op_overhead_us }
//                 (per GPU: the node's host memory, bandwidth and CPU FLOP/s
//                 over its GPUs; what FSDP's CPU offload runs on)
//   }
//
// Pricing (docs/simulator.md has the derivation):
//   GEMM: time = max(flops / (peak[dtype] * gemm_efficiency[dtype] * shape_eff),
//                    bytes / (memory_bandwidth * memory_efficiency))
//              + kernel_overhead,
//     shape_eff = max over tiles (relative_efficiency * tile_q * wave_q) * k_q:
//       tile_q = m n / (ceil(m/Tm) Tm * ceil(n/Tn) Tn)   (padding of edge tiles)
//       wave_q = CTAs / (ceil(CTAs / SMs) SMs), CTAs = ceil(m/Tm) ceil(n/Tn) batch
//       k_q    = k / (ceil(k/Kq) Kq)
//     (NVIDIA's "Matrix Multiplication Background User's Guide", sections
//     "Tile Quantization" and "Wave Quantization"; cuBLAS picks among several
//     tiles, modelled as the best of the profile's list). A profile with a
//     measured gemm_table (cpu-local) prices a GEMM from the table instead:
//     the rate is interpolated log-linearly in (log m, log n, log k) over the
//     measured grid (clamped at its edges) and includes the call's overhead.
//   Fused attention (flash_attention_fwd/bwd, whose cost carries m = q_len,
//   n = keys per query, k = head_dim, batch = batch x heads), with an
//   attention section:
//     time = max(flops / (peak[dtype] * eff_dir * wave_q * n / (n + key_overhead)),
//                bytes / bandwidth) + kernel_overhead,
//     eff_dir = fwd_efficiency or bwd_efficiency (the kernel's fraction of
//     the tensor-core peak on long sequences), wave_q the last wave of
//     batch x ceil(m / q_block) thread blocks over the SMs (one block per
//     q_block query rows, as FlashAttention-2 and cuDNN schedule them), and
//     n / (n + key_overhead) each block's fixed work (loading its queries,
//     writing its output) against its pass over the keys. Without the
//     section: the GEMM rate, or memory bound.
//     With measured curves (attention.curves: a kernel's published FLOP/s
//     by sequence length, per pass, mask and head size) the kernel's rate
//     replaces eff_dir x n / (n + key_overhead):
//       rate = the curve of this pass and mask, interpolated linearly in
//              log2(sequence) between its points (clamped at its ends) and
//              in log2(head_dim) between the head sizes measured (clamped);
//              the sequence is q_len for a causal call, the keys per query
//              otherwise; a pass with no causal curve takes its non-causal
//              curve times the forward's causal / non-causal ratio at the
//              same sequence and head size (an assumption: the mask costs
//              both passes alike);
//       eff  = rate / the 16-bit peak x wave_q / wave_q of the measured
//              calls (curve_tokens tokens per call, curve_hidden / head_dim
//              heads: the published benchmark's shape).
//   Other ops: time = max(bytes / bandwidth[op], flops / vector_peak)
//              + kernel_overhead, bandwidth[op] = the datasheet rate x
//     op_memory_efficiency[op] where measured, x memory_efficiency otherwise;
//     where op_rates measured the op: time = max(kernel_overhead,
//     work / rate(work)), the rate interpolated log-log between the measured
//     sizes (clamped at the ends), work = bytes (or flops for per_flop ops).
//
// Thread safety: profiles are values; the functions are pure.
#ifndef SHARDKIT_RUNTIME_SIM_PROFILE_H_
#define SHARDKIT_RUNTIME_SIM_PROFILE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/sim/sim_device.h"

namespace sk::sim {

// One thread-block tile cuBLAS may choose, and its efficiency relative to the
// largest tile (smaller tiles reuse less data per load).
struct GemmTile {
  int64_t m = 0;
  int64_t n = 0;
  double relative_efficiency = 1;
};

// One measured GEMM (cpu-local): C[m,n] = A[m,k] B[k,n] at `flops_per_s`,
// all overheads of the call included.
struct GemmPoint {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  DType dtype = DType::kF32;
  double flops_per_s = 0;
};

// Measured rates of one op name by size (cpu-local): at `work` bytes (or
// flops, for per_flop ops such as attention) the op ran at `rate` work per
// second, all overheads of the call included. Points sorted by work.
struct OpRate {
  bool per_flop = false;
  std::vector<std::pair<double, double>> points;  // (work, work per second)
};

struct ComputeProfile {
  int64_t sm_count = 1;
  // Peak GEMM FLOP/s by the A/B dtype (bf16/f16 on tensor cores). A dtype
  // without an entry uses f32's.
  std::map<DType, double> gemm_peak_flops;
  // The fraction of peak that large, well-shaped GEMMs reach, by the A/B
  // dtype where gemm_efficiency_by_dtype gives one, gemm_efficiency
  // otherwise.
  double gemm_efficiency = 1;
  std::map<DType, double> gemm_efficiency_by_dtype;
  // Empty: no tile or wave quantisation.
  std::vector<GemmTile> gemm_tiles;
  int64_t gemm_k_quantum = 1;
  // Measured GEMM grid; when non-empty it prices GEMMs (see the file comment).
  std::vector<GemmPoint> gemm_table;
  // Peak FLOP/s of non-GEMM arithmetic (CUDA cores, f32).
  double vector_flops = 0;
  // Achievable device-memory bandwidth (datasheet rate x efficiency), bytes/s.
  double memory_bandwidth = 0;
  // The datasheet rate, bytes/s (0: as memory_bandwidth), and the fraction
  // of it each op name reaches where that was measured (the memory-bound
  // ops' own kernels: a LayerNorm backward that reads rows twice reaches
  // less than a copy).
  double memory_bandwidth_peak = 0;
  std::map<std::string, double, std::less<>> op_memory_efficiency;
  // Fused attention's efficiency (the pricing above); unset: priced as a
  // GEMM of its flops.
  struct Attention {
    double fwd_efficiency = 0;
    double bwd_efficiency = 0;
    int64_t q_block = 128;
    double key_overhead = 0;
    // A kernel's measured rate by sequence length for one pass, mask and
    // head size (the file comment); points (sequence length, FLOP/s, as the
    // publications count them: 4 per score pair and head dimension forward,
    // 2.5x that backward) sorted by length. When any is given they price
    // fused attention and the efficiencies above are unused.
    struct Curve {
      bool backward = false;
      bool causal = false;
      int64_t head_dim = 0;
      std::vector<std::pair<double, double>> points;
    };
    std::vector<Curve> curves;
    // The measured calls' shape: batch x sequence tokens, heads x head_dim.
    int64_t curve_tokens = 0;
    int64_t curve_hidden = 0;
  };
  std::optional<Attention> attention;
  // Fixed device time of every kernel.
  double kernel_overhead_s = 0;
  // Measured per-op rates by op name, replacing the roofline for that op.
  std::map<std::string, OpRate, std::less<>> op_rates;
};

// The validation table's spread for a profile (benchmarks/results/
// planner_validation.md): over `runs` published runs that were not used to
// build the cost model, predicted / published throughput lay in
// [ratio_low, ratio_high] with this median.
struct ValidationSpread {
  int runs = 0;
  double ratio_low = 0;
  double ratio_median = 0;
  double ratio_high = 0;
  std::string source;
};

// What one framework's kernels lose against the hardware's library rates
// (the profile's "implementations" section): applied over the compute
// section by ParseProfile.
struct KernelImplementation {
  std::string description;
  // Multiplies the compute section's GEMM efficiency of each dtype listed.
  std::map<DType, double> gemm_fraction_by_dtype;
  // Replaces (or adds) the compute section's per-op bandwidth fractions.
  std::map<std::string, double, std::less<>> op_memory_efficiency;
};

struct SimProfile {
  std::string name;
  std::string description;
  // The implementation applied to `compute` ("" when the profile has no
  // implementations section), and every one the profile describes.
  std::string implementation;
  std::string default_implementation;
  std::map<std::string, KernelImplementation, std::less<>> implementations;
  SimDeviceSpec device;
  ComputeProfile compute;
  // The host's rates per GPU ("host" section; device.host_memory_bytes is
  // its memory): host ops are priced with KernelSeconds over these
  // (memory_bandwidth = rate x efficiency, vector_flops, kernel_overhead_s =
  // the per-op overhead). Unset when the profile has no host section.
  std::optional<ComputeProfile> host;
  // The "network" section as written, for topology.h's ParseNetworkProfile
  // (null when the profile has none: a single device).
  nlohmann::json network;
  // Unset when no published run on this hardware was checked.
  std::optional<ValidationSpread> validation;
};

// Parses a profile document. `origin` (a path or "builtin:a100-80g") names it
// in errors. InvalidArgument naming the key for a missing or malformed
// section, a number without a "source", or an out-of-range value.
// `implementation` names the kernels the compute section is priced with
// (KernelImplementation); "" takes the profile's default. NotFound naming
// the ones it has for an implementation it does not describe.
StatusOr<SimProfile> ParseProfile(const nlohmann::json& doc, std::string_view origin,
                                  std::string_view implementation = "");
// Reads and parses the file at `path`. NotFound if it cannot be read;
// ResourceExhausted if it is larger than 16 MiB (an endless file such as
// /dev/zero is read no further); InvalidArgument for malformed JSON (with the
// parser's message), JSON nested deeper than a profile ever is, or content.
StatusOr<SimProfile> LoadProfileFile(const std::string& path, std::string_view implementation = "");
// A profile by name: one compiled into the library ("a100-80g", "h100-80g", "h200-141g",
// "cpu-local"), or, when `name_or_path` ends in ".json", that file.
// NotFound listing the built-in names otherwise. Either may end in
// ":<implementation>" ("h100-80g:reference"): the kernels it is priced with
// (ParseProfile); without it, the profile's default.
StatusOr<SimProfile> LoadProfile(std::string_view name_or_path);
// Splits "name:implementation" into its two parts (implementation "" when
// there is no ':'; a path's directories may not contain one).
std::pair<std::string, std::string> SplitProfileName(std::string_view name_or_path);
// The names of the compiled-in profiles, sorted.
std::vector<std::string> BuiltinProfileNames();

// The shape efficiency of a GEMM in (0, 1] (file comment); 1 for a profile
// without tiles. m, n, k, batch >= 1.
double GemmShapeEfficiency(const ComputeProfile& p, int64_t m, int64_t n, int64_t k,
                           int64_t batch);
// Seconds of a GEMM of `batch` m x n x k products with A/B in `dtype`,
// moving `bytes` bytes and doing `flops` flops. Dimensions < 1 take only the
// kernel overhead.
double GemmSeconds(const ComputeProfile& p, int64_t m, int64_t n, int64_t k, int64_t batch,
                   DType dtype, double flops, double bytes);
// The efficiency of a fused attention kernel (the file comment's
// eff_dir x wave_q x n / (n + key_overhead), or the measured curves' rate
// over the 16-bit peak x the wave ratio) for `batch` (x heads) sequences of
// m queries over n keys each, of `head_dim`, causal or not; a fraction of
// the dtype's GEMM peak. 0 when the profile has no attention section.
double AttentionEfficiency(const ComputeProfile& p, bool backward, int64_t m, int64_t n,
                           int64_t batch, int64_t head_dim = 0, bool causal = false);
// Seconds of any other kernel named `name` (op_rates key).
double KernelSeconds(const ComputeProfile& p, std::string_view name, double flops,
                     double bytes);

}  // namespace sk::sim

#endif  // SHARDKIT_RUNTIME_SIM_PROFILE_H_
