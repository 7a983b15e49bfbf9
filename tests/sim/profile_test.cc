// Profiles (runtime/sim/profile.h): the loader's checks, the built-in
// profiles, and the pricing formulas recomputed independently.
#include "runtime/sim/profile.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/util/child_process.h"

namespace sk::sim {
namespace {

using sk::testing::InChild;

nlohmann::json Sourced(nlohmann::json value) {
  return {{"value", std::move(value)}, {"source", "test"}};
}

nlohmann::json MinimalProfile() {
  return {{"name", "tiny"},
          {"device",
           {{"memory_bytes", Sourced(1 << 30)},
            {"launch_overhead_us", Sourced(5)},
            {"raw_alloc_us", Sourced(10)},
            {"raw_free_us", Sourced(20)},
            {"host_link_gbps", Sourced(10)}}},
          {"compute",
           {{"sm_count", Sourced(4)},
            {"gemm_peak_tflops", {{"f32", Sourced(1)}, {"bf16", Sourced(4)}}},
            {"gemm_efficiency", Sourced(0.5)},
            {"vector_tflops", Sourced(0.5)},
            {"memory_bandwidth_gbps", Sourced(100)},
            {"memory_efficiency", Sourced(0.8)},
            {"kernel_overhead_us", Sourced(3)}}}};
}

TEST(ProfileTest, ParsesUnitsIntoSeconds) {
  StatusOr<SimProfile> p = ParseProfile(MinimalProfile(), "test");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "tiny");
  EXPECT_EQ(p->device.memory_bytes, size_t{1} << 30);
  EXPECT_DOUBLE_EQ(p->device.launch_overhead_s, 5e-6);
  EXPECT_DOUBLE_EQ(p->device.raw_free_s, 20e-6);
  EXPECT_DOUBLE_EQ(p->device.host_link_bytes_per_s, 10e9);
  EXPECT_DOUBLE_EQ(p->compute.memory_bandwidth, 80e9);
  EXPECT_DOUBLE_EQ(p->device.memory_bandwidth_bytes_per_s, 80e9);
  EXPECT_DOUBLE_EQ(p->compute.gemm_peak_flops.at(DType::kBF16), 4e12);
  EXPECT_DOUBLE_EQ(p->compute.kernel_overhead_s, 3e-6);
  EXPECT_TRUE(p->network.is_null());
}

// The optional host section (CPU offload): memory per GPU into the device
// spec, rates into SimProfile::host; each number needs its source; the
// built-in GPU profiles carry one, cpu-local does not.
TEST(ProfileTest, HostSectionIsOptionalAndSourced) {
  nlohmann::json doc = MinimalProfile();
  StatusOr<SimProfile> none = ParseProfile(doc, "test");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->host.has_value());
  EXPECT_EQ(none->device.host_memory_bytes, 0u);
  auto num = [](double v) { return nlohmann::json{{"value", v}, {"source", "test"}}; };
  doc["host"] = {{"memory_bytes", num(1 << 30)}, {"memory_bandwidth_gbps", num(50)},
                 {"memory_efficiency", num(0.5)}, {"vector_tflops", num(2)},
                 {"op_overhead_us", num(7)}};
  StatusOr<SimProfile> p = ParseProfile(doc, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->host.has_value());
  EXPECT_EQ(p->device.host_memory_bytes, size_t{1} << 30);
  EXPECT_DOUBLE_EQ(p->host->memory_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(p->host->vector_flops, 2e12);
  EXPECT_DOUBLE_EQ(p->host->kernel_overhead_s, 7e-6);
  doc["host"]["vector_tflops"].erase("source");
  Status s = ParseProfile(doc, "test").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host.vector_tflops"), std::string::npos) << s;
  for (const char* name : {"a100-80g", "h100-80g", "h200-141g"}) {
    StatusOr<SimProfile> b = LoadProfile(name);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->host.has_value()) << name;
    EXPECT_EQ(b->device.host_memory_bytes, size_t{256} << 30) << name;  // 2 TiB over 8 GPUs
  }
  EXPECT_FALSE(LoadProfile("cpu-local")->host.has_value());
}

// device.release_page_bytes is optional and sourced: cpu-local's is the host's
// page size (the CPU device releases free pages), the GPU profiles have none
// (cudaMalloc's segments go back whole), and a value that is not a power of
// two is refused.
TEST(ProfileTest, ReleasePageBytesIsOptionalSourcedAndAPowerOfTwo) {
  nlohmann::json doc = MinimalProfile();
  EXPECT_EQ(ParseProfile(doc, "test")->device.release_page_bytes, 0u);
  doc["device"]["release_page_bytes"] = {{"value", 4096}, {"source", "test"}};
  StatusOr<SimProfile> p = ParseProfile(doc, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->device.release_page_bytes, 4096u);
  doc["device"]["release_page_bytes"] = {{"value", 3000}, {"source", "test"}};
  Status odd = ParseProfile(doc, "test").status();
  EXPECT_EQ(odd.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("release_page_bytes"), std::string::npos) << odd;
  doc["device"]["release_page_bytes"] = 4096;  // no source
  EXPECT_EQ(ParseProfile(doc, "test").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadProfile("cpu-local")->device.release_page_bytes, 4096u);
  for (const char* name : {"a100-80g", "h100-80g", "h200-141g"}) {
    EXPECT_EQ(LoadProfile(name)->device.release_page_bytes, 0u) << name;
  }
}

// h200-141g is h100-80g's GH100 with 141 GB of HBM3e at 4.8 TB/s: the same
// compute, network and host; only device memory and its bandwidth differ.
TEST(ProfileTest, H200IsTheH100ChipWithMoreAndFasterMemory) {
  StatusOr<SimProfile> h100 = LoadProfile("h100-80g");
  StatusOr<SimProfile> h200 = LoadProfile("h200-141g");
  ASSERT_TRUE(h100.ok()) << h100.status();
  ASSERT_TRUE(h200.ok()) << h200.status();
  EXPECT_EQ(h200->name, "h200-141g");
  EXPECT_EQ(h200->device.memory_bytes, size_t{143771} << 20);  // nvidia-smi on an H200
  // The datasheets' rates; each streams at its own measured fraction.
  EXPECT_DOUBLE_EQ(h200->compute.memory_bandwidth_peak / h100->compute.memory_bandwidth_peak, 4800.0 / 3350.0);
  EXPECT_EQ(h200->compute.sm_count, h100->compute.sm_count);
  EXPECT_EQ(h200->compute.gemm_peak_flops, h100->compute.gemm_peak_flops);
  EXPECT_DOUBLE_EQ(h200->compute.gemm_efficiency, h100->compute.gemm_efficiency);
  EXPECT_DOUBLE_EQ(h200->compute.vector_flops, h100->compute.vector_flops);
  EXPECT_EQ(h200->device.host_memory_bytes, h100->device.host_memory_bytes);
  ASSERT_TRUE(h200->host.has_value() && h100->host.has_value());
  EXPECT_DOUBLE_EQ(h200->host->memory_bandwidth, h100->host->memory_bandwidth);
  // The network section differs only in its sources' wording and its
  // measured curve.
  auto values = [](const nlohmann::json& j) {
    nlohmann::json flat = j.flatten();
    for (auto it = flat.begin(); it != flat.end();) {
      const std::string& k = it.key();
      const bool source = k.size() >= 7 && k.compare(k.size() - 7, 7, "/source") == 0;
      if (source || k == "/note" || k.rfind("/measured_bus_bandwidth", 0) == 0) {
        it = flat.erase(it);
      } else {
        ++it;
      }
    }
    return flat;
  };
  EXPECT_EQ(values(h200->network), values(h100->network));
  // Each has its own measured nccl-tests curve: all_reduce on the 8 GPUs of
  // one node, each measured on its own GPU.
  for (const nlohmann::json* n : {&h200->network, &h100->network}) {
    ASSERT_TRUE(n->contains("measured_bus_bandwidth"));
    const nlohmann::json& c = n->at("measured_bus_bandwidth").at(0);
    EXPECT_EQ(c.at("ranks"), 8);
    EXPECT_EQ(c.at("collectives"), nlohmann::json::array({"all_reduce"}));
  }
  EXPECT_NE(h200->network["measured_bus_bandwidth"][0]["source"].get<std::string>().find("H200"),
            std::string::npos);
}

TEST(ProfileTest, EveryNumberNeedsASource) {
  nlohmann::json doc = MinimalProfile();
  doc["compute"]["gemm_efficiency"].erase("source");
  Status s = ParseProfile(doc, "test").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compute.gemm_efficiency"), std::string::npos) << s;
  EXPECT_NE(s.message().find("source"), std::string::npos) << s;
}

TEST(ProfileTest, BadValuesAreNamed) {
  struct Case {
    const char* section;
    const char* key;
    nlohmann::json value;
  } cases[] = {
      {"compute", "gemm_efficiency", Sourced(1.5)},
      {"compute", "sm_count", Sourced(0)},
      {"device", "launch_overhead_us", Sourced(-1)},
      {"device", "raw_alloc_us", Sourced("fast")},
      {"compute", "memory_bandwidth_gbps", 100},
      // Physical quantities must be positive (issue 35: memory_bytes 0 was
      // accepted and the planner fitted models into "0.00 GiB").
      {"device", "memory_bytes", Sourced(0)},
      {"device", "memory_bytes", Sourced(-1)},
      {"device", "host_link_gbps", Sourced(0)},
      {"compute", "vector_tflops", Sourced(0)},
      {"compute", "gemm_efficiency", Sourced(0)},
      {"compute", "memory_bandwidth_gbps", Sourced(0)},
      {"compute", "memory_efficiency", Sourced(0)},
      {"compute", "gemm_tiles", Sourced(nlohmann::json::array())},
  };
  for (const Case& c : cases) {
    nlohmann::json doc = MinimalProfile();
    doc[c.section][c.key] = c.value;
    if (std::string(c.key) == "gemm_tiles") doc[c.section]["gemm_k_quantum"] = Sourced(32);
    Status s = ParseProfile(doc, "test").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.key << " = " << c.value.dump();
    EXPECT_NE(s.message().find(std::string(c.section) + "." + c.key), std::string::npos) << s;
  }
  // Out-of-range values read back as given: 1e-300 printed as "0.000000"
  // and 1e300 as three hundred digits.
  for (double bad : {1e-300, 1e300}) {
    nlohmann::json doc = MinimalProfile();
    doc["compute"]["memory_bandwidth_gbps"] = Sourced(bad);
    Status s = ParseProfile(doc, "test").status();
    char want[96];
    std::snprintf(want, sizeof(want), "value %g is outside [0.001, 1e+07]", bad);
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
    EXPECT_LT(s.message().size(), 200u) << s;
  }
  nlohmann::json doc = MinimalProfile();
  doc["compute"]["gemm_peak_tflops"]["f64x"] = Sourced(1);
  EXPECT_EQ(ParseProfile(doc, "test").status().code(), StatusCode::kInvalidArgument);
  doc = MinimalProfile();
  doc.erase("device");
  EXPECT_EQ(ParseProfile(doc, "test").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProfile(nlohmann::json::array(), "test").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ProfileTest, FilesAndBuiltins) {
  EXPECT_EQ(LoadProfileFile("/nonexistent/x.json").status().code(), StatusCode::kNotFound);
  const std::string path = ::testing::TempDir() + "/bad_profile.json";
  {
    std::ofstream(path) << "{ not json";
  }
  EXPECT_EQ(LoadProfile(path).status().code(), StatusCode::kInvalidArgument);
  {
    std::ofstream(path) << MinimalProfile().dump();
  }
  StatusOr<SimProfile> from_file = LoadProfile(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(from_file->name, "tiny");
  std::remove(path.c_str());

  Status unknown = LoadProfile("b200").status();
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("a100-80g"), std::string::npos) << unknown;
  for (const std::string& name : BuiltinProfileNames()) {
    StatusOr<SimProfile> p = LoadProfile(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ(p->name, name);
  }
  StatusOr<SimProfile> a100 = LoadProfile("a100-80g");
  ASSERT_TRUE(a100.ok()) << a100.status();
  EXPECT_EQ(a100->device.memory_bytes, size_t{80} << 30);
  EXPECT_EQ(a100->compute.sm_count, 108);
  EXPECT_DOUBLE_EQ(a100->compute.gemm_peak_flops.at(DType::kBF16), 312e12);
}

// The "network" section is kept as parsed JSON and copied with the profile;
// nlohmann copies recursively, so a section nested 10^6 deep overflowed the
// stack. The file's nesting is bounded before it is parsed.
TEST(ProfileTest, DeeplyNestedFileIsInvalidArgumentNotAStackOverflow) {
  const std::string path = ::testing::TempDir() + "/deep_profile.json";
  {
    std::string text = MinimalProfile().dump();
    text.pop_back();
    std::ofstream(path) << text << ",\"network\":" << std::string(1000000, '[')
                        << std::string(1000000, ']') << "}";
  }
  int rc = InChild([&] {
    StatusOr<SimProfile> p = LoadProfile(path);
    if (p.ok()) return 1;
    if (p.status().code() != StatusCode::kInvalidArgument) return 2;
    if (std::string(p.status().message()).find("nested deeper") == std::string::npos) return 3;
    if (std::string(p.status().message()).find(path) == std::string::npos) return 4;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "exit code (128 + signal if it crashed)";
  std::remove(path.c_str());
}

// A profile path that names something other than a regular file is refused
// at once: an endless device (here a symlink to /dev/zero) is not read until
// the heap runs out, and a FIFO without a writer does not block the loader
// (its open waited for ever). In a child with an alarm, so a hang fails.
TEST(ProfileTest, ProfilePathThatIsNotARegularFileIsRefusedWithoutBlocking) {
  const std::string endless = ::testing::TempDir() + "/endless_profile.json";
  const std::string fifo = ::testing::TempDir() + "/fifo_profile.json";
  std::remove(endless.c_str());
  std::remove(fifo.c_str());
  ASSERT_EQ(::symlink("/dev/zero", endless.c_str()), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {endless, fifo}) {
    int rc = InChild([&] {
      ::alarm(20);
      StatusOr<SimProfile> p = LoadProfile(path);
      if (p.ok()) return 1;
      if (p.status().code() != StatusCode::kInvalidArgument) return 2;
      if (std::string(p.status().message()).find(path) == std::string::npos) return 3;
      if (std::string(p.status().message()).find("not a regular file") == std::string::npos) return 4;
      return 0;
    });
    EXPECT_EQ(rc, 0) << path << ": exit code (128 + signal if it crashed; 142: blocked)";
  }
  std::remove(endless.c_str());
  std::remove(fifo.c_str());
}

ComputeProfile Tiled() {
  ComputeProfile p;
  p.sm_count = 108;
  p.gemm_peak_flops[DType::kF32] = 19.5e12;
  p.gemm_peak_flops[DType::kBF16] = 312e12;
  p.gemm_efficiency = 0.859;
  p.gemm_tiles = {{256, 128, 1.0}, {128, 128, 0.9}, {64, 64, 0.65}};
  p.gemm_k_quantum = 32;
  p.memory_bandwidth = 2039e9 * 0.9;
  p.vector_flops = 19.5e12;
  p.kernel_overhead_s = 2e-6;
  return p;
}

TEST(PricingTest, OneFullWaveOfLargeTilesIsFullyEfficient) {
  ComputeProfile p = Tiled();
  // 12 x 9 tiles of 256 x 128 = 108 CTAs: exactly one wave, no padding.
  EXPECT_DOUBLE_EQ(GemmShapeEfficiency(p, 12 * 256, 9 * 128, 4096, 1), 1.0);
  // One CTA more needs a second wave; the best tile recovers part of it.
  const double e = GemmShapeEfficiency(p, 109 * 256, 128, 4096, 1);
  // 256x128: 109 CTAs in 2 waves; 128x128: 218 in 3 waves; 64x64: 872 in 9.
  const double expected = std::max({109.0 / 216, 0.9 * 218.0 / 324, 0.65 * 872.0 / 972});
  EXPECT_DOUBLE_EQ(e, expected);
  // k not a multiple of the k step pads the last step.
  EXPECT_DOUBLE_EQ(GemmShapeEfficiency(p, 12 * 256, 9 * 128, 48, 1), 48.0 / 64);
  // Tiny m: the 64x64 tile pads 8 rows to 64.
  EXPECT_NEAR(GemmShapeEfficiency(p, 8, 64 * 108, 4096, 1), 0.65 * 8.0 / 64, 1e-12);
  // Batches fill waves too.
  EXPECT_DOUBLE_EQ(GemmShapeEfficiency(p, 256, 128, 64, 108), 1.0);
}

TEST(PricingTest, GemmIsARooflineOverTheShapeEfficiency) {
  ComputeProfile p = Tiled();
  const int64_t m = 4096, n = 4096, k = 4096;
  const double flops = 2.0 * m * n * k;
  const double bytes = 2.0 * (m * k + k * n) + 4.0 * m * n;
  // 256x128 tiles: 16 * 32 = 512 CTAs in 5 waves of 108.
  const double eff = 512.0 / 540;
  const double t = GemmSeconds(p, m, n, k, 1, DType::kBF16, flops, bytes);
  EXPECT_NEAR(t, flops / (312e12 * 0.859 * eff) + 2e-6, 1e-12);
  // f32 runs on CUDA cores.
  const double t32 = GemmSeconds(p, m, n, k, 1, DType::kF32, flops, bytes);
  EXPECT_NEAR(t32, flops / (19.5e12 * 0.859 * eff) + 2e-6, 1e-12);
  // A matrix-vector product is memory bound.
  const double gemv_bytes = 2.0 * (4096.0 * 4096 + 4096) + 4.0 * 4096;
  const double gemv = GemmSeconds(p, 4096, 1, 4096, 1, DType::kBF16, 2.0 * 4096 * 4096, gemv_bytes);
  EXPECT_GE(gemv, gemv_bytes / p.memory_bandwidth + 2e-6 - 1e-15);
  // Degenerate shapes cost the kernel overhead only.
  EXPECT_DOUBLE_EQ(GemmSeconds(p, 0, 4, 4, 1, DType::kF32, 0, 0), 2e-6);
}

TEST(PricingTest, OtherKernelsAreBandwidthOrFlopBound) {
  ComputeProfile p = Tiled();
  EXPECT_NEAR(KernelSeconds(p, "copy", 0, 1e9), 1e9 / (2039e9 * 0.9) + 2e-6, 1e-15);
  EXPECT_NEAR(KernelSeconds(p, "gelu_fwd", 1e12, 1e6), 1e12 / 19.5e12 + 2e-6, 1e-15);
  // A measured op: rates by size, interpolated log-log, overhead as a floor.
  p.op_rates["gelu_fwd"] = OpRate{false, {{1e3, 1e8}, {1e7, 1e10}}};
  EXPECT_NEAR(KernelSeconds(p, "gelu_fwd", 1e12, 1e7), 1e-3, 1e-15);
  EXPECT_NEAR(KernelSeconds(p, "gelu_fwd", 1e12, 1e5), 1e5 / 1e9, 1e-15);  // midpoint: 1e9 B/s
  EXPECT_NEAR(KernelSeconds(p, "gelu_fwd", 1e12, 1e9), 1e9 / 1e10, 1e-15);  // clamped rate
  EXPECT_NEAR(KernelSeconds(p, "gelu_fwd", 1e12, 10), 2e-6, 1e-15);        // overhead floor
  p.op_rates["attention_fwd"] = OpRate{true, {{1e6, 1e9}}};
  EXPECT_NEAR(KernelSeconds(p, "attention_fwd", 1e9, 1.0), 1.0, 1e-12);
}

TEST(ProfileTest, OpRatesAreChecked) {
  nlohmann::json doc = MinimalProfile();
  doc["compute"]["op_rates"] = Sourced({{"gelu_fwd", {{"per", "byte"}, {"points", {{1e3, 1e8}, {1e2, 1e9}}}}}});
  Status s = ParseProfile(doc, "test").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compute.op_rates.gelu_fwd"), std::string::npos) << s;
  doc["compute"]["op_rates"] = Sourced({{"gelu_fwd", {{"per", "flop"}, {"points", {{1e3, 1e8}, {1e4, 1e9}}}}}});
  StatusOr<SimProfile> ok = ParseProfile(doc, "test");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->compute.op_rates.at("gelu_fwd").per_flop);
}

// A tile is a few hundred elements on a side; one of 2^63 - 1 made pricing
// overflow int64 (ceil(m / Tm) computed as (m + Tm - 1) / Tm), so the loader
// bounds tiles as it bounds gemm_k_quantum.
TEST(ProfileTest, HugeGemmTilesAreRefused) {
  for (int64_t huge : {std::numeric_limits<int64_t>::max(), int64_t{1} << 40}) {
    for (const char* side : {"m", "n"}) {
      nlohmann::json doc = MinimalProfile();
      nlohmann::json tile = {{"m", 128}, {"n", 128}, {"relative_efficiency", 1.0}};
      tile[side] = huge;
      doc["compute"]["gemm_tiles"] = Sourced(nlohmann::json::array({tile}));
      doc["compute"]["gemm_k_quantum"] = Sourced(32);
      StatusOr<SimProfile> p = ParseProfile(doc, "test");
      ASSERT_FALSE(p.ok()) << side << " = " << huge << ": efficiency "
                           << GemmShapeEfficiency(p->compute, 1000, 1000, 1000, 1);
      EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(p.status().message().find("compute.gemm_tiles"), std::string::npos) << p.status();
    }
  }
}

TEST(PricingTest, MeasuredTableInterpolatesInLogSpace) {
  ComputeProfile p = Tiled();
  for (int64_t m : {16, 256}) {
    for (int64_t n : {16, 256}) {
      for (int64_t k : {16, 256}) {
        // Rate grows with every dimension.
        p.gemm_table.push_back({m, n, k, DType::kF32, 1e9 * (m / 16) * (n / 16) * (k / 16)});
      }
    }
  }
  auto seconds = [&](int64_t m, int64_t n, int64_t k) {
    const double flops = 2.0 * m * n * k;
    return GemmSeconds(p, m, n, k, 1, DType::kF32, flops, 0);
  };
  // On grid points: the measured rate (no extra overhead: it is included).
  EXPECT_NEAR(seconds(16, 16, 16), 2.0 * 16 * 16 * 16 / 1e9, 1e-15);
  // At the geometric midpoint of every axis: the geometric mean, 4^3.
  EXPECT_NEAR(seconds(64, 64, 64), 2.0 * 64 * 64 * 64 / (1e9 * 64), 1e-15);
  // Beyond the grid the edge rate holds; bf16 without entries uses f32's.
  EXPECT_NEAR(seconds(1024, 256, 256), 2.0 * 1024 * 256 * 256 / (1e9 * 4096), 1e-15);
  EXPECT_NEAR(GemmSeconds(p, 16, 16, 16, 1, DType::kBF16, 2.0 * 4096, 0), 2.0 * 4096 / 1e9,
              1e-15);
}

// bf16 GEMMs may have their own measured fraction (the H100/H200's in-step
// rate); other dtypes keep gemm_efficiency.
TEST(PricingTest, GemmEfficiencyByDtypeOverridesTheDefault) {
  ComputeProfile p = Tiled();
  p.gemm_efficiency_by_dtype[DType::kBF16] = 0.5;
  const int64_t m = 12 * 256, n = 9 * 128, k = 4096;  // one full wave: shape efficiency 1
  const double flops = 2.0 * m * n * k;
  EXPECT_NEAR(GemmSeconds(p, m, n, k, 1, DType::kBF16, flops, 0), flops / (312e12 * 0.5) + 2e-6, 1e-12);
  EXPECT_NEAR(GemmSeconds(p, m, n, k, 1, DType::kF32, flops, 0), flops / (19.5e12 * 0.859) + 2e-6, 1e-12);
}

// A memory-bound op whose bandwidth was measured runs at that fraction of the
// datasheet rate; the others at memory_efficiency.
TEST(PricingTest, MeasuredOpBandwidthReplacesTheAssumedFraction) {
  ComputeProfile p = Tiled();
  p.memory_bandwidth_peak = 2039e9;
  p.op_memory_efficiency["layer_norm_bwd"] = 0.25;
  EXPECT_NEAR(KernelSeconds(p, "layer_norm_bwd", 0, 1e9), 1e9 / (2039e9 * 0.25) + 2e-6, 1e-15);
  EXPECT_NEAR(KernelSeconds(p, "copy", 0, 1e9), 1e9 / (2039e9 * 0.9) + 2e-6, 1e-15);
}

// Fused attention: the direction's efficiency, times the last wave of
// ceil(q / q_block) blocks per sequence and head, times each block's pass over
// n keys against its fixed work.
TEST(PricingTest, FusedAttentionEfficiencyFollowsBlocksAndKeys) {
  ComputeProfile p = Tiled();  // 108 SMs
  EXPECT_EQ(AttentionEfficiency(p, false, 1024, 512, 8), 0.0);  // no attention section
  p.attention = ComputeProfile::Attention{0.7, 0.6, 128, 256};
  // 8 blocks of 128 queries x 27 sequences*heads = 216 blocks: two full waves.
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 1024, 768, 27), 0.7 * 768.0 / 1024);
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, true, 1024, 768, 27), 0.6 * 768.0 / 1024);
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 1024, 768, 0), 0.7);  // no sequences: the base figure
  // One block more than two waves: 217 of 324 slots; 256 keys: half the rate.
  const double partial = AttentionEfficiency(p, false, 128, 256, 217);
  EXPECT_DOUBLE_EQ(partial, 0.7 * (217.0 / 324) * 0.5);
  // Longer sequences approach the long-sequence figure.
  // (128 blocks per sequence x 27 = 3456: 32 full waves of 108.)
  EXPECT_GT(AttentionEfficiency(p, false, 16384, 8192, 27), 0.7 * 0.96);
}

// Measured attention curves (profile.h): the rate of the call's pass, mask
// and head size at its sequence, over the 16-bit peak, times its last wave
// against the published calls' (16k tokens, hidden 2048).
ComputeProfile::Attention TestCurves() {
  ComputeProfile::Attention a;
  a.q_block = 128;
  a.curve_tokens = 16384;
  a.curve_hidden = 2048;
  using Curve = ComputeProfile::Attention::Curve;
  a.curves = {Curve{false, false, 64, {{512, 100e12}, {2048, 200e12}}},
              Curve{false, false, 128, {{512, 150e12}, {2048, 300e12}}},
              Curve{false, true, 128, {{512, 75e12}, {2048, 240e12}}},
              Curve{true, false, 128, {{512, 100e12}, {2048, 200e12}}}};
  return a;
}

TEST(PricingTest, AttentionCurvesPriceByPassMaskHeadSizeAndSequence) {
  ComputeProfile p = Tiled();  // 108 SMs, bf16 peak 312 TFLOP/s
  p.attention = TestCurves();
  // 32 sequences x 16 heads of 512 (4 blocks each): the published call's
  // 2048 blocks, so its wave cancels: the measured point itself.
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 512, 512, 512, 128, false), 150e12 / 312e12);
  // 1024 tokens, halfway in log2 between 512 and 2048 (2048 blocks again).
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 1024, 1024, 256, 128, false), 225e12 / 312e12);
  // Head size 90, between the 64 and 128 curves in log2(head_dim); the
  // published call then has 2048 / 90 heads: compare against that wave.
  const double f = std::log2(90.0 / 64);
  const double bench_blocks = 32 * (2048.0 / 90) * 4;
  const double bench_fill = bench_blocks / (std::ceil(bench_blocks / 108) * 108);
  const double call_fill = 512.0 * 4 / (std::ceil(512.0 * 4 / 108) * 108);
  EXPECT_NEAR(AttentionEfficiency(p, false, 512, 512, 512, 90, false),
              (100e12 + f * 50e12) / 312e12 * call_fill / bench_fill, 1e-12);
  // Beyond the measured sequences: the last point (the wave is the same
  // as the published call's: one sequence of 16 heads).
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 100000, 100000, 16, 128, false), 300e12 / 312e12);
  // Causal: the causal curve at the query length (n is half of it).
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 2048, 1025, 128, 128, true), 240e12 / 312e12);
  // Backward has no causal curve: its non-causal rate x the forward's
  // causal / non-causal ratio at that sequence (240 / 300).
  EXPECT_NEAR(AttentionEfficiency(p, true, 2048, 1025, 128, 128, true), 200e12 * 0.8 / 312e12, 1e-12);
  // A call of 4 blocks fills 4 of 108 SMs; the published call 2048 of 2052.
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 512, 512, 1, 128, false),
                   150e12 / 312e12 * (4.0 / 108) / (2048.0 / 2052));
  // The key overhead and the fixed efficiencies are not used with curves.
  p.attention->key_overhead = 1e6;
  p.attention->fwd_efficiency = 0.01;
  EXPECT_DOUBLE_EQ(AttentionEfficiency(p, false, 512, 512, 512, 128, false), 150e12 / 312e12);
}

nlohmann::json CurveJson(const char* pass, bool causal, int head_dim, nlohmann::json tflops) {
  return {{"pass", pass}, {"causal", causal}, {"head_dim", head_dim}, {"tflops", std::move(tflops)},
          {"source", "test figure"}};
}

TEST(ProfileTest, AttentionCurvesAreParsedAndChecked) {
  nlohmann::json doc = MinimalProfile();
  const nlohmann::json good = {CurveJson("fwd", false, 128, {{512, 150}, {2048, 300}}),
                               CurveJson("bwd", false, 128, {{512, 100}, {2048, 200}})};
  doc["compute"]["attention"] = {{"q_block", Sourced(128)},
                                 {"curve_tokens", Sourced(16384)},
                                 {"curve_hidden", Sourced(2048)},
                                 {"curves", Sourced(good)}};
  StatusOr<SimProfile> p = ParseProfile(doc, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->compute.attention->curves.size(), 2u);
  EXPECT_TRUE(p->compute.attention->curves[1].backward);
  EXPECT_DOUBLE_EQ(p->compute.attention->curves[0].points[1].second, 300e12);
  EXPECT_EQ(p->compute.attention->curve_tokens, 16384);

  struct Case {
    nlohmann::json curves;
    const char* named;
  };
  nlohmann::json unsourced = good;
  unsourced[1].erase("source");
  const Case cases[] = {
      {{good[0]}, "no bwd curve"},
      {{good[0], good[1], good[1]}, "compute.attention.curves[2]"},
      {unsourced, "compute.attention.curves[1]"},
      {{good[0], CurveJson("bwd", false, 128, {{2048, 100}, {512, 200}})}, "compute.attention.curves[1]"},
      {{good[0], CurveJson("back", false, 128, {{512, 100}})}, "compute.attention.curves[1]"},
      {{good[0], CurveJson("bwd", false, 0, {{512, 100}})}, "compute.attention.curves[1]"},
      {{good[0], CurveJson("bwd", false, 128, {{512, -1}})}, "compute.attention.curves[1]"},
      {nlohmann::json::array(), "compute.attention.curves"},
  };
  for (const Case& c : cases) {
    nlohmann::json bad = doc;
    bad["compute"]["attention"]["curves"] = Sourced(c.curves);
    Status s = ParseProfile(bad, "test").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.named;
    EXPECT_NE(s.message().find(c.named), std::string::npos) << s;
  }
  // Curves need the published calls' shape.
  nlohmann::json no_tokens = doc;
  no_tokens["compute"]["attention"].erase("curve_tokens");
  Status s = ParseProfile(no_tokens, "test").status();
  EXPECT_NE(s.message().find("compute.attention.curve_tokens"), std::string::npos) << s;
}

TEST(ProfileTest, KernelEfficiencySectionsAreParsedAndChecked) {
  nlohmann::json doc = MinimalProfile();
  doc["compute"]["gemm_efficiency_by_dtype"] = {{"bf16", Sourced(0.6)}};
  doc["compute"]["op_memory_efficiency"] = Sourced({{"layer_norm_bwd", 0.2}});
  doc["compute"]["attention"] = {{"fwd_efficiency", Sourced(0.7)},
                                 {"bwd_efficiency", Sourced(0.6)},
                                 {"q_block", Sourced(128)},
                                 {"key_overhead", Sourced(256)}};
  StatusOr<SimProfile> p = ParseProfile(doc, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->compute.gemm_efficiency_by_dtype.at(DType::kBF16), 0.6);
  EXPECT_DOUBLE_EQ(p->compute.op_memory_efficiency.at("layer_norm_bwd"), 0.2);
  EXPECT_DOUBLE_EQ(p->compute.memory_bandwidth_peak, 100e9);
  ASSERT_TRUE(p->compute.attention.has_value());
  EXPECT_EQ(p->compute.attention->q_block, 128);
  EXPECT_DOUBLE_EQ(p->compute.attention->key_overhead, 256);

  struct Case {
    const char* key;
    nlohmann::json value;
    const char* named;
  };
  const Case cases[] = {
      {"gemm_efficiency_by_dtype", {{"bf16", Sourced(1.5)}}, "compute.gemm_efficiency_by_dtype.bf16"},
      {"gemm_efficiency_by_dtype", {{"int3", Sourced(0.5)}}, "compute.gemm_efficiency_by_dtype.int3"},
      {"op_memory_efficiency", Sourced({{"cast", 0}}), "compute.op_memory_efficiency.cast"},
      {"op_memory_efficiency", Sourced(0.5), "compute.op_memory_efficiency"},
      {"attention", {{"fwd_efficiency", Sourced(0.7)}}, "compute.attention.bwd_efficiency"},
  };
  for (const Case& c : cases) {
    nlohmann::json bad = MinimalProfile();
    bad["compute"][c.key] = c.value;
    Status s = ParseProfile(bad, "test").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.named;
    EXPECT_NE(s.message().find(c.named), std::string::npos) << s;
  }
}

// Every built-in GPU profile prices fused attention and its memory-bound ops
// from the kernel sections.
TEST(ProfileTest, GpuProfilesCarryKernelEfficiencies) {
  for (const char* name : {"a100-80g", "h100-80g", "h200-141g"}) {
    StatusOr<SimProfile> p = LoadProfile(name);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(p->compute.attention.has_value()) << name;
    // Published kernel curves for both passes, both masks forward, head
    // sizes 64 and 128.
    EXPECT_EQ(p->compute.attention->curves.size(), 6u) << name;
    EXPECT_EQ(p->compute.gemm_efficiency_by_dtype.count(DType::kBF16), 1u) << name;
    // The default is shardkit's own kernels: its measured memory-bound op
    // rates and its in-step GEMM shortfall.
    EXPECT_EQ(p->implementation, "shardkit") << name;
    EXPECT_GT(p->compute.op_memory_efficiency.size(), 10u) << name;
    // The kernel libraries' rates: no per-op shortfall, GEMMs faster.
    StatusOr<SimProfile> ref = LoadProfile(std::string(name) + ":reference");
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(ref->implementation, "reference");
    EXPECT_TRUE(ref->compute.op_memory_efficiency.empty()) << name;
    EXPECT_GT(ref->compute.gemm_efficiency_by_dtype.at(DType::kBF16),
              p->compute.gemm_efficiency_by_dtype.at(DType::kBF16))
        << name;
  }
  // The profiles held against published runs carry the validation spread.
  for (const char* name : {"a100-80g", "h100-80g"}) {
    StatusOr<SimProfile> p = LoadProfile(name);
    ASSERT_TRUE(p.ok() && p->validation.has_value()) << name;
    EXPECT_GT(p->validation->runs, 0) << name;
    EXPECT_LE(p->validation->ratio_low, p->validation->ratio_median) << name;
    EXPECT_LE(p->validation->ratio_median, p->validation->ratio_high) << name;
    EXPECT_NE(p->validation->source.find("planner_validation.md"), std::string::npos) << name;
  }
}

// An implementation scales the GEMM efficiency of the dtypes it lists and
// replaces per-op bandwidths; a name picks one, the default otherwise.
TEST(ProfileTest, KernelImplementationsApplyOverTheHardware) {
  nlohmann::json doc = MinimalProfile();
  doc["compute"]["gemm_efficiency_by_dtype"] = {{"bf16", Sourced(0.8)}};
  doc["compute"]["op_memory_efficiency"] = Sourced({{"cast", 0.9}});
  doc["implementations"] = {
      {"default", "mine"},
      {"mine",
       {{"description", "slow kernels"},
        {"gemm_fraction_by_dtype", {{"bf16", Sourced(0.5)}, {"f16", Sourced(0.25)}}},
        {"op_memory_efficiency", Sourced({{"layer_norm_bwd", 0.1}, {"cast", 0.3}})}}},
      {"reference", {{"description", "the libraries"}}}};
  StatusOr<SimProfile> p = ParseProfile(doc, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->implementation, "mine");
  EXPECT_EQ(p->default_implementation, "mine");
  EXPECT_EQ(p->implementations.size(), 2u);
  EXPECT_DOUBLE_EQ(p->compute.gemm_efficiency_by_dtype.at(DType::kBF16), 0.4);
  // f16 had no entry: the fraction of gemm_efficiency.
  EXPECT_DOUBLE_EQ(p->compute.gemm_efficiency_by_dtype.at(DType::kF16), 0.125);
  EXPECT_DOUBLE_EQ(p->compute.op_memory_efficiency.at("layer_norm_bwd"), 0.1);
  EXPECT_DOUBLE_EQ(p->compute.op_memory_efficiency.at("cast"), 0.3);

  StatusOr<SimProfile> ref = ParseProfile(doc, "test", "reference");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->implementation, "reference");
  EXPECT_DOUBLE_EQ(ref->compute.gemm_efficiency_by_dtype.at(DType::kBF16), 0.8);
  EXPECT_EQ(ref->compute.gemm_efficiency_by_dtype.count(DType::kF16), 0u);
  EXPECT_EQ(ref->compute.op_memory_efficiency.size(), 1u);

  Status missing = ParseProfile(doc, "test", "theirs").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("'theirs'"), std::string::npos) << missing;
  EXPECT_NE(missing.message().find("mine, reference"), std::string::npos) << missing;
  // A profile without the section has none to pick.
  EXPECT_EQ(ParseProfile(MinimalProfile(), "test").value().implementation, "");
  EXPECT_EQ(ParseProfile(MinimalProfile(), "test", "reference").status().code(), StatusCode::kNotFound);

  struct Case {
    nlohmann::json section;
    const char* named;
  };
  const Case cases[] = {
      {{{"mine", {{"description", "x"}}}}, "implementations.default"},
      {{{"default", "other"}, {"mine", {{"description", "x"}}}}, "implementations.default"},
      {{{"default", "mine"}, {"mine", {{"gemm_fraction_by_dtype", {{"bf16", Sourced(0.5)}}}}}},
       "implementations.mine.description"},
      {{{"default", "mine"}, {"mine", {{"description", "x"}, {"gemm_fraction_by_dtype", {{"bf16", Sourced(1.5)}}}}}},
       "implementations.mine.gemm_fraction_by_dtype.bf16"},
      {{{"default", "mine"},
        {"mine", {{"description", "x"}, {"gemm_fraction_by_dtype", {{"bf16", {{"value", 0.5}}}}}}}},
       "implementations.mine.gemm_fraction_by_dtype.bf16"},
      {{{"default", "mine"}, {"mine", {{"description", "x"}, {"op_memory_efficiency", Sourced({{"cast", 2}})}}}},
       "implementations.mine.op_memory_efficiency.cast"},
      {{{"default", "a:b"}, {"a:b", {{"description", "x"}}}}, "implementations.a:b"},
      {{{"default", "mine"}, {"mine", 3}}, "implementations.mine"},
  };
  for (const Case& c : cases) {
    nlohmann::json bad = MinimalProfile();
    bad["implementations"] = c.section;
    Status s = ParseProfile(bad, "test").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.named << " " << s;
    EXPECT_NE(s.message().find(c.named), std::string::npos) << s;
  }
}

// "name:implementation" picks the kernels of a built-in profile or a file;
// a path's directories may hold a ':'.
TEST(ProfileTest, ProfileNamesCarryTheImplementation) {
  EXPECT_EQ(SplitProfileName("h100-80g:reference"), std::make_pair(std::string("h100-80g"), std::string("reference")));
  EXPECT_EQ(SplitProfileName("h100-80g"), std::make_pair(std::string("h100-80g"), std::string()));
  EXPECT_EQ(SplitProfileName("/tmp/a:b/p.json"), std::make_pair(std::string("/tmp/a:b/p.json"), std::string()));
  EXPECT_EQ(SplitProfileName("/tmp/a:b/p.json:shardkit"),
            std::make_pair(std::string("/tmp/a:b/p.json"), std::string("shardkit")));
  StatusOr<SimProfile> bad = LoadProfile("a100-80g:nonesuch");
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("reference, shardkit"), std::string::npos) << bad.status();
  EXPECT_EQ(LoadProfile("cpu-local:reference").status().code(), StatusCode::kNotFound);
  StatusOr<SimProfile> own = LoadProfile("h200-141g:shardkit");
  StatusOr<SimProfile> plain = LoadProfile("h200-141g");
  ASSERT_TRUE(own.ok() && plain.ok());
  EXPECT_DOUBLE_EQ(own->compute.gemm_efficiency_by_dtype.at(DType::kBF16),
                   plain->compute.gemm_efficiency_by_dtype.at(DType::kBF16));
}

// The validation spread is sourced and ordered; a high below the median is
// named.
TEST(ProfileTest, ValidationSpreadIsChecked) {
  nlohmann::json doc = MinimalProfile();
  doc["validation"] = {{"runs", Sourced(3)}, {"ratio_low", Sourced(0.8)}, {"ratio_median", Sourced(0.9)},
                       {"ratio_high", Sourced(1.2)}};
  StatusOr<SimProfile> p = ParseProfile(doc, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->validation.has_value());
  EXPECT_EQ(p->validation->runs, 3);
  EXPECT_DOUBLE_EQ(p->validation->ratio_high, 1.2);
  doc["validation"]["ratio_high"] = Sourced(0.85);
  Status s = ParseProfile(doc, "test").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("validation.ratio_high"), std::string::npos) << s;
}

}  // namespace
}  // namespace sk::sim
