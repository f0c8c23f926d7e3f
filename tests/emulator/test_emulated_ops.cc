// The routing of test_ops_emulated (tests/emulator/emulated_ops.h), which the shared test
// bodies of test_ops_devices.cc and test_attention_devices.cc rely on: a call on the
// emulated device's tensors runs the CUDA kernels on the warp emulator, a call on the
// reference's CPU tensors runs the CPU backend, an op whose CUDA code the emulator cannot
// run refuses the emulated device, and a call that mixes the two is an error.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tests/emulator/emulated_ops.h"
#include "tests/emulator/warp_emulator.h"

namespace mb = megabatch;
namespace ops = megabatch::testing::emulated_ops;
using mb::DType;

TEST(EmulatedOps, DeviceCallsRunOnTheEmulatorAndTheReferenceOnTheCpu) {
  const mb::Device dev = mb::testing::emulated_device();
  const std::vector<float> a = {1, 2, 3, 4, 5}, b = {10, 20, 30, 40, 50};
  const mb::Tensor ea = mb::from_host(a, {5}, DType::kF32, dev), eb = mb::from_host(b, {5}, DType::kF32, dev);
  mb::Tensor eout({5}, DType::kF32, dev);
  const int64_t before = mb::emu::launches();
  ops::residual_forward(eout, ea, eb);
  EXPECT_EQ(mb::emu::launches(), before + 1) << "the emulated device's call did not launch on the emulator";
  EXPECT_EQ(mb::to_host_f32(eout), (std::vector<float>{11, 22, 33, 44, 55}));

  const mb::Tensor ca = mb::from_host(a, {5}, DType::kF32), cb = mb::from_host(b, {5}, DType::kF32);
  mb::Tensor cout({5}, DType::kF32);
  ops::residual_forward(cout, ca, cb);
  EXPECT_EQ(mb::emu::launches(), before + 1) << "the CPU's call launched on the emulator";
  EXPECT_EQ(mb::to_host_f32(cout), (std::vector<float>{11, 22, 33, 44, 55}));
}

TEST(EmulatedOps, WhatTheEmulatorCannotRunRefusesAndMixingIsAnError) {
  const mb::Device dev = mb::testing::emulated_device();
  const mb::Tensor x = mb::from_host(std::vector<float>(6, 1.0f), {2, 3}, DType::kF32, dev);
  mb::Tensor c({2, 2}, DType::kF32, dev);
  try {
    ops::gemm(c, x, ops::Trans::N, x, ops::Trans::T);
    ADD_FAILURE() << "gemm ran on the emulated device";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: its CUDA code (cuBLASLt) does not run on the warp emulator"),
              std::string::npos)
        << e.what();
  }
  const mb::Tensor cpu = mb::from_host(std::vector<float>(6, 1.0f), {2, 3}, DType::kF32);
  mb::Tensor out({2, 3}, DType::kF32, dev);
  try {
    ops::residual_forward(out, x, cpu);
    ADD_FAILURE() << "a call mixing the emulated device and the CPU ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("tensors on the emulated GPU and elsewhere"), std::string::npos) << e.what();
  }
}
