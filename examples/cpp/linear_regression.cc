// The low-level API through the C++ frontend: a linear regression computed
// here on gathered parameters (same arithmetic and output as
// examples/c/linear_regression.c).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "shardkit/shardkit.hpp"

namespace {

constexpr int kFeatures = 4, kBatch = 8, kSteps = 20;

double Feature(int step, int i, int j) { return ((step * 5 + i * 3 + j * 7) % 11) / 5.0 - 1.0; }
double Target(int step, int i) {
  const double w[kFeatures] = {0.5, -1.0, 2.0, 0.25};
  double y = 0.0;
  for (int j = 0; j < kFeatures; ++j) y += w[j] * Feature(step, i, j);
  return y + 0.3;
}

}  // namespace

int main() try {
  shardkit::ModelSpec spec;
  const int32_t unit = spec.AddUnit("linear");
  spec.AddParam(unit, "w", {kFeatures}, SK_INIT_NORMAL, 0.0f, 0.5f);
  spec.AddParam(unit, "b", {1}, SK_INIT_ZEROS);

  std::vector<shardkit::ProcessGroup> groups = shardkit::ProcessGroup::Local(1);
  sk_fsdp_options fsdp = SK_FSDP_OPTIONS_INIT;
  fsdp.seed = 42;
  sk_optimizer_options sgd = SK_OPTIMIZER_OPTIONS_INIT;
  sgd.kind = SK_OPTIMIZER_SGD;
  sgd.lr = 0.05f;
  sk_engine_options options = SK_ENGINE_OPTIONS_INIT;
  options.fsdp = &fsdp;
  options.optimizer = &sgd;
  shardkit::Engine engine(spec, groups[0].get(), &options);

  for (int step = 0; step < kSteps; ++step) {
    engine.ZeroGrad();
    double err[kBatch];
    double loss = 0.0;
    engine.PreForward(unit);
    const float* w = engine.Param(unit, 0).f32();
    const float* b = engine.Param(unit, 1).f32();
    for (int i = 0; i < kBatch; ++i) {
      double pred = 0.0;
      for (int j = 0; j < kFeatures; ++j) pred += static_cast<double>(w[j]) * Feature(step, i, j);
      pred += static_cast<double>(b[0]);
      err[i] = pred - Target(step, i);
      loss += err[i] * err[i];
    }
    loss /= kBatch;
    engine.PostForward(unit);
    engine.PreBackward(unit);
    float* gw = engine.Grad(unit, 0).f32();
    float* gb = engine.Grad(unit, 1).f32();
    for (int j = 0; j < kFeatures; ++j) {
      double g = 0.0;
      for (int i = 0; i < kBatch; ++i) g += err[i] * Feature(step, i, j);
      gw[j] = static_cast<float>(static_cast<double>(gw[j]) + g * (2.0 / kBatch));
    }
    double g = 0.0;
    for (int i = 0; i < kBatch; ++i) g += err[i];
    gb[0] = static_cast<float>(static_cast<double>(gb[0]) + g * (2.0 / kBatch));
    engine.PostBackward(unit);
    engine.FinishBackward();
    engine.OptimizerStep();

    const float loss32 = static_cast<float>(loss);
    uint32_t bits;
    std::memcpy(&bits, &loss32, sizeof(bits));
    std::printf("step %d loss %.6f bits 0x%08x\n", step + 1, loss32, bits);
  }
  std::vector<float> w = engine.ReadParam(unit, 0, kFeatures);
  std::printf("w %.4f %.4f %.4f %.4f\n", w[0], w[1], w[2], w[3]);
  return 0;
} catch (const shardkit::Error& e) {
  std::cerr << e.what() << "\n";
  return 1;
}
