// Checks shared by the model tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/train/model.h"

namespace megabatch::testing {

// For one random direction v per parameter tensor, the central difference
// (L(theta + h v) - L(theta - h v)) / 2h of the objective (all loss terms) must equal the
// analytic <grad, v> within rel_tol * max(1, |<grad, v>|) + abs_tol. h = step / rms(v).
inline void expect_directional_derivatives(train::Model& model, const train::Batch& batch,
                                           const train::StepContext& ctx, float step, double rel_tol,
                                           double abs_tol, const std::string& label = "") {
  auto& P = model.parameters();
  P.zero_grad();
  model.forward(batch, ctx, 1.0f);
  model.backward();
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  for (size_t id = 0; id < P.count(); ++id) {
    const int i = static_cast<int>(id);
    const size_t n = P.info(i).numel;
    std::vector<float> v(n), keep(P.param(i), P.param(i) + n);
    double analytic = 0, vnorm = 0;
    for (size_t j = 0; j < n; ++j) {
      v[j] = nd(g);
      analytic += static_cast<double>(P.grad(i)[j]) * v[j];
      vnorm += static_cast<double>(v[j]) * v[j];
    }
    const float h = step / static_cast<float>(std::sqrt(vnorm / static_cast<double>(n)));
    auto loss_at = [&](float s) {
      for (size_t j = 0; j < n; ++j) P.param(i)[j] = keep[j] + s * v[j];
      return model.forward(batch, ctx, 0.0f).objective();
    };
    const double fd = (loss_at(h) - loss_at(-h)) / (2.0 * h);
    std::copy(keep.begin(), keep.end(), P.param(i));
    EXPECT_NEAR(fd, analytic, rel_tol * std::max(1.0, std::abs(analytic)) + abs_tol) << P.info(i).name << label;
  }
}

}  // namespace megabatch::testing
