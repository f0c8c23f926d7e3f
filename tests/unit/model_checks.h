// Checks shared by the model tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/train/model.h"
#include "core/train/train_options.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace megabatch::testing {

// What the steady-state tests train with (test_gpt.cc on the CPU, test_gpu.cc): two
// micro-batches of 2 a step, a log line and diagnostics every 4 steps, the noise scale,
// clipping at 1, no evaluation, a constant LR, fp16's scale from 1024.
inline train::TrainOptions steady_state_options() {
  train::TrainOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 4;
  o.train_iters = 1000;
  o.log_interval = 4;
  o.eval_iters = 0;
  o.diagnostics_interval = 4;
  o.noise_scale = true;
  o.clip_grad = 1.0;
  o.schedule.max_lr = o.schedule.min_lr = 1e-3;
  o.schedule.style = optim::DecayStyle::kConstant;
  o.loss_scaler.initial_scale = 1024;
  return o;
}

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
    float* p = P.param(i).data();
    const float* grad = P.grad(i).data();
    std::vector<float> v(n), keep(p, p + n);
    double analytic = 0, vnorm = 0;
    for (size_t j = 0; j < n; ++j) {
      v[j] = nd(g);
      analytic += static_cast<double>(grad[j]) * v[j];
      vnorm += static_cast<double>(v[j]) * v[j];
    }
    const float h = step / static_cast<float>(std::sqrt(vnorm / static_cast<double>(n)));
    auto loss_at = [&](float s) {
      for (size_t j = 0; j < n; ++j) p[j] = keep[j] + s * v[j];
      return model.forward(batch, ctx, 0.0f).read().objective();
    };
    const double fd = (loss_at(h) - loss_at(-h)) / (2.0 * h);
    std::copy(keep.begin(), keep.end(), p);
    EXPECT_NEAR(fd, analytic, rel_tol * std::max(1.0, std::abs(analytic)) + abs_tol) << P.info(i).name << label;
  }
}

// The command running an independent reference implementation in tests/reference/.
inline std::string reference(const std::string& script) {
  return "/usr/bin/python3 " + source_dir() + "/tests/reference/" + script;
}

// Fresh gradients of one micro-batch, without dropout: the losses (and the gradients in the store).
inline train::LossValues loss_and_gradients(train::Model& model, const train::Batch& batch) {
  model.parameters().zero_grad();
  const auto out = model.forward(batch, {0, 1, 0, false}, 1.0f).read();
  model.backward();
  return out;
}

// Adds N(0, std^2) noise to every parameter (so that biases and norms are not trivial).
inline void perturb_parameters(nn::ParameterStore& P, uint32_t seed, float std) {
  for (size_t id = 0; id < P.count(); ++id) {
    std::mt19937 g(seed + static_cast<uint32_t>(id));
    std::normal_distribution<float> nd(0.0f, std);
    float* p = P.param(static_cast<int>(id)).data();
    for (size_t j = 0; j < P.info(static_cast<int>(id)).numel; ++j) p[j] += nd(g);
  }
}

// Every parameter as params/<name> (its shape), for the PyTorch references.
inline void write_parameters(H5File& f, nn::ParameterStore& P) {
  for (size_t id = 0; id < P.count(); ++id) {
    const auto& info = P.info(static_cast<int>(id));
    std::vector<hsize_t> dims(info.shape.begin(), info.shape.end());
    const float* p = P.param(static_cast<int>(id)).data();
    f.write("params/" + info.name, std::vector<float>(p, p + info.numel), dims);
  }
}

// Every gradient against the reference's grads/<name>. fp32: the longest reductions of the
// tiny test models sum ~1e3 terms: sqrt(1e3) eps32 ~ 4e-6 of the tensor's scale; 16x that.
inline void expect_gradients_match(nn::ParameterStore& P, H5File& ref, const std::string& label = "") {
  for (size_t id = 0; id < P.count(); ++id) {
    const auto& info = P.info(static_cast<int>(id));
    const auto expected = ref.read<float>("grads/" + info.name);
    ASSERT_EQ(expected.size(), info.numel) << info.name;
    float scale = 0;
    for (float x : expected) scale = std::max(scale, std::abs(x));
    for (size_t j = 0; j < info.numel; ++j)
      ASSERT_NEAR(P.grad(static_cast<int>(id))[j], expected[j], 6e-5f * scale + 1e-9f)
          << info.name << "[" << j << "]" << label;
  }
}

}  // namespace megabatch::testing
