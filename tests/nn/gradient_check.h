// The models' gradient check, shared by gpt_test, t5_test and
// unit_table_test: each compared its hand-written backward with central
// differences through the same loop.
#ifndef SHARDKIT_TESTS_NN_GRADIENT_CHECK_H_
#define SHARDKIT_TESTS_NN_GRADIENT_CHECK_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/allocator.h"
#include "runtime/nn/model.h"
#include "runtime/nn/owned_parameters.h"

namespace sk {

// `p` holds the gradients ForwardBackward(batch) just accumulated. At the
// first, middle and last element of every parameter tensor, compares that
// gradient with the central difference of Forward(batch) (eps 1e-2):
// |g - fd| <= 2e-3 + 0.03 |fd|, failures naming `label`, the tensor and the
// element. Parameters are restored. Returns the number of elements checked.
inline int ExpectGradientsMatchCentralDifferences(const Model& m, OwnedParameters& p,
                                                  const TokenBatch& batch, const std::string& label) {
  const std::vector<Tensor> params = p.all_params();
  const std::vector<Tensor> grads = p.all_grads();
  int checked = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    float* d = params[t].data_as<float>();
    for (int64_t i : {int64_t{0}, params[t].numel() / 2, params[t].numel() - 1}) {
      const float saved = d[i];
      const float eps = 1e-2f;
      d[i] = saved + eps;
      const double lp = *m.Forward(batch, p, HostAllocator::Default());
      d[i] = saved - eps;
      const double lm = *m.Forward(batch, p, HostAllocator::Default());
      d[i] = saved;
      const double fd = (lp - lm) / (2.0 * eps);
      EXPECT_NEAR(grads[t].data_as<float>()[i], fd, 2e-3 + 0.03 * std::fabs(fd))
          << label << " tensor " << t << " element " << i;
      ++checked;
    }
  }
  return checked;
}

}  // namespace sk

#endif  // SHARDKIT_TESTS_NN_GRADIENT_CHECK_H_
