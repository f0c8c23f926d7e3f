// Where a tensor lives and where an op runs: the CPU, or one CUDA GPU.
//
// Host code reads device memory only through explicit copies (copy() in
// core/tensor/tensor.h); everything a run computes on a GPU stays there until a log
// interval, a checkpoint or an evaluation reads it back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megabatch {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  constexpr bool is_cpu() const { return type == DeviceType::kCpu; }
  constexpr bool is_cuda() const { return type == DeviceType::kCuda; }
  constexpr bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// "cpu", "cuda" or "cuda:N"; an Error naming `where` otherwise.
Device parse_device(const std::string& text, const std::string& where);

// The device of a run: `requested` ("cpu", "cuda", "cuda:N", or empty for the default:
// a GPU when this build has CUDA and one is visible, else cpu). "cuda" and the default pick
// GPU local_rank modulo the GPUs visible (one process per GPU under mpirun or srun: the
// local rank of the process on its node); "cuda:N" is GPU N whatever the rank. An explicit
// cuda request fails with a clear Error when the build has no CUDA or no GPU is visible.
Device select_device(const std::string& requested, int local_rank = 0);

}  // namespace megabatch
