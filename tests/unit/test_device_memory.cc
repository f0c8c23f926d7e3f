// The tensor memory a device's tensors hold (core/device/allocator.h: tensor_memory), which the
// trainer writes at every iteration line (memory/allocated_bytes, max_allocated_bytes): on the
// CPU, and on each GPU a CUDA build sees. A tensor of n bytes adds n (up to its block's
// rounding) while it lives and gives them back at its end; the peak keeps them.
#include <gtest/gtest.h>

#include <vector>

#include "core/device/allocator.h"
#include "core/device/runtime.h"
#include "core/tensor/tensor.h"

namespace mb = megabatch;

TEST(TensorMemory, ATensorsBytesAreCountedWhileItLivesAndThePeakKeepsThem) {
  std::vector<mb::Device> devices = {mb::Device::cpu()};
  for (int i = 0; mb::runtime::built_with_cuda() && i < mb::runtime::cuda_device_count(); ++i)
    devices.push_back(mb::Device::cuda(i));
  constexpr size_t kBytes = size_t{4} << 20;  // 4 MiB of f32
  for (const mb::Device d : devices) {
    SCOPED_TRACE(d.str());
    const mb::TensorMemory before = mb::tensor_memory(d);
    EXPECT_GE(before.peak, before.in_use);
    {
      const mb::Tensor t({static_cast<int64_t>(kBytes / 4)}, mb::DType::kF32, d);
      const mb::TensorMemory during = mb::tensor_memory(d);
      EXPECT_GE(during.in_use, before.in_use + kBytes);
      EXPECT_LE(during.in_use, before.in_use + kBytes + kBytes / 8);  // a GPU's size class: at most 1/8 more
      EXPECT_GE(during.peak, during.in_use);
    }
    const mb::TensorMemory after = mb::tensor_memory(d);
    EXPECT_EQ(after.in_use, before.in_use);
    EXPECT_GE(after.peak, before.in_use + kBytes);
  }
}
